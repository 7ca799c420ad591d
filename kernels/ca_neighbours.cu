// Neighbours (src/tracking/ca/neighbours.rs): triplet (a, b, c) is a left neighbour of
// (b, c, d) when the first's right doublet is the second's left doublet and their q/p
// agree (neighbours::compatible, in double as the CPU computes it).
//
// The index of triplets by right doublet (the CPU's end_start / ending, a stable counting
// sort): ca_neighbours_ending counts per doublet (write = 0; the counters were cleared by
// the triplet step's count pass), ca_event_scan gives end_off, ca_neighbours_ending (write = 1) drops
// each triplet into its doublet's segment, ca_neighbours_sort_ending orders each segment
// by triplet index (the CPU's order). Then ca_neighbours counts (write = 0) and writes
// (write = 1) each triplet's left neighbours in that order, and marks has_right.

extern "C" __global__ void ca_neighbours_ending(const u32* __restrict__ dbl_base,
                                                const u32* __restrict__ trip_base,
                                                const u32* __restrict__ trip_n,
                                                const u32* __restrict__ tright,
                                                const u32* __restrict__ failed, int write,
                                                u32* __restrict__ end_count,
                                                const u32* __restrict__ end_off,
                                                u32* __restrict__ end_cursor,
                                                u32* __restrict__ ending) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 dbase = dbl_base[e], tbase = trip_base[e], n_t = trip_n[e];
    for (u32 t = CA_FIRST; t < n_t; t += CA_STRIDE) {
        u32 R = dbase + tright[tbase + t];
        if (!write) {
            atomicAdd(&end_count[R], 1u);
        } else {
            u32 slot = end_off[R] + atomicAdd(&end_cursor[R], 1u);
            ending[tbase + slot] = t;
        }
    }
}

extern "C" __global__ void ca_neighbours_sort_ending(const u32* __restrict__ dbl_base,
                                                     const u32* __restrict__ dbl_n,
                                                     const u32* __restrict__ trip_base,
                                                     const u32* __restrict__ failed,
                                                     const u32* __restrict__ end_count,
                                                     const u32* __restrict__ end_off,
                                                     u32* __restrict__ ending) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 dbase = dbl_base[e], n_d = dbl_n[e], tbase = trip_base[e];
    for (u32 d = CA_FIRST; d < n_d; d += CA_STRIDE) {
        u32 n = end_count[dbase + d];
        if (n < 2) continue;
        u32* seg = ending + tbase + end_off[dbase + d];
        for (u32 i = 1; i < n; i++) {
            u32 v = seg[i];
            u32 j = i;
            while (j > 0 && seg[j - 1] > v) {
                seg[j] = seg[j - 1];
                j--;
            }
            seg[j] = v;
        }
    }
}

extern "C" __global__ void ca_neighbours(const u32* __restrict__ dbl_base,
                                         const u32* __restrict__ trip_base,
                                         const u32* __restrict__ trip_n,
                                         const u32* __restrict__ tleft,
                                         const float* __restrict__ tqop,
                                         const float* __restrict__ tsigma,
                                         const u32* __restrict__ end_count,
                                         const u32* __restrict__ end_off,
                                         const u32* __restrict__ ending, double chi2_max,
                                         const u32* __restrict__ failed, int write,
                                         u32* __restrict__ nb_count, const u32* __restrict__ nb_off,
                                         const u32* __restrict__ nb_base, u32* __restrict__ left,
                                         u32* __restrict__ has_right) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 dbase = dbl_base[e], tbase = trip_base[e], n_t = trip_n[e];
    u32 nbase = write ? nb_base[e] : 0;
    for (u32 t2 = CA_FIRST; t2 < n_t; t2 += CA_STRIDE) {
        u32 T2 = tbase + t2;
        if (write && nb_count[T2] == 0) continue;
        u32 D = dbase + tleft[T2];
        u32 k0 = end_off[D], k1 = k0 + end_count[D];
        double q2 = (double)tqop[T2], s2 = (double)tsigma[T2];
        u32 out = write ? nbase + nb_off[T2] : 0;
        u32 found = 0;
        for (u32 k = k0; k < k1; k++) {
            u32 t1 = ending[tbase + k];
            double s1 = (double)tsigma[tbase + t1];
            double var = s1 * s1 + s2 * s2;
            double dq = (double)tqop[tbase + t1] - q2;
            if (var > 0.0 && dq * dq > chi2_max * var) continue;
            if (write) {
                left[out + found] = t1;
                has_right[tbase + t1] = 1u;
            }
            found++;
        }
        if (!write) nb_count[T2] = found;
    }
}
