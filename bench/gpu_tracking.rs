//! The cellular automaton's steps on the GPU (`trigd::gpu::tracking_ca`), per kernel,
//! against each step's floor (run on a machine with a CUDA GPU):
//!
//!     cargo bench --bench gpu_tracking            # or the built binary; --quick: fewer events
//!
//! For batches of central and of minimum-bias events of the spectrometer (uniform field)
//! and the forward tracker (field map), for the first pass's reach (1) and, on minimum-bias
//! events, the reach over missing planes: each step's device time (median of several profiled runs, device
//! events around each kernel), its floor (the fewest bytes the step must move: each input
//! read once, each output written once, over the device-to-device copy bandwidth measured
//! here), the steps' events per second on the device, the batch's wall time through
//! `run` (hits up, steps, per-event summary back), and the CPU finder's same steps on one
//! core of this host for the same events. Prints `key value` lines and a table.

use std::time::Instant;

use cudarc::driver::sys as drv_sys;
use trigd::frame::HitRecord;
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::runtime::DeviceBuffer;
use trigd::gpu::tracking_ca::{CaLimits, GpuCaEngine};
use trigd::gpu::{detect, BackendChoice, GpuDevice, GpuError};
use trigd::tracking::ca::{self, CaBuffers, FinderGeometry};
use trigd::tracking::geometry::Detector;
use trigd::tracking::kalman::KalmanFitter;
use trigd::tracking::reco::FinderConfig;
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn drv<T>(call: &'static str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Driver {
        call,
        code: format!("{e:?}"),
    })
}

/// Device-to-device copy bandwidth, GB/s, counting bytes read plus bytes written.
fn copy_bandwidth(dev: &GpuDevice) -> Result<f64, GpuError> {
    let ctx = dev.open()?;
    let stream = drv("cuStreamCreate", ctx.new_stream())?;
    let bytes = 1usize << 30;
    let a = DeviceBuffer::<u8>::new(&ctx, bytes)?;
    let b = DeviceBuffer::<u8>::new(&ctx, bytes)?;
    a.fill_bytes(0x3c, &stream)?;
    let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (e0, e1) = (
        drv("cuEventCreate", ctx.new_event(flags))?,
        drv("cuEventCreate", ctx.new_event(flags))?,
    );
    let mut t = Vec::new();
    for i in 0..11 {
        drv("cuEventRecord", e0.record(&stream))?;
        // SAFETY: both allocations are `bytes` long.
        drv("cuMemcpyDtoDAsync", unsafe {
            drv_sys::cuMemcpyDtoDAsync_v2(b.ptr(), a.ptr(), bytes, stream.cu_stream()).result()
        })?;
        drv("cuEventRecord", e1.record(&stream))?;
        let ms = drv("cuEventElapsedTime", e0.elapsed_ms(&e1))? as f64;
        if i >= 3 {
            t.push(ms);
        }
    }
    Ok(2.0 * bytes as f64 / (median(t) * 1e-3) / 1e9)
}

/// The fewest bytes each step moves, from the batch's counts (see the module doc):
/// hit sorting reads x, y, plane and writes the sorted x, y, plane, input index and the
/// cells' starts; doublets read the sorted hits and cells and write a, b, tx, ty, gap and
/// the per-hit starts; triplets read the doublets and hits and write left, right, q/p,
/// its error, chi-square; neighbours read the triplets' doublets and q/p and write the
/// links, starts and flags; the evolution reads the links and writes the levels.
fn floor_bytes(step: &str, hits: f64, cells: f64, d: f64, t: f64, links: f64) -> f64 {
    match step {
        "hit_sorting" => 12.0 * hits + 16.0 * hits + 4.0 * cells,
        "doublets" => 12.0 * hits + 4.0 * cells + 20.0 * d + 4.0 * hits,
        "triplets" => 12.0 * hits + 4.0 * hits + 20.0 * d + 20.0 * t,
        "neighbours" => 16.0 * t + 4.0 * links + 8.0 * t,
        _ => 4.0 * t + 4.0 * links + 4.0 * t,
    }
}

const STEPS: [&str; 5] = [
    "hit_sorting",
    "doublets",
    "triplets",
    "neighbours",
    "evolution",
];

#[allow(clippy::too_many_arguments)]
fn bench_batch(
    dev: &GpuDevice,
    bw_gbs: f64,
    label: &str,
    det: &Detector,
    events: &[Vec<HitRecord>],
    reach: usize,
    reps: usize,
    table: &mut Vec<String>,
) -> Result<(), GpuError> {
    let cfg = FinderConfig::from_detector(det, 1.0);
    let geo = FinderGeometry::new(det, &cfg);
    let limits = CaLimits {
        max_events: 2048,
        max_hits: 1 << 23,
        max_doublets: 1 << 26,
        max_triplets: 1 << 26,
        max_neighbours: 1 << 26,
        ..CaLimits::default()
    };
    let fitter = KalmanFitter::new(det, cfg.fit.clone());
    let mut engine = GpuCaEngine::with_fitter(
        dev,
        &geo,
        &cfg,
        &fitter,
        reach,
        limits,
        &KernelCache::from_env(),
    )?;
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    let s = engine.run(&batch)?;
    let failed = s.failed.iter().filter(|f| f.is_some()).count();
    let sum = |v: &[u32]| v.iter().map(|&x| x as f64).sum::<f64>();
    let (hits, d, t, links) = (
        sum(&s.hits),
        sum(&s.doublets),
        sum(&s.triplets),
        sum(&s.neighbours),
    );
    let cells = (geo.n_bins * events.len()) as f64;
    let n = events.len() as f64;
    // Profiled runs: per kernel group.
    let mut per_step: Vec<Vec<f64>> = vec![Vec::new(); STEPS.len()];
    let mut totals = Vec::new();
    let mut per_kernel: Vec<(&'static str, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        engine.run_profiled(&batch)?;
        for (k, (name, ms)) in engine.kernel_times().iter().enumerate() {
            if per_kernel.len() <= k {
                per_kernel.push((name, Vec::new()));
            }
            per_kernel[k].1.push(*ms);
        }
        let mut acc = [0.0f64; 5];
        for (name, ms) in engine.kernel_times() {
            let k = STEPS
                .iter()
                .position(|s| name.starts_with(s))
                .unwrap_or(STEPS.len() - 1);
            acc[k] += ms;
        }
        for k in 0..STEPS.len() {
            per_step[k].push(acc[k]);
        }
        totals.push(acc.iter().sum::<f64>());
    }
    // Wall time of `run` (hits up, steps, summary back), unprofiled.
    let mut wall = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        engine.run(&batch)?;
        wall.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    // The CPU's same steps on one core.
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let t0 = Instant::now();
    for hits in events {
        ca::hit_sorting::sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
        ca::doublets::find_doublets(&geo, &cfg, reach, &mut buf);
        ca::triplets::find_triplets(&geo, &cfg, reach, &mut buf);
        ca::neighbours::find_neighbours(&cfg, &mut buf);
        ca::evolution::evolve(&mut buf, geo.planes.len());
    }
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    let total_ms = median(totals);
    let wall_ms = median(wall);
    println!(
        "batch {label} reach {reach}: {} events ({failed} failed), {:.0} hits, {:.0} doublets, {:.0} triplets, {:.0} links per event",
        events.len(),
        hits / n,
        d / n,
        t / n,
        links / n
    );
    let parts: Vec<String> = per_kernel
        .into_iter()
        .map(|(name, v)| format!("{name} {:.3}", median(v)))
        .collect();
    println!("  kernels (ms): {}", parts.join(", "));
    let mut floor_total = 0.0;
    for (k, step) in STEPS.iter().enumerate() {
        let ms = median(per_step[k].clone());
        let floor_ms = floor_bytes(step, hits, cells, d, t, links) / (bw_gbs * 1e9) * 1e3;
        floor_total += floor_ms;
        println!(
            "  {step:<12} {ms:9.3} ms  floor {floor_ms:8.4} ms  ({:6.1}x the floor)",
            ms / floor_ms
        );
        table.push(format!(
            "| {label} | {reach} | {step} | {ms:.3} | {floor_ms:.4} | {:.0} |",
            ms / floor_ms
        ));
    }
    println!(
        "  steps on the device {total_ms:.3} ms ({:.0} events/s), floor {floor_total:.4} ms; run() wall {wall_ms:.3} ms ({:.0} events/s); CPU one core {cpu_ms:.1} ms ({:.0} events/s, {:.1}x the device steps)",
        n / (total_ms * 1e-3),
        n / (wall_ms * 1e-3),
        n / (cpu_ms * 1e-3),
        cpu_ms / total_ms
    );
    table.push(format!(
        "| {label} | {reach} | all steps | {total_ms:.3} | {floor_total:.4} | {:.0} |; run() wall {wall_ms:.3} ms = {:.0} ev/s; CPU 1 core {cpu_ms:.1} ms = {:.0} ev/s",
        total_ms / floor_total,
        n / (wall_ms * 1e-3),
        n / (cpu_ms * 1e-3)
    ));
    if reach == 1 {
        bench_candidates(
            &mut engine,
            &batch,
            &geo,
            &cfg,
            &fitter,
            events,
            reps,
            label,
            table,
        )?;
    }
    Ok(())
}

/// The candidate step of the first pass's reach (`min_hits` of the configuration) after
/// the steps: its two kernels' device times, and the CPU's `extract_and_select` on one
/// core for the same events.
#[allow(clippy::too_many_arguments)]
fn bench_candidates(
    engine: &mut GpuCaEngine,
    batch: &[&[HitRecord]],
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    events: &[Vec<HitRecord>],
    reps: usize,
    label: &str,
    table: &mut Vec<String>,
) -> Result<(), GpuError> {
    let mut per_kernel: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let mut tracks = 0.0;
    let mut failed = 0;
    for _ in 0..reps {
        engine.run(batch)?;
        let s = engine.select_candidates_profiled(cfg.min_hits, false)?;
        tracks = s.tracks.iter().map(|&t| t as f64).sum();
        failed = s.failed.iter().filter(|f| f.is_some()).count();
        for (k, (name, ms)) in engine.kernel_times().iter().enumerate() {
            if per_kernel.len() <= k {
                per_kernel.push((name, Vec::new()));
            }
            per_kernel[k].1.push(*ms);
        }
    }
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let mut cpu_ns = 0u128;
    let mut cpu_tracks = 0usize;
    for hits in events {
        ca::hit_sorting::sort_hits(geo, hits, cfg.limits.max_hits, &mut buf);
        ca::doublets::find_doublets(geo, cfg, 1, &mut buf);
        ca::triplets::find_triplets(geo, cfg, 1, &mut buf);
        ca::neighbours::find_neighbours(cfg, &mut buf);
        ca::evolution::evolve(&mut buf, geo.planes.len());
        let t0 = Instant::now();
        ca::candidates::extract_and_select(cfg, fitter, &mut buf, cfg.min_hits, false);
        cpu_ns += t0.elapsed().as_nanos();
        cpu_tracks += buf.accepted.len();
    }
    let cpu_ms = cpu_ns as f64 * 1e-6;
    let mut total = 0.0;
    let parts: Vec<String> = per_kernel
        .into_iter()
        .map(|(name, v)| {
            let ms = median(v);
            total += ms;
            format!("{name} {ms:.3}")
        })
        .collect();
    let n = events.len() as f64;
    println!(
        "  candidates (reach 1, min_hits {}): {:.1} tracks per event ({failed} events failed), kernels (ms): {}; device {total:.3} ms ({:.0} events/s); CPU extract_and_select one core {cpu_ms:.1} ms ({:.1} tracks per event, {:.1}x the device)",
        cfg.min_hits,
        tracks / n,
        parts.join(", "),
        n / (total * 1e-3),
        cpu_tracks as f64 / n,
        cpu_ms / total
    );
    table.push(format!(
        "| {label} | 1 | candidates | {total:.3} | - | - |; {}; CPU 1 core {cpu_ms:.1} ms",
        parts.join(", ")
    ));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let devices = detect(BackendChoice::Gpu)?;
    let dev = devices.into_iter().next().ok_or("no GPU")?;
    println!("device {dev}");
    let bw = copy_bandwidth(&dev)?;
    println!("copy_bandwidth_gbs {bw:.0}");
    let base = std::env::var_os("TRIGD_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("fixtures"));
    let configs = [
        ("spectrometer", "detector.toml", false),
        (
            "forward map",
            "tracking/forward/detector_forward.toml",
            true,
        ),
    ];
    let (n_central, n_minbias, reps) = if quick { (16, 128, 3) } else { (64, 1024, 5) };
    let mut table = vec![
        "| batch | reach | step | device ms | floor ms | x floor |".to_string(),
        "| --- | --- | --- | --- | --- | --- |".to_string(),
    ];
    for (name, path, forward) in configs {
        let det = Detector::from_toml_file(base.join(path))?;
        for (preset, n) in [(Preset::Central, n_central), (Preset::Minbias, n_minbias)] {
            let sim = if forward {
                SimConfig::forward(preset)
            } else {
                SimConfig::preset(preset)
            };
            let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, 2026, 0, n)
                .map(|e| e.hits)
                .collect();
            // The reach over missing planes on minimum-bias events only: the CPU's second
            // pass searches the hits the first left, a sparse event.
            let gap_reach = (1 + FinderConfig::from_detector(&det, 1.0).max_gap_planes).min(3);
            let reaches = if preset == Preset::Central {
                vec![1]
            } else {
                vec![1, gap_reach]
            };
            for reach in reaches {
                let label = format!("{name} {preset:?} x{n}");
                bench_batch(&dev, bw, &label, &det, &events, reach, reps, &mut table)?;
            }
        }
    }
    for l in table {
        println!("{l}");
    }
    Ok(())
}
