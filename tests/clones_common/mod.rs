//! Shared by the tests of the GPU clone step (`tests/gpu_tracking_clones.rs`, on a GPU)
//! and of its kernel source run on the CPU (`tests/clones_kernel_on_cpu.rs`): the CPU's
//! accepted tracks before clone suppression and its marks, on simulated events of the
//! shipped detectors and on constructed cases.

#![allow(dead_code)]

use std::time::Instant;

pub use super::gpu_common::{load, seed};

use trigd::gpu::tracking_clones::CloneTrack;
use trigd::tracking::ca::clones::{accepted_fit, accepted_hits, mark_clones};
use trigd::tracking::ca::{CaBuffers, Candidate, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field, Plane};
use trigd::tracking::kalman::{FitHit, FitOutput, KalmanFitter};
use trigd::tracking::propagate::propagate_state;
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

/// One event's accepted tracks before clone suppression and the CPU's marks.
pub struct EventTracks {
    pub hits: Vec<Vec<FitHit>>,
    pub fits: Vec<FitOutput>,
    pub cpu_marks: Vec<bool>,
    /// Wall time of the CPU's marking, microseconds.
    pub cpu_us: f64,
}

impl EventTracks {
    pub fn tracks(&self) -> Vec<CloneTrack<'_>> {
        self.hits
            .iter()
            .zip(&self.fits)
            .map(|(hits, fit)| CloneTrack { hits, fit })
            .collect()
    }
}

/// The accepted tracks in `buf` (acceptance order) and the CPU's marks of them.
pub fn capture(geo: &FinderGeometry, cfg: &FinderConfig, buf: &CaBuffers) -> EventTracks {
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

/// The shipped detectors: name, geometry, whether the forward spectrum applies.
pub fn shipped_detectors() -> Vec<(&'static str, Detector, bool)> {
    vec![
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
    ]
}

/// Every this many accepted tracks of a found event, one of at least [`SPLIT_MIN_HITS`]
/// hits is split in two ([`found_events`]).
pub const SPLIT_EVERY: usize = 200;
/// Fewest hits of a track split in two: its upstream hits and its last three.
pub const SPLIT_MIN_HITS: usize = 7;

/// The tracks of `ev` with every [`SPLIT_EVERY`]-th track of at least [`SPLIT_MIN_HITS`]
/// hits split in two, each piece fitted on its own: the upstream piece in its place, the
/// last three hits appended (accepted later), as a chain broken by missing planes gives
/// them. The short piece lies on the long one's trajectory and measures its q/p: a clone.
fn with_split_tracks(det: &Detector, cfg: &FinderConfig, ev: &EventTracks) -> Vec<Track> {
    let fitter = KalmanFitter::new(det, cfg.fit.clone());
    let mut tracks: Vec<Track> = ev
        .hits
        .iter()
        .cloned()
        .zip(ev.fits.iter().copied())
        .collect();
    let mut tails = Vec::new();
    for (i, (hits, fit)) in tracks.iter_mut().enumerate() {
        if i % SPLIT_EVERY != 0 || hits.len() < SPLIT_MIN_HITS {
            continue;
        }
        let tail = hits.split_off(hits.len() - 3);
        let (head_fit, tail_fit) = (fitter.fit_reference(hits), fitter.fit_reference(&tail));
        if !(head_fit.ok && tail_fit.ok) {
            hits.extend(tail);
            continue;
        }
        *fit = head_fit;
        tails.push((tail, tail_fit));
    }
    tracks.extend(tails);
    tracks
}

/// `n_events` fresh events of `preset` found by `reco` up to clone suppression, some of
/// their tracks split in two ([`with_split_tracks`]: the finder itself leaves hardly any
/// clone in the shipped detectors' events), with the CPU's marks.
pub fn found_events(
    reco: &mut Reconstructor,
    det: &Detector,
    forward: bool,
    preset: Preset,
    seed: u64,
    n_events: u64,
) -> Vec<EventTracks> {
    let sim = if forward {
        SimConfig::forward(preset)
    } else {
        SimConfig::preset(preset)
    };
    simulate_events(det, &sim, seed, 0, n_events)
        .map(|ev| {
            reco.find_tracks(&ev.hits);
            let found = capture(reco.geometry(), reco.config(), reco.buffers());
            let tracks = with_split_tracks(det, reco.config(), &found);
            capture(reco.geometry(), reco.config(), &buffers_of(&tracks))
        })
        .collect()
}

pub fn count(marks: &[bool]) -> usize {
    marks.iter().filter(|&&m| m).count()
}

/// Eight planes from z = 300 mm, 100 mm apart, in a uniform field.
pub fn eight_planes(b_tesla: [f64; 3]) -> Detector {
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
pub type Track = (Vec<FitHit>, FitOutput);

/// The hits of a trajectory (state at plane 0) on `planes`, shifted by `dx_mm` in x, and
/// its fit at the first of them.
pub fn along(det: &Detector, start: [f64; 5], planes: &[usize], dx_mm: f64) -> Track {
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
pub fn buffers_of(tracks: &[Track]) -> CaBuffers {
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

/// A constructed event: what it shows, its tracks in acceptance order, the marks expected.
pub type Case = (&'static str, Vec<Track>, Vec<bool>);

/// Constructed events in a uniform field on [`eight_planes`], each with the marks
/// expected: a clone, a short track off the trajectory, one sharing a plane, and short
/// tracks of one trajectory where the order of acceptance decides which is the clone.
pub fn constructed_cases() -> (Detector, Vec<Case>) {
    let det = eight_planes([0.0, 1.0, 0.0]);
    // A 2 GeV/c track and a 1 GeV/c one of the other charge: trajectories that bend by
    // many windows over the detector, so a straight line would not do.
    let t = [10.0, -5.0, 0.1, 0.02, 0.5];
    let u = [-40.0, 20.0, -0.05, -0.03, -1.0];
    // A 10 GeV/c track, and the clone window of the minimum momentum (1 GeV/c, as the tests
    // build the cuts): the stiff track's is about a ninth of it.
    let stiff = [10.0, -5.0, 0.1, 0.02, 0.1];
    let window = FinderConfig::from_detector(&det, 1.0).clone_window_mm;
    let cases: Vec<Case> = vec![
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
        (
            "a short track whose only reference is a later short one, itself the clone of a \
             long track: the later one is not marked yet at the earlier one's turn",
            vec![
                along(&det, t, &[3, 4], 0.0),
                along(&det, t, &[6, 7], 0.0),
                along(&det, t, &[0, 1, 2, 3, 4, 5], 0.0),
            ],
            vec![true, true, false],
        ),
        (
            "beside a stiff track: off by half the window of the minimum momentum (not a \
             clone: the window is its own momentum's), and by a twentieth of it (a clone)",
            vec![
                along(&det, stiff, &[0, 1, 2, 3, 4], 0.0),
                along(&det, stiff, &[5, 6, 7], 0.5 * window),
                along(&det, stiff, &[6, 7], 0.05 * window),
            ],
            vec![false, false, true],
        ),
        (
            "on a track's trajectory, but measuring the other charge: not a clone",
            vec![along(&det, t, &[0, 1, 2, 3, 4], 0.0), {
                let (hits, mut fit) = along(&det, t, &[5, 6, 7], 0.0);
                fit.state[4] = -fit.state[4];
                (hits, fit)
            }],
            vec![false, false],
        ),
    ];
    (det, cases)
}

/// The CPU's marks of the constructed cases, checked against the expected ones.
pub fn constructed_events(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    cases: &[Case],
) -> Vec<EventTracks> {
    cases
        .iter()
        .map(|(what, tracks, expected)| {
            let ev = capture(geo, cfg, &buffers_of(tracks));
            assert_eq!(&ev.cpu_marks, expected, "CPU: {what}");
            ev
        })
        .collect()
}
