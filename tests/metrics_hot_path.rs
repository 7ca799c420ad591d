//! The per-frame work of metrics and sinks does not touch the heap once handles are made:
//! a counting allocator (per thread, so other tests do not disturb it) watches a loop of
//! counting, observing and writing decisions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{self, BufWriter};

use trigd::backend::{BackendKind, Detail};
use trigd::decision::{Decision, Names, Outcome, Workload};
use trigd::metrics::{Metrics, Stage};
use trigd::sinks::binlog::BinlogSink;
use trigd::sinks::jsonl::JsonlSink;
use trigd::sinks::udp::UdpSink;
use trigd::sinks::Sink;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn decisions() -> Vec<Decision> {
    let base = Decision {
        delivery: 0,
        source: 0,
        source_id: 3,
        seq: 0,
        timestamp_ns: 1_000,
        workload: Workload::Tracking,
        outcome: Outcome::Accept,
        accepted: true,
        reason: "",
        lines_fired: 0b11,
        latency_ns: 250_000,
        backend: Some(BackendKind::Gpu),
        detail: Detail::Tracking {
            n_tracks: 2,
            max_p_gev: 4.5,
        },
    };
    vec![
        base.clone(),
        Decision {
            outcome: Outcome::Reject,
            accepted: false,
            lines_fired: 0,
            ..base.clone()
        },
        Decision {
            outcome: Outcome::Timeout,
            reason: "deadline",
            ..base.clone()
        },
        Decision {
            source: 1,
            workload: Workload::Eeg,
            outcome: Outcome::Dropped,
            accepted: false,
            reason: "ring_full",
            lines_fired: 0,
            backend: None,
            detail: Detail::None,
            ..base.clone()
        },
        Decision {
            workload: Workload::Eeg,
            detail: Detail::Eeg {
                statistic: 7.5,
                peak_source: 9,
                peak_pos_mm: [1.0, 2.0, 3.0],
            },
            ..base
        },
    ]
}

#[test]
fn counting_observing_and_writing_decisions_does_not_allocate() {
    let metrics = Metrics::new().unwrap();
    let names = Names {
        sources: vec!["udp0".into(), "eeg0".into()],
        lines: vec!["a".into(), "b".into()],
    };
    let mut dm = metrics.decisions(&names);
    let source = metrics.source("udp0");
    let stages = metrics.stages();
    let ring = metrics.ring("udp0", 4096);
    let gpu = metrics.backend(BackendKind::Gpu);
    let mut jsonl = JsonlSink::new(BufWriter::with_capacity(1 << 16, io::sink()));
    let mut binlog =
        BinlogSink::new(BufWriter::with_capacity(1 << 16, io::sink()), &names).unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut udp = UdpSink::connect(&rx.local_addr().unwrap().to_string()).unwrap();
    let decisions = decisions();

    let mut step = |i: usize| {
        let d = &decisions[i % decisions.len()];
        source.received();
        dm.record(d);
        for (k, s) in Stage::ALL.iter().enumerate() {
            stages[k].observe(1e-6 * (i % 1000) as f64 * (*s as u8 + 1) as f64);
        }
        ring.set_fill(i % 4096);
        gpu.observe_batch(i % 300 + 1);
        jsonl.write(d, &names).unwrap();
        binlog.write(d, &names).unwrap();
        if i % 64 == 0 {
            udp.write(d, &names).unwrap();
        }
    };
    // Warm-up: the first frame with each reason resolves its counter once.
    for i in 0..decisions.len() {
        step(i);
    }
    let before = allocations();
    for i in 0..20_000 {
        step(i);
    }
    let allocated = allocations() - before;
    assert_eq!(allocated, 0, "{allocated} heap allocations in 20000 frames");
}

/// Per-operation cost, for bench/RESULTS.md:
/// `cargo test --release --test metrics_hot_path -- --ignored --nocapture`
#[test]
#[ignore = "timing: run in release, see bench/RESULTS.md"]
fn hot_path_cost_ns() {
    use std::hint::black_box;
    use std::time::Instant;
    const N: usize = 2_000_000;
    let metrics = Metrics::new().unwrap();
    let names = Names {
        sources: vec!["udp0".into(), "eeg0".into()],
        lines: vec!["a".into(), "b".into()],
    };
    let mut dm = metrics.decisions(&names);
    let mut source = metrics.source("udp0");
    let stage = metrics.stage(Stage::Reconstruct);
    let decisions = decisions();
    let mut jsonl = JsonlSink::new(BufWriter::with_capacity(1 << 16, io::sink()));
    let mut binlog =
        BinlogSink::new(BufWriter::with_capacity(1 << 16, io::sink()), &names).unwrap();

    let time = |label: &str, f: &mut dyn FnMut(usize)| {
        let t = Instant::now();
        for i in 0..N {
            f(black_box(i));
        }
        let ns = t.elapsed().as_nanos() as f64 / N as f64;
        println!("{label:<44} {ns:8.1} ns");
    };
    time("SourceMetrics::count(accept, \"\")", &mut |_| {
        source.count(Outcome::Accept, "")
    });
    time("SourceMetrics::count(dropped, \"ring_full\")", &mut |_| {
        source.count(Outcome::Dropped, "ring_full")
    });
    time("Histogram::observe (stage)", &mut |i| {
        stage.observe((i % 1000) as f64 * 1e-6)
    });
    time("DecisionMetrics::record", &mut |i| {
        dm.record(&decisions[i % decisions.len()])
    });
    time("JsonlSink::write (to io::sink)", &mut |i| {
        jsonl
            .write(&decisions[i % decisions.len()], &names)
            .unwrap()
    });
    time("BinlogSink::write (to io::sink)", &mut |i| {
        binlog
            .write(&decisions[i % decisions.len()], &names)
            .unwrap()
    });
    let t = Instant::now();
    let text = metrics.render().unwrap();
    println!(
        "Metrics::render ({} bytes)                    {:8.1} us",
        text.len(),
        t.elapsed().as_secs_f64() * 1e6
    );
}
