//! Tracking on the GPU, end to end: [`GpuTracker`] finds and fits the tracks of a batch of
//! events as the CPU's [`crate::tracking::reco::Reconstructor`] does for each, with every
//! step on the device:
//!
//! 1. the first pass ([`GpuCaEngine::run_first`]): hits up once and sorted into the grid,
//!    doublets on consecutive planes, triplets, the dead ends dropped where the finder
//!    keeps only chains that reach the last plane or leave the detector, neighbours,
//!    evolution; then the candidates of at least `first_pass_min_hits` hits, fitted and
//!    chosen with each hit used once ([`GpuCaEngine::select_candidates`]); with the
//!    stiff-track cuts first ([`FinderConfig::stiff_pass`], their own tables), then again
//!    with the configuration's on the hits left ([`GpuCaEngine::run_pass`]), as the CPU;
//! 2. the later pass over missing planes on the hits the first left
//!    ([`GpuCaEngine::run_pass`]), its candidates appended; where the first pass ran
//!    with the stiff-track cuts, this one does too, first, for the stiff tracks with a
//!    gap ([`FinderConfig::stiff_gap_pass_min_hits`]);
//! 3. the accepted tracks packed on the device, one event after the other
//!    ([`GpuCaEngine::read_tracks`]), clone suppression ([`GpuCloneEngine`]) on them in
//!    place, and the tracks (hits as the event's input indices, fitted state,
//!    covariance, chi-square) and clone marks back to the host in one copy per array,
//!    where the tracks fitted below the minimum momentum are dropped as the CPU drops
//!    them ([`FinderConfig::keep_tracks_below_min_p`]) and the trigger lines run on the
//!    tracks kept;
//! 4. where the configuration asks for it ([`FinderConfig::exchange_segments`]), the
//!    exchange of segments between crossing tracks, on the device on the packed tracks
//!    after the clone step and the momentum cut, a sequence of kernels over the launch's
//!    events ([`GpuCaEngine::set_exchange`], `kernels/ca_exchange.cu`: the CPU finder's step,
//!    [`crate::tracking::ca::exchange`], in the same arithmetic; an event beyond its
//!    limits is handed back as `exchange`); on the host with the CPU's own step where
//!    there is no clone step on the device;
//! 5. where the origin is finite and the configuration asks for it
//!    ([`FinderConfig::first_hits_to_origin`], on by default), each track's second hit
//!    (where [`FinderConfig::second_hits_to_origin`] asks for it) and then its first hit
//!    chosen again against the origin and its own next hits, as the CPU does after the
//!    exchange ([`crate::tracking::ca::first_hits`]): on the device,
//!    on the packed tracks after the exchange, before they come back
//!    ([`GpuCaEngine::set_first_hits`], one block per event; an event beyond its limits is
//!    handed back as `first_hits`); where the exchange runs on the host, on the host
//!    after it with the CPU finder's own step.
//!
//! A finder configured for one pass (no missing plane allowed, or a first pass that could
//! not make a track) runs step 1 with the pass's reach and `min_hits`, as the CPU.
//!
//! An event the device cannot take whole (a step's per-event limit, where the CPU would
//! overflow too, or the batch's arena) is marked in the result with the step's name and
//! none of its tracks are returned: the caller runs it on the CPU and counts it
//! (`trigd_tracking_overflow_total{step}`). A device error fails the whole batch
//! ([`GpuError`]); the engines stay usable for the next one.

use crate::frame::HitRecord;
use crate::gpu::nvrtc::KernelCache;
pub use crate::gpu::tracking_ca::CandidateBlocks;
use crate::gpu::tracking_ca::{
    BatchTracks, CaLimits, CaTables, GpuCaEngine, PassOptions, EXCHANGE_MAX_PLANES,
    FIRST_HIT_MAX_PLANES,
};
use crate::gpu::tracking_clones::{CloneEngineConfig, CloneLimits, GpuCloneEngine};
use crate::gpu::{GpuDevice, GpuError};
use crate::tracking::ca::cuts::MomentumCut;
use crate::tracking::ca::exchange::{Exchange, ExchangeCuts};
use crate::tracking::ca::first_hits::{FirstHitCuts, FirstHits};
use crate::tracking::ca::{FinderGeometry, MAX_REACH};
use crate::tracking::geometry::Detector;
use crate::tracking::kalman::KalmanFitter;
use crate::tracking::reco::FinderConfig;
use crate::tracking::track::Track;

/// Tracks of a launch from which they are written on several host threads.
const WRITE_THREADS_FROM_TRACKS: usize = 16_384;

/// The sizes a tracker is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerLimits {
    /// Events per launch.
    pub max_events: usize,
    /// Hits of all the launch's events together.
    pub max_hits: usize,
    /// The arenas of the steps.
    pub ca: CaLimits,
}

impl TrackerLimits {
    /// Arenas for launches of up to `max_events` events (at most 512).
    ///
    /// A full launch gets those of [`CaLimits::default`] with twice the doublets,
    /// triplets and neighbour links (the later pass over missing planes makes more
    /// doublets per event than the first: 128 central events of the dipole spectrometer
    /// need some 17 Mi), about 6.2 GiB: room for some 240 central events, half the
    /// launch. A smaller launch gets the part of them that four times its events would
    /// have in a full launch, at least an eighth (the part of 64 events): room for
    /// nearly twice its events, all central, so that a GPU holds many trackers of small
    /// launches (those of a short deadline). An event beyond what is left is handed back.
    pub fn for_batch(_cfg: &FinderConfig, max_events: usize) -> Self {
        const FULL: usize = 512;
        let d = CaLimits::default();
        let max_events = max_events.clamp(1, FULL);
        let part = (4 * max_events).clamp(FULL / 8, FULL);
        let scale = |v: usize| (v / FULL) * part;
        let ca = CaLimits {
            max_events,
            max_hits: scale(d.max_hits),
            max_doublets: scale(2 * d.max_doublets),
            max_triplets: scale(2 * d.max_triplets),
            max_neighbours: scale(2 * d.max_neighbours),
            max_candidates: scale(d.max_candidates),
            max_candidate_hits: scale(d.max_candidate_hits),
            max_chain_hits: scale(d.max_chain_hits),
        };
        TrackerLimits {
            max_events: ca.max_events,
            max_hits: ca.max_hits,
            ca,
        }
    }
}

/// Wall time of each stage of the last launch, milliseconds (each stage ends with the
/// stream synchronised).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrackerTimes {
    /// Hits up, sorted, and the first pass's steps (the stiff-track pass's included).
    pub first_pass_ms: f64,
    pub first_candidates_ms: f64,
    pub later_pass_ms: f64,
    pub later_candidates_ms: f64,
    /// The accepted tracks packed, their clones marked (on the device), both back to the
    /// host.
    pub readback_ms: f64,
    /// The caller's tracks written from them.
    pub write_ms: f64,
    /// Of the stages' time, the host's in the driver's launches of the finder's kernels
    /// (the clone step's few not counted), and their number: where several trackers share
    /// a device, their launches wait for each other in the driver.
    pub enqueue_ms: f64,
    pub kernels: u32,
}

/// How the CPU finder runs its passes, from its configuration (as
/// `Reconstructor::reconstruct`).
#[derive(Debug, Clone, Copy)]
struct Passes {
    two_pass: bool,
    /// The first pass runs first with the stiff-track cuts
    /// ([`FinderConfig::stiff_pass`]; two passes only, set by the tracker): the engine's
    /// pass 0, in events of at least `stiff_min_hits` sorted hits.
    stiff: bool,
    stiff_min_hits: usize,
    /// Fewest hits of the stiff tracks of the later pass (its stiff-track run, the
    /// engine's pass 2, where `stiff`).
    stiff_gap_min_hits: usize,
    first_min_hits: usize,
    min_hits: usize,
    /// The first pass keeps only chains that can end (dead ends dropped from this plane).
    dead_ends_from: Option<usize>,
    /// Reach of the single pass, or of the later pass.
    reach: usize,
}

impl Passes {
    fn new(cfg: &FinderConfig, n_planes: usize) -> Self {
        let two_pass = cfg.allow_missing_plane && cfg.first_pass_min_hits <= n_planes;
        let reach = if cfg.allow_missing_plane {
            (1 + cfg.max_gap_planes).min(MAX_REACH)
        } else {
            1
        };
        let seed_planes = (n_planes + 1).saturating_sub(cfg.first_pass_min_hits.max(3));
        let dead_ends_from = (two_pass && cfg.first_pass_to_last_plane)
            .then(|| n_planes - seed_planes.min(n_planes));
        Passes {
            two_pass,
            stiff: false,
            stiff_min_hits: cfg.stiff_pass_min_hits,
            stiff_gap_min_hits: cfg.stiff_gap_pass_min_hits(),
            first_min_hits: cfg.first_pass_min_hits,
            min_hits: cfg.min_hits,
            dead_ends_from,
            reach,
        }
    }
}

/// The finder and fitter on one GPU. See the module documentation.
pub struct GpuTracker {
    ca: GpuCaEngine,
    clones: Option<GpuCloneEngine>,
    passes: Passes,
    limits: TrackerLimits,
    /// The accepted tracks of the last launch and their clone marks.
    batch: BatchTracks,
    times: TrackerTimes,
    /// The tracks output: those not measured below the minimum momentum, as the CPU.
    momentum_cut: MomentumCut,
    /// The steps after clone suppression where the configuration asks for them (the
    /// exchange of segments, the first hits against the origin): run on the host on the
    /// tracks that come back, with the CPU finder's own steps, cuts and fitters.
    host_steps: Option<HostSteps>,
}

/// What the host needs to run [`crate::tracking::ca::exchange`] and
/// [`crate::tracking::ca::first_hits`] on a launch's tracks.
struct HostSteps {
    exchange: Option<ExchangeCuts>,
    first_hits: Option<FirstHitCuts>,
    fitter: KalmanFitter,
    track_fitter: Option<KalmanFitter>,
}

impl GpuTracker {
    /// Uploads the finder's tables, compiles the kernels and allocates every arena.
    pub fn new(
        device: &GpuDevice,
        det: &Detector,
        cfg: &FinderConfig,
        limits: TrackerLimits,
    ) -> Result<Self, GpuError> {
        let geo = FinderGeometry::new(det, cfg);
        let fitter = KalmanFitter::new(det, cfg.candidate_fit());
        let n_planes = det.planes.len();
        let mut passes = Passes::new(cfg, n_planes);
        let stiff = cfg.stiff_pass(det).filter(|_| passes.two_pass);
        passes.stiff = stiff.is_some();
        // The engine's passes, as the CPU runs them: the stiff-track pass (its own cuts
        // and tables), the configuration's first pass, the stiff-track run of the later
        // pass, and the later pass.
        let mut tables = Vec::new();
        let stiff_geo = stiff
            .as_ref()
            .map(|s| FinderGeometry::new(det, s).with_grid_of(&geo));
        if let (Some(s), Some(g)) = (&stiff, &stiff_geo) {
            let t = CaTables::new(g, s, 1);
            tables.push(t.for_events_of(cfg.stiff_pass_min_hits));
        }
        if passes.two_pass {
            tables.push(CaTables::new(&geo, cfg, 1));
        }
        if let (Some(s), Some(g)) = (&stiff, &stiff_geo) {
            let t = CaTables::new(g, s, passes.reach);
            tables.push(t.for_events_of(cfg.stiff_pass_min_hits));
        }
        tables.push(CaTables::new(&geo, cfg, passes.reach));
        let cache = KernelCache::from_env();
        let mut ca = GpuCaEngine::with_tables(device, tables, Some(&fitter), limits.ca, &cache)?;
        let track_fitter = cfg.track_fit().map(|f| KalmanFitter::new(det, f));
        if let Some(f) = &track_fitter {
            ca.set_track_fitter(f, cfg.track_fit_starts_from_candidate_fit())?;
        }
        // Clone suppression compares short tracks (at most n - 3 hits) with longer ones.
        let clones = if n_planes >= 4 {
            Some(GpuCloneEngine::new(
                device,
                &geo,
                cfg,
                CloneEngineConfig {
                    // It compares the tracks packed on the device: as many as the
                    // candidate arenas hold.
                    limits: CloneLimits {
                        max_events: limits.max_events,
                        max_tracks_per_event: limits.ca.max_candidates.div_ceil(limits.max_events),
                        max_hits_per_track: n_planes,
                    },
                    cache,
                    host_batches: false,
                },
            )?)
        } else {
            None
        };
        let host_steps = {
            let mut exchange = ExchangeCuts::new(&geo, cfg);
            let mut first_hits = FirstHitCuts::new(&geo, cfg);
            // The steps after the clone step on the device where it runs there: the
            // exchange of segments first (it applies the momentum cut), then the first
            // hits, each where nothing the host does comes before it.
            let on_device = clones.is_some();
            if exchange.enabled && on_device && n_planes <= EXCHANGE_MAX_PLANES {
                ca.set_exchange(&exchange, cfg.momentum_cut())?;
                exchange.enabled = false;
            }
            if first_hits.enabled
                && !exchange.enabled
                && on_device
                && n_planes <= FIRST_HIT_MAX_PLANES
            {
                // After the exchange on the device the tracks below the minimum momentum
                // are marked already: the first-hit step must not cut the exchanged
                // tracks again (the CPU cuts before the exchange).
                let cut = if ca.exchange_on_device() {
                    MomentumCut {
                        max_qop: f64::INFINITY,
                        ..cfg.momentum_cut()
                    }
                } else {
                    cfg.momentum_cut()
                };
                ca.set_first_hits(&first_hits, cut)?;
                first_hits.enabled = false;
            }
            (exchange.enabled || first_hits.enabled).then(|| HostSteps {
                exchange: exchange.enabled.then_some(exchange),
                first_hits: first_hits.enabled.then_some(first_hits),
                fitter,
                track_fitter,
            })
        };
        Ok(GpuTracker {
            ca,
            clones,
            passes,
            limits,
            batch: BatchTracks::default(),
            times: TrackerTimes::default(),
            momentum_cut: cfg.momentum_cut(),
            host_steps,
        })
    }

    /// Host threads that lay a launch's hits out and write its tracks when it has many
    /// (default: the host's cores, at most 8). Several trackers on one host share its
    /// cores: give each its share.
    pub fn set_write_threads(&mut self, threads: usize) {
        self.ca.set_host_threads(threads);
    }

    /// Whether the steps of a pass and the candidate step are recorded once per batch
    /// size as CUDA graphs and replayed (default), or each kernel launched; the tracks
    /// are the same either way.
    pub fn set_graphs(&mut self, on: bool) {
        self.ca.set_graphs(on);
    }

    /// The sequences of launches recorded as CUDA graphs so far (none where graphs are
    /// off or a recording failed).
    pub fn recorded_graphs(&self) -> usize {
        self.ca.recorded_graphs()
    }

    /// The blocks the candidate step runs in (default: chosen per launch,
    /// [`CandidateBlocks::Auto`]; the tracks are the same in any).
    pub fn set_candidate_blocks(&mut self, blocks: CandidateBlocks) {
        self.ca.set_candidate_blocks(blocks);
    }

    pub fn limits(&self) -> TrackerLimits {
        self.limits
    }

    /// The stages' times of the last launch.
    pub fn last_times(&self) -> TrackerTimes {
        self.times
    }

    /// Whether the first hits are chosen again against the origin on the device (where
    /// the configuration asks for the step, without the exchange of segments).
    pub fn first_hits_on_device(&self) -> bool {
        self.ca.first_hits_on_device()
    }

    /// Whether the segments of crossing tracks are exchanged on the device (where the
    /// configuration asks for the step and the clone step runs there).
    pub fn exchange_on_device(&self) -> bool {
        self.ca.exchange_on_device()
    }

    /// Test hook: the exchange step on the device takes at most `per_event` pairs of
    /// tracks per event (so that busy events are handed back).
    pub fn limit_exchange_pairs(&mut self, per_event: usize) {
        self.ca.limit_exchange_pairs(per_event);
    }

    /// Test hook: the first-hit step on the device takes at most `per_event` pairs of
    /// track and hit per event (so that busy events are handed back).
    pub fn limit_first_hit_pairs(&mut self, per_event: usize) {
        self.ca.limit_first_hit_pairs(per_event);
    }

    /// Test hook: the next batch fails as a device error would.
    pub fn inject_device_error(&mut self) {
        self.ca.inject_device_error();
    }

    /// Finds and fits the tracks of `events`: `out[e]` holds event `e`'s tracks as
    /// [`crate::tracking::reco::Reconstructor::reconstruct`] writes them, and `back[e]`
    /// the step at which the event left the device (its tracks then empty: run it on the
    /// CPU), or `None`.
    // Events index the summary, the accepted tracks, `out` and `back` in lockstep.
    #[allow(clippy::needless_range_loop)]
    pub fn reconstruct_batch(
        &mut self,
        events: &[&[HitRecord]],
        out: &mut Vec<Vec<Track>>,
        back: &mut Vec<Option<&'static str>>,
    ) -> Result<(), GpuError> {
        let n = events.len();
        if n > self.limits.max_events {
            return Err(GpuError::Config(format!(
                "a launch of {n} events exceeds the tracker's {}",
                self.limits.max_events
            )));
        }
        out.resize_with(n, Vec::new);
        back.clear();
        back.resize(n, None);
        if n == 0 {
            return Ok(());
        }
        let p = self.passes;
        let mut times = TrackerTimes::default();
        self.ca.take_enqueue();
        let mut clock = std::time::Instant::now();
        let mut lap = || {
            let now = std::time::Instant::now();
            let ms = (now - clock).as_secs_f64() * 1e3;
            clock = now;
            ms
        };
        // The stiff-track pass where some event is busy enough for it (a sparse event
        // makes nothing in it; the device counts sorted hits, at most an event's hits).
        let stiff = p.stiff && events.iter().any(|e| e.len() >= p.stiff_min_hits);
        let first = PassOptions {
            pass: (p.stiff && !stiff) as usize,
            dead_ends_from_plane: p.dead_ends_from,
            skip_used: false,
        };
        self.ca.run_first(events, first)?;
        times.first_pass_ms = lap();
        let first_min = if p.two_pass {
            p.first_min_hits
        } else {
            p.min_hits
        };
        let mut summary = self.ca.select_candidates(first_min, false)?;
        times.first_candidates_ms = lap();
        if stiff {
            // The configuration's first pass on the hits the stiff tracks left.
            self.ca.run_pass(PassOptions {
                pass: 1,
                dead_ends_from_plane: p.dead_ends_from,
                skip_used: true,
            })?;
            times.first_pass_ms += lap();
            summary = self.ca.select_candidates(first_min, true)?;
            times.first_candidates_ms += lap();
        }
        if p.two_pass {
            if stiff {
                // The stiff tracks with a gap first.
                self.ca.run_pass(PassOptions {
                    pass: 2,
                    dead_ends_from_plane: None,
                    skip_used: true,
                })?;
                times.later_pass_ms = lap();
                // Its summary is the next selection's: failures stay, counts add up.
                self.ca.select_candidates(p.stiff_gap_min_hits, true)?;
                times.later_candidates_ms = lap();
            }
            self.ca.run_pass(PassOptions {
                pass: 1 + 2 * p.stiff as usize,
                dead_ends_from_plane: None,
                skip_used: true,
            })?;
            times.later_pass_ms += lap();
            summary = self.ca.select_candidates(p.min_hits, true)?;
            times.later_candidates_ms += lap();
        }
        // The accepted tracks packed, their clones marked, both read back.
        self.ca.read_tracks(self.clones.as_ref(), &mut self.batch)?;
        times.readback_ms = lap();
        (times.enqueue_ms, times.kernels) = self.ca.take_enqueue();
        let b = self.ca.tracks_view(&self.batch);
        for e in 0..n {
            if let Some(step) = summary.failed[e] {
                back[e] = Some(step.name());
            } else if self.batch.exchange_failed.get(e).is_some_and(|&f| f != 0) {
                back[e] = Some("exchange");
            } else if self.batch.first_hits_failed.get(e).is_some_and(|&f| f != 0) {
                back[e] = Some("first_hits");
            }
        }
        // Where the device exchanged segments or chose the first hits, it marked the
        // tracks below the minimum momentum (the cut comes before the steps).
        let cut_on_host = !(self.batch.first_hits_done || self.batch.exchange_done);
        // The events' tracks written from the packed arrays, on several host threads
        // when there are many (a launch of central events has some 250,000).
        let back: &[Option<&'static str>] = back;
        let host_steps = self.host_steps.as_ref();
        let momentum_cut = self.momentum_cut;
        let write = |first: usize, outs: &mut [Vec<Track>]| {
            let mut exchange = Exchange::default();
            let mut first_hits = FirstHits::default();
            for (i, tracks) in outs.iter_mut().enumerate() {
                let e = first + i;
                if back[e].is_some() {
                    tracks.clear();
                    continue;
                }
                // The event's `Track`s and their hit vectors are reused.
                let mut w = 0;
                for t in b.tracks_of(e).filter(|&t| !b.is_clone(t)) {
                    if w == tracks.len() {
                        tracks.push(Track::default());
                    }
                    b.write_track(t, &mut tracks[w]);
                    w += (!cut_on_host || momentum_cut.keeps(&tracks[w])) as usize;
                }
                tracks.truncate(w);
                if let Some(x) = host_steps {
                    if let Some(cuts) = &x.exchange {
                        exchange.run(
                            cuts,
                            &x.fitter,
                            x.track_fitter.as_ref(),
                            events[e],
                            tracks,
                            None,
                        );
                    }
                    if let Some(cuts) = &x.first_hits {
                        first_hits.run(cuts, &x.fitter, x.track_fitter.as_ref(), events[e], tracks);
                    }
                }
            }
        };
        let threads = if b.n_tracks() >= WRITE_THREADS_FROM_TRACKS {
            self.ca.host_threads()
        } else {
            1
        };
        if threads <= 1 {
            write(0, &mut out[..n]);
        } else {
            let chunk = n.div_ceil(threads);
            std::thread::scope(|s| {
                for (k, part) in out[..n].chunks_mut(chunk).enumerate() {
                    let write = &write;
                    s.spawn(move || write(k * chunk, part));
                }
            });
        }
        times.write_ms = lap();
        self.times = times;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full launch keeps the arenas it always had; a smaller one gets a part of them
    /// that still holds one and a half times its events, all central (17 k hits and 133 k
    /// doublets of the dipole map's later pass each), and never less than an eighth.
    #[test]
    fn arenas_follow_the_launch_and_hold_its_busiest_events() {
        let det = Detector::from_toml_file(std::path::Path::new("fixtures/detector.toml")).unwrap();
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let d = CaLimits::default();
        let full = TrackerLimits::for_batch(&cfg, 512);
        assert_eq!(full.max_events, 512);
        assert_eq!(full.ca.max_hits, d.max_hits);
        assert_eq!(full.ca.max_doublets, 2 * d.max_doublets);
        assert_eq!(full.ca.max_neighbours, 2 * d.max_neighbours);
        assert_eq!(full.ca.max_candidates, d.max_candidates);
        assert_eq!(
            TrackerLimits::for_batch(&cfg, 4096),
            full,
            "at most 512 events"
        );
        let bytes = |l: &TrackerLimits| l.ca.device_bytes(1 << 14) as f64;
        let mut last = 0.0;
        for n in [1, 4, 8, 16, 32, 64, 128, 256, 512] {
            let l = TrackerLimits::for_batch(&cfg, n);
            assert_eq!(l.max_events, n);
            assert!(bytes(&l) >= last, "{n} events: arenas grow with the launch");
            last = bytes(&l);
            assert!(l.max_hits >= full.max_hits / 8, "{n}: at least an eighth");
            assert!(l.ca.max_doublets >= full.ca.max_doublets / 8);
            if n <= 128 {
                assert!(l.max_hits >= 3 * n * 17_000 / 2, "{n}: hits {}", l.max_hits);
                assert!(
                    l.ca.max_doublets >= 3 * n * 133_000 / 2,
                    "{n}: doublets {}",
                    l.ca.max_doublets
                );
                let (cands, _) = l.ca.candidate_share(n);
                assert!(cands >= 2 * 2048, "{n}: {cands} candidates an event");
            }
        }
        let small = TrackerLimits::for_batch(&cfg, 8);
        assert!(
            bytes(&small) <= bytes(&full) / 8.0 * 1.01,
            "launches of 8 take an eighth: {:.2} GiB",
            bytes(&small) / (1u64 << 30) as f64
        );
    }
}
