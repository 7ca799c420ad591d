//! Exchange of segments between tracks: the greedy choice ([`super::candidates`]) takes
//! the best candidate first, each hit once. Where two particles come close on a plane, the
//! best single candidate can be one particle's upstream segment joined to the other's
//! downstream one; the two particles' own chains then lose hits, and what is left of them
//! is that crossing's mirror image, or pieces. Both mixed tracks pass the fit (particles
//! from one point that come close have nearly the same slope there, so the change of
//! particle costs no more than a scatter), and each is a ghost.
//!
//! This step weighs the two tracks of such a crossing together, as the choice cannot: for
//! every pair of tracks whose hits on some plane lie within the plane's window of each
//! other ([`ExchangeCuts::window_for`]: scattering at the softer track's measured momentum,
//! resolution), it tries exchanging their upstream segments, just before and just after
//! that plane (without a field, where one of them misses the next plane, also before each
//! plane up to the next both cross), and keeps an exchange where both new tracks pass the
//! fit's cut and the pair's summed chi-square falls by more than [`MIN_GAIN`]: the pair of
//! trajectories that explains both sets of hits best. An exchange whose straight-chord
//! kinks around the junction grow by more than [`PRE_TEST`] squared standard deviations is
//! not fitted (on the 132 drawn and independent samples that skips most of the fits and
//! changes no sample's found particles, ghosts or clones), nor one whose kinks grow by as
//! much with the field's bending taken away and in units of the scattering at the pair's
//! measured momentum, where no momentum makes the exchanged tracks' junctions as good
//! ([`Exchange::measured_score`]: in a magnet's gap the straight chords hold the bending,
//! and the minimum momentum's scattering is many times a fast track's); an exchange of the
//! two tracks' first hits alone, which those tests hardly ever refuse, is fitted only where
//! the gain its fits' last updates predict ([`first_hit_gain`]) comes within
//! [`FIRST_HIT_SLACK`] of [`MIN_GAIN`] (on the drawn central samples, one in eight of those
//! exchanges). A trial fit's retry with another seed is made only where its first attempt
//! comes within [`RETRY_WITHIN`] times what the exchange can afford.
//!
//! Where no field measures the momenta and none is given
//! ([`crate::tracking::kalman::FitConfig::estimates_scattering`]), the candidates' fit
//! scatters every track at the minimum momentum, at which a junction of two particles
//! costs hardly more than a scatter: an exchange is then weighed by the kinks' evidence
//! instead ([`ExchangeCuts::evidence`], [`KalmanFitter::scatter_evidence`]), and taken
//! where it gains [`MIN_GAIN`] and both new tracks pass the fit.
//!
//! The exchanges are made in rounds: every pair is evaluated on the tracks as they are, the
//! exchanges are taken by decreasing gain, each track in at most one per round (ties by the
//! pair's order), and the pairs that touch a changed track are evaluated again in the next
//! round, so a chain of crossings (three tracks whose upstream segments are each other's)
//! resolves one exchange at a time. The result depends on the tracks and hits only, not on
//! an order of evaluation.
//!
//! It runs, where [`FinderConfig::exchange_segments`] asks for it (the default: it adds
//! 10-16 % to the finder's time on central events), on the found tracks of an event after clone
//! suppression ([`crate::tracking::reco::Reconstructor::reconstruct`]); the GPU tracker
//! runs the same step on the device (`kernels/ca_exchange.cu`, the same arithmetic in the
//! same order: [`crate::gpu::tracking::GpuTracker`]).

use crate::frame::HitRecord;
use crate::tracking::geometry::Field;
use crate::tracking::kalman::{FitHit, FitOutput, KalmanFitter};
use crate::tracking::propagate::{bending, K_GEV_PER_T_MM};
use crate::tracking::track::Track;

use super::cuts::FinderConfig;
use super::FinderGeometry;

/// What the exchange reads of a track's candidates' fit: its chi-square (infinite where
/// the fit failed), its q/p bound (|q/p| plus three errors), its q/p and its first point
/// (x, y and their covariance).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CandidateFit {
    pub chi2: f32,
    pub qop: f32,
    pub q: f32,
    pub first: [f64; 5],
}

impl From<&FitOutput> for CandidateFit {
    fn from(f: &FitOutput) -> Self {
        CandidateFit {
            chi2: if f.ok { f.chi2 as f32 } else { f32::INFINITY },
            qop: (f.state[4].abs() + 3.0 * f.cov[14].max(0.0).sqrt()) as f32,
            q: f.state[4] as f32,
            first: [f.state[0], f.state[1], f.cov[0], f.cov[1], f.cov[2]],
        }
    }
}

/// What the exchange knows of each track's candidates' fit: chi-square (NaN: not fitted
/// yet), q/p bound, q/p and first point ([`CandidateFit`]).
#[derive(Debug, Default)]
struct TrackFits {
    chi2: Vec<f32>,
    /// Per track: its largest |q/p| (fitted plus three standard deviations).
    qop: Vec<f32>,
    /// Per track: its q/p (the bending [`Exchange::measured_score`] takes away).
    q: Vec<f32>,
    /// Per track: x, y and their covariance (xx, yx, yy) at its first hit, from the fit
    /// whose chi-square is in `chi2` ([`first_hit_gain`]).
    first: Vec<[f64; 5]>,
}

impl TrackFits {
    /// Track `t`'s from its candidates' fit `f`.
    fn take(&mut self, t: u32, f: CandidateFit) {
        let t = t as usize;
        (self.chi2[t], self.qop[t], self.q[t], self.first[t]) = (f.chi2, f.qop, f.q, f.first);
    }
}

/// The fall of the pair's summed chi-square an exchange must bring: the exchanged pair
/// must be e (exp of half this) times likelier than the choice's. Without it, on the 102
/// drawn detectors and events, pairs of true tracks with a scatter in the tail were
/// exchanged for a sum smaller by a fraction of a unit (`bench/RESULTS.md`).
pub const MIN_GAIN: f32 = 2.0;

/// Rounds of exchanges at most (a chain of crossings resolves one exchange per round).
pub const MAX_ROUNDS: usize = 8;

/// How far below [`MIN_GAIN`] the gain [`first_hit_gain`] predicts for an exchange of two
/// tracks' first hits may lie for the exchange to be fitted. The prediction is the fits'
/// last update; the fitted gain differs where the first hit moves the fit's start (its
/// three-hit q/p, the retry of [`crate::tracking::kalman::RETRY_CHI2_NDF`]): on the 66
/// drawn central samples, of 1,528 such exchanges that gained, 1 % gained 1.8 less than
/// predicted and 2 % were predicted below this slack (`bench/RESULTS.md`).
pub const FIRST_HIT_SLACK: f32 = 7.0;

/// The pre-test of an exchange: the squared kinks around the junction (in units of the
/// scattering at the minimum momentum and resolution, straight chords) may grow by at most
/// this much. The exchange must lower the pair's fitted chi-square by [`MIN_GAIN`], and
/// its fit sees the junction's kinks in units of the tracks' own scattering, smaller than
/// the minimum momentum's for all but the slowest tracks, so mostly by more than this
/// score: what the margin holds is the straight chords' neglect of the field (the two
/// tracks' bending differs across the junction) and of the other hits' pull on the fit. At 10,
/// on the 132 drawn and independent samples (fields reversing, ending, of 3 T solenoids,
/// toroids), every sample finds the same particles, ghosts and clones as at 20 (three
/// differ in a pull's width by at most 0.004), with a third of the first fits at 20
/// skipped (29 % on the dipole map's central events, 46 % at a solenoid's end); at 4,
/// counts begin to differ (`bench/RESULTS.md`). The same bound holds for the kinks with
/// the field's bending taken away, at the pair's measured momentum
/// ([`Exchange::measured_score`]): on the project's central events it refuses 78 % of the
/// dipole map's fits the straight chords let through, 27 % of the spectrometer's, and
/// the 120 drawn samples' reports stay the same byte for byte (`bench/RESULTS.md`).
pub const PRE_TEST: f64 = 10.0;

/// The fit's retry ([`crate::tracking::kalman::RETRY_CHI2_NDF`]) of an exchange's trial
/// fit is made only where its first attempt fails or ends within this many times the
/// pair's chi-square less [`MIN_GAIN`] (the most either new track may have for the
/// exchange to gain). Nearly every trial fit in a dense core is a mixed track far beyond
/// it, and its retry, made because its chi-square per degree of freedom exceeds 5, was
/// 43 % of the trial fits' time on the drawn sample `random:62`; on the drawn samples
/// the retries that brought a fit within the gain started from within twice it
/// (`bench/RESULTS.md`).
pub const RETRY_WITHIN: f32 = 10.0;

/// The cuts of the exchange step, derived from the geometry and the finder's cuts.
#[derive(Debug, Clone)]
pub struct ExchangeCuts {
    /// Per plane: how close (mm, in x and in y) two tracks' hits must lie on it for an
    /// exchange next to it to be tried, at most: the displacement over the plane's gap on
    /// the side of the exchange of a scatter of `n_sigma` standard deviations at the
    /// minimum momentum (at the largest slope factor), plus `n_sigma` times the two hits'
    /// resolution ([`Self::window_for`]); this is the larger side's. Two tracks further
    /// apart cannot exchange their segments without a kink the fit refuses.
    pub window_mm: Vec<f32>,
    /// Per plane and side (the gap upstream, the gap downstream): the scattering part of
    /// the window for an exchange across that gap (at the minimum momentum); for a pair of
    /// tracks whose momentum is measured it shrinks with the softer one's |q/p|
    /// ([`Self::window_for`]), as the scattering does.
    pub scatter_mm: Vec<[f32; 2]>,
    /// Per plane: the resolution part of the windows.
    pub res_mm: Vec<f32>,
    /// The |q/p| the windows are for (1 / the minimum momentum); zero without a momentum
    /// measurement (no scaling).
    pub qop_ref: f32,
    /// Fewest hits of a track (the finder's `min_hits`).
    pub min_hits: usize,
    /// The fit's chi-square per degree of freedom cut (the finder's `max_chi2_ndf`).
    pub max_chi2_ndf: f64,
    /// Whether the step runs ([`FinderConfig::exchange_segments`]).
    pub enabled: bool,
    /// Whether an exchange's gain is the fall of the pair's summed kink evidence
    /// ([`KalmanFitter::scatter_evidence`]) rather than of its candidates' chi-square:
    /// where the tracks' fit takes each track's momentum from its kinks
    /// ([`crate::tracking::kalman::FitConfig::estimates_scattering`]). The candidates'
    /// fit then scatters every track at the minimum momentum, at which two particles'
    /// segments joined cost hardly more than a scatter (on the drawn sample `random:405`,
    /// 12 planes without a field, pairs whose upstream segments are each other's gained
    /// 1.5 in chi-square by their exchange and 3.7 in evidence); the evidence weighs each
    /// set of hits at the momenta its kinks allow, against the run's spectrum.
    pub evidence: bool,
    /// Per plane: z (mm), the variance of a scattering angle at the minimum momentum
    /// (largest slope factor) and of a hit's position (the larger of x and y).
    pub z_mm: Vec<f64>,
    pub kink_var: Vec<f64>,
    pub res_var: Vec<f64>,
    /// Per plane: the variances of a hit's x and y (the fit's measurement).
    pub hit_var: Vec<[f64; 2]>,
    /// The field's bending of a kink, where the tracks' momenta are measured
    /// ([`Exchange::measured_score`]): the tent tables of the plane triples, or the uniform
    /// field, and the origin their lines start from (x, y).
    pub bending: Option<JunctionBending>,
}

/// What the field bends a kink by per unit q/p ([`Kink::bend`]): the tent-weighted mean
/// field of the kink's three planes ([`super::bending`]), from the tables along the line
/// from the origin through the middle hit (as the triplets read them), or the uniform
/// field.
#[derive(Debug, Clone)]
pub struct JunctionBending {
    pub tables: std::sync::Arc<super::bending::Bending>,
    pub uniform: Option<[f32; 3]>,
    pub origin: [f32; 2],
}

impl JunctionBending {
    /// The mean field (tesla) of the tent over planes `l < m < r`, the middle hit at
    /// (`x`, `y`); NaN where no table holds it (planes further apart than the finder's
    /// reach).
    fn field(&self, l: usize, m: usize, r: usize, x: f32, y: f32) -> [f32; 3] {
        if let Some(b) = self.uniform {
            return b;
        }
        match r
            .checked_sub(m + 1)
            .and_then(|s| self.tables.triple(l, m, s))
        {
            Some(t) => {
                let inv = self.tables.inv_lever[m];
                t.at((x - self.origin[0]) * inv, (y - self.origin[1]) * inv)
            }
            None => [f32::NAN; 3],
        }
    }
}

impl ExchangeCuts {
    pub fn new(geo: &FinderGeometry, cfg: &FinderConfig) -> Self {
        let planes = &geo.planes;
        // Per plane and side (the gap upstream, the gap downstream): the displacement of
        // an `n_sigma` scatter at the minimum momentum over that gap.
        let scatter = |p: usize, side: usize| -> f32 {
            let z = planes[p].z_mm;
            let gap = if side == 0 {
                if p > 0 {
                    z - planes[p - 1].z_mm
                } else {
                    0.0
                }
            } else {
                planes.get(p + 1).map_or(0.0, |n| n.z_mm - z)
            };
            (cfg.n_sigma * planes[p].theta2_min_p.sqrt() * cfg.slope_factor * gap) as f32
        };
        let scatter_mm: Vec<[f32; 2]> = (0..planes.len())
            .map(|p| [scatter(p, 0), scatter(p, 1)])
            .collect();
        let res_mm: Vec<f32> = planes
            .iter()
            .map(|g| (cfg.n_sigma * (2.0 * g.var_x.max(g.var_y)).sqrt()) as f32)
            .collect();
        let window_mm = scatter_mm
            .iter()
            .zip(&res_mm)
            .map(|(s, r)| r + s[0].max(s[1]))
            .collect();
        let qop_ref = if cfg.fit.fit_momentum && geo.b_max_tesla.iter().any(|&b| b != 0.0) {
            (1.0 / cfg.min_p_gev) as f32
        } else {
            0.0
        };
        ExchangeCuts {
            scatter_mm,
            res_mm,
            z_mm: planes.iter().map(|g| g.z_mm).collect(),
            kink_var: planes
                .iter()
                .map(|g| g.theta2_min_p * cfg.slope_factor * cfg.slope_factor)
                .collect(),
            res_var: planes.iter().map(|g| g.var_x.max(g.var_y)).collect(),
            hit_var: planes.iter().map(|g| [g.var_x, g.var_y]).collect(),
            bending: (qop_ref > 0.0).then(|| JunctionBending {
                tables: geo.bending.clone(),
                uniform: match geo.field {
                    Field::Uniform { b_tesla } => Some(b_tesla.map(|b| b as f32)),
                    Field::Grid(_) => None,
                },
                origin: [cfg.origin_x_mm as f32, cfg.origin_y_mm as f32],
            }),
            qop_ref,
            window_mm,
            min_hits: cfg.min_hits.max(3),
            max_chi2_ndf: cfg.max_chi2_ndf,
            enabled: cfg.exchange_segments,
            evidence: cfg.fit.estimates_scattering(),
        }
    }

    /// The window on plane `p` for an exchange across the gap upstream of it (`side` 0:
    /// the boundary just before the plane) or downstream (1: just after), for a pair whose
    /// softer track's |q/p| is at most `q` (fitted plus three standard deviations).
    pub fn window_for(&self, p: usize, side: usize, q: f32) -> f32 {
        let s = self.scatter_mm[p][side];
        if self.qop_ref > 0.0 && q.is_finite() {
            self.res_mm[p] + s * (q / self.qop_ref).min(1.0)
        } else {
            self.res_mm[p] + s
        }
    }

    fn good(&self, f: &FitOutput, n_hits: usize) -> bool {
        n_hits >= self.min_hits
            && f.ok
            && f.ndf > 0
            && ((f.chi2 as f32) / f.ndf as f32) as f64 <= self.max_chi2_ndf
    }
}

/// An exchange that improves its pair: the two tracks, the boundary plane and the gain.
#[derive(Debug, Clone, Copy)]
struct Gain {
    a: u32,
    b: u32,
    boundary: u16,
    gain: f32,
}

/// The end of the run of one plane and row of `p` that starts at `from` (`from` itself
/// past the end).
fn row_end(p: &[Point], from: usize) -> usize {
    let Some(first) = p.get(from) else {
        return from;
    };
    from + p[from..]
        .iter()
        .position(|o| o.plane != first.plane || o.row != first.row)
        .unwrap_or(p.len() - from)
}

/// A track's hit on a plane, with its row ([`Exchange::find_close_hits`]).
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    plane: u16,
    row: i32,
    x: f32,
    y: f32,
    hit: u32,
}

/// The exchange step's working memory (reused from event to event).
#[derive(Debug, Default)]
pub struct Exchange {
    points: Vec<Point>,
    /// The points by row ([`Self::find_close_hits`]): per plane its lowest and highest
    /// row, its first cell, the cells' starts in `sorted`.
    rows: Vec<(i32, i32)>,
    base: Vec<usize>,
    start: Vec<u32>,
    fill: Vec<u32>,
    sorted: Vec<Point>,
    close: Vec<(u32, u32, f32)>,
    /// Per track: its candidates' fit.
    fit: TrackFits,
    owner: Vec<u32>,
    pairs: Vec<(u32, u32, u16)>,
    changed: Vec<bool>,
    exchanged: Vec<bool>,
    taken: Vec<bool>,
    gains: Vec<Gain>,
    trial_hits: Vec<FitHit>,
    trials: Vec<(u32, u16, u32, u32)>,
    fits: Vec<FitOutput>,
    segment: Vec<u32>,
    /// The exchanges whose first new track passed, with its chi-square
    /// ([`Self::evaluate`]).
    firsts: Vec<(u32, f64)>,
    /// The exchanges whose evidence gains ([`ExchangeCuts::evidence`]), with the gain.
    weighed: Vec<(u32, f32)>,
    /// One set of hits whose evidence is taken.
    evidence_hits: Vec<FitHit>,
}

impl Exchange {
    /// Exchanges segments between `tracks` (an event's, hits as indices into `hits`,
    /// upstream first) where it lowers a pair's chi-square (or, without a field, its
    /// kinks' evidence: [`ExchangeCuts::evidence`]) by more than [`MIN_GAIN`]
    /// (`fitter`: the candidates' fit, whose chi-square the choice ranked by); the
    /// exchanged tracks are written with `final_fitter`'s fit where given (the accepted
    /// tracks' own), else `fitter`'s. Returns the number of exchanges.
    pub fn run(
        &mut self,
        cuts: &ExchangeCuts,
        fitter: &KalmanFitter,
        final_fitter: Option<&KalmanFitter>,
        hits: &[HitRecord],
        tracks: &mut [Track],
        candidate_fits: Option<&[CandidateFit]>,
    ) -> usize {
        let n = tracks.len();
        let candidate_fits = candidate_fits.filter(|f| f.len() == n);
        if !cuts.enabled || n < 2 {
            return 0;
        }
        self.find_close_hits(cuts, hits, tracks);
        if self.close.is_empty() {
            return 0;
        }
        let fit = &mut self.fit;
        fit.qop.clear();
        fit.qop.extend(
            tracks
                .iter()
                .map(|t| t.state.qop.abs() + 3.0 * t.var(4).max(0.0).sqrt()),
        );
        fit.q.clear();
        fit.q.extend(tracks.iter().map(|t| t.state.qop));
        self.changed.clear();
        self.changed.resize(n, true);
        self.find_pairs(cuts, hits, tracks);
        self.exchanged.clear();
        self.exchanged.resize(n, false);
        // The chi-square with the candidates' fit of every track in a pair (NaN: not
        // fitted yet).
        let fit = &mut self.fit;
        fit.chi2.clear();
        fit.first.clear();
        if final_fitter.is_none() {
            // The tracks' own fits are the candidates' fits.
            fit.first.extend(tracks.iter().map(|t| {
                let c = &t.cov;
                [t.state.x_mm, t.state.y_mm, c[0], c[1], c[2]].map(f64::from)
            }));
            fit.chi2.extend(
                tracks
                    .iter()
                    .map(|t| if t.ndf > 0 { t.chi2 } else { f32::INFINITY }),
            );
        } else {
            fit.chi2.resize(n, f32::NAN);
            fit.first.resize(n, [f64::NAN; 5]);
        }
        self.fit_missing(fitter, hits, tracks, false, candidate_fits);
        self.taken.clear();
        self.taken.resize(n, false);
        self.gains.clear();
        let mut exchanges = 0;
        for _ in 0..MAX_ROUNDS {
            self.evaluate(cuts, fitter, hits, tracks);
            // Best gain first; ties by the pair, then the boundary.
            self.gains.sort_unstable_by(|x, y| {
                y.gain
                    .total_cmp(&x.gain)
                    .then((x.a, x.b, x.boundary).cmp(&(y.a, y.b, y.boundary)))
            });
            self.changed.fill(false);
            self.taken.fill(false);
            let mut made = 0;
            for g in &self.gains {
                let (a, b) = (g.a as usize, g.b as usize);
                if self.taken[a] || self.taken[b] {
                    continue;
                }
                self.taken[a] = true;
                self.taken[b] = true;
                let (ta, tb) = split_two(tracks, a, b);
                exchange(ta, tb, hits, g.boundary, &mut self.segment);
                for (t, track) in [(a, &*ta), (b, &*tb)] {
                    for &h in &track.hits {
                        self.owner[h as usize] = t as u32;
                    }
                }
                for t in [a, b] {
                    self.changed[t] = true;
                    self.exchanged[t] = true;
                    self.fit.chi2[t] = f32::NAN;
                }
                made += 1;
            }
            if made == 0 {
                break;
            }
            exchanges += made;
            // The gains of pairs that touch no changed track stand; the pairs of the
            // changed tracks are found again (their hits moved) and evaluated again.
            let changed = &self.changed;
            self.gains
                .retain(|g| !changed[g.a as usize] && !changed[g.b as usize]);
            self.pairs.clear();
            self.fit_missing(fitter, hits, tracks, true, candidate_fits);
            self.find_pairs(cuts, hits, tracks);
            self.fit_missing(fitter, hits, tracks, false, candidate_fits);
        }
        if exchanges > 0 {
            // The exchanged tracks' final fits (a track exchanged twice is fitted once).
            std::mem::swap(&mut self.changed, &mut self.exchanged);
            self.write_fits(fitter, final_fitter, hits, tracks);
        }
        exchanges
    }

    /// The pairs of hits of tracks within their plane's window of each other (`close`),
    /// and every hit's track (`owner`). The hits are binned per plane into rows of the
    /// window's height (a counting sort) and sorted by x within a row; each hit is
    /// compared with the hits after it in its own row and in the row above, within the
    /// window in x. Every pair within the window lies in one row or in two neighbouring
    /// ones, so each is found once, in one sweep over sorted memory (in a dense core a
    /// strip of the window's width in x alone holds hundreds of hits where a row's
    /// stretch holds a few).
    fn find_close_hits(&mut self, cuts: &ExchangeCuts, hits: &[HitRecord], tracks: &[Track]) {
        self.points.clear();
        self.owner.clear();
        self.owner.resize(hits.len(), u32::MAX);
        self.close.clear();
        let planes = cuts.window_mm.len();
        self.rows.clear();
        self.rows.resize(planes, (i32::MAX, i32::MIN));
        for (j, t) in tracks.iter().enumerate() {
            for &h in &t.hits {
                self.owner[h as usize] = j as u32;
            }
        }
        // In the hits' order (one pass over them), those of a track.
        for (h, (r, &o)) in hits.iter().zip(&self.owner).enumerate() {
            let Some(&w) = cuts.window_mm.get(r.plane as usize) else {
                continue;
            };
            if o == u32::MAX {
                continue;
            }
            let row = (r.y_mm / w.max(1e-3)).floor() as i32;
            let span = &mut self.rows[r.plane as usize];
            *span = (span.0.min(row), span.1.max(row));
            self.points.push(Point {
                plane: r.plane,
                row,
                x: r.x_mm,
                y: r.y_mm,
                hit: h as u32,
            });
        }
        // Each plane's rows from its lowest to its highest one, one cell each, and one
        // empty cell after a plane's rows (the last row has no row above).
        self.base.clear();
        let mut cells = 0usize;
        for &(lo, hi) in &self.rows {
            self.base.push(cells);
            if lo <= hi {
                cells += (hi as i64 - lo as i64 + 2) as usize;
            }
        }
        let n = self.points.len();
        if cells > 2 * n {
            // Few hits for their rows (a small event, or hits far outside any plane's
            // area): one sort instead of the counting.
            self.points.sort_unstable_by(|a, b| {
                (a.plane, a.row)
                    .cmp(&(b.plane, b.row))
                    .then(a.x.total_cmp(&b.x))
                    .then(a.hit.cmp(&b.hit))
            });
            std::mem::swap(&mut self.points, &mut self.sorted);
        } else {
            self.count_rows(cells);
        }
        // `sorted` is in (plane, row, x, hit) order either way: the rows are its runs of
        // one plane and row.
        let mut i = 0;
        let mut end = row_end(&self.sorted, i);
        while i < self.sorted.len() {
            let p = &self.sorted;
            let above = end < p.len() && p[end].plane == p[i].plane && p[end].row == p[i].row + 1;
            let next_end = row_end(p, end);
            self.sweep_row(cuts, i, end, if above { next_end } else { end });
            (i, end) = (end, next_end);
        }
    }

    /// The counting sort of `points` into `sorted` by cell (a plane's rows in order, the
    /// planes in order: `cells` of them), then each row by x.
    fn count_rows(&mut self, cells: usize) {
        let cell = |base: &[usize], rows: &[(i32, i32)], p: &Point| -> usize {
            base[p.plane as usize] + (p.row - rows[p.plane as usize].0) as usize
        };
        self.start.clear();
        self.start.resize(cells + 1, 0);
        for p in &self.points {
            self.start[cell(&self.base, &self.rows, p) + 1] += 1;
        }
        for c in 1..self.start.len() {
            self.start[c] += self.start[c - 1];
        }
        self.fill.clear();
        self.fill.extend_from_slice(&self.start[..cells]);
        self.sorted.clear();
        self.sorted.resize(
            self.points.len(),
            self.points.first().copied().unwrap_or_default(),
        );
        for p in &self.points {
            let c = cell(&self.base, &self.rows, p);
            self.sorted[self.fill[c] as usize] = *p;
            self.fill[c] += 1;
        }
        for c in 0..cells {
            let row = &mut self.sorted[self.start[c] as usize..self.start[c + 1] as usize];
            if row.len() > 1 {
                row.sort_unstable_by(|a, b| a.x.total_cmp(&b.x).then(a.hit.cmp(&b.hit)));
            }
        }
    }

    /// The close pairs of the row `sorted[from..end]` (sorted by x) within itself and
    /// with the row above it, `sorted[end..above_end]`.
    fn sweep_row(&mut self, cuts: &ExchangeCuts, from: usize, end: usize, above_end: usize) {
        let p = &self.sorted;
        let Some(first) = p.get(from).filter(|_| from < end) else {
            return;
        };
        let w = cuts.window_mm[first.plane as usize];
        let mut above = end;
        for a in from..end {
            let pa = &p[a];
            while above < above_end && p[above].x < pa.x - w {
                above += 1;
            }
            // The hits after it in its row, then the row above's from `above`, each up
            // to the window's end in x.
            for run in [&p[a + 1..end], &p[above..above_end]] {
                for o in run.iter().take_while(|o| o.x - pa.x <= w) {
                    let (dx, dy) = ((o.x - pa.x).abs(), (o.y - pa.y).abs());
                    if dy <= w {
                        self.close
                            .push((pa.hit.min(o.hit), pa.hit.max(o.hit), dx.max(dy)));
                    }
                }
            }
        }
    }

    /// The exchanges to try: pairs of tracks with close hits on a plane (within the
    /// window of the side of the exchange), `(a, b, boundary)` with `a < b`, sorted, of
    /// which one track is marked in `changed`; the boundary is the first plane of the
    /// downstream segments. Where the gain is the kinks' evidence
    /// ([`ExchangeCuts::evidence`]), on the downstream side, where one track misses the
    /// next plane, every boundary up to the next plane both have a hit on (or past the
    /// last plane): two particles that cross where one of them left no hit exchange their
    /// segments there (on the drawn sample `random:405`, a pair close on plane 2 whose
    /// particles were 0.8 mm apart on plane 4, one of them without a hit on plane 3). In
    /// a field, where the gain is the chi-square, it changed one of 300 drawn samples by
    /// 0.3 % and cost 1.3 % of the dipole map's time per hit (`bench/RESULTS.md`).
    fn find_pairs(&mut self, cuts: &ExchangeCuts, hits: &[HitRecord], tracks: &[Track]) {
        self.pairs.clear();
        for &(h1, h2, d) in &self.close {
            let (a, b) = (self.owner[h1 as usize], self.owner[h2 as usize]);
            if a == b || !(self.changed[a as usize] || self.changed[b as usize]) {
                continue;
            }
            let plane = hits[h1 as usize].plane;
            let q = self.fit.qop[a as usize].max(self.fit.qop[b as usize]);
            for side in 0..2 {
                if d <= cuts.window_for(plane as usize, side, q) {
                    self.pairs.push((a.min(b), a.max(b), plane + side as u16));
                    if side == 1 && cuts.evidence {
                        // Where one of the two misses the next plane, the boundaries up
                        // to the next plane both cross.
                        let (ta, tb) = (&tracks[a as usize].hits, &tracks[b as usize].hits);
                        let n = next_common_plane(hits, ta, tb, plane)
                            .unwrap_or(cuts.z_mm.len() as u16);
                        for boundary in plane + 2..=n {
                            self.pairs.push((a.min(b), a.max(b), boundary));
                        }
                    }
                }
            }
        }
        self.pairs.sort_unstable();
        self.pairs.dedup();
    }

    /// The candidates' chi-square of the tracks in a pair not fitted yet, into
    /// `self.chi2`; `candidate_fits` (one per track, the tracks as found): the fits of
    /// the tracks not exchanged, made by the candidates' fit on the same hits.
    fn fit_missing(
        &mut self,
        fitter: &KalmanFitter,
        hits: &[HitRecord],
        tracks: &[Track],
        with_changed: bool,
        candidate_fits: Option<&[CandidateFit]>,
    ) {
        self.trial_hits.clear();
        self.trials.clear();
        // The changed tracks (their q/p sets their pairs' windows), then those in a pair.
        let changed =
            (0..self.changed.len() as u32).filter(|&t| with_changed && self.changed[t as usize]);
        let paired = self.pairs.iter().flat_map(|&(a, b, _)| [a, b]);
        for t in changed.chain(paired) {
            if !self.fit.chi2[t as usize].is_nan() {
                continue;
            }
            if let Some(f) = candidate_fits.filter(|_| !self.exchanged[t as usize]) {
                self.fit.take(t, f[t as usize]);
                continue;
            }
            // Marked as being fitted (a track in several pairs is fitted once).
            self.fit.chi2[t as usize] = f32::INFINITY;
            push_trial(
                &mut self.trial_hits,
                &mut self.trials,
                (t, 0),
                hits,
                [&tracks[t as usize].hits[..]],
            );
        }
        self.fit_trials(fitter);
        for (&(t, ..), f) in self.trials.iter().zip(&self.fits) {
            self.fit.take(t, f.into());
        }
    }

    /// The trials of `evaluate` (their id a pair's index): [`Self::fit_trials`], each
    /// retry only within [`RETRY_WITHIN`] times its pair's room for the gain.
    fn fit_exchanges(&mut self, fitter: &KalmanFitter) {
        self.fits.clear();
        self.fits.resize(self.trials.len(), FitOutput::default());
        let (hits, pairs, chi2) = (&self.trial_hits, &self.pairs, &self.fit.chi2);
        fitter.fit_each_retry_within(
            &self.trials,
            |&(_, _, from, len)| &hits[from as usize..(from + len) as usize],
            |&(k, ..)| {
                let (a, b, _) = pairs[k as usize];
                (chi2[a as usize] + chi2[b as usize] - MIN_GAIN) * RETRY_WITHIN
            },
            &mut self.fits,
        );
    }

    /// Fits every trial (`trials`: id, boundary, first hit, hit count in `trial_hits`)
    /// into `fits`, a lane group at a time.
    fn fit_trials(&mut self, fitter: &KalmanFitter) {
        self.fits.clear();
        self.fits.resize(self.trials.len(), FitOutput::default());
        let hits = &self.trial_hits;
        fitter.fit_each(
            &self.trials,
            |&(_, _, from, len)| &hits[from as usize..(from + len) as usize],
            &mut self.fits,
        );
    }

    /// Evaluates the pairs that touch a changed track, at both boundaries of their plane,
    /// adding the exchanges that gain to `gains`. Where the gain is the kinks' evidence
    /// ([`ExchangeCuts::evidence`]), the exchanges that gain by it are fitted, both new
    /// tracks at once ([`Self::fit_weighed`]). Otherwise the first new track of every
    /// exchange (`a`'s upstream segment, `b`'s downstream one) is fitted first; the second only
    /// where the first passes the cut and leaves room for the gain (a chi-square is not
    /// negative), which on the drawn samples spares four of five second fits and changes
    /// no outcome.
    fn evaluate(
        &mut self,
        cuts: &ExchangeCuts,
        fitter: &KalmanFitter,
        hits: &[HitRecord],
        tracks: &[Track],
    ) {
        self.trial_hits.clear();
        self.trials.clear();
        for (k, &(a, b, boundary)) in self.pairs.iter().enumerate() {
            if !self.changed[a as usize] && !self.changed[b as usize] {
                continue;
            }
            let Some([ua, da, ub, db]) = self.segments(cuts, hits, tracks, k) else {
                continue;
            };
            if self.single_hit_swap(hits, a, b, ua, ub) {
                // The first hits swapped: the gain the fits' last updates predict.
                let g = first_hit_gain(
                    cuts,
                    hits,
                    &self.fit.first[a as usize],
                    &self.fit.first[b as usize],
                    ua[0],
                    ub[0],
                );
                if g.is_nan() || g < (MIN_GAIN - FIRST_HIT_SLACK) as f64 {
                    continue;
                }
            } else {
                // The kinks around the junction, before and after: an exchange that makes
                // them much worse is not fitted.
                let aa = junction_kinks(cuts, hits, ua, da);
                let bb = junction_kinks(cuts, hits, ub, db);
                let ab = junction_kinks(cuts, hits, ua, db);
                let ba = junction_kinks(cuts, hits, ub, da);
                let straight = straight_score(&aa) + straight_score(&bb)
                    - straight_score(&ab)
                    - straight_score(&ba);
                if straight < -PRE_TEST
                    || self.measured_score(cuts, a, b, [&aa, &bb, &ab, &ba]) < -PRE_TEST
                {
                    continue;
                }
            }
            if cuts.evidence {
                let g = evidence_gain(&mut self.evidence_hits, fitter, hits, [ua, da, ub, db]);
                if g > MIN_GAIN as f64 {
                    self.weighed.push((k as u32, g as f32));
                }
                continue;
            }
            push_trial(
                &mut self.trial_hits,
                &mut self.trials,
                (k as u32, boundary),
                hits,
                [ua, db],
            );
        }
        if cuts.evidence {
            self.fit_weighed(cuts, fitter, hits, tracks);
            return;
        }
        self.fit_exchanges(fitter);
        // The first fits that leave room for a gain, then their second fits.
        self.firsts.clear();
        for (&(k, _, _, len), f) in self.trials.iter().zip(&self.fits) {
            let (a, b, _) = self.pairs[k as usize];
            let before = self.fit.chi2[a as usize] + self.fit.chi2[b as usize];
            if cuts.good(f, len as usize) && before - f.chi2 as f32 > MIN_GAIN {
                self.firsts.push((k, f.chi2));
            }
        }
        self.trial_hits.clear();
        self.trials.clear();
        for &(k, _) in &self.firsts {
            let [_, da, ub, _] = self
                .segments(cuts, hits, tracks, k as usize)
                .expect("split");
            let boundary = self.pairs[k as usize].2;
            push_trial(
                &mut self.trial_hits,
                &mut self.trials,
                (k, boundary),
                hits,
                [ub, da],
            );
        }
        self.fit_exchanges(fitter);
        for ((&(k, boundary, _, len), fb), &(_, chi2_a)) in
            self.trials.iter().zip(&self.fits).zip(&self.firsts)
        {
            if !cuts.good(fb, len as usize) {
                continue;
            }
            let (a, b, _) = self.pairs[k as usize];
            let chi2 = &self.fit.chi2;
            let gain = chi2[a as usize] + chi2[b as usize] - (chi2_a + fb.chi2) as f32;
            if gain > MIN_GAIN {
                self.gains.push(Gain {
                    a,
                    b,
                    boundary,
                    gain,
                });
            }
        }
    }

    /// The exchanges whose evidence gains (`weighed`): both new tracks fitted with the
    /// candidates' fit, and the exchange kept in `gains` where both pass its cut.
    fn fit_weighed(
        &mut self,
        cuts: &ExchangeCuts,
        fitter: &KalmanFitter,
        hits: &[HitRecord],
        tracks: &[Track],
    ) {
        self.trial_hits.clear();
        self.trials.clear();
        for &(k, _) in &self.weighed {
            let [ua, da, ub, db] = self
                .segments(cuts, hits, tracks, k as usize)
                .expect("split");
            let boundary = self.pairs[k as usize].2;
            for parts in [[ua, db], [ub, da]] {
                push_trial(
                    &mut self.trial_hits,
                    &mut self.trials,
                    (k, boundary),
                    hits,
                    parts,
                );
            }
        }
        self.fit_trials(fitter);
        for (i, &(k, gain)) in self.weighed.iter().enumerate() {
            let (first, second) = (&self.trials[2 * i], &self.trials[2 * i + 1]);
            if cuts.good(&self.fits[2 * i], first.3 as usize)
                && cuts.good(&self.fits[2 * i + 1], second.3 as usize)
            {
                let (a, b, boundary) = self.pairs[k as usize];
                self.gains.push(Gain {
                    a,
                    b,
                    boundary,
                    gain,
                });
            }
        }
        self.weighed.clear();
    }

    /// The segments of pair `k`'s exchange, `[a upstream, a downstream, b upstream, b
    /// downstream]`, where both tracks have hits on both sides of the boundary and both
    /// exchanged tracks would keep enough hits.
    fn segments<'t>(
        &self,
        cuts: &ExchangeCuts,
        hits: &[HitRecord],
        tracks: &'t [Track],
        k: usize,
    ) -> Option<[&'t [u32]; 4]> {
        let (a, b, boundary) = self.pairs[k];
        let (ta, tb) = (&tracks[a as usize].hits, &tracks[b as usize].hits);
        let (sa, sb) = (split(ta, hits, boundary), split(tb, hits, boundary));
        if sa == 0 || sb == 0 || sa == ta.len() || sb == tb.len() {
            return None;
        }
        let (na, nb) = (sa + tb.len() - sb, sb + ta.len() - sa);
        if na < cuts.min_hits || nb < cuts.min_hits {
            return None;
        }
        Some([&ta[..sa], &ta[sa..], &tb[..sb], &tb[sb..]])
    }

    /// How much smaller the junction's squared kinks of pair (`a`, `b`) are than those of
    /// its exchange (`kinks`: of a's and b's junctions, then of the exchanged tracks'),
    /// with each track's bending taken away and in units of the scattering at the pair's
    /// measured momentum ([`ExchangeCuts::window_for`]'s scaling, at the softer track's
    /// |q/p| bound): a's and b's kinks less the bending of their own fitted q/p, the
    /// exchanged tracks' less the bending of whichever q/p explains them best (so the
    /// exchange is refused only where no momentum makes its junctions as good). NaN where
    /// the momentum is not measured or a kink's bending is not known.
    fn measured_score(
        &self,
        cuts: &ExchangeCuts,
        a: u32,
        b: u32,
        kinks: [&[Option<Kink>; 2]; 4],
    ) -> f64 {
        let Some(jb) = &cuts.bending else {
            return f64::NAN;
        };
        let q = |t: u32| self.fit.q[t as usize] as f64;
        let soft = self.fit.qop[a as usize].max(self.fit.qop[b as usize]);
        let s = if soft.is_finite() {
            (soft as f64 / cuts.qop_ref as f64).min(1.0)
        } else {
            1.0
        };
        let s2 = s * s;
        let [aa, bb, ab, ba] = kinks;
        bent_score(aa, jb, q(a), s2) + bent_score(bb, jb, q(b), s2)
            - best_bent_score(ab, jb, s2)
            - best_bent_score(ba, jb, s2)
    }

    /// Whether pair (`a`, `b`)'s exchange swaps their first hits only (`ua`, `ub`: one
    /// hit each, on one plane) and both fits are known, so that [`first_hit_gain`]
    /// predicts it.
    fn single_hit_swap(&self, hits: &[HitRecord], a: u32, b: u32, ua: &[u32], ub: &[u32]) -> bool {
        ua.len() == 1
            && ub.len() == 1
            && hits[ua[0] as usize].plane == hits[ub[0] as usize].plane
            && self.fit.chi2[a as usize].is_finite()
            && self.fit.chi2[b as usize].is_finite()
    }

    /// Fits the tracks marked in `changed` with the final fitter and writes their states.
    fn write_fits(
        &mut self,
        fitter: &KalmanFitter,
        final_fitter: Option<&KalmanFitter>,
        hits: &[HitRecord],
        tracks: &mut [Track],
    ) {
        let f = final_fitter.unwrap_or(fitter);
        self.trial_hits.clear();
        self.trials.clear();
        for (t, track) in tracks.iter().enumerate() {
            if self.changed[t] {
                let id = (t as u32, 0);
                push_trial(
                    &mut self.trial_hits,
                    &mut self.trials,
                    id,
                    hits,
                    [&track.hits[..]],
                );
            }
        }
        self.fit_trials(f);
        for (k, &(t, ..)) in self.trials.iter().enumerate() {
            self.fits[k].write_track(&mut tracks[t as usize]);
        }
    }
}

/// A track's kink at a hit: the change from the chord before it to the chord after, in
/// x and y, with what it is made of.
#[derive(Debug, Clone, Copy)]
struct Kink {
    /// The change of slope.
    k: [f64; 2],
    /// The variance of a scattering angle at the minimum momentum (largest slope factor).
    scatter: f64,
    /// The variance the three hits' resolution gives the change.
    res: [f64; 3],
    /// The planes of the three hits, the middle hit's x and y, the outer hits' chord's
    /// slopes and their planes' distance.
    planes: [usize; 3],
    middle: [f32; 2],
    chord: [f64; 2],
    span: f64,
}

impl Kink {
    /// Its variance with the scattering at `s2` times the minimum momentum's.
    fn var(&self, s2: f64) -> f64 {
        self.scatter * s2 + self.res[0] + self.res[1] + self.res[2]
    }

    /// The change of slope the field gives per unit q/p: the curvature's `K n (A_x, A_y)`
    /// of the tent's mean field at the outer chord's slopes, times the tent's integral
    /// (half the span); NaN where no table holds the tent.
    fn bend(&self, jb: &JunctionBending) -> [f64; 2] {
        let [l, m, r] = self.planes;
        let b = jb
            .field(l, m, r, self.middle[0], self.middle[1])
            .map(f64::from);
        let [tx, ty] = self.chord;
        let (ax, ay) = bending(tx, ty, b);
        let per_qop = K_GEV_PER_T_MM * (1.0 + tx * tx + ty * ty).sqrt() * self.span * 0.5;
        [ax * per_qop, ay * per_qop]
    }
}

/// The kinks at the two hits around the junction of segments `up` and `down` (each where
/// the hit has neighbours on both sides).
fn junction_kinks(
    cuts: &ExchangeCuts,
    hits: &[HitRecord],
    up: &[u32],
    down: &[u32],
) -> [Option<Kink>; 2] {
    let kink = |l: u32, m: u32, r: u32| {
        let (hl, hm, hr) = (&hits[l as usize], &hits[m as usize], &hits[r as usize]);
        let (pl, pm, pr) = (hl.plane as usize, hm.plane as usize, hr.plane as usize);
        let (xl, yl) = (hl.x_mm as f64, hl.y_mm as f64);
        let (xm, ym) = (hm.x_mm as f64, hm.y_mm as f64);
        let (xr, yr) = (hr.x_mm as f64, hr.y_mm as f64);
        let (g1, g2) = (cuts.z_mm[pm] - cuts.z_mm[pl], cuts.z_mm[pr] - cuts.z_mm[pm]);
        let span = g1 + g2;
        Kink {
            k: [
                (xr - xm) / g2 - (xm - xl) / g1,
                (yr - ym) / g2 - (ym - yl) / g1,
            ],
            scatter: cuts.kink_var[pm],
            res: [
                cuts.res_var[pm] * (1.0 / g1 + 1.0 / g2).powi(2),
                cuts.res_var[pl] / (g1 * g1),
                cuts.res_var[pr] / (g2 * g2),
            ],
            planes: [pl, pm, pr],
            middle: [hm.x_mm, hm.y_mm],
            chord: [(xr - xl) / span, (yr - yl) / span],
            span,
        }
    };
    let (u, d) = (up.len(), down.len());
    [
        (u >= 2).then(|| kink(up[u - 2], up[u - 1], down[0])),
        (d >= 2).then(|| kink(up[u - 1], down[0], down[1])),
    ]
}

/// The squared kinks along straight chords, in units of the scattering at the minimum
/// momentum and the resolution.
fn straight_score(kinks: &[Option<Kink>; 2]) -> f64 {
    let mut s = 0.0;
    for k in kinks.iter().flatten() {
        s += (k.k[0] * k.k[0] + k.k[1] * k.k[1]) / k.var(1.0);
    }
    s
}

/// The squared kinks less the bending of q/p `q`, in units of the scattering at `s2`
/// times the minimum momentum's and the resolution.
fn bent_score(kinks: &[Option<Kink>; 2], jb: &JunctionBending, q: f64, s2: f64) -> f64 {
    let mut s = 0.0;
    for k in kinks.iter().flatten() {
        let b = k.bend(jb);
        let (rx, ry) = (k.k[0] - q * b[0], k.k[1] - q * b[1]);
        s += (rx * rx + ry * ry) / k.var(s2);
    }
    s
}

/// [`bent_score`] at the q/p that makes it least (the bending that explains the kinks
/// best, whatever the momentum).
fn best_bent_score(kinks: &[Option<Kink>; 2], jb: &JunctionBending, s2: f64) -> f64 {
    let (mut kk, mut kb, mut bb) = (0.0, 0.0, 0.0);
    for k in kinks.iter().flatten() {
        let (v, b) = (k.var(s2), k.bend(jb));
        kk += (k.k[0] * k.k[0] + k.k[1] * k.k[1]) / v;
        kb += (k.k[0] * b[0] + k.k[1] * b[1]) / v;
        bb += (b[0] * b[0] + b[1] * b[1]) / v;
    }
    if bb == 0.0 {
        return kk;
    }
    // (A NaN stays NaN: no exchange is refused on it.)
    let s = kk - kb * kb / bb;
    if s < 0.0 {
        0.0
    } else {
        s
    }
}

/// The gain in the pair's summed chi-square of exchanging the first hits `ha` and `hb`
/// (on one plane) of two tracks whose fits at their first hit are `fa` and `fb` (x, y
/// and their covariance, [`Exchange::first`]), as the fits' last update tells it: a
/// filter from downstream ends with the first hit, so each track's chi-square with the
/// other's hit instead of its own differs by that update's alone (the fit's state
/// before it is the filtered state less the hit). With `V` the hit's covariance, `P`
/// the filtered position's and `r` the own hit's residual to it, the update's
/// chi-square of a hit at `d` from the own hit rises by `d' (V^-1 - V^-1 P V^-1) d + 2 d'
/// V^-1 r`. NaN where a fit is not known.
fn first_hit_gain(
    cuts: &ExchangeCuts,
    hits: &[HitRecord],
    fa: &[f64; 5],
    fb: &[f64; 5],
    ha: u32,
    hb: u32,
) -> f64 {
    let (a, b) = (&hits[ha as usize], &hits[hb as usize]);
    let [vx, vy] = cuts.hit_var[a.plane as usize];
    let (ax, ay, bx, by) = (a.x_mm as f64, a.y_mm as f64, b.x_mm as f64, b.y_mm as f64);
    // The rise of track f's update chi-square with the hit at (hx, hy) instead of its own
    // (mx, my).
    let rise = |f: &[f64; 5], mx: f64, my: f64, hx: f64, hy: f64| {
        let (dx, dy) = (hx - mx, hy - my);
        let (rx, ry) = (mx - f[0], my - f[1]);
        let sxx = (1.0 - f[2] / vx) / vx;
        let syy = (1.0 - f[4] / vy) / vy;
        let sxy = -f[3] / (vx * vy);
        dx * dx * sxx + 2.0 * dx * dy * sxy + dy * dy * syy + 2.0 * (dx * rx / vx + dy * ry / vy)
    };
    -(rise(fa, ax, ay, bx, by) + rise(fb, bx, by, ax, ay))
}

/// Two distinct tracks, mutably.
fn split_two(tracks: &mut [Track], a: usize, b: usize) -> (&mut Track, &mut Track) {
    debug_assert!(a < b);
    let (lo, hi) = tracks.split_at_mut(b);
    (&mut lo[a], &mut hi[0])
}

/// Exchanges the hits of `a` and `b` upstream of plane `boundary` (`tmp`: scratch).
fn exchange(a: &mut Track, b: &mut Track, hits: &[HitRecord], boundary: u16, tmp: &mut Vec<u32>) {
    let (sa, sb) = (
        split(&a.hits, hits, boundary),
        split(&b.hits, hits, boundary),
    );
    tmp.clear();
    tmp.extend_from_slice(&b.hits[..sb]);
    tmp.extend_from_slice(&a.hits[sa..]);
    b.hits.splice(..sb, a.hits[..sa].iter().copied());
    a.hits.clear();
    a.hits.extend_from_slice(tmp);
}

/// How much smaller the summed kink evidence ([`KalmanFitter::scatter_evidence`]) of
/// the exchanged tracks is than that of the pair (`buf`: scratch; `parts`: a's upstream
/// and downstream segments, then b's); NaN or infinite where a set of hits has none.
fn evidence_gain(
    buf: &mut Vec<FitHit>,
    fitter: &KalmanFitter,
    hits: &[HitRecord],
    parts: [&[u32]; 4],
) -> f64 {
    let [ua, da, ub, db] = parts;
    let mut evidence = |up: &[u32], down: &[u32]| {
        buf.clear();
        for &h in up.iter().chain(down) {
            buf.push(FitHit::from(&hits[h as usize]));
        }
        fitter.scatter_evidence(buf).unwrap_or(f64::INFINITY)
    };
    evidence(ua, da) + evidence(ub, db) - evidence(ua, db) - evidence(ub, da)
}

/// The first plane after `p` on which both tracks (hits upstream first, one per plane)
/// have a hit.
fn next_common_plane(hits: &[HitRecord], a: &[u32], b: &[u32], p: u16) -> Option<u16> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (pa, pb) = (hits[a[i] as usize].plane, hits[b[j] as usize].plane);
        if pa <= p || pa < pb {
            i += 1;
        } else if pb <= p || pb < pa {
            j += 1;
        } else {
            return Some(pa);
        }
    }
    None
}

/// The number of a track's hits (upstream first) upstream of plane `boundary`.
fn split(track: &[u32], hits: &[HitRecord], boundary: u16) -> usize {
    track
        .iter()
        .position(|&h| hits[h as usize].plane >= boundary)
        .unwrap_or(track.len())
}

/// Appends a trial of id `id` (`trials`: id, boundary, first hit, hit count in
/// `trial_hits`) whose hits are the `parts` one after the other.
fn push_trial<const N: usize>(
    trial_hits: &mut Vec<FitHit>,
    trials: &mut Vec<(u32, u16, u32, u32)>,
    id: (u32, u16),
    hits: &[HitRecord],
    parts: [&[u32]; N],
) {
    let s = trial_hits.len() as u32;
    for p in parts {
        trial_hits.extend(p.iter().map(|&h| FitHit::from(&hits[h as usize])));
    }
    trials.push((id.0, id.1, s, trial_hits.len() as u32 - s));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuts(window_mm: Vec<f32>) -> ExchangeCuts {
        let n = window_mm.len();
        ExchangeCuts {
            scatter_mm: vec![[0.0; 2]; n],
            res_mm: window_mm.clone(),
            window_mm,
            qop_ref: 0.0,
            min_hits: 3,
            max_chi2_ndf: 5.0,
            enabled: true,
            evidence: false,
            z_mm: (0..n).map(|p| 100.0 * (p + 1) as f64).collect(),
            kink_var: vec![1e-6; n],
            res_var: vec![1e-4; n],
            hit_var: vec![[1e-4; 2]; n],
            bending: None,
        }
    }

    /// Every pair of two tracks' hits on one plane within the plane's window, as the
    /// definition says, compared one with another.
    fn brute_force(cuts: &ExchangeCuts, hits: &[HitRecord], tracks: &[Track]) -> Vec<(u32, u32)> {
        let mine: Vec<u32> = tracks.iter().flat_map(|t| t.hits.iter().copied()).collect();
        let mut out = Vec::new();
        for (i, &a) in mine.iter().enumerate() {
            for &b in &mine[i + 1..] {
                let (ha, hb) = (&hits[a as usize], &hits[b as usize]);
                let Some(&w) = cuts.window_mm.get(ha.plane as usize) else {
                    continue;
                };
                if ha.plane == hb.plane
                    && (ha.x_mm - hb.x_mm).abs() <= w
                    && (ha.y_mm - hb.y_mm).abs() <= w
                {
                    out.push((a.min(b), a.max(b)));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The close hits found by rows equal those found by comparing every pair: in a
    /// dense core, across row edges, on planes without a window, with hits on no track,
    /// and with a hit far outside the planes (where the rows give way to one sort).
    #[test]
    fn close_hits_by_rows_are_every_close_pair() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for far in [false, true] {
            let cuts = cuts(vec![0.5, 2.0, 0.25]);
            let mut hits = Vec::new();
            for h in 0..3000u32 {
                // A core of half the hits within 3 mm, the rest over 100 mm; plane 3 has
                // no window.
                let spread = if h % 2 == 0 { 3.0 } else { 100.0 };
                hits.push(HitRecord {
                    x_mm: ((uniform() - 0.5) * spread) as f32,
                    y_mm: ((uniform() - 0.5) * spread) as f32,
                    z_mm: 0.0,
                    plane: (h % 4) as u16,
                    hit_id: h,
                });
            }
            // Hits on a row's edge and exactly one window apart.
            for (k, y) in [0.5f32, 1.0, 0.999_999, 1.5].into_iter().enumerate() {
                let plane = 0;
                hits.push(HitRecord {
                    x_mm: 40.0 + 0.5 * k as f32,
                    y_mm: y,
                    z_mm: 0.0,
                    plane,
                    hit_id: 0,
                });
            }
            if far {
                hits[4].y_mm = 1e9;
            }
            // Tracks of up to five hits; every seventh hit on no track.
            let mut tracks = Vec::new();
            let mut track = Track::default();
            for h in 0..hits.len() as u32 {
                if h % 7 == 3 {
                    continue;
                }
                track.hits.push(h);
                if track.hits.len() == 5 {
                    tracks.push(std::mem::take(&mut track));
                }
            }
            tracks.push(track);
            let mut ex = Exchange::default();
            ex.find_close_hits(&cuts, &hits, &tracks);
            let mut found: Vec<(u32, u32)> = ex.close.iter().map(|&(a, b, _)| (a, b)).collect();
            found.sort_unstable();
            let expected = brute_force(&cuts, &hits, &tracks);
            assert!(expected.len() > 1000, "{} close pairs", expected.len());
            assert_eq!(found, expected, "far hit: {far}");
            // Each pair's distance is the larger of its offsets in x and y.
            for &(a, b, d) in &ex.close {
                let (ha, hb) = (&hits[a as usize], &hits[b as usize]);
                let expected = (ha.x_mm - hb.x_mm).abs().max((ha.y_mm - hb.y_mm).abs());
                assert_eq!(d, expected);
            }
            // And every hit's track.
            for (t, track) in tracks.iter().enumerate() {
                for &h in &track.hits {
                    assert_eq!(ex.owner[h as usize], t as u32);
                }
            }
        }
    }

    /// The next plane two tracks both cross: past the plane given, skipping the planes
    /// only one of them has a hit on; none where they share no later plane.
    #[test]
    fn the_next_common_plane_skips_the_planes_one_track_misses() {
        let hits: Vec<HitRecord> = (0..10u16)
            .map(|plane| HitRecord {
                x_mm: 0.0,
                y_mm: 0.0,
                z_mm: 0.0,
                plane,
                hit_id: 0,
            })
            .collect();
        // Hit k is on plane k.
        let a = [0, 1, 2, 4, 6, 7];
        let b = [0, 2, 3, 5, 7, 9];
        let next = |p| next_common_plane(&hits, &a, &b, p);
        assert_eq!(next(0), Some(2));
        assert_eq!(next(1), Some(2));
        assert_eq!(next(2), Some(7));
        assert_eq!(next(6), Some(7));
        assert_eq!(next(7), None);
        assert_eq!(next_common_plane(&hits, &a, &[], 0), None);
    }

    /// Pairs of particles from the origin without a field, 0.2 mrad apart at 10-30 GeV/c,
    /// each found as the other's upstream segment joined to its own downstream one: the
    /// kinks' evidence gives nearly every pair its own segments back, where the
    /// candidates' chi-square (at the minimum momentum's scattering) leaves a quarter
    /// crossed; of pairs found right, it exchanges few.
    #[test]
    fn without_a_field_the_kinks_evidence_gives_crossed_pairs_their_own_segments() {
        use crate::tracking::reco::synthetic::{detector, track};
        use rand::{Rng, SeedableRng};
        let det = detector(10, [0.0; 3], 0.01, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        assert!(cfg.fit.estimates_scattering());
        let cuts = ExchangeCuts::new(&FinderGeometry::new(&det, &cfg), &cfg);
        assert!(cuts.evidence);
        let fitter = KalmanFitter::new(&det, cfg.candidate_fit());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let n = 100;
        // Per pair: its hits, the particles' hits and the boundary of the crossing.
        let pairs: Vec<(Vec<HitRecord>, [Vec<u32>; 2], usize)> = (0..n)
            .map(|_| {
                let mut hits = Vec::new();
                let t = [rng.random_range(-0.1..0.1), rng.random_range(-0.1..0.1)];
                let phi: f64 = rng.random_range(0.0..std::f64::consts::TAU);
                let d = [2e-4 * phi.cos(), 2e-4 * phi.sin()];
                let mut particle = |t: [f64; 2], rng: &mut rand_chacha::ChaCha8Rng| {
                    let q = 1.0 / rng.random_range(10.0..30.0);
                    track(&det, [0.0, 0.0, t[0], t[1], q], true, true, rng, &mut hits).0
                };
                let a = particle(t, &mut rng);
                let b = particle([t[0] + d[0], t[1] + d[1]], &mut rng);
                (hits, [a, b], rng.random_range(2..6))
            })
            .collect();
        // Each pair run through the step as found (crossed or not); how many pairs end as
        // their particles.
        let own = |evidence: bool, crossed: bool| -> usize {
            let cuts = ExchangeCuts {
                evidence,
                ..cuts.clone()
            };
            let mut ex = Exchange::default();
            pairs
                .iter()
                .filter(|(hits, [a, b], k)| {
                    let mut tracks = [a, b].map(|p| Track {
                        hits: p.clone(),
                        ..Track::default()
                    });
                    if crossed {
                        let (x, y) = tracks.split_at_mut(1);
                        exchange(&mut x[0], &mut y[0], hits, *k as u16, &mut Vec::new());
                        assert_ne!(&x[0].hits, a);
                    }
                    ex.run(&cuts, &fitter, Some(&fitter), hits, &mut tracks, None);
                    tracks[0].hits == *a && tracks[1].hits == *b
                })
                .count()
        };
        let (with, without) = (own(true, true), own(false, true));
        assert!(with >= 95, "crossed pairs given back: {with} of {n}");
        assert!(without <= 85, "by the chi-square: {without} of {n}");
        // Particles this close lie within a scatter of each other (0.2 mrad against 0.3
        // of scattering and resolution per plane): the evidence takes the likelier pair,
        // which for a few pairs found right is the other.
        let right = own(true, false);
        assert!(right >= 95, "pairs found right that stay: {right} of {n}");
        assert_eq!(own(false, false), n);
    }

    /// A swap of two tracks' first hits changes each one's chi-square by its fit's last
    /// update alone where the first hit does not move the fit's start: without a field
    /// (no three-hit q/p), [`first_hit_gain`] is the gain the two tracks' refits give; in a
    /// field, where the first hit enters the seed's q/p, it is near it.
    #[test]
    fn first_hit_gain_is_the_refits_gain() {
        use crate::tracking::reco::synthetic::{detector, track};
        use rand::{Rng, SeedableRng};
        for (field, tol) in [(0.0, 1e-3), (0.8, 0.1)] {
            let det = detector(6, [0.0, field, 0.0], 0.01, 0.02);
            let cfg = FinderConfig::from_detector(&det, 1.0);
            let cuts = ExchangeCuts::new(&FinderGeometry::new(&det, &cfg), &cfg);
            let fitter = KalmanFitter::new(&det, cfg.candidate_fit());
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
            let (mut gaining, mut worst) = (0, 0.0f64);
            for i in 0..200 {
                let mut hits = Vec::new();
                let t = [rng.random_range(-0.05..0.05), rng.random_range(-0.05..0.05)];
                let q = rng.random_range(0.3..1.0) * if rng.random::<bool>() { 1.0 } else { -1.0 };
                let (a, _) = track(
                    &det,
                    [0.0, 0.0, t[0], t[1], q],
                    true,
                    true,
                    &mut rng,
                    &mut hits,
                );
                // The other close by on the first plane (within a few resolutions).
                let d = [rng.random_range(-0.2..0.2), rng.random_range(-0.2..0.2)];
                let start = [d[0], d[1], t[0] - d[0] / 300.0, t[1] - d[1] / 300.0, q];
                let (mut b, _) = track(&det, start, true, true, &mut rng, &mut hits);
                let mut a = a;
                if i % 2 == 1 {
                    // Every other pair starts with its first hits swapped.
                    std::mem::swap(&mut a[0], &mut b[0]);
                }
                let fit = |ids: Vec<u32>| {
                    let h: Vec<FitHit> = ids
                        .iter()
                        .map(|&i| FitHit::from(&hits[i as usize]))
                        .collect();
                    let mut out = Vec::new();
                    fitter.fit_batch(&[&h[..]], &mut out);
                    out[0]
                };
                let swap = |x: &[u32], y: &[u32]| {
                    [y[0]].into_iter().chain(x[1..].iter().copied()).collect()
                };
                let (fa, fb) = (fit(a.clone()), fit(b.clone()));
                let (sa, sb) = (fit(swap(&a, &b)), fit(swap(&b, &a)));
                assert!(fa.ok && fb.ok && sa.ok && sb.ok);
                let refits = fa.chi2 + fb.chi2 - sa.chi2 - sb.chi2;
                let first = |f: &FitOutput| [f.state[0], f.state[1], f.cov[0], f.cov[1], f.cov[2]];
                let predicted = first_hit_gain(&cuts, &hits, &first(&fa), &first(&fb), a[0], b[0]);
                let off = (predicted - refits).abs() / (1.0 + refits.abs());
                assert!(
                    off <= tol,
                    "field {field}: predicted {predicted}, refits {refits}"
                );
                worst = worst.max(off);
                gaining += (refits > MIN_GAIN as f64) as usize;
            }
            // Swaps that gain are among them, and the prediction is not exact by chance.
            assert!(gaining > 0, "field {field}");
            assert!(worst > 0.0, "field {field}");
        }
    }

    /// A kink's bending per unit q/p ([`Kink::bend`]) is what the field bends a particle's
    /// trajectory by: on three planes of the dipole map (a field along z like a Gaussian,
    /// with fringe components) and of the uniform spectrometer, the hits of trajectories
    /// propagated from the origin at several momenta and directions make kinks that q/p
    /// times the bend explains to within a few percent of the bending, where the straight
    /// chords leave it whole. The exchanged tracks' best score is then near zero, and no
    /// more than the score at any one q/p.
    #[test]
    fn a_kinks_bending_is_the_bending_of_a_trajectory_in_the_field() {
        use crate::tracking::ca::cuts::FinderConfig;
        use crate::tracking::ca::FinderGeometry;
        use crate::tracking::geometry::Detector;
        use crate::tracking::propagate::propagate_state;
        for file in [
            "fixtures/tracking/dipole/detector_dipole.toml",
            "fixtures/detector.toml",
        ] {
            let det = Detector::from_toml_file(file).expect("detector");
            let cfg = FinderConfig::from_detector(&det, 1.0);
            let geo = FinderGeometry::new(&det, &cfg);
            let cuts = ExchangeCuts::new(&geo, &cfg);
            let jb = cuts.bending.as_ref().expect("the momentum is measured");
            let o = cfg.origin_mm();
            let n = det.planes.len();
            let mut checked = 0;
            for (tx, ty) in [(0.0, 0.0), (0.12, -0.05), (-0.2, 0.15)] {
                for q in [1.0, -0.5, 0.2] {
                    let hits: Vec<HitRecord> = det
                        .planes
                        .iter()
                        .enumerate()
                        .map(|(p, plane)| {
                            let s = [o[0], o[1], tx, ty, q];
                            let s = propagate_state(&det.field, o[2], s, plane.z_mm, 5.0);
                            HitRecord {
                                x_mm: s[0] as f32,
                                y_mm: s[1] as f32,
                                z_mm: plane.z_mm as f32,
                                plane: p as u16,
                                hit_id: p as u32,
                            }
                        })
                        .collect();
                    for m in 1..n - 1 {
                        let (l, r) = (m as u32 - 1, m as u32 + 1);
                        let [kink, _] = junction_kinks(&cuts, &hits, &[l, m as u32], &[r]);
                        let k = kink.expect("a kink with hits on both sides");
                        let b = k.bend(jb);
                        let bent = (q * b[0]).hypot(q * b[1]);
                        if bent < 1e-4 {
                            continue;
                        }
                        let left = (k.k[0] - q * b[0]).hypot(k.k[1] - q * b[1]);
                        assert!(
                            left < 0.05 * bent && k.k[0].hypot(k.k[1]) > 0.5 * bent,
                            "{file}: planes {l}-{r}, ({tx}, {ty}), q/p {q}: kink {:?}, bending {:?}",
                            k.k,
                            b.map(|v| q * v)
                        );
                        let kinks = [Some(k), None];
                        let best = best_bent_score(&kinks, jb, 1.0);
                        assert!(best >= 0.0 && best <= bent_score(&kinks, jb, q, 1.0));
                        assert!(best <= bent_score(&kinks, jb, 0.5 * q, 1.0));
                        checked += 1;
                    }
                }
            }
            assert!(checked > 20, "{file}: {checked} kinks checked");
        }
    }
}
