//! Physics performance of a reconstruction against simulation truth: efficiency (overall
//! and versus momentum), ghost and clone rates, the TrackML double-majority score,
//! momentum resolution and the pulls of the five track parameters; with JSON, markdown
//! and plots (SVG and PNG).
//!
//! Definitions:
//! - A particle is *reconstructable* when it has hits on at least `min_planes` distinct
//!   planes and momentum at least `min_p_gev` (at the vertex when the particles file is
//!   there, else at its first hit).
//! - A track is *matched* to the particle that owns most of its hits when that particle owns
//!   at least `match_fraction` of them (default 70 %); otherwise it is a *ghost*.
//! - Efficiency: reconstructable particles with at least one matched track over all
//!   reconstructable particles. Ghost rate: ghosts over all tracks. Clone rate: matched
//!   tracks beyond the first of each particle over all matched tracks.
//! - TrackML score: each hit goes to the first track that holds it (the submission format
//!   allows one track per hit); a track counts when more than half of its hits belong to one
//!   particle and it holds more than half of that particle's hits; the event score is the
//!   summed truth weight of those shared hits over the event's total weight; the reported
//!   score is the mean over events. Weights come from the truth file (uniform over particle
//!   hits when it has none).
//! - Efficiency against the planes a reconstructable particle hit (distinct planes, from
//!   `min_planes` to the detector's plane count) and against its missing planes: planes
//!   inside its span that have no hit of it (an inefficient plane or a crack), that is
//!   `last plane - first plane + 1 - distinct planes`, so hits on planes 0, 1, 3, 4, 5 miss
//!   one; classes 0, 1, 2 and 3 or more. Both are counted over the same particles as the
//!   overall efficiency, so each table sums to its numerator and denominator.
//! - Ghost rate against momentum: ghosts and tracks per bin of the *fitted* momentum,
//!   `1 / |q/p|` of the track's state (a ghost has no true one), with the edges of the
//!   efficiency. Tracks whose fit did not measure the momentum (q/p of zero or not finite,
//!   as from a submission file without a fit, or a q/p error as large as the q/p itself,
//!   as the fit reports in a detector without field: [`Track::momentum_measured`]) are counted
//!   apart as *unmeasured*, not in the top bin; a fitted momentum outside the edges is in
//!   no bin.
//! - Ghosts by kind, from their hits in the order of z: *joined* (two particles' hits and
//!   no noise, one particle's run of hits followed by the other's: a segment continued by
//!   another particle's, where two come close), *mixed* (two particles, alternating),
//!   *several* (three particles or more) and *with noise* (at least one hit of no
//!   particle).
//! - Pulls: `(fitted - true) / sqrt(variance)` for x, y, tx, ty, q/p at the track's z, the
//!   truth state taken from the matched particle's truth hit at that z (transported with the
//!   detector's field when the particle has no hit there and a detector is given). Only
//!   tracks with a positive, finite covariance diagonal are used (a submission file carries
//!   no fit, so it gives no pulls or resolution). The q/p pull is taken for every track
//!   whose fit took q/p from its hits ([`Track::momentum_fitted`]: not the q/p a fit
//!   without field assumes; none where the configuration says the fit assumes it,
//!   [`EvalConfig::qop_assumed`]), however large its error: a cut on the error against the
//!   fitted q/p keeps the tracks whose fit strayed away from zero and drops those whose
//!   fit strayed towards it, and narrows the pulls where the error is half the q/p or
//!   more (a drawn detector of five thick planes in a weak dipole, `random:327`: 0.85 with
//!   the cut, 0.96 without). The momentum resolution only where the momentum was
//!   measured ([`Track::momentum_measured`]).
//! - Mean and width of pulls and resolutions are robust: start from the median and
//!   1.4826 × MAD, then iterate mean and standard deviation over the values within 3 widths
//!   until the selection no longer changes; the width is divided by 0.9866 (the standard
//!   deviation of a unit Gaussian truncated at ±3) so a Gaussian gives its sigma.
//!   Each comes with its standard error from the values inside the window: the mean's
//!   their standard deviation over √n, the width's from their fourth moment, √((m4 − s⁴)
//!   / n) / 2s (√(1/2n) of the width for a Gaussian). A pull's mean of 0.1 over 800
//!   tracks is 2.8 of its errors from zero: the errors tell a fluctuation from a bias.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use super::beam_spot::{BeamSpot, BeamSpotMeter};
use super::geometry::Detector;
use super::simulate::{self, HitTruth, Particle, StateVector};
use super::track::Track;
use crate::frame::HitRecord;

/// Momentum a particle needs to be reconstructable unless told otherwise, GeV/c (the
/// finder's default minimum momentum too: `backend::tracking::DEFAULT_MIN_P_GEV`).
pub const RECONSTRUCTABLE_MIN_P_GEV: f64 = 1.0;

/// Evaluation settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalConfig {
    /// Distinct planes with hits a particle needs to be reconstructable.
    pub min_planes: usize,
    /// Momentum a particle needs to be reconstructable, GeV/c.
    pub min_p_gev: f64,
    /// Fraction of a track's hits that must belong to one particle to match it.
    pub match_fraction: f64,
    /// Edges of the momentum bins for efficiency and resolution, GeV/c, increasing.
    pub p_bin_edges_gev: Vec<f64>,
    /// z of the plane the tracks' beam spot is measured on (the finder's origin), mm.
    pub origin_z_mm: f64,
    /// Fitted momentum from which tracks measure the beam spot, GeV/c (0: every track;
    /// [`crate::tracking::beam_spot::stiff_p_gev`] of the finder).
    pub beam_min_p_gev: f64,
    /// Whether the tracks' fit assumes q/p instead of measuring it (the finder's
    /// `fit.fit_momentum` off: no field, or one too weak to bend its tracks beyond the
    /// resolution): then no track gives a q/p pull. In a weak field such a fit still
    /// moves the assumed q/p's variance by a few per cent, so the tracks alone
    /// ([`Track::momentum_fitted`]) cannot tell it.
    pub qop_assumed: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            min_planes: simulate::RECONSTRUCTABLE_MIN_PLANES,
            min_p_gev: RECONSTRUCTABLE_MIN_P_GEV,
            match_fraction: 0.7,
            p_bin_edges_gev: vec![
                0.2, 0.5, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0,
            ],
            origin_z_mm: 0.0,
            beam_min_p_gev: 0.0,
            qop_assumed: false,
        }
    }
}

/// Why an event could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("event {event_id}: {n_truth} truth rows for {n_hits} hits")]
    TruthLength {
        event_id: u64,
        n_hits: usize,
        n_truth: usize,
    },
    #[error("event {event_id}: track {track} refers to hit index {index}, but the event has {n_hits} hits")]
    HitIndex {
        event_id: u64,
        track: usize,
        index: u32,
        n_hits: usize,
    },
}

/// Robust mean and width of a distribution (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct RobustStat {
    pub mean: f64,
    pub width: f64,
    /// Standard errors of `mean` and `width` (see the module documentation).
    pub mean_error: f64,
    pub width_error: f64,
    /// Values inside the final ±3 width window.
    pub n_used: usize,
    pub n_total: usize,
}

/// Robust mean and width of `values` (non-finite values are ignored).
pub fn robust_stat(values: &[f64]) -> RobustStat {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n_total = v.len();
    if v.is_empty() {
        return RobustStat {
            n_total: values.len(),
            ..Default::default()
        };
    }
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    let mut dev: Vec<f64> = v.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mut mean = median;
    let mut width = 1.4826 * dev[dev.len() / 2];
    let mut used = (0, v.len());
    for _ in 0..50 {
        let (lo, hi) = if width > 0.0 {
            (
                v.partition_point(|x| *x < mean - 3.0 * width),
                v.partition_point(|x| *x <= mean + 3.0 * width),
            )
        } else {
            (0, v.len())
        };
        let sel = &v[lo..hi];
        if sel.is_empty() {
            break;
        }
        let m = sel.iter().sum::<f64>() / sel.len() as f64;
        let var = sel.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / sel.len() as f64;
        let w = var.sqrt() / 0.9866;
        let converged = (lo, hi) == used;
        mean = m;
        width = w;
        used = (lo, hi);
        if converged || w == 0.0 {
            break;
        }
    }
    // The errors from the values of the final window, about its mean.
    let sel = &v[used.0..used.1];
    let n = sel.len().max(1) as f64;
    let var = sel.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let m4 = sel.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n;
    let mean_error = (var / n).sqrt();
    let width_error = if var > 0.0 {
        ((m4 - var * var).max(0.0) / n).sqrt() / (2.0 * var.sqrt()) / 0.9866
    } else {
        0.0
    };
    RobustStat {
        mean,
        width,
        mean_error,
        width_error,
        n_used: used.1 - used.0,
        n_total,
    }
}

/// One momentum bin of the efficiency and resolution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MomentumBin {
    pub p_lo_gev: f64,
    pub p_hi_gev: f64,
    /// Particles with hits on enough planes (whatever their momentum) in this bin.
    pub n_particles: usize,
    pub n_found: usize,
    pub efficiency: f64,
    /// Binomial standard error.
    pub efficiency_error: f64,
    /// (p_fit - p_true) / p_true in this bin.
    pub resolution: RobustStat,
}

/// Efficiency of the reconstructable particles in one class (planes hit, missing planes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassBin {
    /// The class: the number of planes (the last bin: this many or more).
    pub value: usize,
    pub n_particles: usize,
    pub n_found: usize,
    pub efficiency: f64,
    pub efficiency_error: f64,
}

/// Ghosts among the tracks of one bin of fitted momentum.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GhostBin {
    pub p_lo_gev: f64,
    pub p_hi_gev: f64,
    pub n_tracks: usize,
    pub n_ghosts: usize,
    pub ghost_rate: f64,
}

/// Ghosts by the hits they join ([`EvalReport::ghost_kinds`]); each ghost is of one kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GhostKinds {
    /// Two particles, no noise, one's hits all upstream of the other's.
    pub joined: usize,
    /// Two particles, no noise, their hits alternating along z.
    pub mixed: usize,
    /// Three particles or more, no noise.
    pub several: usize,
    /// At least one noise hit.
    pub with_noise: usize,
}

impl GhostKinds {
    /// Counts a ghost of `track`'s hits (`counts`: hits per particle id, 0 for noise).
    fn add(
        &mut self,
        track: &Track,
        hits: &[HitRecord],
        truth: &[HitTruth],
        counts: &HashMap<u64, usize>,
    ) {
        if counts.contains_key(&0) {
            self.with_noise += 1;
            return;
        }
        if counts.len() > 2 {
            self.several += 1;
            return;
        }
        // Two particles: how often the particle changes along z.
        let mut by_z: Vec<(f32, u64)> = track
            .hits
            .iter()
            .map(|&i| (hits[i as usize].z_mm, truth[i as usize].particle_id))
            .collect();
        by_z.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let changes = by_z.windows(2).filter(|w| w[0].1 != w[1].1).count();
        if changes <= 1 {
            self.joined += 1;
        } else {
            self.mixed += 1;
        }
    }
}

/// Largest class of missing planes reported on its own (the last bin holds more).
pub const MISSING_PLANES_MAX: usize = 3;

/// Pull of one track parameter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pull {
    pub parameter: &'static str,
    pub stat: RobustStat,
    /// Histogram over [`PULL_RANGE`] in [`PULL_BINS`] bins (values outside are not counted).
    pub histogram: Vec<u32>,
}

pub const PULL_RANGE: (f64, f64) = (-5.0, 5.0);
pub const PULL_BINS: usize = 40;
const PARAMETERS: [&str; 5] = ["x", "y", "tx", "ty", "qop"];

/// The result of an evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    pub config: EvalConfig,
    pub n_events: usize,
    pub n_tracks: usize,
    pub n_reconstructable: usize,
    pub n_reconstructed: usize,
    pub efficiency: f64,
    pub efficiency_error: f64,
    pub n_ghosts: usize,
    pub ghost_rate: f64,
    pub n_matched_tracks: usize,
    /// Matched tracks whose first (most upstream) hit is their particle's: on the plane
    /// nearest the target, the densest, a track may start on a neighbour's hit, which
    /// moves its state there (what vertexing reads).
    pub n_first_hit_own: usize,
    pub first_hit_purity: f64,
    pub n_clones: usize,
    pub clone_rate: f64,
    /// Mean over events of the TrackML double-majority score.
    pub trackml_score: f64,
    pub efficiency_vs_p: Vec<MomentumBin>,
    /// Efficiency by the number of distinct planes hit, from `min_planes` up to the
    /// detector's plane count (without a detector: up to the most planes a particle hit).
    pub efficiency_vs_planes: Vec<ClassBin>,
    /// Efficiency by the number of missing planes (0, 1, 2, 3 or more).
    pub efficiency_vs_missing: Vec<ClassBin>,
    /// Ghost rate by fitted momentum (bins of `p_bin_edges_gev`; a fitted momentum outside
    /// the edges is in no bin).
    pub ghosts_vs_p: Vec<GhostBin>,
    /// Tracks and ghosts without a measured momentum (q/p of zero or not finite: no field,
    /// or a submission file, which carries no fit); they are in no bin of `ghosts_vs_p`.
    pub n_tracks_unmeasured: usize,
    pub n_ghosts_unmeasured: usize,
    /// The ghosts by the hits they join.
    pub ghost_kinds: GhostKinds,
    /// (p_fit - p_true) / p_true over all matched fitted tracks.
    pub momentum_resolution: RobustStat,
    /// The pulls of the matched fitted tracks (the five parameters; q/p where the fit took
    /// it from the hits, [`Track::momentum_fitted`]).
    pub pulls: Vec<Pull>,
    /// The same over the matched tracks whose hits are all their particle's: the fit's
    /// error model alone. A matched track may carry foreign hits (up to `1 -
    /// match_fraction` of them); where one sits on the first plane, the state there is
    /// pulled to it, which widens `pulls` by the assignment, not by the fit (in dense
    /// events close to the target, widths of 1.3-1.5 where these give 1.0).
    pub pulls_pure: Vec<Pull>,
    /// The fit's chi-square per degree of freedom over the matched fitted tracks: about 1
    /// where the fit's model of the detector (resolution, material, field) is right.
    pub fit_chi2_ndf: Chi2Summary,
    /// Where the fitted tracks come from on the finder's origin plane (`config.origin_z_mm`),
    /// with a detector and 20 fitted tracks or more ([`super::beam_spot`]): a centre far
    /// from the finder's origin means the beam is off it (see
    /// [`super::reco::FinderConfig::origin_x_mm`]).
    pub beam_spot: Option<BeamSpot>,
}

/// Mean and median of the matched tracks' chi-square per degree of freedom.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Chi2Summary {
    pub n_tracks: usize,
    pub mean: f64,
    pub median: f64,
}

impl Chi2Summary {
    fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Chi2Summary::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        Chi2Summary {
            n_tracks: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            median: v[v.len() / 2],
        }
    }
}

struct ParticleInfo {
    planes: Vec<u16>,
    n_hits: usize,
    p_gev: f64,
    q: f64,
}

/// Collects events and produces an [`EvalReport`].
pub struct Evaluator<'d> {
    cfg: EvalConfig,
    detector: Option<&'d Detector>,
    n_events: usize,
    n_tracks: usize,
    n_reconstructable: usize,
    n_reconstructed: usize,
    n_ghosts: usize,
    n_matched: usize,
    n_first_hit_own: usize,
    n_clones: usize,
    score_sum: f64,
    bins_total: Vec<usize>,
    bins_found: Vec<usize>,
    resolution: Vec<f64>,
    resolution_bins: Vec<Vec<f64>>,
    pulls: [Vec<f64>; 5],
    /// The pulls of the tracks with only their particle's hits.
    pulls_pure: [Vec<f64>; 5],
    /// Chi-square per degree of freedom of the matched fitted tracks.
    chi2_ndf: Vec<f64>,
    /// `(particles, found)` by planes hit (index: planes; up to the detector's plane count
    /// when there is a detector, else up to the most planes seen) and by missing planes.
    by_planes: Vec<(usize, usize)>,
    by_missing: [(usize, usize); MISSING_PLANES_MAX + 1],
    /// `(tracks, ghosts)` by fitted-momentum bin, and unmeasured.
    ghost_bins: Vec<(usize, usize)>,
    ghost_unmeasured: (usize, usize),
    ghost_kinds: GhostKinds,
    /// The tracks' points on the origin plane (with a detector).
    beam: Option<BeamSpotMeter>,
}

impl<'d> Evaluator<'d> {
    /// `detector` (optional) is used to transport the truth to a track's z when the matched
    /// particle has no hit there.
    pub fn new(cfg: EvalConfig, detector: Option<&'d Detector>) -> Self {
        let n_bins = cfg.p_bin_edges_gev.len().saturating_sub(1);
        // With a detector the planes table runs up to its plane count even where no particle
        // hit them all (a row of zeros says so rather than a shorter table).
        let by_planes = match detector {
            Some(d) if d.planes.len() >= cfg.min_planes => vec![(0, 0); d.planes.len() + 1],
            _ => Vec::new(),
        };
        let (origin_z_mm, beam_min_p) = (cfg.origin_z_mm, cfg.beam_min_p_gev);
        Evaluator {
            cfg,
            detector,
            n_events: 0,
            n_tracks: 0,
            n_reconstructable: 0,
            n_reconstructed: 0,
            n_ghosts: 0,
            n_matched: 0,
            n_first_hit_own: 0,
            n_clones: 0,
            score_sum: 0.0,
            bins_total: vec![0; n_bins],
            bins_found: vec![0; n_bins],
            resolution: Vec::new(),
            resolution_bins: vec![Vec::new(); n_bins],
            pulls: Default::default(),
            pulls_pure: Default::default(),
            chi2_ndf: Vec::new(),
            by_planes,
            by_missing: [(0, 0); MISSING_PLANES_MAX + 1],
            ghost_bins: vec![(0, 0); n_bins],
            ghost_unmeasured: (0, 0),
            ghost_kinds: GhostKinds::default(),
            beam: detector
                .map(|_| BeamSpotMeter::new(origin_z_mm, f64::INFINITY).above(beam_min_p)),
        }
    }

    fn bin_of(&self, p_gev: f64) -> Option<usize> {
        let e = &self.cfg.p_bin_edges_gev;
        if e.len() < 2 || !(p_gev >= e[0] && p_gev < e[e.len() - 1]) {
            return None;
        }
        Some(e.partition_point(|&edge| edge <= p_gev) - 1)
    }

    /// Adds one event. `truth` is aligned with `hits`; `particles` (optional) gives vertex
    /// momenta and charges; `tracks` hold indices into `hits`.
    pub fn add_event(
        &mut self,
        event_id: u64,
        hits: &[HitRecord],
        truth: &[HitTruth],
        particles: Option<&[Particle]>,
        tracks: &[Track],
    ) -> Result<(), EvalError> {
        if truth.len() != hits.len() {
            return Err(EvalError::TruthLength {
                event_id,
                n_hits: hits.len(),
                n_truth: truth.len(),
            });
        }
        for (t, track) in tracks.iter().enumerate() {
            if let Some(&index) = track.hits.iter().find(|&&i| i as usize >= hits.len()) {
                return Err(EvalError::HitIndex {
                    event_id,
                    track: t,
                    index,
                    n_hits: hits.len(),
                });
            }
        }
        if let (Some(m), Some(d)) = (&mut self.beam, self.detector) {
            m.add(&d.field, tracks);
        }
        // Particle summaries from the truth hits (first hit = most upstream plane).
        let mut info: HashMap<u64, ParticleInfo> = HashMap::new();
        let mut first_hit: HashMap<u64, usize> = HashMap::new();
        for (i, (h, t)) in hits.iter().zip(truth).enumerate() {
            // A hit the reader found on no plane (`trackml::NO_PLANE`) is not one the
            // particle left on the detector.
            if t.particle_id == 0 || h.plane == crate::tracking::trackml::NO_PLANE {
                continue;
            }
            let e = info.entry(t.particle_id).or_insert_with(|| ParticleInfo {
                planes: Vec::new(),
                n_hits: 0,
                p_gev: 0.0,
                q: 0.0,
            });
            e.planes.push(h.plane);
            e.n_hits += 1;
            let f = first_hit.entry(t.particle_id).or_insert(i);
            if hits[*f].z_mm > h.z_mm {
                *f = i;
            }
        }
        let vertex: HashMap<u64, &Particle> =
            particles.unwrap_or(&[]).iter().map(|p| (p.id, p)).collect();
        for (id, e) in info.iter_mut() {
            e.planes.sort_unstable();
            e.planes.dedup();
            match vertex.get(id) {
                Some(p) => {
                    e.p_gev = p.p_gev();
                    e.q = p.q as f64;
                }
                None => {
                    let m = truth[first_hit[id]].momentum_gev;
                    e.p_gev = (m[0] * m[0] + m[1] * m[1] + m[2] * m[2]).sqrt();
                }
            }
        }

        // Each particle's truth entries, in order (the fit quality takes the one nearest
        // a track's z).
        let mut truth_of: HashMap<u64, Vec<u32>> = HashMap::new();
        if !tracks.is_empty() {
            for (i, t) in truth.iter().enumerate() {
                truth_of.entry(t.particle_id).or_default().push(i as u32);
            }
        }

        // Matching.
        let mut matches: HashMap<u64, usize> = HashMap::new();
        for track in tracks {
            self.n_tracks += 1;
            let qop = track.state.qop as f64;
            let ghost_bin = if track.momentum_measured() {
                self.bin_of(1.0 / qop.abs())
                    .map(|b| &mut self.ghost_bins[b])
            } else {
                Some(&mut self.ghost_unmeasured)
            };
            let mut counts: HashMap<u64, usize> = HashMap::new();
            for &i in &track.hits {
                *counts.entry(truth[i as usize].particle_id).or_default() += 1;
            }
            let best = counts
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(&id, &n)| (id, n));
            let matched = match best {
                Some((id, n))
                    if id != 0 && n as f64 >= self.cfg.match_fraction * track.hits.len() as f64 =>
                {
                    Some(id)
                }
                _ => None,
            };
            if let Some(g) = ghost_bin {
                g.0 += 1;
                g.1 += matched.is_none() as usize;
            }
            let Some(id) = matched else {
                self.n_ghosts += 1;
                self.ghost_kinds.add(track, hits, truth, &counts);
                continue;
            };
            self.n_matched += 1;
            if track
                .hits
                .first()
                .is_some_and(|&h| truth[h as usize].particle_id == id)
            {
                self.n_first_hit_own += 1;
            }
            let k = matches.entry(id).or_default();
            *k += 1;
            if *k > 1 {
                self.n_clones += 1;
            }
            let pure = best.is_some_and(|(_, n)| n == track.hits.len());
            let own = truth_of.get(&id).map_or(&[][..], Vec::as_slice);
            self.add_fit_quality(track, info.get(&id).map(|e| e.q), truth, own, pure);
        }

        // Efficiency.
        for (id, e) in &info {
            if e.planes.len() < self.cfg.min_planes {
                continue;
            }
            let found = matches.contains_key(id);
            if let Some(b) = self.bin_of(e.p_gev) {
                self.bins_total[b] += 1;
                self.bins_found[b] += found as usize;
            }
            if e.p_gev >= self.cfg.min_p_gev {
                self.n_reconstructable += 1;
                self.n_reconstructed += found as usize;
                let n = e.planes.len();
                if self.by_planes.len() <= n {
                    self.by_planes.resize(n + 1, (0, 0));
                }
                self.by_planes[n].0 += 1;
                self.by_planes[n].1 += found as usize;
                // `planes` is sorted and distinct: the span less the planes hit.
                let span = (e.planes[n - 1] - e.planes[0]) as usize + 1;
                let m = &mut self.by_missing[(span - n).min(MISSING_PLANES_MAX)];
                m.0 += 1;
                m.1 += found as usize;
            }
        }

        self.score_sum += trackml_score(hits.len(), truth, tracks, &info);
        self.n_events += 1;
        Ok(())
    }

    /// The pulls and chi-square of `track`, matched to the particle whose truth entries
    /// are `own` (indices into `truth`).
    fn add_fit_quality(
        &mut self,
        track: &Track,
        q: Option<f64>,
        truth: &[HitTruth],
        own: &[u32],
        pure: bool,
    ) {
        let var: [f64; 5] = std::array::from_fn(|i| track.var(i) as f64);
        if var.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return;
        }
        if track.ndf > 0 && track.chi2.is_finite() {
            self.chi2_ndf.push(track.chi2_ndf() as f64);
        }
        let z = track.state.z_mm as f64;
        let Some(&i) = own.iter().min_by(|&&a, &&b| {
            (truth[a as usize].pos_mm[2] - z)
                .abs()
                .total_cmp(&(truth[b as usize].pos_mm[2] - z).abs())
        }) else {
            return;
        };
        let t = &truth[i as usize];
        // Charge: from the particles file, else from the fitted sign (only the magnitude of
        // q/p is then checked).
        let q = match q {
            Some(q) if q != 0.0 => q,
            _ => (track.state.qop as f64).signum(),
        };
        if q == 0.0 || t.momentum_gev[2] <= 0.0 {
            return;
        }
        let mut s = StateVector::from_momentum(t.pos_mm, t.momentum_gev, q);
        if (s.z_mm - z).abs() > 1e-3 {
            let Some(det) = self.detector else { return };
            if simulate::propagate(&det.field, &mut s, z, 5.0).is_err() {
                return;
            }
        }
        let fit = [
            track.state.x_mm as f64,
            track.state.y_mm as f64,
            track.state.tx as f64,
            track.state.ty as f64,
            track.state.qop as f64,
        ];
        let truth_v = [s.x_mm, s.y_mm, s.tx, s.ty, s.qop];
        let measured = track.momentum_measured();
        let fitted = !self.cfg.qop_assumed && track.momentum_fitted();
        for k in 0..if fitted { 5 } else { 4 } {
            let pull = (fit[k] - truth_v[k]) / var[k].sqrt();
            self.pulls[k].push(pull);
            if pure {
                self.pulls_pure[k].push(pull);
            }
        }
        if measured {
            let p_true = 1.0 / s.qop.abs();
            let r = (1.0 / fit[4].abs() - p_true) / p_true;
            self.resolution.push(r);
            if let Some(b) = self.bin_of(p_true) {
                self.resolution_bins[b].push(r);
            }
        }
    }

    /// The report over all events added.
    pub fn finish(&self) -> EvalReport {
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let binomial = |k: usize, n: usize| {
            if n == 0 {
                0.0
            } else {
                let e = k as f64 / n as f64;
                (e * (1.0 - e) / n as f64).sqrt()
            }
        };
        let edges = &self.cfg.p_bin_edges_gev;
        let efficiency_vs_p = (0..self.bins_total.len())
            .map(|b| MomentumBin {
                p_lo_gev: edges[b],
                p_hi_gev: edges[b + 1],
                n_particles: self.bins_total[b],
                n_found: self.bins_found[b],
                efficiency: ratio(self.bins_found[b], self.bins_total[b]),
                efficiency_error: binomial(self.bins_found[b], self.bins_total[b]),
                resolution: robust_stat(&self.resolution_bins[b]),
            })
            .collect();
        EvalReport {
            config: self.cfg.clone(),
            n_events: self.n_events,
            n_tracks: self.n_tracks,
            n_reconstructable: self.n_reconstructable,
            n_reconstructed: self.n_reconstructed,
            efficiency: ratio(self.n_reconstructed, self.n_reconstructable),
            efficiency_error: binomial(self.n_reconstructed, self.n_reconstructable),
            n_ghosts: self.n_ghosts,
            ghost_rate: ratio(self.n_ghosts, self.n_tracks),
            n_matched_tracks: self.n_matched,
            n_first_hit_own: self.n_first_hit_own,
            first_hit_purity: ratio(self.n_first_hit_own, self.n_matched),
            n_clones: self.n_clones,
            clone_rate: ratio(self.n_clones, self.n_matched),
            trackml_score: if self.n_events == 0 {
                0.0
            } else {
                self.score_sum / self.n_events as f64
            },
            efficiency_vs_p,
            efficiency_vs_planes: self
                .by_planes
                .iter()
                .enumerate()
                .skip(self.cfg.min_planes.min(self.by_planes.len()))
                .map(|(value, &(n, k))| class_bin(value, n, k))
                .collect(),
            efficiency_vs_missing: self
                .by_missing
                .iter()
                .enumerate()
                .map(|(value, &(n, k))| class_bin(value, n, k))
                .collect(),
            ghosts_vs_p: self
                .ghost_bins
                .iter()
                .enumerate()
                .map(|(b, &(n, g))| GhostBin {
                    p_lo_gev: edges[b],
                    p_hi_gev: edges[b + 1],
                    n_tracks: n,
                    n_ghosts: g,
                    ghost_rate: ratio(g, n),
                })
                .collect(),
            n_tracks_unmeasured: self.ghost_unmeasured.0,
            n_ghosts_unmeasured: self.ghost_unmeasured.1,
            ghost_kinds: self.ghost_kinds.clone(),
            momentum_resolution: robust_stat(&self.resolution),
            pulls: pulls_of(&self.pulls),
            pulls_pure: pulls_of(&self.pulls_pure),
            fit_chi2_ndf: Chi2Summary::of(&self.chi2_ndf),
            beam_spot: self.beam.as_ref().and_then(BeamSpotMeter::finish),
        }
    }
}

/// The pulls' statistics and histograms of the five parameters.
fn pulls_of(pulls: &[Vec<f64>; 5]) -> Vec<Pull> {
    (0..5)
        .map(|k| {
            let mut histogram = vec![0u32; PULL_BINS];
            let (lo, hi) = PULL_RANGE;
            for &v in &pulls[k] {
                if v >= lo && v < hi {
                    let b = (((v - lo) / (hi - lo)) * PULL_BINS as f64) as usize;
                    histogram[b.min(PULL_BINS - 1)] += 1;
                }
            }
            Pull {
                parameter: PARAMETERS[k],
                stat: robust_stat(&pulls[k]),
                histogram,
            }
        })
        .collect()
}

/// A [`ClassBin`] of `n` particles, `k` found.
fn class_bin(value: usize, n: usize, k: usize) -> ClassBin {
    let e = if n == 0 { 0.0 } else { k as f64 / n as f64 };
    ClassBin {
        value,
        n_particles: n,
        n_found: k,
        efficiency: e,
        efficiency_error: if n == 0 {
            0.0
        } else {
            (e * (1.0 - e) / n as f64).sqrt()
        },
    }
}

/// TrackML double-majority score of one event (see the module documentation).
fn trackml_score(
    n_hits: usize,
    truth: &[HitTruth],
    tracks: &[Track],
    info: &HashMap<u64, ParticleInfo>,
) -> f64 {
    let total_weight: f64 = truth.iter().map(|t| t.weight).sum();
    if total_weight <= 0.0 {
        return 0.0;
    }
    // One track per hit: the first that holds it.
    let mut owner = vec![usize::MAX; n_hits];
    for (t, track) in tracks.iter().enumerate() {
        for &i in &track.hits {
            if owner[i as usize] == usize::MAX {
                owner[i as usize] = t;
            }
        }
    }
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); tracks.len()];
    for (i, &t) in owner.iter().enumerate() {
        if t != usize::MAX {
            members[t].push(i);
        }
    }
    let mut score = 0.0;
    for hits in members.iter().filter(|m| !m.is_empty()) {
        let mut counts: HashMap<u64, (usize, f64)> = HashMap::new();
        for &i in hits {
            let e = counts.entry(truth[i].particle_id).or_default();
            e.0 += 1;
            e.1 += truth[i].weight;
        }
        let Some((&id, &(n, w))) = counts
            .iter()
            .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))
        else {
            continue;
        };
        if id == 0 {
            continue;
        }
        let n_particle = info.get(&id).map_or(0, |e| e.n_hits);
        if 2 * n > hits.len() && 2 * n > n_particle {
            score += w;
        }
    }
    score / total_weight
}

impl EvalReport {
    /// A markdown summary (tables of the headline numbers, bins and pulls).
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let c = &self.config;
        let _ = writeln!(s, "## Tracking performance\n");
        let _ = writeln!(
            s,
            "{} events, {} tracks. Reconstructable: hits on >= {} planes and p >= {} GeV/c; match: >= {:.0} % of a track's hits from one particle.\n",
            self.n_events,
            self.n_tracks,
            c.min_planes,
            c.min_p_gev,
            100.0 * c.match_fraction
        );
        let _ = writeln!(s, "| quantity | value |\n| --- | --- |");
        let _ = writeln!(
            s,
            "| efficiency | {:.4} ± {:.4} ({} / {}) |",
            self.efficiency, self.efficiency_error, self.n_reconstructed, self.n_reconstructable
        );
        let _ = writeln!(
            s,
            "| ghost rate | {:.4} ({} / {}) |",
            self.ghost_rate, self.n_ghosts, self.n_tracks
        );
        let k = &self.ghost_kinds;
        let _ = writeln!(
            s,
            "| ghosts: joined, mixed, several particles, with noise | {}, {}, {}, {} |",
            k.joined, k.mixed, k.several, k.with_noise
        );
        let _ = writeln!(
            s,
            "| clone rate | {:.4} ({} / {}) |",
            self.clone_rate, self.n_clones, self.n_matched_tracks
        );
        let _ = writeln!(
            s,
            "| first hit of the track's particle | {:.4} ({} / {}) |",
            self.first_hit_purity, self.n_first_hit_own, self.n_matched_tracks
        );
        let _ = writeln!(s, "| TrackML score | {:.4} |", self.trackml_score);
        let r = &self.momentum_resolution;
        let _ = writeln!(
            s,
            "| dp/p (mean, width) | {:.2e}, {:.2e} (n = {}) |\n",
            r.mean, r.width, r.n_total
        );
        let _ = writeln!(s, "| p bin (GeV/c) | particles | found | efficiency | dp/p width |\n| --- | --- | --- | --- | --- |");
        for b in &self.efficiency_vs_p {
            let _ = writeln!(
                s,
                "| {}–{} | {} | {} | {:.3} ± {:.3} | {:.2e} |",
                b.p_lo_gev,
                b.p_hi_gev,
                b.n_particles,
                b.n_found,
                b.efficiency,
                b.efficiency_error,
                b.resolution.width
            );
        }
        for (title, bins, last) in [
            ("planes hit", &self.efficiency_vs_planes, usize::MAX),
            (
                "missing planes",
                &self.efficiency_vs_missing,
                MISSING_PLANES_MAX,
            ),
        ] {
            let _ = writeln!(
                s,
                "\n| {title} | particles | found | efficiency |\n| --- | --- | --- | --- |"
            );
            for b in bins {
                let more = if b.value == last { "+" } else { "" };
                let _ = writeln!(
                    s,
                    "| {}{more} | {} | {} | {:.3} ± {:.3} |",
                    b.value, b.n_particles, b.n_found, b.efficiency, b.efficiency_error
                );
            }
        }
        let _ = writeln!(
            s,
            "\n| fitted p (GeV/c) | tracks | ghosts | ghost rate |\n| --- | --- | --- | --- |"
        );
        for b in self.ghosts_vs_p.iter().filter(|b| b.n_tracks > 0) {
            let _ = writeln!(
                s,
                "| {}–{} | {} | {} | {:.4} |",
                b.p_lo_gev, b.p_hi_gev, b.n_tracks, b.n_ghosts, b.ghost_rate
            );
        }
        if self.n_tracks_unmeasured > 0 {
            let _ = writeln!(
                s,
                "| unmeasured | {} | {} | {:.4} |",
                self.n_tracks_unmeasured,
                self.n_ghosts_unmeasured,
                self.n_ghosts_unmeasured as f64 / self.n_tracks_unmeasured as f64
            );
        }
        for (title, pulls) in [
            ("pull", &self.pulls),
            (
                "pull, tracks with only their particle's hits (the fit's error model)",
                &self.pulls_pure,
            ),
        ] {
            let _ = writeln!(
                s,
                "\n| {title} | mean | width | n |\n| --- | --- | --- | --- |"
            );
            for p in pulls {
                let t = &p.stat;
                let _ = writeln!(
                    s,
                    "| {} | {:.3} ± {:.3} | {:.3} ± {:.3} | {} |",
                    p.parameter, t.mean, t.mean_error, t.width, t.width_error, t.n_total
                );
            }
        }
        let c = &self.fit_chi2_ndf;
        if c.n_tracks > 0 {
            let _ = writeln!(
                s,
                "\nfit chi-square per degree of freedom (matched tracks): mean {:.3}, median {:.3}, {} tracks",
                c.mean, c.median, c.n_tracks
            );
        }
        if let Some(b) = &self.beam_spot {
            let _ = writeln!(
                s,
                "\nwhere the tracks come from (z = {} mm, {} tracks{}): x {:.3} ± {:.3} mm, y {:.3} ± {:.3} mm; spread {:.3} / {:.3} mm, beam size {:.3} / {:.3} mm",
                b.z_mm,
                b.n_tracks,
                if self.config.beam_min_p_gev > 0.0 {
                    format!(" above {} GeV/c", self.config.beam_min_p_gev)
                } else {
                    String::new()
                },
                b.centre_mm[0],
                b.centre_error_mm[0],
                b.centre_mm[1],
                b.centre_error_mm[1],
                b.spread_mm[0],
                b.spread_mm[1],
                b.size_mm[0],
                b.size_mm[1]
            );
            if let Some(l) = &b.length {
                let _ = writeln!(
                    s,
                    "along the beam ({} tracks of slope {} or more, median {:.3}): from z = {:.1} mm, half length {:.1} mm ({}; a track's error in z {:.1} mm), spread across their direction {:.3} mm",
                    l.n_tracks,
                    crate::tracking::beam_spot::LENGTH_MIN_SLOPE,
                    l.median_slope,
                    l.z_centre_mm,
                    l.half_length_mm,
                    if l.resolved() { "measured" } else { "within the tracks' errors" },
                    l.z_error_mm,
                    l.across_spread_mm
                );
            }
        }
        s
    }
}

/// Writes `efficiency_vs_p`, `efficiency_vs_planes`, `efficiency_vs_missing`,
/// `ghosts_vs_p` and `pulls` (each `.svg` and `.png`) into `dir`. Text needs a
/// TrueType font: `TRIGD_FONT` (a .ttf path) or DejaVu Sans / Liberation Sans from the
/// usual system paths; without one the plots are drawn without text (the markdown and
/// JSON carry the numbers).
pub fn write_plots(
    report: &EvalReport,
    dir: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use plotters::prelude::*;
    std::fs::create_dir_all(dir)?;
    let text = plot::ensure_font();
    let err = |e: Box<dyn std::error::Error>| -> Box<dyn std::error::Error + Send + Sync> {
        e.to_string().into()
    };
    let size = (800, 500);
    plot::efficiency(
        SVGBackend::new(&dir.join("efficiency_vs_p.svg"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    plot::efficiency(
        BitMapBackend::new(&dir.join("efficiency_vs_p.png"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    plot::ghosts(
        SVGBackend::new(&dir.join("ghosts_vs_p.svg"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    plot::ghosts(
        BitMapBackend::new(&dir.join("ghosts_vs_p.png"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    for (name, bins, title, x_desc) in [
        (
            "efficiency_vs_planes",
            &report.efficiency_vs_planes,
            "Efficiency by planes hit",
            "planes hit",
        ),
        (
            "efficiency_vs_missing",
            &report.efficiency_vs_missing,
            "Efficiency by missing planes (last: or more)",
            "missing planes",
        ),
    ] {
        let svg = dir.join(format!("{name}.svg"));
        plot::classes(
            SVGBackend::new(&svg, size).into_drawing_area(),
            bins,
            text,
            title,
            x_desc,
        )
        .map_err(err)?;
        let png = dir.join(format!("{name}.png"));
        plot::classes(
            BitMapBackend::new(&png, size).into_drawing_area(),
            bins,
            text,
            title,
            x_desc,
        )
        .map_err(err)?;
    }
    let size = (1200, 700);
    plot::pulls(
        SVGBackend::new(&dir.join("pulls.svg"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    plot::pulls(
        BitMapBackend::new(&dir.join("pulls.png"), size).into_drawing_area(),
        report,
        text,
    )
    .map_err(err)?;
    Ok(())
}

/// The plots' drawing helpers; `trigd report` shares the font set-up.
pub(crate) mod plot {
    use super::{EvalReport, PULL_BINS, PULL_RANGE};
    use plotters::coord::ranged1d::ValueFormatter;
    use plotters::coord::types::RangedCoordf64;
    use plotters::coord::Shift;
    use plotters::prelude::*;
    use std::error::Error;
    use std::sync::OnceLock;

    const FONT_PATHS: [&str; 4] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ];

    /// Registers a sans-serif font once; whether text can be drawn.
    pub fn ensure_font() -> bool {
        static FONT: OnceLock<bool> = OnceLock::new();
        *FONT.get_or_init(|| {
            let candidates = std::env::var("TRIGD_FONT")
                .ok()
                .into_iter()
                .chain(FONT_PATHS.iter().map(|s| s.to_string()));
            for path in candidates {
                if let Ok(bytes) = std::fs::read(&path) {
                    // Registered for the life of the process: plotters wants 'static bytes.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .is_ok()
                    {
                        return true;
                    }
                }
            }
            false
        })
    }

    /// Points with error bars against momentum (log scale) from `(p_lo, p_hi, value,
    /// error)` bins, up to `y_max`, with a vertical line at the momentum cut.
    #[allow(clippy::too_many_arguments)]
    fn log_p_points<DB: DrawingBackend>(
        root: DrawingArea<DB, Shift>,
        r: &EvalReport,
        text: bool,
        title: &str,
        y_desc: &str,
        y_max: f64,
        bins: &[(f64, f64, f64, f64)],
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let lo = bins.first().map_or(0.1, |b| b.0.max(0.05));
        let hi = bins.last().map_or(100.0, |b| b.1.max(lo * 2.0));
        let mut builder = ChartBuilder::on(&root);
        builder.margin(20);
        if text {
            builder
                .caption(title, ("sans-serif", 24))
                .x_label_area_size(45)
                .y_label_area_size(60);
        }
        let mut chart = builder.build_cartesian_2d((lo..hi).log_scale(), 0.0..y_max)?;
        mesh(&mut chart, text, "p (GeV/c)", y_desc, false)?;
        let points: Vec<(f64, f64, f64)> = bins
            .iter()
            .map(|&(a, b, v, e)| ((a.max(lo) * b).sqrt(), v, e))
            .collect();
        draw_points(&mut chart, &points, y_max)?;
        let threshold = r.config.min_p_gev;
        if threshold > lo && threshold < hi {
            chart.draw_series(LineSeries::new(
                [(threshold, 0.0), (threshold, y_max)],
                RED.stroke_width(1),
            ))?;
        }
        root.present()?;
        Ok(())
    }

    /// The axes' mesh, with labels where there is a font; `x_integers` labels only the
    /// whole numbers of x (classes that are counts).
    fn mesh<DB: DrawingBackend, X: Ranged<ValueType = f64> + ValueFormatter<f64>>(
        chart: &mut ChartContext<'_, DB, Cartesian2d<X, RangedCoordf64>>,
        text: bool,
        x_desc: &str,
        y_desc: &str,
        x_integers: bool,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        let whole = |x: &f64| {
            if (x - x.round()).abs() < 1e-9 {
                format!("{}", x.round())
            } else {
                String::new()
            }
        };
        if text {
            let mut m = chart.configure_mesh();
            m.x_desc(x_desc).y_desc(y_desc);
            if x_integers {
                m.x_label_formatter(&whole);
            }
            m.draw()?;
        } else {
            chart
                .configure_mesh()
                .disable_x_mesh()
                .disable_y_mesh()
                .x_labels(0)
                .y_labels(0)
                .draw()?;
        }
        Ok(())
    }

    /// Points `(x, y)` with error bars `+-e`, clipped to `[0, y_max]`.
    fn draw_points<DB: DrawingBackend, X: Ranged<ValueType = f64>>(
        chart: &mut ChartContext<'_, DB, Cartesian2d<X, RangedCoordf64>>,
        points: &[(f64, f64, f64)],
        y_max: f64,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        chart.draw_series(points.iter().map(|&(x, y, e)| {
            PathElement::new(
                vec![(x, (y - e).max(0.0)), (x, (y + e).min(y_max))],
                BLUE.stroke_width(2),
            )
        }))?;
        chart.draw_series(
            points
                .iter()
                .map(|&(x, y, _)| Circle::new((x, y), 4, BLUE.filled())),
        )?;
        Ok(())
    }

    pub fn efficiency<DB: DrawingBackend>(
        root: DrawingArea<DB, Shift>,
        r: &EvalReport,
        text: bool,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        let bins: Vec<_> = r
            .efficiency_vs_p
            .iter()
            .filter(|b| b.n_particles > 0)
            .map(|b| (b.p_lo_gev, b.p_hi_gev, b.efficiency, b.efficiency_error))
            .collect();
        let title = format!("Tracking efficiency (overall {:.3})", r.efficiency);
        log_p_points(root, r, text, &title, "efficiency", 1.05, &bins)
    }

    /// Ghost rate against the fitted momentum.
    pub fn ghosts<DB: DrawingBackend>(
        root: DrawingArea<DB, Shift>,
        r: &EvalReport,
        text: bool,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        let bins: Vec<_> = r
            .ghosts_vs_p
            .iter()
            .filter(|b| b.n_tracks > 0)
            .map(|b| {
                let e = (b.ghost_rate * (1.0 - b.ghost_rate) / b.n_tracks as f64).sqrt();
                (b.p_lo_gev, b.p_hi_gev, b.ghost_rate, e)
            })
            .collect();
        let y_max = bins.iter().map(|b| b.2 + b.3).fold(0.01, f64::max) * 1.2;
        let title = format!("Ghost rate (overall {:.4})", r.ghost_rate);
        log_p_points(root, r, text, &title, "ghost rate", y_max, &bins)
    }

    /// Efficiency against a class of particles (planes hit, missing planes).
    pub fn classes<DB: DrawingBackend>(
        root: DrawingArea<DB, Shift>,
        bins: &[super::ClassBin],
        text: bool,
        title: &str,
        x_desc: &str,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let lo = bins.first().map_or(0.0, |b| b.value as f64) - 0.5;
        let hi = bins.last().map_or(1.0, |b| b.value as f64) + 0.5;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(20);
        if text {
            builder
                .caption(title, ("sans-serif", 24))
                .x_label_area_size(45)
                .y_label_area_size(60);
        }
        let mut chart = builder.build_cartesian_2d(lo..hi, 0.0..1.05)?;
        mesh(&mut chart, text, x_desc, "efficiency", true)?;
        let points: Vec<(f64, f64, f64)> = bins
            .iter()
            .filter(|b| b.n_particles > 0)
            .map(|b| (b.value as f64, b.efficiency, b.efficiency_error))
            .collect();
        draw_points(&mut chart, &points, 1.05)?;
        root.present()?;
        Ok(())
    }

    pub fn pulls<DB: DrawingBackend>(
        root: DrawingArea<DB, Shift>,
        r: &EvalReport,
        text: bool,
    ) -> Result<(), Box<dyn Error>>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let panels = root.split_evenly((2, 3));
        let (lo, hi) = PULL_RANGE;
        let bin_w = (hi - lo) / PULL_BINS as f64;
        for (panel, pull) in panels.iter().zip(&r.pulls) {
            let max = pull.histogram.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.15;
            let mut builder = ChartBuilder::on(panel);
            builder.margin(12);
            if text {
                builder
                    .caption(
                        format!(
                            "pull {}: mean {:.2}, width {:.2} (n {})",
                            pull.parameter, pull.stat.mean, pull.stat.width, pull.stat.n_total
                        ),
                        ("sans-serif", 16),
                    )
                    .x_label_area_size(30)
                    .y_label_area_size(45);
            }
            let mut chart = builder.build_cartesian_2d(lo..hi, 0.0..max)?;
            if text {
                chart
                    .configure_mesh()
                    .x_desc(format!("pull {}", pull.parameter))
                    .draw()?;
            } else {
                chart
                    .configure_mesh()
                    .disable_x_mesh()
                    .disable_y_mesh()
                    .x_labels(0)
                    .y_labels(0)
                    .draw()?;
            }
            chart.draw_series(pull.histogram.iter().enumerate().map(|(b, &n)| {
                let x0 = lo + b as f64 * bin_w;
                Rectangle::new([(x0, 0.0), (x0 + bin_w, n as f64)], BLUE.mix(0.5).filled())
            }))?;
            // The Gaussian with the robust mean and width, normalised to the histogram.
            let (m, w) = (pull.stat.mean, pull.stat.width);
            if w > 0.0 {
                let norm =
                    pull.stat.n_total as f64 * bin_w / (w * (2.0 * std::f64::consts::PI).sqrt());
                let curve = (0..=200).map(|i| {
                    let x = lo + (hi - lo) * i as f64 / 200.0;
                    (x, norm * (-0.5 * ((x - m) / w).powi(2)).exp())
                });
                chart.draw_series(LineSeries::new(curve, RED.stroke_width(2)))?;
            }
        }
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::simulate::{event_rng, simulate_event, Preset, SimConfig};
    use crate::tracking::track::TrackState;

    /// Hand-made event, 5 GeV/c particles unless said: 1 on planes 0-6 (none missing,
    /// found), 2 on 0, 1, 3, 4, 5 (one missing, found), 3 on 0, 1, 4, 5, 6 (two missing, not
    /// found), 4 on 0, 2, 4, 6 (three missing, found), 5 on 0, 1, 3 (too few planes) and 6 on
    /// 0-5 at 0.5 GeV/c (too soft); plus ghosts of fitted p 3.3 GeV/c, 1 TeV/c (outside
    /// the bins) and one without a measured momentum.
    fn hand_made_event() -> (Vec<HitRecord>, Vec<HitTruth>, Vec<Track>) {
        let layout: [(u64, &[u16], f64); 6] = [
            (1, &[0, 1, 2, 3, 4, 5, 6], 5.0),
            (2, &[0, 1, 3, 4, 5], 5.0),
            (3, &[0, 1, 4, 5, 6], 5.0),
            (4, &[0, 2, 4, 6], 5.0),
            (5, &[0, 1, 3], 5.0),
            (6, &[0, 1, 2, 3, 4, 5], 0.5),
        ];
        let (mut hits, mut truth) = (Vec::new(), Vec::new());
        let mut of = HashMap::<u64, Vec<u32>>::new();
        for (id, planes, p_gev) in layout {
            for &p in planes {
                of.entry(id).or_default().push(hits.len() as u32);
                hits.push(HitRecord {
                    x_mm: id as f32,
                    y_mm: 0.0,
                    z_mm: 100.0 * (p + 1) as f32,
                    plane: p,
                    hit_id: hits.len() as u32 + 1,
                });
                truth.push(HitTruth {
                    particle_id: id,
                    pos_mm: [id as f64, 0.0, 100.0 * (p + 1) as f64],
                    momentum_gev: [0.0, 0.0, p_gev],
                    weight: 0.0,
                });
            }
        }
        let track = |hits: Vec<u32>, qop: f32| Track {
            hits,
            state: TrackState {
                qop,
                ..Default::default()
            },
            ..Track::default()
        };
        // The ghost: two hits of 1, two of 2, one of 3 (40 % at most from one particle).
        let ghost = vec![of[&1][0], of[&1][1], of[&2][2], of[&2][3], of[&3][4]];
        let tracks = vec![
            track(of[&1].clone(), 0.125),
            track(of[&2].clone(), -0.125),
            track(of[&4].clone(), 0.125),
            track(of[&6].clone(), 2.0),
            track(ghost.clone(), 0.3),
            track(ghost.clone(), 1e-3),
            track(ghost, 0.0),
        ];
        (hits, truth, tracks)
    }

    #[test]
    fn ghosts_are_told_apart_by_the_hits_they_join() {
        let (mut hits, mut truth, _) = hand_made_event();
        // A noise hit on plane 2.
        let noise = hits.len() as u32;
        hits.push(HitRecord {
            x_mm: 50.0,
            y_mm: 0.0,
            z_mm: 300.0,
            plane: 2,
            hit_id: noise + 1,
        });
        truth.push(HitTruth {
            particle_id: 0,
            pos_mm: [50.0, 0.0, 300.0],
            momentum_gev: [0.0; 3],
            weight: 0.0,
        });
        let of = |id: u64, plane: u16| -> u32 {
            (0..hits.len())
                .find(|&i| truth[i].particle_id == id && hits[i].plane == plane)
                .unwrap() as u32
        };
        let track = |hits: Vec<u32>| Track {
            hits,
            ..Track::default()
        };
        let mut tracks = vec![
            // Particle 1's first two planes, then particle 2's next two: joined (listed
            // downstream first, as a submission may).
            track(vec![of(2, 4), of(2, 3), of(1, 1), of(1, 0)]),
            // 1, 2, 1, 2 along z: mixed.
            track(vec![of(1, 0), of(2, 1), of(1, 2), of(2, 3)]),
            // Three particles.
            track(vec![of(1, 0), of(2, 1), of(4, 2), of(4, 4)]),
            // A noise hit among two particles' hits.
            track(vec![of(1, 0), of(2, 1), noise, of(2, 3)]),
            // Matched (six of particle 1's seven hits and one of 2's): not a ghost.
            track(vec![
                of(1, 0),
                of(1, 1),
                of(1, 2),
                of(2, 3),
                of(1, 4),
                of(1, 5),
                of(1, 6),
            ]),
        ];
        let report = |tracks: &[Track]| {
            let mut ev = Evaluator::new(EvalConfig::default(), None);
            ev.add_event(0, &hits, &truth, None, tracks).unwrap();
            ev.finish()
        };
        let r = report(&tracks);
        assert_eq!((r.n_tracks, r.n_ghosts), (5, 4));
        let kinds = GhostKinds {
            joined: 1,
            mixed: 1,
            several: 1,
            with_noise: 1,
        };
        assert_eq!(r.ghost_kinds, kinds);
        let md = r.to_markdown();
        let row = "| ghosts: joined, mixed, several particles, with noise | 1, 1, 1, 1 |";
        assert!(md.contains(row), "{row} not in\n{md}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ghost_kinds"]["joined"], 1);
        // A third hit of particle 2 after the joined track's: 1, 1, 2, 2, 2 along z, still
        // joined; 1, 2, 1, 2, 2 is mixed.
        tracks.truncate(1);
        tracks[0].hits.push(of(2, 5));
        tracks.push(track(vec![
            of(1, 0),
            of(2, 1),
            of(1, 2),
            of(2, 3),
            of(2, 4),
        ]));
        let r = report(&tracks);
        assert_eq!(r.n_ghosts, 2);
        assert_eq!((r.ghost_kinds.joined, r.ghost_kinds.mixed), (1, 1));
    }

    fn classes(bins: &[ClassBin]) -> Vec<(usize, usize, usize)> {
        bins.iter()
            .map(|b| (b.value, b.n_particles, b.n_found))
            .collect()
    }

    #[test]
    fn efficiency_by_planes_and_missing_planes_and_ghosts_by_fitted_momentum() {
        let (hits, truth, tracks) = hand_made_event();
        let mut ev = Evaluator::new(EvalConfig::default(), None);
        ev.add_event(0, &hits, &truth, None, &tracks).unwrap();
        let r = ev.finish();
        assert_eq!((r.n_reconstructable, r.n_reconstructed), (4, 3));
        // Without a detector the table stops at the most planes hit (7).
        assert_eq!(
            classes(&r.efficiency_vs_planes),
            [(4, 1, 1), (5, 2, 1), (6, 0, 0), (7, 1, 1)]
        );
        assert_eq!(
            classes(&r.efficiency_vs_missing),
            [(0, 1, 1), (1, 1, 1), (2, 1, 0), (3, 1, 1)]
        );
        for bins in [&r.efficiency_vs_planes, &r.efficiency_vs_missing] {
            let n: usize = bins.iter().map(|b| b.n_particles).sum();
            let k: usize = bins.iter().map(|b| b.n_found).sum();
            assert_eq!((n, k), (r.n_reconstructable, r.n_reconstructed));
        }
        let five = &r.efficiency_vs_planes[1];
        assert_eq!(five.efficiency, 0.5);
        assert!((five.efficiency_error - (0.25f64 / 2.0).sqrt()).abs() < 1e-12);

        let ghosts: Vec<_> = r
            .ghosts_vs_p
            .iter()
            .filter(|b| b.n_tracks > 0)
            .map(|b| (b.p_lo_gev, b.n_tracks, b.n_ghosts))
            .collect();
        assert_eq!(ghosts, [(0.5, 1, 0), (3.0, 1, 1), (7.0, 3, 0)]);
        assert_eq!(r.ghosts_vs_p[4].ghost_rate, 1.0);
        assert_eq!((r.n_tracks_unmeasured, r.n_ghosts_unmeasured), (1, 1));
        assert_eq!((r.n_tracks, r.n_ghosts), (7, 3));
        // The three ghosts join hits of three particles.
        assert_eq!(
            r.ghost_kinds,
            GhostKinds {
                several: 3,
                ..GhostKinds::default()
            }
        );

        let md = r.to_markdown();
        for row in [
            "| 2 | 1 | 0 | 0.000 ± 0.000 |",
            "| 3+ | 1 | 1 | 1.000 ± 0.000 |",
            "| 5 | 2 | 1 | 0.500 ± 0.354 |",
            "| 3–5 | 1 | 1 | 1.0000 |",
            "| unmeasured | 1 | 1 | 1.0000 |",
        ] {
            assert!(md.contains(row), "{row} not in\n{md}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["efficiency_vs_missing"][2]["n_particles"], 1);
        assert_eq!(json["ghosts_vs_p"][4]["n_ghosts"], 1);
    }

    #[test]
    fn a_hit_on_no_plane_is_not_a_plane_hit() {
        let (mut hits, mut truth, tracks) = hand_made_event();
        let mut ev = Evaluator::new(EvalConfig::default(), None);
        ev.add_event(0, &hits, &truth, None, &tracks).unwrap();
        let want = ev.finish();
        // Particle 4 (planes 0, 2, 4, 6) also crossed something between the planes.
        let t = truth.iter().position(|t| t.particle_id == 4).unwrap();
        let mut stray = hits[t];
        stray.plane = crate::tracking::trackml::NO_PLANE;
        stray.hit_id = 1000;
        hits.push(stray);
        truth.push(truth[t]);
        let mut ev = Evaluator::new(EvalConfig::default(), None);
        ev.add_event(0, &hits, &truth, None, &tracks).unwrap();
        let got = ev.finish();
        assert_eq!(
            classes(&got.efficiency_vs_planes),
            classes(&want.efficiency_vs_planes)
        );
        assert_eq!(
            classes(&got.efficiency_vs_missing),
            classes(&want.efficiency_vs_missing)
        );
        assert_eq!(
            (got.n_reconstructable, got.n_reconstructed),
            (want.n_reconstructable, want.n_reconstructed)
        );
    }

    #[test]
    fn planes_table_runs_to_the_detectors_plane_count() {
        let (hits, truth, tracks) = hand_made_event();
        let det = detector();
        assert_eq!(det.planes.len(), 8);
        let mut ev = Evaluator::new(EvalConfig::default(), Some(&det));
        ev.add_event(0, &hits, &truth, None, &tracks).unwrap();
        assert_eq!(
            classes(&ev.finish().efficiency_vs_planes),
            [(4, 1, 1), (5, 2, 1), (6, 0, 0), (7, 1, 1), (8, 0, 0)]
        );
    }

    fn detector() -> Detector {
        Detector::from_toml_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/detector.toml"
        ))
        .unwrap()
    }

    /// A minimum-bias event of `det`, the `i`th of random stream `stream`.
    fn minbias_event(det: &Detector, stream: u64, i: u64) -> simulate::SimEvent {
        simulate_event(
            det,
            &SimConfig::preset(Preset::Minbias),
            &mut event_rng(stream, i),
        )
    }

    fn event() -> simulate::SimEvent {
        minbias_event(&detector(), 21, 0)
    }

    /// Perfect tracks: every particle with hits on >= 4 planes, its hits, exact truth state
    /// at its first hit and a unit covariance scaled per parameter.
    fn perfect_tracks(ev: &simulate::SimEvent) -> Vec<Track> {
        let mut by_particle: HashMap<u64, Vec<u32>> = HashMap::new();
        for (i, t) in ev.truth.iter().enumerate() {
            if t.particle_id != 0 {
                by_particle.entry(t.particle_id).or_default().push(i as u32);
            }
        }
        let mut ids: Vec<u64> = by_particle
            .keys()
            .copied()
            .filter(|id| by_particle[id].len() >= 4)
            .collect();
        ids.sort_unstable();
        ids.iter()
            .map(|id| {
                let hits = by_particle[id].clone();
                let t = &ev.truth[hits[0] as usize];
                let q = ev.particles[(*id - 1) as usize].q as f64;
                let s = StateVector::from_momentum(t.pos_mm, t.momentum_gev, q);
                let mut cov = [0f32; 15];
                for (k, v) in [1e-4f32, 1e-4, 1e-8, 1e-8, 1e-6].iter().enumerate() {
                    cov[k * (k + 1) / 2 + k] = *v;
                }
                Track {
                    hits,
                    state: TrackState {
                        z_mm: s.z_mm as f32,
                        x_mm: s.x_mm as f32,
                        y_mm: s.y_mm as f32,
                        tx: s.tx as f32,
                        ty: s.ty as f32,
                        qop: s.qop as f32,
                    },
                    cov,
                    chi2: 0.0,
                    ndf: 5,
                }
            })
            .collect()
    }

    #[test]
    fn perfect_reconstruction_scores_one() {
        let ev = event();
        let tracks = perfect_tracks(&ev);
        assert!(tracks.len() > 5);
        let mut e = Evaluator::new(EvalConfig::default(), None);
        e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
            .unwrap();
        let r = e.finish();
        assert!(r.n_reconstructable > 0);
        assert_eq!(r.efficiency, 1.0);
        assert_eq!((r.n_ghosts, r.ghost_rate, r.n_clones), (0, 0.0, 0));
        assert!((r.trackml_score - 1.0).abs() < 1e-12, "{}", r.trackml_score);
        // States equal the truth up to f32 rounding: pulls are tiny.
        for p in &r.pulls {
            assert!(
                p.stat.n_total == tracks.len() && p.stat.mean.abs() < 0.05 && p.stat.width < 0.05,
                "{p:?}"
            );
        }
        assert!(r.momentum_resolution.width < 1e-5);
    }

    #[test]
    fn split_track_is_a_clone_and_random_hits_are_a_ghost() {
        let ev = event();
        let mut tracks = perfect_tracks(&ev);
        let n_perfect = tracks.len();
        // Split the first track with 8 hits into two halves of 4.
        let k = tracks
            .iter()
            .position(|t| t.hits.len() == 8)
            .expect("a track with 8 hits");
        let second_half = tracks[k].hits.split_off(4);
        tracks.push(Track {
            hits: second_half,
            ..tracks[k].clone()
        });
        // A track of hits from four different particles.
        let ghost: Vec<u32> = (0..4).map(|j| tracks[j].hits[0]).collect();
        tracks.push(Track {
            hits: ghost,
            ..Track::default()
        });
        let mut e = Evaluator::new(EvalConfig::default(), None);
        e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
            .unwrap();
        let r = e.finish();
        assert_eq!(r.efficiency, 1.0);
        assert_eq!(r.n_clones, 1);
        assert_eq!(r.n_ghosts, 1);
        assert!((r.ghost_rate - 1.0 / (n_perfect + 2) as f64).abs() < 1e-12);
        assert!((r.clone_rate - 1.0 / (n_perfect + 1) as f64).abs() < 1e-12);
        // Half of a track is not a majority of the particle's hits: the score drops.
        assert!(r.trackml_score < 1.0 && r.trackml_score > 0.5);
    }

    #[test]
    fn no_tracks_means_no_efficiency_and_zero_score() {
        let ev = event();
        let mut e = Evaluator::new(EvalConfig::default(), None);
        e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &[])
            .unwrap();
        let r = e.finish();
        assert!(r.n_reconstructable > 0);
        assert_eq!(
            (r.efficiency, r.trackml_score, r.ghost_rate),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn impure_track_below_70_percent_is_a_ghost() {
        let ev = event();
        let mut tracks = perfect_tracks(&ev);
        let k = tracks.iter().position(|t| t.hits.len() >= 6).unwrap();
        let other = tracks[(k + 1) % tracks.len()].hits.clone();
        // 6 own hits + 3 foreign: 67 % < 70 %.
        tracks[k].hits.truncate(6);
        tracks[k].hits.extend_from_slice(&other[..3]);
        let mut e = Evaluator::new(EvalConfig::default(), None);
        e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
            .unwrap();
        assert_eq!(e.finish().n_ghosts, 1);
    }

    #[test]
    fn out_of_range_hit_index_is_an_error() {
        let ev = event();
        let bad = Track {
            hits: vec![ev.hits.len() as u32],
            ..Track::default()
        };
        let mut e = Evaluator::new(EvalConfig::default(), None);
        let err = e
            .add_event(3, &ev.hits, &ev.truth, None, &[bad])
            .unwrap_err();
        assert!(matches!(err, EvalError::HitIndex { event_id: 3, .. }));
    }

    #[test]
    fn pulls_of_a_known_gaussian_error_have_unit_width() {
        // Shift each perfect state by a Gaussian of the stated sigma: pulls ~ N(0, 1).
        use rand_distr::{Distribution, StandardNormal};
        let det = detector();
        let mut rng = event_rng(99, 0);
        let mut e = Evaluator::new(EvalConfig::default(), Some(&det));
        for i in 0..30 {
            let ev = minbias_event(&det, 500, i);
            let mut tracks = perfect_tracks(&ev);
            for t in &mut tracks {
                let g = |rng: &mut rand_chacha::ChaCha8Rng| {
                    <StandardNormal as Distribution<f64>>::sample(&StandardNormal, rng) as f32
                };
                t.state.x_mm += 1e-2 * g(&mut rng);
                t.state.y_mm += 1e-2 * g(&mut rng);
                t.state.tx += 1e-4 * g(&mut rng);
                t.state.ty += 1e-4 * g(&mut rng);
                t.state.qop += 1e-3 * g(&mut rng);
                // Every other track with twice the chi-square of the other.
                t.ndf = 4;
                t.chi2 = if t.hits.len() % 2 == 0 { 2.0 } else { 4.0 };
            }
            e.add_event(i, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
                .unwrap();
        }
        let r = e.finish();
        for p in &r.pulls {
            assert!(p.stat.n_total > 200);
            let tol = 5.0 / (p.stat.n_total as f64).sqrt();
            assert!(
                p.stat.mean.abs() < tol && (p.stat.width - 1.0).abs() < 1.5 * tol,
                "{p:?}"
            );
        }
        // The chi-square summary is over the same matched tracks.
        let c = r.fit_chi2_ndf;
        assert_eq!(c.n_tracks, r.pulls[0].stat.n_total);
        assert!(
            c.mean > 0.5 && c.mean < 1.0 && (c.median == 0.5 || c.median == 1.0),
            "{c:?}"
        );
        assert!(r
            .to_markdown()
            .contains("fit chi-square per degree of freedom"));
    }

    #[test]
    fn tracks_with_a_foreign_hit_are_left_out_of_the_fits_pulls() {
        // States shifted by a Gaussian of their stated sigma (pulls ~ N(0, 1)), and every
        // third track with its first hit exchanged for another track's and its state moved
        // by 2.5 sigma more in x and tx (as a foreign first hit pulls it): those stay
        // matched (at least 70 % of their hits) and widen the pulls of all matched tracks,
        // not those of the tracks with only their particle's hits.
        use rand_distr::{Distribution, StandardNormal};
        let det = detector();
        let mut rng = event_rng(98, 0);
        let mut e = Evaluator::new(EvalConfig::default(), Some(&det));
        let (mut n, mut contaminated) = (0, 0);
        for i in 0..30 {
            let ev = minbias_event(&det, 600, i);
            let mut tracks = perfect_tracks(&ev);
            tracks.retain(|t| t.hits.len() >= 4);
            for t in &mut tracks {
                let mut g = || {
                    <StandardNormal as Distribution<f64>>::sample(&StandardNormal, &mut rng) as f32
                };
                t.state.x_mm += 1e-2 * g();
                t.state.y_mm += 1e-2 * g();
                t.state.tx += 1e-4 * g();
                t.state.ty += 1e-4 * g();
                t.state.qop += 1e-3 * g();
            }
            for k in (0..tracks.len().saturating_sub(1)).step_by(3) {
                let foreign = tracks[k + 1].hits[0];
                let t = &mut tracks[k];
                t.hits[0] = foreign;
                t.state.x_mm += 2.5e-2;
                t.state.tx += 2.5e-4;
                contaminated += 1;
            }
            n += tracks.len();
            e.add_event(i, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
                .unwrap();
        }
        let r = e.finish();
        assert_eq!(r.n_ghosts, 0);
        assert_eq!(r.pulls[0].stat.n_total, n);
        assert_eq!(r.pulls_pure[0].stat.n_total, n - contaminated);
        assert!(contaminated > 100, "{contaminated}");
        // The tracks with another particle's first hit are counted as such.
        assert_eq!(r.n_first_hit_own, n - contaminated);
        assert_eq!(r.n_matched_tracks, n);
        assert!((r.first_hit_purity - (n - contaminated) as f64 / n as f64).abs() < 1e-12);
        assert!(r
            .to_markdown()
            .contains("| first hit of the track's particle |"));
        for k in 0..5 {
            let p = &r.pulls_pure[k];
            let tol = 5.0 / (p.stat.n_total as f64).sqrt();
            assert!(
                p.stat.mean.abs() < tol && (p.stat.width - 1.0).abs() < 1.5 * tol,
                "{p:?}"
            );
        }
        for k in [0, 2] {
            assert!(r.pulls[k].stat.width > 1.25, "{:?}", r.pulls[k]);
        }
        assert!(r
            .to_markdown()
            .contains("tracks with only their particle's hits"));
    }

    #[test]
    fn tracks_whose_fit_did_not_measure_the_momentum_give_no_q_over_p_pull() {
        let det = detector();
        let ev = minbias_event(&det, 7, 0);
        let mut tracks = perfect_tracks(&ev);
        let n = tracks.len();
        assert!(n > 20);
        // Half of them as a fit without field reports them: the q/p it assumes, with an
        // error as large.
        for t in tracks.iter_mut().step_by(2) {
            t.state.qop = 0.2;
            t.cov[14] = 0.04;
        }
        assert!(!tracks[0].momentum_measured() && tracks[1].momentum_measured());
        assert!(!tracks[0].momentum_fitted() && tracks[1].momentum_fitted());
        let mut e = Evaluator::new(EvalConfig::default(), Some(&det));
        e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
            .unwrap();
        let r = e.finish();
        assert_eq!(r.pulls[0].stat.n_total, n);
        assert_eq!(r.pulls[4].stat.n_total, n / 2);
        assert_eq!(r.momentum_resolution.n_total, n / 2);
        assert_eq!(r.n_tracks_unmeasured, n.div_ceil(2));
    }

    #[test]
    fn a_fit_that_assumes_q_over_p_in_a_weak_field_gives_no_q_over_p_pull() {
        // A fit without a momentum measurement in a field too weak to bend the tracks
        // beyond the resolution: its assumed q/p's variance moves by a few per cent.
        let det = detector();
        let ev = minbias_event(&det, 8, 0);
        let mut tracks = perfect_tracks(&ev);
        for t in &mut tracks {
            t.state.qop = 0.2;
            t.cov[14] = 0.95 * 0.04;
        }
        assert!(tracks.iter().all(|t| t.momentum_fitted()));
        for (qop_assumed, q_pulls) in [(false, tracks.len()), (true, 0)] {
            let cfg = EvalConfig {
                qop_assumed,
                ..EvalConfig::default()
            };
            let mut e = Evaluator::new(cfg, Some(&det));
            e.add_event(0, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
                .unwrap();
            let r = e.finish();
            assert_eq!(r.pulls[0].stat.n_total, tracks.len());
            assert_eq!(
                r.pulls[4].stat.n_total, q_pulls,
                "qop_assumed {qop_assumed}"
            );
        }
    }

    #[test]
    fn q_over_p_pulls_of_poorly_measured_momenta_keep_unit_width() {
        // A q/p error of 0.6 of the q/p (a field that hardly bends the tracks): the fitted
        // q/p often lands within 0.9 of its error from zero. A cut on the error against
        // the fitted q/p would drop those tracks, whose pulls lean towards zero, and keep
        // the ones that lean away: a pull width of about 0.7 (a unit Gaussian cut below
        // -0.56). Every one counts.
        use rand_distr::{Distribution, StandardNormal};
        let det = detector();
        let mut rng = event_rng(98, 0);
        let mut e = Evaluator::new(EvalConfig::default(), Some(&det));
        let (mut n, mut n_measured) = (0, 0);
        for i in 0..30 {
            let ev = minbias_event(&det, 600, i);
            let mut tracks = perfect_tracks(&ev);
            for t in &mut tracks {
                let sigma = 0.6 * t.state.qop.abs();
                let g: f64 = StandardNormal.sample(&mut rng);
                t.state.qop += sigma * g as f32;
                t.cov[14] = sigma * sigma;
                n += 1;
                n_measured += usize::from(t.momentum_measured());
                assert!(t.momentum_fitted());
            }
            e.add_event(i, &ev.hits, &ev.truth, Some(&ev.particles), &tracks)
                .unwrap();
        }
        let r = e.finish();
        let q = &r.pulls[4].stat;
        assert_eq!(q.n_total, n);
        assert!(n_measured < n * 9 / 10, "{n_measured} of {n}");
        let tol = 5.0 / (n as f64).sqrt();
        assert!(
            q.mean.abs() < tol && (q.width - 1.0).abs() < 1.5 * tol,
            "{q:?}"
        );
    }

    #[test]
    fn robust_stat_of_gaussian_with_outliers() {
        use rand_distr::{Distribution, Normal};
        let mut rng = event_rng(4, 0);
        let n = Normal::new(2.0, 0.5).unwrap();
        let mut v: Vec<f64> = (0..10_000).map(|_| n.sample(&mut rng)).collect();
        v.extend([1e3, -1e4, 5e2, f64::NAN]);
        let s = robust_stat(&v);
        assert!(
            (s.mean - 2.0).abs() < 0.02 && (s.width - 0.5).abs() < 0.015,
            "{s:?}"
        );
        assert_eq!(s.n_total, 10_003);
        // A Gaussian's errors: sigma / sqrt(n) and sigma / sqrt(2 n), within 10 %.
        let n = s.n_used as f64;
        assert!(s.n_used > 9_900 && s.n_used <= 10_000, "{s:?}");
        assert!((s.mean_error / (0.5 / n.sqrt()) - 1.0).abs() < 0.1, "{s:?}");
        assert!(
            (s.width_error / (0.5 / (2.0 * n).sqrt()) - 1.0).abs() < 0.1,
            "{s:?}"
        );
    }

    /// The errors say how far a mean or width may stray by chance: over many samples of
    /// 800 unit Gaussian pulls, about 95 % lie within two errors of 0 and 1, and the
    /// errors shrink as one over the root of the sample.
    #[test]
    fn robust_stat_errors_cover_the_spread_between_samples() {
        use rand_distr::{Distribution, Normal};
        let mut rng = event_rng(5, 0);
        let g = Normal::new(0.0, 1.0).unwrap();
        let (mut in_mean, mut in_width, trials) = (0, 0, 400);
        let mut err_800 = 0.0;
        for _ in 0..trials {
            let v: Vec<f64> = (0..800).map(|_| g.sample(&mut rng)).collect();
            let s = robust_stat(&v);
            in_mean += (s.mean.abs() < 2.0 * s.mean_error) as usize;
            in_width += ((s.width - 1.0).abs() < 2.0 * s.width_error) as usize;
            err_800 += s.mean_error / trials as f64;
        }
        let (fm, fw) = (
            in_mean as f64 / trials as f64,
            in_width as f64 / trials as f64,
        );
        assert!((0.91..=0.99).contains(&fm), "mean within 2 errors: {fm}");
        assert!((0.91..=0.99).contains(&fw), "width within 2 errors: {fw}");
        let v: Vec<f64> = (0..3200).map(|_| g.sample(&mut rng)).collect();
        let ratio = err_800 / robust_stat(&v).mean_error;
        assert!(
            (1.8..2.2).contains(&ratio),
            "error ratio 800 / 3200 values: {ratio}"
        );
    }

    #[test]
    fn plots_and_summaries_are_written() {
        let ev = event();
        let mut e = Evaluator::new(EvalConfig::default(), None);
        e.add_event(
            0,
            &ev.hits,
            &ev.truth,
            Some(&ev.particles),
            &perfect_tracks(&ev),
        )
        .unwrap();
        let r = e.finish();
        let dir = tempfile::tempdir().unwrap();
        write_plots(&r, dir.path()).unwrap();
        for f in [
            "efficiency_vs_p.svg",
            "efficiency_vs_p.png",
            "efficiency_vs_planes.svg",
            "efficiency_vs_planes.png",
            "efficiency_vs_missing.svg",
            "efficiency_vs_missing.png",
            "ghosts_vs_p.svg",
            "ghosts_vs_p.png",
            "pulls.svg",
            "pulls.png",
        ] {
            let len = std::fs::metadata(dir.path().join(f)).unwrap().len();
            assert!(len > 1000, "{f} has {len} bytes");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["efficiency"], 1.0);
        assert!(r.to_markdown().contains("| efficiency | 1.0000"));
    }
}
