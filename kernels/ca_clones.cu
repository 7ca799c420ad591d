// Clone suppression on the GPU: the device side of src/gpu/tracking_clones.rs, the
// CPU's mark_clones (src/tracking/ca/clones.rs) over a batch of events. Compiled with
// --fmad=false after kernels/field_map.cuh: the comparison and the Runge-Kutta steps are
// the CPU's double-precision operations in the CPU's order, so the decisions are the CPU's.
//
// Three launches. The CPU marks in acceptance order, and a track marked earlier is no
// longer a reference: a short track is a clone when a reference not marked at its turn
// passes every test (which one does not matter). The tests themselves do not depend on the
// marks, so they run first for every short track in parallel (ca_clone_refs, a warp per
// short track after ca_clone_masks, a thread per track), each keeping which references
// passed; only the order of the marks is then walked per event (ca_clones, a warp per
// event), which asks of most short tracks one word. No atomics; the result does not
// depend on scheduling.
//
// Layout of a batch (offsets are absolute indices into the batch's arrays):
//   event_start[n_events + 1]    tracks of event e: event_start[e] .. event_start[e + 1]
//   track_hit_start[n_tracks + 1] hits of track t: track_hit_start[t] .. [t + 1], upstream
//                                first
//   hit_plane, hit_x, hit_y [n_hits]
//   fits[n_tracks][FIT_WORDS]    z, state (x, y, tx, ty, qop), covariance (15, lower
//                                triangle row by row), doubles
//   marks[n_tracks]              out: 1 a clone, 0 kept
//   masks[n_tracks]              scratch: each track's planes modulo 64 as bits
//   refs[n_tracks * REF_WORDS]   scratch: step 2's references of each short track
// Offsets beyond the counts are clamped to them (a malformed batch reads no memory outside
// its arrays; its marks are then meaningless); plane indices are clamped to the last plane.
// Tables: plane_z[n_planes] (mm); pi[PI_*]; pd[PD_*]; nodes the field map's (one zero
// node in a uniform field).

#define PI_N_PLANES 0
#define PI_SHORT_MAX 1
#define PI_FIELD_MAP 2
#define PI_NX 3
#define PI_NY 4
#define PI_NZ 5

#define PD_BEND_X 0
#define PD_BEND_Y 1
#define PD_STEP 2
#define PD_WINDOW 3
#define PD_K 4
#define PD_B 5
#define PD_ORIGIN 8
#define PD_INV_STEP 11
#define PD_WINDOW_FLOOR 14
#define PD_QOP_REF 15
#define PD_N_SIGMA 16

#define FIT_WORDS 21
#define FIT_Z 0
#define FIT_STATE 1
#define FIT_COV 6
// tri(2, 2), tri(3, 3), tri(4, 4) of the lower triangle.
#define COV_TX 5
#define COV_TY 9
#define COV_QOP 14

#define FULL_MASK 0xffffffffu

// Step 2's words per track (refs): flags and count, then up to REF_MAX short references
// (fewer may be set when compiling, as the tests do to take the other path more often).
#ifndef REF_MAX
#define REF_MAX 7u
#endif
#define REF_WORDS 8
#define REF_COUNT 0xffu
#define REF_LONG 0x100u
#define REF_OVERFLOW 0x200u

struct CloneField {
    bool map;
    double b[3];
    FieldMap64 g;
};

__device__ __forceinline__ void field_at(const CloneField& f, double x, double y, double z,
                                         double b[3]) {
    if (f.map) {
        field_map_at_f64(f.g, x, y, z, b);
    } else {
        b[0] = f.b[0];
        b[1] = f.b[1];
        b[2] = f.b[2];
    }
}

// steps_for: equal steps of at most max_step (1 to 1024).
__device__ __forceinline__ int steps_for(double dz, double max_step) {
    if (isnan(max_step) || max_step <= 0.0 || !isfinite(dz)) {
        return 1;
    }
    const double c = ceil(fabs(dz) / max_step);
    return c < 1.0 ? 1 : (c > 1024.0 ? 1024 : (int)c);
}

// propagate_state: the state's Runge-Kutta steps from z_from to z_to (q/p unchanged).
__device__ void propagate_state(const CloneField& f, double kk, double z_from, double s[5],
                                double z_to, double max_step) {
    const int n = steps_for(z_to - z_from, max_step);
    double x = s[0], y = s[1], tx = s[2], ty = s[3];
    const double q = s[4];
    double z = z_from;
    const double h = (z_to - z) / (double)n;
    const double a[4] = {0.0, 0.5, 0.5, 1.0};
    const double sixth = 1.0 / 6.0, two = 2.0;
    for (int step = 0; step < n; ++step) {
        double ks[4][4];
        for (int st = 0; st < 4; ++st) {
            double px, py, pz, ptx, pty;
            if (st == 0) {
                px = x;
                py = y;
                pz = z;
                ptx = tx;
                pty = ty;
            } else {
                const double ah = a[st] * h;
                const double* k = ks[st - 1];
                px = x + ah * k[0];
                py = y + ah * k[1];
                pz = z + ah;
                ptx = tx + ah * k[2];
                pty = ty + ah * k[3];
            }
            double b[3];
            field_at(f, px, py, pz, b);
            const double nn = sqrt(1.0 + ptx * ptx + pty * pty);
            const double ax = ptx * pty * b[0] - (1.0 + ptx * ptx) * b[1] + pty * b[2];
            const double ay = (1.0 + pty * pty) * b[0] - ptx * pty * b[1] - ptx * b[2];
            const double kqn = kk * q * nn;
            ks[st][0] = ptx;
            ks[st][1] = pty;
            ks[st][2] = kqn * ax;
            ks[st][3] = kqn * ay;
        }
        const double hs = h * sixth;
        x += hs * (ks[0][0] + two * ks[1][0] + two * ks[2][0] + ks[3][0]);
        y += hs * (ks[0][1] + two * ks[1][1] + two * ks[2][1] + ks[3][1]);
        tx += hs * (ks[0][2] + two * ks[1][2] + two * ks[2][2] + ks[3][2]);
        ty += hs * (ks[0][3] + two * ks[1][3] + two * ks[2][3] + ks[3][3]);
        z += h;
    }
    s[0] = x;
    s[1] = y;
    s[2] = tx;
    s[3] = ty;
    s[4] = q;
}

struct Batch {
    const unsigned* track_hit_start;
    int n_tracks;
    const unsigned* hit_plane;
    const float* hit_x;
    const float* hit_y;
    int n_hits;
    const double* fits;
    const double* plane_z;
    int n_planes;
};

// Hits of track t, clamped to the batch.
__device__ __forceinline__ void hit_range(const Batch& bt, int t, int& h0, int& h1) {
    h0 = (int)min(bt.track_hit_start[t], (unsigned)bt.n_hits);
    h1 = (int)min(bt.track_hit_start[t + 1], (unsigned)bt.n_hits);
    h1 = max(h1, h0);
}

__device__ __forceinline__ int plane_of(const Batch& bt, int h) {
    return (int)min(bt.hit_plane[h], (unsigned)(bt.n_planes - 1));
}

// The track's planes modulo 64 as bits.
__device__ __forceinline__ unsigned long long plane_mask(const Batch& bt, int h0, int h1) {
    unsigned long long m = 0;
    for (int h = h0; h < h1; ++h) {
        m |= 1ull << (plane_of(bt, h) % 64);
    }
    return m;
}

// The window of a longer track whose largest |q/p| is q: the scattering displacement at the
// momentum cut (PD_WINDOW) scaled to the track's momentum, at least PD_WINDOW_FLOOR; not
// scaled without a momentum measurement (PD_QOP_REF zero). As CloneCuts::window_for.
__device__ __forceinline__ double clone_window(const double* __restrict__ pd, double q) {
    const double qref = pd[PD_QOP_REF];
    if (qref > 0.0) {
        return fmax(pd[PD_WINDOW] * fmin(q / qref, 1.0), pd[PD_WINDOW_FLOOR]);
    }
    return pd[PD_WINDOW];
}

// Whether two tracks' fitted q/p (values and variances) may be one particle's: always
// without a momentum measurement. As CloneCuts::same_qop.
__device__ __forceinline__ bool same_qop(const double* __restrict__ pd, double qa, double va,
                                         double qb, double vb) {
    if (pd[PD_QOP_REF] > 0.0) {
        const double d = qa - qb;
        const double ns = pd[PD_N_SIGMA];
        return !(d * d > ns * ns * (fmax(va, 0.0) + fmax(vb, 0.0)));
    }
    return true;
}

// Whether reference track a passes every test of mark_clones' inner loop for short track
// b (hits hb0..hb1, mask mb), in its order, but the mark: whether a was marked before b
// is the resolution's to ask (ca_clones).
__device__ bool qualifies(const Batch& bt, const CloneField& f, const double* pd,
                          const unsigned long long* masks, int a, int b, int hb0, int hb1,
                          unsigned long long mb) {
    const unsigned long long ma = masks[a];
    if ((ma & mb) != 0 && bt.n_planes <= 64) {
        return false;
    }
    if (a == b) {
        return false;
    }
    int ha0, ha1;
    hit_range(bt, a, ha0, ha1);
    if (ha1 - ha0 < hb1 - hb0) {
        return false;
    }
    if ((ma & mb) != 0) {
        for (int hb = hb0; hb < hb1; ++hb) {
            for (int ha = ha0; ha < ha1; ++ha) {
                if (plane_of(bt, ha) == plane_of(bt, hb)) {
                    return false;
                }
            }
        }
    }
    const double* fa = bt.fits + (size_t)a * FIT_WORDS;
    const double* fb = bt.fits + (size_t)b * FIT_WORDS;
    if (!same_qop(pd, fa[FIT_STATE + 4], fa[FIT_COV + COV_QOP], fb[FIT_STATE + 4],
                  fb[FIT_COV + COV_QOP])) {
        return false;
    }
    const double za = fa[FIT_Z];
    const double bend_x = pd[PD_BEND_X], bend_y = pd[PD_BEND_Y];
    // Every hit of b near a's straight line, within the largest bending.
    const double sd_tx = 3.0 * sqrt(fmax(fa[FIT_COV + COV_TX], 0.0));
    const double sd_ty = 3.0 * sqrt(fmax(fa[FIT_COV + COV_TY], 0.0));
    const double sd_q = 3.0 * sqrt(fmax(fa[FIT_COV + COV_QOP], 0.0));
    const double q = fabs(fa[FIT_STATE + 4]) + sd_q;
    const double window = clone_window(pd, q);
    for (int hb = hb0; hb < hb1; ++hb) {
        const double dz = bt.plane_z[plane_of(bt, hb)] - za;
        const double bend = 0.5 * q * dz * dz;
        const double x_lin = fa[FIT_STATE + 0] + fa[FIT_STATE + 2] * dz;
        const double y_lin = fa[FIT_STATE + 1] + fa[FIT_STATE + 3] * dz;
        const double wx = window + bend * bend_x + sd_tx * fabs(dz);
        const double wy = window + bend * bend_y + sd_ty * fabs(dz);
        const bool near = fabs(x_lin - (double)bt.hit_x[hb]) <= wx &&
                          fabs(y_lin - (double)bt.hit_y[hb]) <= wy;
        if (!near) {
            return false;
        }
    }
    // Every hit of b within the window of a's trajectory, followed hit by hit.
    double s[5];
    for (int k = 0; k < 5; ++k) {
        s[k] = fa[FIT_STATE + k];
    }
    double z = za;
    for (int hb = hb0; hb < hb1; ++hb) {
        const double zt = bt.plane_z[plane_of(bt, hb)];
        propagate_state(f, pd[PD_K], z, s, zt, pd[PD_STEP]);
        z = zt;
        if (fabs(s[0] - (double)bt.hit_x[hb]) > window ||
            fabs(s[1] - (double)bt.hit_y[hb]) > window) {
            return false;
        }
    }
    return true;
}

// The kernels' common arguments.
#define CLONE_ARGS                                                                          \
    const unsigned *__restrict__ event_start, int n_events,                                 \
        const unsigned *__restrict__ track_hit_start, int n_tracks,                         \
        const unsigned *__restrict__ hit_plane, const float *__restrict__ hit_x,            \
        const float *__restrict__ hit_y, int n_hits, const double *__restrict__ fits,       \
        const double *__restrict__ plane_z, const int *__restrict__ pi,                     \
        const double *__restrict__ pd, const float *__restrict__ nodes, unsigned *marks,    \
        unsigned long long *masks, unsigned *refs

__device__ __forceinline__ Batch batch_of(const unsigned* track_hit_start, int n_tracks,
                                          const unsigned* hit_plane, const float* hit_x,
                                          const float* hit_y, int n_hits, const double* fits,
                                          const double* plane_z, int n_planes) {
    Batch bt;
    bt.track_hit_start = track_hit_start;
    bt.n_tracks = n_tracks;
    bt.hit_plane = hit_plane;
    bt.hit_x = hit_x;
    bt.hit_y = hit_y;
    bt.n_hits = n_hits;
    bt.fits = fits;
    bt.plane_z = plane_z;
    bt.n_planes = n_planes;
    return bt;
}

__device__ __forceinline__ CloneField field_of(const int* pi, const double* pd,
                                               const float* nodes) {
    CloneField f;
    f.map = pi[PI_FIELD_MAP] != 0;
    f.g.nodes = nodes;
    for (int a = 0; a < 3; ++a) {
        f.b[a] = pd[PD_B + a];
        f.g.n[a] = pi[PI_NX + a];
        f.g.origin[a] = pd[PD_ORIGIN + a];
        f.g.inv_step[a] = pd[PD_INV_STEP + a];
    }
    return f;
}

// The tracks of event ev, clamped to the batch.
__device__ __forceinline__ void event_range(const unsigned* event_start, int ev, int n_tracks,
                                            int& t0, int& t1) {
    t0 = (int)min(event_start[ev], (unsigned)n_tracks);
    t1 = max((int)min(event_start[ev + 1], (unsigned)n_tracks), t0);
}

// Step 1, a thread per track: its plane mask (the comparisons read them again and again),
// no mark, and no reference yet (step 2 writes those of the short tracks).
extern "C" __global__ void ca_clone_masks(CLONE_ARGS) {
    const int t = (int)(blockIdx.x * (size_t)blockDim.x + threadIdx.x);
    if (t >= n_tracks) {
        return;
    }
    marks[t] = 0;
    refs[(size_t)t * REF_WORDS] = 0;
    const int n_planes = pi[PI_N_PLANES];
    if (n_planes < 1) {
        return;
    }
    const Batch bt = batch_of(track_hit_start, n_tracks, hit_plane, hit_x, hit_y, n_hits, fits,
                              plane_z, n_planes);
    int h0, h1;
    hit_range(bt, t, h0, h1);
    masks[t] = plane_mask(bt, h0, h1);
}

// Step 2, a warp per short track (warps striding over the batch's tracks): which of its
// event's tracks it qualifies against (`qualifies`: every test but the mark), as one word
// of flags and up to REF_MAX short references in increasing index, in refs[t * REF_WORDS].
// A long reference (more than PI_SHORT_MAX hits) is never marked, so one makes the short
// track a clone whatever the order; short references are marked or not by then, which
// step 3 asks in the order of acceptance. Every warp's work is its own: the events' short
// tracks are compared in parallel.
extern "C" __global__ void ca_clone_refs(CLONE_ARGS) {
    const int lane = threadIdx.x & 31;
    const int short_max = pi[PI_SHORT_MAX];
    const int n_planes = pi[PI_N_PLANES];
    if (short_max < 0 || n_planes < 1 || n_events < 1) {
        return;
    }
    const Batch bt = batch_of(track_hit_start, n_tracks, hit_plane, hit_x, hit_y, n_hits, fits,
                              plane_z, n_planes);
    const CloneField f = field_of(pi, pd, nodes);
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; w < (size_t)n_tracks;
         w += warps) {
        const int b = (int)w;
        int hb0, hb1;
        hit_range(bt, b, hb0, hb1);
        if (hb1 - hb0 > short_max) {
            continue;
        }
        // The event of track b: the last whose first track is at most b.
        int lo = 0, hi = n_events;
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if ((int)min(event_start[mid], (unsigned)n_tracks) <= b) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        int t0, t1;
        event_range(event_start, lo, n_tracks, t0, t1);
        if (b < t0 || b >= t1) {
            continue;
        }
        unsigned* out = refs + (size_t)b * REF_WORDS;
        const unsigned long long mb = masks[b];
        unsigned flags = 0;
        unsigned n_refs = 0;
        for (int base = t0; base < t1; base += 32) {
            const int a = base + lane;
            const bool hit = a < t1 && qualifies(bt, f, pd, masks, a, b, hb0, hb1, mb);
            bool long_ref = false;
            if (hit) {
                int ha0, ha1;
                hit_range(bt, a, ha0, ha1);
                long_ref = ha1 - ha0 > short_max;
            }
            if (__any_sync(FULL_MASK, long_ref)) {
                flags = REF_LONG;
                break;
            }
            const unsigned votes = __ballot_sync(FULL_MASK, hit);
            const unsigned n = (unsigned)__popc(votes);
            if (n_refs + n > REF_MAX) {
                flags = REF_OVERFLOW;
                break;
            }
            if (hit) {
                out[1 + n_refs + (unsigned)__popc(votes & ((1u << lane) - 1u))] = (unsigned)a;
            }
            n_refs += n;
        }
        if (lane == 0) {
            out[0] = flags | n_refs;
        }
    }
}

// Whether short track b of an event walked in order is a clone, given every track before it
// marked already: the CPU's test of every reference a with its mark at b's turn. Step 3
// sets the marks of tracks with a long reference ahead of their turn, so a mark counts only
// for a track before b (at b's turn on the CPU, no track after it is marked).
__device__ __forceinline__ bool marked_before(const volatile unsigned* marks, int a, int b) {
    return a < b && marks[a] != 0;
}

// Step 3, a warp per event: the marks in the order of acceptance. The warp reads the step-2
// words of 32 tracks at once; tracks with a long reference are clones, and marked at once;
// then the lanes whose short tracks have short references only take their turns in order:
// a clone when one of its references is not marked before it; with more references than
// step 2 kept, the lanes test every track of the event again (qualifies) and vote. No
// atomics; the result does not depend on scheduling.
extern "C" __global__ void ca_clones(CLONE_ARGS) {
    const int ev = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (ev >= n_events) {
        return;
    }
    const int short_max = pi[PI_SHORT_MAX];
    const int n_planes = pi[PI_N_PLANES];
    if (short_max < 0 || n_planes < 1) {
        return;
    }
    const Batch bt = batch_of(track_hit_start, n_tracks, hit_plane, hit_x, hit_y, n_hits, fits,
                              plane_z, n_planes);
    const CloneField f = field_of(pi, pd, nodes);
    int t0, t1;
    event_range(event_start, ev, n_tracks, t0, t1);
    const volatile unsigned* seen = marks;
    for (int base = t0; base < t1; base += 32) {
        const int b = base + lane;
        // Zero for a long track (never a clone) and for a short one without references.
        const unsigned word = b < t1 ? refs[(size_t)b * REF_WORDS] : 0u;
        if ((word & REF_LONG) != 0) {
            marks[b] = 1;
        }
        __syncwarp();
        // The lanes with a turn to take, in order.
        unsigned turns = __ballot_sync(FULL_MASK, (word & REF_LONG) == 0 && word != 0);
        while (turns != 0) {
            const int l = __ffs((int)turns) - 1;
            turns &= turns - 1;
            const int tb = base + l;
            const unsigned tw = __shfl_sync(FULL_MASK, word, l);
            bool clone = false;
            if ((tw & REF_OVERFLOW) != 0) {
                int tb0, tb1;
                hit_range(bt, tb, tb0, tb1);
                const unsigned long long mb = masks[tb];
                for (int a0 = t0; a0 < t1 && !clone; a0 += 32) {
                    const int a = a0 + lane;
                    const bool hit = a < t1 && !marked_before(seen, a, tb) &&
                                     qualifies(bt, f, pd, masks, a, tb, tb0, tb1, mb);
                    clone = __any_sync(FULL_MASK, hit);
                }
            } else {
                const unsigned n = tw & REF_COUNT;
                const unsigned* r = refs + (size_t)tb * REF_WORDS + 1;
                bool free_ref = false;
                if ((unsigned)lane < n) {
                    free_ref = !marked_before(seen, (int)r[lane], tb);
                }
                clone = __any_sync(FULL_MASK, free_ref);
            }
            if (clone && lane == 0) {
                marks[tb] = 1;
            }
            // The mark is seen by every lane before the next turn.
            __syncwarp();
        }
    }
}
