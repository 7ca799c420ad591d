//! Recording I/O throughput for small hit frames: append (`RecordingWriter`, fsync never),
//! open (map + verify every record), and read back (`Recording::iter`, with and without a
//! full `frame::parse` of each frame).
//!
//! `cargo bench --bench recording` (env `TRIGD_BENCH_FRAMES`, default 500000; `TRIGD_BENCH_HITS`,
//! hits per frame, default 10). Prints one line per measurement, best of 3.

use std::time::{Duration, Instant};

use trigd::frame::{self, encode_hit_event, HitRecord, Stamp};
use trigd::recording::{FsyncPolicy, Recording, RecordingWriter};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn report(what: &str, frames: usize, bytes: u64, best: Duration) {
    let s = best.as_secs_f64();
    println!(
        "{what:<28} {:>8.2} Mframes/s {:>7.2} GB/s  ({frames} frames, {:.1} MB, best {:.1} ms)",
        frames as f64 / s / 1e6,
        bytes as f64 / s / 1e9,
        bytes as f64 / 1e6,
        s * 1e3
    );
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.expect("runs >= 1"))
}

fn main() {
    let n = env_usize("TRIGD_BENCH_FRAMES", 500_000);
    let n_hits = env_usize("TRIGD_BENCH_HITS", 10);
    let hits: Vec<HitRecord> = (0..n_hits)
        .map(|i| HitRecord {
            x_mm: i as f32,
            y_mm: 2.0 * i as f32,
            z_mm: 100.0 * (i % 8) as f32,
            plane: (i % 8) as u16,
            hit_id: i as u32,
        })
        .collect();
    // Pre-encode a few distinct frames (sequence/timestamp are patched per frame below).
    let mut proto = Vec::new();
    encode_hit_event(
        &mut proto,
        Stamp {
            source_id: 1,
            sequence: 0,
            timestamp_ns: 0,
        },
        &hits,
    );
    let frame_len = proto.len();
    let frames_bytes = (n * frame_len) as u64;
    println!("# {n} hit frames of {frame_len} bytes ({n_hits} hits)");

    let dir = tempfile::tempdir().expect("temp dir");
    let mut k = 0;
    let (write_best, path) = best_of(3, || {
        k += 1;
        let path = dir.path().join(format!("bench{k}.trgd"));
        let mut w = RecordingWriter::create(&path, FsyncPolicy::Never).expect("create");
        let mut f = proto.clone();
        for i in 0..n as u64 {
            f[16..24].copy_from_slice(&i.to_le_bytes());
            f[24..32].copy_from_slice(&(1_000 * i).to_le_bytes());
            w.append(&f).expect("append");
        }
        w.finish().expect("finish");
        path
    });
    report("write (append+finish)", n, frames_bytes, write_best);

    let (open_best, rec) = best_of(3, || Recording::open(&path).expect("open"));
    assert_eq!(rec.len(), n);
    report("open (map + verify)", n, frames_bytes, open_best);

    let (iter_best, total) = best_of(3, || {
        rec.iter()
            .map(|f| f.len() as u64 + f[HEADER_BYTE] as u64)
            .sum::<u64>()
    });
    assert!(total >= frames_bytes);
    report("iterate (borrow frames)", n, frames_bytes, iter_best);

    let (parse_best, hits_seen) = best_of(3, || {
        rec.iter()
            .map(|f| match frame::parse(f).expect("valid").payload {
                frame::Payload::Hits(h) => h.len(),
                frame::Payload::Eeg(_) => 0,
            })
            .sum::<usize>()
    });
    assert_eq!(hits_seen, n * n_hits);
    report("iterate + frame::parse", n, frames_bytes, parse_best);

    let (seek_best, found) = best_of(3, || {
        (0..100_000u64)
            .map(|i| {
                rec.index_at_or_after_timestamp((i * 7_919) % (1_000 * n as u64))
                    .unwrap_or(0)
            })
            .sum::<usize>()
    });
    assert!(found > 0);
    println!(
        "{:<28} {:>8.1} ns/seek",
        "seek by timestamp",
        seek_best.as_nanos() as f64 / 100_000.0
    );
}

/// A byte inside the frame header, read so the iteration touches every frame's memory.
const HEADER_BYTE: usize = 6;
