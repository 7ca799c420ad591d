//! Evolution of the cellular automaton: every triplet starts at level 1; a triplet's level
//! becomes 1 + the highest level of its left neighbours, iterated until nothing changes.
//! Triplets are stored by increasing plane of their first hit, so the sweep in storage
//! order reaches the fixed point in one pass and a second confirms it; the number of
//! sweeps is bounded by the number of planes (the GPU iterates the same rule in parallel).

use super::CaBuffers;

/// Fills `buf.level`; returns the number of sweeps made.
pub fn evolve(buf: &mut CaBuffers, n_planes: usize) -> usize {
    let n = buf.triplets.len();
    buf.level.clear();
    buf.level.resize(n, 1);
    let max_sweeps = n_planes.max(1) + 1;
    let mut sweeps = 0;
    loop {
        sweeps += 1;
        let mut changed = false;
        for t in 0..n {
            let (s, e) = (buf.left_start[t] as usize, buf.left_start[t + 1] as usize);
            let mut best = 0u16;
            for &l in &buf.left[s..e] {
                best = best.max(buf.level[l as usize]);
            }
            let lv = best.saturating_add(1);
            if lv != buf.level[t] {
                buf.level[t] = lv;
                changed = true;
            }
        }
        if !changed || sweeps >= max_sweeps {
            return sweeps;
        }
    }
}
