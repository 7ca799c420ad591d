//! Tracking throughput on the CPU: events per second per core for minimum-bias and
//! central events on the default spectrometer (with the time of each reconstruction step),
//! and Kalman fits per second on one and two threads on each configuration (the kernel the CPU runs and the
//! portable one).
//!
//! `cargo bench --bench tracking` (options after `--`: `--events N` central events (0:
//! fits only), `--minbias N` minimum-bias events (default 20 per central event),
//! `--fits N` (0: events only), `--fit-threads N` (fits on 1..=N threads, default 2), `--portable 0` (only
//! the kernel the CPU runs), `--configs LIST` (detectors, comma-separated, of `spectrometer`
//! (the default), `dipole`, `forward`, `reversing`, `telescope`, or `all`), `--finder TOML` (overrides of the finder's derived cuts, the
//! contents of a `[finder]` table, e.g. `--finder 'first_pass_min_hits = 8'`), `--min-p GEV`
//! (the finder's minimum momentum, default 1), `--events-dir LIST` (comma-separated
//! TrackML-style CSV directories, each with its own `detector.toml` beside the events, as
//! `fixtures/tracking/independent/simulate.py` writes them: their events are timed as they
//! are, after the configurations of `--configs`, which `--configs none` leaves out),
//! `--repeat N` (the events reconstructed N times over, for profilers), `--per-hit-rounds N`
//! (aim 3's measure: the central events of every configuration reconstructed in turn, N
//! rounds, each round's thread CPU time per hit and its ratio to the spectrometer's in the
//! same round)).

use std::time::Instant;
use trigd::frame::HitRecord;
use trigd::tracking::geometry::Detector;
use trigd::tracking::kalman::{FitConfig, FitHit, FitKernel, FitOutput, KalmanFitter};
use trigd::tracking::reco::{FinderConfig, FinderOverrides, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};
use trigd::tracking::trackml;

fn arg(name: &str, default: usize) -> usize {
    str_arg(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn str_arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// The detector configurations the bench runs: name, geometry, and the samples of
/// minimum-bias and central events.
fn configs(which: &str) -> Vec<(&'static str, &'static str, SimConfig, SimConfig)> {
    let hadronic = |p| SimConfig::preset(p);
    let all = vec![
        (
            "spectrometer",
            "fixtures/detector.toml",
            hadronic(Preset::Minbias),
            hadronic(Preset::Central),
        ),
        (
            "dipole",
            "fixtures/tracking/dipole/detector_dipole.toml",
            hadronic(Preset::Minbias),
            hadronic(Preset::Central),
        ),
        (
            "forward",
            "fixtures/tracking/forward/detector_forward.toml",
            SimConfig::forward(Preset::Minbias),
            SimConfig::forward(Preset::Central),
        ),
        (
            "reversing",
            "fixtures/tracking/reversing/detector_reversing.toml",
            SimConfig::forward(Preset::Minbias),
            SimConfig::forward(Preset::Central),
        ),
        (
            "telescope",
            "fixtures/telescope.toml",
            hadronic(Preset::Minbias),
            hadronic(Preset::Central),
        ),
    ];
    all.into_iter()
        .filter(|c| which == "all" || which.split(',').any(|w| w == c.0))
        .collect()
}

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let overrides = match FinderOverrides::from_toml_str(&str_arg("--finder").unwrap_or_default()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("--finder: {e}");
            std::process::exit(1);
        }
    };
    let n_events = arg("--events", 20) as u64;
    let n_fits = arg("--fits", 2_000_000);
    let which = str_arg("--configs").unwrap_or_else(|| "spectrometer".into());
    let min_p: f64 = str_arg("--min-p")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let configs = if which == "none" {
        Vec::new()
    } else {
        configs(&which)
    };
    if configs.is_empty() && which != "none" {
        eprintln!(
            "--configs {which}: none of spectrometer, dipole, forward, reversing, telescope, all"
        );
        std::process::exit(1);
    }
    let mut fit_dets = Vec::new();
    let per_hit_rounds = arg("--per-hit-rounds", 0);
    let mut per_hit = Vec::new();
    for (config, path, minbias, central) in configs {
        let central_sim = central.clone();
        let det = match Detector::from_toml_file(root.join(path)) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        println!("# Tracking (CPU), {config} ({path}), min p {min_p} GeV/c");
        for (name, sim, n) in [
            (
                "minbias",
                minbias,
                arg("--minbias", 20 * n_events as usize) as u64,
            ),
            ("central", central, n_events),
        ] {
            if n > 0 {
                let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, 7, 0, n)
                    .map(|ev| ev.hits)
                    .collect();
                bench_events(&det, &overrides, min_p, name, &events);
            }
        }
        if per_hit_rounds > 0 {
            let events: Vec<Vec<HitRecord>> = simulate_events(&det, &central_sim, 7, 0, n_events)
                .map(|ev| ev.hits)
                .collect();
            per_hit.push(events);
        }
        fit_dets.push((config, det));
    }
    if per_hit_rounds > 0 {
        let runs: Vec<_> = fit_dets
            .iter()
            .zip(per_hit)
            .map(|((config, det), events)| (*config, det, events))
            .collect();
        bench_per_hit(&runs, &overrides, min_p, per_hit_rounds);
    }
    for dir in str_arg("--events-dir")
        .unwrap_or_default()
        .split(',')
        .filter(|d| !d.is_empty())
    {
        let dir = std::path::Path::new(dir);
        let geometry = dir.join("detector.toml");
        let read = || -> Result<(Detector, Vec<Vec<HitRecord>>), String> {
            let det = Detector::from_toml_file(&geometry).map_err(|e| e.to_string())?;
            let events = trackml::read_trackml_dir(dir)
                .map_err(|e| e.to_string())?
                .map(|ev| ev.map(|ev| ev.hits).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((det, events))
        };
        let (det, events) = match read() {
            Ok(v) => v,
            Err(e) => {
                eprintln!("--events-dir {}: {e}", dir.display());
                std::process::exit(1);
            }
        };
        println!(
            "# Tracking (CPU), {} ({}), min p {min_p} GeV/c",
            dir.display(),
            geometry.display()
        );
        bench_events(&det, &overrides, min_p, "events", &events);
    }
    if n_fits > 0 {
        if fit_dets.is_empty() {
            eprintln!("--fits needs a detector in --configs");
            std::process::exit(1);
        }
        for (config, det) in &fit_dets {
            println!("\n# Kalman fits, {config}");
            bench_fits(
                det,
                n_fits,
                arg("--fit-threads", 2),
                arg("--portable", 1) != 0,
            );
        }
    }
}

fn bench_events(
    det: &Detector,
    overrides: &FinderOverrides,
    min_p: f64,
    name: &str,
    events: &[Vec<HitRecord>],
) {
    let n = events.len() as u64;
    let mut reco = Reconstructor::new(det, FinderConfig::from_detector_with(det, min_p, overrides));
    let mut tracks = Vec::new();
    // Warm-up: buffers reach their working size.
    for hits in events.iter().take(2) {
        reco.reconstruct(hits, &mut tracks);
    }
    reco.reset_step_times();
    let repeat = arg("--repeat", 1).max(1) as u64;
    let t0 = Instant::now();
    let mut n_tracks = 0;
    for _ in 0..repeat {
        for hits in events {
            reco.reconstruct(hits, &mut tracks);
            n_tracks += tracks.len();
        }
    }
    let n = n * repeat;
    let dt = t0.elapsed().as_secs_f64();
    let st = reco.step_times();
    let per_event_ms = 1e3 * dt / n as f64;
    println!(
        "\n{name}: {n} events, {:.0} hits/event, {:.1} tracks/event: {:.3} ms/event, {:.0} ns/hit, {:.0} events/s per core",
        st.hits as f64 / n as f64,
        n_tracks as f64 / n as f64,
        per_event_ms,
        dt * 1e9 / st.hits.max(1) as f64,
        n as f64 / dt
    );
    println!(
        "  doublets/event {:.0}, triplets/event {:.0}, candidates/event {:.0}",
        st.doublets as f64 / n as f64,
        st.triplets as f64 / n as f64,
        st.candidates as f64 / n as f64
    );
    println!("  | step | us/event | share |\n  | --- | --- | --- |");
    let total = st.total_ns().max(1) as f64;
    for (step, ns) in st.steps() {
        println!(
            "  | {step} | {:.1} | {:.1} % |",
            ns as f64 / 1e3 / n as f64,
            100.0 * ns as f64 / total
        );
    }
}

/// Aim 3's measure: the central events of every configuration reconstructed in turn,
/// round after round, each round's thread CPU time per input hit; the ratio of each
/// configuration to the spectrometer (or to the first configuration) is taken within a
/// round, so that what the machine does meanwhile weighs on both alike.
fn bench_per_hit(
    configs: &[(&str, &Detector, Vec<Vec<HitRecord>>)],
    overrides: &FinderOverrides,
    min_p: f64,
    rounds: usize,
) {
    if configs.is_empty() || configs.iter().any(|c| c.2.is_empty()) {
        eprintln!("--per-hit-rounds needs central events (--events) of at least one configuration");
        std::process::exit(1);
    }
    let mut recos: Vec<Reconstructor> = configs
        .iter()
        .map(|(_, det, _)| {
            Reconstructor::new(det, FinderConfig::from_detector_with(det, min_p, overrides))
        })
        .collect();
    let mut tracks = Vec::new();
    for (reco, (_, _, events)) in recos.iter_mut().zip(configs) {
        for hits in events.iter().take(2) {
            reco.reconstruct(hits, &mut tracks);
        }
    }
    let reference = configs
        .iter()
        .position(|c| c.0 == "spectrometer")
        .unwrap_or(0);
    // Per configuration, per round: CPU ns per hit and wall ns per hit.
    let mut cpu = vec![Vec::new(); configs.len()];
    let mut wall = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (k, (reco, (_, _, events))) in recos.iter_mut().zip(configs).enumerate() {
            let hits: usize = events.iter().map(|e| e.len()).sum();
            let (c0, w0) = (thread_cpu_s(), Instant::now());
            for ev in events {
                reco.reconstruct(ev, &mut tracks);
            }
            cpu[k].push((thread_cpu_s() - c0) * 1e9 / hits as f64);
            wall[k].push(w0.elapsed().as_secs_f64() * 1e9 / hits as f64);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        }
    };
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    println!(
        "\n# Central events per hit, {rounds} rounds of {} events per configuration, in turn: thread CPU time, and wall time",
        configs[0].2.len()
    );
    println!(
        "| configuration | hits/event | CPU ns/hit, median (min-max) | wall ns/hit, median | ratio to {}, median (min-max) |",
        configs[reference].0
    );
    println!("| --- | --- | --- | --- | --- |");
    for (k, (name, _, events)) in configs.iter().enumerate() {
        let hits = events.iter().map(|e| e.len()).sum::<usize>() as f64 / events.len() as f64;
        let ratios: Vec<f64> = cpu[k]
            .iter()
            .zip(&cpu[reference])
            .map(|(a, b)| a / b)
            .collect();
        let (lo, hi) = range(&cpu[k]);
        let (rlo, rhi) = range(&ratios);
        println!(
            "| {name} | {hits:.0} | {:.0} ({lo:.0}-{hi:.0}) | {:.0} | {:.2} ({rlo:.2}-{rhi:.2}) |",
            median(&cpu[k]),
            median(&wall[k]),
            median(&ratios)
        );
    }
}

fn bench_fits(det: &Detector, n_fits: usize, max_threads: usize, portable: bool) {
    // Real hit sets: the true hits of simulated central-event particles.
    let sim = SimConfig::preset(Preset::Central);
    let mut sets: Vec<Vec<FitHit>> = Vec::new();
    for ev in simulate_events(det, &sim, 9, 0, 2) {
        let mut by_particle: std::collections::BTreeMap<u64, Vec<FitHit>> = Default::default();
        for (h, t) in ev.hits.iter().zip(&ev.truth) {
            if t.particle_id != 0 {
                by_particle.entry(t.particle_id).or_default().push(FitHit {
                    plane: h.plane,
                    x_mm: h.x_mm,
                    y_mm: h.y_mm,
                });
            }
        }
        for (_, mut v) in by_particle {
            v.sort_by_key(|h| h.plane);
            if v.len() >= 4 {
                sets.push(v);
            }
        }
    }
    let refs: Vec<&[FitHit]> = sets.iter().map(|v| &v[..]).collect();
    let mean_hits = sets.iter().map(|v| v.len()).sum::<usize>() as f64 / sets.len().max(1) as f64;
    println!(
        "\nKalman fits: {} distinct hit sets, {:.1} hits each",
        sets.len(),
        mean_hits
    );
    // The kernel the fitter picks on this CPU, then the portable one for comparison.
    let best = KalmanFitter::new(det, FitConfig::from_detector(det));
    let mut kernels = vec![best.kernel()];
    if portable && best.kernel() != FitKernel::Portable {
        kernels.push(FitKernel::Portable);
    }
    for kernel in kernels {
        let fitter = best.clone().with_kernel(kernel);
        println!("  kernel {kernel:?}:");
        for threads in 1..=max_threads.max(1) {
            let per_thread = n_fits / threads;
            let t0 = Instant::now();
            // Each thread fits all hit sets into its own output buffer with the shared
            // fitter, and returns the CPU time it used.
            let cpu_s: f64 = std::thread::scope(|s| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        let (fitter, refs) = (&fitter, &refs);
                        s.spawn(move || {
                            let c0 = thread_cpu_s();
                            let mut out: Vec<FitOutput> = Vec::with_capacity(refs.len());
                            let mut done = 0;
                            let mut sink = 0.0;
                            while done < per_thread {
                                fitter.fit_batch(refs, &mut out);
                                sink += out[0].chi2;
                                done += refs.len();
                            }
                            std::hint::black_box(sink);
                            thread_cpu_s() - c0
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap_or(0.0)).sum()
            });
            let dt = t0.elapsed().as_secs_f64();
            let total = (per_thread.div_ceil(refs.len()) * refs.len() * threads) as f64;
            println!(
                "    {threads} thread(s): {:.2} M fits/s ({:.1} ns/fit per thread; {:.1} ns of thread CPU time per fit)",
                total / dt / 1e6,
                dt * 1e9 * threads as f64 / total,
                cpu_s * 1e9 / total
            );
        }
    }
}

/// CPU time of the calling thread, seconds (wall time where it cannot be read): on a
/// shared machine it shows the cost of the work without the time other processes held
/// the core.
fn thread_cpu_s() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}
