//! A farm of trigd nodes on a real NATS JetStream server (`nats-server`, installed by
//! `./setup.sh` from Debian): three nodes share one work queue, one node is killed with
//! SIGKILL mid-run and the server is restarted once, and still every frame of a 10,000
//! event minimum-bias recording has exactly one decision in the decision stream, equal to
//! the decision a single-node replay of the same recording makes. Also: a malformed
//! message is decided `malformed` and acknowledged (not redelivered for ever), an
//! unreachable server is a clear error, `trigd record` reads a stream back, and nodes
//! starting together all get the one stream and consumer whichever of them creates it.

mod common;

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{root, trigd_bin, Daemon};
use serde_json::Value;

/// The `nats-server` binary. Missing is a failure, not a skip: CI installs it.
fn nats_server_bin() -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/bin"])
    {
        let p = Path::new(dir).join("nats-server");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "nats-server is not installed: run ./setup.sh (it installs the Debian package nats-server)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A nats-server with JetStream, its store in `dir`, on a loopback port.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Server {
    fn start(dir: &Path, port: u16) -> Server {
        let child = Command::new(nats_server_bin())
            .args(["-js", "-sd"])
            .arg(dir)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    fn url(&self, stream: &str) -> String {
        format!("nats://127.0.0.1:{}/{stream}", self.port)
    }

    /// Stops the server (SIGTERM, as a service manager would) and starts it again on the
    /// same port and store.
    fn restart(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let fresh = Server::start(&self.dir, self.port);
        // Replace without running Drop on the old one (already reaped).
        let old = std::mem::replace(self, fresh);
        std::mem::forget(old);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn trigd(args: &[&str]) -> std::process::Output {
    Command::new(trigd_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run trigd")
}

fn geometry() -> String {
    root().join("fixtures/detector.toml").display().to_string()
}

/// A recording of `events` minimum-bias events.
fn minbias(dir: &Path, events: usize) -> PathBuf {
    let rec = dir.join(format!("minbias{events}.trgr"));
    let out = trigd(&[
        "simulate",
        "tracking",
        "--preset",
        "minbias",
        "--events",
        &events.to_string(),
        "--seed",
        "2026",
        "--geometry",
        &geometry(),
        "--recording",
        rec.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rec
}

/// Every message of a stream: (message id, decision JSON).
fn read_stream(port: u16, stream: &str) -> Vec<(Option<String>, Value)> {
    let url: trigd::farm::NatsUrl = format!("nats://127.0.0.1:{port}").parse().unwrap();
    let client = trigd::farm::connect(&url, Duration::from_secs(5)).unwrap();
    let js = trigd::farm::js_context(client);
    let mut out = Vec::new();
    trigd::farm::runtime()
        .block_on(trigd::farm::read_stream(&js, stream, |id, payload| {
            let v: Value = serde_json::from_slice(payload)
                .unwrap_or_else(|e| panic!("decision is not JSON ({e}): {payload:?}"));
            out.push((id.map(str::to_string), v));
        }))
        .unwrap();
    out
}

/// A decision without what legitimately differs between runs (input name, latency).
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().unwrap();
    o.remove("source");
    o.remove("latency_us");
    v
}

fn node(server: &Server, decisions: &Path) -> Daemon {
    Daemon::spawn(&[
        "run",
        "--listen",
        &server.url("FRAMES"),
        "--ack-wait-s",
        "2",
        "--connect-retry-s",
        "10",
        "--workload",
        "tracking",
        "--backend",
        "cpu",
        "--geometry",
        &geometry(),
        // Far beyond any frame's time here: the farm decides as the replay does, with no
        // timeouts on a loaded 2-core machine.
        "--budget-ms",
        "600000",
        "--decisions-nats",
        &server.url("DECISIONS"),
        "--decisions",
        decisions.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ])
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Publishes raw payloads to the frames subject (what a broken event builder might send).
fn publish_raw(port: u16, stream: &str, payloads: &[&[u8]]) {
    let url: trigd::farm::NatsUrl = format!("nats://127.0.0.1:{port}").parse().unwrap();
    let client = trigd::farm::connect(&url, Duration::from_secs(5)).unwrap();
    let js = trigd::farm::js_context(client.clone());
    trigd::farm::runtime().block_on(async {
        for p in payloads {
            js.publish(
                trigd::farm::frame_subject(stream),
                bytes::Bytes::copy_from_slice(p),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
    });
}

#[test]
fn three_nodes_decide_every_frame_once_through_a_killed_node_and_a_server_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = minbias(tmp.path(), 10_000);

    // The reference: one node replaying the recording.
    let single = tmp.path().join("single.jsonl");
    let out = trigd(&[
        "replay",
        rec.to_str().unwrap(),
        "--workload",
        "tracking",
        "--backend",
        "cpu",
        "--geometry",
        &geometry(),
        "--decisions",
        single.to_str().unwrap(),
        "--no-progress",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference: HashMap<(u64, u64), Value> = common::read_jsonl(&single)
        .iter()
        .map(|v| {
            let key = (v["source_id"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
            (key, comparable(v))
        })
        .collect();
    assert_eq!(reference.len(), 10_000);

    let store = tmp.path().join("js");
    std::fs::create_dir_all(&store).unwrap();
    let mut server = Server::start(&store, free_port());

    // Three nodes: they create the streams and the shared consumer (idempotently).
    let logs: Vec<PathBuf> = (0..3)
        .map(|i| tmp.path().join(format!("node{i}.jsonl")))
        .collect();
    let mut nodes: Vec<Option<Daemon>> = logs.iter().map(|l| Some(node(&server, l))).collect();
    let mut metrics = Vec::new();
    for n in nodes.iter_mut().flatten() {
        n.wait_for(
            "pulling frames from the work queue",
            Duration::from_secs(20),
        );
        metrics.push(n.addr_from_log("metrics at"));
    }

    // Garbage first: three messages that are no frames.
    publish_raw(server.port, "FRAMES", &[b"", b"not a frame", &[0xff; 64]]);

    // The event builder's stand-in: the recording at 2,500 frames/s (4 s), acknowledged.
    let sender = Command::new(trigd_bin())
        .args(["send", rec.to_str().unwrap(), "--to", &server.url("FRAMES")])
        .args(["--rate", "2500", "--connect-retry-s", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Kill node 0 once it has decided a few hundred frames. It is frozen first while frames
    // flow, so its open pull request takes frames it never decides or acknowledges: a node
    // that dies holding deliveries, whatever its pace was when the kill came.
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines(&logs[0]) < 300 {
        assert!(Instant::now() < deadline, "node 0 decided nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = nodes[0].take().unwrap();
    killed.signal("STOP");
    std::thread::sleep(Duration::from_millis(300));
    killed.signal("KILL");
    let _ = killed.wait(Duration::from_secs(10));
    let decided_by_killed = lines(&logs[0]);

    // Restart the server while frames still flow.
    std::thread::sleep(Duration::from_millis(500));
    server.restart();

    let sent = sender.wait_with_output().unwrap();
    let sent_out = String::from_utf8_lossy(&sent.stdout).to_string();
    assert!(
        sent.status.success(),
        "send failed: {sent_out}\n{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(sent_out.contains("published 10000 frames"), "{sent_out}");

    // The farm check, until the redelivered frames are decided (ack wait 2 s).
    let check_args = [
        "farm".to_string(),
        "check".into(),
        "--nats".into(),
        format!("nats://127.0.0.1:{}", server.port),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let check = loop {
        let out = Command::new(trigd_bin())
            .args(&check_args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the farm never balanced: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(check.contains("frames in 10003,"), "{check}");
    assert!(
        check.contains("decisions 10003 (10003 distinct frames)"),
        "{check}"
    );

    // Redelivery happened (the killed node's frames, and those the restart cut off), and
    // the survivors acknowledged everything they decided.
    let mut redelivered = 0.0;
    let mut acked = 0.0;
    for m in &metrics[1..] {
        let (_, text) = common::http_get(*m, "/metrics");
        redelivered += common::metric_sum(&text, "trigd_nats_redelivered_total", &[]);
        acked += common::metric_sum(&text, "trigd_nats_acked_total", &[]);
    }
    assert!(redelivered > 0.0, "no frame was redelivered after the kill");
    assert!(acked > 0.0);

    // Survivors stop cleanly, with balanced accounting.
    for n in nodes.into_iter().flatten() {
        n.signal("TERM");
        let (code, stdout, log) = n.wait(Duration::from_secs(30));
        assert_eq!(code, 0, "{stdout}\n{}", log.join("\n"));
        assert!(stdout.contains("accounting  balanced"), "{stdout}");
    }

    // Every frame exactly once in the decision stream, as the single node decided it.
    let stream = read_stream(server.port, "DECISIONS");
    assert_eq!(stream.len(), 10_003);
    let mut seen: HashMap<(u64, u64), usize> = HashMap::new();
    let mut malformed = 0;
    for (id, v) in &stream {
        if v["outcome"] == "malformed" {
            malformed += 1;
            assert!(id.as_deref().is_some_and(|i| i.starts_with("d.")), "{id:?}");
            continue;
        }
        let key = (v["source_id"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
        assert_eq!(id.as_deref(), Some(format!("{}.{}", key.0, key.1).as_str()));
        *seen.entry(key).or_default() += 1;
        assert_eq!(
            &comparable(v),
            reference.get(&key).expect("a frame the recording has"),
            "frame {key:?} decided differently from the single-node replay"
        );
    }
    assert_eq!(
        malformed, 3,
        "each malformed message decided once, and acknowledged"
    );
    assert_eq!(seen.len(), 10_000);
    assert!(seen.values().all(|&n| n == 1));
    assert!(decided_by_killed >= 300);
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = free_port();
    let started = Instant::now();
    let out = trigd(&[
        "run",
        "--listen",
        &format!("nats://127.0.0.1:{port}/FRAMES"),
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the NATS server"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));

    // With a retry it logs its back-off and gives up when the time is over.
    let out = trigd(&[
        "run",
        "--listen",
        &format!("nats://127.0.0.1:{port}/FRAMES"),
        "--connect-retry-s",
        "0.5",
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trying again"), "{err}");
    assert!(err.contains("cannot reach the NATS server"), "{err}");
}

#[test]
fn record_reads_a_stream_back_frame_for_frame() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = minbias(tmp.path(), 50);
    let store = tmp.path().join("js");
    std::fs::create_dir_all(&store).unwrap();
    let server = Server::start(&store, free_port());
    let out = trigd(&["send", rec.to_str().unwrap(), "--to", &server.url("REC")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = tmp.path().join("copy.trgr");
    let out = trigd(&[
        "record",
        "--listen",
        &server.url("REC"),
        "--out",
        copy.to_str().unwrap(),
        "--count",
        "50",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = trigd::recording::Recording::open(&rec).unwrap();
    let b = trigd::recording::Recording::open(&copy).unwrap();
    assert_eq!(a.len(), 50);
    assert_eq!(b.len(), 50);
    for i in 0..50 {
        assert_eq!(a.frame(i), b.frame(i), "frame {i}");
    }
}

/// Nodes of a farm start together, each creating the work queue and the shared consumer it
/// does not find: every one of them must end up with the same stream and consumer, whoever
/// wins the creation (the server refuses the losers' creation with "subjects overlap" or
/// "name in use").
#[test]
fn nodes_starting_together_all_get_the_stream_and_the_consumer() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path(), free_port());
    let url: trigd::farm::NatsUrl = format!("nats://127.0.0.1:{}", server.port).parse().unwrap();
    const NODES: usize = 24;
    let contexts: Vec<_> = (0..NODES)
        .map(|_| {
            trigd::farm::js_context(trigd::farm::connect(&url, Duration::from_secs(5)).unwrap())
        })
        .collect();
    for round in 0..30 {
        let spec = trigd::farm::StreamSpec {
            name: format!("RACE{round}"),
            work_queue: true,
            duplicate_window: Duration::from_secs(120),
        };
        let consumer = trigd::farm::ConsumerSpec {
            durable: "nodes".into(),
            filter_subject: None,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1000,
        };
        let results = trigd::farm::runtime().block_on(async {
            let tasks: Vec<_> = contexts
                .iter()
                .map(|js| {
                    let (js, spec, consumer) = (js.clone(), spec.clone(), consumer.clone());
                    tokio::spawn(async move {
                        let mut s = trigd::farm::ensure_stream(&js, &spec).await?;
                        let mut c = trigd::farm::ensure_consumer(&s, &consumer).await?;
                        let created = s.info().await.unwrap().created;
                        let durable = c.info().await.unwrap().name.clone();
                        Ok::<_, trigd::farm::FarmError>((created, durable))
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let ok: Vec<_> = results
            .iter()
            .map(|r| r.as_ref().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("round {round}: a node could not get the stream: {e}"));
        assert!(
            ok.iter().all(|x| *x == ok[0]),
            "round {round}: nodes got different streams or consumers: {ok:?}"
        );
    }
}
