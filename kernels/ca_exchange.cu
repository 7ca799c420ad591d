// Exchange of segments between crossing tracks (src/tracking/ca/exchange.rs) on the
// device: on the tracks ca_tracks_pack packed and the clone step marked, before the first
// hits are chosen again (ca_first_hits.cu) and before the tracks go to the host. The same
// steps as Exchange::run, in the same arithmetic, as a sequence of kernels over the
// batch's events (the host launches each round's until no event made an exchange in the
// round before; an event whose exchanges are done leaves each at once): ca_exchange_begin
// (one block per event), then per round ca_exchange_fit_changed (from the second),
// ca_exchange_pairs (the first; ca_exchange_pairs_changed in the later ones),
// ca_exchange_fit_needed and ca_exchange_evaluate (several blocks per event: the searches
// and the fits of all the events' tracks and pairs at once), ca_exchange_choose (one block
// per event), and ca_exchange_end (one block per event):
//
// 1. the tracks kept: not clones and not below the minimum momentum (MomentumCut::keeps;
//    a track below it is marked 2 in the clone marks, as ca_first_hits marks it); each
//    track's hits copied to a working list of the event's slot (stride: the planes);
//    every kept track's hits owned by it;
// 2. per round: the pairs of tracks whose hits on a plane lie within the window of the
//    side of the exchange (ExchangeCuts::window_for at the softer track's |q/p|), of
//    which one track changed in the round before (all in the first), found through the
//    grid the hits were sorted into at the launch's start (ca_hit_sorting.cu), each pair once
//    (from the changed track of lower index; the boundary shared by two planes from the
//    plane downstream of it; where the gain is the kinks' evidence, also the boundaries
//    past a plane one of the two misses, up to the next both cross); the tracks in a
//    pair whose candidates' chi-square is not known fitted (after the tracks changed in
//    the round before, whose |q/p| set the pairs' windows);
// 3. every pair's exchange tested by the kinks around its junction and its two new
//    tracks fitted at once by two lanes, the gain kept under Exchange::run's tests
//    (where no field measures momenta, the gain of the kinks' evidence, the lanes each
//    taking two of its four terms, and both new tracks fitted where it gains); the
//    gains sorted by (gain descending, pair, boundary) and taken in that order by one
//    thread, each track once per round; the exchanges applied to the working lists;
// 4. after the last round, the exchanged tracks fitted with the tracks' fit (the
//    candidates' where there is no other) and the event's tracks packed again in place,
//    in their order, from the working lists (an exchange keeps the pair's hits).
//
// Nothing depends on the order threads arrive in: pairs and gains are sets whose order is
// a key's. An event beyond the step's limits (its tracks, planes, a track's hits, its pairs)
// is marked failed with its tracks untouched: the host runs it on the CPU.

#define EX_THREADS 512
// Threads of the kernels with several blocks per event.
#define EX_WIDE_THREADS 256
#define EX_MAX_TRACKS 8192
#define EX_TRACK_WORDS (EX_MAX_TRACKS / 32)
#define EX_MAX_PLANES 63
#define EX_NAN __int_as_float(0x7fc00000)
#define EX_NONE 0xffffffffu
// exchange.rs: MIN_GAIN, MAX_ROUNDS, PRE_TEST, RETRY_WITHIN.
#define EX_MIN_GAIN 2.0f
#define EX_MAX_ROUNDS 8
#define EX_PRE_TEST 10.0
#define EX_RETRY_WITHIN 10.0f
// MIN_GAIN - FIRST_HIT_SLACK: the least predicted gain of a swap of first hits fitted.
#define EX_FIRST_HIT_MIN (-5.0)
// Parameters, floats (exchange_params): the |q/p| the windows are for; whether the
// kinks' bending is known (ExchangeCuts::bending) and whether the field is uniform, the
// uniform field (tesla), the origin's x and y (JunctionBending); then per plane the
// resolution part of the windows, the scattering parts upstream and downstream, the
// window (the larger side's) and the bending lever (Bending::inv_lever).
#define EXF_QOP_REF 0
#define EXF_BEND 1
#define EXF_UNIFORM 2
#define EXF_FIELD 3
#define EXF_ORIGIN 6
#define EXF_PLANES 8
#define EXF_PER_PLANE 5
// The bending constant, GeV/c per tesla and mm (propagate.rs: K_GEV_PER_T_MM).
#define EX_K 0.299792458e-3
// Parameters, doubles: the fit's cut, the momentum cut, then per plane (EXD_PER_PLANE)
// z, the kink's scattering variance and the hit's, and the hit's variances in x and y.
#define EXD_MAX_CHI2_NDF 0
#define EXD_MC_MAX_QOP 1
#define EXD_MC_N_SIGMA 2
#define EXD_PLANES 3
#define EXD_PER_PLANE 5
// Parameters, ints.
#define EXI_N_PLANES 0
#define EXI_MIN_HITS 1
#define EXI_TRACK_FIT 2
#define EXI_EVIDENCE 3
// Failures (ex_failed): tracks, planes or a track's hits beyond the step's, pairs beyond
// the event's share.
#define EX_FAIL_SIZE 1
#define EX_FAIL_PAIRS 2
// Per track slot (ex_flags): changed in the round before, exchanged, its candidates' fit
// needed.
#define EX_CHANGED 1u
#define EX_EXCHANGED 2u
#define EX_NEED 4u
// Per event (ex_state, EX_STATE words): rounds go on, pairs, gains, exchanges made.
#define EX_STATE 8
#define EX_ACTIVE 0
#define EX_N_PAIRS 1
#define EX_N_GAINS 2
#define EX_N_MADE 3

__device__ __forceinline__ u32 ex_scan(u32 v, u32* total) {
    return block_scan_inclusive_of<EX_THREADS>(v, total);
}

__device__ __forceinline__ bool ex_bit(const u32* bits, u32 i) { return (bits[i >> 5] >> (i & 31)) & 1u; }

// A pair (a < b, boundary) in one word: a and b below EX_MAX_TRACKS (13 bits), the
// boundary at most EX_MAX_PLANES (6 bits).
__device__ __forceinline__ u32 ex_pair(u32 a, u32 b, u32 boundary) { return (a << 19) | (b << 6) | boundary; }

// ExchangeCuts::window_for.
__device__ __forceinline__ float ex_window(const float* __restrict__ xf, u32 p, u32 side, float q) {
    const float* w = xf + EXF_PLANES + EXF_PER_PLANE * p;
    const float s = w[1 + side];
    const float qref = xf[EXF_QOP_REF];
    if (qref > 0.0f && isfinite(q)) return w[0] + s * fminf(q / qref, 1.0f);
    return w[0] + s;
}

// The position of track k's first hit at or downstream of plane `boundary` (split).
__device__ __forceinline__ u32 ex_split(const u32* list, u32 len, const u32* hp, u32 boundary) {
    for (u32 i = 0; i < len; i++) {
        if (hp[list[i]] >= boundary) return i;
    }
    return len;
}

// The first plane after p on which both tracks have a hit, or `none` (next_common_plane).
__device__ __forceinline__ u32 ex_next_common(const u32* a, u32 na, const u32* b, u32 nb, const u32* hp,
                                              u32 p, u32 none) {
    u32 i = 0, j = 0;
    while (i < na && j < nb) {
        const u32 pa = hp[a[i]], pb = hp[b[j]];
        if (pa <= p || pa < pb) {
            i++;
        } else if (pb <= p || pb < pa) {
            j++;
        } else {
            return pa;
        }
    }
    return none;
}

// The track's hit on plane p, or EX_NONE.
__device__ __forceinline__ u32 ex_on_plane(const u32* list, u32 len, const u32* hp, u32 p) {
    for (u32 i = 0; i < len; i++) {
        const u32 q = hp[list[i]];
        if (q == p) return list[i];
        if (q > p) break;
    }
    return EX_NONE;
}

// A kink of junction_kinks: the change of slope, the scattering's variance at the minimum
// momentum, the resolution's three terms, the planes, the middle hit, the outer chord's
// slopes and span.
struct ExKink {
    double kx, ky, scatter, r0, r1, r2, tx, ty, span;
    u32 l, m, r;
    float x, y;
};

__device__ __forceinline__ ExKink ex_kink_of(const double* __restrict__ xd, const float* hx,
                                             const float* hy, const u32* hp, u32 l, u32 m, u32 r) {
    ExKink k;
    k.l = hp[l];
    k.m = hp[m];
    k.r = hp[r];
    const double xl = (double)hx[l], yl = (double)hy[l];
    const double xm = (double)hx[m], ym = (double)hy[m];
    const double xr = (double)hx[r], yr = (double)hy[r];
    const double* P = xd + EXD_PLANES;
    const double g1 = P[EXD_PER_PLANE * k.m] - P[EXD_PER_PLANE * k.l];
    const double g2 = P[EXD_PER_PLANE * k.r] - P[EXD_PER_PLANE * k.m];
    k.span = g1 + g2;
    k.kx = (xr - xm) / g2 - (xm - xl) / g1;
    k.ky = (yr - ym) / g2 - (ym - yl) / g1;
    const double s = 1.0 / g1 + 1.0 / g2;
    k.scatter = P[EXD_PER_PLANE * k.m + 1];
    k.r0 = P[EXD_PER_PLANE * k.m + 2] * (s * s);
    k.r1 = P[EXD_PER_PLANE * k.l + 2] / (g1 * g1);
    k.r2 = P[EXD_PER_PLANE * k.r + 2] / (g2 * g2);
    k.x = hx[m];
    k.y = hy[m];
    k.tx = (xr - xl) / k.span;
    k.ty = (yr - yl) / k.span;
    return k;
}

// Kink::var.
__device__ __forceinline__ double ex_kink_var(const ExKink& k, double s2) {
    return k.scatter * s2 + k.r0 + k.r1 + k.r2;
}

// The squared kink at m between l and r, in units of its scattering and resolution
// (straight_score's term).
__device__ __forceinline__ double ex_kink(const double* __restrict__ xd, const float* hx,
                                          const float* hy, const u32* hp, u32 l, u32 m, u32 r) {
    const ExKink k = ex_kink_of(xd, hx, hy, hp, l, m, r);
    return (k.kx * k.kx + k.ky * k.ky) / ex_kink_var(k, 1.0);
}

// straight_score of the junction of segments up (nu hits) and down (nd hits).
__device__ double ex_junction(const double* __restrict__ xd, const float* hx, const float* hy,
                              const u32* hp, const u32* up, u32 nu, const u32* down, u32 nd) {
    double s = 0.0;
    if (nu >= 2) s += ex_kink(xd, hx, hy, hp, up[nu - 2], up[nu - 1], down[0]);
    if (nd >= 2) s += ex_kink(xd, hx, hy, hp, up[nu - 1], down[0], down[1]);
    return s;
}

// Kink::bend: the change of slope the field gives per unit q/p (NaN where no table holds
// the tent).
__device__ __forceinline__ void ex_kink_bend(const ExKink& k, const float* __restrict__ xf,
                                             const int* __restrict__ ex_pri,
                                             const float* __restrict__ ex_tents, u32 n_planes,
                                             double* bx, double* by) {
    float f[3];
    if (xf[EXF_UNIFORM] != 0.0f) {
        for (int c = 0; c < 3; c++) f[c] = xf[EXF_FIELD + c];
    } else {
        int ti = -1;
        if (k.m > k.l && k.r > k.m && k.r - k.m - 1 < MAX_REACH)
            ti = ex_pri[(k.l * n_planes + k.m) * PRI + 1 + (k.r - k.m - 1)];
        if (ti < 0) {
            *bx = (double)EX_NAN;
            *by = (double)EX_NAN;
            return;
        }
        const float inv = xf[EXF_PLANES + EXF_PER_PLANE * k.m + 4];
        tent_at(ex_tents + (size_t)ti * TENT_FLOATS, (k.x - xf[EXF_ORIGIN]) * inv,
                (k.y - xf[EXF_ORIGIN + 1]) * inv, f);
    }
    const double b0 = (double)f[0], b1 = (double)f[1], b2 = (double)f[2];
    const double tx = k.tx, ty = k.ty;
    const double ax = tx * ty * b0 - (1.0 + tx * tx) * b1 + ty * b2;
    const double ay = (1.0 + ty * ty) * b0 - tx * ty * b1 - tx * b2;
    const double per_qop = EX_K * sqrt(1.0 + tx * tx + ty * ty) * k.span * 0.5;
    *bx = ax * per_qop;
    *by = ay * per_qop;
}

// bent_score (q the track's q/p) and best_bent_score (q NaN: the q/p that explains the
// kinks best) of the junction of segments up (nu hits) and down (nd hits).
__device__ double ex_bent(const double* __restrict__ xd, const float* __restrict__ xf,
                          const int* __restrict__ ex_pri, const float* __restrict__ ex_tents,
                          u32 n_planes, const float* hx, const float* hy, const u32* hp,
                          const u32* up, u32 nu, const u32* down, u32 nd, bool best, double q,
                          double s2) {
    ExKink ks[2];
    int n = 0;
    if (nu >= 2) ks[n++] = ex_kink_of(xd, hx, hy, hp, up[nu - 2], up[nu - 1], down[0]);
    if (nd >= 2) ks[n++] = ex_kink_of(xd, hx, hy, hp, up[nu - 1], down[0], down[1]);
    double s = 0.0, kk = 0.0, kb = 0.0, bb = 0.0;
    for (int i = 0; i < n; i++) {
        const ExKink& k = ks[i];
        double bx, by;
        ex_kink_bend(k, xf, ex_pri, ex_tents, n_planes, &bx, &by);
        const double v = ex_kink_var(k, s2);
        if (best) {
            kk += (k.kx * k.kx + k.ky * k.ky) / v;
            kb += (k.kx * bx + k.ky * by) / v;
            bb += (bx * bx + by * by) / v;
        } else {
            const double rx = k.kx - q * bx, ry = k.ky - q * by;
            s += (rx * rx + ry * ry) / v;
        }
    }
    if (!best) return s;
    if (bb == 0.0) return kk;
    // (A NaN stays NaN: no exchange is refused on it.)
    const double r = kk - kb * kb / bb;
    return r < 0.0 ? 0.0 : r;
}

// Exchange::measured_score of pair (a, b) whose boundary splits a's sa of la hits and b's
// sb of lb: NaN where the tracks' momenta are not measured.
__device__ double ex_measured(const double* __restrict__ xd, const float* __restrict__ xf,
                              const int* __restrict__ ex_pri, const float* __restrict__ ex_tents,
                              u32 n_planes, const float* hx, const float* hy, const u32* hp,
                              const float* qop, const float* sq, u32 a, u32 b, const u32* ta,
                              u32 sa, u32 la, const u32* tbl, u32 sb, u32 lb) {
    if (xf[EXF_BEND] == 0.0f) return (double)EX_NAN;
    const float soft = fmaxf(qop[a], qop[b]);
    const double s = isfinite(soft) ? fmin((double)soft / (double)xf[EXF_QOP_REF], 1.0) : 1.0;
    const double s2 = s * s;
#define EX_BENT(up, nu, down, nd, best, q)                                                    \
    ex_bent(xd, xf, ex_pri, ex_tents, n_planes, hx, hy, hp, up, nu, down, nd, best, q, s2)
    return EX_BENT(ta, sa, ta + sa, la - sa, false, (double)sq[a]) +
           EX_BENT(tbl, sb, tbl + sb, lb - sb, false, (double)sq[b]) -
           EX_BENT(ta, sa, tbl + sb, lb - sb, true, 0.0) -
           EX_BENT(tbl, sb, ta + sa, la - sa, true, 0.0);
#undef EX_BENT
}

// The rise of a track's last update's chi-square with the hit at (hx, hy) instead of its
// own (mx, my); f: the fit's x, y and their covariance (xx, yx, yy) at the first hit
// (first_hit_gain's `rise`).
__device__ __forceinline__ double ex_rise(const float* f, double vx, double vy, double mx, double my,
                                          double hx, double hy) {
    const double dx = hx - mx, dy = hy - my;
    const double rx = mx - (double)f[0], ry = my - (double)f[1];
    const double sxx = (1.0 - (double)f[2] / vx) / vx;
    const double syy = (1.0 - (double)f[4] / vy) / vy;
    const double sxy = -(double)f[3] / (vx * vy);
    return (((dx * dx) * sxx + ((2.0 * dx) * dy) * sxy) + (dy * dy) * syy) +
           2.0 * ((dx * rx) / vx + (dy * ry) / vy);
}

// first_hit_gain: the gain of swapping the first hits ha and hb (one plane) of two tracks
// whose fits at their first hit are fa and fb.
__device__ __forceinline__ double ex_first_hit_gain(const double* __restrict__ xd, const float* hx,
                                                    const float* hy, const u32* hp, const float* fa,
                                                    const float* fb, u32 ha, u32 hb) {
    const double* P = xd + EXD_PLANES + EXD_PER_PLANE * hp[ha];
    const double vx = P[3], vy = P[4];
    const double ax = (double)hx[ha], ay = (double)hy[ha], bx = (double)hx[hb], by = (double)hy[hb];
    return -(ex_rise(fa, vx, vy, ax, ay, bx, by) + ex_rise(fb, vx, vy, bx, by, ax, ay));
}

// ExchangeCuts::good on a fit of n hits.
__device__ __forceinline__ bool ex_good(const KalmanResult& r, u32 n, u32 min_hits, double max_chi2_ndf) {
    const u32 ndf = min((u32)r.ndf, 65535u);
    return n >= min_hits && r.ok != 0 && ndf > 0 && (double)(r.chi2 / (float)ndf) <= max_chi2_ndf;
}

// The hits of `list` (event indices) as the fit reads them.
__device__ __forceinline__ CandHits ex_hits(const u32* list, const float* hx, const float* hy,
                                            const u32* hp) {
    CandHits h;
    h.idx = list;
    h.hx = hx;
    h.hy = hy;
    h.hp = hp;
    return h;
}

// A fit of the n hits of `list` (event indices) with tables T.
__device__ __forceinline__ void ex_fit(const u32* list, u32 n, const float* hx, const float* hy,
                                       const u32* hp, const KalmanTables& T, KalmanResult& r) {
    kalman_fit_track(ex_hits(list, hx, hy, hp), (int)n, MAX_CHAIN, T, r);
}

// Fit_missing's record of a candidates' fit (TrackFits::take): chi-square (infinite where
// the fit failed), the largest |q/p| (fitted plus three standard deviations), the q/p and
// x, y and their covariance at the first hit.
__device__ __forceinline__ void ex_note_fit(const KalmanResult& r, float* chi2, float* qop, float* sq,
                                            float* first) {
    *chi2 = r.ok ? r.chi2 : CA_INF;
    *qop = (float)(fabs((double)r.st[4]) + 3.0 * sqrt(fmax((double)r.c[14], 0.0)));
    *sq = r.st[4];
    first[0] = r.st[0];
    first[1] = r.st[1];
    first[2] = r.c[0];
    first[3] = r.c[1];
    first[4] = r.c[2];
}


// The arguments every kernel of the step takes.
#define EX_PARAMS                                                                              \
    const u32 *__restrict__ failed, const u32 *__restrict__ trk_n,                            \
        const u32 *__restrict__ trk_base, const u32 *__restrict__ trk_hit_base,               \
        const u32 *__restrict__ hit_start, const float *__restrict__ in_x,                    \
        const float *__restrict__ in_y, const u32 *__restrict__ in_plane,                     \
        uint2 *__restrict__ out_tracks, u32 *__restrict__ out_fits, u32 *__restrict__ out_hits, \
        u32 *__restrict__ marks, const float *__restrict__ xf, const double *__restrict__ xd,  \
        const int *__restrict__ xi, u32 *__restrict__ lists, u32 *__restrict__ lens,          \
        float *__restrict__ chi2s, float *__restrict__ qops, float *__restrict__ firsts,      \
        u32 *__restrict__ flags,                                                              \
        u32 *__restrict__ owner, const float *__restrict__ sx,                                \
        const u32 *__restrict__ sinput, const u32 *__restrict__ bin_start, int n_bins,        \
        const float *__restrict__ plf, const int *__restrict__ pli, u32 *__restrict__ pairs,  \
        unsigned long long *__restrict__ gains, u32 pairs_per_track, u32 pair_limit,          \
        u32 *__restrict__ state, u32 *__restrict__ ex_failed, u32 *__restrict__ n_active,     \
        const float *__restrict__ rows32, const double *__restrict__ rows64,                  \
        const int *__restrict__ gap_steps, const int *__restrict__ gap_kind,                  \
        const int *__restrict__ gap_slice, const float *__restrict__ slices,                  \
        const float *__restrict__ pf, const double *__restrict__ pd,                          \
        const int *__restrict__ pi, const float *__restrict__ nodes,                          \
        const float *__restrict__ tpf, const double *__restrict__ tpd,                        \
        const int *__restrict__ tpi, const int *__restrict__ ex_pri,                          \
        const float *__restrict__ ex_tents, float *__restrict__ sqops

// The same arguments passed on.
#define EX_ARGS                                                                                \
    failed, trk_n, trk_base, trk_hit_base, hit_start, in_x, in_y, in_plane, out_tracks,        \
        out_fits, out_hits, marks, xf, xd, xi, lists, lens, chi2s, qops, firsts, flags, owner, \
        sx,                                                                                    \
        sinput, bin_start, n_bins, plf, pli, pairs, gains, pairs_per_track, pair_limit, state, \
        ex_failed, n_active, rows32, rows64, gap_steps, gap_kind, gap_slice, slices, pf, pd,   \
        pi, nodes, tpf, tpd, tpi, ex_pri, ex_tents, sqops

// The event's views of the arguments (`e` the event).
#define EX_EVENT                                                                              \
    const u32 nt = trk_n[e], tb = trk_base[e];                                                \
    const u32 hs = hit_start[e], nh = hit_start[e + 1] - hs;                                  \
    const float* hx = in_x + hs;                                                              \
    const float* hy = in_y + hs;                                                              \
    const u32* hp = in_plane + hs;                                                            \
    const u32 n_planes = (u32)xi[EXI_N_PLANES];                                               \
    const u32 min_hits = (u32)xi[EXI_MIN_HITS];                                               \
    const double max_chi2_ndf = xd[EXD_MAX_CHI2_NDF];                                         \
    const u32 S = n_planes;                                                                   \
    u32* L = lists + (size_t)tb * S;                                                          \
    u32* len = lens + tb;                                                                     \
    float* chi2 = chi2s + tb;                                                                 \
    float* qop = qops + tb;                                                                   \
    float* sq = sqops + tb;                                                                   \
    float* fst = firsts + (size_t)tb * 5;                                                     \
    u32* fl = flags + tb;                                                                     \
    u32* own = owner + hs;                                                                    \
    const u32 pair_cap = min(pairs_per_track * nt, pair_limit);                               \
    u32* P = pairs + (size_t)tb * pairs_per_track;                                            \
    unsigned long long* G = gains + 2 * (size_t)tb * pairs_per_track;                         \
    u32* st = state + (size_t)e * EX_STATE;                                                   \
    const int track_fit = xi[EXI_TRACK_FIT];                                                  \
    const int evidence = xi[EXI_EVIDENCE];                                                    \
    const KalmanTables T = {rows32, rows64, gap_steps, gap_kind, gap_slice,                   \
                            slices, pf,     pd,        pi,       nodes};                      \
    (void)nh; (void)min_hits; (void)max_chi2_ndf; (void)pair_cap; (void)track_fit; (void)T; (void)fst; \
    (void)sq; (void)evidence;

// 1. The tracks kept, their working lists, their hits' owners and index.
extern "C" __global__ void __launch_bounds__(EX_THREADS) ca_exchange_begin(EX_PARAMS) {
    __shared__ u32 s_overflow;
    const u32 e = blockIdx.y;
    const u32 tid = threadIdx.x;
    EX_EVENT
    if (tid == 0) {
        ex_failed[e] = 0;
        for (int i = 0; i < EX_STATE; i++) st[i] = 0;
        s_overflow = 0;
    }
    if (failed[e] || nt < 2) return;
    if (nt > EX_MAX_TRACKS || n_planes > EX_MAX_PLANES) {
        if (tid == 0) ex_failed[e] = EX_FAIL_SIZE;
        return;
    }
    for (u32 h = tid; h < nh; h += EX_THREADS) own[h] = EX_NONE;
    __syncthreads();
    u32 live_local = 0;
    for (u32 k = tid; k < nt; k += EX_THREADS) {
        const u32 t = tb + k;
        const uint2 tr = out_tracks[t];
        fl[k] = 0;
        if (tr.y > S) {
            atomicOr(&s_overflow, 1u);
            continue;
        }
        len[k] = tr.y;
        for (u32 i = 0; i < tr.y; i++) L[(size_t)k * S + i] = out_hits[tr.x + i];
        if (marks[t] != 0) continue;
        const u32* fw = out_fits + (size_t)t * FIT_WORDS;
        {
            // MomentumCut::keeps.
            const double q0 = (double)__uint_as_float(fw[4]);
            const double var = (double)__uint_as_float(fw[5 + 14]);
            const double sigma = sqrt(var);
            const bool measured = q0 != 0.0 && isfinite(q0) && (var < 0.81 * q0 * q0 || isnan(var));
            if (measured && fabs(q0) - xd[EXD_MC_N_SIGMA] * sigma > xd[EXD_MC_MAX_QOP]) {
                marks[t] = 2;
                continue;
            }
        }
        live_local++;
        fl[k] = EX_CHANGED;
        for (u32 i = 0; i < tr.y; i++) own[out_hits[tr.x + i]] = k;
        // The tracks' own fits are the candidates' where there is no track fit.
        const u32 ndf = min(fw[22], 65535u);
        chi2[k] = track_fit ? EX_NAN : (ndf > 0 ? __uint_as_float(fw[21]) : CA_INF);
        const float q = __uint_as_float(fw[4]), v = __uint_as_float(fw[5 + 14]);
        qop[k] = fabsf(q) + 3.0f * sqrtf(fmaxf(v, 0.0f));
        sq[k] = q;
        // The first hit's x, y and covariance (Exchange::first).
        const u32 from[5] = {0, 1, 5, 6, 7};
        for (int i = 0; i < 5; i++) fst[(size_t)5 * k + i] = track_fit ? EX_NAN : __uint_as_float(fw[from[i]]);
    }
    u32 n_live;
    ex_scan(live_local, &n_live);
    __syncthreads();
    if (s_overflow) {
        if (tid == 0) ex_failed[e] = EX_FAIL_SIZE;
        return;
    }
    if (n_live < 2) return;
    if (tid == 0) st[EX_ACTIVE] = 1;
}

// Fits the candidates' fit of the event's tracks flagged `mask` (clearing EX_NEED), over
// the blocks of the event.
__device__ __forceinline__ void ex_fit_flagged(EX_PARAMS, u32 mask) {
    const u32 e = blockIdx.y;
    EX_EVENT
    if (!st[EX_ACTIVE] || st[EX_N_PAIRS] > pair_cap) return;
    for (u32 k = blockIdx.x * EX_WIDE_THREADS + threadIdx.x; k < nt; k += gridDim.x * EX_WIDE_THREADS) {
        const u32 f = fl[k];
        if (!(f & mask)) continue;
        if (mask == EX_NEED) fl[k] = f & ~EX_NEED;
        KalmanResult r;
        ex_fit(L + (size_t)k * S, len[k], hx, hy, hp, T, r);
        ex_note_fit(r, &chi2[k], &qop[k], &sq[k], fst + (size_t)5 * k);
    }
}

// 2. The tracks changed in the round before fitted (their |q/p| sets the windows of
// their pairs).
extern "C" __global__ void __launch_bounds__(EX_WIDE_THREADS) ca_exchange_fit_changed(EX_PARAMS) {
    ex_fit_flagged(EX_ARGS, EX_CHANGED);
}

// Lanes that search one hit's window together in the rounds after the first (a power of
// two, at most a warp). There few tracks changed, and the round waited on the longest
// searches: in a dense core a cell's stretch of the window's width in x holds tens of
// hits, which one thread read one after another. In the first round every track
// changed and the device is full: one thread per hit, where the searches' repeated
// steps in every lane cost more than they save.
#ifndef EX_SEARCH_LANES
#define EX_SEARCH_LANES 16
#endif
static_assert(EX_SEARCH_LANES >= 1 && EX_SEARCH_LANES <= 32 &&
                  (EX_SEARCH_LANES & (EX_SEARCH_LANES - 1)) == 0 &&
                  EX_WIDE_THREADS % EX_SEARCH_LANES == 0,
              "a search's lanes are a power of two within one warp");

// Probe `j` of a search of LANES lanes over [lo, lo + n): the range cut in LANES + 1 parts.
template <u32 LANES>
__device__ __forceinline__ u32 ex_probe(u32 lo, u32 n, u32 j) {
    return lo + (u32)(((unsigned long long)(j + 1) * n) / (LANES + 1));
}

// The first of gx[lo..hi) (ascending) at or above x, found by the search's LANES lanes
// together (`group` their lanes' mask, `sub` the lane's place in it): each step every
// lane tests one probe, and the range shrinks to the part between the last probe below x
// and the first one not. Every lane of the group gets the same answer. (One lane:
// `lower_bound_of`.)
template <u32 LANES>
__device__ __forceinline__ u32 ex_lower_bound(const float* gx, u32 lo, u32 hi, float x,
                                              unsigned group, u32 sub) {
    if constexpr (LANES == 1) {
        (void)group;
        (void)sub;
        return lower_bound_of(gx, lo, hi, x);
    } else {
        while (lo < hi) {
            const u32 n = hi - lo;
            const bool below = gx[ex_probe<LANES>(lo, n, sub)] < x;
            // The probes below x are the group's first `c` (gx is sorted).
            const u32 c = (u32)__popc(__ballot_sync(group, below) & group);
            const u32 lo2 = c == 0 ? lo : ex_probe<LANES>(lo, n, c - 1) + 1;
            hi = c == LANES ? hi : ex_probe<LANES>(lo, n, c);
            lo = lo2;
        }
    }
    return lo;
}

// The pairs: from each changed track's hits, the other kept tracks' hits within the
// plane's window (its rows and x about the hit, then the window itself), each hit's
// search by LANES lanes together; the tracks of a pair whose candidates' chi-square is not
// known flagged for their fit.
template <u32 LANES>
__device__ __forceinline__ void ex_pairs(EX_PARAMS) {
    const u32 e = blockIdx.y;
    EX_EVENT
    if (!st[EX_ACTIVE]) return;
    const float* xfp = xf + EXF_PLANES;
    const u32* starts = bin_start + (size_t)e * (n_bins + 1);
    const float* gx = sx + hs;
    const u32* gin = sinput + hs;
    const u32 lane = threadIdx.x & 31u, sub = lane & (LANES - 1u);
    const unsigned group = LANES == 32 ? 0xffffffffu : ((1u << LANES) - 1u) << (lane & ~(LANES - 1u));
    // One group of lanes per hit of a changed track (every test before the scan of a
    // cell is the same in the group's lanes).
    const u32 searches = gridDim.x * (EX_WIDE_THREADS / LANES);
    for (u32 item = (blockIdx.x * EX_WIDE_THREADS + threadIdx.x) / LANES; item < nt * S;
         item += searches) {
        const u32 k = item / S, i = item - k * S;
        if (!(fl[k] & EX_CHANGED)) continue;
        const u32* la = L + (size_t)k * S;
        const u32 na = len[k];
        if (i >= na) continue;
        const u32 h = la[i];
        const u32 p = hp[h];
        const float wp = xfp[EXF_PER_PLANE * p + 3];
        const float w = fmaxf(wp, 1e-3f);
        const float x = hx[h], y = hy[h];
        // The cells of the hit grid (ca_hit_sorting.cu: by plane, cell, then x) about the
        // hit, and in each the hits about its x.
        const float* gpl = plf + p * PLF;
        const int* gpi = pli + p * PLI;
        // (The window widened by more than the coordinates' rounding: the window's test
        // itself follows.)
        const float reach = w + 1e-3f;
        const float x_lo = x - reach, x_hi = x + reach;
        const u32 bx0 = bin_1d(gpl, gpi, 0, x_lo), bx1 = bin_1d(gpl, gpi, 0, x_hi);
        const u32 by0 = bin_1d(gpl, gpi, 1, y - reach), by1 = bin_1d(gpl, gpi, 1, y + reach);
        for (u32 by = by0; by <= by1; by++) {
            for (u32 bx = bx0; bx <= bx1; bx++) {
                const u32 cell = (u32)gpi[2] + by * (u32)gpi[0] + bx;
                const u32 end = starts[cell + 1];
                const u32 from = ex_lower_bound<LANES>(gx, starts[cell], end, x_lo, group, sub);
                // The cell's hits from x_lo to x_hi, a lane each in turn.
                for (u32 q = from + sub; q < end && gx[q] <= x_hi; q += LANES) {
                    const u32 h2 = gin[q];
                    const u32 b = own[h2];
                    if (b == EX_NONE || b == k) continue;
                    if ((fl[b] & EX_CHANGED) && b < k) continue;
                    const float dx = fabsf(hx[h2] - x), dy = fabsf(hy[h2] - y);
                    if (!(dx <= wp && dy <= wp)) continue;
                    const float d = fmaxf(dx, dy);
                    const float qq = fmaxf(qop[k], qop[b]);
                    const u32 lo_t = min(k, b), hi_t = max(k, b);
                    // Side 0: the boundary before plane p; side 1: the boundary after it,
                    // and where the gain is the kinks' evidence those up to the next
                    // plane both tracks cross (past the last plane where there is none:
                    // Exchange::find_pairs).
                    const u32* lb_ = L + (size_t)b * S;
                    const u32 nb = len[b];
                    for (u32 side = 0; side < 2; side++) {
                        if (!(d <= ex_window(xf, p, side, qq))) continue;
                        const u32 last = side == 0 ? p : evidence ? ex_next_common(la, na, lb_, nb, hp, p, S) : p + 1;
                        // At the detector's ends (boundary 0 or n_planes) an exchange
                        // changes nothing, but the pair's tracks are fitted as the CPU's.
                        for (u32 boundary = p + side; boundary <= last; boundary++) {
                            const u32 ha = side == 1 && boundary == last && last < S ? ex_on_plane(la, na, hp, last) : EX_NONE;
                            const u32 hb = ha != EX_NONE ? ex_on_plane(lb_, nb, hp, last) : EX_NONE;
                            if (hb != EX_NONE) {
                                // The same boundary from that plane, where the two tracks
                                // are close there too.
                                const float dx1 = fabsf(hx[hb] - hx[ha]);
                                const float dy1 = fabsf(hy[hb] - hy[ha]);
                                const float w1 = xfp[EXF_PER_PLANE * last + 3];
                                if (dx1 <= w1 && dy1 <= w1 && fmaxf(dx1, dy1) <= ex_window(xf, last, 0, qq))
                                    continue;
                            }
                            const u32 at = atomicAdd(&st[EX_N_PAIRS], 1u);
                            if (at < pair_cap) P[at] = ex_pair(lo_t, hi_t, boundary);
                            if (isnan(chi2[k])) atomicOr(&fl[k], EX_NEED);
                            if (isnan(chi2[b])) atomicOr(&fl[b], EX_NEED);
                        }
                    }
                }
            }
        }
    }
}

// The first round's pairs (every kept track changed): a thread per hit.
extern "C" __global__ void __launch_bounds__(EX_WIDE_THREADS) ca_exchange_pairs(EX_PARAMS) {
    ex_pairs<1>(EX_ARGS);
}

// A later round's pairs (the tracks changed in the round before): EX_SEARCH_LANES lanes
// per hit.
extern "C" __global__ void __launch_bounds__(EX_WIDE_THREADS) ca_exchange_pairs_changed(EX_PARAMS) {
    ex_pairs<EX_SEARCH_LANES>(EX_ARGS);
}

// The tracks of the round's pairs whose candidates' chi-square is not known, fitted.
extern "C" __global__ void __launch_bounds__(EX_WIDE_THREADS) ca_exchange_fit_needed(EX_PARAMS) {
    ex_fit_flagged(EX_ARGS, EX_NEED);
}

// 3. Every pair's exchange: the pre-test, the first new track (a's upstream, b's
// downstream) and the second (b's upstream, a's downstream), each fitted by one of two
// neighbouring lanes at once (the second is made whether the first passes or not: the
// round's later pairs are few, and their fits one after the other were the round's time);
// the gains kept where the first passes and leaves room for the gain and the second passes,
// as in Exchange::run.
extern "C" __global__ void __launch_bounds__(EX_WIDE_THREADS) ca_exchange_evaluate(EX_PARAMS) {
    const u32 e = blockIdx.y;
    EX_EVENT
    const u32 n_pairs = st[EX_N_PAIRS];
    if (!st[EX_ACTIVE] || n_pairs > pair_cap) return;
    // The two lanes of a pair: `half` 0 fits the first new track, 1 the second.
    const u32 half = threadIdx.x & 1u;
    const u32 lane = threadIdx.x & 31u;
    const unsigned two = 3u << (lane & ~1u);
    const u32 stride = gridDim.x * (EX_WIDE_THREADS / 2);
    // Both lanes of a pair take the same pairs, so they meet at each exchange of results.
    const u32 first = (blockIdx.x * EX_WIDE_THREADS + threadIdx.x) >> 1;
    for (u32 j = first; j < n_pairs; j += stride) {
        const u32 a = P[j] >> 19, b = (P[j] >> 6) & 0x1fffu, boundary = P[j] & 63u;
        const u32* ta = L + (size_t)a * S;
        const u32* tbl = L + (size_t)b * S;
        const u32 la = len[a], lb = len[b];
        const u32 sa = ex_split(ta, la, hp, boundary), sb = ex_split(tbl, lb, hp, boundary);
        if (sa == 0 || sb == 0 || sa == la || sb == lb) continue;
        const u32 n1 = sa + lb - sb, n2 = sb + la - sa;
        if (n1 < min_hits || n2 < min_hits) continue;
        if (sa == 1 && sb == 1 && hp[ta[0]] == hp[tbl[0]] && isfinite(chi2[a]) && isfinite(chi2[b])) {
            // The first hits swapped: the gain the fits' last updates predict.
            const double g = ex_first_hit_gain(xd, hx, hy, hp, fst + (size_t)5 * a, fst + (size_t)5 * b,
                                               ta[0], tbl[0]);
            if (!(g >= EX_FIRST_HIT_MIN)) continue;
        } else {
            const double s_now = ex_junction(xd, hx, hy, hp, ta, sa, ta + sa, la - sa) +
                                 ex_junction(xd, hx, hy, hp, tbl, sb, tbl + sb, lb - sb);
            const double s_new = s_now - ex_junction(xd, hx, hy, hp, ta, sa, tbl + sb, lb - sb) -
                                 ex_junction(xd, hx, hy, hp, tbl, sb, ta + sa, la - sa);
            if (s_new < -EX_PRE_TEST) continue;
            if (ex_measured(xd, xf, ex_pri, ex_tents, n_planes, hx, hy, hp, qop, sq, a, b, ta, sa, la,
                            tbl, sb, lb) < -EX_PRE_TEST)
                continue;
        }
        // (Every test above is the same in both lanes: both reach the exchange below.)
        const u32* up = half ? tbl : ta;
        const u32* down = half ? ta : tbl;
        const u32 s_up = half ? sb : sa, s_down = half ? sa : sb;
        const u32 l_down = half ? la : lb;
        const u32 n = half ? n2 : n1;
        u32 trial[MAX_CHAIN];
        for (u32 i = 0; i < s_up; i++) trial[i] = up[i];
        for (u32 i = s_down; i < l_down; i++) trial[s_up + i - s_down] = down[i];
        if (evidence) {
            // Exchange::evidence_gain: each lane the evidence of its own track (a, b) and
            // of its new one, summed as the CPU sums them; then both new tracks fitted
            // (Exchange::fit_weighed) where the pair gains.
            const double mass = T.pd[PD_MASS], q_max = T.pd[PD_SCATTER_Q_MAX];
            const double* prior = T.pd + PD_SCATTER_PRIOR;
            const int fit_planes = T.pi[PI_N_PLANES];
            const double e_own = scatter_evidence(ex_hits(half ? tbl : ta, hx, hy, hp),
                                                  (int)(half ? lb : la), rows64, fit_planes, mass,
                                                  q_max, prior);
            const double e_new = scatter_evidence(ex_hits(trial, hx, hy, hp), (int)n, rows64,
                                                  fit_planes, mass, q_max, prior);
            const double o_own = __shfl_xor_sync(two, e_own, 1);
            const double o_new = __shfl_xor_sync(two, e_new, 1);
            const double ea = half ? o_own : e_own, eb = half ? e_own : o_own;
            const double na = half ? o_new : e_new, nb = half ? e_new : o_new;
            const double g = ea + eb - na - nb;
            if (!(g > (double)EX_MIN_GAIN)) continue;
            KalmanResult r;
            kalman_fit_track(ex_hits(trial, hx, hy, hp), (int)n, MAX_CHAIN, T, r);
            const u32 good = ex_good(r, n, min_hits, max_chi2_ndf) ? 1u : 0u;
            const u32 good_other = __shfl_xor_sync(two, good, 1);
            if (half || !good || !good_other) continue;
            const u32 at = atomicAdd(&st[EX_N_GAINS], 1u);
            G[at] = ((unsigned long long)~fh_order32((float)g) << 32) | (unsigned long long)P[j];
            continue;
        }
        // Exchange::fit_exchanges: the retry only within RETRY_WITHIN times the pair's
        // room for the gain.
        KalmanResult r;
        kalman_fit_track_within(ex_hits(trial, hx, hy, hp), (int)n, MAX_CHAIN, T, r,
                                (chi2[a] + chi2[b] - EX_MIN_GAIN) * EX_RETRY_WITHIN);
        const u32 good = ex_good(r, n, min_hits, max_chi2_ndf) ? 1u : 0u;
        const float c_other = __shfl_xor_sync(two, r.chi2, 1);
        const u32 good_other = __shfl_xor_sync(two, good, 1);
        if (half) continue;
        const float before = chi2[a] + chi2[b];
        if (!(good && before - r.chi2 > EX_MIN_GAIN)) continue;
        if (!good_other) continue;
        const float gain = before - (float)((double)r.chi2 + (double)c_other);
        if (!(gain > EX_MIN_GAIN)) continue;
        const u32 at = atomicAdd(&st[EX_N_GAINS], 1u);
        // Best gain first (f32::total_cmp's order, reversed), then the pair.
        G[at] = ((unsigned long long)~fh_order32(gain) << 32) | (unsigned long long)P[j];
    }
}

// The gains sorted and taken in order, each track once; the exchanges applied to the
// working lists (a gets b's upstream segment, b a's); the round's flags and counts.
extern "C" __global__ void __launch_bounds__(EX_THREADS) ca_exchange_choose(EX_PARAMS) {
    __shared__ u32 s_taken[EX_TRACK_WORDS];
    __shared__ u32 s_n_made;
    const u32 e = blockIdx.y;
    const u32 tid = threadIdx.x;
    EX_EVENT
    if (!st[EX_ACTIVE]) return;
    const u32 n_pairs = st[EX_N_PAIRS], n_gains = st[EX_N_GAINS];
    __syncthreads();
    if (n_pairs > pair_cap || n_gains == 0) {
        if (tid == 0) {
            if (n_pairs > pair_cap) ex_failed[e] = EX_FAIL_PAIRS;
            st[EX_ACTIVE] = 0;
        }
        return;
    }
    {
        u32 n_ps = 1;
        while (n_ps < n_gains) n_ps <<= 1;
        for (u32 q = n_gains + tid; q < n_ps; q += EX_THREADS) G[q] = ~0ull;
        __syncthreads();
        if (n_gains > 1) {
            fh_bitonic(n_ps, [&](u32 i, u32 ixj, bool up) {
                const unsigned long long x = G[i], y = G[ixj];
                if ((x > y) == up) {
                    G[i] = y;
                    G[ixj] = x;
                }
            });
        }
    }
    if (tid == 0) {
        for (u32 w = 0; w < EX_TRACK_WORDS; w++) s_taken[w] = 0;
        u32 made = 0;
        for (u32 i = 0; i < n_gains; i++) {
            const u32 pr = (u32)G[i];
            const u32 a = pr >> 19, b = (pr >> 6) & 0x1fffu;
            if (ex_bit(s_taken, a) || ex_bit(s_taken, b)) continue;
            s_taken[a >> 5] |= 1u << (a & 31);
            s_taken[b >> 5] |= 1u << (b & 31);
            P[made++] = pr;
        }
        s_n_made = made;
    }
    __syncthreads();
    const u32 made = s_n_made;
    for (u32 k = tid; k < nt; k += EX_THREADS) {
        const u32 f = fl[k] & ~(EX_CHANGED | EX_NEED);
        fl[k] = ex_bit(s_taken, k) ? (f | EX_CHANGED | EX_EXCHANGED) : f;
    }
    for (u32 j = tid; j < made; j += EX_THREADS) {
        const u32 a = P[j] >> 19, b = (P[j] >> 6) & 0x1fffu, boundary = P[j] & 63u;
        u32* ta = L + (size_t)a * S;
        u32* tbl = L + (size_t)b * S;
        const u32 la = len[a], lb = len[b];
        const u32 sa = ex_split(ta, la, hp, boundary), sb = ex_split(tbl, lb, hp, boundary);
        u32 na[MAX_CHAIN], nb[MAX_CHAIN];
        u32 ka = 0, kb = 0;
        for (u32 i = 0; i < sb; i++) na[ka++] = tbl[i];
        for (u32 i = sa; i < la; i++) na[ka++] = ta[i];
        for (u32 i = 0; i < sa; i++) nb[kb++] = ta[i];
        for (u32 i = sb; i < lb; i++) nb[kb++] = tbl[i];
        for (u32 i = 0; i < ka; i++) {
            ta[i] = na[i];
            own[na[i]] = a;
        }
        for (u32 i = 0; i < kb; i++) {
            tbl[i] = nb[i];
            own[nb[i]] = b;
        }
        len[a] = ka;
        len[b] = kb;
        chi2[a] = EX_NAN;
        chi2[b] = EX_NAN;
    }
    __syncthreads();
    if (tid == 0) {
        st[EX_N_PAIRS] = 0;
        st[EX_N_GAINS] = 0;
        st[EX_N_MADE] += made;
        // The events that go on to the next round, for the host.
        atomicAdd(n_active, 1u);
    }
}

// 4. The exchanged tracks' final fits, then the event's tracks packed again in order.
extern "C" __global__ void __launch_bounds__(EX_THREADS) ca_exchange_end(EX_PARAMS) {
    const u32 e = blockIdx.y;
    const u32 tid = threadIdx.x;
    EX_EVENT
    if (failed[e] || ex_failed[e] || nt < 2 || st[EX_N_MADE] == 0) return;
    const KalmanTables TT = {rows32, rows64, gap_steps, gap_kind, gap_slice, slices,
                             track_fit ? tpf : pf, track_fit ? tpd : pd,
                             track_fit ? tpi : pi, nodes};
    for (u32 k = tid; k < nt; k += EX_THREADS) {
        if (!(fl[k] & EX_EXCHANGED)) continue;
        KalmanResult r;
        ex_fit(L + (size_t)k * S, len[k], hx, hy, hp, TT, r);
        store_fit(r, out_fits + (size_t)(tb + k) * FIT_WORDS);
    }
    u32 carry = trk_hit_base[e];
    for (u32 c0 = 0; c0 < nt; c0 += EX_THREADS) {
        const u32 k = c0 + tid;
        const u32 n = k < nt ? len[k] : 0u;
        u32 chunk;
        const u32 at = carry + ex_scan(n, &chunk) - n;
        if (k < nt) {
            out_tracks[tb + k] = make_uint2(at, n);
            for (u32 i = 0; i < n; i++) out_hits[at + i] = L[(size_t)k * S + i];
        }
        carry += chunk;
        __syncthreads();
    }
}
