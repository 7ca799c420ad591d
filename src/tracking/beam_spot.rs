//! Where the tracks come from: the beam's position and size on the origin plane, measured
//! from fitted tracks.
//!
//! The finder's pointing windows are centred on the origin the configuration gives
//! ([`FinderConfig::origin_x_mm`], `origin_y_mm`, 0 by default) and are as wide as its box
//! (`origin_half_x_mm`, 1.5 mm by default). A beam further off the detector's axis than
//! that loses the stiff tracks first: their windows are the narrowest (a beam 3 mm off
//! loses about one in ten tracks above 7 GeV/c on a forward tracker). The beam's position
//! is rarely known to a millimetre before a run, so it is measured here from the event's
//! own tracks:
//!
//! - every track with at least [`MIN_HITS`] hits and a fit within the finder's cut, its
//!   fitted state at its first hit carried through the field to the origin plane
//!   ([`propagate::propagate`]) with its covariance;
//! - per axis, the median of the points is the centre; the spread about it (1.4826 times
//!   the median absolute deviation), less the median of the points' own errors, the
//!   beam's size. The medians stand a large share of tracks with a wrong hit or from
//!   elsewhere (decays, secondary interactions); the spread is taken again over the
//!   points within four spreads until they no longer change, so that such tracks spread
//!   over the plane do not widen a narrow beam's.
//!
//! [`measure_origin`] finds the tracks for this with the pointing windows open, so that
//! the measurement does not depend on the origin it measures: first with the configured
//! box, then four times as wide, then with a box of [`OPEN_HALF_MM`], until the tracks
//! found come from well inside the box they were found with ([`inside_the_box`]). A box
//! cuts off a beam it does not hold, so tracks found with one that holds theirs are the
//! tracks the open box finds; and a wide box costs more than it finds in busy events
//! (a central event of 1,000 particles on thick planes: 25 ms with the default box, over
//! a second with the open one, which fills its buffers and finds fewer tracks).

use super::geometry::Detector;
use super::geometry::Field;
use super::propagate;
use super::reco::{FinderConfig, Reconstructor};
use super::track::Track;
use crate::frame::HitRecord;

/// Fewest hits of a track the beam spot is measured with.
pub const MIN_HITS: usize = 4;
/// Fewest tracks for a measurement.
pub const MIN_TRACKS: usize = 20;
/// Most tracks kept (the first ones).
pub const MAX_TRACKS: usize = 20_000;
/// The points within so many spreads of the median make the next round's median and
/// spread ([`BeamSpotMeter::finish`]).
const TRIM: f64 = 4.0;
/// Most rounds of that.
const TRIM_ROUNDS: usize = 8;
/// Longest step of the propagation to the origin plane, mm.
const STEP_MM: f64 = 50.0;

/// The beam spot as the tracks see it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BeamSpot {
    /// z of the plane it is measured on, mm.
    pub z_mm: f64,
    /// The median of the tracks' points on it, x and y, mm.
    pub centre_mm: [f64; 2],
    /// The spread of the points about the centre (1.4826 times the median absolute
    /// deviation), mm.
    pub spread_mm: [f64; 2],
    /// That spread less the points' own errors (the median of their standard deviations,
    /// in quadrature; 0 where the errors are larger): the beam's size, mm.
    pub size_mm: [f64; 2],
    /// The statistical error of the centre (1.2533 times the spread over the square root
    /// of the tracks), mm.
    pub centre_error_mm: [f64; 2],
    /// The tracks measured.
    pub n_tracks: usize,
    /// Where along the beam they come from ([`OriginLength`]); `None` with fewer than
    /// [`MIN_TRACKS`] tracks inclined enough to say.
    pub length: Option<OriginLength>,
}

/// Where along the beam the tracks come from: each track's point of closest approach to
/// the beam line (through the spot's centre, along z), in a straight line from its point
/// on the origin plane. A long target or colliding beams' luminous region spreads it over
/// their length; a thin target only by the tracks' errors across the beam over their
/// slopes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct OriginLength {
    /// The median of the tracks' z there, mm.
    pub z_centre_mm: f64,
    /// The region's half length: 1.2 times the 97th percentile of the tracks' distances
    /// from that median (the points within four spreads of it), mm. For a uniform target
    /// about 1.16 times its half length, for a Gaussian region 2.6 standard deviations.
    pub half_length_mm: f64,
    /// The median error of a track's z: its offset's error across the beam, the beam's
    /// own size included, over its slope, mm. The tracks whose error is at most the
    /// median of all make the measurement.
    pub z_error_mm: f64,
    /// The median slope (`sqrt(tx^2 + ty^2)`) of the tracks measured.
    pub median_slope: f64,
    /// The spread (1.4826 times the median absolute deviation) of the tracks' offsets
    /// from the beam line across their own direction, which their z does not move: the
    /// beam's size with the points' errors, mm.
    pub across_spread_mm: f64,
    /// The tracks measured (slopes of at least [`LENGTH_MIN_SLOPE`], errors in z at most
    /// the median).
    pub n_tracks: usize,
}

/// Fewest slope of a track [`OriginLength`] is measured with.
pub const LENGTH_MIN_SLOPE: f64 = 0.01;

impl OriginLength {
    /// Whether the length is measured, not the tracks' errors: the half length more than
    /// five times a track's typical error in z (a thin target's tracks give about 3.5).
    pub fn resolved(&self) -> bool {
        self.half_length_mm > 5.0 * self.z_error_mm
    }
}

/// The median and spread (1.4826 times the median absolute deviation) of `values`,
/// again over those within [`TRIM`] spreads of the median until the set no longer
/// changes (at most [`TRIM_ROUNDS`] times), and how many that is; `None` with fewer
/// than [`MIN_TRACKS`]. `scratch` is reused.
fn trimmed(values: &[f64], scratch: &mut Vec<f64>) -> Option<(f64, f64, usize)> {
    let (mut m, mut spread, mut n_in) = (0.0, f64::INFINITY, usize::MAX);
    for _ in 0..TRIM_ROUNDS {
        scratch.clear();
        scratch.extend(
            values
                .iter()
                .copied()
                .filter(|x| (x - m).abs() <= TRIM * spread),
        );
        if scratch.len() < MIN_TRACKS || scratch.len() == n_in {
            break;
        }
        n_in = scratch.len();
        m = median(scratch);
        for x in scratch.iter_mut() {
            *x = (*x - m).abs();
        }
        spread = 1.4826 * median(scratch);
    }
    (n_in != usize::MAX && spread.is_finite()).then_some((m, spread, n_in))
}

/// Collects tracks' points on the origin plane ([`BeamSpotMeter::add`]) and measures the
/// beam spot from them ([`BeamSpotMeter::finish`]).
#[derive(Debug, Clone)]
pub struct BeamSpotMeter {
    z_mm: f64,
    max_chi2_ndf: f64,
    /// Largest |q/p| of a track measured ([`Self::stiff`]).
    max_qop: f64,
    /// Per track: x, y, their variances, and the slopes there.
    points: Vec<[f64; 6]>,
}

impl BeamSpotMeter {
    /// Points on the plane at `z_mm` of tracks whose chi-square per degree of freedom is
    /// at most `max_chi2_ndf`.
    pub fn new(z_mm: f64, max_chi2_ndf: f64) -> Self {
        BeamSpotMeter {
            z_mm,
            max_chi2_ndf,
            max_qop: f64::INFINITY,
            points: Vec::new(),
        }
    }

    /// Only tracks above [`STIFF_FACTOR`] times `cfg`'s minimum momentum where its fit
    /// measures the momentum (every track without a field): the least scattering on the
    /// way back to the plane, so that the spread is the beam's, not the soft tracks'
    /// errors, and the measurements of [`measure_origin`], of `trigd eval tracking`'s
    /// report and of the daemon's watch see the same tracks.
    pub fn stiff(self, cfg: &FinderConfig) -> Self {
        self.above(stiff_p_gev(cfg))
    }

    /// Only tracks of fitted momentum `p_gev` or more (0: every track).
    pub fn above(mut self, p_gev: f64) -> Self {
        if p_gev > 0.0 && p_gev.is_finite() {
            self.max_qop = 1.0 / p_gev;
        }
        self
    }

    /// Tracks measured so far.
    pub fn n_tracks(&self) -> usize {
        self.points.len()
    }

    /// Adds the tracks of one event (up to [`MAX_TRACKS`] in all).
    pub fn add(&mut self, field: &Field, tracks: &[Track]) {
        self.add_at_most(field, tracks, usize::MAX);
    }

    /// Adds the first `n` tracks of one event that can be measured (up to [`MAX_TRACKS`] in
    /// all).
    pub fn add_at_most(&mut self, field: &Field, tracks: &[Track], n: usize) {
        let mut added = 0;
        for t in tracks {
            if self.points.len() >= MAX_TRACKS || added >= n {
                return;
            }
            if let Some(p) = self.point(field, t) {
                self.points.push(p);
                added += 1;
            }
        }
    }

    /// Forgets the tracks measured so far.
    pub fn clear(&mut self) {
        self.points.clear();
    }

    /// A track's point on the plane and its variances, or `None` for a short or poorly
    /// fitted track, or one that starts upstream of the plane.
    fn point(&self, field: &Field, t: &Track) -> Option<[f64; 6]> {
        let chi2 = t.chi2_ndf() as f64;
        if t.hits.len() < MIN_HITS || chi2.is_nan() || chi2 > self.max_chi2_ndf {
            return None;
        }
        let s = &t.state;
        let z0 = s.z_mm as f64;
        if z0 <= self.z_mm {
            return None;
        }
        let qop = if s.qop.is_finite() { s.qop as f64 } else { 0.0 };
        if qop.abs() > self.max_qop {
            return None;
        }
        let state = [s.x_mm as f64, s.y_mm as f64, s.tx as f64, s.ty as f64, qop];
        let (out, jac) = propagate::propagate(field, z0, state, self.z_mm, STEP_MM);
        // The variances of x and y on the plane: J C J^T.
        let cov = |i: usize, j: usize| {
            let (a, b) = if i >= j { (i, j) } else { (j, i) };
            t.cov[a * (a + 1) / 2 + b] as f64
        };
        let var = |r: usize| {
            let mut v = 0.0;
            for i in 0..5 {
                for j in 0..5 {
                    v += jac[r][i] * cov(i, j) * jac[r][j];
                }
            }
            v
        };
        let p = [out[0], out[1], var(0), var(1), out[2], out[3]];
        p.iter().all(|v| v.is_finite()).then_some(p)
    }

    /// The beam spot, or `None` with fewer than [`MIN_TRACKS`] tracks.
    pub fn finish(&self) -> Option<BeamSpot> {
        let n = self.points.len();
        if n < MIN_TRACKS {
            return None;
        }
        let mut spot = BeamSpot {
            z_mm: self.z_mm,
            centre_mm: [0.0; 2],
            spread_mm: [0.0; 2],
            size_mm: [0.0; 2],
            centre_error_mm: [0.0; 2],
            n_tracks: n,
            length: None,
        };
        let mut v: Vec<f64> = Vec::with_capacity(n);
        let mut coords: Vec<f64> = Vec::with_capacity(n);
        for c in 0..2 {
            // Tracks from elsewhere (ghosts, decays), spread flat over the plane, would
            // widen the median absolute deviation of a narrow beam: [`trimmed`].
            coords.clear();
            coords.extend(self.points.iter().map(|p| p[c]));
            let (m, spread, n_in) = trimmed(&coords, &mut v)?;
            v.clear();
            v.extend(
                self.points
                    .iter()
                    .filter(|p| (p[c] - m).abs() <= TRIM * spread)
                    .map(|p| p[2 + c].max(0.0)),
            );
            let err2 = median(&mut v);
            spot.centre_mm[c] = m;
            spot.spread_mm[c] = spread;
            spot.size_mm[c] = (spread * spread - err2).max(0.0).sqrt();
            spot.centre_error_mm[c] = 1.2533 * spread / (n_in.min(n) as f64).sqrt();
        }
        spot.length = self.length(spot.centre_mm, &mut v);
        Some(spot)
    }

    /// Where along the beam line through `centre` the tracks come from ([`OriginLength`]).
    fn length(&self, centre: [f64; 2], v: &mut Vec<f64>) -> Option<OriginLength> {
        // Per inclined track: the offset from the beam line along and across the slope's
        // direction, the slope, and the offset's variance along it.
        let mut along = Vec::new();
        let mut across = Vec::new();
        for p in &self.points {
            let (tx, ty) = (p[4], p[5]);
            let t = tx.hypot(ty);
            if t.is_nan() || t < LENGTH_MIN_SLOPE {
                continue;
            }
            let (dx, dy) = (p[0] - centre[0], p[1] - centre[1]);
            let u = (dx * tx + dy * ty) / t;
            let var_u = (p[2] * tx * tx + p[3] * ty * ty) / (t * t);
            along.push([self.z_mm - u / t, t, var_u]);
            across.push((dx * ty - dy * tx) / t);
        }
        let (_, across_spread, _) = trimmed(&across, v)?;
        // Each track's error in z; the better half of the tracks measure (the flattest
        // have errors of centimetres).
        let err = |a: &[f64; 3]| (a[2] + across_spread * across_spread).sqrt() / a[1];
        v.clear();
        v.extend(along.iter().map(err));
        let cut = median(v);
        along.retain(|a| err(a) <= cut);
        let z: Vec<f64> = along.iter().map(|a| a[0]).collect();
        let (zc, spread, n_in) = trimmed(&z, v)?;
        v.clear();
        v.extend(
            z.iter()
                .map(|z| (z - zc).abs())
                .filter(|d| *d <= TRIM * spread),
        );
        v.sort_by(f64::total_cmp);
        let q97 = v[((v.len() as f64 * 0.97) as usize).min(v.len() - 1)];
        v.clear();
        v.extend(along.iter().map(err));
        let z_error = median(v);
        v.clear();
        v.extend(along.iter().map(|a| a[1]));
        let median_slope = median(v);
        Some(OriginLength {
            z_centre_mm: zc,
            half_length_mm: 1.2 * q97,
            z_error_mm: z_error,
            median_slope,
            across_spread_mm: across_spread,
            n_tracks: n_in,
        })
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let k = v.len() / 2;
    *v.select_nth_unstable_by(k, f64::total_cmp).1
}

/// The momentum, in units of the finder's minimum, above which tracks measure the beam
/// spot ([`BeamSpotMeter::stiff`], [`measure_origin`]).
pub const STIFF_FACTOR: f64 = 3.0;

/// The fitted momentum from which tracks measure the beam spot for `cfg`: [`STIFF_FACTOR`]
/// times its minimum where its fit measures the momentum, else 0 (every track).
pub fn stiff_p_gev(cfg: &FinderConfig) -> f64 {
    if cfg.fit.fit_momentum {
        STIFF_FACTOR * cfg.min_p_gev
    } else {
        0.0
    }
}

/// The widest origin box's half size [`measure_origin`] finds tracks with, mm: a beam
/// anywhere within it, or spread over it, is measured alike (without a box at all the doublet
/// windows open to the largest slopes, four times the cost per event).
pub const OPEN_HALF_MM: f64 = 25.0;
/// Fewest tracks [`measure_origin`] reads events for.
pub const ORIGIN_TRACKS: usize = 400;
/// Most events [`measure_origin`] reads.
pub const ORIGIN_EVENTS: usize = 50;

/// The beam spot of the first events of `events` (up to [`ORIGIN_EVENTS`], or fewer once
/// [`ORIGIN_TRACKS`] tracks are measured), their tracks found with `cfg`'s cuts but the
/// pointing windows open and above three times its minimum momentum (the narrowest
/// windows, the least scattering on the way back to the plane). The box is `cfg`'s, where
/// the tracks come from well inside it ([`inside_the_box`]); else [`WIDEN`] times as wide,
/// where they come from well inside that; else [`OPEN_HALF_MM`] (so that tracks from
/// anywhere within it are found alike). `None` with fewer than [`MIN_TRACKS`] tracks.
pub fn measure_origin<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    events: impl IntoIterator<Item = E>,
) -> Option<BeamSpot> {
    let events: Vec<E> = events.into_iter().take(ORIGIN_EVENTS).collect();
    let measure = |half: f64| spot_in_box(det, cfg, [half; 2], &events);
    let configured = cfg.origin_half_x_mm.max(cfg.origin_half_y_mm);
    let open = configured.max(OPEN_HALF_MM);
    for half in [configured, WIDEN * configured] {
        if !(half > 0.0 && half < open) {
            break;
        }
        if let Some(spot) = measure(half).filter(|s| inside_the_box(s, cfg, half)) {
            return Some(spot);
        }
    }
    measure(open)
}

/// The beam spot on the origin plane of the stiff tracks of `events` found with an origin
/// box of half sizes `half_mm` ([`open_tracks`]); `None` without planes or with fewer than
/// [`MIN_TRACKS`] tracks.
fn spot_in_box<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    half_mm: [f64; 2],
    events: &[E],
) -> Option<BeamSpot> {
    let tracks = open_tracks(det, cfg, half_mm, events.iter().map(|e| e.as_ref()))?;
    let mut meter = BeamSpotMeter::new(cfg.origin_z_mm, cfg.max_chi2_ndf).stiff(cfg);
    meter.add(&det.field, &tracks);
    meter.finish()
}

/// How much wider each box [`measure_origin`] tries is than the one before.
pub const WIDEN: f64 = 4.0;

/// Whether the tracks of `spot`, found with an origin box of half size `half_mm` about
/// `cfg`'s origin, come from well inside it, so that a wider box would find them alike:
/// on both axes their centre's distance from the origin plus four spreads (their errors
/// included) within half the box, and along the beam, where their region is measured
/// ([`OriginLength::resolved`]), its reach beyond the configured length times their median
/// slope within a quarter of it. Tracks the box cuts off spread over all of it.
pub fn inside_the_box(spot: &BeamSpot, cfg: &FinderConfig, half_mm: f64) -> bool {
    let centre = [cfg.origin_x_mm, cfg.origin_y_mm];
    let across = (0..2)
        .all(|c| (spot.centre_mm[c] - centre[c]).abs() + 4.0 * spot.spread_mm[c] <= half_mm / 2.0);
    let along = match &spot.length {
        Some(l) if l.resolved() => {
            let reach = l.half_length_mm + (l.z_centre_mm - cfg.origin_z_mm).abs()
                - cfg.origin_half_z_mm.max(0.0);
            reach.max(0.0) * l.median_slope <= half_mm / 4.0
        }
        _ => true,
    };
    across && along
}

/// The tracks of the first events of `events` (up to [`ORIGIN_EVENTS`], or fewer once
/// [`ORIGIN_TRACKS`] of them can be measured), found with `cfg`'s cuts above three times
/// its minimum momentum (the narrowest windows, the least scattering on the way back to
/// the origin) and an origin box of half size `half_mm` (infinite: none); `None` without
/// planes.
fn open_tracks<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    half_mm: [f64; 2],
    events: impl IntoIterator<Item = E>,
) -> Option<Vec<Track>> {
    let first = det.planes.first()?.z_mm;
    let mut open = cfg.at_momentum_factor(det, STIFF_FACTOR);
    open.origin_half_x_mm = half_mm[0];
    open.origin_half_y_mm = half_mm[1];
    open.exchange_segments = false;
    open.first_hits_to_origin = false;
    let mut reco = Reconstructor::new(det, open);
    let (mut tracks, mut all) = (Vec::new(), Vec::new());
    let mut counter = BeamSpotMeter::new(first - 1.0, cfg.max_chi2_ndf).stiff(cfg);
    for hits in events.into_iter().take(ORIGIN_EVENTS) {
        reco.reconstruct(hits.as_ref(), &mut tracks);
        counter.add(&det.field, &tracks);
        all.append(&mut tracks);
        if counter.n_tracks() >= ORIGIN_TRACKS {
            break;
        }
    }
    Some(all)
}

/// Candidate planes of [`measure_origin_z`]'s coarse scan.
const Z_SCAN: usize = 64;
/// Candidate planes of its fine scan about the coarse scan's best.
const Z_FINE: usize = 32;

/// Where the tracks of the first events come from in z: the plane upstream of the first
/// detector plane where their points are the least spread (the sum of the squared spreads
/// in x and y, [`BeamSpotMeter::finish`]), searched from the first plane back over twice
/// the detector's length, first on [`Z_SCAN`] planes, then on [`Z_FINE`] about the best;
/// the tracks found as by [`measure_origin`] but without any origin box (a target
/// elsewhere than the configured origin is seen from every plane pair alike). The beam
/// spot on the configured origin's plane and on that plane, or `None` with fewer than
/// [`MIN_TRACKS`] tracks. For a
/// configuration whose coordinates start elsewhere than at the target (the first plane at
/// z = 0, or the magnet's centre), where the default origin at z = 0 is wrong.
pub fn measure_origin_z<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    events: impl IntoIterator<Item = E>,
) -> Option<(BeamSpot, BeamSpot)> {
    let (first, last) = (det.planes.first()?.z_mm, det.planes.last()?.z_mm);
    let all = open_tracks(det, cfg, [f64::INFINITY; 2], events)?;
    let spot_at = |z: f64| {
        let mut m = BeamSpotMeter::new(z, cfg.max_chi2_ndf).stiff(cfg);
        m.add(&det.field, &all);
        m.finish()
    };
    let score = |s: &BeamSpot| s.spread_mm[0].powi(2) + s.spread_mm[1].powi(2);
    let best = |lo: f64, hi: f64, n: usize| {
        (0..=n)
            .map(|k| lo + (hi - lo) * k as f64 / n as f64)
            .filter_map(|z| spot_at(z).map(|s| (score(&s), z)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let (lo, hi) = (first - 2.0 * (last - first).max(1.0), first - 1.0);
    let step = (hi - lo) / Z_SCAN as f64;
    let (_, z) = best(lo, hi, Z_SCAN)?;
    let (_, z) = best((z - step).max(lo), (z + step).min(hi), Z_FINE)?;
    Some((spot_at(cfg.origin_z_mm)?, spot_at(z)?))
}

/// Whether the tracks of `at_z` come from a point elsewhere than the configured origin's
/// plane, `at_origin` their spot there: on its own plane the spot is at most a third as
/// spread as on the configured one, and the configured box would not hold it there
/// ([`wider_origin`]) where it holds it on its own plane.
pub fn origin_elsewhere(at_origin: &BeamSpot, at_z: &BeamSpot, cfg: &FinderConfig) -> bool {
    let spread = |s: &BeamSpot| s.spread_mm[0].hypot(s.spread_mm[1]);
    spread(at_z) * 3.0 <= spread(at_origin)
        && wider_origin(at_origin, cfg).is_some()
        && wider_origin(at_z, cfg).is_none()
}

/// The origin box's half sizes the tracks of `spot` need, where the configured box is too
/// narrow for them: three times their spread about the centre (the box is three standard
/// deviations of the beam; the spread, errors included, never less than the beam), per
/// axis, in hundredths of a millimetre up, never below the configured box. `None` where
/// the configured box holds three spreads on both axes. A wide beam (a test beam spread
/// over the planes), a long target seen from the planes, a beam that wanders: all are
/// tracks the pointing windows would lose with the default box.
///
/// With a long origin configured (`origin_half_z_mm`), whose box grows with the slope,
/// the spread is the tracks' across their own direction ([`OriginLength`]), which their
/// z does not move.
pub fn wider_origin(spot: &BeamSpot, cfg: &FinderConfig) -> Option<[f64; 2]> {
    let half = [cfg.origin_half_x_mm, cfg.origin_half_y_mm];
    let need = box_of(spot, cfg, 3.0);
    (0..2)
        .any(|c| half[c].is_finite() && need[c] > half[c])
        .then(|| std::array::from_fn(|c| need[c].max(half[c])))
}

/// The box to set where [`wider_origin`] finds the configured one too narrow: four
/// spreads per axis, never below the configured box (`None` where it is wide enough). A
/// box set from a measurement holds four spreads, as [`narrower_origin`]'s does, while
/// the check asks for three: the first events' spread is itself measured, a few per cent
/// off with a hundred tracks, and a box of three measured spreads would be found too
/// narrow again by the next measurement as often as not (and lose the beam's tails,
/// 0.3 % of a Gaussian beam per axis beyond three standard deviations).
pub fn widened_origin(spot: &BeamSpot, cfg: &FinderConfig) -> Option<[f64; 2]> {
    wider_origin(spot, cfg)?;
    let half = [cfg.origin_half_x_mm, cfg.origin_half_y_mm];
    let need = box_of(spot, cfg, 4.0);
    Some(std::array::from_fn(|c| need[c].max(half[c])))
}

/// Most rounds of [`settled_origin`].
pub const SETTLE_ROUNDS: usize = 6;

/// The box a widened one settles to: the tracks of the first events found again with the
/// box `half_mm` (the stiff tracks, as [`measure_origin`] finds them), and the box made
/// their four spreads ([`widened_origin`]'s rule) per axis where that is narrower, until
/// a round narrows it by less than a tenth on both axes (at most [`SETTLE_ROUNDS`]).
/// Returns the box and the spot of the last round that kept its tracks, or `None` where
/// the first round measures nothing.
///
/// A box measured from tracks found with a wider one is too wide where the wider box
/// itself made the spread: in a busy event on a detector that tells the upstream hits
/// apart poorly (few planes, a field that reverses between them), the open box lets
/// the stiff tracks take other particles' first hits, their bending-plane points spread
/// over millimetres, and a box of four such spreads keeps the combinations that made
/// them. Found again with a box that holds four true spreads, the tracks come from the
/// beam again and their spread shrinks, round by round, to the beam's and their own
/// errors': a box of four spreads keeps all but 6e-5 of a Gaussian beam, so the shrinking
/// stops there. On `random:336`'s central events (5 planes, a field that changes sign
/// between the second and third) the box widened to 5.97 x 1.5 mm settles at 0.76 x
/// 0.47 mm: efficiency 0.747 -> 0.801, ghosts 24 % -> 17 % (`bench/RESULTS.md`).
pub fn settled_origin<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    events: &[E],
    half_mm: [f64; 2],
) -> Option<([f64; 2], BeamSpot)> {
    let mut half = half_mm;
    let mut last = None;
    for _ in 0..SETTLE_ROUNDS {
        let Some(spot) = spot_in_box(det, cfg, half, events) else {
            break;
        };
        let need = box_of(&spot, cfg, 4.0);
        last = Some((half, spot));
        // Narrower where the tracks allow; never wider than the box they were found with
        // (a box that cuts its tracks off would only measure its own width).
        let next: [f64; 2] = std::array::from_fn(|c| need[c].clamp(1e-2, half[c]));
        if (0..2).all(|c| next[c] > 0.9 * half[c]) {
            break;
        }
        half = next;
    }
    last
}

/// The origin's half length (`origin_half_z_mm`) the tracks of `spot` need, where the
/// configured one is too short for them and that loses tracks: their region along the
/// beam is measured ([`OriginLength::resolved`]), reaches further from the configured
/// origin's z than its half length, and the difference times the tracks' median slope
/// (how far it moves a typical track's point on the origin plane) exceeds a third of the
/// box's smaller half size. Its distance from the configured z plus its half length, in
/// tenths of a millimetre up; `None` otherwise. Within the box's share a thin target's
/// tracks need nothing, however their z is spread by their errors.
pub fn longer_origin(spot: &BeamSpot, cfg: &FinderConfig) -> Option<f64> {
    let l = spot.length.as_ref()?;
    if !l.resolved() {
        return None;
    }
    let need = l.half_length_mm + (l.z_centre_mm - cfg.origin_z_mm).abs();
    let need = (need * 10.0).ceil() / 10.0;
    let half = cfg.origin_half_x_mm.min(cfg.origin_half_y_mm);
    let have = cfg.origin_half_z_mm.max(0.0);
    (half.is_finite() && need > have && (need - have) * l.median_slope > half / 3.0).then_some(need)
}

/// The origin box's half sizes the tracks of `spot` need where the configured box is
/// much wider than they come from: four times their spread per axis (errors included;
/// [`wider_origin`] asks for three, so that a later measurement a little wider does not
/// call for a wider box), in hundredths of a millimetre up, where that is under two
/// thirds of the configured box on both axes; `None` otherwise, and without a field,
/// where the spread cannot be taken from the stiff tracks alone ([`stiff_p_gev`]). In
/// dense events a narrower box holds fewer combinations of other particles' hits
/// (ghosts, and true tracks' hits taken by them).
pub fn narrower_origin(spot: &BeamSpot, cfg: &FinderConfig) -> Option<[f64; 2]> {
    if stiff_p_gev(cfg) <= 0.0 {
        return None;
    }
    let half = [cfg.origin_half_x_mm, cfg.origin_half_y_mm];
    let need = box_of(spot, cfg, 4.0);
    (0..2)
        .all(|c| half[c].is_finite() && need[c] > 0.0 && need[c] < half[c] * 2.0 / 3.0)
        .then_some(need)
}

/// The box half sizes of `k` spreads of the tracks of `spot`, in hundredths of a
/// millimetre up: their spread on the origin plane, or with a long origin configured
/// their spread across their own direction (which their z does not move).
fn box_of(spot: &BeamSpot, cfg: &FinderConfig, k: f64) -> [f64; 2] {
    let spread = match (&spot.length, cfg.origin_half_z_mm > 0.0) {
        (Some(l), true) => [l.across_spread_mm; 2],
        _ => spot.spread_mm,
    };
    spread.map(|s| (k * s * 100.0).ceil() / 100.0)
}

/// What to configure where the tracks of `spot` come from off the finder's origin
/// ([`off_the_origin`]), spread wider than its box ([`wider_origin`]) or along the beam
/// further than its length ([`longer_origin`]), each of which loses tracks: a sentence
/// for the log, `None` where none.
pub fn origin_advice(spot: &BeamSpot, cfg: &FinderConfig) -> Option<String> {
    if let (Some(need), Some(l)) = (longer_origin(spot, cfg), &spot.length) {
        return Some(format!(
            "the tracks come from z = {:.1} mm, {:.1} mm either side ({} tracks of median slope {:.3}), longer than the finder's origin (z = {} mm, half length {} mm), which loses tracks: set [tracking.finder] origin_half_z_mm = {need} or more",
            l.z_centre_mm,
            l.half_length_mm,
            l.n_tracks,
            l.median_slope,
            cfg.origin_z_mm,
            cfg.origin_half_z_mm
        ));
    }
    let (what, set) = match (off_the_origin(spot, cfg), wider_origin(spot, cfg)) {
        (false, None) => return None,
        (true, None) => ("off", "origin_x_mm and origin_y_mm".to_string()),
        (false, Some([hx, hy])) => (
            "spread wider than the box of",
            format!("origin_half_x_mm = {hx} and origin_half_y_mm = {hy} or more"),
        ),
        (true, Some([hx, hy])) => (
            "off and spread wider than the box of",
            format!("origin_x_mm, origin_y_mm, origin_half_x_mm = {hx} and origin_half_y_mm = {hy} or more"),
        ),
    };
    Some(format!(
        "the tracks come from x = {:.3} mm, y = {:.3} mm at z = {} mm (spread {:.3} / {:.3} mm, {} tracks), {what} the finder's origin ({} mm, {} mm; half size {} x {} mm), which loses stiff tracks: set [tracking.finder] {set}",
        spot.centre_mm[0],
        spot.centre_mm[1],
        spot.z_mm,
        spot.spread_mm[0],
        spot.spread_mm[1],
        spot.n_tracks,
        cfg.origin_x_mm,
        cfg.origin_y_mm,
        cfg.origin_half_x_mm,
        cfg.origin_half_y_mm
    ))
}

/// Whether the beam spot's centre lies so far from the configured origin that the pointing
/// windows lose tracks: beyond a third of the origin box's half size in x or y (the box is
/// three standard deviations of a beam on its centre), by more than three times the
/// centre's error.
pub fn off_the_origin(spot: &BeamSpot, cfg: &FinderConfig) -> bool {
    let centre = [cfg.origin_x_mm, cfg.origin_y_mm];
    let half = [cfg.origin_half_x_mm, cfg.origin_half_y_mm];
    (0..2).any(|c| {
        let d = (spot.centre_mm[c] - centre[c]).abs();
        half[c].is_finite() && d > half[c] / 3.0 && d > 3.0 * spot.centre_error_mm[c]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::reco::synthetic;
    use crate::tracking::track::TrackState;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Normal};

    /// A straight track of 6 hits from `(x0, y0)` at z = 0 with slopes `t`, its state at
    /// z = 200 mm with a covariance of `sigma_mm` in x and y and 1e-4 in the slopes.
    fn track(x0: f64, y0: f64, t: [f64; 2], sigma_mm: f64, chi2_ndf: f32) -> Track {
        let z = 200.0;
        let mut cov = [0.0f32; 15];
        let diag = [sigma_mm * sigma_mm, sigma_mm * sigma_mm, 1e-8, 1e-8, 1e-4];
        for (i, v) in diag.into_iter().enumerate() {
            cov[i * (i + 1) / 2 + i] = v as f32;
        }
        Track {
            hits: (0..6).collect(),
            state: TrackState {
                z_mm: z as f32,
                x_mm: (x0 + t[0] * z) as f32,
                y_mm: (y0 + t[1] * z) as f32,
                tx: t[0] as f32,
                ty: t[1] as f32,
                qop: 0.0,
            },
            cov,
            chi2: chi2_ndf * 8.0,
            ndf: 8,
        }
    }

    /// A widened box settles to the tracks it finds: events of a beam of 0.05 mm, whose
    /// tracks are first found with a box of 6 mm, give a box of about four of their
    /// spreads, which holds them (found again with it, they spread as before).
    #[test]
    fn a_widened_box_settles_to_four_spreads_of_the_tracks_it_finds() {
        let det = synthetic::detector(6, [0.0, 0.8, 0.0], 0.01, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let beam = Normal::new(0.0, 0.05).unwrap();
        let events: Vec<Vec<HitRecord>> = (0..10)
            .map(|_| {
                let mut hits = Vec::new();
                for k in 0..60 {
                    let q = if k % 2 == 0 { 1.0 } else { -1.0 };
                    let p = rng.random_range(3.5..20.0);
                    let start = [
                        beam.sample(&mut rng),
                        beam.sample(&mut rng),
                        rng.random_range(-0.1..0.1),
                        rng.random_range(-0.1..0.1),
                        q / p,
                    ];
                    synthetic::track(&det, start, true, true, &mut rng, &mut hits);
                }
                hits
            })
            .collect();
        let (half, spot) = settled_origin(&det, &cfg, &events, [6.0, 6.0]).expect("measured");
        for c in 0..2 {
            assert!(half[c] < 1.0, "axis {c}: box {half:?}");
            assert!(
                half[c] >= 3.0 * spot.spread_mm[c],
                "axis {c}: {half:?} {spot:?}"
            );
            assert!(spot.spread_mm[c] < 0.15, "axis {c}: {spot:?}");
        }
    }

    #[test]
    fn the_centre_and_size_of_a_beam_off_the_axis_stand_tracks_from_elsewhere() {
        let field = Field::Uniform { b_tesla: [0.0; 3] };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let beam = Normal::new(0.0, 0.1).unwrap();
        let mut tracks = Vec::new();
        for i in 0..2000 {
            let t = [rng.random_range(-0.2..0.2), rng.random_range(-0.2..0.2)];
            // One track in five from anywhere within 20 mm (decays, interactions).
            let (x, y) = if i % 5 == 4 {
                (rng.random_range(-20.0..20.0), rng.random_range(-20.0..20.0))
            } else {
                (1.0 + beam.sample(&mut rng), -0.5 + beam.sample(&mut rng))
            };
            tracks.push(track(x, y, t, 0.01, 1.0));
        }
        // Short or poorly fitted tracks are not measured.
        let mut short = track(9.0, 9.0, [0.0; 2], 0.01, 1.0);
        short.hits.truncate(MIN_HITS - 1);
        tracks.push(short);
        tracks.push(track(9.0, 9.0, [0.0; 2], 0.01, 50.0));
        let mut meter = BeamSpotMeter::new(0.0, 5.0);
        meter.add(&field, &tracks);
        assert_eq!(meter.n_tracks(), 2000);
        let spot = meter.finish().unwrap();
        for (c, want) in [1.0, -0.5].into_iter().enumerate() {
            assert!(
                (spot.centre_mm[c] - want).abs() < 4.0 * spot.centre_error_mm[c],
                "{spot:?}"
            );
            // The tracks from elsewhere do not widen the spread (0.1 mm); the points' own
            // error (0.01 mm) is taken out of the size.
            assert!(
                spot.spread_mm[c] > 0.09 && spot.spread_mm[c] < 0.11,
                "{spot:?}"
            );
            assert!(spot.size_mm[c] < spot.spread_mm[c], "{spot:?}");
        }
        let on_axis = |half: f64| FinderConfig {
            origin_half_x_mm: half,
            origin_half_y_mm: half,
            ..FinderConfig::from_detector(&synthetic::detector(6, [0.0; 3], 0.01, 0.01), 1.0)
        };
        // 1 mm off: beyond a third of a 1.5 mm box, within a third of a 4.5 mm one.
        assert!(off_the_origin(&spot, &on_axis(1.5)));
        assert!(!off_the_origin(&spot, &on_axis(4.5)));
        assert!(!off_the_origin(&spot, &on_axis(f64::INFINITY)));
        let centred = FinderConfig {
            origin_x_mm: 1.0,
            origin_y_mm: -0.5,
            ..on_axis(1.5)
        };
        assert!(!off_the_origin(&spot, &centred));
        // A 1.5 mm box holds three spreads: no wider one; a 0.25 mm box does not.
        assert_eq!(wider_origin(&spot, &on_axis(1.5)), None);
        let [hx, hy] = wider_origin(&spot, &on_axis(0.25)).expect("wider");
        for (h, c) in [(hx, 0), (hy, 1)] {
            assert!(h >= 3.0 * spot.spread_mm[c] && h < 3.0 * spot.spread_mm[c] + 0.01);
        }
        assert_eq!(wider_origin(&spot, &on_axis(f64::INFINITY)), None);
        // A 1.5 mm box is more than half as wide again as four spreads: narrowed to them,
        // where the fit measures the momentum (the spread is the stiff tracks'); not
        // without a field, nor where the box is already close.
        let mut field_cfg = on_axis(1.5);
        field_cfg.fit.fit_momentum = true;
        let [hx, hy] = narrower_origin(&spot, &field_cfg).expect("narrower");
        for (h, c) in [(hx, 0), (hy, 1)] {
            assert!(h >= 4.0 * spot.spread_mm[c] && h < 4.0 * spot.spread_mm[c] + 0.01);
        }
        assert_eq!(
            wider_origin(
                &spot,
                &FinderConfig {
                    origin_half_x_mm: hx,
                    origin_half_y_mm: hy,
                    ..field_cfg.clone()
                }
            ),
            None
        );
        assert_eq!(narrower_origin(&spot, &on_axis(1.5)), None);
        field_cfg.origin_half_x_mm = 0.5;
        assert_eq!(narrower_origin(&spot, &field_cfg), None);
        // The stiff tracks only: q/p beyond a third of the minimum momentum's is not
        // measured.
        let mut soft = track(0.0, 0.0, [0.0; 2], 0.01, 1.0);
        soft.state.qop = 1.0;
        let mut stiff = track(0.0, 0.0, [0.0; 2], 0.01, 1.0);
        stiff.state.qop = 0.2;
        let mut m = BeamSpotMeter::new(0.0, 5.0).stiff(&field_cfg);
        m.add(&field, &[soft.clone(), stiff.clone()]);
        assert_eq!(m.n_tracks(), 1);
        let mut m = BeamSpotMeter::new(0.0, 5.0).stiff(&on_axis(1.5));
        m.add(&field, &[soft, stiff]);
        assert_eq!(m.n_tracks(), 2);
        // Too few tracks: no measurement.
        let mut few = BeamSpotMeter::new(0.0, 5.0);
        few.add(&field, &tracks[..MIN_TRACKS - 1]);
        assert!(few.finish().is_none());
    }

    #[test]
    fn a_box_holds_a_spot_only_with_room_to_spare_across_and_along_the_beam() {
        let cfg = FinderConfig::from_detector(&synthetic::detector(6, [0.0; 3], 0.01, 0.01), 1.0);
        let spot = |centre: [f64; 2], spread: f64, length: Option<OriginLength>| BeamSpot {
            z_mm: 0.0,
            centre_mm: centre,
            spread_mm: [spread; 2],
            size_mm: [spread; 2],
            centre_error_mm: [0.005; 2],
            n_tracks: 400,
            length,
        };
        // A thin target's beam of 0.1 mm on the axis: four spreads and its offset within
        // half of a 1.5 mm box, not of a 0.75 mm one.
        let thin = spot([0.05, -0.05], 0.1, None);
        assert!(inside_the_box(&thin, &cfg, 1.5));
        assert!(!inside_the_box(&thin, &cfg, 0.75));
        // Off the axis by 0.5 mm (beyond half the box with its spreads), or spread wider
        // (a box that cuts a beam off leaves its tracks spread over all of it).
        assert!(!inside_the_box(&spot([0.5, 0.0], 0.1, None), &cfg, 1.5));
        assert!(inside_the_box(&spot([0.5, 0.0], 0.1, None), &cfg, 6.0));
        assert!(!inside_the_box(&spot([0.0, 0.0], 0.3, None), &cfg, 1.5));
        // Along the beam: a region measured 10 mm either side at a median slope of 0.05
        // moves a track's point by 0.5 mm, more than a quarter of the 1.5 mm box; one
        // within the tracks' errors (not resolved) says nothing.
        let long = OriginLength {
            z_centre_mm: 0.0,
            half_length_mm: 10.0,
            z_error_mm: 1.0,
            median_slope: 0.05,
            across_spread_mm: 0.1,
            n_tracks: 200,
        };
        assert!(long.resolved());
        assert!(!inside_the_box(&spot([0.0; 2], 0.1, Some(long)), &cfg, 1.5));
        assert!(inside_the_box(&spot([0.0; 2], 0.1, Some(long)), &cfg, 6.0));
        let blurred = OriginLength {
            z_error_mm: 3.0,
            ..long
        };
        assert!(!blurred.resolved());
        assert!(inside_the_box(
            &spot([0.0; 2], 0.1, Some(blurred)),
            &cfg,
            1.5
        ));
        // A configured length takes its share.
        let long_cfg = FinderConfig {
            origin_half_z_mm: 10.0,
            ..cfg.clone()
        };
        assert!(inside_the_box(
            &spot([0.0; 2], 0.1, Some(long)),
            &long_cfg,
            1.5
        ));
    }
}
