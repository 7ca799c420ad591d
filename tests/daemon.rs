//! The real binary end to end: frames over real UDP and TCP sockets on loopback, metrics
//! scraped over HTTP, decision files read back, accounting checked, signals.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(30);

#[test]
fn udp_frames_get_one_decision_each_and_metrics_count_them() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "udp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        decisions.to_str().unwrap(),
        // A generous deadline: this shared test machine must not turn frames into timeouts.
        "--budget-ms",
        "5000",
        // Two workers share the ring; each says in the metrics what it reconstructed.
        "--workers",
        "2",
    ]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let deadline = std::time::Instant::now() + T;
    while http_get(metrics, "/readyz").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http_get(metrics, "/healthz").0, 200);

    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let n = 300u64;
    let mut expect_accept = 0;
    for seq in 0..n {
        // Default line: >= 8 hits on >= 4 planes.
        let hits = (seq % 16) as usize;
        if hits >= 8 {
            expect_accept += 1;
        }
        sock.send_to(&hit_frame(9, seq, hits, 6), udp).unwrap();
        if seq % 50 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // Malformed: garbage, a bad CRC.
    sock.send_to(
        b"not a frame at all, clearly: just some bytes from a broken board",
        udp,
    )
    .unwrap();
    let mut bad = hit_frame(9, n, 10, 6);
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    sock.send_to(&bad, udp).unwrap();

    // Each decision updates the outcome counter and then the latency histogram: wait for
    // both, so a scrape between the two updates of the last frame is not a failure.
    let body = wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= (n + 2) as f64
            && metric_sum(b, "trigd_decision_latency_seconds_count", &[]) >= n as f64
    });
    assert_eq!(
        metric_sum(&body, "trigd_frames_total", &[("outcome", "accept")]),
        expect_accept as f64
    );
    assert_eq!(
        metric_sum(&body, "trigd_frames_total", &[("outcome", "reject")]),
        (n - expect_accept) as f64
    );
    assert_eq!(
        metric_sum(
            &body,
            "trigd_frames_total",
            &[("outcome", "malformed"), ("reason", "bad_crc")]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &body,
            "trigd_frames_total",
            &[("outcome", "malformed"), ("reason", "bad_magic")]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(&body, "trigd_frames_received_total", &[]),
        (n + 2) as f64
    );
    // A real histogram, in seconds.
    assert!(
        body.contains("trigd_decision_latency_seconds_bucket{"),
        "{body}"
    );
    assert!(metric_sum(&body, "trigd_decision_latency_seconds_count", &[]) >= n as f64);
    assert!(body.contains("trigd_build_info{"));
    assert_eq!(
        metric_sum(&body, "trigd_backend_active", &[("backend", "cpu")]),
        1.0
    );
    // Every valid frame was reconstructed by one of the two workers, on the CPU; both
    // workers' series exist from the start.
    assert_eq!(
        metric_sum(&body, "trigd_worker_frames_total", &[("device", "cpu")]),
        n as f64
    );
    for w in ["0", "1"] {
        assert!(
            body.contains(&format!(
                "trigd_worker_frames_total{{device=\"cpu\",worker=\"{w}\"}}"
            )),
            "{body}"
        );
    }

    d.signal("TERM");
    let (code, stdout, log) = d.wait(T);
    for w in 0..2 {
        let start = format!("worker {w} reconstructs on cpu");
        assert!(log.iter().any(|l| l.contains(&start)), "{log:?}");
    }
    // At the end each worker says what it did; together, every valid frame.
    let done: u64 = frames_by_device(&log.join("\n")).values().sum();
    assert_eq!(done, n, "{log:?}");
    assert_eq!(code, 0, "{stdout}");
    let recs = read_jsonl(&decisions);
    assert_eq!(recs.len() as u64, n + 2);
    let seqs: HashSet<u64> = recs
        .iter()
        .filter(|r| r["outcome"] != "malformed")
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs.len() as u64,
        n,
        "every valid frame decided exactly once"
    );
    for r in &recs {
        assert!(r["latency_us"].as_f64().unwrap() >= 0.0);
        if r["outcome"] == "accept" {
            assert_eq!(r["lines"], serde_json::json!(["multiplicity"]));
            assert_eq!(r["backend"], "cpu");
            assert!(r["n_hits"].as_u64().unwrap() >= 8);
        }
    }
    assert!(stdout.contains("accounting  balanced"), "{stdout}");
}

#[test]
fn tcp_carries_events_larger_than_a_datagram() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "tcp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        decisions.to_str().unwrap(),
        // A generous deadline: this shared test machine must not turn frames into timeouts.
        "--budget-ms",
        "5000",
    ]);
    let tcp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let mut s = TcpStream::connect(tcp).unwrap();
    let big = hit_frame(3, 0, 20_000, 10); // 400 kB
    assert!(big.len() > 65_507);
    s.write_all(&big).unwrap();
    for seq in 1..50 {
        s.write_all(&hit_frame(3, seq, 12, 5)).unwrap();
    }
    s.flush().unwrap();
    wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 50.0
    });
    drop(s);
    d.signal("INT");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let recs = read_jsonl(&decisions);
    assert_eq!(recs.len(), 50);
    let first = recs
        .iter()
        .find(|r| r["seq"] == 0)
        .expect("the large event");
    assert_eq!(first["outcome"], "accept");
    assert_eq!(first["n_hits"], 20_000);
}

#[test]
fn sigterm_with_frames_in_flight_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "udp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        decisions.to_str().unwrap(),
        // A generous deadline: this shared test machine must not turn frames into timeouts.
        "--budget-ms",
        "5000",
    ]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(&hit_frame(1, 0, 10, 5), udp).unwrap();
    wait_metrics(metrics, |b| metric_sum(b, "trigd_frames_total", &[]) >= 1.0);
    // A burst, and SIGTERM while it is still arriving.
    let sender = std::thread::spawn(move || {
        for seq in 1..20_000u64 {
            let _ = sock.send_to(&hit_frame(1, seq, 10, 5), udp);
        }
    });
    std::thread::sleep(Duration::from_millis(5));
    d.signal("TERM");
    sender.join().unwrap();
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let taken_in = summary_count(&stdout, "frames");
    let recs = read_jsonl(&decisions);
    assert_eq!(
        recs.len() as u64,
        taken_in,
        "every frame taken in has its decision"
    );
    assert!(taken_in >= 1);
    assert!(stdout.contains("accounting  balanced"), "{stdout}");
}

#[test]
fn sighup_reloads_thresholds_without_dropping_frames() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("trigd.toml");
    let decisions = dir.path().join("d.jsonl");
    let write_cfg = |min_hits: u32| {
        std::fs::write(
            &cfg_path,
            format!(
                "[daemon]\nmetrics_addr = \"127.0.0.1:0\"\n[[input]]\nlisten = \"udp://127.0.0.1:0\"\n[output]\ndecisions_jsonl = {:?}\n[multiplicity]\nmin_hits = {min_hits}\nmin_planes = 1\n",
                decisions.to_str().unwrap()
            ),
        )
        .unwrap();
    };
    write_cfg(1000);
    let mut d = Daemon::spawn(&["run", "--config", cfg_path.to_str().unwrap()]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 0..20 {
        sock.send_to(&hit_frame(1, seq, 10, 5), udp).unwrap();
    }
    wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 20.0
    });
    write_cfg(5);
    d.signal("HUP");
    d.wait_for("reloaded", T);
    for seq in 20..40 {
        sock.send_to(&hit_frame(1, seq, 10, 5), udp).unwrap();
    }
    wait_metrics(metrics, |b| {
        metric_sum(b, "trigd_frames_total", &[]) >= 40.0
    });
    d.signal("TERM");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let recs = read_jsonl(&decisions);
    assert_eq!(recs.len(), 40);
    for r in &recs {
        let seq = r["seq"].as_u64().unwrap();
        let want = if seq < 20 { "reject" } else { "accept" };
        assert_eq!(r["outcome"], want, "seq {seq}");
    }
}

#[test]
fn bad_configuration_names_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[daemon]\nbatch_max = 0\n[[input]]\nlisten = \"udp://127.0.0.1:0\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(trigd_bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("daemon.batch_max"),
        "{err}"
    );
}

#[test]
fn the_example_configuration_is_valid() {
    let cfg = root().join("deploy/trigd.toml");
    let out = std::process::Command::new(trigd_bin())
        .args(["check", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 inputs, workload multiplicity)"));
}

/// `trigd check` on a tracking configuration builds it as `run` does (the geometry and its
/// field map read, the finder derived with the configuration's overrides and checked) and
/// prints what the finder derived: the overrides show in the table.
#[test]
fn check_builds_a_tracking_configuration_and_shows_its_cuts() {
    let geometry = root().join("fixtures/tracking/dipole/detector_dipole.toml");
    let stdout = stdout_of_success(&trigd_check(&format!(
        "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = {:?}\nmin_p_gev = 2.0\n\
         [tracking.finder]\nn_sigma = 4.0\n",
        geometry.to_str().unwrap()
    )));
    for want in [
        "ok (0 inputs, workload tracking)",
        "tracking: 8 planes from z = 250.0 to 1200.0 mm",
        "field: map of",
        "momenta: measured by the fit",
        "| min_p_gev | 2 (windows at",
        "| n_sigma | 4 |",
        "| 7 | 1200.0 | 480.0, 310.0 | 12.0, 12.0 |",
    ] {
        assert!(stdout.contains(want), "{want:?} not in\n{stdout}");
    }
}

/// What `run` refuses, `check` refuses: a geometry that is not there, a finder override
/// out of range; each named.
#[test]
fn check_refuses_a_tracking_configuration_run_would_refuse() {
    let geometry = root().join("fixtures/tracking/dipole/detector_dipole.toml");
    for (body, want) in [
        (
            "[tracking]\ngeometry = \"no/such/detector.toml\"\n".to_string(),
            "no/such/detector.toml",
        ),
        (
            format!(
                "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = {:?}\n\
                 [tracking.finder]\nn_sigma = -1.0\n",
                geometry.to_str().unwrap()
            ),
            "n_sigma",
        ),
    ] {
        let out = trigd_check(&body);
        assert!(!out.status.success(), "{body} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{want:?} not in {err}");
    }
}

/// A field map that ends inside the detector with a field at its edge is warned of, plane
/// by plane, with the field the tracks get beyond it; one that holds the detector is not.
#[test]
fn check_warns_where_a_field_map_ends_inside_the_detector() {
    let dir = tempfile::tempdir().unwrap();
    // A uniform 1 T along y on a grid of 25 mm from -`half` to `half` in x and y and from
    // 0 to 600 mm in z.
    let write_map = |name: &str, half: f64| {
        let n = (2.0 * half / 25.0) as usize + 1;
        let nz = 600 / 25 + 1;
        let header =
            format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n}, {n}, {nz}, 3), }}");
        let mut h = header.into_bytes();
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(b' ');
        }
        h.push(b'\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&h);
        for _ in 0..n * n * nz {
            for v in [0.0f32, 1.0, 0.0] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::write(dir.path().join(name), bytes).unwrap();
    };
    write_map("narrow.npy", 50.0);
    write_map("wide.npy", 200.0);
    let check = |map: &str, half: f64| -> String {
        let mut det = String::new();
        for z in [100.0, 200.0, 300.0, 400.0, 500.0] {
            det.push_str(&format!(
                "[[plane]]\nz_mm = {z}\nhalf_x_mm = {h}\nhalf_y_mm = {h}\nsigma_x_mm = 0.01\n\
                 sigma_y_mm = 0.01\nx0_fraction = 0.005\nefficiency = 0.98\n\n",
                h = 0.2 * z + 10.0
            ));
        }
        det.push_str(&format!(
            "[field]\nkind = \"grid\"\nfile = \"{map}\"\norigin_mm = [{o}, {o}, 0.0]\n\
             step_mm = [25.0, 25.0, 25.0]\n",
            o = -half
        ));
        let geometry = dir.path().join(format!("{map}.toml"));
        std::fs::write(&geometry, det).unwrap();
        stdout_of_success(&trigd_check(&format!(
            "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = {:?}\n",
            geometry.to_str().unwrap()
        )))
    };
    // Planes 2 to 4 (half sizes 70 to 110 mm) reach past the narrow map's 50 mm; planes 0
    // and 1 (30 and 50 mm) do not.
    let narrow = check("narrow.npy", 50.0);
    let warning = narrow
        .lines()
        .find(|l| l.starts_with("warning: the field map"))
        .unwrap_or_else(|| panic!("no warning in\n{narrow}"));
    for want in [
        "plane 2 (z = 300.0 mm), up to 1.000 T there",
        "plane 4 (z = 500.0 mm), up to 1.000 T there",
    ] {
        assert!(warning.contains(want), "{want:?} not in {warning}");
    }
    assert!(
        !warning.contains("plane 0") && !warning.contains("plane 1 "),
        "{warning}"
    );
    let wide = check("wide.npy", 200.0);
    assert!(wide.contains("no warnings"), "{wide}");
    // `replay` and `eval` say it in their logs, where a run's user reads.
    let geometry = dir.path().join("narrow.npy.toml");
    let events = dir.path().join("events");
    let sim = std::process::Command::new(trigd_bin())
        .args(["simulate", "tracking", "--events", "1", "--geometry"])
        .arg(&geometry)
        .arg("--out")
        .arg(&events)
        .output()
        .unwrap();
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    for args in [
        vec!["replay", events.to_str().unwrap(), "--workload", "tracking"],
        vec!["eval", "tracking", events.to_str().unwrap()],
    ] {
        let out = std::process::Command::new(trigd_bin())
            .args(&args)
            .arg("--geometry")
            .arg(&geometry)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {log}");
        assert!(
            log.contains("WARN") && log.contains("the field map") && log.contains("plane 4"),
            "{args:?}: {log}"
        );
    }
}
