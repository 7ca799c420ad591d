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
//!
//! The step runs in three phases over chunks of [`CHUNK`] doublets, in `f32` on lanes of
//! [`LANES`] (the layout the GPU shares, and vector instructions on the CPU): the windows
//! of every doublet of the chunk (lane-parallel, no branches), the search of the
//! continuations inside them (each hit's outgoing doublets are sorted by slope: a binary
//! search and a short scan), and the kink test of the pairs found (lane-parallel). Pairs
//! are tested in the order they were found, so triplets come out ordered by left doublet
//! and, within one, by right doublet, whatever the chunking.

// Negated comparisons keep NaN out of every window (a NaN fails each test); the lane
// loops index several arrays by lane.
#![allow(clippy::neg_cmp_op_on_partial_ord, clippy::needless_range_loop)]

use super::{CaBuffers, FinderGeometry, PairLanes, Triplet};
use crate::tracking::geometry::Field;
use crate::tracking::propagate::K_GEV_PER_T_MM;
use crate::tracking::reco::FinderConfig;

/// Lanes of the lane-parallel phases.
pub const LANES: usize = 8;
/// Doublets per chunk (a multiple of [`LANES`]).
pub const CHUNK: usize = 128;
/// Capacity of the pair buffer (`CaBuffers::trip_candidates`): pairs are tested whenever
/// it is full.
pub const CANDIDATES: usize = 1024;

/// A pair of doublets inside each other's windows: left doublet (index in its chunk),
/// right doublet, and which plane triple (`s`: next plane or one skipped).
#[derive(Debug, Clone, Copy, Default)]
pub struct Candidate {
    pub left: u32,
    pub right: u32,
    pub s: u32,
}

/// The cuts of one call, in `f32`.
#[derive(Clone, Copy)]
struct Cuts {
    qop_max: f32,
    n_sigma: f32,
    mass2: f32,
    sf2_max: f32,
    chi2_max: f32,
    fit_momentum: f32,
    /// Uniform field, tesla (`None`: looked up at each middle hit).
    uniform: Option<[f32; 3]>,
    /// Largest plane distance of the doublets (1 or 2).
    reach: u8,
}

/// Per doublet of a chunk: its slopes, field and windows on the continuation's slope
/// (kept in `CaBuffers::trip_windows` between calls).
#[derive(Debug)]
pub struct ChunkWindows {
    t1x: [f32; CHUNK],
    t1y: [f32; CHUNK],
    b: [[f32; CHUNK]; 3],
    q_hi: [f32; CHUNK],
    /// Index of the plane pair's [`PairLanes`], and the plane of the middle hit.
    pair: [u32; CHUNK],
    plane_b: [u16; CHUNK],
    n_win: [u8; CHUNK],
    pred_x: [[f32; CHUNK]; 2],
    pred_y: [[f32; CHUNK]; 2],
    wx: [[f32; CHUNK]; 2],
    wy: [[f32; CHUNK]; 2],
    /// The union of the windows in x (`lo > hi` when there is none).
    lo: [f32; CHUNK],
    hi: [f32; CHUNK],
}

impl ChunkWindows {
    pub fn new() -> Box<Self> {
        Box::new(ChunkWindows {
            t1x: [0.0; CHUNK],
            t1y: [0.0; CHUNK],
            b: [[0.0; CHUNK]; 3],
            q_hi: [0.0; CHUNK],
            pair: [0; CHUNK],
            plane_b: [0; CHUNK],
            n_win: [0; CHUNK],
            pred_x: [[0.0; CHUNK]; 2],
            pred_y: [[0.0; CHUNK]; 2],
            wx: [[0.0; CHUNK]; 2],
            wy: [[0.0; CHUNK]; 2],
            lo: [0.0; CHUNK],
            hi: [0.0; CHUNK],
        })
    }
}

/// Squared [`super::slope_factor`] (one square root).
#[inline(always)]
fn slope_factor2(tx: f32, ty: f32) -> f32 {
    let t = tx.abs().max(ty.abs());
    let n2 = 1.0 + tx * tx + ty * ty;
    (1.0 + t * t) * n2 * n2.sqrt()
}

/// Curvature terms of the equations of motion (as [`crate::tracking::propagate::bending`]).
#[inline(always)]
fn bending(tx: f32, ty: f32, b: [f32; 3]) -> (f32, f32) {
    let ax = tx * ty * b[0] - (1.0 + tx * tx) * b[1] + ty * b[2];
    let ay = (1.0 + ty * ty) * b[0] - tx * ty * b[1] - tx * b[2];
    (ax, ay)
}

/// Which code the step runs: compiled for the target's baseline, or for AVX2 (chosen at
/// run time; both give the same triplets: no fused multiply-adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TripletKernel {
    Portable,
    Avx2,
}

impl TripletKernel {
    /// The best kernel this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return TripletKernel::Avx2;
        }
        TripletKernel::Portable
    }
}

/// Fills `buf.triplets` and `buf.trip_start` (per doublet, the triplets it starts); `reach`
/// is the largest plane distance of the doublets (as given to
/// [`super::doublets::find_doublets`]).
pub fn find_triplets(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    find_triplets_with(TripletKernel::detect(), geo, cfg, reach, buf)
}

/// [`find_triplets`] with the given kernel (the portable one where the CPU lacks it).
pub fn find_triplets_with(
    kernel: TripletKernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    buf: &mut CaBuffers,
) {
    #[cfg(target_arch = "x86_64")]
    if kernel == TripletKernel::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        unsafe { find_triplets_avx2(geo, cfg, reach, buf) };
        return;
    }
    let _ = kernel;
    find_triplets_portable(geo, cfg, reach, buf)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_triplets_avx2(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    buf: &mut CaBuffers,
) {
    find_triplets_impl(geo, cfg, reach, buf)
}

#[inline(never)]
fn find_triplets_portable(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    buf: &mut CaBuffers,
) {
    find_triplets_impl(geo, cfg, reach, buf)
}

#[inline(always)]
fn find_triplets_impl(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    let n_doublets = buf.doublets.len();
    buf.triplets.clear();
    buf.trip_start.clear();
    buf.trip_start.resize(n_doublets + 1, 0);
    let cuts = Cuts {
        qop_max: cfg.qop_max() as f32,
        n_sigma: cfg.n_sigma as f32,
        mass2: (cfg.fit.mass_gev * cfg.fit.mass_gev) as f32,
        sf2_max: (cfg.slope_factor * cfg.slope_factor) as f32,
        chi2_max: cfg.triplet_chi2_max as f32,
        fit_momentum: if cfg.fit.fit_momentum { 1.0 } else { 0.0 },
        uniform: match geo.field {
            Field::Uniform { b_tesla } => Some(b_tesla.map(|v| v as f32)),
            #[allow(unreachable_patterns)]
            _ => None,
        },
        reach: reach.clamp(1, 2) as u8,
    };
    let mut cands = std::mem::take(&mut buf.trip_candidates);
    cands.clear();
    let mut w = buf.trip_windows.take().unwrap_or_else(ChunkWindows::new);
    // Doublets before this one have their `trip_start` set.
    let mut next_start = 0usize;
    for c0 in (0..n_doublets).step_by(CHUNK) {
        let c1 = (c0 + CHUNK).min(n_doublets);
        for p0 in (c0..c1).step_by(LANES) {
            chunk_windows(geo, &cuts, buf, p0, c1, p0 - c0, &mut w);
        }
        for d1 in c0..c1 {
            let i = d1 - c0;
            let (lo, hi) = (w.lo[i], w.hi[i]);
            if !(lo <= hi) {
                continue;
            }
            let b = buf.doublets[d1].b as usize;
            let (s, e) = (buf.dbl_start[b] as usize, buf.dbl_start[b + 1] as usize);
            let txs = &buf.dbl_tx[s..e];
            let first = s + txs.partition_point(|&t| t < lo);
            let (pb, n_win) = (w.plane_b[i], w.n_win[i] as usize);
            for d2 in first..e {
                let t2x = buf.dbl_tx[d2];
                if t2x > hi {
                    break;
                }
                let r = buf.doublets[d2];
                let k = (buf.hits.plane[r.b as usize] - pb - 1) as usize;
                if k >= n_win {
                    continue;
                }
                if (t2x - w.pred_x[k][i]).abs() > w.wx[k][i]
                    || (r.ty - w.pred_y[k][i]).abs() > w.wy[k][i]
                {
                    continue;
                }
                cands.push(Candidate {
                    left: i as u32,
                    right: d2 as u32,
                    s: k as u32,
                });
                if cands.len() == CANDIDATES {
                    kink_tests(geo, &cuts, cfg, buf, &cands, c0, &w, &mut next_start);
                    cands.clear();
                }
            }
        }
        kink_tests(geo, &cuts, cfg, buf, &cands, c0, &w, &mut next_start);
        cands.clear();
    }
    let len = buf.triplets.len() as u32;
    for t in &mut buf.trip_start[next_start..] {
        *t = len;
    }
    buf.trip_candidates = cands;
    buf.trip_windows = Some(w);
}

/// Phase 1: the windows of doublets `p0..min(p0 + LANES, end)`, stored at `i0..` in `w`.
#[inline(always)]
fn chunk_windows(
    geo: &FinderGeometry,
    cuts: &Cuts,
    buf: &CaBuffers,
    p0: usize,
    end: usize,
    i0: usize,
    w: &mut ChunkWindows,
) {
    let n_planes = geo.planes.len();
    let sh = &buf.hits;
    let mut pl = [PairLanes::default(); LANES];
    let (mut xa, mut ya) = ([0.0f32; LANES], [0.0f32; LANES]);
    let (mut t1x, mut t1y) = ([0.0f32; LANES], [0.0f32; LANES]);
    let mut bf = [[0.0f32; LANES]; 3];
    let mut n_win = [0u8; LANES];
    for l in 0..LANES {
        // Lanes past the end repeat the last doublet (results not stored).
        let d = buf.doublets[(p0 + l).min(end - 1)];
        let (pa, pb) = (
            sh.plane[d.a as usize] as usize,
            sh.plane[d.b as usize] as usize,
        );
        let pair = pa * n_planes + pb;
        pl[l] = geo.pair_lanes[pair];
        n_win[l] = pl[l].n_triples.min(cuts.reach);
        xa[l] = sh.x_mm[d.a as usize];
        ya[l] = sh.y_mm[d.a as usize];
        t1x[l] = d.tx;
        t1y[l] = d.ty;
        let b = match cuts.uniform {
            Some(b) => b,
            None => geo
                .field
                .at([
                    sh.x_mm[d.b as usize] as f64,
                    sh.y_mm[d.b as usize] as f64,
                    geo.planes[pb].z_mm,
                ])
                .map(|v| v as f32),
        };
        for c in 0..3 {
            bf[c][l] = b[c];
        }
        if p0 + l < end {
            w.pair[i0 + l] = pair as u32;
            w.plane_b[i0 + l] = pb as u16;
            w.n_win[i0 + l] = n_win[l];
        }
    }
    let ns = cuts.n_sigma;
    let qmax = cuts.qop_max;
    let mut out = [[0.0f32; LANES]; 11];
    for l in 0..LANES {
        let p = &pl[l];
        let (tx, ty) = (t1x[l], t1y[l]);
        // Pointing parabola through the origin, a and b: curvature, its hard error from
        // the origin's size and its Gaussian variance (scattering per (q/p)^2, resolution).
        let kappa_x = p.pointing * (tx - xa[l] * p.inv_zi) * p.two_inv_zj;
        let kappa_y = p.pointing * (ty - ya[l] * p.inv_zi) * p.two_inv_zj;
        let sf2 = slope_factor2(tx, ty).min(cuts.sf2_max);
        let kvar_ms = p.kvar_ms_per_qop2 * sf2;
        // Curvature d2(x, y)/dz2 per unit q/p along the doublet.
        let n1 = (1.0 + tx * tx + ty * ty).sqrt();
        let (ax, ay) = bending(tx, ty, [bf[0][l], bf[1][l], bf[2][l]]);
        let k = K_GEV_PER_T_MM as f32 * n1;
        let (cx, cy) = (k * ax, k * ay);
        let c2 = cx * cx + cy * cy;
        // Largest |q/p| of the doublet: its pointing estimate plus errors (with a field
        // and a pointing window), else the cut.
        let use_ptg = cuts.fit_momentum * p.pointing > 0.0 && c2 > 0.0;
        let inv_c2 = 1.0 / if use_ptg { c2 } else { 1.0 };
        let q_ptg = (kappa_x * cx + kappa_y * cy) * inv_c2;
        let hard = (p.hard_kx * cx.abs() + p.hard_ky * cy.abs()) * inv_c2;
        let sigma = ((kvar_ms * qmax * qmax + p.kvar_res) * inv_c2).sqrt();
        let q_ptg_hi = (q_ptg.abs() + hard + ns * sigma).min(qmax);
        let q_hi = if use_ptg { q_ptg_hi } else { qmax };
        let ms2 = q_hi * q_hi * (1.0 + cuts.mass2 * q_hi * q_hi) * sf2;
        let kvar = kvar_ms * q_hi * q_hi + p.kvar_res;
        let mut lo = f32::INFINITY;
        let mut hi = f32::NEG_INFINITY;
        for s in 0..2 {
            let h = p.half[s];
            let var = kvar * h * h + p.theta2_per_qop2[s] * ms2 + p.var_res[s];
            let gauss = ns * var.sqrt();
            let pred_x = tx + kappa_x * h;
            let pred_y = ty + kappa_y * h;
            // A plane triple outside the detector or beyond the reach gets no window.
            let open = (s as u8) < n_win[l];
            let wx = if open { p.hard_kx * h + gauss } else { -1.0 };
            let wy = p.hard_ky * h + gauss;
            lo = if open { lo.min(pred_x - wx) } else { lo };
            hi = if open { hi.max(pred_x + wx) } else { hi };
            out[s * 4][l] = pred_x;
            out[s * 4 + 1][l] = pred_y;
            out[s * 4 + 2][l] = wx;
            out[s * 4 + 3][l] = wy;
        }
        out[8][l] = lo;
        out[9][l] = hi;
        out[10][l] = q_hi;
    }
    for l in 0..LANES.min(end - p0) {
        let i = i0 + l;
        w.t1x[i] = t1x[l];
        w.t1y[i] = t1y[l];
        for c in 0..3 {
            w.b[c][i] = bf[c][l];
        }
        for s in 0..2 {
            w.pred_x[s][i] = out[s * 4][l];
            w.pred_y[s][i] = out[s * 4 + 1][l];
            w.wx[s][i] = out[s * 4 + 2][l];
            w.wy[s][i] = out[s * 4 + 3][l];
        }
        w.lo[i] = out[8][l];
        w.hi[i] = out[9][l];
        w.q_hi[i] = out[10][l];
    }
}

/// Phase 3: the kink test of `cands` (left doublets of the chunk starting at `c0`), in
/// order; the pairs that pass become triplets.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn kink_tests(
    geo: &FinderGeometry,
    cuts: &Cuts,
    cfg: &FinderConfig,
    buf: &mut CaBuffers,
    cands: &[Candidate],
    c0: usize,
    w: &ChunkWindows,
    next_start: &mut usize,
) {
    let ns = cuts.n_sigma;
    let qmax = cuts.qop_max;
    let ms_qmax = qmax * qmax * (1.0 + cuts.mass2 * qmax * qmax);
    let kk = K_GEV_PER_T_MM as f32;
    for group in cands.chunks(LANES) {
        let mut t1 = [[0.0f32; LANES]; 2];
        let mut t2 = [[0.0f32; LANES]; 2];
        let mut bf = [[0.0f32; LANES]; 3];
        let mut q_hi = [0.0f32; LANES];
        let mut tg = [[0.0f32; LANES]; 3];
        for l in 0..LANES {
            let c = group[l.min(group.len() - 1)];
            let i = c.left as usize;
            let s = c.s as usize;
            let r = buf.doublets[c.right as usize];
            t1[0][l] = w.t1x[i];
            t1[1][l] = w.t1y[i];
            t2[0][l] = r.tx;
            t2[1][l] = r.ty;
            for k in 0..3 {
                bf[k][l] = w.b[k][i];
            }
            q_hi[l] = w.q_hi[i];
            let p = &geo.pair_lanes[w.pair[i] as usize];
            tg[0][l] = p.half[s];
            tg[1][l] = p.theta2_per_qop2[s];
            tg[2][l] = p.var_res[s];
        }
        let mut pass = [false; LANES];
        let mut res = [[0.0f32; LANES]; 3];
        for l in 0..LANES {
            let (t1x, t1y, t2x, t2y) = (t1[0][l], t1[1][l], t2[0][l], t2[1][l]);
            let (half, th2, var_res) = (tg[0][l], tg[1][l], tg[2][l]);
            let (dx, dy) = (t2x - t1x, t2y - t1y);
            let (tmx, tmy) = (0.5 * (t1x + t2x), 0.5 * (t1y + t2y));
            let n2 = 1.0 + tmx * tmx + tmy * tmy;
            let (bx, by) = bending(tmx, tmy, [bf[0][l], bf[1][l], bf[2][l]]);
            let gk = kk * n2.sqrt() * half;
            let (gx, gy) = (gk * bx, gk * by);
            let g2 = gx * gx + gy * gy;
            let measure = cuts.fit_momentum > 0.0 && g2 > 0.0;
            let inv_g2 = 1.0 / if measure { g2 } else { 1.0 };
            let qop = if measure {
                (dx * gx + dy * gy) * inv_g2
            } else {
                0.0
            };
            let (rx, ry) = (dx - gx * qop, dy - gy * qop);
            let r2 = rx * rx + ry * ry;
            // Scattering at b and at skipped planes, per (q/p)^2, with the slope factor.
            let th = th2 * slope_factor2(tmx, tmy).min(cuts.sf2_max);
            let var_max = th * ms_qmax + var_res;
            let sigma_max = (var_max * inv_g2).sqrt();
            // Largest |q/p| both estimates allow.
            let q = (qop.abs() + ns * sigma_max).min(q_hi[l]);
            let v_q = th * q * q * (1.0 + cuts.mass2 * q * q) + var_res;
            let v = if measure { v_q } else { var_max };
            let in_momentum = !measure || !(qop.abs() > qmax + ns * sigma_max);
            pass[l] = in_momentum && !(r2 > cuts.chi2_max * v);
            res[0][l] = qop;
            res[1][l] = if measure { (v * inv_g2).sqrt() } else { 0.0 };
            res[2][l] = r2 / v;
        }
        for (l, c) in group.iter().enumerate() {
            if !pass[l] {
                continue;
            }
            let d1 = c0 + c.left as usize;
            if buf.triplets.len() == cfg.limits.max_triplets {
                buf.overflow.triplets += 1;
                continue;
            }
            let len = buf.triplets.len() as u32;
            while *next_start <= d1 {
                buf.trip_start[*next_start] = len;
                *next_start += 1;
            }
            buf.triplets.push(Triplet {
                left: d1 as u32,
                right: c.right,
                qop: res[0][l],
                qop_sigma: res[1][l],
                chi2: res[2][l],
            });
        }
    }
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
