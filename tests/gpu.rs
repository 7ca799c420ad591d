//! GPU EEG engine against the CPU's float64 inverse (`InverseKernel::apply_f64`), on fresh
//! random operators and data. Needs a CUDA GPU: every test is ignored in CI and runs on the
//! device machine with `--ignored --test-threads=1`.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trigd::eeg::kernel::InverseKernel;
use trigd::gpu::eeg::{EegBlockOutput, EegEngineConfig, EegProduct, GpuEegEngine};
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::{detect, BackendChoice, GpuDevice, GpuError};

fn device() -> GpuDevice {
    let devices = detect(BackendChoice::Gpu).expect("a GPU is needed for this test");
    devices
        .into_iter()
        .next()
        .expect("detect(Gpu) returned no device")
}

fn seed() -> u64 {
    // Fresh inputs each run; the seed is printed so a failure can be replayed.
    let s = std::env::var("TRIGD_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("seed {s}");
    s
}

fn random_kernel(rng: &mut ChaCha8Rng, c: usize, s: usize) -> InverseKernel {
    InverseKernel {
        n_channels: c,
        n_sources: s,
        kernel: (0..3 * s * c)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect(),
        source_scale: (0..s).map(|_| rng.random_range(0.2..3.0)).collect(),
    }
}

fn random_roi(rng: &mut ChaCha8Rng, s: usize) -> Vec<u32> {
    let n = rng.random_range(1..=s.min(300));
    let mut roi: Vec<u32> = (0..n).map(|_| rng.random_range(0..s as u32)).collect();
    roi.sort_unstable();
    roi.dedup();
    roi
}

fn random_frame(rng: &mut ChaCha8Rng, c: usize, t: usize) -> Vec<f32> {
    (0..c * t).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The CPU's answer in float64: amplitudes, ROI power per sample, per-source power.
struct CpuBlock {
    amplitudes: Vec<f64>,
    roi_power: Vec<f64>,
    power: Vec<f64>,
}

fn cpu_block(kernel: &InverseKernel, roi: &[u32], frame: &[f32], t: usize) -> CpuBlock {
    let data: Vec<f64> = frame.iter().map(|&v| f64::from(v)).collect();
    let s = kernel.n_sources;
    let mut amplitudes = vec![0.0; s * t];
    kernel.apply_f64(&data, t, &mut amplitudes);
    let roi_power = (0..t)
        .map(|tt| {
            roi.iter()
                .map(|&r| amplitudes[r as usize * t + tt].powi(2))
                .sum::<f64>()
                / roi.len() as f64
        })
        .collect();
    let power = (0..s)
        .map(|src| (0..t).map(|tt| amplitudes[src * t + tt].powi(2)).sum())
        .collect();
    CpuBlock {
        amplitudes,
        roi_power,
        power,
    }
}

fn cpu_peak(power: &[f64]) -> usize {
    (0..power.len()).fold(0, |b, i| if power[i] > power[b] { i } else { b })
}

fn rel_norm(a: impl Iterator<Item = (f64, f64)>) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, r) in a {
        assert!(x.is_finite(), "unwritten or non-finite output {x}");
        num += (x - r) * (x - r);
        den += r * r;
    }
    (num / den.max(1e-300)).sqrt()
}

/// Checks one frame: amplitudes (if any) and ROI power within 1e-4 relative, the peak
/// equal (or, if float32 rounding could swap a near tie, of equal power to 1e-5).
fn check_frame(out: &EegBlockOutput, cpu: &CpuBlock, t: usize, with_amplitudes: bool) {
    assert_eq!(out.roi_power.len(), t);
    let e = rel_norm(
        out.roi_power
            .iter()
            .copied()
            .zip(cpu.roi_power.iter().copied()),
    );
    assert!(e < 1e-4, "ROI power relative error {e}");
    for (g, c) in out.roi_power.iter().zip(&cpu.roi_power) {
        assert!(
            (g - c).abs() <= 1e-4 * c.abs() + 1e-12,
            "ROI power {g} vs {c}"
        );
    }
    if with_amplitudes {
        assert_eq!(out.amplitudes.len(), cpu.amplitudes.len());
        let e = rel_norm(
            out.amplitudes
                .iter()
                .map(|&v| f64::from(v))
                .zip(cpu.amplitudes.iter().copied()),
        );
        assert!(e < 1e-4, "amplitude relative error {e}");
    } else {
        assert!(out.amplitudes.is_empty());
    }
    let want = cpu_peak(&cpu.power);
    let got = out.peak_source as usize;
    assert!(got < cpu.power.len(), "peak source {got} out of range");
    if got != want {
        let (pg, pw) = (cpu.power[got], cpu.power[want]);
        assert!(
            (pw - pg).abs() <= 1e-5 * pw,
            "peak {got} (power {pg}) vs CPU {want} (power {pw})"
        );
    }
    assert!(
        (out.peak_power - cpu.power[want]).abs() <= 1e-4 * cpu.power[want],
        "peak power {} vs {}",
        out.peak_power,
        cpu.power[want]
    );
}

fn poisoned() -> EegBlockOutput {
    EegBlockOutput {
        amplitudes: vec![f32::NAN; 3],
        roi_power: vec![f64::NAN; 2],
        peak_source: u32::MAX,
        peak_power: f64::NAN,
    }
}

fn engine(
    dev: &GpuDevice,
    k: &InverseKernel,
    roi: &[u32],
    t_max: usize,
    f_max: usize,
    graphs: bool,
    product: EegProduct,
) -> GpuEegEngine {
    let config = EegEngineConfig {
        max_samples_per_frame: t_max,
        max_frames_per_batch: f_max,
        slots: 2,
        amplitudes: true,
        use_graphs: graphs,
        product,
        cache: KernelCache::from_env(),
    };
    let eng = GpuEegEngine::new(dev, k, roi, config).expect("engine");
    assert_eq!(eng.is_fused(), product == EegProduct::Fused);
    eng
}

/// Both device paths where the GPU has tensor cores (sm_80+), else cuBLAS alone.
fn products(dev: &GpuDevice) -> Vec<EegProduct> {
    if dev.compute_capability.0 >= 8 {
        vec![EegProduct::Blas, EegProduct::Fused]
    } else {
        vec![EegProduct::Blas]
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn single_blocks_agree_with_cpu_f64_for_many_sizes() {
    let dev = device();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    // (channels, sources, samples): odd sizes, one sample, 32 samples, partial tiles.
    for &(c, s, t) in &[
        (1, 1, 1),
        (7, 13, 1),
        (59, 1000, 32),
        (33, 257, 5),
        (64, 2049, 17),
        (256, 3001, 1),
        (19, 511, 32),
        (21, 700, 40),
        (59, 1000, 64),
    ] {
        let k = random_kernel(&mut rng, c, s);
        let roi = random_roi(&mut rng, s);
        for (graphs, product) in [false, true]
            .into_iter()
            .flat_map(|g| products(&dev).into_iter().map(move |p| (g, p)))
        {
            let mut eng = engine(&dev, &k, &roi, 64, 4, graphs, product);
            for rep in 0..3 {
                let frame = random_frame(&mut rng, c, t);
                let cpu = cpu_block(&k, &roi, &frame, t);
                let amps = rep != 1;
                eng.poison_device_outputs().unwrap();
                let mut out = poisoned();
                eng.process(&frame, t, amps, &mut out).unwrap();
                check_frame(&out, &cpu, t, amps);
            }
        }
        eprintln!("ok: {c} channels x {s} sources x {t} samples");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_and_pipelined_frames_agree_with_cpu() {
    let dev = device();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let (c, s) = (59, 4099);
    let k = random_kernel(&mut rng, c, s);
    let roi = random_roi(&mut rng, s);
    for product in products(&dev) {
        batched_and_pipelined(&dev, &mut rng, &k, &roi, product);
    }
}

fn batched_and_pipelined(
    dev: &GpuDevice,
    rng: &mut ChaCha8Rng,
    k: &InverseKernel,
    roi: &[u32],
    product: EegProduct,
) {
    let (c, t) = (k.n_channels, 32);
    let mut eng = engine(dev, k, roi, 32, 8, true, product);
    // One batch of 8 in one launch.
    let frames: Vec<Vec<f32>> = (0..8).map(|_| random_frame(rng, c, t)).collect();
    let refs: Vec<&[f32]> = frames.iter().map(Vec::as_slice).collect();
    eng.poison_device_outputs().unwrap();
    let mut outs = vec![poisoned(); 8];
    eng.process_batch(&refs, t, true, &mut outs).unwrap();
    for (fr, out) in frames.iter().zip(&outs) {
        check_frame(out, &cpu_block(k, roi, fr, t), t, true);
    }
    // Pipelined: two batches in flight on two streams, 6 batches of 3 (shorter blocks).
    let t2 = 9;
    let batches: Vec<Vec<Vec<f32>>> = (0..6)
        .map(|_| (0..3).map(|_| random_frame(rng, c, t2)).collect())
        .collect();
    let mut results: Vec<Vec<EegBlockOutput>> = Vec::new();
    let mut in_flight = std::collections::VecDeque::new();
    for b in &batches {
        if in_flight.len() == 2 {
            let tk = in_flight.pop_front().unwrap();
            let mut o = vec![poisoned(); 3];
            eng.wait(tk, &mut o).unwrap();
            results.push(o);
        }
        let refs: Vec<&[f32]> = b.iter().map(Vec::as_slice).collect();
        in_flight.push_back(eng.submit(&refs, t2, false).unwrap());
    }
    while let Some(tk) = in_flight.pop_front() {
        let mut o = vec![poisoned(); 3];
        eng.wait(tk, &mut o).unwrap();
        results.push(o);
    }
    assert_eq!(results.len(), batches.len());
    for (b, outs) in batches.iter().zip(&results) {
        for (fr, out) in b.iter().zip(outs) {
            check_frame(out, &cpu_block(k, roi, fr, t2), t2, false);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn peak_ties_go_to_the_lowest_source() {
    let dev = device();
    // Sources 3 and 700 (different tiles) and 900 get identical rows: equal power.
    let (c, s, t) = (4, 1000, 2);
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let mut k = random_kernel(&mut rng, c, s);
    for v in k.kernel.iter_mut() {
        *v *= 0.01;
    }
    for src in [3usize, 700, 900] {
        for j in 0..3 {
            for ch in 0..c {
                k.kernel[(3 * src + j) * c + ch] = (j + ch + 1) as f64;
            }
        }
        k.source_scale[src] = 1.5;
    }
    let frame = random_frame(&mut rng, c, t);
    for product in products(&dev) {
        let mut eng = engine(&dev, &k, &[3, 700], 4, 1, false, product);
        let mut out = poisoned();
        eng.process(&frame, t, false, &mut out).unwrap();
        assert_eq!(out.peak_source, 3, "{product:?}");
    }
}

/// The pipeline's fail-over contract: a device error fails the batch with an error value,
/// the CPU path then yields every frame's result, and the engine serves the next batch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn injected_device_error_is_reported_and_cpu_fallback_loses_no_frame() {
    let dev = device();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let (c, s) = (32, 777);
    let k = random_kernel(&mut rng, c, s);
    let roi = random_roi(&mut rng, s);
    for product in products(&dev) {
        fail_over(&dev, &mut rng, &k, &roi, product);
    }
}

fn fail_over(
    dev: &GpuDevice,
    rng: &mut ChaCha8Rng,
    k: &InverseKernel,
    roi: &[u32],
    product: EegProduct,
) {
    let (c, t) = (k.n_channels, 8);
    let mut eng = engine(dev, k, roi, 8, 4, true, product);
    let frames: Vec<Vec<f32>> = (0..12).map(|_| random_frame(rng, c, t)).collect();
    let mut results: Vec<Option<(Vec<f64>, u32)>> = vec![None; frames.len()];
    let mut failed_batches = 0;
    for (bi, chunk) in frames.chunks(4).enumerate() {
        if bi == 1 {
            eng.inject_device_error();
        }
        let refs: Vec<&[f32]> = chunk.iter().map(Vec::as_slice).collect();
        let mut outs = Vec::new();
        match eng.process_batch(&refs, t, false, &mut outs) {
            Ok(()) => {
                for (i, o) in outs.into_iter().enumerate() {
                    results[bi * 4 + i] = Some((o.roi_power, o.peak_source));
                }
            }
            Err(e) => {
                failed_batches += 1;
                assert!(matches!(e, GpuError::Driver { .. }), "{e}");
                assert!(e.to_string().contains("cuLaunchKernel"), "{e}");
                let be: trigd::backend::BackendError = e.into();
                assert!(be.to_string().starts_with("device error"), "{be}");
                // CPU fail-over for the whole batch.
                for (i, fr) in chunk.iter().enumerate() {
                    let cpu = cpu_block(k, roi, fr, t);
                    results[bi * 4 + i] = Some((cpu.roi_power, cpu_peak(&cpu.power) as u32));
                }
            }
        }
    }
    assert_eq!(failed_batches, 1, "exactly the injected batch fails");
    for (i, (r, fr)) in results.iter().zip(&frames).enumerate() {
        let (roi_power, peak) = r.as_ref().unwrap_or_else(|| panic!("frame {i} lost"));
        let cpu = cpu_block(k, roi, fr, t);
        assert_eq!(*peak as usize, cpu_peak(&cpu.power), "frame {i}");
        assert!(
            rel_norm(roi_power.iter().copied().zip(cpu.roi_power.iter().copied())) < 1e-4,
            "frame {i}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn second_engine_loads_kernels_from_the_disk_cache() {
    let dev = device();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let k = random_kernel(&mut rng, 8, 100);
    let cfg = || EegEngineConfig {
        max_samples_per_frame: 4,
        max_frames_per_batch: 1,
        slots: 2,
        amplitudes: false,
        use_graphs: false,
        product: EegProduct::Auto,
        cache: KernelCache::at(dir.path()),
    };
    let t0 = Instant::now();
    let first = GpuEegEngine::new(&dev, &k, &[1, 2], cfg()).unwrap();
    let first_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert!(!first.kernels_from_cache, "empty cache: compiled");
    let t1 = Instant::now();
    let mut second = GpuEegEngine::new(&dev, &k, &[1, 2], cfg()).unwrap();
    let second_ms = t1.elapsed().as_secs_f64() * 1e3;
    assert!(
        second.kernels_from_cache,
        "second start loads from the cache"
    );
    eprintln!(
        "engine start: compile {:.1} ms (kernels {:.1} ms), cached {:.1} ms (kernels {:.1} ms)",
        first_ms, first.kernel_load_ms, second_ms, second.kernel_load_ms
    );
    assert!(
        second.kernel_load_ms < first.kernel_load_ms,
        "loading from the cache is faster than compiling"
    );
    // A corrupted entry is compiled again, not fatal, and the engine computes correctly.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x5a;
        std::fs::write(&p, bytes).unwrap();
    }
    let mut third = GpuEegEngine::new(&dev, &k, &[1, 2], cfg()).unwrap();
    assert!(!third.kernels_from_cache, "damaged entry recompiled");
    let fourth = GpuEegEngine::new(&dev, &k, &[1, 2], cfg()).unwrap();
    assert!(fourth.kernels_from_cache, "rewritten entry used again");
    let frame = random_frame(&mut rng, 8, 4);
    let cpu = cpu_block(&k, &[1, 2], &frame, 4);
    for eng in [&mut second, &mut third] {
        let mut out = poisoned();
        eng.process(&frame, 4, false, &mut out).unwrap();
        check_frame(&out, &cpu, 4, false);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_an_error_not_a_panic() {
    let dev = device();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let k = random_kernel(&mut rng, 4, 10);
    assert!(
        GpuEegEngine::new(&dev, &k, &[10], EegEngineConfig::default()).is_err(),
        "ROI out of range"
    );
    let mut eng = engine(&dev, &k, &[0], 4, 2, true, EegProduct::Blas);
    let mut out = EegBlockOutput::default();
    assert!(
        eng.process(&[0.5; 4 * 5], 5, false, &mut out).is_err(),
        "T over the limit"
    );
    assert!(
        eng.process(&[0.5; 7], 2, false, &mut out).is_err(),
        "wrong length"
    );
    let f = random_frame(&mut rng, 4, 2);
    let mut outs = Vec::new();
    assert!(
        eng.process_batch(
            &[f.as_slice(), f.as_slice(), f.as_slice()],
            2,
            false,
            &mut outs
        )
        .is_err(),
        "batch over the limit"
    );
    // Still works afterwards.
    eng.process(&f, 2, false, &mut out).unwrap();
    check_frame(&out, &cpu_block(&k, &[0], &f, 2), 2, false);
}
