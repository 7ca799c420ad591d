//! The tracking workload through the real `trigd replay` on each backend: `--backend auto`
//! decides every event as `--backend cpu` does (on the GPU where there is one, on the CPU
//! otherwise); `--backend gpu` without a usable GPU is an error naming what is missing,
//! and with one decides as the CPU. The GPU tests replay the tracking fixtures and fresh
//! simulations of the spectrometer and the dipole and forward field maps on both backends
//! and compare every decision (outcome, lines fired, tracks, best momentum).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

fn trigd(args: &[&str]) -> Output {
    std::process::Command::new(common::trigd_bin())
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("trigd runs")
}

fn fixture(rel: &str) -> String {
    common::root().join(rel).to_string_lossy().into_owned()
}

fn gpu_present() -> bool {
    trigd::gpu::detect(trigd::gpu::BackendChoice::Gpu)
        .map(|d| !d.is_empty())
        .unwrap_or(false)
}

/// A recording of `events` simulated events (`preset`) on `geometry`.
fn simulate(dir: &Path, geometry: &str, preset: &str, events: usize, extra: &[&str]) -> PathBuf {
    let rec = dir.join(format!("{preset}{events}.trgr"));
    let n = events.to_string();
    let mut args = vec![
        "simulate",
        "tracking",
        "--preset",
        preset,
        "--events",
        &n,
        "--seed",
        "2027",
        "--geometry",
        geometry,
        "--recording",
        rec.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = trigd(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rec
}

/// Replays `input` on `backend`; the decisions by (source, seq), and the run's log.
fn replay(
    dir: &Path,
    input: &str,
    geometry: &str,
    backend: &str,
) -> (HashMap<(u64, u64), Value>, String) {
    let decisions = dir.join(format!("decisions-{backend}.jsonl"));
    let tracks = dir.join(format!("tracks-{backend}.csv"));
    let _ = std::fs::remove_file(&decisions);
    let out = trigd(&[
        "replay",
        input,
        "--workload",
        "tracking",
        "--geometry",
        geometry,
        "--backend",
        backend,
        "--decisions",
        decisions.to_str().unwrap(),
        "--tracks-out",
        tracks.to_str().unwrap(),
        "--no-progress",
    ]);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "replay on {backend}: {log}");
    let map = common::read_jsonl(&decisions)
        .into_iter()
        .map(|v| {
            let key = (v["source_id"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
            (key, v)
        })
        .collect();
    (map, log)
}

/// Every decision of `b` equals `a`'s (all but latency, time stamp and backend); returns
/// how many events and tracks were compared.
fn same_decisions(
    what: &str,
    a: &HashMap<(u64, u64), Value>,
    b: &HashMap<(u64, u64), Value>,
) -> (usize, u64) {
    assert_eq!(a.len(), b.len(), "{what}: decisions on each backend");
    let mut tracks = 0;
    for (k, va) in a {
        let vb = b
            .get(k)
            .unwrap_or_else(|| panic!("{what}: event {k:?} missing"));
        for field in ["outcome", "lines", "n_tracks", "max_p_gev", "workload"] {
            assert_eq!(
                va[field], vb[field],
                "{what}: event {k:?} differs in {field}: {va} / {vb}"
            );
        }
        tracks += va["n_tracks"].as_u64().unwrap_or(0);
    }
    (a.len(), tracks)
}

#[test]
fn tracking_on_backend_auto_decides_as_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let geometry = fixture("fixtures/detector.toml");
    let rec = simulate(tmp.path(), &geometry, "minbias", 300, &[]);
    let rec = rec.to_str().unwrap();
    let (cpu, _) = replay(tmp.path(), rec, &geometry, "cpu");
    let (auto, log) = replay(tmp.path(), rec, &geometry, "auto");
    let (n, tracks) = same_decisions("auto", &cpu, &auto);
    assert_eq!(n, 300);
    assert!(tracks > 1000, "the events have tracks ({tracks})");
    let on_gpu = auto.values().filter(|v| v["backend"] == "gpu").count();
    if gpu_present() {
        assert_eq!(on_gpu, n, "with a GPU, auto runs there: {log}");
    } else {
        assert_eq!(on_gpu, 0);
        assert!(
            log.contains("no usable GPU"),
            "auto says why it runs on the CPU: {log}"
        );
    }
}

#[test]
fn tracking_on_backend_gpu_needs_a_gpu_and_says_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let geometry = fixture("fixtures/detector.toml");
    let events = fixture("fixtures/tracking/minbias");
    if gpu_present() {
        let (cpu, _) = replay(tmp.path(), &events, &geometry, "cpu");
        let (gpu, _) = replay(tmp.path(), &events, &geometry, "gpu");
        same_decisions("gpu", &cpu, &gpu);
        assert!(gpu.values().all(|v| v["backend"] == "gpu"));
        return;
    }
    let out = trigd(&[
        "replay",
        &events,
        "--workload",
        "tracking",
        "--geometry",
        &geometry,
        "--backend",
        "gpu",
        "--no-progress",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--backend gpu without a GPU: {err}");
    assert!(
        err.contains("CUDA") || err.contains("GPU") || err.contains("driver"),
        "the error names what is missing: {err}"
    );
    assert!(!err.contains("tracking runs on the CPU"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_tracking_fixture_and_fresh_simulations_decide_alike_on_both_backends() {
    let tmp = tempfile::tempdir().unwrap();
    let spectrometer = fixture("fixtures/detector.toml");
    let dipole = fixture("fixtures/tracking/dipole/detector_dipole.toml");
    let forward = fixture("fixtures/tracking/forward/detector_forward.toml");
    let cases: Vec<(&str, String, String)> = vec![
        (
            "minimum-bias fixture, spectrometer",
            fixture("fixtures/tracking/minbias"),
            spectrometer.clone(),
        ),
        (
            "minimum-bias, spectrometer",
            simulate(tmp.path(), &spectrometer, "minbias", 2000, &[])
                .to_string_lossy()
                .into_owned(),
            spectrometer.clone(),
        ),
        (
            "central, spectrometer",
            simulate(tmp.path(), &spectrometer, "central", 20, &[])
                .to_string_lossy()
                .into_owned(),
            spectrometer.clone(),
        ),
        (
            "central, dipole field map",
            simulate(tmp.path(), &dipole, "central", 10, &[])
                .to_string_lossy()
                .into_owned(),
            dipole.clone(),
        ),
        (
            "minimum-bias, forward field map",
            simulate(
                tmp.path(),
                &forward,
                "minbias",
                500,
                &[
                    "--spectrum",
                    "exponential",
                    "--beam-sigma-mm",
                    "0.05",
                    "--noise-per-plane",
                    "6",
                ],
            )
            .to_string_lossy()
            .into_owned(),
            forward.clone(),
        ),
    ];
    for (what, input, geometry) in cases {
        let dir = tmp.path().join(what.replace([' ', ','], "_"));
        std::fs::create_dir_all(&dir).unwrap();
        let (cpu, _) = replay(&dir, &input, &geometry, "cpu");
        let (gpu, log) = replay(&dir, &input, &geometry, "gpu");
        let (n, tracks) = same_decisions(what, &cpu, &gpu);
        assert!(
            gpu.values().all(|v| v["backend"] == "gpu"),
            "{what}: every event decided on the GPU: {log}"
        );
        // The same track assignment of every hit (`--tracks-out`, TrackML rows).
        let rows = |b: &str| {
            let mut v: Vec<String> = std::fs::read_to_string(dir.join(format!("tracks-{b}.csv")))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            v.sort();
            v
        };
        let (rc, rg) = (rows("cpu"), rows("gpu"));
        assert!(rc.len() > n, "{what}: one row per hit");
        assert!(
            rc == rg,
            "{what}: --tracks-out differs between the backends"
        );
        println!("{what}: {n} events, {tracks} tracks, identical decisions on both backends");
        assert!(tracks > 0, "{what}");
    }
}

/// The GPUs `trigd` sees (`CUDA_VISIBLE_DEVICES` applies).
fn gpu_count() -> usize {
    trigd::gpu::detect(trigd::gpu::BackendChoice::Gpu).map_or(0, |d| d.len())
}

/// With every GPU of the host: one tracking worker per GPU, the log says which GPU each
/// took, every GPU reconstructs a share of the events, and the decisions are the CPU's.
#[test]
#[ignore = "needs CUDA GPUs (two or more to spread the events)"]
fn replay_spreads_the_events_over_every_gpu_and_decides_as_the_cpu() {
    let gpus = gpu_count();
    assert!(gpus >= 1, "no GPU");
    let tmp = tempfile::tempdir().unwrap();
    let geometry = fixture("fixtures/detector.toml");
    for (preset, events) in [("minbias", 20_000usize), ("central", 200)] {
        let rec = simulate(tmp.path(), &geometry, preset, events, &[]);
        let rec = rec.to_str().unwrap();
        let (cpu, _) = replay(tmp.path(), rec, &geometry, "cpu");
        let (gpu, log) = replay(tmp.path(), rec, &geometry, "gpu");
        let (n, tracks) = same_decisions(preset, &cpu, &gpu);
        assert_eq!(n, events);
        assert!(gpu.values().all(|v| v["backend"] == "gpu"), "{log}");
        for k in 0..gpus {
            assert!(
                log.contains(&format!("tracking worker on GPU {k}")),
                "{preset}: a worker on GPU {k}: {log}"
            );
        }
        let by = common::frames_by_device(&log);
        for k in 0..gpus {
            let f = by.get(&format!("gpu{k}")).copied().unwrap_or(0);
            assert!(f > 0, "{preset}: GPU {k} reconstructed no event: {by:?}");
        }
        assert_eq!(by.values().sum::<u64>(), events as u64, "{by:?}");
        println!("{preset}: {n} events, {tracks} tracks on {gpus} GPU(s): {by:?}");
    }
}

/// `trigd run` fed over TCP, with every GPU of the host: the metrics say which GPU
/// reconstructed how many frames (`trigd_worker_frames_total{worker,device}`), each GPU
/// takes a share, and the decisions are those of the CPU replay of the same events.
#[test]
#[ignore = "needs CUDA GPUs (two or more to spread the events)"]
fn run_spreads_the_events_over_every_gpu_and_the_metrics_say_which() {
    let gpus = gpu_count();
    assert!(gpus >= 1, "no GPU");
    let tmp = tempfile::tempdir().unwrap();
    let geometry = fixture("fixtures/detector.toml");
    let events = 20_000u64;
    let rec = simulate(tmp.path(), &geometry, "minbias", events as usize, &[]);
    let (cpu, _) = replay(tmp.path(), rec.to_str().unwrap(), &geometry, "cpu");
    let decisions = tmp.path().join("run.jsonl");
    // Slots for every frame of the run: this test is about spreading, not back-pressure
    // (a socket input drops a frame it has no slot for).
    let config = tmp.path().join("trigd.toml");
    std::fs::write(&config, "[daemon]\nring_slots = 32768\n").unwrap();
    let mut d = common::Daemon::spawn(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--listen",
        "tcp://127.0.0.1:0",
        "--workload",
        "tracking",
        "--geometry",
        &geometry,
        "--backend",
        "gpu",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        decisions.to_str().unwrap(),
        "--budget-ms",
        "5000",
    ]);
    let tcp = d.addr_from_log("listening");
    let metrics = d.addr_from_log("metrics at");
    let to = format!("tcp://{tcp}");
    // Paced well below what one GPU decides, so no frame meets a full ring.
    let sent = trigd(&[
        "send",
        rec.to_str().unwrap(),
        "--to",
        &to,
        "--rate",
        "20000",
    ]);
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let body = common::wait_metrics(metrics, |b| {
        common::metric_sum(b, "trigd_frames_total", &[]) >= events as f64
    });
    let outcomes: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("trigd_frames_total"))
        .collect();
    println!("run: {outcomes:?}");
    assert_eq!(
        common::metric_sum(&body, "trigd_frames_total", &[("outcome", "accept")])
            + common::metric_sum(&body, "trigd_frames_total", &[("outcome", "reject")]),
        events as f64,
        "every frame reconstructed: {outcomes:?}"
    );
    assert_eq!(
        common::metric_sum(&body, "trigd_backend_active", &[("backend", "gpu")]),
        1.0
    );
    let mut total = 0.0;
    for k in 0..gpus {
        let f = common::metric_sum(
            &body,
            "trigd_worker_frames_total",
            &[("device", &format!("gpu{k}"))],
        );
        assert!(f > 0.0, "GPU {k} reconstructed no frame:\n{body}");
        total += f;
    }
    assert_eq!(total, events as f64, "{body}");
    d.signal("TERM");
    let (code, stdout, _) = d.wait(std::time::Duration::from_secs(30));
    assert_eq!(code, 0, "{stdout}");
    let run: HashMap<(u64, u64), Value> = common::read_jsonl(&decisions)
        .into_iter()
        .map(|v| {
            let key = (v["source_id"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
            (key, v)
        })
        .collect();
    let (n, _) = same_decisions("run", &cpu, &run);
    assert_eq!(n as u64, events);
}
