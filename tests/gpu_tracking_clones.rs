//! Clone suppression on the GPU against the CPU's, on identical input: the accepted tracks
//! of the CPU finder before clone suppression ([`Reconstructor::find_tracks`]) on fresh
//! simulated central and minimum-bias events of the shipped detectors (a uniform field, a
//! dipole field map, a forward field map), marked by the CPU ([`mark_clones`]) and by the
//! GPU engine; the marks must be equal track by track, and the set must contain clones.
//! A constructed case in a uniform field pins the decisions themselves: a clone, a short
//! track off the trajectory, one sharing a plane, and short tracks of one trajectory
//! where the order of acceptance decides which is the clone.
//!
//! Needs a CUDA GPU: every test is ignored in CI and runs on the device machine with
//! `--ignored --test-threads=1`, from the repository root (or with `TRIGD_FIXTURES`
//! naming the fixtures directory).

use std::path::PathBuf;
use std::time::Instant;

use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::tracking_clones::{
    CloneEngineConfig, CloneError, CloneLimit, CloneLimits, CloneTrack, GpuCloneEngine,
};
use trigd::gpu::{detect, BackendChoice, GpuDevice};
use trigd::tracking::ca::clones::{accepted_fit, accepted_hits, mark_clones};
use trigd::tracking::ca::{CaBuffers, Candidate, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field, Plane};
use trigd::tracking::kalman::{FitHit, FitOutput};
use trigd::tracking::propagate::propagate_state;
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

fn device() -> GpuDevice {
    let devices = detect(BackendChoice::Gpu).expect("a GPU is needed for this test");
    devices
        .into_iter()
        .next()
        .expect("detect(Gpu) returned no device")
}

fn seed() -> u64 {
    // Fresh events each run; the seed is printed so a failure can be replayed.
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

fn fixture(rel: &str) -> PathBuf {
    let base = std::env::var_os("TRIGD_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("fixtures"));
    base.join(rel)
}

fn load(rel: &str) -> Detector {
    Detector::from_toml_file(fixture(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e} (run from the repository root)"))
}

/// One event's accepted tracks before clone suppression and the CPU's marks.
struct EventTracks {
    hits: Vec<Vec<FitHit>>,
    fits: Vec<FitOutput>,
    cpu_marks: Vec<bool>,
    /// Wall time of the CPU's marking, microseconds.
    cpu_us: f64,
}

impl EventTracks {
    fn tracks(&self) -> Vec<CloneTrack<'_>> {
        self.hits
            .iter()
            .zip(&self.fits)
            .map(|(hits, fit)| CloneTrack { hits, fit })
            .collect()
    }
}

/// The accepted tracks in `buf` (acceptance order) and the CPU's marks of them.
fn capture(geo: &FinderGeometry, cfg: &FinderConfig, buf: &CaBuffers) -> EventTracks {
    let n = buf.accepted.len();
    let (mut masks, mut cpu_marks) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let t0 = Instant::now();
    mark_clones(geo, cfg, buf, &mut masks, &mut cpu_marks);
    let cpu_us = t0.elapsed().as_secs_f64() * 1e6;
    EventTracks {
        cpu_us,
        hits: (0..n).map(|i| accepted_hits(buf, i).collect()).collect(),
        fits: (0..n).map(|i| *accepted_fit(buf, i)).collect(),
        cpu_marks,
    }
}

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
    let samples = [
        ("uniform", load("detector.toml"), false),
        (
            "dipole map",
            load("tracking/dipole/detector_dipole.toml"),
            false,
        ),
        (
            "forward map",
            load("tracking/forward/detector_forward.toml"),
            true,
        ),
    ];
    let mut dev = None;
    let mut total_clones = 0;
    for (name, det, forward) in &samples {
        let cfg = FinderConfig::from_detector(det, 0.5);
        let mut reco = Reconstructor::new(det, cfg);
        let short_max = det.planes.len() - 3;
        // The CPU's side first: the accepted tracks and their marks.
        let mut sets = Vec::new();
        for (preset, n_events) in [(Preset::Central, 6u64), (Preset::Minbias, 64)] {
            let sim = if *forward {
                SimConfig::forward(preset)
            } else {
                SimConfig::preset(preset)
            };
            let t0 = Instant::now();
            let events: Vec<EventTracks> = simulate_events(det, &sim, seed, 0, n_events)
                .map(|ev| {
                    reco.find_tracks(&ev.hits);
                    capture(reco.geometry(), reco.config(), reco.buffers())
                })
                .collect();
            let cpu_clones: usize = events
                .iter()
                .map(|e| e.cpu_marks.iter().filter(|&&m| m).count())
                .sum();
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

/// Eight planes from z = 300 mm, 100 mm apart, in a uniform field.
fn eight_planes(b_tesla: [f64; 3]) -> Detector {
    Detector {
        planes: (0..8)
            .map(|i| Plane {
                z_mm: 300.0 + 100.0 * i as f64,
                half_x_mm: 300.0,
                half_y_mm: 300.0,
                sigma_x_mm: 0.01,
                sigma_y_mm: 0.01,
                x0_fraction: 0.003,
                efficiency: 1.0,
            })
            .collect(),
        field: Field::Uniform { b_tesla },
    }
}

/// A constructed track: its hits and its fit.
type Track = (Vec<FitHit>, FitOutput);

/// The hits of a trajectory (state at plane 0) on `planes`, shifted by `dx_mm` in x, and
/// its fit at the first of them.
fn along(det: &Detector, start: [f64; 5], planes: &[usize], dx_mm: f64) -> Track {
    let z0 = det.planes[0].z_mm;
    let at = |p: usize| propagate_state(&det.field, z0, start, det.planes[p].z_mm, 10.0);
    let hits = planes
        .iter()
        .map(|&p| {
            let s = at(p);
            FitHit {
                plane: p as u16,
                x_mm: (s[0] + dx_mm) as f32,
                y_mm: s[1] as f32,
            }
        })
        .collect();
    let mut state = at(planes[0]);
    state[0] += dx_mm;
    let mut cov = [0.0; 15];
    for (i, v) in [(0, 1e-4), (2, 1e-4), (5, 1e-6), (9, 1e-6), (14, 1e-4)] {
        cov[i] = v;
    }
    let fit = FitOutput {
        z_mm: det.planes[planes[0]].z_mm,
        state,
        cov,
        chi2: 1.0,
        ndf: 2 * planes.len() as u16 - 4,
        ok: true,
    };
    (hits, fit)
}

/// The CPU's buffers holding `tracks` as accepted tracks, in the order given.
fn buffers_of(tracks: &[Track]) -> CaBuffers {
    let mut buf = CaBuffers::default();
    for (k, (hits, fit)) in tracks.iter().enumerate() {
        let start = buf.candidate_hits.len() as u32;
        for h in hits {
            buf.candidate_hits.push(buf.hits.x_mm.len() as u32);
            buf.hits.x_mm.push(h.x_mm);
            buf.hits.y_mm.push(h.y_mm);
            buf.hits.plane.push(h.plane);
        }
        buf.candidates.push(Candidate {
            start,
            len: hits.len() as u16,
            chi2: fit.chi2 as f32,
            ndf: fit.ndf,
            fit: k as u32,
        });
        buf.fits.push(*fit);
        buf.accepted.push(k as u32);
    }
    buf
}

/// Constructed events in a uniform field: the CPU's marks are the expected ones, and the
/// GPU's are the CPU's; then a batch beyond the engine's limits is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_marks_constructed_clones_as_the_cpu() {
    let det = eight_planes([0.0, 1.0, 0.0]);
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    // A 2 GeV/c track and a 1 GeV/c one of the other charge: trajectories that bend by
    // many windows over the detector, so a straight line would not do.
    let t = [10.0, -5.0, 0.1, 0.02, 0.5];
    let u = [-40.0, 20.0, -0.05, -0.03, -1.0];
    let cases: Vec<(&str, Vec<Track>, Vec<bool>)> = vec![
        (
            "a long track and short ones: on its trajectory, off it, sharing a plane",
            vec![
                along(&det, t, &[0, 1, 2, 3, 4], 0.0),
                along(&det, t, &[5, 6, 7], 0.0),
                along(&det, t, &[5, 6, 7], 150.0),
                along(&det, t, &[4, 5, 6], 0.0),
                along(&det, u, &[0, 1, 2, 3, 4, 5], 0.0),
                along(&det, u, &[6, 7], 0.0),
            ],
            vec![false, true, false, false, false, true],
        ),
        (
            "two short tracks of one trajectory: the first accepted is compared first",
            vec![
                along(&det, t, &[0, 1, 2], 0.0),
                along(&det, t, &[4, 5, 6], 0.0),
            ],
            vec![true, false],
        ),
        (
            "a short track marked earlier is no longer a reference",
            vec![
                along(&det, t, &[0, 1, 2], 0.0),
                along(&det, t, &[4, 5], 0.0),
                along(&det, t, &[6, 7], 0.0),
            ],
            vec![false, true, true],
        ),
        (
            "a clone of a clone: the later short track has no reference left",
            vec![
                along(&det, t, &[3, 4, 5], 0.0),
                along(&det, t, &[0, 1, 2], 0.0),
                along(&det, t, &[6, 7], 0.0),
            ],
            vec![true, false, true],
        ),
    ];
    let events: Vec<EventTracks> = cases
        .iter()
        .map(|(what, tracks, expected)| {
            let ev = capture(&geo, &cfg, &buffers_of(tracks));
            assert_eq!(&ev.cpu_marks, expected, "CPU: {what}");
            ev
        })
        .collect();
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
        },
    )
    .expect("engine");
    let (_, _, clones) = compare(&mut engine, &events, 5, "constructed");
    assert_eq!(clones, 2 + 1 + 2 + 2);
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
