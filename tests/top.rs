//! `trigd top --once` against the real daemon: the screen's totals are the daemon's, its
//! scrapes leave the ring peaks to Prometheus, and a wrong address is a clear error.

mod common;

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(30);

#[test]
fn top_shows_the_running_daemon() {
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "udp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    let udp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 0..300u64 {
        sock.send_to(&hit_frame(1, seq, 10, 5), udp).unwrap();
    }
    let deadline = std::time::Instant::now() + T;
    loop {
        let (_, body) = http_get(metrics, "/metrics?peaks=keep");
        // Decided, and the rings watched (the decision thread reports them every 250 ms).
        if metric_sum(&body, "trigd_frames_total", &[]) >= 300.0
            && body.contains("trigd_ring_fill_max_ratio{")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "frames never decided");
        std::thread::sleep(Duration::from_millis(20));
    }

    let out = Command::new(trigd_bin())
        .args(["top", "--once", "--interval-ms", "200", "--metrics-addr"])
        .arg(metrics.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let screen = String::from_utf8(out.stdout).unwrap();
    assert!(screen.contains("backend cpu"), "{screen}");
    assert!(screen.contains("ready"), "{screen}");
    let row = |name: &str| -> Vec<String> {
        screen
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{screen}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let decided: f64 = ["accept", "reject", "timeout", "dropped", "malformed"]
        .iter()
        .map(|o| row(o)[2].parse::<f64>().unwrap())
        .sum();
    assert_eq!(decided, 300.0, "{screen}");
    // The scrapes of `top` kept the peaks: the next Prometheus scrape still sees the
    // burst's (at least one frame in a ring), not an idle interval's zero.
    let (_, after) = http_get(metrics, "/metrics");
    assert!(
        metric_sum(&after, "trigd_ring_fill_max_ratio", &[]) > 0.0,
        "top took the ring peaks:\n{after}"
    );

    d.signal("TERM");
    let (code, _, _) = d.wait(T);
    assert_eq!(code, 0);
}

#[test]
fn top_without_a_daemon_says_where_it_looked() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let out = Command::new(trigd_bin())
        .args(["top", "--once", "--metrics-addr"])
        .arg(addr.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&addr.to_string()) && err.contains("--metrics-addr"),
        "{err}"
    );
}
