//! Doublets: pairs of hits on planes `i` and `i + 1` (and `i + 2` when a plane may be
//! missing), kept when the pair's slopes lie inside the detector's slope limits and its
//! straight extrapolation points back to the origin region within a window made of
//! (a) the origin's half size, (b) the bending of a track at the minimum momentum,
//! (c) `n_sigma` times the multiple scattering of the planes up to `i` at that momentum
//! (with the slope factor of the direction the hit is seen from the origin) and
//! (d) `n_sigma` times the hit resolution propagated to the origin. Hits already used by a
//! track (in an earlier pass) are left out.

use super::hit_sorting::for_each_range;
use super::{slope_factor, CaBuffers, Doublet, FinderGeometry};
use crate::tracking::reco::FinderConfig;

/// Fills `buf.doublets` and `buf.dbl_start` (per sorted hit, its outgoing doublets) with the
/// pairs of hits not yet used by a track, on planes at most `reach` apart (1: consecutive
/// planes only; 2: also skipping one).
pub fn find_doublets(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    let n_planes = geo.planes.len();
    let n_hits = buf.hits.x_mm.len();
    buf.doublets.clear();
    buf.dbl_start.clear();
    buf.dbl_start.resize(n_hits + 1, 0);
    let max_doublets = cfg.limits.max_doublets;
    let sh = &buf.hits;
    let reach = reach.max(1);
    for i in 0..n_planes {
        let gi = &geo.planes[i];
        let first = sh.bin_start[gi.bin_offset] as usize;
        let end = sh.bin_start[gi.bin_offset + gi.bins_x * gi.bins_y] as usize;
        let lever_a = gi.z_mm - cfg.origin_z_mm;
        let pointing =
            lever_a > 1.0 && cfg.origin_half_x_mm.is_finite() && cfg.origin_half_y_mm.is_finite();
        let inv_lever_a = 1.0 / lever_a;
        // Per target plane: dz, 1 / dz, the bending lever and the resolution terms.
        let mut target = [(0usize, 0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64); 2];
        let mut n_target = 0;
        for j in (i + 1)..(i + 1 + reach.min(2)).min(n_planes) {
            let gj = &geo.planes[j];
            let dz = gj.z_mm - gi.z_mm;
            if dz <= 0.0 {
                continue;
            }
            let lever_b = gj.z_mm - cfg.origin_z_mm;
            let meas = |vi: f64, vj: f64| {
                cfg.n_sigma * ((vi * lever_b * lever_b + vj * lever_a * lever_a).sqrt() / dz)
            };
            target[n_target] = (
                j,
                dz,
                1.0 / dz,
                0.5 * lever_a * lever_b,
                meas(gi.var_x, gj.var_x),
                meas(gi.var_y, gj.var_y),
            );
            n_target += 1;
        }
        for a in first..end {
            buf.dbl_start[a] = buf.doublets.len() as u32;
            if sh.used[a] {
                continue;
            }
            let xa = sh.x_mm[a] as f64;
            let ya = sh.y_mm[a] as f64;
            // Curvature bound for the direction this hit is seen from the origin (the
            // configured bound is for the largest slopes).
            let (kx, ky, sf) = if pointing {
                let (tx, ty) = (
                    (xa * inv_lever_a).abs() + 0.05,
                    (ya * inv_lever_a).abs() + 0.05,
                );
                let (tx, ty) = (tx.min(cfg.max_tx), ty.min(cfg.max_ty));
                let (cx, cy) = geo.curvature_bound(tx, ty, cfg);
                (
                    cx.min(cfg.max_curvature_x_per_mm),
                    cy.min(cfg.max_curvature_y_per_mm),
                    slope_factor(tx, ty).min(cfg.slope_factor),
                )
            } else {
                (
                    cfg.max_curvature_x_per_mm,
                    cfg.max_curvature_y_per_mm,
                    cfg.slope_factor,
                )
            };
            for &(j, dz, inv_dz, bend, meas_x, meas_y) in &target[..n_target] {
                let (mut tx0, mut tx1) = (-cfg.max_tx, cfg.max_tx);
                let (mut ty0, mut ty1) = (-cfg.max_ty, cfg.max_ty);
                if pointing {
                    let ms = cfg.n_sigma * gi.ms_origin_mm * sf;
                    let wx = cfg.origin_half_x_mm + bend * kx + ms + meas_x;
                    let wy = cfg.origin_half_y_mm + bend * ky + ms + meas_y;
                    tx0 = tx0.max((xa - wx) * inv_lever_a);
                    tx1 = tx1.min((xa + wx) * inv_lever_a);
                    ty0 = ty0.max((ya - wy) * inv_lever_a);
                    ty1 = ty1.min((ya + wy) * inv_lever_a);
                }
                if tx0 > tx1 || ty0 > ty1 {
                    continue;
                }
                let (x0, x1) = ((xa + dz * tx0) as f32, (xa + dz * tx1) as f32);
                let (y0, y1) = ((ya + dz * ty0) as f32, (ya + dz * ty1) as f32);
                let doublets = &mut buf.doublets;
                let overflow = &mut buf.overflow;
                for_each_range(geo, &sh.bin_start, &sh.x_mm, j, x0, x1, y0, y1, |s, e| {
                    // The range holds the hits with x in [x0, x1] (the slope window in x):
                    // only y is left to check, on the f32 coordinates, before any slope.
                    let ys = &sh.y_mm[s..e];
                    for (k, &yb) in ys.iter().enumerate() {
                        if yb < y0 || yb > y1 {
                            continue;
                        }
                        let b = s + k;
                        if sh.used[b] {
                            continue;
                        }
                        let tx = (sh.x_mm[b] as f64 - xa) * inv_dz;
                        let ty = (yb as f64 - ya) * inv_dz;
                        if doublets.len() == max_doublets {
                            overflow.doublets += 1;
                            continue;
                        }
                        doublets.push(Doublet {
                            a: a as u32,
                            b: b as u32,
                            tx: tx as f32,
                            ty: ty as f32,
                        });
                    }
                });
            }
        }
    }
    // Hits past the last processed one (none: every hit belongs to a plane) and the end.
    let total = buf.doublets.len() as u32;
    let last_plane_end = geo
        .planes
        .last()
        .map(|g| sh.bin_start[g.bin_offset + g.bins_x * g.bins_y] as usize)
        .unwrap_or(0);
    for h in last_plane_end..=n_hits {
        buf.dbl_start[h] = total;
    }
    // Each hit's outgoing doublets by increasing slope tx, so the triplet step finds the
    // continuations of a doublet by binary search.
    for h in 0..n_hits {
        let (s, e) = (buf.dbl_start[h] as usize, buf.dbl_start[h + 1] as usize);
        if e - s > 1 {
            buf.doublets[s..e].sort_unstable_by(|p, q| p.tx.total_cmp(&q.tx));
        }
    }
    buf.dbl_tx.clear();
    buf.dbl_tx.extend(buf.doublets.iter().map(|d| d.tx));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HitRecord;
    use crate::tracking::ca::hit_sorting::sort_hits;
    use crate::tracking::reco::synthetic::{detector, track};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Doublets of an event as input hit pairs with their slopes, for a grid of
    /// `bins_x` x `bins_y` cells per plane.
    fn doublets(
        hits: &[HitRecord],
        bins: (usize, usize),
        reach: usize,
    ) -> Vec<(u32, u32, f32, f32)> {
        let det = detector(5, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        (cfg.bins_x, cfg.bins_y) = bins;
        let geo = FinderGeometry::new(&det, &cfg);
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
        find_doublets(&geo, &cfg, reach, &mut buf);
        let ii = &buf.hits.input_index;
        // Per hit, outgoing doublets by increasing slope tx.
        for h in 0..buf.hits.x_mm.len() {
            let (s, e) = (buf.dbl_start[h] as usize, buf.dbl_start[h + 1] as usize);
            assert!(buf.doublets[s..e].iter().all(|d| d.a as usize == h));
            assert!(buf.dbl_tx[s..e].windows(2).all(|w| w[0] <= w[1]));
        }
        let mut out: Vec<_> = buf
            .doublets
            .iter()
            .map(|d| (ii[d.a as usize], ii[d.b as usize], d.tx, d.ty))
            .collect();
        out.sort_by_key(|d| (d.0, d.1));
        out
    }

    #[test]
    fn doublets_do_not_depend_on_the_grid_and_hold_every_track_segment() {
        let det = detector(5, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut hits = Vec::new();
        let mut segments = Vec::new();
        for _ in 0..150 {
            let q = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let p = rng.random_range(1.2..20.0);
            let start = [
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.2..0.2),
                rng.random_range(-0.2..0.2),
                q / p,
            ];
            let (ids, _) = track(&det, start, true, true, &mut rng, &mut hits);
            segments.extend(ids.windows(2).map(|w| (w[0], w[1])));
        }
        // Noise hits fill the planes.
        for i in 0..2000 {
            hits.push(HitRecord {
                x_mm: rng.random_range(-150.0..150.0),
                y_mm: rng.random_range(-150.0..150.0),
                z_mm: 0.0,
                plane: (i % 5) as u16,
                hit_id: hits.len() as u32,
            });
        }
        for reach in [1, 2] {
            // One cell per plane: every hit of the plane is a candidate of every window.
            let all = doublets(&hits, (1, 1), reach);
            assert!(all.len() > segments.len());
            for bins in [(8, 128), (2, 512), (16, 16)] {
                assert_eq!(doublets(&hits, bins, reach), all, "bins {bins:?}");
            }
            let pairs: Vec<(u32, u32)> = all.iter().map(|d| (d.0, d.1)).collect();
            let missing = segments
                .iter()
                .filter(|s| pairs.binary_search(s).is_err())
                .count();
            assert_eq!(missing, 0, "reach {reach}");
            // Slopes are those of the two hits.
            for &(a, b, tx, ty) in &all {
                let (ha, hb) = (&hits[a as usize], &hits[b as usize]);
                let dz = 100.0 * (hb.plane - ha.plane) as f32;
                assert!((tx - (hb.x_mm - ha.x_mm) / dz).abs() < 1e-5);
                assert!((ty - (hb.y_mm - ha.y_mm) / dz).abs() < 1e-5);
                assert!(hb.plane > ha.plane && hb.plane - ha.plane <= reach as u16);
            }
        }
    }
}
