//! First hits against the origin: each track's most upstream hit chosen again, after the
//! event's tracks are found, with the origin as a measurement.
//!
//! The plane nearest the target is the densest, and there the finder's choice is the
//! weakest: the chain's upstream end is picked by its kink at the second hit, where every
//! hit of a nearby particle from the same point bends about as little. In dense events on
//! thick planes a quarter of the found tracks took another particle's first hit (that
//! particle's track then takes a third one's, or none); the fit absorbs it in its position
//! and slope at the first plane, which are what vertexing needs.
//!
//! The origin knows better. A particle from the origin reaches its first plane (at
//! `Z0` from the origin) on the trajectory through the origin and its second hit (at
//! `Z1`): the chord between the two, plus the bending of the field over that stretch at
//! the track's fitted q/p (the sagitta `-(Z0 (Z1 - Z0) / 2) K q/p N a`, with `a` the
//! bending terms of the tent-weighted mean field of the pointing tent `(origin, Z0, Z1)`,
//! [`super::bending`]). That point is off only by the origin's size scaled by
//! `(Z1 - Z0) / Z1`, the second hit's resolution scaled by `Z0 / Z1`, and the scattering in
//! the planes crossed before the second hit at the track's momentum (a kink at `z` moves
//! the chord's point at `Z0` by the angle times `min(z, Z0) (Z1 - max(z, Z0)) / Z1`), the
//! first hit's own resolution and the q/p's error in the sagitta. Where the first plane
//! is close to the target, this is several times sharper than the extrapolation from the
//! downstream hits, which carries the scattering at the second plane over the whole gap.
//!
//! Further from the target, or where the planes are thin and sharp, the track's own
//! point tells better: its fitted position at the first plane with the first hit's
//! update undone ([`own_axis`]), whose error shares the second hit's with the origin's
//! point. Beyond [`NEAR_ORIGIN_RATIO`] the two are combined as correlated estimates
//! ([`combine`]): on a telescope's planes of 4 um and 0.075 % X0, the origin's point is off
//! by 155 um and the track's own by 8 um.
//!
//! Per plane, the tracks that start on it and have a hit to spare (more than the finder's
//! `min_hits`), their first hits and the plane's hits no track uses are matched again:
//! every track-hit pair within the chi-square of `n_sigma` standard deviations (two
//! degrees of freedom) of the track's predicted point, each track and hit once; a track's
//! own first hit counts [`HOLD`] less, so a hit only as close does not move it. The
//! pairs that share tracks or hits are matched at the least summed chi-square, the most
//! likely assignment of the group ([`LeastCost`]), a track left without a hit counting
//! the cut's chi-square; groups beyond [`MATCH_ROWS`] tracks or [`MATCH_COLS`] hits take
//! their pairs by increasing chi-square. A track left without a hit keeps its own where no
//! other took it, and else starts at its second hit. A changed track is fitted again
//! and keeps the change only where the fit passes the finder's cut (else it goes back to
//! its own first hit when that is still free, with the fit it had, and else starts at its
//! second). The result depends on the tracks and hits only (ties by the track's and the
//! hit's order).
//!
//! Before the first hits, each track's second hit is chosen again in the same way
//! ([`FinderConfig::second_hits_to_origin`]): its point on the second hit's plane is the
//! origin's through its third hit (the scattering in the planes before the third, the
//! first's included), without the track's own point (the fitted state is the first hit's),
//! and a track left without a second hit goes from its first hit to its third. In the
//! densest cores most ghosts are a particle's track whose first two hits are another
//! particle's: the first hit's chord through the wrong second hit points at the wrong
//! first hit, so the second must be set right first.
//!
//! It runs where the origin is finite ([`FinderConfig::origin_half_x_mm`]) and
//! [`FinderConfig::first_hits_to_origin`] asks for it (by default), on the found tracks
//! of an event after clone suppression and the exchange of segments
//! ([`crate::tracking::reco::Reconstructor::reconstruct`]). On the GPU the same steps run
//! on the device on the packed tracks (`kernels/ca_first_hits.cu`, one block per event,
//! in the same double-precision arithmetic and order), or, where the exchange runs on the
//! host before it, on the host with this function ([`crate::gpu::tracking::GpuTracker`]).

use crate::frame::HitRecord;
use crate::tracking::geometry::Field;
use crate::tracking::kalman::{FitHit, FitOutput, KalmanFitter};
use crate::tracking::propagate::{bending, K_GEV_PER_T_MM};
use crate::tracking::track::Track;

use super::bending::TentTable;
use super::cuts::FinderConfig;
use super::FinderGeometry;

/// How much lower (chi-square units) a track's own first hit ranks than another hit at
/// the same distance from its predicted point: a change must make the first hit at least
/// e (exp of half this) times likelier.
pub const HOLD: f64 = 2.0;

/// The largest ratio `Z0 / Z1` of a track's first and second hits' distances from the
/// origin at which its first hit's point is the origin's alone, not combined with the
/// track's own ([`own_axis`]).
///
/// Carried back from its next hits, a track's point on the first plane is off by the
/// scattering at the second plane times the gap, `theta (Z1 - Z0)`; on the line from the
/// origin through its second hit, by the scattering at the first plane over what is left
/// of that line, `theta (Z1 - Z0) Z0 / Z1`: smaller by the ratio, and the area where
/// another particle's hit can take its place by the ratio squared (at most a fifth here).
/// There the track's own point adds little, and what it adds is biased: the track's next
/// hits chose its first hit, a neighbour's hit on their line as readily as its own (on
/// four drawn samples that close, 4-12 % of the tracks' first hits lie beyond 3 standard
/// deviations of the origin's point, 1.3-5 times fewer beyond the track's own, though
/// both points' errors are within 10 % of their spread). Combined there, all 8 such
/// central samples of the 16 looked at started fewer tracks on their particle's hit
/// (0.2-1.1 %); beyond the ratio the combination gains on every shipped detector and most
/// drawn ones (`bench/RESULTS.md`).
pub const NEAR_ORIGIN_RATIO: f64 = 0.45;

/// A track whose window spans more rows (of the mean window's height) keeps its first
/// hit ([`FirstHits::run`]).
pub const MAX_WINDOW_ROWS: i32 = 16;

/// Most tracks of one group of contested pairs ([`LeastCost`]) matched at the least
/// summed chi-square; a larger group (hits piled up far beyond the shipped detectors' and
/// most drawn ones' cores) is matched by increasing chi-square.
pub const MATCH_ROWS: usize = 32;

/// Most hits of one group of contested pairs matched at the least summed chi-square.
pub const MATCH_COLS: usize = 64;

/// More pairs of tracks and hits than this per track leave the event's tracks as they are
/// (hits piled up far beyond any detector's density).
pub const MAX_PAIRS_PER_TRACK: usize = 32;

/// Fewest tracks with a prediction for the origin's centre and size to be measured in
/// the event ([`FirstHits::spot`]).
pub const SPOT_TRACKS: usize = 20;

/// The tracks the origin's centre and size are measured from ([`FirstHits::spot`]): every
/// k-th of them, about this many at most (the medians' errors are then a few per cent).
pub const SPOT_SAMPLE: usize = 512;

/// The measured origin's size is at least this fraction of the spread of the tracks'
/// offsets from their points.
pub const SPOT_FLOOR: f64 = 0.25;

/// The cuts of the first-hit step, derived from the geometry and the finder's cuts.
#[derive(Debug, Clone)]
pub struct FirstHitCuts {
    /// Whether the step runs.
    pub enabled: bool,
    /// The origin's centre in x and y, and its z, mm.
    pub origin_xy_mm: [f64; 2],
    pub origin_z_mm: f64,
    /// Variance of the origin's position in x and y, mm^2: its half size as three
    /// standard deviations.
    pub origin_var: [f64; 2],
    /// Per plane: z (mm), the variances of a hit's x and y (mm^2) and of a scattering
    /// angle per unit (q/p)^2 at normal incidence.
    pub z_mm: Vec<f64>,
    pub var_hit: Vec<[f64; 2]>,
    pub theta2_per_qop2: Vec<f64>,
    /// The mass hypothesis squared (GeV^2), for the velocity in the scattering.
    pub mass2: f64,
    /// The |q/p| the scattering is taken at where the fit measures none: the minimum
    /// momentum's.
    pub qop_cut: f64,
    /// Largest chi-square (two degrees of freedom) of a hit against a track's predicted
    /// point: the two-sided `n_sigma` probability.
    pub chi2_max: f64,
    /// Fewest hits of a track (the finder's `min_hits`): a track with no more keeps its
    /// first hits.
    pub min_hits: usize,
    /// Whether each track's second hit is chosen again, against the origin through its
    /// third, before its first ([`FinderConfig::second_hits_to_origin`]).
    pub second_hits: bool,
    /// The fit's chi-square per degree of freedom cut.
    pub max_chi2_ndf: f64,
    /// The field where it is uniform (no tables); `None` for a map.
    uniform: Option<[f64; 3]>,
    /// Per plane pair `(i, j)` at `i * n + j`: the pointing tent's table in a map.
    pointing: Vec<Option<TentTable>>,
    n_planes: usize,
}

impl FirstHitCuts {
    pub fn new(geo: &FinderGeometry, cfg: &FinderConfig) -> Self {
        let finite = cfg.origin_half_x_mm.is_finite() && cfg.origin_half_y_mm.is_finite();
        let n = geo.planes.len();
        let uniform = match &geo.field {
            Field::Uniform { b_tesla } => Some(*b_tesla),
            Field::Grid(_) => None,
        };
        FirstHitCuts {
            // A point origin: with a long one (`origin_half_z_mm`) the step does not run.
            enabled: cfg.first_hits_to_origin && finite && n >= 3 && cfg.origin_half_z_mm <= 0.0,
            origin_xy_mm: [cfg.origin_x_mm, cfg.origin_y_mm],
            origin_z_mm: cfg.origin_z_mm,
            origin_var: [cfg.origin_half_x_mm, cfg.origin_half_y_mm].map(|h| {
                let s = h / 3.0;
                s * s
            }),
            z_mm: geo.planes.iter().map(|p| p.z_mm).collect(),
            var_hit: geo.planes.iter().map(|p| [p.var_x, p.var_y]).collect(),
            theta2_per_qop2: geo.planes.iter().map(|p| p.theta2_per_qop2).collect(),
            mass2: cfg.fit.mass_gev * cfg.fit.mass_gev,
            qop_cut: 1.0 / cfg.min_p_gev.max(1e-3),
            chi2_max: chi2_two_dof(cfg.n_sigma),
            min_hits: cfg.min_hits,
            second_hits: cfg.second_hits_to_origin,
            max_chi2_ndf: cfg.max_chi2_ndf,
            uniform,
            pointing: (0..n * n)
                .map(|k| geo.bending.pointing(k / n, k % n).cloned())
                .collect(),
            n_planes: n,
        }
    }

    /// The field where it is uniform (`None` for a map, whose pointing tents are the
    /// finder's tables), for a device copy of [`Self::predict`].
    pub fn uniform_field(&self) -> Option<[f64; 3]> {
        self.uniform
    }

    /// Planes of the detector.
    pub fn n_planes(&self) -> usize {
        self.n_planes
    }

    /// The point on the plane of its hit `at` (0: the first, 1: the second) where `track`
    /// would cross it from the origin through its next hit, and the variances of that
    /// point's x and y (without the origin's size and the hit's resolution, added by
    /// [`FirstHits::spot`]): `None` for a track with no hit to spare, without a plane
    /// downstream of the origin, or without the field's table for the two planes.
    fn predict(&self, track: &Track, hits: &[HitRecord], at: usize) -> Option<Prediction> {
        if track.hits.len() <= self.min_hits.max(at + 2) {
            return None;
        }
        let (h0, h1) = (
            &hits[track.hits[at] as usize],
            &hits[track.hits[at + 1] as usize],
        );
        let (k0, k1) = (h0.plane as usize, h1.plane as usize);
        if k0 >= k1 || k1 >= self.n_planes {
            return None;
        }
        let z0 = self.z_mm[k0] - self.origin_z_mm;
        let z1 = self.z_mm[k1] - self.origin_z_mm;
        if z0 <= 1.0 || z1 <= z0 {
            return None;
        }
        // The second hit from the origin's centre.
        let [cx, cy] = self.origin_xy_mm;
        let (x1, y1) = (h1.x_mm as f64 - cx, h1.y_mm as f64 - cy);
        let s = &track.state;
        let (tx, ty) = (s.tx as f64, s.ty as f64);
        let b = match self.uniform {
            Some(b) => b,
            None => {
                let t = self.pointing[k0 * self.n_planes + k1].as_ref()?;
                t.at((x1 / z1) as f32, (y1 / z1) as f32).map(f64::from)
            }
        };
        let n2 = 1.0 + tx * tx + ty * ty;
        let nn = n2.sqrt();
        let (ax, ay) = bending(tx, ty, b);
        // Sagitta per unit q/p at z0 against the chord from the origin to z1.
        let lever = 0.5 * z0 * (z1 - z0) * K_GEV_PER_T_MM * nn;
        let qop = s.qop as f64;
        let f = z0 / z1;
        let px = cx + x1 * f - lever * qop * ax;
        let py = cy + y1 * f - lever * qop * ay;
        // Scattering: every plane upstream of the second hit, at the fitted momentum.
        let q = if qop.is_finite() && qop != 0.0 {
            qop.abs()
        } else {
            self.qop_cut
        };
        let theta2 = q * q * (1.0 + self.mass2 * q * q) * n2 * nn;
        let mut ms = 0.0;
        for p in 0..k1 {
            let zp = self.z_mm[p] - self.origin_z_mm;
            if zp <= 0.0 {
                continue;
            }
            let arm = zp.min(z0) * (z1 - zp.max(z0)) / z1;
            ms += self.theta2_per_qop2[p] * arm * arm;
        }
        ms *= theta2;
        let var_qop = track.var(4).max(0.0) as f64;
        let var = |c: usize, a: f64, slope: f64| {
            self.var_hit[k1][c] * f * f
                + ms * (1.0 + slope * slope)
                + lever * lever * a * a * var_qop
        };
        let (var_x, var_y) = (var(0, ax, tx), var(1, ay, ty));
        if !(px.is_finite() && py.is_finite() && var_x.is_finite() && var_y.is_finite()) {
            return None;
        }
        let (own_x, own_y) = (h0.x_mm as f64, h0.y_mm as f64);
        let [hit_x, hit_y] = self.var_hit[k0];
        // The track's own point without its first hit, per axis (the position's variance
        // at 0 for x and 2 for y of the covariance's lower triangle, its covariance with
        // the slope at 3 and 7), where the first hit is not near the origin against the
        // second ([`NEAR_ORIGIN_RATIO`]: there the origin's point is the sharper, and the
        // track's own next hits, which chose its first hit, would only add their choice
        // back). The second hit's point is the origin's alone: the fitted state is the
        // first hit's.
        let c = &track.cov;
        let own_pred = [(s.x_mm, own_x, hit_x, 0, 3), (s.y_mm, own_y, hit_y, 2, 7)].map(
            |(x, m, v, ip, ir)| {
                if at == 0 && f > NEAR_ORIGIN_RATIO {
                    own_axis(x as f64, c[ip] as f64, c[ir] as f64, m, v, z1 - z0, f)
                } else {
                    None
                }
            },
        );
        Some(Prediction {
            plane: k0 as u16,
            x: px,
            y: py,
            var_x,
            var_y,
            hit_var: [hit_x, hit_y],
            origin_arm: 1.0 - f,
            own: track.hits[at],
            own_x,
            own_y,
            own_pred,
        })
    }
}

/// The track's own prediction of its first hit on one axis: the fitted position `at`
/// (variance `p`, covariance `r` with the slope) at the first hit's plane with the first
/// hit `m` (variance `v`) taken out of it (the update undone, in the information form:
/// the position `(v at - p m) / (v - p)`, its variance and its covariance with the slope
/// scaled by `v / (v - p)`), and that point's covariance with the origin's prediction
/// through their shared second hit: the second hit's error moves the origin's point by
/// `f` of itself (`f = Z0 / Z1`), and the own point, carried from the second plane over
/// `dz` back, is off from that hit's error by its variance plus `dz` times its covariance
/// with the slope (a fitted state's error has with a measurement it took in the covariance
/// of the state with the measured coordinate). `None` where the fit does not hold the hit
/// (its variance not below the hit's).
fn own_axis(at: f64, p: f64, r: f64, m: f64, v: f64, dz: f64, f: f64) -> Option<[f64; 3]> {
    let d = v - p;
    if !(d > 1e-9 * v && at.is_finite() && r.is_finite()) {
        return None;
    }
    let g = v / d;
    let x = (v * at - p * m) / d;
    let b = p * g;
    let c = f * (b + dz * (r * g));
    (x.is_finite() && b.is_finite() && c.is_finite()).then_some([x, b, c])
}

/// The origin's prediction `xo` (variance `a`) and the track's own `[xt, b, c]` (variance
/// `b`, covariance `c` with the origin's) combined: the correlated estimates' weighted
/// mean, `xt + w (xo - xt)` with `w = (b - c) / (a + b - 2 c)`, and its variance
/// `(a b - c^2) / (a + b - 2 c)`; the sharper of the two where those are not a variance
/// (the covariance as large as the variances allow).
fn combine(xo: f64, a: f64, own: Option<[f64; 3]>) -> (f64, f64) {
    let Some([xt, b, c]) = own else {
        return (xo, a);
    };
    let den = a + b - 2.0 * c;
    let var = (a * b - c * c) / den;
    if den > 0.0 && var > 0.0 && var.is_finite() {
        let w = (b - c) / den;
        (xt + w * (xo - xt), var)
    } else if a <= b {
        (xo, a)
    } else {
        (xt, b)
    }
}

/// The chi-square of two degrees of freedom with the probability of a Gaussian beyond
/// `n` standard deviations on either side: `-2 ln(erfc(n / sqrt 2))`.
fn chi2_two_dof(n: f64) -> f64 {
    -2.0 * erfc(n / std::f64::consts::SQRT_2).max(1e-300).ln()
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative error below
/// 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[derive(Debug, Clone, Copy)]
struct Prediction {
    plane: u16,
    /// The point from the origin's centre and the second hit, mm.
    x: f64,
    y: f64,
    /// Its variances without the origin's size and the first hit's resolution, then
    /// ([`FirstHits::spot`]) of the point combined with the track's own, with both.
    var_x: f64,
    var_y: f64,
    /// The first hit's variances in x and y.
    hit_var: [f64; 2],
    /// How much of an offset of the origin moves the point: `(Z1 - Z0) / Z1`.
    origin_arm: f64,
    /// The track's own first hit and its position.
    own: u32,
    own_x: f64,
    own_y: f64,
    /// Per axis, the track's own point without its first hit, its variance and its
    /// covariance with the origin's point ([`own_axis`]).
    own_pred: [Option<[f64; 3]>; 2],
}

/// The row of a [`pool_key`].
#[inline]
fn key_row(key: u64) -> i32 {
    ((key >> 32) & 0xFF_FFFF) as i32 - (1 << 23)
}

/// The row of height `h` that `y` lies in, within 24 bits.
#[inline]
fn row_of(y: f64, h: f64) -> i32 {
    (y / h)
        .floor()
        .clamp(-(1 << 23) as f64, ((1 << 23) - 1) as f64) as i32
}

/// A sort key in the order of (plane, row, x): the plane, the row (offset into 24 bits)
/// and the bits of x in the order of [`f32::total_cmp`] (a window's ends rounded to `f32`
/// as the hits are).
#[inline]
fn pool_key(plane: u16, row: i32, x: f32) -> u64 {
    let b = x.to_bits();
    let ordered = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    let row = (row + (1 << 23)) as u64 & 0xFF_FFFF;
    (u64::from(plane) << 56) | (row << 32) | u64::from(ordered)
}

/// The step's scratch, reused from event to event.
#[derive(Debug, Default)]
pub struct FirstHits {
    /// Per hit: whether a track uses it.
    used: Vec<bool>,
    /// Per hit: whether a track that takes part starts on it.
    starts: Vec<bool>,
    /// Tracks that take part: (track, prediction).
    preds: Vec<(u32, Prediction)>,
    /// The pool's hits by (plane, row, x) ([`pool_key`]), and their positions.
    pool: Vec<(u64, u32)>,
    pool_xy: Vec<[f64; 2]>,
    /// Per plane: whether a participating track starts on it.
    with_tracks: Vec<bool>,
    /// Per plane: the lowest row of its pool hits and that row's place in `row_start`
    /// (`u32::MAX`: no hit); `row_start`: per row, where its hits start in the pool
    /// (empty where the rows would be too many: then a search of the pool).
    plane_rows: Vec<(i32, u32, u32)>,
    row_start: Vec<u32>,
    /// (rank, prediction, place in the pool), a prediction's together.
    edges: Vec<(f64, u32, u32)>,
    /// Per prediction, where its pairs start in `edges` (and one past the last).
    edge_start: Vec<u32>,
    /// Per pool hit, the predictions within whose cut it lies.
    claims: Vec<u16>,
    /// The pairs of the predictions that need the ordered matching.
    contested: Vec<(f64, u32, u32)>,
    /// The groups' matching at the least summed chi-square.
    least_cost: LeastCost,
    assigned: Vec<u32>,
    taken: Vec<bool>,
    /// Changed tracks: (track, new first hit or `u32::MAX` for none).
    changes: Vec<(u32, u32)>,
    /// The changed tracks' hits before the change.
    original: Vec<Vec<u32>>,
    /// The changed tracks' fits before the change, given back to a change undone to them.
    original_fit: Vec<Fitted>,
    /// The changed tracks' hits laid out for the fit, each track's span of them.
    fit_hits: Vec<FitHit>,
    spans: Vec<(usize, usize)>,
    fits: Vec<FitOutput>,
    /// The spot's offsets and other errors, per axis.
    scratch: [Vec<f64>; 4],
}

/// The contested pairs' matching at the least summed chi-square, group by group.
///
/// A group is a connected set of tracks and hits (two tracks whose windows share a hit are
/// in one group). Within one, the assignment of each track to at most one hit and each
/// hit to at most one track with the least sum of the pairs' ranks (chi-square, less
/// [`HOLD`] for a track's own hit), a track without a hit counting the cut's chi-square,
/// is the most likely one: the tracks' points are independent Gaussians, and a hit at the
/// cut is as likely as none. Taking the pairs by increasing chi-square instead gives the
/// closest pair its hit even where that leaves its neighbour only a worse one, or none,
/// and the error runs on down a row of close particles.
///
/// The assignment is the Hungarian method's (shortest augmenting paths with potentials,
/// one track after the other in prediction order, a column for each hit in the order the
/// tracks' pairs first name it and one for each track's "no hit"; ties to the first
/// column), on the group's pairs only. Groups of more than [`MATCH_ROWS`] tracks or
/// [`MATCH_COLS`] hits are left out (not `decided`). `kernels/ca_first_hits.cu` finds the
/// same groups in parallel (labels lowered to the group's least prediction, its root
/// here too) and solves each on its root's thread with the same steps in the same order
/// (`fh_solve_group`).
#[derive(Debug, Default)]
struct LeastCost {
    /// Per prediction: whether its group was matched here, and the pool place of its hit.
    decided: Vec<bool>,
    matched: Vec<Option<u32>>,
    /// Union-find over the predictions, then the pool places (at `n_preds + q`), each
    /// root the group's least node: its first prediction.
    parent: Vec<u32>,
    /// Per prediction: the next of its group (`u32::MAX`: the last), from its root.
    next: Vec<u32>,
    /// Per pool place: the group's root and the hit's column, where it has one.
    col_of: Vec<(u32, u32)>,
    rows: Vec<u32>,
    cols: Vec<u32>,
    u: Vec<f64>,
    v: Vec<f64>,
    minv: Vec<f64>,
    /// Per column: its row (1-based, 0 for none) and the previous column of its path.
    row_of: Vec<u32>,
    way: Vec<u32>,
    used: Vec<bool>,
}

impl LeastCost {
    fn find(parent: &mut [u32], mut x: u32) -> u32 {
        while parent[x as usize] != x {
            let g = parent[parent[x as usize] as usize];
            parent[x as usize] = g;
            x = g;
        }
        x
    }

    /// Matches the groups of `contested` (the pairs `(rank, prediction, pool place)` of
    /// the predictions that need it, in prediction order; each prediction's pairs are
    /// `edges[edge_start[i]..edge_start[i + 1]]`), `none` the rank of a track without a
    /// hit.
    fn run(
        &mut self,
        contested: &[(f64, u32, u32)],
        edges: &[(f64, u32, u32)],
        edge_start: &[u32],
        n_pool: usize,
        none: f64,
    ) {
        let n_preds = edge_start.len() - 1;
        self.decided.clear();
        self.decided.resize(n_preds, false);
        self.matched.clear();
        self.matched.resize(n_preds, None);
        self.parent.clear();
        self.parent.extend(0..(n_preds + n_pool) as u32);
        self.next.clear();
        self.next.resize(n_preds, u32::MAX);
        self.col_of.clear();
        self.col_of.resize(n_pool, (u32::MAX, 0));
        for &(_, i, q) in contested {
            let a = Self::find(&mut self.parent, i);
            let b = Self::find(&mut self.parent, n_preds as u32 + q);
            // The larger root under the smaller: a group's root is its least node.
            if a < b {
                self.parent[b as usize] = a;
            } else if b < a {
                self.parent[a as usize] = b;
            }
        }
        // Each group's predictions chained from its root in increasing order (the last
        // pairs' prediction first, each put in front of its root's chain).
        let mut last = u32::MAX;
        for k in (0..contested.len()).rev() {
            let i = contested[k].1;
            if i == last {
                continue;
            }
            last = i;
            let r = Self::find(&mut self.parent, i);
            if r != i {
                self.next[i as usize] = self.next[r as usize];
                self.next[r as usize] = i;
            }
        }
        let mut last = u32::MAX;
        for &(_, r, _) in contested {
            if r == last {
                continue;
            }
            last = r;
            if Self::find(&mut self.parent, r) == r {
                self.group(r, edges, edge_start, none);
            }
        }
    }

    /// Matches the group rooted at prediction `root`, where it is small enough.
    fn group(&mut self, root: u32, edges: &[(f64, u32, u32)], edge_start: &[u32], none: f64) {
        self.rows.clear();
        self.cols.clear();
        let mut i = root;
        while i != u32::MAX {
            if self.rows.len() == MATCH_ROWS {
                return;
            }
            self.rows.push(i);
            let (a, b) = (
                edge_start[i as usize] as usize,
                edge_start[i as usize + 1] as usize,
            );
            for &(_, _, q) in &edges[a..b] {
                if self.col_of[q as usize].0 != root {
                    if self.cols.len() == MATCH_COLS {
                        return;
                    }
                    self.col_of[q as usize] = (root, self.cols.len() as u32);
                    self.cols.push(q);
                }
            }
            i = self.next[i as usize];
        }
        let (n, nc) = (self.rows.len(), self.cols.len());
        let m = nc + n;
        self.u.clear();
        self.u.resize(n + 1, 0.0);
        self.v.clear();
        self.v.resize(m + 1, 0.0);
        self.row_of.clear();
        self.row_of.resize(m + 1, 0);
        self.way.clear();
        self.way.resize(m + 1, 0);
        for k in 1..=n {
            self.row_of[0] = k as u32;
            let mut j0 = 0usize;
            self.minv.clear();
            self.minv.resize(m + 1, f64::INFINITY);
            self.used.clear();
            self.used.resize(m + 1, false);
            loop {
                self.used[j0] = true;
                let i0 = self.row_of[j0] as usize;
                let ui = self.u[i0];
                // The row's pairs and its "no hit" (every other column is out of reach).
                let p = self.rows[i0 - 1] as usize;
                let (a, b) = (edge_start[p] as usize, edge_start[p + 1] as usize);
                for &(rank, _, q) in &edges[a..b] {
                    let j = self.col_of[q as usize].1 as usize + 1;
                    self.relax(j, rank, ui, j0);
                }
                self.relax(nc + i0, none, ui, j0);
                let (mut delta, mut j1) = (f64::INFINITY, 0usize);
                for j in 1..=m {
                    if !self.used[j] && self.minv[j] < delta {
                        delta = self.minv[j];
                        j1 = j;
                    }
                }
                for j in 0..=m {
                    if self.used[j] {
                        self.u[self.row_of[j] as usize] += delta;
                        self.v[j] -= delta;
                    } else {
                        self.minv[j] -= delta;
                    }
                }
                j0 = j1;
                if self.row_of[j0] == 0 {
                    break;
                }
            }
            loop {
                let j1 = self.way[j0] as usize;
                self.row_of[j0] = self.row_of[j1];
                j0 = j1;
                if j0 == 0 {
                    break;
                }
            }
        }
        for &r in &self.rows {
            self.decided[r as usize] = true;
        }
        for j in 1..=nc {
            let k = self.row_of[j] as usize;
            if k != 0 {
                self.matched[self.rows[k - 1] as usize] = Some(self.cols[j - 1]);
            }
        }
    }

    /// The reduced cost of column `j` from the row of potential `ui` at `cost`, taken
    /// where it is below the column's least so far (reached from column `j0`).
    #[inline]
    fn relax(&mut self, j: usize, cost: f64, ui: f64, j0: usize) {
        if !self.used[j] {
            let cur = cost - ui - self.v[j];
            if cur < self.minv[j] {
                self.minv[j] = cur;
                self.way[j] = j0 as u32;
            }
        }
    }
}

/// A track's fitted parameters (its state, covariance, chi-square and degrees of freedom).
#[derive(Debug, Clone, Copy)]
struct Fitted {
    state: crate::tracking::track::TrackState,
    cov: [f32; 15],
    chi2: f32,
    ndf: u16,
}

impl Fitted {
    fn of(t: &Track) -> Self {
        Fitted {
            state: t.state,
            cov: t.cov,
            chi2: t.chi2,
            ndf: t.ndf,
        }
    }

    fn write(&self, t: &mut Track) {
        t.state = self.state;
        t.cov = self.cov;
        t.chi2 = self.chi2;
        t.ndf = self.ndf;
    }
}

/// The median of `v` (reordered), NaN when empty.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let k = v.len() / 2;
    *v.select_nth_unstable_by(k, f64::total_cmp).1
}

impl FirstHits {
    /// Chooses the second hits of `tracks` again where the cuts ask for it
    /// ([`FirstHitCuts::second_hits`]), then their first hits (see the module); returns how
    /// many tracks changed, per pass (a track changed in both counts twice).
    pub fn run(
        &mut self,
        cuts: &FirstHitCuts,
        fitter: &KalmanFitter,
        final_fitter: Option<&KalmanFitter>,
        hits: &[HitRecord],
        tracks: &mut [Track],
    ) -> usize {
        if !cuts.enabled || tracks.len() < 2 {
            return 0;
        }
        let second = if cuts.second_hits {
            self.run_at(cuts, 1, fitter, final_fitter, hits, tracks)
        } else {
            0
        };
        second + self.run_at(cuts, 0, fitter, final_fitter, hits, tracks)
    }

    /// Chooses each track's hit `at` (0: the first, 1: the second) again, against the
    /// origin through its next hit; returns how many tracks changed.
    fn run_at(
        &mut self,
        cuts: &FirstHitCuts,
        at: usize,
        fitter: &KalmanFitter,
        final_fitter: Option<&KalmanFitter>,
        hits: &[HitRecord],
        tracks: &mut [Track],
    ) -> usize {
        self.used.clear();
        self.used.resize(hits.len(), false);
        self.starts.clear();
        self.starts.resize(hits.len(), false);
        self.preds.clear();
        for (t, track) in tracks.iter().enumerate() {
            for &h in &track.hits {
                self.used[h as usize] = true;
            }
            if let Some(p) = cuts.predict(track, hits, at) {
                self.starts[track.hits[at] as usize] = true;
                self.preds.push((t as u32, p));
            }
        }
        if self.preds.is_empty() {
            return 0;
        }
        self.spot(cuts);
        // The pool: per plane, the hits no track uses and the participants' hits `at`, by
        // row and x.
        self.with_tracks.clear();
        self.with_tracks.resize(cuts.n_planes, false);
        for (_, p) in &self.preds {
            self.with_tracks[p.plane as usize] = true;
        }
        // Rows of the mean window's height: a window spans two rows at most.
        let mut h_sum = 0.0;
        for (_, p) in &self.preds {
            h_sum += 2.0 * (cuts.chi2_max * p.var_y).sqrt();
        }
        let row_h = (h_sum / self.preds.len() as f64).max(1e-3);
        self.pool.clear();
        for (h, r) in hits.iter().enumerate() {
            let plane = r.plane as usize;
            if plane < cuts.n_planes
                && self.with_tracks[plane]
                && (!self.used[h] || self.starts[h])
                && r.x_mm.is_finite()
                && r.y_mm.is_finite()
            {
                let row = row_of(r.y_mm as f64, row_h);
                self.pool.push((pool_key(r.plane, row, r.x_mm), h as u32));
            }
        }
        self.pool.sort_unstable();
        self.pool_xy.clear();
        self.pool_xy.extend(self.pool.iter().map(|&(_, h)| {
            let r = &hits[h as usize];
            [r.x_mm as f64, r.y_mm as f64]
        }));
        self.index_rows(cuts.n_planes);
        // Every pair within the cut: per row the window spans, the row's stretch of x.
        self.edges.clear();
        self.claims.clear();
        self.claims.resize(self.pool.len(), 0);
        self.edge_start.clear();
        let max_pairs = MAX_PAIRS_PER_TRACK * self.preds.len();
        for (i, (_, p)) in self.preds.iter().enumerate() {
            if self.edges.len() > max_pairs {
                // Hits piled up far beyond any detector's density (a broken event): the
                // tracks stay as the finder left them.
                return 0;
            }
            self.edge_start.push(self.edges.len() as u32);
            // (Widened by a little against the rounding of its ends to `f32`.)
            let wx = (cuts.chi2_max * p.var_x).sqrt() * (1.0 + 1e-6) + 1e-6;
            let wy = (cuts.chi2_max * p.var_y).sqrt() * (1.0 + 1e-6) + 1e-6;
            let (r0, r1) = (row_of(p.y - wy, row_h), row_of(p.y + wy, row_h));
            if r1 - r0 > MAX_WINDOW_ROWS {
                // A window far taller than the others' (a track whose point is poorly
                // known): the track keeps its hit.
                continue;
            }
            for row in r0..=r1 {
                let (lo_key, hi_key) = (
                    pool_key(p.plane, row, (p.x - wx) as f32),
                    pool_key(p.plane, row, (p.x + wx) as f32),
                );
                let (from, to) = self.row_range(p.plane, row, lo_key);
                for q in from..to {
                    let (key, hit) = self.pool[q];
                    if key > hi_key {
                        break;
                    }
                    let [x, y] = self.pool_xy[q];
                    let (dx, dy) = (x - p.x, y - p.y);
                    let chi2 = dx * dx / p.var_x + dy * dy / p.var_y;
                    if chi2 <= cuts.chi2_max {
                        let rank = if hit == p.own { chi2 - HOLD } else { chi2 };
                        self.edges.push((rank, i as u32, q as u32));
                        self.claims[q] = self.claims[q].saturating_add(1);
                    }
                }
            }
        }
        self.edge_start.push(self.edges.len() as u32);
        // A track with one pair whose hit no other track can take gets it whatever the
        // order; the others' groups at their least summed chi-square, and those of the
        // larger groups by increasing chi-square (ties by the track, then by the hit's
        // place in the pool).
        self.assigned.clear();
        self.assigned.resize(self.preds.len(), u32::MAX);
        self.taken.clear();
        self.taken.resize(hits.len(), false);
        self.contested.clear();
        for i in 0..self.preds.len() {
            let (a, b) = (self.edge_start[i] as usize, self.edge_start[i + 1] as usize);
            if b == a + 1 && self.claims[self.edges[a].2 as usize] == 1 {
                let h = self.pool[self.edges[a].2 as usize].1;
                self.assigned[i] = h;
                self.taken[h as usize] = true;
            } else {
                self.contested.extend_from_slice(&self.edges[a..b]);
            }
        }
        // The groups of pairs that share tracks or hits, each matched at its least summed
        // chi-square where small enough; the pairs of the others by increasing chi-square.
        self.least_cost.run(
            &self.contested,
            &self.edges,
            &self.edge_start,
            self.pool.len(),
            cuts.chi2_max,
        );
        for (i, m) in self.least_cost.matched.iter().enumerate() {
            if let Some(q) = m {
                let h = self.pool[*q as usize].1;
                self.assigned[i] = h;
                self.taken[h as usize] = true;
            }
        }
        let decided = &self.least_cost.decided;
        self.contested.retain(|e| !decided[e.1 as usize]);
        self.contested
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for &(_, i, q) in &self.contested {
            let h = self.pool[q as usize].1;
            if self.assigned[i as usize] != u32::MAX || self.taken[h as usize] {
                continue;
            }
            self.assigned[i as usize] = h;
            self.taken[h as usize] = true;
        }
        // The changes: a new hit, or none where another took the own one.
        self.changes.clear();
        for (i, (t, p)) in self.preds.iter().enumerate() {
            let own = p.own;
            let mut new = self.assigned[i];
            if new == u32::MAX && !self.taken[own as usize] {
                new = own;
            }
            if new != own {
                self.changes.push((*t, new));
            }
        }
        if self.changes.is_empty() {
            return 0;
        }
        // Apply, keeping the originals.
        while self.original.len() < self.changes.len() {
            self.original.push(Vec::new());
        }
        self.original_fit.clear();
        for (k, &(t, new)) in self.changes.iter().enumerate() {
            let track = &mut tracks[t as usize];
            self.original[k].clear();
            self.original[k].extend_from_slice(&track.hits);
            self.original_fit.push(Fitted::of(track));
            if new == u32::MAX {
                track.hits.remove(at);
            } else {
                track.hits[at] = new;
            }
        }
        // Each changed track fitted with the finder's fit; where it fails the cut, its own
        // hit back if still free (the track as it was, with its fit), else none there.
        self.fit_changed(fitter, hits, tracks);
        let mut dropped = 0;
        for (k, &(t, new)) in self.changes.iter().enumerate() {
            let f = &self.fits[k];
            let pass = f.ok && f.ndf > 0 && f.chi2 / f.ndf as f64 <= cuts.max_chi2_ndf;
            if pass || new == u32::MAX {
                continue;
            }
            let own = self.original[k][at];
            let track = &mut tracks[t as usize];
            if !self.taken[own as usize] {
                track.hits.clear();
                track.hits.extend_from_slice(&self.original[k]);
            } else {
                track.hits.remove(at);
                dropped += 1;
            }
            self.taken[new as usize] = false;
            self.taken[own as usize] = true;
        }
        // The final fits of the tracks that changed (the finder's where they are the
        // final ones and no change was undone to a hit dropped).
        if final_fitter.is_some() || dropped > 0 {
            self.fit_changed(final_fitter.unwrap_or(fitter), hits, tracks);
        }
        let mut changed = 0;
        for (k, &(t, _)) in self.changes.iter().enumerate() {
            let track = &mut tracks[t as usize];
            if track.hits[..] != self.original[k][..] {
                changed += 1;
                self.fits[k].write_track(track);
            } else {
                self.original_fit[k].write(track);
            }
        }
        changed
    }

    /// `plane_rows` and `row_start` of the sorted pool, where its rows are few enough
    /// (a hit far off a plane makes many: then `row_start` stays empty).
    fn index_rows(&mut self, n_planes: usize) {
        self.plane_rows.clear();
        self.plane_rows.resize(n_planes, (0, u32::MAX, 0));
        self.row_start.clear();
        // The lowest and highest row of each plane (the pool is in plane and row order).
        let mut total = 0usize;
        let mut i = 0;
        while i < self.pool.len() {
            let plane = (self.pool[i].0 >> 56) as usize;
            let mut j = i;
            while j < self.pool.len() && (self.pool[j].0 >> 56) as usize == plane {
                j += 1;
            }
            let (lo, hi) = (key_row(self.pool[i].0), key_row(self.pool[j - 1].0));
            let rows = (hi as i64 - lo as i64 + 1) as usize;
            if plane < n_planes {
                self.plane_rows[plane] = (lo, total as u32, rows as u32);
            }
            total += rows;
            i = j;
        }
        if total > 4 * self.pool.len() + 4096 {
            for r in &mut self.plane_rows {
                r.1 = u32::MAX;
            }
            return;
        }
        self.row_start.resize(total + 1, 0);
        for &(key, _) in &self.pool {
            let plane = (key >> 56) as usize;
            let (lo, base, _) = self.plane_rows[plane];
            self.row_start[base as usize + (key_row(key) - lo) as usize + 1] += 1;
        }
        for r in 1..self.row_start.len() {
            self.row_start[r] += self.row_start[r - 1];
        }
    }

    /// The pool's hits of `row` on `plane` from key `from_key` on: the start and the end
    /// of the row (the end of the pool where the rows are not indexed; the caller stops at
    /// its last key).
    fn row_range(&self, plane: u16, row: i32, from_key: u64) -> (usize, usize) {
        if self.row_start.is_empty() {
            let lo = self.pool.partition_point(|q| q.0 < from_key);
            return (lo, self.pool.len());
        }
        let Some(&(lo, base, rows)) = self.plane_rows.get(plane as usize) else {
            return (0, 0);
        };
        if base == u32::MAX || row < lo || (row - lo) as u32 >= rows {
            return (0, 0);
        }
        let r = base as usize + (row - lo) as usize;
        let (a, b) = (self.row_start[r] as usize, self.row_start[r + 1] as usize);
        let first = a + self.pool[a..b].partition_point(|q| q.0 < from_key);
        (first, b)
    }

    /// The origin's centre and size as the event's tracks see them, added to their
    /// predicted points: from [`SPOT_TRACKS`] tracks up (at most about [`SPOT_SAMPLE`] of
    /// them, evenly through the event's), the median of the tracks' first hits' offsets from their points (over the origin's arm) is the centre (within the
    /// configured origin), and their spread about it (1.4826 times the median absolute
    /// deviation), less the median of the other errors, the size (at most the configured
    /// one, at least [`SPOT_FLOOR`] of the spread); with fewer tracks, the configured
    /// origin. A beam spot of 50 um within the default box of 1.5 mm is then seen as
    /// about that: the box alone would give every point an error of 0.5 mm over the arm.
    /// The medians stand a quarter of the tracks with another particle's first hit.
    fn spot(&mut self, cuts: &FirstHitCuts) {
        let mut centre = [0.0f64; 2];
        let mut var = cuts.origin_var;
        if self.preds.len() >= SPOT_TRACKS {
            // Per axis: the offsets over the arm, and the other errors over its square.
            for v in &mut self.scratch {
                v.clear();
            }
            // (At most about SPOT_SAMPLE of them, evenly through the tracks.)
            let every = (self.preds.len() / SPOT_SAMPLE).max(1);
            for (_, p) in self.preds.iter().step_by(every) {
                let a = p.origin_arm;
                self.scratch[0].push((p.own_x - p.x) / a);
                self.scratch[1].push((p.own_y - p.y) / a);
                self.scratch[2].push((p.var_x + p.hit_var[0]) / (a * a));
                self.scratch[3].push((p.var_y + p.hit_var[1]) / (a * a));
            }
            for c in 0..2 {
                let (offsets, others) = self.scratch.split_at_mut(2);
                let (offsets, others) = (&mut offsets[c], &mut others[c]);
                let m = median(offsets);
                for v in offsets.iter_mut() {
                    *v = (*v - m).abs();
                }
                let spread = 1.4826 * median(offsets);
                let other = median(others);
                let floor = SPOT_FLOOR * SPOT_FLOOR * spread * spread;
                if m.is_finite() && spread.is_finite() {
                    let half = 3.0 * cuts.origin_var[c].sqrt();
                    centre[c] = m.clamp(-half, half);
                    var[c] = (spread * spread - other).max(floor).min(cuts.origin_var[c]);
                }
            }
        }
        // The points from the origin, combined with the tracks' own.
        for (_, p) in &mut self.preds {
            let a = p.origin_arm;
            let (x, var_x) = combine(p.x + centre[0] * a, p.var_x + var[0] * a * a, p.own_pred[0]);
            let (y, var_y) = combine(p.y + centre[1] * a, p.var_y + var[1] * a * a, p.own_pred[1]);
            p.x = x;
            p.y = y;
            p.var_x = var_x + p.hit_var[0];
            p.var_y = var_y + p.hit_var[1];
        }
    }

    /// Fits the changed tracks (`changes`) into `fits`, a lane group at a time.
    fn fit_changed(&mut self, fitter: &KalmanFitter, hits: &[HitRecord], tracks: &[Track]) {
        self.fit_hits.clear();
        self.spans.clear();
        for &(t, _) in &self.changes {
            let s = self.fit_hits.len();
            self.fit_hits.extend(
                tracks[t as usize]
                    .hits
                    .iter()
                    .map(|&h| FitHit::from(&hits[h as usize])),
            );
            self.spans.push((s, self.fit_hits.len()));
        }
        self.fits.clear();
        self.fits.resize(self.changes.len(), FitOutput::default());
        let fit_hits = &self.fit_hits;
        fitter.fit_each(&self.spans, |&(a, b)| &fit_hits[a..b], &mut self.fits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step is on by default wherever the origin is finite and thin, on every shipped
    /// detector too; off where the configuration says so, the origin is long or open.
    #[test]
    fn the_first_hits_are_matched_by_default_where_the_origin_is_a_point() {
        use crate::tracking::ca::cuts::FinderOverrides;
        use crate::tracking::ca::FinderGeometry;
        use crate::tracking::geometry::Detector;
        use crate::tracking::reco::synthetic::detector;
        let enabled = |det: &Detector, ov: &FinderOverrides| {
            let cfg = FinderConfig::from_detector_with(det, 1.0, ov);
            FirstHitCuts::new(&FinderGeometry::new(det, &cfg), &cfg).enabled
        };
        let det = detector(6, [0.0, 0.5, 0.0], 0.01, 0.02);
        assert!(enabled(&det, &FinderOverrides::default()));
        // Asked for, or not, the configuration decides.
        let off = FinderOverrides {
            first_hits_to_origin: Some(false),
            ..Default::default()
        };
        assert!(!enabled(&det, &off));
        // A long origin, or an open one: the step does not run.
        let long = FinderOverrides {
            origin_half_z_mm: Some(20.0),
            ..Default::default()
        };
        assert!(!enabled(&det, &long));
        let open = FinderOverrides {
            origin_half_x_mm: Some(f64::INFINITY),
            ..Default::default()
        };
        assert!(!enabled(&det, &open));
        // Two planes: never.
        let two = Detector {
            planes: det.planes[..2].to_vec(),
            field: det.field.clone(),
        };
        assert!(!enabled(&two, &FinderOverrides::default()));
        // The shipped detectors.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        for f in [
            "detector.toml",
            "telescope.toml",
            "tracking/dipole/detector_dipole.toml",
            "tracking/forward/detector_forward.toml",
            "tracking/reversing/detector_reversing.toml",
        ] {
            let d = Detector::from_toml_file(root.join(f)).unwrap();
            assert!(enabled(&d, &FinderOverrides::default()), "{f}");
        }
    }

    /// Undoing a position measurement gives back the state before it: its point, its
    /// variance and its covariance with the slope (the last as the covariance with the
    /// origin's point scales it).
    #[test]
    fn the_own_point_is_the_fit_before_its_first_hit() {
        // Before: x = 1.3 with variance 0.04, slope covariance -2e-4; the hit 1.1, 0.01.
        let (x, p, r, m, v) = (1.3f64, 0.04f64, -2e-4f64, 1.1f64, 0.01f64);
        let k = p / (p + v);
        let (xu, pu, ru) = (x + k * (m - x), (1.0 - k) * p, (1.0 - k) * r);
        let (dz, f) = (80.0, 0.6);
        let [xb, b, c] = own_axis(xu, pu, ru, m, v, dz, f).unwrap();
        assert!((xb - x).abs() < 1e-12 && (b - p).abs() < 1e-15, "{xb} {b}");
        assert!((c - f * (p + dz * r)).abs() < 1e-12, "{c}");
        // A fit that did not take the hit (its variance not below the hit's): none.
        assert!(own_axis(xu, v, ru, m, v, dz, f).is_none());
        assert!(own_axis(xu, 2.0 * v, ru, m, v, dz, f).is_none());
        assert!(own_axis(f64::NAN, pu, ru, m, v, dz, f).is_none());
    }

    /// The combination of two correlated estimates: weights that favour the sharper one
    /// by the covariance, a variance below both, and the sharper one where the
    /// covariance allows no combination.
    #[test]
    fn correlated_points_combine_to_the_least_variance() {
        // Independent and equal: the mean, half the variance.
        let (x, var) = combine(1.0, 2.0, Some([3.0, 2.0, 0.0]));
        assert!((x - 2.0).abs() < 1e-12 && (var - 1.0).abs() < 1e-12);
        // Correlated: var = (a b - c^2) / (a + b - 2 c), w = (b - c) / (a + b - 2 c).
        let (a, b, c) = (4.0, 1.0, 0.5);
        let (x, var) = combine(0.0, a, Some([1.0, b, c]));
        let (den, w) = (a + b - 2.0 * c, (b - c) / (a + b - 2.0 * c));
        assert!((var - (a * b - c * c) / den).abs() < 1e-12 && var < b);
        assert!((x - (1.0 - w)).abs() < 1e-12);
        // Fully correlated or beyond: the sharper one.
        assert_eq!(combine(0.0, 4.0, Some([1.0, 1.0, 2.0])), (1.0, 1.0));
        assert_eq!(combine(0.0, 1.0, Some([1.0, 4.0, 2.0])), (0.0, 1.0));
        assert_eq!(combine(0.5, 1.0, None), (0.5, 1.0));
    }

    /// `n` tracks drawn from the origin through `det` (scattering and resolution, 1.5-20
    /// GeV/c, slopes up to 0.15), fitted with the finder's candidates' fit: the hits, the
    /// tracks, and per track the true crossings (x, y) of its first two planes.
    fn drawn_tracks(
        det: &crate::tracking::geometry::Detector,
        cfg: &FinderConfig,
        n: usize,
        seed: u64,
    ) -> (Vec<HitRecord>, Vec<Track>, Vec<[f64; 4]>) {
        use crate::tracking::reco::synthetic::track;
        use rand::{Rng, SeedableRng};
        let fitter = KalmanFitter::new(det, cfg.candidate_fit());
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut hits = Vec::new();
        let mut tracks = Vec::new();
        let mut truth = Vec::new();
        for _ in 0..n {
            let p = rng.random_range(1.5..20.0f64);
            let q = if rng.random::<bool>() { 1.0 } else { -1.0 };
            let start = [
                0.0,
                0.0,
                rng.random_range(-0.15..0.15),
                rng.random_range(-0.15..0.15),
                q / p,
            ];
            let (ids, states) = track(det, start, true, true, &mut rng, &mut hits);
            truth.push([states[0][0], states[0][1], states[1][0], states[1][1]]);
            tracks.push(Track {
                hits: ids,
                ..Default::default()
            });
        }
        let fit_hits: Vec<FitHit> = hits.iter().map(FitHit::from).collect();
        let spans: Vec<(usize, usize)> = tracks
            .iter()
            .map(|t| (t.hits[0] as usize, t.hits[t.hits.len() - 1] as usize + 1))
            .collect();
        let mut fits = vec![FitOutput::default(); tracks.len()];
        fitter.fit_each(&spans, |&(a, b)| &fit_hits[a..b], &mut fits);
        for (t, f) in tracks.iter_mut().zip(&fits) {
            assert!(f.ok);
            f.write_track(t);
        }
        (hits, tracks, truth)
    }

    /// On drawn tracks (scattering and resolution, a field, the finder's own fit), the
    /// origin's point, the track's own without its first hit and their combination are
    /// off from the particle's true crossing by what their variances say, the two points'
    /// errors correlated as their covariance says, and the combination sharper than either.
    #[test]
    fn the_predicted_points_errors_are_their_variances() {
        use crate::tracking::ca::FinderGeometry;
        use crate::tracking::reco::synthetic::detector;
        // Planes at 300, 400, ...: the first hit's ratio 0.75; 1 % X0, 20 um, 0.5 T.
        let det = detector(6, [0.0, 0.5, 0.0], 0.01, 0.02);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let cuts = FirstHitCuts::new(&FinderGeometry::new(&det, &cfg), &cfg);
        let (hits, tracks, truth) = drawn_tracks(&det, &cfg, 4000, 11);
        // Per axis: the sums of the three pulls' squares, of the two points' pulls'
        // products, of their errors' squares and the combination's, and of the predicted
        // correlations.
        let mut sums = [[0.0f64; 8]; 2];
        let mut n = 0.0;
        for (t, tr) in tracks.iter().zip(&truth) {
            let pr = cuts.predict(t, &hits, 0).expect("a prediction");
            let points = [
                (pr.x, pr.var_x, pr.own_pred[0]),
                (pr.y, pr.var_y, pr.own_pred[1]),
            ];
            for (c, (xo, a, own)) in points.into_iter().enumerate() {
                let [xt, b, cov] = own.expect("the track's own point");
                let (xc, var) = combine(xo, a, own);
                let (eo, et, ec) = (xo - tr[c], xt - tr[c], xc - tr[c]);
                let s = &mut sums[c];
                s[0] += eo * eo / a;
                s[1] += et * et / b;
                s[2] += ec * ec / var;
                s[3] += eo * et / (a * b).sqrt();
                s[4] += eo * eo;
                s[5] += et * et;
                s[6] += ec * ec;
                s[7] += cov / (a * b).sqrt();
            }
            n += 1.0;
        }
        for s in sums {
            let pulls = [s[0] / n, s[1] / n, s[2] / n].map(f64::sqrt);
            assert!(pulls.iter().all(|w| (w - 1.0).abs() < 0.1), "{pulls:?}");
            let corr = s[3] / n;
            assert!((corr - s[7] / n).abs() < 0.1, "{corr} against {}", s[7] / n);
            assert!(s[6] < s[4].min(s[5]), "{s:?}");
        }
    }

    /// The origin's point on a track's second plane (through its third hit) is off from
    /// the particle's true crossing by what its variance says, along the field: on
    /// planes of 4 % X0 measured to 5 um, where the scattering in the first plane (over
    /// the arm `Z0 (Z2 - Z1) / Z2`) is a third of the error (without it, the pulls are
    /// 1.24 wide). It is the origin's alone.
    #[test]
    fn the_second_hits_point_errs_by_its_variance() {
        use crate::tracking::ca::FinderGeometry;
        use crate::tracking::reco::synthetic::detector;
        let det = detector(6, [0.0, 0.5, 0.0], 0.04, 0.005);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let cuts = FirstHitCuts::new(&FinderGeometry::new(&det, &cfg), &cfg);
        let (hits, tracks, truth) = drawn_tracks(&det, &cfg, 4000, 12);
        let mut sums = [0.0f64; 2];
        for (t, tr) in tracks.iter().zip(&truth) {
            let p = cuts
                .predict(t, &hits, 1)
                .expect("a prediction of the second hit");
            assert_eq!(p.own, t.hits[1]);
            assert!(p.own_pred.iter().all(Option::is_none));
            sums[0] += (p.x - tr[2]).powi(2) / p.var_x;
            sums[1] += (p.y - tr[3]).powi(2) / p.var_y;
        }
        let [wx, wy] = sums.map(|s| (s / tracks.len() as f64).sqrt());
        // Across the field the sagitta's term (the fitted q/p's error, which its
        // scattering makes large here and which shares that scattering) overstates it.
        assert!((0.75..1.1).contains(&wx), "{wx}");
        assert!((wy - 1.0).abs() < 0.1, "{wy}");
    }

    #[test]
    fn the_cut_holds_the_two_sided_probability_of_n_sigma() {
        // Two degrees of freedom: P(chi2 > c) = exp(-c / 2).
        for n in [1.0f64, 2.0, 3.0, 4.0] {
            let c = chi2_two_dof(n);
            let two_sided = erfc(n / std::f64::consts::SQRT_2);
            assert!(((-c / 2.0).exp() - two_sided).abs() <= 1e-6 * two_sided.max(1e-3));
        }
        assert!((chi2_two_dof(3.0) - 11.829).abs() < 1e-2);
        assert!((erfc(0.0) - 1.0).abs() < 1e-6 && (erfc(-1.0) - 1.842_700_79).abs() < 1e-6);
    }

    #[test]
    fn pool_keys_order_by_plane_row_then_x() {
        let keys = [
            pool_key(0, -3, 5.0),
            pool_key(0, -3, 7.5),
            pool_key(0, 2, -100.0),
            pool_key(0, 2, -0.0),
            pool_key(0, 2, 0.5),
            pool_key(1, -(1 << 23), -1.0),
            pool_key(1, (1 << 23) - 1, 1.0),
        ];
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:x?}");
        assert_eq!(key_row(pool_key(3, -17, 2.0)), -17);
        assert_eq!(row_of(-0.5, 1.0), -1);
        assert_eq!(row_of(1e300, 1.0), (1 << 23) - 1);
    }

    /// Random groups of contested pairs: the matching's summed rank is the least of every
    /// assignment (each track one of its hits or none, each hit once), where taking the
    /// pairs by increasing rank often is not; groups beyond the bound are left out.
    #[test]
    fn contested_pairs_are_matched_at_their_least_summed_chi_square() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let none = 11.8;
        // The least summed rank over every assignment of tracks `t..` given the hits used.
        fn best(t: usize, rows: &[Vec<(f64, u32)>], used: &mut Vec<bool>, none: f64) -> f64 {
            if t == rows.len() {
                return 0.0;
            }
            let mut b = none + best(t + 1, rows, used, none);
            for &(c, q) in &rows[t] {
                if !used[q as usize] {
                    used[q as usize] = true;
                    b = b.min(c + best(t + 1, rows, used, none));
                    used[q as usize] = false;
                }
            }
            b
        }
        let mut lc = LeastCost::default();
        let mut greedy_worse = 0;
        for _ in 0..2000 {
            let (n, n_pool) = (rng.random_range(2..7usize), rng.random_range(2..8usize));
            let mut edges = Vec::new();
            let mut edge_start = Vec::new();
            let mut rows = Vec::new();
            for i in 0..n {
                edge_start.push(edges.len() as u32);
                let mut row = Vec::new();
                for q in 0..n_pool as u32 {
                    if rng.random_bool(0.5) {
                        let c = rng.random_range(-2.0..none);
                        edges.push((c, i as u32, q));
                        row.push((c, q));
                    }
                }
                rows.push(row);
            }
            edge_start.push(edges.len() as u32);
            lc.run(&edges, &edges, &edge_start, n_pool, none);
            let mut hit_used = vec![false; n_pool];
            let mut sum = 0.0;
            for (i, m) in lc.matched.iter().enumerate() {
                let with_pairs = !rows[i].is_empty();
                assert_eq!(lc.decided[i], with_pairs, "a track with pairs is decided");
                match m {
                    Some(q) => {
                        assert!(!std::mem::replace(&mut hit_used[*q as usize], true));
                        sum += rows[i].iter().find(|e| e.1 == *q).expect("its own pair").0;
                    }
                    None if with_pairs => sum += none,
                    None => {}
                }
            }
            let pairs: Vec<_> = rows.iter().filter(|r| !r.is_empty()).cloned().collect();
            let least = best(0, &pairs, &mut vec![false; n_pool], none);
            assert!(
                (sum - least).abs() < 1e-9,
                "{sum} against the least {least}: {rows:?}"
            );
            // Pairs by increasing rank.
            let mut sorted = edges.clone();
            sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut t_done, mut q_done) = (vec![false; n], vec![false; n_pool]);
            let mut g = 0.0;
            for &(c, i, q) in &sorted {
                if !t_done[i as usize] && !q_done[q as usize] {
                    t_done[i as usize] = true;
                    q_done[q as usize] = true;
                    g += c;
                }
            }
            g += none
                * (0..n)
                    .filter(|&i| !t_done[i] && !rows[i].is_empty())
                    .count() as f64;
            if g > least + 1e-9 {
                greedy_worse += 1;
            }
        }
        assert!(greedy_worse > 100, "{greedy_worse}");
        // A group of more tracks than the bound is left to the ordered matching.
        let n = MATCH_ROWS + 1;
        let edges: Vec<_> = (0..n as u32).map(|i| (1.0, i, 0)).collect();
        let edge_start: Vec<_> = (0..=n as u32).collect();
        lc.run(&edges, &edges, &edge_start, 1, none);
        assert!(lc.decided.iter().all(|d| !d) && lc.matched.iter().all(Option::is_none));
        lc.run(
            &edges[..MATCH_ROWS],
            &edges[..MATCH_ROWS],
            &edge_start[..=MATCH_ROWS],
            1,
            none,
        );
        assert!(lc.decided.iter().all(|&d| d));
        assert_eq!(lc.matched.iter().flatten().count(), 1);
    }
}
