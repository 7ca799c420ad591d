//! A real Prometheus server scrapes trigd's real `/metrics` endpoint, and `promtool` checks
//! the shipped scrape configuration, alert rules (with their unit tests) and the Grafana
//! dashboard's queries. Needs the `prometheus` and `promtool` binaries (Debian package
//! `prometheus`), or their paths in `PROMETHEUS_BIN` / `PROMTOOL_BIN`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use trigd::backend::{BackendKind, Detail};
use trigd::decision::{Decision, Names, Outcome, Workload};
use trigd::http::{http_get, HttpServer};
use trigd::metrics::{Metrics, Stage};

fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or(None);
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` not found on PATH: run the setup script (it installs the Debian package \
             `prometheus`: apt-get install prometheus) or set {env} to the binary"
        )
    })
}

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file)
}

/// Kills the Prometheus child however the test ends.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Instant query; returns the result vector as (labels, value).
fn query(prom: SocketAddr, q: &str) -> Result<Vec<(serde_json::Value, f64)>, String> {
    let path = format!("/api/v1/query?query={}", percent_encode(q));
    let (status, _, body) =
        http_get(prom, &path, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("HTTP {status}: {body}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    let result = v["data"]["result"]
        .as_array()
        .ok_or(format!("no result in {body}"))?;
    result
        .iter()
        .map(|r| {
            let value = r["value"][1]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or(format!("bad value in {r}"))?;
            Ok((r["metric"].clone(), value))
        })
        .collect()
}

fn decision(outcome: Outcome, reason: &'static str, latency_ns: u64) -> Decision {
    Decision {
        delivery: 0,
        source: 0,
        source_id: 1,
        seq: 0,
        timestamp_ns: 0,
        workload: Workload::Tracking,
        outcome,
        accepted: outcome == Outcome::Accept,
        reason,
        lines_fired: u64::from(outcome == Outcome::Accept),
        latency_ns,
        backend: if outcome == Outcome::Dropped {
            None
        } else {
            Some(BackendKind::Cpu)
        },
        detail: Detail::None,
    }
}

#[test]
fn real_prometheus_scrapes_the_metrics_endpoint() {
    let prometheus = tool("PROMETHEUS_BIN", "prometheus");

    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let names = Names {
        sources: vec!["udp0".into()],
        lines: vec!["two_tracks".into()],
    };
    let mut dm = metrics.decisions(&names);
    let src = metrics.source("udp0");
    let mut decisions = vec![decision(Outcome::Accept, "", 150_000); 7];
    decisions.extend(vec![decision(Outcome::Reject, "", 90_000); 3]);
    decisions.extend(vec![decision(Outcome::Dropped, "ring_full", 2_000); 2]);
    for d in &decisions {
        src.received();
        dm.record(d);
    }
    metrics.stage(Stage::Reconstruct).observe(120e-6);
    let server = HttpServer::start(
        "127.0.0.1:0",
        Arc::clone(&metrics),
        Arc::new(AtomicBool::new(true)),
    )
    .expect("metrics server on a free port");
    let target = server.local_addr();

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: trigd\n    \
             static_configs:\n      - targets: [\"{target}\"]\n"
        ),
    )
    .expect("write prometheus.yml");
    let prom_addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
    let child = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", prometheus.display()));
    let _prom = Killed(child);

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last;
    let accepted = loop {
        match query(prom_addr, r#"trigd_frames_total{outcome="accept"}"#) {
            Ok(r) if !r.is_empty() => break r,
            Ok(_) => last = "no series yet".into(),
            Err(e) => last = e,
        }
        if Instant::now() > deadline {
            let log =
                std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
            panic!("Prometheus did not report trigd_frames_total within 30 s ({last}); its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    let (labels, value) = &accepted[0];
    assert_eq!(*value, 7.0);
    assert_eq!(labels["source"], "udp0");
    assert_eq!(
        labels["reason"],
        serde_json::Value::Null,
        "empty reason label is dropped by Prometheus"
    );
    assert_eq!(labels["job"], "trigd");
    assert_eq!(labels["instance"], target.to_string());

    let dropped = query(
        prom_addr,
        r#"trigd_frames_total{outcome="dropped",reason="ring_full"}"#,
    )
    .unwrap();
    assert_eq!(dropped.iter().map(|r| r.1).collect::<Vec<_>>(), vec![2.0]);
    let sum = query(prom_addr, r#"sum(trigd_frames_total)"#).unwrap();
    let received = query(prom_addr, "trigd_frames_received_total").unwrap();
    assert_eq!(sum[0].1, received[0].1, "frames in = sum of outcomes");
    assert_eq!(
        query(prom_addr, "trigd_accounting_balanced").unwrap()[0].1,
        1.0
    );

    // Histogram buckets: 10 decisions with a backend, 7 at 150 us, 3 at 90 us.
    let q = r#"trigd_decision_latency_seconds_bucket{workload="tracking",backend="cpu"}"#;
    let buckets = query(prom_addr, q).unwrap();
    let bucket = |le: &str| buckets.iter().find(|(l, _)| l["le"] == le).map(|r| r.1);
    assert_eq!(bucket("0.000128"), Some(3.0), "{buckets:?}");
    assert_eq!(bucket("0.000256"), Some(10.0));
    assert_eq!(bucket("+Inf"), Some(10.0));
    let stage = query(
        prom_addr,
        r#"trigd_stage_seconds_count{stage="reconstruct"}"#,
    )
    .unwrap();
    assert_eq!(stage[0].1, 1.0);
    let up = query(prom_addr, r#"up{job="trigd"}"#).unwrap();
    assert_eq!(up[0].1, 1.0);
    server.shutdown();
}

fn promtool(args: &[&str]) {
    let bin = tool("PROMTOOL_BIN", "promtool");
    let out = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_alert_rules_and_scrape_config() {
    promtool(&["check", "rules", deploy("alerts.yml").to_str().unwrap()]);
    promtool(&[
        "check",
        "config",
        deploy("prometheus.yml").to_str().unwrap(),
    ]);
    promtool(&["test", "rules", deploy("alerts_test.yml").to_str().unwrap()]);
}

/// Every query of the Grafana dashboard parses as PromQL and names only trigd families that
/// exist (checked against the text that `Metrics::render` produces).
#[test]
fn dashboard_queries_are_valid_promql_over_real_families() {
    let text = std::fs::read_to_string(deploy("grafana-dashboard.json")).expect("dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");

    // Every family with at least one child, so that each appears in the text.
    let m = Metrics::new().unwrap();
    let names = Names {
        sources: vec!["s".into()],
        lines: vec!["l".into()],
    };
    let mut dm = m.decisions(&names);
    dm.record(&decision(Outcome::Accept, "", 1_000));
    let s = m.source("s");
    s.sequence_gap(1);
    s.sequence_repeat();
    let _ = m.stages();
    m.ring("r", 8).set_fill(1);
    let (_tx, _rx, fill) = trigd::ring::channel::<u8>(8);
    m.watch_ring("r", fill);
    m.prepare_sink("jsonl");
    m.sink_error("jsonl", "storage_full");
    m.input_refused("s", "not_allowed").inc();
    m.backend(BackendKind::Gpu).observe_batch(4);
    m.worker_frames(0, "gpu0").inc_by(4);
    m.beam_spot("x", "centre").set(0.0);
    let rendered = m.render().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        for family in e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("trigd_"))
        {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(family, |f, s| f.strip_suffix(s).unwrap_or(f));
            assert!(
                rendered.contains(&format!("# TYPE {base} ")),
                "dashboard query uses unknown family {family}: {e}"
            );
        }
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:q{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard_rules.yml");
    std::fs::write(&path, rules).unwrap();
    promtool(&["check", "rules", path.to_str().unwrap()]);
}
