// Triplets (src/tracking/ca/triplets.rs, the full search: every doublet a left doublet):
// per left doublet (a, b) the continuation windows of window_lanes (pointing parabola,
// tent-weighted mean fields of bending.rs, scattering at the largest |q/p| the doublet
// allows), every outgoing doublet (b, c) of the middle hit tested against the window of
// its plane triple, and the pairs inside tested by kink_lanes' chi-square and momentum
// cut. Same f32 operations in the same order as the CPU's lanes. Triplets come out
// ordered by left doublet, then right doublet, as the CPU's.
//
// Run twice: write = 0 counts per left doublet, write = 1 writes at the event's base plus
// the doublet's scanned offset (and the triplet's first and last planes, for the
// evolution and the dead ends, and clears its has_right flag). The count pass clears the
// neighbour step's per-doublet counters. Both are bounded to ITEM_MIN_BLOCKS blocks per
// multiprocessor, and the host launches one wave of them.

// a[q] for a run-time q of a small array kept in registers (indexing it directly would
// move it to local memory).
#define PICK3(a, q) ((q) == 0 ? (a)[0] : ((q) == 1 ? (a)[1] : (a)[2]))

__device__ __forceinline__ float slope_factor2(float tx, float ty) {
    float t = fmaxf(fabsf(tx), fabsf(ty));
    float n2 = 1.0f + tx * tx + ty * ty;
    return (1.0f + t * t) * n2 * sqrtf(n2);
}

__device__ __forceinline__ void bending(float tx, float ty, const float* b, float* ax, float* ay) {
    *ax = tx * ty * b[0] - (1.0f + tx * tx) * b[1] + ty * b[2];
    *ay = (1.0f + ty * ty) * b[0] - tx * ty * b[1] - tx * b[2];
}

// TentTable::at.
__device__ __forceinline__ void tent_at(const float* __restrict__ tab, float tx, float ty, float* out) {
    float top = (float)(NODES - 1) - 1e-3f;
    float u = fminf(fmaxf((tx - tab[0]) * tab[2], 0.0f), top);
    float v = fminf(fmaxf((ty - tab[1]) * tab[3], 0.0f), top);
    int iu = (int)u, iv = (int)v;
    float fu = u - (float)iu, fv = v - (float)iv;
    const float* b = tab + 4;
    const float* b00 = b + (iu * NODES + iv) * 3;
    const float* b01 = b + (iu * NODES + iv + 1) * 3;
    const float* b10 = b + ((iu + 1) * NODES + iv) * 3;
    const float* b11 = b + ((iu + 1) * NODES + iv + 1) * 3;
#pragma unroll
    for (int c = 0; c < 3; c++) {
        float lo = b00[c] + fv * (b01[c] - b00[c]);
        float hi = b10[c] + fv * (b11[c] - b10[c]);
        out[c] = lo + fu * (hi - lo);
    }
}

extern "C" __global__ void __launch_bounds__(CA_THREADS, ITEM_MIN_BLOCKS)
    ca_triplets(const float* __restrict__ sx, const float* __restrict__ sy,
                                       const u32* __restrict__ splane,
                                       const u32* __restrict__ hit_start,
                                       const u32* __restrict__ dbl_count, const u32* __restrict__ dbl_off,
                                       const u32* __restrict__ dbl_base, const u32* __restrict__ dbl_n,
                                       const uint4* __restrict__ dbl,
                                       const u32* __restrict__ dgap,
                                       const float* __restrict__ plf, const float* __restrict__ prf,
                                       const int* __restrict__ pri, const float* __restrict__ tents,
                                       const float* __restrict__ g, int n_planes, int reach,
                                       const u32* __restrict__ failed, int write,
                                       u32* __restrict__ trip_count, const u32* __restrict__ trip_off,
                                       const u32* __restrict__ trip_base,
                                       u32* __restrict__ tleft, u32* __restrict__ tright,
                                       float* __restrict__ tqop, float* __restrict__ tsigma,
                                       float* __restrict__ tchi2, u32* __restrict__ tplane,
                                       u32* __restrict__ has_right, u32* __restrict__ end_count,
                                       u32* __restrict__ end_cursor) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], dbase = dbl_base[e], n_d = dbl_n[e];
    u32 tbase = write ? trip_base[e] : 0;
    const float ns = g[G_N_SIGMA], qmax = g[G_QOP_MAX], mass2 = g[G_MASS2];
    const float sf2_max = g[G_SF2_MAX], K = g[G_K];
    const float ms_qmax = qmax * qmax * (1.0f + mass2 * qmax * qmax);
    // The triplets of left doublet d (the event's index).
    auto triplets_of = [&](u32 d) {
        u32 D = dbase + d;
        // The neighbour step's counters of this doublet, cleared here (coalesced).
        if (!write) {
            end_count[D] = 0;
            end_cursor[D] = 0;
        }
        // Most doublets make no triplet: the write pass skips them (the count is known).
        if (write && trip_count[D] == 0) return;
        uint4 left_dbl = dbl[D];
        u32 a = left_dbl.x, b = left_dbl.y;
        // A middle hit without outgoing doublets (on the last plane, say): no window to make.
        if (dbl_count[s + b] == 0) {
            if (!write) trip_count[D] = 0;
            return;
        }
        int pa = (int)splane[s + a], pb = (int)splane[s + b];
        int pair = pa * n_planes + pb;
        const float* pr = prf + pair * PRF;
        float xa = sx[s + a], ya = sy[s + a];
        float xb = sx[s + b], yb = sy[s + b];
        float tx = __uint_as_float(left_dbl.z), ty = __uint_as_float(left_dbl.w);
        // Fields: uniform, or the tent tables at the line from the origin through b.
        float bd[3], bg[MAX_REACH][3];
        if (g[G_UNIFORM] != 0.0f) {
#pragma unroll
            for (int c = 0; c < 3; c++) {
                bd[c] = g[G_UB + c];
#pragma unroll
                for (int q = 0; q < MAX_REACH; q++) bg[q][c] = g[G_UB + c];
            }
        } else {
            float inv = plf[pb * PLF + PLF_INV_LEVER];
            float ltx = (xb - g[G_ORIGIN_X]) * inv, lty = (yb - g[G_ORIGIN_Y]) * inv;
            int ti = pri[pair * PRI];
            if (ti >= 0) tent_at(tents + (size_t)ti * TENT_FLOATS, ltx, lty, bd);
            else bd[0] = bd[1] = bd[2] = 0.0f;
#pragma unroll
            for (int q = 0; q < MAX_REACH; q++) {
                int tq = q < reach ? pri[pair * PRI + 1 + q] : -1;
                if (tq >= 0) tent_at(tents + (size_t)tq * TENT_FLOATS, ltx, lty, bg[q]);
                else bg[q][0] = bg[q][1] = bg[q][2] = 0.0f;
            }
        }
        // window_lanes.
        float pointing = pr[PRF_POINTING], inv_zi = pr[PRF_INV_ZI], two_inv_zj = pr[PRF_TWO_INV_ZJ];
        float kvar_ms_per_qop2 = pr[PRF_KVAR_MS], kvar_res = pr[PRF_KVAR_RES];
        int n_triples = (int)pr[PRF_N_TRIPLES];
        int n_win = n_triples < reach ? n_triples : reach;
        float ra = xa - g[G_ORIGIN_X], rya = ya - g[G_ORIGIN_Y];
        float kappa_x = pointing * (tx - ra * inv_zi) * two_inv_zj;
        float kappa_y = pointing * (ty - rya * inv_zi) * two_inv_zj;
        float hard_slope = pr[PRF_HARD_SLOPE], kappa_rel = pr[PRF_KAPPA_REL];
        float hard_kx = pr[PRF_HARD_KX] + hard_slope * fabsf(ra * inv_zi) + kappa_rel * fabsf(kappa_x);
        float hard_ky = pr[PRF_HARD_KY] + hard_slope * fabsf(rya * inv_zi) + kappa_rel * fabsf(kappa_y);
        float sf2 = fminf(slope_factor2(tx, ty), sf2_max);
        float kvar_ms = kvar_ms_per_qop2 * sf2;
        // The pointing tent's bending at its mean slope (the mean of the chords origin-a
        // and a-b).
        float tpx = tx + pointing * 0.5f * (ra * inv_zi - tx);
        float tpy = ty + pointing * 0.5f * (rya * inv_zi - ty);
        float n1 = sqrtf(1.0f + tpx * tpx + tpy * tpy);
        float ax, ay;
        bending(tpx, tpy, bd, &ax, &ay);
        float k = K * n1;
        float cx = k * ax, cy = k * ay;
        float c2 = cx * cx + cy * cy;
        bool use_ptg = g[G_FIT_MOMENTUM] * pointing > 0.0f;
        float inv_c2 = 1.0f / (use_ptg ? fmaxf(c2, 1e-30f) : 1.0f);
        float q_ptg = (kappa_x * cx + kappa_y * cy) * inv_c2;
        float hard = (hard_kx * fabsf(cx) + hard_ky * fabsf(cy)) * inv_c2;
        float sigma = sqrtf((kvar_ms * qmax * qmax + kvar_res) * inv_c2);
        float q_ptg_hi = fminf(fabsf(q_ptg) + hard + ns * sigma, qmax);
        float q_hi = use_ptg ? q_ptg_hi : qmax;
        float q_c = 0.0f, dq = 0.0f;
        if (use_ptg) {
            float dd = hard + ns * sigma;
            float q_lo = fmaxf(q_ptg - dd, -qmax), q_up = fminf(q_ptg + dd, qmax);
            if (q_lo <= q_up) {
                q_c = 0.5f * (q_lo + q_up);
                dq = 0.5f * (q_up - q_lo);
            } else {
                q_c = fminf(fmaxf(q_ptg, -qmax), qmax);
            }
        }
        float ms2 = q_hi * q_hi * (1.0f + mass2 * q_hi * q_hi) * sf2;
        float kvar = kvar_ms * q_hi * q_hi + kvar_res;
        float lo = CA_INF, hi = -CA_INF;
        float pred_x[MAX_REACH], pred_y[MAX_REACH], wx[MAX_REACH], wy[MAX_REACH];
#pragma unroll
        for (int q = 0; q < MAX_REACH; q++) {
            pred_x[q] = 0.0f;
            pred_y[q] = 0.0f;
            wx[q] = -1.0f;
            wy[q] = 0.0f;
            if (q >= reach) continue;
            float h = pr[PRF_HALF + q];
            float var = kvar * h * h + pr[PRF_TH2 + q] * ms2 + pr[PRF_VAR + q];
            float gauss = ns * sqrtf(var);
            // The triplet tent's at its mean slope (the chord a-b plus half the predicted
            // change).
            float ttx = tx + 0.5f * kappa_x * h, tty = ty + 0.5f * kappa_y * h;
            float kt = K * sqrtf(1.0f + ttx * ttx + tty * tty);
            float gx, gy;
            bending(ttx, tty, bg[q], &gx, &gy);
            float dcx = (kt * gx - cx) * h, dcy = (kt * gy - cy) * h;
            pred_x[q] = tx + kappa_x * h + q_c * dcx;
            pred_y[q] = ty + kappa_y * h + q_c * dcy;
            bool open = q < n_win;
            wx[q] = open ? hard_kx * h + gauss + dq * fabsf(dcx) : -1.0f;
            wy[q] = hard_ky * h + gauss + dq * fabsf(dcy);
            if (open) {
                lo = fminf(lo, pred_x[q] - wx[q]);
                hi = fmaxf(hi, pred_x[q] + wx[q]);
            }
        }
        u32 found = 0;
        u32 out = write ? tbase + trip_off[D] : 0;
        if (lo <= hi) {
            u32 r0 = dbl_off[s + b], r1 = r0 + dbl_count[s + b];
            // Each right doublet's gap and record are read together, and the next one's
            // while this one is tested: the loop waits on one load's latency at a time
            // at most, not two in turn per right doublet. (The middle hit has at least one:
            // its count was tested above.)
            u32 next_q = dgap[dbase + r0];
            uint4 next_dbl = dbl[dbase + r0];
            for (u32 r = r0; r < r1; r++) {
                u32 q = next_q;
                uint4 right_dbl = next_dbl;
                if (r + 1 < r1) {
                    next_q = dgap[dbase + r + 1];
                    next_dbl = dbl[dbase + r + 1];
                }
                if (q >= MAX_REACH) continue;
                float t2x = __uint_as_float(right_dbl.z), t2y = __uint_as_float(right_dbl.w);
                if (!(fabsf(t2x - PICK3(pred_x, q)) <= PICK3(wx, q) &&
                      fabsf(t2y - PICK3(pred_y, q)) <= PICK3(wy, q)))
                    continue;
                // kink_lanes.
                float half = pr[PRF_HALF + q], th2 = pr[PRF_TH2 + q], var_res = pr[PRF_VAR + q];
                float dx = t2x - tx, dy = t2y - ty;
                float tmx = 0.5f * (tx + t2x), tmy = 0.5f * (ty + t2y);
                float n2 = 1.0f + tmx * tmx + tmy * tmy;
                float bq[3];
#pragma unroll
                for (int c = 0; c < 3; c++) bq[c] = q == 0 ? bg[0][c] : (q == 1 ? bg[1][c] : bg[2][c]);
                float bx, by;
                bending(tmx, tmy, bq, &bx, &by);
                float gk = K * sqrtf(n2) * half;
                float gx = gk * bx, gy = gk * by;
                float g2 = gx * gx + gy * gy;
                bool measure = g[G_FIT_MOMENTUM] > 0.0f && g2 > 0.0f;
                float inv_g2 = 1.0f / (measure ? g2 : 1.0f);
                float qop = measure ? (dx * gx + dy * gy) * inv_g2 : 0.0f;
                float rx = dx - gx * qop, ry = dy - gy * qop;
                float r2 = rx * rx + ry * ry;
                float th = th2 * fminf(slope_factor2(tmx, tmy), sf2_max);
                float var_max = th * ms_qmax + var_res;
                float sigma_max = sqrtf(var_max * inv_g2);
                float qq = fminf(fabsf(qop) + ns * sigma_max, q_hi);
                float v_q = th * qq * qq * (1.0f + mass2 * qq * qq) + var_res;
                float v = measure ? v_q : var_max;
                bool in_momentum = !measure || !(fabsf(qop) > qmax + ns * sigma_max);
                bool pass = in_momentum && !(r2 > g[G_CHI2_MAX] * v);
                if (!pass) continue;
                if (write) {
                    u32 t = out + found;
                    tleft[t] = d;
                    tright[t] = r;
                    tqop[t] = qop;
                    tsigma[t] = measure ? sqrtf(v * inv_g2) : 0.0f;
                    tchi2[t] = r2 / v;
                    // The right doublet's second hit is q planes beyond the one after b.
                    tplane[t] = TPLANE((u32)pa, (u32)pb + 1u + q);
                    has_right[t] = 0;
                }
                found++;
            }
        }
        if (!write) trip_count[D] = found;
    };
    if (!write) {
        for (u32 d = CA_FIRST; d < n_d; d += CA_STRIDE) triplets_of(d);
        return;
    }
    // The write pass: most doublets make no triplet (their count is 0), and a lane per
    // doublet would leave most of each warp idle while the others test their pairs, so
    // those with triplets go through the warp's queue (warp_enqueue); which lane writes a
    // doublet's triplets does not change them or their places.
    warp_queue_each(
        n_d, [&](u32 d, u32*) { return trip_count[dbase + d] != 0; }, triplets_of);
}
