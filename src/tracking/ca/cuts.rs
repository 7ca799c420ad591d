//! Every cut of the finder and where it comes from: [`FinderConfig`] derives each window
//! and cut from the detector (plane positions, sizes, resolution, material), the field and
//! the minimum momentum, and says per field which physical quantity it bounds;
//! [`FinderOverrides`] replaces chosen values from a TOML `[finder]` table. The field
//! enters through its bending along the trajectories a track from the origin can take
//! ([`super::bending`]): the largest field on the lines through the acceptance for the
//! curvature bounds here, the tent-weighted mean fields of each plane pair and triple for
//! the doublet and triplet windows ([`super::FinderGeometry`]).
//!
//! | window or cut | bounds |
//! | --- | --- |
//! | origin (`origin_x_mm`, `origin_y_mm`, `origin_z_mm`; box `origin_half_*_mm`) | where the tracks come from: the beam on the target, a box of three standard deviations about its centre; the pointing windows, the pointing parabolas and the lines the field is read along all start there (a centre the configuration does not give is measured by `trigd eval tracking` from the first events' tracks, [`crate::tracking::beam_spot`], and watched by the daemon) |
//! | origin length (`origin_half_z_mm`) | a long target or luminous region: a track of slope `t` from `dz` along the beam crosses the origin plane `t dz` off its vertex, so the box grows with the slope each window sees and the levers from the origin shorten by the half length (measured by `trigd eval tracking` from where the first events' tracks come closest to the beam) |
//! | `max_tx`, `max_ty` | the slopes of tracks from the origin inside the acceptance, plus the bending of a track at the minimum momentum over the detector |
//! | `max_curvature_*_per_mm` | d2x/dz2 and d2y/dz2 of a track at the minimum momentum (with `momentum_slack`) in the largest field on the lines through the acceptance |
//! | doublet pointing window | the miss at the origin: origin size + the pointing tent's bending at the minimum momentum + `n_sigma` scattering upstream + resolution |
//! | triplet continuation window | the change of chord slope: the pointing parabola's prediction, corrected by the q/p it allows for the difference of the pointing and triplet tents' bending (each tent's field at its own mean slope: in a strong field at large slopes the bending factor changes along the track), + origin size + `n_sigma` scattering and resolution |
//! | `triplet_chi2_max` | the breaking angle not explained by the triplet tent's field, in units of scattering and resolution |
//! | `neighbour_chi2_max` | the q/p difference of neighbouring triplets in units of their errors (also where the seeded step makes a triplet upstream of the seed planes in a field map: kept only as a neighbour of one downstream) |
//! | exchange windows (`exchange::ExchangeCuts`, with `exchange_segments`) | the displacement over the gap an exchange crosses of an `n_sigma` scatter at the softer track's momentum (the minimum momentum where none is measured), plus resolution: two tracks further apart on the plane cannot exchange segments there without a kink the fit refuses |
//! | exchange pre-test (`exchange::PRE_TEST`) | how much the squared kinks around an exchange's junction may grow, in standard deviations: along straight chords at the minimum momentum's scattering, and with each track's bending (its fitted q/p times the tent's mean field) taken away at the pair's measured momentum's scattering, the exchanged tracks at the q/p that explains them best |
//! | exchange gain (`exchange::MIN_GAIN`; `exchange::ExchangeCuts::evidence`) | how much likelier (e times) the exchanged pair must be: by the candidates' chi-square where the field measures momenta or one is given; without either, by the kinks' likelihood averaged over the run's spectrum (the candidates' fit then scatters every track at the minimum momentum, where two particles' segments joined cost hardly more than a scatter) |
//! | first-hit window (`first_hits::FirstHitCuts`, with `first_hits_to_origin`) | the chi-square of `n_sigma` (two degrees of freedom) about the point where a particle from the origin through the track's second hit crosses the first hit's plane (the origin's size, measured from the event's tracks and at most the configured box, over its arm, the second hit's resolution, the scattering of every plane before the second hit at the track's fitted momentum, and the q/p error in the field's sagitta), combined, where the first plane is not near the origin, with the track's own fitted point there without its first hit (the fit's covariance, correlated with the origin's point through the shared second hit), plus the first hit's resolution |
//! | second-hit window (`first_hits::FirstHitCuts`, with `second_hits_to_origin`) | the chi-square of `n_sigma` (two degrees of freedom) about the point where a particle from the origin through the track's third hit crosses the second hit's plane (the origin's size and the third hit's resolution over their arms, the scattering of every plane before the third hit, the first's included, at the track's fitted momentum, and the q/p error in the field's sagitta), plus the second hit's resolution |
//! | tracks kept (`MomentumCut`, unless `keep_tracks_below_min_p`) | the fitted momentum, where a field measures it: a track measured below the minimum momentum by more than `n_sigma` of its own q/p error lies outside what every window above was derived for, and is not output |
//! | `clone_window_mm` | the scattering displacement over the detector at the minimum momentum |
//! | exit margins (`may_leave`) | the curvature bound, scattering and resolution over one plane gap |
//! | `stiff_pass_p_factor` | the momentum of a first run of each pass (on consecutive planes, then over missing planes) for the stiffer tracks (every momentum-dependent window above at that momentum), whose hits the runs at the minimum momentum no longer see |
//! | `overflow_p_steps` | the momentum a pass is run again at when its combinations fill a per-event buffer: doubled each time, the windows narrowing with it |
//! | `max_gap_planes` | the planes in a row a track may cross without a hit (plane inefficiency: two in a row miss at `(1 - eff)^2`), bridged by doublets in the second pass |
//! | `max_chi2_ndf` | the fit's chi-square per degree of freedom, its scattering at the track's momentum: measured in a field, at most the minimum momentum's over its slack (`fit.scatter_floor`: no track the finder looks for scatters more), and where a seed's bending cancels its expectation over the q/p's error (`fit.scatter_qop_error`); without one estimated from the track's kinks from the minimum momentum up (`fit.scatter_p_min_gev`), or the one a user gives (`fit.p_no_field_gev`, then widened for the tracks at the minimum momentum) |

use crate::tracking::geometry::Detector;
use crate::tracking::kalman::{FitConfig, MAX_PLANES};
use crate::tracking::propagate::K_GEV_PER_T_MM;
use crate::tracking::simulate::highland_theta0;
use crate::tracking::track::Track;
use serde::Deserialize;

use super::{bending, FinderGeometry};

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
    /// Centre of the region the tracks come from (the beam's position on the target) in x,
    /// mm. Default 0: the beam on the geometry's axis. `trigd eval tracking` reports where
    /// the found tracks point to; a beam further off than the box below loses the stiff
    /// tracks, whose windows are narrowest.
    pub origin_x_mm: f64,
    /// Centre of that region in y, mm. Default 0.
    pub origin_y_mm: f64,
    /// z of the region the tracks come from (target / interaction point), mm. Default 0, the
    /// coordinate origin of the geometry.
    pub origin_z_mm: f64,
    /// Half size in x of that region, mm; infinite disables the pointing window. Default
    /// 1.5 mm (a beam spot up to 0.5 mm rms at 3 sigma).
    pub origin_half_x_mm: f64,
    /// Half size in y of that region, mm. Default 1.5 mm.
    pub origin_half_y_mm: f64,
    /// Half length in z of that region about `origin_z_mm`, mm: a long target, or
    /// colliding beams' luminous region. Default 0 (a thin target). A track of slope `t`
    /// from `dz` upstream or downstream of `origin_z_mm` crosses the origin plane `t dz`
    /// from where it started, so every pointing window's box grows with the slope the
    /// hit is seen at, `origin_half_x_mm + origin_half_z_mm |tx|` (and the levers from
    /// the origin to the planes shorten by it): see [`super::doublets`] and
    /// [`super::triplets`]. The slope limits are derived from the region's downstream
    /// end. `trigd eval tracking` measures it from where the tracks come together along
    /// the beam ([`crate::tracking::beam_spot`]).
    pub origin_half_z_mm: f64,
    /// Largest |dx/dz| of a doublet. Default: the widest plane's half width over its
    /// distance from the origin, plus the bending of a `min_p_gev` track over the detector.
    pub max_tx: f64,
    /// Largest |dy/dz| of a doublet, as `max_tx`.
    pub max_ty: f64,
    /// Largest |d2x/dz2| of a track above the minimum momentum, 1/mm. Default from the
    /// largest field on the lines from the origin through the acceptance up to the last
    /// plane ([`max_curvature_per_mm`]) and `momentum_slack`. It bounds the windows where
    /// no pointing is possible, the exit margins and `max_tx`; the pointing and triplet
    /// windows use the field of each plane pair and triple ([`super::bending`]).
    pub max_curvature_x_per_mm: f64,
    /// Largest |d2y/dz2|, as `max_curvature_x_per_mm`.
    pub max_curvature_y_per_mm: f64,
    /// Largest factor on scattering angles for inclined tracks (longer path, projected
    /// angles): the cuts use the factor of each hit's or track's own slopes
    /// ([`ca::slope_factor`]), at most this one. Default: the factor at the slope limits.
    pub slope_factor: f64,
    /// Width of every window in standard deviations (scattering and resolution). Default 3:
    /// each window is already the sum of its widths' bounds (scattering at the minimum
    /// momentum, the largest slope factor, resolution, the bending bound), so a particle
    /// above the cut lies well inside it; wider windows hold more hits of other particles,
    /// and in dense events on thick planes those make ghosts that take true tracks' hits
    /// (on 102 drawn detectors and events, 3 against 4: efficiency 0.9847 -> 0.9869 and
    /// ghosts 1.53 % -> 1.34 % on average, no sample worse by more than 0.3 % of its
    /// particles; with 2-5 % of the scattering kicks three times wider, no loss).
    pub n_sigma: f64,
    /// Make doublets that skip planes (inefficient planes), in a second pass. Default true.
    pub allow_missing_plane: bool,
    /// Most planes in a row a track may miss (doublets skip up to this many planes; 1 or
    /// 2, at most `MAX_REACH - 1`). Two planes in a row miss a hit with probability
    /// `(1 - efficiency)^2` per pair of planes, about one track in a hundred at 97 %
    /// efficiency on eight planes: without doublets over them such a track falls into two
    /// pieces, each too short where it has fewer than `min_hits` hits. Default 2.
    pub max_gap_planes: usize,
    /// The first pass on consecutive planes runs twice: first for tracks above this factor
    /// times `min_p_gev`, with every momentum-dependent window (bending, scattering, slope
    /// limits, exit margins) derived at that momentum ([`FinderConfig::stiff_pass`]), then
    /// at `min_p_gev` on the hits it left. Most tracks of a busy event are stiff: their
    /// windows are this factor narrower in the bending and the scattering, and the wide
    /// windows of the soft tracks then search a fraction of the hits, with fewer wrong
    /// combinations to choose from. The stiff tracks' candidates are chosen before the
    /// soft ones' (hits used once, as between the passes). The later pass over missing
    /// planes runs the same way in a busy event: first with the stiff cuts for the tracks
    /// that cross the detector with one plane more missing than the first pass allows
    /// ([`FinderConfig::stiff_gap_pass_min_hits`]), then at `min_p_gev` on the hits they
    /// left. Its doublets skip planes, so its combinations grow fastest with the windows:
    /// on thick planes in a strong field the two runs together make about a fifth of the
    /// combinations of one run at `min_p_gev`. At most 1
    /// (or 0): one pass each. Default 3 (the windows a third as wide; the finder's cost is
    /// flat from 2 to 4).
    pub stiff_pass_p_factor: f64,
    /// When a pass fills a per-event buffer (doublets, triplets, neighbours: `limits`), its
    /// search is incomplete and what it would choose from truncated lists is arbitrary. It
    /// is then run again with every momentum-dependent window derived at twice its
    /// momentum ([`FinderConfig::at_momentum_factor`]: the combinations grow with the
    /// square of the windows), doubling up to this many times until it fits, and the
    /// stiffer tracks it finds are taken; then the pass runs once more at its own momentum
    /// on the hits they left, kept if it now fits. An event this happened in still counts
    /// as overflowed ([`super::Overflow`]: `raised` passes); its tracks below the raised
    /// momentum may be missing, the others are found as in an event that fits. 0: the
    /// pass keeps what it found in the truncated lists. Default 4 (up to 16 times the
    /// minimum momentum).
    pub overflow_p_steps: usize,
    /// Fewest hits of an event for the stiff-track pass: in sparse events the windows
    /// hold few wrong hits at any momentum and the extra pass costs more than it saves.
    /// Default 2000.
    pub stiff_pass_min_hits: usize,
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
    /// Grid rows per plane in y, at most: a window scans the hits of the rows it overlaps,
    /// so each plane gets rows about as high as the narrowest doublet window into it, up
    /// to this many (`FinderGeometry`; a telescope's wide pointing windows get a tenth to
    /// a half of them). The grid changes which hits a window compares, never the tracks.
    /// Default 128.
    pub bins_y: usize,
    /// Cut on the breaking-angle chi-square of a triplet at the minimum momentum. Default
    /// `n_sigma^2` (plus one degree of freedom without field).
    pub triplet_chi2_max: f64,
    /// Cut on the chi-square of the q/p difference of neighbouring triplets. Default
    /// `n_sigma^2`.
    pub neighbour_chi2_max: f64,
    /// Fewest hits of a track. Default 4 (3 on a detector of three planes).
    pub min_hits: usize,
    /// Cut on the Kalman fit's chi-square per degree of freedom. Default 5 where the fit
    /// measures the momentum, and without a field where the fit estimates each track's
    /// momentum from its scattering (the candidates are then fitted, ranked and cut with
    /// the scattering of the momentum cut, `fit.scatter_p_min_gev`: [`Self::candidate_fit`]).
    /// Where it assumes one momentum for all (`fit.p_no_field_gev`), a track at the
    /// minimum momentum scatters more: 5 times the largest ratio over the plane gaps of
    /// the residual variance (resolution plus scattering over the gap) at the minimum
    /// momentum to that at the assumed one ([`no_field_chi2_scale`]).
    pub max_chi2_ndf: f64,
    /// A short track whose hits all lie this close (mm) to the trajectory of a longer track
    /// at the minimum momentum is its clone; for a stiffer longer track the window shrinks
    /// with its momentum, to ten hit resolutions at least ([`super::clones::CloneCuts`]).
    /// Default `n_sigma` times the scattering displacement over the detector at the
    /// minimum momentum, at least 10 hit resolutions.
    pub clone_window_mm: f64,
    /// The candidate step runs a second round over the chains that ran into hits the
    /// first round's tracks took: each walked again, choosing among a triplet's left
    /// neighbours those whose hit is still free (in a dense event a particle's own
    /// upstream hit is often second to a neighbour's that another track then takes,
    /// which left the chain too short). Default true.
    pub divert_chains: bool,
    /// After clone suppression, two tracks that come close on a plane exchange their
    /// upstream segments where that lowers their summed chi-square ([`super::exchange`]):
    /// the choice takes one candidate at a time and can join two particles' segments at a
    /// crossing. Worth it in dense events on thick planes (on the 132 drawn samples, 120 ->
    /// 125 meet every aim, efficiency 0.9947 -> 0.9957 and ghosts 0.52 -> 0.43 % on
    /// average), for 10-16 % of the finder's time on one core on the shipped detectors'
    /// central events; on the GPU it runs on the device (`kernels/ca_exchange.cu`)
    /// (`bench/RESULTS.md`). Default true.
    pub exchange_segments: bool,
    /// After clone suppression (and the exchange), each track's first hit is chosen again
    /// with the origin as a measurement ([`super::first_hits`]): the plane nearest the
    /// target is the densest, and there a chain's upstream end often takes a nearby
    /// particle's hit (a quarter of the tracks of the densest drawn samples). Only where
    /// the origin is finite and thin (`origin_half_z_mm` 0). Each track's point on its
    /// first plane is the origin's through its second hit, combined with the track's own
    /// from its next hits where the first plane is not near the origin
    /// ([`super::first_hits::NEAR_ORIGIN_RATIO`]). On the 120 drawn samples it gives mean
    /// efficiency 0.9944 -> 0.9947 and ghosts 0.407 -> 0.376 %, and more tracks start on
    /// their own particle's hit on every shipped detector; it adds a few per cent to the
    /// finder's time on one core (`bench/RESULTS.md`). Default: true.
    pub first_hits_to_origin: bool,
    /// Before the first hits, each track's second hit is chosen again in the same way,
    /// against the origin through its third hit (the origin's point alone): in the
    /// densest cores a track often takes a nearby particle's first two hits, and the first
    /// hit's chord through a wrong second hit points at the wrong particle
    /// ([`super::first_hits`]). Only where `first_hits_to_origin` runs. Default: true.
    pub second_hits_to_origin: bool,
    /// Output the tracks whose fit measures them below the minimum momentum. By default,
    /// where the field measures momenta (`fit.fit_momentum`), a track whose fitted q/p
    /// exceeds `1 / min_p_gev` by more than `n_sigma` of its own q/p error is not output
    /// ([`MomentumCut`]): every window bounds the bending and scattering of tracks above
    /// the minimum, so below it the finder finds some particles and not others (72 % of
    /// the particles of 0.5-1 GeV/c in a drawn sample with a minimum of 1 GeV/c) and its
    /// combinations of several slow particles' hits pass more often (7.7 % ghosts among
    /// the tracks fitted at 0.5-1 GeV/c there, 3.1 % at 1-2). On 102 drawn detectors and
    /// events: ghosts 0.70 -> 0.66 % on average, clones halved, the mean efficiency the
    /// same (three samples lose 0.05-0.06 % of their particles, none gains), one more
    /// sample meets every aim (`bench/RESULTS.md`). Without a field nothing is cut. Kept,
    /// such tracks are fitted with their own scattering: the bound at the minimum
    /// momentum's (`fit.scatter_floor`) is then off. Default false.
    pub keep_tracks_below_min_p: bool,
    /// Kalman fit settings.
    pub fit: FitConfig,
    /// Buffer sizes.
    pub limits: Limits,
}

impl FinderConfig {
    /// Cuts derived from the detector for tracks above `min_p_gev`.
    pub fn from_detector(det: &Detector, min_p_gev: f64) -> Self {
        Self::from_detector_at(det, min_p_gev, [0.0; 3])
    }

    /// Cuts derived from the detector for tracks above `min_p_gev` from an origin at
    /// `origin` (x, y, z in mm): the slope limits and curvature bounds seen from there.
    pub fn from_detector_at(det: &Detector, min_p_gev: f64, origin: [f64; 3]) -> Self {
        let min_p = if min_p_gev.is_finite() && min_p_gev > 0.0 {
            min_p_gev
        } else {
            1.0
        };
        let momentum_slack = 1.15;
        let mut fit = FitConfig::from_detector_at(det, min_p / momentum_slack);
        fit.scatter_p_min_gev = min_p / momentum_slack;
        fit.scatter_floor = true;
        let b = MomentumBounds::new(det, origin, min_p / momentum_slack);
        let (max_tx, max_ty, cx, cy) = (b.max_t[0], b.max_t[1], b.curvature[0], b.curvature[1]);
        let slope_factor = slope_factor(max_tx, max_ty);
        let n_sigma: f64 = 3.0;
        let mut cfg = FinderConfig {
            min_p_gev: min_p,
            momentum_slack,
            origin_x_mm: origin[0],
            origin_y_mm: origin[1],
            origin_z_mm: origin[2],
            origin_half_x_mm: 1.5,
            origin_half_y_mm: 1.5,
            origin_half_z_mm: 0.0,
            max_tx,
            max_ty,
            max_curvature_x_per_mm: cx,
            max_curvature_y_per_mm: cy,
            slope_factor,
            n_sigma,
            allow_missing_plane: true,
            max_gap_planes: super::MAX_REACH - 1,
            first_pass_min_hits: 0,
            stiff_pass_p_factor: 3.0,
            stiff_pass_min_hits: 2000,
            overflow_p_steps: 4,
            first_pass_to_last_plane: true,
            follow_seeds: true,
            follow_seeds_min_hits: 2000,
            bins_x: 8,
            bins_y: 128,
            triplet_chi2_max: n_sigma * n_sigma + if fit.fit_momentum { 0.0 } else { 2.0 },
            neighbour_chi2_max: n_sigma * n_sigma,
            min_hits: if det.planes.len() >= 4 { 4 } else { 3 },
            max_chi2_ndf: max_chi2_ndf(det, min_p, &fit),
            clone_window_mm: 0.0,
            divert_chains: true,
            exchange_segments: true,
            first_hits_to_origin: true,
            second_hits_to_origin: true,
            keep_tracks_below_min_p: false,
            fit,
            limits: Limits::default(),
        };
        cfg.first_pass_min_hits = det.planes.len().saturating_sub(1).max(cfg.min_hits);
        let geo = FinderGeometry::new(det, &cfg);
        let ms = geo.planes.last().map(|g| g.ms_origin_mm).unwrap_or(0.0);
        cfg.clone_window_mm = (n_sigma * ms * slope_factor).max(10.0 * geo.sigma_max_mm());
        cfg
    }

    /// Derived cuts with the given overrides applied.
    pub fn from_detector_with(det: &Detector, min_p_gev: f64, ov: &FinderOverrides) -> Self {
        let min_p = ov.min_p_gev.unwrap_or(min_p_gev);
        // The slope and curvature bounds are derived from the origin as configured.
        let origin = [
            ov.origin_x_mm.unwrap_or(0.0),
            ov.origin_y_mm.unwrap_or(0.0),
            ov.origin_z_mm.unwrap_or(0.0),
        ];
        let origin = if origin.iter().all(|v| v.is_finite()) {
            origin
        } else {
            [0.0; 3]
        };
        let mut c = FinderConfig::from_detector_at(det, min_p, origin);
        let half_z = ov.origin_half_z_mm.unwrap_or(0.0);
        if half_z > 0.0 && half_z.is_finite() {
            // Tracks from the region's downstream end reach the planes' edges at the
            // largest slopes.
            let b = MomentumBounds::new(
                det,
                [origin[0], origin[1], origin[2] + half_z],
                min_p / c.momentum_slack,
            );
            c.max_tx = b.max_t[0];
            c.max_ty = b.max_t[1];
            c.max_curvature_x_per_mm = b.curvature[0];
            c.max_curvature_y_per_mm = b.curvature[1];
            c.slope_factor = slope_factor(b.max_t[0], b.max_t[1]);
        }
        ov.apply(&mut c);
        if ov.max_chi2_ndf.is_none() {
            // The derived cut follows the fit's overridden scattering model.
            c.max_chi2_ndf = max_chi2_ndf(det, c.min_p_gev, &c.fit);
        }
        c
    }

    /// The cuts of the stiff-track pass (see [`Self::stiff_pass_p_factor`]), or `None`
    /// where there is none: this configuration at `stiff_pass_p_factor` times the minimum
    /// momentum ([`Self::at_momentum_factor`]).
    pub fn stiff_pass(&self, det: &Detector) -> Option<FinderConfig> {
        let k = self.stiff_pass_p_factor;
        if !(k > 1.0 && k.is_finite()) {
            return None;
        }
        Some(self.at_momentum_factor(det, k))
    }

    /// Fewest hits of a track found by the stiff-track cuts in the later pass over missing
    /// planes ([`Self::stiff_pass_p_factor`]): one fewer than the first pass's, so that it
    /// takes the stiff tracks crossing the detector with a gap, and leaves the shorter
    /// ones (tracks that leave the detector early, or a stiff track's piece its narrow
    /// windows could not follow past a large scatter) to the pass at the minimum momentum,
    /// which finds them whole rather than in two pieces.
    pub fn stiff_gap_pass_min_hits(&self) -> usize {
        self.first_pass_min_hits
            .saturating_sub(1)
            .max(self.min_hits)
    }

    /// This configuration for tracks above `k` (> 1) times its minimum momentum: the slope
    /// limits and the curvature bounds derived at that momentum from the origin and the
    /// field as [`Self::from_detector`] does (never beyond this configuration's), the
    /// scattering windows following from `min_p_gev` where the finder's tables are built;
    /// every other cut, overrides included, kept, and no stiff-track pass of its own.
    pub fn at_momentum_factor(&self, det: &Detector, k: f64) -> FinderConfig {
        let min_p = self.min_p_gev * k;
        let b = MomentumBounds::new(det, self.slope_origin_mm(), min_p / self.momentum_slack);
        let max_tx = b.max_t[0].min(self.max_tx);
        let max_ty = b.max_t[1].min(self.max_ty);
        FinderConfig {
            min_p_gev: min_p,
            max_tx,
            max_ty,
            max_curvature_x_per_mm: b.curvature[0].min(self.max_curvature_x_per_mm),
            max_curvature_y_per_mm: b.curvature[1].min(self.max_curvature_y_per_mm),
            slope_factor: slope_factor(max_tx, max_ty).min(self.slope_factor),
            stiff_pass_p_factor: 0.0,
            ..self.clone()
        }
    }

    /// The fit of the candidates: the configuration's, but without a field and without a
    /// given momentum (`fit.p_no_field_gev`) the scattering of the momentum cut
    /// (`fit.scatter_p_min_gev`) for every candidate. Ranked and cut by that chi-square, a
    /// candidate pays for every kink beyond what a track at the cut could show; with each
    /// candidate's own estimate a foreign hit's kink read as a lower momentum instead, and
    /// the choice took more ghosts. The accepted tracks are fitted again with their own.
    pub fn candidate_fit(&self) -> FitConfig {
        let mut f = self.fit.clone();
        if f.estimates_scattering() {
            f.p_no_field_gev = Some(f.scatter_p_min_gev);
        }
        // Tracks below the minimum momentum are wanted: their scattering is their own.
        f.scatter_floor &= !self.keep_tracks_below_min_p;
        // One fit per candidate: the choice ranks them by it.
        f.scatter_at_prefit = false;
        f
    }

    /// The accepted tracks' fit where it differs from the candidates'
    /// ([`Self::candidate_fit`]): the finder fits its accepted tracks again with it, and
    /// tracks its later steps change. Without a field and without a given momentum, each
    /// track's own scattering ([`FitConfig::estimates_scattering`]); where the field
    /// measures momenta and `fit.scatter_at_prefit` asks for it, the candidates' fit made
    /// again with every plane's scattering at the first fit's q/p.
    pub fn track_fit(&self) -> Option<FitConfig> {
        if self.fit.estimates_scattering() {
            return Some(self.fit.clone());
        }
        (self.fit.fit_momentum && self.fit.scatter_at_prefit).then(|| {
            let mut f = self.candidate_fit();
            f.scatter_at_prefit = true;
            f
        })
    }

    /// Whether the tracks' fit ([`Self::track_fit`]) is the candidates' fit made again at
    /// its momentum: then an accepted candidate's fit is the first fit of its track's, and
    /// only the fit at that momentum is made
    /// ([`crate::tracking::kalman::KalmanFitter::fit_lanes_from_first`]).
    pub fn track_fit_starts_from_candidate_fit(&self) -> bool {
        !self.fit.estimates_scattering() && self.fit.fit_momentum && self.fit.scatter_at_prefit
    }

    /// The cut on the fitted tracks' momenta ([`Self::keep_tracks_below_min_p`]).
    pub fn momentum_cut(&self) -> MomentumCut {
        MomentumCut {
            max_qop: if self.keep_tracks_below_min_p || !self.fit.fit_momentum {
                f64::INFINITY
            } else {
                1.0 / self.min_p_gev
            },
            n_sigma: self.n_sigma,
        }
    }

    /// The centre of the region the tracks come from, `[x, y, z]` in mm.
    pub fn origin_mm(&self) -> [f64; 3] {
        [self.origin_x_mm, self.origin_y_mm, self.origin_z_mm]
    }

    /// Where the slope limits are seen from: the origin's centre moved downstream by its
    /// half length (`origin_half_z_mm`, when positive), `[x, y, z]` in mm.
    pub fn slope_origin_mm(&self) -> [f64; 3] {
        let dz = if self.origin_half_z_mm > 0.0 && self.origin_half_z_mm.is_finite() {
            self.origin_half_z_mm
        } else {
            0.0
        };
        [self.origin_x_mm, self.origin_y_mm, self.origin_z_mm + dz]
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
            ("origin_x_mm", self.origin_x_mm),
            ("origin_y_mm", self.origin_y_mm),
            ("origin_z_mm", self.origin_z_mm),
        ] {
            if !v.is_finite() {
                return bad(name, "must be finite");
            }
        }
        let half = |f: fn(&crate::tracking::geometry::Plane) -> f64| {
            det.planes.iter().map(f).fold(0.0, f64::max)
        };
        for (name, v, h) in [
            ("origin_x_mm", self.origin_x_mm, half(|p| p.half_x_mm)),
            ("origin_y_mm", self.origin_y_mm, half(|p| p.half_y_mm)),
        ] {
            if v.abs() > h {
                return bad(
                    name,
                    "must lie within the planes' extent (the beam crosses the detector)",
                );
            }
        }
        if !self.origin_half_z_mm.is_finite() {
            return bad("origin_half_z_mm", "must be finite");
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
            ("origin_half_z_mm", self.origin_half_z_mm),
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
        if self.max_gap_planes == 0 || self.max_gap_planes >= super::MAX_REACH {
            return bad("max_gap_planes", "must be 1 or 2");
        }
        if self.stiff_pass_p_factor.is_nan() || self.stiff_pass_p_factor < 0.0 {
            return bad(
                "stiff_pass_p_factor",
                "must be zero or positive (at most 1: no stiff-track pass)",
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
            || !self.fit.p_no_field_gev.is_none_or(positive)
            || !positive(self.fit.scatter_p_min_gev)
            || !positive(self.fit.qop_prior_floor)
        {
            return bad(
                "fit",
                "max_step_mm, p_no_field_gev, scatter_p_min_gev and qop_prior_floor must be positive",
            );
        }
        if !self
            .fit
            .scatter_prior
            .as_deref()
            .is_none_or(crate::tracking::kalman::valid_scatter_prior)
        {
            return bad(
                "fit",
                "scatter_prior must be 16 finite, non-negative weights with a positive, finite sum",
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
    pub origin_x_mm: Option<f64>,
    pub origin_y_mm: Option<f64>,
    pub origin_z_mm: Option<f64>,
    pub origin_half_x_mm: Option<f64>,
    pub origin_half_y_mm: Option<f64>,
    pub origin_half_z_mm: Option<f64>,
    pub max_tx: Option<f64>,
    pub max_ty: Option<f64>,
    pub max_curvature_x_per_mm: Option<f64>,
    pub max_curvature_y_per_mm: Option<f64>,
    pub slope_factor: Option<f64>,
    pub n_sigma: Option<f64>,
    pub allow_missing_plane: Option<bool>,
    pub max_gap_planes: Option<usize>,
    pub first_pass_min_hits: Option<usize>,
    pub stiff_pass_p_factor: Option<f64>,
    pub stiff_pass_min_hits: Option<usize>,
    pub overflow_p_steps: Option<usize>,
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
    pub divert_chains: Option<bool>,
    pub exchange_segments: Option<bool>,
    pub first_hits_to_origin: Option<bool>,
    pub second_hits_to_origin: Option<bool>,
    pub keep_tracks_below_min_p: Option<bool>,
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
    pub scatter_p_min_gev: Option<f64>,
    pub qop_prior_rel: Option<f64>,
    pub qop_prior_floor: Option<f64>,
    pub mass_gev: Option<f64>,
    pub scatter_prior: Option<Vec<f64>>,
    pub scatter_qop_error: Option<bool>,
    pub scatter_floor: Option<bool>,
    pub scatter_at_prefit: Option<bool>,
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
            origin_x_mm,
            origin_y_mm,
            origin_z_mm,
            origin_half_x_mm,
            origin_half_y_mm,
            origin_half_z_mm,
            max_tx,
            max_ty,
            max_curvature_x_per_mm,
            max_curvature_y_per_mm,
            slope_factor,
            n_sigma,
            allow_missing_plane,
            max_gap_planes,
            first_pass_min_hits,
            stiff_pass_p_factor,
            stiff_pass_min_hits,
            overflow_p_steps,
            first_pass_to_last_plane,
            follow_seeds,
            follow_seeds_min_hits,
            bins_x,
            bins_y,
            triplet_chi2_max,
            neighbour_chi2_max,
            min_hits,
            max_chi2_ndf,
            clone_window_mm,
            divert_chains,
            exchange_segments,
            first_hits_to_origin,
            second_hits_to_origin,
            keep_tracks_below_min_p
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
            scatter_p_min_gev,
            qop_prior_rel,
            qop_prior_floor,
            mass_gev,
            scatter_qop_error,
            scatter_floor,
            scatter_at_prefit
        );
        if let Some(p) = f.p_no_field_gev {
            c.fit.p_no_field_gev = Some(p);
        }
        if let Some(w) = &f.scatter_prior {
            c.fit.scatter_prior = Some(w.clone());
        }
        if let Some(l) = &self.limits {
            c.limits = l.clone();
        }
    }
}

/// The fitted tracks the finder outputs ([`FinderConfig::keep_tracks_below_min_p`]): those
/// whose |q/p| is within `n_sigma` of their own q/p error of `max_qop` or below it, and
/// those whose fit does not measure the momentum ([`Track::momentum_measured`]). Both
/// backends apply it to the tracks after clone suppression, in f64 from the tracks' f32
/// values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumCut {
    /// The largest |q/p| a track is taken to be at (1 / `min_p_gev`); infinite: no cut.
    pub max_qop: f64,
    pub n_sigma: f64,
}

impl MomentumCut {
    /// Whether `t` is output.
    pub fn keeps(&self, t: &Track) -> bool {
        let q = (t.state.qop as f64).abs();
        let sigma = (t.var(4) as f64).sqrt();
        // A NaN error compares false: kept.
        !(t.momentum_measured() && q - self.n_sigma * sigma > self.max_qop)
    }
}

/// Factor on the projected scattering angle of a track with slopes `(tx, ty)`: the longer
/// path through a plane and the projection of the space angle on the x-z and y-z planes
/// (1 at normal incidence).
#[inline]
pub fn slope_factor(tx: f64, ty: f64) -> f64 {
    let t = tx.abs().max(ty.abs());
    let n2 = 1.0 + tx * tx + ty * ty;
    ((1.0 + t * t) * n2).sqrt() * n2.sqrt().sqrt()
}

/// The slope limits and curvature bounds of tracks from the origin above a momentum.
struct MomentumBounds {
    /// Largest |dx/dz| and |dy/dz|: the acceptance seen from the origin plus the bending
    /// over the detector (at most 3).
    max_t: [f64; 2],
    /// Largest |d2x/dz2| and |d2y/dz2| on the lines through those slopes, 1/mm.
    curvature: [f64; 2],
}

impl MomentumBounds {
    /// At momentum `p_gev` (the minimum momentum over the slack), from `origin` (mm).
    fn new(det: &Detector, origin: [f64; 3], p_gev: f64) -> Self {
        let origin_z_mm = origin[2];
        // Slope limits from the acceptance seen from the origin.
        let mut tx_geo: f64 = 0.0;
        let mut ty_geo: f64 = 0.0;
        for p in &det.planes {
            let lever = p.z_mm - origin_z_mm;
            if lever > 1.0 {
                tx_geo = tx_geo.max((p.half_x_mm + origin[0].abs()) / lever);
                ty_geo = ty_geo.max((p.half_y_mm + origin[1].abs()) / lever);
            }
        }
        if tx_geo == 0.0 {
            tx_geo = 1.0;
            ty_geo = 1.0;
        }
        let (cx0, cy0) = max_curvature_per_mm(det, origin, p_gev, tx_geo, ty_geo);
        let length = det
            .planes
            .last()
            .map(|p| p.z_mm - origin_z_mm)
            .unwrap_or(0.0)
            .max(0.0);
        let max_tx = (tx_geo + cx0 * length).min(3.0);
        let max_ty = (ty_geo + cy0 * length).min(3.0);
        let (cx, cy) = max_curvature_per_mm(det, origin, p_gev, max_tx, max_ty);
        MomentumBounds {
            max_t: [max_tx, max_ty],
            curvature: [cx, cy],
        }
    }
}

/// Largest |d2x/dz2| and |d2y/dz2| (1/mm) of tracks above `min_p_gev` with slopes up to
/// the given limits, from the largest field on the lines from the origin at `origin` (mm)
/// through the acceptance ([`bending::max_field_tesla`]) up to the last plane.
pub fn max_curvature_per_mm(
    det: &Detector,
    origin: [f64; 3],
    min_p_gev: f64,
    max_tx: f64,
    max_ty: f64,
) -> (f64, f64) {
    let Some(last) = det.planes.last() else {
        return (0.0, 0.0);
    };
    let bmax = bending::max_field_tesla(&det.field, origin, last.z_mm, [max_tx, max_ty]);
    let n = (1.0 + max_tx * max_tx + max_ty * max_ty).sqrt();
    let ax = max_tx * max_ty * bmax[0] + (1.0 + max_tx * max_tx) * bmax[1] + max_ty * bmax[2];
    let ay = (1.0 + max_ty * max_ty) * bmax[0] + max_tx * max_ty * bmax[1] + max_tx * bmax[2];
    let k = K_GEV_PER_T_MM / min_p_gev.max(1e-3) * n;
    (k * ax, k * ay)
}

/// The default of [`FinderConfig::max_chi2_ndf`] for tracks above `min_p_gev`.
pub fn max_chi2_ndf(det: &Detector, min_p_gev: f64, fit: &FitConfig) -> f64 {
    match fit.p_no_field_gev {
        Some(p) if !fit.fit_momentum => 5.0 * no_field_chi2_scale(det, min_p_gev, p),
        _ => 5.0,
    }
}

/// The largest factor, over the gaps between consecutive planes, by which the residual
/// variance of a hit (resolution plus the scattering angle on the plane before times the
/// gap) grows from a track at `p_assumed_gev` to one at `min_p_gev`; at least 1.
pub fn no_field_chi2_scale(det: &Detector, min_p_gev: f64, p_assumed_gev: f64) -> f64 {
    let theta = |x0: f64, p: f64| highland_theta0(p.max(1e-3), 1.0, x0);
    det.planes
        .windows(2)
        .map(|w| {
            let var = w[1].sigma_x_mm.min(w[1].sigma_y_mm).powi(2);
            let dz = w[1].z_mm - w[0].z_mm;
            let at = |p: f64| var + (theta(w[0].x0_fraction, p) * dz).powi(2);
            at(min_p_gev) / at(p_assumed_gev).max(1e-30)
        })
        .fold(1.0, f64::max)
}
