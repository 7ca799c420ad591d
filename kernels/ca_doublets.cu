// Doublets (src/tracking/ca/doublets.rs, the full search of one pass on fresh hits): per
// sorted hit a on plane i, per target plane j (i + 1 ..= i + reach), the box on plane j
// of PlaneWindows::boxes (same f32 operations in the same order), whose hits are found
// row by row of the grid between the box's cells, in sorted order. A hit's doublets come
// out ordered by target plane, row and x: by the sorted index of their second hit, as
// the CPU's.
//
// Run twice: write = 0 counts per hit (dbl_count), write = 1 writes at the event's base in
// the arena plus the hit's scanned offset (dbl_off): per doublet a, b, tx, ty in one
// 16-byte record (dbl) and the gap. The count keeps the second hits of a hit's first
// DBL_CACHE doublets, in their order, in its slots of `dcache`; the write takes a hit with
// at most that many from there instead of scanning its windows again (the slopes and gap
// computed from the two hits as the scan computes them). In a later pass (`fmap` not
// null), the windows scan only the hits no earlier track took: their copy in sorted order
// (fx, fy, with each one's sorted index in fmap and the cells' starts among them in
// free_start, from ca_free_hits), so doublets with a used hit are not made, as the CPU
// skips them, and the used hits are not read.
// A pass whose tables set G_MIN_EVENT_HITS makes none in an event with fewer sorted hits
// (the CPU does not run it there).

// The host's DBL_CACHE (src/gpu/tracking_ca.rs), which sizes `dcache`.
#define DBL_CACHE 16

struct Box4 {
    float x0, x1, y0, y1;
};

// The window of hit (xa, ya) on plane i towards its target k (PlaneWindows::boxes).
__device__ __forceinline__ Box4 doublet_box(const float* __restrict__ pl, const float* __restrict__ g,
                                            int k, float xa, float ya) {
    float max_tx = g[G_MAX_TX], max_ty = g[G_MAX_TY];
    float inv_lever_a = pl[PLF_INV_LEVER_A];
    // The hit's offsets from the origin's centre.
    float rx = xa - g[G_ORIGIN_X], ry = ya - g[G_ORIGIN_Y];
    float tx = fminf(fabsf(rx) * inv_lever_a + 0.05f, max_tx);
    float ty = fminf(fabsf(ry) * inv_lever_a + 0.05f, max_ty);
    float n2 = 1.0f + tx * tx + ty * ty;
    float nn = sqrtf(n2);
    float knn = g[G_K_QOP] * nn;
    float t = fmaxf(tx, ty);
    float sf = fminf(sqrtf((1.0f + t * t) * n2) * sqrtf(nn), g[G_SF_MAX]);
    const float* tg = pl + PLF_TARGET + 8 * k;
    float dz = tg[0], bend = tg[1], meas_x = tg[2], meas_y = tg[3];
    float b0 = tg[4], b1 = tg[5], b2 = tg[6];
    float ax = tx * ty * b0 + (1.0f + tx * tx) * b1 + ty * b2;
    float ay = (1.0f + ty * ty) * b0 + tx * ty * b1 + tx * b2;
    float kx = fminf(knn * ax, g[G_MAX_CX]);
    float ky = fminf(knn * ay, g[G_MAX_CY]);
    float tx0 = -max_tx, tx1 = max_tx, ty0 = -max_ty, ty1 = max_ty;
    if (pl[PLF_POINTING] != 0.0f) {
        float ms = pl[PLF_MS];
        float hz_inv_a = pl[PLF_HZ_INV_A], box_scale = pl[PLF_BOX_SCALE];
        float hx = (g[G_ORIGIN_HX] + hz_inv_a * fabsf(rx)) * box_scale;
        float hy = (g[G_ORIGIN_HY] + hz_inv_a * fabsf(ry)) * box_scale;
        float wx = hx + bend * kx + ms * sf + meas_x;
        float wy = hy + bend * ky + ms * sf + meas_y;
        tx0 = fmaxf(tx0, (rx - wx) * inv_lever_a);
        tx1 = fminf(tx1, (rx + wx) * inv_lever_a);
        ty0 = fmaxf(ty0, (ry - wy) * inv_lever_a);
        ty1 = fminf(ty1, (ry + wy) * inv_lever_a);
    }
    bool open = tx0 <= tx1 && ty0 <= ty1;
    Box4 bx;
    bx.x0 = xa + dz * tx0;
    bx.x1 = open ? xa + dz * tx1 : -CA_INF;
    bx.y0 = ya + dz * ty0;
    bx.y1 = ya + dz * ty1;
    return bx;
}

// The doublets of sorted hit a (its index in the event), with the event's arrays at their
// bases: counted (and its first DBL_CACHE second hits kept in `dcache`), or written. The
// windows scan the hits wx, wy with cell starts `starts` (wmap: their sorted indices;
// null: the sorted hits themselves).
__device__ __forceinline__ void doublets_of_hit(
    u32 a, u32 s, const float* __restrict__ sx, const float* __restrict__ sy,
    const u32* __restrict__ splane, const u32* __restrict__ starts,
    const float* __restrict__ wx, const float* __restrict__ wy, const u32* __restrict__ wmap,
    const float* __restrict__ plf, const int* __restrict__ pli, const double* __restrict__ pld,
    const float* __restrict__ g, int write, u32* __restrict__ dbl_count,
    const u32* __restrict__ dbl_off, u32 base, uint4* __restrict__ dbl, u32* __restrict__ dgap,
    u32* __restrict__ dcache) {
    u32 i = splane[s + a];
    const float* pl = plf + i * PLF;
    const int* pi = pli + i * PLI;
    float xa = sx[s + a], ya = sy[s + a];
    double xa64 = (double)xa, ya64 = (double)ya;
    u32 out = write ? base + dbl_off[s + a] : 0;
    u32* cache = dcache + (size_t)(s + a) * DBL_CACHE;
    if (write) {
        u32 n = dbl_count[s + a];
        if (n <= DBL_CACHE) {
            for (u32 f = 0; f < n; f++) {
                u32 h = cache[f];
                int j = (int)splane[s + h];
                int k = 0;
                while (pi[4 + k] != j) k++;
                double inv_dz = pld[i * PLD + k];
                float tx = (float)(((double)sx[s + h] - xa64) * inv_dz);
                float ty = (float)(((double)sy[s + h] - ya64) * inv_dz);
                dbl[out + f] = make_uint4(a, h, __float_as_uint(tx), __float_as_uint(ty));
                dgap[out + f] = (u32)(j - (int)i - 1);
            }
            return;
        }
    }
    u32 found = 0;
    for (int k = 0; k < pi[3]; k++) {
        Box4 bx = doublet_box(pl, g, k, xa, ya);
        if (!(bx.x0 <= bx.x1 && bx.y0 <= bx.y1)) continue;
        int j = pi[4 + k];
        const float* plj = plf + j * PLF;
        const int* pij = pli + j * PLI;
        u32 c0 = bin_1d(plj, pij, 0, bx.x0), c1 = bin_1d(plj, pij, 0, bx.x1);
        u32 r0 = bin_1d(plj, pij, 1, bx.y0), r1 = bin_1d(plj, pij, 1, bx.y1);
        double inv_dz = pld[i * PLD + k];
        u32 gap = (u32)(j - (int)i - 1);
        for (u32 r = r0; r <= r1; r++) {
            u32 row = (u32)pij[2] + r * (u32)pij[0];
            u32 h0 = starts[row + c0], h1 = starts[row + c1 + 1];
            for (u32 h = h0; h < h1; h++) {
                float x = wx[s + h], y = wy[s + h];
                if (x >= bx.x0 && x <= bx.x1 && y >= bx.y0 && y <= bx.y1) {
                    u32 b = wmap ? wmap[s + h] : h;
                    if (write) {
                        u32 d = out + found;
                        float tx = (float)(((double)x - xa64) * inv_dz);
                        float ty = (float)(((double)y - ya64) * inv_dz);
                        // One 16-byte store: hits and slopes together.
                        dbl[d] = make_uint4(a, b, __float_as_uint(tx), __float_as_uint(ty));
                        dgap[d] = gap;
                    } else if (found < DBL_CACHE) {
                        cache[found] = b;
                    }
                    found++;
                }
            }
        }
    }
    if (!write) dbl_count[s + a] = found;
}

extern "C" __global__ void __launch_bounds__(CA_THREADS, ITEM_MIN_BLOCKS)
    ca_doublets(const float* __restrict__ sx, const float* __restrict__ sy,
                                       const u32* __restrict__ splane,
                                       const u32* __restrict__ hit_start,
                                       const u32* __restrict__ n_sorted,
                                       const u32* __restrict__ bin_start,
                                       const float* __restrict__ fx, const float* __restrict__ fy,
                                       const u32* __restrict__ fmap,
                                       const u32* __restrict__ free_start,
                                       const u32* __restrict__ n_free, int n_bins,
                                       const float* __restrict__ plf, const int* __restrict__ pli,
                                       const double* __restrict__ pld, const float* __restrict__ g,
                                       const u32* __restrict__ failed, int write,
                                       u32* __restrict__ dbl_count, const u32* __restrict__ dbl_off,
                                       const u32* __restrict__ dbl_base,
                                       uint4* __restrict__ dbl, u32* __restrict__ dgap,
                                       u32* __restrict__ dcache) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], m = n_sorted[e];
    u32 base = write ? dbl_base[e] : 0;
    // A pass for busy events only (the stiff-track pass): a sparse event makes nothing.
    bool sparse = (float)m < g[G_MIN_EVENT_HITS];
    // The hits the windows scan: the sorted ones, or in a later pass the free ones (whose
    // count the caller zeroed for the used ones).
    const bool later = fmap != nullptr;
    const float* wx = later ? fx : sx;
    const float* wy = later ? fy : sy;
    const u32* starts = (later ? free_start : bin_start) + (size_t)e * (n_bins + 1);
    const u32 n_items = later ? n_free[e] : m;
    if (!write || !later) {
        // A lane per hit: every hit to count has its windows to scan, and on fresh hits
        // most have doublets to write.
        for (u32 i = CA_FIRST; i < n_items; i += CA_STRIDE) {
            u32 a = later ? fmap[s + i] : i;
            if (write ? dbl_count[s + a] == 0 : sparse) {
                if (!write) dbl_count[s + a] = 0;
                continue;
            }
            doublets_of_hit(a, s, sx, sy, splane, starts, wx, wy, fmap, plf, pli, pld, g, write,
                            dbl_count, dbl_off, base, dbl, dgap, dcache);
        }
        return;
    }
    // A later pass's write: many free hits have no doublets, and a lane per hit would leave
    // much of each warp idle through the window scans of the others, so the ones with
    // doublets go through the warp's queue (warp_enqueue). (On fresh hits, above, a lane
    // per hit is faster.)
    warp_queue_each(
        n_items,
        [&](u32 i, u32* a) {
            *a = fmap[s + i];
            return dbl_count[s + *a] != 0;
        },
        [&](u32 a) {
            doublets_of_hit(a, s, sx, sy, splane, starts, wx, wy, fmap, plf, pli, pld, g, write,
                            dbl_count, dbl_off, base, dbl, dgap, dcache);
        });
}
