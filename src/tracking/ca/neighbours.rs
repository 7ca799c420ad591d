//! Neighbours: triplet `(a, b, c)` is a left neighbour of triplet `(b, c, d)` when they
//! share the doublet `(b, c)` (two hits) and their curvatures agree within their
//! resolutions (chi-square of the q/p difference below `neighbour_chi2_max`). Without a
//! field sharing the doublet is the whole condition: both kinks were already checked.

use super::cuts::FinderConfig;
use super::{CaBuffers, Triplet};

/// Whether triplet `left` `(a, b, c)` may be the left neighbour of `right` `(b, c, d)`
/// (sharing the doublet is the caller's): their q/p agree within `neighbour_chi2_max`
/// of the variance of the difference (always, where neither measured q/p).
#[inline]
pub fn compatible(cfg: &FinderConfig, left: &Triplet, right: &Triplet) -> bool {
    let var = (left.qop_sigma as f64).powi(2) + (right.qop_sigma as f64).powi(2);
    let dq = left.qop as f64 - right.qop as f64;
    !(var > 0.0 && dq * dq > cfg.neighbour_chi2_max * var)
}

/// Fills `buf.left_start` / `buf.left` (left neighbours per triplet) and `buf.has_right`.
pub fn find_neighbours(cfg: &FinderConfig, buf: &mut CaBuffers) {
    let n_doublets = buf.doublets.len();
    let n_triplets = buf.triplets.len();
    // Index of triplets by their right doublet (counting sort).
    buf.end_start.clear();
    buf.end_start.resize(n_doublets + 1, 0);
    for t in &buf.triplets {
        buf.end_start[t.right as usize + 1] += 1;
    }
    for d in 0..n_doublets {
        buf.end_start[d + 1] += buf.end_start[d];
    }
    buf.ending.clear();
    buf.ending.resize(n_triplets, 0);
    {
        let cursor = &mut buf.scratch_u32;
        cursor.clear();
        cursor.extend_from_slice(&buf.end_start[..n_doublets]);
        for (i, t) in buf.triplets.iter().enumerate() {
            let slot = &mut cursor[t.right as usize];
            buf.ending[*slot as usize] = i as u32;
            *slot += 1;
        }
    }
    buf.left_start.clear();
    buf.left_start.resize(n_triplets + 1, 0);
    buf.left.clear();
    buf.has_right.clear();
    buf.has_right.resize(n_triplets, false);
    for t2 in 0..n_triplets {
        buf.left_start[t2] = buf.left.len() as u32;
        let tr = buf.triplets[t2];
        let d = tr.left as usize;
        for k in buf.end_start[d]..buf.end_start[d + 1] {
            let t1 = buf.ending[k as usize] as usize;
            if !compatible(cfg, &buf.triplets[t1], &tr) {
                continue;
            }
            if buf.left.len() == cfg.limits.max_neighbours {
                buf.overflow.neighbours += 1;
                if buf.stop_when_full {
                    buf.left_start[n_triplets] = buf.left.len() as u32;
                    return;
                }
                continue;
            }
            buf.left.push(t1 as u32);
            buf.has_right[t1] = true;
        }
    }
    buf.left_start[n_triplets] = buf.left.len() as u32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::geometry::{Detector, Field, Plane};

    fn triplet(qop: f32, qop_sigma: f32) -> Triplet {
        Triplet {
            qop,
            qop_sigma,
            ..Default::default()
        }
    }

    #[test]
    fn neighbours_agree_in_q_over_p_within_the_cut() {
        let det = Detector {
            planes: (0..6)
                .map(|i| Plane {
                    z_mm: 300.0 + 100.0 * i as f64,
                    half_x_mm: 300.0,
                    half_y_mm: 300.0,
                    sigma_x_mm: 0.01,
                    sigma_y_mm: 0.01,
                    x0_fraction: 0.004,
                    efficiency: 1.0,
                })
                .collect(),
            field: Field::Uniform {
                b_tesla: [0.0, 1.0, 0.0],
            },
        };
        let cfg = FinderConfig::from_detector(&det, 1.0);
        // The difference's error is 0.05 (two errors of 0.0354): `n_sigma` of them, `w`.
        let s = 0.05f32 / 2f32.sqrt();
        let w = cfg.n_sigma as f32 * 0.05;
        assert!(compatible(
            &cfg,
            &triplet(0.5, s),
            &triplet(0.5 - w + 0.01, s)
        ));
        assert!(!compatible(
            &cfg,
            &triplet(0.5, s),
            &triplet(0.5 - w - 0.01, s)
        ));
        assert!(!compatible(
            &cfg,
            &triplet(-0.1, s),
            &triplet(-0.1 + w + 0.01, s)
        ));
        // Neither measured q/p (no field): sharing the doublet is the whole condition.
        assert!(compatible(&cfg, &triplet(0.0, 0.0), &triplet(0.0, 0.0)));
        // One measured: the other's q/p (0) within its error.
        assert!(compatible(
            &cfg,
            &triplet(w - 0.01, 0.05),
            &triplet(0.0, 0.0)
        ));
        assert!(!compatible(
            &cfg,
            &triplet(w + 0.01, 0.05),
            &triplet(0.0, 0.0)
        ));
    }
}
