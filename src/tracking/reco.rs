//! Track reconstruction, the public entry: [`FinderConfig`] (every cut, with defaults
//! derived from the detector and the minimum momentum, overridable from a TOML `[finder]`
//! table through [`FinderOverrides`]) and [`Reconstructor`], which runs the
//! cellular-automaton steps of [`crate::tracking::ca`] and the Kalman fit of
//! [`crate::tracking::kalman`] on one event's hits into [`Track`]s, reusing bounded buffers.
//!
//! ```no_run
//! # use trigd::tracking::{geometry::Detector, reco::{FinderConfig, Reconstructor}};
//! # fn run(det: &Detector, hits: &[trigd::frame::HitRecord]) {
//! let cfg = FinderConfig::from_detector(det, 1.0);
//! let mut reco = Reconstructor::new(det, cfg);
//! let mut tracks = Vec::new();
//! reco.reconstruct(hits, &mut tracks);
//! # }
//! ```

use crate::frame::HitRecord;
use crate::tracking::ca::{self, CaBuffers, FinderGeometry, Overflow};
use crate::tracking::geometry::Detector;
use crate::tracking::kalman::{FitConfig, KalmanFitter, MAX_PLANES};
use crate::tracking::track::Track;
use serde::Deserialize;
use std::time::Instant;

/// Maximum sizes of the finder's per-event buffers (all reserved at construction; what
/// does not fit is dropped and counted in [`Overflow`]). The defaults hold a central event
/// of the default spectrometer (about 2000 hits per plane, 0.4 M doublets, 1.1 M
/// triplets) with room to spare, about 130 MB per reconstructor.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Hits per event.
    pub max_hits: usize,
    /// Doublets per event.
    pub max_doublets: usize,
    /// Triplets per event.
    pub max_triplets: usize,
    /// Neighbour relations per event.
    pub max_neighbours: usize,
    /// Track candidates per event.
    pub max_candidates: usize,
    /// Tracks per event.
    pub max_tracks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_hits: 1 << 16,
            max_doublets: 1 << 20,
            max_triplets: 1 << 21,
            max_neighbours: 1 << 22,
            max_candidates: 1 << 15,
            max_tracks: 1 << 14,
        }
    }
}

/// Every cut of the finder. Build with [`FinderConfig::from_detector`]; the derived values
/// are documented per field.
#[derive(Debug, Clone, PartialEq)]
pub struct FinderConfig {
    /// Minimum momentum of the tracks to find, GeV/c: sets the bending windows and the
    /// multiple-scattering windows.
    pub min_p_gev: f64,
    /// Factor on the curvature of a `min_p_gev` track allowed by the cuts (so tracks at the
    /// threshold survive their resolution). Default 1.15.
    pub momentum_slack: f64,
    /// z of the region the tracks come from (target / interaction point), mm. Default 0, the
    /// coordinate origin of the geometry.
    pub origin_z_mm: f64,
    /// Half size in x of that region, mm; infinite disables the pointing window. Default
    /// 1.5 mm (a beam spot up to 0.5 mm rms at 3 sigma).
    pub origin_half_x_mm: f64,
    /// Half size in y of that region, mm. Default 1.5 mm.
    pub origin_half_y_mm: f64,
    /// Largest |dx/dz| of a doublet. Default: the widest plane's half width over its
    /// distance from the origin, plus the bending of a `min_p_gev` track over the detector.
    pub max_tx: f64,
    /// Largest |dy/dz| of a doublet, as `max_tx`.
    pub max_ty: f64,
    /// Largest |d2x/dz2| of a track above the minimum momentum, 1/mm. Default from the
    /// field sampled along the axis and `momentum_slack`.
    pub max_curvature_x_per_mm: f64,
    /// Largest |d2y/dz2|, as `max_curvature_x_per_mm`.
    pub max_curvature_y_per_mm: f64,
    /// Largest factor on scattering angles for inclined tracks (longer path, projected
    /// angles): the cuts use the factor of each hit's or track's own slopes
    /// ([`ca::slope_factor`]), at most this one. Default: the factor at the slope limits.
    pub slope_factor: f64,
    /// Width of every window in standard deviations (scattering and resolution). Default 4.
    pub n_sigma: f64,
    /// Make doublets that skip one plane (inefficient plane). Default true.
    pub allow_missing_plane: bool,
    /// Fewest hits of a track found in the first pass, which makes doublets on consecutive
    /// planes only (a fraction of the combinations of the doublets skipping a plane); the
    /// second pass, with the skipping doublets when `allow_missing_plane`, runs on the hits
    /// the first left. Default `n_planes - 1` (tracks without a gap inside), at least
    /// `min_hits`; above the number of planes (or without `allow_missing_plane`) there is
    /// one pass.
    pub first_pass_min_hits: usize,
    /// The first of two passes takes only tracks that reach the last plane or may leave
    /// the detector before it (their last doublet's extrapolation, widened by the curvature
    /// at the momentum cut, the scattering and the resolution, reaches outside the next
    /// plane: [`ca::FinderGeometry::may_leave`]). A track that stops early because the next
    /// plane missed its hit is left to the second pass, which finds tracks with missing
    /// planes anyway; the first pass then follows far fewer possible track ends (in the
    /// seeded search every doublet onto a plane before the last is one). Default true.
    pub first_pass_to_last_plane: bool,
    /// The pass on consecutive planes follows its tracks upstream from the planes they can
    /// end on, where the hits are least dense (doublets on the other planes are made only
    /// as extensions of triplets, see [`ca::triplets::find_triplets_seeded`]): the same
    /// tracks as making every doublet, for a fraction of the work. Default true.
    pub follow_seeds: bool,
    /// Fewest hits of an event for following the seeds: in sparse events nearly every
    /// doublet belongs to a track and the full search is cheaper. Default 2000.
    pub follow_seeds_min_hits: usize,
    /// Grid bins per plane in x for the window search (a window scans, per grid row it
    /// overlaps, the cells between its columns). Default 8.
    pub bins_x: usize,
    /// Grid rows per plane in y: a window scans the hits of the rows it overlaps, so rows
    /// about as high as the narrowest windows are best. Default 128.
    pub bins_y: usize,
    /// Cut on the breaking-angle chi-square of a triplet at the minimum momentum. Default
    /// `n_sigma^2` (plus one degree of freedom without field).
    pub triplet_chi2_max: f64,
    /// Cut on the chi-square of the q/p difference of neighbouring triplets. Default
    /// `n_sigma^2`.
    pub neighbour_chi2_max: f64,
    /// Fewest hits of a track. Default 4 (3 on a detector of three planes).
    pub min_hits: usize,
    /// Cut on the Kalman fit's chi-square per degree of freedom. Default 5.
    pub max_chi2_ndf: f64,
    /// A short track whose hits all lie this close (mm) to a longer track's trajectory is
    /// its clone. Default `n_sigma` times the scattering displacement over the detector at
    /// the minimum momentum, at least 10 hit resolutions.
    pub clone_window_mm: f64,
    /// Kalman fit settings.
    pub fit: FitConfig,
    /// Buffer sizes.
    pub limits: Limits,
}

impl FinderConfig {
    /// Cuts derived from the detector for tracks above `min_p_gev`.
    pub fn from_detector(det: &Detector, min_p_gev: f64) -> Self {
        let min_p = if min_p_gev.is_finite() && min_p_gev > 0.0 {
            min_p_gev
        } else {
            1.0
        };
        let origin_z_mm = 0.0;
        let momentum_slack = 1.15;
        let fit = FitConfig::from_detector(det);
        // Slope limits from the acceptance seen from the origin.
        let mut tx_geo: f64 = 0.0;
        let mut ty_geo: f64 = 0.0;
        for p in &det.planes {
            let lever = p.z_mm - origin_z_mm;
            if lever > 1.0 {
                tx_geo = tx_geo.max(p.half_x_mm / lever);
                ty_geo = ty_geo.max(p.half_y_mm / lever);
            }
        }
        if tx_geo == 0.0 {
            tx_geo = 1.0;
            ty_geo = 1.0;
        }
        let (cx0, cy0) =
            ca::max_curvature_per_mm(det, origin_z_mm, min_p / momentum_slack, tx_geo, ty_geo);
        let length = det
            .planes
            .last()
            .map(|p| p.z_mm - origin_z_mm)
            .unwrap_or(0.0)
            .max(0.0);
        let max_tx = (tx_geo + cx0 * length).min(3.0);
        let max_ty = (ty_geo + cy0 * length).min(3.0);
        let (cx, cy) =
            ca::max_curvature_per_mm(det, origin_z_mm, min_p / momentum_slack, max_tx, max_ty);
        let slope_factor = ca::slope_factor(max_tx, max_ty);
        let n_sigma: f64 = 4.0;
        let mut cfg = FinderConfig {
            min_p_gev: min_p,
            momentum_slack,
            origin_z_mm,
            origin_half_x_mm: 1.5,
            origin_half_y_mm: 1.5,
            max_tx,
            max_ty,
            max_curvature_x_per_mm: cx,
            max_curvature_y_per_mm: cy,
            slope_factor,
            n_sigma,
            allow_missing_plane: true,
            first_pass_min_hits: 0,
            first_pass_to_last_plane: true,
            follow_seeds: true,
            follow_seeds_min_hits: 2000,
            bins_x: 8,
            bins_y: 128,
            triplet_chi2_max: n_sigma * n_sigma + if fit.fit_momentum { 0.0 } else { 2.0 },
            neighbour_chi2_max: n_sigma * n_sigma,
            min_hits: if det.planes.len() >= 4 { 4 } else { 3 },
            max_chi2_ndf: 5.0,
            clone_window_mm: 0.0,
            fit,
            limits: Limits::default(),
        };
        cfg.first_pass_min_hits = det.planes.len().saturating_sub(1).max(cfg.min_hits);
        let geo = FinderGeometry::new(det, &cfg);
        let sigma_max = det
            .planes
            .iter()
            .map(|p| p.sigma_x_mm.max(p.sigma_y_mm))
            .fold(0.0, f64::max);
        let ms = geo.planes.last().map(|g| g.ms_origin_mm).unwrap_or(0.0);
        cfg.clone_window_mm = (n_sigma * ms * slope_factor).max(10.0 * sigma_max);
        cfg
    }

    /// Derived cuts with the given overrides applied.
    pub fn from_detector_with(det: &Detector, min_p_gev: f64, ov: &FinderOverrides) -> Self {
        let min_p = ov.min_p_gev.unwrap_or(min_p_gev);
        let mut c = FinderConfig::from_detector(det, min_p);
        ov.apply(&mut c);
        c
    }

    /// Largest |q/p| the cuts accept, e/(GeV/c).
    pub fn qop_max(&self) -> f64 {
        self.momentum_slack / self.min_p_gev
    }

    /// Checks the values make sense for `det`; the message names the field.
    pub fn validate(&self, det: &Detector) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: reason.to_string(),
            })
        };
        if det.planes.len() < 3 {
            return bad(
                "planes",
                "the detector needs at least 3 planes to find tracks",
            );
        }
        if det.planes.len() > MAX_PLANES {
            return bad("planes", "too many planes (at most 64)");
        }
        if !(self.min_p_gev > 0.0 && self.min_p_gev.is_finite()) {
            return bad("min_p_gev", "must be positive");
        }
        for (name, v) in [
            ("momentum_slack", self.momentum_slack),
            ("n_sigma", self.n_sigma),
            ("max_tx", self.max_tx),
            ("max_ty", self.max_ty),
            ("slope_factor", self.slope_factor),
            ("triplet_chi2_max", self.triplet_chi2_max),
            ("neighbour_chi2_max", self.neighbour_chi2_max),
            ("max_chi2_ndf", self.max_chi2_ndf),
        ] {
            if v.is_nan() || v <= 0.0 {
                return bad(name, "must be positive");
            }
        }
        for (name, v) in [
            ("origin_half_x_mm", self.origin_half_x_mm),
            ("origin_half_y_mm", self.origin_half_y_mm),
            ("max_curvature_x_per_mm", self.max_curvature_x_per_mm),
            ("max_curvature_y_per_mm", self.max_curvature_y_per_mm),
            ("clone_window_mm", self.clone_window_mm),
        ] {
            if v.is_nan() || v < 0.0 {
                return bad(name, "must be zero or positive");
            }
        }
        if self.min_hits < 3 || self.min_hits > det.planes.len() {
            return bad(
                "min_hits",
                "must be at least 3 and at most the number of planes",
            );
        }
        if self.first_pass_min_hits < self.min_hits {
            return bad("first_pass_min_hits", "must be at least min_hits");
        }
        if self.bins_x == 0 || self.bins_y == 0 || self.bins_x > 1024 || self.bins_y > 1024 {
            return bad("bins_x/bins_y", "must be between 1 and 1024");
        }
        let l = &self.limits;
        if [
            l.max_hits,
            l.max_doublets,
            l.max_triplets,
            l.max_neighbours,
            l.max_candidates,
            l.max_tracks,
        ]
        .contains(&0)
        {
            return bad("limits", "every limit must be positive");
        }
        if l.max_hits > u32::MAX as usize / 2
            || l.max_doublets > u32::MAX as usize / 2
            || l.max_triplets > u32::MAX as usize / 2
        {
            return bad("limits", "limits must stay below 2^31");
        }
        let positive = |v: f64| v > 0.0 && v.is_finite();
        if !positive(self.fit.max_step_mm)
            || !positive(self.fit.p_no_field_gev)
            || !positive(self.fit.qop_prior_floor)
        {
            return bad(
                "fit",
                "max_step_mm, p_no_field_gev and qop_prior_floor must be positive",
            );
        }
        Ok(())
    }
}

/// A configuration error.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("finder.{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Overrides of the derived cuts, as read from a TOML `[finder]` table; absent keys keep
/// the derived value. Unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinderOverrides {
    pub min_p_gev: Option<f64>,
    pub momentum_slack: Option<f64>,
    pub origin_z_mm: Option<f64>,
    pub origin_half_x_mm: Option<f64>,
    pub origin_half_y_mm: Option<f64>,
    pub max_tx: Option<f64>,
    pub max_ty: Option<f64>,
    pub max_curvature_x_per_mm: Option<f64>,
    pub max_curvature_y_per_mm: Option<f64>,
    pub slope_factor: Option<f64>,
    pub n_sigma: Option<f64>,
    pub allow_missing_plane: Option<bool>,
    pub first_pass_min_hits: Option<usize>,
    pub first_pass_to_last_plane: Option<bool>,
    pub follow_seeds: Option<bool>,
    pub follow_seeds_min_hits: Option<usize>,
    pub bins_x: Option<usize>,
    pub bins_y: Option<usize>,
    pub triplet_chi2_max: Option<f64>,
    pub neighbour_chi2_max: Option<f64>,
    pub min_hits: Option<usize>,
    pub max_chi2_ndf: Option<f64>,
    pub clone_window_mm: Option<f64>,
    pub fit: FitOverrides,
    pub limits: Option<Limits>,
}

/// Overrides of [`FitConfig`] (`[finder.fit]`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FitOverrides {
    pub max_step_mm: Option<f64>,
    pub fit_momentum: Option<bool>,
    pub p_no_field_gev: Option<f64>,
    pub qop_prior_rel: Option<f64>,
    pub qop_prior_floor: Option<f64>,
    pub mass_gev: Option<f64>,
}

impl FinderOverrides {
    /// Parses a `[finder]` table's text (the table's contents, not the header).
    pub fn from_toml_str(s: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(s)
    }

    fn apply(&self, c: &mut FinderConfig) {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { c.$f = v; } )* };
        }
        set!(
            min_p_gev,
            momentum_slack,
            origin_z_mm,
            origin_half_x_mm,
            origin_half_y_mm,
            max_tx,
            max_ty,
            max_curvature_x_per_mm,
            max_curvature_y_per_mm,
            slope_factor,
            n_sigma,
            allow_missing_plane,
            first_pass_min_hits,
            first_pass_to_last_plane,
            follow_seeds,
            follow_seeds_min_hits,
            bins_x,
            bins_y,
            triplet_chi2_max,
            neighbour_chi2_max,
            min_hits,
            max_chi2_ndf,
            clone_window_mm
        );
        if self.first_pass_min_hits.is_none() {
            // The derived value follows an overridden `min_hits`.
            c.first_pass_min_hits = c.first_pass_min_hits.max(c.min_hits);
        }
        let f = &self.fit;
        macro_rules! set_fit {
            ($($f:ident),*) => { $( if let Some(v) = f.$f { c.fit.$f = v; } )* };
        }
        set_fit!(
            max_step_mm,
            fit_momentum,
            p_no_field_gev,
            qop_prior_rel,
            qop_prior_floor,
            mass_gev
        );
        if let Some(l) = &self.limits {
            c.limits = l.clone();
        }
    }
}

/// Time spent in each step, nanoseconds, accumulated over events until reset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    pub events: u64,
    pub hit_sorting_ns: u64,
    pub doublets_ns: u64,
    pub triplets_ns: u64,
    pub neighbours_ns: u64,
    pub evolution_ns: u64,
    pub candidates_ns: u64,
    /// Kalman fits of the candidates (inside the candidates step).
    pub fit_ns: u64,
    pub clones_ns: u64,
    /// Work counters (for throughput per step).
    pub hits: u64,
    pub doublets: u64,
    pub triplets: u64,
    pub candidates: u64,
    pub tracks: u64,
}

impl StepTimes {
    /// `(step name, nanoseconds)` in execution order.
    pub fn steps(&self) -> [(&'static str, u64); 8] {
        [
            ("hit_sorting", self.hit_sorting_ns),
            ("doublets", self.doublets_ns),
            ("triplets", self.triplets_ns),
            ("neighbours", self.neighbours_ns),
            ("evolution", self.evolution_ns),
            ("candidates", self.candidates_ns),
            ("fit", self.fit_ns),
            ("clones", self.clones_ns),
        ]
    }
    pub fn total_ns(&self) -> u64 {
        self.steps().iter().map(|s| s.1).sum()
    }
}

/// Track reconstruction for one detector; one per worker thread (it owns its buffers).
#[derive(Debug)]
pub struct Reconstructor {
    cfg: FinderConfig,
    geo: FinderGeometry,
    fitter: KalmanFitter,
    buf: CaBuffers,
    spare: Vec<Track>,
    times: StepTimes,
    last_overflow: Overflow,
    overflow_events: u64,
    clones_removed: u64,
}

impl Reconstructor {
    /// Builds the tables and reserves every buffer to its limit. The configuration should
    /// have passed [`FinderConfig::validate`]; planes beyond 64 are ignored.
    pub fn new(det: &Detector, cfg: FinderConfig) -> Self {
        let geo = FinderGeometry::new(det, &cfg);
        let fitter = KalmanFitter::new(det, cfg.fit.clone());
        let buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        Reconstructor {
            cfg,
            geo,
            fitter,
            buf,
            spare: Vec::new(),
            times: StepTimes::default(),
            last_overflow: Overflow::default(),
            overflow_events: 0,
            clones_removed: 0,
        }
    }

    pub fn config(&self) -> &FinderConfig {
        &self.cfg
    }

    pub fn fitter(&self) -> &KalmanFitter {
        &self.fitter
    }

    /// Accumulated per-step times.
    pub fn step_times(&self) -> StepTimes {
        self.times
    }

    pub fn reset_step_times(&mut self) {
        self.times = StepTimes::default();
    }

    /// What was dropped in the last event (buffers full, bad hits).
    pub fn last_overflow(&self) -> Overflow {
        self.last_overflow
    }

    /// Events in which some buffer overflowed, since construction.
    pub fn overflow_events(&self) -> u64 {
        self.overflow_events
    }

    /// Clone tracks removed since construction.
    pub fn clones_removed(&self) -> u64 {
        self.clones_removed
    }

    /// Finds and fits the tracks of one event; `out` is replaced (its `Track`s and their hit
    /// vectors are reused, so a warmed-up reconstructor does not allocate).
    pub fn reconstruct(&mut self, hits: &[HitRecord], out: &mut Vec<Track>) {
        let t0 = Instant::now();
        self.buf.overflow = Overflow::default();
        ca::hit_sorting::sort_hits(&self.geo, hits, self.cfg.limits.max_hits, &mut self.buf);
        let t1 = Instant::now();
        self.times.hit_sorting_ns += (t1 - t0).as_nanos() as u64;
        let n_planes = self.geo.planes.len();
        let two_pass = self.cfg.allow_missing_plane && self.cfg.first_pass_min_hits <= n_planes;
        if two_pass {
            // Tracks without a gap first, on consecutive-plane doublets; then the hits left,
            // with doublets skipping a plane.
            let to_last_plane = self.cfg.first_pass_to_last_plane;
            self.find_pass(1, self.cfg.first_pass_min_hits, to_last_plane, false);
            self.find_pass(2, self.cfg.min_hits, false, true);
        } else {
            let reach = if self.cfg.allow_missing_plane { 2 } else { 1 };
            self.find_pass(reach, self.cfg.min_hits, false, false);
        }
        let t6 = Instant::now();
        self.clones_removed +=
            ca::clones::suppress_clones(&self.geo, &self.cfg, &mut self.buf) as u64;
        self.write_tracks(out);
        let t9 = Instant::now();

        let t = &mut self.times;
        t.events += 1;
        t.clones_ns += (t9 - t6).as_nanos() as u64;
        t.hits += self.buf.hits.x_mm.len() as u64;
        t.candidates += self.buf.candidates.len() as u64;
        t.tracks += out.len() as u64;
        self.last_overflow = self.buf.overflow;
        if self.buf.overflow.any() {
            self.overflow_events += 1;
        }
    }

    /// One pass of the cellular automaton on the hits not used yet: doublets on planes up to
    /// `reach` apart, triplets, neighbours, evolution, then candidates of at least
    /// `min_hits` hits (appended to the earlier pass's when `append`). With
    /// `to_last_plane` (reach 1), only chains that end on the last plane or may leave
    /// the detector before it ([`ca::triplets::prune_dead_ends`]).
    fn find_pass(&mut self, reach: usize, min_hits: usize, to_last_plane: bool, append: bool) {
        let t1 = Instant::now();
        let n_planes = self.geo.planes.len();
        // Tracks of `min_hits` hits on consecutive planes end on one of this many last planes.
        let seed_planes = (n_planes + 1).saturating_sub(min_hits.max(3));
        let dense = self.buf.hits.x_mm.len() >= self.cfg.follow_seeds_min_hits;
        let t2 = if reach == 1 && self.cfg.follow_seeds && dense && seed_planes + 1 < n_planes {
            let kernel = ca::Kernel::detect();
            let (geo, cfg) = (&self.geo, &self.cfg);
            let a_planes = ca::triplets::seed_doublet_planes(n_planes, seed_planes);
            ca::doublets::find_doublets_with(kernel, geo, cfg, 1, a_planes, &mut self.buf);
            let t2 = Instant::now();
            let buf = &mut self.buf;
            ca::triplets::find_triplets_seeded_with(
                kernel,
                geo,
                cfg,
                seed_planes,
                to_last_plane,
                buf,
            );
            t2
        } else {
            ca::doublets::find_doublets(&self.geo, &self.cfg, reach, &mut self.buf);
            let t2 = Instant::now();
            ca::triplets::find_triplets(&self.geo, &self.cfg, reach, &mut self.buf);
            if to_last_plane && reach == 1 {
                let first_end_plane = n_planes - seed_planes.min(n_planes);
                ca::triplets::prune_dead_ends(&self.geo, first_end_plane, &mut self.buf);
            }
            t2
        };
        let t3 = Instant::now();
        ca::neighbours::find_neighbours(&self.cfg, &mut self.buf);
        let t4 = Instant::now();
        ca::evolution::evolve(&mut self.buf, self.geo.planes.len());
        let t5 = Instant::now();
        let fit_ns = ca::candidates::extract_and_select(
            &self.cfg,
            &self.fitter,
            &mut self.buf,
            min_hits,
            append,
        );
        let t6 = Instant::now();
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
        let t = &mut self.times;
        t.doublets_ns += ns(t1, t2);
        t.triplets_ns += ns(t2, t3);
        t.neighbours_ns += ns(t3, t4);
        t.evolution_ns += ns(t4, t5);
        // Extraction and greedy selection interleave with the fits (chunks of candidates).
        t.candidates_ns += ns(t5, t6).saturating_sub(fit_ns);
        t.fit_ns += fit_ns;
        t.doublets += self.buf.doublets.len() as u64;
        t.triplets += self.buf.triplets.len() as u64;
    }

    fn write_tracks(&mut self, out: &mut Vec<Track>) {
        let n = self.buf.accepted.len();
        while out.len() > n {
            if let Some(t) = out.pop() {
                self.spare.push(t);
            }
        }
        while out.len() < n {
            out.push(self.spare.pop().unwrap_or_default());
        }
        for (t, &k) in out.iter_mut().zip(&self.buf.accepted) {
            let c = &self.buf.candidates[k as usize];
            t.hits.clear();
            for &h in &self.buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
            {
                t.hits.push(self.buf.hits.input_index[h as usize]);
            }
            self.buf.fits[c.fit as usize].write_track(t);
        }
    }
}

/// Small synthetic events for tests: straight lines and helices through a simple
/// detector, with optional multiple scattering and smearing.
#[cfg(test)]
pub(crate) mod synthetic {
    use crate::frame::HitRecord;
    use crate::tracking::geometry::{Detector, Field, Plane};
    use crate::tracking::propagate::propagate;
    use rand::Rng;
    use rand_distr::StandardNormal;

    /// `n` planes from z = 300 mm every 100 mm, 300 mm half size.
    pub fn detector(n: usize, b_tesla: [f64; 3], x0: f64, sigma_mm: f64) -> Detector {
        Detector {
            planes: (0..n)
                .map(|i| Plane {
                    z_mm: 300.0 + 100.0 * i as f64,
                    half_x_mm: 300.0,
                    half_y_mm: 300.0,
                    sigma_x_mm: sigma_mm,
                    sigma_y_mm: sigma_mm,
                    x0_fraction: x0,
                    efficiency: 1.0,
                })
                .collect(),
            field: Field::Uniform { b_tesla },
        }
    }

    /// A particle from `(x, y, 0)` with slopes and q/p; appends its hits (plane order) and
    /// returns the indices of its hits and the true states just after each plane.
    pub fn track(
        det: &Detector,
        start: [f64; 5],
        scatter: bool,
        smear: bool,
        rng: &mut impl Rng,
        hits: &mut Vec<HitRecord>,
    ) -> (Vec<u32>, Vec<[f64; 5]>) {
        let mut s = start;
        let mut z = 0.0;
        let mut ids = Vec::new();
        let mut states = Vec::new();
        let p = 1.0 / start[4].abs().max(1e-9);
        let beta2 = p * p / (p * p + 0.139_570_39f64.powi(2));
        for (i, pl) in det.planes.iter().enumerate() {
            let (s2, _) = propagate(&det.field, z, s, pl.z_mm, 20.0);
            s = s2;
            z = pl.z_mm;
            if scatter && pl.x0_fraction > 0.0 {
                let n2 = 1.0 + s[2] * s[2] + s[3] * s[3];
                let xr = pl.x0_fraction * n2.sqrt();
                let th =
                    0.0136 / (beta2.sqrt() * p) * xr.sqrt() * (1.0 + 0.038 * (xr / beta2).ln());
                // Covariance of the slope kick; sample by Cholesky.
                let a = th * th * (1.0 + s[2] * s[2]) * n2;
                let c = th * th * (1.0 + s[3] * s[3]) * n2;
                let b = th * th * s[2] * s[3] * n2;
                let l11 = a.sqrt();
                let l21 = b / l11;
                let l22 = (c - l21 * l21).sqrt();
                let (u, v): (f64, f64) = (rng.sample(StandardNormal), rng.sample(StandardNormal));
                s[2] += l11 * u;
                s[3] += l21 * u + l22 * v;
            }
            let (mut x, mut y) = (s[0], s[1]);
            if smear {
                x += pl.sigma_x_mm * rng.sample::<f64, _>(StandardNormal);
                y += pl.sigma_y_mm * rng.sample::<f64, _>(StandardNormal);
            }
            ids.push(hits.len() as u32);
            states.push(s);
            hits.push(HitRecord {
                x_mm: x as f32,
                y_mm: y as f32,
                z_mm: pl.z_mm as f32,
                plane: i as u16,
                hit_id: hits.len() as u32 + 1,
            });
        }
        (ids, states)
    }
}

#[cfg(test)]
mod tests {
    use super::synthetic::{detector, track};
    use super::*;
    use crate::tracking::kalman::FitHit;
    use crate::tracking::track::Track;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn fit_hits(hits: &[HitRecord], ids: &[u32]) -> Vec<FitHit> {
        ids.iter()
            .map(|&i| FitHit {
                plane: hits[i as usize].plane,
                x_mm: hits[i as usize].x_mm,
                y_mm: hits[i as usize].y_mm,
            })
            .collect()
    }

    #[test]
    fn following_the_seeds_finds_the_tracks_of_the_full_search() {
        use crate::tracking::simulate::{simulate_events, Preset, SimConfig};
        // The spectrometer (uniform field), the field-free telescope, the spectrometer
        // in a dipole field map and the forward tracker in a field concentrated between
        // its planes; the first pass with or without early track ends. Where the planes
        // upstream of a magnet see no field, their doublets do not measure the momentum,
        // the continuations into the magnet may bend by anything the momentum cut allows,
        // and the seeded pass saves less.
        let forward = "fixtures/tracking/forward/detector_forward.toml";
        let dipole = "fixtures/tracking/dipole/detector_dipole.toml";
        for (file, n_central, to_last_plane, saving) in [
            ("fixtures/detector.toml", 2, true, 0.75),
            ("fixtures/detector.toml", 1, false, 0.75),
            ("fixtures/telescope.toml", 1, true, 0.75),
            (dipole, 1, true, 1.0),
            (dipole, 1, false, 1.0),
            (forward, 1, true, 0.85),
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file))
                .expect("fixtures (tests run from the crate root)");
            let derived = FinderConfig {
                first_pass_to_last_plane: to_last_plane,
                ..FinderConfig::from_detector(&det, 1.0)
            };
            let full_cfg = FinderConfig {
                follow_seeds: false,
                ..derived.clone()
            };
            // Seeds followed in every event (by default only in dense ones).
            let seeded_cfg = FinderConfig {
                follow_seeds_min_hits: 0,
                ..derived
            };
            let mut seeded = Reconstructor::new(&det, seeded_cfg);
            let mut full = Reconstructor::new(&det, full_cfg);
            let key = |t: &[Track]| {
                let mut v: Vec<(Vec<u32>, u32)> = t
                    .iter()
                    .map(|t| (t.hits.clone(), t.chi2.to_bits()))
                    .collect();
                v.sort();
                v
            };
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut n_tracks = [0; 2];
            for (k, preset, n) in [(0, Preset::Minbias, 10), (1, Preset::Central, n_central)] {
                for ev in simulate_events(&det, &SimConfig::preset(preset), 3, 0, n) {
                    seeded.reconstruct(&ev.hits, &mut a);
                    full.reconstruct(&ev.hits, &mut b);
                    n_tracks[k] += b.len();
                    assert_eq!(key(&a), key(&b), "{file} {preset:?} {to_last_plane}");
                }
            }
            assert!(
                n_tracks[0] > 20 && n_tracks[1] > 100,
                "{file}: {n_tracks:?}"
            );
            // The seeded pass looks at a fraction of the doublets.
            let (sa, sb) = (seeded.step_times(), full.step_times());
            assert!(
                (sa.doublets as f64) < sb.doublets as f64 * saving,
                "{file}: {} vs {}",
                sa.doublets,
                sb.doublets
            );
        }
    }

    #[test]
    fn straight_track_without_field_is_found_and_fitted_exactly() {
        let det = detector(6, [0.0; 3], 0.003, 0.01);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut hits = Vec::new();
        let (ids, states) = track(
            &det,
            [0.2, -0.3, 0.05, -0.08, 0.2],
            false,
            false,
            &mut rng,
            &mut hits,
        );
        let cfg = FinderConfig::from_detector(&det, 1.0);
        cfg.validate(&det).unwrap();
        let mut reco = Reconstructor::new(&det, cfg);
        let mut tracks = Vec::new();
        reco.reconstruct(&hits, &mut tracks);
        assert_eq!(tracks.len(), 1, "{tracks:?}");
        let t = &tracks[0];
        assert_eq!(t.hits, ids);
        assert_eq!(t.state.z_mm, 300.0);
        assert!(
            (t.state.x_mm as f64 - states[0][0]).abs() < 2e-4,
            "x {}",
            t.state.x_mm
        );
        assert!((t.state.y_mm as f64 - states[0][1]).abs() < 2e-4);
        assert!((t.state.tx as f64 - 0.05).abs() < 1e-6, "tx {}", t.state.tx);
        assert!((t.state.ty as f64 + 0.08).abs() < 1e-6);
        assert!(t.chi2 < 1e-2, "chi2 {}", t.chi2);
        assert_eq!(t.ndf, 8);
    }

    #[test]
    fn f32_lanes_agree_with_f64_reference_fit() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let fitter = KalmanFitter::new(&det, FitConfig::from_detector(&det));
        let mut hits = Vec::new();
        let mut all = Vec::new();
        for k in 0..11 {
            let q = if k % 2 == 0 { 1.0 } else { -1.0 };
            let p = 1.0 + k as f64;
            let (ids, _) = track(
                &det,
                [0.1, 0.2, 0.02 * k as f64 - 0.1, 0.05, q / p],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            all.push(fit_hits(&hits, &ids));
        }
        let refs: Vec<&[FitHit]> = all.iter().map(|v| &v[..]).collect();
        let mut out = Vec::new();
        fitter.fit_batch(&refs, &mut out);
        for (k, h) in all.iter().enumerate() {
            let r = fitter.fit_reference(h);
            let o = &out[k];
            assert!(o.ok && r.ok);
            for i in 0..5 {
                let sigma = r.cov[crate::tracking::kalman::tri(i, i)].sqrt();
                assert!(
                    (o.state[i] - r.state[i]).abs() < 0.02 * sigma,
                    "track {k} param {i}: {} vs {} (sigma {sigma})",
                    o.state[i],
                    r.state[i]
                );
                let rel = (o.cov[crate::tracking::kalman::tri(i, i)]
                    / r.cov[crate::tracking::kalman::tri(i, i)]
                    - 1.0)
                    .abs();
                assert!(rel < 1e-2, "track {k} var {i} rel {rel}");
            }
            assert!((o.chi2 - r.chi2).abs() < 1e-2 * (1.0 + r.chi2));
        }
    }

    /// Pulls of the Kalman fit on simulated helices with scattering and smearing.
    #[test]
    fn helix_fit_pulls_are_standard_normal() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let fitter = KalmanFitter::new(&det, FitConfig::from_detector(&det));
        let n = 2000;
        let mut sum = [0.0f64; 5];
        let mut sum2 = [0.0f64; 5];
        let mut chi2 = 0.0;
        let mut ndf = 0.0;
        for k in 0..n {
            let mut hits = Vec::new();
            let p = 1.0 + 20.0 * (k as f64 / n as f64).powi(2);
            let q = if k % 2 == 0 { 1.0 } else { -1.0 };
            let (ids, states) = track(
                &det,
                [
                    0.0,
                    0.0,
                    0.15 * ((k % 7) as f64 / 3.0 - 1.0),
                    0.1 * ((k % 5) as f64 / 2.0 - 1.0),
                    q / p,
                ],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            let mut out = Vec::new();
            fitter.fit_batch(&[&fit_hits(&hits, &ids)], &mut out);
            let o = out[0];
            assert!(o.ok);
            chi2 += o.chi2;
            ndf += o.ndf as f64;
            for i in 0..5 {
                let pull =
                    (o.state[i] - states[0][i]) / o.cov[crate::tracking::kalman::tri(i, i)].sqrt();
                sum[i] += pull;
                sum2[i] += pull * pull;
            }
        }
        for i in 0..5 {
            let mean = sum[i] / n as f64;
            let width = (sum2[i] / n as f64 - mean * mean).sqrt();
            assert!(mean.abs() < 0.1, "param {i} pull mean {mean}");
            assert!((width - 1.0).abs() < 0.1, "param {i} pull width {width}");
        }
        let r = chi2 / ndf;
        assert!((r - 1.0).abs() < 0.1, "chi2/ndf {r}");
    }

    #[test]
    fn helix_in_uniform_field_is_found_with_its_momentum() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let mut reco = Reconstructor::new(&det, cfg);
        let mut tracks = Vec::new();
        for &(p, q) in &[(1.5, 1.0), (3.0, -1.0), (10.0, 1.0), (40.0, -1.0)] {
            let mut hits = Vec::new();
            let (ids, states) = track(
                &det,
                [0.1, -0.1, 0.1 * q, 0.05, q / p],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            reco.reconstruct(&hits, &mut tracks);
            assert_eq!(tracks.len(), 1);
            assert_eq!(tracks[0].hits, ids);
            let t = &tracks[0];
            let sigma = t.var(4).sqrt() as f64;
            let pull = (t.state.qop as f64 - states[0][4]) / sigma;
            assert!(
                pull.abs() < 4.0,
                "p {p}: qop {} true {} sigma {sigma}",
                t.state.qop,
                states[0][4]
            );
            assert!(
                sigma < 0.05 * states[0][4].abs(),
                "resolution {sigma} at p {p}"
            );
        }
    }

    #[test]
    fn two_crossing_tracks_are_both_found_without_swapped_hits() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // Opposite charges with slopes chosen so they cross in x near the middle plane.
        let mut hits = Vec::new();
        let (a, _) = track(
            &det,
            [0.0, 0.0, 0.10, 0.02, 1.0 / 2.0],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let (b, _) = track(
            &det,
            [0.0, 0.0, -0.03, 0.021, -1.0 / 2.0],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let mut reco = Reconstructor::new(&det, cfg);
        let mut tracks: Vec<Track> = Vec::new();
        reco.reconstruct(&hits, &mut tracks);
        assert_eq!(tracks.len(), 2, "{tracks:?}");
        let mut found: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
        found.sort();
        let mut want = vec![a, b];
        want.sort();
        assert_eq!(found, want);
        for t in &tracks {
            assert!(
                t.state.qop.signum()
                    == if t.hits == want[0] || t.hits == want[1] {
                        t.state.qop.signum()
                    } else {
                        0.0
                    }
            );
        }
    }

    #[test]
    fn track_with_a_gap_is_found_whole_in_the_second_pass() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut hits = Vec::new();
        let (a, _) = track(
            &det,
            [0.0, 0.0, 0.08, 0.03, 1.0 / 3.0],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let (mut b, _) = track(
            &det,
            [0.1, 0.0, -0.06, -0.04, -1.0 / 1.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        // The second particle misses plane 3: its last hit moves into the gap's slot.
        let gap = b.remove(3) as usize;
        hits.swap_remove(gap);
        let moved = b.iter_mut().find(|h| **h == hits.len() as u32).unwrap();
        *moved = gap as u32;
        let cfg = FinderConfig::from_detector(&det, 1.0);
        assert_eq!(cfg.first_pass_min_hits, 7);
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let mut tracks = Vec::new();
        reco.reconstruct(&hits, &mut tracks);
        let mut found: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
        found.sort();
        let mut want = vec![a, b];
        want.sort();
        assert_eq!(found, want);
        // Without plane-skipping doublets the gapped track falls apart.
        let one = FinderConfig {
            allow_missing_plane: false,
            ..cfg
        };
        let mut reco = Reconstructor::new(&det, one);
        reco.reconstruct(&hits, &mut tracks);
        assert!(tracks.iter().all(|t| t.hits.len() < 7 || t.hits.len() == 8));
    }

    #[test]
    fn overrides_replace_derived_values_and_refuse_unknown_keys() {
        let det = detector(6, [0.0, 1.0, 0.0], 0.004, 0.01);
        let ov = FinderOverrides::from_toml_str(
            "n_sigma = 5.0\nmin_hits = 5\n[fit]\nmax_step_mm = 25.0\n",
        )
        .unwrap();
        let c = FinderConfig::from_detector_with(&det, 1.0, &ov);
        assert_eq!(c.n_sigma, 5.0);
        assert_eq!(c.min_hits, 5);
        assert_eq!(c.fit.max_step_mm, 25.0);
        let all = FinderOverrides::from_toml_str("min_hits = 6").unwrap();
        let c6 = FinderConfig::from_detector_with(&det, 1.0, &all);
        assert_eq!(c6.first_pass_min_hits, 6);
        assert!(c6.validate(&det).is_ok());
        assert!(c.validate(&det).is_ok());
        assert!(FinderOverrides::from_toml_str("n_sigmas = 5.0").is_err());
        let low = FinderConfig {
            first_pass_min_hits: 4,
            ..c.clone()
        };
        assert!(matches!(
            low.validate(&det),
            Err(ConfigError::Invalid {
                field: "first_pass_min_hits",
                ..
            })
        ));
        let bad = FinderConfig { min_hits: 9, ..c };
        assert!(matches!(
            bad.validate(&det),
            Err(ConfigError::Invalid {
                field: "min_hits",
                ..
            })
        ));
    }

    #[test]
    fn buffers_overflow_is_counted_not_fatal() {
        let det = detector(6, [0.0, 0.5, 0.0], 0.004, 0.01);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        cfg.limits.max_hits = 10;
        cfg.limits.max_doublets = 5;
        let mut reco = Reconstructor::new(&det, cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let mut hits = Vec::new();
        for k in 0..5 {
            track(
                &det,
                [0.0, 0.0, 0.01 * k as f64, 0.0, 0.3],
                true,
                true,
                &mut rng,
                &mut hits,
            );
        }
        hits.push(HitRecord {
            x_mm: f32::NAN,
            y_mm: 0.0,
            z_mm: 300.0,
            plane: 0,
            hit_id: 99,
        });
        hits.push(HitRecord {
            x_mm: 0.0,
            y_mm: 0.0,
            z_mm: 300.0,
            plane: 77,
            hit_id: 100,
        });
        let mut tracks = Vec::new();
        reco.reconstruct(&hits, &mut tracks);
        let o = reco.last_overflow();
        assert_eq!(o.bad_hits, 2);
        assert_eq!(o.hits, 20);
        assert!(o.doublets > 0);
        assert_eq!(reco.overflow_events(), 1);
    }
}
