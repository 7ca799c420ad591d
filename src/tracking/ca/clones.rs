//! Clone suppression: with each hit used once, a particle can still give two tracks when
//! its chain breaks (two missing planes in a row, a kink): a short track on planes the
//! other does not use, lying on the other's trajectory. Each short track (at most
//! `n_planes - 3` hits) is compared with the longer accepted tracks: when all its hits lie
//! within the window of a longer track's fitted trajectory (Runge-Kutta through the
//! field), it is a clone and dropped. The window is the scattering displacement of the
//! longer track's own momentum: `clone_window_mm` (the displacement at the minimum
//! momentum) times the ratio of its largest |q/p| (fitted, plus three standard
//! deviations) to the momentum cut's, at least ten hit resolutions; without a field the
//! momentum is not measured and the window stays at the minimum momentum's. A window of
//! the minimum momentum for every track would take, in a dense event, the short track of
//! another particle (one that leaves the acceptance early) near a stiff track's
//! extrapolation for a clone. Where the field measures the momentum, the two pieces of one
//! particle also measure the same q/p: the short track's fitted q/p must agree with the
//! longer one's within `n_sigma` standard deviations of their difference.
//!
//! Before the Runge-Kutta, each hit is compared with the straight line of the longer
//! track's state, which cannot be further from the trajectory than the bending of the
//! largest field over the distance at the track's momentum (plus three standard deviations
//! of its q/p and slopes): most pairs fail there. The Runge-Kutta then takes steps of up to [`CLONE_STEP_MM`]: the comparison is against a window of
//! millimetres, not a fit's micrometres. Ghosts (random combinations) are removed earlier by
//! the triplet, neighbour and fit chi-square cuts and `min_hits`.

use super::cuts::FinderConfig;
use super::{CaBuffers, FinderGeometry};
use crate::tracking::kalman::{tri, FitHit, FitOutput};
use crate::tracking::propagate::{propagate_state, K_GEV_PER_T_MM};

/// Longest Runge-Kutta step of the comparison with the longer track's trajectory, mm (the
/// fit's own step where it is longer, as in a uniform field). Across the shipped field
/// maps, a track at the momentum cut lands within 0.06 mm of where the fit's 50 mm steps
/// take it over the whole detector (0.3 % of the dipole spectrometer's 19 mm clone
/// window; the test `coarse_steps_land_within_a_small_part_of_the_clone_window`), at a
/// quarter of the field lookups.
pub const CLONE_STEP_MM: f64 = 200.0;

/// The cuts of the clone comparison, derived once from the geometry and the configuration
/// (the CPU step and the GPU's `kernels/ca_clones.cu` read the same values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloneCuts {
    /// Longest track compared with longer ones (`n_planes - 3` hits); `None` with fewer
    /// than four planes (no comparison).
    pub short_max: Option<usize>,
    /// Bending per unit |q/p| and squared distance along z of the largest field, x and y,
    /// over the acceptance's slopes (mm per (e/(GeV/c)) per mm^2).
    pub bend_x: f64,
    pub bend_y: f64,
    /// Runge-Kutta step of the comparison, mm.
    pub step_mm: f64,
    /// How far each hit of the short track may lie from the trajectory of a longer track
    /// at the momentum cut, mm ([`Self::window_for`] scales it to the track's momentum).
    pub window_mm: f64,
    /// The smallest window, mm: ten hit resolutions (at most `window_mm`).
    pub window_floor_mm: f64,
    /// The |q/p| `window_mm` is for (the momentum cut's); zero without a momentum
    /// measurement (no scaling, no comparison of the q/p).
    pub qop_ref: f64,
    /// Standard deviations of the q/p difference two pieces of one particle may have.
    pub n_sigma: f64,
}

impl CloneCuts {
    pub fn new(geo: &FinderGeometry, cfg: &FinderConfig) -> Self {
        let n_planes = geo.planes.len();
        // Curvature per unit |q/p| bounding every track's in the acceptance: the largest
        // field components and slopes.
        let (tx, ty) = (cfg.max_tx, cfg.max_ty);
        let [bx, by, bz] = geo.b_max_tesla;
        let nn = (1.0 + tx * tx + ty * ty).sqrt();
        CloneCuts {
            short_max: (n_planes >= 4).then(|| n_planes - 3),
            bend_x: K_GEV_PER_T_MM * nn * (tx * ty * bx + (1.0 + tx * tx) * by + ty * bz),
            bend_y: K_GEV_PER_T_MM * nn * ((1.0 + ty * ty) * bx + tx * ty * by + tx * bz),
            step_mm: cfg.fit.max_step_mm.max(CLONE_STEP_MM),
            window_mm: cfg.clone_window_mm,
            window_floor_mm: (10.0 * geo.sigma_max_mm()).min(cfg.clone_window_mm),
            qop_ref: if cfg.fit.fit_momentum && geo.b_max_tesla.iter().any(|&b| b != 0.0) {
                cfg.qop_max()
            } else {
                0.0
            },
            n_sigma: cfg.n_sigma,
        }
    }

    /// Whether two tracks' fitted q/p (values and variances) may be one particle's: always
    /// without a momentum measurement. As `same_qop` in `kernels/ca_clones.cu`.
    // Negated: a q/p or variance that is not a number tells nothing against the pair.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn same_qop(&self, qa: f64, va: f64, qb: f64, vb: f64) -> bool {
        if self.qop_ref > 0.0 {
            let d = qa - qb;
            !(d * d > self.n_sigma * self.n_sigma * (va.max(0.0) + vb.max(0.0)))
        } else {
            true
        }
    }

    /// The window of a longer track whose largest |q/p| is `q` (its fitted |q/p| plus three
    /// standard deviations): the scattering displacement scales with |q/p|. The GPU's
    /// `clone_window` in `kernels/ca_clones.cu` computes the same.
    pub fn window_for(&self, q: f64) -> f64 {
        if self.qop_ref > 0.0 {
            (self.window_mm * (q / self.qop_ref).min(1.0)).max(self.window_floor_mm)
        } else {
            self.window_mm
        }
    }
}

/// Removes clones from `buf.accepted`; returns how many were removed (the marks of
/// [`mark_clones`]).
pub fn suppress_clones(geo: &FinderGeometry, cfg: &FinderConfig, buf: &mut CaBuffers) -> usize {
    let mut masks = std::mem::take(&mut buf.scratch_u64);
    let mut marks = std::mem::take(&mut buf.clone_marks);
    let removed = mark_clones(geo, cfg, buf, &mut masks, &mut marks);
    let mut k = 0;
    buf.accepted.retain(|_| {
        k += 1;
        !marks[k - 1]
    });
    buf.scratch_u64 = masks;
    buf.clone_marks = marks;
    removed
}

/// The hits of accepted track `i` (index in `buf.accepted`), upstream first, as the fit
/// and the GPU's clone comparison take them.
pub fn accepted_hits(buf: &CaBuffers, i: usize) -> impl Iterator<Item = FitHit> + '_ {
    let c = buf.candidates[buf.accepted[i] as usize];
    buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
        .iter()
        .map(|&h| FitHit {
            plane: buf.hits.plane[h as usize],
            x_mm: buf.hits.x_mm[h as usize],
            y_mm: buf.hits.y_mm[h as usize],
        })
}

/// The fit of accepted track `i` (index in `buf.accepted`).
pub fn accepted_fit(buf: &CaBuffers, i: usize) -> &FitOutput {
    &buf.fits[buf.candidates[buf.accepted[i] as usize].fit as usize]
}

/// Decides which of `buf.accepted` are clones, in acceptance order: `marks` is replaced by
/// one flag per accepted track (true: a clone); returns how many. A short track is
/// compared with every longer-or-equal accepted track not marked before it (a track marked
/// earlier is no longer a reference). `masks` is scratch (one word per accepted track).
pub fn mark_clones(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    buf: &CaBuffers,
    masks: &mut Vec<u64>,
    marks: &mut Vec<bool>,
) -> usize {
    let n = buf.accepted.len();
    marks.clear();
    marks.resize(n, false);
    let n_planes = geo.planes.len();
    let cuts = CloneCuts::new(geo, cfg);
    let Some(short_max) = cuts.short_max else {
        return 0;
    };
    let (bend_x, bend_y, step_mm) = (cuts.bend_x, cuts.bend_y, cuts.step_mm);
    let mut removed = 0;
    // Per accepted track, its planes modulo 64 as bits: tracks with disjoint masks have
    // disjoint planes, and up to 64 planes overlapping masks mean a shared plane.
    masks.clear();
    masks.extend(buf.accepted.iter().map(|&k| {
        let c = buf.candidates[k as usize];
        buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
            .iter()
            .fold(0u64, |m, &h| m | 1 << (buf.hits.plane[h as usize] % 64))
    }));
    // With up to 64 planes only tracks on planes disjoint from the short track's can be
    // its longer piece: the tracks by mask (ids sorted by mask, then index, after the
    // masks; then the start of each run of one mask), so a short track visits the runs,
    // not every track, and tries the tracks of the disjoint runs. The order of the tries
    // does not matter: a try changes nothing, and the short track is a clone where any
    // succeeds.
    let grouped = n_planes <= 64;
    let runs_at = 2 * n;
    if grouped {
        masks.extend(0..n as u64);
        let (m, ids) = masks.split_at_mut(n);
        ids.sort_unstable_by_key(|&i| (m[i as usize], i));
        let mut k = 0;
        while k < n {
            masks.push(k as u64);
            let mk = masks[masks[n + k] as usize];
            while k < n && masks[masks[n + k] as usize] == mk {
                k += 1;
            }
        }
        masks.push(n as u64);
    }
    for ib in 0..n {
        let kb = buf.accepted[ib];
        let cb = buf.candidates[kb as usize];
        if cb.len as usize > short_max {
            continue;
        }
        let hits_b = &buf.candidate_hits[cb.start as usize..cb.start as usize + cb.len as usize];
        let mb = masks[ib];
        // Whether track `ia` is the longer piece of the short track `ib`.
        let clone_of = |ia: usize, ma: u64, marks: &[bool]| -> bool {
            if ia == ib || marks[ia] {
                return false;
            }
            let ka = buf.accepted[ia];
            let ca = buf.candidates[ka as usize];
            if ca.len < cb.len {
                return false;
            }
            let hits_a =
                &buf.candidate_hits[ca.start as usize..ca.start as usize + ca.len as usize];
            if ma & mb != 0
                && hits_b.iter().any(|&hb| {
                    hits_a
                        .iter()
                        .any(|&ha| buf.hits.plane[ha as usize] == buf.hits.plane[hb as usize])
                })
            {
                return false;
            }
            let fa = &buf.fits[ca.fit as usize];
            let fb = &buf.fits[cb.fit as usize];
            if !cuts.same_qop(
                fa.state[4],
                fa.cov[tri(4, 4)],
                fb.state[4],
                fb.cov[tri(4, 4)],
            ) {
                return false;
            }
            // Every hit of b near a's straight line, within the largest bending.
            let sd = |k: usize| 3.0 * fa.cov[k].max(0.0).sqrt();
            let q = fa.state[4].abs() + sd(tri(4, 4));
            let window = cuts.window_for(q);
            let near_line = hits_b.iter().all(|&hb| {
                let hb = hb as usize;
                let dz = geo.planes[buf.hits.plane[hb] as usize].z_mm - fa.z_mm;
                let bend = 0.5 * q * dz * dz;
                let x_lin = fa.state[0] + fa.state[2] * dz;
                let y_lin = fa.state[1] + fa.state[3] * dz;
                let wx = window + bend * bend_x + sd(tri(2, 2)) * dz.abs();
                let wy = window + bend * bend_y + sd(tri(3, 3)) * dz.abs();
                (x_lin - buf.hits.x_mm[hb] as f64).abs() <= wx
                    && (y_lin - buf.hits.y_mm[hb] as f64).abs() <= wy
            });
            if !near_line {
                return false;
            }
            let mut z = fa.z_mm;
            let mut s = fa.state;
            for &hb in hits_b {
                let hb = hb as usize;
                let zt = geo.planes[buf.hits.plane[hb] as usize].z_mm;
                s = propagate_state(&geo.field, z, s, zt, step_mm);
                z = zt;
                if (s[0] - buf.hits.x_mm[hb] as f64).abs() > window
                    || (s[1] - buf.hits.y_mm[hb] as f64).abs() > window
                {
                    return false;
                }
            }
            true
        };
        let found = if grouped {
            // Planes must be disjoint (most tracks share one with any short track).
            let runs = &masks[runs_at..];
            runs.windows(2).any(|run| {
                let ids = &masks[n + run[0] as usize..n + run[1] as usize];
                masks[ids[0] as usize] & mb == 0
                    && ids
                        .iter()
                        .any(|&ia| clone_of(ia as usize, masks[ia as usize], marks))
            })
        } else {
            (0..n).any(|ia| clone_of(ia, masks[ia], marks))
        };
        if found {
            marks[ib] = true;
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::ca::Candidate;
    use crate::tracking::propagate::propagate;
    use crate::tracking::reco::synthetic::detector;

    /// Tracks at the momentum cut from the origin across the shipped field maps, as the
    /// clone comparison follows them (from one end of the detector to the other, both
    /// ways): positions with [`CLONE_STEP_MM`] steps against the fit's steps.
    #[test]
    fn coarse_steps_land_within_a_small_part_of_the_clone_window() {
        use crate::tracking::geometry::Detector;
        for file in [
            "fixtures/tracking/dipole/detector_dipole.toml",
            "fixtures/tracking/forward/detector_forward.toml",
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file)).unwrap();
            let cfg = FinderConfig::from_detector(&det, 1.0);
            assert!(cfg.fit.max_step_mm < CLONE_STEP_MM, "{file}");
            let (z0, z1) = (det.planes[0].z_mm, det.planes[det.planes.len() - 1].z_mm);
            let mut worst: f64 = 0.0;
            for (tx, ty) in [(0.0, 0.0), (0.25, 0.1), (-0.2, -0.2), (0.1, 0.25)] {
                for q in [-cfg.qop_max(), cfg.qop_max()] {
                    let start = [tx * z0, ty * z0, tx, ty, q];
                    let fine = |a: f64, s: [f64; 5], b: f64| {
                        propagate(&det.field, a, s, b, cfg.fit.max_step_mm).0
                    };
                    let coarse = |a: f64, s: [f64; 5], b: f64| {
                        propagate(&det.field, a, s, b, CLONE_STEP_MM).0
                    };
                    let end = fine(z0, start, z1);
                    for (a, s, b) in [(z0, start, z1), (z1, end, z0)] {
                        let (f, c) = (fine(a, s, b), coarse(a, s, b));
                        worst = worst.max((f[0] - c[0]).abs()).max((f[1] - c[1]).abs());
                    }
                }
            }
            assert!(
                worst < 0.01 * cfg.clone_window_mm,
                "{file}: {worst} mm against a window of {} mm",
                cfg.clone_window_mm
            );
            eprintln!(
                "{file}: worst {worst} mm, window {} mm",
                cfg.clone_window_mm
            );
        }
    }

    #[test]
    fn short_track_on_a_longer_ones_line_is_a_clone_unless_it_shares_a_plane() {
        // Eight planes without field; a long track on planes 0-4 along x = 10 + 0.1 (z - 300)
        // and three short ones: on planes 5-7 along it (a clone), on planes 5-7 far from
        // it, and on planes 4-6 along it (shares plane 4: not a clone).
        let det = detector(8, [0.0; 3], 0.003, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let mut buf = CaBuffers::default();
        let line = |p: usize| (10.0 + 0.1 * 100.0 * p as f32, -5.0f32);
        let tracks: [(&[usize], f32); 4] = [
            (&[0, 1, 2, 3, 4], 0.0),
            (&[5, 6, 7], 0.0),
            (&[5, 6, 7], 40.0),
            (&[4, 5, 6], 0.0),
        ];
        for (k, (planes, dx)) in tracks.iter().enumerate() {
            let start = buf.candidate_hits.len() as u32;
            for &p in *planes {
                let (x, y) = line(p);
                buf.candidate_hits.push(buf.hits.x_mm.len() as u32);
                buf.hits.x_mm.push(x + dx);
                buf.hits.y_mm.push(y);
                buf.hits.plane.push(p as u16);
            }
            buf.candidates.push(Candidate {
                start,
                len: planes.len() as u16,
                chi2: 1.0,
                ndf: 2 * planes.len() as u16 - 4,
                fit: k as u32,
            });
            let (x, y) = line(planes[0]);
            buf.fits.push(FitOutput {
                z_mm: det.planes[planes[0]].z_mm,
                state: [(x + dx) as f64, y as f64, 0.1, 0.0, 0.2],
                ok: true,
                ..Default::default()
            });
            buf.accepted.push(k as u32);
        }
        assert_eq!(suppress_clones(&geo, &cfg, &mut buf), 1);
        assert_eq!(buf.accepted, vec![0, 2, 3]);
    }
}
