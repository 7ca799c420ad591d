//! Neighbours: triplet `(a, b, c)` is a left neighbour of triplet `(b, c, d)` when they
//! share the doublet `(b, c)` (two hits) and their curvatures agree within their
//! resolutions (chi-square of the q/p difference below `neighbour_chi2_max`). Without a
//! field sharing the doublet is the whole condition: both kinks were already checked.

use super::cuts::FinderConfig;
use super::CaBuffers;

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
            let tl = buf.triplets[t1];
            let var = (tl.qop_sigma as f64).powi(2) + (tr.qop_sigma as f64).powi(2);
            let dq = tl.qop as f64 - tr.qop as f64;
            if var > 0.0 && dq * dq > cfg.neighbour_chi2_max * var {
                continue;
            }
            if buf.left.len() == cfg.limits.max_neighbours {
                buf.overflow.neighbours += 1;
                continue;
            }
            buf.left.push(t1 as u32);
            buf.has_right[t1] = true;
        }
    }
    buf.left_start[n_triplets] = buf.left.len() as u32;
}
