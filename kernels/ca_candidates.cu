// Candidates (src/tracking/ca/candidates.rs, extract_and_select): the end triplets of the
// pass ordered longest first, their chains built, Kalman fitted in chunks and chosen
// greedily, each hit used once, as the CPU does it, for every event of the batch.
//
// ca_candidates_order (one block of ORDER_THREADS per event): the end triplets (nobody's
// left neighbour, level >= min_level) compacted as the warps find them, then sorted by one
// 64-bit key (63 - level, total_key(kink chi-square), index): the CPU's order, (level desc,
// chi2 by total_cmp, index), with no tie left to the order threads arrive in. A bitonic
// sort of the event's keys (bitonic_sort_block), in shared memory up to ORDER_SHARED_KEYS,
// else in its slice of the key arena (two keys per triplet of the event: the slice is
// padded to a power of two, there more than ORDER_SHARED_KEYS). Then each end triplet's
// room for its chain and its fork's (a chain has min(level + 2, MAX_CHAIN) hits), scanned;
// ca_event_budget places the events' chains in the batch's chain arena.
//
// ca_candidates_chains (a row of blocks per event, a thread per end triplet): the walk of
// every chain and of its fork, which does not depend on the used flags, for the whole
// batch at once.
//
// ca_candidates (one block of CAND_THREADS per event; ca_candidates_small, the same step in
// blocks of CAND_THREADS_SMALL, for launches of more events than multiprocessors; the
// block works through the ordered end triplets a window of its threads at a time): every
// thread takes one end triplet's walked chains and leaves out the hits used as of the
// window's start, which are what the CPU sees (the flags only change in the choice); the
// block then places the chains in the CPU's order with the CPU's limits (a scan; thread 0
// alone where a limit could be reached), until the chunk holds CHUNK candidates (the rest
// of the window is filtered again after the choice); the chunk's fits run one candidate
// per thread, in one round in blocks of CAND_THREADS, two in the small blocks (where the
// chunk has fewer candidates than threads, the others fit ahead, in the same round, the
// copies that second chances would fit); the chunk is staged (its hits in shared memory
// where they fit) and ordered by the block (a bitonic sort of one key per
// candidate), which also marks the candidates the choice must accept whenever their turn
// comes (passing the cut, every hit free, and no hit shared with a candidate before it in
// the choice's order: most of them) and those it must drop (too few hits left without
// those); the greedy choice runs in the block's first warp: a run of such candidates is
// decided together, a lane each, the others one at a time (their hits checked and taken,
// their free hits counted, by the lanes together), their refits in lane 0; meanwhile the
// block's other warps fit ahead the two copies of every second chance the choice may give
// (those the fit round did not), which lanes 0 and 1 wait for and take (where the chunk
// leaves no room for them in the arenas, lanes 0 and 1 fit them).
// Candidates, their hits (the event's input indices, upstream first), their fits and the
// accepted list persist per event across passes (`append`); the used flags are per input
// hit of the event.
//
// An event where the CPU would count an overflow (candidates, candidate hits, tracks) or
// whose candidates do not fit in its share of the batch's arenas fails with
// FAIL_CANDIDATES and goes to the CPU path; nothing is truncated silently.

// Threads of an event's block: a chunk's fits in one round (CAND_CHUNK), its end
// triplets' chains filtered a window of CAND_THREADS at a time.
#define CAND_THREADS 256
// Threads of the smaller blocks (ca_candidates_small).
#define CAND_THREADS_SMALL 128
static_assert(CAND_THREADS_SMALL % 32 == 0 && CAND_THREADS_SMALL >= 64 &&
                  CAND_THREADS % 32 == 0 && CAND_THREADS <= 1024,
              "whole warps; the choice's warp and at least one for second chances ahead");
// Candidates fitted together before the choice (CHUNK in candidates.rs).
#define CAND_CHUNK 256
// The longest chain (one hit per plane: MAX_CHAIN = MAX_PLANES in candidates.rs).
#define MAX_CHAIN 64
// Kink chi-squares of two left neighbours closer than this make a fork (FORK_CHI2).
#define FORK_CHI2 2.0f
// Most candidates of one chunk: CHUNK - 1 pending, then a chain and its fork.
#define CHUNK_MAX (CAND_CHUNK + 1)
// Words of the chunk's hits staged in shared memory (16 KB: 256 candidates of 16 hits); a
// chunk with more hits is read where it lies, in the candidate-hit arena. (A smaller value
// in TRIGD_KERNEL_OPTIONS sends more chunks that way, to check it.)
#ifndef STAGE_HITS
#define STAGE_HITS 4096
#endif
// The chunk's order keys: CHUNK_MAX padded to a power of two.
#define RANK_KEYS 512
// Slots of the first rank holding a shared hit (stage_chunk), in the keys' words.
#define FIRST_SLOTS RANK_KEYS
// A chunk candidate's verdict known before the choice (ChunkStage::fast): accepted
// whenever its turn comes, or dropped.
#define FAST_ACCEPT 1u
#define FAST_DROP 2u
static_assert(CAND_CHUNK < 512 && CHUNK_MAX <= RANK_KEYS, "a chunk's index fits the key's 9 bits");
// Words of a fit in the fit arena (OUT_WORDS in kalman_fit.cu).
#define FIT_WORDS 24
// Triplet indices in the order key.
#define KEY_INDEX_BITS 26
// Threads of ca_candidates_order's blocks: its sort's steps take a few keys a thread.
#define ORDER_THREADS 1024
// Most end triplets of an event sorted in shared memory (32 KB of keys); more are sorted in
// the key arena. (A smaller power of two, at least 32, given in TRIGD_KERNEL_OPTIONS sends
// more events to the arena's path, to check it.)
#ifndef ORDER_SHARED_KEYS
#define ORDER_SHARED_KEYS 4096
#endif

typedef unsigned long long u64;

// total_key in candidates.rs: an unsigned key in the order of f32::total_cmp.
__device__ __forceinline__ u32 total_key(float x) {
    int b = __float_as_int(x);
    return ((u32)(b ^ (int)(((u32)(b >> 31)) >> 1))) ^ 0x80000000u;
}

__device__ __forceinline__ void fail_event(u32* failed, u32* overflow, int e) {
    if (failed[e] == FAIL_NONE) {
        failed[e] = FAIL_CANDIDATES;
        atomicAdd(&overflow[FAIL_CANDIDATES], 1u);
    }
}

// Sorts a[0..n) ascending, n a power of two and at least 32, by the block of THREADS
// threads (a bitonic network; `a` in shared or global memory). Each size's steps over strides of 32 and more
// exchange through memory, waiting for the block; those below, between lanes of one warp,
// in registers. Ends after a __syncthreads.
template <u32 THREADS>
__device__ __forceinline__ void bitonic_sort_block(u64* a, u32 n) {
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride >= 32; stride >>= 1) {
            for (u32 i = threadIdx.x; i < n; i += THREADS) {
                u32 j = i ^ stride;
                if (j > i) {
                    u64 x = a[i], y = a[j];
                    bool up = (i & size) == 0;
                    if ((x > y) == up) {
                        a[i] = y;
                        a[j] = x;
                    }
                }
            }
            __syncthreads();
        }
        // `n` is a multiple of 32: a warp's lanes are all inside or all outside it.
        for (u32 i = threadIdx.x; i < n; i += THREADS) {
            u64 v = a[i];
            const bool up = (i & size) == 0;
            for (u32 stride = (size >> 1) < 16 ? (size >> 1) : 16; stride > 0; stride >>= 1) {
                u64 o = __shfl_xor_sync(0xffffffffu, v, stride);
                // The lower of the pair keeps the smaller key going up, the larger going
                // down; the upper the other.
                bool keep_min = ((i & stride) == 0) == up;
                v = keep_min ? (o < v ? o : v) : (o > v ? o : v);
            }
            a[i] = v;
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(ORDER_THREADS) ca_candidates_order(const u32* __restrict__ trip_base,
                                               const u32* __restrict__ trip_n,
                                               const u32* __restrict__ level,
                                               const u32* __restrict__ has_right,
                                               const float* __restrict__ tchi2,
                                               u32* __restrict__ failed, u32* __restrict__ overflow,
                                               u32 min_level, u64* __restrict__ keys,
                                               u32* __restrict__ n_end,
                                               u32* __restrict__ chain_off,
                                               u32* __restrict__ chain_total) {
    int e = blockIdx.y;
    if (failed[e]) {
        if (threadIdx.x == 0) {
            n_end[e] = 0;
            chain_total[e] = 0;
        }
        return;
    }
    u32 tb = trip_base[e], nt = trip_n[e];
    if (nt >= (1u << KEY_INDEX_BITS)) {
        // Beyond the key's index bits (far beyond the CPU's default limits).
        if (threadIdx.x == 0) {
            n_end[e] = 0;
            chain_total[e] = 0;
            fail_event(failed, overflow, e);
        }
        return;
    }
    u64* k = keys + 2 * (size_t)tb;
    // The end triplets' keys, in the order the warps find them (the sort below orders
    // them: every key holds its triplet's index); four triplets a thread at a time, their
    // loads independent, each warp's found ones placed by one shared atomic.
    __shared__ u32 s_count;
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    const u32 lane = threadIdx.x & 31u;
    for (u32 c0 = 0; c0 < nt; c0 += 4 * ORDER_THREADS) {
        u32 lv[4], hr[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const u32 t = c0 + (u32)q * ORDER_THREADS + threadIdx.x;
            lv[q] = t < nt ? level[tb + t] : 0u;
            hr[q] = t < nt ? has_right[tb + t] : 1u;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const u32 t = c0 + (u32)q * ORDER_THREADS + threadIdx.x;
            const bool end = t < nt && !hr[q] && lv[q] >= min_level;
            const u32 found = __ballot_sync(0xffffffffu, end);
            if (found == 0u) continue;
            const int leader = __ffs((int)found) - 1;
            u32 at = 0;
            if ((int)lane == leader) at = atomicAdd(&s_count, (u32)__popc(found));
            at = __shfl_sync(0xffffffffu, at, leader);
            if (end) {
                const u32 l = lv[q] < 63 ? 63 - lv[q] : 0;
                k[at + (u32)__popc(found & ((1u << lane) - 1u))] =
                    ((u64)l << 58) | ((u64)total_key(tchi2[tb + t]) << KEY_INDEX_BITS) | (u64)t;
            }
        }
    }
    __syncthreads();
    const u32 count = s_count;
    // The sorted slice: a power of two (none for no end triplet), within the event's 2 nt.
    u32 m = count ? 1u : 0u;
    while (m < count) m <<= 1;
    if (m <= ORDER_SHARED_KEYS) {
        // Sorted in shared memory where it fits (every key is distinct, the index is in
        // it, so the order is the same in either place).
        __shared__ u64 sk[ORDER_SHARED_KEYS];
        // At least a warp's width (bitonic_sort_block).
        const u32 ms = m < 32 ? 32 : m;
        __syncthreads();
        for (u32 i = threadIdx.x; i < ms; i += ORDER_THREADS) sk[i] = i < count ? k[i] : ~0ull;
        __syncthreads();
        bitonic_sort_block<ORDER_THREADS>(sk, ms);
        for (u32 i = threadIdx.x; i < m; i += ORDER_THREADS) k[i] = sk[i];
        __syncthreads();
    } else {
        for (u32 i = count + threadIdx.x; i < m; i += ORDER_THREADS) k[i] = ~0ull;
        __syncthreads();
        bitonic_sort_block<ORDER_THREADS>(k, m);
    }
    // Room for each end triplet's chain and its fork's (the chain of an end triplet of
    // level L has min(L + 2, MAX_CHAIN) hits, whichever neighbours it follows), in order.
    u32 carry = 0;
    for (u32 c0 = 0; c0 < count; c0 += ORDER_THREADS) {
        u32 p = c0 + threadIdx.x;
        u32 room = 0;
        if (p < count) {
            u32 lv = level[tb + (u32)(k[p] & ((1u << KEY_INDEX_BITS) - 1))];
            room = 2 * (lv + 2 < MAX_CHAIN ? lv + 2 : MAX_CHAIN);
        }
        u32 chunk;
        u32 incl = block_scan_inclusive_of<ORDER_THREADS>(room, &chunk);
        if (p < count) chain_off[tb + p] = carry + incl - room;
        carry += chunk;
    }
    if (threadIdx.x == 0) {
        n_end[e] = count;
        chain_total[e] = carry;
    }
}

// What the candidate step reads of one event.
struct CandEvent {
    // Sorted hits: their input index (the event's), used flags by input index.
    const u32* sinput;
    u32* used;
    // Input hits of the event.
    const float* x;
    const float* y;
    const u32* plane;
    const uint4* dbl;
    const u32* tleft;
    const u32* tright;
    const float* tchi2;
    const float* tqop;
    const float* tsigma;
    const u32* level;
    const u32* nb_off;
    const u32* nb_count;
    const u32* left;
};

__device__ __forceinline__ bool hit_used(const CandEvent& ev, u32 sorted) {
    return ev.used[ev.sinput[sorted]] != 0;
}

// ChainQop::add in candidates.rs: triplet l's q/p into the chain's weighted sums.
__device__ __forceinline__ void chain_qop_add(const CandEvent& ev, u32 l, float* w, float* wq) {
    float s = ev.tsigma[l];
    float v = s * s;
    if (v > 0.0f) {
        *w = *w + 1.0f / v;
        *wq = *wq + ev.tqop[l] / v;
    }
}

// ChainQop::score: left neighbour l's kink chi-square plus the chi-square of its q/p
// against the chain's.
__device__ __forceinline__ float chain_qop_score(const CandEvent& ev, u32 l, float w, float wq) {
    float s = ev.tsigma[l];
    float v = s * s;
    float c = ev.tchi2[l];
    if (w > 0.0f && v > 0.0f) {
        float d = ev.tqop[l] - wq / w;
        return c + d * d / (v + 1.0f / w);
    }
    return c;
}

// lookahead_score in candidates.rs: left neighbour l's score plus the best score among
// its own left neighbours of one level lower, for the chain continued through it.
__device__ __forceinline__ float lookahead_score(const CandEvent& ev, u32 l, float w, float wq) {
    float c = chain_qop_score(ev, l, w, wq);
    const u32 want = ev.level[l];
    if (want > 1) {
        float nw = w, nwq = wq;
        chain_qop_add(ev, l, &nw, &nwq);
        float best = CA_INF;
        const u32 k0 = ev.nb_off[l], k1 = k0 + ev.nb_count[l];
        for (u32 k = k0; k < k1; k++) {
            const u32 m = ev.left[k];
            if (ev.level[m] == want - 1) best = fminf(best, chain_qop_score(ev, m, nw, nwq));
        }
        if (isfinite(best)) c = c + best;
    }
    return c;
}

// A walked chain's first hit where the walk made none.
#define NO_CHAIN 0xffffffffu

// The walk of build_chain in candidates.rs: the chain ending with triplet t (sorted hits,
// downstream first, into raw; returns its length, min(level + 2, MAX_CHAIN)), following
// the left neighbour of one level lower with the best score (lookahead_score), except at
// the fork (fork_at, fork_l) when fork_at >= 0. The first round's walk does not read the
// used flags (ev.used null); the second round's (divert_chains) reads them as they were
// when it began: it returns 0 (no chain, no fork) where one of the end triplet's hits is
// used or where no step chose a free neighbour's hit over a better used one (the first
// round's chain), and prefers, at each step, the neighbours whose hit is free.
// Without a fork, *f_at and *f_l receive the step where the second-best neighbour came
// closest to the best (within FORK_CHI2), *f_at = -1 if none.
__device__ int walk_chain(const CandEvent& ev, u32 t, int fork_at, u32 fork_l, u32* raw,
                          int* f_at, u32* f_l) {
    *f_at = -1;
    uint4 r = ev.dbl[ev.tright[t]];
    uint4 lft = ev.dbl[ev.tleft[t]];
    const bool divert = ev.used != nullptr;
    if (divert && (hit_used(ev, r.y) || hit_used(ev, r.x) || hit_used(ev, lft.x))) return 0;
    // Whether a step left a better neighbour whose hit was used for a free one (a fork's
    // chain is kept either way: its main chain was).
    bool diverted = fork_at >= 0;
    int len = 0;
    raw[len++] = r.y;
    raw[len++] = r.x;
    raw[len++] = lft.x;
    bool has_closest = false;
    int c_at = -1;
    u32 c_l = 0;
    float c_gap = 0.0f;
    u32 cur = t;
    // The chain's q/p so far (ChainQop in candidates.rs): sums of 1/sigma^2 and q/p/sigma^2.
    float qw = 0.0f, qwq = 0.0f;
    chain_qop_add(ev, t, &qw, &qwq);
    while (ev.level[cur] > 1 && len < MAX_CHAIN) {
        u32 want = ev.level[cur] - 1;
        u32 k0 = ev.nb_off[cur], k1 = k0 + ev.nb_count[cur];
        bool has_best = false, has_second = false, has_taken = false;
        u32 bl = 0, sl = 0, tl = 0;
        float bc = 0.0f, sc = 0.0f, tc = 0.0f;
        for (u32 k = k0; k < k1; k++) {
            u32 l = ev.left[k];
            if (ev.level[l] != want) continue;
            float c = lookahead_score(ev, l, qw, qwq);
            if (divert && hit_used(ev, ev.dbl[ev.tleft[l]].x)) {
                if (!has_taken || c < tc) {
                    has_taken = true;
                    tl = l;
                    tc = c;
                }
                continue;
            }
            if (!has_best || c < bc) {
                has_second = has_best;
                sl = bl;
                sc = bc;
                has_best = true;
                bl = l;
                bc = c;
            } else if (!has_second || c < sc) {
                has_second = true;
                sl = l;
                sc = c;
            }
        }
        if (has_best && has_taken && tc < bc) {
            diverted = true;
        } else if (!has_best && has_taken) {
            has_best = true;
            bl = tl;
            bc = tc;
        }
        if (!has_best) break;
        u32 l = bl;
        if (fork_at >= 0) {
            if ((u32)fork_at == cur) l = fork_l;
        } else if (has_second) {
            float gap = sc - bc;
            if (gap < FORK_CHI2 && (!has_closest || gap < c_gap)) {
                has_closest = true;
                c_at = (int)cur;
                c_l = sl;
                c_gap = gap;
            }
        }
        chain_qop_add(ev, l, &qw, &qwq);
        raw[len++] = ev.dbl[ev.tleft[l]].x;
        cur = l;
    }
    if (divert && !diverted) return 0;
    if (has_closest) {
        *f_at = c_at;
        *f_l = c_l;
    }
    return len;
}

// Every end triplet's chain and, where it has one, its fork's, as the event's input
// indices (downstream first) at the scanned offsets (a row of blocks per event, a thread
// per end triplet): the walks of the whole batch at once, before the choice.
extern "C" __global__ void ca_candidates_chains(const u32* __restrict__ hit_start,
                                                const u32* __restrict__ sinput,
                                                const uint4* __restrict__ dbl,
                                                const u32* __restrict__ dbl_base,
                                                const u32* __restrict__ trip_base,
                                                const u32* __restrict__ tleft,
                                                const u32* __restrict__ tright,
                                                const float* __restrict__ tchi2,
                                                const float* __restrict__ tqop,
                                                const float* __restrict__ tsigma,
                                                const u32* __restrict__ level,
                                                const u32* __restrict__ nb_off,
                                                const u32* __restrict__ nb_count,
                                                const u32* __restrict__ nb_base,
                                                const u32* __restrict__ left,
                                                const u64* __restrict__ keys,
                                                const u32* __restrict__ n_end,
                                                const u32* __restrict__ failed,
                                                const u32* __restrict__ chain_off,
                                                const u32* __restrict__ chain_base,
                                                u32* __restrict__ chain_fork,
                                                u32* __restrict__ chain_hits,
                                                u32* __restrict__ used, int divert) {
    int e = blockIdx.y;
    if (failed[e]) return;
    const u32 hs = hit_start[e];
    const u32 tb = trip_base[e];
    CandEvent ev;
    ev.sinput = sinput + hs;
    ev.used = divert ? used + hs : nullptr;
    ev.x = nullptr;
    ev.y = nullptr;
    ev.plane = nullptr;
    ev.dbl = dbl + dbl_base[e];
    ev.tleft = tleft + tb;
    ev.tright = tright + tb;
    ev.tchi2 = tchi2 + tb;
    ev.tqop = tqop + tb;
    ev.tsigma = tsigma + tb;
    ev.level = level + tb;
    ev.nb_off = nb_off + tb;
    ev.nb_count = nb_count + tb;
    ev.left = left + nb_base[e];
    const u64* order = keys + 2 * (size_t)tb;
    const u32 n = n_end[e];
    u32* base = chain_hits + chain_base[e];
    u32 raw[MAX_CHAIN];
    for (u32 p = CA_FIRST; p < n; p += CA_STRIDE) {
        u32 t = (u32)(order[p] & ((1u << KEY_INDEX_BITS) - 1));
        u32* out = base + chain_off[tb + p];
        int f_at;
        u32 f_l = 0;
        int len = walk_chain(ev, t, -1, 0, raw, &f_at, &f_l);
        if (len == 0) {
            // No chain this round (the second round's): filter_chain makes no candidate.
            out[0] = NO_CHAIN;
            chain_fork[tb + p] = 0u;
            continue;
        }
        for (int i = 0; i < len; i++) out[i] = ev.sinput[raw[i]];
        chain_fork[tb + p] = f_at >= 0 ? 1u : 0u;
        if (f_at >= 0) {
            int unused_at;
            u32 unused_l;
            int flen = walk_chain(ev, t, f_at, f_l, raw, &unused_at, &unused_l);
            for (int i = 0; i < flen; i++) out[len + i] = ev.sinput[raw[i]];
        }
    }
}

// The rest of build_chain, on a walked chain `raw` (input indices, downstream first) of
// end triplet level `lv`: -1 when too many of its first three hits are used to make a
// track (no candidate and no fork); otherwise the hits not used into out (upstream first)
// and their count, 0 (no candidate) when fewer than min_hits.
__device__ int filter_chain(const CandEvent& ev, const u32* raw, u32 len, u32 lv, u32 min_hits,
                            u32* out) {
    if (raw[0] == NO_CHAIN) return -1;
    u32 taken = (ev.used[raw[0]] ? 1u : 0u) + (ev.used[raw[1]] ? 1u : 0u) +
                (ev.used[raw[2]] ? 1u : 0u);
    if (lv + 2 - taken < min_hits) return -1;
    // Eight hits at a time, upstream first: their loads, then their flags' loads, each
    // eight independent of each other (one thread: latency, not work).
    u32 w = 0;
    for (u32 i0 = 0; i0 < len; i0 += 8) {
        u32 h[8], u[8];
#pragma unroll
        for (int q = 0; q < 8; q++) h[q] = i0 + q < len ? raw[len - 1 - (i0 + q)] : 0u;
#pragma unroll
        for (int q = 0; q < 8; q++) u[q] = i0 + q < len ? ev.used[h[q]] : 1u;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            if (!u[q]) out[w++] = h[q];
        }
    }
    return w < min_hits ? 0 : (int)w;
}

// The hits of a device-resident candidate for the fit: input indices into the event's
// input hits.
struct CandHits {
    const u32* idx;
    const float* hx;
    const float* hy;
    const u32* hp;
    __device__ __forceinline__ int plane(int k) const { return (int)hp[idx[k]]; }
    __device__ __forceinline__ float x(int k) const { return hx[idx[k]]; }
    __device__ __forceinline__ float y(int k) const { return hy[idx[k]]; }
};

// The per-event arenas of the candidate step (shares of the batch's).
struct CandArenas {
    uint4* cand;  // start (in chits), len, chi2 (bits), ndf
    u32* chits;   // input indices
    u32* fits;    // FIT_WORDS per candidate
    u32* acc;     // accepted candidate indices
};

// A fit's FIT_WORDS words: state (5), covariance (15), z, chi2 (floats), ndf, ok.
__device__ __forceinline__ void store_fit(const KalmanResult& r, u32* o) {
    for (int i = 0; i < 5; ++i) o[i] = __float_as_uint(r.st[i]);
    for (int i = 0; i < 15; ++i) o[5 + i] = __float_as_uint(r.c[i]);
    o[20] = __float_as_uint(r.z);
    o[21] = __float_as_uint(r.chi2);
    o[22] = (u32)r.ndf;
    o[23] = (u32)r.ok;
}

// The fit of FIT_WORDS words `w` (store_fit's layout).
__device__ __forceinline__ void load_fit(const u32* w, KalmanResult& r) {
    for (int i = 0; i < 5; ++i) r.st[i] = __uint_as_float(w[i]);
    for (int i = 0; i < 15; ++i) r.c[i] = __uint_as_float(w[5 + i]);
    r.z = __uint_as_float(w[20]);
    r.chi2 = __uint_as_float(w[21]);
    r.ndf = (int)w[22];
    r.ok = (int)w[23];
}

// The hits of candidate record cd for the fit.
__device__ __forceinline__ CandHits candidate_hits(const CandEvent& ev, const CandArenas& a,
                                                   uint4 cd) {
    CandHits h;
    h.idx = a.chits + cd.x;
    h.hx = ev.x;
    h.hy = ev.y;
    h.hp = ev.plane;
    return h;
}

// fit_range for the `len` candidate hits from `x`: the fit into slot `out` of the fit
// arena, the range with its chi2 and ndf into candidate `out` (chi2 infinite where the fit
// failed).
__device__ void fit_hits_into(const CandEvent& ev, const CandArenas& a, const KalmanTables& T,
                              u32 x, u32 len, u32 out) {
    const CandHits h = candidate_hits(ev, a, make_uint4(x, len, 0u, 0u));
    KalmanResult r;
    kalman_fit_track(h, (int)len, MAX_CHAIN, T, r);
    store_fit(r, a.fits + (size_t)out * FIT_WORDS);
    float chi2 = (r.ok && r.ndf > 0) ? r.chi2 : CA_INF;
    a.cand[out] = make_uint4(x, len, __float_as_uint(chi2), (u32)r.ndf);
}

// fit_range for one candidate, in its own slot.
__device__ void fit_candidate(const CandEvent& ev, const CandArenas& a, const KalmanTables& T,
                              u32 c) {
    const uint4 cd = a.cand[c];
    fit_hits_into(ev, a, T, cd.x, cd.y, c);
}

__device__ __forceinline__ bool good_candidate(uint4 c, u32 min_hits, double max_chi2_ndf) {
    return c.y >= min_hits && c.w > 0 &&
           (double)(__uint_as_float(c.z) / (float)c.w) <= max_chi2_ndf;
}

// The per-event counters and limits the choice works with.
struct CandState {
    u32 n_cand, n_hits, n_acc;
    // The CPU's limits (candidates, candidate-hit capacity, tracks) and this event's
    // shares of the arenas.
    u32 max_cand, hits_cap, max_tracks;
    u32 share_cand, share_hits;
    u32 min_hits;
    double max_chi2_ndf;
    bool failed;
};

// Hits used since the chunk's start, by input index modulo 2^16 (a filter: a clear bit
// means not used since; a set bit is checked in the used flags).
#define CHUNK_BITS_WORDS 2048

__device__ __forceinline__ bool maybe_used_in_chunk(const u32* bits, u32 h) {
    u32 b = h & 0xffffu;
    return (bits[b >> 5] >> (b & 31)) & 1u;
}

// Marks hit h used, in the used flags and in the chunk's filter.
__device__ __forceinline__ void take_hit(const CandEvent& ev, u32* bits, u32 h) {
    ev.used[h] = 1u;
    u32 b = h & 0xffffu;
    atomicOr(&bits[b >> 5], 1u << (b & 31));
}

// accept in candidates.rs: candidate k of `len` hits `hits` (shared or global); false (the
// event fails) where the CPU would count a track overflow.
__device__ bool accept_candidate(const CandEvent& ev, const CandArenas& a, CandState& s, u32 k,
                                 const u32* hits, u32 len, u32* bits) {
    if (s.n_acc == s.max_tracks) return false;
    // Eight hits at a time, their loads independent (one thread: latency, not work).
    for (u32 i0 = 0; i0 < len; i0 += 8) {
        u32 w[8];
#pragma unroll
        for (int q = 0; q < 8; q++) w[q] = i0 + q < len ? hits[i0 + q] : 0u;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            if (i0 + q < len) take_hit(ev, bits, w[q]);
        }
    }
    a.acc[s.n_acc++] = k;
    return true;
}

// Appends a candidate of `len` hits (copied from `src`, skipping used ones when
// `only_free`) at the end; false where the event's share of the arenas is full.
__device__ bool push_copy(const CandEvent& ev, const CandArenas& a, CandState& s, u32 src,
                          u32 len, bool only_free, u32 n_keep) {
    if (s.n_cand >= s.share_cand || s.n_hits + n_keep > s.share_hits) return false;
    u32 start = s.n_hits;
    for (u32 i = 0; i < len; i++) {
        u32 h = a.chits[src + i];
        if (!only_free || !ev.used[h]) a.chits[s.n_hits++] = h;
    }
    a.cand[s.n_cand++] = make_uint4(start, n_keep, 0u, 0u);
    return true;
}

// The chunk's candidates staged by the block before the choice: records, hits, how many
// of them were free at the chunk's start, and the order of the choice.
struct ChunkStage {
    uint4* cand;   // [CHUNK_MAX]
    u32* shared_hits;  // [STAGE_HITS]
    // The chunk's hits, candidate j's at hits + cand[j].x - h0: the candidates of a chunk
    // are placed one after another, so their hits are one range of the arena, from h0;
    // staged in shared_hits where the range fits, else read in the arena.
    const u32* hits;
    u32 h0;
    u32* free0;    // [CHUNK_MAX]
    u32* order;    // [CHUNK_MAX]: candidate indices, in the order of the choice
    u64* keys;     // [RANK_KEYS]: the choice's order keys, sorted
    u32* bits;     // [CHUNK_BITS_WORDS]
    u32* twice;    // [CHUNK_BITS_WORDS]: hits (modulo 2^16) of two candidates of the chunk
    u32* fast;     // [CHUNK_MAX]: FAST_ACCEPT, FAST_DROP whatever the others do; else 0
};

// The chunk's order key of a fitted candidate: chi2/ndf (infinite without ndf) by
// total_cmp.
__device__ __forceinline__ u32 choice_key(uint4 c) {
    return total_key(c.w > 0 ? __uint_as_float(c.z) / (float)c.w : CA_INF);
}

// The staged hits of chunk candidate c.
__device__ __forceinline__ const u32* chunk_hits(const ChunkStage& st, uint4 c) {
    return st.hits + (c.x - st.h0);
}

// Stages the chunk from..n_cand (all threads; a __syncthreads after each of its loops):
// records, hits, free counts, then the choice's order (longest first, then chi2/ndf by
// total_cmp, then index: one 64-bit key per candidate, sorted), then which candidates are
// `fast`: passing the cut with every hit free at the chunk's start and none shared with
// a candidate of the chunk before it in the choice's order. The choice would accept such
// a candidate whenever its turn comes (no candidate before it, nor any copy of one, which
// holds a subset of its hits, can take its hits first), so the choice takes a run of them
// together. A hit shared is found by setting each candidate's hits in `bits` (by index
// modulo 2^16: two hits of one bit count as shared), then the first rank holding each
// such hit (by slot: hits of one slot count as one); either aliasing only sends a
// candidate the slow way. Then which of the others are doomed: with the hits used at the
// chunk's start and those of fast candidates before them left out, fewer than a track
// needs (the choice would drop them: a hit lost, too few left for a refit); the choice
// passes over them in its runs. `bits` then holds every hit of the chunk, which the
// choice's filter treats as possibly taken (it reads the used flags), as it must.
template <u32 CT>
__device__ void stage_chunk(const CandEvent& ev, const CandArenas& a, u32 from, u32 m,
                            ChunkStage& st, u32 min_hits, double max_chi2_ndf) {
    // Every thread works this out alike: the range of the chunk's hits, staged where it fits.
    const uint4 c0 = a.cand[from], c1 = a.cand[from + m - 1];
    const bool stage = c1.x + c1.y - c0.x <= STAGE_HITS;
    st.h0 = c0.x;
    st.hits = stage ? st.shared_hits : a.chits + c0.x;
    for (u32 j = threadIdx.x; j < m; j += CT) {
        uint4 c = a.cand[from + j];
        st.cand[j] = c;
        // Eight hits at a time (their loads, then their flags' loads, independent).
        u32 n_free = 0;
        for (u32 r0 = 0; r0 < c.y; r0 += 8) {
            u32 h[8], u[8];
#pragma unroll
            for (int q = 0; q < 8; q++) h[q] = r0 + q < c.y ? a.chits[c.x + r0 + q] : 0u;
#pragma unroll
            for (int q = 0; q < 8; q++) u[q] = r0 + q < c.y ? ev.used[h[q]] : 1u;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                if (r0 + q < c.y) {
                    if (stage) st.shared_hits[c.x - st.h0 + r0 + q] = h[q];
                    n_free += u[q] ? 0u : 1u;
                }
            }
        }
        st.free0[j] = n_free;
    }
    __syncthreads();
    // The keys: (127 - length) above the chi2/ndf key above the index (< 512), padded to
    // a power of two with keys above every candidate's.
    u32 n_keys = 32;
    while (n_keys < m) n_keys <<= 1;
    for (u32 j = threadIdx.x; j < n_keys; j += CT) {
        u64 k = ~0ull;
        if (j < m) {
            const uint4 cj = st.cand[j];
            k = (u64)(127u - cj.y) << 41 | (u64)choice_key(cj) << 9 | j;
        }
        st.keys[j] = k;
    }
    __syncthreads();
    bitonic_sort_block<CT>(st.keys, n_keys);
    for (u32 r = threadIdx.x; r < m; r += CT) {
        st.order[r] = from + (u32)(st.keys[r] & 0x1ffu);
    }
    for (u32 j = threadIdx.x; j < m; j += CT) {
        uint4 cj = st.cand[j];
        const u32* hj = chunk_hits(st, cj);
        for (u32 r = 0; r < cj.y; r++) {
            u32 b = hj[r] & 0xffffu;
            u32 bit = 1u << (b & 31);
            if (atomicOr(&st.bits[b >> 5], bit) & bit) atomicOr(&st.twice[b >> 5], bit);
        }
    }
    __syncthreads();
    // The first rank holding each shared hit, by slot (the hit modulo FIRST_SLOTS): the
    // least (rank, hit) of the slot, in the keys' words, free now that the order is read
    // out. A slot tells the first holder of its hit exactly; of another hit of the slot,
    // only that no rank before the slot's holds it.
    u64* first = st.keys;
    for (u32 i = threadIdx.x; i < FIRST_SLOTS; i += CT) first[i] = ~0ull;
    __syncthreads();
    for (u32 r = threadIdx.x; r < m; r += CT) {
        const uint4 cj = st.cand[st.order[r] - from];
        const u32* hj = chunk_hits(st, cj);
        for (u32 q = 0; q < cj.y; q++) {
            const u32 h = hj[q], b = h & 0xffffu;
            if ((st.twice[b >> 5] >> (b & 31)) & 1u)
                atomicMin(&first[h % FIRST_SLOTS], (u64)r << 32 | h);
        }
    }
    __syncthreads();
    for (u32 r = threadIdx.x; r < m; r += CT) {
        const u32 j = st.order[r] - from;
        uint4 cj = st.cand[j];
        bool fast = st.free0[j] == cj.y && good_candidate(cj, min_hits, max_chi2_ndf);
        const u32* hj = chunk_hits(st, cj);
        for (u32 q = 0; fast && q < cj.y; q++) {
            const u32 b = hj[q] & 0xffffu;
            fast = !((st.twice[b >> 5] >> (b & 31)) & 1u) ||
                   (u32)(first[hj[q] % FIRST_SLOTS] >> 32) == r;
        }
        st.fast[j] = fast ? FAST_ACCEPT : 0u;
    }
    __syncthreads();
    // Doomed: fewer hits than a track needs left once the hits used at the chunk's start
    // and those of fast candidates before it are out (all taken before its turn, whatever
    // else happens): the choice would drop it (a lost hit, too few left to refit).
    for (u32 r = threadIdx.x; r < m; r += CT) {
        const u32 j = st.order[r] - from;
        if (st.fast[j] == FAST_ACCEPT) continue;
        const uint4 cj = st.cand[j];
        const u32* hj = chunk_hits(st, cj);
        u32 n_left = 0;
        for (u32 q = 0; q < cj.y; q++) {
            const u32 h = hj[q], b = h & 0xffffu;
            bool taken = ev.used[h] != 0u;
            if (!taken && ((st.twice[b >> 5] >> (b & 31)) & 1u)) {
                const u64 f = first[h % FIRST_SLOTS];
                const u32 fr = (u32)(f >> 32);
                taken = (u32)f == h && fr < r && st.fast[st.order[fr] - from] == FAST_ACCEPT;
            }
            n_left += taken ? 0u : 1u;
        }
        if (n_left < min_hits) st.fast[j] = FAST_DROP;
    }
    __syncthreads();
}

// A candidate of the choice that lost a hit to a better track of the chunk, `n_free` of
// its hits left (in one thread): refitted without the taken hits, and accepted if it
// passes the cut. False where the event fails.
__device__ bool choose_refit(const CandEvent& ev, const CandArenas& a, const KalmanTables& T,
                             CandState& s, uint4 c, u32 n_free, u32* bits) {
    if (n_free < s.min_hits || s.n_cand == s.max_cand || s.n_hits + c.y > s.hits_cap) {
        return true;
    }
    u32 base = s.n_cand;
    if (!push_copy(ev, a, s, c.x, c.y, true, n_free)) return false;
    fit_candidate(ev, a, T, base);
    uint4 cb = a.cand[base];
    if (good_candidate(cb, s.min_hits, s.max_chi2_ndf) &&
        !accept_candidate(ev, a, s, base, a.chits + cb.x, cb.y, bits)) {
        return false;
    }
    return true;
}

// Lane 0's counters (written to *shared_s) and verdict `ok`, handed to every lane of the
// warp; the second __syncwarp keeps lane 0 from writing *shared_s again before every lane
// has read it.
__device__ __forceinline__ int from_lane0(CandState& s, int ok, const CandState* shared_s) {
    __syncwarp();
    s = *shared_s;
    ok = __shfl_sync(0xffffffffu, ok, 0);
    __syncwarp();
    return ok;
}

// Second chances fitted ahead (speculate_second_chances): per chunk, two slots per chunk
// candidate at the top of the event's share of the candidate and fit arenas, used where
// the choice's copies cannot reach them (at most two per candidate of the chunk).
struct SpecFits {
    u32 base;   // the first slot; ~0u: none this chunk
    u32* done;  // [SPEC_WORDS] shared: bit 2 j + v set once copy v of candidate j is fitted
};
#define SPEC_WORDS ((2 * CHUNK_MAX + 31) / 32)

// Whether the second chance of chunk candidate j (record c) is fitted ahead: it failed the
// cut with every hit free at the chunk's start, has more hits than a track needs and no
// verdict from the stage. Every second chance the choice gives is one of these (it gives
// one to a candidate with no verdict that failed the cut with every hit still free and
// hits to spare); the choice waits for a fit made ahead only where this holds, and fits
// the copies itself otherwise, so that the two can never disagree into a wait.
__device__ __forceinline__ bool second_chance_ahead(const ChunkStage& st, u32 j, uint4 c,
                                                    u32 min_hits, double max_chi2_ndf) {
    return st.fast[j] == 0u && st.free0[j] == c.y && c.y > min_hits &&
           !good_candidate(c, min_hits, max_chi2_ndf);
}

// The fits of the second chances the choice may give, made by the block's other warps
// while its first warp chooses: for every candidate of the chunk that failed the cut with
// every hit free at the chunk's start, more hits than a track needs and no verdict from
// the stage, its two copies (without the last hit, without the first) fitted into its
// slots in the order of the choice, a thread each. The same code on the same hits gives
// the fit the choice would make of the copy; a copy not needed is never read.
template <u32 CT>
__device__ void speculate_second_chances(const CandEvent& ev, const CandArenas& a,
                                         const KalmanTables& T, u32 from, u32 m,
                                         const ChunkStage& st, SpecFits spec, u32 min_hits,
                                         double max_chi2_ndf) {
    const u32 t = threadIdx.x - 32u;
    const u32 v = t & 1u;
    for (u32 r = t >> 1; r < m; r += (CT - 32u) / 2u) {
        const u32 j = st.order[r] - from;
        const uint4 c = st.cand[j];
        if (!second_chance_ahead(st, j, c, min_hits, max_chi2_ndf)) continue;
        const u32 bit = 2u * j + v;
        // Fitted ahead already, in the chunk's fit round.
        if ((spec.done[bit >> 5] >> (bit & 31)) & 1u) continue;
        fit_hits_into(ev, a, T, c.x + v, c.y - 1u, spec.base + bit);
        __threadfence_block();
        atomicOr(&spec.done[bit >> 5], 1u << (bit & 31));
    }
}

// Copy `dst` of a second chance takes the fit made ahead in slot `src` (written by another
// warp of the block: read past L1).
__device__ void take_spec_fit(const CandArenas& a, u32 src, u32 dst) {
    const u32* f = a.fits + (size_t)src * FIT_WORDS;
    u32* g = a.fits + (size_t)dst * FIT_WORDS;
#pragma unroll
    for (int w = 0; w < FIT_WORDS; w++) g[w] = __ldcg(f + w);
    const uint4 cs = __ldcg(a.cand + src);
    const uint4 cd = a.cand[dst];
    a.cand[dst] = make_uint4(cd.x, cd.y, cs.z, cs.w);
}

// The second chance of a candidate that failed the cut with every hit free (choose in
// candidates.rs), by the choice's warp: lane 0 places its two copies (without the last
// hit, without the first), lanes 0 and 1 take their fits (made ahead where `spec` has
// slots and second_chance_ahead holds, waiting for them; else fitted now, one each at the
// same time), and lane 0 accepts the better one that passes the cut. `j` is the
// candidate's index in the chunk.
// The counters go through `shared_s`. False (in every lane) where the event fails.
__device__ bool choose_second_chance(const CandEvent& ev, const CandArenas& a,
                                     const KalmanTables& T, CandState& s, uint4 c, u32 j,
                                     SpecFits spec, const ChunkStage& st,
                                     CandState* shared_s) {
    u32* bits = st.bits;
    const bool ahead =
        spec.base != ~0u && second_chance_ahead(st, j, c, s.min_hits, s.max_chi2_ndf);
    const u32 lane = threadIdx.x & 31u;
    int ok = 1;
    if (lane == 0) {
        for (int v = 0; v < 2 && ok; v++) {
            if (s.n_cand == s.max_cand || s.n_hits + c.y > s.hits_cap ||
                !push_copy(ev, a, s, c.x + (u32)v, c.y - 1, false, c.y - 1)) {
                ok = 0;
            }
        }
        *shared_s = s;
    }
    if (!from_lane0(s, ok, shared_s)) return false;
    const u32 base = s.n_cand - 2;
    if (lane < 2) {
        if (ahead) {
            const u32 bit = 2u * j + lane;
            const volatile u32* dw = spec.done + (bit >> 5);
            while (!((*dw >> (bit & 31)) & 1u)) {
                SPIN_PAUSE();
            }
            __threadfence_block();
            take_spec_fit(a, spec.base + bit, base + lane);
        } else {
            fit_candidate(ev, a, T, base + lane);
        }
    }
    __syncwarp();
    if (lane == 0) {
        int best = -1;
        float best_q = 0.0f;
        for (u32 q = base; q < base + 2; q++) {
            uint4 cq = a.cand[q];
            if (!good_candidate(cq, s.min_hits, s.max_chi2_ndf)) continue;
            float qq = __uint_as_float(cq.z) / (float)cq.w;
            if (best < 0 || qq < best_q) {
                best = (int)q;
                best_q = qq;
            }
        }
        if (best >= 0) {
            uint4 cb = a.cand[best];
            if (!accept_candidate(ev, a, s, (u32)best, a.chits + cb.x, cb.y, bits)) ok = 0;
        }
        *shared_s = s;
    }
    return from_lane0(s, ok, shared_s) != 0;
}

#ifdef CA_PHASE_CLOCKS
// Profiling builds: the choice's slow calls per block, by kind (0 lost hits and dropped,
// 1 lost hits and refitted, 2 second chance), and their cycles.
__shared__ unsigned long long ca_slow_calls[3], ca_slow_cycles[3];
#ifdef CA_COUNT_RETRIES
// With -DCA_COUNT_RETRIES too: the chunk's candidates whose first fit pass asks for the
// retry (computed once more, so the phase's cycles are not the kernel's), and the chunks
// with at least one such candidate.
__shared__ u32 ca_retry_fits, ca_retry_chunks, ca_chunk_has_retry;
#endif
#endif

// choose in candidates.rs over the staged chunk, by the block's first warp (all its 32
// lanes, each with the same copy of the counters `s`): a candidate's hits are checked and
// taken by the lanes together, one candidate after the other in the choice's order (a
// __syncwarp between two orders the used flags and the filter); a candidate that failed
// the cut gets its second chance from the warp (choose_second_chance), one that lost a
// hit goes to lane 0 (choose_refit); both hand the counters back through `shared_s`.
// False (in every lane) where the event fails.
__device__ bool choose_candidates(const CandEvent& ev, const CandArenas& a, const KalmanTables& T,
                                  CandState& s, u32 from, u32 m, ChunkStage& st, SpecFits spec,
                                  CandState* shared_s) {
    const u32 lane = threadIdx.x & 31u;
    for (u32 i = 0; i < m;) {
        // A run of candidates from rank i (at most 32) whose verdict the stage knew:
        // together, each by a lane, the accepted ones in the order of the choice.
        {
            const u32 rl = i + lane;
            u32 kl = 0;
            u32 fl = 0u;
            if (rl < m) {
                kl = st.order[rl];
                fl = st.fast[kl - from];
            }
            const u32 not_fast = ~__ballot_sync(0xffffffffu, fl != 0u);
            const u32 run = not_fast ? (u32)__ffs(not_fast) - 1u : 32u;
            if (run > 0) {
                const u32 in_run = run == 32u ? ~0u : (1u << run) - 1u;
                const u32 acc_mask = __ballot_sync(0xffffffffu, fl == FAST_ACCEPT) & in_run;
                const u32 n_new = (u32)__popc(acc_mask);
                if (s.n_acc + n_new > s.max_tracks) return false;
                if ((acc_mask >> lane) & 1u) {
                    // take_hit without the filter's bits, which the stage set for every
                    // hit of the chunk.
                    const u32 jl = kl - from;
                    const uint4 cl = st.cand[jl];
                    const u32* hl = chunk_hits(st, cl);
                    for (u32 r = 0; r < cl.y; r++) ev.used[hl[r]] = 1u;
                    a.acc[s.n_acc + (u32)__popc(acc_mask & ((1u << lane) - 1u))] = kl;
                }
#ifdef CA_PHASE_CLOCKS
                if (lane == 0) ca_slow_calls[0] += run - n_new;
#endif
                s.n_acc += n_new;
                i += run;
                __syncwarp();
                continue;
            }
        }
        u32 k = st.order[i];
        u32 j = k - from;
        uint4 c = st.cand[j];
        const u32* hits = chunk_hits(st, c);
        // Free: all its hits free at the chunk's start and none taken since (the used
        // flags read only where the filter's bit is set).
        bool is_free = st.free0[j] == c.y;
        if (is_free) {
            bool taken = false;
            for (u32 r = lane; r < c.y; r += 32) {
                u32 h = hits[r];
                if (maybe_used_in_chunk(st.bits, h) && ev.used[h]) taken = true;
            }
            is_free = !__any_sync(0xffffffffu, taken);
        }
        if (is_free && good_candidate(c, s.min_hits, s.max_chi2_ndf)) {
            // accept_candidate, its hits taken by the lanes together.
            if (s.n_acc == s.max_tracks) return false;
            for (u32 r = lane; r < c.y; r += 32) take_hit(ev, st.bits, hits[r]);
            if (lane == 0) a.acc[s.n_acc] = k;
            s.n_acc++;
            __syncwarp();
            i++;
            continue;
        }
        if (is_free) {
            // Failed the cut: a second chance without an end hit where it has hits to
            // spare (its two fits at once), nothing otherwise.
            if (c.y > s.min_hits) {
#ifdef CA_PHASE_CLOCKS
                const long long t0 = clock64();
#endif
                const bool ok2 =
                    choose_second_chance(ev, a, T, s, c, j, spec, st, shared_s);
#ifdef CA_PHASE_CLOCKS
                if (lane == 0) {
                    ca_slow_calls[2]++;
                    ca_slow_cycles[2] += clock64() - t0;
                }
#endif
                if (!ok2) return false;
            }
            i++;
            continue;
        }
        // Its hits still free, counted by the lanes together; with fewer than a track
        // needs, it is dropped here (what choose_refit would do).
        u32 n_free = 0;
        for (u32 r0 = 0; r0 < c.y; r0 += 32) {
            const u32 r = r0 + lane;
            n_free += __popc(__ballot_sync(0xffffffffu, r < c.y && !ev.used[hits[r]]));
        }
        if (n_free < s.min_hits) {
#ifdef CA_PHASE_CLOCKS
            if (lane == 0) ca_slow_calls[0]++;
#endif
            i++;
            continue;
        }
        int ok = 1;
        if (lane == 0) {
#ifdef CA_PHASE_CLOCKS
            const int kind = 1;
            const long long t0 = clock64();
#endif
            ok = choose_refit(ev, a, T, s, c, n_free, st.bits) ? 1 : 0;
#ifdef CA_PHASE_CLOCKS
            ca_slow_calls[kind]++;
            ca_slow_cycles[kind] += clock64() - t0;
#endif
            *shared_s = s;
        }
        if (!from_lane0(s, ok, shared_s)) return false;
        i++;
    }
    return true;
}

// The arguments of the candidate kernels, and the same arguments passed on.
#define CAND_PARAMS \
    const float* __restrict__ in_x, const float* __restrict__ in_y, \
    const u32* __restrict__ in_plane, const u32* __restrict__ hit_start, \
    const u32* __restrict__ sinput, const uint4* __restrict__ dbl, \
    const u32* __restrict__ dbl_base, const u32* __restrict__ trip_base, \
    const u32* __restrict__ tleft, const u32* __restrict__ tright, \
    const float* __restrict__ tchi2, const u32* __restrict__ level, \
    const u32* __restrict__ nb_off, const u32* __restrict__ nb_count, \
    const u32* __restrict__ nb_base, const u32* __restrict__ left, \
    const u64* __restrict__ keys, const u32* __restrict__ n_end, \
    const u32* __restrict__ chain_off, const u32* __restrict__ chain_base, \
    const u32* __restrict__ chain_fork, const u32* __restrict__ chain_hits, \
    u32* __restrict__ failed, u32* __restrict__ overflow, u32* __restrict__ used, \
    uint4* __restrict__ cand, u32* __restrict__ chits, u32* __restrict__ fits, \
    u32* __restrict__ acc, u32* __restrict__ n_cand, u32* __restrict__ n_chits, \
    u32* __restrict__ n_acc, u32 share_cand, u32 share_hits, u32 max_cand, u32 hits_cap, \
    u32 max_tracks, u32 min_hits, double max_chi2_ndf, int append, \
    const float* __restrict__ rows32, const double* __restrict__ rows64, \
    const int* __restrict__ gap_steps, const int* __restrict__ gap_kind, \
    const int* __restrict__ gap_slice, const float* __restrict__ slices, \
    const float* __restrict__ pf, const double* __restrict__ pd, \
    const int* __restrict__ pi, const float* __restrict__ nodes
#define CAND_ARGS \
    in_x, in_y, in_plane, hit_start, sinput, dbl, dbl_base, trip_base, tleft, tright, \
    tchi2, level, nb_off, nb_count, nb_base, left, keys, n_end, chain_off, chain_base, \
    chain_fork, chain_hits, failed, overflow, used, cand, chits, fits, acc, n_cand, \
    n_chits, n_acc, share_cand, share_hits, max_cand, hits_cap, max_tracks, min_hits, \
    max_chi2_ndf, append, rows32, rows64, gap_steps, gap_kind, gap_slice, slices, pf, pd, \
    pi, nodes

// The step for one event in a block of CT threads (both kernels below).
template <u32 CT>
__device__ __forceinline__ void candidates_block(CAND_PARAMS) {
    const int e = blockIdx.y;
    const u32 tid = threadIdx.x;
    __shared__ CandState s, s_choose;
    __shared__ u32 s_len[CT], s_flen[CT];
    __shared__ u32 s_off[CT], s_foff[CT];
    __shared__ u32 s_consumed, s_pending_from;
    __shared__ int s_close;
    // The placement's scan: per warp its candidates' and hits' sums, then which of its
    // entries bring the chunk to CAND_CHUNK.
    __shared__ u32 s_scan[3 * (CT / 32)];
    __shared__ u32 s_order[CHUNK_MAX];
    __shared__ u64 s_keys[RANK_KEYS];
    __shared__ uint4 s_cand[CHUNK_MAX];
    __shared__ u32 s_hits[STAGE_HITS];
    __shared__ u32 s_free0[CHUNK_MAX];
    __shared__ u32 s_bits[CHUNK_BITS_WORDS];
    __shared__ u32 s_twice[CHUNK_BITS_WORDS];
    __shared__ u32 s_fast[CHUNK_MAX];
    __shared__ u32 s_spec_done[SPEC_WORDS];
    if (failed[e]) return;
    ChunkStage st = {s_cand, s_hits, s_hits, 0u, s_free0, s_order, s_keys, s_bits, s_twice, s_fast};
    for (u32 i = tid; i < CHUNK_BITS_WORDS; i += CT) s_bits[i] = s_twice[i] = 0u;
    const KalmanTables T = {rows32, rows64, gap_steps, gap_kind, gap_slice,
                            slices, pf,     pd,        pi,       nodes};
    const u32 hs = hit_start[e];
    const u32 tb = trip_base[e];
    CandEvent ev;
    ev.sinput = sinput + hs;
    ev.used = used + hs;
    ev.x = in_x + hs;
    ev.y = in_y + hs;
    ev.plane = in_plane + hs;
    ev.dbl = dbl + dbl_base[e];
    ev.tleft = tleft + tb;
    ev.tright = tright + tb;
    ev.tchi2 = tchi2 + tb;
    ev.tqop = nullptr;
    ev.tsigma = nullptr;
    ev.level = level + tb;
    ev.nb_off = nb_off + tb;
    ev.nb_count = nb_count + tb;
    ev.left = left + nb_base[e];
    CandArenas a;
    a.cand = cand + (size_t)e * share_cand;
    a.chits = chits + (size_t)e * share_hits;
    a.fits = fits + (size_t)e * share_cand * FIT_WORDS;
    a.acc = acc + (size_t)e * share_cand;
    const u64* order = keys + 2 * (size_t)tb;
    const u32* walked = chain_hits + chain_base[e];
    const u32 n_order = n_end[e];
    const u32 key_mask = (1u << KEY_INDEX_BITS) - 1;
    if (tid == 0) {
        s.n_cand = append ? n_cand[e] : 0;
        s.n_hits = append ? n_chits[e] : 0;
        s.n_acc = append ? n_acc[e] : 0;
        s.max_cand = max_cand;
        s.hits_cap = hits_cap;
        s.max_tracks = max_tracks;
        s.share_cand = share_cand;
        s.share_hits = share_hits;
        s.min_hits = min_hits;
        s.max_chi2_ndf = max_chi2_ndf;
        s.failed = false;
        s_pending_from = s.n_cand;
    }
    __syncthreads();
    u32 chain[MAX_CHAIN], fchain[MAX_CHAIN];
    u32 oi = 0;
#ifdef CA_PHASE_CLOCKS
    // Profiling builds (-DCA_PHASE_CLOCKS through TRIGD_KERNEL_OPTIONS): thread 0 times
    // each phase of the loop, each interval ending at the barrier that closes the phase,
    // and prints the first two events' totals.
    long long ph[7] = {0, 0, 0, 0, 0, 0, 0};
    long long ph_t = clock64();
    u32 ph_windows = 0, ph_chunks = 0;
    if (tid < 3) ca_slow_calls[tid] = ca_slow_cycles[tid] = 0;
#ifdef CA_COUNT_RETRIES
    if (tid == 0) ca_retry_fits = ca_retry_chunks = ca_chunk_has_retry = 0u;
#endif
    __syncthreads();
#define CA_PHASE(k)                   \
    do {                              \
        if (tid == 0) {               \
            long long t_ = clock64(); \
            ph[k] += t_ - ph_t;       \
            ph_t = t_;                \
        }                             \
    } while (0)
#else
#define CA_PHASE(k) \
    do {            \
    } while (0)
#endif
    while (oi < n_order) {
        // Every thread builds the chains of one end triplet of the window.
        u32 my = oi + tid;
        u32 len = 0, flen = 0;
        int f_at = -1;
        if (my < n_order) {
            u32 t = (u32)(order[my] & key_mask);
            u32 lv = ev.level[t];
            u32 clen = lv + 2 < MAX_CHAIN ? lv + 2 : MAX_CHAIN;
            const u32* raw = walked + chain_off[tb + my];
            int r = filter_chain(ev, raw, clen, lv, min_hits, chain);
            len = r > 0 ? (u32)r : 0u;
            if (r >= 0 && chain_fork[tb + my]) {
                f_at = 0;
                int fr = filter_chain(ev, raw + clen, clen, lv, min_hits, fchain);
                flen = fr > 0 ? (u32)fr : 0u;
            }
        }
        s_len[tid] = len;
        // A fork found: its chain's length + 1 (0: no fork).
        s_flen[tid] = f_at >= 0 ? flen + 1 : 0;
        __syncthreads();
        CA_PHASE(0);
        // The placement by a scan over the block: each entry's candidates (its chain, its
        // fork) and their hits, summed in order; the chunk closes after the first entry
        // that brings it to CAND_CHUNK pending candidates. Where no limit can be reached
        // in the whole window (nearly every window) this places exactly what the CPU's loop below
        // places; otherwise thread 0 runs that loop.
        const u32 n_win = n_order - oi < CT ? n_order - oi : CT;
        const bool has_main = tid < n_win && len > 0;
        const bool has_fork = tid < n_win && f_at >= 0 && flen > 0;
        const u32 e_c = (has_main ? 1u : 0u) + (has_fork ? 1u : 0u);
        const u32 e_h = (has_main ? len : 0u) + (has_fork ? flen : 0u);
        u32 i_c = e_c, i_h = e_h;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u32 c2 = __shfl_up_sync(0xffffffffu, i_c, o);
            u32 h2 = __shfl_up_sync(0xffffffffu, i_h, o);
            if ((tid & 31u) >= (u32)o) {
                i_c += c2;
                i_h += h2;
            }
        }
        if ((tid & 31u) == 31u) {
            s_scan[tid >> 5] = i_c;
            s_scan[(CT / 32) + (tid >> 5)] = i_h;
        }
        __syncthreads();
        // The warps before this one's sums, and the block's.
        u32 tot_c = 0, tot_h = 0;
#pragma unroll
        for (u32 w = 0; w < (CT / 32); w++) {
            const u32 wc = s_scan[w], wh = s_scan[(CT / 32) + w];
            if (w < (tid >> 5)) {
                i_c += wc;
                i_h += wh;
            }
            tot_c += wc;
            tot_h += wh;
        }
        const CandState ps = s;
        const u32 pending_now = ps.n_cand - s_pending_from;
        const u32 cap_c = ps.max_cand < ps.share_cand ? ps.max_cand : ps.share_cand;
        const bool scan_ok = ps.n_cand + tot_c < cap_c &&
                             ps.n_hits + tot_h + MAX_CHAIN <= hits_cap / 2 &&
                             ps.n_hits + tot_h <= ps.share_hits;
        const u32 reach = __ballot_sync(0xffffffffu, tid < n_win && pending_now + i_c >= CAND_CHUNK);
        if ((tid & 31u) == 0u) s_scan[2 * (CT / 32) + (tid >> 5)] = reach;
        __syncthreads();
        if (scan_ok) {
            // The first entry that reaches it: in the first warp with one.
            u32 first = ~0u;
            for (u32 w = 0; w < (CT / 32); w++) {
                const u32 r = s_scan[2 * (CT / 32) + w];
                if (r) {
                    first = 32u * w + (u32)__ffs(r) - 1u;
                    break;
                }
            }
            const u32 consumed = first != ~0u ? first + 1u : n_win;
            if (tid < consumed) {
                u32 c0 = ps.n_cand + i_c - e_c, h0 = ps.n_hits + i_h - e_h;
                s_off[tid] = ~0u;
                s_foff[tid] = ~0u;
                if (has_main) {
                    s_off[tid] = h0;
                    a.cand[c0++] = make_uint4(h0, len, 0u, 0u);
                    h0 += len;
                }
                if (has_fork) {
                    s_foff[tid] = h0;
                    a.cand[c0] = make_uint4(h0, flen, 0u, 0u);
                }
            }
            if (tid == consumed - 1) {
                // The last entry placed holds the sums up to it.
                const u32 n_cand = ps.n_cand + i_c;
                int close = first != ~0u ? 1 : 0;
                if (!close && oi + consumed >= n_order && n_cand > s_pending_from) close = 1;
                s.n_cand = n_cand;
                s.n_hits = ps.n_hits + i_h;
                s_consumed = consumed;
                s_close = close;
            }
        } else if (tid == 0) {
            // The CPU's loop over the window, in order, with its limits (the counters in
            // registers).
            CandState ls = s;
            const u32 pending_from = s_pending_from;
            u32 j = 0;
            int close = 0;
            u32 lim_chits = hits_cap / 2;
            for (; j < CT && oi + j < n_order; j++) {
                s_off[j] = ~0u;
                s_foff[j] = ~0u;
                if (ls.n_cand == ls.max_cand || ls.n_hits + MAX_CHAIN > lim_chits) {
                    ls.failed = true;
                    j++;
                    break;
                }
                u32 l = s_len[j];
                if (l > 0) {
                    if (ls.n_cand >= ls.share_cand || ls.n_hits + l > ls.share_hits) {
                        ls.failed = true;
                        j++;
                        break;
                    }
                    s_off[j] = ls.n_hits;
                    a.cand[ls.n_cand++] = make_uint4(ls.n_hits, l, 0u, 0u);
                    ls.n_hits += l;
                }
                u32 fl = s_flen[j];
                if (fl > 0 && ls.n_cand < ls.max_cand && ls.n_hits + MAX_CHAIN <= lim_chits &&
                    fl - 1 > 0) {
                    fl -= 1;
                    if (ls.n_cand >= ls.share_cand || ls.n_hits + fl > ls.share_hits) {
                        ls.failed = true;
                        j++;
                        break;
                    }
                    s_foff[j] = ls.n_hits;
                    a.cand[ls.n_cand++] = make_uint4(ls.n_hits, fl, 0u, 0u);
                    ls.n_hits += fl;
                }
                if (ls.n_cand - pending_from >= CAND_CHUNK) {
                    close = 1;
                    j++;
                    break;
                }
            }
            if (!close && oi + j >= n_order && ls.n_cand > pending_from) close = 1;
            s = ls;
            s_consumed = j;
            s_close = close;
        }
        __syncthreads();
        CA_PHASE(1);
        if (s.failed) break;
        if (tid < s_consumed) {
            if (s_off[tid] != ~0u)
                for (u32 i = 0; i < len; i++) a.chits[s_off[tid] + i] = chain[i];
            if (s_foff[tid] != ~0u)
                for (u32 i = 0; i < flen; i++) a.chits[s_foff[tid] + i] = fchain[i];
        }
        __syncthreads();
        CA_PHASE(2);
        if (s_close) {
            const u32 m = s.n_cand - s_pending_from, from = s_pending_from;
            // The slots of second chances made ahead, where the choice's copies (at most
            // two per candidate) cannot reach them.
            const SpecFits spec = {s.n_cand + 2u * m + 2u * CHUNK_MAX <= s.share_cand
                                       ? s.share_cand - 2u * CHUNK_MAX
                                       : ~0u,
                                   s_spec_done};
            for (u32 i = tid; i < SPEC_WORDS; i += CT) s_spec_done[i] = 0u;
            __syncthreads();
            // The round's fits: the chunk's candidates, then, where the chunk leaves threads
            // without one, the copies a second chance would fit (copy k & 1 of candidate
            // k >> 1: without its last hit, without its first), as many as those threads,
            // into their slots (speculate_second_chances fits the rest in the choice). The
            // same code on the same hits gives the fit the choice would make of a copy; a
            // copy not needed is never read. (One call of the fit for both: a second one
            // would not fit the block's registers.)
            const u32 n_jobs =
                spec.base != ~0u && m < CT ? min(3u * m, (u32)CT) : m;
            for (u32 job = tid; job < n_jobs; job += CT) {
                const bool copy = job >= m;
                const u32 k = job - m;
                const uint4 cd = a.cand[from + (copy ? k >> 1 : job)];
                // (A copy reads the placed start and length, which the candidate's own
                // fit, beside, rewrites alike.)
                if (copy && cd.y <= min_hits) continue;
                fit_hits_into(ev, a, T, cd.x + (copy ? (k & 1u) : 0u), copy ? cd.y - 1u : cd.y,
                              copy ? spec.base + k : from + job);
                if (copy) {
                    __threadfence_block();
                    atomicOr(&s_spec_done[k >> 5], 1u << (k & 31));
                }
#if defined(CA_PHASE_CLOCKS) && defined(CA_COUNT_RETRIES)
                if (!copy) {
                    KalmanResult r1;
                    kalman_fit_pass(candidate_hits(ev, a, cd), (int)cd.y, MAX_CHAIN, T, r1,
                                    (int)cd.y / 2, __int_as_float(0x7fc00000),
                                    __int_as_float(0x7fc00000));
                    if (kalman_retry((int)cd.y, r1)) {
                        atomicAdd(&ca_retry_fits, 1u);
                        ca_chunk_has_retry = 1u;
                    }
                }
#endif
            }
            __syncthreads();
#if defined(CA_PHASE_CLOCKS) && defined(CA_COUNT_RETRIES)
            if (tid == 0) {
                ca_retry_chunks += ca_chunk_has_retry;
                ca_chunk_has_retry = 0u;
            }
#endif
            CA_PHASE(3);
            stage_chunk<CT>(ev, a, s_pending_from, m, st, min_hits, max_chi2_ndf);
            CA_PHASE(4);
            if (tid < 32) {
                // The counters in registers while the first warp works through the chunk.
                CandState ls = s;
                __syncwarp();
                if (!choose_candidates(ev, a, T, ls, from, m, st, spec, &s_choose)) {
                    ls.failed = true;
                }
                if (tid == 0) {
                    s = ls;
                    s_pending_from = ls.n_cand;
                }
            } else if (spec.base != ~0u) {
                speculate_second_chances<CT>(ev, a, T, from, m, st, spec, min_hits, max_chi2_ndf);
            }
            __syncthreads();
            CA_PHASE(5);
#ifdef CA_PHASE_CLOCKS
            ph_chunks++;
#endif
            if (s.failed) break;
            // The next chunk's filter and shared hits start empty.
            for (u32 i = tid; i < CHUNK_BITS_WORDS; i += CT) s_bits[i] = s_twice[i] = 0u;
        }
        oi += s_consumed;
        __syncthreads();
        CA_PHASE(6);
#ifdef CA_PHASE_CLOCKS
        ph_windows++;
#endif
    }
#ifdef CA_PHASE_CLOCKS
    if (tid == 0 && e < 2)
        printf("ca_candidates phases event %d append %d ends %u windows %u chunks %u "
               "candidates %u cycles filter %lld place %lld copy %lld fit %lld stage %lld "
               "choice %lld other %lld; slow calls dropped %llu (%llu cycles) refitted %llu "
               "(%llu) second chance %llu (%llu)\n",
               e, append, n_order, ph_windows, ph_chunks, s.n_cand, ph[0], ph[1], ph[2],
               ph[3], ph[4], ph[5], ph[6], ca_slow_calls[0], ca_slow_cycles[0],
               ca_slow_calls[1], ca_slow_cycles[1], ca_slow_calls[2], ca_slow_cycles[2]);
#endif
#if defined(CA_PHASE_CLOCKS) && defined(CA_COUNT_RETRIES)
    if (tid == 0 && e < 2)
        printf("ca_candidates retries event %d append %d: %u candidates' fits retried, in %u "
               "of %u chunks\n",
               e, append, ca_retry_fits, ca_retry_chunks, ph_chunks);
#endif
#undef CA_PHASE
    if (tid == 0) {
        if (s.failed) {
            fail_event(failed, overflow, e);
        } else {
            n_cand[e] = s.n_cand;
            n_chits[e] = s.n_hits;
            n_acc[e] = s.n_acc;
        }
    }
}

// Blocks of CAND_THREADS: a chunk's fits in one round. The host launches these where the
// launch has no more events than the device has multiprocessors: each event's block has
// a multiprocessor to itself.
extern "C" __global__ void __launch_bounds__(CAND_THREADS) ca_candidates(CAND_PARAMS) {
    candidates_block<CAND_THREADS>(CAND_ARGS);
}

// Blocks of CAND_THREADS_SMALL: the same step, the same results (a window's chains are
// filtered against the used flags of the window's start, so the window's size does not
// change what a chunk holds), with two events' blocks in the registers of one
// multiprocessor. Where a launch has more events than multiprocessors, one event's serial
// choice then overlaps another's fits.
extern "C" __global__ void __launch_bounds__(CAND_THREADS_SMALL)
    ca_candidates_small(CAND_PARAMS) {
    candidates_block<CAND_THREADS_SMALL>(CAND_ARGS);
}
