//! The GPU finder's steps on the packed tracks run on the CPU
//! (`tests/kernels_on_cpu/ca_packed_steps.cpp`): the exchange of segments between crossing
//! tracks (`kernels/ca_exchange.cu`) and the first hits chosen again against the origin
//! (`kernels/ca_first_hits.cu`), with the module's fit, as the engine compiles them. Their
//! input is the CPU finder's accepted tracks of fresh central events, packed as the device
//! packs them (their hits, their fits' words, the clone step's marks: the kernels' own, to
//! the bit, in `tests/clones_kernel_on_cpu.rs` and `tests/candidate_kernels_on_cpu.rs`),
//! with the hits sorted into the grid, the steps' parameters ([`exchange_params`],
//! [`first_hit_params`]) and the fits' tables the engine uploads. The tracks the events
//! keep must be the CPU finder's (`Reconstructor::reconstruct`, whose last steps on them
//! are `ca::exchange` and `ca::first_hits`), the same hits in the same order and their
//! fits to the bit, as the GPU tracker writes them ([`BatchView::write_track`]). The
//! exchange's every round runs: the pairs found through the grid (a thread per hit in the
//! first round, sixteen lanes per hit in the later ones), the tracks' fits, each pair's two
//! trial fits by two lanes, the choice by the gains' order, the exchanged tracks' final
//! fits and the events' tracks packed again; then the first hits' predictions at the
//! origin, the matching of tracks and free hits, the refits and the changes kept. On a
//! uniform field, the dipole and forward field maps and no field. What only a GPU shows
//! (NVRTC, the device's scheduling, memory faults) is left to `tests/gpu_tracking_passes.rs`.
//!
//! Needs a C++20 compiler (`g++`, installed by `./setup.sh`; `CXX` overrides).

mod gpu_common;
mod kernels_on_cpu;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gpu_common::load;
use kernels_on_cpu::{read_words, write_arg, InputHits};
use trigd::frame::HitRecord;
use trigd::gpu::tracking_ca::{
    exchange_params, first_hit_params, BatchView, CaTables, EXCHANGE_PAIRS_PER_TRACK,
};
use trigd::gpu::tracking_fit::FitTables;
use trigd::tracking::ca::exchange::ExchangeCuts;
use trigd::tracking::ca::first_hits::FirstHitCuts;
use trigd::tracking::ca::{self, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::kalman::{FitOutput, KalmanFitter};
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};
use trigd::tracking::track::Track;

/// The kernels on the CPU, compiled once per test run.
fn kernel_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled(&BINARY, "ca_packed_steps.cpp", "ca_packed_steps_on_cpu")
}

/// The same, with the first hits' pool sorted in tiles of 64 entries (`FH_TILE`; on the
/// device, 1,024), so that every central event's pool takes the sort's steps across tiles
/// in global memory as well as those within a tile.
fn kernel_binary_small_tiles() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled_with(
        &BINARY,
        "ca_packed_steps.cpp",
        "ca_packed_steps_small_tiles_on_cpu",
        &["FH_TILE=64"],
    )
}

/// A fit's words as the candidate step stores them (`store_fit` in
/// `kernels/ca_candidates.cu`): state, covariance, z, chi-square as floats, ndf, ok.
fn fit_words(f: &FitOutput) -> [u32; 24] {
    let mut w = [0u32; 24];
    let values = f.state.iter().chain(&f.cov);
    for (w, v) in w.iter_mut().zip(values) {
        *w = (*v as f32).to_bits();
    }
    w[20] = (f.z_mm as f32).to_bits();
    w[21] = (f.chi2 as f32).to_bits();
    w[22] = u32::from(f.ndf);
    w[23] = u32::from(f.ok);
    w
}

/// The batch as the device holds it before the exchange.
#[derive(Default)]
struct Batch {
    trk_n: Vec<u32>,
    trk_base: Vec<u32>,
    trk_hit_base: Vec<u32>,
    inputs: InputHits,
    tracks: Vec<[u32; 2]>,
    fits: Vec<u32>,
    hits: Vec<u32>,
    marks: Vec<u32>,
    sx: Vec<f32>,
    bin_start: Vec<u32>,
}

impl Batch {
    /// Appends an event after `reco.find_tracks` on its hits: its accepted tracks in
    /// acceptance order, their clone marks, its sorted hits.
    fn push(&mut self, hits: &[HitRecord], reco: &Reconstructor) {
        let buf = reco.buffers();
        let start = self.inputs.push(hits, &buf.hits.input_index);
        self.sx.extend_from_slice(&buf.hits.x_mm);
        self.sx.resize(start + hits.len(), f32::NAN);
        self.bin_start.extend_from_slice(&buf.hits.bin_start);
        let (mut masks, mut marks) = (Vec::new(), Vec::new());
        ca::clones::mark_clones(reco.geometry(), reco.config(), buf, &mut masks, &mut marks);
        self.trk_base.push(self.tracks.len() as u32);
        self.trk_hit_base.push(self.hits.len() as u32);
        self.trk_n.push(buf.accepted.len() as u32);
        for (&k, &clone) in buf.accepted.iter().zip(&marks) {
            let c = &buf.candidates[k as usize];
            let hit_range = c.start as usize..c.start as usize + c.len as usize;
            self.tracks.push([self.hits.len() as u32, u32::from(c.len)]);
            self.hits.extend(
                buf.candidate_hits[hit_range]
                    .iter()
                    .map(|&h| buf.hits.input_index[h as usize]),
            );
            self.fits
                .extend_from_slice(&fit_words(&buf.fits[c.fit as usize]));
            self.marks.push(u32::from(clone));
        }
    }
}

/// Blocks per event of the step's fits and evaluations, and of its searches (the engine's
/// depend on the device; the results do not).
const WIDE: u32 = 2;
const SEARCH: u32 = 3;

/// Which steps run on the packed tracks, in the engine's order.
#[derive(Clone, Copy)]
struct Steps {
    exchange: bool,
    first_hits: bool,
    /// The first hits' pool sorted in tiles of 64 entries ([`kernel_binary_small_tiles`]).
    small_tiles: bool,
    /// The finder's chi-square cut in place of the one derived from the detector.
    max_chi2_ndf: Option<f64>,
}

/// Runs `steps` on `batch`; the events' tracks as the GPU tracker writes them (clones and
/// tracks below the minimum momentum left out) and the exchanges each event made.
fn kernel_tracks(
    det: &Detector,
    reco: &Reconstructor,
    batch: &Batch,
    steps: Steps,
) -> (Vec<Vec<Track>>, Vec<u32>) {
    let cfg = reco.config();
    let geo: &FinderGeometry = reco.geometry();
    let n_events = batch.trk_n.len();
    let tables = CaTables::new(geo, cfg, 1);
    let track_fitter = cfg.track_fit().map(|f| KalmanFitter::new(det, f));
    let (xf, xd, xi) = exchange_params(
        &ExchangeCuts::new(geo, cfg),
        cfg.momentum_cut(),
        track_fitter.is_some(),
    );
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    // Each event's share of the first-hit step's edges: as many pairs of track and hit per
    // track as the CPU's step takes.
    let most_tracks = batch.trk_n.iter().copied().max().unwrap_or(0);
    let edge_share = most_tracks * ca::first_hits::MAX_PAIRS_PER_TRACK as u32;
    write_arg(
        d,
        "shape",
        &[
            tables.n_bins as u32,
            WIDE,
            SEARCH,
            u32::from(steps.exchange),
            u32::from(steps.first_hits),
            edge_share,
        ],
    );
    if steps.first_hits {
        let (fh_d, fh_i) = first_hit_params(
            &FirstHitCuts::new(geo, cfg),
            cfg.momentum_cut(),
            track_fitter.is_some(),
        );
        write_arg(d, "fh_d", &fh_d);
        write_arg(d, "fh_i", &fh_i);
    }
    // The tents of the last pass's tables (the engine's last pass reaches over the missing
    // planes): the first hits' pointing, the exchange's kinks' bending.
    let reach = if cfg.allow_missing_plane {
        (1 + cfg.max_gap_planes).min(ca::MAX_REACH)
    } else {
        1
    };
    let last = CaTables::new(geo, cfg, reach);
    write_arg(d, "pair_i32", &last.pair_i32);
    write_arg(d, "tents", &last.tents);
    write_arg(d, "pairs_per_track", &[EXCHANGE_PAIRS_PER_TRACK as u32]);
    write_arg(d, "trk_n", &batch.trk_n);
    write_arg(d, "trk_base", &batch.trk_base);
    write_arg(d, "trk_hit_base", &batch.trk_hit_base);
    batch.inputs.write(d, true);
    write_arg(d, "tracks", batch.tracks.as_flattened());
    write_arg(d, "fits", &batch.fits);
    write_arg(d, "hits", &batch.hits);
    write_arg(d, "marks", &batch.marks);
    write_arg(d, "xf", &xf);
    write_arg(d, "xd", &xd);
    write_arg(d, "xi", &xi);
    write_arg(d, "sx", &batch.sx);
    write_arg(d, "bin_start", &batch.bin_start);
    write_arg(d, "plf", &tables.plane_f32);
    write_arg(d, "pli", &tables.plane_i32);
    let t = FitTables::new(reco.fitter());
    kernels_on_cpu::write_fit_tables(d, &t);
    let tt = track_fitter.as_ref().map(FitTables::new);
    kernels_on_cpu::write_track_fit(d, &t, tt.as_ref());
    let binary = if steps.small_tiles {
        kernel_binary_small_tiles()
    } else {
        kernel_binary()
    };
    kernels_on_cpu::run(binary, d);
    for name in ["failed", "fh_failed"] {
        let failed = read_words(d, name);
        assert!(
            failed.iter().all(|&f| f == 0),
            "events beyond the steps' limits ({name}): {failed:?}"
        );
    }
    let words = read_words(d, "tracks");
    let track_hits: Vec<[u32; 2]> = words.chunks_exact(2).map(|w| [w[0], w[1]]).collect();
    let (fits, hits, marks) = (
        read_words(d, "fits"),
        read_words(d, "hits"),
        read_words(d, "marks"),
    );
    let mut first_track = batch.trk_base.clone();
    first_track.push(batch.tracks.len() as u32);
    let view = BatchView {
        first_track: &first_track,
        track_hits: &track_hits,
        fits: &fits,
        hits: &hits,
        marks: &marks,
    };
    let tracks = (0..n_events)
        .map(|e| {
            view.tracks_of(e)
                .filter(|&t| !view.is_clone(t))
                .map(|t| {
                    let mut track = Track::default();
                    view.write_track(t, &mut track);
                    track
                })
                .collect()
        })
        .collect();
    // Per event its state words (`EX_STATE`): the exchanges made are the fourth.
    let made = read_words(d, "state")
        .chunks_exact(8)
        .map(|s| s[3])
        .collect();
    (tracks, made)
}

/// The kernels' tracks after `steps` equal the CPU finder's on every event; returns the
/// exchanges the kernels made and the tracks the first-hit step changed on the CPU.
fn agree(
    name: &str,
    det: &Detector,
    sim: &SimConfig,
    seed: u64,
    n_events: u64,
    steps: Steps,
) -> (u32, usize) {
    let base = FinderConfig::from_detector(det, 1.0);
    let cfg = FinderConfig {
        exchange_segments: steps.exchange,
        first_hits_to_origin: steps.first_hits,
        max_chi2_ndf: steps.max_chi2_ndf.unwrap_or(base.max_chi2_ndf),
        ..base
    };
    let mut reco = Reconstructor::new(det, cfg.clone());
    let mut reference = Reconstructor::new(det, cfg.clone());
    // Where the first hits are chosen again, the same finder without that step: what the
    // step changed.
    let mut before = steps.first_hits.then(|| {
        Reconstructor::new(
            det,
            FinderConfig {
                first_hits_to_origin: false,
                ..cfg
            },
        )
    });
    let events: Vec<Vec<HitRecord>> = simulate_events(det, sim, seed, 0, n_events)
        .map(|e| e.hits)
        .collect();
    let mut batch = Batch::default();
    let mut cpu = Vec::new();
    let mut changed = 0;
    for hits in &events {
        reco.find_tracks(hits);
        batch.push(hits, &reco);
        let mut out = Vec::new();
        reference.reconstruct(hits, &mut out);
        if let Some(before) = &mut before {
            let mut without = Vec::new();
            before.reconstruct(hits, &mut without);
            assert_eq!(
                out.len(),
                without.len(),
                "{name}: the first hits dropped a track"
            );
            changed += out.iter().zip(&without).filter(|(a, b)| a != b).count();
        }
        cpu.push(out);
    }
    let (kernel, made) = kernel_tracks(det, &reco, &batch, steps);
    for (e, (k, c)) in kernel.iter().zip(&cpu).enumerate() {
        let what = format!("{name}, event {e}");
        assert_eq!(
            k.len(),
            c.len(),
            "{what}: tracks from the kernels against the CPU's"
        );
        for (i, (kt, ct)) in k.iter().zip(c).enumerate() {
            assert_eq!(kt.hits, ct.hits, "{what}: the hits of track {i}");
            assert_eq!(kt, ct, "{what}: the fit of track {i}");
        }
    }
    let made: u32 = made.iter().sum();
    let tracks: usize = cpu.iter().map(Vec::len).sum();
    println!(
        "{name}: {} events, {tracks} tracks after {made} exchanges and {changed} tracks' \
         first hits changed, equal to the bit",
        events.len()
    );
    assert!(tracks > 300, "{name}: only {tracks} tracks");
    (made, changed)
}

/// The shipped detectors' central events: name, detector, simulation, events.
fn detectors() -> Vec<(&'static str, Detector, SimConfig, u64)> {
    let central = SimConfig::preset(Preset::Central);
    let no_field = {
        let mut det = load("detector.toml");
        det.field = Field::Uniform { b_tesla: [0.0; 3] };
        det
    };
    vec![
        (
            "uniform field, central",
            load("detector.toml"),
            central.clone(),
            4,
        ),
        (
            "dipole map, central",
            load("tracking/dipole/detector_dipole.toml"),
            central.clone(),
            10,
        ),
        (
            "forward map, central",
            load("tracking/forward/detector_forward.toml"),
            SimConfig::forward(Preset::Central),
            4,
        ),
        ("no field, central", no_field, central, 2),
    ]
}

#[test]
fn the_exchange_kernels_give_the_cpus_tracks_on_every_shipped_detector() {
    let steps = Steps {
        exchange: true,
        first_hits: false,
        small_tiles: false,
        max_chi2_ndf: None,
    };
    let mut made = 0;
    for (name, det, sim, n) in detectors() {
        made += agree(name, &det, &sim, 74, n, steps).0;
    }
    // The comparison covers exchanges made, not only tracks left as they were.
    assert!(made > 0, "no exchange was made");
    // Without a field and with planes that miss a hit in ten, where the pairs' boundaries
    // reach past the planes one of the two tracks misses (Exchange::find_pairs).
    let mut det = load("detector.toml");
    det.field = Field::Uniform { b_tesla: [0.0; 3] };
    for p in &mut det.planes {
        p.efficiency = 0.9;
    }
    let sim = SimConfig::preset(Preset::Central);
    let (made, _) = agree(
        "no field, 90 % efficient planes, central",
        &det,
        &sim,
        75,
        3,
        steps,
    );
    assert!(made > 0, "no exchange was made");
}

/// The first hits chosen again against the origin after the exchange, as the finder runs
/// them by default (the origin's point combined with the track's own on these detectors).
#[test]
fn the_first_hit_kernel_after_the_exchange_gives_the_cpus_tracks() {
    let steps = Steps {
        exchange: true,
        first_hits: true,
        small_tiles: false,
        max_chi2_ndf: None,
    };
    let mut changed = 0;
    for (name, det, sim, n) in detectors() {
        changed += agree(name, &det, &sim, 75, n.min(4), steps).1;
    }
    assert!(changed > 0, "the first-hit step changed no track");
}

/// The same with the pool sorted over tiles of 64 entries: a central event's pool of
/// thousands of entries takes the sort's long steps in global memory between the tiles'
/// steps in shared memory, and the tracks stay the CPU's.
#[test]
fn the_first_hit_kernel_sorting_its_pool_over_many_tiles_gives_the_cpus_tracks() {
    let steps = Steps {
        exchange: true,
        first_hits: true,
        small_tiles: true,
        max_chi2_ndf: None,
    };
    let mut changed = 0;
    for (name, det, sim, n) in detectors().into_iter().take(2) {
        changed += agree(name, &det, &sim, 76, n.min(2), steps).1;
    }
    assert!(changed > 0, "the first-hit step changed no track");
}

/// The first hits with a chi-square cut tight enough that changed tracks fail their fit
/// (the dipole map's event 2 has one): those changes undone (the own first hit back, or
/// the track without it) and the track fitted again with the tracks' fit, the others
/// keeping the fits made with the change, as on the CPU. With the undone track's fit
/// left out, the kernel's tracks differ there.
#[test]
fn the_first_hit_kernel_undoing_changes_that_fail_the_cut_gives_the_cpus_tracks() {
    let steps = Steps {
        exchange: true,
        first_hits: true,
        small_tiles: false,
        max_chi2_ndf: Some(1.3),
    };
    let mut changed = 0;
    for (name, det, sim, n) in detectors().into_iter().take(3) {
        changed += agree(name, &det, &sim, 80, n.min(4), steps).1;
    }
    assert!(changed > 0, "the first-hit step changed no track");
}

/// The first hits in a dense core: the spectrometer with its planes five times nearer the
/// target and three times as thick (without the exchange, whose pairs' arena such a core
/// outgrows), so the tracks' windows on the first planes overlap in groups of up to 31
/// tracks, and two groups beyond the least-cost matching's bound take their pairs in
/// order. The kernel's groups (found by lowering labels, each matched by its root's
/// thread) and its tracks are the CPU's; with the groups left unmatched in the kernel,
/// they are not.
#[test]
fn the_first_hit_kernel_in_a_dense_core_gives_the_cpus_tracks() {
    let steps = Steps {
        exchange: false,
        first_hits: true,
        small_tiles: false,
        max_chi2_ndf: None,
    };
    let mut det = load("detector.toml");
    for p in &mut det.planes {
        p.z_mm *= 0.2;
        p.x0_fraction *= 3.0;
    }
    let sim = SimConfig::preset(Preset::Central);
    let (_, changed) = agree("dense core", &det, &sim, 91, 2, steps);
    assert!(changed > 0, "the first-hit step changed no track");
}
