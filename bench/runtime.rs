//! What the runtime itself adds, measured on the real binary:
//! 1. frames/s from file replay to the binary decision log (small hit events, the
//!    multiplicity line, `--speed max`);
//! 2. latency arrival-to-decision and per stage (p50/p99 from the exported Prometheus
//!    histograms) under a steady UDP load.
//!
//! `cargo bench --bench runtime` (builds `target/release/trigd` first if needed).
//! Options through the environment: `RUNTIME_FRAMES` (replay, default 1,000,000),
//! `RUNTIME_RATE_HZ` (UDP, default 20,000), `RUNTIME_SECONDS` (UDP, default 5).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trigd::frame::{encode_hit_event, HitRecord, Stamp};
use trigd::recording::{FsyncPolicy, RecordingWriter};

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn small_frame(seq: u64, buf: &mut Vec<u8>) {
    let hits: [HitRecord; 4] = std::array::from_fn(|i| HitRecord {
        x_mm: i as f32,
        y_mm: seq as f32 * 1e-3,
        z_mm: 100.0 * i as f32,
        plane: i as u16,
        hit_id: i as u32,
    });
    buf.clear();
    encode_hit_event(
        buf,
        Stamp {
            source_id: 1,
            sequence: seq,
            timestamp_ns: seq * 1000,
        },
        &hits,
    );
}

fn trigd() -> std::path::PathBuf {
    if let Some(b) = std::env::var_os("TRIGD_BIN") {
        return b.into();
    }
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = root.join("target/release/trigd");
    if !bin.exists() {
        let st = Command::new("cargo")
            .args(["build", "--release", "--bin", "trigd"])
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(st.success());
    }
    bin
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    r.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Prometheus-style quantile from cumulative `_bucket` lines matching `name` and `filter`.
fn quantile(text: &str, name: &str, filter: &str, q: f64) -> f64 {
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(filter))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total == 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            return prev.0 + (le - prev.0) * (rank - prev.1) / (c - prev.1).max(1e-12);
        }
        prev = (le, c);
    }
    prev.0
}

fn main() {
    let bin = trigd();
    let dir = tempfile::tempdir().unwrap();

    // 1. Replay throughput.
    let n: u64 = env_or("RUNTIME_FRAMES", 1_000_000);
    let rec = dir.path().join("small.trgr");
    let mut w = RecordingWriter::create(&rec, FsyncPolicy::Never).unwrap();
    let mut buf = Vec::new();
    for seq in 0..n {
        small_frame(seq, &mut buf);
        w.append(&buf).unwrap();
    }
    w.finish().unwrap();
    let bl = dir.path().join("d.tdl");
    let t0 = Instant::now();
    let out = Command::new(&bin)
        .args([
            "replay",
            rec.to_str().unwrap(),
            "--decisions-bin",
            bl.to_str().unwrap(),
            "--no-progress",
        ])
        .args(["--log", "warn"])
        .output()
        .unwrap();
    let wall = t0.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    println!("## replay to binary decision log: {n} frames of 4 hits (128 bytes)\n");
    for l in summary.lines() {
        println!("    {l}");
    }
    println!(
        "\nwhole process (start, mmap, decide, write, exit): {:.0} frames/s\n",
        n as f64 / wall
    );

    // 2. Steady UDP load.
    let rate: f64 = env_or("RUNTIME_RATE_HZ", 20_000.0);
    let secs: f64 = env_or("RUNTIME_SECONDS", 5.0);
    let mut child = Command::new(&bin)
        .args([
            "run",
            "--listen",
            "udp://127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--decisions-bin",
            dir.path().join("u.tdl").to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut addr_of = |needle: &str| -> SocketAddr {
        loop {
            let l = lines.next().expect("trigd log").unwrap();
            if l.contains(needle) {
                let a = l
                    .split("addr=")
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap();
                return a.trim_matches('"').parse().unwrap();
            }
        }
    };
    let udp = addr_of("listening");
    let metrics = addr_of("metrics at");
    std::thread::spawn(move || for _ in lines {});
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let period = Duration::from_secs_f64(1.0 / rate);
    let total = (rate * secs) as u64;
    let start = Instant::now();
    for seq in 0..total {
        let due = start + period.mul_f64(seq as f64);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        small_frame(seq, &mut buf);
        sock.send_to(&buf, udp).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let text = http_get(metrics, "/metrics");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    println!("## steady UDP load: {rate} frames/s for {secs} s ({total} frames of 128 bytes)\n");
    println!("| measure | p50 (us) | p99 (us) |");
    println!("|---|---|---|");
    let row = |label: &str, name: &str, filter: &str| {
        println!(
            "| {label} | {:.1} | {:.1} |",
            quantile(&text, name, filter, 0.5) * 1e6,
            quantile(&text, name, filter, 0.99) * 1e6
        );
    };
    row("arrival to decision", "trigd_decision_latency_seconds", "");
    for stage in ["queue", "batch", "reconstruct", "decide", "sink"] {
        row(
            &format!("stage {stage}"),
            "trigd_stage_seconds",
            &format!("stage=\"{stage}\""),
        );
    }
}
