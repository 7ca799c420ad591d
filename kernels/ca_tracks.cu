// The tracks out (what Reconstructor::write_tracks reads): every event's accepted tracks,
// in acceptance order, packed one event after the other into three arrays that go to the
// host in one copy each: per track its first hit in the packed hits and its length, its
// fit (FIT_WORDS words), and the hits themselves (the event's input indices, upstream
// first). ca_tracks_count totals each event's tracks and hits; ca_event_budget (with the
// arenas' own sizes as capacity: the accepted tracks of an event are some of its
// candidates, so nothing can overflow) places the events; ca_tracks_pack copies, a row of
// blocks per event, each track's hits at its place from a block scan of the lengths.

// Candidate records (ca_candidates.cu): start in the event's candidate hits, length,
// chi2 bits, ndf.
extern "C" __global__ void ca_tracks_count(const u32* __restrict__ failed,
                                           const u32* __restrict__ n_accepted,
                                           const u32* __restrict__ accepted,
                                           const uint4* __restrict__ cand, u32 share_c,
                                           u32* __restrict__ n_tracks,
                                           u32* __restrict__ n_hits) {
    int e = blockIdx.y;
    u32 na = failed[e] ? 0u : n_accepted[e];
    const u32* acc = accepted + (size_t)e * share_c;
    const uint4* cd = cand + (size_t)e * share_c;
    u32 sum = 0;
    for (u32 k = threadIdx.x; k < na; k += CA_THREADS) sum += cd[acc[k]].y;
    u32 total;
    block_scan_inclusive(sum, &total);
    if (threadIdx.x == 0) {
        n_tracks[e] = na;
        n_hits[e] = total;
    }
}

extern "C" __global__ void ca_tracks_pack(const u32* __restrict__ failed,
                                          const u32* __restrict__ n_accepted,
                                          const u32* __restrict__ accepted,
                                          const uint4* __restrict__ cand,
                                          const u32* __restrict__ cand_hits,
                                          const u32* __restrict__ fits, u32 share_c,
                                          u32 share_h, const u32* __restrict__ trk_base,
                                          const u32* __restrict__ hit_base,
                                          uint2* __restrict__ out_tracks,
                                          u32* __restrict__ out_fits,
                                          u32* __restrict__ out_hits, int refit,
                                          const float* __restrict__ in_x,
                                          const float* __restrict__ in_y,
                                          const u32* __restrict__ in_plane,
                                          const u32* __restrict__ hit_start,
                                          const float* __restrict__ rows32,
                                          const double* __restrict__ rows64,
                                          const int* __restrict__ gap_steps,
                                          const int* __restrict__ gap_kind,
                                          const int* __restrict__ gap_slice,
                                          const float* __restrict__ slices,
                                          const float* __restrict__ pf,
                                          const double* __restrict__ pd,
                                          const int* __restrict__ pi,
                                          const float* __restrict__ nodes) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 na = n_accepted[e];
    const u32* acc = accepted + (size_t)e * share_c;
    const uint4* cd = cand + (size_t)e * share_c;
    const u32* ch = cand_hits + (size_t)e * share_h;
    const u32* fw = fits + (size_t)e * share_c * FIT_WORDS;
    u32 tb = trk_base[e];
    // The event's tracks in tiles of CA_THREADS, the tiles over the event's blocks; a
    // tile's first hit is the event's hit base plus the lengths of the tracks before it,
    // which its block sums itself.
    for (u32 c0 = blockIdx.x * CA_THREADS; c0 < na; c0 += gridDim.x * CA_THREADS) {
        u32 before = 0;
        for (u32 k = threadIdx.x; k < c0; k += CA_THREADS) before += cd[acc[k]].y;
        u32 carry;
        block_scan_inclusive(before, &carry);
        carry += hit_base[e];
        u32 k = c0 + threadIdx.x;
        uint4 c = make_uint4(0, 0, 0, 0);
        u32 cidx = 0;
        if (k < na) {
            cidx = acc[k];
            c = cd[cidx];
        }
        u32 chunk;
        u32 at = carry + block_scan_inclusive(c.y, &chunk) - c.y;
        if (k < na) {
            out_tracks[tb + k] = make_uint2(at, c.y);
            for (u32 i = 0; i < c.y; i++) out_hits[at + i] = ch[c.x + i];
            u32* o = out_fits + (size_t)(tb + k) * FIT_WORDS;
            if (refit) {
                // The accepted track fitted again with the track fit's parameters
                // (candidates::refit_accepted), in the candidates' layout: in full
                // (refit 1), or from the candidate's fit as its first fit (refit 2).
                const KalmanTables T = {rows32, rows64, gap_steps, gap_kind, gap_slice,
                                        slices, pf,     pd,        pi,       nodes};
                const u32 hs = hit_start[e];
                CandHits h;
                h.idx = ch + c.x;
                h.hx = in_x + hs;
                h.hy = in_y + hs;
                h.hp = in_plane + hs;
                KalmanResult r;
                if (refit == 2) {
                    load_fit(fw + (size_t)cidx * FIT_WORDS, r);
                    kalman_fit_at_prefit(h, (int)c.y, MAX_CHAIN, T, r);
                } else {
                    kalman_fit_track(h, (int)c.y, MAX_CHAIN, T, r);
                }
                store_fit(r, o);
            } else {
                for (int w = 0; w < FIT_WORDS; w++) o[w] = fw[(size_t)cidx * FIT_WORDS + w];
            }
        }
    }
}

// The packed tracks in the layout of the clone step (kernels/ca_clones.cu): per event its
// first track, per track its first hit, per hit its plane and position (from the event's
// input hits), per track its fit in double precision (z, state, covariance: the fit's
// single-precision values, exact in double, as the CPU's FitOutput holds them). A row of
// blocks per event; the last event's first block writes the closing offsets.
#define CLONE_FIT_WORDS 21
extern "C" __global__ void ca_tracks_clone_input(u32 n_events, const u32* __restrict__ failed,
                                                 const u32* __restrict__ trk_n,
                                                 const u32* __restrict__ trk_base,
                                                 const u32* __restrict__ trk_hits,
                                                 const u32* __restrict__ trk_hit_base,
                                                 const u32* __restrict__ hit_start,
                                                 const float* __restrict__ in_x,
                                                 const float* __restrict__ in_y,
                                                 const u32* __restrict__ in_plane,
                                                 const uint2* __restrict__ out_tracks,
                                                 const u32* __restrict__ out_fits,
                                                 const u32* __restrict__ out_hits,
                                                 u32* __restrict__ event_start,
                                                 u32* __restrict__ track_hit_start,
                                                 u32* __restrict__ hit_plane,
                                                 float* __restrict__ hit_x,
                                                 float* __restrict__ hit_y,
                                                 double* __restrict__ fits) {
    u32 e = blockIdx.y;
    u32 tb = trk_base[e], nt = failed[e] ? 0u : trk_n[e];
    u32 hb = trk_hit_base[e], nh = failed[e] ? 0u : trk_hits[e];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        event_start[e] = tb;
        if (e + 1 == n_events) {
            event_start[n_events] = tb + nt;
            track_hit_start[tb + nt] = hb + nh;
        }
    }
    u32 s = hit_start[e];
    for (u32 k = CA_FIRST; k < nt; k += CA_STRIDE) {
        u32 t = tb + k;
        track_hit_start[t] = out_tracks[t].x;
        const u32* w = out_fits + (size_t)t * FIT_WORDS;
        double* f = fits + (size_t)t * CLONE_FIT_WORDS;
        f[0] = (double)__uint_as_float(w[20]);
        for (int i = 0; i < 20; i++) f[1 + i] = (double)__uint_as_float(w[i]);
    }
    for (u32 i = CA_FIRST; i < nh; i += CA_STRIDE) {
        u32 h = s + out_hits[hb + i];
        hit_plane[hb + i] = in_plane[h];
        hit_x[hb + i] = in_x[h];
        hit_y[hb + i] = in_y[h];
    }
}
