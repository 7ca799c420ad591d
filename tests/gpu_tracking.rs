//! The cellular automaton's steps on the GPU ([`trigd::gpu::tracking_ca`]) against the CPU
//! finder's, on fresh simulated events (minimum-bias and central) of the spectrometer
//! (`fixtures/detector.toml`, uniform field) and the field-map detectors of
//! `fixtures/tracking/` (dipole, forward): per event, the sorted hits and grid cells, the
//! doublets, triplets, neighbour links and CA levels of the GPU equal the CPU's full
//! search of the same pass (`find_doublets`, `find_triplets`, `find_neighbours`,
//! `evolve` with the same reach) element by element, floats to the bit; repeated runs
//! give the same bytes; an event beyond a limit is counted and handed back; an injected
//! device error fails the batch and leaves the engine usable; the launches recorded as
//! CUDA graphs and replayed give the tracks of the kernels launched one by one.
//!
//! Needs a CUDA GPU: every test is ignored in CI and runs on the device machine with
//! `--ignored --test-threads=1`, from the repository root (or with `TRIGD_FIXTURES`
//! naming the fixtures directory). `TRIGD_TEST_SEED` replays a run.

mod gpu_common;

use gpu_common::{device, load, minbias_spectrometer, seed};
use trigd::frame::HitRecord;
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::tracking_ca::{CaEventTracks, CaLimits, CaStep, GpuCaEngine};
use trigd::tracking::ca::{self, CaBuffers, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::kalman::{FitOutput, KalmanFitter};
use trigd::tracking::reco::FinderConfig;
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

/// The detectors: name, geometry, simulation of a class of events.
fn configurations(preset: Preset) -> Vec<(&'static str, Detector, SimConfig)> {
    vec![
        (
            "spectrometer, uniform field",
            load("detector.toml"),
            SimConfig::preset(preset),
        ),
        (
            "dipole spectrometer, field map",
            load("tracking/dipole/detector_dipole.toml"),
            SimConfig::preset(preset),
        ),
        (
            "forward tracker, field map",
            load("tracking/forward/detector_forward.toml"),
            SimConfig::forward(preset),
        ),
        (
            "telescope, no field",
            no_field(load("detector.toml")),
            SimConfig::preset(preset),
        ),
    ]
}

/// The detector without its field: a telescope, whose fit takes each track's momentum
/// from its scattering.
fn no_field(mut det: Detector) -> Detector {
    det.field = Field::Uniform { b_tesla: [0.0; 3] };
    det
}

/// The reaches of the finder's passes: the first pass's consecutive planes, and the
/// doublets over missing planes.
fn reaches(cfg: &FinderConfig) -> Vec<usize> {
    let mut r = vec![1];
    if cfg.allow_missing_plane && cfg.max_gap_planes > 0 {
        r.push((1 + cfg.max_gap_planes).min(ca::MAX_REACH));
    }
    r
}

/// The CPU finder's full search of one pass on an event's hits, in `buf`.
fn cpu_pass(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    hits: &[HitRecord],
    buf: &mut CaBuffers,
) {
    buf.overflow = Default::default();
    ca::hit_sorting::sort_hits(geo, hits, cfg.limits.max_hits, buf);
    ca::doublets::find_doublets(geo, cfg, reach, buf);
    ca::triplets::find_triplets(geo, cfg, reach, buf);
    ca::neighbours::find_neighbours(cfg, buf);
    ca::evolution::evolve(buf, geo.planes.len());
}

struct Totals {
    events: usize,
    doublets: usize,
    triplets: usize,
    links: usize,
    max_level: u16,
}

/// Runs `events` through the GPU engine and the CPU pass; asserts equality per event.
fn compare_batch(
    name: &str,
    engine: &mut GpuCaEngine,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    events: &[Vec<HitRecord>],
    buf: &mut CaBuffers,
) -> Totals {
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    let summary = engine.run(&batch).expect("the batch runs on the GPU");
    assert!(
        summary.failed.iter().all(|f| f.is_none()),
        "{name}: {summary:?}"
    );
    let mut t = Totals {
        events: 0,
        doublets: 0,
        triplets: 0,
        links: 0,
        max_level: 0,
    };
    for (e, hits) in events.iter().enumerate() {
        cpu_pass(geo, cfg, reach, hits, buf);
        assert!(
            !buf.overflow.any(),
            "{name}: the CPU overflowed: {:?}",
            buf.overflow
        );
        let gpu = engine
            .event_result(e)
            .expect("read back")
            .expect("the event did not fail");
        if let Some(d) = gpu.difference(buf) {
            panic!("{name}, reach {reach}, event {e}: {d}");
        }
        assert_eq!(summary.doublets[e] as usize, buf.doublets.len());
        assert_eq!(summary.triplets[e] as usize, buf.triplets.len());
        t.events += 1;
        t.doublets += buf.doublets.len();
        t.triplets += buf.triplets.len();
        t.links += buf.left.len();
        t.max_level = t
            .max_level
            .max(buf.level.iter().copied().max().unwrap_or(0));
    }
    t
}

fn agreement(preset: Preset, n_events: u64) {
    let dev = device();
    let s = seed();
    for (name, det, sim) in configurations(preset) {
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, s, 0, n_events)
            .map(|e| e.hits)
            .collect();
        // On every hit of a central event the doublets over missing planes are the CPU's
        // second pass's worst case, not its work (it searches the hits the first pass
        // left); the forward tracker's are few enough to compare.
        let mut rs = reaches(&cfg);
        if preset == Preset::Central && !name.starts_with("forward") {
            rs.truncate(1);
        }
        for reach in rs {
            let mut engine = GpuCaEngine::new(
                &dev,
                &geo,
                &cfg,
                reach,
                CaLimits::default(),
                &KernelCache::disabled(),
            )
            .expect("engine");
            let t = compare_batch(name, &mut engine, &geo, &cfg, reach, &events, &mut buf);
            println!(
                "agreement {preset:?} {name} reach {reach}: {} events equal to the bit: {} doublets, {} triplets, {} neighbour links, highest level {}",
                t.events, t.doublets, t.triplets, t.links, t.max_level
            );
            // Something was found: a comparison of empty arrays proves nothing.
            assert!(t.triplets > 0 && t.links > 0 && t.max_level >= 3, "{name}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn central_events_give_the_cpu_finders_doublets_triplets_neighbours_and_levels() {
    agreement(Preset::Central, 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn minimum_bias_events_give_the_cpu_finders_doublets_triplets_neighbours_and_levels() {
    agreement(Preset::Minbias, 40);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn repeated_runs_give_the_same_bytes() {
    let dev = device();
    let s = seed();
    let (_, det, sim) = configurations(Preset::Central).swap_remove(2);
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    // Central and minimum-bias events mixed in one batch.
    let mut events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, s, 0, 3)
        .map(|e| e.hits)
        .collect();
    let mb = SimConfig::forward(Preset::Minbias);
    events.extend(simulate_events(&det, &mb, s + 1, 0, 20).map(|e| e.hits));
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    let mut engine = GpuCaEngine::new(
        &dev,
        &geo,
        &cfg,
        2,
        CaLimits::default(),
        &KernelCache::disabled(),
    )
    .expect("engine");
    let mut first: Option<Vec<Vec<u32>>> = None;
    for run in 0..5 {
        let summary = engine.run(&batch).expect("batch");
        assert!(summary.failed.iter().all(|f| f.is_none()));
        let words: Vec<Vec<u32>> = (0..events.len())
            .map(|e| engine.event_result(e).unwrap().unwrap().to_words())
            .collect();
        match &first {
            None => first = Some(words),
            Some(f) => assert!(*f == words, "run {run} differs from the first"),
        }
    }
    let words: usize = first.unwrap().iter().map(|w| w.len()).sum();
    println!(
        "determinism: 5 runs of {} events, {words} words each, identical",
        events.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_event_beyond_a_limit_is_counted_and_handed_back_to_the_cpu() {
    let dev = device();
    let s = seed();
    let det = load("detector.toml");
    let mut cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let central: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Central), s, 0, 2)
            .map(|e| e.hits)
            .collect();
    let minbias: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Minbias), s + 1, 0, 6)
            .map(|e| e.hits)
            .collect();
    // Minimum-bias, central, minimum-bias ...: the central events overflow.
    let mut events = minbias[..3].to_vec();
    events.push(central[0].clone());
    events.extend_from_slice(&minbias[3..]);
    events.push(central[1].clone());
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);

    // 1. The batch's doublet arena holds the minimum-bias events but not a central one.
    let mut mb_doublets = 0;
    for hits in &minbias {
        cpu_pass(&geo, &cfg, 1, hits, &mut buf);
        mb_doublets += buf.doublets.len();
    }
    cpu_pass(&geo, &cfg, 1, &central[0], &mut buf);
    let central_doublets = buf.doublets.len();
    assert!(
        central_doublets > mb_doublets,
        "{central_doublets} {mb_doublets}"
    );
    let limits = CaLimits {
        max_doublets: mb_doublets + central_doublets / 2,
        ..CaLimits::default()
    };
    let mut engine =
        GpuCaEngine::new(&dev, &geo, &cfg, 1, limits, &KernelCache::disabled()).expect("engine");
    let summary = engine.run(&batch).expect("batch");
    let failed: Vec<usize> = (0..events.len())
        .filter(|&e| summary.failed[e].is_some())
        .collect();
    assert_eq!(failed, vec![3, 7], "{summary:?}");
    assert_eq!(summary.failed[3], Some(CaStep::Doublets));
    assert_eq!(summary.overflow, [0, 2, 0, 0, 0]);
    assert_eq!(summary.doublets[3], 0);
    assert!(engine.event_result(3).unwrap().is_none());
    // The others are the CPU's; the failed ones go to the CPU path, which finds them whole.
    for (e, hits) in events.iter().enumerate() {
        cpu_pass(&geo, &cfg, 1, hits, &mut buf);
        match engine.event_result(e).unwrap() {
            Some(gpu) => assert_eq!(gpu.difference(&buf), None, "event {e}"),
            None => assert!(!buf.overflow.any() && buf.triplets.len() > 1000),
        }
    }
    println!(
        "overflow: doublet arena of {} for {} + {} doublets: events {failed:?} failed at {:?}, counted {:?}, the others equal the CPU",
        limits.max_doublets, mb_doublets, central_doublets, summary.failed[3], summary.overflow
    );

    // 2. The CPU finder's own per-event hit limit: the central events fail at hit sorting
    // (the CPU would drop hits; the event goes to the CPU path, which counts that).
    let n_mb_max = minbias.iter().map(|e| e.len()).max().unwrap();
    cfg.limits.max_hits = n_mb_max;
    let geo = FinderGeometry::new(&det, &cfg);
    let mut engine = GpuCaEngine::new(
        &dev,
        &geo,
        &cfg,
        1,
        CaLimits::default(),
        &KernelCache::disabled(),
    )
    .expect("engine");
    let summary = engine.run(&batch).expect("batch");
    assert_eq!(summary.failed[3], Some(CaStep::Hits));
    assert_eq!(summary.failed[7], Some(CaStep::Hits));
    assert_eq!(summary.overflow, [2, 0, 0, 0, 0]);
    for (e, hits) in events.iter().enumerate() {
        cpu_pass(&geo, &cfg, 1, hits, &mut buf);
        match engine.event_result(e).unwrap() {
            Some(gpu) => assert_eq!(gpu.difference(&buf), None, "event {e}"),
            None => assert!(buf.overflow.hits > 0, "event {e}"),
        }
    }
    println!(
        "overflow: per-event hit limit {n_mb_max}: central events failed at hits, counted {:?}",
        summary.overflow
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_error_fails_the_batch_and_the_next_batch_runs() {
    let dev = device();
    let s = seed();
    let det = load("detector.toml");
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let events: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Minbias), s, 0, 8)
            .map(|e| e.hits)
            .collect();
    let mut engine = GpuCaEngine::new(
        &dev,
        &geo,
        &cfg,
        2,
        CaLimits::default(),
        &KernelCache::disabled(),
    )
    .expect("engine");
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    engine.inject_device_error();
    let err = engine
        .run(&batch)
        .expect_err("the injected fault fails the batch");
    assert!(err.to_string().contains("cuLaunchKernel"), "{err}");
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let t = compare_batch(
        "after a device error",
        &mut engine,
        &geo,
        &cfg,
        2,
        &events,
        &mut buf,
    );
    assert_eq!(t.events, 8);
    println!("device error: {err}; the next batch equals the CPU");
}

/// The CPU's accepted tracks of the candidate step on `buf` (after [`cpu_pass`]): hits as
/// the event's input indices, upstream first, and the fit; and the used flags per input
/// hit.
fn cpu_select(
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    buf: &mut CaBuffers,
    n_input: usize,
    min_hits: usize,
    append: bool,
) -> (Vec<(Vec<u32>, FitOutput)>, Vec<bool>) {
    ca::candidates::extract_and_select(cfg, fitter, buf, min_hits, append);
    let tracks = buf
        .accepted
        .iter()
        .map(|&k| {
            let c = &buf.candidates[k as usize];
            let hits = buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
                .iter()
                .map(|&h| buf.hits.input_index[h as usize])
                .collect();
            (hits, buf.fits[c.fit as usize])
        })
        .collect();
    let mut used = vec![false; n_input];
    for (h, &u) in buf.hits.used.iter().enumerate() {
        used[buf.hits.input_index[h] as usize] = u;
    }
    (tracks, used)
}

/// Whether two fits agree within single-precision tolerance (1e-4 relative).
fn fits_agree(g: &FitOutput, c: &FitOutput) -> Result<(), String> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1e-2);
    if g.ndf != c.ndf || g.ok != c.ok {
        return Err(format!(
            "ndf/ok GPU {}/{}, CPU {}/{}",
            g.ndf, g.ok, c.ndf, c.ok
        ));
    }
    if !close(g.chi2, c.chi2) || !close(g.z_mm, c.z_mm) {
        return Err(format!("chi2 GPU {}, CPU {}", g.chi2, c.chi2));
    }
    for i in 0..5 {
        if !close(g.state[i], c.state[i]) {
            return Err(format!("state[{i}] GPU {:?}, CPU {:?}", g.state, c.state));
        }
    }
    Ok(())
}

#[derive(Default)]
struct TrackTotals {
    tracks: usize,
    differ: usize,
    used_differ: usize,
    hits: usize,
    max_chi2_rel: f64,
}

/// Compares one event's accepted tracks: counts the tracks whose hit lists the other side
/// lacks, checks the fits of the tracks both have, and the used flags.
fn compare_tracks(
    what: &str,
    gpu: &CaEventTracks,
    cpu: &(Vec<(Vec<u32>, FitOutput)>, Vec<bool>),
    t: &mut TrackTotals,
) {
    let (cpu_tracks, cpu_used) = cpu;
    let mut differ = 0;
    let mut first: Option<String> = None;
    for (i, (hits, fit)) in cpu_tracks.iter().enumerate() {
        match gpu.tracks.iter().find(|g| &g.hits == hits) {
            Some(g) => {
                if let Err(m) = fits_agree(&g.fit, fit) {
                    panic!("{what}: track {i} {hits:?}: {m}");
                }
                let rel = (g.fit.chi2 - fit.chi2).abs() / fit.chi2.abs().max(1e-2);
                t.max_chi2_rel = t.max_chi2_rel.max(rel);
            }
            None => {
                differ += 1;
                first.get_or_insert_with(|| format!("CPU track {i} {hits:?} not on the GPU"));
            }
        }
    }
    let gpu_only = gpu
        .tracks
        .iter()
        .filter(|g| !cpu_tracks.iter().any(|(h, _)| *h == g.hits))
        .count();
    let differ = differ.max(gpu_only);
    let used_differ = gpu
        .used
        .iter()
        .zip(cpu_used)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(gpu.used.len(), cpu_used.len(), "{what}");
    if differ == 0 {
        // Same tracks: same order of acceptance and the same hits used.
        let g: Vec<&Vec<u32>> = gpu.tracks.iter().map(|t| &t.hits).collect();
        let c: Vec<&Vec<u32>> = cpu_tracks.iter().map(|t| &t.0).collect();
        assert_eq!(g, c, "{what}: acceptance order");
        assert_eq!(used_differ, 0, "{what}: used flags");
    } else {
        eprintln!(
            "{what}: {differ} of {} tracks differ (GPU {}), {used_differ} used flags: {}",
            cpu_tracks.len(),
            gpu.tracks.len(),
            first.unwrap_or_default()
        );
    }
    t.tracks += cpu_tracks.len();
    t.differ += differ;
    t.used_differ += used_differ;
    t.hits += cpu_tracks.iter().map(|(h, _)| h.len()).sum::<usize>();
}

/// One pass of the full search with reach 1 and `cfg.min_hits` on the GPU, then the
/// candidate step (`append` false, then a second call with `append` true on the same
/// arrays), against the CPU's; twice, for the same bytes.
fn candidate_agreement(preset: Preset, n_events: u64) {
    let dev = device();
    let s = seed();
    // The first calls' tracks the candidate step's second round chose (`divert_chains`,
    // in central events of the dipole map): the comparison covers them.
    let mut diverted = 0usize;
    for (name, det, sim) in configurations(preset) {
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let fitter = KalmanFitter::new(&det, cfg.candidate_fit());
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, s, 0, n_events)
            .map(|e| e.hits)
            .collect();
        let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
        let mut engine = GpuCaEngine::with_fitter(
            &dev,
            &geo,
            &cfg,
            &fitter,
            1,
            CaLimits::default(),
            &KernelCache::disabled(),
        )
        .expect("engine");
        let min_hits = cfg.min_hits;
        let mut words: Option<Vec<Vec<u32>>> = None;
        let mut totals = [TrackTotals::default(), TrackTotals::default()];
        let first_round = FinderConfig {
            divert_chains: false,
            ..cfg.clone()
        };
        for run in 0..2 {
            let summary = engine.run(&batch).expect("the batch runs on the GPU");
            assert!(
                summary.failed.iter().all(|f| f.is_none()),
                "{name}: {summary:?}"
            );
            let first = engine
                .select_candidates(min_hits, false)
                .expect("candidates");
            assert!(
                first.failed.iter().all(|f| f.is_none()),
                "{name}: {first:?}"
            );
            let gpu_first: Vec<CaEventTracks> = (0..events.len())
                .map(|e| engine.event_tracks(e).unwrap().expect("not failed"))
                .collect();
            let again = engine.select_candidates(min_hits, true).expect("append");
            assert!(
                again.failed.iter().all(|f| f.is_none()),
                "{name}: {again:?}"
            );
            let w: Vec<Vec<u32>> = (0..events.len())
                .map(|e| engine.event_tracks(e).unwrap().unwrap().to_words())
                .collect();
            match &words {
                None => words = Some(w),
                Some(f) => {
                    assert!(*f == w, "{name}: run {run} differs from the first");
                    continue;
                }
            }
            for (e, hits) in events.iter().enumerate() {
                cpu_pass(&geo, &cfg, 1, hits, &mut buf);
                let one_round =
                    cpu_select(&first_round, &fitter, &mut buf, hits.len(), min_hits, false);
                cpu_pass(&geo, &cfg, 1, hits, &mut buf);
                let cpu = cpu_select(&cfg, &fitter, &mut buf, hits.len(), min_hits, false);
                diverted += cpu.0.len().saturating_sub(one_round.0.len());
                assert!(!buf.overflow.any(), "{name}: the CPU overflowed");
                let what = format!("{name}, event {e}");
                compare_tracks(&what, &gpu_first[e], &cpu, &mut totals[0]);
                assert_eq!(first.tracks[e] as usize, gpu_first[e].tracks.len());
                let cpu2 = cpu_select(&cfg, &fitter, &mut buf, hits.len(), min_hits, true);
                let gpu2 = engine.event_tracks(e).unwrap().unwrap();
                compare_tracks(&format!("{what}, appended"), &gpu2, &cpu2, &mut totals[1]);
            }
        }
        for (pass, t) in ["first call", "appended call"].iter().zip(&totals) {
            println!(
                "candidates {preset:?} {name} ({pass}): {} events, {} CPU tracks of {} hits, {} differ, {} used flags differ, largest chi2 difference {:.2e} (relative); 2 runs identical",
                events.len(), t.tracks, t.hits, t.differ, t.used_differ, t.max_chi2_rel
            );
            assert!(
                t.differ * 1000 <= t.tracks,
                "{name}: {} of {} tracks differ",
                t.differ,
                t.tracks
            );
        }
        assert!(totals[0].tracks > 0, "{name}: no track found");
    }
    println!("candidates {preset:?}: {diverted} tracks more with the second round");
    if preset == Preset::Central {
        assert!(diverted > 0, "the second round chose no track");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn minimum_bias_events_give_the_cpu_finders_accepted_tracks() {
    candidate_agreement(Preset::Minbias, 40);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn central_events_give_the_cpu_finders_accepted_tracks() {
    candidate_agreement(Preset::Central, 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_event_beyond_the_candidate_limit_is_counted_and_handed_back_to_the_cpu() {
    let dev = device();
    let s = seed();
    let det = load("detector.toml");
    let mut cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let fitter = KalmanFitter::new(&det, cfg.fit.clone());
    let central: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Central), s, 0, 2)
            .map(|e| e.hits)
            .collect();
    let minbias: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Minbias), s + 1, 0, 6)
            .map(|e| e.hits)
            .collect();
    let mut events = minbias[..3].to_vec();
    events.push(central[0].clone());
    events.extend_from_slice(&minbias[3..]);
    events.push(central[1].clone());
    // A candidate limit that the minimum-bias events stay under and the central ones
    // exceed (candidates and their hits: the CPU's capacity is 16 hits per candidate,
    // and extraction keeps half of it free).
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let (mut most, mut most_hits) = (0, 0);
    for hits in &minbias {
        cpu_pass(&geo, &cfg, 1, hits, &mut buf);
        ca::candidates::extract_and_select(&cfg, &fitter, &mut buf, cfg.min_hits, false);
        most = most.max(buf.candidates.len());
        most_hits = most_hits.max(buf.candidate_hits.len());
    }
    cfg.limits.max_candidates = (most + 8).max((most_hits + 2 * 64) / 8 + 1);
    let geo = FinderGeometry::new(&det, &cfg);
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let mut engine = GpuCaEngine::with_fitter(
        &dev,
        &geo,
        &cfg,
        &fitter,
        1,
        CaLimits::default(),
        &KernelCache::disabled(),
    )
    .expect("engine");
    let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
    let summary = engine.run(&batch).expect("batch");
    assert!(summary.failed.iter().all(|f| f.is_none()), "{summary:?}");
    let summary = engine
        .select_candidates(cfg.min_hits, false)
        .expect("candidates");
    let failed: Vec<usize> = (0..events.len())
        .filter(|&e| summary.failed[e].is_some())
        .collect();
    assert_eq!(failed, vec![3, 7], "{summary:?}");
    assert_eq!(summary.failed[3], Some(CaStep::Candidates));
    assert_eq!(summary.overflow, [0, 0, 0, 0, 2]);
    assert_eq!(summary.tracks[3], 0);
    let mut t = TrackTotals::default();
    for (e, hits) in events.iter().enumerate() {
        cpu_pass(&geo, &cfg, 1, hits, &mut buf);
        let cpu = cpu_select(&cfg, &fitter, &mut buf, hits.len(), cfg.min_hits, false);
        match engine.event_tracks(e).unwrap() {
            Some(gpu) => {
                assert!(!buf.overflow.any(), "event {e}: {:?}", buf.overflow);
                compare_tracks(&format!("event {e}"), &gpu, &cpu, &mut t);
            }
            None => assert!(buf.overflow.candidates > 0, "event {e}: {:?}", buf.overflow),
        }
    }
    assert_eq!(t.differ, 0);
    println!(
        "candidate limit {} per event: events {failed:?} failed at {:?}, counted {:?}; the CPU overflows on them too; the others' {} tracks equal the CPU's",
        cfg.limits.max_candidates, summary.failed[3], summary.overflow, t.tracks
    );
}

/// `daemon.gpu_wait`: each way of waiting is set on the device's primary context when a
/// tracker opens it (also while the context is active, from an earlier open), and a
/// tracker's launches under each give the same tracks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn each_gpu_wait_is_set_on_the_device_and_gives_the_same_tracks() {
    use cudarc::driver::sys::CUctx_flags as F;
    use trigd::config::GpuWait;
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    let dev = device();
    let (det, cfg, events) = minbias_spectrometer(16);
    let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    type Keys = Vec<Vec<(Vec<u32>, u32)>>;
    let mut first: Option<Keys> = None;
    for (wait, flag) in [
        (GpuWait::Spin, F::CU_CTX_SCHED_SPIN),
        (GpuWait::Block, F::CU_CTX_SCHED_BLOCKING_SYNC),
        (GpuWait::Yield, F::CU_CTX_SCHED_YIELD),
    ] {
        trigd::gpu::set_wait(wait);
        let mut tracker =
            GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, 16)).expect("tracker");
        assert_eq!(
            trigd::gpu::primary_wait_flag(dev.ordinal),
            Some(flag as u32),
            "{wait:?} on the device"
        );
        let (mut out, mut back) = (Vec::new(), Vec::new());
        tracker
            .reconstruct_batch(&views, &mut out, &mut back)
            .expect("launch");
        assert!(back.iter().all(Option::is_none));
        let keys: Keys = out
            .iter()
            .map(|ts| {
                ts.iter()
                    .map(|t| (t.hits.clone(), t.chi2.to_bits()))
                    .collect()
            })
            .collect();
        assert!(keys.iter().any(|k| !k.is_empty()));
        match &first {
            None => first = Some(keys),
            Some(f) => assert_eq!(&keys, f, "{wait:?}: the same tracks"),
        }
    }
    // The default again, for the tests after this one in the same process.
    trigd::gpu::set_wait(GpuWait::Auto);
    let _tracker =
        GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, 16)).expect("tracker");
    assert_eq!(
        trigd::gpu::primary_wait_flag(dev.ordinal),
        Some(F::CU_CTX_SCHED_AUTO as u32),
        "the driver's choice again"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_graphs_give_the_tracks_of_kernels_launched_one_by_one() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    let dev = device();
    let (det, cfg, mut events) = minbias_spectrometer(12);
    // Two central events among them: every pass and both candidate rounds have work.
    events.extend(
        simulate_events(&det, &SimConfig::preset(Preset::Central), seed() + 1, 0, 2)
            .map(|e| e.hits),
    );
    let all: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    type Keys = Vec<Vec<(Vec<u32>, u32)>>;
    let keys = |out: &[Vec<trigd::tracking::track::Track>], n: usize| -> Keys {
        out[..n]
            .iter()
            .map(|ts| {
                ts.iter()
                    .map(|t| (t.hits.clone(), t.chi2.to_bits()))
                    .collect()
            })
            .collect()
    };
    let limits = TrackerLimits::for_batch(&cfg, all.len());
    let mut direct = GpuTracker::new(&dev, &det, &cfg, limits).expect("tracker");
    direct.set_graphs(false);
    let mut graphs = GpuTracker::new(&dev, &det, &cfg, limits).expect("tracker");
    // Batches of two sizes in turn: each size's sequences recorded once, then replayed,
    // with the scans' epochs moving on between replays.
    let batches: [&[&[HitRecord]]; 5] = [&all, &all[4..], &all, &all[4..], &all];
    let (mut out, mut back) = (Vec::new(), Vec::new());
    for (i, batch) in batches.iter().enumerate() {
        direct
            .reconstruct_batch(batch, &mut out, &mut back)
            .expect("launch");
        assert!(back.iter().all(Option::is_none));
        let want = keys(&out, batch.len());
        assert!(want.iter().filter(|k| !k.is_empty()).count() >= batch.len() / 2);
        graphs
            .reconstruct_batch(batch, &mut out, &mut back)
            .expect("launch");
        assert!(back.iter().all(Option::is_none));
        assert!(
            keys(&out, batch.len()) == want,
            "batch {i}: the tracks of the direct launches"
        );
        let (d, g) = (direct.last_times(), graphs.last_times());
        assert_eq!(d.kernels, g.kernels, "batch {i}: the same kernels");
        println!(
            "batch {i} of {} events: host in kernel launches {:.3} ms direct, {:.3} ms replayed ({} kernels)",
            batch.len(),
            d.enqueue_ms,
            g.enqueue_ms,
            g.kernels
        );
    }
    // The second tracker replayed recordings (none failed), the first launched directly.
    assert!(graphs.recorded_graphs() > 0, "no sequence recorded");
    assert_eq!(direct.recorded_graphs(), 0);
}
