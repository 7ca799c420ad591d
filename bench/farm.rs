//! A farm on NATS JetStream against UDP input, in one run, on the real binary and a real
//! `nats-server` (loopback):
//! 1. throughput: N minimum-bias events (tracking, CPU) sent at a rate above what the nodes
//!    decide (`FARM_SEND_HZ`, default 20,000/s; unpaced UDP overflows the kernel's socket
//!    buffer), to one node over UDP, then to 1, 2 and 3 nodes through a JetStream work queue;
//!    frames/s from the first frame sent to the last decision stored in the decision stream;
//! 2. added latency per frame: frames sent at a steady rate, each stamped with the wall
//!    clock when sent; latency = the decision's time in the decision stream (the server's
//!    clock, same host) minus the send time; p50/p99 for UDP input and for NATS input, both
//!    with their decisions published to the decision stream, and the difference.
//!
//! Every node buffers the whole run in its slots (`ring_slots` >= N), so UDP drops nothing
//! and both inputs are measured at the reconstruction's pace plus what the input adds.
//!
//! `cargo bench --bench farm` (builds `target/release/trigd` first if needed). Options
//! through the environment: `FARM_FRAMES` (throughput, default 20,000), `FARM_RATE_HZ`
//! (latency, default 1,000), `FARM_LATENCY_FRAMES` (default 3,000).

use std::collections::HashMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;
use trigd::farm;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn trigd_bin() -> PathBuf {
    std::env::var_os("TRIGD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/trigd"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node; returns once its log says its input is open.
fn node(cfg: &Path, listen: &str, decisions: &str, log: &Path, ready: &str) -> Killed {
    let child = Command::new(trigd_bin())
        .args(["run", "--config"])
        .arg(cfg)
        .args(["--listen", listen, "--decisions-nats", decisions])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let k = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut s = String::new();
        std::fs::File::open(log)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        if s.contains(ready) {
            return k;
        }
        assert!(Instant::now() < deadline, "node did not start:\n{s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stream_messages(js: &jetstream::Context, name: &str) -> u64 {
    farm::runtime().block_on(async {
        match js.get_stream(name).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    })
}

/// Waits until the stream holds `n` messages, or its count has not grown for 2 s; returns
/// the count and when it last grew.
fn wait_settled(js: &jetstream::Context, name: &str, n: u64) -> (u64, Instant) {
    let mut last = (0u64, Instant::now());
    loop {
        let c = stream_messages(js, name);
        if c != last.0 {
            last = (c, Instant::now());
        }
        if c >= n || last.1.elapsed() > Duration::from_secs(2) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_for(js: &jetstream::Context, name: &str, n: u64) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(300);
    while stream_messages(js, name) < n {
        assert!(Instant::now() < deadline, "{name} never reached {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
    Instant::now()
}

/// (source_id, seq) -> the server's time of each decision in the stream, ns since the epoch.
fn stored_times(js: &jetstream::Context, name: &str) -> HashMap<(u64, u64), i128> {
    let total = stream_messages(js, name) as usize;
    farm::runtime().block_on(async {
        let s = js.get_stream(name).await.unwrap();
        let c = s
            .create_consumer(pull::Config {
                ack_policy: jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut out = HashMap::new();
        while out.len() < total {
            let mut b = c
                .batch()
                .max_messages(4096)
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .unwrap();
            let before = out.len();
            while let Some(Ok(m)) = b.next().await {
                let t = m.info().unwrap().published.unix_timestamp_nanos();
                let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
                let key = (v["source_id"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
                out.insert(key, t);
            }
            if out.len() == before {
                break;
            }
        }
        out
    })
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let n: usize = env_or("FARM_FRAMES", 20_000);
    let rate: f64 = env_or("FARM_RATE_HZ", 1_000.0);
    let n_lat: usize = env_or("FARM_LATENCY_FRAMES", 3_000);
    let send_rate: f64 = env_or("FARM_SEND_HZ", 20_000.0);
    if !trigd_bin().exists() {
        let st = Command::new("cargo")
            .args(["build", "--release"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let rec_path = tmp.path().join("minbias.trgr");
    let st = Command::new(trigd_bin())
        .args([
            "simulate", "tracking", "--preset", "minbias", "--seed", "11",
        ])
        .args(["--events", &n.max(n_lat).to_string(), "--geometry"])
        .arg(root.join("fixtures/detector.toml"))
        .arg("--recording")
        .arg(&rec_path)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let rec = trigd::recording::Recording::open(&rec_path).unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nworkload = \"tracking\"\nbackend = \"cpu\"\nbudget_ms = 600000.0\nring_slots = {}\nslot_bytes = 8192\n[tracking]\ngeometry = \"{}\"\n",
            n.max(n_lat) + 16,
            root.join("fixtures/detector.toml").display()
        ),
    )
    .unwrap();

    let store = tmp.path().join("js");
    std::fs::create_dir_all(&store).unwrap();
    let port = free_port();
    let _server = Killed(
        Command::new("nats-server")
            .args(["-js", "-sd"])
            .arg(&store)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (run ./setup.sh)"),
    );
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let server: farm::NatsUrl = format!("nats://127.0.0.1:{port}").parse().unwrap();
    let client = farm::connect(&server, Duration::from_secs(5)).unwrap();
    let js = farm::js_context(client);
    let url = |s: &str| format!("nats://127.0.0.1:{port}/{s}");
    let frames = |count: usize| rec.iter().take(count);
    println!(
        "farm bench: {n} minimum-bias events ({:.1} kB each), tracking on the CPU, one worker per node",
        rec.file_len_bytes() as f64 / rec.len() as f64 / 1e3
    );

    // 1. Throughput.
    let udp_port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let log = tmp.path().join("udp.log");
    let udp_node = node(
        &cfg,
        &format!("udp://127.0.0.1:{udp_port}"),
        &url("D_UDP"),
        &log,
        "listening",
    );
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send_period = Duration::from_secs_f64(1.0 / send_rate);
    let t0 = Instant::now();
    for (i, f) in frames(n).enumerate() {
        let due = t0 + send_period.mul_f64(i as f64);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        sock.send_to(f, ("127.0.0.1", udp_port)).unwrap();
    }
    let (decided, at) = wait_settled(&js, "D_UDP", n as u64);
    let udp_fps = decided as f64 / (at - t0).as_secs_f64();
    drop(udp_node);
    println!(
        "udp input, 1 node:   {udp_fps:>8.0} frames/s  ({} of {n} frames lost before trigd, in the kernel)",
        n as u64 - decided
    );

    let mut nats_fps = Vec::new();
    for k in 1..=3usize {
        let input = format!("F{k}");
        let out = format!("D{k}");
        let nodes: Vec<Killed> = (0..k)
            .map(|i| {
                node(
                    &cfg,
                    &url(&input),
                    &url(&out),
                    &tmp.path().join(format!("n{k}_{i}.log")),
                    "pulling frames",
                )
            })
            .collect();
        let t0 = Instant::now();
        let st = Command::new(trigd_bin())
            .arg("send")
            .arg(&rec_path)
            .args(["--to", &url(&input), "--rate", &send_rate.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        // The sender sent the whole recording; count only the first n.
        let total = rec.len() as u64;
        let fps = total as f64 / (wait_for(&js, &out, total) - t0).as_secs_f64();
        drop(nodes);
        println!(
            "nats input, {k} node{}: {fps:>8.0} frames/s  ({:.2} x udp)",
            if k > 1 { "s" } else { " " },
            fps / udp_fps
        );
        nats_fps.push(fps);
    }

    // 2. Latency at a steady rate.
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut results = Vec::new();
    for kind in ["udp", "nats"] {
        let out = format!("L_{kind}");
        let log = tmp.path().join(format!("lat_{kind}.log"));
        let (listen, ready) = match kind {
            "udp" => (format!("udp://127.0.0.1:{udp_port}"), "listening"),
            _ => (url("LF"), "pulling frames"),
        };
        let _node = node(&cfg, &listen, &url(&out), &log, ready);
        let mut sent = HashMap::new();
        let t0 = Instant::now();
        farm::runtime().block_on(async {
            for (i, f) in frames(n_lat).enumerate() {
                let due = t0 + period.mul_f64(i as f64);
                let now = Instant::now();
                if due > now {
                    tokio::time::sleep(due - now).await;
                }
                let v = trigd::frame::parse(f).unwrap();
                sent.insert((v.source_id() as u64, v.sequence()), now_ns());
                if kind == "udp" {
                    sock.send_to(f, ("127.0.0.1", udp_port)).unwrap();
                } else {
                    js.send_publish(
                        farm::frame_subject("LF"),
                        jetstream::message::PublishMessage::build()
                            .payload(bytes::Bytes::copy_from_slice(f)),
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                }
            }
        });
        wait_for(&js, &out, n_lat as u64);
        let stored = stored_times(&js, &out);
        let mut lat_us: Vec<f64> = sent
            .iter()
            .filter_map(|(k, t)| stored.get(k).map(|s| (s - t) as f64 / 1e3))
            .collect();
        assert_eq!(lat_us.len(), n_lat);
        let p50 = quantile(&mut lat_us, 0.5);
        let p99 = quantile(&mut lat_us, 0.99);
        println!("{kind:>4} input at {rate:.0} frames/s: send -> decision stored p50 {p50:.0} us, p99 {p99:.0} us");
        results.push((p50, p99));
    }
    println!(
        "added by the NATS input: p50 {:+.0} us, p99 {:+.0} us",
        results[1].0 - results[0].0,
        results[1].1 - results[0].1
    );
    let _ = nats_fps;
}
