//! Replay through the real binary: determinism, torn tails, conversion, `send` into a
//! running daemon.

mod common;

use std::time::Duration;

use common::*;
use trigd::recording::{FsyncPolicy, RecordingWriter};

const T: Duration = Duration::from_secs(60);

fn write_recording(path: &std::path::Path, n: u64) {
    let mut w = RecordingWriter::create(path, FsyncPolicy::Never).unwrap();
    for seq in 0..n {
        w.append(&hit_frame(
            4,
            seq,
            (seq % 13) as usize,
            (seq % 7) as u16 + 1,
        ))
        .unwrap();
    }
    w.finish().unwrap();
}

fn replay(args: &[&str]) -> (i32, String, Vec<String>) {
    let d = Daemon::spawn(args);
    d.wait(T)
}

fn strip_latency(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("latency_us");
    v
}

#[test]
fn replaying_a_recording_twice_gives_identical_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("events.trgr");
    write_recording(&rec, 5000);
    let mut runs = Vec::new();
    for k in 0..2 {
        let out = dir.path().join(format!("d{k}.jsonl"));
        let (code, stdout, _) = replay(&[
            "replay",
            rec.to_str().unwrap(),
            "--decisions",
            out.to_str().unwrap(),
            "--workers",
            "2",
        ]);
        assert_eq!(code, 0, "{stdout}");
        assert_eq!(summary_count(&stdout, "frames"), 5000);
        assert!(
            stdout.contains("frames/s") && stdout.contains("p99"),
            "{stdout}"
        );
        let mut recs: Vec<serde_json::Value> =
            read_jsonl(&out).into_iter().map(strip_latency).collect();
        recs.sort_by_key(|r| r["seq"].as_u64().unwrap());
        runs.push(recs);
    }
    assert_eq!(runs[0].len(), 5000);
    assert_eq!(runs[0], runs[1]);
    let accepts = runs[0].iter().filter(|r| r["outcome"] == "accept").count();
    let expect = (0..5000u64)
        .filter(|s| s % 13 >= 8 && (s % 7 + 1).min(s % 13) >= 4)
        .count();
    assert_eq!(accepts, expect);
}

#[test]
fn a_torn_tail_replays_the_complete_prefix_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("torn.trgr");
    {
        // A writer killed mid-frame: no finish, last frame cut.
        let mut w = RecordingWriter::create(&rec, FsyncPolicy::Never).unwrap();
        for seq in 0..100 {
            w.append(&hit_frame(4, seq, 10, 5)).unwrap();
        }
        drop(w);
    }
    let len = std::fs::metadata(&rec).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&rec).unwrap();
    f.set_len(len - 30).unwrap();
    let out = dir.path().join("d.jsonl");
    let (code, stdout, log) = replay(&[
        "replay",
        rec.to_str().unwrap(),
        "--decisions",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        log.iter().any(|l| l.contains("WARN") && l.contains("torn")),
        "{}",
        log.join("\n")
    );
    assert_eq!(summary_count(&stdout, "frames"), 99);
    assert_eq!(read_jsonl(&out).len(), 99);
}

#[test]
fn accepted_frames_form_a_replayable_recording() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("in.trgr");
    write_recording(&rec, 1000);
    let acc = dir.path().join("acc.trgr");
    let (code, stdout, _) = replay(&[
        "replay",
        rec.to_str().unwrap(),
        "--accepted-out",
        acc.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let accepted = summary_count(&stdout, "accept ");
    let (code, stdout2, _) = replay(&["replay", acc.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(summary_count(&stdout2, "frames"), accepted);
    assert_eq!(
        summary_count(&stdout2, "accept "),
        accepted,
        "accepted frames are accepted again"
    );
}

#[test]
fn send_plays_a_recording_into_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("in.trgr");
    write_recording(&rec, 500);
    let out = dir.path().join("d.jsonl");
    let mut d = Daemon::spawn(&[
        "run",
        "--listen",
        "tcp://127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        out.to_str().unwrap(),
    ]);
    let tcp = d.addr_from_log("listening");
    let st = std::process::Command::new(trigd_bin())
        .args([
            "send",
            rec.to_str().unwrap(),
            "--to",
            &format!("tcp://{tcp}"),
            "--rate",
            "20000",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let metrics = d.addr_from_log("metrics at");
    let deadline = std::time::Instant::now() + T;
    while metric_sum(&http_get(metrics, "/metrics").1, "trigd_frames_total", &[]) < 500.0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    d.signal("TERM");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(read_jsonl(&out).len(), 500);
}

#[test]
fn sequence_gaps_and_repeats_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("gaps.trgr");
    let mut w = RecordingWriter::create(&rec, FsyncPolicy::Never).unwrap();
    let seqs: Vec<u64> = (0..50).chain(60..100).chain([70]).collect();
    for &seq in &seqs {
        w.append(&hit_frame(4, seq, 10, 5)).unwrap();
    }
    w.finish().unwrap();
    let (code, stdout, _) = replay(&["replay", rec.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(summary_count(&stdout, "frames"), seqs.len() as u64);
    assert!(stdout.contains("10 missing, 1 repeated"), "{stdout}");
}

/// Central events whose combinations fill the finder's triplet buffer (a limit set low in
/// the configuration) are decided all the same, and the run says so: a warning in the log
/// and a line of the end-of-run summary naming the step; without the limit, neither.
#[test]
fn events_that_fill_the_finders_buffers_are_named_in_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("central.trgr");
    let geometry = root().join("fixtures/detector.toml");
    let out = std::process::Command::new(trigd_bin())
        .args([
            "simulate", "tracking", "--preset", "central", "--events", "3",
        ])
        .args(["--seed", "7", "--geometry", geometry.to_str().unwrap()])
        .args(["--recording", rec.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for limited in [true, false] {
        let cfg = dir.path().join(format!("trigd{limited}.toml"));
        let limits = if limited {
            "[tracking.finder.limits]\nmax_triplets = 6000\n"
        } else {
            ""
        };
        std::fs::write(
            &cfg,
            format!(
                "[daemon]\nworkload = \"tracking\"\n[tracking]\ngeometry = \"{}\"\n{limits}",
                geometry.display()
            ),
        )
        .unwrap();
        let decisions = dir.path().join(format!("decisions{limited}.jsonl"));
        let (code, stdout, log) = replay(&[
            "replay",
            rec.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--backend",
            "cpu",
            "--decisions",
            decisions.to_str().unwrap(),
            "--no-progress",
        ]);
        assert_eq!(code, 0, "{stdout}\n{}", log.join("\n"));
        let decided = read_jsonl(&decisions);
        assert_eq!(decided.len(), 3);
        assert!(
            decided
                .iter()
                .all(|d| d["n_tracks"].as_u64().unwrap_or(0) > 1000),
            "{decided:?}"
        );
        let line = stdout
            .lines()
            .find(|l| l.contains("filled the finder's buffers"));
        let warned = log.iter().any(|l| l.contains("filled the track finder's"));
        if limited {
            let line = line.unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
            assert!(line.contains("triplets 3"), "{line}");
            assert!(warned, "{}", log.join("\n"));
        } else {
            assert!(line.is_none() && !warned, "{stdout}");
        }
    }
}
