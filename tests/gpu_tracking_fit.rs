//! The Kalman fit on the GPU against the CPU fitter, on fresh simulated central events of
//! the shipped detectors (a uniform field, a dipole field map, a forward field map): the
//! CPU finder's tracks, and variants of them that reach the fit's other paths (seeds over
//! a missing plane, missing hits inside, candidates that cannot be fitted), fitted by both
//! and compared track by track. Needs a CUDA GPU: every test is ignored in CI and runs on
//! the device machine with `--ignored --test-threads=1`, from the repository root (or with
//! `TRIGD_FIXTURES` naming the fixtures directory).
//!
//! The detectors, the candidates and the tolerance of the comparison are `tests/fit_common`'s,
//! shared with `tests/fit_kernel_on_cpu.rs`, which runs the same kernel source on the CPU.

mod fit_common;
mod gpu_common;

use std::time::Instant;

use fit_common::{compare, detectors, found_tracks, with_variants};
use gpu_common::{device, seed};

use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::tracking_fit::{FitEngineConfig, FitError, FitLimit, FitLimits, GpuFitEngine};
use trigd::gpu::GpuDevice;
use trigd::tracking::kalman::{FitHit, KalmanFitter};

fn engine(dev: &GpuDevice, fitter: &KalmanFitter, limits: FitLimits) -> GpuFitEngine {
    GpuFitEngine::new(
        dev,
        fitter,
        FitEngineConfig {
            limits,
            cache: KernelCache::from_env(),
        },
    )
    .expect("engine")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fits_agree_with_the_cpu_on_every_shipped_detector() {
    let dev = device();
    let s = seed();
    for (name, det, sim) in detectors() {
        let (fitter, found) = found_tracks(&det, &sim, s, 3);
        let all = with_variants(&found, det.planes.len());
        let refs: Vec<&[FitHit]> = all.iter().map(|v| &v[..]).collect();
        let mut cpu = Vec::new();
        fitter.fit_batch(&refs, &mut cpu);
        let mut gpu_engine = engine(&dev, &fitter, FitLimits::default());
        let gpu = gpu_engine.fit_batch(&refs).expect("GPU fit");
        let a = compare(name, &cpu, &gpu);
        assert_eq!(a.tracks, all.len());
        assert!(found.len() > 1000, "{name}: {} tracks found", found.len());
        // The tracks found are fitted (well over nine in ten; a few candidates of the
        // finder may end with a negative variance), and the unfittable variants are not.
        assert!(a.ok * 10 > all.len() * 9, "{name}: {a:?}");
        assert!(
            a.ok < all.len(),
            "{name}: the unfittable variants were fitted"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_same_batch_gives_the_same_fits_on_every_run() {
    let dev = device();
    let (_, det, sim) = detectors().swap_remove(2);
    let (fitter, found) = found_tracks(&det, &sim, seed(), 1);
    let refs: Vec<&[FitHit]> = found.iter().map(|v| &v[..]).collect();
    let mut e = engine(&dev, &fitter, FitLimits::default());
    let first = e.fit_batch(&refs).expect("fit");
    for _ in 0..3 {
        assert_eq!(e.fit_batch(&refs).expect("fit"), first);
    }
    // Any sub-batch gives the same fits as in the whole batch.
    let part = e.fit_batch(&refs[5..40]).expect("fit");
    assert_eq!(&part[..], &first[5..40]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_batch_beyond_the_limits_is_an_overflow_and_the_engine_goes_on() {
    let dev = device();
    let (_, det, sim) = detectors().swap_remove(0);
    let (fitter, found) = found_tracks(&det, &sim, seed(), 1);
    let limits = FitLimits {
        max_candidates: 100,
        max_hits_per_candidate: 9,
    };
    let mut e = engine(&dev, &fitter, limits);
    let refs: Vec<&[FitHit]> = found.iter().map(|v| &v[..]).collect();
    match e.fit_batch(&refs[..101]) {
        Err(FitError::Overflow { limit, got, max }) => {
            assert_eq!((limit, got, max), (FitLimit::Candidates, 101, 100));
        }
        other => panic!("expected an overflow, got {other:?}"),
    }
    let mut long = found[0].clone();
    while long.len() < 10 {
        long.push(long[long.len() - 1]);
    }
    match e.fit_batch(&[&found[1][..], &long[..]]) {
        Err(FitError::Overflow { limit, got, max }) => {
            assert_eq!((limit, got, max), (FitLimit::HitsPerCandidate, 10, 9));
        }
        other => panic!("expected an overflow, got {other:?}"),
    }
    // A batch at the limit fits as the CPU does.
    let mut cpu = Vec::new();
    fitter.fit_batch(&refs[..100], &mut cpu);
    let gpu = e.fit_batch(&refs[..100]).expect("fit at the limit");
    compare("at the limit", &cpu, &gpu);
    assert!(e.fit_batch(&[]).expect("empty batch").is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_error_is_returned_and_the_next_batch_fits() {
    let dev = device();
    let (_, det, sim) = detectors().swap_remove(1);
    let (fitter, found) = found_tracks(&det, &sim, seed(), 1);
    let refs: Vec<&[FitHit]> = found.iter().map(|v| &v[..]).collect();
    let mut e = engine(&dev, &fitter, FitLimits::default());
    e.inject_device_error();
    match e.fit_batch(&refs) {
        Err(FitError::Device(err)) => {
            let msg = err.to_string();
            assert!(msg.contains("kalman_fit"), "{msg}");
        }
        other => panic!("expected a device error, got {other:?}"),
    }
    let mut cpu = Vec::new();
    fitter.fit_batch(&refs, &mut cpu);
    let gpu = e.fit_batch(&refs).expect("the batch after the error");
    compare("after a device error", &cpu, &gpu);
}

/// Fits per second on the GPU (end to end from host hits to host results, and the kernel
/// alone with the hits resident) against the CPU fitter on one core, on the found tracks of
/// central events of each shipped detector. Writes a Markdown table to `TRIGD_BENCH_OUT`
/// when set.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fit_throughput_against_one_cpu_core() {
    let dev = device();
    let s = seed();
    let events: u64 = std::env::var("TRIGD_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut table = String::from(
        "| detector | events | fits per batch | CPU 1 core (fits/s) | GPU end to end (fits/s; pack + device + unpack) | GPU kernel, hits resident (fits/s) | GPU kernel, 2^20 fits resident (fits/s) | end to end / CPU |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (name, det, sim) in detectors() {
        let (fitter, found) = found_tracks(&det, &sim, s, events);
        let refs: Vec<&[FitHit]> = found.iter().map(|v| &v[..]).collect();
        let n = refs.len();
        let limits = FitLimits {
            max_candidates: n,
            max_hits_per_candidate: det.planes.len().max(3),
        };
        let mut e = engine(&dev, &fitter, limits);
        // CPU: best of three passes over the batch on this thread.
        let mut cpu_out = Vec::new();
        let mut cpu_s = f64::INFINITY;
        for _ in 0..3 {
            let t0 = Instant::now();
            fitter.fit_batch(&refs, &mut cpu_out);
            cpu_s = cpu_s.min(t0.elapsed().as_secs_f64());
        }
        // GPU end to end: packing, copy in, kernel, copy out, unpacking.
        let mut gpu_out = Vec::new();
        e.fit_batch_into(&refs, &mut gpu_out).expect("warm-up");
        let mut e2e_s = f64::INFINITY;
        let mut times = e.last_times();
        for _ in 0..10 {
            let t0 = Instant::now();
            e.fit_batch_into(&refs, &mut gpu_out).expect("fit");
            let t = t0.elapsed().as_secs_f64();
            if t < e2e_s {
                e2e_s = t;
                times = e.last_times();
            }
        }
        eprintln!("{name}: best batch {:.0} us: {times:?}", e2e_s * 1e6);
        compare(name, &cpu_out, &gpu_out);
        let launches = 50;
        let resident = e.time_resident(&refs, launches).expect("resident");
        let kernel_s = resident.as_secs_f64() / launches as f64;
        // The kernel alone on a batch of 2^20 fits (the found tracks repeated), where
        // launch and tail effects are small.
        let big_n = 1 << 20;
        let big: Vec<&[FitHit]> = refs.iter().copied().cycle().take(big_n).collect();
        let mut big_e = engine(
            &dev,
            &fitter,
            FitLimits {
                max_candidates: big_n,
                ..limits
            },
        );
        let big_s = big_e
            .time_resident(&big, 20)
            .expect("resident")
            .as_secs_f64()
            / 20.0;
        drop(big_e);
        let big_r = big_n as f64 / big_s;
        let (cpu_r, e2e_r, ker_r) = (n as f64 / cpu_s, n as f64 / e2e_s, n as f64 / kernel_s);
        let line = format!(
            "| {name} | {events} | {n} | {cpu_r:.3e} | {e2e_r:.3e} ({:.0} + {:.0} + {:.0} us) | {ker_r:.3e} | {big_r:.3e} | {:.1}x |\n",
            times.pack_us,
            times.device_us,
            times.unpack_us,
            e2e_r / cpu_r
        );
        eprint!("{line}");
        table.push_str(&line);
        assert!(
            ker_r > e2e_r * 0.5,
            "{name}: kernel alone slower than end to end"
        );
    }
    eprintln!("device: {}\n{table}", dev);
    if let Some(path) = std::env::var_os("TRIGD_BENCH_OUT") {
        std::fs::write(path, format!("device: {dev}\n\n{table}")).expect("write results");
    }
}
