//! The tracking workload on the GPU behind the backend trait: every frame's hits go up in
//! one batch, the device finds and fits the tracks ([`crate::gpu::tracking::GpuTracker`]),
//! and the host runs the trigger lines on the tracks that come back, with the same
//! `Decider` as the CPU backend, so both decide alike from the same tracks.
//!
//! An event the device cannot take whole (a step's per-event limit or the batch's arena
//! exceeded) comes back marked; it is counted in `trigd_tracking_overflow_total{step}` and
//! reconstructed by this backend's own CPU finder, in its place in the batch. A device error
//! fails the whole batch to the pipeline, which hands it to the CPU fallback: no frame is
//! lost and none is decided twice. The batch goes to the device in launches whose size
//! follows the deadline and the measured cost per event ([`BatchSizer`]), as for EEG.

use std::sync::Arc;

use super::tracking::{copy_hits, Decider, TrackingSetup};
use super::{Backend, BackendError, BackendKind, Verdict};
use crate::config::Config;
use crate::frame::{FrameView, HitRecord, Payload};
use crate::gpu::runtime::BatchSizer;
use crate::gpu::tracking::{GpuTracker, TrackerLimits};
use crate::gpu::GpuDevice;
use crate::metrics::Metrics;
use crate::tracking::reco::Reconstructor;
use crate::tracking::track::Track;

/// The GPU tracking backend of one worker (one GPU).
pub struct GpuTracking {
    tracker: GpuTracker,
    /// The CPU finder for the events the device hands back.
    reco: Reconstructor,
    decider: Decider,
    sizer: BatchSizer,
    max_events: usize,
    max_hits: usize,
    metrics: Option<Arc<Metrics>>,
    /// Per frame of the batch: its hits (reused).
    hits: Vec<Vec<HitRecord>>,
    /// Per frame: its tracks (reused).
    tracks: Vec<Vec<Track>>,
    /// Per frame: the step at which the device handed it back, if it did.
    handed_back: Vec<Option<&'static str>>,
    launch_tracks: Vec<Vec<Track>>,
    launch_back: Vec<Option<&'static str>>,
    /// The GPU's ordinal.
    ordinal: usize,
    /// What the worker did, for its last log line.
    stats: RunStats,
}

/// Totals over a run: where a GPU tracking worker's time went.
#[derive(Debug, Default)]
struct RunStats {
    batches: u64,
    launches: u64,
    events: u64,
    handed_back: u64,
    /// Inside `process`, all of it.
    process_s: f64,
    /// Inside the tracker's launches.
    launch_s: f64,
    /// The launches' stages, summed (milliseconds).
    stages: crate::gpu::tracking::TrackerTimes,
}

impl GpuTracking {
    /// Builds the device finder on `device` for launches of up to `max_events` events
    /// (limits per event from the finder's configuration).
    pub fn new(
        setup: &TrackingSetup,
        device: &GpuDevice,
        max_events: usize,
        budget_us: f64,
        write_threads: usize,
        metrics: Option<Arc<Metrics>>,
    ) -> anyhow::Result<Self> {
        let limits = TrackerLimits::for_batch(&setup.finder, max_events.max(1));
        let mut tracker = GpuTracker::new(device, &setup.detector, &setup.finder, limits)?;
        tracker.set_write_threads(write_threads);
        // Compile and warm up before the first frame.
        let mut t = Vec::new();
        let mut b = Vec::new();
        tracker.reconstruct_batch(&[&[]], &mut t, &mut b)?;
        // Then a launch of simulated events with tracks, so every step's kernels are loaded
        // (CUDA loads a kernel at its first launch) and the host's buffers have grown
        // before the first frame, not while the inputs' slots fill behind it.
        let sim = crate::tracking::simulate::SimConfig::preset(
            crate::tracking::simulate::Preset::Minbias,
        );
        let warm: Vec<Vec<HitRecord>> =
            crate::tracking::simulate::simulate_events(&setup.detector, &sim, 1, 0, 8)
                .map(|e| e.hits)
                .collect();
        let views: Vec<&[HitRecord]> = warm.iter().map(Vec::as_slice).collect();
        tracker.reconstruct_batch(&views, &mut t, &mut b)?;
        tracing::info!(device = %device, "tracking on the GPU: {limits:?}");
        Ok(Self {
            stats: RunStats::default(),
            ordinal: device.ordinal,
            max_events: limits.max_events,
            // The doublet, triplet and link arenas hold about half the hit arena's worth of
            // busy events (some 128 central events): a launch of more would hand the
            // last ones back to the CPU.
            max_hits: (limits.max_hits / 2).max(1),
            tracker,
            reco: Reconstructor::new(&setup.detector, setup.finder.clone()),
            decider: Decider::new(setup, metrics.clone()),
            sizer: BatchSizer::new(budget_us / 2.0, max_events.max(1)),
            metrics,
            hits: Vec::new(),
            tracks: Vec::new(),
            handed_back: Vec::new(),
            launch_tracks: Vec::new(),
            launch_back: Vec::new(),
        })
    }

    /// Makes the next launch fail as a device error would (fail-over tests).
    pub fn inject_device_error(&mut self) {
        self.tracker.inject_device_error();
    }

    /// Runs frames `i..j` (already copied) on the device; records their tracks or the
    /// step that handed them back.
    fn launch(&mut self, i: usize, j: usize) -> Result<(), BackendError> {
        let events: Vec<&[HitRecord]> = self.hits[i..j].iter().map(Vec::as_slice).collect();
        let started = std::time::Instant::now();
        self.tracker
            .reconstruct_batch(&events, &mut self.launch_tracks, &mut self.launch_back)
            .map_err(|e| BackendError::Device(e.to_string()))?;
        let took = started.elapsed().as_secs_f64();
        self.sizer.record(j - i, took * 1e6);
        let t = self.tracker.last_times();
        let st = &mut self.stats;
        st.launches += 1;
        st.launch_s += took;
        st.stages.first_pass_ms += t.first_pass_ms;
        st.stages.first_candidates_ms += t.first_candidates_ms;
        st.stages.later_pass_ms += t.later_pass_ms;
        st.stages.later_candidates_ms += t.later_candidates_ms;
        st.stages.readback_ms += t.readback_ms;
        st.stages.write_ms += t.write_ms;
        for (k, e) in (i..j).enumerate() {
            std::mem::swap(&mut self.tracks[e], &mut self.launch_tracks[k]);
            self.handed_back[e] = self.launch_back[k];
        }
        Ok(())
    }
}

impl Backend for GpuTracking {
    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }
    fn device(&self) -> String {
        format!("gpu{}", self.ordinal)
    }
    fn line_names(&self) -> &[String] {
        self.decider.names()
    }
    // The frames and their hits, tracks and hand-back marks are parallel arrays.
    #[allow(clippy::needless_range_loop)]
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        let entered = std::time::Instant::now();
        let n = batch.len();
        if self.hits.len() < n {
            self.hits.resize_with(n, Vec::new);
            self.tracks.resize_with(n, Vec::new);
        }
        self.handed_back.clear();
        self.handed_back.resize(n, None);
        for (index, f) in batch.iter().enumerate() {
            let Payload::Hits(hits) = f.payload else {
                return Err(BackendError::WrongKind {
                    index,
                    expected: "hit_event",
                });
            };
            copy_hits(hits, &mut self.hits[index]);
        }
        // Launches of consecutive events within the sizer's proposal and the arenas.
        let mut i = 0;
        while i < n {
            let limit = self.sizer.next_batch().clamp(1, self.max_events);
            let mut j = i;
            let mut n_hits = 0;
            while j < n && j - i < limit && n_hits + self.hits[j].len() <= self.max_hits {
                n_hits += self.hits[j].len();
                j += 1;
            }
            if j == i {
                // One event beyond the batch's hit arena: the CPU takes it.
                self.handed_back[i] = Some("hits");
                j = i + 1;
            } else {
                self.launch(i, j)?;
            }
            i = j;
        }
        for e in 0..n {
            if let Some(step) = self.handed_back[e] {
                self.stats.handed_back += 1;
                if let Some(m) = &self.metrics {
                    m.tracking_overflow(step).inc();
                }
                self.reco.reconstruct(&self.hits[e], &mut self.tracks[e]);
                super::tracking::report_limits(&self.reco, self.metrics.as_deref());
            }
            let Payload::Hits(wire) = batch[e].payload else {
                unreachable!("checked above")
            };
            out.push(self.decider.decide(
                batch[e].sequence(),
                wire,
                &self.hits[e],
                &self.tracks[e],
            )?);
        }
        self.stats.batches += 1;
        self.stats.events += n as u64;
        self.stats.process_s += entered.elapsed().as_secs_f64();
        Ok(())
    }
    fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        self.decider.reload(cfg)
    }
    fn finish(&mut self) -> Result<(), String> {
        let st = &self.stats;
        let per_launch = |ms: f64| ms / st.launches.max(1) as f64;
        tracing::info!(
            device = %self.device(),
            batches = st.batches,
            launches = st.launches,
            events = st.events,
            handed_back = st.handed_back,
            "GPU tracking: {} events in {} launches ({:.1} per launch), {:.3} s in launches of \
             {:.3} s in batches; per launch ms: first pass {:.3}, candidates {:.3}, later pass \
             {:.3}, candidates {:.3}, read back {:.3}, tracks written {:.3}",
            st.events,
            st.launches,
            st.events as f64 / st.launches.max(1) as f64,
            st.launch_s,
            st.process_s,
            per_launch(st.stages.first_pass_ms),
            per_launch(st.stages.first_candidates_ms),
            per_launch(st.stages.later_pass_ms),
            per_launch(st.stages.later_candidates_ms),
            per_launch(st.stages.readback_ms),
            per_launch(st.stages.write_ms),
        );
        self.decider.finish()
    }
}
