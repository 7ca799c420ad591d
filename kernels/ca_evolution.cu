// Evolution of the cellular automaton (src/tracking/ca/evolution.rs): a triplet's level is
// 1 + the highest level of its left neighbours. Every left neighbour of a triplet starts
// one plane further upstream, so one launch per plane, upstream first, each setting the
// levels of the triplets that start on that plane from levels already final, gives the
// CPU's fixed point exactly, with no iteration to convergence and no race.

extern "C" __global__ void ca_evolution(const u32* __restrict__ trip_base,
                                        const u32* __restrict__ trip_n,
                                        const u32* __restrict__ tplane,
                                        const u32* __restrict__ nb_count,
                                        const u32* __restrict__ nb_off,
                                        const u32* __restrict__ nb_base,
                                        const u32* __restrict__ left,
                                        const u32* __restrict__ failed, u32 plane,
                                        u32* __restrict__ level) {
    int e = blockIdx.y;
    if (failed[e]) return;
    u32 tbase = trip_base[e], n_t = trip_n[e], nbase = nb_base[e];
    for (u32 t = CA_FIRST; t < n_t; t += CA_STRIDE) {
        u32 T = tbase + t;
        if (TPLANE_FIRST(tplane[T]) != plane) continue;
        u32 k0 = nbase + nb_off[T], k1 = k0 + nb_count[T];
        u32 best = 0;
        for (u32 k = k0; k < k1; k++) {
            u32 l = level[tbase + left[k]];
            best = l > best ? l : best;
        }
        level[T] = best + 1;
    }
}
