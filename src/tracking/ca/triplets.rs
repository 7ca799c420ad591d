//! Triplets: two doublets `(a, b)` and `(b, c)` sharing the middle hit. The change of
//! slope at `b` is split into the part the field explains (giving a curvature estimate q/p
//! from the bending direction of the equations of motion at `b`) and the rest, the
//! breaking angle, which multiple scattering at `b` (and any skipped plane) and the hit
//! resolution must explain: its chi-square at the minimum momentum is cut, and |q/p| must
//! stay below the momentum cut within its resolution.

use super::{CaBuffers, FinderGeometry, Triplet};
use crate::tracking::propagate::{bending, K_GEV_PER_T_MM};
use crate::tracking::reco::FinderConfig;

/// Fills `buf.triplets` and `buf.trip_start` (per doublet, the triplets it starts).
pub fn find_triplets(geo: &FinderGeometry, cfg: &FinderConfig, buf: &mut CaBuffers) {
    let n_doublets = buf.doublets.len();
    buf.triplets.clear();
    buf.trip_start.clear();
    buf.trip_start.resize(n_doublets + 1, 0);
    let qop_max = cfg.qop_max();
    let m2 = cfg.fit.mass_gev * cfg.fit.mass_gev;
    let uniform = match geo.field {
        crate::tracking::geometry::Field::Uniform { b_tesla } => Some(b_tesla),
        #[allow(unreachable_patterns)]
        _ => None,
    };
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
        let (za, zb) = (geo.planes[pa].z_mm, geo.planes[pb].z_mm);
        let dz1 = zb - za;
        let bf = match uniform {
            Some(v) => v,
            None => geo.field.at([sh.x_mm[b] as f64, sh.y_mm[b] as f64, zb]),
        };
        // Window on the slope tx of the continuation (b, c): from the parabola through the
        // origin, a and b (pointing), or from the curvature bound alone.
        let pointing = cfg.origin_half_x_mm.is_finite()
            && cfg.origin_half_y_mm.is_finite()
            && za - cfg.origin_z_mm > 1.0;
        let (za_o, zb_o) = (za - cfg.origin_z_mm, zb - cfg.origin_z_mm);
        let xa = sh.x_mm[l.a as usize] as f64;
        let ya = sh.y_mm[l.a as usize] as f64;
        let (kappa_x, kappa_y) = if pointing {
            (
                2.0 * (l.tx as f64 - xa / za_o) / zb_o,
                2.0 * (l.ty as f64 - ya / za_o) / zb_o,
            )
        } else {
            (0.0, 0.0)
        };
        let kink = cfg.n_sigma
            * (geo.planes[pb].theta2_min_p * cfg.momentum_slack * cfg.momentum_slack).sqrt()
            * cfg.slope_factor
            + cfg.n_sigma * 4.0 * geo.planes[pb].var_x.max(geo.planes[pb].var_y).sqrt() / dz1;
        let (wx_per_dz, wy_per_dz) = if pointing {
            let o = (cfg.origin_half_x_mm
                + cfg.n_sigma * geo.planes[pa].ms_origin_mm * cfg.slope_factor)
                / (za_o * zb_o);
            let oy = (cfg.origin_half_y_mm
                + cfg.n_sigma * geo.planes[pa].ms_origin_mm * cfg.slope_factor)
                / (za_o * zb_o);
            (o, oy)
        } else {
            (
                0.5 * cfg.max_curvature_x_per_mm,
                0.5 * cfg.max_curvature_y_per_mm,
            )
        };
        // Both possible planes of c (next, or one skipped).
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for pc in (pb + 1)..(pb + 3).min(geo.planes.len()) {
            let dzc = geo.planes[pc].z_mm - za;
            let pred = l.tx as f64 + 0.5 * kappa_x * dzc;
            let w = wx_per_dz * dzc + kink;
            lo = lo.min(pred - w);
            hi = hi.max(pred + w);
        }
        let first = s + buf.doublets[s..e].partition_point(|d| (d.tx as f64) < lo);
        for d2 in first..e {
            let r = buf.doublets[d2];
            if r.tx as f64 > hi {
                break;
            }
            {
                let pc = sh.plane[r.b as usize] as usize;
                let dzc = geo.planes[pc].z_mm - za;
                let pred_x = l.tx as f64 + 0.5 * kappa_x * dzc;
                let pred_y = l.ty as f64 + 0.5 * kappa_y * dzc;
                if (r.tx as f64 - pred_x).abs() > wx_per_dz * dzc + kink
                    || (r.ty as f64 - pred_y).abs() > wy_per_dz * dzc + kink
                {
                    continue;
                }
            }
            let pc = sh.plane[r.b as usize] as usize;
            let zc = geo.planes[pc].z_mm;
            let dz2 = zc - zb;
            let (t1x, t1y) = (l.tx as f64, l.ty as f64);
            let (t2x, t2y) = (r.tx as f64, r.ty as f64);
            let (dx, dy) = (t2x - t1x, t2y - t1y);
            let (tmx, tmy) = (0.5 * (t1x + t2x), 0.5 * (t1y + t2y));
            let n2 = 1.0 + tmx * tmx + tmy * tmy;
            let (ax, ay) = bending(tmx, tmy, bf);
            let half = 0.5 * (zc - za);
            let gx = K_GEV_PER_T_MM * n2.sqrt() * ax * half;
            let gy = K_GEV_PER_T_MM * n2.sqrt() * ay * half;
            let g2 = gx * gx + gy * gy;
            let qop = if cfg.fit.fit_momentum && g2 > 0.0 {
                (dx * gx + dy * gy) / g2
            } else {
                0.0
            };
            let (rx, ry) = (dx - gx * qop, dy - gy * qop);
            // Scattering at b and at skipped planes, per (q/p)^2, with the slope factors.
            let mut th2_per_qop2 = geo.planes[pb].theta2_per_qop2;
            for p in (pa + 1)..pb {
                th2_per_qop2 += geo.planes[p].theta2_per_qop2;
            }
            for p in (pb + 1)..pc {
                th2_per_qop2 += geo.planes[p].theta2_per_qop2;
            }
            th2_per_qop2 *= n2 * (1.0 + tmx.abs().max(tmy.abs()).powi(2)) * n2.sqrt().sqrt();
            let var_meas = {
                let va = geo.planes[pa].var_x.max(geo.planes[pa].var_y);
                let vb = geo.planes[pb].var_x.max(geo.planes[pb].var_y);
                let vc = geo.planes[pc].var_x.max(geo.planes[pc].var_y);
                let w = 1.0 / dz1 + 1.0 / dz2;
                va / (dz1 * dz1) + vb * w * w + vc / (dz2 * dz2)
            };
            let var_at = |q: f64| th2_per_qop2 * q * q * (1.0 + m2 * q * q) + var_meas;
            let var_cut = var_at(qop_max);
            let chi2_cut = (rx * rx + ry * ry) / var_cut;
            if chi2_cut > cfg.triplet_chi2_max {
                continue;
            }
            let (qop_sigma, chi2) = if g2 > 0.0 && cfg.fit.fit_momentum {
                if qop.abs() > qop_max + cfg.n_sigma * var_cut.sqrt() / g2.sqrt() {
                    continue;
                }
                let q_use = qop.abs().clamp(0.1 * qop_max, qop_max);
                let v = var_at(q_use);
                (v.sqrt() / g2.sqrt(), (rx * rx + ry * ry) / v)
            } else {
                (0.0, chi2_cut)
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
