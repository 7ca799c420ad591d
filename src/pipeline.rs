//! The runtime: sources -> rings -> workers (batch, deadline, backend) -> decision thread
//! (sinks, metrics, accounting). Every frame taken in leaves as exactly one [`Decision`].
//!
//! Threads and ownership (all queues bounded, all buffers allocated here at start-up):
//! - one thread per input. It validates each frame (`frame::parse`), tracks sequence
//!   numbers, copies the frame into a free slot of its own pool and pushes the slot to a
//!   worker ring. A socket source never waits: no free slot or a full ring makes the frame
//!   `dropped` (`ring_full`). A file source waits instead (a file can be paused, hardware
//!   cannot), so replay never drops.
//! - `workers` reconstruction threads. Each drains its rings into a batch (bounded by
//!   `batch_max`; it waits up to `batch_wait_us` after the first frame for more), gives frames
//!   whose deadline already passed the `timeout` outcome, hands the rest to its backend and
//!   passes (decision, slot) to the decision thread. A backend error fails the batch over to
//!   the CPU fallback backend when there is one.
//! - one decision thread. It writes every sink, feeds the observer (metrics), keeps the
//!   accounting and returns each slot to its source's pool.
//!
//! Malformed and dropped frames never occupy a slot: their small records travel to the
//! decision thread on a bounded control channel.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use zerocopy::FromBytes;

use crate::backend::{Backend, BackendKind, Detail, Verdict};
use crate::config::{Admission, Config, DaemonConfig, Speed, TimeoutPolicy};
use crate::decision::{Decision, Names, Outcome, Workload};
use crate::frame::{self, FrameKind, FrameView};
use crate::ring::{self, Fill, Rx, Slot, Tx};
use crate::sinks::guard::{Episode, GuardedSink, SinkTotals};
use crate::sources::{Received, SeqEvent, SequenceTracker};

/// Pipeline stages timed for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Arrival to the start of the frame's batch.
    Queue,
    /// Batch formation (waiting for more frames).
    Batch,
    /// The backend's reconstruction and trigger, per batch.
    Reconstruct,
    /// Reconstruction end to the decision record.
    Decide,
    /// Writing one decision to every sink.
    Sink,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::Queue,
        Stage::Batch,
        Stage::Reconstruct,
        Stage::Decide,
        Stage::Sink,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Batch => "batch",
            Stage::Reconstruct => "reconstruct",
            Stage::Decide => "decide",
            Stage::Sink => "sink",
        }
    }
}

/// What the runtime reports as it goes; the metrics layer implements it.
pub trait Observe: Send + Sync {
    fn received(&self, _source: u16) {}
    fn stage(&self, _stage: Stage, _seconds: f64) {}
    fn batch(&self, _backend: BackendKind, _size: usize) {}
    /// Where worker `worker` counts the frames it reconstructs on `device` (`cpu`,
    /// `gpuN`): asked once per backend when the worker starts, then called per batch.
    fn worker_frames(&self, _worker: usize, _device: &str) -> Option<FrameCount> {
        None
    }
    fn sequence_gap(&self, _source: u16, _missing: u64) {}
    fn sequence_repeat(&self, _source: u16) {}
    fn failover(&self) {}
    /// A sink (`jsonl`, `binlog`, `udp`, `recording`) failed to write or flush.
    fn sink_error(&self, _sink: &'static str, _error: &std::io::Error) {}
    /// `n` decisions (or accepted frames) a sink will never hold.
    fn sink_lost(&self, _sink: &'static str, _n: u64) {}
    fn ring_fill(&self, _ring: &str, _fill: &Fill) {}
    fn accounting(&self, _source: u16, _balanced: bool) {}
    /// A network input refused a datagram or connection (never a frame).
    fn refused(&self, _source: u16, _reason: &'static str) {}
    /// A NATS input's consumer, as the server reports it (about once a second).
    fn consumer_state(&self, _source: u16, _state: &crate::sources::nats::ConsumerState) {}
    /// A NATS input received a message delivered before (to this node or another).
    fn redelivered(&self, _source: u16) {}
    /// A NATS input acknowledged `n` frames whose decisions were written.
    fn acked(&self, _source: u16, _n: u64) {}
    /// A live stream (LSL) came back after `samples` samples it never delivered.
    fn stream_gap(&self, _source: u16, _samples: u64) {}
}

/// Adds a batch's frames to a count kept by an [`Observe`] implementation.
pub type FrameCount = Box<dyn Fn(u64) + Send + Sync>;

/// An observer that records nothing.
pub struct NoObserver;
impl Observe for NoObserver {}

/// Why a file feed could not produce a frame.
#[derive(Debug, Clone)]
pub struct FeedError {
    pub reason: &'static str,
    pub detail: String,
}

/// Frames from a file (recording, CSV directory, EDF): one frame at a time into a buffer.
pub trait FrameFeed: Send {
    /// Clears `buf` and writes the next complete frame into it; `None` at the end.
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>>;
    /// Number of frames, if known (for progress).
    fn total(&self) -> Option<u64> {
        None
    }
}

/// One input of the pipeline.
pub enum InputKind {
    /// A bound UDP socket or TCP listener and what it admits; never waits for the pipeline.
    Socket(crate::sources::BoundSource, crate::sources::Limits),
    File(Box<dyn FrameFeed>, Speed),
    /// A JetStream pull consumer (a farm node): waits for room instead of dropping, and
    /// acknowledges each frame once its decision is written by every sink.
    Nats(Box<crate::sources::nats::NatsSource>),
    /// A Lab Streaming Layer EEG stream; never waits for the pipeline.
    Lsl(Box<crate::sources::lsl::LslInput>),
}

pub struct Input {
    pub name: String,
    pub kind: InputKind,
}

/// Per-input totals at the end.
#[derive(Debug, Clone, Default)]
pub struct SourceTotals {
    pub name: String,
    pub frames_in: u64,
    /// Indexed by `Outcome as usize`.
    pub outcomes: [u64; 5],
    pub sequence_gaps: u64,
    pub sequence_repeats: u64,
}

impl SourceTotals {
    pub fn decided(&self) -> u64 {
        self.outcomes.iter().sum()
    }
    pub fn balanced(&self) -> bool {
        self.decided() == self.frames_in
    }
}

/// Log-bucketed latency histogram for the end-of-run summary (1 us .. ~1000 s, 8 buckets
/// per octave, so a quantile is within 9%); fixed size, no allocation per record.
#[derive(Clone)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    max_ns: u64,
    n: u64,
}

const SUB: usize = 8;

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; 64 * SUB],
            max_ns: 0,
            n: 0,
        }
    }
}

impl LatencyHistogram {
    fn bucket(ns: u64) -> usize {
        let v = ns.max(1);
        let octave = 63 - v.leading_zeros() as usize;
        let frac = if octave >= 3 {
            ((v >> (octave - 3)) & 7) as usize
        } else {
            0
        };
        (octave * SUB + frac).min(64 * SUB - 1)
    }
    fn bucket_upper_ns(b: usize) -> u64 {
        let octave = b / SUB;
        let frac = (b % SUB) as u64;
        if octave >= 3 {
            ((8 + frac + 1) << (octave - 3)).saturating_sub(1)
        } else {
            (1u64 << (octave + 1)) - 1
        }
    }
    pub fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.max_ns = self.max_ns.max(ns);
        self.n += 1;
    }
    pub fn count(&self) -> u64 {
        self.n
    }
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }
    /// Upper edge of the bucket holding quantile `q` (0..=1), capped by the maximum seen.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_upper_ns(b).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// What a run reports when it ends.
#[derive(Clone, Default)]
pub struct Summary {
    pub sources: Vec<SourceTotals>,
    pub latency: LatencyHistogram,
    /// From the backends ready (the inputs open) to the last decision.
    pub elapsed: Duration,
    /// Building the backends before the first frame (a GPU's context, kernels, arenas and
    /// warm-up launch), not in `elapsed`.
    pub startup: Duration,
    /// Frames decided per backend kind (cpu, gpu).
    pub by_backend: [u64; 2],
    pub failovers: u64,
    /// Write and flush errors of every sink, the accepted-frame recording included.
    pub sink_errors: u64,
    /// What each decision sink did.
    pub sinks: Vec<SinkTotals>,
    /// Accepted frames the accepted-frame recording failed to take.
    pub recording_lost: u64,
    /// Events whose track finding on the CPU filled a per-event buffer, by step (the
    /// steps with any), and the passes run again at a higher momentum for it.
    pub finder_limits: Vec<(&'static str, u64)>,
    pub passes_raised: u64,
}

impl Summary {
    pub fn frames_in(&self) -> u64 {
        self.sources.iter().map(|s| s.frames_in).sum()
    }
    pub fn outcome(&self, o: Outcome) -> u64 {
        self.sources.iter().map(|s| s.outcomes[o as usize]).sum()
    }
    pub fn balanced(&self) -> bool {
        self.sources.iter().all(SourceTotals::balanced)
    }
    /// Decisions (and accepted frames) not written where they should be, best-effort sinks
    /// aside: non-zero makes the run fail.
    pub fn undelivered(&self) -> u64 {
        self.sinks.iter().map(SinkTotals::undelivered).sum::<u64>() + self.recording_lost
    }
}

/// Builds a backend for worker `i` (each worker owns one).
pub type BackendFactory<'a> = &'a (dyn Fn(usize) -> anyhow::Result<Box<dyn Backend>> + Sync);

/// Builds the sinks, each behind its failure policy, once the names (sources, trigger
/// lines) are known.
pub type MakeSinks<'a> = Box<dyn FnOnce(&Names) -> anyhow::Result<Vec<GuardedSink>> + Send + 'a>;
/// Sees every decision, on the decision thread.
pub type OnDecision<'a> = Box<dyn FnMut(&Decision, &Names) + Send + 'a>;
/// Receives the bytes of every accepted frame.
pub type AcceptedFrames = Box<dyn FnMut(&[u8]) -> std::io::Result<()> + Send>;

/// Everything a run needs besides its inputs.
pub struct Runtime<'a> {
    pub daemon: DaemonConfig,
    pub workload: Workload,
    /// Deadlines apply (live sources, paced replay); off for `--speed max` throughput replay.
    pub deadlines: bool,
    /// Every frame of one producer (header `source_id`) goes to worker `source_id % workers`
    /// and nowhere else, so a stream's frames keep their order and their state on one
    /// worker (EEG); otherwise frames go round-robin to whichever worker has room.
    pub ordered_by_source: bool,
    /// Builds the sinks once the names (sources, trigger lines) are known.
    pub make_sinks: MakeSinks<'a>,
    /// Sees every decision (metrics), on the decision thread.
    pub on_decision: OnDecision<'a>,
    /// Receives the bytes of every accepted frame (the accepted-frame recording).
    pub accepted: Option<AcceptedFrames>,
    pub observer: Arc<dyn Observe>,
    pub stop: Arc<AtomicBool>,
    /// New configurations to apply (SIGHUP).
    pub reload: Option<Receiver<Arc<Config>>>,
    /// Set when the pipeline is running (for `/readyz`).
    pub ready: Option<Arc<AtomicBool>>,
    /// Called with the running count of decided frames (progress bars).
    pub progress: Option<Box<dyn Fn(u64) + Send>>,
    /// Set (by SIGHUP) to reopen the decision logs; the decision thread clears it.
    pub reopen: Option<Arc<AtomicBool>>,
    /// The service manager's notification socket (`trigd run` under systemd): readiness,
    /// status, drain and watchdog pings from the decision thread.
    pub notify: Option<Arc<crate::notify::Notifier>>,
}

/// What the decision thread owns.
struct DecideCtx<'a> {
    sinks: Vec<GuardedSink>,
    on_decision: OnDecision<'a>,
    accepted: Option<AcceptedFrames>,
    /// Failure episode of the accepted-frame recording.
    accepted_episode: Episode,
    observer: Arc<dyn Observe>,
    progress: Option<Box<dyn Fn(u64) + Send>>,
    workload: Workload,
    ready: Option<Arc<AtomicBool>>,
    reopen: Option<Arc<AtomicBool>>,
    stop: Arc<AtomicBool>,
    /// Set while a blocking sink pauses the decision thread (sources drop `sink_blocked`).
    sink_blocked: Arc<AtomicBool>,
    /// systemd's watchdog, pinged from the decision loop while the pipeline progresses.
    watchdog: Option<crate::notify::Watchdog>,
}

struct SideRecord {
    source: u16,
    source_id: u32,
    seq: u64,
    timestamp_ns: u64,
    outcome: Outcome,
    reason: &'static str,
    arrival: Instant,
    /// See [`Slot::delivery`].
    delivery: u64,
}

struct Done {
    decision: Decision,
    slot: Box<Slot>,
}

struct SourceShared {
    frames_in: AtomicU64,
    gaps: AtomicU64,
    repeats: AtomicU64,
}

/// The work waiting in the rings, as the admission policy measures it.
struct Load {
    /// Frames pushed to the worker rings and not yet taken by a worker.
    queued: AtomicUsize,
    /// Reconstruction time per frame, nanoseconds, smoothed over batches; 0 until measured.
    per_frame_ns: AtomicU64,
    workers: u64,
}

impl Load {
    /// Time the frames already queued will take to reconstruct, nanoseconds.
    #[inline]
    fn wait_ns(&self) -> u64 {
        let queued = self.queued.load(Ordering::Relaxed) as u64;
        queued.saturating_mul(self.per_frame_ns.load(Ordering::Relaxed)) / self.workers.max(1)
    }

    /// A batch of `frames` took `ns`: an exponential average with weight 1/8.
    fn observe(&self, ns: u64, frames: usize) {
        if frames == 0 {
            return;
        }
        let sample = ns / frames as u64;
        let old = self.per_frame_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.per_frame_ns.store(new.max(1), Ordering::Relaxed);
    }
}

/// Runs the pipeline until every input has ended (files) or `stop` is set (sockets), and
/// every frame taken in has its decision. Returns the accounting.
pub fn run(
    rt: Runtime<'_>,
    inputs: Vec<Input>,
    make_backend: BackendFactory<'_>,
    fallback: Option<BackendFactory<'_>>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let n_inputs = inputs.len();
    anyhow::ensure!(
        n_inputs > 0,
        "no inputs configured: give --listen or an input file"
    );
    let Runtime {
        daemon,
        workload,
        deadlines,
        ordered_by_source,
        make_sinks,
        on_decision,
        accepted,
        observer,
        stop,
        reload,
        ready,
        progress,
        reopen,
        notify,
    } = rt;
    let workers = daemon.workers.max(1);
    let slots = daemon.ring_slots;

    // Backends first: a backend that cannot start stops the run before any socket opens.
    let mut backends = Vec::with_capacity(workers);
    let mut fallbacks = Vec::with_capacity(workers);
    for w in 0..workers {
        backends.push(make_backend(w)?);
        fallbacks.push(match fallback {
            Some(f) => Some(f(w)?),
            None => None,
        });
    }
    let mut names = Names {
        sources: inputs.iter().map(|i| i.name.clone()).collect(),
        lines: Vec::new(),
    };
    names.lines = backends[0].line_names().to_vec();
    // The run's clock starts once the backends are ready: a GPU's start-up is reported
    // apart, so a short replay's rate is the rate frames are decided at.
    let startup = started.elapsed();
    let started = Instant::now();
    let names = Arc::new(names);
    let sink_blocked = Arc::new(AtomicBool::new(false));
    let heartbeats = crate::notify::Heartbeats::new(workers);
    let watchdog = notify
        .map(|n| crate::notify::Watchdog::new(n, heartbeats.clone(), backends[0].kind().as_str()));
    let mut dctx = DecideCtx {
        sinks: make_sinks(&names)?,
        on_decision,
        accepted,
        accepted_episode: Episode::default(),
        observer: observer.clone(),
        progress,
        workload,
        ready: ready.clone(),
        reopen,
        stop: stop.clone(),
        sink_blocked: sink_blocked.clone(),
        watchdog,
    };

    // Rings: per input, a free-slot ring (decision thread -> source) and one work ring per
    // worker (source -> worker); per worker, a done ring (worker -> decision thread) large
    // enough for every slot in existence, so it can never be full.
    let mut free_tx = Vec::new();
    let mut source_ends = Vec::new();
    let mut worker_rx: Vec<Vec<Rx<Box<Slot>>>> = (0..workers).map(|_| Vec::new()).collect();
    let mut fills = Vec::new();
    for (i, _) in inputs.iter().enumerate() {
        let (mut ftx, frx, _) = ring::channel::<Box<Slot>>(slots);
        for _ in 0..slots {
            let ok = ftx
                .try_push(Slot::with_capacity(daemon.slot_bytes, i as u16))
                .is_ok();
            debug_assert!(ok, "free ring sized for the pool");
        }
        free_tx.push(ftx);
        let mut txs = Vec::new();
        for (w, rxs) in worker_rx.iter_mut().enumerate() {
            let (tx, rx, fill) = ring::channel::<Box<Slot>>(slots);
            txs.push(tx);
            rxs.push(rx);
            fills.push((format!("{}->w{}", names.source(i as u16), w), fill));
        }
        source_ends.push((frx, txs));
    }
    let total_slots = slots * n_inputs;
    let mut done_rx = Vec::new();
    let mut done_tx = Vec::new();
    for w in 0..workers {
        let (tx, rx, fill) = ring::channel::<Done>(total_slots);
        done_tx.push(tx);
        done_rx.push(rx);
        fills.push((format!("w{w}->decide"), fill));
    }
    let (side_tx, side_rx) = crossbeam_channel::bounded::<SideRecord>(65536.max(total_slots));

    let shared: Arc<Vec<SourceShared>> = Arc::new(
        (0..n_inputs)
            .map(|_| SourceShared {
                frames_in: AtomicU64::new(0),
                gaps: AtomicU64::new(0),
                repeats: AtomicU64::new(0),
            })
            .collect(),
    );
    let sources_live = Arc::new(AtomicUsize::new(n_inputs));
    let load = Arc::new(Load {
        queued: AtomicUsize::new(0),
        per_frame_ns: AtomicU64::new(0),
        workers: workers as u64,
    });
    // Shedding applies where deadlines do.
    let admission_budget_ns = (deadlines && daemon.admission == Admission::Deadline)
        .then(|| daemon.budget().as_nanos() as u64);
    let workers_live = Arc::new(AtomicUsize::new(workers));
    let failovers = Arc::new(AtomicU64::new(0));
    let mut reloads: Vec<Sender<Arc<Config>>> = Vec::new();

    // NATS inputs: a channel from the decision thread to each input's acknowledging thread,
    // for the deliveries whose decisions are written (at most the input's slots are held).
    let mut acks = Acks {
        tx: (0..n_inputs).map(|_| None).collect(),
        held: Vec::with_capacity(total_slots),
        since: None,
    };
    let mut ackers = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        if let InputKind::Nats(src) = &input.kind {
            let (tx, rx) = crossbeam_channel::bounded::<u64>(slots.max(1) * 2);
            acks.tx[i] = Some(tx);
            ackers.push((i as u16, src.acker(), rx));
        }
    }

    let summary = std::thread::scope(|scope| -> anyhow::Result<Summary> {
        // Acknowledging threads of the NATS inputs: they end when the decision thread drops
        // its ends of their channels, after its last flush.
        for (i, acker, rx) in ackers {
            let observer = observer.clone();
            std::thread::Builder::new()
                .name(format!("ack-{i}"))
                .spawn_scoped(scope, move || acker.run(rx, |n| observer.acked(i, n)))?;
        }
        // Sources.
        let mut source_handles = Vec::new();
        for ((i, input), (frx, txs)) in inputs.into_iter().enumerate().zip(source_ends) {
            let ctx = SourceCtx {
                index: i as u16,
                free: frx,
                work: txs,
                next_worker: 0,
                by_source: ordered_by_source,
                side: side_tx.clone(),
                shared: shared.clone(),
                observer: observer.clone(),
                tracker: SequenceTracker::default(),
                spare: None,
                sink_blocked: sink_blocked.clone(),
                load: load.clone(),
                admission_budget_ns,
            };
            let stop = stop.clone();
            let live = sources_live.clone();
            let name = input.name.clone();
            source_handles.push(
                std::thread::Builder::new()
                    .name(format!("src-{i}"))
                    .spawn_scoped(scope, move || {
                        let r = run_source(ctx, input.kind, &stop);
                        live.fetch_sub(1, Ordering::AcqRel);
                        if let Err(e) = &r {
                            tracing::error!(input = %name, "source stopped: {e}");
                        }
                        r
                    })?,
            );
        }
        drop(side_tx);

        // Workers.
        let mut worker_handles = Vec::new();
        for (w, ((rxs, dtx), (backend, fb))) in worker_rx
            .into_iter()
            .zip(done_tx)
            .zip(backends.into_iter().zip(fallbacks))
            .enumerate()
        {
            let (rtx, rrx) = crossbeam_channel::bounded::<Arc<Config>>(4);
            reloads.push(rtx);
            let wctx = WorkerCtx {
                triage: Vec::with_capacity(daemon.batch_max),
                views: Vec::with_capacity(daemon.batch_max),
                rings: rxs,
                done: dtx,
                backend,
                fallback: fb,
                daemon: daemon.clone(),
                workload,
                deadlines,
                observer: observer.clone(),
                sources_live: sources_live.clone(),
                reload: rrx,
                failovers: failovers.clone(),
                load: load.clone(),
                heartbeats: heartbeats.clone(),
                index: w,
                tally: Default::default(),
            };
            let live = workers_live.clone();
            worker_handles.push(
                std::thread::Builder::new()
                    .name(format!("worker-{w}"))
                    .spawn_scoped(scope, move || {
                        run_worker(wctx);
                        live.fetch_sub(1, Ordering::AcqRel);
                    })?,
            );
        }

        // Reload fan-out (SIGHUP): one control thread forwarding to every worker.
        if let Some(rx) = reload {
            let live = workers_live.clone();
            scope.spawn(move || loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(cfg) => {
                        for tx in &reloads {
                            let _ = tx.send(cfg.clone());
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if live.load(Ordering::Acquire) == 0 {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            });
        } else {
            drop(reloads);
        }
        if let Some(r) = &ready {
            r.store(true, Ordering::Release);
        }
        if let Some(w) = dctx.watchdog.as_mut() {
            w.ready(n_inputs);
        }

        // The decision thread is this one.
        let mut summary = decide_loop(
            &mut dctx,
            &names,
            done_rx,
            side_rx,
            free_tx,
            &workers_live,
            &shared,
            &fills,
            acks,
        );
        for h in source_handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.context("a source failed")),
                Err(_) => anyhow::bail!("a source thread panicked"),
            }
        }
        for h in worker_handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?;
        }
        summary.failovers = failovers.load(Ordering::Relaxed);
        Ok(summary)
    })?;
    if let Some(r) = &ready {
        r.store(false, Ordering::Release);
    }
    let mut summary = summary;
    summary.elapsed = started.elapsed();
    summary.startup = startup;
    for (i, s) in summary.sources.iter_mut().enumerate() {
        s.name = names.source(i as u16).to_string();
        s.frames_in = shared[i].frames_in.load(Ordering::Acquire);
        s.sequence_gaps = shared[i].gaps.load(Ordering::Relaxed);
        s.sequence_repeats = shared[i].repeats.load(Ordering::Relaxed);
        observer.accounting(i as u16, s.balanced());
    }
    Ok(summary)
}

struct SourceCtx {
    index: u16,
    free: Rx<Box<Slot>>,
    work: Vec<Tx<Box<Slot>>>,
    next_worker: usize,
    /// See [`Runtime::ordered_by_source`].
    by_source: bool,
    side: Sender<SideRecord>,
    shared: Arc<Vec<SourceShared>>,
    observer: Arc<dyn Observe>,
    tracker: SequenceTracker,
    spare: Option<Box<Slot>>,
    /// See [`DecideCtx::sink_blocked`].
    sink_blocked: Arc<AtomicBool>,
    load: Arc<Load>,
    /// Admission `deadline`: shed a socket frame when the queued work exceeds this.
    admission_budget_ns: Option<u64>,
}

impl SourceCtx {
    fn side(&self, bytes: &[u8], outcome: Outcome, reason: &'static str, arrival: Instant) {
        self.side_delivered(bytes, outcome, reason, arrival, 0);
    }

    /// [`SourceCtx::side`] for a frame with a delivery to acknowledge.
    fn side_delivered(
        &self,
        bytes: &[u8],
        outcome: Outcome,
        reason: &'static str,
        arrival: Instant,
        delivery: u64,
    ) {
        let (source_id, seq, timestamp_ns) = match frame::FrameHeader::read_from_prefix(bytes) {
            Ok((h, _)) if h.magic == frame::MAGIC => {
                (h.source_id.get(), h.sequence.get(), h.timestamp_ns.get())
            }
            _ => (0, 0, 0),
        };
        let rec = SideRecord {
            source: self.index,
            source_id,
            seq,
            timestamp_ns,
            outcome,
            reason,
            arrival,
            delivery,
        };
        // The channel is larger than the slot pool; if the decision thread is that far
        // behind, the source waits rather than lose the record.
        if self.side.send(rec).is_err() {
            tracing::error!("decision thread gone; a record is lost");
        }
    }

    fn observe_sequence(&mut self, view: &FrameView<'_>) {
        match self.tracker.observe(view.source_id(), view.sequence()) {
            SeqEvent::Gap(n) => {
                self.shared[self.index as usize]
                    .gaps
                    .fetch_add(n, Ordering::Relaxed);
                self.observer.sequence_gap(self.index, n);
            }
            SeqEvent::Repeat => {
                self.shared[self.index as usize]
                    .repeats
                    .fetch_add(1, Ordering::Relaxed);
                self.observer.sequence_repeat(self.index);
            }
            _ => {}
        }
    }

    fn count_in(&self) {
        self.shared[self.index as usize]
            .frames_in
            .fetch_add(1, Ordering::Release);
        self.observer.received(self.index);
    }

    /// Takes in the record of blocks a live stream never delivered: one decision,
    /// `dropped` with the source's reason.
    fn lost(&mut self, r: &Received<'_>, arrival: Instant) {
        let Received::Lost {
            reason,
            source_id,
            sequence,
            timestamp_ns,
            samples,
            ..
        } = *r
        else {
            return;
        };
        self.count_in();
        self.observer.stream_gap(self.index, samples);
        let rec = SideRecord {
            source: self.index,
            source_id,
            seq: sequence,
            timestamp_ns,
            outcome: Outcome::Dropped,
            reason,
            arrival,
            delivery: 0,
        };
        if self.side.send(rec).is_err() {
            tracing::error!("decision thread gone; a record is lost");
        }
    }

    /// Takes in one frame from a socket: validate, slot, ring; never waits.
    fn admit(&mut self, bytes: &[u8], arrival: Instant) {
        self.count_in();
        let view = match frame::parse(bytes) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(source = self.index, "malformed frame: {e}");
                self.side(bytes, Outcome::Malformed, e.reason(), arrival);
                return;
            }
        };
        self.observe_sequence(&view);
        if let Some(budget_ns) = self.admission_budget_ns {
            if self.load.wait_ns() > budget_ns {
                self.side(bytes, Outcome::Dropped, "overload", arrival);
                return;
            }
        }
        let Some(mut slot) = self.spare.take().or_else(|| self.free.try_pop()) else {
            self.side(bytes, Outcome::Dropped, self.full_reason(), arrival);
            return;
        };
        slot.fill(bytes, arrival);
        if let Err(slot) = self.push(slot) {
            self.side(&slot.bytes, Outcome::Dropped, self.full_reason(), arrival);
            self.spare = Some(slot);
        }
    }

    /// Takes in one frame from a NATS input: validate, then wait for a slot and a ring
    /// place. Nothing is dropped: the stream keeps what the node has no room for, and the
    /// input pulls only as many frames as it has slots, so the wait is short.
    fn admit_delivery(&mut self, bytes: &[u8], delivery: u64, arrival: Instant) {
        self.count_in();
        let view = match frame::parse(bytes) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(source = self.index, "malformed frame: {e}");
                self.side_delivered(bytes, Outcome::Malformed, e.reason(), arrival, delivery);
                return;
            }
        };
        self.observe_sequence(&view);
        let mut slot = loop {
            if let Some(s) = self.spare.take().or_else(|| self.free.try_pop()) {
                break s;
            }
            std::thread::yield_now();
        };
        slot.fill(bytes, arrival);
        slot.delivery = delivery;
        let mut pending = slot;
        while let Err(back) = self.push(pending) {
            pending = back;
            std::thread::yield_now();
        }
    }

    /// Why there is no room: a blocked sink holds the slots, or the workers are behind.
    fn full_reason(&self) -> &'static str {
        if self.sink_blocked.load(Ordering::Relaxed) {
            "sink_blocked"
        } else {
            "ring_full"
        }
    }

    /// Pushes the slot to a worker ring (see [`SourceCtx::push_ring`]) and counts it queued.
    fn push(&mut self, slot: Box<Slot>) -> Result<(), Box<Slot>> {
        self.push_ring(slot)?;
        self.load.queued.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Round-robin over the workers' rings; a full ring passes the frame to the next one.
    /// Ordered by source: only the ring of the frame's worker (a full ring is full).
    fn push_ring(&mut self, mut slot: Box<Slot>) -> Result<(), Box<Slot>> {
        let n = self.work.len();
        if self.by_source {
            // The header was validated before the slot was filled.
            let id = frame::FrameHeader::read_from_prefix(&slot.bytes)
                .map(|(h, _)| h.source_id.get())
                .unwrap_or(0);
            return self.work[id as usize % n].try_push(slot);
        }
        for k in 0..n {
            let w = (self.next_worker + k) % n;
            match self.work[w].try_push(slot) {
                Ok(()) => {
                    self.next_worker = (w + 1) % n;
                    return Ok(());
                }
                Err(back) => slot = back,
            }
        }
        Err(slot)
    }
}

fn run_source(mut ctx: SourceCtx, kind: InputKind, stop: &AtomicBool) -> anyhow::Result<()> {
    match kind {
        InputKind::Socket(source, limits) => {
            let mut refused = 0u64;
            let on = |r: Received<'_>, arrival: Instant| {
                match r {
                    Received::Refused { reason, peer } => {
                        refused += 1;
                        ctx.observer.refused(ctx.index, reason);
                        // The first refusals, then every power of two: a flood does not
                        // flood the log.
                        if refused.is_power_of_two() {
                            tracing::warn!(source = ctx.index, %peer, reason, refused, "refused a sender");
                        }
                    }
                    Received::Frame(bytes) => ctx.admit(bytes, arrival),
                    Received::Malformed { reason, detail } => {
                        ctx.count_in();
                        tracing::warn!(source = ctx.index, reason, "malformed input: {detail}");
                        ctx.side(&[], Outcome::Malformed, reason, arrival);
                    }
                    lost @ Received::Lost { .. } => ctx.lost(&lost, arrival),
                }
                std::ops::ControlFlow::Continue(())
            };
            let stats = source.run_limited(&limits, stop, on)?;
            tracing::info!(
                source = ctx.index,
                frames = stats.frames,
                malformed = stats.malformed,
                refused = stats.refused,
                "source stopped"
            );
            Ok(())
        }
        InputKind::Nats(mut source) => {
            let observer = ctx.observer.clone();
            let index = ctx.index;
            let stats = source.run(
                stop,
                |state| observer.consumer_state(index, &state),
                |bytes, delivery, redelivered, arrival| {
                    if redelivered {
                        ctx.observer.redelivered(ctx.index);
                    }
                    ctx.admit_delivery(bytes, delivery, arrival);
                },
            )?;
            tracing::info!(
                source = ctx.index,
                frames = stats.frames,
                "NATS source stopped"
            );
            Ok(())
        }
        InputKind::Lsl(input) => {
            let on = |r: Received<'_>, arrival: Instant| {
                match r {
                    Received::Frame(bytes) => ctx.admit(bytes, arrival),
                    lost @ Received::Lost { .. } => ctx.lost(&lost, arrival),
                    Received::Malformed { .. } | Received::Refused { .. } => {}
                }
                std::ops::ControlFlow::Continue(())
            };
            let stats = input.run(stop, on)?;
            tracing::info!(
                source = ctx.index,
                samples = stats.samples,
                frames = stats.frames,
                losses = stats.losses,
                gaps = stats.gaps,
                gap_samples = stats.gap_samples,
                "LSL source stopped"
            );
            Ok(())
        }
        InputKind::File(mut feed, speed) => {
            let mut pacer = Pacer::new(speed);
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                // A file waits for a free slot instead of dropping.
                let mut slot = loop {
                    if let Some(s) = ctx.spare.take().or_else(|| ctx.free.try_pop()) {
                        break s;
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    std::thread::yield_now();
                };
                let next = feed.next_frame(&mut slot.bytes);
                let Some(next) = next else {
                    ctx.spare = Some(slot);
                    return Ok(());
                };
                if let Ok((h, _)) = frame::FrameHeader::read_from_prefix(&slot.bytes) {
                    pacer.wait(h.timestamp_ns.get(), stop);
                }
                let arrival = Instant::now();
                ctx.count_in();
                if let Err(e) = next {
                    tracing::warn!(
                        source = ctx.index,
                        reason = e.reason,
                        "input file: {}",
                        e.detail
                    );
                    ctx.side(&[], Outcome::Malformed, e.reason, arrival);
                    ctx.spare = Some(slot);
                    continue;
                }
                match frame::parse(&slot.bytes) {
                    Ok(view) => ctx.observe_sequence(&view),
                    Err(e) => {
                        ctx.side(&slot.bytes, Outcome::Malformed, e.reason(), arrival);
                        ctx.spare = Some(slot);
                        continue;
                    }
                }
                slot.arrival = arrival;
                let mut pending = slot;
                loop {
                    match ctx.push(pending) {
                        Ok(()) => break,
                        Err(back) => {
                            pending = back;
                            if stop.load(Ordering::Relaxed) {
                                // Taken in but not handed over: it still gets its decision.
                                ctx.side(&pending.bytes, Outcome::Dropped, "shutdown", arrival);
                                ctx.spare = Some(pending);
                                return Ok(());
                            }
                            std::thread::yield_now();
                        }
                    }
                }
            }
        }
    }
}

/// Back-off of a polling thread with nothing to do: spin briefly, then yield (cheap when
/// no other thread wants the core, and back within microseconds), and only after a quiet
/// period of [`Idle::YIELD_FOR`] sleep, so an idle daemon costs almost no CPU while a busy
/// one reacts within microseconds.
#[derive(Default)]
struct Idle {
    since: Option<Instant>,
    spins: u32,
}

impl Idle {
    const SPINS: u32 = 64;
    const YIELD_FOR: Duration = Duration::from_millis(2);
    const SLEEP: Duration = Duration::from_micros(100);

    fn reset(&mut self) {
        self.since = None;
        self.spins = 0;
    }

    fn wait(&mut self) {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.spins = self.spins.saturating_add(1);
        if self.spins < Self::SPINS {
            std::hint::spin_loop();
        } else if since.elapsed() < Self::YIELD_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Self::SLEEP);
        }
    }
}

/// Replays recorded timestamps at a pace: frame i goes out at start + (t_i - t_0) / speed,
/// an absolute schedule so sleeps do not accumulate drift.
struct Pacer {
    factor: Option<f64>,
    origin: Option<(u64, Instant)>,
}

impl Pacer {
    fn new(speed: Speed) -> Self {
        Self {
            factor: match speed {
                Speed::Max => None,
                Speed::Factor(f) => Some(f),
            },
            origin: None,
        }
    }
    fn wait(&mut self, ts_ns: u64, stop: &AtomicBool) {
        let Some(f) = self.factor else { return };
        let (t0, start) = *self.origin.get_or_insert((ts_ns, Instant::now()));
        let offset = Duration::from_secs_f64(ts_ns.saturating_sub(t0) as f64 / 1e9 / f);
        let due = start + offset;
        loop {
            let now = Instant::now();
            if now >= due || stop.load(Ordering::Relaxed) {
                return;
            }
            let left = due - now;
            if left > Duration::from_micros(200) {
                std::thread::sleep(
                    (left - Duration::from_micros(100)).min(Duration::from_millis(50)),
                );
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

struct WorkerCtx {
    /// Reused per batch (no allocation in the hot path once warm).
    triage: Vec<Option<(Outcome, &'static str)>>,
    views: Vec<FrameView<'static>>,
    rings: Vec<Rx<Box<Slot>>>,
    done: Tx<Done>,
    backend: Box<dyn Backend>,
    fallback: Option<Box<dyn Backend>>,
    daemon: DaemonConfig,
    workload: Workload,
    deadlines: bool,
    observer: Arc<dyn Observe>,
    sources_live: Arc<AtomicUsize>,
    reload: Receiver<Arc<Config>>,
    failovers: Arc<AtomicU64>,
    load: Arc<Load>,
    /// Marks this worker busy while it is inside a batch (the watchdog's view of it).
    heartbeats: Arc<crate::notify::Heartbeats>,
    index: usize,
    /// Frames and batches reconstructed by the backend (0) and by its fallback (1).
    tally: [Tally; 2],
}

/// What one backend of a worker reconstructed.
#[derive(Default)]
struct Tally {
    device: String,
    frames: u64,
    batches: u64,
    /// The observer's count of this device's frames.
    count: Option<FrameCount>,
}

fn expected_kind(w: Workload) -> FrameKind {
    match w {
        Workload::Multiplicity | Workload::Tracking => FrameKind::HitEvent,
        Workload::Eeg => FrameKind::EegBlock,
    }
}

fn run_worker(mut ctx: WorkerCtx) {
    let batch_max = ctx.daemon.batch_max;
    let batch_wait = Duration::from_micros(ctx.daemon.batch_wait_us);
    let budget = ctx.daemon.budget();
    let mut batch: Vec<Box<Slot>> = Vec::with_capacity(batch_max);
    let mut verdicts: Vec<Verdict> = Vec::with_capacity(batch_max);
    let mut live_idx: Vec<usize> = Vec::with_capacity(batch_max);
    let mut next_ring = 0usize;
    let mut idle = Idle::default();
    ctx.tally[0].device = ctx.backend.device();
    ctx.tally[1].device = ctx
        .fallback
        .as_ref()
        .map_or_else(String::new, |b| b.device());
    for t in ctx.tally.iter_mut().filter(|t| !t.device.is_empty()) {
        t.count = ctx.observer.worker_frames(ctx.index, &t.device);
    }
    tracing::info!(
        worker = ctx.index,
        device = %ctx.tally[0].device,
        fallback = %ctx.tally[1].device,
        "worker {} reconstructs on {}",
        ctx.index,
        ctx.tally[0].device
    );
    loop {
        match ctx.reload.try_recv() {
            Ok(cfg) => {
                for b in std::iter::once(&mut ctx.backend).chain(ctx.fallback.as_mut()) {
                    match b.reload(&cfg) {
                        Ok(()) => tracing::info!("trigger thresholds reloaded"),
                        Err(e) => {
                            tracing::error!("reload refused, keeping the previous thresholds: {e}")
                        }
                    }
                }
            }
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => {}
        }
        // Gather a batch.
        let mut first_at: Option<Instant> = None;
        loop {
            let n = ctx.rings.len();
            let mut got = false;
            for k in 0..n {
                let r = (next_ring + k) % n;
                if let Some(s) = ctx.rings[r].try_pop() {
                    ctx.load.queued.fetch_sub(1, Ordering::Relaxed);
                    batch.push(s);
                    got = true;
                    next_ring = (r + 1) % n;
                    break;
                }
            }
            if got {
                first_at.get_or_insert_with(Instant::now);
                if batch.len() >= batch_max {
                    break;
                }
                continue;
            }
            match first_at {
                Some(t) if t.elapsed() >= batch_wait => break,
                Some(_) => std::hint::spin_loop(),
                None => break,
            }
        }
        if batch.is_empty() {
            let sources_done = ctx.sources_live.load(Ordering::Acquire) == 0;
            if sources_done && ctx.rings.iter().all(Rx::is_empty) {
                for b in std::iter::once(&mut ctx.backend).chain(ctx.fallback.as_mut()) {
                    if let Err(e) = b.finish() {
                        tracing::error!("{} backend could not finish: {e}", b.kind().as_str());
                    }
                }
                let [main, fb] = &ctx.tally;
                tracing::info!(
                    worker = ctx.index,
                    device = %main.device,
                    frames = main.frames,
                    batches = main.batches,
                    fallback_frames = fb.frames,
                    "worker {} reconstructed {} frames in {} batches on {} ({} on the fallback)",
                    ctx.index,
                    main.frames,
                    main.batches,
                    main.device,
                    fb.frames
                );
                return;
            }
            idle.wait();
            continue;
        }
        idle.reset();
        ctx.heartbeats.begin(ctx.index);
        process_batch(
            &mut ctx,
            &mut batch,
            &mut verdicts,
            &mut live_idx,
            budget,
            first_at,
        );
        ctx.heartbeats.end(ctx.index);
    }
}

/// [`Backend::process`], with a panic inside it (a bug in a reconstruction step on an
/// input nobody foresaw) turned into a failed batch: the batch then fails over, or its
/// frames are decided `dropped` as `backend_error`, counted and logged (the panic's
/// message on stderr by the panic hook, the failure by the worker), and the worker goes
/// on with the next batch. Without it the worker's thread would end with its slots, and
/// the daemon would wait for their decisions for ever.
fn process_guarded(
    backend: &mut dyn Backend,
    views: &[FrameView<'_>],
    verdicts: &mut Vec<Verdict>,
) -> Result<(), crate::backend::BackendError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        backend.process(views, verdicts)
    }))
    .unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        // What verdicts it pushed before are cleared by the batch's failure.
        Err(crate::backend::BackendError::Failed(format!(
            "the {} backend panicked: {what}",
            backend.kind().as_str()
        )))
    })
}

// Slots are boxed on purpose: a slot moves through every ring as one pointer.
#[allow(clippy::vec_box)]
fn process_batch(
    ctx: &mut WorkerCtx,
    batch: &mut Vec<Box<Slot>>,
    verdicts: &mut Vec<Verdict>,
    live_idx: &mut Vec<usize>,
    budget: Duration,
    first_at: Option<Instant>,
) {
    let start = Instant::now();
    if let Some(t) = first_at {
        ctx.observer.stage(Stage::Batch, (start - t).as_secs_f64());
    }
    let want = expected_kind(ctx.workload);
    // Triage: deadline passed, wrong kind, or to be reconstructed.
    let mut triage = std::mem::take(&mut ctx.triage);
    triage.clear();
    triage.resize(batch.len(), None);
    live_idx.clear();
    for (i, s) in batch.iter().enumerate() {
        ctx.observer.stage(
            Stage::Queue,
            start.saturating_duration_since(s.arrival).as_secs_f64(),
        );
        // The source validated the whole frame; the header is all triage needs.
        let header =
            frame::peek_header(&s.bytes).expect("slots hold frames validated by their source");
        if header.kind.get() != want as u16 {
            triage[i] = Some((Outcome::Malformed, "wrong_kind"));
        } else if ctx.deadlines && start > s.arrival + budget {
            triage[i] = Some((Outcome::Timeout, "deadline"));
        } else {
            live_idx.push(i);
        }
    }
    verdicts.clear();
    let mut backend_kind = ctx.backend.kind();
    let mut failed_reason: Option<&'static str> = None;
    let mut on_fallback = false;
    if !live_idx.is_empty() {
        // Reuse the views' allocation across batches: an empty vector collected in place
        // keeps its buffer whatever the borrow's lifetime.
        let mut views: Vec<FrameView<'_>> = std::mem::take(&mut ctx.views)
            .into_iter()
            .map(|_| unreachable!())
            .collect();
        views.extend(
            live_idx
                .iter()
                // The input validated each frame (CRC included) into its slot.
                .map(|&i| frame::parse_validated(&batch[i].bytes).expect("validated")),
        );
        let t0 = Instant::now();
        let r = process_guarded(&mut *ctx.backend, &views, verdicts);
        match r {
            Ok(()) if verdicts.len() == views.len() => {}
            other => {
                let msg = match other {
                    Err(e) => e.to_string(),
                    Ok(()) => format!(
                        "backend returned {} verdicts for {} frames",
                        verdicts.len(),
                        views.len()
                    ),
                };
                verdicts.clear();
                if let Some(fb) = ctx.fallback.as_mut() {
                    tracing::warn!(
                        "{} backend failed a batch of {}, failing over: {msg}",
                        backend_kind.as_str(),
                        views.len()
                    );
                    ctx.failovers.fetch_add(1, Ordering::Relaxed);
                    ctx.observer.failover();
                    backend_kind = fb.kind();
                    on_fallback = true;
                    if let Err(e) = process_guarded(&mut **fb, &views, verdicts) {
                        tracing::error!("fallback backend failed too: {e}");
                        verdicts.clear();
                        failed_reason = Some("backend_error");
                    }
                } else {
                    tracing::error!("backend failed a batch of {}: {msg}", views.len());
                    failed_reason = Some("backend_error");
                }
            }
        }
        let took = t0.elapsed();
        ctx.load.observe(took.as_nanos() as u64, views.len());
        ctx.observer.stage(Stage::Reconstruct, took.as_secs_f64());
        ctx.observer.batch(backend_kind, views.len());
        let tally = &mut ctx.tally[usize::from(on_fallback)];
        tally.frames += views.len() as u64;
        tally.batches += 1;
        if let Some(count) = &tally.count {
            count(views.len() as u64);
        }
        views.clear();
        ctx.views = views.into_iter().map(|_| unreachable!()).collect();
    }
    let decided_at = Instant::now();
    let mut vi = 0usize;
    for (i, slot) in batch.drain(..).enumerate() {
        let header = frame::peek_header(&slot.bytes).expect("validated");
        let (outcome, accepted, reason, lines, detail, backend) = match triage[i] {
            Some((Outcome::Timeout, reason)) => {
                let acc = ctx.daemon.timeout_policy == TimeoutPolicy::Accept;
                (Outcome::Timeout, acc, reason, 0, Detail::None, None)
            }
            Some((o, reason)) => (o, false, reason, 0, Detail::None, None),
            None => match failed_reason {
                Some(reason) => (Outcome::Dropped, false, reason, 0, Detail::None, None),
                None => {
                    let v = std::mem::take(&mut verdicts[vi]);
                    vi += 1;
                    let o = match (v.malformed, v.accept) {
                        (Some(_), _) => Outcome::Malformed,
                        (None, true) => Outcome::Accept,
                        (None, false) => Outcome::Reject,
                    };
                    let accepted = o == Outcome::Accept;
                    (
                        o,
                        accepted,
                        v.malformed.unwrap_or(""),
                        v.lines_fired,
                        v.detail,
                        Some(backend_kind),
                    )
                }
            },
        };
        let d = Decision {
            source: slot.source,
            source_id: header.source_id.get(),
            seq: header.sequence.get(),
            timestamp_ns: header.timestamp_ns.get(),
            workload: ctx.workload,
            outcome,
            accepted,
            reason,
            lines_fired: lines,
            latency_ns: decided_at
                .saturating_duration_since(slot.arrival)
                .as_nanos() as u64,
            backend,
            detail,
            delivery: slot.delivery,
        };
        let mut item = Done { decision: d, slot };
        // The done ring holds every slot in existence, so this cannot stay full.
        loop {
            match ctx.done.try_push(item) {
                Ok(()) => break,
                Err(back) => {
                    item = back;
                    std::thread::yield_now();
                }
            }
        }
    }
    ctx.triage = triage;
    ctx.observer
        .stage(Stage::Decide, decided_at.elapsed().as_secs_f64());
}

#[allow(clippy::too_many_arguments)]
fn decide_loop(
    rt: &mut DecideCtx<'_>,
    names: &Names,
    mut done: Vec<Rx<Done>>,
    side: Receiver<SideRecord>,
    mut free: Vec<Tx<Box<Slot>>>,
    workers_live: &AtomicUsize,
    _shared: &[SourceShared],
    fills: &[(String, Fill)],
    mut acks: Acks,
) -> Summary {
    let mut summary = Summary {
        sources: (0..free.len()).map(|_| SourceTotals::default()).collect(),
        ..Default::default()
    };
    let mut decided = 0u64;
    let mut idle = Idle::default();
    let mut last_fill = Instant::now();
    let mut side_open = true;
    let mut paused = false;
    loop {
        let mut any = false;
        // A blocking sink that fails holds back reconstructed frames (their slots stay
        // taken, so the inputs fill up); side records still flow, into its backlog. At
        // shutdown nothing waits any more.
        let now = Instant::now();
        let pause = !rt.stop.load(Ordering::Relaxed) && rt.sinks.iter().any(|s| s.pauses(now));
        if pause != paused {
            paused = pause;
            rt.sink_blocked.store(pause, Ordering::Relaxed);
            if pause {
                tracing::warn!("inputs paused: a decision sink blocks");
            } else {
                tracing::info!("inputs resumed");
            }
        }
        for rx in done.iter_mut().filter(|_| !paused) {
            // Bounded per pass so side records and other workers are served too.
            for _ in 0..256 {
                let Some(Done { decision, mut slot }) = rx.try_pop() else {
                    break;
                };
                any = true;
                // A frame whose accepted copy could not be kept is not acknowledged: it
                // comes back and is decided (and kept) again.
                let kept = !decision.accepted || record_accepted(rt, &mut summary, &slot.bytes);
                record(rt, names, &mut summary, &decision);
                decided += 1;
                if decision.delivery != 0 && kept {
                    acks.hold(slot.source, decision.delivery);
                }
                let src = slot.source as usize;
                slot.bytes.clear();
                if free[src].try_push(slot).is_err() {
                    unreachable!("free ring holds the whole pool");
                }
            }
        }
        if side_open {
            for _ in 0..256 {
                match side.try_recv() {
                    Ok(s) => {
                        any = true;
                        let d = Decision {
                            source: s.source,
                            source_id: s.source_id,
                            seq: s.seq,
                            timestamp_ns: s.timestamp_ns,
                            workload: rt.workload,
                            outcome: s.outcome,
                            accepted: false,
                            reason: s.reason,
                            lines_fired: 0,
                            latency_ns: s.arrival.elapsed().as_nanos() as u64,
                            backend: None,
                            detail: Detail::None,
                            delivery: s.delivery,
                        };
                        record(rt, names, &mut summary, &d);
                        decided += 1;
                        if s.delivery != 0 {
                            acks.hold(s.source, s.delivery);
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        side_open = false;
                        break;
                    }
                }
            }
        }
        if acks.due(!any) {
            flush_sinks(rt, names);
            if rt.sinks.iter().all(GuardedSink::all_written) {
                acks.release();
            }
        }
        if any {
            idle.reset();
            if let Some(p) = &rt.progress {
                p(decided);
            }
        } else {
            let workers_done = workers_live.load(Ordering::Acquire) == 0;
            if workers_done && !side_open && done.iter().all(Rx::is_empty) {
                break;
            }
            idle.wait();
        }
        if last_fill.elapsed() > Duration::from_millis(250) {
            last_fill = Instant::now();
            for (name, fill) in fills {
                rt.observer.ring_fill(name, fill);
            }
            flush_sinks(rt, names);
        }
        for s in rt.sinks.iter_mut() {
            s.retry(names, &*rt.observer, false);
        }
        // A load first: the flag is almost never set, and a load does not write the line.
        if rt
            .reopen
            .as_ref()
            .is_some_and(|r| r.load(Ordering::Relaxed) && r.swap(false, Ordering::AcqRel))
        {
            for s in rt.sinks.iter_mut() {
                s.reopen(&*rt.observer);
            }
        }
        update_readiness(rt);
        if let Some(w) = rt.watchdog.as_mut() {
            w.tick(decided, rt.stop.load(Ordering::Relaxed));
        }
    }
    for s in rt.sinks.iter_mut() {
        let t = s.finish(names, &*rt.observer);
        summary.sink_errors += t.errors;
        summary.sinks.push(t);
    }
    // Frames whose decisions some sink lost stay unacknowledged: the work queue hands them
    // to another node.
    if summary.sinks.iter().all(|t| t.undelivered() == 0) {
        acks.release();
    } else if !acks.held.is_empty() {
        tracing::warn!(
            frames = acks.held.len(),
            "not acknowledging frames whose decisions were not all written; the work queue redelivers them"
        );
    }
    drop(acks);
    rt.sink_blocked.store(false, Ordering::Relaxed);
    if let Some(p) = &rt.progress {
        p(decided);
    }
    summary
}

/// `/readyz`: ready while no sink is in a failure episode.
fn update_readiness(rt: &DecideCtx<'_>) {
    if let Some(r) = &rt.ready {
        let ok = !rt.accepted_episode.active() && !rt.sinks.iter().any(GuardedSink::failing);
        if r.load(Ordering::Relaxed) != ok {
            r.store(ok, Ordering::Release);
        }
    }
}

/// Acknowledgements for the NATS inputs, held by the decision thread until the sinks have
/// flushed the decisions they belong to.
struct Acks {
    /// Per input: the channel to its acknowledging thread (NATS inputs only).
    tx: Vec<Option<Sender<u64>>>,
    /// (input, delivery) decided since the last flush.
    held: Vec<(u16, u64)>,
    /// When the oldest held delivery was decided.
    since: Option<Instant>,
}

impl Acks {
    /// Flush and acknowledge at least this often while frames are held.
    const EVERY: Duration = Duration::from_millis(5);
    /// ... or once this many are held.
    const BATCH: usize = 256;

    fn hold(&mut self, source: u16, delivery: u64) {
        if self.tx.get(source as usize).is_some_and(Option::is_some) {
            if self.held.is_empty() {
                self.since = Some(Instant::now());
            }
            self.held.push((source, delivery));
        }
    }

    /// Time to flush the sinks and acknowledge: the decision thread is idle, many are
    /// held, or the oldest has waited long enough.
    fn due(&self, idle: bool) -> bool {
        !self.held.is_empty()
            && (idle
                || self.held.len() >= Self::BATCH
                || self.since.is_some_and(|t| t.elapsed() >= Self::EVERY))
    }

    /// The held deliveries' decisions are written: acknowledge them.
    fn release(&mut self) {
        for (source, delivery) in self.held.drain(..) {
            if let Some(Some(tx)) = self.tx.get(source as usize) {
                if tx.send(delivery).is_err() {
                    tracing::error!(source, "the acknowledging thread is gone");
                }
            }
        }
        self.since = None;
    }
}

/// Appends an accepted frame to the accepted-frame recording; a failure is counted, logged
/// once per episode, and the frame is lost to the recording (counted). Returns whether the
/// frame was kept.
fn record_accepted(rt: &mut DecideCtx<'_>, summary: &mut Summary, bytes: &[u8]) -> bool {
    let Some(acc) = rt.accepted.as_mut() else {
        return true;
    };
    match acc(bytes) {
        Ok(()) => {
            if rt.accepted_episode.active() {
                let lost = summary.recording_lost;
                if let Some((errors, lost)) = rt.accepted_episode.end(
                    Instant::now(),
                    crate::sinks::guard::QUIET_FOR_RECOVERY,
                    lost,
                ) {
                    tracing::warn!(
                        "the accepted-frame recording works again after {errors} errors; {lost} frames lost meanwhile"
                    );
                }
            }
            true
        }
        Err(e) => {
            summary.sink_errors += 1;
            summary.recording_lost += 1;
            rt.observer.sink_error("recording", &e);
            rt.observer.sink_lost("recording", 1);
            if rt
                .accepted_episode
                .error(Instant::now(), summary.recording_lost - 1)
            {
                tracing::error!(
                    sink = "recording",
                    "the accepted-frame recording failed: {e}; accepted frames are counted as lost until it works again"
                );
            }
            false
        }
    }
}

fn flush_sinks(rt: &mut DecideCtx<'_>, names: &Names) {
    for s in rt.sinks.iter_mut() {
        s.flush(names, &*rt.observer);
    }
}

fn record(rt: &mut DecideCtx<'_>, names: &Names, summary: &mut Summary, d: &Decision) {
    let t0 = Instant::now();
    for s in rt.sinks.iter_mut() {
        s.deliver(d, names, &*rt.observer);
    }
    rt.observer.stage(Stage::Sink, t0.elapsed().as_secs_f64());
    (rt.on_decision)(d, names);
    summary.sources[d.source as usize].outcomes[d.outcome as usize] += 1;
    summary.latency.record(d.latency_ns);
    match d.backend {
        Some(BackendKind::Cpu) => summary.by_backend[0] += 1,
        Some(BackendKind::Gpu) => summary.by_backend[1] += 1,
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::multiplicity::CpuMultiplicity;
    use crate::config::MultiplicityConfig;
    use crate::frame::{encode_hit_event, HitRecord, Stamp};
    use crate::sinks::Sink;

    struct VecFeed {
        frames: Vec<Vec<u8>>,
        next: usize,
    }
    impl FrameFeed for VecFeed {
        fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
            let f = self.frames.get(self.next)?;
            self.next += 1;
            buf.clear();
            buf.extend_from_slice(f);
            Some(Ok(()))
        }
    }

    fn frames(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let hits: Vec<HitRecord> = (0..(i % 12) as u16)
                    .map(|p| HitRecord {
                        x_mm: 0.0,
                        y_mm: 0.0,
                        z_mm: p as f32,
                        plane: p,
                        hit_id: p as u32,
                    })
                    .collect();
                let mut b = Vec::new();
                encode_hit_event(
                    &mut b,
                    Stamp {
                        source_id: 1,
                        sequence: i as u64,
                        timestamp_ns: i as u64 * 1000,
                    },
                    &hits,
                );
                if i % 97 == 13 {
                    b[20] ^= 0xff; // corrupt the sequence field: CRC still fine, but...
                    let n = b.len();
                    b[n - 1] ^= 0x01; // ...and the payload: bad_crc
                }
                b
            })
            .collect()
    }

    struct Collect(std::sync::Arc<std::sync::Mutex<Vec<Decision>>>);
    impl Sink for Collect {
        fn write(&mut self, d: &Decision, _: &Names) -> std::io::Result<()> {
            self.0.lock().unwrap().push(d.clone());
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn runtime(sink: Collect, workers: usize) -> Runtime<'static> {
        Runtime {
            ordered_by_source: false,
            daemon: DaemonConfig {
                workers,
                ring_slots: 16,
                batch_max: 8,
                ..Default::default()
            },
            workload: Workload::Multiplicity,
            deadlines: false,
            make_sinks: Box::new(move |_| {
                Ok(vec![GuardedSink::new(
                    Box::new(sink),
                    crate::sinks::SinkPolicy::Block,
                    None,
                    Default::default(),
                )])
            }),
            on_decision: Box::new(|_, _| {}),
            accepted: None,
            observer: Arc::new(NoObserver),
            stop: Arc::new(AtomicBool::new(false)),
            reload: None,
            ready: None,
            progress: None,
            reopen: None,
            notify: None,
        }
    }

    /// A worker wedged inside one batch withholds systemd's watchdog pings from the
    /// decision thread until it returns; the run still decides every frame.
    #[test]
    fn a_wedged_worker_withholds_the_watchdog_pings() {
        struct Wedge {
            names: Vec<String>,
            batches: usize,
        }
        impl Backend for Wedge {
            fn kind(&self) -> BackendKind {
                BackendKind::Cpu
            }
            fn line_names(&self) -> &[String] {
                &self.names
            }
            fn process(
                &mut self,
                batch: &[FrameView<'_>],
                out: &mut Vec<crate::backend::Verdict>,
            ) -> Result<(), crate::backend::BackendError> {
                self.batches += 1;
                // The second batch hangs for 800 ms, four manager periods' worth of pings.
                std::thread::sleep(Duration::from_millis(if self.batches == 2 {
                    800
                } else {
                    20
                }));
                out.extend(batch.iter().map(|_| crate::backend::Verdict::default()));
                Ok(())
            }
            fn reload(&mut self, _: &Config) -> Result<(), String> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        manager
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let notifier = crate::notify::Notifier::connect(
            path.to_str().unwrap(),
            Some(Duration::from_millis(200)),
        )
        .unwrap();
        let out = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut rt = runtime(Collect(out.clone()), 1);
        rt.daemon.batch_max = 4;
        rt.notify = Some(Arc::new(notifier));
        let input = Input {
            name: "file".into(),
            kind: InputKind::File(
                Box::new(VecFeed {
                    frames: frames(80),
                    next: 0,
                }),
                Speed::Max,
            ),
        };
        let started = Instant::now();
        let done = Arc::new(AtomicBool::new(false));
        let listen = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut got: Vec<(Duration, String)> = Vec::new();
                let mut buf = [0u8; 256];
                while !done.load(Ordering::Relaxed) {
                    if let Ok(n) = manager.recv(&mut buf) {
                        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                        got.push((started.elapsed(), m));
                    }
                }
                got
            })
        };
        let s = run(
            rt,
            vec![input],
            &|_| {
                Ok(Box::new(Wedge {
                    names: Vec::new(),
                    batches: 0,
                }) as Box<dyn Backend>)
            },
            None,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        done.store(true, Ordering::Relaxed);
        assert_eq!(s.frames_in(), 80);
        assert!(s.balanced());
        let got = listen.join().unwrap();
        let text: Vec<&str> = got.iter().map(|(_, m)| m.as_str()).collect();
        assert!(text[0].starts_with("READY=1"), "{text:?}");
        let wedged = got
            .iter()
            .position(|(_, m)| m.starts_with("STATUS=worker 0 wedged"))
            .unwrap_or_else(|| panic!("the wedge is reported: {text:?}"));
        // Pings at 100 ms intervals except across the wedge: a gap of well over the
        // manager's 200 ms period, then pings again.
        let pings: Vec<Duration> = got
            .iter()
            .filter(|(_, m)| m == "WATCHDOG=1")
            .map(|(t, _)| *t)
            .collect();
        let gap = pings.windows(2).map(|w| w[1] - w[0]).max().expect("pings");
        assert!(
            gap >= Duration::from_millis(500),
            "largest gap {gap:?}: {text:?}"
        );
        assert!(
            got[wedged + 1..].iter().any(|(_, m)| m == "WATCHDOG=1"),
            "pings resume after the wedge: {text:?}"
        );
    }

    #[test]
    fn replay_decides_every_frame_exactly_once() {
        for workers in [1, 3] {
            let out = Arc::new(std::sync::Mutex::new(Vec::new()));
            let rt = runtime(Collect(out.clone()), workers);
            let fs = frames(2000);
            let input = Input {
                name: "file".into(),
                kind: InputKind::File(
                    Box::new(VecFeed {
                        frames: fs,
                        next: 0,
                    }),
                    Speed::Max,
                ),
            };
            let cfg = MultiplicityConfig {
                min_hits: 8,
                min_planes: 8,
            };
            let s = run(
                rt,
                vec![input],
                &|_| Ok(Box::new(CpuMultiplicity::new(cfg)) as Box<dyn Backend>),
                None,
            )
            .unwrap();
            assert!(s.balanced());
            assert_eq!(s.frames_in(), 2000);
            let ds = out.lock().unwrap();
            assert_eq!(ds.len(), 2000);
            let malformed = ds
                .iter()
                .filter(|d| d.outcome == Outcome::Malformed)
                .count();
            assert_eq!(malformed, (0..2000).filter(|i| i % 97 == 13).count());
            let mut seqs: Vec<u64> = ds
                .iter()
                .filter(|d| d.outcome != Outcome::Malformed)
                .map(|d| d.seq)
                .collect();
            seqs.sort_unstable();
            seqs.dedup();
            assert_eq!(
                seqs.len(),
                2000 - malformed,
                "each valid frame decided once"
            );
            for d in ds
                .iter()
                .filter(|d| d.outcome == Outcome::Accept || d.outcome == Outcome::Reject)
            {
                let n = (d.seq % 12) as u32;
                assert_eq!(d.outcome == Outcome::Accept, n >= 8, "seq {}", d.seq);
            }
        }
    }

    /// Ordered by source: every frame of one `source_id` is processed by one worker, in the
    /// order it arrived, while several workers share the sources.
    #[test]
    fn ordered_by_source_keeps_each_producer_on_one_worker_in_order() {
        struct Record {
            worker: usize,
            seen: Arc<std::sync::Mutex<Vec<(usize, u32, u64)>>>,
            names: Vec<String>,
        }
        impl Backend for Record {
            fn kind(&self) -> BackendKind {
                BackendKind::Cpu
            }
            fn line_names(&self) -> &[String] {
                &self.names
            }
            fn process(
                &mut self,
                batch: &[FrameView<'_>],
                out: &mut Vec<crate::backend::Verdict>,
            ) -> Result<(), crate::backend::BackendError> {
                let mut seen = self.seen.lock().unwrap();
                for f in batch {
                    seen.push((
                        self.worker,
                        f.header.source_id.get(),
                        f.header.sequence.get(),
                    ));
                    out.push(crate::backend::Verdict::default());
                }
                Ok(())
            }
            fn reload(&mut self, _: &Config) -> Result<(), String> {
                Ok(())
            }
        }
        let out = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut rt = runtime(Collect(out.clone()), 3);
        rt.ordered_by_source = true;
        let fs: Vec<Vec<u8>> = (0..3000u64)
            .map(|i| {
                let mut b = Vec::new();
                encode_hit_event(
                    &mut b,
                    Stamp {
                        source_id: (i % 7) as u32,
                        sequence: i / 7,
                        timestamp_ns: i,
                    },
                    &[],
                );
                b
            })
            .collect();
        let input = Input {
            name: "file".into(),
            kind: InputKind::File(
                Box::new(VecFeed {
                    frames: fs,
                    next: 0,
                }),
                Speed::Max,
            ),
        };
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = run(
            rt,
            vec![input],
            &|w| {
                Ok(Box::new(Record {
                    worker: w,
                    seen: seen.clone(),
                    names: Vec::new(),
                }) as Box<dyn Backend>)
            },
            None,
        )
        .unwrap();
        assert!(s.balanced());
        assert_eq!(out.lock().unwrap().len(), 3000);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3000);
        let mut workers_used = std::collections::BTreeSet::new();
        for id in 0..7u32 {
            let mine: Vec<&(usize, u32, u64)> = seen.iter().filter(|r| r.1 == id).collect();
            assert!(
                mine.iter().all(|r| r.0 == id as usize % 3),
                "source {id} on one worker"
            );
            let seqs: Vec<u64> = mine.iter().map(|r| r.2).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "source {id} in order");
            assert_eq!(seqs.len(), (0..3000).filter(|i| i % 7 == id as u64).count());
            workers_used.insert(mine[0].0);
        }
        assert_eq!(
            workers_used.len(),
            3,
            "the sources are spread over the workers"
        );
    }

    #[test]
    fn expired_frames_time_out_by_policy() {
        let out = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut rt = runtime(Collect(out.clone()), 1);
        rt.deadlines = true;
        rt.daemon.budget_ms = 1e-6; // every frame is late
        rt.daemon.timeout_policy = TimeoutPolicy::Accept;
        let input = Input {
            name: "f".into(),
            kind: InputKind::File(
                Box::new(VecFeed {
                    frames: frames(50),
                    next: 0,
                }),
                Speed::Max,
            ),
        };
        let s = run(
            rt,
            vec![input],
            &|_| Ok(Box::new(CpuMultiplicity::new(Default::default())) as Box<dyn Backend>),
            None,
        )
        .unwrap();
        assert!(s.balanced());
        let ds = out.lock().unwrap();
        assert!(ds
            .iter()
            .filter(|d| d.outcome != Outcome::Malformed)
            .all(|d| d.outcome == Outcome::Timeout && d.accepted));
    }

    /// An input of `n` frames from a file, read as fast as it goes.
    fn file_input(n: usize) -> Input {
        Input {
            name: "f".into(),
            kind: InputKind::File(
                Box::new(VecFeed {
                    frames: frames(n),
                    next: 0,
                }),
                Speed::Max,
            ),
        }
    }

    struct Failing;
    impl Backend for Failing {
        fn kind(&self) -> BackendKind {
            BackendKind::Gpu
        }
        fn line_names(&self) -> &[String] {
            &[]
        }
        fn process(
            &mut self,
            _: &[FrameView<'_>],
            _: &mut Vec<Verdict>,
        ) -> Result<(), crate::backend::BackendError> {
            Err(crate::backend::BackendError::Device("injected".into()))
        }
        fn reload(&mut self, _: &Config) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn failed_batches_fail_over_and_lose_nothing() {
        let (s, ds) = run_backend(|| Box::new(Failing), true).expect("the run ended");
        assert!(s.balanced());
        assert!(s.failovers > 0);
        assert_eq!(ds.len(), 300);
        assert!(ds
            .iter()
            .filter(|d| d.outcome != Outcome::Malformed)
            .all(|d| d.backend == Some(BackendKind::Cpu)));
    }

    /// A backend whose odd-numbered batches panic inside `process` (a reconstruction
    /// step's bug on an input nobody foresaw); the others it decides as the multiplicity
    /// backend does.
    struct Panicking {
        batches: usize,
        inner: CpuMultiplicity,
    }
    impl Backend for Panicking {
        fn kind(&self) -> BackendKind {
            BackendKind::Cpu
        }
        fn line_names(&self) -> &[String] {
            self.inner.line_names()
        }
        fn process(
            &mut self,
            batch: &[FrameView<'_>],
            out: &mut Vec<Verdict>,
        ) -> Result<(), crate::backend::BackendError> {
            self.batches += 1;
            if self.batches % 2 == 1 {
                // Half a batch's verdicts written, then the panic.
                self.inner.process(&batch[..batch.len() / 2], out)?;
                panic!("injected panic in batch {}", self.batches);
            }
            self.inner.process(batch, out)
        }
        fn reload(&mut self, cfg: &Config) -> Result<(), String> {
            self.inner.reload(cfg)
        }
    }

    /// Runs 300 frames through the backend `make` gives (with the multiplicity backend as
    /// the fallback, or none) on another thread; `None` if the run has not ended after a
    /// minute.
    fn run_backend(
        make: fn() -> Box<dyn Backend>,
        with_fallback: bool,
    ) -> Option<(Summary, Vec<Decision>)> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let out = Arc::new(std::sync::Mutex::new(Vec::new()));
            let rt = runtime(Collect(out.clone()), 1);
            let fb = |_| Ok(Box::new(CpuMultiplicity::new(Default::default())) as Box<dyn Backend>);
            let s = run(
                rt,
                vec![file_input(300)],
                &|_| Ok(make()),
                if with_fallback { Some(&fb) } else { None },
            )
            .unwrap();
            let ds = out.lock().unwrap().clone();
            let _ = tx.send((s, ds));
        });
        rx.recv_timeout(Duration::from_secs(60)).ok()
    }

    /// [`run_backend`] with a [`Panicking`] backend.
    fn run_panicking(with_fallback: bool) -> Option<(Summary, Vec<Decision>)> {
        run_backend(
            || {
                Box::new(Panicking {
                    batches: 0,
                    inner: CpuMultiplicity::new(Default::default()),
                })
            },
            with_fallback,
        )
    }

    #[test]
    fn a_backend_that_panics_drops_its_batch_and_the_run_goes_on() {
        let (s, ds) = run_panicking(false).expect("the run ended");
        assert!(s.balanced());
        assert_eq!(ds.len(), 300, "every frame has a decision");
        let dropped: Vec<_> = ds
            .iter()
            .filter(|d| d.outcome == Outcome::Dropped)
            .collect();
        // The first batch panicked: its frames are dropped, none with a stale verdict.
        assert!(!dropped.is_empty());
        assert!(dropped
            .iter()
            .all(|d| d.reason == "backend_error" && d.backend.is_none()));
        // Every frame is either dropped or decided by the backend.
        assert!(ds.iter().all(|d| d.outcome == Outcome::Dropped
            || d.outcome == Outcome::Malformed
            || d.backend == Some(BackendKind::Cpu)));
    }

    #[test]
    fn a_backend_that_panics_fails_over_and_loses_nothing() {
        let (s, ds) = run_panicking(true).expect("the run ended");
        assert!(s.balanced());
        assert!(s.failovers > 0);
        assert_eq!(ds.len(), 300);
        assert!(ds.iter().all(|d| d.outcome != Outcome::Dropped));
    }

    #[test]
    fn latency_quantiles_are_within_a_bucket() {
        let mut h = LatencyHistogram::default();
        for i in 1..=10_000u64 {
            h.record(i * 1000);
        }
        let p50 = h.quantile_ns(0.5) as f64;
        assert!((p50 / 5e6 - 1.0).abs() < 0.13, "{p50}");
        assert_eq!(h.quantile_ns(1.0), 10_000_000);
    }
}
