//! Overload soak: the real runtime behind a real UDP socket, offered twice what its backend
//! can reconstruct, for 20 seconds with the `deadline` admission policy and 8 without.
//! Checks that memory stays flat, that every frame received has exactly one outcome, that
//! the excess is shed at the input as `overload` instead of timing out, and that without
//! the policy the same load turns into timeouts and full rings.
//!
//! The backend sleeps a fixed time per frame, so capacity is known and the test costs
//! little CPU: 200 us per frame on one worker is 5,000 frames/s; 10,000 are offered.

use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use trigd::backend::{Backend, BackendError, BackendKind, Verdict};
use trigd::config::{Admission, Config, DaemonConfig};
use trigd::decision::{Decision, Names, Outcome, Workload};
use trigd::frame::{encode_hit_event, FrameView, HitRecord, Stamp};
use trigd::pipeline::{self, Input, InputKind, Observe, Runtime, Summary};
use trigd::ring::Fill;
use trigd::sinks::guard::GuardedSink;
use trigd::sinks::{Sink, SinkPolicy};
use trigd::sources::{Endpoint, Limits};

const PER_FRAME: Duration = Duration::from_micros(200);
const OFFERED_HZ: u64 = 10_000;

/// Reconstructs nothing, slowly: `PER_FRAME` per frame, in one sleep per batch.
struct Slow {
    names: Vec<String>,
}
impl Backend for Slow {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn line_names(&self) -> &[String] {
        &self.names
    }
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        std::thread::sleep(PER_FRAME * batch.len() as u32);
        out.extend(batch.iter().map(|_| Verdict::default()));
        Ok(())
    }
    fn reload(&mut self, _: &Config) -> Result<(), String> {
        Ok(())
    }
}

/// Counts decisions by (outcome, reason); stores none of them.
#[derive(Clone, Default)]
struct Count(Arc<Mutex<HashMap<(Outcome, &'static str), u64>>>);
impl Sink for Count {
    fn write(&mut self, d: &Decision, _: &Names) -> std::io::Result<()> {
        *self
            .0
            .lock()
            .unwrap()
            .entry((d.outcome, d.reason))
            .or_default() += 1;
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl Count {
    fn get(&self, o: Outcome, reason: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|((oo, r), _)| *oo == o && *r == reason)
            .map(|(_, n)| n)
            .sum()
    }
    fn total(&self) -> u64 {
        self.0.lock().unwrap().values().sum()
    }
}

/// Frames received and the largest ring fill seen between two looks (as a scrape sees it).
#[derive(Default)]
struct Watch {
    received: AtomicU64,
    ring_peak: AtomicUsize,
}
impl Observe for Watch {
    fn received(&self, _: u16) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }
    fn ring_fill(&self, ring: &str, fill: &Fill) {
        if ring.ends_with("->w0") {
            self.ring_peak.fetch_max(fill.take_max(), Ordering::Relaxed);
        }
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

struct Phase {
    summary: Summary,
    counts: Count,
    sent: u64,
    rss_after_warmup: u64,
    rss_max: u64,
    ring_peak: usize,
}

fn soak(admission: Admission, seconds: u64) -> Phase {
    let bound = "udp://127.0.0.1:0"
        .parse::<Endpoint>()
        .unwrap()
        .bind()
        .unwrap();
    let to = bound.local_addr().unwrap();
    let counts = Count::default();
    let sink = counts.clone();
    let watch = Arc::new(Watch::default());
    let stop = Arc::new(AtomicBool::new(false));
    let rt = Runtime {
        daemon: DaemonConfig {
            workers: 1,
            ring_slots: 1024,
            batch_max: 16,
            budget_ms: 20.0,
            admission,
            ..Default::default()
        },
        workload: Workload::Multiplicity,
        deadlines: true,
        ordered_by_source: false,
        make_sinks: Box::new(move |_| {
            Ok(vec![GuardedSink::new(
                Box::new(sink),
                SinkPolicy::Block,
                None,
                Default::default(),
            )])
        }),
        on_decision: Box::new(|_, _| {}),
        accepted: None,
        observer: watch.clone(),
        stop: stop.clone(),
        reload: None,
        ready: None,
        progress: None,
        reopen: None,
        notify: None,
    };
    let input = Input {
        name: "udp0".into(),
        kind: InputKind::Socket(bound, Limits::default()),
    };
    let frame = |seq: u64| {
        let hits = [HitRecord {
            x_mm: 1.0,
            y_mm: 2.0,
            z_mm: 3.0,
            plane: 0,
            hit_id: 1,
        }; 8];
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            Stamp {
                source_id: 1,
                sequence: seq,
                timestamp_ns: seq,
            },
            &hits,
        );
        b
    };
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            pipeline::run(
                rt,
                vec![input],
                &|_| Ok(Box::new(Slow { names: Vec::new() }) as Box<dyn Backend>),
                None,
            )
        });
        // Offer OFFERED_HZ in 1 ms steps on an absolute schedule; sample memory each second.
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let start = Instant::now();
        let per_ms = OFFERED_HZ / 1000;
        let mut sent = 0u64;
        let mut rss_after_warmup = 0;
        let mut rss_max = 0;
        let mut ring_peak = 0;
        let mut next_sample = 1;
        while start.elapsed() < Duration::from_secs(seconds) {
            for _ in 0..per_ms {
                tx.send_to(&frame(sent), to).unwrap();
                sent += 1;
            }
            let ms = sent / per_ms;
            let due = start + Duration::from_millis(ms);
            if let Some(left) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
            let secs = start.elapsed().as_secs();
            if secs >= next_sample {
                next_sample = secs + 1;
                let rss = rss_bytes();
                if secs == 4 {
                    rss_after_warmup = rss;
                }
                rss_max = rss_max.max(rss);
                ring_peak = ring_peak.max(watch.ring_peak.swap(0, Ordering::Relaxed));
            }
        }
        // Let the kernel hand over what is in the socket buffer, then stop.
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let summary = run.join().unwrap().unwrap();
        Phase {
            summary,
            counts,
            sent,
            rss_after_warmup,
            rss_max,
            ring_peak,
        }
    })
}

#[test]
fn twice_capacity_is_shed_at_the_input_with_flat_memory_and_full_accounting() {
    let p = soak(Admission::Deadline, 20);
    let s = &p.summary;
    let frames = s.frames_in();
    let (accept, reject) = (s.outcome(Outcome::Accept), s.outcome(Outcome::Reject));
    let timeout = s.outcome(Outcome::Timeout);
    let overload = p.counts.get(Outcome::Dropped, "overload");
    let ring_full = p.counts.get(Outcome::Dropped, "ring_full");
    eprintln!(
        "admission deadline: sent {} received {frames}: accept {accept} reject {reject} timeout {timeout} overload {overload} ring_full {ring_full}; rss {} -> max {} bytes; ring peak {} of 1024",
        p.sent, p.rss_after_warmup, p.rss_max, p.ring_peak
    );
    // Every frame received has exactly one outcome, and the sink saw each one.
    assert!(s.balanced());
    assert_eq!(p.counts.total(), frames);
    assert_eq!(frames, accept + reject + timeout + overload + ring_full);
    assert!(frames * 100 >= p.sent * 95, "loopback lost more than 5%");
    assert_eq!(s.undelivered(), 0);
    // Half the offer is beyond capacity: shed at the input, not left to time out.
    assert!(
        overload * 4 >= frames,
        "too little shed: {overload} of {frames}"
    );
    assert!(
        (accept + reject) * 5 >= frames,
        "too little reconstructed: {} of {frames}",
        accept + reject
    );
    assert!(timeout * 10 <= frames, "{timeout} of {frames} timed out");
    let shed_timeout_ratio = timeout as f64 / frames as f64;
    assert!(
        ring_full * 100 <= frames,
        "{ring_full} of {frames} found the ring full"
    );
    // The queue is held near the deadline (20 ms / 200 us = 100 frames), well below the ring.
    assert!(
        p.ring_peak > 0 && p.ring_peak < 512,
        "ring peak {}",
        p.ring_peak
    );
    // Flat memory: slots and buffers were allocated at start; 16 s more of overload add
    // nothing but noise.
    assert!(p.rss_after_warmup > 0);
    assert!(
        p.rss_max <= p.rss_after_warmup + (4 << 20),
        "memory grew from {} to {} bytes",
        p.rss_after_warmup,
        p.rss_max
    );

    // The same overload without admission: frames wait in a full ring past their deadline.
    let q = soak(Admission::None, 8);
    let s = &q.summary;
    let frames = s.frames_in();
    let timeout = s.outcome(Outcome::Timeout);
    let ring_full = q.counts.get(Outcome::Dropped, "ring_full");
    eprintln!(
        "admission none: sent {} received {frames}: timeout {timeout} ring_full {ring_full} overload {}; ring peak {}",
        q.sent,
        q.counts.get(Outcome::Dropped, "overload"),
        q.ring_peak
    );
    assert!(s.balanced());
    assert_eq!(q.counts.get(Outcome::Dropped, "overload"), 0);
    assert!(
        (timeout + ring_full) * 4 >= frames,
        "without shedding the overload shows as timeouts and full rings: {timeout} + {ring_full} of {frames}"
    );
    let timeout_ratio = timeout as f64 / frames as f64;
    assert!(
        timeout_ratio > 4.0 * shed_timeout_ratio,
        "admission cut timeouts from {timeout_ratio:.3} to {shed_timeout_ratio:.3} only"
    );
    // More than a deadline's worth of work queues up (20 ms / 200 us = 100 frames).
    assert!(
        q.ring_peak > 100,
        "the queue grows past the deadline: peak {} (with admission {})",
        q.ring_peak,
        p.ring_peak
    );
}
