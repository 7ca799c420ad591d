//! Seeded simulation of the pipeline: the real runtime (`pipeline::run`: sources, rings,
//! workers, decision thread) driven by generated frame streams, with a backend, a fallback
//! and a sink that fail, stall or slow down as the seed says, and the invariants checked
//! after every run:
//!
//! - every frame taken in has exactly one decision, and nothing is decided that was not
//!   taken in (frames are told apart by their header timestamp, unique per run);
//! - the accounting balances per source, and its outcome counts are the decisions seen;
//! - each frame has the outcome its generation implies (malformed with the right reason,
//!   the backend's verdict, a timeout only under deadlines, `backend_error` only when the
//!   backend failed with no fallback);
//! - the decisions of one producer come out in the order its frames were taken in (where
//!   the runtime promises it: one worker, or frames routed by producer);
//! - sequence gaps and repeats are counted as the producer's sequence numbers imply;
//! - every error a sink returned is counted in the summary, and every decision reached the
//!   sink or its spill sink unless the sink's totals count it as lost.
//!
//! The streams and the fault schedule come from the seed; the threads run on the real
//! clock, so a seed fixes the inputs and faults, not the interleaving, and the checks must
//! hold for every interleaving. `TRIGD_SIM_SEED=N` runs seed N alone (with its log);
//! `TRIGD_SIM_SEEDS=N` runs seeds 0..N (default 2000, about 20 s).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trigd::backend::{Backend, BackendError, BackendKind, Verdict};
use trigd::config::{Config, DaemonConfig, Speed, TimeoutPolicy};
use trigd::decision::{Decision, Names, Outcome, Workload};
use trigd::frame::{self, FrameView, HitRecord, Stamp};
use trigd::pipeline::{self, FeedError, FrameFeed, Input, InputKind, NoObserver, Runtime};
use trigd::sinks::guard::{GuardSettings, GuardedSink};
use trigd::sinks::{Sink, SinkPolicy};
use trigd::sources::{SeqEvent, SequenceTracker};

/// What the generator made of one frame, and so what its decision must be.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Made {
    /// A valid hit event: the backend decides it.
    Valid,
    /// A valid EEG block in a hit-event workload: `malformed`, `wrong_kind`, by a worker.
    WrongKind,
    /// Payload byte flipped: `malformed`, `bad_crc`, at the source.
    BadCrc,
    /// Last byte cut off: `malformed`, `length_mismatch`, at the source.
    Truncated,
    /// Magic overwritten: `malformed`, `bad_magic`, at the source; header unreadable.
    BadMagic,
    /// The feed itself fails: `malformed` with the feed's reason; no bytes.
    FeedError,
}

impl Made {
    /// The malformed reason, or `None` for frames that reach the backend.
    fn reason(self) -> Option<&'static str> {
        match self {
            Made::Valid => None,
            Made::WrongKind => Some("wrong_kind"),
            Made::BadCrc => Some("bad_crc"),
            Made::Truncated => Some("length_mismatch"),
            Made::BadMagic => Some("bad_magic"),
            Made::FeedError => Some("sim_feed_error"),
        }
    }
    /// Decided at the source (side records) rather than by a worker.
    fn at_source(self) -> bool {
        !matches!(self, Made::Valid | Made::WrongKind)
    }
    /// The decision carries the header's timestamp (the frame id).
    fn readable(self) -> bool {
        !matches!(self, Made::BadMagic | Made::FeedError)
    }
}

struct SimFrame {
    made: Made,
    source_id: u32,
    sequence: u64,
    /// Unique in the run: `(input + 1) << 32 | (index + 1)`.
    id: u64,
    bytes: Vec<u8>,
    /// Microseconds the feed waits before handing this frame out (a gap between bursts).
    pause_us: u64,
}

/// Whether the backend accepts a frame: a fixed function of its id, so the harness knows
/// each verdict.
fn verdict_of(id: u64) -> bool {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1
}

/// One seed's configuration and fault rates.
#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    inputs: usize,
    frames_per_input: Vec<usize>,
    workers: usize,
    ordered_by_source: bool,
    deadlines: bool,
    budget_ms: f64,
    timeout_policy: TimeoutPolicy,
    batch_max: usize,
    batch_wait_us: u64,
    ring_slots: usize,
    fallback: bool,
    backend_fail_p: f64,
    backend_short_p: f64,
    backend_stall_p: f64,
    stall_us: u64,
    sink_fail_p: f64,
    sink_slow_p: f64,
    sink_policy: SinkPolicy,
    reloads: usize,
    malformed_p: f64,
    duplicate_p: f64,
    gap_p: f64,
    pause_p: f64,
}

impl Scenario {
    fn from_seed(seed: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let inputs = r.random_range(1..=3);
        let deadlines = r.random_bool(0.4);
        Scenario {
            seed,
            inputs,
            frames_per_input: (0..inputs).map(|_| r.random_range(0..=250)).collect(),
            workers: r.random_range(1..=3),
            ordered_by_source: r.random_bool(0.5),
            deadlines,
            budget_ms: [0.05, 0.5, 5.0][r.random_range(0..3)],
            timeout_policy: if r.random_bool(0.5) {
                TimeoutPolicy::Accept
            } else {
                TimeoutPolicy::Reject
            },
            batch_max: [1, 4, 16, 64][r.random_range(0..4)],
            batch_wait_us: [0, 0, 50][r.random_range(0..3)],
            ring_slots: [2, 8, 64][r.random_range(0..3)],
            fallback: r.random_bool(0.5),
            backend_fail_p: [0.0, 0.05, 0.3][r.random_range(0..3)],
            backend_short_p: [0.0, 0.05][r.random_range(0..2)],
            backend_stall_p: [0.0, 0.05][r.random_range(0..2)],
            stall_us: r.random_range(50..=1500),
            sink_fail_p: [0.0, 0.01, 0.2][r.random_range(0..3)],
            sink_slow_p: [0.0, 0.01][r.random_range(0..2)],
            sink_policy: [SinkPolicy::Block, SinkPolicy::Spill, SinkPolicy::Drop]
                [r.random_range(0..3)],
            reloads: r.random_range(0..=3),
            malformed_p: [0.0, 0.05, 0.3][r.random_range(0..3)],
            duplicate_p: [0.0, 0.05][r.random_range(0..2)],
            gap_p: [0.0, 0.05][r.random_range(0..2)],
            pause_p: [0.0, 0.02][r.random_range(0..2)],
        }
    }

    fn stream(&self, input: usize) -> Vec<SimFrame> {
        let mut r = ChaCha8Rng::seed_from_u64(self.seed ^ (0xA5A5_0000 + input as u64));
        let mut next_seq: HashMap<u32, u64> = HashMap::new();
        (0..self.frames_per_input[input])
            .map(|k| {
                let source_id = r.random_range(1..=3u32);
                let seq = next_seq.entry(source_id).or_insert(0);
                if r.random_bool(self.gap_p) {
                    *seq += r.random_range(1..10);
                }
                let sequence = *seq;
                if !r.random_bool(self.duplicate_p) {
                    *seq += 1;
                }
                let id = ((input as u64 + 1) << 32) | (k as u64 + 1);
                let made = if r.random_bool(self.malformed_p) {
                    [
                        Made::WrongKind,
                        Made::BadCrc,
                        Made::Truncated,
                        Made::BadMagic,
                        Made::FeedError,
                    ][r.random_range(0..5)]
                } else {
                    Made::Valid
                };
                let stamp = Stamp {
                    source_id,
                    sequence,
                    timestamp_ns: id,
                };
                let mut bytes = Vec::new();
                if made == Made::WrongKind {
                    frame::encode_eeg_block(&mut bytes, stamp, 2, 250.0, 0, &[1e-6; 8]);
                } else {
                    let hits: Vec<HitRecord> = (0..r.random_range(0..6u16))
                        .map(|p| HitRecord {
                            x_mm: f32::from(p),
                            y_mm: -f32::from(p),
                            z_mm: 100.0 * f32::from(p),
                            plane: p,
                            hit_id: u32::from(p),
                        })
                        .collect();
                    frame::encode_hit_event(&mut bytes, stamp, &hits);
                }
                match made {
                    Made::BadCrc => {
                        let n = bytes.len();
                        bytes[n - 1] ^= 0x40;
                    }
                    Made::Truncated => {
                        bytes.pop();
                    }
                    Made::BadMagic => bytes[0] = b'X',
                    _ => {}
                }
                let pause_us = if r.random_bool(self.pause_p) {
                    r.random_range(100..2000)
                } else {
                    0
                };
                SimFrame {
                    made,
                    source_id,
                    sequence,
                    id,
                    bytes,
                    pause_us,
                }
            })
            .collect()
    }
}

struct SimFeed {
    frames: Arc<Vec<SimFrame>>,
    next: usize,
}

impl FrameFeed for SimFeed {
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
        let f = self.frames.get(self.next)?;
        self.next += 1;
        if f.pause_us > 0 {
            std::thread::sleep(Duration::from_micros(f.pause_us));
        }
        buf.clear();
        if f.made == Made::FeedError {
            return Some(Err(FeedError {
                reason: "sim_feed_error",
                detail: format!("frame id {:#x}", f.id),
            }));
        }
        buf.extend_from_slice(&f.bytes);
        Some(Ok(()))
    }
}

/// A backend that fails whole batches, returns too few verdicts, or stalls, as its seed
/// says; otherwise accepts by [`verdict_of`].
struct SimBackend {
    rng: ChaCha8Rng,
    kind: BackendKind,
    fail_p: f64,
    short_p: f64,
    stall_p: f64,
    stall_us: u64,
    lines: Vec<String>,
    reloads: Arc<AtomicU64>,
}

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn line_names(&self) -> &[String] {
        &self.lines
    }
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        if self.rng.random_bool(self.stall_p) {
            std::thread::sleep(Duration::from_micros(self.stall_us));
        }
        if self.rng.random_bool(self.fail_p) {
            // A failed batch may leave verdicts behind; the runtime must discard them.
            out.push(Verdict::default());
            return Err(BackendError::Failed("simulated failure".into()));
        }
        let short = self.rng.random_bool(self.short_p);
        for (i, f) in batch.iter().enumerate() {
            if short && i + 1 == batch.len() {
                break;
            }
            let accept = verdict_of(f.timestamp_ns());
            out.push(Verdict {
                accept,
                lines_fired: u64::from(accept),
                ..Default::default()
            });
        }
        Ok(())
    }
    fn reload(&mut self, _cfg: &Config) -> Result<(), String> {
        self.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A sink that is slow or fails as its seed says, and counts its failures.
struct SimSink {
    rng: ChaCha8Rng,
    fail_p: f64,
    slow_p: f64,
    failures: Arc<AtomicU64>,
    /// `(source, timestamp_ns, seq)` of every record the sink took.
    taken: Arc<Mutex<Vec<(u16, u64, u64)>>>,
}

impl SimSink {
    fn maybe_fail(&mut self) -> io::Result<()> {
        if self.rng.random_bool(self.slow_p) {
            std::thread::sleep(Duration::from_micros(500));
        }
        if self.rng.random_bool(self.fail_p) {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::other("simulated sink failure"));
        }
        Ok(())
    }
}

impl Sink for SimSink {
    fn write(&mut self, d: &Decision, _names: &Names) -> io::Result<()> {
        self.maybe_fail()?;
        self.taken
            .lock()
            .unwrap()
            .push((d.source, d.timestamp_ns, d.seq));
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.maybe_fail()
    }
}

/// Runs one seed; an error names the first invariant broken.
fn simulate(sc: &Scenario) -> Result<Report, String> {
    let streams: Vec<Arc<Vec<SimFrame>>> = (0..sc.inputs).map(|i| Arc::new(sc.stream(i))).collect();
    let decisions: Arc<Mutex<Vec<Decision>>> = Arc::new(Mutex::new(Vec::new()));
    let sink_failures = Arc::new(AtomicU64::new(0));
    let reloads_seen = Arc::new(AtomicU64::new(0));
    let (reload_tx, reload_rx) = crossbeam_channel::bounded::<Arc<Config>>(8);

    let taken = Arc::new(Mutex::new(Vec::new()));
    let sink = SimSink {
        rng: ChaCha8Rng::seed_from_u64(sc.seed ^ 0x51_4B),
        fail_p: sc.sink_fail_p,
        slow_p: sc.sink_slow_p,
        failures: sink_failures.clone(),
        taken: taken.clone(),
    };
    let spill = SimSink {
        rng: ChaCha8Rng::seed_from_u64(sc.seed ^ 0x5B_11),
        fail_p: 0.0,
        slow_p: 0.0,
        failures: sink_failures.clone(),
        taken: taken.clone(),
    };
    let policy = sc.sink_policy;
    let settings = GuardSettings {
        backlog: 4096,
        retry: Duration::from_micros(200),
        block_max: Some(Duration::from_millis(20)),
    };
    let seen = decisions.clone();
    let rt = Runtime {
        daemon: DaemonConfig {
            workers: sc.workers,
            ring_slots: sc.ring_slots,
            batch_max: sc.batch_max,
            batch_wait_us: sc.batch_wait_us,
            budget_ms: sc.budget_ms,
            timeout_policy: sc.timeout_policy,
            slot_bytes: 256,
            ..Default::default()
        },
        workload: Workload::Multiplicity,
        deadlines: sc.deadlines,
        ordered_by_source: sc.ordered_by_source,
        make_sinks: Box::new(move |_| {
            Ok(vec![GuardedSink::new(
                Box::new(sink),
                policy,
                Some(Box::new(spill)),
                settings,
            )])
        }),
        on_decision: Box::new(move |d, _| seen.lock().unwrap().push(d.clone())),
        accepted: None,
        observer: Arc::new(NoObserver),
        stop: Arc::new(AtomicBool::new(false)),
        reload: Some(reload_rx),
        ready: None,
        progress: None,
        reopen: None,
        notify: None,
    };
    let inputs: Vec<Input> = streams
        .iter()
        .enumerate()
        .map(|(i, s)| Input {
            name: format!("sim{i}"),
            kind: InputKind::File(
                Box::new(SimFeed {
                    frames: s.clone(),
                    next: 0,
                }),
                Speed::Max,
            ),
        })
        .collect();
    let make = |fail: bool, kind: BackendKind| {
        let reloads = reloads_seen.clone();
        let sc = sc.clone();
        move |w: usize| -> anyhow::Result<Box<dyn Backend>> {
            Ok(Box::new(SimBackend {
                rng: ChaCha8Rng::seed_from_u64(sc.seed ^ (0xB0_0000 + w as u64)),
                kind,
                fail_p: if fail { sc.backend_fail_p } else { 0.0 },
                short_p: if fail { sc.backend_short_p } else { 0.0 },
                stall_p: sc.backend_stall_p,
                stall_us: sc.stall_us,
                lines: vec!["sim".into()],
                reloads: reloads.clone(),
            }))
        }
    };
    let primary = make(true, BackendKind::Gpu);
    let fallback = make(false, BackendKind::Cpu);

    let started = Instant::now();
    let summary = std::thread::scope(|scope| {
        let reloader = scope.spawn(|| {
            for _ in 0..sc.reloads {
                std::thread::sleep(Duration::from_micros(300));
                if reload_tx.send(Arc::new(Config::default())).is_err() {
                    break;
                }
            }
            drop(reload_tx);
        });
        let r = pipeline::run(
            rt,
            inputs,
            &primary,
            if sc.fallback { Some(&fallback) } else { None },
        );
        reloader.join().unwrap();
        r
    })
    .map_err(|e| format!("run failed: {e:#}"))?;
    let elapsed = started.elapsed();
    let decisions = std::mem::take(&mut *decisions.lock().unwrap());
    check(sc, &streams, &decisions, &summary, &sink_failures)?;
    check_delivery(&decisions, &taken.lock().unwrap(), &summary)?;
    let outcomes = OUTCOMES.map(|o| summary.outcome(o));
    Ok(Report {
        frames: summary.frames_in(),
        outcomes,
        failovers: summary.failovers,
        sink_errors: summary.sink_errors,
        sink_lost: summary.sinks.iter().map(|t| t.lost).sum(),
        spilled: summary.sinks.iter().map(|t| t.spilled).sum(),
        log: format!(
            "{} decisions in {elapsed:.2?}; outcomes (accept, reject, timeout, dropped, malformed) \
             {outcomes:?}; failovers {}; sink errors {}; reloads applied {}",
            decisions.len(),
            summary.failovers,
            summary.sink_errors,
            reloads_seen.load(Ordering::Relaxed),
        ),
    })
}

const OUTCOMES: [Outcome; 5] = [
    Outcome::Accept,
    Outcome::Reject,
    Outcome::Timeout,
    Outcome::Dropped,
    Outcome::Malformed,
];

/// What one seed's run did.
#[derive(Default)]
struct Report {
    frames: u64,
    outcomes: [u64; 5],
    failovers: u64,
    sink_errors: u64,
    sink_lost: u64,
    spilled: u64,
    log: String,
}

fn check(
    sc: &Scenario,
    streams: &[Arc<Vec<SimFrame>>],
    decisions: &[Decision],
    summary: &pipeline::Summary,
    sink_failures: &AtomicU64,
) -> Result<(), String> {
    macro_rules! ensure {
        ($cond:expr, $($msg:tt)*) => {
            if !$cond {
                return Err(format!($($msg)*));
            }
        };
    }
    ensure!(
        summary.sources.len() == sc.inputs,
        "{} sources in the summary, {} inputs",
        summary.sources.len(),
        sc.inputs
    );
    ensure!(summary.balanced(), "accounting does not balance");
    ensure!(
        summary.sink_errors == sink_failures.load(Ordering::Relaxed),
        "sink returned {} errors, summary counts {}",
        sink_failures.load(Ordering::Relaxed),
        summary.sink_errors
    );
    for (i, stream) in streams.iter().enumerate() {
        let totals = &summary.sources[i];
        ensure!(
            totals.frames_in == stream.len() as u64,
            "input {i}: {} frames taken in, {} offered",
            totals.frames_in,
            stream.len()
        );
        let mine: Vec<&Decision> = decisions
            .iter()
            .filter(|d| d.source as usize == i)
            .collect();
        ensure!(
            mine.len() == stream.len(),
            "input {i}: {} decisions for {} frames",
            mine.len(),
            stream.len()
        );
        let mut by_outcome = [0u64; 5];
        for d in &mine {
            by_outcome[d.outcome as usize] += 1;
        }
        ensure!(
            by_outcome == totals.outcomes,
            "input {i}: decisions seen {by_outcome:?}, accounting {:?}",
            totals.outcomes
        );

        // Exactly one decision per frame, none for a frame not offered.
        let index: HashMap<u64, &SimFrame> = stream.iter().map(|f| (f.id, f)).collect();
        let mut decided: HashMap<u64, usize> = HashMap::new();
        let mut unreadable = 0usize;
        for d in &mine {
            if d.timestamp_ns == 0 {
                unreadable += 1;
                ensure!(
                    d.outcome == Outcome::Malformed,
                    "input {i}: a decision without a frame id is {:?}",
                    d.outcome
                );
                continue;
            }
            let Some(f) = index.get(&d.timestamp_ns) else {
                return Err(format!(
                    "input {i}: decision for frame id {:#x}, never offered",
                    d.timestamp_ns
                ));
            };
            *decided.entry(f.id).or_default() += 1;
            check_outcome(sc, f, d).map_err(|e| format!("input {i}, frame {:#x}: {e}", f.id))?;
        }
        let expect_unreadable = stream.iter().filter(|f| !f.made.readable()).count();
        ensure!(
            unreadable == expect_unreadable,
            "input {i}: {unreadable} decisions without a frame id, {expect_unreadable} unreadable frames"
        );
        for f in stream.iter().filter(|f| f.made.readable()) {
            let n = decided.get(&f.id).copied().unwrap_or(0);
            ensure!(n == 1, "input {i}: frame {:#x} decided {n} times", f.id);
        }

        // Order: worker decisions per producer (where promised), source decisions per input.
        let position: HashMap<u64, usize> =
            stream.iter().enumerate().map(|(k, f)| (f.id, k)).collect();
        let ordered = sc.workers == 1 || sc.ordered_by_source;
        let mut last_worker: HashMap<u32, usize> = HashMap::new();
        let mut last_source: Option<usize> = None;
        for d in mine.iter().filter(|d| d.timestamp_ns != 0) {
            let f = index[&d.timestamp_ns];
            let k = position[&f.id];
            if f.made.at_source() {
                ensure!(
                    last_source.is_none_or(|p| p < k),
                    "input {i}: source decision for frame {k} after frame {}",
                    last_source.unwrap_or(0)
                );
                last_source = Some(k);
            } else if ordered {
                let prev = last_worker.insert(f.source_id, k);
                ensure!(
                    prev.is_none_or(|p| p < k),
                    "input {i}, producer {}: frame {k} decided after frame {}",
                    f.source_id,
                    prev.unwrap_or(0)
                );
            }
        }

        // Sequence accounting: what the producers' numbers imply for the frames that parse.
        let mut tracker = SequenceTracker::default();
        let (mut gaps, mut repeats) = (0u64, 0u64);
        for f in stream.iter().filter(|f| !f.made.at_source()) {
            match tracker.observe(f.source_id, f.sequence) {
                SeqEvent::Gap(n) => gaps += n,
                SeqEvent::Repeat => repeats += 1,
                _ => {}
            }
        }
        ensure!(
            (totals.sequence_gaps, totals.sequence_repeats) == (gaps, repeats),
            "input {i}: sequence gaps/repeats counted {:?}, implied {:?}",
            (totals.sequence_gaps, totals.sequence_repeats),
            (gaps, repeats)
        );
    }
    Ok(())
}

/// Every decision reached the sink or its spill sink, unless the sink counts it as lost.
fn check_delivery(
    decisions: &[Decision],
    taken: &[(u16, u64, u64)],
    summary: &pipeline::Summary,
) -> Result<(), String> {
    let mut reached: HashMap<(u16, u64, u64), usize> = HashMap::new();
    for &k in taken {
        *reached.entry(k).or_default() += 1;
    }
    let mut missing = 0u64;
    for d in decisions {
        match reached.get_mut(&(d.source, d.timestamp_ns, d.seq)) {
            Some(n) if *n > 0 => *n -= 1,
            _ => missing += 1,
        }
    }
    let lost: u64 = summary.sinks.iter().map(|t| t.lost).sum();
    if missing > lost {
        return Err(format!(
            "{missing} decisions reached no sink, the sinks count {lost} lost"
        ));
    }
    Ok(())
}

/// The outcome a frame may have, given how it was made and the scenario.
fn check_outcome(sc: &Scenario, f: &SimFrame, d: &Decision) -> Result<(), String> {
    if let Some(reason) = f.made.reason() {
        if d.outcome == Outcome::Timeout && f.made == Made::WrongKind {
            return Err("a wrong-kind frame timed out instead of being malformed".into());
        }
        return if d.outcome == Outcome::Malformed && d.reason == reason {
            Ok(())
        } else {
            Err(format!(
                "made {:?}: decided {:?} ({}), expected malformed ({reason})",
                f.made, d.outcome, d.reason
            ))
        };
    }
    match d.outcome {
        Outcome::Accept | Outcome::Reject => {
            let want = verdict_of(f.id);
            if (d.outcome == Outcome::Accept) != want || d.accepted != want {
                return Err(format!(
                    "backend verdict {want}, decided {:?} (accepted {})",
                    d.outcome, d.accepted
                ));
            }
            let kind = d.backend.ok_or("a backend verdict without a backend")?;
            if kind == BackendKind::Cpu && !sc.fallback {
                return Err("decided by a fallback that does not exist".into());
            }
            Ok(())
        }
        Outcome::Timeout => {
            if !sc.deadlines {
                return Err("timed out with deadlines off".into());
            }
            if d.accepted != (sc.timeout_policy == TimeoutPolicy::Accept) {
                return Err(format!(
                    "timeout resolved accepted={} under {:?}",
                    d.accepted, sc.timeout_policy
                ));
            }
            Ok(())
        }
        Outcome::Dropped => {
            let backend_can_fail = sc.backend_fail_p > 0.0 || sc.backend_short_p > 0.0;
            if d.reason == "backend_error" && backend_can_fail && !sc.fallback {
                Ok(())
            } else {
                Err(format!("dropped ({}) in scenario {sc:?}", d.reason))
            }
        }
        Outcome::Malformed => Err(format!("valid frame malformed ({})", d.reason)),
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("TRIGD_SIM_SEED") {
        return vec![s.parse().expect("TRIGD_SIM_SEED is a number")];
    }
    let n = std::env::var("TRIGD_SIM_SEEDS")
        .ok()
        .map(|s| s.parse().expect("TRIGD_SIM_SEEDS is a number"))
        .unwrap_or(2000);
    (0..n).collect()
}

#[test]
fn every_frame_gets_exactly_one_decision_under_generated_faults() {
    let one = std::env::var("TRIGD_SIM_SEED").is_ok();
    let started = Instant::now();
    let mut total = Report::default();
    let seeds = seeds();
    for &seed in &seeds {
        let sc = Scenario::from_seed(seed);
        match simulate(&sc) {
            Ok(r) => {
                if one {
                    eprintln!("seed {seed}: {sc:?}\n{} frames, {}", r.frames, r.log);
                }
                total.frames += r.frames;
                for (t, n) in total.outcomes.iter_mut().zip(r.outcomes) {
                    *t += n;
                }
                total.failovers += r.failovers;
                total.sink_errors += r.sink_errors;
                total.sink_lost += r.sink_lost;
                total.spilled += r.spilled;
            }
            Err(e) => panic!(
                "seed {seed}: {e}\nscenario: {sc:?}\nreproduce: \
                 TRIGD_SIM_SEED={seed} cargo test --release --test simulation -- --nocapture"
            ),
        }
    }
    eprintln!(
        "simulated {} seeds in {:.2?}: {} frames offered and decided, outcomes (accept, reject, \
         timeout, dropped, malformed) {:?}, {} failovers, {} sink errors counted, {} decisions \
         spilled, {} counted lost by the sinks, no frame without a decision",
        seeds.len(),
        started.elapsed(),
        total.frames,
        total.outcomes,
        total.failovers,
        total.sink_errors,
        total.spilled,
        total.sink_lost
    );
}

/// The checks catch what they are for: a decision dropped, duplicated or invented, or an
/// outcome the frame cannot have, is reported.
#[test]
fn the_checks_reject_a_run_that_loses_or_invents_a_decision() {
    let sc = Scenario {
        malformed_p: 0.0,
        deadlines: false,
        backend_fail_p: 0.0,
        backend_short_p: 0.0,
        sink_fail_p: 0.0,
        frames_per_input: vec![20],
        inputs: 1,
        ..Scenario::from_seed(7)
    };
    let streams = vec![Arc::new(sc.stream(0))];
    let decide = |f: &SimFrame| Decision {
        delivery: 0,
        source: 0,
        source_id: f.source_id,
        seq: f.sequence,
        timestamp_ns: f.id,
        workload: Workload::Multiplicity,
        outcome: if verdict_of(f.id) {
            Outcome::Accept
        } else {
            Outcome::Reject
        },
        accepted: verdict_of(f.id),
        reason: "",
        lines_fired: 0,
        latency_ns: 0,
        backend: Some(BackendKind::Gpu),
        detail: Default::default(),
    };
    let good: Vec<Decision> = streams[0].iter().map(decide).collect();
    let mut summary = pipeline::Summary {
        sources: vec![pipeline::SourceTotals {
            frames_in: 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    for d in &good {
        summary.sources[0].outcomes[d.outcome as usize] += 1;
    }
    let mut tracker = SequenceTracker::default();
    for f in streams[0].iter() {
        match tracker.observe(f.source_id, f.sequence) {
            SeqEvent::Gap(n) => summary.sources[0].sequence_gaps += n,
            SeqEvent::Repeat => summary.sources[0].sequence_repeats += 1,
            _ => {}
        }
    }
    let none = AtomicU64::new(0);
    assert_eq!(check(&sc, &streams, &good, &summary, &none), Ok(()));

    let mut lost = good.clone();
    lost.pop();
    assert!(check(&sc, &streams, &lost, &summary, &none).is_err());

    let mut twice = good.clone();
    twice[3] = good[2].clone();
    assert!(check(&sc, &streams, &twice, &summary, &none).is_err());

    let mut invented = good.clone();
    invented[5].timestamp_ns = 0xdead;
    assert!(check(&sc, &streams, &invented, &summary, &none).is_err());

    let mut flipped = good.clone();
    flipped[4].outcome = if flipped[4].accepted {
        Outcome::Reject
    } else {
        Outcome::Accept
    };
    assert!(check(&sc, &streams, &flipped, &summary, &none).is_err());

    let mut reordered = good.clone();
    let producer = reordered[0].source_id;
    let later = (1..20)
        .find(|&k| reordered[k].source_id == producer)
        .expect("a producer with two frames");
    reordered.swap(0, later);
    let sc_ordered = Scenario {
        ordered_by_source: true,
        ..sc.clone()
    };
    assert!(check(&sc_ordered, &streams, &reordered, &summary, &none).is_err());

    let one_error = AtomicU64::new(1);
    assert!(check(&sc, &streams, &good, &summary, &one_error).is_err());

    let taken: Vec<(u16, u64, u64)> = good
        .iter()
        .map(|d| (d.source, d.timestamp_ns, d.seq))
        .collect();
    assert_eq!(check_delivery(&good, &taken, &summary), Ok(()));
    assert!(check_delivery(&good, &taken[1..], &summary).is_err());
    let mut counted = summary.clone();
    counted.sinks = vec![trigd::sinks::guard::SinkTotals {
        lost: 1,
        ..Default::default()
    }];
    assert_eq!(check_delivery(&good, &taken[1..], &counted), Ok(()));
}
