// Shared part of the cellular-automaton kernels (kernels/ca_*.cu): the layouts of the
// tables that src/gpu/tracking_ca.rs uploads from the CPU finder's own structures
// (FinderGeometry, PlaneWindows, PairLanes, the triplet step's Cuts, the bending tables),
// the per-event scan and the batch budget that every counting step shares.
//
// Every step runs a row of blocks per event (blockIdx.y = event; gridDim.x blocks, sized
// so that a batch fills the GPU whether it holds a few busy events or many small ones),
// their threads striding over the event's items; the per-event scan runs a few blocks per
// event that take its tiles in turn. Items of an event are
// indexed locally as the CPU indexes them (sorted hit, doublet, triplet), so a step's
// output for an event is the CPU's arrays for it.
// Steps that make a variable number of outputs run twice: count per item, scan per event
// (ca_event_scan), place events in the batch arena (ca_event_budget: an event beyond its
// limit or beyond the arena fails, with the step's code, and goes to the CPU), then write
// at the scanned offsets. Nothing in an output depends on the order threads arrive in.
//
// Compiled with --fmad=false: the window and kink arithmetic must round as the CPU's
// (which makes no fused multiply-adds), operation by operation, in the same order.

typedef unsigned int u32;

#define MAX_REACH 3
// The body of a loop that waits for another thread's write: nothing on the GPU; the CPU
// harnesses (tests/kernels_on_cpu), whose threads take turns, hand the turn over there.
#ifndef SPIN_PAUSE
#define SPIN_PAUSE()
#endif
#define CA_THREADS 256
// Threads of ca_event_scan's blocks (several per event, a tile of SCAN_THREADS *
// SCAN_ITEMS items each).
#define SCAN_THREADS 256
// Blocks of CA_THREADS per multiprocessor the doublet and triplet kernels are bounded to
// (64 registers a thread): the host sizes their grids to one wave of them
// (ITEM_BLOCKS_PER_SM in src/gpu/tracking_ca.rs).
#define ITEM_MIN_BLOCKS 4
// A triplet's planes in one word (tplane): its first hit's in the low half (the
// evolution's order), its last hit's in the high half (the dead ends' order).
#define TPLANE(first, last) ((first) | ((last) << 16))
#define TPLANE_FIRST(v) ((v) & 0xffffu)
#define TPLANE_LAST(v) ((v) >> 16)
// Items per thread in each chunk of the per-event scan.
#define SCAN_ITEMS 8
#define CA_INF __int_as_float(0x7f800000)
// The first item of this thread and the stride over an event's items.
#define CA_FIRST (blockIdx.x * CA_THREADS + threadIdx.x)
#define CA_STRIDE (gridDim.x * CA_THREADS)

// Tent tables (bending.rs): 17 x 17 nodes of 3 components, after t0[2], inv_step[2].
#define NODES 17
#define TENT_FLOATS (4 + NODES * NODES * 3)

// Per plane, floats: grid, windows of the doublet step (PlaneWindows), bending lever.
#define PLF 34
#define PLF_HALF_X 0
#define PLF_HALF_Y 1
#define PLF_SCALE_X 2
#define PLF_SCALE_Y 3
#define PLF_POINTING 4
#define PLF_INV_LEVER_A 5
#define PLF_MS 6
#define PLF_INV_LEVER 7
#define PLF_TARGET 8 // + 8 k: dz, bend, meas_x, meas_y, b[3], unused
#define PLF_HZ_INV_A 32 // a long origin seen from the plane: hz / a, a / (a - hz)
#define PLF_BOX_SCALE 33
// Per plane, ints: bins_x, bins_y, bin_offset, n_target, target planes[3].
#define PLI 8
// Per plane, doubles: inv_dz of each target.
#define PLD 4
// Per plane pair (i, j) at i * n_planes + j, floats (PairLanes).
#define PRF 20
#define PRF_POINTING 0
#define PRF_INV_ZI 1
#define PRF_TWO_INV_ZJ 2
#define PRF_HARD_KX 3
#define PRF_HARD_KY 4
#define PRF_KVAR_MS 5
#define PRF_KVAR_RES 6
#define PRF_N_TRIPLES 7
#define PRF_HALF 8
#define PRF_TH2 11
#define PRF_VAR 14
#define PRF_HARD_SLOPE 17 // a long origin: the hard error per chord slope, per curvature
#define PRF_KAPPA_REL 18
// Per plane pair, ints: pointing tent index, triple tent index per s (-1: none).
#define PRI 4
// Globals, floats.
#define G_MAX_TX 0
#define G_MAX_TY 1
#define G_MAX_CX 2
#define G_MAX_CY 3
#define G_SF_MAX 4
#define G_ORIGIN_HX 5
#define G_ORIGIN_HY 6
#define G_K_QOP 7
#define G_QOP_MAX 8
#define G_N_SIGMA 9
#define G_MASS2 10
#define G_SF2_MAX 11
#define G_CHI2_MAX 12
#define G_FIT_MOMENTUM 13
#define G_UNIFORM 14
#define G_UB 15 // 3
#define G_K 18
#define G_MIN_EVENT_HITS 19 // events with fewer sorted hits make no doublets in the pass
#define G_ORIGIN_X 20 // the origin's centre in x and y, mm
#define G_ORIGIN_Y 21
#define G_N 22

// Failure codes of an event (the step that overflowed).
#define FAIL_NONE 0u
#define FAIL_HITS 1u
#define FAIL_DOUBLETS 2u
#define FAIL_TRIPLETS 3u
#define FAIL_NEIGHBOURS 4u
#define FAIL_CANDIDATES 5u

// The first of v[lo..hi) (ascending) at or above x: a binary search.
template <typename T>
__device__ __forceinline__ u32 lower_bound_of(const T* __restrict__ v, u32 lo, u32 hi, T x) {
    while (lo < hi) {
        const u32 mid = (lo + hi) >> 1;
        if (v[mid] < x) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Bin column or row of v (PlaneGeometry::bin_1d): clamped, then truncated.
__device__ __forceinline__ u32 bin_1d(const float* pl, const int* pi, int axis, float v) {
    int n = axis == 0 ? pi[0] : pi[1];
    float half = pl[PLF_HALF_X + axis];
    float scale = pl[PLF_SCALE_X + axis];
    float f = (v + half) * scale;
    int nc = n < 1 ? 1 : (n > 65536 ? 65536 : n);
    float top = (float)(nc - 1);
    f = fminf(fmaxf(f, 0.0f), top);
    return (u32)f;
}

// A warp's work queue (the doublets of a later pass, the triplets' write pass): most items
// of a lane-per-item loop have nothing to do, so each warp takes its lanes' items over
// WARP_QUEUE_GROUP strides, queues those with work in order in shared memory
// (warp_enqueue, every lane calling it together) and shares them out over its lanes.
#define WARP_QUEUE_GROUP 4

// Appends `item` where `take`, after the `n_q` queued; returns the new count (all lanes).
__device__ __forceinline__ u32 warp_enqueue(u32* queue, u32 n_q, bool take, u32 item) {
    const u32 lane = threadIdx.x & 31u;
    const u32 mask = __ballot_sync(0xffffffffu, take);
    if (take) queue[n_q + __popc(mask & ((1u << lane) - 1u))] = item;
    return n_q + __popc(mask);
}

// The block's strided loop over an event's items 0..n through each warp's queue:
// `take(i, &item)` (i < n) says whether item i has work and which value to queue for it
// (the item itself unless it sets another); `work(item)` does it. Every thread of a block
// of CA_THREADS calls it together.
template <typename Take, typename Work>
__device__ __forceinline__ void warp_queue_each(u32 n, Take take, Work work) {
    __shared__ u32 s_queue[CA_THREADS / 32][32 * WARP_QUEUE_GROUP];
    const u32 lane = threadIdx.x & 31u;
    u32* queue = s_queue[threadIdx.x >> 5];
    for (u32 w0 = CA_FIRST - lane; w0 < n; w0 += WARP_QUEUE_GROUP * CA_STRIDE) {
        u32 n_q = 0;
        for (u32 q = 0; q < WARP_QUEUE_GROUP; q++) {
            const u32 i = w0 + q * CA_STRIDE + lane;
            u32 item = i;
            const bool has = i < n && take(i, &item);
            n_q = warp_enqueue(queue, n_q, has, item);
        }
        __syncwarp();
        for (u32 q = lane; q < n_q; q += 32) work(queue[q]);
        __syncwarp();
    }
}

// Inclusive scan of v over the block (THREADS threads, at most 1024); returns the inclusive
// value and the block's total in *total.
template <u32 THREADS>
__device__ __forceinline__ u32 block_scan_inclusive_of(u32 v, u32* total) {
    __shared__ u32 warp_sums[THREADS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        u32 n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < THREADS / 32 ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            u32 n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        if (lane < THREADS / 32) warp_sums[lane] = w;
    }
    __syncthreads();
    if (warp > 0) v += warp_sums[warp - 1];
    *total = warp_sums[THREADS / 32 - 1];
    __syncthreads();
    return v;
}

// block_scan_inclusive_of over a block of CA_THREADS.
__device__ __forceinline__ u32 block_scan_inclusive(u32 v, u32* total) {
    return block_scan_inclusive_of<CA_THREADS>(v, total);
}

// Items of one tile of the per-event scan.
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)
// A tile's status word in the per-event scan: the scan's epoch (30 bits), the flag, the
// value. A word of another epoch reads as not yet published.
#define SCAN_AGGREGATE 1ull
#define SCAN_PREFIX 2ull
#define SCAN_EPOCH_BITS 30
__device__ __forceinline__ unsigned long long scan_word(u32 epoch, unsigned long long flag,
                                                        u32 value) {
    return (unsigned long long)epoch << 34 | flag << 32 | value;
}

// The next tile of event e's scan for this block, in the order blocks ask: a tile's
// predecessors are then all held by blocks that run (or ran), so waiting for them always
// ends. The ticket word holds the epoch above the count: the event's first block (which
// starts before the others) sets it to this epoch's count of 0, the others wait for that
// once (`started`), then each ticket is one atomic add.
__device__ __forceinline__ u32 scan_ticket(unsigned long long* ticket, u32 epoch, bool* started) {
    if (!*started) {
        if (blockIdx.x == 0) {
            atomicExch(ticket, (unsigned long long)epoch << 32);
        } else {
            while ((u32)(__ldcg(ticket) >> 32) != epoch) {
                SPIN_PAUSE();
            }
        }
        *started = true;
    }
    return (u32)atomicAdd(ticket, 1ull);
}

// Per event: exclusive scan of count[base[e] .. base[e] + n[e]] into offset[...] (the same
// positions), the event's total into total[e], and with `sentinel` the total also at
// offset[base[e] + n[e]]. A failed event scans nothing and totals 0.
//
// Several blocks per event (gridDim.x), each taking the event's tiles of SCAN_TILE items
// in turn (scan_ticket): a tile's sum over the block, published at once with its status
// word; its first warp then adds the published sums of the tiles before it, 32 at a time,
// back to the nearest one that published its prefix (a decoupled look-back), and
// publishes its own. The events' status words start at base / SCAN_TILE + e (ranges that
// do not overlap: the bases grow by at least the items). Each launch has a new epoch: the
// host sets `epoch_base` on the stream before a sequence of scans (a recorded graph's
// included) and numbers them `k` = 1, 2, ...; it clears the words when the epochs wrap.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
ca_event_scan(const u32* __restrict__ count, u32* __restrict__ offset,
              const u32* __restrict__ base, const u32* __restrict__ n, u32 base_stride,
              const u32* __restrict__ failed, u32* __restrict__ total, int sentinel,
              unsigned long long* __restrict__ status, unsigned long long* __restrict__ tickets,
              const u32* __restrict__ epoch_base, u32 k) {
    const u32 epoch = *epoch_base + k;
    __shared__ u32 s_tile, s_prefix;
    const int e = blockIdx.y;
    const u32 lane = threadIdx.x & 31u;
    // `base` null: event e's items start at e * base_stride.
    const u32 b = base ? base[e] : (u32)e * base_stride;
    const bool fail = failed[e] != 0u;
    const u32 m = fail ? 0u : n[e];
    const u32 n_tiles = (m + SCAN_TILE - 1) / SCAN_TILE;
    unsigned long long* st = status + b / SCAN_TILE + (u32)e;
    bool started = false;
    for (;;) {
        if (threadIdx.x == 0) s_tile = scan_ticket(tickets + e, epoch, &started);
        __syncthreads();
        const u32 t = s_tile;
        if (t >= n_tiles) {
            // An event without items: its total by the block with the first ticket.
            if (n_tiles == 0 && t == 0 && threadIdx.x == 0) {
                total[e] = 0;
                if (sentinel && !fail) offset[b] = 0;
            }
            return;
        }
        const u32 i0 = t * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
        u32 v[SCAN_ITEMS];
        u32 sum = 0;
#pragma unroll
        for (int k = 0; k < SCAN_ITEMS; k++) {
            v[k] = i0 + k < m ? count[b + i0 + k] : 0;
            sum += v[k];
        }
        u32 tile_sum;
        const u32 incl = block_scan_inclusive_of<SCAN_THREADS>(sum, &tile_sum);
        if (threadIdx.x < 32) {
            u32 before = 0;
            if (t == 0) {
                if (lane == 0) __stcg(st, scan_word(epoch, SCAN_PREFIX, tile_sum));
            } else {
                if (lane == 0) __stcg(st + t, scan_word(epoch, SCAN_AGGREGATE, tile_sum));
                // The look-back: lane l reads tile j - l.
                int j = (int)t - 1;
                for (;;) {
                    const int idx = j - (int)lane;
                    unsigned long long w = idx >= 0 ? __ldcg(st + idx)
                                                    : scan_word(epoch, SCAN_PREFIX, 0u);
                    const u32 flag = (u32)(w >> 34) == epoch ? (u32)(w >> 32) & 3u : 0u;
                    const u32 not_ready = __ballot_sync(0xffffffffu, flag == 0u);
                    const u32 prefix = __ballot_sync(0xffffffffu, flag == (u32)SCAN_PREFIX);
                    // Lanes up to the nearest prefix count (all 32 without one).
                    const u32 stop = prefix ? (u32)__ffs(prefix) - 1u : 31u;
                    const u32 need = stop == 31u ? 0xffffffffu : (2u << stop) - 1u;
                    if (not_ready & need) {
                        SPIN_PAUSE();
                        continue;
                    }
                    u32 val = lane <= stop ? (u32)w : 0u;
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) val += __shfl_xor_sync(0xffffffffu, val, o);
                    before += val;
                    if (prefix) break;
                    j -= 32;
                }
                if (lane == 0) __stcg(st + t, scan_word(epoch, SCAN_PREFIX, before + tile_sum));
            }
            if (lane == 0) s_prefix = before;
        }
        __syncthreads();
        const u32 before = s_prefix;
        u32 run = before + incl - sum;
#pragma unroll
        for (int k = 0; k < SCAN_ITEMS; k++) {
            if (i0 + k < m) offset[b + i0 + k] = run;
            run += v[k];
        }
        if (t == n_tiles - 1 && threadIdx.x == 0) {
            total[e] = before + tile_sum;
            if (sentinel) offset[b + m] = before + tile_sum;
        }
        // s_tile and s_prefix are read before the next tile writes them.
        __syncthreads();
    }
}

// Places the events of the batch in a step's arena, in event order: an event whose total
// exceeds `per_event_max` (the CPU finder's own limit, where it overflows too) or that
// does not fit in what is left of `capacity` fails with `code` (counted in
// overflow[code]); the others get base[e] and n[e]. One block, over CA_THREADS events at a
// time: where all of them fit in what is left, their bases are a scan of the block; where
// some may not, one thread places them one after the other (the placement is sequential
// by nature: an event that does not fit leaves room for the next).
extern "C" __global__ void ca_event_budget(const u32* __restrict__ total, u32* __restrict__ base,
                                           u32* __restrict__ n, u32* __restrict__ failed,
                                           u32 n_events, u32 per_event_max, u32 capacity,
                                           u32 code, u32* __restrict__ overflow) {
    __shared__ u32 t[CA_THREADS];
    __shared__ u32 f[CA_THREADS];
    __shared__ u32 nk[CA_THREADS];
    __shared__ u32 s_used;
    u32 used = 0;
    for (u32 c0 = 0; c0 < n_events; c0 += CA_THREADS) {
        const u32 i = c0 + threadIdx.x;
        const bool in = i < n_events;
        const u32 k = in ? total[i] : 0;
        const u32 fl = in ? failed[i] : FAIL_NONE;
        const bool over = fl == FAIL_NONE && k > per_event_max;
        const u32 kk = in && fl == FAIL_NONE && !over ? k : 0;
        u32 chunk;
        const u32 incl = block_scan_inclusive(kk, &chunk);
        if ((unsigned long long)used + chunk <= capacity) {
            if (in) {
                if (over) {
                    failed[i] = code;
                    atomicAdd(&overflow[code], 1u);
                }
                base[i] = used + incl - kk;
                n[i] = kk;
            }
            used += chunk;
            continue;
        }
        t[threadIdx.x] = k;
        f[threadIdx.x] = fl;
        __syncthreads();
        if (threadIdx.x == 0) {
            const u32 m = n_events - c0 < CA_THREADS ? n_events - c0 : CA_THREADS;
            for (u32 q = 0; q < m; q++) {
                u32 kq = t[q];
                if (f[q] == FAIL_NONE && (kq > per_event_max || kq > capacity - used)) {
                    f[q] = code;
                    overflow[code] += 1;
                }
                if (f[q] != FAIL_NONE) kq = 0;
                t[q] = used;
                nk[q] = kq;
                used += kq;
            }
            s_used = used;
        }
        __syncthreads();
        if (in) {
            base[i] = t[threadIdx.x];
            n[i] = nk[threadIdx.x];
            failed[i] = f[threadIdx.x];
        }
        used = s_used;
        __syncthreads();
    }
}
