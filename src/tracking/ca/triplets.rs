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
        for d2 in s..e {
            let r = buf.doublets[d2];
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
