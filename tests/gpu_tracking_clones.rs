//! Clone suppression on the GPU against the CPU's, on identical input: the accepted tracks
//! of the CPU finder before clone suppression ([`Reconstructor::find_tracks`]) on fresh
//! simulated central and minimum-bias events of the shipped detectors (a uniform field, a
//! dipole field map, a forward field map), marked by the CPU (`ca::clones::mark_clones`) and by the
//! GPU engine; the marks must be equal track by track, and the set must contain clones.
//! Constructed cases in a uniform field pin the decisions themselves: a clone, a short
//! track off the trajectory, one sharing a plane, and short tracks of one trajectory
//! where the order of acceptance decides which is the clone. (`tests/clones_kernel_on_cpu.rs`
//! runs the same comparisons on the kernel's source compiled for the CPU, in CI.)
//!
//! Needs a CUDA GPU: every test is ignored in CI and runs on the device machine with
//! `--ignored --test-threads=1`, from the repository root (or with `TRIGD_FIXTURES`
//! naming the fixtures directory).

mod clones_common;
mod gpu_common;

use std::time::Instant;

use clones_common::{
    constructed_cases, constructed_events, count, found_events, seed, shipped_detectors,
    EventTracks,
};
use gpu_common::device;
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::tracking_clones::{
    CloneEngineConfig, CloneError, CloneLimit, CloneLimits, CloneTrack, GpuCloneEngine,
};
use trigd::tracking::ca::FinderGeometry;
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::Preset;

/// The GPU's marks of `events` (in batches of the engine's event limit) against the
/// CPU's, track by track; returns (tracks, short tracks, clones).
fn compare(
    engine: &mut GpuCloneEngine,
    events: &[EventTracks],
    short_max: usize,
    what: &str,
) -> (usize, usize, usize) {
    let per_batch = engine.limits().max_events;
    let mut marks = Vec::new();
    let (mut n_tracks, mut n_short, mut n_clones) = (0, 0, 0);
    for (b, chunk) in events.chunks(per_batch).enumerate() {
        let tracks: Vec<Vec<CloneTrack>> = chunk.iter().map(EventTracks::tracks).collect();
        let batch: Vec<&[CloneTrack]> = tracks.iter().map(Vec::as_slice).collect();
        let gpu_clones = engine
            .mark_batch(&batch, &mut marks)
            .unwrap_or_else(|e| panic!("{what}: batch {b}: {e}"));
        let mut k = 0;
        for (e, ev) in chunk.iter().enumerate() {
            for (t, &cpu) in ev.cpu_marks.iter().enumerate() {
                let gpu = marks[k];
                k += 1;
                assert_eq!(
                    gpu,
                    cpu,
                    "{what}: event {} track {t} of {}: GPU marks {gpu}, CPU {cpu}; hits {:?}, fit {:?}",
                    b * per_batch + e,
                    ev.cpu_marks.len(),
                    ev.hits[t],
                    ev.fits[t]
                );
            }
            n_tracks += ev.cpu_marks.len();
            n_short += ev.hits.iter().filter(|h| h.len() <= short_max).count();
        }
        assert_eq!(k, marks.len(), "{what}: one mark per track");
        n_clones += gpu_clones;
    }
    (n_tracks, n_short, n_clones)
}

/// CPU and GPU agree on every accepted track of fresh central and minimum-bias events of
/// the three shipped detectors, and the set contains clones.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_marks_the_cpus_clones_on_simulated_events() {
    let seed = seed();
    let samples = shipped_detectors();
    let mut dev = None;
    let mut total_clones = 0;
    for (name, det, forward) in &samples {
        let cfg = FinderConfig::from_detector(det, 0.5);
        let mut reco = Reconstructor::new(det, cfg);
        let short_max = det.planes.len() - 3;
        // The CPU's side first: the accepted tracks and their marks.
        let mut sets = Vec::new();
        for (preset, n_events) in [(Preset::Central, 6u64), (Preset::Minbias, 64)] {
            let t0 = Instant::now();
            let events = found_events(&mut reco, det, *forward, preset, seed, n_events);
            let cpu_clones: usize = events.iter().map(|e| count(&e.cpu_marks)).sum();
            eprintln!(
                "{name} {preset:?}: CPU: {n_events} events, {} tracks, {cpu_clones} clones ({:.1} s simulating and finding)",
                events.iter().map(|e| e.cpu_marks.len()).sum::<usize>(),
                t0.elapsed().as_secs_f64()
            );
            sets.push((preset, events, cpu_clones));
        }
        let dev = dev.get_or_insert_with(device);
        let config = CloneEngineConfig {
            limits: CloneLimits {
                max_events: 16,
                max_tracks_per_event: 4096,
                max_hits_per_track: 64,
            },
            cache: KernelCache::from_env(),
            host_batches: true,
        };
        let mut engine = GpuCloneEngine::new(dev, reco.geometry(), reco.config(), config)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (preset, events, cpu_clones) in &sets {
            let what = format!("{name} {preset:?}");
            let (tracks, short, clones) = compare(&mut engine, events, short_max, &what);
            assert_eq!(clones, *cpu_clones, "{what}");
            eprintln!(
                "{what}: GPU and CPU agree on {} events, {tracks} tracks, {short} short, {clones} clones",
                events.len()
            );
            if *preset == Preset::Central {
                let per_event: Vec<Vec<CloneTrack>> =
                    events.iter().map(EventTracks::tracks).collect();
                let batch: Vec<&[CloneTrack]> = per_event.iter().map(Vec::as_slice).collect();
                let launches = 20;
                let wall = engine
                    .time_resident(&batch, launches)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                eprintln!(
                    "{what}: kernel alone, {} events of {} tracks resident: {:.1} us per launch; CPU marking (one core) {:.1} us for the same events",
                    batch.len(),
                    tracks,
                    wall.as_secs_f64() * 1e6 / launches as f64,
                    events.iter().map(|e| e.cpu_us).sum::<f64>()
                );
            }
            total_clones += clones;
        }
    }
    assert!(
        total_clones > 0,
        "the simulated events gave no clone: the comparison exercised nothing"
    );
}

/// Constructed events in a uniform field: the CPU's marks are the expected ones, and the
/// GPU's are the CPU's; then a batch beyond the engine's limits is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_marks_constructed_clones_as_the_cpu() {
    let (det, cases) = constructed_cases();
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let events = constructed_events(&geo, &cfg, &cases);
    let mut engine = GpuCloneEngine::new(
        &device(),
        &geo,
        &cfg,
        CloneEngineConfig {
            limits: CloneLimits {
                max_events: 4,
                max_tracks_per_event: 8,
                max_hits_per_track: 8,
            },
            cache: KernelCache::from_env(),
            host_batches: true,
        },
    )
    .expect("engine");
    let (_, _, clones) = compare(&mut engine, &events, 5, "constructed");
    assert_eq!(clones, 2 + 1 + 2 + 2 + 2 + 1);
    // An empty batch, and events without tracks among others.
    let mut marks = vec![true];
    assert_eq!(engine.mark_batch(&[], &mut marks).unwrap(), 0);
    assert!(marks.is_empty());
    let tracks = events[1].tracks();
    assert_eq!(
        engine.mark_batch(&[&[], &tracks, &[]], &mut marks).unwrap(),
        1
    );
    assert_eq!(marks, events[1].cpu_marks);
    // Beyond the limits: refused, and the engine still works afterwards.
    let nine: Vec<CloneTrack> = (0..9).map(|k| events[0].tracks()[k % 6]).collect();
    match engine.mark_batch(&[&nine], &mut marks) {
        Err(CloneError::Overflow {
            limit: CloneLimit::TracksPerEvent,
            got: 9,
            max: 8,
        }) => {}
        other => panic!("expected a refusal of 9 tracks per event, got {other:?}"),
    }
    let five: Vec<&[CloneTrack]> = vec![&tracks; 5];
    assert!(matches!(
        engine.mark_batch(&five, &mut marks),
        Err(CloneError::Overflow {
            limit: CloneLimit::Events,
            ..
        })
    ));
    assert_eq!(engine.mark_batch(&[&tracks], &mut marks).unwrap(), 1);
}
