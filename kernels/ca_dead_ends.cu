// Dead ends of the first pass (src/tracking/ca/triplets.rs, prune_dead_ends): a triplet is
// kept when its chain can reach the last plane or leave the detector: its right doublet
// ends on the last plane, or some kept triplet continues it (has it as its left doublet),
// or it ends on a plane from `first_end_plane` on where the extrapolation of the right
// doublet leaves the plane (FinderGeometry::may_leave, same f32 operations). A triplet
// continuing another ends on a later plane, so one launch per plane of the right
// doublet's last hit, downstream first, decides from marks already final; the marks
// `continues[left doublet] = 1` of one launch are read only by later launches. Then a
// per-event scan of the marks (ca_event_scan) and a gather keep the triplets in their
// order, as the CPU's `retain`.

// Clears the marks of the event's doublets before the first launch of ca_dead_ends.
extern "C" __global__ void ca_dead_ends_clear(const u32* __restrict__ dbl_base,
                                              const u32* __restrict__ dbl_n,
                                              const u32* __restrict__ failed,
                                              u32* __restrict__ continues) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 dbase = dbl_base[e], n_d = dbl_n[e];
    for (u32 d = CA_FIRST; d < n_d; d += CA_STRIDE) continues[dbase + d] = 0u;
}

extern "C" __global__ void ca_dead_ends(const float* __restrict__ sx, const float* __restrict__ sy,
                                        const u32* __restrict__ hit_start,
                                        const u32* __restrict__ dbl_base,
                                        const uint4* __restrict__ dbl,
                                        const u32* __restrict__ trip_base,
                                        const u32* __restrict__ trip_n,
                                        const u32* __restrict__ tleft,
                                        const u32* __restrict__ tright,
                                        const u32* __restrict__ tplane,
                                        const float* __restrict__ exits, int n_planes,
                                        u32 first_end_plane, const u32* __restrict__ failed,
                                        u32 plane, u32* __restrict__ continues,
                                        u32* __restrict__ keep) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 s = hit_start[e], dbase = dbl_base[e], tbase = trip_base[e], n_t = trip_n[e];
    u32 last = n_planes > 0 ? (u32)(n_planes - 1) : 0u;
    for (u32 t = CA_FIRST; t < n_t; t += CA_STRIDE) {
        u32 T = tbase + t;
        // The plane of the right doublet's second hit, kept with the triplet: the
        // triplets ending elsewhere read nothing more.
        u32 p = TPLANE_LAST(tplane[T]);
        if (p != plane) continue;
        const u32 R = dbase + tright[T];
        bool live = p == last || continues[R] != 0u;
        if (!live && p >= first_end_plane) {
            if (p + 1 >= (u32)n_planes) {
                live = true;
            } else {
                // The right doublet's record only where its exit is tested.
                const uint4 r = dbl[R];
                const u32 c = r.y;
                const float* ex = exits + 3 * p;
                float tx = __uint_as_float(r.z), ty = __uint_as_float(r.w);
                float x = sx[s + c], y = sy[s + c];
                // Negated so that a NaN counts as leaving.
                live = !(fabsf(x + ex[0] * tx) <= ex[1] && fabsf(y + ex[0] * ty) <= ex[2]);
            }
        }
        keep[T] = live ? 1u : 0u;
        if (live) continues[dbase + tleft[T]] = 1u;
    }
}

// The kept triplets of each event to the front of its range, in order (`koff`: the
// per-event exclusive scan of `keep`), through the second set of arrays; `trip_n` becomes
// the kept count (`total`, from the scan) after ca_dead_ends_copy_back.
extern "C" __global__ void ca_dead_ends_gather(const u32* __restrict__ trip_base,
                                               const u32* __restrict__ trip_n,
                                               const u32* __restrict__ failed,
                                               const u32* __restrict__ keep,
                                               const u32* __restrict__ koff,
                                               const u32* __restrict__ tleft,
                                               const u32* __restrict__ tright,
                                               const float* __restrict__ tqop,
                                               const float* __restrict__ tsigma,
                                               const float* __restrict__ tchi2,
                                               const u32* __restrict__ tplane,
                                               u32* __restrict__ o_left, u32* __restrict__ o_right,
                                               float* __restrict__ o_qop,
                                               float* __restrict__ o_sigma,
                                               float* __restrict__ o_chi2,
                                               u32* __restrict__ o_plane) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 tbase = trip_base[e], n_t = trip_n[e];
    for (u32 t = CA_FIRST; t < n_t; t += CA_STRIDE) {
        u32 T = tbase + t;
        if (!keep[T]) continue;
        u32 O = tbase + koff[T];
        o_left[O] = tleft[T];
        o_right[O] = tright[T];
        o_qop[O] = tqop[T];
        o_sigma[O] = tsigma[T];
        o_chi2[O] = tchi2[T];
        o_plane[O] = tplane[T];
    }
}

extern "C" __global__ void ca_dead_ends_copy_back(const u32* __restrict__ trip_base,
                                                  u32* __restrict__ trip_n,
                                                  const u32* __restrict__ failed,
                                                  const u32* __restrict__ total,
                                                  const u32* __restrict__ o_left,
                                                  const u32* __restrict__ o_right,
                                                  const float* __restrict__ o_qop,
                                                  const float* __restrict__ o_sigma,
                                                  const float* __restrict__ o_chi2,
                                                  const u32* __restrict__ o_plane,
                                                  u32* __restrict__ tleft, u32* __restrict__ tright,
                                                  float* __restrict__ tqop,
                                                  float* __restrict__ tsigma,
                                                  float* __restrict__ tchi2,
                                                  u32* __restrict__ tplane,
                                                  u32* __restrict__ has_right) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 tbase = trip_base[e], n_k = total[e];
    for (u32 t = CA_FIRST; t < n_k; t += CA_STRIDE) {
        u32 T = tbase + t;
        tleft[T] = o_left[T];
        tright[T] = o_right[T];
        tqop[T] = o_qop[T];
        tsigma[T] = o_sigma[T];
        tchi2[T] = o_chi2[T];
        tplane[T] = o_plane[T];
        has_right[T] = 0u;
    }
    // Every block of the event has read trip_n (the loop bound above is the new count):
    // only block 0's thread 0 writes it, after its own loop, and no block reads it later
    // in this launch.
    if (blockIdx.x == 0 && threadIdx.x == 0) trip_n[e] = n_k;
}
