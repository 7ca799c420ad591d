//! Kalman-filter track fit: state `(x, y, tx, ty, q/p)` with its 5x5 covariance, propagated
//! through the field by Runge-Kutta ([`crate::tracking::propagate`]), multiple-scattering
//! process noise from every plane crossed (Highland formula with the current momentum
//! estimate), a 2D measurement update per hit, chi-square and degrees of freedom.
//!
//! The fit runs from the most downstream hit to the most upstream one, so the filtered
//! state at the end is the estimate from all hits at the first hit (no smoother needed).
//! It starts from the two most downstream hits (position, slopes and their exact
//! covariance) and a three-hit curvature estimate with a wide prior, which keeps every
//! covariance update well conditioned in single precision.
//!
//! Reported state: at the z of the most upstream hit, just downstream of that plane's
//! material (the direction the downstream hits measure; the simulation's truth convention).
//! Multiple scattering uses a mass hypothesis (pion by default) for the velocity.
//!
//! Layout: `L` tracks at once in structure-of-arrays lanes (`f32`, `L = 8` in the hot path),
//! the same code as the `f64` one-lane reference used in tests.

// Lane loops index several structure-of-arrays quantities in lockstep (what LLVM
// vectorises); iterator chains over one of them would hide that.
#![allow(clippy::needless_range_loop)]

use crate::tracking::geometry::{Detector, Field};
use crate::tracking::propagate::{
    bending, propagate_lanes, steps_for, JacobianLanes, Real, K_GEV_PER_T_MM,
};
use crate::tracking::track::{Track, TrackState};
use serde::Deserialize;

/// Lanes of the single-precision hot path.
pub const LANES: usize = 8;

/// Most planes a detector may have (bounds every per-plane loop and array).
pub const MAX_PLANES: usize = 64;

/// Fit settings; defaults come from the detector ([`FitConfig::from_detector`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FitConfig {
    /// Longest Runge-Kutta step, mm. Default: 1000 mm for a uniform field (RK4 is exact to
    /// far below the resolution over a gap), 50 mm otherwise.
    pub max_step_mm: f64,
    /// Whether the field bends tracks enough to measure q/p. Default: the bending of a
    /// 100 GeV/c track over the detector exceeds the hit resolution.
    pub fit_momentum: bool,
    /// Momentum assumed for multiple scattering when q/p is not measured, GeV/c.
    pub p_no_field_gev: f64,
    /// Prior width of q/p relative to the three-hit estimate.
    pub qop_prior_rel: f64,
    /// Absolute floor of the q/p prior width, e/(GeV/c). Default: ten times the
    /// measurement-limited q/p resolution of the detector.
    pub qop_prior_floor: f64,
    /// Mass hypothesis for the velocity in the Highland formula, GeV/c^2 (pion).
    pub mass_gev: f64,
}

impl Default for FitConfig {
    fn default() -> Self {
        FitConfig {
            max_step_mm: 1000.0,
            fit_momentum: true,
            p_no_field_gev: 5.0,
            qop_prior_rel: 0.5,
            qop_prior_floor: 0.05,
            mass_gev: 0.139_570_39,
        }
    }
}

impl FitConfig {
    /// Settings derived from the detector.
    pub fn from_detector(det: &Detector) -> Self {
        let mut c = FitConfig::default();
        let uniform = matches!(det.field, Field::Uniform { .. });
        c.max_step_mm = if uniform { 1000.0 } else { 50.0 };
        let (bend_mm, length_mm, sigma_mm) = bending_power(det);
        c.fit_momentum = bend_mm > sigma_mm;
        if c.fit_momentum && length_mm > 0.0 {
            // Sagitta-limited q/p resolution ~ 8 sigma / (K B L^2) per unit q/p.
            let per_qop_mm = bend_mm * 100.0; // sagitta for q/p = 1
            c.qop_prior_floor = 10.0 * 8.0 * sigma_mm / per_qop_mm.max(1e-12);
        }
        c
    }
}

/// Sagitta of a 100 GeV/c track over the detector (mm), detector length (mm), smallest
/// hit resolution (mm). Field sampled along the z axis.
pub fn bending_power(det: &Detector) -> (f64, f64, f64) {
    let planes = &det.planes;
    if planes.len() < 2 {
        return (0.0, 0.0, 1.0);
    }
    let z0 = planes[0].z_mm;
    let z1 = planes[planes.len() - 1].z_mm;
    let length = z1 - z0;
    let mut bt = 0.0f64;
    for i in 0..=16 {
        let z = z0 + length * i as f64 / 16.0;
        let b = det.field.at([0.0, 0.0, z]);
        bt = bt.max((b[0] * b[0] + b[1] * b[1]).sqrt());
    }
    let sagitta = K_GEV_PER_T_MM * bt * length * length / 8.0 / 100.0;
    let sigma = planes
        .iter()
        .map(|p| p.sigma_x_mm.min(p.sigma_y_mm))
        .fold(f64::INFINITY, f64::min);
    (sagitta, length, sigma)
}

/// One measured hit of a track to fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitHit {
    pub plane: u16,
    pub x_mm: f32,
    pub y_mm: f32,
}

/// Result of one fit, in the number type of the fit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FitOutput {
    pub z_mm: f64,
    /// x, y, tx, ty, qop.
    pub state: [f64; 5],
    /// Lower triangle of the covariance, row by row.
    pub cov: [f64; 15],
    pub chi2: f64,
    pub ndf: u16,
    /// False when the track could not be fitted (fewer than three hits, bad planes,
    /// non-finite result).
    pub ok: bool,
}

impl FitOutput {
    /// Writes the fit into a [`Track`]'s state, covariance and chi-square.
    pub fn write_track(&self, t: &mut Track) {
        t.state = TrackState {
            z_mm: self.z_mm as f32,
            x_mm: self.state[0] as f32,
            y_mm: self.state[1] as f32,
            tx: self.state[2] as f32,
            ty: self.state[3] as f32,
            qop: self.state[4] as f32,
        };
        for i in 0..15 {
            t.cov[i] = self.cov[i] as f32;
        }
        t.chi2 = self.chi2 as f32;
        t.ndf = self.ndf;
    }
}

/// Index of `(i, j)`, `j <= i`, in a lower triangle stored row by row.
#[inline(always)]
pub const fn tri(i: usize, j: usize) -> usize {
    if j <= i {
        i * (i + 1) / 2 + j
    } else {
        j * (j + 1) / 2 + i
    }
}

/// Per-plane constants of the fit.
#[derive(Debug, Clone)]
struct PlaneConsts {
    z_mm: f64,
    var_x: f64,
    var_y: f64,
    x0: f64,
    /// ln(x0), 0 where there is no material.
    ln_x0: f64,
}

/// The Kalman fitter for one detector.
#[derive(Debug, Clone)]
pub struct KalmanFitter {
    field: Field,
    planes: Vec<PlaneConsts>,
    cfg: FitConfig,
}

/// Highland constant, GeV.
const HIGHLAND_GEV: f64 = 0.0136;

impl KalmanFitter {
    pub fn new(det: &Detector, cfg: FitConfig) -> Self {
        let planes = det
            .planes
            .iter()
            .take(MAX_PLANES)
            .map(|p| PlaneConsts {
                z_mm: p.z_mm,
                var_x: p.sigma_x_mm * p.sigma_x_mm,
                var_y: p.sigma_y_mm * p.sigma_y_mm,
                x0: p.x0_fraction.max(0.0),
                ln_x0: if p.x0_fraction > 0.0 {
                    p.x0_fraction.ln()
                } else {
                    0.0
                },
            })
            .collect();
        KalmanFitter {
            field: det.field.clone(),
            planes,
            cfg,
        }
    }

    pub fn config(&self) -> &FitConfig {
        &self.cfg
    }

    /// Whether a track's hits can be fitted: at least three, planes strictly increasing and
    /// known.
    pub fn fittable(&self, hits: &[FitHit]) -> bool {
        hits.len() >= 3
            && hits.windows(2).all(|w| w[0].plane < w[1].plane)
            && (hits[hits.len() - 1].plane as usize) < self.planes.len()
            && hits
                .iter()
                .all(|h| h.x_mm.is_finite() && h.y_mm.is_finite())
    }

    /// Multiple-scattering angle variance (per unit q/p squared) crossing plane `p` at
    /// normal incidence, used by the finder's windows.
    pub fn theta0_sq_per_qop2(&self, p: usize) -> f64 {
        let pc = &self.planes[p];
        if pc.x0 <= 0.0 {
            return 0.0;
        }
        let f = HIGHLAND_GEV * (1.0 + 0.038 * pc.ln_x0);
        f * f * pc.x0
    }

    /// Three-hit seed of q/p (general field direction) and the prior variance.
    fn seed_qop(&self, a: &FitHit, b: &FitHit, c: &FitHit) -> (f64, f64) {
        if !self.cfg.fit_momentum {
            let q = 1.0 / self.cfg.p_no_field_gev.max(1e-3);
            return (q, q * q);
        }
        let (za, zb, zc) = (
            self.planes[a.plane as usize].z_mm,
            self.planes[b.plane as usize].z_mm,
            self.planes[c.plane as usize].z_mm,
        );
        let (xa, xb, xc) = (a.x_mm as f64, b.x_mm as f64, c.x_mm as f64);
        let (ya, yb, yc) = (a.y_mm as f64, b.y_mm as f64, c.y_mm as f64);
        let sx1 = (xb - xa) / (zb - za);
        let sx2 = (xc - xb) / (zc - zb);
        let sy1 = (yb - ya) / (zb - za);
        let sy2 = (yc - yb) / (zc - zb);
        let ddx = 2.0 * (sx2 - sx1) / (zc - za);
        let ddy = 2.0 * (sy2 - sy1) / (zc - za);
        let tx = (xc - xa) / (zc - za);
        let ty = (yc - ya) / (zc - za);
        let bf = self.field.at([xb, yb, zb]);
        let (ax, ay) = bending(tx, ty, bf);
        let n = (1.0 + tx * tx + ty * ty).sqrt();
        let gx = K_GEV_PER_T_MM * n * ax;
        let gy = K_GEV_PER_T_MM * n * ay;
        let g2 = gx * gx + gy * gy;
        let q = if g2 > 0.0 {
            (ddx * gx + ddy * gy) / g2
        } else {
            0.0
        };
        let q = if q.is_finite() { q } else { 0.0 };
        let s = self.cfg.qop_prior_rel * q.abs() + self.cfg.qop_prior_floor;
        (q, s * s)
    }

    /// Fits up to `L` tracks at once (`tracks.len() <= L`); `out[i]` receives track `i`.
    /// Tracks that are not [`fittable`](Self::fittable) get `ok = false`.
    pub fn fit_lanes<T: Real, const L: usize>(&self, tracks: &[&[FitHit]], out: &mut [FitOutput]) {
        assert!(tracks.len() <= L && out.len() >= tracks.len());
        let zero = T::of(0.0);
        let one = T::of(1.0);
        // Lanes that are empty or unfittable copy a valid track (result discarded) so every
        // lane computes finite numbers.
        let mut valid = [false; L];
        let mut template: Option<&[FitHit]> = None;
        for (i, t) in tracks.iter().enumerate() {
            valid[i] = self.fittable(t);
            if valid[i] && template.is_none() {
                template = Some(t);
            }
        }
        let Some(template) = template else {
            for o in out.iter_mut().take(tracks.len()) {
                *o = FitOutput::default();
            }
            return;
        };
        let lane_hits: [&[FitHit]; L] = std::array::from_fn(|l| {
            if l < tracks.len() && valid[l] {
                tracks[l]
            } else {
                template
            }
        });

        // State and covariance, structure of arrays.
        let mut z = [zero; L];
        let mut x = [zero; L];
        let mut y = [zero; L];
        let mut tx = [zero; L];
        let mut ty = [zero; L];
        let mut qop = [zero; L];
        let mut c = [[zero; L]; 15];
        let mut chi2 = [zero; L];
        let mut first_plane = [0usize; L];
        let mut last_plane = [0usize; L];
        let mut skip_plane = [usize::MAX; L];
        let mut max_span = 0usize;

        for l in 0..L {
            let h = lane_hits[l];
            let n = h.len();
            let hn = &h[n - 1];
            let hm = &h[n - 2];
            let (q, cq) = self.seed_qop(&h[0], &h[n / 2], hn);
            let pn = &self.planes[hn.plane as usize];
            let pm = &self.planes[hm.plane as usize];
            let dz = pn.z_mm - pm.z_mm;
            let chord_x = (hn.x_mm as f64 - hm.x_mm as f64) / dz;
            let chord_y = (hn.y_mm as f64 - hm.y_mm as f64) / dz;
            let bf = self.field.at([
                0.5 * (hn.x_mm as f64 + hm.x_mm as f64),
                0.5 * (hn.y_mm as f64 + hm.y_mm as f64),
                0.5 * (pn.z_mm + pm.z_mm),
            ]);
            let (ax, ay) = bending(chord_x, chord_y, bf);
            let nn = (1.0 + chord_x * chord_x + chord_y * chord_y).sqrt();
            let gx = 0.5 * dz * K_GEV_PER_T_MM * nn * ax;
            let gy = 0.5 * dz * K_GEV_PER_T_MM * nn * ay;
            z[l] = T::of(pn.z_mm);
            x[l] = T::of(hn.x_mm as f64);
            y[l] = T::of(hn.y_mm as f64);
            tx[l] = T::of(chord_x + gx * q);
            ty[l] = T::of(chord_y + gy * q);
            qop[l] = T::of(q);
            // Scattering in planes skipped between the two seeding hits.
            let mut ms_tx = 0.0;
            let mut ms_ty = 0.0;
            let mut ms_txty = 0.0;
            for p in (hm.plane as usize + 1)..(hn.plane as usize) {
                let pk = &self.planes[p];
                let w = (pk.z_mm - pm.z_mm) / dz;
                let th2 = self.theta0_sq(p, q, chord_x, chord_y) * w * w;
                let n2 = 1.0 + chord_x * chord_x + chord_y * chord_y;
                ms_tx += th2 * (1.0 + chord_x * chord_x) * n2;
                ms_ty += th2 * (1.0 + chord_y * chord_y) * n2;
                ms_txty += th2 * chord_x * chord_y * n2;
            }
            let cv = [
                pn.var_x,                                                 // xx
                0.0,                                                      // yx
                pn.var_y,                                                 // yy
                pn.var_x / dz,                                            // txx
                0.0,                                                      // txy
                (pn.var_x + pm.var_x) / (dz * dz) + gx * gx * cq + ms_tx, // txtx
                0.0,                                                      // tyx
                pn.var_y / dz,                                            // tyy
                gx * gy * cq + ms_txty,                                   // tytx
                (pn.var_y + pm.var_y) / (dz * dz) + gy * gy * cq + ms_ty, // tyty
                0.0,                                                      // qx
                0.0,                                                      // qy
                gx * cq,                                                  // qtx
                gy * cq,                                                  // qty
                cq,                                                       // qq
            ];
            for i in 0..15 {
                c[i][l] = T::of(cv[i]);
            }
            first_plane[l] = h[0].plane as usize;
            last_plane[l] = hn.plane as usize;
            skip_plane[l] = hm.plane as usize;
            max_span = max_span.max(last_plane[l] - first_plane[l]);
        }

        let mut jac: JacobianLanes<T, L> = [[[zero; L]; 3]; 4];
        let mut hit_cursor = [0usize; L];
        for l in 0..L {
            hit_cursor[l] = lane_hits[l].len() - 2; // index of hit m (already used)
        }
        let mut z_to = [zero; L];
        let mut active = [zero; L];
        let mut has_hit = [zero; L];
        let mut mx = [zero; L];
        let mut my = [zero; L];
        let mut vx = [zero; L];
        let mut vy = [zero; L];
        let mut x0 = [zero; L];
        let mut ln_x0 = [zero; L];
        let m2 = T::of(self.cfg.mass_gev * self.cfg.mass_gev);
        for s in 1..=max_span {
            let mut dz_max = 0.0f64;
            for l in 0..L {
                let plane = last_plane[l] as isize - s as isize;
                if plane >= first_plane[l] as isize {
                    let p = plane as usize;
                    let pc = &self.planes[p];
                    z_to[l] = T::of(pc.z_mm);
                    dz_max = dz_max.max((pc.z_mm - z[l].to_f64()).abs());
                    active[l] = one;
                    vx[l] = T::of(pc.var_x);
                    vy[l] = T::of(pc.var_y);
                    // No scattering at the first hit's plane: the state is reported
                    // just downstream of it.
                    let scatters = p != first_plane[l];
                    x0[l] = T::of(if scatters { pc.x0 } else { 0.0 });
                    ln_x0[l] = T::of(pc.ln_x0);
                    let h = lane_hits[l];
                    // Next unused hit going upstream.
                    let mut hit = false;
                    if p != skip_plane[l] {
                        let k = hit_cursor[l];
                        if k > 0 && h[k - 1].plane as usize == p {
                            hit_cursor[l] = k - 1;
                            hit = true;
                            mx[l] = T::of(h[k - 1].x_mm as f64);
                            my[l] = T::of(h[k - 1].y_mm as f64);
                        }
                    }
                    has_hit[l] = if hit { one } else { zero };
                } else {
                    z_to[l] = z[l];
                    active[l] = zero;
                    has_hit[l] = zero;
                    x0[l] = zero;
                    ln_x0[l] = zero;
                    vx[l] = one;
                    vy[l] = one;
                }
            }
            let n_steps = steps_for(dz_max, self.cfg.max_step_mm);
            propagate_lanes(
                &self.field,
                &mut z,
                &mut x,
                &mut y,
                &mut tx,
                &mut ty,
                &qop,
                &z_to,
                n_steps,
                &mut jac,
            );
            transport_cov(&mut c, &jac);
            for l in 0..L {
                if has_hit[l] == zero {
                    mx[l] = x[l];
                    my[l] = y[l];
                }
            }
            update(
                &mut x, &mut y, &mut tx, &mut ty, &mut qop, &mut c, &mut chi2, &mx, &my, &vx, &vy,
                &has_hit,
            );
            scatter(&mut c, &tx, &ty, &qop, &x0, &ln_x0, m2);
        }

        for (i, o) in out.iter_mut().enumerate().take(tracks.len()) {
            if !valid[i] {
                *o = FitOutput::default();
                continue;
            }
            let mut r = FitOutput {
                z_mm: z[i].to_f64(),
                state: [
                    x[i].to_f64(),
                    y[i].to_f64(),
                    tx[i].to_f64(),
                    ty[i].to_f64(),
                    qop[i].to_f64(),
                ],
                cov: [0.0; 15],
                chi2: chi2[i].to_f64(),
                ndf: 0,
                ok: true,
            };
            for k in 0..15 {
                r.cov[k] = c[k][i].to_f64();
            }
            let n = tracks[i].len() as i32;
            let ndf = 2 * n - if self.cfg.fit_momentum { 5 } else { 4 };
            r.ndf = ndf.max(0) as u16;
            r.ok = r.state.iter().all(|v| v.is_finite())
                && r.cov.iter().all(|v| v.is_finite())
                && r.chi2.is_finite()
                && (0..5).all(|k| r.cov[tri(k, k)] >= 0.0);
            *o = r;
        }
    }

    /// Scattering angle variance at plane `p` for a given q/p and slopes (scalar).
    fn theta0_sq(&self, p: usize, qop: f64, tx: f64, ty: f64) -> f64 {
        let pc = &self.planes[p];
        if pc.x0 <= 0.0 {
            return 0.0;
        }
        let n2 = 1.0 + tx * tx + ty * ty;
        let xr = pc.x0 * n2.sqrt();
        let inv_beta2 = 1.0 + self.cfg.mass_gev * self.cfg.mass_gev * qop * qop;
        let f = HIGHLAND_GEV * qop * inv_beta2.sqrt() * (1.0 + 0.038 * (xr * inv_beta2).ln());
        f * f * xr
    }

    /// Single-precision batch fit (lanes of [`LANES`]); `out` is resized to `tracks.len()`.
    pub fn fit_batch(&self, tracks: &[&[FitHit]], out: &mut Vec<FitOutput>) {
        out.clear();
        out.resize(tracks.len(), FitOutput::default());
        for (chunk, o) in tracks.chunks(LANES).zip(out.chunks_mut(LANES)) {
            self.fit_lanes::<f32, LANES>(chunk, o);
        }
    }

    /// Double-precision one-track reference fit.
    pub fn fit_reference(&self, hits: &[FitHit]) -> FitOutput {
        let mut o = [FitOutput::default()];
        self.fit_lanes::<f64, 1>(&[hits], &mut o);
        o[0]
    }
}

/// `C <- J C J^T` with the block-structured Jacobian (see [`JacobianLanes`]).
#[inline(always)]
fn transport_cov<T: Real, const L: usize>(c: &mut [[T; L]; 15], jac: &JacobianLanes<T, L>) {
    for l in 0..L {
        let mut m = [[T::of(0.0); 5]; 5];
        for i in 0..5 {
            for j in 0..=i {
                m[i][j] = c[tri(i, j)][l];
                m[j][i] = m[i][j];
            }
        }
        // Rows of J: J[r] = e_r + sum over k in (tx, ty, qop) of jac[r][k-2] at column k,
        // for r < 2; J[r][k] = jac[r][k-2] for r = 2, 3; J[4] = e_4.
        let j = |r: usize, k: usize| jac[r][k - 2][l];
        // A = J M (5x5).
        let mut a = [[T::of(0.0); 5]; 5];
        for col in 0..5 {
            for r in 0..4 {
                let mut v = j(r, 2) * m[2][col] + j(r, 3) * m[3][col] + j(r, 4) * m[4][col];
                if r < 2 {
                    v += m[r][col];
                }
                a[r][col] = v;
            }
            a[4][col] = m[4][col];
        }
        // C' = A J^T: C'[r][s] = sum_k A[r][k] J[s][k].
        for r in 0..5 {
            for s in 0..=r {
                let v = if s < 4 {
                    let mut v = a[r][2] * j(s, 2) + a[r][3] * j(s, 3) + a[r][4] * j(s, 4);
                    if s < 2 {
                        v += a[r][s];
                    }
                    v
                } else {
                    a[r][4]
                };
                c[tri(r, s)][l] = v;
            }
        }
    }
}

/// 2D measurement update of x and y, weighted by `mask` (1 = hit on this plane, 0 = none).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn update<T: Real, const L: usize>(
    x: &mut [T; L],
    y: &mut [T; L],
    tx: &mut [T; L],
    ty: &mut [T; L],
    qop: &mut [T; L],
    c: &mut [[T; L]; 15],
    chi2: &mut [T; L],
    mx: &[T; L],
    my: &[T; L],
    vx: &[T; L],
    vy: &[T; L],
    mask: &[T; L],
) {
    for l in 0..L {
        let s00 = c[0][l] + vx[l];
        let s01 = c[1][l];
        let s11 = c[2][l] + vy[l];
        let inv_det = T::of(1.0) / (s00 * s11 - s01 * s01);
        let i00 = s11 * inv_det;
        let i01 = -s01 * inv_det;
        let i11 = s00 * inv_det;
        let r0 = mx[l] - x[l];
        let r1 = my[l] - y[l];
        // Column 0 and 1 of C: cov(i, x), cov(i, y).
        let mut cx = [T::of(0.0); 5];
        let mut cy = [T::of(0.0); 5];
        for i in 0..5 {
            cx[i] = c[tri(i, 0)][l];
            cy[i] = c[tri(i, 1)][l];
        }
        let mut k0 = [T::of(0.0); 5];
        let mut k1 = [T::of(0.0); 5];
        for i in 0..5 {
            k0[i] = (cx[i] * i00 + cy[i] * i01) * mask[l];
            k1[i] = (cx[i] * i01 + cy[i] * i11) * mask[l];
        }
        x[l] += k0[0] * r0 + k1[0] * r1;
        y[l] += k0[1] * r0 + k1[1] * r1;
        tx[l] += k0[2] * r0 + k1[2] * r1;
        ty[l] += k0[3] * r0 + k1[3] * r1;
        qop[l] += k0[4] * r0 + k1[4] * r1;
        for i in 0..5 {
            for j in 0..=i {
                c[tri(i, j)][l] = c[tri(i, j)][l] - (k0[i] * cx[j] + k1[i] * cy[j]);
            }
        }
        chi2[l] += mask[l] * (r0 * r0 * i00 + T::of(2.0) * r0 * r1 * i01 + r1 * r1 * i11);
    }
}

/// Adds multiple-scattering noise on the slopes for crossing a plane of `x0` radiation
/// lengths (0 = not crossing): Highland formula with the velocity of the mass hypothesis
/// (`mass2` = m^2) and the path length through the plane; the logarithms of the path and
/// velocity corrections by [`ln1p_pade`].
#[inline(always)]
fn scatter<T: Real, const L: usize>(
    c: &mut [[T; L]; 15],
    tx: &[T; L],
    ty: &[T; L],
    qop: &[T; L],
    x0: &[T; L],
    ln_x0: &[T; L],
    mass2: T,
) {
    let one = T::of(1.0);
    for l in 0..L {
        let u = tx[l] * tx[l] + ty[l] * ty[l];
        let n2 = one + u;
        // 1 / beta^2 = 1 + m^2 (q/p)^2.
        let w = mass2 * qop[l] * qop[l];
        let xr = x0[l] * n2.sqrt();
        let log_term = ln_x0[l] + T::of(0.5) * ln1p_pade(u) + ln1p_pade(w);
        let f = T::of(HIGHLAND_GEV) * qop[l] * (one + w).sqrt() * (one + T::of(0.038) * log_term);
        let th2 = f * f * xr;
        c[tri(2, 2)][l] += th2 * (one + tx[l] * tx[l]) * n2;
        c[tri(3, 3)][l] += th2 * (one + ty[l] * ty[l]) * n2;
        c[tri(3, 2)][l] += th2 * tx[l] * ty[l] * n2;
    }
}

/// `ln(1 + u)` by its (2,1) Pade approximant `u (6 + u) / (6 + 4 u)`: relative error below
/// 1e-3 for `u` up to 0.5 and 1 % at `u` = 1, vectorisable (it enters the Highland formula's
/// logarithmic term multiplied by 0.038).
#[inline(always)]
fn ln1p_pade<T: Real>(u: T) -> T {
    u * (T::of(6.0) + u) / (T::of(6.0) + T::of(4.0) * u)
}
