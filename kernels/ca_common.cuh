// Shared part of the cellular-automaton kernels (kernels/ca_*.cu): the layouts of the
// tables that src/gpu/tracking_ca.rs uploads from the CPU finder's own structures
// (FinderGeometry, PlaneWindows, PairLanes, the triplet step's Cuts, the bending tables),
// the per-event scan and the batch budget that every counting step shares.
//
// Every step runs a row of blocks per event (blockIdx.y = event; gridDim.x blocks, sized
// so that a batch fills the GPU whether it holds a few busy events or many small ones),
// their threads striding over the event's items; the per-event scan and ca_bin_hits run
// one block per event. Items of an event are indexed locally as the CPU indexes them (sorted
// hit, doublet, triplet), so a step's output for an event is the CPU's arrays for it.
// Steps that make a variable number of outputs run twice: count per item, scan per event
// (ca_event_scan), place events in the batch arena (ca_event_budget: an event beyond its
// limit or beyond the arena fails, with the step's code, and goes to the CPU), then write
// at the scanned offsets. Nothing in an output depends on the order threads arrive in.
//
// Compiled with --fmad=false: the window and kink arithmetic must round as the CPU's
// (which makes no fused multiply-adds), operation by operation, in the same order.

typedef unsigned int u32;

#define MAX_REACH 3
#define CA_THREADS 256
// Threads of ca_event_scan's block (one per event: the more, the fewer chunks in turn).
#define SCAN_THREADS 1024
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

// Per event: exclusive scan of count[base[e] .. base[e] + n[e]] into offset[...] (the same
// positions), the event's total into total[e], and with `sentinel` the total also at
// offset[base[e] + n[e]]. A failed event scans nothing and totals 0. One block of
// SCAN_THREADS per event.
extern "C" __global__ void ca_event_scan(const u32* __restrict__ count, u32* __restrict__ offset,
                                         const u32* __restrict__ base, const u32* __restrict__ n,
                                         u32 base_stride, const u32* __restrict__ failed,
                                         u32* __restrict__ total, int sentinel) {
    int e = blockIdx.y;
    // `base` null: event e's items start at e * base_stride.
    u32 b = base ? base[e] : (u32)e * base_stride;
    u32 m = failed[e] ? 0 : n[e];
    u32 carry = 0;
    // Chunks of SCAN_ITEMS consecutive items per thread: a serial scan in the thread, a
    // block scan of the threads' sums.
    for (u32 c0 = 0; c0 < m; c0 += SCAN_THREADS * SCAN_ITEMS) {
        u32 i0 = c0 + threadIdx.x * SCAN_ITEMS;
        u32 v[SCAN_ITEMS];
        u32 sum = 0;
#pragma unroll
        for (int k = 0; k < SCAN_ITEMS; k++) {
            v[k] = i0 + k < m ? count[b + i0 + k] : 0;
            sum += v[k];
        }
        u32 chunk;
        u32 run = carry + block_scan_inclusive_of<SCAN_THREADS>(sum, &chunk) - sum;
#pragma unroll
        for (int k = 0; k < SCAN_ITEMS; k++) {
            if (i0 + k < m) offset[b + i0 + k] = run;
            run += v[k];
        }
        carry += chunk;
    }
    if (threadIdx.x == 0) {
        total[e] = carry;
        if (sentinel && !failed[e]) offset[b + m] = carry;
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
