// First hits against the origin (src/tracking/ca/first_hits.rs) on the device: each
// track's second hit (where FHI_SECOND_HITS asks for it), then its first, chosen again
// with the origin as a measurement, on the tracks ca_tracks_pack packed and the clone
// step marked (and the exchange of segments changed, ca_exchange.cu, which then applied
// the momentum cut: this step's is then off), one block per event, before they go to the
// host. The same steps as FirstHits::run, in the same f64 arithmetic and order:
//
// 1. the tracks kept: not clones and not below the minimum momentum (MomentumCut::keeps;
//    a track below it is marked 2 in the clone marks, so the host leaves it out);
//
// then per pass, for the hit `at` of each track (1: the second, 0: the first), with the
// kept tracks' hits as the last pass left them the used ones:
//
// 2. each kept track's predicted point on its hit's plane (FirstHitCuts::predict), the
//    predictions in track order;
// 3. the origin's centre and size from the tracks (FirstHits::spot: medians of a sample
//    of at most about SPOT_SAMPLE, sorted in shared memory), and each track's point from
//    the origin combined with its own where its first hit is not near the origin (the
//    own point from the packed fit, as FirstHitCuts::predict makes it: the geometry of
//    the track's first two hits is read again here, since the predictions' scratch holds
//    eight doubles each; the second hit's point is the origin's alone);
// 4. the pool: each plane's hits that no kept track uses and the predictions' own
//    hits, placed as the warps find them, then sorted by (plane, row of the mean window's
//    height, x) and hit, as the CPU's;
// 5. every pair of prediction and pool hit within the cut (each row of the window found
//    by a binary search; counted, scanned, written in pool order per prediction);
// 6. a prediction with one pair whose hit no other can take gets it; the groups of the
//    other pairs (predictions linked by shared hits, found by lowering labels) matched
//    at their least summed rank, each group by one thread (fh_solve_group: the Hungarian
//    method, for groups of up to FH_MATCH_ROWS predictions and FH_MATCH_COLS hits);
//    the pairs of larger groups sorted by (rank, prediction, place in the pool) in the
//    event's slice of a global arena and matched in that order by one thread (the pairs
//    staged in shared memory);
// 7. the changes applied to the packed hits, fitted with the candidates' fit, the ones
//    that fail the cut undone in order by one thread, and the changed tracks fitted with
//    the tracks' fit where there is one (or where a change was undone).
//
// Nothing depends on the order threads arrive in: every order is a key's. An event beyond
// the step's limits (its hits, predictions, pairs) is marked failed (1: hits or
// predictions, 2: pairs), its tracks as the pass before left them: the host runs the
// whole event on the CPU.

// Threads of the step's block (one block per event).
#define FH_THREADS 512
#define FH_MAX_HITS 65536
#define FH_HIT_WORDS (FH_MAX_HITS / 32)
#define FH_MAX_PREDS 8192
#define FH_MAX_PLANES 64
#define FH_SPOT_TRACKS 20
#define FH_SPOT_SAMPLE 512
#define FH_SPOT_FLOOR 0.25
#define FH_HOLD 2.0
#define FH_NEAR_ORIGIN_RATIO 0.45
#define FH_MAX_WINDOW_ROWS 16
#define FH_MAX_PAIRS_PER_TRACK 32
#define FH_NONE 0xffffffffu
// A change undone after its fit to a hit dropped (in its new-hit word; hits are numbered
// below it), and one undone to the track as it was (its fit given back).
#define FH_UNDONE 0xfffffffeu
#define FH_RESTORED 0xfffffffdu
// Profiling builds (TRIGD_KERNEL_OPTIONS="-DFH_PHASE_CLOCKS"): thread 0 of each event's
// block reads clock64() at the end of each step (after a barrier of its own) and the
// first two events of a launch print their cycles per step.
#ifdef FH_PHASE_CLOCKS
#define FH_CLOCK(i)                              \
    do {                                         \
        __syncthreads();                         \
        if (threadIdx.x == 0) fh_clk[i] = clock64(); \
    } while (0)
#else
#define FH_CLOCK(i) \
    do {            \
    } while (0)
#endif
// Parameters, doubles (GpuFirstHits::new).
#define FHD_ORIGIN_X 0
#define FHD_ORIGIN_Y 1
#define FHD_ORIGIN_Z 2
#define FHD_ORIGIN_VAR_X 3
#define FHD_ORIGIN_VAR_Y 4
#define FHD_MASS2 5
#define FHD_QOP_CUT 6
#define FHD_CHI2_MAX 7
#define FHD_MAX_CHI2_NDF 8
#define FHD_MC_MAX_QOP 9
#define FHD_MC_N_SIGMA 10
#define FHD_B 11 // + 3: the uniform field
#define FHD_K 14
#define FHD_PLANES 16 // + 4 p: z, var x, var y, theta2 per (q/p)^2
// Parameters, ints.
#define FHI_N_PLANES 0
#define FHI_MIN_HITS 1
#define FHI_UNIFORM 2
#define FHI_TRACK_FIT 3
#define FHI_SECOND_HITS 4

__device__ __forceinline__ u32 fh_scan(u32 v, u32* total) {
    return block_scan_inclusive_of<FH_THREADS>(v, total);
}

struct FhPred {
    double x, y, var_x, var_y, arm, own_x, own_y;
    u32 plane, own;
};

// A pair of prediction r and pool hit q, with its rank (the chi-square, less HOLD for the
// prediction's own hit) as the bits of f64::total_cmp's order.
struct FhEdge {
    unsigned long long rank;
    u32 r, q;
};

__device__ __forceinline__ unsigned long long fh_order64(double d) {
    unsigned long long b = (unsigned long long)__double_as_longlong(d);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

__device__ __forceinline__ double fh_of_order64(unsigned long long k) {
    unsigned long long b = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
    return __longlong_as_double((long long)b);
}

__device__ __forceinline__ u32 fh_order32(float x) {
    u32 b = __float_as_uint(x);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

// row_of: the row of height h that y lies in, within 24 bits (NaN: 0, as Rust's cast).
__device__ __forceinline__ int fh_row(double y, double h) {
    double r = floor(y / h);
    if (isnan(r)) return 0;
    return (int)fmin(fmax(r, -8388608.0), 8388607.0);
}

__device__ __forceinline__ unsigned long long fh_pool_key(u32 plane, int row, float x) {
    unsigned long long rr = (unsigned long long)(u32)(row + (1 << 23)) & 0xffffffull;
    return ((unsigned long long)plane << 56) | (rr << 32) | (unsigned long long)fh_order32(x);
}

__device__ __forceinline__ bool fh_bit(const u32* bits, u32 i) { return (bits[i >> 5] >> (i & 31)) & 1u; }

__device__ __forceinline__ void fh_set(u32* bits, u32 i) { atomicOr(&bits[i >> 5], 1u << (i & 31)); }

__device__ __forceinline__ void fh_clear(u32* bits, u32 i) { atomicAnd(&bits[i >> 5], ~(1u << (i & 31))); }

// MomentumCut::keeps on a fit record.
__device__ __forceinline__ bool fh_keeps(const u32* fw, const double* fp) {
    double qop = (double)__uint_as_float(fw[4]);
    double var = (double)__uint_as_float(fw[5 + 14]);
    double q = fabs(qop);
    double sigma = sqrt(var);
    bool measured = qop != 0.0 && isfinite(qop) && (var < 0.81 * qop * qop || isnan(var));
    return !(measured && q - fp[FHD_MC_N_SIGMA] * sigma > fp[FHD_MC_MAX_QOP]);
}

// FirstHitCuts::predict of the track's hit `at` (0: the first, 1: the second).
__device__ bool fh_predict(const double* __restrict__ fp, const int* __restrict__ fi,
                           const int* __restrict__ pair_i32, const float* __restrict__ tents,
                           uint2 tr, u32 at, const u32* __restrict__ hits,
                           const u32* __restrict__ fw, const float* __restrict__ hx,
                           const float* __restrict__ hy, const u32* __restrict__ hp, FhPred& p) {
    const u32 n_planes = (u32)fi[FHI_N_PLANES];
    const u32 need = max((u32)fi[FHI_MIN_HITS], at + 2u);
    if (tr.y <= need) return false;
    const u32 i0 = hits[tr.x + at], i1 = hits[tr.x + at + 1];
    const u32 k0 = hp[i0], k1 = hp[i1];
    if (k0 >= k1 || k1 >= n_planes) return false;
    const double oz = fp[FHD_ORIGIN_Z];
    const double z0 = fp[FHD_PLANES + 4 * k0] - oz;
    const double z1 = fp[FHD_PLANES + 4 * k1] - oz;
    if (z0 <= 1.0 || z1 <= z0) return false;
    const double cx = fp[FHD_ORIGIN_X], cy = fp[FHD_ORIGIN_Y];
    const double x1 = (double)hx[i1] - cx, y1 = (double)hy[i1] - cy;
    const double tx = (double)__uint_as_float(fw[2]), ty = (double)__uint_as_float(fw[3]);
    double b0, b1, b2;
    if (fi[FHI_UNIFORM]) {
        b0 = fp[FHD_B];
        b1 = fp[FHD_B + 1];
        b2 = fp[FHD_B + 2];
    } else {
        const int ti = pair_i32[(k0 * n_planes + k1) * PRI];
        if (ti < 0) return false;
        float bf[3];
        tent_at(tents + (size_t)ti * TENT_FLOATS, (float)(x1 / z1), (float)(y1 / z1), bf);
        b0 = (double)bf[0];
        b1 = (double)bf[1];
        b2 = (double)bf[2];
    }
    const double n2 = 1.0 + tx * tx + ty * ty;
    const double nn = sqrt(n2);
    const double ax = tx * ty * b0 - (1.0 + tx * tx) * b1 + ty * b2;
    const double ay = (1.0 + ty * ty) * b0 - tx * ty * b1 - tx * b2;
    const double lever = 0.5 * z0 * (z1 - z0) * fp[FHD_K] * nn;
    const double qop = (double)__uint_as_float(fw[4]);
    const double f = z0 / z1;
    const double px = cx + x1 * f - lever * qop * ax;
    const double py = cy + y1 * f - lever * qop * ay;
    const double q = (isfinite(qop) && qop != 0.0) ? fabs(qop) : fp[FHD_QOP_CUT];
    const double mass2 = fp[FHD_MASS2];
    const double theta2 = q * q * (1.0 + mass2 * q * q) * n2 * nn;
    double ms = 0.0;
    for (u32 k = 0; k < k1; k++) {
        const double zp = fp[FHD_PLANES + 4 * k] - oz;
        if (zp <= 0.0) continue;
        const double arm = fmin(zp, z0) * (z1 - fmax(zp, z0)) / z1;
        ms += fp[FHD_PLANES + 4 * k + 3] * arm * arm;
    }
    ms *= theta2;
    const double var_qop = (double)fmaxf(__uint_as_float(fw[5 + 14]), 0.0f);
    const double* v1 = fp + FHD_PLANES + 4 * k1;
    // Without the first hit's resolution (added with the track's own point, fh_combine).
    const double var_x = v1[1] * f * f + ms * (1.0 + tx * tx) + lever * lever * ax * ax * var_qop;
    const double var_y = v1[2] * f * f + ms * (1.0 + ty * ty) + lever * lever * ay * ay * var_qop;
    if (!(isfinite(px) && isfinite(py) && isfinite(var_x) && isfinite(var_y))) return false;
    p.plane = k0;
    p.x = px;
    p.y = py;
    p.var_x = var_x;
    p.var_y = var_y;
    p.arm = 1.0 - f;
    p.own = i0;
    p.own_x = (double)hx[i0];
    p.own_y = (double)hy[i0];
    return true;
}

// own_axis (first_hits.rs): the track's own point on one axis without its first hit, its
// variance and its covariance with the origin's point; false where the fit does not hold
// the hit.
__device__ bool fh_own_axis(double at, double p, double r, double m, double v, double dz,
                            double f, double* o) {
    const double d = v - p;
    if (!(d > 1e-9 * v && isfinite(at) && isfinite(r))) return false;
    const double g = v / d;
    const double x = (v * at - p * m) / d;
    const double b = p * g;
    const double c = f * (b + dz * (r * g));
    if (!(isfinite(x) && isfinite(b) && isfinite(c))) return false;
    o[0] = x;
    o[1] = b;
    o[2] = c;
    return true;
}

// combine (first_hits.rs): the origin's point xo (variance a) and the track's own
// (o: point, variance, covariance) combined, into xo and a.
__device__ void fh_combine(double* xo, double* a, bool have, const double* o) {
    if (!have) return;
    const double xt = o[0], b = o[1], c = o[2];
    const double den = *a + b - 2.0 * c;
    const double var = (*a * b - c * c) / den;
    if (den > 0.0 && var > 0.0 && isfinite(var)) {
        const double w = (b - c) / den;
        *xo = xt + w * (*xo - xt);
        *a = var;
    } else if (!(*a <= b)) {
        *xo = xt;
        *a = b;
    }
}

// A bitonic sorting network over n (a power of two) items, the whole block:
// exchange(i, ixj, up) puts items i < ixj in ascending order where up, else descending.
template <typename Exchange>
__device__ void fh_bitonic(u32 n, Exchange exchange) {
    for (u32 k = 2; k <= n; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < n; i += FH_THREADS) {
                const u32 ixj = i ^ j;
                if (ixj > i) exchange(i, ixj, (i & k) == 0);
            }
            __syncthreads();
        }
    }
}

// The pairs' order: rank, prediction, place in the pool (sorted by key and hit).
__device__ __forceinline__ bool fh_edge_less(const FhEdge& a, const FhEdge& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.r != b.r) return a.r < b.r;
    return a.q < b.q;
}

// Sorts the first n (a power of two) pairs of a global array.
__device__ void fh_sort_edges(FhEdge* v, u32 n) {
    fh_bitonic(n, [&](u32 i, u32 ixj, bool up) {
        const FhEdge a = v[i], b = v[ixj];
        if (fh_edge_less(b, a) == up) {
            v[i] = b;
            v[ixj] = a;
        }
    });
}

// Most tracks and hits of one group of contested pairs matched at the least summed
// chi-square (MATCH_ROWS and MATCH_COLS in first_hits.rs).
#define FH_MATCH_ROWS 32
#define FH_MATCH_COLS 64
#define FH_MATCH_M (FH_MATCH_ROWS + FH_MATCH_COLS)
// A pool place's column in its group, in the claims' word: flag, root, column.
#define FH_COL_FLAG 0x80000000u
static_assert(FH_MATCH_M < 256 && FH_MAX_PREDS < (1u << 31), "a column in a byte; a root without the flag");

// One group of contested pairs matched at its least summed rank, by the thread of its
// root (its least prediction): LeastCost::group in first_hits.rs, the same rows (in
// increasing order), columns (in the order the rows' pairs first name them) and steps.
// The group's other predictions are linked from the root's scratch words (words + 16 r:
// the first, the next, the count of the others; in any order), prediction r's pairs are
// edges[u[3]..u[3] + u[4]] (u = pslot + 8 r), cl[q] holds the pool place's group (its
// root) and then its column. The group's predictions are marked in s_asg (the
// ordered matching passes them by), their hits in s_taken and in pslot[8 r + 5]. Groups
// beyond FH_MATCH_ROWS predictions or FH_MATCH_COLS hits are left as they are.
__device__ void fh_solve_group(u32 root, const FhEdge* edges, u32* pslot, u32* cl,
                               const u32* ph, const u32* words, double none, u32* s_asg,
                               u32* s_taken) {
    u32 rows[FH_MATCH_ROWS], cols[FH_MATCH_COLS];
    double u[FH_MATCH_ROWS + 1], v[FH_MATCH_M + 1], minv[FH_MATCH_M + 1];
    unsigned char row_of[FH_MATCH_M + 1], way[FH_MATCH_M + 1], used[FH_MATCH_M + 1];
    if (words[(size_t)root * 16 + 2] + 1 > FH_MATCH_ROWS) return;
    u32 n = 0;
    rows[n++] = root;
    for (u32 i = words[(size_t)root * 16]; i != FH_NONE; i = words[(size_t)i * 16 + 1]) {
        // In increasing order (insertion).
        u32 k = n++;
        while (k > 0 && rows[k - 1] > i) {
            rows[k] = rows[k - 1];
            k--;
        }
        rows[k] = i;
    }
    u32 nc = 0;
    for (u32 k = 0; k < n; k++) {
        const u32 a = pslot[(size_t)rows[k] * 8 + 3], b = a + pslot[(size_t)rows[k] * 8 + 4];
        for (u32 x = a; x < b; x++) {
            const u32 q = edges[x].q;
            if (!(cl[q] & FH_COL_FLAG)) {
                if (nc == FH_MATCH_COLS) return;
                cl[q] = FH_COL_FLAG | nc;
                cols[nc++] = q;
            }
        }
    }
    const double inf = __longlong_as_double(0x7ff0000000000000ll);
    const u32 m = nc + n;
    for (u32 j = 0; j <= n; j++) u[j] = 0.0;
    for (u32 j = 0; j <= m; j++) {
        v[j] = 0.0;
        row_of[j] = 0;
        way[j] = 0;
    }
    for (u32 kr = 1; kr <= n; kr++) {
        row_of[0] = (unsigned char)kr;
        u32 j0 = 0;
        for (u32 j = 0; j <= m; j++) {
            minv[j] = inf;
            used[j] = 0;
        }
        for (;;) {
            used[j0] = 1;
            const u32 i0 = row_of[j0];
            const double ui = u[i0];
            const u32 p = rows[i0 - 1];
            const u32 a = pslot[(size_t)p * 8 + 3], b = a + pslot[(size_t)p * 8 + 4];
            for (u32 x = a; x <= b; x++) {
                // The row's pairs, then its "no hit".
                const u32 j = x < b ? (cl[edges[x].q] & 0xffu) + 1 : nc + i0;
                const double cost = x < b ? fh_of_order64(edges[x].rank) : none;
                if (!used[j]) {
                    const double cur = cost - ui - v[j];
                    if (cur < minv[j]) {
                        minv[j] = cur;
                        way[j] = (unsigned char)j0;
                    }
                }
            }
            double delta = inf;
            u32 j1 = 0;
            for (u32 j = 1; j <= m; j++) {
                if (!used[j] && minv[j] < delta) {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for (u32 j = 0; j <= m; j++) {
                if (used[j]) {
                    u[row_of[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if (row_of[j0] == 0) break;
        }
        for (;;) {
            const u32 j1 = way[j0];
            row_of[j0] = row_of[j1];
            j0 = j1;
            if (j0 == 0) break;
        }
    }
    for (u32 k = 0; k < n; k++) fh_set(s_asg, rows[k]);
    for (u32 j = 1; j <= nc; j++) {
        const u32 kr = row_of[j];
        if (kr != 0) {
            const u32 h = ph[cols[j - 1]];
            pslot[(size_t)rows[kr - 1] * 8 + 5] = h;
            fh_set(s_taken, h);
        }
    }
}

// Entries of the pool's sort held in shared memory at once (a power of two, two per
// thread: a step of the network is one exchange per thread). A smaller value in
// TRIGD_KERNEL_OPTIONS sorts more pools over several tiles, to check it.
#ifndef FH_TILE
#define FH_TILE (2 * FH_THREADS)
#endif
static_assert(FH_TILE <= 2 * FH_THREADS && FH_TILE <= 1024 && (FH_TILE & (FH_TILE - 1)) == 0,
              "a power of two, at most an exchange per thread, its keys held in s_key");

// The exchange of pool entries i < ixj (key, hit arrays) into ascending order where up.
__device__ __forceinline__ void fh_pool_exchange(unsigned long long* k, u32* h, u32 i, u32 ixj,
                                                 bool up) {
    const unsigned long long ka = k[i], kb = k[ixj];
    const u32 ha = h[i], hb = h[ixj];
    if ((kb < ka || (kb == ka && hb < ha)) == up) {
        k[i] = kb;
        k[ixj] = ka;
        h[i] = hb;
        h[ixj] = ha;
    }
}

// The first entry of pair p of a network's step of width j: p's place among the pairs,
// with the bits below j as they are.
__device__ __forceinline__ u32 fh_pair(u32 p, u32 j) {
    return ((p & ~(j - 1)) << 1) | (p & (j - 1));
}

// The steps j = from, from / 2, ..., 1 of the network's stage k on a tile of 2 * pairs
// entries, [t0, t0 + 2 * pairs), in shared memory (s_k, s_h): one exchange per thread
// per step.
__device__ void fh_pool_tile_steps(unsigned long long* s_k, u32* s_h, u32 t0, u32 k, u32 from,
                                   u32 pairs) {
    for (u32 j = from; j > 0; j >>= 1) {
        if (threadIdx.x < pairs) {
            const u32 i = fh_pair(threadIdx.x, j);
            fh_pool_exchange(s_k, s_h, i, i + j, ((t0 + i) & k) == 0);
        }
        __syncthreads();
    }
}

// Sorts the first n (a power of two) pool entries (key, hit) of global arrays by key,
// then hit: a bitonic network whose steps within a tile (j < FH_TILE) run on the tile in
// shared memory (s_k, s_h: FH_TILE entries each), one tile after the other, and the
// longer steps in global memory. The result is the network's, the sorted entries.
__device__ void fh_sort_pool(unsigned long long* key, u32* hit, u32 n, unsigned long long* s_k,
                             u32* s_h) {
    const u32 tid = threadIdx.x;
    const u32 tile = n < FH_TILE ? n : FH_TILE;
    // Each tile through shared memory: every stage up to the tile's size (k = 0), or the
    // steps below FH_TILE of stage k.
    auto tiles = [&](u32 k) {
        for (u32 t0 = 0; t0 < n; t0 += tile) {
            for (u32 i = tid; i < tile; i += FH_THREADS) {
                s_k[i] = key[t0 + i];
                s_h[i] = hit[t0 + i];
            }
            __syncthreads();
            if (k == 0) {
                for (u32 kk = 2; kk <= tile; kk <<= 1)
                    fh_pool_tile_steps(s_k, s_h, t0, kk, kk >> 1, tile / 2);
            } else {
                fh_pool_tile_steps(s_k, s_h, t0, k, FH_TILE / 2, tile / 2);
            }
            for (u32 i = tid; i < tile; i += FH_THREADS) {
                key[t0 + i] = s_k[i];
                hit[t0 + i] = s_h[i];
            }
            __syncthreads();
        }
    };
    tiles(0);
    for (u32 k = 2 * FH_TILE; k <= n; k <<= 1) {
        for (u32 j = k >> 1; j >= FH_TILE; j >>= 1) {
            for (u32 p = tid; p < n / 2; p += FH_THREADS) {
                const u32 i = fh_pair(p, j);
                fh_pool_exchange(key, hit, i, i + j, (i & k) == 0);
            }
            __syncthreads();
        }
        tiles(k);
    }
}

// Fits a packed track (tr: its first hit in the packed hits, its length) with tables T.
__device__ __forceinline__ void fh_fit(const u32* hits, uint2 tr, const float* hx,
                                       const float* hy, const u32* hp, const KalmanTables& T,
                                       u32* out) {
    CandHits h;
    h.idx = hits + tr.x;
    h.hx = hx;
    h.hy = hy;
    h.hp = hp;
    KalmanResult res;
    kalman_fit_track(h, (int)tr.y, MAX_CHAIN, T, res);
    store_fit(res, out);
}

// Drops hit `at` of packed track t: the hits before it move up one place and the track
// starts one place later (its length one less).
__device__ __forceinline__ void fh_drop(u32* hits, uint2* tracks, u32 t, u32 at) {
    const uint2 tr = tracks[t];
    for (u32 i = at; i > 0; i--) hits[tr.x + i] = hits[tr.x + i - 1];
    tracks[t] = make_uint2(tr.x + 1, tr.y - 1);
}

// The medians of the first m keys of s0 and of s1 (n a power of two >= m; the rest the
// largest key), sorted together by one network, as doubles in out[0] and out[1].
__device__ void fh_medians2(unsigned long long* s0, unsigned long long* s1, u32 m, u32 n,
                            double* out) {
    fh_bitonic(n, [&](u32 i, u32 ixj, bool up) {
        unsigned long long a = s0[i], b = s0[ixj];
        if ((a > b) == up) {
            s0[i] = b;
            s0[ixj] = a;
        }
        a = s1[i];
        b = s1[ixj];
        if ((a > b) == up) {
            s1[i] = b;
            s1[ixj] = a;
        }
    });
    out[0] = fh_of_order64(s0[m / 2]);
    out[1] = fh_of_order64(s1[m / 2]);
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(FH_THREADS)
ca_first_hits(const u32* __restrict__ failed, const u32* __restrict__ trk_n,
              const u32* __restrict__ trk_base, const u32* __restrict__ hit_start,
              const float* __restrict__ in_x, const float* __restrict__ in_y,
              const u32* __restrict__ in_plane, uint2* __restrict__ out_tracks,
              u32* __restrict__ out_fits, u32* __restrict__ out_hits, u32* __restrict__ marks,
              const double* __restrict__ fp, const int* __restrict__ fi,
              const int* __restrict__ pair_i32, const float* __restrict__ tents,
              double* __restrict__ pred_d, u32* __restrict__ pred_u, u32* __restrict__ pool_h,
              unsigned long long* __restrict__ pool_key, u32* __restrict__ claims,
              FhEdge* __restrict__ edges, FhEdge* __restrict__ contested, u32 edge_share,
              u32* __restrict__ chg_fit, u32* __restrict__ fh_failed,
              const float* __restrict__ rows32, const double* __restrict__ rows64,
              const int* __restrict__ gap_steps, const int* __restrict__ gap_kind,
              const int* __restrict__ gap_slice, const float* __restrict__ slices,
              const float* __restrict__ pf, const double* __restrict__ pd,
              const int* __restrict__ pi, const float* __restrict__ nodes,
              const float* __restrict__ tpf, const double* __restrict__ tpd,
              const int* __restrict__ tpi) {
    __shared__ u32 s_used[FH_HIT_WORDS];
    __shared__ u32 s_start[FH_HIT_WORDS];
    __shared__ u32 s_taken[FH_HIT_WORDS];
    __shared__ u32 s_asg[FH_MAX_PREDS / 32];
    __shared__ unsigned long long s_key[1024];
    // The origin's spot: the second axis's keys beside s_key's.
    __shared__ unsigned long long s_key2[1024];
    // The pool sort's tile: its keys in s_key, its hits here.
    __shared__ u32 s_pool_hit[FH_TILE];
    __shared__ double s_centre[2], s_var[2], s_row_h;
    const u32 e = blockIdx.y;
    const u32 tid = threadIdx.x;
    if (tid == 0) fh_failed[e] = 0;
    if (failed[e]) return;
    const u32 nt = trk_n[e], tb = trk_base[e];
    const u32 hs = hit_start[e], nh = hit_start[e + 1] - hs;
    const float* hx = in_x + hs;
    const float* hy = in_y + hs;
    const u32* hp = in_plane + hs;
    const u32 n_planes = (u32)fi[FHI_N_PLANES];
    if (nh > FH_MAX_HITS) {
        if (tid == 0) fh_failed[e] = 1;
        return;
    }
    // Per-slot scratch of the event: predictions at tb + r.
    double* pd8 = pred_d + (size_t)tb * 8;
    u32* pslot = pred_u + (size_t)tb * 8;
    // pred_u per prediction: slot, own, plane, edge start, edge count, assigned, change
    // (prediction or none), new hit.
#ifdef FH_PHASE_CLOCKS
    long long fh_clk[13] = {0};
#endif
    FH_CLOCK(0);
    // 1. The tracks kept.
    u32 kept_local = 0;
    for (u32 k = tid; k < nt; k += FH_THREADS) {
        const u32 t = tb + k;
        if (marks[t] != 0) continue;
        if (!fh_keeps(out_fits + (size_t)t * FIT_WORDS, fp)) {
            marks[t] = 2;
            continue;
        }
        kept_local++;
    }
    u32 kept;
    fh_scan(kept_local, &kept);
    __syncthreads();
    if (kept < 2) return;
    // The event's share of the pairs' arenas.
    FhEdge* ev_edges = edges + (size_t)e * edge_share;
    FhEdge* ev_contested = contested + (size_t)e * edge_share;
    // Each track's second hit chosen again where the cuts ask for it (at = 1), then its
    // first (at = 0): FirstHits::run_at. A pass that finds nothing to change goes on to
    // the next; an event beyond the limits is handed back whole.
    for (int pass = fi[FHI_SECOND_HITS] ? 1 : 0; pass >= 0; pass--) {
        const u32 at = (u32)pass;
        for (u32 w = tid; w < FH_HIT_WORDS; w += FH_THREADS) {
            s_used[w] = 0;
            s_start[w] = 0;
            s_taken[w] = 0;
        }
        for (u32 w = tid; w < FH_MAX_PREDS / 32; w += FH_THREADS) s_asg[w] = 0;
        __syncthreads();
        // The kept tracks' hits used (as the last pass left them).
        for (u32 k = tid; k < nt; k += FH_THREADS) {
            const u32 t = tb + k;
            if (marks[t] != 0) continue;
            const uint2 tr = out_tracks[t];
            for (u32 i = 0; i < tr.y; i++) fh_set(s_used, out_hits[tr.x + i]);
        }
        __syncthreads();
        FH_CLOCK(1);
        // 2. The predictions, in track order.
        u32 np = 0;
        for (u32 c0 = 0; c0 < nt; c0 += FH_THREADS) {
            const u32 k = c0 + tid;
            FhPred p;
            bool have = false;
            if (k < nt && marks[tb + k] == 0) {
                const u32 t = tb + k;
                have = fh_predict(fp, fi, pair_i32, tents, out_tracks[t], at, out_hits,
                                  out_fits + (size_t)t * FIT_WORDS, hx, hy, hp, p);
            }
            u32 chunk;
            const u32 r = np + fh_scan(have ? 1u : 0u, &chunk) - (have ? 1u : 0u);
            if (have && r < FH_MAX_PREDS) {
                double* d = pd8 + (size_t)r * 8;
                d[0] = p.x;
                d[1] = p.y;
                d[2] = p.var_x;
                d[3] = p.var_y;
                d[4] = p.arm;
                d[5] = p.own_x;
                d[6] = p.own_y;
                u32* u = pslot + (size_t)r * 8;
                u[0] = k;
                u[1] = p.own;
                u[2] = p.plane;
                fh_set(s_start, p.own);
            }
            np += chunk;
            __syncthreads();
        }
        if (np == 0) continue;
        if (np > FH_MAX_PREDS || n_planes > FH_MAX_PLANES) {
            if (tid == 0) fh_failed[e] = 1;
            return;
        }
        FH_CLOCK(2);
        // 3. The origin's centre and size from the tracks.
        if (tid < 2) {
            s_centre[tid] = 0.0;
            s_var[tid] = fp[FHD_ORIGIN_VAR_X + tid];
        }
        __syncthreads();
        if (np >= FH_SPOT_TRACKS) {
            const u32 every = max(np / FH_SPOT_SAMPLE, 1u);
            const u32 m = (np + every - 1) / every;
            u32 n = 1;
            while (n < m) n <<= 1;
            // Both axes at once: x's keys in s_key, y's in s_key2, sorted by one network.
            unsigned long long* ks[2] = {s_key, s_key2};
            for (u32 j = tid; j < n; j += FH_THREADS) {
                for (int c = 0; c < 2; c++) {
                    unsigned long long key = ~0ull;
                    if (j < m) {
                        const double* d = pd8 + (size_t)(j * every) * 8;
                        key = fh_order64((d[5 + c] - d[c]) / d[4]);
                    }
                    ks[c][j] = key;
                }
            }
            __syncthreads();
            double med[2], spread[2], other[2];
            fh_medians2(s_key, s_key2, m, n, med);
            for (u32 j = tid; j < m; j += FH_THREADS) {
                for (int c = 0; c < 2; c++)
                    ks[c][j] = fh_order64(fabs(fh_of_order64(ks[c][j]) - med[c]));
            }
            __syncthreads();
            fh_medians2(s_key, s_key2, m, n, spread);
            for (u32 j = tid; j < n; j += FH_THREADS) {
                for (int c = 0; c < 2; c++) {
                    unsigned long long key = ~0ull;
                    if (j < m) {
                        const double* d = pd8 + (size_t)(j * every) * 8;
                        const double a = d[4];
                        const u32 k0 = pslot[(size_t)(j * every) * 8 + 2];
                        key = fh_order64((d[2 + c] + fp[FHD_PLANES + 4 * k0 + 1 + c]) / (a * a));
                    }
                    ks[c][j] = key;
                }
            }
            __syncthreads();
            fh_medians2(s_key, s_key2, m, n, other);
            if (tid == 0) {
                for (int c = 0; c < 2; c++) {
                    const double sp = 1.4826 * spread[c];
                    const double floor_v = FH_SPOT_FLOOR * FH_SPOT_FLOOR * sp * sp;
                    if (isfinite(med[c]) && isfinite(sp)) {
                        const double ov = fp[FHD_ORIGIN_VAR_X + c];
                        const double half = 3.0 * sqrt(ov);
                        s_centre[c] = fmin(fmax(med[c], -half), half);
                        s_var[c] = fmin(fmax(sp * sp - other[c], floor_v), ov);
                    }
                }
            }
            __syncthreads();
        }
        const double chi2_max = fp[FHD_CHI2_MAX];
        {
            const double c0 = s_centre[0], c1 = s_centre[1], v0 = s_var[0], v1 = s_var[1];
            // The points from the origin, combined with the tracks' own.
            const double oz = fp[FHD_ORIGIN_Z];
            for (u32 r = tid; r < np; r += FH_THREADS) {
                double* d = pd8 + (size_t)r * 8;
                const u32* u = pslot + (size_t)r * 8;
                const u32 t = tb + u[0], k0 = u[2];
                const u32* fw = out_fits + (size_t)t * FIT_WORDS;
                const u32 k1 = hp[out_hits[out_tracks[t].x + 1]];
                const double z0 = fp[FHD_PLANES + 4 * k0] - oz;
                const double z1 = fp[FHD_PLANES + 4 * k1] - oz;
                const double f = z0 / z1;
                const double hit_x = fp[FHD_PLANES + 4 * k0 + 1];
                const double hit_y = fp[FHD_PLANES + 4 * k0 + 2];
                double ox[3], oy[3];
                // The track's own point only for its first hit, where that is not near the
                // origin.
                const bool far = at == 0 && f > FH_NEAR_ORIGIN_RATIO;
                const bool own_x_ok = far && fh_own_axis((double)__uint_as_float(fw[0]),
                                                (double)__uint_as_float(fw[5 + 0]),
                                                (double)__uint_as_float(fw[5 + 3]), d[5], hit_x,
                                                z1 - z0, f, ox);
                const bool own_y_ok = far && fh_own_axis((double)__uint_as_float(fw[1]),
                                                (double)__uint_as_float(fw[5 + 2]),
                                                (double)__uint_as_float(fw[5 + 7]), d[6], hit_y,
                                                z1 - z0, f, oy);
                const double a = d[4];
                double x = d[0] + c0 * a, var_x = d[2] + v0 * a * a;
                double y = d[1] + c1 * a, var_y = d[3] + v1 * a * a;
                fh_combine(&x, &var_x, own_x_ok, ox);
                fh_combine(&y, &var_y, own_y_ok, oy);
                d[0] = x;
                d[1] = y;
                d[2] = var_x + hit_x;
                d[3] = var_y + hit_y;
            }
        }
        __syncthreads();
        FH_CLOCK(3);
        // 4. The rows of the mean window's height (the heights summed in prediction order).
        {
            double h_sum = 0.0;
            for (u32 c0 = 0; c0 < np; c0 += 1024) {
                const u32 cn = min(np - c0, 1024u);
                for (u32 j = tid; j < cn; j += FH_THREADS) {
                    const double vy = pd8[(size_t)(c0 + j) * 8 + 3];
                    s_key[j] = (unsigned long long)__double_as_longlong(2.0 * sqrt(chi2_max * vy));
                }
                __syncthreads();
                if (tid == 0) {
                    for (u32 j = 0; j < cn; j++) h_sum += __longlong_as_double((long long)s_key[j]);
                }
                __syncthreads();
            }
            if (tid == 0) s_row_h = fmax(h_sum / (double)np, 1e-3);
            __syncthreads();
        }
        const double row_h = s_row_h;
        // The planes a prediction starts on.
        __shared__ u32 s_with[FH_MAX_PLANES / 32];
        if (tid < FH_MAX_PLANES / 32) s_with[tid] = 0;
        __syncthreads();
        for (u32 r = tid; r < np; r += FH_THREADS) fh_set(s_with, pslot[(size_t)r * 8 + 2]);
        __syncthreads();
        // The pool, sorted by (plane, row, x) and hit as the CPU's (room for twice the
        // event's hits: the sort's power of two). Its entries are placed in the order the
        // warps reach them (one shared atomic per warp): the sort below orders them by key and
        // hit, whatever that order.
        __shared__ u32 s_npool;
        if (tid == 0) s_npool = 0;
        __syncthreads();
        u32* ph = pool_h + 2 * (size_t)hs;
        unsigned long long* pk = pool_key + 2 * (size_t)hs;
        u32* cl = claims + hs;
        const u32 lane = tid & 31u;
        for (u32 c0 = 0; c0 < nh; c0 += FH_THREADS) {
            const u32 h = c0 + tid;
            bool in = false;
            u32 plane = 0;
            if (h < nh) {
                plane = hp[h];
                in = plane < n_planes && fh_bit(s_with, plane) &&
                     (!fh_bit(s_used, h) || fh_bit(s_start, h)) && isfinite(hx[h]) &&
                     isfinite(hy[h]);
            }
            const u32 votes = __ballot_sync(0xffffffffu, in);
            u32 base = 0;
            if (lane == 0 && votes != 0u) base = atomicAdd(&s_npool, (u32)__popc(votes));
            base = __shfl_sync(0xffffffffu, base, 0);
            if (in) {
                const u32 q = base + (u32)__popc(votes & ((1u << lane) - 1u));
                ph[q] = h;
                pk[q] = fh_pool_key(plane, fh_row((double)hy[h], row_h), hx[h]);
                cl[q] = 0;
            }
        }
        __syncthreads();
        const u32 npool = s_npool;
        FH_CLOCK(4);
        {
            u32 n_ps = 1;
            while (n_ps < npool) n_ps <<= 1;
            for (u32 q = npool + tid; q < n_ps; q += FH_THREADS) {
                pk[q] = ~0ull;
                ph[q] = FH_NONE;
            }
            __syncthreads();
            if (npool > 1) fh_sort_pool(pk, ph, n_ps, s_key, s_pool_hit);
        }
        FH_CLOCK(5);
        // 5. Every pair within the cut: counted, then written.
        const u32 max_pairs = FH_MAX_PAIRS_PER_TRACK * np;
        u32 n_edges = 0;
        bool too_many = false;
        for (int write = 0; write < 2 && !too_many; write++) {
            for (u32 c0 = 0; c0 < np; c0 += FH_THREADS) {
                const u32 r = c0 + tid;
                u32 count = 0;
                if (r < np) {
                    const double* d = pd8 + (size_t)r * 8;
                    u32* u = pslot + (size_t)r * 8;
                    const u32 plane = u[2], own = u[1];
                    const double px = d[0], py = d[1], vx = d[2], vy = d[3];
                    const double wx = sqrt(chi2_max * vx) * (1.0 + 1e-6) + 1e-6;
                    const double wy = sqrt(chi2_max * vy) * (1.0 + 1e-6) + 1e-6;
                    const int r0 = fh_row(py - wy, row_h), r1 = fh_row(py + wy, row_h);
                    const u32 lo = fh_order32((float)(px - wx)), hi = fh_order32((float)(px + wx));
                    const u32 from = write ? u[3] : 0;
                    for (int row = r0; r1 - r0 <= FH_MAX_WINDOW_ROWS && row <= r1; row++) {
                        const unsigned long long base =
                            fh_pool_key(plane, row, 0.0f) & 0xffffffff00000000ull;
                        const unsigned long long lo_key = base | lo, hi_key = base | hi;
                        for (u32 q = lower_bound_of(pk, 0u, npool, lo_key);
                             q < npool && pk[q] <= hi_key; q++) {
                            const u32 h = ph[q];
                            const double dx = (double)hx[h] - px, dy = (double)hy[h] - py;
                            const double chi2 = dx * dx / vx + dy * dy / vy;
                            if (chi2 <= chi2_max) {
                                if (write) {
                                    FhEdge ed;
                                    ed.rank = fh_order64(h == own ? chi2 - FH_HOLD : chi2);
                                    ed.r = r;
                                    ed.q = q;
                                    ev_edges[(size_t)from + count] = ed;
                                } else {
                                    atomicAdd(&cl[q], 1u);
                                }
                                count++;
                            }
                        }
                    }
                    if (!write) u[4] = count;
                }
                if (!write) {
                    u32 chunk;
                    const u32 start = n_edges + fh_scan(count, &chunk) - count;
                    if (r < np) pslot[(size_t)r * 8 + 3] = start;
                    n_edges += chunk;
                }
                __syncthreads();
            }
            if (!write) {
                // FirstHits::run leaves the tracks as they are where the pairs of the
                // predictions before the last exceed the bound.
                const u32 last = pslot[(size_t)(np - 1) * 8 + 4];
                too_many = n_edges - last > max_pairs;
                if (!too_many && n_edges > edge_share) {
                    if (tid == 0) fh_failed[e] = 2;
                    return;
                }
            }
        }
        if (too_many) continue;
        FH_CLOCK(6);
        // 6. The uncontested pairs; the others' groups matched at their least summed rank,
        // the larger groups' pairs sorted and matched in order.
        u32 n_cont = 0;
        for (u32 c0 = 0; c0 < np; c0 += FH_THREADS) {
            const u32 r = c0 + tid;
            u32 count = 0;
            if (r < np) {
                u32* u = pslot + (size_t)r * 8;
                const u32 a = u[3];
                const u32 b = a + u[4];
                u[5] = FH_NONE;
                if (b == a + 1 && cl[ev_edges[a].q] == 1) {
                    const u32 h = ph[ev_edges[a].q];
                    u[5] = h;
                    fh_set(s_taken, h);
                    fh_set(s_asg, r);
                } else {
                    count = b - a;
                }
                // The prediction's group label (itself to start with; none uncontested).
                u[6] = count > 0 ? r : FH_NONE;
            }
            u32 chunk;
            fh_scan(count, &chunk);
            n_cont += chunk;
            __syncthreads();
        }
        // The groups of contested pairs (predictions linked by the hits their windows
        // share): each prediction's label lowered to the least of its group's (through
        // the pool places' labels in the claims' words, free once read) until no label
        // changes; each group's predictions then linked from its root (the prediction that
        // is its own label; three scratch words each in the predictions' doubles, free
        // once the pairs are written), and each group matched at its least summed rank by
        // its root's thread where small enough. The pairs of the others are sorted and
        // taken in order below.
        if (n_cont > 0) {
            __shared__ u32 s_changed;
            u32* words = (u32*)pd8;
            for (u32 r = tid; r < np; r += FH_THREADS) {
                const u32* u = pslot + (size_t)r * 8;
                if (u[6] == FH_NONE) continue;
                for (u32 x = u[3]; x < u[3] + u[4]; x++) cl[ev_edges[x].q] = FH_NONE;
                words[(size_t)r * 16] = FH_NONE;
                words[(size_t)r * 16 + 2] = 0;
            }
            __syncthreads();
            for (;;) {
                for (u32 r = tid; r < np; r += FH_THREADS) {
                    const u32* u = pslot + (size_t)r * 8;
                    if (u[6] == FH_NONE) continue;
                    for (u32 x = u[3]; x < u[3] + u[4]; x++) atomicMin(&cl[ev_edges[x].q], u[6]);
                }
                __syncthreads();
                if (tid == 0) s_changed = 0;
                __syncthreads();
                for (u32 r = tid; r < np; r += FH_THREADS) {
                    u32* u = pslot + (size_t)r * 8;
                    if (u[6] == FH_NONE) continue;
                    u32 low = u[6];
                    for (u32 x = u[3]; x < u[3] + u[4]; x++) low = min(low, cl[ev_edges[x].q]);
                    if (low < u[6]) {
                        u[6] = low;
                        s_changed = 1;
                    }
                }
                __syncthreads();
                const bool more = s_changed != 0;
                __syncthreads();
                if (!more) break;
            }
            for (u32 r = tid; r < np; r += FH_THREADS) {
                const u32 root = pslot[(size_t)r * 8 + 6];
                if (root == FH_NONE || root == r) continue;
                words[(size_t)r * 16 + 1] = atomicExch(&words[(size_t)root * 16], r);
                atomicAdd(&words[(size_t)root * 16 + 2], 1u);
            }
            __syncthreads();
            for (u32 r = tid; r < np; r += FH_THREADS) {
                if (pslot[(size_t)r * 8 + 6] == r)
                    fh_solve_group(r, ev_edges, pslot, cl, ph, words, chi2_max, s_asg, s_taken);
            }
            __syncthreads();
            // Only the pairs of the groups left unmatched go on to the ordered matching
            // (a matched group's predictions are all assigned, and its hits are no other
            // group's), gathered in prediction order for the sort.
            u32 n_left = 0;
            for (u32 c0 = 0; c0 < np; c0 += FH_THREADS) {
                const u32 r = c0 + tid;
                u32 count = 0, a = 0;
                if (r < np && pslot[(size_t)r * 8 + 6] != FH_NONE && !fh_bit(s_asg, r)) {
                    a = pslot[(size_t)r * 8 + 3];
                    count = pslot[(size_t)r * 8 + 4];
                }
                u32 chunk;
                const u32 to = n_left + fh_scan(count, &chunk) - count;
                for (u32 i = 0; i < count; i++) ev_contested[to + i] = ev_edges[a + i];
                n_left += chunk;
                __syncthreads();
            }
            n_cont = n_left;
        }
        u32 n_sort = 1;
        while (n_sort < n_cont) n_sort <<= 1;
        if (n_cont > 0 && n_sort > edge_share) {
            if (tid == 0) fh_failed[e] = 2;
            return;
        }
        for (u32 i = n_cont + tid; i < n_sort; i += FH_THREADS) {
            FhEdge s;
            s.rank = ~0ull;
            s.r = FH_NONE;
            s.q = FH_NONE;
            ev_contested[i] = s;
        }
        __syncthreads();
        if (n_cont > 1) fh_sort_edges(ev_contested, n_sort);
        FH_CLOCK(7);
        // Matched in order by one thread, from pairs (prediction, hit) staged in shared
        // memory by the block.
        for (u32 c0 = 0; c0 < n_cont; c0 += 1024) {
            const u32 cn = min(n_cont - c0, 1024u);
            for (u32 i = tid; i < cn; i += FH_THREADS) {
                const FhEdge ed = ev_contested[c0 + i];
                s_key[i] = ((unsigned long long)ed.r << 32) | ph[ed.q];
            }
            __syncthreads();
            if (tid == 0) {
                for (u32 i = 0; i < cn; i++) {
                    const u32 r = (u32)(s_key[i] >> 32), h = (u32)s_key[i];
                    if (fh_bit(s_asg, r) || fh_bit(s_taken, h)) continue;
                    s_asg[r >> 5] |= 1u << (r & 31);
                    s_taken[h >> 5] |= 1u << (h & 31);
                    pslot[(size_t)r * 8 + 5] = h;
                }
            }
            __syncthreads();
        }
        FH_CLOCK(8);
        // 7. The changes, in prediction order: a new hit, or none where another took the own
        // one.
        u32 n_chg = 0;
        for (u32 c0 = 0; c0 < np; c0 += FH_THREADS) {
            const u32 r = c0 + tid;
            bool change = false;
            u32 nw = FH_NONE;
            if (r < np) {
                const u32* u = pslot + (size_t)r * 8;
                const u32 own = u[1];
                nw = u[5];
                if (nw == FH_NONE && !fh_bit(s_taken, own)) nw = own;
                change = nw != own;
            }
            u32 chunk;
            const u32 j = n_chg + fh_scan(change ? 1u : 0u, &chunk) - (change ? 1u : 0u);
            if (change) {
                // The change's prediction and new hit, at the change's place.
                pslot[(size_t)j * 8 + 6] = r;
                pslot[(size_t)j * 8 + 7] = nw;
            }
            n_chg += chunk;
            __syncthreads();
        }
        if (n_chg == 0) continue;
        FH_CLOCK(9);
        // The changes made, each track's fit kept (chg_fit: per change, the candidates' fit
        // of the changed track, then the track's fit before the change); then the
        // candidates' fit of the changed tracks (for the cut) on the block's first threads
        // and, where the tracks' own fit differs, that fit of the same tracks on the others
        // at once, into the tracks' fits (the changes undone below given back their fits, or
        // fitted again).
        for (u32 j = tid; j < n_chg; j += FH_THREADS) {
            const u32 r = pslot[(size_t)j * 8 + 6], nw = pslot[(size_t)j * 8 + 7];
            const u32 t = tb + pslot[(size_t)r * 8];
            const uint2 tr = out_tracks[t];
            const u32* was = out_fits + (size_t)t * FIT_WORDS;
            u32* keep = chg_fit + (2 * ((size_t)tb + j) + 1) * FIT_WORDS;
            for (int i = 0; i < FIT_WORDS; i++) keep[i] = was[i];
            if (nw == FH_NONE) {
                fh_drop(out_hits, out_tracks, t, at);
            } else {
                out_hits[tr.x + at] = nw;
            }
        }
        __syncthreads();
        const bool track_fit = fi[FHI_TRACK_FIT] != 0;
        const KalmanTables T = {rows32, rows64, gap_steps, gap_kind, gap_slice,
                                slices, pf,     pd,        pi,       nodes};
        const KalmanTables TT = {rows32, rows64, gap_steps, gap_kind, gap_slice, slices,
                                 track_fit ? tpf : pf, track_fit ? tpd : pd,
                                 track_fit ? tpi : pi, nodes};
        {
            const u32 lanes = track_fit ? FH_THREADS / 2 : FH_THREADS;
            const bool cand = tid < lanes;
            for (u32 j = cand ? tid : tid - lanes; j < n_chg; j += lanes) {
                const u32 t = tb + pslot[(size_t)pslot[(size_t)j * 8 + 6] * 8];
                u32* o = cand ? chg_fit + 2 * ((size_t)tb + j) * FIT_WORDS
                              : out_fits + (size_t)t * FIT_WORDS;
                fh_fit(out_hits, out_tracks[t], hx, hy, hp, cand ? T : TT, o);
            }
        }
        __syncthreads();
        FH_CLOCK(10);
        // Each change that fails the fit's cut undone, in order: its own hit back if still
        // free (marked for its fit back), else none there (marked for its fit again).
        if (tid == 0) {
            const double max_chi2_ndf = fp[FHD_MAX_CHI2_NDF];
            for (u32 j = 0; j < n_chg; j++) {
                const u32* w = chg_fit + 2 * ((size_t)tb + j) * FIT_WORDS;
                const double chi2 = (double)__uint_as_float(w[21]);
                const u32 ndf = min(w[22], 65535u);
                const bool pass = w[23] != 0 && ndf > 0 && chi2 / (double)ndf <= max_chi2_ndf;
                const u32 r = pslot[(size_t)j * 8 + 6], nw = pslot[(size_t)j * 8 + 7];
                if (pass || nw == FH_NONE) continue;
                const u32 own = pslot[(size_t)r * 8 + 1];
                const u32 t = tb + pslot[(size_t)r * 8];
                const uint2 tr = out_tracks[t];
                const bool back = !fh_bit(s_taken, own);
                if (back) {
                    out_hits[tr.x + at] = own;
                } else {
                    fh_drop(out_hits, out_tracks, t, at);
                }
                s_taken[nw >> 5] &= ~(1u << (nw & 31));
                s_taken[own >> 5] |= 1u << (own & 31);
                pslot[(size_t)j * 8 + 7] = back ? FH_RESTORED : FH_UNDONE;
            }
        }
        __syncthreads();
        FH_CLOCK(11);
        // The final fits: a track whose change was undone to its own hit gets back the fit
        // it had, one that lost the hit is fitted again with the tracks' fit; the others'
        // candidates' fit is copied where it is the tracks' fit too.
        for (u32 j = tid; j < n_chg; j += FH_THREADS) {
            const u32 r = pslot[(size_t)j * 8 + 6];
            const u32 t = tb + pslot[(size_t)r * 8];
            const u32 how = pslot[(size_t)j * 8 + 7];
            u32* o = out_fits + (size_t)t * FIT_WORDS;
            if (how == FH_UNDONE) {
                fh_fit(out_hits, out_tracks[t], hx, hy, hp, TT, o);
            } else if (how == FH_RESTORED || !track_fit) {
                const u32* w = chg_fit + (2 * ((size_t)tb + j) + (how == FH_RESTORED)) * FIT_WORDS;
                for (int i = 0; i < FIT_WORDS; i++) o[i] = w[i];
            }
        }
        FH_CLOCK(12);
#ifdef FH_PHASE_CLOCKS
        if (tid == 0 && e < 2) {
            long long d[12];
            for (int i = 0; i < 12; i++) d[i] = fh_clk[i + 1] - fh_clk[i];
            printf("ca_first_hits hit %u phases event %u tracks %u predictions %u pool %u pairs %u "
                   "contested left unmatched %u changes %u: kept %lld predictions %lld spot %lld pool %lld "
                   "pool sort %lld pairs %lld contested sort %lld matching %lld changes %lld "
                   "fits %lld undo %lld final fits %lld\n",
                   at, e, nt, np, npool, n_edges, n_cont, n_chg, d[0], d[1], d[2], d[3], d[4],
                   d[5], d[6], d[7], d[8], d[9], d[10], d[11]);
        }
#endif
        // The pass's tracks and fits complete before the next pass reads them.
        __syncthreads();
        FH_CLOCK(0);
    }
}
