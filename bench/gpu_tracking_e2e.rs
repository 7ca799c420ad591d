//! Tracking end to end, GPU against the CPU in the same run (run on a machine with a CUDA
//! GPU):
//!
//!     cargo bench --bench gpu_tracking_e2e            # or the built binary
//!     options: --central N (events, default 256; 0: none) --minbias N (default 8192; 0: none)
//!              --launch-central N (events per launch, default 128)
//!              --launch-minbias N (default 512) --rounds N (default 5)
//!              --configs spectrometer,dipole,forward
//!              --gpus N (on a host with several GPUs: also every launch dealt
//!              round-robin over the first N GPUs, default all, one host thread each)
//!              --per-gpu K (K trackers per GPU, each on its own stream and host
//!              thread, so one's host work overlaps another's kernels; default as
//!              the daemon's `gpu_workers`, 4)
//!              --gpu-wait auto|spin|yield|block (how the host threads wait for the
//!              GPU, as the daemon's `gpu_wait`; default auto, the driver's choice)
//!              --candidate-blocks auto|large|small (the candidate step's blocks,
//!              `CandidateBlocks`; default auto, chosen per launch)
//!              --graphs 1|0 (each pass's and candidate step's launches recorded as
//!              CUDA graphs and replayed, the default, or each kernel launched)
//!
//! For central and minimum-bias events of each detector: the CPU finder
//! (`Reconstructor::reconstruct`, the daemon's CPU path) on one core and on every core of
//! this host (one finder per thread, the events dealt round-robin), and the GPU
//! (`GpuTracker::reconstruct_batch`: hits in host memory to tracks in host memory, every
//! step on the device) in launches of a fixed size, each launch timed (p50, p99); the
//! GPU's time per stage of a launch; and the agreement of the two (events whose tracks,
//! hit lists and chi-squares, are the CPU's). Prints `key value` lines and a table.

use std::time::Instant;

use trigd::frame::HitRecord;
use trigd::gpu::tracking::{CandidateBlocks, GpuTracker, TrackerLimits};
use trigd::gpu::{detect, BackendChoice};
use trigd::tracking::ca::cuts::FinderOverrides;
use trigd::tracking::geometry::Detector;
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};
use trigd::tracking::track::Track;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn str_arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// `--candidate-blocks`.
fn candidate_blocks() -> CandidateBlocks {
    match str_arg("--candidate-blocks", "auto").as_str() {
        "auto" => CandidateBlocks::Auto,
        "large" => CandidateBlocks::Large,
        "small" => CandidateBlocks::Small,
        other => panic!("--candidate-blocks: auto, large or small, not {other}"),
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn key(tracks: &[Track]) -> Vec<(Vec<u32>, u32)> {
    let mut v: Vec<_> = tracks
        .iter()
        .map(|t| (t.hits.clone(), t.chi2.to_bits()))
        .collect();
    v.sort();
    v
}

/// CPU events per second on `threads` threads (one finder each, built and warmed up on
/// one event before the clock starts; the threads start together).
fn cpu_rate(det: &Detector, cfg: &FinderConfig, events: &[Vec<HitRecord>], threads: usize) -> f64 {
    let start = std::sync::Barrier::new(threads + 1);
    let t0 = std::thread::scope(|s| {
        for k in 0..threads {
            let start = &start;
            s.spawn(move || {
                let mut reco = Reconstructor::new(det, cfg.clone());
                let mut out = Vec::new();
                reco.reconstruct(&events[0], &mut out);
                start.wait();
                for ev in events.iter().skip(k).step_by(threads) {
                    reco.reconstruct(ev, &mut out);
                }
            });
        }
        start.wait();
        Instant::now()
    });
    events.len() as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    use clap::ValueEnum;
    let wait = trigd::config::GpuWait::from_str(&str_arg("--gpu-wait", "auto"), false)
        .unwrap_or_else(|e| panic!("--gpu-wait: {e}"));
    trigd::gpu::set_wait(wait);
    let devices = match detect(BackendChoice::Gpu) {
        Ok(d) if !d.is_empty() => d,
        Ok(_) | Err(_) => {
            eprintln!("gpu_tracking_e2e: no usable CUDA GPU; nothing to measure");
            return;
        }
    };
    let dev = &devices[0];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("device {dev}");
    println!("host_cores {cores}");
    println!("gpu_wait {:?}", trigd::gpu::wait());
    let rounds = arg("--rounds", 5).max(1);
    let configs = str_arg("--configs", "spectrometer,dipole,forward");
    let n_gpus = arg("--gpus", devices.len()).clamp(1, devices.len());
    let per_gpu = arg("--per-gpu", trigd::config::GPU_WORKERS_DEFAULT).max(1);
    // Tracker k on GPU k % gpus: per GPU `per_gpu` trackers, on one GPU and on all.
    let on = |gpus: usize| -> Vec<trigd::gpu::GpuDevice> {
        (0..gpus * per_gpu)
            .map(|k| devices[k % gpus].clone())
            .collect()
    };
    let (on_one, on_all) = (on(1), on(n_gpus));
    let mut table = Vec::new();
    let mut multi = Vec::new();
    for name in configs.split(',') {
        let (geometry, forward) = match name {
            "spectrometer" => ("fixtures/detector.toml", false),
            "dipole" => ("fixtures/tracking/dipole/detector_dipole.toml", false),
            "forward" => ("fixtures/tracking/forward/detector_forward.toml", true),
            other => panic!("unknown configuration {other}"),
        };
        let det = Detector::from_toml_file(std::path::Path::new(geometry))
            .expect("run from the repository root");
        // `--finder 'key = value; ..'`: overrides of the derived cuts, as `[tracking.finder]`.
        let overrides = FinderOverrides::from_toml_str(&str_arg("--finder", "").replace(';', "\n"))
            .unwrap_or_else(|e| panic!("--finder: {e}"));
        let cfg = FinderConfig::from_detector_with(&det, 1.0, &overrides);
        for (preset, n_events, launch) in [
            (
                Preset::Central,
                arg("--central", 256),
                arg("--launch-central", 128),
            ),
            (
                Preset::Minbias,
                arg("--minbias", 8192),
                arg("--launch-minbias", 512),
            ),
        ] {
            if n_events == 0 {
                continue;
            }
            let sim = if forward {
                SimConfig::forward(preset)
            } else {
                SimConfig::preset(preset)
            };
            let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, 11, 0, n_events as u64)
                .map(|e| e.hits)
                .collect();
            let hits: usize = events.iter().map(Vec::len).sum();
            // One core: a quarter of the events (at least 32).
            let n_one = (events.len() / 4).max(32);
            let one = cpu_rate(&det, &cfg, &events[..events.len().min(n_one)], 1);
            let all = cpu_rate(&det, &cfg, &events, cores);
            let limits = TrackerLimits::for_batch(&cfg, launch);
            let mut tracker = GpuTracker::new(dev, &det, &cfg, limits).expect("tracker");
            tracker.set_candidate_blocks(candidate_blocks());
            tracker.set_graphs(arg("--graphs", 1) != 0);
            let (mut out, mut back) = (Vec::new(), Vec::new());
            // Warm-up, and agreement with the CPU on every event.
            let mut reco = Reconstructor::new(&det, cfg.clone());
            let mut cpu_tracks = Vec::new();
            let (mut equal, mut handed_back, mut n_tracks) = (0, 0, 0);
            let mut steps: std::collections::BTreeMap<&str, usize> = Default::default();
            for chunk in events.chunks(launch) {
                let views: Vec<&[HitRecord]> = chunk.iter().map(Vec::as_slice).collect();
                tracker
                    .reconstruct_batch(&views, &mut out, &mut back)
                    .expect("launch");
                for (k, ev) in chunk.iter().enumerate() {
                    if let Some(step) = back[k] {
                        handed_back += 1;
                        *steps.entry(step).or_default() += 1;
                        continue;
                    }
                    reco.reconstruct(ev, &mut cpu_tracks);
                    n_tracks += cpu_tracks.len();
                    equal += (key(&out[k]) == key(&cpu_tracks)) as usize;
                }
            }
            let mut lat = Vec::new();
            let mut stages = Vec::new();
            let t0 = Instant::now();
            for _ in 0..rounds {
                for chunk in events.chunks(launch) {
                    let views: Vec<&[HitRecord]> = chunk.iter().map(Vec::as_slice).collect();
                    let t = Instant::now();
                    tracker
                        .reconstruct_batch(&views, &mut out, &mut back)
                        .expect("launch");
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    stages.push(tracker.last_times());
                }
            }
            let gpu = (rounds * events.len()) as f64 / t0.elapsed().as_secs_f64();
            let mean = |f: fn(&trigd::gpu::tracking::TrackerTimes) -> f64| {
                stages.iter().map(f).sum::<f64>() / stages.len() as f64
            };
            let what = format!("{name} {preset:?}");
            if on_all.len() > 1 {
                // One GPU with `per_gpu` trackers, then every GPU with as many, same run.
                let (one_k, lat_k, enq_k) = if per_gpu > 1 {
                    several_gpus(&on_one, &det, &cfg, &events, launch, rounds)
                } else {
                    (gpu, lat.clone(), mean(|t| t.enqueue_ms))
                };
                let all_k = if n_gpus > 1 {
                    several_gpus(&on_all, &det, &cfg, &events, launch, rounds).0
                } else {
                    one_k
                };
                let (p50_k, p99_k) = (quantile(&lat_k, 0.5), quantile(&lat_k, 0.99));
                println!(
                    "{what}: 1 GPU x 1 tracker {gpu:.0}, 1 GPU x {per_gpu} {one_k:.0} (launch ms p50 {p50_k:.2}, p99 {p99_k:.2}; host in kernel launches {enq_k:.3} ms a launch), {n_gpus} GPU(s) x {per_gpu} {all_k:.0} events/s"
                );
                multi.push(format!(
                    "| {what} | {launch} | {gpu:.0} | {one_k:.0} | {p50_k:.2} / {p99_k:.2} | {all_k:.0} | {:.2}x | {:.2}x | {:.1}x | {:.1}x |",
                    one_k / gpu,
                    all_k / one_k,
                    all_k / n_gpus as f64 / one,
                    all_k / all / n_gpus as f64,
                ));
            }
            println!(
                "{what}: {} events, {:.0} hits/event, {:.1} tracks/event; agreement {equal}/{} events equal ({handed_back} handed back: {steps:?})",
                events.len(),
                hits as f64 / events.len() as f64,
                n_tracks as f64 / (events.len() - handed_back).max(1) as f64,
                events.len() - handed_back
            );
            println!(
                "{what}: launch of {launch}: stages ms first pass {:.3}, candidates {:.3}, later pass {:.3}, candidates {:.3}, tracks packed, clones marked and read back {:.3}, tracks written {:.3}; host in kernel launches {:.3} ms for {:.0} kernels",
                mean(|t| t.first_pass_ms),
                mean(|t| t.first_candidates_ms),
                mean(|t| t.later_pass_ms),
                mean(|t| t.later_candidates_ms),
                mean(|t| t.readback_ms),
                mean(|t| t.write_ms),
                mean(|t| t.enqueue_ms),
                mean(|t| t.kernels as f64),
            );
            table.push(format!(
                "| {what} | {launch} | {:.0} | {:.0} | {:.0} | {:.0}x | {:.1}x | {:.2} / {:.2} |",
                one,
                all,
                gpu,
                gpu / one,
                gpu / all,
                quantile(&lat, 0.5),
                quantile(&lat, 0.99),
            ));
        }
    }
    println!();
    println!("| events | per launch | CPU 1 core, events/s | CPU {cores} cores, events/s | GPU, events/s | GPU / 1 core | GPU / all cores | launch ms p50 / p99 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for row in table {
        println!("{row}");
    }
    if !multi.is_empty() {
        println!();
        println!(
            "| events | per launch | 1 GPU x 1 tracker, events/s | 1 GPU x {per_gpu}, events/s | 1 GPU x {per_gpu}: launch ms p50 / p99 | {n_gpus} GPU(s) x {per_gpu}, events/s | 1 GPU: {per_gpu} trackers / 1 | {n_gpus} GPUs / 1, {per_gpu} trackers each | per GPU / 1 core | per GPU / all {cores} cores |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for row in multi {
            println!("{row}");
        }
    }
}

/// Events/s with the launches dealt round-robin over one tracker per entry of `devices`
/// (a GPU may appear more than once), each on its own host thread (as the daemon runs
/// one worker per tracker), `rounds` times over `events`; and every launch's latency, ms
/// (from the call to the tracks in host memory, while the other trackers run).
fn several_gpus(
    devices: &[trigd::gpu::GpuDevice],
    det: &Detector,
    cfg: &FinderConfig,
    events: &[Vec<HitRecord>],
    launch: usize,
    rounds: usize,
) -> (f64, Vec<f64>, f64) {
    let chunks: Vec<&[Vec<HitRecord>]> = events.chunks(launch).collect();
    let mut trackers: Vec<GpuTracker> = devices
        .iter()
        .map(|d| {
            let mut t = GpuTracker::new(d, det, cfg, TrackerLimits::for_batch(cfg, launch))
                .expect("tracker");
            t.set_candidate_blocks(candidate_blocks());
            t.set_graphs(arg("--graphs", 1) != 0);
            // Compiled and warm before the clock starts.
            let views: Vec<&[HitRecord]> = chunks[0].iter().map(Vec::as_slice).collect();
            t.reconstruct_batch(&views, &mut Vec::new(), &mut Vec::new())
                .expect("launch");
            t
        })
        .collect();
    let n = devices.len();
    // The host's cores shared among the trackers, as the daemon does.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    for t in &mut trackers {
        t.set_write_threads((cores / n).max(1));
    }
    let start = std::sync::Barrier::new(n + 1);
    let (t0, lat) = std::thread::scope(|s| {
        let handles: Vec<_> = trackers
            .iter_mut()
            .enumerate()
            .map(|(g, tracker)| {
                let (chunks, start) = (&chunks, &start);
                s.spawn(move || {
                    let (mut out, mut back) = (Vec::new(), Vec::new());
                    let mut lat = Vec::new();
                    start.wait();
                    for _ in 0..rounds {
                        for chunk in chunks.iter().skip(g).step_by(n) {
                            let views: Vec<&[HitRecord]> =
                                chunk.iter().map(Vec::as_slice).collect();
                            let t = Instant::now();
                            tracker
                                .reconstruct_batch(&views, &mut out, &mut back)
                                .expect("launch");
                            lat.push((
                                t.elapsed().as_secs_f64() * 1e3,
                                tracker.last_times().enqueue_ms,
                            ));
                        }
                    }
                    lat
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let lat: Vec<(f64, f64)> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("tracker thread"))
            .collect();
        (t0, lat)
    });
    let rate = (rounds * events.len()) as f64 / t0.elapsed().as_secs_f64();
    // The mean host time in kernel launches per launch.
    let enqueue = lat.iter().map(|l| l.1).sum::<f64>() / lat.len().max(1) as f64;
    (rate, lat.into_iter().map(|l| l.0).collect(), enqueue)
}
