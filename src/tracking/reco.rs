//! Track reconstruction, the public entry: [`FinderConfig`] (every cut, with defaults
//! derived from the detector and the minimum momentum, overridable from a TOML `[finder]`
//! table through [`FinderOverrides`]; defined with their derivation in
//! [`crate::tracking::ca::cuts`]) and [`Reconstructor`], which runs the
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
use crate::tracking::kalman::KalmanFitter;
use crate::tracking::track::Track;
use std::time::Instant;

pub use crate::tracking::ca::cuts::{
    ConfigError, FinderConfig, FinderOverrides, FitOverrides, Limits, MomentumCut,
};

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
    /// Exchange of segments between crossing tracks ([`ca::exchange`]).
    pub exchange_ns: u64,
    /// First hits chosen again against the origin ([`ca::first_hits`]).
    pub first_hits_ns: u64,
    /// Work counters (for throughput per step).
    pub hits: u64,
    pub doublets: u64,
    pub triplets: u64,
    pub candidates: u64,
    pub tracks: u64,
}

impl StepTimes {
    /// `(step name, nanoseconds)` in execution order.
    pub fn steps(&self) -> [(&'static str, u64); 10] {
        [
            ("hit_sorting", self.hit_sorting_ns),
            ("doublets", self.doublets_ns),
            ("triplets", self.triplets_ns),
            ("neighbours", self.neighbours_ns),
            ("evolution", self.evolution_ns),
            ("candidates", self.candidates_ns),
            ("fit", self.fit_ns),
            ("clones", self.clones_ns),
            ("exchange", self.exchange_ns),
            ("first_hits", self.first_hits_ns),
        ]
    }
    pub fn total_ns(&self) -> u64 {
        self.steps().iter().map(|s| s.1).sum()
    }
}

/// Which cuts a pass runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The configuration's.
    Main,
    /// Those of `Reconstructor::rungs[i]`.
    Rung(usize),
}

/// The cuts at a multiple of the configuration's minimum momentum, and their tables.
#[derive(Debug)]
struct Rung {
    factor: f64,
    cfg: FinderConfig,
    geo: FinderGeometry,
}

/// Track reconstruction for one detector; one per worker thread (it owns its buffers).
#[derive(Debug)]
pub struct Reconstructor {
    cfg: FinderConfig,
    geo: FinderGeometry,
    /// Cuts above the minimum momentum, by increasing factor: the stiff-track pass's
    /// ([`FinderConfig::stiff_pass`]) and those a pass that fills a buffer is run again
    /// with (2, 4, .. times the minimum momentum, [`FinderConfig::overflow_p_steps`]).
    rungs: Vec<Rung>,
    /// The stiff-track pass's rung.
    stiff: Option<usize>,
    /// The candidates' fitter ([`FinderConfig::candidate_fit`]).
    fitter: KalmanFitter,
    /// The accepted tracks' fitter where it differs from the candidates'.
    track_fitter: Option<KalmanFitter>,
    buf: CaBuffers,
    exchange_cuts: ca::exchange::ExchangeCuts,
    exchange: ca::exchange::Exchange,
    /// Per written track, its candidates' fit where the tracks' fit replaced it
    /// (`CaBuffers::candidate_fits`; empty otherwise).
    candidate_fits: Vec<ca::exchange::CandidateFit>,
    first_hit_cuts: ca::first_hits::FirstHitCuts,
    first_hits: ca::first_hits::FirstHits,
    spare: Vec<Track>,
    times: StepTimes,
    last_overflow: Overflow,
    overflow_events: u64,
    clones_removed: u64,
    below_min_p: u64,
}

impl Reconstructor {
    /// Builds the tables and reserves every buffer to its limit. The configuration should
    /// have passed [`FinderConfig::validate`]; planes beyond 64 are ignored.
    pub fn new(det: &Detector, cfg: FinderConfig) -> Self {
        let geo = FinderGeometry::new(det, &cfg);
        // Without a field and without a given momentum the candidates are fitted, ranked
        // and cut with the scattering of the momentum cut (`scatter_p_min_gev`), and the
        // accepted tracks fitted again with each one's own (`scattering_qop`,
        // `FinderConfig::track_fit`).
        let fitter = KalmanFitter::new(det, cfg.candidate_fit());
        let track_fitter = cfg.track_fit().map(|f| KalmanFitter::new(det, f));
        let buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        // The stiff-track pass's rung has its own field tables (as on the GPU); the others
        // share the configuration's, which cover their narrower slopes.
        let stiff_factor = cfg.stiff_pass(det).map(|_| cfg.stiff_pass_p_factor);
        let mut factors: Vec<f64> = (1..=cfg.overflow_p_steps.min(16))
            .map(|i| (1u32 << i) as f64)
            .chain(stiff_factor)
            .collect();
        factors.sort_by(f64::total_cmp);
        factors.dedup();
        let rungs: Vec<Rung> = factors
            .into_iter()
            .map(|factor| {
                let c = cfg.at_momentum_factor(det, factor);
                let g = if Some(factor) == stiff_factor {
                    FinderGeometry::new(det, &c).with_grid_of(&geo)
                } else {
                    FinderGeometry::sharing_field_tables(det, &c, &geo)
                };
                Rung {
                    factor,
                    cfg: c,
                    geo: g,
                }
            })
            .collect();
        let stiff = stiff_factor.and_then(|f| rungs.iter().position(|r| r.factor == f));
        let exchange_cuts = ca::exchange::ExchangeCuts::new(&geo, &cfg);
        let first_hit_cuts = ca::first_hits::FirstHitCuts::new(&geo, &cfg);
        Reconstructor {
            exchange_cuts,
            exchange: Default::default(),
            candidate_fits: Vec::new(),
            first_hit_cuts,
            first_hits: Default::default(),
            cfg,
            geo,
            rungs,
            stiff,
            fitter,
            track_fitter,
            buf,
            spare: Vec::new(),
            times: StepTimes::default(),
            last_overflow: Overflow::default(),
            overflow_events: 0,
            clones_removed: 0,
            below_min_p: 0,
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

    /// Tracks not output since construction for a fitted momentum below the minimum
    /// ([`FinderConfig::keep_tracks_below_min_p`]).
    pub fn tracks_below_min_p(&self) -> u64 {
        self.below_min_p
    }

    /// Finds and fits the tracks of one event; `out` is replaced (its `Track`s and their hit
    /// vectors are reused, so a warmed-up reconstructor does not allocate).
    pub fn reconstruct(&mut self, hits: &[HitRecord], out: &mut Vec<Track>) {
        self.find_tracks(hits);
        let t6 = Instant::now();
        self.clones_removed +=
            ca::clones::suppress_clones(&self.geo, &self.cfg, &mut self.buf) as u64;
        self.write_tracks(out);
        let t9 = Instant::now();
        // The tracks as found: their candidates' fits stand for the exchange's first fits.
        let candidate_fits =
            (self.candidate_fits.len() == out.len()).then_some(&self.candidate_fits[..]);
        self.exchange.run(
            &self.exchange_cuts,
            &self.fitter,
            self.track_fitter.as_ref(),
            hits,
            out,
            candidate_fits,
        );
        let t10 = Instant::now();
        self.choose_first_hits(hits, out);
        let t11 = Instant::now();

        let t = &mut self.times;
        t.clones_ns += (t9 - t6).as_nanos() as u64;
        t.exchange_ns += (t10 - t9).as_nanos() as u64;
        t.first_hits_ns += (t11 - t10).as_nanos() as u64;
        t.tracks += out.len() as u64;
    }

    /// The exchange step of [`Self::reconstruct`] on an event's tracks after clone
    /// suppression (as the GPU's tracks come back): [`ca::exchange`], fitting again with
    /// the candidates' fit the tracks it compares (`reconstruct` hands it the candidates'
    /// fits it kept instead). Returns the number of exchanges.
    pub fn exchange_segments(&mut self, hits: &[HitRecord], tracks: &mut [Track]) -> usize {
        self.exchange.run(
            &self.exchange_cuts,
            &self.fitter,
            self.track_fitter.as_ref(),
            hits,
            tracks,
            None,
        )
    }

    /// The step of [`Self::reconstruct`] after the exchange (as the GPU's tracks come
    /// back): [`ca::first_hits`]. Returns the number of tracks whose second hit changed
    /// plus the number whose first hit changed.
    pub fn choose_first_hits(&mut self, hits: &[HitRecord], tracks: &mut [Track]) -> usize {
        self.first_hits.run(
            &self.first_hit_cuts,
            &self.fitter,
            self.track_fitter.as_ref(),
            hits,
            tracks,
        )
    }

    /// Every step of [`Self::reconstruct`] up to clone suppression: afterwards
    /// [`Self::buffers`] holds the event's accepted tracks in acceptance order, as the
    /// clone step ([`ca::clones::mark_clones`]) and the GPU's take them.
    pub fn find_tracks(&mut self, hits: &[HitRecord]) {
        let t0 = Instant::now();
        self.buf.overflow = Overflow::default();
        ca::hit_sorting::sort_hits(&self.geo, hits, self.cfg.limits.max_hits, &mut self.buf);
        let t1 = Instant::now();
        self.times.hit_sorting_ns += (t1 - t0).as_nanos() as u64;
        let n_planes = self.geo.planes.len();
        let two_pass = self.cfg.allow_missing_plane && self.cfg.first_pass_min_hits <= n_planes;
        // Doublets over up to `max_gap_planes` missing planes in a row.
        let reach = if self.cfg.allow_missing_plane {
            1 + self.cfg.max_gap_planes
        } else {
            1
        };
        if two_pass {
            // Tracks without a gap first, on consecutive-plane doublets; then the hits
            // left, with doublets skipping planes. In a busy event each pass runs first
            // with the stiff-track cuts, then with the configuration's on the hits left.
            let to_last_plane = self.cfg.first_pass_to_last_plane;
            let first_min_hits = self.cfg.first_pass_min_hits;
            let stiff = self
                .stiff
                .filter(|_| self.buf.hits.x_mm.len() >= self.cfg.stiff_pass_min_hits);
            if let Some(r) = stiff {
                self.run_pass(Pass::Rung(r), 1, first_min_hits, to_last_plane, false);
            }
            self.run_pass(
                Pass::Main,
                1,
                first_min_hits,
                to_last_plane,
                stiff.is_some(),
            );
            if let Some(r) = stiff {
                let min_hits = self.cfg.stiff_gap_pass_min_hits();
                self.run_pass(Pass::Rung(r), reach, min_hits, false, true);
            }
            self.run_pass(Pass::Main, reach, self.cfg.min_hits, false, true);
        } else {
            self.run_pass(Pass::Main, reach, self.cfg.min_hits, false, false);
        }
        if let Some(f) = &self.track_fitter {
            let from_candidates = self.cfg.track_fit_starts_from_candidate_fit();
            ca::candidates::refit_accepted(f, &mut self.buf, from_candidates);
        }
        let t = &mut self.times;
        t.events += 1;
        t.hits += self.buf.hits.x_mm.len() as u64;
        t.candidates += self.buf.candidates.len() as u64;
        self.last_overflow = self.buf.overflow;
        if self.buf.overflow.any() {
            self.overflow_events += 1;
        }
    }

    /// The working buffers of the last event (after [`Self::find_tracks`]: the accepted
    /// tracks before clone suppression).
    pub fn buffers(&self) -> &CaBuffers {
        &self.buf
    }

    /// The finder's tables derived from the detector and the configuration.
    pub fn geometry(&self) -> &FinderGeometry {
        &self.geo
    }

    /// The rung a pass that fills a buffer is run again with: the next momentum above its
    /// own, up to `2^overflow_p_steps` times the minimum.
    fn next_rung(&self, pass: Pass) -> Option<usize> {
        let top = (1u64 << self.cfg.overflow_p_steps.min(16)) as f64;
        let from = match pass {
            Pass::Main => 0,
            Pass::Rung(r) => r + 1,
        };
        (from..self.rungs.len()).find(|&r| self.rungs[r].factor <= top)
    }

    /// [`Self::find_pass`] with the cuts of `pass`; where it fills a buffer of the doublet,
    /// triplet or neighbour steps, its search is incomplete, so it is given up before
    /// choosing candidates and run instead with the cuts of the next rung (recursively,
    /// until one fits or none is left, whose truncated search is then kept), and once more
    /// with its own cuts on the hits the stiffer tracks left, kept if it now fits.
    fn run_pass(
        &mut self,
        pass: Pass,
        reach: usize,
        min_hits: usize,
        to_last_plane: bool,
        append: bool,
    ) {
        let next = self.next_rung(pass);
        if self.find_pass(pass, reach, min_hits, to_last_plane, append, next.is_some()) {
            return;
        }
        let Some(next) = next else { return };
        self.buf.overflow.raised += 1;
        self.run_pass(Pass::Rung(next), reach, min_hits, to_last_plane, append);
        self.find_pass(pass, reach, min_hits, to_last_plane, true, true);
    }

    /// One pass of the cellular automaton (with the cuts of `pass`) on the hits not used
    /// yet: doublets on planes up to
    /// `reach` apart, triplets, neighbours, evolution, then candidates of at least
    /// `min_hits` hits (appended to the earlier pass's when `append`). With
    /// `to_last_plane` (reach 1), only chains that end on the last plane or may leave
    /// the detector before it ([`ca::triplets::prune_dead_ends`]). With
    /// `give_up_on_overflow`, a pass whose doublets, triplets or neighbours fill their
    /// buffer stops there and returns false, having chosen no candidate.
    fn find_pass(
        &mut self,
        pass: Pass,
        reach: usize,
        min_hits: usize,
        to_last_plane: bool,
        append: bool,
        give_up_on_overflow: bool,
    ) -> bool {
        let (geo, cfg) = match pass {
            Pass::Rung(r) => (&self.rungs[r].geo, &self.rungs[r].cfg),
            Pass::Main => (&self.geo, &self.cfg),
        };
        let filled = |o: &Overflow| o.doublets as u64 + o.triplets as u64 + o.neighbours as u64;
        let before = filled(&self.buf.overflow);
        let (buf, fitter, times) = (&mut self.buf, &self.fitter, &mut self.times);
        buf.stop_when_full = give_up_on_overflow;
        let t1 = Instant::now();
        let n_planes = geo.planes.len();
        // Tracks of `min_hits` hits on consecutive planes end on one of this many last planes.
        let seed_planes = (n_planes + 1).saturating_sub(min_hits.max(3));
        let dense = buf.hits.x_mm.len() >= cfg.follow_seeds_min_hits;
        // Each step after one that filled its buffer would search a truncated list.
        let gave_up = |buf: &CaBuffers| give_up_on_overflow && filled(&buf.overflow) > before;
        let t2 = if reach == 1 && cfg.follow_seeds && dense && seed_planes + 1 < n_planes {
            let kernel = ca::Kernel::detect();
            let a_planes = ca::triplets::seed_doublet_planes(n_planes, seed_planes);
            ca::doublets::find_doublets_with(kernel, geo, cfg, 1, a_planes, buf);
            let t2 = Instant::now();
            if !gave_up(buf) {
                ca::triplets::find_triplets_seeded_with(
                    kernel,
                    geo,
                    cfg,
                    seed_planes,
                    to_last_plane,
                    buf,
                );
            }
            t2
        } else {
            ca::doublets::find_doublets(geo, cfg, reach, buf);
            let t2 = Instant::now();
            if !gave_up(buf) {
                ca::triplets::find_triplets(geo, cfg, reach, buf);
                if to_last_plane && reach == 1 {
                    let first_end_plane = n_planes - seed_planes.min(n_planes);
                    ca::triplets::prune_dead_ends(geo, first_end_plane, buf);
                }
            }
            t2
        };
        let t3 = Instant::now();
        if !gave_up(buf) {
            ca::neighbours::find_neighbours(cfg, buf);
        }
        let t4 = Instant::now();
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
        if gave_up(buf) {
            times.doublets_ns += ns(t1, t2);
            times.triplets_ns += ns(t2, t3);
            times.neighbours_ns += ns(t3, t4);
            return false;
        }
        ca::evolution::evolve(buf, geo.planes.len());
        let t5 = Instant::now();
        let fit_ns = ca::candidates::extract_and_select(cfg, fitter, buf, min_hits, append);
        let t6 = Instant::now();
        let t = times;
        t.doublets_ns += ns(t1, t2);
        t.triplets_ns += ns(t2, t3);
        t.neighbours_ns += ns(t3, t4);
        t.evolution_ns += ns(t4, t5);
        // Extraction and greedy selection interleave with the fits (chunks of candidates).
        t.candidates_ns += ns(t5, t6).saturating_sub(fit_ns);
        t.fit_ns += fit_ns;
        t.doublets += buf.doublets.len() as u64;
        t.triplets += buf.triplets.len() as u64;
        true
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
        let cut = self.cfg.momentum_cut();
        let mut w = 0;
        // The candidates' fits, in acceptance order as `accepted` (whose clones are gone).
        let firsts = &self.buf.candidate_fits;
        let mut next_first = 0;
        self.candidate_fits.clear();
        for &k in &self.buf.accepted {
            let c = &self.buf.candidates[k as usize];
            let t = &mut out[w];
            self.buf.fits[c.fit as usize].write_track(t);
            if !cut.keeps(t) {
                continue;
            }
            while next_first < firsts.len() && firsts[next_first].0 != k {
                next_first += 1;
            }
            if let Some(&(_, f)) = firsts.get(next_first) {
                self.candidate_fits.push(f);
            }
            t.hits.clear();
            for &h in &self.buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
            {
                t.hits.push(self.buf.hits.input_index[h as usize]);
            }
            w += 1;
        }
        self.below_min_p += (n - w) as u64;
        while out.len() > w {
            if let Some(t) = out.pop() {
                self.spare.push(t);
            }
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
    use crate::tracking::kalman::FitConfig;
    use crate::tracking::kalman::FitHit;
    use crate::tracking::track::Track;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn fit_hits(hits: &[HitRecord], ids: &[u32]) -> Vec<FitHit> {
        ids.iter()
            .map(|&i| FitHit::from(&hits[i as usize]))
            .collect()
    }

    /// The grid's rows follow the windows: the telescope's wide pointing windows get
    /// rows several times coarser than the default on every plane searched, the
    /// spectrometer's narrow ones keep the default, and a pass at another momentum keeps
    /// the configuration's grid (its hits are sorted once). The tracks are those of a
    /// grid of the default rows on every plane, on central events of both (the stiff
    /// pass and the later passes included).
    #[test]
    fn the_grid_rows_follow_the_windows_and_change_no_track() {
        use crate::tracking::simulate::{simulate_events, Preset, SimConfig};
        for (file, coarser) in [
            ("fixtures/telescope.toml", true),
            ("fixtures/detector.toml", false),
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file))
                .expect("fixtures (tests run from the crate root)");
            let cfg = FinderConfig::from_detector(&det, 1.0);
            let geo = FinderGeometry::new(&det, &cfg);
            assert_eq!(geo.planes[0].bins_y, cfg.bins_y);
            for g in &geo.planes[1..] {
                if coarser {
                    assert!(2 * g.bins_y < cfg.bins_y, "{file}: {} rows", g.bins_y);
                } else {
                    assert_eq!(g.bins_y, cfg.bins_y, "{file}");
                }
            }
            let stiff = cfg.at_momentum_factor(&det, 3.0);
            let own = FinderGeometry::new(&det, &stiff);
            let shared = FinderGeometry::new(&det, &stiff).with_grid_of(&geo);
            assert_eq!(shared.n_bins, geo.n_bins);
            if coarser {
                assert_ne!(
                    own.n_bins, geo.n_bins,
                    "{file}: the stiff pass's own rows differ"
                );
            }
            let mut derived = Reconstructor::new(&det, cfg.clone());
            let mut fixed = Reconstructor::new(&det, cfg.clone());
            // The grid of the default rows on every plane.
            let mut uniform = FinderGeometry::new(&det, &cfg);
            uniform.set_rows(&vec![cfg.bins_y; det.planes.len()]);
            fixed.geo = fixed.geo.with_grid_of(&uniform);
            for r in fixed.rungs.iter_mut() {
                r.geo = r.geo.clone().with_grid_of(&uniform);
            }
            fixed.buf = ca::CaBuffers::with_limits(&cfg.limits, uniform.n_bins);
            let sim = SimConfig::preset(Preset::Central);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut n = 0;
            for ev in simulate_events(&det, &sim, 11, 0, 2) {
                derived.reconstruct(&ev.hits, &mut a);
                fixed.reconstruct(&ev.hits, &mut b);
                assert_eq!(a.len(), b.len(), "{file}");
                for (x, y) in a.iter().zip(&b) {
                    assert_eq!(x.hits, y.hits, "{file}");
                    assert_eq!(x.chi2.to_bits(), y.chi2.to_bits(), "{file}");
                }
                n += a.len();
            }
            assert!(n > 1000, "{file}: {n} tracks");
        }
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
        // Also with a target 80 mm long and the finder's origin as long (the back boxes
        // of the seeded search bounded per middle hit).
        for (file, n_central, to_last_plane, saving, half_z) in [
            ("fixtures/detector.toml", 2, true, 0.75, 0.0),
            ("fixtures/detector.toml", 1, false, 0.75, 0.0),
            ("fixtures/telescope.toml", 1, true, 0.75, 0.0),
            (dipole, 1, true, 1.0, 0.0),
            (dipole, 1, false, 1.0, 0.0),
            (forward, 1, true, 0.85, 0.0),
            ("fixtures/detector.toml", 1, true, 1.0, 40.0),
            (dipole, 1, true, 1.0, 40.0),
            (forward, 1, true, 1.0, 40.0),
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file))
                .expect("fixtures (tests run from the crate root)");
            let ov = FinderOverrides {
                origin_half_z_mm: Some(half_z),
                ..Default::default()
            };
            let derived = FinderConfig {
                first_pass_to_last_plane: to_last_plane,
                ..FinderConfig::from_detector_with(&det, 1.0, &ov)
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
                let mut sim = SimConfig::preset(preset);
                if half_z > 0.0 {
                    sim.target_thickness_mm = 2.0 * half_z;
                }
                for ev in simulate_events(&det, &sim, 3, 0, n) {
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
            // The seeded pass looks at a fraction of the doublets, and keeps no triplet
            // the full search does not make (upstream of the seed planes only those the
            // neighbour cut links downstream).
            let (sa, sb) = (seeded.step_times(), full.step_times());
            assert!(
                sa.triplets <= sb.triplets,
                "{file}: {} vs {}",
                sa.triplets,
                sb.triplets
            );
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
    fn tracks_fitted_below_the_minimum_momentum_are_not_output() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let keep = FinderConfig {
            keep_tracks_below_min_p: true,
            ..cfg.clone()
        };
        let mut reco = Reconstructor::new(&det, cfg);
        let mut reco_keep = Reconstructor::new(&det, keep);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (mut tracks, mut kept) = (Vec::new(), Vec::new());
        let (mut below, mut above) = (0, 0);
        for i in 0..40 {
            // Inside the windows' momentum slack (down to 1 / 1.15 GeV/c): found, and
            // measured well enough to tell 0.9 GeV/c from the minimum.
            let p = if i % 2 == 0 { 0.9 } else { 1.05 };
            let q = if i % 4 < 2 { 1.0 } else { -1.0 };
            let mut hits = Vec::new();
            let (ids, _) = track(
                &det,
                [0.0, 0.0, 0.05 * q, 0.02, q / p],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            reco.reconstruct(&hits, &mut tracks);
            reco_keep.reconstruct(&hits, &mut kept);
            assert_eq!(
                kept.len(),
                1,
                "p {p}: the finder keeping every track finds it"
            );
            assert!(kept[0].hits.iter().all(|h| ids.contains(h)) && kept[0].hits.len() >= 7);
            if p < 1.0 {
                below += 1 - tracks.len();
            } else {
                assert_eq!(tracks.len(), 1, "p {p}: above the minimum, output");
                above += 1;
            }
        }
        assert_eq!(above, 20);
        assert!(below >= 18, "{below} of 20 tracks at 0.9 GeV/c not output");
        assert_eq!(reco.tracks_below_min_p(), below as u64);
        assert_eq!(reco_keep.tracks_below_min_p(), 0);

        // Without a field no momentum is measured, and nothing is cut.
        let det0 = detector(8, [0.0; 3], 0.004, 0.016);
        let cfg0 = FinderConfig::from_detector(&det0, 1.0);
        assert_eq!(cfg0.momentum_cut().max_qop, f64::INFINITY);
        let mut reco0 = Reconstructor::new(&det0, cfg0);
        let mut hits = Vec::new();
        track(
            &det0,
            [0.0, 0.0, 0.05, 0.02, 1.0 / 0.3],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        reco0.reconstruct(&hits, &mut tracks);
        assert_eq!(tracks.len(), 1);
    }

    #[test]
    fn the_momentum_cut_counts_the_error_of_each_track() {
        let cut = MomentumCut {
            max_qop: 1.0,
            n_sigma: 3.0,
        };
        let track = |qop: f32, sigma: f32| {
            let mut t = Track::default();
            t.state.qop = qop;
            t.cov[14] = sigma * sigma;
            t
        };
        assert!(cut.keeps(&track(1.05, 0.02)), "within three errors");
        assert!(!cut.keeps(&track(-1.07, 0.02)), "beyond, either charge");
        assert!(cut.keeps(&track(0.5, 0.01)));
        assert!(cut.keeps(&track(3.0, 2.8)), "not measured: kept");
        assert!(cut.keeps(&track(f32::NAN, 0.01)));
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

    /// Where the tracks' fit replaces the candidates' (the field maps), the candidates'
    /// fits the reconstructor keeps for the exchange of segments are, bit for bit, the
    /// candidates' fit of each written track's hits: what the exchange would otherwise
    /// fit again, and not the tracks' own fits. In a uniform field none are kept (the
    /// tracks' fits are the candidates').
    #[test]
    fn the_kept_candidate_fits_are_the_candidates_fits_of_the_tracks_hits() {
        use crate::tracking::simulate::{simulate_events, Preset, SimConfig};
        for (file, kept) in [
            ("fixtures/tracking/dipole/detector_dipole.toml", true),
            ("fixtures/tracking/forward/detector_forward.toml", true),
            ("fixtures/detector.toml", false),
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file)).unwrap();
            let mut reco = Reconstructor::new(&det, FinderConfig::from_detector(&det, 1.0));
            let sim = SimConfig::preset(Preset::Central);
            for ev in simulate_events(&det, &sim, 5, 0, 1) {
                let mut out = Vec::new();
                reco.find_tracks(&ev.hits);
                ca::clones::suppress_clones(&reco.geo, &reco.cfg, &mut reco.buf);
                reco.write_tracks(&mut out);
                assert!(out.len() > 500, "{file}: {}", out.len());
                if !kept {
                    assert!(reco.candidate_fits.is_empty(), "{file}");
                    continue;
                }
                assert_eq!(reco.candidate_fits.len(), out.len(), "{file}");
                let hits: Vec<Vec<FitHit>> =
                    out.iter().map(|t| fit_hits(&ev.hits, &t.hits)).collect();
                let mut fits = vec![crate::tracking::kalman::FitOutput::default(); out.len()];
                let ids: Vec<usize> = (0..out.len()).collect();
                let hits = &hits;
                reco.fitter().fit_each(&ids, |&i| &hits[i][..], &mut fits);
                let mut own = 0;
                for (t, (f, k)) in fits.iter().zip(&reco.candidate_fits).enumerate() {
                    assert!(f.ok, "{file}: track {t}");
                    assert_eq!(ca::exchange::CandidateFit::from(f), *k, "{file}: track {t}");
                    own += usize::from(f.chi2 as f32 == out[t].chi2);
                }
                // The tracks' own fits are another fit's.
                assert!(own < out.len() / 10, "{file}: {own} of {}", out.len());
            }
        }
    }

    /// Two particles of opposite charge through one point of the middle plane: the tracks
    /// made of one's upstream and the other's downstream hits are exchanged back, and the
    /// particles' own tracks are left as they are.
    #[test]
    fn crossing_tracks_with_exchanged_segments_are_exchanged_back() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut hits = Vec::new();
        let mut shoot = |start: [f64; 5], smear: bool, hits: &mut Vec<HitRecord>| {
            track(&det, start, false, smear, &mut rng, hits)
        };
        let (pa, pb) = ([0.0, 0.0, 0.05, 0.02, 0.5], [0.0, 0.0, 0.02, 0.02, -0.5]);
        // The second one shifted in x to cross the first on plane 4.
        let dx =
            shoot(pa, false, &mut Vec::new()).1[4][0] - shoot(pb, false, &mut Vec::new()).1[4][0];
        let (a, _) = shoot(pa, true, &mut hits);
        let (b, _) = shoot([dx, 0.0, 0.02, 0.02, -0.5], true, &mut hits);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        cfg.exchange_segments = true;
        let mut reco = Reconstructor::new(&det, cfg);
        let fitted = |reco: &Reconstructor, ids: Vec<u32>| {
            let o = reco.fitter().fit_reference(&fit_hits(&hits, &ids));
            let mut t = Track {
                hits: ids,
                ..Track::default()
            };
            o.write_track(&mut t);
            t
        };
        let mixed = |u: &[u32], d: &[u32], k: usize| -> Vec<u32> {
            u[..k].iter().chain(&d[k..]).copied().collect()
        };
        for k in [4, 5] {
            let mut tracks = vec![
                fitted(&reco, mixed(&a, &b, k)),
                fitted(&reco, mixed(&b, &a, k)),
            ];
            assert_eq!(
                reco.exchange_segments(&hits, &mut tracks),
                1,
                "boundary {k}"
            );
            let mut got: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
            got.sort();
            let mut want = vec![a.clone(), b.clone()];
            want.sort();
            assert_eq!(got, want, "boundary {k}");
            for t in &tracks {
                let own = fitted(&reco, t.hits.clone());
                assert!((t.chi2 - own.chi2).abs() <= 1e-2 * (1.0 + own.chi2));
                assert!(t.chi2_ndf() < 3.0, "{}", t.chi2_ndf());
            }
        }
        let mut tracks = vec![fitted(&reco, a.clone()), fitted(&reco, b.clone())];
        let before = tracks.clone();
        assert_eq!(reco.exchange_segments(&hits, &mut tracks), 0);
        assert_eq!(tracks, before);
        // Off, nothing is exchanged.
        let mut off = Reconstructor::new(
            &det,
            FinderConfig {
                exchange_segments: false,
                ..FinderConfig::from_detector(&det, 1.0)
            },
        );
        let mut tracks = vec![
            fitted(&reco, mixed(&a, &b, 4)),
            fitted(&reco, mixed(&b, &a, 4)),
        ];
        assert_eq!(off.exchange_segments(&hits, &mut tracks), 0);
    }

    /// Thirty particles' states at the origin: slopes within 0.15, q/p 0.2-0.6 of
    /// alternating charge.
    fn origin_starts(rng: &mut ChaCha8Rng) -> Vec<[f64; 5]> {
        use rand::Rng;
        (0..30)
            .map(|k| {
                let tx: f64 = rng.random_range(-0.15..0.15);
                let ty: f64 = rng.random_range(-0.15..0.15);
                let q = if k % 2 == 0 { 1.0 } else { -1.0 };
                [0.0, 0.0, tx, ty, q * rng.random_range(0.2..0.6)]
            })
            .collect()
    }

    /// The track of hits `ids` with `reco`'s reference fit.
    fn fitted_track(reco: &Reconstructor, hits: &[HitRecord], ids: &[u32]) -> Track {
        let o = reco.fitter().fit_reference(&fit_hits(hits, ids));
        let mut t = Track {
            hits: ids.to_vec(),
            ..Track::default()
        };
        o.write_track(&mut t);
        t
    }

    /// Thirty particles from the origin, two of them close on the first plane: tracks that
    /// took each other's first hit get their own back, a track that took a nearby free hit
    /// (its own left free) gets its own back, the particles' own tracks are left as they
    /// are, and without an origin (infinite box) or switched off nothing changes.
    #[test]
    fn first_hits_taken_from_a_neighbour_are_given_back() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut hits = Vec::new();
        let mut starts = origin_starts(&mut rng);
        // Particle 1, softer than particle 0, leaves the origin in the direction that
        // brings it 0.07 mm from particle 0 in x on the first plane (then they part).
        let z0 = det.planes[0].z_mm;
        let at_z0 =
            |s: [f64; 5]| crate::tracking::propagate::propagate(&det.field, 0.0, s, z0, 20.0).0[0];
        let s0 = starts[0];
        let mut s1 = [0.0, 0.0, s0[2], s0[3], 0.6 * s0[4]];
        for _ in 0..3 {
            s1[2] += (at_z0(s0) + 0.07 - at_z0(s1)) / z0;
        }
        starts[1] = s1;
        let own: Vec<Vec<u32>> = starts
            .iter()
            .map(|&s| track(&det, s, true, true, &mut rng, &mut hits).0)
            .collect();
        // A free hit 0.1 mm from particle 2's first hit.
        let h2 = hits[own[2][0] as usize];
        let noise = hits.len() as u32;
        hits.push(HitRecord {
            x_mm: h2.x_mm + 0.1,
            hit_id: noise + 1,
            ..h2
        });
        let cfg = FinderConfig {
            first_hits_to_origin: true,
            ..FinderConfig::from_detector(&det, 1.0)
        };
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let fitted = |reco: &Reconstructor, ids: &[u32]| fitted_track(reco, &hits, ids);
        let truth: Vec<Track> = own.iter().map(|ids| fitted(&reco, ids)).collect();
        let mut tracks = truth.clone();
        assert_eq!(reco.choose_first_hits(&hits, &mut tracks), 0);
        assert_eq!(tracks, truth, "the particles' own tracks stay");
        // Swapped first hits, and a free hit taken for the own one.
        let mut mixed = own.clone();
        (mixed[0][0], mixed[1][0]) = (own[1][0], own[0][0]);
        mixed[2][0] = noise;
        let mut tracks: Vec<Track> = mixed.iter().map(|ids| fitted(&reco, ids)).collect();
        assert_eq!(reco.choose_first_hits(&hits, &mut tracks), 3);
        for (t, ids) in tracks.iter().zip(&own) {
            assert_eq!(&t.hits, ids);
        }
        // The changed tracks carry their new fits.
        for k in 0..3 {
            let want = &truth[k];
            assert!((tracks[k].chi2 - want.chi2).abs() <= 1e-2 * (1.0 + want.chi2));
            assert!((tracks[k].state.x_mm - want.state.x_mm).abs() < 1e-3);
        }
        // Without an origin, or switched off: nothing changes.
        for cfg in [
            FinderConfig {
                origin_half_x_mm: f64::INFINITY,
                origin_half_y_mm: f64::INFINITY,
                ..cfg.clone()
            },
            FinderConfig {
                first_hits_to_origin: false,
                ..cfg.clone()
            },
        ] {
            let mut reco = Reconstructor::new(&det, cfg);
            let mut tracks: Vec<Track> = mixed.iter().map(|ids| fitted(&reco, ids)).collect();
            assert_eq!(reco.choose_first_hits(&hits, &mut tracks), 0);
            assert_eq!(tracks[0].hits, mixed[0]);
        }
    }

    /// Two particles of the same momentum whose directions differ by 0.5 mrad in y (0.15
    /// mm apart on the first plane, 0.2 mm on the second): tracks that took each other's
    /// first two hits get both back where the second hits are chosen again first. The
    /// first-hit step alone leaves them: each chord runs through the other particle's
    /// second hit and points at its first.
    #[test]
    fn first_two_hits_taken_from_a_neighbour_are_given_back() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let mut hits = Vec::new();
        let mut starts = origin_starts(&mut rng);
        let s0 = [0.0, 0.0, starts[0][2], starts[0][3], 0.3];
        starts[0] = s0;
        starts[1] = [0.0, 0.0, s0[2], s0[3] + 0.15 / det.planes[0].z_mm, s0[4]];
        let own: Vec<Vec<u32>> = starts
            .iter()
            .map(|&s| track(&det, s, true, true, &mut rng, &mut hits).0)
            .collect();
        let fitted = |reco: &Reconstructor, ids: &[u32]| fitted_track(reco, &hits, ids);
        let mut mixed = own.clone();
        for i in 0..2 {
            (mixed[0][i], mixed[1][i]) = (own[1][i], own[0][i]);
        }
        let cfg = FinderConfig::from_detector(&det, 1.0);
        assert!(cfg.first_hits_to_origin && cfg.second_hits_to_origin);
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let mut tracks: Vec<Track> = mixed.iter().map(|ids| fitted(&reco, ids)).collect();
        // Both tracks' second hits, then both first hits.
        assert_eq!(reco.choose_first_hits(&hits, &mut tracks), 4);
        for (t, ids) in tracks.iter().zip(&own) {
            assert_eq!(&t.hits, ids);
        }
        let mut first_only = Reconstructor::new(
            &det,
            FinderConfig {
                second_hits_to_origin: false,
                ..cfg
            },
        );
        let mut tracks: Vec<Track> = mixed.iter().map(|ids| fitted(&first_only, ids)).collect();
        assert_eq!(first_only.choose_first_hits(&hits, &mut tracks), 0);
        assert_eq!(tracks[0].hits, mixed[0]);
        assert_eq!(tracks[1].hits, mixed[1]);
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

    /// A particle that misses two planes in a row (3 and 4 of 8) is found whole with
    /// doublets over two missing planes; with `max_gap_planes = 1` it falls into two pieces
    /// of three hits, neither a track.
    #[test]
    fn track_missing_two_planes_in_a_row_is_found_whole() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut hits = Vec::new();
        let (a, _) = track(
            &det,
            [0.0, 0.0, 0.08, 0.03, 1.0 / 3.0],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let (b, _) = track(
            &det,
            [0.1, 0.0, -0.06, -0.04, -1.0 / 2.0],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        // Drop b's hits on planes 3 and 4, renumbering the hits after them.
        let drop = [b[3], b[4]];
        let keep: Vec<u32> = (0..hits.len() as u32)
            .filter(|h| !drop.contains(h))
            .collect();
        let renumber = |h: u32| keep.iter().position(|&k| k == h).unwrap() as u32;
        let hits: Vec<_> = keep.iter().map(|&h| hits[h as usize]).collect();
        let a: Vec<u32> = a.iter().map(|&h| renumber(h)).collect();
        let b: Vec<u32> = b
            .iter()
            .filter(|h| !drop.contains(h))
            .map(|&h| renumber(h))
            .collect();
        assert_eq!(b.len(), 6);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        assert_eq!(cfg.max_gap_planes, 2);
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let mut tracks = Vec::new();
        reco.reconstruct(&hits, &mut tracks);
        let mut found: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
        found.sort();
        let mut want = vec![a.clone(), b];
        want.sort();
        assert_eq!(found, want);
        let one = FinderConfig {
            max_gap_planes: 1,
            ..cfg
        };
        let mut reco = Reconstructor::new(&det, one);
        reco.reconstruct(&hits, &mut tracks);
        let found: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
        assert_eq!(found, vec![a]);
    }

    /// The stiff-track pass runs with every momentum-dependent window derived at its
    /// momentum (narrower bending and slope limits), everything else kept; none below a
    /// factor above 1.
    #[test]
    fn the_stiff_pass_narrows_the_momentum_windows_and_keeps_the_other_cuts() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let ov = FinderOverrides::from_toml_str("n_sigma = 5.0\nmin_hits = 5\n").unwrap();
        let cfg = FinderConfig::from_detector_with(&det, 0.5, &ov);
        assert_eq!(cfg.stiff_pass_p_factor, 3.0);
        let stiff = cfg.stiff_pass(&det).expect("a stiff-track pass by default");
        assert_eq!(stiff.min_p_gev, 1.5);
        assert_eq!((stiff.n_sigma, stiff.min_hits), (5.0, 5));
        assert_eq!(stiff.first_pass_min_hits, cfg.first_pass_min_hits);
        assert_eq!(stiff.stiff_pass_p_factor, 0.0);
        assert!(stiff.stiff_pass(&det).is_none());
        // By bends in x: a third of the curvature bound (at most: the slope limits, on
        // which the curvature of an inclined track depends, shrink too).
        let third = cfg.max_curvature_x_per_mm / 3.0;
        assert!(
            stiff.max_curvature_x_per_mm <= third * (1.0 + 1e-9)
                && stiff.max_curvature_x_per_mm > 0.0,
            "{} vs {third}",
            stiff.max_curvature_x_per_mm
        );
        assert!(stiff.max_tx < cfg.max_tx && stiff.max_ty <= cfg.max_ty);
        assert!(stiff.slope_factor <= cfg.slope_factor);
        let (g, gs) = (
            FinderGeometry::new(&det, &cfg),
            FinderGeometry::new(&det, &stiff),
        );
        for (a, b) in g.planes.iter().zip(&gs.planes) {
            // Scattering at three times the momentum: a ninth of the variance (a little
            // more: the pion's velocity is closer to c).
            let r = b.theta2_min_p * 9.0 / a.theta2_min_p;
            assert!(r < 1.0 && r > 0.9, "{r}");
        }
        for k in [1.0, 0.0, 0.5] {
            let one = FinderConfig {
                stiff_pass_p_factor: k,
                ..cfg.clone()
            };
            assert!(one.stiff_pass(&det).is_none());
            assert!(one.validate(&det).is_ok());
        }
        for k in [f64::NAN, -2.0] {
            let bad = FinderConfig {
                stiff_pass_p_factor: k,
                ..cfg.clone()
            };
            assert!(matches!(
                bad.validate(&det),
                Err(ConfigError::Invalid {
                    field: "stiff_pass_p_factor",
                    ..
                })
            ));
        }
        let off = FinderOverrides::from_toml_str("stiff_pass_p_factor = 0").unwrap();
        let c = FinderConfig::from_detector_with(&det, 0.5, &off);
        assert!(c.stiff_pass(&det).is_none());
    }

    /// The fit's spectrum without a field (`[finder.fit] scatter_prior`) is read from the
    /// configuration, and one that is not 16 finite non-negative weights with a positive
    /// sum is refused with its name.
    #[test]
    fn a_configured_spectrum_is_read_and_a_wrong_one_refused() {
        let det = detector(6, [0.0; 3], 0.01, 0.02);
        let w: Vec<String> = (1..=16).map(|g| format!("{g}.0")).collect();
        let good =
            FinderOverrides::from_toml_str(&format!("[fit]\nscatter_prior = [{}]", w.join(", ")))
                .unwrap();
        let c = FinderConfig::from_detector_with(&det, 1.0, &good);
        assert!(c.validate(&det).is_ok());
        let weights = c.fit.scatter_weights();
        assert!((weights[15] / weights[0] - 16.0).abs() < 1e-12);
        for bad in [
            "[fit]\nscatter_prior = [1.0, 2.0]",
            "[fit]\nscatter_prior = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
            "[fit]\nscatter_prior = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0]",
        ] {
            let ov = FinderOverrides::from_toml_str(bad).unwrap();
            let e = FinderConfig::from_detector_with(&det, 1.0, &ov).validate(&det);
            assert!(
                matches!(e, Err(ConfigError::Invalid { field: "fit", ref reason }) if reason.contains("scatter_prior")),
                "{bad}: {e:?}"
            );
        }
    }

    /// A soft track, bent beyond the stiff-track pass's windows, is found by the pass at
    /// the minimum momentum on the hits the stiff tracks left; the stiff tracks are found
    /// as without the stiff pass.
    #[test]
    fn a_soft_track_is_found_on_the_hits_the_stiff_pass_leaves() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        let mut hits = Vec::new();
        let mut want = Vec::new();
        for start in [
            [0.0, 0.0, 0.08, 0.03, 1.0 / 5.0],
            [0.1, 0.0, -0.06, -0.04, -1.0 / 3.0],
            [0.0, 0.1, 0.02, 0.05, -1.0 / 0.8],
        ] {
            want.push(track(&det, start, true, true, &mut rng, &mut hits).0);
        }
        let soft = want[2].clone();
        want.sort();
        let cfg = FinderConfig::from_detector(&det, 0.5);
        let stiff = cfg.stiff_pass(&det).expect("stiff pass");
        let find = |cfg: FinderConfig| {
            let mut reco = Reconstructor::new(&det, cfg);
            let mut tracks = Vec::new();
            reco.reconstruct(&hits, &mut tracks);
            let mut found: Vec<Vec<u32>> = tracks.iter().map(|t| t.hits.clone()).collect();
            found.sort();
            found
        };
        let one = FinderConfig {
            stiff_pass_p_factor: 0.0,
            ..cfg.clone()
        };
        assert_eq!(find(one), want);
        assert_eq!(find(cfg), want);
        // The stiff-track cuts alone do not take the soft track.
        let alone = find(stiff);
        assert!(!alone.contains(&soft), "{alone:?}");
        assert_eq!(alone.len(), 2);
    }

    /// In a busy event the later pass over missing planes also takes the stiff tracks
    /// first: a stiff track with a gap that leaves before the last plane (7 of 9 hits) is
    /// accepted before a longer soft one with a gap (8 hits; longest first would take the
    /// soft one first), and both are found whole, as without the stiff-track cuts.
    #[test]
    fn the_later_pass_takes_the_stiff_tracks_with_a_gap_first() {
        let det = detector(9, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(29);
        let mut hits: Vec<HitRecord> = Vec::new();
        let mut want = Vec::new();
        for (start, gaps) in [
            ([0.0, 0.0, 0.06, 0.03, 1.0 / 6.0], &[2u16, 8][..]),
            ([0.1, 0.0, -0.05, -0.04, -1.0 / 0.8], &[4u16][..]),
        ] {
            let mut own = Vec::new();
            track(&det, start, true, true, &mut rng, &mut own);
            let mut ids = Vec::new();
            for h in own.into_iter().filter(|h| !gaps.contains(&h.plane)) {
                ids.push(hits.len() as u32);
                hits.push(h);
            }
            want.push(ids);
        }
        let cfg = FinderConfig {
            stiff_pass_min_hits: 0,
            ..FinderConfig::from_detector(&det, 0.5)
        };
        assert_eq!(cfg.first_pass_min_hits, 8);
        assert_eq!(cfg.stiff_gap_pass_min_hits(), 7);
        let find = |cfg: FinderConfig| {
            let mut reco = Reconstructor::new(&det, cfg);
            let mut tracks = Vec::new();
            reco.reconstruct(&hits, &mut tracks);
            tracks.iter().map(|t| t.hits.clone()).collect::<Vec<_>>()
        };
        // Acceptance order: the stiff track first.
        assert_eq!(find(cfg.clone()), want);
        // At the minimum momentum alone, the longer track first.
        let one = FinderConfig {
            stiff_pass_p_factor: 0.0,
            ..cfg
        };
        let (stiff, soft) = (want[0].clone(), want[1].clone());
        assert_eq!(find(one), vec![soft, stiff]);
    }

    #[test]
    fn without_a_field_the_fit_estimates_each_momentum_unless_one_is_given() {
        let det = detector(6, [0.0; 3], 0.01, 0.01);
        // Derived: the estimate from the momentum cut (over its slack) up, and the
        // chi-square cut of a fit that measures the momentum.
        let c = FinderConfig::from_detector(&det, 1.0);
        assert!(!c.fit.fit_momentum);
        assert_eq!(c.fit.p_no_field_gev, None);
        assert!((c.fit.scatter_p_min_gev - 1.0 / c.momentum_slack).abs() < 1e-12);
        assert_eq!(c.max_chi2_ndf, 5.0);
        assert!(c.validate(&det).is_ok());
        // A test beam's momentum: every track's, and the cut widens for the tracks at the
        // momentum cut, which scatter more than the assumed momentum.
        let ov = FinderOverrides::from_toml_str("[fit]\np_no_field_gev = 5.0\n").unwrap();
        let beam = FinderConfig::from_detector_with(&det, 1.0, &ov);
        assert_eq!(beam.fit.p_no_field_gev, Some(5.0));
        let scale = ca::cuts::no_field_chi2_scale(&det, 1.0, 5.0);
        assert!(scale > 2.0, "{scale}");
        assert!((beam.max_chi2_ndf - 5.0 * scale).abs() < 1e-9);
        // An explicit cut stays.
        let ov =
            FinderOverrides::from_toml_str("max_chi2_ndf = 7.0\n[fit]\np_no_field_gev = 5.0\n")
                .unwrap();
        assert_eq!(
            FinderConfig::from_detector_with(&det, 1.0, &ov).max_chi2_ndf,
            7.0
        );
        let bad = FinderOverrides::from_toml_str("[fit]\np_no_field_gev = -1.0\n").unwrap();
        assert!(FinderConfig::from_detector_with(&det, 1.0, &bad)
            .validate(&det)
            .is_err());
        // The origin's centre: within the planes' extent, and the slope limits seen from it.
        let ov =
            FinderOverrides::from_toml_str("origin_x_mm = 20.0\norigin_y_mm = -5.0\n").unwrap();
        let off = FinderConfig::from_detector_with(&det, 1.0, &ov);
        assert_eq!(off.origin_mm(), [20.0, -5.0, 0.0]);
        assert!(off.validate(&det).is_ok());
        assert!(off.max_tx > c.max_tx && off.max_ty > c.max_ty);
        for far in [
            "origin_x_mm = 1e3\n",
            "origin_y_mm = -1e300\n",
            "origin_z_mm = inf\n",
            "origin_half_z_mm = inf\n",
            "origin_half_z_mm = -1.0\n",
        ] {
            let ov = FinderOverrides::from_toml_str(far).unwrap();
            let e = FinderConfig::from_detector_with(&det, 1.0, &ov).validate(&det);
            assert!(e.is_err(), "{far}");
        }
        // A long origin: the slope limits seen from its downstream end, the stiff pass's
        // too.
        let ov = FinderOverrides::from_toml_str("origin_half_z_mm = 50.0\n").unwrap();
        let long = FinderConfig::from_detector_with(&det, 1.0, &ov);
        assert!(long.validate(&det).is_ok());
        assert_eq!(long.slope_origin_mm(), [0.0, 0.0, 50.0]);
        assert!(long.max_tx > c.max_tx && long.max_ty > c.max_ty);
        let (s_long, s) = (long.stiff_pass(&det).unwrap(), c.stiff_pass(&det).unwrap());
        assert!(s_long.max_tx > s.max_tx, "{} {}", s_long.max_tx, s.max_tx);
        // The fitter takes the two paths apart: each track's own q/p against one for all.
        let fit = |cfg: &FinderConfig| {
            let f = KalmanFitter::new(&det, cfg.fit.clone());
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let mut hits: Vec<HitRecord> = Vec::new();
            let (ids, _) = track(
                &det,
                [0.0, 0.0, 0.05, 0.02, 1.0 / 1.2],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            f.fit_reference(&fit_hits(&hits, &ids))
        };
        assert!((fit(&beam).state[4] - 0.2).abs() < 1e-6);
        let own = fit(&c).state[4];
        assert!(own > 0.2 && own <= c.momentum_slack, "{own}");
        // The candidates are fitted at the momentum cut's scattering, the tracks written
        // with their own: a stiff track's q/p is well below the cut's.
        assert_eq!(
            c.candidate_fit().p_no_field_gev,
            Some(c.fit.scatter_p_min_gev)
        );
        assert_eq!(beam.candidate_fit(), beam.fit);
        let mut reco = Reconstructor::new(&det, c.clone());
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut hits: Vec<HitRecord> = Vec::new();
        for k in 0..6 {
            let t = [
                0.3 * k as f64,
                -0.2,
                0.02 * k as f64 - 0.05,
                0.01,
                1.0 / 20.0,
            ];
            track(&det, t, true, true, &mut rng, &mut hits);
        }
        let mut out = Vec::new();
        reco.reconstruct(&hits, &mut out);
        assert_eq!(out.len(), 6);
        for t in &out {
            assert!(
                t.state.qop > 0.0 && (t.state.qop as f64) < 0.5 * c.qop_max(),
                "{t:?}"
            );
        }
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

    /// A central event whose combinations at the minimum momentum fill the triplet buffer:
    /// its passes run again with the windows of twice (four times, ..) the momentum, and
    /// the particles above the highest momentum they need are found as in the full search.
    /// Keeping the truncated search instead (`overflow_p_steps = 0`) loses many of them.
    #[test]
    fn a_pass_that_fills_a_buffer_runs_again_at_a_higher_momentum() {
        use crate::tracking::eval::{EvalConfig, Evaluator};
        use crate::tracking::simulate::{simulate_events, Preset, SimConfig};
        let det = Detector::from_toml_file(std::path::Path::new("fixtures/detector.toml")).unwrap();
        let events: Vec<_> =
            simulate_events(&det, &SimConfig::preset(Preset::Central), 11, 0, 2).collect();
        let run = |max_triplets: Option<usize>, steps: usize| {
            let mut cfg = FinderConfig::from_detector(&det, 0.5);
            cfg.overflow_p_steps = steps;
            if let Some(m) = max_triplets {
                cfg.limits.max_triplets = m;
            }
            let mut reco = Reconstructor::new(&det, cfg);
            // Above 16 times the minimum momentum: found whatever rung the passes end on.
            let mut eval = Evaluator::new(
                EvalConfig {
                    min_p_gev: 8.0,
                    ..EvalConfig::default()
                },
                Some(&det),
            );
            let (mut raised, mut most_triplets) = (0, 0);
            for ev in &events {
                let mut tracks = Vec::new();
                reco.reset_step_times();
                reco.reconstruct(&ev.hits, &mut tracks);
                raised += reco.last_overflow().raised;
                most_triplets = most_triplets.max(reco.step_times().triplets);
                eval.add_event(
                    ev.event_id,
                    &ev.hits,
                    &ev.truth,
                    Some(&ev.particles),
                    &tracks,
                )
                .unwrap();
            }
            (eval.finish(), raised, most_triplets, reco.overflow_events())
        };
        let (full, raised, triplets, overflows) = run(None, 4);
        assert_eq!((raised, overflows), (0, 0));
        // A quarter of the triplets all passes of an event made together: the busiest
        // pass fills it.
        let limit = triplets as usize / 4;
        let (ladder, raised, _, overflows) = run(Some(limit), 4);
        let (truncated, _, _, _) = run(Some(limit), 0);
        eprintln!(
            "limit {limit}: full {:.4} ({} ghosts), raised {raised} times {:.4} ({} ghosts), truncated {:.4} ({} ghosts)",
            full.efficiency, full.n_ghosts, ladder.efficiency, ladder.n_ghosts, truncated.efficiency, truncated.n_ghosts
        );
        assert_eq!(overflows, 2);
        assert!(raised >= 2, "raised {raised}");
        assert!(full.n_reconstructable > 300, "{}", full.n_reconstructable);
        assert!(
            ladder.efficiency >= full.efficiency - 0.01,
            "{} against {}",
            ladder.efficiency,
            full.efficiency
        );
        assert!(ladder.ghost_rate <= full.ghost_rate + 0.01);
        assert!(
            truncated.efficiency < ladder.efficiency - 0.05,
            "truncated {} raised {}",
            truncated.efficiency,
            ladder.efficiency
        );
    }
}
