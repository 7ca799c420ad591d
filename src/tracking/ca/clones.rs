//! Clone suppression: with each hit used once, a particle can still give two tracks when
//! its chain breaks (two missing planes in a row, a kink): a short track on planes the
//! other does not use, lying on the other's trajectory. Each short track (at most
//! `n_planes - 3` hits) is compared with the longer accepted tracks: when all its hits lie
//! within `clone_window_mm` of a longer track's fitted trajectory (Runge-Kutta through the
//! field), it is a clone and dropped. Ghosts (random combinations) are removed earlier by
//! the triplet, neighbour and fit chi-square cuts and `min_hits`.

use super::{CaBuffers, FinderGeometry};
use crate::tracking::propagate::propagate;
use crate::tracking::reco::FinderConfig;

/// Removes clones from `buf.accepted`; returns how many were removed.
pub fn suppress_clones(geo: &FinderGeometry, cfg: &FinderConfig, buf: &mut CaBuffers) -> usize {
    let n_planes = geo.planes.len();
    if n_planes < 4 {
        return 0;
    }
    let short_max = n_planes - 3;
    let n = buf.accepted.len();
    let mut removed = 0;
    // Mark clones by setting their entry to u32::MAX, then compact.
    for ib in 0..n {
        let kb = buf.accepted[ib];
        let cb = buf.candidates[kb as usize];
        if cb.len as usize > short_max {
            continue;
        }
        let hits_b = &buf.candidate_hits[cb.start as usize..cb.start as usize + cb.len as usize];
        for ia in 0..n {
            let ka = buf.accepted[ia];
            if ia == ib || ka == u32::MAX {
                continue;
            }
            let ca = buf.candidates[ka as usize];
            if ca.len < cb.len {
                continue;
            }
            let hits_a =
                &buf.candidate_hits[ca.start as usize..ca.start as usize + ca.len as usize];
            // Planes must be disjoint.
            if hits_b.iter().any(|&hb| {
                hits_a
                    .iter()
                    .any(|&ha| buf.hits.plane[ha as usize] == buf.hits.plane[hb as usize])
            }) {
                continue;
            }
            let fa = &buf.fits[ca.fit as usize];
            // Quick slope pre-check on the first hit of b (straight line).
            let hb0 = hits_b[0] as usize;
            let zb0 = geo.planes[buf.hits.plane[hb0] as usize].z_mm;
            let dz = zb0 - fa.z_mm;
            let y_lin = fa.state[1] + fa.state[3] * dz;
            if (y_lin - buf.hits.y_mm[hb0] as f64).abs()
                > 10.0 * cfg.clone_window_mm + 0.05 * dz.abs()
            {
                continue;
            }
            let mut all_close = true;
            let mut z = fa.z_mm;
            let mut s = fa.state;
            for &hb in hits_b {
                let hb = hb as usize;
                let zt = geo.planes[buf.hits.plane[hb] as usize].z_mm;
                let (s2, _) = propagate(&geo.field, z, s, zt, cfg.fit.max_step_mm);
                z = zt;
                s = s2;
                if (s[0] - buf.hits.x_mm[hb] as f64).abs() > cfg.clone_window_mm
                    || (s[1] - buf.hits.y_mm[hb] as f64).abs() > cfg.clone_window_mm
                {
                    all_close = false;
                    break;
                }
            }
            if all_close {
                buf.accepted[ib] = u32::MAX;
                removed += 1;
                break;
            }
        }
    }
    buf.accepted.retain(|&k| k != u32::MAX);
    removed
}
