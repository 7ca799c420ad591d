// Hit sorting into the grid (src/tracking/ca/hit_sorting.rs): per event, its hits by
// plane, then grid cell, then x (ties in input order), with bin_start per cell.
//
// ca_bin_hits (a row of blocks per event) counts each valid hit (known plane, finite x and
// y) in its cell; ca_event_scan turns the counts into bin_start, whose last entry is the
// event's count of valid hits; ca_place_hits fails the event when that exceeds max_hits
// (the CPU would drop the excess: the event goes back to it), and otherwise drops each
// hit's index into its cell (arrival order, a scratch array); ca_rank_hits gives each its
// rank in the cell by (x, input index) and writes the sorted arrays, so the order never
// depends on the arrival.

extern "C" __global__ void ca_bin_hits(const float* __restrict__ in_x, const float* __restrict__ in_y,
                                       const u32* __restrict__ in_plane,
                                       const u32* __restrict__ hit_start,
                                       const float* __restrict__ plf, const int* __restrict__ pli,
                                       int n_planes, int n_bins, u32* __restrict__ hit_bin,
                                       u32* __restrict__ bin_count) {
    int e = blockIdx.y;
    u32 s = hit_start[e], m = hit_start[e + 1] - s;
    u32* counts = bin_count + (size_t)e * (n_bins + 1);
    for (u32 i = CA_FIRST; i < m; i += CA_STRIDE) {
        u32 p = in_plane[s + i];
        float x = in_x[s + i], y = in_y[s + i];
        u32 b = 0xffffffffu;
        if (p < (u32)n_planes && isfinite(x) && isfinite(y)) {
            const float* pl = plf + p * PLF;
            const int* pi = pli + p * PLI;
            u32 bx = bin_1d(pl, pi, 0, x), by = bin_1d(pl, pi, 1, y);
            b = (u32)pi[2] + by * (u32)pi[0] + bx;
            atomicAdd(&counts[b], 1u);
        }
        hit_bin[s + i] = b;
    }
}

// Every block of the event reads its count of valid hits (bin_start's last entry) and
// returns where it exceeds max_hits; the event's first block fails it and counts it, or
// else writes its count.
extern "C" __global__ void ca_place_hits(const u32* __restrict__ hit_start, const u32* __restrict__ hit_bin,
                                         const u32* __restrict__ bin_start, u32* __restrict__ bin_cursor,
                                         int n_bins, u32 max_hits, u32* __restrict__ n_sorted,
                                         u32* __restrict__ failed, u32* __restrict__ overflow,
                                         u32* __restrict__ scratch) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], m = hit_start[e + 1] - s;
    const u32* starts = bin_start + (size_t)e * (n_bins + 1);
    const u32 total = starts[n_bins];
    if (total > max_hits) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            failed[e] = FAIL_HITS;
            n_sorted[e] = 0;
            atomicAdd(&overflow[FAIL_HITS], 1u);
        }
        return;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) n_sorted[e] = total;
    u32* cursor = bin_cursor + (size_t)e * (n_bins + 1);
    for (u32 i = CA_FIRST; i < m; i += CA_STRIDE) {
        u32 b = hit_bin[s + i];
        if (b == 0xffffffffu) continue;
        u32 slot = starts[b] + atomicAdd(&cursor[b], 1u);
        scratch[s + slot] = i;
    }
}

extern "C" __global__ void ca_rank_hits(const float* __restrict__ in_x, const float* __restrict__ in_y,
                                        const u32* __restrict__ in_plane,
                                        const u32* __restrict__ hit_start,
                                        const u32* __restrict__ hit_bin,
                                        const u32* __restrict__ bin_start, int n_bins,
                                        const u32* __restrict__ n_sorted,
                                        const u32* __restrict__ failed,
                                        const u32* __restrict__ scratch,
                                        float* __restrict__ sx, float* __restrict__ sy,
                                        u32* __restrict__ splane, u32* __restrict__ sinput) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], m = n_sorted[e];
    const u32* starts = bin_start + (size_t)e * (n_bins + 1);
    for (u32 k = CA_FIRST; k < m; k += CA_STRIDE) {
        u32 li = scratch[s + k];
        u32 b = hit_bin[s + li];
        float x = in_x[s + li];
        u32 lo = starts[b], hi = starts[b + 1];
        u32 rank = 0;
        for (u32 j = lo; j < hi; j++) {
            u32 lj = scratch[s + j];
            float xj = in_x[s + lj];
            rank += (xj < x || (xj == x && lj < li)) ? 1u : 0u;
        }
        u32 dst = s + lo + rank;
        sx[dst] = x;
        sy[dst] = in_y[s + li];
        splane[dst] = in_plane[s + li];
        sinput[dst] = li;
    }
}

// The hits a later pass searches (hit_sorting.rs, free_hits): per event the sorted hits no
// track has taken, in sorted order, each with its sorted index (fmap), and the grid's cell
// starts among them (free_start), so that the doublets' windows scan only those.
// ca_free_flags marks them per sorted hit, ca_event_scan gives each its place (and the
// event's count, n_free), ca_free_hits copies them.
extern "C" __global__ void ca_free_flags(const u32* __restrict__ hit_start,
                                         const u32* __restrict__ n_sorted,
                                         const u32* __restrict__ sinput,
                                         const u32* __restrict__ used,
                                         const u32* __restrict__ failed, u32* __restrict__ flags) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], m = n_sorted[e];
    for (u32 h = CA_FIRST; h < m; h += CA_STRIDE) flags[s + h] = used[s + sinput[s + h]] ? 0u : 1u;
}

extern "C" __global__ void ca_free_hits(const u32* __restrict__ hit_start,
                                        const u32* __restrict__ n_sorted,
                                        const u32* __restrict__ bin_start, int n_bins,
                                        const u32* __restrict__ failed,
                                        const u32* __restrict__ flags,
                                        const u32* __restrict__ prefix,
                                        const u32* __restrict__ n_free,
                                        const float* __restrict__ sx, const float* __restrict__ sy,
                                        float* __restrict__ fx, float* __restrict__ fy,
                                        u32* __restrict__ fmap, u32* __restrict__ free_start) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], m = n_sorted[e];
    for (u32 h = CA_FIRST; h < m; h += CA_STRIDE) {
        if (flags[s + h]) {
            u32 d = s + prefix[s + h];
            fx[d] = sx[s + h];
            fy[d] = sy[s + h];
            fmap[d] = h;
        }
    }
    const u32* starts = bin_start + (size_t)e * (n_bins + 1);
    u32* fstarts = free_start + (size_t)e * (n_bins + 1);
    for (u32 b = CA_FIRST; b <= (u32)n_bins; b += CA_STRIDE) {
        u32 st = starts[b];
        fstarts[b] = st < m ? prefix[s + st] : n_free[e];
    }
}
