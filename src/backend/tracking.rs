//! The tracking workload on the CPU: cellular-automaton track finding and Kalman fitting
//! of every event, then the trigger lines over the fitted tracks (and the hit-multiplicity
//! line when it is configured). Optionally writes every event's track assignment in the
//! TrackML submission format.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use super::{Backend, BackendError, BackendKind, Detail, Verdict};
use crate::config::{Config, MultiplicityConfig};
use crate::frame::{FrameView, HitRecord, Payload};
use crate::metrics::Metrics;
use crate::tracking::ca::Overflow;
use crate::tracking::geometry::Detector;
use crate::tracking::lines::{self, LineConfig};
use crate::tracking::reco::{FinderConfig, FinderOverrides, Reconstructor};
use crate::tracking::track::Track;

/// The `[tracking]` table of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackingConfig {
    /// Detector geometry TOML (relative paths: to the working directory).
    pub geometry: PathBuf,
    /// Minimum momentum the finder is built for, GeV/c (windows derive from it); default
    /// [`DEFAULT_MIN_P_GEV`].
    #[serde(default = "default_min_p")]
    pub min_p_gev: f64,
    /// Overrides of the cuts derived from the geometry.
    #[serde(default)]
    pub finder: FinderOverrides,
    /// Trigger lines (`[[tracking.line]]`); default: one line `track` firing on any track.
    #[serde(default, rename = "line")]
    pub lines: Vec<LineConfig>,
    /// Threads each CPU worker reconstructs a batch on, its own included; default: the
    /// cores left once each input has its source thread and the decisions theirs, shared
    /// among the workers.
    #[serde(default)]
    pub threads: Option<usize>,
}

/// The finder's minimum momentum where the configuration names none, GeV/c: the threshold
/// of the particles `trigd eval` counts as reconstructable. Tracks below it are not looked
/// for: their scattering windows are the widest, and in a busy event the combinations they
/// admit take other particles' hits (on thick planes a search down to half this momentum
/// lost up to 5 % of the particles above it and made up to 13 % ghosts).
pub const DEFAULT_MIN_P_GEV: f64 = crate::tracking::eval::RECONSTRUCTABLE_MIN_P_GEV;

fn default_min_p() -> f64 {
    DEFAULT_MIN_P_GEV
}

impl TrackingConfig {
    /// Reads `[tracking]` from `cfg`; errors name the field.
    pub fn from_config(cfg: &Config) -> anyhow::Result<TrackingConfig> {
        let table = cfg
            .tracking
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the tracking workload needs a geometry: --geometry FILE or [tracking] geometry = ..."))?;
        let mut tc: TrackingConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e| anyhow::anyhow!("[tracking]: {e}"))?;
        if tc.lines.is_empty() {
            tc.lines.push(LineConfig {
                name: "track".into(),
                min_tracks: 1,
                min_p_gev: 0.0,
                max_p_gev: f64::INFINITY,
                max_chi2_ndf: f64::INFINITY,
                min_hits: 0,
                max_dp_over_p: f64::INFINITY,
                max_slope: f64::INFINITY,
                charge: None,
            });
        }
        lines::validate(&tc.lines).map_err(|e| anyhow::anyhow!("[[tracking.line]]: {e}"))?;
        if let Some(t) = tc.threads {
            anyhow::ensure!(
                (1..=256).contains(&t),
                "[tracking] threads = {t} must be in 1..=256"
            );
        }
        Ok(tc)
    }
}

/// Everything the tracking backends share, built once.
pub struct TrackingSetup {
    pub detector: Detector,
    pub finder: FinderConfig,
    pub config: TrackingConfig,
    pub multiplicity: Option<MultiplicityConfig>,
    pub tracks_out: Option<Arc<Mutex<TracksWriter>>>,
}

impl TrackingSetup {
    pub fn new(cfg: &Config, tracks_out: Option<&Path>) -> anyhow::Result<Self> {
        let config = TrackingConfig::from_config(cfg)?;
        let detector =
            Detector::from_toml_file(&config.geometry).map_err(|e| anyhow::anyhow!("{e}"))?;
        let finder = FinderConfig::from_detector_with(&detector, config.min_p_gev, &config.finder);
        finder
            .validate(&detector)
            .map_err(|e| anyhow::anyhow!("[tracking.finder]: {e}"))?;
        for w in crate::tracking::ca::summary::warnings(&detector, &finder) {
            tracing::warn!("{}: {w}", config.geometry.display());
        }
        let tracks_out = match tracks_out {
            Some(p) => Some(Arc::new(Mutex::new(TracksWriter::create(p)?))),
            None => None,
        };
        Ok(Self {
            detector,
            finder,
            config,
            multiplicity: cfg.multiplicity,
            tracks_out,
        })
    }

    /// Names of the lines in bit order: `multiplicity` first when configured.
    pub fn line_names(&self) -> Vec<String> {
        self.multiplicity
            .iter()
            .map(|_| super::multiplicity::LINE_NAME.to_string())
            .chain(self.config.lines.iter().map(|l| l.name.clone()))
            .collect()
    }
}

/// TrackML submission rows `event_id,hit_id,track_id` (track 0: hit on no track).
pub struct TracksWriter {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl TracksWriter {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let f = std::fs::File::create(path)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", path.display()))?;
        let mut out = std::io::BufWriter::new(f);
        writeln!(out, "event_id,hit_id,track_id")?;
        Ok(Self {
            out,
            path: path.to_path_buf(),
        })
    }
    fn write_event(
        &mut self,
        event_id: u64,
        hits: &[HitRecord],
        track_of_hit: &[u32],
    ) -> std::io::Result<()> {
        for (h, t) in hits.iter().zip(track_of_hit) {
            writeln!(self.out, "{event_id},{},{t}", h.hit_id)?;
        }
        Ok(())
    }
    pub fn finish(&mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", self.path.display()))
    }
}

/// CPU tracking backend of one worker. A batch's events are reconstructed on `threads`
/// threads (the worker's own and helpers started once), each with its own finder, taking
/// the next event as they finish one; the decisions are then made in the batch's order on
/// the worker's thread, so the lines, the decisions and `--tracks-out` see the events as
/// they arrived, whatever the number of threads.
pub struct CpuTracking {
    /// One finder per thread (a thread locks only its own).
    finders: Vec<Mutex<Reconstructor>>,
    decider: Decider,
    /// Per event of the batch: its hits and tracks (grown to the largest batch, reused).
    events: Vec<Mutex<EventWork>>,
    pool: crate::eeg::workers::Workers,
    metrics: Option<Arc<Metrics>>,
}

/// One event's hits and tracks while its batch is reconstructed.
#[derive(Default)]
struct EventWork {
    hits: Vec<HitRecord>,
    tracks: Vec<Track>,
}

impl CpuTracking {
    /// A backend reconstructing each batch on `threads` threads (its own included);
    /// `metrics`: where events the finder could not search whole are counted
    /// ([`report_limits`]).
    pub fn new(
        setup: &TrackingSetup,
        threads: usize,
        metrics: Option<Arc<Metrics>>,
    ) -> anyhow::Result<Self> {
        let threads = threads.max(1);
        Ok(Self {
            finders: (0..threads)
                .map(|_| Mutex::new(Reconstructor::new(&setup.detector, setup.finder.clone())))
                .collect(),
            decider: Decider::new(setup, metrics.clone()),
            events: Vec::new(),
            pool: crate::eeg::workers::Workers::new(threads, "tracking")
                .map_err(|e| anyhow::anyhow!("starting the tracking threads: {e}"))?,
            metrics,
        })
    }

    /// Threads a batch is reconstructed on.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// Counts an event whose finding filled a per-event buffer (the last of `reco`), in
/// `trigd_tracking_finder_limit_total{step}` and `trigd_tracking_passes_raised_total`,
/// and logs it: a finder's first such events, then every power of two, so that a detector
/// whose every event fills a buffer does not flood the log.
pub(crate) fn report_limits(reco: &Reconstructor, metrics: Option<&Metrics>) {
    let o = reco.last_overflow();
    if !o.any() {
        return;
    }
    if let Some(m) = metrics {
        for (step, n) in Overflow::STEPS.into_iter().zip(o.counts()) {
            if n > 0 {
                m.finder_limit(step).inc();
            }
        }
        m.passes_raised().inc_by(o.raised as u64);
    }
    let events = reco.overflow_events();
    if events.is_power_of_two() {
        tracing::warn!(
            events,
            hits = o.hits,
            doublets = o.doublets,
            triplets = o.triplets,
            neighbours = o.neighbours,
            candidates = o.candidates,
            tracks = o.tracks,
            passes_raised = o.raised,
            "an event filled the track finder's per-event buffers ([tracking.finder.limits]); \
             tracks below the momentum its passes were raised to may be missing"
        );
    }
}

/// A hit event's wire hits (`None` for another kind of frame).
fn wire<'a>(f: &FrameView<'a>) -> Option<&'a [crate::frame::Hit]> {
    match f.payload {
        Payload::Hits(hits) => Some(hits),
        _ => None,
    }
}

/// Copies a frame's wire hits into `out` (replacing it).
pub(crate) fn copy_hits(hits: &[crate::frame::Hit], out: &mut Vec<HitRecord>) {
    out.clear();
    out.extend(hits.iter().map(|h| HitRecord {
        x_mm: h.x_mm.get(),
        y_mm: h.y_mm.get(),
        z_mm: h.z_mm.get(),
        plane: h.plane.get(),
        hit_id: h.hit_id.get(),
    }));
}

/// What both tracking backends do with an event's tracks: the trigger lines (and the
/// multiplicity line), the verdict's detail, and the event's rows of `--tracks-out`.
pub(crate) struct Decider {
    lines: Vec<LineConfig>,
    multiplicity: Option<MultiplicityConfig>,
    names: Vec<String>,
    track_of_hit: Vec<u32>,
    tracks_out: Option<Arc<Mutex<TracksWriter>>>,
    beam: BeamWatch,
}

/// Events per track measured by [`BeamWatch`] (the first of the event's tracks that can
/// be): one propagation through the field per so many events, a fraction of a
/// microsecond per event, whatever its size.
const BEAM_EVERY_EVENTS: u64 = 8;
/// Tracks per measurement of [`BeamWatch`].
const BEAM_TRACKS: usize = 500;

/// Where the decided events' tracks come from, measured over and over
/// ([`crate::tracking::beam_spot`]) on one track of every [`BEAM_EVERY_EVENTS`] events: in
/// `trigd_tracking_beam_spot_mm{axis, quantity}` after each [`BEAM_TRACKS`] tracks, logged
/// the first time, and a warning each time the
/// beam moves off the finder's origin or spreads wider than its box (either loses stiff
/// tracks), a note when it is back.
struct BeamWatch {
    field: crate::tracking::geometry::Field,
    finder: FinderConfig,
    meter: crate::tracking::beam_spot::BeamSpotMeter,
    metrics: Option<Arc<Metrics>>,
    events: u64,
    measured: u64,
    off: bool,
}

impl BeamWatch {
    fn new(setup: &TrackingSetup, metrics: Option<Arc<Metrics>>) -> Self {
        BeamWatch {
            field: setup.detector.field.clone(),
            finder: setup.finder.clone(),
            meter: crate::tracking::beam_spot::BeamSpotMeter::new(
                setup.finder.origin_z_mm,
                setup.finder.max_chi2_ndf,
            )
            .stiff(&setup.finder),
            metrics,
            events: 0,
            measured: 0,
            off: false,
        }
    }

    fn add(&mut self, tracks: &[Track]) {
        self.events += 1;
        if self.events % BEAM_EVERY_EVENTS != 0 {
            return;
        }
        self.meter.add_at_most(&self.field, tracks, 1);
        if self.meter.n_tracks() < BEAM_TRACKS {
            return;
        }
        let spot = self.meter.finish();
        self.meter.clear();
        let Some(spot) = spot else { return };
        self.measured += 1;
        if let Some(m) = &self.metrics {
            for (c, axis) in ["x", "y"].into_iter().enumerate() {
                m.beam_spot(axis, "centre").set(spot.centre_mm[c]);
                m.beam_spot(axis, "spread").set(spot.spread_mm[c]);
            }
            if let Some(l) = &spot.length {
                m.beam_spot("z", "centre").set(l.z_centre_mm);
                m.beam_spot("z", "half_length").set(l.half_length_mm);
            }
        }
        let advice = crate::tracking::beam_spot::origin_advice(&spot, &self.finder);
        let mut off = advice.is_some();
        if self.off && !off {
            // Back only within four fifths of the box (a beam at the threshold would
            // otherwise warn and clear at every measurement).
            let inner = FinderConfig {
                origin_half_x_mm: 0.8 * self.finder.origin_half_x_mm,
                origin_half_y_mm: 0.8 * self.finder.origin_half_y_mm,
                origin_half_z_mm: 0.8 * self.finder.origin_half_z_mm,
                ..self.finder.clone()
            };
            off = crate::tracking::beam_spot::origin_advice(&spot, &inner).is_some();
        }
        let (x, y) = (spot.centre_mm[0], spot.centre_mm[1]);
        if let (Some(advice), false) = (&advice, self.off) {
            tracing::warn!("{advice}");
        } else if !off && self.off {
            tracing::info!(
                "the tracks come from the finder's origin again: x = {x:.3} mm, y = {y:.3} mm"
            );
        } else if self.measured == 1 {
            tracing::info!(
                "the tracks come from x = {x:.3} mm, y = {y:.3} mm (spread {:.3} / {:.3} mm, {} tracks), within the finder's origin",
                spot.spread_mm[0],
                spot.spread_mm[1],
                spot.n_tracks
            );
        }
        self.off = off;
    }
}

impl Decider {
    pub(crate) fn new(setup: &TrackingSetup, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            lines: setup.config.lines.clone(),
            multiplicity: setup.multiplicity,
            names: setup.line_names(),
            track_of_hit: Vec::with_capacity(4096),
            tracks_out: setup.tracks_out.clone(),
            beam: BeamWatch::new(setup, metrics),
        }
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The verdict of event `sequence` (its wire hits, the same hits copied, its tracks).
    pub(crate) fn decide(
        &mut self,
        sequence: u64,
        wire: &[crate::frame::Hit],
        hits: &[HitRecord],
        tracks: &[Track],
    ) -> Result<Verdict, BackendError> {
        let mut mask = 0u64;
        let mut shift = 0;
        if let Some(m) = &self.multiplicity {
            let (n_hits, n_planes) = super::multiplicity::count(wire);
            mask |= super::multiplicity::fires(m, n_hits, n_planes) as u64;
            shift = 1;
        }
        mask |= lines::evaluate(&self.lines, tracks) << shift;
        self.beam.add(tracks);
        let max_p_gev = tracks
            .iter()
            .map(|t| t.state.p_gev())
            .filter(|p| p.is_finite())
            .fold(0.0f32, f32::max);
        if let Some(w) = &self.tracks_out {
            self.track_of_hit.clear();
            self.track_of_hit.resize(hits.len(), 0);
            for (k, t) in tracks.iter().enumerate() {
                for &h in &t.hits {
                    if let Some(slot) = self.track_of_hit.get_mut(h as usize) {
                        *slot = k as u32 + 1;
                    }
                }
            }
            let mut w = w
                .lock()
                .map_err(|_| BackendError::Failed("tracks writer poisoned".into()))?;
            w.write_event(sequence, hits, &self.track_of_hit)
                .map_err(|e| BackendError::Failed(format!("writing tracks: {e}")))?;
        }
        Ok(Verdict {
            accept: mask != 0,
            lines_fired: mask,
            detail: Detail::Tracking {
                n_tracks: tracks.len() as u32,
                max_p_gev,
            },
            malformed: None,
        })
    }

    /// New thresholds (SIGHUP); the lines' names and order must stay.
    pub(crate) fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        let tc = TrackingConfig::from_config(cfg).map_err(|e| format!("{e:#}"))?;
        let new_names: Vec<String> = cfg
            .multiplicity
            .iter()
            .map(|_| super::multiplicity::LINE_NAME.to_string())
            .chain(tc.lines.iter().map(|l| l.name.clone()))
            .collect();
        if new_names != self.names {
            return Err(
                "trigger line names or order changed; only thresholds reload without a restart"
                    .into(),
            );
        }
        self.lines = tc.lines;
        self.multiplicity = cfg.multiplicity;
        Ok(())
    }

    pub(crate) fn finish(&mut self) -> Result<(), String> {
        if let Some(w) = &self.tracks_out {
            let mut w = w.lock().map_err(|_| "tracks writer poisoned".to_string())?;
            w.finish().map_err(|e| format!("{e:#}"))?;
        }
        Ok(())
    }
}

impl Backend for CpuTracking {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn line_names(&self) -> &[String] {
        self.decider.names()
    }
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        if let Some(index) = batch.iter().position(|f| wire(f).is_none()) {
            return Err(BackendError::WrongKind {
                index,
                expected: "hit_event",
            });
        }
        let n = batch.len();
        if self.events.len() < n {
            self.events.resize_with(n, Default::default);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (events, finders) = (&self.events, &self.finders);
        let metrics = self.metrics.as_deref();
        let work = |part: usize| {
            let mut reco = finders[part].lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let e = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if e >= n {
                    break;
                }
                let mut ev = events[e].lock().unwrap_or_else(|e| e.into_inner());
                let EventWork { hits, tracks } = &mut *ev;
                copy_hits(wire(&batch[e]).expect("checked above"), hits);
                tracks.clear();
                reco.reconstruct(hits, tracks);
                report_limits(&reco, metrics);
            }
        };
        if n <= 1 || self.pool.threads() == 1 {
            // One event (or one thread): no helper is woken.
            work(0);
        } else {
            self.pool
                .run(&work)
                .map_err(|e| BackendError::Failed(e.to_string()))?;
        }
        for (e, f) in batch.iter().enumerate() {
            let ev = self.events[e].lock().unwrap_or_else(|e| e.into_inner());
            let hits = wire(f).expect("checked above");
            out.push(
                self.decider
                    .decide(f.sequence(), hits, &ev.hits, &ev.tracks)?,
            );
        }
        Ok(())
    }
    fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        self.decider.reload(cfg)
    }
    fn finish(&mut self) -> Result<(), String> {
        self.decider.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{self, Stamp};
    use crate::tracking::simulate::{encode_event_frame, simulate_events, Preset, SimConfig};

    fn setup(tracks_out: Option<&Path>) -> TrackingSetup {
        let cfg = Config::from_str_named(
            "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = \"fixtures/detector.toml\"\n",
            "test",
        )
        .unwrap();
        TrackingSetup::new(&cfg, tracks_out).unwrap()
    }

    /// The finder looks for tracks from the momentum `trigd eval` counts particles from,
    /// unless the configuration names another.
    #[test]
    fn the_default_minimum_momentum_is_the_evaluations_threshold() {
        let tracking = |extra: &str| {
            let cfg = Config::from_str_named(
                &format!("[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = \"fixtures/detector.toml\"\n{extra}"),
                "test",
            )
            .unwrap();
            TrackingConfig::from_config(&cfg).unwrap()
        };
        assert_eq!(tracking("").min_p_gev, DEFAULT_MIN_P_GEV);
        assert_eq!(
            DEFAULT_MIN_P_GEV,
            crate::tracking::eval::EvalConfig::default().min_p_gev
        );
        assert_eq!(tracking("min_p_gev = 2.5").min_p_gev, 2.5);
    }

    /// Hit-event frames of simulated events: per `(preset, events, seed)` in turn, numbered
    /// from 0 in one source.
    fn event_frames(det: &Detector, classes: &[(Preset, u64, u64)]) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for &(preset, n, seed) in classes {
            for ev in simulate_events(det, &SimConfig::preset(preset), seed, 0, n) {
                let stamp = Stamp {
                    source_id: 1,
                    sequence: frames.len() as u64,
                    timestamp_ns: 0,
                };
                frames.push(encode_event_frame(&ev, stamp));
            }
        }
        frames
    }

    /// A batch reconstructed on several threads decides as on one, event by event and in
    /// order, and writes the same `--tracks-out` rows in the same order.
    #[test]
    fn a_batch_on_several_threads_decides_as_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let det = Detector::from_toml_file(Path::new("fixtures/detector.toml")).unwrap();
        // Events of very different cost (central and minimum-bias), so the threads finish
        // out of order.
        let mut frames = event_frames(&det, &[(Preset::Minbias, 40, 3), (Preset::Central, 3, 4)]);
        frames.swap(1, 41);
        let views: Vec<FrameView<'_>> = frames.iter().map(|f| frame::parse(f).unwrap()).collect();
        let mut outs = Vec::new();
        for threads in [1, 3] {
            let path = dir.path().join(format!("tracks{threads}.csv"));
            let mut b = CpuTracking::new(&setup(Some(&path)), threads, None).unwrap();
            assert_eq!(b.threads(), threads);
            let mut out = Vec::new();
            // Twice: the second batch reuses every buffer.
            for _ in 0..2 {
                out.clear();
                b.process(&views, &mut out).unwrap();
            }
            b.finish().unwrap();
            let rows = std::fs::read_to_string(&path).unwrap();
            outs.push((out, rows));
        }
        assert_eq!(outs[0].0.len(), views.len());
        assert!(
            outs[0]
                .0
                .iter()
                .any(|v| matches!(v.detail, Detail::Tracking { n_tracks, .. } if n_tracks > 1000)),
            "a central event among them"
        );
        assert_eq!(outs[0].0, outs[1].0, "verdicts in order");
        assert!(outs[0].1.lines().count() > 10_000);
        assert_eq!(outs[0].1, outs[1].1, "--tracks-out rows in order");
    }

    /// The decided events' tracks give where the beam is, in
    /// `trigd_tracking_beam_spot_mm`: on the axis with the default origin, and 3 mm off it
    /// where the simulated beam is. (The finder, centred on the axis, finds the softer
    /// tracks of such a beam, whose wider windows reach it, and of those rather the ones
    /// that come out towards the axis: the centre is seen a little short of the beam's.)
    #[test]
    fn the_beam_spot_of_the_decided_events_is_measured() {
        let det = Detector::from_toml_file(Path::new("fixtures/detector.toml")).unwrap();
        for (beam, target_mm) in [([0.0, 0.0], 1.0), ([3.0, -1.0], 1.0), ([0.0, 0.0], 80.0)] {
            let sim = SimConfig {
                beam_centre_mm: beam,
                beam_sigma_xy_mm: 0.05,
                target_thickness_mm: target_mm,
                ..SimConfig::preset(Preset::Minbias)
            };
            let n = 4200;
            let frames: Vec<Vec<u8>> = simulate_events(&det, &sim, 9, 0, n)
                .map(|ev| {
                    let stamp = Stamp {
                        source_id: 1,
                        sequence: ev.event_id,
                        timestamp_ns: 0,
                    };
                    encode_event_frame(&ev, stamp)
                })
                .collect();
            let views: Vec<FrameView<'_>> =
                frames.iter().map(|f| frame::parse(f).unwrap()).collect();
            let metrics = Arc::new(Metrics::new().unwrap());
            let mut b = CpuTracking::new(&setup(None), 2, Some(metrics.clone())).unwrap();
            let mut out = Vec::new();
            for batch in views.chunks(100) {
                b.process(batch, &mut out).unwrap();
            }
            assert_eq!(out.len(), n as usize);
            for (c, axis) in ["x", "y"].into_iter().enumerate() {
                let centre = metrics.beam_spot(axis, "centre").get();
                let spread = metrics.beam_spot(axis, "spread").get();
                assert!(
                    (centre - beam[c]).abs() < 0.03 + 0.05 * beam[c].abs(),
                    "beam {beam:?}: {axis} centre {centre}"
                );
                if target_mm < 10.0 {
                    assert!(spread > 0.0 && spread < 1.0, "{axis} spread {spread}");
                }
            }
            // Along the beam: a thin target's tracks come from about z = 0 (their errors
            // there are millimetres), a long one's from its length.
            let (z, half) = (
                metrics.beam_spot("z", "centre").get(),
                metrics.beam_spot("z", "half_length").get(),
            );
            assert!(z.abs() < 3.0, "beam {beam:?}, target {target_mm} mm: z {z}");
            if target_mm > 10.0 {
                assert!(half > 36.0 && half < 60.0, "half length {half}");
            } else {
                assert!(half < 20.0, "half length {half}");
            }
        }
    }

    /// The watch warns once when the beam moves off the finder's origin and clears only
    /// once it is back within four fifths of the box: a beam at the threshold does not
    /// warn at every measurement.
    #[test]
    fn the_beam_watch_clears_only_well_within_the_box() {
        use crate::tracking::track::TrackState;
        let setup = setup(None);
        let mut watch = BeamWatch::new(&setup, None);
        // One straight track from (x0, 0) at z = 0, its state at z = 300 mm.
        let from = |x0: f64, k: usize| {
            let t = 0.01 * ((k % 21) as f64 - 10.0);
            let mut cov = [0.0f32; 15];
            for i in 0..5 {
                cov[i * (i + 1) / 2 + i] = 1e-6;
            }
            Track {
                hits: (0..6).collect(),
                state: TrackState {
                    z_mm: 300.0,
                    x_mm: (x0 + 300.0 * t) as f32,
                    y_mm: (300.0 * t) as f32,
                    tx: t as f32,
                    ty: t as f32,
                    qop: 0.0,
                },
                cov,
                chi2: 1.0,
                ndf: 8,
            }
        };
        let mut run = |x0: f64| {
            for k in 0..(BEAM_TRACKS as u64 * BEAM_EVERY_EVENTS) as usize {
                watch.add(std::slice::from_ref(&from(x0, k)));
            }
            (watch.measured, watch.off)
        };
        assert_eq!(run(0.0), (1, false));
        // 1 mm off a 1.5 mm box: off.
        assert_eq!(run(1.0), (2, true));
        // 0.45 mm: within a third of the box (0.5), not of four fifths of it (0.4).
        assert_eq!(run(0.45), (3, true));
        assert_eq!(run(0.1), (4, false));
        assert_eq!(run(0.45), (5, false));
    }

    /// Central events whose combinations fill the finder's triplet buffer are counted in
    /// `trigd_tracking_finder_limit_total{step="triplets"}` and
    /// `trigd_tracking_passes_raised_total`, and still decided on the tracks of the raised
    /// passes; the minimum-bias events between them are decided as without the limit.
    #[test]
    fn events_that_fill_the_finders_buffers_are_counted_and_decided() {
        let det = Detector::from_toml_file(Path::new("fixtures/detector.toml")).unwrap();
        let frames = event_frames(&det, &[(Preset::Minbias, 5, 3), (Preset::Central, 2, 4)]);
        let views: Vec<FrameView<'_>> = frames.iter().map(|f| frame::parse(f).unwrap()).collect();
        let limited = Config::from_str_named(
            "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = \"fixtures/detector.toml\"\n\
             [tracking.finder.limits]\nmax_triplets = 6000\n",
            "test",
        )
        .unwrap();
        let metrics = Arc::new(Metrics::new().unwrap());
        let mut b = CpuTracking::new(
            &TrackingSetup::new(&limited, None).unwrap(),
            1,
            Some(metrics.clone()),
        )
        .unwrap();
        let mut out = Vec::new();
        b.process(&views, &mut out).unwrap();
        let mut reference = Vec::new();
        CpuTracking::new(&setup(None), 1, Some(metrics.clone()))
            .unwrap()
            .process(&views, &mut reference)
            .unwrap();
        assert_eq!(metrics.finder_limit("triplets").get(), 2);
        assert!(metrics.passes_raised().get() >= 2);
        assert_eq!(out.len(), 7);
        assert_eq!(out[..5], reference[..5], "minimum-bias events");
        for (v, r) in out[5..].iter().zip(&reference[5..]) {
            let (Detail::Tracking { n_tracks: a, .. }, Detail::Tracking { n_tracks: b, .. }) =
                (&v.detail, &r.detail)
            else {
                panic!("tracking verdicts")
            };
            // The raised passes take the stiff tracks, the pass at the minimum momentum on
            // the hits they left then fits the buffer and finds the others.
            let (a, b) = (*a as f64, *b as f64);
            assert!(a >= 0.9 * b && a <= 1.02 * b, "{a} tracks against {b}");
        }
    }
}
