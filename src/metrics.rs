//! Prometheus metrics: every frame counted by outcome, latencies as histograms, ring fill,
//! backend state. [`Metrics`] owns the registry and hands out pre-resolved handles
//! ([`SourceMetrics`], [`DecisionMetrics`], [`RingMetrics`], [`BackendMetrics`], stage
//! histograms) so that the hot path only touches atomics: label strings are looked up once,
//! when a handle is made, never per frame.
//!
//! Why the `prometheus` crate rather than the `metrics` facade (+ `metrics-exporter-prometheus`):
//! - Histograms: `prometheus` histograms are cumulative buckets with explicit upper bounds
//!   chosen here (1 us .. ~1 s, powers of two), exported as `_bucket{le=..}` series that
//!   `histogram_quantile` aggregates across instances. The `metrics` exporter renders
//!   histograms as client-side summaries unless buckets are configured per metric name on the
//!   exporter builder; summaries cannot be aggregated.
//! - Ownership: the [`prometheus::Registry`] is a value this struct owns, so tests create as
//!   many independent instances as they like. The `metrics` facade routes through one global
//!   recorder installed once per process.
//! - Handles: a `prometheus` child counter/histogram is an `Arc` of atomics; keeping it is the
//!   pre-resolved handle. The facade's macros resolve a key (name + labels) on each call
//!   unless the handle is registered and cached the same way, so no gain there.
//! - No async runtime: the `metrics` exporter's built-in HTTP listener runs on hyper/tokio;
//!   here `/metrics` is served by a plain thread ([`crate::http`]) calling [`Metrics::render`],
//!   which uses `prometheus`'s text encoder (format 0.0.4) with the protobuf feature off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::backend::BackendKind;
use crate::decision::{Decision, Names, Outcome, Workload};

/// Content-Type of [`Metrics::render`]'s output.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Most distinct non-empty reasons one source caches children for; further reasons are
/// counted under reason `other` so that a misbehaving producer cannot blow up cardinality.
pub const MAX_REASONS_PER_SOURCE: usize = 32;

/// Error building or rendering metrics.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("registering metric family {name}: {source}")]
    Register {
        name: &'static str,
        source: prometheus::Error,
    },
    #[error("bad histogram buckets for {name}: {source}")]
    Buckets {
        name: &'static str,
        source: prometheus::Error,
    },
    #[error("encoding metrics in text format: {0}")]
    Encode(prometheus::Error),
}

/// Pipeline stages timed by `trigd_stage_seconds{stage}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Arrival until a worker takes the frame off the ring.
    Queue,
    /// Waiting for the batch to fill (or its deadline).
    Batch,
    /// Backend reconstruction of the batch.
    Reconstruct,
    /// Trigger lines and decision record.
    Decide,
    /// Writing the decision to the sinks.
    Sink,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Self::Queue,
        Self::Batch,
        Self::Reconstruct,
        Self::Decide,
        Self::Sink,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Batch => "batch",
            Self::Reconstruct => "reconstruct",
            Self::Decide => "decide",
            Self::Sink => "sink",
        }
    }
}

/// Latency buckets in seconds: 1 us * 2^k for k = 0..=20, i.e. 1 us .. ~1.05 s.
pub fn latency_buckets_s() -> Vec<f64> {
    (0..=20).map(|k| 1e-6 * f64::from(1u32 << k)).collect()
}

/// Batch size buckets: 1, 2, 4, .. 4096 frames.
pub fn batch_size_buckets() -> Vec<f64> {
    (0..=12).map(|k| f64::from(1u32 << k)).collect()
}

fn backend_label(b: Option<BackendKind>) -> &'static str {
    b.map_or("none", BackendKind::as_str)
}

fn backend_index(b: Option<BackendKind>) -> usize {
    match b {
        None => 0,
        Some(BackendKind::Cpu) => 1,
        Some(BackendKind::Gpu) => 2,
    }
}

fn workload_index(w: Workload) -> usize {
    match w {
        Workload::Multiplicity => 0,
        Workload::Tracking => 1,
        Workload::Eeg => 2,
    }
}

fn outcome_index(o: Outcome) -> usize {
    usize::from(o.code())
}

/// Per-source accounting shared by every handle of one source: decisions counted so far.
#[derive(Debug)]
struct SourceShared {
    name: String,
    received: IntCounter,
    decided: AtomicU64,
    balanced: IntGauge,
}

impl SourceShared {
    fn refresh(&self, in_flight_max: u64) -> bool {
        // Read decided first: a frame is received before it is decided, so reading in this
        // order never sees decided > received for a correct pipeline.
        let decided = self.decided.load(Ordering::Acquire);
        let received = self.received.get();
        let ok = decided <= received && received - decided <= in_flight_max;
        self.balanced.set(i64::from(ok));
        ok
    }
}

/// Counts of one source: what the source reader and the decision thread count.
/// Cheap to clone (atomics behind `Arc`s); each thread keeps its own clone.
#[derive(Debug, Clone)]
pub struct SourceMetrics {
    shared: Arc<SourceShared>,
    frames: IntCounterVec,
    /// Children `{outcome, reason=""}` indexed by [`Outcome::code`].
    plain: [IntCounter; 5],
    /// Children for non-empty reasons, found by pointer then by text; bounded.
    reasons: Vec<(Outcome, &'static str, IntCounter)>,
    /// Children `{outcome, reason="other"}` once the reason cache is full.
    overflow: [Option<IntCounter>; 5],
    gaps: IntCounter,
    repeats: IntCounter,
}

impl SourceMetrics {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// A frame arrived (before validation), `trigd_frames_received_total`.
    #[inline]
    pub fn received(&self) {
        self.shared.received.inc();
    }

    /// `n` frames missing in the sequence numbers (`trigd_sequence_gaps_total`).
    #[inline]
    pub fn sequence_gap(&self, missing_frames: u64) {
        self.gaps.inc_by(missing_frames);
    }

    /// A sequence number seen again or going backwards (`trigd_sequence_repeats_total`).
    #[inline]
    pub fn sequence_repeat(&self) {
        self.repeats.inc();
    }

    /// Pre-resolves the child for `(outcome, reason)` so the first frame with that reason
    /// does not pay for it. Call at start-up for the reasons the pipeline can produce.
    pub fn prepare(&mut self, outcome: Outcome, reason: &'static str) {
        if !reason.is_empty() {
            let _ = self.reason_counter(outcome, reason);
        }
    }

    /// Counts one decision of this source in `trigd_frames_total{source,outcome,reason}`.
    /// Empty reason: an atomic increment. Known reason: a scan of at most
    /// [`MAX_REASONS_PER_SOURCE`] entries comparing pointers first. A reason never seen
    /// before by this handle resolves its child once (allocates once).
    #[inline]
    pub fn count(&mut self, outcome: Outcome, reason: &'static str) {
        if reason.is_empty() {
            self.plain[outcome_index(outcome)].inc();
        } else {
            self.reason_counter(outcome, reason).inc();
        }
        self.shared.decided.fetch_add(1, Ordering::Release);
    }

    fn reason_counter(&mut self, outcome: Outcome, reason: &'static str) -> &IntCounter {
        let found = self
            .reasons
            .iter()
            .position(|(o, r, _)| *o == outcome && std::ptr::eq(*r, reason))
            .or_else(|| {
                self.reasons
                    .iter()
                    .position(|(o, r, _)| *o == outcome && *r == reason)
            });
        if let Some(i) = found {
            return &self.reasons[i].2;
        }
        if self.reasons.len() < MAX_REASONS_PER_SOURCE {
            let c = self.frames.with_label_values(&[
                self.shared.name.as_str(),
                outcome.as_str(),
                reason,
            ]);
            self.reasons.push((outcome, reason, c));
            let last = self.reasons.len() - 1;
            return &self.reasons[last].2;
        }
        let name = self.shared.name.as_str();
        let frames = &self.frames;
        self.overflow[outcome_index(outcome)]
            .get_or_insert_with(|| frames.with_label_values(&[name, outcome.as_str(), "other"]))
    }

    /// Frames received and decisions counted so far for this source.
    pub fn accounting(&self) -> (u64, u64) {
        let decided = self.shared.decided.load(Ordering::Acquire);
        (self.shared.received.get(), decided)
    }
}

/// Counters the decision thread updates per [`Decision`]: outcome, latency, lines fired.
#[derive(Debug)]
pub struct DecisionMetrics {
    sources: Vec<SourceMetrics>,
    lines: Vec<IntCounter>,
    latency: HistogramVec,
    /// `[workload][backend]`, resolved on first use.
    latency_children: [[Option<Histogram>; 3]; 3],
}

impl DecisionMetrics {
    /// Counts `d`: outcome (+ reason) of its source, decision latency, lines fired.
    /// A source index outside the names table is a caller bug; it is ignored in release.
    pub fn record(&mut self, d: &Decision) {
        debug_assert!(
            usize::from(d.source) < self.sources.len(),
            "decision source index {} outside the names table",
            d.source
        );
        if let Some(s) = self.sources.get_mut(usize::from(d.source)) {
            s.count(d.outcome, d.reason);
        }
        let latency = &self.latency;
        let h = self.latency_children[workload_index(d.workload)][backend_index(d.backend)]
            .get_or_insert_with(|| {
                latency.with_label_values(&[d.workload.as_str(), backend_label(d.backend)])
            });
        h.observe(d.latency_ns as f64 * 1e-9);
        let mut mask = d.lines_fired;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(c) = self.lines.get(i) {
                c.inc();
            }
        }
    }

    /// The per-source handles, indexed like [`Names::sources`].
    pub fn sources(&mut self) -> &mut [SourceMetrics] {
        &mut self.sources
    }
}

/// Fill of one ring buffer.
#[derive(Debug, Clone)]
pub struct RingMetrics {
    fill: Gauge,
    capacity_slots: usize,
}

impl RingMetrics {
    /// Sets `trigd_ring_fill_ratio{ring}` from the number of occupied slots.
    #[inline]
    pub fn set_fill(&self, occupied_slots: usize) {
        let cap = self.capacity_slots.max(1) as f64;
        self.fill.set(occupied_slots as f64 / cap);
    }
    pub fn capacity_slots(&self) -> usize {
        self.capacity_slots
    }
}

/// State of one backend kind.
#[derive(Debug, Clone)]
pub struct BackendMetrics {
    active: IntGauge,
    batch_size: Histogram,
}

impl BackendMetrics {
    /// `trigd_backend_active{backend}`: 1 while this backend takes batches.
    pub fn set_active(&self, active: bool) {
        self.active.set(i64::from(active));
    }
    /// Observes one batch of `frames` frames (`trigd_batch_size{backend}`).
    #[inline]
    pub fn observe_batch(&self, frames: usize) {
        self.batch_size.observe(frames as f64);
    }
}

/// A NATS input's counters and its consumer's state.
#[derive(Debug, Clone)]
pub struct NatsSourceMetrics {
    pub acked: IntCounter,
    pub redelivered: IntCounter,
    pub pending: IntGauge,
    pub ack_pending: IntGauge,
    pub consumer_redelivered: IntGauge,
}

/// All of trigd's metrics and the registry that exports them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    frames_received: IntCounterVec,
    frames: IntCounterVec,
    sequence_gaps: IntCounterVec,
    sequence_repeats: IntCounterVec,
    decision_latency: HistogramVec,
    stage: HistogramVec,
    ring_fill: GaugeVec,
    ring_capacity: IntGaugeVec,
    batch_size: HistogramVec,
    backend_active: IntGaugeVec,
    worker_frames: IntCounterVec,
    backend_failovers: IntCounter,
    line_fired: IntCounterVec,
    accounting_balanced: IntGaugeVec,
    udp_send_errors: IntCounter,
    sink_errors: IntCounterVec,
    sink_lost: IntCounterVec,
    ring_fill_max: GaugeVec,
    input_refused: IntCounterVec,
    nats_acked: IntCounterVec,
    nats_redelivered: IntCounterVec,
    nats_consumer: IntGaugeVec,
    tracking_overflow: IntCounterVec,
    finder_limit: IntCounterVec,
    passes_raised: IntCounter,
    beam_spot: GaugeVec,
    stream_gaps: IntCounterVec,
    stream_gap_samples: IntCounterVec,
    lsl_marker_latency: Histogram,
    /// Rings whose peak fill is read (and reset) at each scrape.
    watched_rings: Mutex<Vec<(Gauge, crate::ring::Fill)>>,
    sources: Mutex<Vec<Arc<SourceShared>>>,
    in_flight_max_frames: AtomicU64,
}

fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &'static str,
    c: C,
) -> Result<C, MetricsError> {
    registry
        .register(Box::new(c.clone()))
        .map_err(|source| MetricsError::Register { name, source })?;
    Ok(c)
}

macro_rules! family {
    ($registry:expr, $ty:ident, $name:literal, $help:literal, [$($label:literal),*]) => {
        register(
            $registry,
            $name,
            $ty::new(Opts::new($name, $help), &[$($label),*])
                .map_err(|source| MetricsError::Register { name: $name, source })?,
        )?
    };
}

macro_rules! histogram_family {
    ($registry:expr, $name:literal, $help:literal, $buckets:expr, [$($label:literal),*]) => {
        register(
            $registry,
            $name,
            HistogramVec::new(HistogramOpts::new($name, $help).buckets($buckets), &[$($label),*])
                .map_err(|source| MetricsError::Buckets { name: $name, source })?,
        )?
    };
}

impl Metrics {
    /// Registers every family; sets `trigd_build_info` and `trigd_start_time_seconds`.
    pub fn new() -> Result<Self, MetricsError> {
        let r = Registry::new();
        let frames_received = family!(
            &r,
            IntCounterVec,
            "trigd_frames_received_total",
            "Frames that arrived at a source, before validation.",
            ["source"]
        );
        let frames = family!(&r, IntCounterVec, "trigd_frames_total",
            "Frames by final outcome (accept|reject|timeout|dropped|malformed) and reason; sums to trigd_frames_received_total.",
            ["source", "outcome", "reason"]);
        let sequence_gaps = family!(
            &r,
            IntCounterVec,
            "trigd_sequence_gaps_total",
            "Frames missing according to the producers' sequence numbers.",
            ["source"]
        );
        let sequence_repeats = family!(
            &r,
            IntCounterVec,
            "trigd_sequence_repeats_total",
            "Frames whose sequence number repeated or went backwards.",
            ["source"]
        );
        let decision_latency = histogram_family!(
            &r,
            "trigd_decision_latency_seconds",
            "Frame arrival to decision.",
            latency_buckets_s(),
            ["workload", "backend"]
        );
        let stage = histogram_family!(
            &r,
            "trigd_stage_seconds",
            "Time spent per pipeline stage (queue, batch, reconstruct, decide, sink).",
            latency_buckets_s(),
            ["stage"]
        );
        let ring_fill = family!(
            &r,
            GaugeVec,
            "trigd_ring_fill_ratio",
            "Occupied fraction of a ring buffer (0..1).",
            ["ring"]
        );
        let ring_capacity = family!(
            &r,
            IntGaugeVec,
            "trigd_ring_capacity",
            "Slots of a ring buffer.",
            ["ring"]
        );
        let batch_size = histogram_family!(
            &r,
            "trigd_batch_size",
            "Frames per backend batch.",
            batch_size_buckets(),
            ["backend"]
        );
        let backend_active = family!(
            &r,
            IntGaugeVec,
            "trigd_backend_active",
            "1 while the backend takes batches, else 0.",
            ["backend"]
        );
        let worker_frames = family!(
            &r,
            IntCounterVec,
            "trigd_worker_frames_total",
            "Frames each reconstruction worker reconstructed, by the device that did it (cpu, or gpuN for the GPU of ordinal N).",
            ["worker", "device"]
        );
        let backend_failovers = register(
            &r,
            "trigd_backend_failovers_total",
            IntCounter::new(
                "trigd_backend_failovers_total",
                "Batches failed over from the GPU to the CPU backend.",
            )
            .map_err(|source| MetricsError::Register {
                name: "trigd_backend_failovers_total",
                source,
            })?,
        )?;
        let line_fired = family!(
            &r,
            IntCounterVec,
            "trigd_trigger_line_fired_total",
            "Decisions on which a trigger line fired.",
            ["line"]
        );
        let accounting_balanced = family!(
            &r,
            IntGaugeVec,
            "trigd_accounting_balanced",
            "1 if frames received = frames decided (up to frames in flight), else 0.",
            ["source"]
        );
        let udp_send_errors = register(
            &r,
            "trigd_udp_send_errors_total",
            IntCounter::new(
                "trigd_udp_send_errors_total",
                "Decision datagrams the UDP stream failed to send.",
            )
            .map_err(|source| MetricsError::Register {
                name: "trigd_udp_send_errors_total",
                source,
            })?,
        )?;
        let sink_errors = family!(
            &r,
            IntCounterVec,
            "trigd_sink_errors_total",
            "Write and flush errors of a sink (jsonl, binlog, udp, recording) by kind of OS error.",
            ["sink", "kind"]
        );
        let sink_lost = family!(
            &r,
            IntCounterVec,
            "trigd_sink_lost_total",
            "Decisions (recording: accepted frames) a sink failed to write and will not write.",
            ["sink"]
        );
        let ring_fill_max = family!(
            &r,
            GaugeVec,
            "trigd_ring_fill_max_ratio",
            "Largest occupied fraction of a ring buffer since the previous scrape (0..1).",
            ["ring"]
        );
        let input_refused = family!(
            &r,
            IntCounterVec,
            "trigd_input_refused_total",
            "Datagrams and connections an input refused before they became frames (not_allowed, too_many_connections, idle, stalled, too_large).",
            ["source", "reason"]
        );
        let nats_acked = family!(
            &r,
            IntCounterVec,
            "trigd_nats_acked_total",
            "Frames of a NATS input acknowledged to the work queue after their decisions were written by every sink.",
            ["source"]
        );
        let nats_redelivered = family!(
            &r,
            IntCounterVec,
            "trigd_nats_redelivered_total",
            "Frames a NATS input received that the server had delivered before (to this node or another).",
            ["source"]
        );
        let tracking_overflow = family!(
            &r,
            IntCounterVec,
            "trigd_tracking_overflow_total",
            "Events the GPU tracking handed back to the CPU finder, by the step whose per-event limit or batch arena they exceeded (hits, doublets, triplets, neighbours, candidates, tracks, exchange, first_hits).",
            ["step"]
        );
        let finder_limit = family!(
            &r,
            IntCounterVec,
            "trigd_tracking_finder_limit_total",
            "Events whose track finding on the CPU filled a per-event buffer, by step: hits (the hits beyond the limit dropped), doublets, triplets or neighbours (the pass run again with the windows of a higher momentum, trigd_tracking_passes_raised_total, so tracks below it may be missing), candidates or tracks (the last candidates dropped). The event is decided on the tracks found.",
            ["step"]
        );
        let passes_raised = register(
            &r,
            "trigd_tracking_passes_raised_total",
            IntCounter::new(
                "trigd_tracking_passes_raised_total",
                "Finder passes run again with the windows of twice the momentum because their combinations filled a per-event buffer.",
            )
            .map_err(|source| MetricsError::Register {
                name: "trigd_tracking_passes_raised_total",
                source,
            })?,
        )?;
        let nats_consumer = family!(
            &r,
            IntGaugeVec,
            "trigd_nats_consumer_messages",
            "A NATS input's durable consumer as the server reports it, over all nodes: state=pending (not yet delivered), ack_pending (delivered, not acknowledged), redelivered (delivered again, not acknowledged).",
            ["source", "state"]
        );
        let beam_spot = family!(
            &r,
            GaugeVec,
            "trigd_tracking_beam_spot_mm",
            "Where the decided events' tracks come from on the finder's origin plane, over the last 500 tracks measured (one of every 8 events, above three times the finder's minimum momentum where the field measures it): quantity=centre (the median) or spread (1.4826 times the median absolute deviation), per axis; along the beam (axis=z) quantity=centre (the median z of the tracks' closest approach to the beam line) and half_length (the region they come from, a long target's). A centre off the finder's origin by more than a third of its box loses stiff tracks: set [tracking.finder] origin_x_mm, origin_y_mm; a region longer than the finder's origin_half_z_mm loses inclined tracks.",
            ["axis", "quantity"]
        );
        let stream_gaps = family!(
            &r,
            IntCounterVec,
            "trigd_stream_gaps_total",
            "Times a live stream (LSL) came back after going away; each is one decision with reason stream_gap.",
            ["source"]
        );
        let stream_gap_samples = family!(
            &r,
            IntCounterVec,
            "trigd_stream_gap_samples_total",
            "Samples a live stream (LSL) never delivered while it was away (from its time stamps).",
            ["source"]
        );
        let lsl_marker_latency = register(
            &r,
            "trigd_lsl_marker_latency_seconds",
            Histogram::with_opts(
                HistogramOpts::new(
                    "trigd_lsl_marker_latency_seconds",
                    "LSL time stamp of the block's last sample (clock-corrected) to the push of its LSL marker.",
                )
                .buckets(latency_buckets_s()),
            )
            .map_err(|source| MetricsError::Register {
                name: "trigd_lsl_marker_latency_seconds",
                source,
            })?,
        )?;
        let build_info = family!(
            &r,
            IntGaugeVec,
            "trigd_build_info",
            "Build of the running binary (value is always 1).",
            ["version", "git_commit", "rustc"]
        );
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                option_env!("TRIGD_GIT_COMMIT").unwrap_or("unknown"),
                option_env!("TRIGD_RUSTC_VERSION").unwrap_or("unknown"),
            ])
            .set(1);
        let start_time = register(
            &r,
            "trigd_start_time_seconds",
            Gauge::new(
                "trigd_start_time_seconds",
                "Process start, seconds since the Unix epoch.",
            )
            .map_err(|source| MetricsError::Register {
                name: "trigd_start_time_seconds",
                source,
            })?,
        )?;
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        start_time.set(now_s);

        Ok(Self {
            registry: r,
            frames_received,
            frames,
            sequence_gaps,
            sequence_repeats,
            decision_latency,
            stage,
            ring_fill,
            ring_capacity,
            batch_size,
            backend_active,
            worker_frames,
            backend_failovers,
            line_fired,
            accounting_balanced,
            udp_send_errors,
            sink_errors,
            sink_lost,
            ring_fill_max,
            input_refused,
            nats_acked,
            nats_redelivered,
            nats_consumer,
            tracking_overflow,
            finder_limit,
            passes_raised,
            beam_spot,
            stream_gaps,
            stream_gap_samples,
            lsl_marker_latency,
            watched_rings: Mutex::new(Vec::new()),
            sources: Mutex::new(Vec::new()),
            in_flight_max_frames: AtomicU64::new(0),
        })
    }

    /// The registry, to add process or custom collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// `trigd_tracking_overflow_total{step}`: events of the GPU tracking that `step` handed
    /// back to the CPU finder.
    pub fn tracking_overflow(&self, step: &str) -> IntCounter {
        self.tracking_overflow.with_label_values(&[step])
    }

    /// `trigd_tracking_finder_limit_total{step}`: events whose CPU track finding filled
    /// `step`'s per-event buffer.
    pub fn finder_limit(&self, step: &str) -> IntCounter {
        self.finder_limit.with_label_values(&[step])
    }

    /// `trigd_tracking_beam_spot_mm{axis, quantity}`.
    pub fn beam_spot(&self, axis: &str, quantity: &str) -> Gauge {
        self.beam_spot.with_label_values(&[axis, quantity])
    }

    /// `trigd_tracking_passes_raised_total`.
    pub fn passes_raised(&self) -> &IntCounter {
        &self.passes_raised
    }

    /// The steps of `trigd_tracking_finder_limit_total` with events, and their counts.
    pub fn finder_limits(&self) -> Vec<(&'static str, u64)> {
        crate::tracking::ca::Overflow::STEPS
            .iter()
            .map(|&s| (s, self.finder_limit.with_label_values(&[s]).get()))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Handles of a NATS input's metrics (resolved once, exported at 0).
    pub fn nats_source(&self, name: &str) -> NatsSourceMetrics {
        NatsSourceMetrics {
            acked: self.nats_acked.with_label_values(&[name]),
            redelivered: self.nats_redelivered.with_label_values(&[name]),
            pending: self.nats_consumer.with_label_values(&[name, "pending"]),
            ack_pending: self.nats_consumer.with_label_values(&[name, "ack_pending"]),
            consumer_redelivered: self.nats_consumer.with_label_values(&[name, "redelivered"]),
        }
    }

    /// Handle for source `name`: the five plain outcome children are resolved now and
    /// exported at 0. Handles for the same name share their accounting.
    pub fn source(&self, name: &str) -> SourceMetrics {
        let shared = {
            let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = sources.iter().find(|s| s.name == name) {
                Arc::clone(s)
            } else {
                let s = Arc::new(SourceShared {
                    name: name.to_owned(),
                    received: self.frames_received.with_label_values(&[name]),
                    decided: AtomicU64::new(0),
                    balanced: self.accounting_balanced.with_label_values(&[name]),
                });
                s.balanced.set(1);
                sources.push(Arc::clone(&s));
                s
            }
        };
        let plain = Outcome::ALL.map(|o| self.frames.with_label_values(&[name, o.as_str(), ""]));
        SourceMetrics {
            shared,
            frames: self.frames.clone(),
            plain,
            reasons: Vec::with_capacity(MAX_REASONS_PER_SOURCE),
            overflow: Default::default(),
            gaps: self.sequence_gaps.with_label_values(&[name]),
            repeats: self.sequence_repeats.with_label_values(&[name]),
        }
    }

    /// Handle for the decision thread: one [`SourceMetrics`] per configured source and one
    /// counter per trigger line, in the order of `names`.
    pub fn decisions(&self, names: &Names) -> DecisionMetrics {
        DecisionMetrics {
            sources: names.sources.iter().map(|n| self.source(n)).collect(),
            lines: names
                .lines
                .iter()
                .take(64)
                .map(|l| self.line_fired.with_label_values(&[l.as_str()]))
                .collect(),
            latency: self.decision_latency.clone(),
            latency_children: Default::default(),
        }
    }

    /// `trigd_decision_latency_seconds{workload,backend}` child (backend `none` for
    /// decisions made without a backend: dropped, malformed).
    pub fn decision_latency(&self, workload: Workload, backend: Option<BackendKind>) -> Histogram {
        self.decision_latency
            .with_label_values(&[workload.as_str(), backend_label(backend)])
    }

    /// `trigd_stage_seconds{stage}` child; observe seconds.
    pub fn stage(&self, stage: Stage) -> Histogram {
        self.stage.with_label_values(&[stage.as_str()])
    }

    /// All five stage histograms, indexed in [`Stage::ALL`] order.
    pub fn stages(&self) -> [Histogram; 5] {
        Stage::ALL.map(|s| self.stage(s))
    }

    /// Handle for ring `name` of `capacity_slots` slots; sets `trigd_ring_capacity{ring}` and
    /// adds the slots to the frames the accounting check allows in flight. Call once per ring.
    pub fn ring(&self, name: &str, capacity_slots: usize) -> RingMetrics {
        self.add_in_flight_frames(capacity_slots as u64);
        self.ring_capacity
            .with_label_values(&[name])
            .set(i64::try_from(capacity_slots).unwrap_or(i64::MAX));
        let fill = self.ring_fill.with_label_values(&[name]);
        fill.set(0.0);
        RingMetrics {
            fill,
            capacity_slots,
        }
    }

    /// Handle for backend `kind` (active gauge, batch size histogram); the gauge starts at 0.
    pub fn backend(&self, kind: BackendKind) -> BackendMetrics {
        let active = self.backend_active.with_label_values(&[kind.as_str()]);
        BackendMetrics {
            active,
            batch_size: self.batch_size.with_label_values(&[kind.as_str()]),
        }
    }

    /// `trigd_worker_frames_total{worker,device}`, exported at 0; resolved once per worker
    /// and device, so counting a batch is one atomic add.
    pub fn worker_frames(&self, worker: usize, device: &str) -> IntCounter {
        self.worker_frames
            .with_label_values(&[worker.to_string().as_str(), device])
    }

    /// `trigd_backend_failovers_total`.
    pub fn failovers(&self) -> IntCounter {
        self.backend_failovers.clone()
    }

    /// `trigd_udp_send_errors_total`, for [`crate::sinks::udp::UdpSink::with_error_counter`].
    pub fn udp_send_errors(&self) -> IntCounter {
        self.udp_send_errors.clone()
    }

    /// Counts one error of `sink` in `trigd_sink_errors_total{sink,kind}` (error path only).
    pub fn sink_error(&self, sink: &str, kind: &str) {
        self.sink_errors.with_label_values(&[sink, kind]).inc();
    }

    /// Counts `n` decisions `sink` lost in `trigd_sink_lost_total{sink}` (error path only).
    pub fn sink_lost(&self, sink: &str, n: u64) {
        self.sink_lost.with_label_values(&[sink]).inc_by(n);
    }

    /// Exports `trigd_sink_lost_total` at 0 for `sink`, so that alerts and dashboards see
    /// the series before the first loss (`trigd_sink_errors_total` has a child per error
    /// kind, made at its first error).
    pub fn prepare_sink(&self, sink: &str) {
        let _ = self.sink_lost.with_label_values(&[sink]);
    }

    /// Counts a live stream's return after `samples` missing samples
    /// (`trigd_stream_gaps_total`, `trigd_stream_gap_samples_total`; rare, off the hot path).
    pub fn stream_gap(&self, source: &str, samples: u64) {
        self.stream_gaps.with_label_values(&[source]).inc();
        self.stream_gap_samples
            .with_label_values(&[source])
            .inc_by(samples);
    }

    /// Exports the stream gap counters of `source` at 0.
    pub fn prepare_stream(&self, source: &str) {
        let _ = self.stream_gaps.with_label_values(&[source]);
        let _ = self.stream_gap_samples.with_label_values(&[source]);
    }

    /// `trigd_lsl_marker_latency_seconds`, for [`crate::sinks::lsl::LslMarkerSink`].
    pub fn lsl_marker_latency(&self) -> Histogram {
        self.lsl_marker_latency.clone()
    }

    /// `trigd_input_refused_total{source,reason}` child for an input (resolve once).
    pub fn input_refused(&self, source: &str, reason: &str) -> IntCounter {
        self.input_refused.with_label_values(&[source, reason])
    }

    /// Reads `fill`'s peak at every scrape into `trigd_ring_fill_max_ratio{ring}` (and its
    /// current level into `trigd_ring_fill_ratio`), then starts a new peak.
    pub fn watch_ring(&self, name: &str, fill: crate::ring::Fill) {
        let g = self.ring_fill_max.with_label_values(&[name]);
        self.watched_rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((g, fill));
    }

    fn refresh_rings(&self) {
        let rings = self
            .watched_rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (g, fill) in rings.iter() {
            let cap = fill.capacity().max(1) as f64;
            g.set(fill.take_max() as f64 / cap);
        }
    }

    /// Sets how many frames may legitimately be between arrival and decision;
    /// `trigd_accounting_balanced` tolerates this many. Starts at 0 (exact) and grows with
    /// every [`Metrics::ring`]; add batch and worker slots with [`Metrics::add_in_flight_frames`].
    pub fn set_in_flight_max_frames(&self, frames: u64) {
        self.in_flight_max_frames.store(frames, Ordering::Relaxed);
    }

    /// Adds `frames` to the in-flight bound (batch slots, frames held by workers).
    pub fn add_in_flight_frames(&self, frames: u64) {
        self.in_flight_max_frames
            .fetch_add(frames, Ordering::Relaxed);
    }

    /// Recomputes `trigd_accounting_balanced{source}` for every source. `in_flight_max`
    /// overrides the configured bound (pass `Some(0)` after draining at shutdown).
    /// Returns the sources that are out of balance, with (received, decided).
    pub fn check_accounting(&self, in_flight_max: Option<u64>) -> Vec<(String, u64, u64)> {
        let bound =
            in_flight_max.unwrap_or_else(|| self.in_flight_max_frames.load(Ordering::Relaxed));
        let sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        sources
            .iter()
            .filter(|s| !s.refresh(bound))
            .map(|s| {
                (
                    s.name.clone(),
                    s.received.get(),
                    s.decided.load(Ordering::Acquire),
                )
            })
            .collect()
    }

    /// Text exposition format (0.0.4) of every family; refreshes the accounting gauges first.
    pub fn render(&self) -> Result<String, MetricsError> {
        self.render_with(true)
    }

    /// As [`Metrics::render`]; with `take_peaks` false the ring peaks are left for the next
    /// scrape (`/metrics?peaks=keep`, what `trigd top` asks for, so that a terminal
    /// watching the daemon does not take the bursts from Prometheus's view).
    pub fn render_with(&self, take_peaks: bool) -> Result<String, MetricsError> {
        let _ = self.check_accounting(None);
        if take_peaks {
            self.refresh_rings();
        }
        let families = self.registry.gather();
        let mut buf = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&families, &mut buf)
            .map_err(MetricsError::Encode)?;
        String::from_utf8(buf)
            .map_err(|e| MetricsError::Encode(prometheus::Error::Msg(e.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Detail;

    fn decision(source: u16, outcome: Outcome, reason: &'static str, latency_ns: u64) -> Decision {
        Decision {
            delivery: 0,
            source,
            source_id: 7,
            seq: 1,
            timestamp_ns: 0,
            workload: Workload::Tracking,
            outcome,
            accepted: outcome == Outcome::Accept,
            reason,
            lines_fired: 0b101,
            latency_ns,
            backend: Some(BackendKind::Cpu),
            detail: Detail::None,
        }
    }

    /// Value of the sample line starting with `series ` in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn latency_buckets_span_one_microsecond_to_one_second() {
        let b = latency_buckets_s();
        assert!((b[0] - 1e-6).abs() < 1e-18);
        assert!(*b.last().unwrap() >= 1.0);
        assert!(b.windows(2).all(|w| (w[1] / w[0] - 2.0).abs() < 1e-12));
    }

    #[test]
    fn outcomes_reasons_latency_and_lines_are_exported() {
        let m = Metrics::new().unwrap();
        let names = Names {
            sources: vec!["udp0".into(), "file".into()],
            lines: vec!["two_tracks".into(), "high_pt".into(), "muon".into()],
        };
        let mut dm = m.decisions(&names);
        for _ in 0..3 {
            dm.sources()[0].received();
        }
        dm.record(&decision(0, Outcome::Accept, "", 2_000));
        dm.record(&decision(0, Outcome::Dropped, "ring_full", 3_000));
        dm.record(&decision(0, Outcome::Dropped, "ring_full", 500_000_000));
        let t = m.render().unwrap();
        assert_eq!(
            sample(
                &t,
                r#"trigd_frames_total{outcome="accept",reason="",source="udp0"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"trigd_frames_total{outcome="dropped",reason="ring_full",source="udp0"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_frames_received_total{source="udp0"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_accounting_balanced{source="udp0"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_trigger_line_fired_total{line="two_tracks"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_trigger_line_fired_total{line="high_pt"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_trigger_line_fired_total{line="muon"}"#),
            Some(3.0)
        );
        // 2 us and 3 us fall in le=4e-6; 0.5 s only in the larger buckets.
        let le4 = r#"trigd_decision_latency_seconds_bucket{backend="cpu",workload="tracking",le="0.000004"}"#;
        assert_eq!(sample(&t, le4), Some(2.0));
        let count = r#"trigd_decision_latency_seconds_count{backend="cpu",workload="tracking"}"#;
        assert_eq!(sample(&t, count), Some(3.0));
        let build = t
            .lines()
            .find(|l| l.starts_with("trigd_build_info{"))
            .unwrap();
        assert!(
            build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{build}"
        );
        assert!(
            build.contains("rustc=\"rustc 1."),
            "build.rs passes the rustc version: {build}"
        );
        assert!(build.ends_with("} 1"), "{build}");
        assert!(sample(&t, "trigd_start_time_seconds").unwrap() > 1.7e9);
    }

    #[test]
    fn accounting_detects_missing_and_extra_decisions() {
        let m = Metrics::new().unwrap();
        let mut s = m.source("tcp");
        s.received();
        s.received();
        s.count(Outcome::Reject, "");
        let bad = m.check_accounting(None);
        assert_eq!(bad, vec![("tcp".to_string(), 2, 1)]);
        assert!(
            m.check_accounting(Some(1)).is_empty(),
            "one frame in flight is tolerated"
        );
        s.count(Outcome::Malformed, "bad_crc");
        assert!(m.check_accounting(None).is_empty());
        s.count(Outcome::Accept, "");
        assert_eq!(
            m.check_accounting(Some(10)).len(),
            1,
            "more decisions than frames"
        );
        let t = m.render().unwrap();
        assert_eq!(
            sample(&t, r#"trigd_accounting_balanced{source="tcp"}"#),
            Some(0.0)
        );
    }

    #[test]
    fn frames_in_rings_count_as_in_flight() {
        let m = Metrics::new().unwrap();
        let s = m.source("udp0");
        for _ in 0..5 {
            s.received();
        }
        assert_eq!(m.check_accounting(None).len(), 1);
        let _ring = m.ring("udp0", 4);
        assert_eq!(
            m.check_accounting(None).len(),
            1,
            "5 undecided frames > 4 ring slots"
        );
        m.add_in_flight_frames(1);
        assert!(m.check_accounting(None).is_empty());
        assert_eq!(
            m.check_accounting(Some(0)).len(),
            1,
            "after draining, exact"
        );
    }

    #[test]
    fn reason_cardinality_is_bounded() {
        let m = Metrics::new().unwrap();
        let mut s = m.source("s");
        let reasons: Vec<&'static str> = (0..MAX_REASONS_PER_SOURCE + 5)
            .map(|i| &*Box::leak(format!("r{i}").into_boxed_str()))
            .collect();
        for r in &reasons {
            s.count(Outcome::Malformed, r);
        }
        // A reason equal in text but at another address reuses the cached child.
        s.count(
            Outcome::Malformed,
            Box::leak(String::from("r0").into_boxed_str()),
        );
        let t = m.render().unwrap();
        assert_eq!(
            sample(
                &t,
                r#"trigd_frames_total{outcome="malformed",reason="r0",source="s"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"trigd_frames_total{outcome="malformed",reason="other",source="s"}"#
            ),
            Some(5.0)
        );
        let n = t
            .lines()
            .filter(|l| l.starts_with("trigd_frames_total{") && l.contains("malformed"))
            .count();
        assert_eq!(
            n,
            MAX_REASONS_PER_SOURCE + 2,
            "cached reasons + other + plain"
        );
    }

    #[test]
    fn ring_peaks_sink_errors_and_refusals_are_exported() {
        let m = Metrics::new().unwrap();
        let (mut tx, mut rx, fill) = crate::ring::channel::<u8>(10);
        m.watch_ring("udp0->w0", fill);
        for i in 0..8 {
            tx.try_push(i).unwrap();
        }
        for _ in 0..7 {
            rx.try_pop();
        }
        // The burst to 8 of 10 is gone by the scrape but its peak is not.
        let t = m.render().unwrap();
        assert_eq!(
            sample(&t, r#"trigd_ring_fill_max_ratio{ring="udp0->w0"}"#),
            Some(0.8)
        );
        let t = m.render().unwrap();
        assert_eq!(
            sample(&t, r#"trigd_ring_fill_max_ratio{ring="udp0->w0"}"#),
            Some(0.1),
            "a new peak starts at each scrape"
        );
        m.prepare_sink("jsonl");
        m.sink_error("jsonl", "storage_full");
        m.sink_error("jsonl", "storage_full");
        m.sink_lost("udp", 3);
        m.input_refused("udp0", "not_allowed").inc();
        let t = m.render().unwrap();
        assert_eq!(
            sample(
                &t,
                r#"trigd_sink_errors_total{kind="storage_full",sink="jsonl"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_sink_lost_total{sink="jsonl"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_sink_lost_total{sink="udp"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"trigd_input_refused_total{reason="not_allowed",source="udp0"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn stages_rings_and_backends() {
        let m = Metrics::new().unwrap();
        m.stage(Stage::Reconstruct).observe(0.25e-3);
        let r = m.ring("udp0", 1024);
        r.set_fill(256);
        let gpu = m.backend(BackendKind::Gpu);
        gpu.set_active(true);
        gpu.observe_batch(300);
        m.failovers().inc();
        let t = m.render().unwrap();
        assert_eq!(
            sample(&t, r#"trigd_stage_seconds_count{stage="reconstruct"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_ring_fill_ratio{ring="udp0"}"#),
            Some(0.25)
        );
        assert_eq!(
            sample(&t, r#"trigd_ring_capacity{ring="udp0"}"#),
            Some(1024.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_backend_active{backend="gpu"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_batch_size_bucket{backend="gpu",le="256"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&t, r#"trigd_batch_size_bucket{backend="gpu",le="512"}"#),
            Some(1.0)
        );
        assert_eq!(sample(&t, "trigd_backend_failovers_total"), Some(1.0));
    }
}
