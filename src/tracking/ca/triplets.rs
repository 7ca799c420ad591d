//! Triplets: two doublets `(a, b)` and `(b, c)` sharing the middle hit.
//!
//! Tracks come from the origin region, so the doublet `(a, b)` and the origin define a
//! parabola whose curvature gives a first q/p estimate; the continuation `(b, c)` must
//! have the slope this parabola predicts, within a window made of the origin's half size
//! (a hard bound) plus `n_sigma` times the Gaussian errors (scattering upstream of `b`, at
//! `b` and at skipped planes, and the hit resolution). The scattering terms use the
//! largest |q/p| the doublet allows (its pointing estimate plus its uncertainty, at most
//! the momentum cut), so stiff doublets get narrow windows.
//!
//! The change of slope at `b` is then split into the part the field explains (the
//! triplet's own curvature estimate q/p, from the bending direction of the equations of
//! motion at `b`) and the rest, the breaking angle, which multiple scattering and the hit
//! resolution must explain: its chi-square is computed at the largest |q/p| both estimates
//! allow and cut at `triplet_chi2_max`; |q/p| must stay below the momentum cut within its
//! resolution.

use super::{CaBuffers, FinderGeometry, Triplet};
use crate::tracking::propagate::{bending, K_GEV_PER_T_MM};
use crate::tracking::reco::FinderConfig;

/// Slope window for `(b, c)` doublets ending on one plane.
#[derive(Clone, Copy, Default)]
struct Window {
    pred_x: f64,
    pred_y: f64,
    wx: f64,
    wy: f64,
}

/// Squared [`super::slope_factor`] (one square root).
#[inline]
fn slope_factor2(tx: f64, ty: f64) -> f64 {
    let t = tx.abs().max(ty.abs());
    let n2 = 1.0 + tx * tx + ty * ty;
    (1.0 + t * t) * n2 * n2.sqrt()
}

/// Fills `buf.triplets` and `buf.trip_start` (per doublet, the triplets it starts); `reach`
/// is the largest plane distance of the doublets (as given to
/// [`super::doublets::find_doublets`]).
pub fn find_triplets(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    let n_doublets = buf.doublets.len();
    let n_planes = geo.planes.len();
    buf.triplets.clear();
    buf.trip_start.clear();
    buf.trip_start.resize(n_doublets + 1, 0);
    let qop_max = cfg.qop_max();
    let ns = cfg.n_sigma;
    let m2 = cfg.fit.mass_gev * cfg.fit.mass_gev;
    let sf2_max = cfg.slope_factor * cfg.slope_factor;
    // `ms_origin_mm` (hence `kappa_var_ms`) is tabulated at this |q/p|.
    let inv_q_table2 = cfg.min_p_gev.max(1e-3).powi(2);
    let uniform = match geo.field {
        crate::tracking::geometry::Field::Uniform { b_tesla } => Some(b_tesla),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    let ms_var = |per_qop2: f64, q: f64| per_qop2 * q * q * (1.0 + m2 * q * q);
    for d1 in 0..n_doublets {
        buf.trip_start[d1] = buf.triplets.len() as u32;
        let l = buf.doublets[d1];
        let b = l.b as usize;
        let (s, e) = (buf.dbl_start[b] as usize, buf.dbl_start[b + 1] as usize);
        if s == e {
            continue;
        }
        let sh = &buf.hits;
        let pa = sh.plane[l.a as usize] as usize;
        let pb = sh.plane[b] as usize;
        let pg = &geo.pairs[pa * n_planes + pb];
        let bf = match uniform {
            Some(v) => v,
            None => geo
                .field
                .at([sh.x_mm[b] as f64, sh.y_mm[b] as f64, geo.planes[pb].z_mm]),
        };
        let (t1x, t1y) = (l.tx as f64, l.ty as f64);
        // Pointing parabola through the origin, a and b: curvature, its hard error from
        // the origin's size and its Gaussian variance (scattering per (q/p)^2, resolution).
        let (kappa_x, kappa_y, hard_kx, hard_ky, kvar_ms, kvar_res) = if pg.pointing {
            let xa = sh.x_mm[l.a as usize] as f64;
            let ya = sh.y_mm[l.a as usize] as f64;
            (
                (t1x - xa * pg.inv_zi) * pg.two_inv_zj,
                (t1y - ya * pg.inv_zi) * pg.two_inv_zj,
                pg.kappa_per_mm * cfg.origin_half_x_mm,
                pg.kappa_per_mm * cfg.origin_half_y_mm,
                pg.kappa_var_ms * inv_q_table2,
                pg.kappa_var_res,
            )
        } else {
            (
                0.0,
                0.0,
                cfg.max_curvature_x_per_mm,
                cfg.max_curvature_y_per_mm,
                0.0,
                0.0,
            )
        };
        // First the widest window this plane triple allows (largest |q/p| and slope
        // factor): most doublets have no continuation inside it and stop here.
        let tri = &geo.triples[(pa * n_planes + pb) * 2..(pa * n_planes + pb) * 2 + 2];
        let n_win = (n_planes - pb - 1).min(reach.clamp(1, 2));
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for tg in &tri[..n_win] {
            let pred = t1x + kappa_x * tg.half;
            lo = lo.min(pred - tg.max_wx);
            hi = hi.max(pred + tg.max_wx);
        }
        let first = s + buf.dbl_tx[s..e].partition_point(|&t| t < lo as f32);
        if first == e || buf.dbl_tx[first] > hi as f32 {
            continue;
        }
        let sf2 = slope_factor2(t1x, t1y).min(sf2_max);
        let kvar_ms = kvar_ms * sf2;
        // Curvature d2(x, y)/dz2 per unit q/p along the doublet.
        let n1 = (1.0 + t1x * t1x + t1y * t1y).sqrt();
        let (ax, ay) = bending(t1x, t1y, bf);
        let (cx, cy) = (K_GEV_PER_T_MM * n1 * ax, K_GEV_PER_T_MM * n1 * ay);
        let c2 = cx * cx + cy * cy;
        let field = cfg.fit.fit_momentum && c2 > 0.0;
        // Largest |q/p| of the doublet: its pointing estimate plus errors.
        let q_hi = if field && pg.pointing {
            let inv_c2 = 1.0 / c2;
            let q_ptg = (kappa_x * cx + kappa_y * cy) * inv_c2;
            let hard = (hard_kx * cx.abs() + hard_ky * cy.abs()) * inv_c2;
            let sigma = ((kvar_ms * qop_max * qop_max + kvar_res) * inv_c2).sqrt();
            (q_ptg.abs() + hard + ns * sigma).min(qop_max)
        } else {
            qop_max
        };
        // Windows on the slope of the continuation, per plane of c (next, or one skipped).
        let mut win = [Window::default(); 2];
        let mut hi = f64::NEG_INFINITY;
        for k in 0..n_win {
            let tg = &tri[k];
            let h = tg.half;
            let var = (kvar_ms * q_hi * q_hi + kvar_res) * h * h
                + ms_var(tg.theta2_per_qop2, q_hi) * sf2
                + tg.var_res;
            let gauss = ns * var.sqrt();
            let wn = Window {
                pred_x: t1x + kappa_x * h,
                pred_y: t1y + kappa_y * h,
                wx: hard_kx * h + gauss,
                wy: hard_ky * h + gauss,
            };
            hi = hi.max(wn.pred_x + wn.wx);
            win[k] = wn;
        }
        // The exact windows lie inside the widest: the search goes on from `first`.
        let hi = hi as f32;
        for d2 in first..e {
            if buf.dbl_tx[d2] > hi {
                break;
            }
            let r = buf.doublets[d2];
            let (t2x, t2y) = (r.tx as f64, r.ty as f64);
            let k = sh.plane[r.b as usize] as usize - pb - 1;
            if k >= n_win {
                continue;
            }
            let wn = win[k];
            if (t2x - wn.pred_x).abs() > wn.wx || (t2y - wn.pred_y).abs() > wn.wy {
                continue;
            }
            let tg = &tri[k];
            let (dx, dy) = (t2x - t1x, t2y - t1y);
            let (tmx, tmy) = (0.5 * (t1x + t2x), 0.5 * (t1y + t2y));
            let n2 = 1.0 + tmx * tmx + tmy * tmy;
            let (bx, by) = bending(tmx, tmy, bf);
            let gk = K_GEV_PER_T_MM * n2.sqrt() * tg.half;
            let (gx, gy) = (gk * bx, gk * by);
            let g2 = gx * gx + gy * gy;
            let measure = cfg.fit.fit_momentum && g2 > 0.0;
            let qop = if measure {
                (dx * gx + dy * gy) / g2
            } else {
                0.0
            };
            let (rx, ry) = (dx - gx * qop, dy - gy * qop);
            // Scattering at b and at skipped planes, per (q/p)^2, with the slope factor.
            let th2_per_qop2 = tg.theta2_per_qop2 * slope_factor2(tmx, tmy).min(sf2_max);
            let var_at = |q: f64| ms_var(th2_per_qop2, q) + tg.var_res;
            let r2 = rx * rx + ry * ry;
            let (qop_sigma, chi2) = if measure {
                let sigma_max = (var_at(qop_max) / g2).sqrt();
                if qop.abs() > qop_max + ns * sigma_max {
                    continue;
                }
                // Largest |q/p| both estimates allow.
                let q = (qop.abs() + ns * sigma_max).min(q_hi);
                let v = var_at(q);
                if r2 > cfg.triplet_chi2_max * v {
                    continue;
                }
                ((v / g2).sqrt(), r2 / v)
            } else {
                let v = var_at(qop_max);
                if r2 > cfg.triplet_chi2_max * v {
                    continue;
                }
                (0.0, r2 / v)
            };
            if buf.triplets.len() == cfg.limits.max_triplets {
                buf.overflow.triplets += 1;
                continue;
            }
            buf.triplets.push(Triplet {
                left: d1 as u32,
                right: d2 as u32,
                qop: qop as f32,
                qop_sigma: qop_sigma as f32,
                chi2: chi2 as f32,
            });
        }
    }
    buf.trip_start[n_doublets] = buf.triplets.len() as u32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HitRecord;
    use crate::tracking::ca::{doublets::find_doublets, hit_sorting::sort_hits};
    use crate::tracking::geometry::Detector;
    use crate::tracking::reco::synthetic::{detector, track};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Runs the steps up to the triplets; returns the triplets as input hit indices with
    /// their q/p.
    fn triplets(det: &Detector, hits: &[HitRecord]) -> Vec<([u32; 3], f32)> {
        let cfg = FinderConfig::from_detector(det, 1.0);
        let geo = FinderGeometry::new(det, &cfg);
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
        find_doublets(&geo, &cfg, 2, &mut buf);
        find_triplets(&geo, &cfg, 2, &mut buf);
        let input = |h: u32| buf.hits.input_index[h as usize];
        let mut out: Vec<([u32; 3], f32)> = buf
            .triplets
            .iter()
            .map(|t| {
                let (l, r) = (
                    buf.doublets[t.left as usize],
                    buf.doublets[t.right as usize],
                );
                assert_eq!(l.b, r.a);
                ([input(l.a), input(l.b), input(r.b)], t.qop)
            })
            .collect();
        out.sort_by_key(|a| a.0);
        out
    }

    /// Plane triples `(i, j, k)` a track crossing every plane makes, skipping at most one
    /// plane per doublet.
    fn expected(n: u32) -> Vec<[u32; 3]> {
        let mut v = Vec::new();
        for i in 0..n {
            for j in (i + 1)..(i + 3).min(n) {
                for k in (j + 1)..(j + 3).min(n) {
                    v.push([i, j, k]);
                }
            }
        }
        v
    }

    #[test]
    fn straight_track_without_field_makes_every_triplet_with_zero_curvature() {
        let det = detector(6, [0.0; 3], 0.003, 0.01);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut hits = Vec::new();
        track(
            &det,
            [0.3, -0.2, 0.08, -0.05, 0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let t = triplets(&det, &hits);
        let found: Vec<[u32; 3]> = t.iter().map(|x| x.0).collect();
        assert_eq!(found, expected(6));
        assert!(t.iter().all(|x| x.1 == 0.0));
    }

    #[test]
    fn helix_triplets_measure_the_momentum() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for &(p, q) in &[(1.2, 1.0), (3.0, -1.0), (20.0, 1.0)] {
            let mut hits = Vec::new();
            track(
                &det,
                [0.1, -0.1, 0.05 * q, 0.04, q / p],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            let t = triplets(&det, &hits);
            let found: Vec<[u32; 3]> = t.iter().map(|x| x.0).collect();
            assert_eq!(found, expected(8), "p {p}");
            let mean = t.iter().map(|x| x.1 as f64).sum::<f64>() / t.len() as f64;
            assert!(
                (mean - q / p).abs() < 0.1 / p + 0.02,
                "p {p}: mean q/p {mean}"
            );
        }
    }

    #[test]
    fn kink_cut_follows_the_triplet_momentum() {
        // The same breaking angle (2.4 mrad in y at the third plane: under 3 sigma of the
        // scattering at 1.2 GeV/c, over 10 sigma at 20 GeV/c) is kept on a soft track and
        // refused on a stiff one.
        let det = detector(4, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        for &(p, keep) in &[(1.2, true), (20.0, false)] {
            let mut hits = Vec::new();
            track(
                &det,
                [0.0, 0.0, 0.05, 0.03, 1.0 / p],
                false,
                false,
                &mut rng,
                &mut hits,
            );
            // Kink at plane 1 (z = 400): planes 2 and 3 move by 0.24 and 0.48 mm in y.
            hits[2].y_mm += 0.24;
            hits[3].y_mm += 0.48;
            let t = triplets(&det, &hits);
            let has = t.iter().any(|x| x.0 == [0, 1, 2]);
            assert_eq!(has, keep, "p {p}: {t:?}");
            // Downstream of the kink the track is straight again.
            assert!(t.iter().any(|x| x.0 == [1, 2, 3]), "p {p}");
        }
    }

    #[test]
    fn crossing_tracks_do_not_exchange_hits() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let mut hits = Vec::new();
        let (a, _) = track(
            &det,
            [0.0, 0.0, 0.10, 0.02, 0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let _ = track(
            &det,
            [0.0, 0.0, -0.03, 0.021, -0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let t = triplets(&det, &hits);
        let owner = |h: u32| if a.contains(&h) { 0 } else { 1 };
        for (ids, _) in &t {
            assert!(
                ids.iter().all(|&h| owner(h) == owner(ids[0])),
                "mixed triplet {ids:?}"
            );
        }
        assert_eq!(t.len(), 2 * expected(8).len());
    }
}
