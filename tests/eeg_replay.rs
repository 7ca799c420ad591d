//! `trigd replay DATA.edf --workload eeg ... --sources-out OUT.npy` through the real binary,
//! against MNE-Python's `apply_inverse_raw` on the same EDF file (fixtures/eeg, made by
//! fixtures/eeg/make_fixtures.py with MNE 1.13.2), and the decisions of the CPU and GPU
//! backends on the same replay.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn fx(name: &str) -> String {
    root().join("fixtures/eeg").join(name).display().to_string()
}

fn read_npy_f64(path: &Path) -> (Vec<u64>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = npy.shape().to_vec();
    let data: Vec<f64> = match npy.dtype() {
        npyz::DType::Plain(t) if t.size_field() == 4 => npy
            .into_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => npy.into_vec::<f64>().unwrap(),
    };
    (shape, data)
}

/// Worst over samples of max_s |a - b| / max_s |b| (per-sample relative error).
fn worst_relative_error(a: &[f64], b: &[f64], n_sources: usize, n_times: usize) -> f64 {
    let mut worst = 0.0f64;
    for t in 0..n_times {
        let mut num = 0.0f64;
        let mut den = 0.0f64;
        for s in 0..n_sources {
            let (x, y) = (a[s * n_times + t], b[s * n_times + t]);
            num = num.max((x - y).abs());
            den = den.max(y.abs());
        }
        worst = worst.max(num / den);
    }
    worst
}

fn eeg_args<'a>(method: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "replay".into(),
        fx("dipole.edf"),
        "--workload".into(),
        "eeg".into(),
        "--leadfield".into(),
        fx("leadfield.npy"),
        "--src".into(),
        fx("source_pos.npy"),
        "--noise-cov".into(),
        fx("noise_cov.npy"),
        "--channels".into(),
        fx("channels.txt"),
        "--method".into(),
        method.into(),
        "--lambda2".into(),
        "0.1111111111111111".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(args: &[String]) -> String {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, log) = Daemon::spawn(&refs).wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{stdout}\n{}", log.join("\n"));
    stdout
}

#[test]
fn sources_out_matches_mne_for_every_method_and_precision() {
    let dir = tempfile::tempdir().unwrap();
    for method in ["MNE", "dSPM", "sLORETA", "eLORETA"] {
        let (shape, reference) =
            read_npy_f64(&root().join(format!("fixtures/eeg/stc_{method}.npy")));
        let (n_sources, n_times) = (shape[0] as usize, shape[1] as usize);
        for (precision, tolerance) in [("f32", 1e-3), ("f64", 1e-4)] {
            let out: PathBuf = dir.path().join(format!("{method}_{precision}.npy"));
            let stdout = run(&eeg_args(
                method,
                &[
                    "--precision",
                    precision,
                    "--backend",
                    "cpu",
                    "--sources-out",
                    out.to_str().unwrap(),
                ],
            ));
            assert!(stdout.contains("accounting  balanced"), "{stdout}");
            let (got_shape, got) = read_npy_f64(&out);
            assert_eq!(
                got_shape, shape,
                "{method} {precision}: [n_sources, n_samples]"
            );
            let err = worst_relative_error(&got, &reference, n_sources, n_times);
            assert!(
                err <= tolerance,
                "{method} {precision}: relative error {err:e} > {tolerance:e}"
            );
        }
    }
}

/// Runs a replay with a region of interest around the dipole and returns the decisions.
fn roi_decisions(dir: &Path, backend: &str, threshold: f64, tag: &str) -> Vec<serde_json::Value> {
    let cfg = dir.join(format!("{tag}.toml"));
    std::fs::write(
        &cfg,
        format!("[eeg.roi]\nsources = [195, 196, 194]\nwindow_ms = 30.0\nthreshold = {threshold:e}\nrefractory_ms = 100.0\n"),
    )
    .unwrap();
    let out = dir.join(format!("{tag}.jsonl"));
    run(&eeg_args(
        "sLORETA",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--backend",
            backend,
            "--block-samples",
            "16",
            "--decisions",
            out.to_str().unwrap(),
        ],
    ));
    let mut d = read_jsonl(&out);
    d.sort_by_key(|r| r["seq"].as_u64().unwrap());
    d
}

fn threshold_from_cpu(dir: &Path) -> f64 {
    let probe = roi_decisions(dir, "cpu", f64::MAX, "probe");
    let mut stats: Vec<f64> = probe
        .iter()
        .map(|r| r["statistic"].as_f64().unwrap())
        .collect();
    assert!(stats.iter().all(|s| s.is_finite()));
    stats.sort_by(|a, b| a.partial_cmp(b).unwrap());
    stats[stats.len() * 3 / 4]
}

#[test]
fn the_roi_trigger_fires_on_the_dipole() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = threshold_from_cpu(dir.path());
    let d = roi_decisions(dir.path(), "cpu", threshold, "cpu");
    let accepted = d.iter().filter(|r| r["outcome"] == "accept").count();
    assert!(
        accepted > 0 && accepted < d.len(),
        "{accepted} of {}",
        d.len()
    );
    for r in d.iter().filter(|r| r["outcome"] == "accept") {
        assert!(r["statistic"].as_f64().unwrap() >= threshold);
        assert_eq!(r["lines"], serde_json::json!(["roi"]));
        assert_eq!(r["peak_pos_mm"].as_array().unwrap().len(), 3);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_and_cpu_replays_give_identical_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = threshold_from_cpu(dir.path());
    let cpu = roi_decisions(dir.path(), "cpu", threshold, "cpu");
    let gpu = roi_decisions(dir.path(), "gpu", threshold, "gpu");
    assert_eq!(cpu.len(), gpu.len());
    assert!(
        gpu.iter().all(|r| r["backend"] == "gpu"),
        "every block decided on the GPU"
    );
    for (c, g) in cpu.iter().zip(&gpu) {
        assert_eq!(c["seq"], g["seq"]);
        assert_eq!(c["outcome"], g["outcome"], "seq {}", c["seq"]);
        assert_eq!(c["peak_source"], g["peak_source"], "seq {}", c["seq"]);
        let (a, b) = (
            c["statistic"].as_f64().unwrap(),
            g["statistic"].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1e-30),
            "seq {}: {a} vs {b}",
            c["seq"]
        );
    }
}

/// Two EEG streams at once (the same recording as two file inputs: frames with `source_id`
/// 0 and 1) through `trigd run` with several workers: each stream keeps its own filter and
/// trigger state on one worker, so each gets exactly the decisions of a replay of it alone.
fn two_stream_decisions(
    dir: &Path,
    backend: &str,
    workers: &str,
    threshold: f64,
    tag: &str,
) -> (Vec<serde_json::Value>, Vec<String>) {
    two_stream_decisions_with(dir, backend, workers, threshold, tag, "16", "")
}

/// As [`two_stream_decisions`], with `block` samples per frame and `eeg` lines added to the
/// `[eeg]` table.
fn two_stream_decisions_with(
    dir: &Path,
    backend: &str,
    workers: &str,
    threshold: f64,
    tag: &str,
    block: &str,
    eeg: &str,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let cfg = dir.join(format!("{tag}.toml"));
    let edf = fx("dipole.edf");
    std::fs::write(
        &cfg,
        format!(
            "[[input]]\nname = \"a\"\nfile = \"{edf}\"\n\n[[input]]\nname = \"b\"\nfile = \"{edf}\"\n\n\
             [eeg]\n{eeg}\n\n[eeg.roi]\nsources = [195, 196, 194]\nwindow_ms = 30.0\nthreshold = {threshold:e}\nrefractory_ms = 100.0\n"
        ),
    )
    .unwrap();
    let out = dir.join(format!("{tag}.jsonl"));
    let mut args = eeg_args("sLORETA", &[]);
    args[0] = "run".into();
    args.remove(1); // no positional input: the inputs come from the configuration
    for a in [
        "--config",
        cfg.to_str().unwrap(),
        "--backend",
        backend,
        "--workers",
        workers,
        "--block-samples",
        block,
        "--budget-ms",
        "60000",
        "--metrics-addr",
        "127.0.0.1:0",
        "--decisions",
        out.to_str().unwrap(),
    ] {
        args.push(a.into());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, log) = Daemon::spawn(&refs).wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{stdout}\n{}", log.join("\n"));
    let mut d = read_jsonl(&out);
    d.sort_by_key(|r| (r["source_id"].as_u64().unwrap(), r["seq"].as_u64().unwrap()));
    (d, log)
}

fn assert_each_stream_matches(
    two: &[serde_json::Value],
    alone: &[serde_json::Value],
    tolerance: f64,
) {
    for id in 0..2u64 {
        let mine: Vec<&serde_json::Value> = two.iter().filter(|r| r["source_id"] == id).collect();
        assert_eq!(mine.len(), alone.len(), "stream {id}: every block decided");
        for (g, c) in mine.iter().zip(alone) {
            assert_eq!(g["seq"], c["seq"]);
            assert_eq!(g["outcome"], c["outcome"], "stream {id} seq {}", c["seq"]);
            assert_eq!(
                g["peak_source"], c["peak_source"],
                "stream {id} seq {}",
                c["seq"]
            );
            let (a, b) = (
                c["statistic"].as_f64().unwrap(),
                g["statistic"].as_f64().unwrap(),
            );
            assert!(
                (a - b).abs() <= tolerance * a.abs().max(1e-30),
                "stream {id} seq {}: {a} vs {b}",
                c["seq"]
            );
        }
    }
}

#[test]
fn two_streams_on_two_workers_each_decide_as_if_alone() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = threshold_from_cpu(dir.path());
    let alone = roi_decisions(dir.path(), "cpu", threshold, "alone");
    assert!(alone.iter().any(|r| r["outcome"] == "accept"));
    let (two, _) = two_stream_decisions(dir.path(), "cpu", "2", threshold, "two");
    assert_eq!(two.len(), 2 * alone.len());
    assert_each_stream_matches(&two, &alone, 0.0);
}

/// One-sample frames of two streams, batched as they arrive and split over three threads,
/// decide as on one thread: same outcomes and peaks, the statistic equal to float32
/// rounding (a batch's frames share one pass over the operator, so the float32 sums run
/// in another order than a lone frame's).
#[test]
fn one_sample_frames_batched_over_threads_decide_as_on_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = threshold_from_cpu(dir.path());
    let (one, _) =
        two_stream_decisions_with(dir.path(), "cpu", "1", threshold, "t1", "1", "threads = 1");
    let (three, log) =
        two_stream_decisions_with(dir.path(), "cpu", "1", threshold, "t3", "1", "threads = 3");
    assert!(
        log.iter()
            .any(|l| l.contains("EEG product on the CPU") && l.contains("threads=3")),
        "{}",
        log.join("\n")
    );
    assert_eq!(one.len(), three.len());
    assert!(
        one.len() >= 500,
        "one-sample frames of both streams: {}",
        one.len()
    );
    let alone: Vec<serde_json::Value> = one
        .iter()
        .filter(|r| r["source_id"] == 0)
        .cloned()
        .collect();
    assert_each_stream_matches(&three, &alone, 1e-5);
    assert!(three.iter().any(|r| r["outcome"] == "accept"));
}

/// On a machine with two GPUs: one worker per GPU, each stream on one of them, decisions
/// equal to the CPU's.
#[test]
#[ignore = "needs CUDA GPUs (two to spread the streams)"]
fn two_streams_on_the_gpus_match_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = threshold_from_cpu(dir.path());
    let alone = roi_decisions(dir.path(), "cpu", threshold, "alone");
    let (two, log) = two_stream_decisions(dir.path(), "gpu", "1", threshold, "gpu2");
    assert!(
        two.iter().all(|r| r["backend"] == "gpu"),
        "decided on the GPUs"
    );
    assert_each_stream_matches(&two, &alone, 1e-4);
    let gpus = log
        .iter()
        .filter(|l| l.contains("EEG worker on GPU"))
        .count();
    eprintln!(
        "{gpus} GPU worker(s):\n{}",
        log.iter()
            .filter(|l| l.contains("GPU"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(gpus >= 1);
}

/// `trigd check` on an EEG configuration builds it as `run` does and says what it built:
/// the operator's channels, sources and method, the filter, the region's sources (resolved
/// on the fixture's source space: the 7 within 20 mm of the dipole) and its trigger; it
/// warns where no region is given (nothing is accepted) and refuses inputs that are not
/// there.
#[test]
fn check_builds_an_eeg_configuration_and_says_what_it_built() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = format!(
        "[daemon]\nworkload = \"eeg\"\n[eeg]\nleadfield = {:?}\nsrc = {:?}\nnoise_cov = {:?}\n\
         channels = {:?}\nmethod = \"dSPM\"\n",
        fx("leadfield.npy"),
        fx("source_pos.npy"),
        fx("noise_cov.npy"),
        fx("channels.txt")
    );
    let stdout = stdout_of_success(&trigd_check(&format!(
        "{inputs}[eeg.filter]\nbandpass_hz = [1.0, 40.0]\n[eeg.roi]\n\
         sphere = {{ centre_mm = [36.0, 0.0, 54.0], radius_mm = 20.0 }}\nwindow_ms = 30.0\n\
         threshold = 0.75\nrefractory_ms = 100.0\n"
    )));
    for want in [
        "ok (0 inputs, workload eeg)",
        "eeg: 32 channels, 313 sources, dSPM",
        "filter: band-pass 1-40 Hz",
        "region of interest: 7 sources",
        "no warnings",
    ] {
        assert!(stdout.contains(want), "{want:?} not in\n{stdout}");
    }
    // Without a region: a warning. With a cache configured: none written.
    let cache = dir.path().join("kernel.cache");
    let stdout = stdout_of_success(&trigd_check(&format!(
        "{inputs}cache = {:?}\n",
        cache.to_str().unwrap()
    )));
    assert!(stdout.contains("warning: no [eeg.roi]"), "{stdout}");
    assert!(!cache.exists(), "check wrote the operator's cache");
    let out = trigd_check(&inputs.replace("leadfield.npy", "no_such_leadfield.npy"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no_such_leadfield.npy"), "{err}");
}
