// Kalman fit of track candidates on the GPU: the device side of src/gpu/tracking_fit.rs.
//
// One thread per candidate, over a batch of candidates from many events. It mirrors the
// CPU fitter (src/tracking/kalman.rs, src/tracking/propagate.rs) operation by operation,
// in the same number types: single precision for the state, the covariance, the steps
// and the field map's slices, double precision where the CPU computes in double (the
// field between the last two hits where a plane between them is missing, the scattering
// in planes skipped between the two seeding hits). The module is
// compiled with --fmad=false so that no product and sum are contracted into one rounding
// the CPU does not make: the fits then agree with the CPU's to the last bits.
//
// The fit: seed from the last two hits (position, chord slopes corrected by the bending
// between them) and a three-hit q/p with a wide prior; then plane by plane upstream, one
// Runge-Kutta step (several where the field map asks for them) with the derivatives of
// the stage slopes only, the covariance transport with the block structure of the
// Jacobian, the 2D update of x and y, and the multiple-scattering noise of the plane
// crossed (Highland, Pade logarithms). The state is reported at the most upstream hit.
//
// Layout (structure of arrays, `stride` = candidates of the batch rounded up):
//   hits:  [n_hits: stride][x: kmax * stride][y: kmax * stride][plane: kmax * stride]
//          as 32-bit words, hit k of candidate c at k * stride + c of its region;
//   out:   [OUT_WORDS][stride] words: x, y, tx, ty, qop, covariance (15, lower triangle
//          row by row), z, chi2 (floats), ndf, ok (integers).
// Per plane p: rows32/rows64 [z, var_x, var_y, x0, ln_x0, seed_db]; gap_steps[p] and
// gap_kind[p]
// for the step over the gap from plane p + 1 to p; in a field map, gap_slice[p], the first
// of the map's slices (FieldSlices in src/tracking/field.rs: the map's (x, y) nodes at the
// z of the stages, [slice][nx][ny][3]) that the steps over that gap read: step i reads
// slices gap_slice[p] + 2 i + {0, 1, 1, 2} at its four stages.

// Indices of the parameter arrays (PARAM_* in src/gpu/tracking_fit.rs).
#define PI_N_PLANES 0
#define PI_FIT_MOMENTUM 1
#define PI_NX 2
#define PI_NY 3
#define PI_NZ 4
#define PI_FIELD_MAP 5
#define PI_SCATTER_QOP 6
#define PI_SCATTER_QOP_ERROR 7
#define PI_SCATTER_FLOOR 8
#define PI_SCATTER_AT_PREFIT 9
#define PF_QOP_FIXED 0
#define PF_QOP_FIXED_VAR 1
#define PF_PRIOR_REL 2
#define PF_PRIOR_FLOOR 3
#define PF_MASS2 4
#define PF_B 5
#define PF_ORIGIN 8
#define PF_INV_STEP 11
#define PF_SCATTER_QOP_MAX 14
#define PD_MASS 0
#define PD_ORIGIN 1
#define PD_INV_STEP 4
#define PD_SCATTER_Q_MIN 7
#define PD_SCATTER_Q_MAX 8
// SCATTER_GRID weights of scattering_qop's prior (FitConfig::scatter_weights).
#define PD_SCATTER_PRIOR 9

// How the step over a gap reads the field (GapField in propagate.rs).
#define GAP_BY_ONLY 0
#define GAP_UNIFORM 1
#define GAP_MAP 2
#define GAP_PROFILE 3

#define OUT_WORDS 24
#define ROW 6

// K_GEV_PER_T_MM and the Highland constant, as the CPU rounds them.
#define K_F ((float)0.299792458e-3)
#define HALF_K_F ((float)(0.5 * 0.299792458e-3))
#define HIGHLAND_D 0.0136
#define HIGHLAND2_F ((float)(0.0136 * 0.0136))

struct Grid {
    const float* nodes;  // [nx][ny][nz][3], tesla
    int n[3];
    float o32[3], is32[3];
    double o64[3], is64[3];
};

// FieldSlices::at_f32: slice k at (x, y), bilinear in single precision (the map's (x, y)
// grid, clamped as at_f32), along y first, then along x.
__device__ __forceinline__ void at_slice(const Grid& g, const float* slices, int k, float px,
                                         float py, float b[3]) {
    const float pos[2] = {px, py};
    int cell[2];
    float frac[2];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
        float u = (pos[a] - g.o32[a]) * g.is32[a];
        u = fminf(fmaxf(u, 0.0f), (float)(g.n[a] - 1));
        int i = min((int)u, g.n[a] - 2);
        cell[a] = i;
        frac[a] = u - (float)i;
    }
    const int ny = g.n[1];
    const float* c = slices + 3 * ((k * g.n[0] + cell[0]) * ny + cell[1]);
    const float fx = frac[0], fy = frac[1];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        const float a0 = c[j], a1 = c[3 + j];
        const float d0 = c[3 * ny + j], d1 = c[3 * (ny + 1) + j];
        const float v0 = a0 + fy * (a1 - a0);
        const float v1 = d0 + fy * (d1 - d0);
        b[j] = v0 + fx * (v1 - v0);
    }
}

// FieldMap::at: the same interpolation in double precision (seeding).
__device__ void at_f64(const Grid& g, double px, double py, double pz, double b[3]) {
    const double pos[3] = {px, py, pz};
    int cell[3];
    double frac[3];
    for (int a = 0; a < 3; ++a) {
        const int n = g.n[a];
        double u = (pos[a] - g.o64[a]) * g.is64[a];
        if (isnan(u)) {
            u = 0.0;
        } else {
            u = u < 0.0 ? 0.0 : (u > (double)(n - 1) ? (double)(n - 1) : u);
        }
        // u is in [0, n - 1]: truncation is the floor.
        int i = min((int)u, n - 2);
        cell[a] = i;
        frac[a] = u - (double)i;
    }
    b[0] = 0.0;
    b[1] = 0.0;
    b[2] = 0.0;
    for (int dx = 0; dx < 2; ++dx) {
        const double wx = dx ? frac[0] : 1.0 - frac[0];
        for (int dy = 0; dy < 2; ++dy) {
            const double wy = dy ? frac[1] : 1.0 - frac[1];
            for (int dz = 0; dz < 2; ++dz) {
                const double wz = dz ? frac[2] : 1.0 - frac[2];
                const double w = wx * wy * wz;
                const int idx = ((cell[0] + dx) * g.n[1] + cell[1] + dy) * g.n[2] + cell[2] + dz;
                const float* v = g.nodes + 3 * idx;
                b[0] += w * (double)v[0];
                b[1] += w * (double)v[1];
                b[2] += w * (double)v[2];
            }
        }
    }
}

// Where a Runge-Kutta step reads the field (Source in propagate.rs).
struct Source {
    int kind;  // GAP_*; GAP_BY_ONLY and GAP_UNIFORM read `b`
    float b[3];
    float z0, inv_dz;
    float c[3][3];
    const float* slices;  // GAP_MAP: the map's slices, the step's first at `k`
    int k;
};

// The field at stage point (x, y, z); `off` the stage's slice after the step's first (0,
// 1, 1, 2 for stages 1 to 4).
__device__ __forceinline__ void field_at(const Source& s, const Grid& g, float x, float y, float z,
                                         int off, float b[3]) {
    if (s.kind == GAP_PROFILE) {
        const float u = (z - s.z0) * s.inv_dz;
#pragma unroll
        for (int k = 0; k < 3; ++k) b[k] = s.c[0][k] + u * (s.c[1][k] + u * s.c[2][k]);
    } else if (s.kind == GAP_MAP) {
        at_slice(g, s.slices, s.k + off, x, y, b);
    } else {
        b[0] = s.b[0];
        b[1] = s.b[1];
        b[2] = s.b[2];
    }
}

// Slope derivatives of one stage and their derivatives (stage_packs + stage_result).
struct Stage {
    float p[2];
    float dpx[3], dpy[3];
};

__device__ __forceinline__ void stage(bool by_only, float tx, float ty, float qop, const float b[3],
                                      const float* dtx, const float* dty, Stage& s) {
    const float one = 1.0f, two = 2.0f;
    const float bx = b[0], by = b[1], bz = b[2];
    const float txy = tx * ty;
    const float tx2 = tx * tx;
    const float ty2 = ty * ty;
    const float n2 = one + tx2 + ty2;
    const float n = sqrtf(n2);
    float gx, gy, gx_tx, gx_ty, gy_tx, gy_ty;
    if (by_only) {
        const float kb = K_F * -by;
        const float qkb = qop * kb;
        const float a = one + tx2;
        const float inv_n = n * (one / n2);
        const float qa = qkb * a, qb = qkb * txy;
        const float t = qa * inv_n, u = qb * inv_n, w = qkb * n;
        s.p[0] = qa * n;
        s.p[1] = qb * n;
        gx = (kb * a) * n;
        gy = (kb * txy) * n;
        gx_tx = tx * (t + two * w);
        gx_ty = ty * t;
        gy_tx = tx * u + ty * w;
        gy_ty = ty * u + tx * w;
    } else {
        const float kn = K_F * n;
        const float qkn = qop * kn;
        const float qk_n = qkn / n2;
        const float ax = txy * bx - (one + tx2) * by + ty * bz;
        const float ay = (one + ty2) * bx - txy * by - tx * bz;
        gx = kn * ax;
        gy = kn * ay;
        gx_tx = qk_n * tx * ax + qkn * (ty * bx - two * tx * by);
        gx_ty = qk_n * ty * ax + qkn * (tx * bx + bz);
        gy_tx = qk_n * tx * ay - qkn * (ty * by + bz);
        gy_ty = qk_n * ty * ay + qkn * (two * ty * bx - tx * by);
        s.p[0] = qop * gx;
        s.p[1] = qop * gy;
    }
    if (dtx == nullptr) {
        s.dpx[0] = gx_tx;
        s.dpx[1] = gx_ty;
        s.dpx[2] = gx;
        s.dpy[0] = gy_tx;
        s.dpy[1] = gy_ty;
        s.dpy[2] = gy;
    } else {
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            s.dpx[c] = gx_tx * dtx[c] + gx_ty * dty[c];
            s.dpy[c] = gy_tx * dtx[c] + gy_ty * dty[c];
        }
        s.dpx[2] += gx;
        s.dpy[2] += gy;
    }
}

// Slopes of the next stage and their derivatives (next_stage).
__device__ __forceinline__ void next_stage(float tx, float ty, float a, const Stage& s, float& ntx,
                                           float& nty, float dtx[3], float dty[3]) {
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        dtx[c] = a * s.dpx[c];
        dty[c] = a * s.dpy[c];
    }
    dtx[0] += 1.0f;
    dty[1] += 1.0f;
    ntx = tx + a * s.p[0];
    nty = ty + a * s.p[1];
}

// One RK4 step of length h (rk4_step_packs, in its Runge-Kutta-Nystrom form); writes the
// step's Jacobian. The field is read at the start (unless `have_b`: then `b` holds the last
// step's end field), once for stages 2 and 3 (the middle of the step reached with the first
// stage's bending) and at the end, which is left in `b` for the next step.
__device__ __forceinline__ void rk4_step(const Source& src, const Grid& g, float& z, float& x,
                                         float& y, float& tx, float& ty, float qop, float h,
                                         float jac[4][3], float b[3], bool have_b) {
    const bool by_only = src.kind == GAP_BY_ONLY;
    const float hh = h * 0.5f;
    Stage s1, s2, s3, s4;
    float tx2, ty2, tx3, ty3, tx4, ty4;
    float dtx2[3], dty2[3], dtx3[3], dty3[3], dtx4[3], dty4[3];
    if (!have_b) field_at(src, g, x, y, z, 0, b);
    stage(by_only, tx, ty, qop, b, nullptr, nullptr, s1);
    next_stage(tx, ty, hh, s1, tx2, ty2, dtx2, dty2);
    float sp[2] = {s1.p[0], s1.p[1]};
    float sdx[3] = {s1.dpx[0], s1.dpx[1], s1.dpx[2]};
    float sdy[3] = {s1.dpy[0], s1.dpy[1], s1.dpy[2]};
    const float h8 = hh * hh * 0.5f;
    field_at(src, g, x + hh * tx + h8 * s1.p[0], y + hh * ty + h8 * s1.p[1], z + hh, 1, b);
    stage(by_only, tx2, ty2, qop, b, dtx2, dty2, s2);
    next_stage(tx, ty, hh, s2, tx3, ty3, dtx3, dty3);
    float mp[2] = {s2.p[0], s2.p[1]};
    float mdx[3] = {s2.dpx[0], s2.dpx[1], s2.dpx[2]};
    float mdy[3] = {s2.dpy[0], s2.dpy[1], s2.dpy[2]};
    sp[0] += s2.p[0];
    sp[1] += s2.p[1];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        sdx[c] += s2.dpx[c];
        sdy[c] += s2.dpy[c];
    }
    stage(by_only, tx3, ty3, qop, b, dtx3, dty3, s3);
    next_stage(tx, ty, h, s3, tx4, ty4, dtx4, dty4);
    sp[0] += s3.p[0];
    sp[1] += s3.p[1];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        sdx[c] += s3.dpx[c];
        sdy[c] += s3.dpy[c];
    }
    mp[0] += s3.p[0];
    mp[1] += s3.p[1];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        mdx[c] += s3.dpx[c];
        mdy[c] += s3.dpy[c];
    }
    const float h2 = h * hh;
    field_at(src, g, x + h * tx + h2 * s3.p[0], y + h * ty + h2 * s3.p[1], z + h, 2, b);
    stage(by_only, tx4, ty4, qop, b, dtx4, dty4, s4);

    const float h6 = h * (float)(1.0 / 6.0);
    const float hh6 = h * h6;
    x += h * tx + hh6 * sp[0];
    y += h * ty + hh6 * sp[1];
    tx += h6 * (sp[0] + mp[0] + s4.p[0]);
    ty += h6 * (sp[1] + mp[1] + s4.p[1]);
    z += h;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        jac[0][c] = hh6 * sdx[c];
        jac[1][c] = hh6 * sdy[c];
        jac[2][c] = h6 * (sdx[c] + mdx[c] + s4.dpx[c]);
        jac[3][c] = h6 * (sdy[c] + mdy[c] + s4.dpy[c]);
    }
    jac[0][0] += h;
    jac[1][1] += h;
    jac[2][0] += 1.0f;
    jac[3][1] += 1.0f;
}

// Propagates to z_to in n_steps equal steps (propagate_gap_in), composing the Jacobian.
// In a field map the steps read the slices from `first` on.
__device__ void propagate_gap(int kind, const float bu[3], const Grid& g, const float* slices,
                              int first, float& z, float& x, float& y, float& tx, float& ty,
                              float qop, float z_to, int n_steps, float jac[4][3]) {
    Source src;
    src.kind = kind;
    src.b[0] = bu[0];
    src.b[1] = bu[1];
    src.b[2] = bu[2];
    src.z0 = 0.0f;
    src.inv_dz = 0.0f;
    src.slices = slices;
    src.k = first;
    if (kind == GAP_PROFILE) {
        // The straight line over the gap: ends and middle (slices first, first + 1,
        // first + 2).
        const float dz = z_to - z;
        const float half = 0.5f;
        float b0[3], bm[3], b1[3];
        at_slice(g, slices, first, x, y, b0);
        at_slice(g, slices, first + 1, x + half * dz * tx, y + half * dz * ty, bm);
        at_slice(g, slices, first + 2, x + dz * tx, y + dz * ty, b1);
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            src.c[0][k] = b0[k];
            src.c[1][k] = 4.0f * bm[k] - 3.0f * b0[k] - b1[k];
            src.c[2][k] = 2.0f * (b0[k] + b1[k]) - 4.0f * bm[k];
        }
        // A track that does not move reads the field at its start.
        src.inv_dz = dz != 0.0f ? 1.0f / dz : 0.0f;
        src.z0 = z;
    }
    const int n = n_steps > 1 ? n_steps : 1;
    const float h = (z_to - z) * (float)(1.0 / (double)n);
    float b[3];
    rk4_step(src, g, z, x, y, tx, ty, qop, h, jac, b, false);
    for (int s = 1; s < n; ++s) {
        float step[4][3];
        src.k = first + 2 * s;
        rk4_step(src, g, z, x, y, tx, ty, qop, h, step, b, true);
        float prev[4][3];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 3; ++c) prev[r][c] = jac[r][c];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                float v = step[r][0] * prev[2][c] + step[r][1] * prev[3][c];
                if (r < 2) v += prev[r][c];
                if (c == 2) v += step[r][2];
                jac[r][c] = v;
            }
        }
    }
    // Land exactly on the target plane despite rounding.
    z = z_to;
}

__device__ __forceinline__ int tri(int i, int j) { return j <= i ? i * (i + 1) / 2 + j : j * (j + 1) / 2 + i; }

// C <- J C J^T with the block-structured Jacobian (transport_cov).
__device__ __forceinline__ void transport_cov(float c[15], const float jac[4][3]) {
    float e[15];
#pragma unroll
    for (int i = 0; i < 15; ++i) e[i] = c[i];
#define E(i, k) e[tri(i, k)]
#define DOT(r, i) (r[0] * E(i, 2) + r[1] * E(i, 3) + r[2] * E(i, 4))
#define ROWV(r, v2, v3, v4) (r[0] * (v2) + r[1] * (v3) + r[2] * (v4))
    const float* ja = jac[0];
    const float* jb = jac[1];
    const float* jc = jac[2];
    const float* jd = jac[3];
    const float b20 = E(2, 0) + DOT(ja, 2);
    const float b30 = E(3, 0) + DOT(ja, 3);
    const float b40 = E(4, 0) + DOT(ja, 4);
    c[tri(0, 0)] = E(0, 0) + DOT(ja, 0) + ROWV(ja, b20, b30, b40);
    c[tri(1, 0)] = E(1, 0) + DOT(ja, 1) + ROWV(jb, b20, b30, b40);
    c[tri(2, 0)] = ROWV(jc, b20, b30, b40);
    c[tri(3, 0)] = ROWV(jd, b20, b30, b40);
    c[tri(4, 0)] = b40;
    const float b21 = E(2, 1) + DOT(jb, 2);
    const float b31 = E(3, 1) + DOT(jb, 3);
    const float b41 = E(4, 1) + DOT(jb, 4);
    c[tri(1, 1)] = E(1, 1) + DOT(jb, 1) + ROWV(jb, b21, b31, b41);
    c[tri(2, 1)] = ROWV(jc, b21, b31, b41);
    c[tri(3, 1)] = ROWV(jd, b21, b31, b41);
    c[tri(4, 1)] = b41;
    const float b22 = DOT(jc, 2), b32 = DOT(jc, 3), b42 = DOT(jc, 4);
    c[tri(2, 2)] = ROWV(jc, b22, b32, b42);
    c[tri(3, 2)] = ROWV(jd, b22, b32, b42);
    c[tri(4, 2)] = b42;
    const float b23 = DOT(jd, 2), b33 = DOT(jd, 3), b43 = DOT(jd, 4);
    c[tri(3, 3)] = ROWV(jd, b23, b33, b43);
    c[tri(4, 3)] = b43;
#undef E
#undef DOT
#undef ROWV
}

// 2D measurement update of x and y weighted by `mask` (update): the chi-square increment
// over the pivots of S (never negative while they are positive); `untrusted` set where a
// pivot is not positive (or NaN).
__device__ __forceinline__ void update(float st[5], float c[15], float& chi2, bool& untrusted,
                                       float mx, float my, float vx, float vy, float mask) {
    const float s00 = c[0] + vx;
    const float s01 = c[1];
    const float s11 = c[2] + vy;
    const float det = s00 * s11 - s01 * s01;
    const float inv_det = 1.0f / det;
    if (!(0.0f < s00) || !(0.0f < det)) untrusted = true;
    const float r0 = (mx - st[0]) * mask;
    const float r1 = (my - st[1]) * mask;
    const float w0 = (s11 * r0 - s01 * r1) * inv_det;
    const float w1 = (s00 * r1 - s01 * r0) * inv_det;
    const float i00 = s11 * inv_det;
    const float i01 = -s01 * inv_det;
    const float i11 = s00 * inv_det;
    float cx[5], cy[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        cx[i] = c[tri(i, 0)];
        cy[i] = c[tri(i, 1)];
    }
    const float mi00 = i00 * mask;
    const float mi01 = i01 * mask;
    const float mi11 = i11 * mask;
    float k0[5], k1[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        st[i] += cx[i] * w0 + cy[i] * w1;
        k0[i] = cx[i] * mi00 + cy[i] * mi01;
        k1[i] = cx[i] * mi01 + cy[i] * mi11;
    }
#pragma unroll
    for (int i = 0; i < 5; ++i)
#pragma unroll
        for (int j = 0; j <= i; ++j) c[tri(i, j)] -= k0[i] * cx[j] + k1[i] * cy[j];
    const float inv_s00 = 1.0f / s00;
    const float e = r1 - s01 * r0 * inv_s00;
    chi2 += r0 * r0 * inv_s00 + e * e * s00 * inv_det;
}

// Multiple-scattering noise for crossing x0 radiation lengths (scatter); with qop_error,
// of the expectation of (q/p)^2 over the q/p's variance, counted up to the estimate's
// square (FitConfig::scatters_with_qop_error).
__device__ __forceinline__ void scatter(float c[15], float tx, float ty, float qop, float x0,
                                        float ln_x0, float mass2, bool qop_error) {
    const float one = 1.0f, six = 6.0f, four = 4.0f;
    const float u = tx * tx + ty * ty;
    const float n2 = one + u;
    const float w = mass2 * qop * qop;
    const float xr = x0 * sqrtf(n2);
    const float pu = u * (six + u), qu = six + four * u;
    const float pw = w * (six + w), qw = six + four * w;
    const float log_term = ln_x0 + (0.5f * pu * qw + pw * qu) / (qu * qw);
    const float g = one + (float)0.038 * log_term;
    float f2 = HIGHLAND2_F * qop * qop * (one + w) * g * g;
    if (qop_error) {
        const float q2 = qop * qop;
        const float var = c[tri(4, 4)];
        f2 = HIGHLAND2_F * (q2 + (q2 < var ? q2 : var)) * (one + w) * g * g;
    }
    const float th2n = f2 * xr * n2;
    c[tri(2, 2)] += th2n * (one + tx * tx);
    c[tri(3, 3)] += th2n * (one + ty * ty);
    c[tri(3, 2)] += th2n * tx * ty;
}

// The mean fields the seed measures (kalman.rs: seed_fields, same operations in the same
// order): the three-hit curvature's tent a -> b -> n and the ramp m -> n, by the midpoint
// rule with SEED_FIELD_SAMPLES points per straight segment.
#define SEED_FIELD_SAMPLES 3
__device__ void seed_lerp(const double* p0, const double* p1, double f, double* out) {
    out[0] = p0[0] + f * (p1[0] - p0[0]);
    out[1] = p0[1] + f * (p1[1] - p0[1]);
    out[2] = p0[2] + f * (p1[2] - p0[2]);
}
// Also the spread of the tent's bending (kalman.rs: seed_fields' third value): the tent-weighted
// mean of the bending terms' magnitude at the chord slopes from a to n over the magnitude
// of their mean, at least 1, by which the seed's q/p prior widens.
__device__ void seed_fields(const Grid& g, const double* a, const double* b, const double* n,
                            const double* m, double* tent, double* ramp, double* spread) {
    const double ns = (double)SEED_FIELD_SAMPLES;
    double acc[3] = {0.0, 0.0, 0.0};
    double acc_w = 0.0;
    const double dz = n[2] - a[2];
    const double tx = (n[0] - a[0]) / dz;
    const double ty = (n[1] - a[1]) / dz;
    double net_x = 0.0, net_y = 0.0, gross = 0.0;
    for (int seg = 0; seg < 2; ++seg) {
        const double* p0 = seg == 0 ? a : b;
        const double* p1 = seg == 0 ? b : n;
        const double len = p1[2] - p0[2];
        for (int i = 0; i < SEED_FIELD_SAMPLES; ++i) {
            const double f = ((double)i + 0.5) / ns;
            const double w = (seg == 0 ? f : 1.0 - f) * len;
            double pt[3], bf[3];
            seed_lerp(p0, p1, f, pt);
            at_f64(g, pt[0], pt[1], pt[2], bf);
            for (int k = 0; k < 3; ++k) acc[k] += w * bf[k];
            acc_w += w;
            const double ax = tx * ty * bf[0] - (1.0 + tx * tx) * bf[1] + ty * bf[2];
            const double ay = (1.0 + ty * ty) * bf[0] - tx * ty * bf[1] - tx * bf[2];
            net_x += w * ax;
            net_y += w * ay;
            gross += w * sqrt(ax * ax + ay * ay);
        }
    }
    const double net = sqrt(net_x * net_x + net_y * net_y);
    const double r = gross / net;
    // No net bending (no field, hits on one z) or a ratio that is not a number: none.
    *spread = dz > 0.0 && net > 0.0 && isfinite(r) && r > 1.0 ? r : 1.0;
    double racc[3] = {0.0, 0.0, 0.0};
    double racc_w = 0.0;
    for (int i = 0; i < SEED_FIELD_SAMPLES; ++i) {
        const double f = ((double)i + 0.5) / ns;
        double pt[3], bf[3];
        seed_lerp(m, n, f, pt);
        at_f64(g, pt[0], pt[1], pt[2], bf);
        for (int k = 0; k < 3; ++k) racc[k] += f * bf[k];
        racc_w += f;
    }
    if (acc_w > 0.0) {
        for (int k = 0; k < 3; ++k) tent[k] = acc[k] / acc_w;
    } else {
        at_f64(g, b[0], b[1], b[2], tent);
    }
    for (int k = 0; k < 3; ++k) ramp[k] = racc[k] / racc_w;
}

// Scattering angle variance at plane p, double precision (KalmanFitter::theta0_sq).
__device__ double theta0_sq(const double* row, double mass, double qop, double tx, double ty) {
    const double x0 = row[3];
    if (x0 <= 0.0) return 0.0;
    const double n2 = 1.0 + tx * tx + ty * ty;
    const double xr = x0 * sqrt(n2);
    const double inv_beta2 = 1.0 + mass * mass * qop * qop;
    const double f = HIGHLAND_D * qop * sqrt(inv_beta2) * (1.0 + 0.038 * log(xr * inv_beta2));
    return f * f * xr;
}

// Points of q/p at which scattering_qop weighs the kinks (SCATTER_GRID in kalman.rs).
#define SCATTER_GRID 16

// The kinks' log-likelihood at each of SCATTER_GRID points of q/p over (0, q_max], up to
// a constant (KalmanFitter::scatter_log_likelihood_with, the same sums in the same order),
// into logl, the points' q^2 into q2s; the constant it leaves out (the sum over the kinks
// of ln(mx my)) added to *ln_res. False where the CPU gives none (fewer than three hits, a
// plane the fit does not know). Not inlined, its loops not unrolled: only fits without a
// field and the exchange without one take it, and the arrays stay out of their registers.
template <class Hits>
__device__ __noinline__ bool scatter_log_likelihood(const Hits& h, int n, const double* rows64,
                                                    int n_planes, double mass, double q_max,
                                                    double* logl, double* q2s, double* ln_res) {
    if (n < 3) return false;
#pragma unroll 1
    for (int k = 0; k < n; ++k) {
        if (h.plane(k) < 0 || h.plane(k) >= n_planes) return false;
    }
    const double* first = rows64 + ROW * h.plane(0);
    const double* last = rows64 + ROW * h.plane(n - 1);
    const double dz = last[0] - first[0];
    const double tx = ((double)h.x(n - 1) - (double)h.x(0)) / dz;
    const double ty = ((double)h.y(n - 1) - (double)h.y(0)) / dz;
    const double n2 = 1.0 + tx * tx + ty * ty;
    const double ln_root_n2 = 0.5 * log(n2);
    const double root_n2 = sqrt(n2);
    const double fx = (1.0 + tx * tx) * n2, fy = (1.0 + ty * ty) * n2;
    const double m2 = mass * mass;
    double det[SCATTER_GRID], us[SCATTER_GRID];
#pragma unroll 1
    for (int g = 0; g < SCATTER_GRID; ++g) {
        const double q = q_max * ((double)g + 0.5) / (double)SCATTER_GRID;
        q2s[g] = q * q;
        us[g] = q2s[g] * (1.0 + m2 * q2s[g]);
        logl[g] = 0.0;
        det[g] = 1.0;
    }
    double bound = 1.0;
#pragma unroll 1
    for (int k = 1; k < n - 1; ++k) {
        const int pa = h.plane(k - 1), pb = h.plane(k), pd = h.plane(k + 1);
        const double* a = rows64 + ROW * pa;
        const double* b = rows64 + ROW * pb;
        const double* d = rows64 + ROW * pd;
        const double i1 = 1.0 / (b[0] - a[0]);
        const double i2 = 1.0 / (d[0] - b[0]);
        const double w1 = i1 + i2;
        const double x0 = h.x(k - 1), x1 = h.x(k), x2 = h.x(k + 1);
        const double y0 = h.y(k - 1), y1 = h.y(k), y2 = h.y(k + 1);
        const double kx = (x2 - x1) * i2 - (x1 - x0) * i1;
        const double ky = (y2 - y1) * i2 - (y1 - y0) * i1;
        const double mx = a[1] * i1 * i1 + b[1] * w1 * w1 + d[1] * i2 * i2;
        const double my = a[2] * i1 * i1 + b[2] * w1 * w1 + d[2] * i2 * i2;
        double c = 0.0;
#pragma unroll 1
        for (int j = pa + 1; j < pd; ++j) {
            const double* r = rows64 + ROW * j;
            if (r[3] <= 0.0) continue;
            const double w = j <= pb ? (r[0] - a[0]) * i1 : (d[0] - r[0]) * i2;
            const double f = HIGHLAND_D * (1.0 + 0.038 * (r[4] + ln_root_n2));
            c += f * f * r[3] * root_n2 * w * w;
        }
        const double kx2 = kx * kx, ky2 = ky * ky, cx = c * fx, cy = c * fy;
        *ln_res += log(mx * my);
        const double inv_m = 1.0 / (mx * my);
        const double top = us[SCATTER_GRID - 1];
        bound *= (mx + cx * top) * (my + cy * top) * inv_m;
        if (bound > 1e200) {
#pragma unroll 1
            for (int g = 0; g < SCATTER_GRID; ++g) {
                logl[g] += log(det[g]);
                det[g] = 1.0;
            }
            bound = (mx + cx * top) * (my + cy * top) * inv_m;
        }
#pragma unroll 1
        for (int g = 0; g < SCATTER_GRID; ++g) {
            const double vx = mx + cx * us[g];
            const double vy = my + cy * us[g];
            logl[g] += kx2 / vx + ky2 / vy;
            det[g] *= vx * vy * inv_m;
        }
    }
#pragma unroll 1
    for (int g = 0; g < SCATTER_GRID; ++g) logl[g] = -0.5 * (logl[g] + log(det[g]));
    return true;
}

// The largest of the log-likelihoods.
__device__ __forceinline__ double scatter_top(const double* logl) {
    double top = -__longlong_as_double(0x7ff0000000000000LL);
#pragma unroll 1
    for (int g = 0; g < SCATTER_GRID; ++g) top = fmax(top, logl[g]);
    return top;
}

// The q/p of a track no field bends, from the scattering its hits show
// (KalmanFitter::scattering_qop, the same sums in the same order): the kinks' likelihood
// on a grid of q/p over (0, q_max], a prior (the run's spectrum, or proportional to
// 1 / sqrt(q): FitConfig::scatter_weights), and the root of the posterior mean of q^2.
template <class Hits>
__device__ __noinline__ double scattering_qop(const Hits& h, int n, const double* rows64,
                                              int n_planes, double mass, double q_min,
                                              double q_max, const double* prior) {
    double logl[SCATTER_GRID], q2s[SCATTER_GRID], ln_res = 0.0;
    if (!scatter_log_likelihood(h, n, rows64, n_planes, mass, q_max, logl, q2s, &ln_res)) return q_min;
    const double top = scatter_top(logl);
    double sw = 0.0, sq = 0.0;
#pragma unroll 1
    for (int g = 0; g < SCATTER_GRID; ++g) {
        if (logl[g] - top > -40.0) {
            const double w = exp(logl[g] - top) * prior[g];
            sw += w;
            sq += w * q2s[g];
        }
    }
    // fmax/fmin return the number where the root is not one, as the CPU's max/min.
    return fmin(fmax(sqrt(sq / sw), q_min), q_max);
}

// -2 ln of the kinks' likelihood averaged over the prior, with the resolution's
// normalisation (KalmanFitter::scatter_evidence, in the same order); infinite where the
// CPU gives none.
template <class Hits>
__device__ __noinline__ double scatter_evidence(const Hits& h, int n, const double* rows64,
                                                int n_planes, double mass, double q_max,
                                                const double* prior) {
    double logl[SCATTER_GRID], q2s[SCATTER_GRID], ln_res = 0.0;
    const double inf = __longlong_as_double(0x7ff0000000000000LL);
    if (!scatter_log_likelihood(h, n, rows64, n_planes, mass, q_max, logl, q2s, &ln_res)) return inf;
    const double top = scatter_top(logl);
    double z = 0.0;
#pragma unroll 1
    for (int g = 0; g < SCATTER_GRID; ++g) {
        if (logl[g] - top > -40.0) z += exp(logl[g] - top) * prior[g];
    }
    const double e = -2.0 * (top + log(z)) + ln_res;
    return isfinite(e) ? e : inf;
}

__device__ __forceinline__ void fit_bending(float tx, float ty, const float b[3], float& ax, float& ay) {
    const float one = 1.0f;
    const float txy = tx * ty;
    ax = txy * b[0] - (one + tx * tx) * b[1] + ty * b[2];
    ay = (one + ty * ty) * b[0] - txy * b[1] - tx * b[2];
}

// What the fit reads besides the hits (the tables of src/gpu/tracking_fit.rs, FitTables).
struct KalmanTables {
    const float* rows32;
    const double* rows64;
    const int* gap_steps;
    const int* gap_kind;
    const int* gap_slice;
    const float* slices;
    const float* pf;
    const double* pd;
    const int* pi;
    const float* nodes;
};

// One fit's result: the state at the most upstream hit, the covariance (lower triangle
// row by row), z, chi-square, degrees of freedom and whether it is trusted. An unfittable
// candidate gets all zeros (ndf 0, ok 0), as on the CPU.
struct KalmanResult {
    float st[5];
    float c[15];
    float z, chi2;
    int ndf;
    int ok;
};

__device__ __forceinline__ void kalman_empty(KalmanResult& r) {
    for (int i = 0; i < 5; ++i) r.st[i] = 0.0f;
    for (int i = 0; i < 15; ++i) r.c[i] = 0.0f;
    r.z = 0.0f;
    r.chi2 = 0.0f;
    r.ndf = 0;
    r.ok = 0;
}

// A fit of four hits or more that fails or exceeds this chi-square per degree of freedom
// is fitted again with the seed's middle hit one hit upstream, the better kept
// (kalman.rs: RETRY_CHI2_NDF, seed_middle).
#define RETRY_CHI2_NDF 5.0f

template <class Hits>
__device__ void kalman_fit_pass(const Hits& h, int n, int kmax, const KalmanTables& T,
                                KalmanResult& res, int mid, float q_ref, float q_scat);

template <class Hits>
__device__ void kalman_fit_at_prefit(const Hits& h, int n, int kmax, const KalmanTables& T,
                                     KalmanResult& res);

// Whether the first pass `res` of a fit of n hits is fitted again (RETRY_CHI2_NDF).
__device__ __forceinline__ bool kalman_retry(int n, const KalmanResult& res) {
    return n >= 4 && !(res.ok && res.chi2 <= RETRY_CHI2_NDF * (float)res.ndf);
}

// kalman_fit_track, its retry made only where the first pass failed or ended within
// `retry_within` (kalman.rs: fit_each_retry_within; the exchange's trial fits).
template <class Hits>
__device__ void kalman_fit_track_within(const Hits& h, int n, int kmax, const KalmanTables& T,
                                        KalmanResult& res, float retry_within) {
    const float none = __int_as_float(0x7fc00000);
    kalman_fit_pass(h, n, kmax, T, res, n / 2, none, none);
    if (kalman_retry(n, res) && !(res.ok && res.chi2 > retry_within)) {
        KalmanResult again;
        kalman_fit_pass(h, n, kmax, T, again, n / 2 - 1, none, none);
        if (again.ok && (!res.ok || again.chi2 < res.chi2)) res = again;
    }
    kalman_fit_at_prefit(h, n, kmax, T, res);
}

// The fit again, seeded with the first fit's q/p (`res`) and every plane's scattering at
// its expectation over that fit's q/p error (FitConfig::scatter_at_prefit), where the
// first fit is ok; the expectation in double precision, as on the CPU. From a first fit
// made elsewhere (the candidates' fit of the same hits), kalman.rs: fit_lanes_from_first.
template <class Hits>
__device__ void kalman_fit_at_prefit(const Hits& h, int n, int kmax, const KalmanTables& T,
                                     KalmanResult& res) {
    if (T.pi[PI_SCATTER_AT_PREFIT] != 0 && T.pi[PI_FIT_MOMENTUM] != 0 && res.ok) {
        const double q = (double)res.st[4];
        const double v = res.c[14] > 0.0f ? (double)res.c[14] : 0.0;
        KalmanResult fin;
        kalman_fit_pass(h, n, kmax, T, fin, n / 2, res.st[4], (float)sqrt(q * q + v));
        if (fin.ok) res = fin;
    }
}

// The fit of one candidate of n hits (upstream first), read through `h`: h.plane(k),
// h.x(k), h.y(k). Used by the kalman_fit kernel (hits in its batch layout) and by the
// candidate step of the CA module (hits of a device-resident candidate): its retry
// wherever the first pass calls for one (no chi-square exceeds infinity).
template <class Hits>
__device__ void kalman_fit_track(const Hits& h, int n, int kmax, const KalmanTables& T,
                                 KalmanResult& res) {
    kalman_fit_track_within(h, n, kmax, T, res, __int_as_float(0x7f800000));
}

// One pass of the fit, the seed's three-hit q/p from hits 0, `mid` and n - 1; with a
// reference q/p `q_ref` (not NaN, where the fit measures momenta), the seed's q/p that
// instead and every plane's scattering at |q/p| = `q_scat`.
template <class Hits>
__device__ void kalman_fit_pass(const Hits& h, int n, int kmax, const KalmanTables& T,
                                KalmanResult& res, int mid, float q_ref, float q_scat) {
    const float* rows32 = T.rows32;
    const double* rows64 = T.rows64;
    const int* gap_steps = T.gap_steps;
    const int* gap_kind = T.gap_kind;
    const int* gap_slice = T.gap_slice;
    const float* slices = T.slices;
    const float* pf = T.pf;
    const double* pd = T.pd;
    const int* pi = T.pi;
    const float* nodes = T.nodes;
    const int n_planes = pi[PI_N_PLANES];
#define PLANE(k) (h.plane(k))
#define HX(k) (h.x(k))
#define HY(k) (h.y(k))

    // Seedable (seedable_hits) and planes strictly increasing (`ordered`); others get an
    // empty result with ok = 0, as on the CPU.
    if (n < 3 || n > kmax) {
        kalman_empty(res);
        return;
    }
    const int pa = PLANE(0), pb = PLANE(mid), pm = PLANE(n - 2), pl = PLANE(n - 1);
    bool valid = (pa < pb) && (pb <= pm) && (pm < pl) && (pl < n_planes);
    int prev = -1;
    for (int k = 0; k < n - 2; ++k) {
        const int p = PLANE(k);
        valid = valid && p > prev;
        prev = p;
    }
    valid = valid && prev < pm;
    if (!valid) {
        kalman_empty(res);
        return;
    }

    Grid g;
    g.nodes = nodes;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        g.n[a] = pi[PI_NX + a];
        g.o32[a] = pf[PF_ORIGIN + a];
        g.is32[a] = pf[PF_INV_STEP + a];
        g.o64[a] = pd[PD_ORIGIN + a];
        g.is64[a] = pd[PD_INV_STEP + a];
    }
    const bool field_map = pi[PI_FIELD_MAP] != 0;
    const float bu[3] = {pf[PF_B], pf[PF_B + 1], pf[PF_B + 2]};

    const float* ra = rows32 + ROW * pa;
    const float* rb = rows32 + ROW * pb;
    const float* rm = rows32 + ROW * pm;
    const float* rn = rows32 + ROW * pl;
    const float za = ra[0], zb = rb[0], zm = rm[0], zn = rn[0];
    const float xa = HX(0), xb = HX(mid), xm = HX(n - 2), xn = HX(n - 1);
    const float ya = HY(0), yb = HY(mid), ym = HY(n - 2), yn = HY(n - 1);
    const float vxm = rm[1], vym = rm[2], vxn = rn[1], vyn = rn[2];
    const float seed_db = rn[5];
    const bool gap = pl > pm + 1;

    // The fields the seed's two estimates measure (seed_fields): the three-hit
    // curvature's and the last two hits' bending.
    float b_mid[3], b_last[3];
    float spread = 1.0f;
    if (field_map) {
        double m[3], l[3], sp;
        const double sa[3] = {(double)xa, (double)ya, (double)za};
        const double sb[3] = {(double)xb, (double)yb, (double)zb};
        const double sm[3] = {(double)xm, (double)ym, (double)zm};
        const double sn[3] = {(double)xn, (double)yn, (double)zn};
        seed_fields(g, sa, sb, sn, sm, m, l, &sp);
        for (int k = 0; k < 3; ++k) {
            b_mid[k] = (float)m[k];
            b_last[k] = (float)l[k];
        }
        spread = (float)sp;
    } else {
        for (int k = 0; k < 3; ++k) {
            b_mid[k] = bu[k];
            b_last[k] = bu[k];
        }
    }

    // Three-hit q/p and its prior variance (seed_qop).
    float qop, cq;
    if (pi[PI_FIT_MOMENTUM] == 0 && pi[PI_SCATTER_QOP] != 0) {
        const double q = scattering_qop(h, n, rows64, n_planes, pd[PD_MASS],
                                        pd[PD_SCATTER_Q_MIN], pd[PD_SCATTER_Q_MAX],
                                        pd + PD_SCATTER_PRIOR);
        qop = (float)q;
        cq = (float)(q * q);
    } else if (pi[PI_FIT_MOMENTUM] == 0) {
        qop = pf[PF_QOP_FIXED];
        cq = pf[PF_QOP_FIXED_VAR];
    } else {
        const float one = 1.0f;
        const float inv_ab = one / (zb - za);
        const float inv_bc = one / (zn - zb);
        const float inv_ac = one / (zn - za);
        const float sx1 = (xb - xa) * inv_ab;
        const float sx2 = (xn - xb) * inv_bc;
        const float sy1 = (yb - ya) * inv_ab;
        const float sy2 = (yn - yb) * inv_bc;
        const float two_ac = 2.0f * inv_ac;
        const float ddx = (sx2 - sx1) * two_ac;
        const float ddy = (sy2 - sy1) * two_ac;
        const float tx = (xn - xa) * inv_ac;
        const float ty = (yn - ya) * inv_ac;
        float ax, ay;
        fit_bending(tx, ty, b_mid, ax, ay);
        const float kn = K_F * sqrtf(one + tx * tx + ty * ty);
        const float gx = kn * ax;
        const float gy = kn * ay;
        const float g2 = gx * gx + gy * gy;
        float q = (ddx * gx + ddy * gy) / g2;
        // No bending (g2 = 0) or a degenerate geometry: no curvature estimate.
        q = 0.0f < g2 ? q : 0.0f;
        q = fabsf(q) < __int_as_float(0x7f800000) ? q : 0.0f;
        const float s = pf[PF_PRIOR_REL] * spread * fabsf(q) + pf[PF_PRIOR_FLOOR];
        qop = q;
        cq = s * s;
    }
    // A reference q/p: the seed's, with the prior of a three-hit estimate of that value.
    const bool use_ref = pi[PI_FIT_MOMENTUM] != 0 && q_ref == q_ref;
    if (use_ref) {
        const float s = pf[PF_PRIOR_REL] * spread * fabsf(q_ref) + pf[PF_PRIOR_FLOOR];
        qop = q_ref;
        cq = s * s;
    }

    // Seed: the last hit, chord slopes corrected by the bending between the last two.
    const float dz = zn - zm;
    const float inv_dz = 1.0f / dz;
    const float chord_x = (xn - xm) * inv_dz;
    const float chord_y = (yn - ym) * inv_dz;
    float ax, ay;
    fit_bending(chord_x, chord_y, b_last, ax, ay);
    const float f = HALF_K_F * dz * sqrtf(1.0f + chord_x * chord_x + chord_y * chord_y);
    const float gx = f * ax, gy = f * ay;
    float z = zn, x = xn, y = yn;
    float tx = chord_x + gx * qop;
    float ty = chord_y + gy * qop;
    // Scattering in planes skipped between the two seeding hits, in double precision.
    float ms[3] = {0.0f, 0.0f, 0.0f};
    if (gap) {
        const double mass = pd[PD_MASS];
        const double zpm = rows64[ROW * pm];
        const double dzd = (double)dz;
        const double q = (double)qop, cx = (double)chord_x, cy = (double)chord_y;
        const double n2 = 1.0 + cx * cx + cy * cy;
        double m0 = 0.0, m1 = 0.0, m2 = 0.0;
        for (int p = pm + 1; p < pl; ++p) {
            const double w = (rows64[ROW * p] - zpm) / dzd;
            const double th2 = theta0_sq(rows64 + ROW * p, mass, q, cx, cy) * w * w;
            m0 += th2 * (1.0 + cx * cx) * n2;
            m1 += th2 * (1.0 + cy * cy) * n2;
            m2 += th2 * cx * cy * n2;
        }
        ms[0] = (float)m0;
        ms[1] = (float)m1;
        ms[2] = (float)m2;
    }
    const float inv_dz2 = inv_dz * inv_dz;
    // What the seed's mean field over the last gap may miss (seed_field_errors) bends
    // the slopes by up to this much at the seed's q/p.
    const float seed_err =
        f * (1.0f + chord_x * chord_x + chord_y * chord_y) * seed_db * qop;
    const float seed_var = seed_err * seed_err;
    float c[15];
#pragma unroll
    for (int i = 0; i < 15; ++i) c[i] = 0.0f;
    c[0] = vxn;
    c[2] = vyn;
    c[3] = vxn * inv_dz;
    c[5] = (vxn + vxm) * inv_dz2 + gx * gx * cq + ms[0] + seed_var;
    c[7] = vyn * inv_dz;
    c[8] = gx * gy * cq + ms[2];
    c[9] = (vyn + vym) * inv_dz2 + gy * gy * cq + ms[1] + seed_var;
    c[12] = gx * cq;
    c[13] = gy * cq;
    c[14] = cq;
    float chi2 = 0.0f;
    bool untrusted = false;
    const float mass2 = pf[PF_MASS2];
    // The scattering's expectation over the q/p's error where the seed's prior is as wide
    // as its estimate (FitConfig::scatters_with_qop_error).
    const bool qop_error = pi[PI_SCATTER_QOP_ERROR] != 0 && !(pf[PF_PRIOR_REL] * spread < 1.0f);
    // The largest |q/p| whose scattering the planes add (FitConfig::scatter_qop_max).
    const bool floor = pi[PI_SCATTER_FLOOR] != 0;
    const float qop_max = pf[PF_SCATTER_QOP_MAX];

    // Plane by plane upstream: step, transport, update with the hit on the plane (none on
    // the second-to-last hit's plane: the seed used it), scattering in the plane's
    // material (none at the first hit's plane: the state is reported just downstream).
    int k = n - 3;
    for (int p = pl - 1; p >= pa; --p) {
        const float* r = rows32 + ROW * p;
        const float z_to = r[0];
        const float x0 = pa < p ? r[3] : 0.0f;
        float mx = 0.0f, my = 0.0f, hit = 0.0f;
        if (k >= 0 && PLANE(k) == p) {
            mx = HX(k);
            my = HY(k);
            hit = 1.0f;
            --k;
        }
        float jac[4][3];
        propagate_gap(gap_kind[p], bu, g, slices, gap_slice[p], z, x, y, tx, ty, qop, z_to,
                      gap_steps[p], jac);
        transport_cov(c, jac);
        float st[5] = {x, y, tx, ty, qop};
        update(st, c, chi2, untrusted, mx, my, r[1], r[2], hit);
        x = st[0];
        y = st[1];
        tx = st[2];
        ty = st[3];
        qop = st[4];
        float q_scatter = use_ref ? q_scat : qop;
        if (floor) {
            const float a = fabsf(q_scatter);
            q_scatter = a < qop_max ? a : qop_max;
        }
        scatter(c, tx, ty, q_scatter, x0, r[4], mass2, qop_error);
    }

    // Not finite anywhere, a variance that is not positive, or a covariance that lost
    // positive definiteness on the way: not ok.
    bool ok = !untrusted && isfinite(chi2) && isfinite(x) && isfinite(y) && isfinite(tx) &&
              isfinite(ty) && isfinite(qop) && isfinite(z);
#pragma unroll
    for (int i = 0; i < 15; ++i) ok = ok && isfinite(c[i]);
#pragma unroll
    for (int i = 0; i < 5; ++i) ok = ok && 0.0f < c[tri(i, i)];
    const int ndf = 2 * n - (pi[PI_FIT_MOMENTUM] ? 5 : 4);
    res.st[0] = x;
    res.st[1] = y;
    res.st[2] = tx;
    res.st[3] = ty;
    res.st[4] = qop;
#pragma unroll
    for (int i = 0; i < 15; ++i) res.c[i] = c[i];
    res.z = z;
    res.chi2 = chi2;
    res.ndf = ndf > 0 ? ndf : 0;
    res.ok = ok ? 1 : 0;
#undef PLANE
#undef HX
#undef HY
}

// The hits of candidate t in the kalman_fit kernel's batch layout.
struct BatchHits {
    const unsigned* hx;
    const unsigned* hy;
    const unsigned* hp;
    int stride, t;
    __device__ __forceinline__ int plane(int k) const { return (int)hp[(size_t)k * stride + t]; }
    __device__ __forceinline__ float x(int k) const { return __uint_as_float(hx[(size_t)k * stride + t]); }
    __device__ __forceinline__ float y(int k) const { return __uint_as_float(hy[(size_t)k * stride + t]); }
};

// Candidate t's hits in a batch of the kalman_fit kernel's layout (count, then x, y and
// plane words of kmax hits, each array `stride` candidates wide).
__device__ __forceinline__ BatchHits batch_hits(const unsigned* hits, int stride, int kmax, int t) {
    BatchHits h;
    h.hx = hits + stride;
    h.hy = h.hx + (size_t)kmax * stride;
    h.hp = h.hy + (size_t)kmax * stride;
    h.stride = stride;
    h.t = t;
    return h;
}

// Candidate t's fit into the kalman_fit kernel's output words (OUT_WORDS, each `stride`
// candidates wide).
__device__ __forceinline__ void store_batch_fit(const KalmanResult& r, unsigned* out, int stride,
                                                int t) {
#pragma unroll
    for (int i = 0; i < 5; ++i) out[i * stride + t] = __float_as_uint(r.st[i]);
#pragma unroll
    for (int i = 0; i < 15; ++i) out[(5 + i) * stride + t] = __float_as_uint(r.c[i]);
    out[20 * stride + t] = __float_as_uint(r.z);
    out[21 * stride + t] = __float_as_uint(r.chi2);
    out[22 * stride + t] = (unsigned)r.ndf;
    out[23 * stride + t] = (unsigned)r.ok;
}

extern "C" __global__ void kalman_fit(const unsigned* __restrict__ hits, int n_tracks, int stride,
                                      int kmax, const float* __restrict__ rows32,
                                      const double* __restrict__ rows64,
                                      const int* __restrict__ gap_steps,
                                      const int* __restrict__ gap_kind,
                                      const int* __restrict__ gap_slice,
                                      const float* __restrict__ slices,
                                      const float* __restrict__ pf, const double* __restrict__ pd,
                                      const int* __restrict__ pi, const float* __restrict__ nodes,
                                      unsigned* __restrict__ out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tracks) return;
    const KalmanTables T = {rows32, rows64, gap_steps, gap_kind, gap_slice,
                            slices, pf,     pd,        pi,       nodes};
    KalmanResult r;
    kalman_fit_track(batch_hits(hits, stride, kmax, t), (int)hits[t], kmax, T, r);
    store_batch_fit(r, out, stride, t);
}
