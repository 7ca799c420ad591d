//! Failing sinks end to end with the real binary: a decision log on a device that is always
//! full, a spill path, a UDP decision stream to a closed port. Each shows the failure in
//! the metrics and `/readyz` while it lasts, and in the summary and the exit code at the end.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(30);

fn wait_ready(addr: SocketAddr, want: u16) {
    let deadline = Instant::now() + T;
    while http_get(addr, "/readyz").0 != want {
        assert!(Instant::now() < deadline, "/readyz never answered {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The number before `label` on the summary line starting with `line`.
fn number_before(stdout: &str, line: &str, label: &str) -> u64 {
    let l = stdout
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} line in:\n{stdout}"));
    let at = l
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {l:?}"));
    l[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number before {label:?} in {l:?}"))
}

fn send(sock: &UdpSocket, to: SocketAddr, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        sock.send_to(&hit_frame(1, seq, 10, 5), to).unwrap();
        if seq % 100 == 99 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The reported failure: `--decisions /dev/full` used to write nothing, count nothing and
/// exit 0 with "accounting balanced".
#[test]
fn a_full_decision_log_pauses_the_inputs_fails_the_run_and_says_how_many() {
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "udp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        "/dev/full",
        "--budget-ms",
        "5000",
    ]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    wait_ready(metrics, 200);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    // A first 200: the log buffers them, then its first flush fails.
    send(&sock, udp, 0..200);
    wait_ready(metrics, 503);
    let body = wait_metrics(metrics, |b| {
        metric_sum(
            b,
            "trigd_sink_errors_total",
            &[("sink", "jsonl"), ("kind", "storage_full")],
        ) >= 1.0
    });
    assert!(
        body.contains(r#"trigd_sink_lost_total{sink="jsonl"} 0"#),
        "nothing is lost yet, it waits:\n{body}"
    );
    // 1,800 more while the log blocks: the 1,024 slots of the input fill, the rest are
    // dropped as `sink_blocked`.
    send(&sock, udp, 200..2000);
    let body = wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_received_total", &[]) >= 2000.0
    });
    assert_eq!(
        http_get(metrics, "/readyz").0,
        503,
        "unready while it fails"
    );
    let received = metric_sum(&body, "trigd_frames_received_total", &[]) as u64;
    assert!(received >= 1990, "loopback UDP lost too much: {received}");
    let body = wait_metrics(metrics, |b| {
        metric_sum(
            b,
            "trigd_frames_total",
            &[("outcome", "dropped"), ("reason", "sink_blocked")],
        ) >= 1.0
    });
    let blocked = metric_sum(
        &body,
        "trigd_frames_total",
        &[("outcome", "dropped"), ("reason", "sink_blocked")],
    ) as u64;
    assert!(
        blocked <= received - 1024,
        "the input's 1,024 slots hold frames first: {blocked} of {received} dropped"
    );
    d.wait_for("decision sink /dev/full failed to", T);

    d.signal("TERM");
    let (code, stdout, log) = d.wait(T);
    assert_eq!(code, 4, "{stdout}");
    let frames = summary_count(&stdout, "frames");
    assert_eq!(frames, received);
    assert_eq!(
        number_before(
            &stdout,
            "sink        jsonl /dev/full",
            "decisions not written"
        ),
        frames,
        "every decision is counted as not written:\n{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "FAILED: {frames} decisions or accepted frames not durably written"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("accounting  balanced"), "{stdout}");
    let episodes = log
        .iter()
        .filter(|l| l.contains("decision sink /dev/full failed to"))
        .count();
    assert_eq!(episodes, 1, "one log line per episode:\n{}", log.join("\n"));
    assert!(
        log.iter().any(|l| l.contains("No space left on device")),
        "the OS error is in the log:\n{}",
        log.join("\n")
    );
}

#[test]
fn a_full_decision_log_spills_to_its_second_path_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill.jsonl");
    let cfg = dir.path().join("trigd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nmetrics_addr = \"127.0.0.1:0\"\nbudget_ms = 5000.0\n\
             [[input]]\nlisten = \"udp://127.0.0.1:0\"\n\
             [output]\ndecisions_jsonl = \"/dev/full\"\njsonl_policy = \"spill\"\njsonl_spill = {:?}\n",
            spill.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut d = Daemon::spawn(&["run", "--config", cfg.to_str().unwrap()]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    wait_ready(metrics, 200);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&sock, udp, 0..1500);
    let body = wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 1490.0
    });
    assert!(metric_sum(&body, "trigd_sink_errors_total", &[("sink", "jsonl")]) >= 1.0);
    assert_eq!(
        metric_sum(
            &body,
            "trigd_frames_total",
            &[("outcome", "dropped"), ("reason", "sink_blocked")]
        ),
        0.0,
        "spilling never pauses the inputs"
    );
    assert_eq!(http_get(metrics, "/readyz").0, 503);
    d.signal("TERM");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let frames = summary_count(&stdout, "frames");
    let recs = read_jsonl(&spill);
    assert_eq!(
        recs.len() as u64,
        frames,
        "every decision is in the spill file"
    );
    assert_eq!(
        number_before(&stdout, "sink        jsonl /dev/full", "spilled"),
        frames
    );
    assert!(
        stdout.contains("every decision reached every log"),
        "{stdout}"
    );
}

#[test]
fn a_closed_udp_decision_peer_is_counted_best_effort_and_the_log_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    // A port that was just closed: Linux answers with ICMP port unreachable.
    let closed = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = dir.path().join("trigd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nmetrics_addr = \"127.0.0.1:0\"\nbudget_ms = 5000.0\n\
             [[input]]\nlisten = \"udp://127.0.0.1:0\"\n\
             [output]\ndecisions_jsonl = {:?}\ndecisions_udp = \"{closed}\"\n",
            decisions.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut d = Daemon::spawn(&["run", "--config", cfg.to_str().unwrap()]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    wait_ready(metrics, 200);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 0..300 {
        sock.send_to(&hit_frame(1, seq, 10, 5), udp).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let body = wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 300.0
            && metric_sum(
                b,
                "trigd_sink_errors_total",
                &[("sink", "udp"), ("kind", "connection_refused")],
            ) >= 1.0
    });
    let lost = metric_sum(&body, "trigd_sink_lost_total", &[("sink", "udp")]);
    assert!(lost >= 1.0, "{body}");
    assert_eq!(
        http_get(metrics, "/readyz").0,
        503,
        "unready while the stream fails"
    );
    d.signal("TERM");
    let (code, stdout, log) = d.wait(T);
    assert_eq!(
        code, 0,
        "a best-effort stream does not fail the run:\n{stdout}"
    );
    let line = format!("sink        udp {closed}");
    let not_written = number_before(&stdout, &line, "decisions not written");
    assert!(not_written >= lost as u64, "{stdout}");
    assert!(
        stdout.contains("every decision reached every log"),
        "{stdout}"
    );
    assert_eq!(read_jsonl(&decisions).len(), 300, "the log is whole");
    let episodes = log
        .iter()
        .filter(|l| l.contains(&format!("decision sink {closed} failed to")))
        .count();
    assert!(
        (1..=2).contains(&episodes),
        "logged once per episode, not per datagram:\n{}",
        log.join("\n")
    );
}

/// logrotate without copytruncate: move the log away, SIGHUP, and the daemon writes a new
/// file at the configured path; no decision is lost or written twice across the two.
#[test]
fn sighup_reopens_a_moved_decision_log() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    let moved = dir.path().join("d.jsonl.1");
    let cfg = dir.path().join("trigd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nmetrics_addr = \"127.0.0.1:0\"\nbudget_ms = 5000.0\n\
             [[input]]\nlisten = \"udp://127.0.0.1:0\"\n\
             [output]\ndecisions_jsonl = {:?}\n",
            decisions.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut d = Daemon::spawn(&["run", "--config", cfg.to_str().unwrap()]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&sock, udp, 0..100);
    wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 100.0
    });
    std::fs::rename(&decisions, &moved).unwrap();
    d.signal("HUP");
    d.wait_for("decision log reopened", T);
    send(&sock, udp, 100..250);
    wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 250.0
    });
    d.signal("TERM");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let old = read_jsonl(&moved);
    let new = read_jsonl(&decisions);
    assert!(!new.is_empty(), "nothing written to the reopened path");
    let mut seqs: Vec<u64> = old
        .iter()
        .chain(&new)
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..250).collect::<Vec<_>>());
    assert!(
        new.iter().all(|r| r["seq"].as_u64().unwrap() >= 100),
        "decisions from before the move went to the new file"
    );
}

#[test]
fn a_full_binary_log_is_counted_and_fails_the_run_too() {
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "udp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions-bin",
        "/dev/full",
        "--budget-ms",
        "5000",
    ]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    wait_ready(metrics, 200);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    send(&sock, udp, 0..300);
    wait_ready(metrics, 503);
    let body = wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_received_total", &[]) >= 300.0
    });
    assert!(
        metric_sum(
            &body,
            "trigd_sink_errors_total",
            &[("sink", "binlog"), ("kind", "storage_full")]
        ) >= 1.0,
        "{body}"
    );
    d.signal("TERM");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 4, "{stdout}");
    assert_eq!(
        number_before(
            &stdout,
            "sink        binlog /dev/full",
            "decisions not written"
        ),
        summary_count(&stdout, "frames"),
        "{stdout}"
    );
}
