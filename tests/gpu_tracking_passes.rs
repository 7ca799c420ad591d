//! The two passes of the finder on the GPU ([`trigd::gpu::tracking_ca`]) against the CPU
//! finder's: the first pass on consecutive planes with its dead ends dropped
//! (`prune_dead_ends`: chains that can neither reach the last plane nor leave the
//! detector), and the later pass over missing planes on the hits the first pass's tracks
//! left (the CPU's used marks handed to the device), on fresh simulated events of the
//! spectrometer (uniform field) and the dipole and forward field maps. Per event the
//! sorted hits, doublets, triplets, neighbour links and levels equal the CPU's, to the bit.
//!
//! Needs a CUDA GPU: ignored in CI; on the device machine run with
//! `--ignored --test-threads=1` from the repository root. `TRIGD_TEST_SEED` replays a run.

mod gpu_common;

use gpu_common::{device, load, minbias_spectrometer, seed};
use trigd::frame::HitRecord;
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::tracking_ca::{CaLimits, GpuCaEngine, PassOptions};
use trigd::tracking::ca::{self, CaBuffers, FinderGeometry};
use trigd::tracking::geometry::Detector;
use trigd::tracking::kalman::KalmanFitter;
use trigd::tracking::reco::FinderConfig;
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

fn configurations(preset: Preset) -> Vec<(&'static str, Detector, SimConfig)> {
    vec![
        (
            "spectrometer",
            load("detector.toml"),
            SimConfig::preset(preset),
        ),
        (
            "dipole",
            load("tracking/dipole/detector_dipole.toml"),
            SimConfig::preset(preset),
        ),
        (
            "forward",
            load("tracking/forward/detector_forward.toml"),
            SimConfig::forward(preset),
        ),
    ]
}

/// The first plane on which the first pass's chains may end (as `Reconstructor`).
fn first_end_plane(cfg: &FinderConfig, n_planes: usize) -> usize {
    let seed_planes = (n_planes + 1).saturating_sub(cfg.first_pass_min_hits.max(3));
    n_planes - seed_planes.min(n_planes)
}

struct Counts {
    events: usize,
    pruned: usize,
    triplets: [usize; 2],
    used: usize,
}

fn two_passes(preset: Preset, n_events: u64) {
    let dev = device();
    let s = seed();
    for (name, det, sim) in configurations(preset) {
        let cfg = FinderConfig {
            first_pass_to_last_plane: true,
            ..FinderConfig::from_detector(&det, 1.0)
        };
        let n_planes = det.planes.len();
        assert!(
            cfg.allow_missing_plane && cfg.max_gap_planes > 0,
            "{name}: the finder makes a second pass"
        );
        let reach2 = (1 + cfg.max_gap_planes).min(ca::MAX_REACH);
        let geo = FinderGeometry::new(&det, &cfg);
        let fitter = KalmanFitter::new(&det, cfg.fit.clone());
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, s, 0, n_events)
            .map(|e| e.hits)
            .collect();
        let batch: Vec<&[HitRecord]> = events.iter().map(|e| &e[..]).collect();
        let mut engine = GpuCaEngine::with_passes(
            &dev,
            &geo,
            &cfg,
            None,
            &[1, reach2],
            CaLimits::default(),
            &KernelCache::disabled(),
        )
        .expect("engine");
        let end_plane = first_end_plane(&cfg, n_planes);
        let first = PassOptions {
            pass: 0,
            dead_ends_from_plane: Some(end_plane),
            skip_used: false,
        };
        let summary = engine.run_first(&batch, first).expect("first pass");
        assert!(summary.failed.iter().all(Option::is_none), "{name}");
        // The CPU's first pass, event by event; its tracks' hits are the used marks of the
        // second.
        let mut used = Vec::new();
        let mut c = Counts {
            events: 0,
            pruned: 0,
            triplets: [0, 0],
            used: 0,
        };
        for (e, hits) in events.iter().enumerate() {
            buf.overflow = Default::default();
            ca::hit_sorting::sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
            ca::doublets::find_doublets(&geo, &cfg, 1, &mut buf);
            ca::triplets::find_triplets(&geo, &cfg, 1, &mut buf);
            c.pruned += ca::triplets::prune_dead_ends(&geo, end_plane, &mut buf);
            ca::neighbours::find_neighbours(&cfg, &mut buf);
            ca::evolution::evolve(&mut buf, n_planes);
            assert!(!buf.overflow.any(), "{name}: the CPU overflowed");
            let gpu = engine.event_result(e).expect("read").expect("not failed");
            if let Some(d) = gpu.difference(&buf) {
                panic!("{name} {preset:?}, first pass, event {e}: {d}");
            }
            c.triplets[0] += buf.triplets.len();
            ca::candidates::extract_and_select(
                &cfg,
                &fitter,
                &mut buf,
                cfg.first_pass_min_hits,
                false,
            );
            c.used += buf.hits.used.iter().filter(|&&u| u).count();
            // The device keeps the marks by input hit.
            let mut by_input = vec![false; hits.len()];
            for (h, &u) in buf.hits.used.iter().enumerate() {
                by_input[buf.hits.input_index[h] as usize] = u;
            }
            used.push((buf.hits.used.clone(), by_input));
        }
        let by_input: Vec<Vec<bool>> = used.iter().map(|u| u.1.clone()).collect();
        engine.set_used(&by_input).expect("used marks up");
        let later = PassOptions {
            pass: 1,
            dead_ends_from_plane: None,
            skip_used: true,
        };
        let summary = engine.run_pass(later).expect("later pass");
        assert!(summary.failed.iter().all(Option::is_none), "{name}");
        for (e, hits) in events.iter().enumerate() {
            buf.overflow = Default::default();
            ca::hit_sorting::sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
            buf.hits.used.copy_from_slice(&used[e].0);
            ca::doublets::find_doublets(&geo, &cfg, reach2, &mut buf);
            ca::triplets::find_triplets(&geo, &cfg, reach2, &mut buf);
            ca::neighbours::find_neighbours(&cfg, &mut buf);
            ca::evolution::evolve(&mut buf, n_planes);
            let gpu = engine.event_result(e).expect("read").expect("not failed");
            if let Some(d) = gpu.difference(&buf) {
                panic!("{name} {preset:?}, later pass (reach {reach2}), event {e}: {d}");
            }
            c.triplets[1] += buf.triplets.len();
            c.events += 1;
        }
        println!(
            "{name} {preset:?}: {} events equal to the bit in both passes: first pass {} triplets ({} dead ends dropped), {} hits used, later pass {} triplets",
            c.events, c.triplets[0], c.pruned, c.used, c.triplets[1]
        );
        // Both passes and the pruning had work: equal empty arrays prove nothing.
        assert!(
            c.triplets[0] > 0 && c.triplets[1] > 0 && c.used > 0,
            "{name}"
        );
        assert!(c.pruned > 0, "{name}: no dead end was dropped");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn minimum_bias_events_give_the_cpu_finders_two_passes() {
    two_passes(Preset::Minbias, 200);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn central_events_give_the_cpu_finders_two_passes() {
    two_passes(Preset::Central, 3);
}

/// Sorted (hits, chi-square bits) of each track: the assignment and the fit's result.
fn track_key(tracks: &[trigd::tracking::track::Track]) -> Vec<(Vec<u32>, u32)> {
    let mut v: Vec<_> = tracks
        .iter()
        .map(|t| (t.hits.clone(), t.chi2.to_bits()))
        .collect();
    v.sort();
    v
}

/// The whole finder on the GPU (`GpuTracker`: both passes, candidates, fits, clones)
/// against `Reconstructor::reconstruct` on every event: the same tracks (hit lists) and
/// fits (state and chi-square within float32 tolerance); a second run of the same batch
/// gives the same tracks in the same order. With `exchange`, the finder exchanges segments
/// between crossing tracks ([`FinderConfig::exchange_segments`], on the host for the GPU),
/// and some event's tracks must differ from the finder's without it.
/// The steps after clone suppression the host runs on the GPU's tracks, off by default.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HostStep {
    None,
    Exchange,
    FirstHits,
    /// The exchange of segments, then the first hits against the origin, both on the
    /// device one after the other.
    ExchangeFirstHits,
    /// No host step: the beam 3 mm off the axis in x and 2 mm in y, the finder's origin
    /// centred on it (and the finder centred on the axis the one to differ from).
    OffAxis,
    /// No host step: a target [`LONG_HALF_MM`] either side of z = 0 and the finder's
    /// origin as long (and the thin origin the one to differ from).
    LongTarget,
}

/// The target's half length of [`HostStep::LongTarget`], mm.
const LONG_HALF_MM: f64 = 40.0;

/// The beam's centre of [`HostStep::OffAxis`], mm.
const OFF_AXIS_MM: [f64; 2] = [3.0, -2.0];

fn end_to_end(preset: Preset, n_events: u64, launch: usize, step: HostStep) {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let s = seed();
    for (name, det, mut sim) in configurations(preset) {
        let mut cfg = if step == HostStep::LongTarget {
            sim.target_thickness_mm = 2.0 * LONG_HALF_MM;
            let ov = trigd::tracking::reco::FinderOverrides {
                origin_half_z_mm: Some(LONG_HALF_MM),
                ..Default::default()
            };
            FinderConfig::from_detector_with(&det, 1.0, &ov)
        } else {
            FinderConfig::from_detector(&det, 1.0)
        };
        cfg.exchange_segments = matches!(step, HostStep::Exchange | HostStep::ExchangeFirstHits);
        cfg.first_hits_to_origin =
            matches!(step, HostStep::FirstHits | HostStep::ExchangeFirstHits);
        if step == HostStep::OffAxis {
            sim.beam_centre_mm = OFF_AXIS_MM;
            cfg.origin_x_mm = OFF_AXIS_MM[0];
            cfg.origin_y_mm = OFF_AXIS_MM[1];
        }
        let events: Vec<Vec<HitRecord>> = simulate_events(&det, &sim, s, 0, n_events)
            .map(|e| e.hits)
            .collect();
        let mut tracker = GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, launch))
            .expect("tracker");
        assert_eq!(
            tracker.first_hits_on_device(),
            cfg.first_hits_to_origin,
            "{name}: the first hits are chosen on the device"
        );
        assert_eq!(
            tracker.exchange_on_device(),
            cfg.exchange_segments,
            "{name}: the segments are exchanged on the device"
        );
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let mut reco_without = Reconstructor::new(
            &det,
            FinderConfig {
                exchange_segments: false,
                first_hits_to_origin: false,
                origin_x_mm: 0.0,
                origin_y_mm: 0.0,
                origin_half_z_mm: 0.0,
                ..cfg.clone()
            },
        );
        let (mut without, mut changed) = (Vec::new(), 0usize);
        let (mut out, mut back, mut again, mut back2, mut cpu) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut n_tracks, mut differ, mut handed_back, mut worst) = (0usize, 0usize, 0, 0f64);
        for chunk in events.chunks(launch) {
            let views: Vec<&[HitRecord]> = chunk.iter().map(Vec::as_slice).collect();
            tracker
                .reconstruct_batch(&views, &mut out, &mut back)
                .expect("launch");
            tracker
                .reconstruct_batch(&views, &mut again, &mut back2)
                .expect("launch again");
            assert_eq!(back, back2, "{name}: the same events handed back");
            for (k, ev) in chunk.iter().enumerate() {
                if back[k].is_some() {
                    handed_back += 1;
                    continue;
                }
                let same_order = out[k].len() == again[k].len()
                    && out[k]
                        .iter()
                        .zip(&again[k])
                        .all(|(a, b)| a.hits == b.hits && a.chi2.to_bits() == b.chi2.to_bits());
                assert!(
                    same_order,
                    "{name}: a repeated launch gives the same tracks in order"
                );
                reco.reconstruct(ev, &mut cpu);
                n_tracks += cpu.len();
                if step != HostStep::None {
                    reco_without.reconstruct(ev, &mut without);
                    changed += cpu
                        .iter()
                        .zip(&without)
                        .filter(|(a, b)| a.hits != b.hits)
                        .count();
                }
                let (g, c) = (track_key(&out[k]), track_key(&cpu));
                let gh: std::collections::HashSet<&Vec<u32>> = g.iter().map(|t| &t.0).collect();
                differ += c.iter().filter(|t| !gh.contains(&t.0)).count();
                // Fits of the tracks with the same hits.
                for t in &out[k] {
                    if let Some(ct) = cpu.iter().find(|c| c.hits == t.hits) {
                        let rel = |a: f32, b: f32| ((a - b).abs() / b.abs().max(1e-3)) as f64;
                        worst = worst
                            .max(rel(t.chi2, ct.chi2))
                            .max(rel(t.state.qop, ct.state.qop))
                            .max(rel(t.state.tx, ct.state.tx))
                            .max(rel(t.state.x_mm, ct.state.x_mm));
                    }
                }
            }
        }
        println!(
            "{name} {preset:?}: {} events ({handed_back} handed back), {n_tracks} CPU tracks, {differ} without a GPU track of the same hits, worst relative difference of a fitted value {worst:.2e}, {changed} tracks changed by the host's step ({step:?})",
            events.len()
        );
        assert!(n_tracks > 0, "{name}");
        assert!(
            step == HostStep::None || changed > 0,
            "{name}: no track changed by {step:?}"
        );
        assert!(
            (differ as f64) <= 1e-3 * n_tracks as f64,
            "{name}: {differ} of {n_tracks} tracks differ"
        );
        assert!(worst <= 1e-4, "{name}: fits differ by {worst}");
        assert!(
            handed_back * 10 <= events.len(),
            "{name}: {handed_back} handed back"
        );
        if step != HostStep::None {
            assert_eq!(
                handed_back, 0,
                "{name}: events within the steps' limits ({step:?})"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_on_minimum_bias_events_gives_the_cpus_tracks() {
    end_to_end(Preset::Minbias, 1000, 256, HostStep::None);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_on_central_events_gives_the_cpus_tracks() {
    end_to_end(Preset::Central, 12, 12, HostStep::None);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_with_the_exchange_of_segments_gives_the_cpus_tracks() {
    end_to_end(Preset::Central, 12, 12, HostStep::Exchange);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_with_the_exchange_then_the_first_hits_gives_the_cpus_tracks() {
    end_to_end(Preset::Central, 12, 12, HostStep::ExchangeFirstHits);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_with_the_first_hits_against_the_origin_gives_the_cpus_tracks() {
    end_to_end(Preset::Central, 12, 12, HostStep::FirstHits);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_with_the_origin_off_the_axis_gives_the_cpus_tracks() {
    end_to_end(Preset::Minbias, 200, 100, HostStep::OffAxis);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_whole_finder_with_a_long_origin_gives_the_cpus_tracks() {
    end_to_end(Preset::Minbias, 200, 100, HostStep::LongTarget);
    end_to_end(Preset::Central, 12, 12, HostStep::LongTarget);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_error_fails_the_launch_and_the_next_runs_and_overflows_are_handed_back() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    let dev = device();
    let (det, cfg, events) = minbias_spectrometer(64);
    let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    let mut tracker =
        GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, 64)).expect("tracker");
    let (mut out, mut back) = (Vec::new(), Vec::new());
    tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .expect("launch");
    let reference: Vec<_> = out.iter().map(|t| track_key(t)).collect();
    tracker.inject_device_error();
    assert!(tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .is_err());
    tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .expect("the next launch runs");
    let now: Vec<_> = out.iter().map(|t| track_key(t)).collect();
    assert_eq!(
        now, reference,
        "the launch after a device error decides as before"
    );
    // An event beyond the finder's own candidate limit is handed back, the others not.
    let small = at_median_candidates(&det, &cfg, &events);
    let mut tracker =
        GpuTracker::new(&dev, &det, &small, TrackerLimits::for_batch(&small, 64)).expect("tracker");
    tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .expect("launch");
    let n_back = back.iter().filter(|b| b.is_some()).count();
    println!(
        "candidate limit {}: {n_back} of 64 events handed back ({:?})",
        small.limits.max_candidates,
        back.iter().flatten().next()
    );
    assert!(n_back > 0 && n_back < 64, "{n_back}");
    for (k, b) in back.iter().enumerate() {
        if b.is_some() {
            assert!(out[k].is_empty());
        } else {
            assert_eq!(
                track_key(&out[k]),
                reference[k],
                "event {k} kept its tracks"
            );
        }
    }
}

/// A launch's events for the hand-back tests: 4 central events, then 28 minimum-bias ones.
fn central_then_minimum_bias(det: &Detector) -> Vec<Vec<HitRecord>> {
    let s = seed();
    let mut events: Vec<Vec<HitRecord>> =
        simulate_events(det, &SimConfig::preset(Preset::Central), s, 0, 4)
            .map(|e| e.hits)
            .collect();
    events.extend(
        simulate_events(det, &SimConfig::preset(Preset::Minbias), s ^ 1, 0, 28).map(|e| e.hits),
    );
    events
}

/// The first hits chosen on the device: an event beyond the step's pairs of track and hit
/// is handed back as `first_hits` with no tracks (the caller runs it on the CPU), and the
/// launch's other events keep the CPU's tracks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn events_beyond_the_first_hit_steps_pairs_are_handed_back_and_the_others_kept() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let det = load("detector.toml");
    let mut cfg = FinderConfig::from_detector(&det, 1.0);
    cfg.first_hits_to_origin = true;
    let events = central_then_minimum_bias(&det);
    let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    let mut tracker =
        GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, 32)).expect("tracker");
    assert!(tracker.first_hits_on_device());
    // A central event has some two thousand tracks, each with a pair or more; a
    // minimum-bias one a few tens.
    tracker.limit_first_hit_pairs(400);
    let (mut out, mut back) = (Vec::new(), Vec::new());
    tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .expect("launch");
    let mut reco = Reconstructor::new(&det, cfg.clone());
    let mut cpu = Vec::new();
    let mut kept = 0;
    for (k, ev) in events.iter().enumerate() {
        if k < 4 {
            assert_eq!(back[k], Some("first_hits"), "central event {k} handed back");
            assert!(out[k].is_empty());
            continue;
        }
        assert_eq!(back[k], None, "minimum-bias event {k} kept on the device");
        reco.reconstruct(ev, &mut cpu);
        assert_eq!(
            track_key(&out[k]),
            track_key(&cpu),
            "event {k}: the CPU's tracks"
        );
        kept += cpu.len();
    }
    println!("4 central events handed back as first_hits; 28 minimum-bias events with {kept} tracks as the CPU's");
    assert!(kept > 0);
}

/// An event whose pairs of crossing tracks exceed the exchange step's share on the device
/// is handed back (`exchange`) with none of its tracks, the others keep the CPU's tracks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn events_beyond_the_exchange_steps_pairs_are_handed_back_and_the_others_kept() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let det = load("detector.toml");
    let mut cfg = FinderConfig::from_detector(&det, 1.0);
    cfg.exchange_segments = true;
    let events = central_then_minimum_bias(&det);
    let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    let mut tracker =
        GpuTracker::new(&dev, &det, &cfg, TrackerLimits::for_batch(&cfg, 32)).expect("tracker");
    assert!(tracker.exchange_on_device());
    // A central event has some two thousand tracks and hundreds of pairs of them to try;
    // a minimum-bias one a few tens of tracks and a few pairs.
    tracker.limit_exchange_pairs(40);
    let (mut out, mut back) = (Vec::new(), Vec::new());
    tracker
        .reconstruct_batch(&views, &mut out, &mut back)
        .expect("launch");
    let mut reco = Reconstructor::new(&det, cfg.clone());
    let mut cpu = Vec::new();
    let (mut kept, mut handed) = (0, 0);
    for (k, ev) in events.iter().enumerate() {
        if back[k] == Some("exchange") {
            assert!(out[k].is_empty());
            handed += 1;
            continue;
        }
        assert_eq!(back[k], None, "event {k}");
        assert!(k >= 4, "central event {k} handed back");
        reco.reconstruct(ev, &mut cpu);
        assert_eq!(
            track_key(&out[k]),
            track_key(&cpu),
            "event {k}: the CPU's tracks"
        );
        kept += cpu.len();
    }
    println!("{handed} events handed back as exchange; the others with {kept} tracks as the CPU's");
    assert!(handed >= 4 && handed < events.len());
    assert!(kept > 0);
}

/// One launch of busy and sparse events together, at the product's default minimum
/// momentum (0.5 GeV/c): the stiff-track pass runs in the busy events only, on the device
/// as on the CPU (`stiff_pass_min_hits`), so every event's tracks equal the CPU's in
/// acceptance order (where the stiff pass ran, its tracks come first).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_launch_of_busy_and_sparse_events_gives_the_cpus_tracks_in_order() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let s = seed();
    // And the telescope, without a field: its candidates fitted at the momentum cut's
    // scattering, its accepted tracks again at their own (`FinderConfig::candidate_fit`),
    // with the default spectrum and with one learned from a hard beam
    // (`fit.scatter_prior`).
    let telescope = |name| {
        (
            name,
            load("telescope.toml"),
            SimConfig::preset(Preset::Central),
        )
    };
    let hard: Vec<f64> = (0..trigd::tracking::kalman::SCATTER_GRID)
        .map(|g| 0.5f64.powi(g as i32))
        .collect();
    for (name, det, sim) in configurations(Preset::Central).into_iter().chain([
        telescope("telescope"),
        telescope("telescope, hard spectrum"),
    ]) {
        let mut cfg = FinderConfig::from_detector(&det, 0.5);
        if name == "telescope, hard spectrum" {
            cfg.fit.scatter_prior = Some(hard.clone());
        }
        assert!(cfg.stiff_pass(&det).is_some(), "{name}");
        let minbias = match name {
            "forward" => SimConfig::forward(Preset::Minbias),
            _ => SimConfig::preset(Preset::Minbias),
        };
        let busy = simulate_events(&det, &sim, s, 0, 4).map(|e| e.hits);
        let sparse: Vec<Vec<HitRecord>> = simulate_events(&det, &minbias, s, 10, 12)
            .map(|e| e.hits)
            .collect();
        let mut events = Vec::new();
        for (k, b) in busy.enumerate() {
            events.push(b);
            events.extend(sparse[3 * k..3 * k + 3].iter().cloned());
        }
        let n_busy = events
            .iter()
            .filter(|e| e.len() >= cfg.stiff_pass_min_hits)
            .count();
        assert!(
            n_busy == 4,
            "{name}: {n_busy} busy events of {}",
            events.len()
        );
        let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
        let mut tracker = GpuTracker::new(
            &dev,
            &det,
            &cfg,
            TrackerLimits::for_batch(&cfg, views.len()),
        )
        .expect("tracker");
        let (mut out, mut back, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        tracker
            .reconstruct_batch(&views, &mut out, &mut back)
            .expect("launch");
        let mut reco = Reconstructor::new(&det, cfg.clone());
        // The spectrum changes the fits' errors (the tracks compared are not the default's).
        let mut reco_default = Reconstructor::new(
            &det,
            FinderConfig {
                fit: trigd::tracking::kalman::FitConfig {
                    scatter_prior: None,
                    ..cfg.fit.clone()
                },
                ..cfg.clone()
            },
        );
        let (mut n_tracks, mut other_errors, mut default) = (0, 0, Vec::new());
        for (k, ev) in events.iter().enumerate() {
            assert!(back[k].is_none(), "{name}: event {k} handed back");
            reco.reconstruct(ev, &mut cpu);
            n_tracks += cpu.len();
            reco_default.reconstruct(ev, &mut default);
            other_errors += cpu
                .iter()
                .zip(&default)
                .filter(|(a, b)| a.cov[5].to_bits() != b.cov[5].to_bits())
                .count();
            // The hits and the fit, to the bit.
            let hits = |t: &[trigd::tracking::track::Track]| -> Vec<(Vec<u32>, Vec<u32>)> {
                t.iter()
                    .map(|t| {
                        let s = &t.state;
                        let fit = [s.x_mm, s.y_mm, s.tx, s.ty, s.qop, t.chi2]
                            .iter()
                            .chain(&t.cov)
                            .map(|v| v.to_bits())
                            .collect();
                        (t.hits.clone(), fit)
                    })
                    .collect()
            };
            assert_eq!(
                hits(&out[k]),
                hits(&cpu),
                "{name}: event {k} ({} hits)",
                ev.len()
            );
        }
        println!(
            "{name}: {} events, {n_tracks} tracks equal in order",
            events.len()
        );
        assert!(n_tracks > 1000, "{name}");
        assert_eq!(
            other_errors * 2 > n_tracks,
            name == "telescope, hard spectrum",
            "{name}: {other_errors} of {n_tracks} tracks with other errors than the default spectrum's"
        );
    }
}

/// `cfg` with its candidate limit at the median of the events' candidates (the CPU
/// finder's without the limit): the events with more reach it and overflow, those with
/// fewer do not, whatever the seed.
fn at_median_candidates(
    det: &Detector,
    cfg: &FinderConfig,
    events: &[Vec<HitRecord>],
) -> FinderConfig {
    let mut reco = trigd::tracking::reco::Reconstructor::new(det, cfg.clone());
    let mut n: Vec<usize> = events
        .iter()
        .map(|e| {
            reco.find_tracks(e);
            reco.buffers().candidates.len()
        })
        .collect();
    n.sort_unstable();
    let (least, most) = (n[0], n[n.len() - 1]);
    assert!(
        least + 1 < most,
        "events with different numbers of candidates: {n:?}"
    );
    // Above the least and below the most, so that some event stays below it and some
    // goes beyond.
    let limit = n[n.len() / 2].clamp(least + 1, most - 1);
    FinderConfig {
        limits: trigd::tracking::reco::Limits {
            max_candidates: limit,
            ..cfg.limits.clone()
        },
        ..cfg.clone()
    }
}

/// At a candidate limit the finder reaches in some events: the events handed back are
/// the same on every launch (of one tracker and of a fresh one), and they are exactly
/// those where the CPU finder with the same limits counts an overflow.
#[test]
#[ignore = "needs a CUDA GPU"]
fn events_handed_back_at_a_candidate_limit_are_the_same_every_launch_and_the_cpus() {
    use trigd::gpu::tracking::{GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let (det, cfg, events) = minbias_spectrometer(64);
    let small = at_median_candidates(&det, &cfg, &events);
    let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
    let mut reco = Reconstructor::new(&det, small.clone());
    let cpu: Vec<bool> = events
        .iter()
        .map(|e| {
            reco.find_tracks(e);
            reco.last_overflow().any()
        })
        .collect();
    let mut runs = Vec::new();
    for fresh in 0..3 {
        let mut tracker = GpuTracker::new(&dev, &det, &small, TrackerLimits::for_batch(&small, 64))
            .expect("tracker");
        for _ in 0..4 {
            let (mut out, mut back) = (Vec::new(), Vec::new());
            tracker
                .reconstruct_batch(&views, &mut out, &mut back)
                .expect("launch");
            let keys: Vec<_> = out.iter().map(|t| track_key(t)).collect();
            println!(
                "candidate limit {}, tracker {fresh}: {} of 64 handed back ({:?}); the CPU overflows in {}",
                small.limits.max_candidates,
                back.iter().flatten().count(),
                back.iter()
                    .enumerate()
                    .filter_map(|(k, b)| b.map(|b| (k, b)))
                    .filter(|(k, _)| !cpu[*k])
                    .collect::<Vec<_>>(),
                cpu.iter().filter(|&&c| c).count()
            );
            runs.push((back, keys));
        }
    }
    let n_back = runs[0].0.iter().flatten().count();
    assert!(n_back > 0 && n_back < 64, "{n_back}");
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r, &runs[0], "launch {i} as the first");
    }
    for (k, b) in runs[0].0.iter().enumerate() {
        assert_eq!(
            b.is_some(),
            cpu[k],
            "event {k}: handed back where the CPU overflows"
        );
    }
}

/// A track's hits, chi-square and fitted state, as bits.
type TrackBits = (Vec<u32>, u32, [u32; 5]);

/// The candidate step in either of its blocks (`CandidateBlocks`: 256 threads, or 128 with
/// two events to a multiprocessor) gives the same tracks, bit for bit and in the same
/// order, and they are the CPU's: central and minimum-bias events of the three shipped
/// detectors in one launch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_candidate_steps_two_block_sizes_give_the_same_tracks() {
    use trigd::gpu::tracking::{CandidateBlocks, GpuTracker, TrackerLimits};
    use trigd::tracking::reco::Reconstructor;
    let dev = device();
    let s = seed();
    for (name, det, central) in configurations(Preset::Central) {
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let minbias = match name {
            "forward" => SimConfig::forward(Preset::Minbias),
            _ => SimConfig::preset(Preset::Minbias),
        };
        let mut events: Vec<Vec<HitRecord>> = simulate_events(&det, &central, s, 0, 4)
            .map(|e| e.hits)
            .collect();
        events.extend(simulate_events(&det, &minbias, s, 100, 60).map(|e| e.hits));
        let views: Vec<&[HitRecord]> = events.iter().map(Vec::as_slice).collect();
        let mut tracker = GpuTracker::new(
            &dev,
            &det,
            &cfg,
            TrackerLimits::for_batch(&cfg, views.len()),
        )
        .expect("tracker");
        let mut runs = Vec::new();
        for blocks in [
            CandidateBlocks::Large,
            CandidateBlocks::Small,
            CandidateBlocks::Auto,
        ] {
            tracker.set_candidate_blocks(blocks);
            let (mut out, mut back) = (Vec::new(), Vec::new());
            tracker
                .reconstruct_batch(&views, &mut out, &mut back)
                .expect("launch");
            assert!(
                back.iter().all(Option::is_none),
                "{name} {blocks:?}: {back:?}"
            );
            let bits: Vec<Vec<TrackBits>> = out
                .iter()
                .map(|ts| {
                    ts.iter()
                        .map(|t| {
                            let st = &t.state;
                            let p = [st.x_mm, st.y_mm, st.tx, st.ty, st.qop].map(f32::to_bits);
                            (t.hits.clone(), t.chi2.to_bits(), p)
                        })
                        .collect()
                })
                .collect();
            runs.push((blocks, bits));
        }
        for (blocks, bits) in &runs[1..] {
            assert!(
                *bits == runs[0].1,
                "{name}: the tracks of {blocks:?} blocks differ from the large blocks'"
            );
        }
        let mut reco = Reconstructor::new(&det, cfg.clone());
        let (mut cpu, mut n_tracks, mut differ) = (Vec::new(), 0, 0);
        for (k, ev) in events.iter().enumerate() {
            reco.reconstruct(ev, &mut cpu);
            n_tracks += cpu.len();
            let g: std::collections::HashSet<&Vec<u32>> =
                runs[0].1[k].iter().map(|t| &t.0).collect();
            differ += cpu.iter().filter(|t| !g.contains(&t.hits)).count();
        }
        println!(
            "{name}: {} events, {n_tracks} CPU tracks, the same in large, small and automatic blocks; {differ} without a GPU track of the same hits",
            events.len()
        );
        assert!(n_tracks > 0, "{name}");
        assert!(
            (differ as f64) <= 1e-3 * n_tracks as f64,
            "{name}: {differ} of {n_tracks} tracks differ"
        );
    }
}
