//! The GPU finder's candidate step (`kernels/ca_candidates.cu`, with the fit of
//! `kernels/kalman_fit.cu`, as the engine compiles them) run on the CPU
//! (`tests/kernels_on_cpu/ca_candidates.cpp`) on the CPU finder's own first pass of fresh
//! events (the doublets, triplets, neighbours and levels the first-pass kernels give to the
//! bit, `tests/first_pass_kernels_on_cpu.rs`), laid out as the engine keeps them on the
//! device, with the fit's tables the engine uploads ([`FitTables`]) and its arenas'
//! shares ([`CaLimits`]): the order of the end triplets, the chains' walks and forks, the
//! chunks' fits, the greedy choice with its refits and second chances (those fitted ahead
//! by the block's other warps included) and, where the finder asks for it, the second
//! round around the used hits. Every event's accepted tracks must be the CPU's
//! (`candidates::extract_and_select`): the same hits, in the same order of acceptance,
//! their fits to the bit (compiled for the CPU, the kernel's arithmetic is the CPU
//! fitter's), and the same used flags; for a call from scratch and for one appended to it,
//! in the blocks of 256 threads and in the small ones of 128. On a uniform field, the
//! dipole and forward field maps and no field, central and minimum-bias events. What only
//! a GPU shows (NVRTC, the device's scheduling, memory faults) is left to
//! `tests/gpu_tracking.rs`.
//!
//! Needs a C++20 compiler (`g++`, installed by `./setup.sh`; `CXX` overrides).

mod gpu_common;
mod kernels_on_cpu;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gpu_common::load;
use kernels_on_cpu::{read_words, write_arg, InputHits};
use trigd::frame::HitRecord;
use trigd::gpu::tracking_ca::CaLimits;
use trigd::gpu::tracking_clones::CloneTrack;
use trigd::gpu::tracking_fit::FitTables;
use trigd::tracking::ca::{self, CaBuffers, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::kalman::{FitHit, FitOutput, KalmanFitter};
use trigd::tracking::reco::FinderConfig;
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

/// The kernels on the CPU, compiled once per test run.
fn kernel_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled(&BINARY, "ca_candidates.cpp", "ca_candidates_on_cpu")
}

/// The same, with the end triplets' order sorted in the key arena whenever an event has
/// more than 64 of them (`ORDER_SHARED_KEYS`; on the device, more than 4,096).
fn kernel_binary_sorting_in_the_arena() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled_with(
        &BINARY,
        "ca_candidates.cpp",
        "ca_candidates_arena_sort_on_cpu",
        &["ORDER_SHARED_KEYS=64"],
    )
}

/// Words of a fit in the kernels' fit arena: state, covariance, z, chi-square (floats),
/// ndf, ok.
const FIT_WORDS: usize = 24;

/// An accepted track as both sides give it: its hits (the event's input indices, upstream
/// first) and its fit.
type Track = (Vec<u32>, FitOutput);

/// The accepted tracks in `buf` (after the candidate step) as [`Track`]s.
fn accepted_tracks(buf: &CaBuffers) -> Vec<Track> {
    buf.accepted
        .iter()
        .map(|&k| {
            let c = &buf.candidates[k as usize];
            let hits = buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize]
                .iter()
                .map(|&h| buf.hits.input_index[h as usize])
                .collect();
            (hits, buf.fits[c.fit as usize])
        })
        .collect()
}

/// One event's accepted tracks and used flags (per input hit) after a call.
#[derive(Debug, PartialEq)]
struct Selection {
    tracks: Vec<Track>,
    used: Vec<bool>,
}

/// The CPU's first pass of one event (reach 1), in `buf`.
fn cpu_pass(geo: &FinderGeometry, cfg: &FinderConfig, hits: &[HitRecord], buf: &mut CaBuffers) {
    buf.overflow = Default::default();
    ca::hit_sorting::sort_hits(geo, hits, cfg.limits.max_hits, buf);
    ca::doublets::find_doublets(geo, cfg, 1, buf);
    ca::triplets::find_triplets(geo, cfg, 1, buf);
    ca::neighbours::find_neighbours(cfg, buf);
    ca::evolution::evolve(buf, geo.planes.len());
}

/// The CPU's candidate step on `buf` (after [`cpu_pass`]).
fn cpu_select(
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    buf: &mut CaBuffers,
    n_input: usize,
    append: bool,
) -> Selection {
    ca::candidates::extract_and_select(cfg, fitter, buf, cfg.min_hits, append);
    assert!(
        !buf.overflow.any(),
        "the CPU overflowed: {:?}",
        buf.overflow
    );
    let tracks = accepted_tracks(buf);
    let mut used = vec![false; n_input];
    for (h, &u) in buf.hits.used.iter().enumerate() {
        used[buf.hits.input_index[h] as usize] = u;
    }
    Selection { tracks, used }
}

/// The batch's first-pass arrays in the engine's device layout.
#[derive(Default)]
struct Batch {
    hits: InputHits,
    dbl: Vec<u32>,
    dbl_base: Vec<u32>,
    trip_base: Vec<u32>,
    trip_n: Vec<u32>,
    tleft: Vec<u32>,
    tright: Vec<u32>,
    tchi2: Vec<f32>,
    tqop: Vec<f32>,
    tsigma: Vec<f32>,
    level: Vec<u32>,
    has_right: Vec<u32>,
    nb_off: Vec<u32>,
    nb_count: Vec<u32>,
    nb_base: Vec<u32>,
    left: Vec<u32>,
}

impl Batch {
    /// Appends an event after [`cpu_pass`] on its hits (before its candidate step).
    fn push(&mut self, hits: &[HitRecord], buf: &CaBuffers) {
        self.hits.push(hits, &buf.hits.input_index);
        self.dbl_base.push((self.dbl.len() / 4) as u32);
        for d in &buf.doublets {
            self.dbl.extend([d.a, d.b, d.tx.to_bits(), d.ty.to_bits()]);
        }
        self.trip_base.push(self.tleft.len() as u32);
        self.trip_n.push(buf.triplets.len() as u32);
        for (k, t) in buf.triplets.iter().enumerate() {
            self.tleft.push(t.left);
            self.tright.push(t.right);
            self.tchi2.push(t.chi2);
            self.tqop.push(t.qop);
            self.tsigma.push(t.qop_sigma);
            self.level.push(u32::from(buf.level[k]));
            self.has_right.push(u32::from(buf.has_right[k]));
            self.nb_off.push(buf.left_start[k]);
            self.nb_count
                .push(buf.left_start[k + 1] - buf.left_start[k]);
        }
        self.nb_base.push(self.left.len() as u32);
        self.left.extend_from_slice(&buf.left);
    }
}

/// Most hits of walked chains of a batch (the engine's `CaLimits::max_chain_hits` is
/// sized for hundreds of events).
const CHAIN_HITS: u32 = 1 << 22;

/// Each event's tracks as the harness writes them (its count, 0xffffffff where it failed,
/// then per track its hit count, its hits and its fit's words), from `words`.
fn parse_tracks(words: &[u32], n_events: usize, what: &str) -> Vec<Vec<Track>> {
    let mut at = 0;
    let mut next = || {
        at += 1;
        words[at - 1]
    };
    (0..n_events)
        .map(|e| {
            let n = next();
            assert_ne!(n, u32::MAX, "{what}: event {e} failed in the kernels");
            (0..n)
                .map(|_| {
                    let len = next();
                    let hits: Vec<u32> = (0..len).map(|_| next()).collect();
                    let w: Vec<u32> = (0..FIT_WORDS).map(|_| next()).collect();
                    let f = |i: usize| f64::from(f32::from_bits(w[i]));
                    let fit = FitOutput {
                        state: std::array::from_fn(f),
                        cov: std::array::from_fn(|i| f(5 + i)),
                        z_mm: f(20),
                        chi2: f(21),
                        ndf: w[22].min(u32::from(u16::MAX)) as u16,
                        ok: w[23] != 0,
                    };
                    (hits, fit)
                })
                .collect()
        })
        .collect()
}

/// The kernels' selections of `batch`, per call of `appends` and per event, and the last
/// call's tracks as the engine packs them (fitted again with `track_fitter` where there
/// is one).
fn kernel_selections(
    binary: &Path,
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    track_fitter: Option<&KalmanFitter>,
    batch: &Batch,
    threads: u32,
    appends: &[i32],
) -> (Vec<Vec<Selection>>, Vec<Vec<Track>>, CloneLayout) {
    let n_events = batch.hits.hit_start.len();
    let (share_cand, share_hits) = CaLimits::default().candidate_share(n_events);
    let lim = &cfg.limits;
    let to_u32 = |v: usize| v.min(u32::MAX as usize) as u32;
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    write_arg(
        d,
        "shape",
        &[
            n_events as u32,
            threads,
            u32::from(cfg.divert_chains),
            cfg.min_hits as u32,
            to_u32(lim.max_candidates),
            to_u32(lim.max_candidates.saturating_mul(16).max(4)),
            to_u32(lim.max_tracks),
            share_cand as u32,
            share_hits as u32,
            CHAIN_HITS,
            // The tracks' fit: none, in full, or from the candidates' fits.
            match track_fitter {
                None => 0,
                Some(_) if cfg.track_fit_starts_from_candidate_fit() => 2,
                Some(_) => 1,
            },
        ],
    );
    write_arg(d, "max_chi2_ndf", &[cfg.max_chi2_ndf]);
    write_arg(d, "appends", appends);
    batch.hits.write(d, false);
    write_arg(d, "used", &vec![0u32; batch.hits.in_x.len()]);
    write_arg(d, "dbl", &batch.dbl);
    write_arg(d, "dbl_base", &batch.dbl_base);
    write_arg(d, "trip_base", &batch.trip_base);
    write_arg(d, "trip_n", &batch.trip_n);
    write_arg(d, "tleft", &batch.tleft);
    write_arg(d, "tright", &batch.tright);
    write_arg(d, "tchi2", &batch.tchi2);
    write_arg(d, "tqop", &batch.tqop);
    write_arg(d, "tsigma", &batch.tsigma);
    write_arg(d, "level", &batch.level);
    write_arg(d, "has_right", &batch.has_right);
    write_arg(d, "nb_off", &batch.nb_off);
    write_arg(d, "nb_count", &batch.nb_count);
    write_arg(d, "nb_base", &batch.nb_base);
    write_arg(d, "left", &batch.left);
    let t = FitTables::new(fitter);
    kernels_on_cpu::write_fit_tables(d, &t);
    // The tracks' own fit (the engine's `set_track_fitter`): its settings with the
    // candidates' detector tables.
    let tt = track_fitter.map(FitTables::new);
    kernels_on_cpu::write_track_fit(d, &t, tt.as_ref());
    kernels_on_cpu::run(binary, d);
    let calls = (0..appends.len())
        .map(|k| {
            let tracks = parse_tracks(&read_words(d, &format!("tracks{k}")), n_events, "call");
            let used = read_words(d, &format!("used{k}"));
            tracks
                .into_iter()
                .enumerate()
                .map(|(e, tracks)| {
                    let h = &batch.hits;
                    let start = h.hit_start[e] as usize;
                    let end = h.hit_start.get(e + 1).map_or(h.in_x.len(), |&s| s as usize);
                    Selection {
                        tracks,
                        used: used[start..end].iter().map(|&u| u != 0).collect(),
                    }
                })
                .collect()
        })
        .collect();
    let packed = parse_tracks(&read_words(d, "packed"), n_events, "packed");
    // The packed tracks in the clone step's layout: they must be what its host packer
    // makes of the same tracks.
    let clone_layout = read_clone_layout(d);
    (calls, packed, clone_layout)
}

/// The clone step's input arrays (`pack_batch`'s `BatchArrays`), owned.
#[derive(Debug, PartialEq)]
struct CloneLayout {
    event_start: Vec<u32>,
    track_hit_start: Vec<u32>,
    hit_plane: Vec<u32>,
    hit_x: Vec<u32>,
    hit_y: Vec<u32>,
    fits: Vec<u64>,
}

fn read_clone_layout(d: &Path) -> CloneLayout {
    let fits = std::fs::read(d.join("clone_fits")).expect("the harness's clone_fits");
    CloneLayout {
        event_start: read_words(d, "clone_event_start"),
        track_hit_start: read_words(d, "clone_track_hit_start"),
        hit_plane: read_words(d, "clone_hit_plane"),
        hit_x: read_words(d, "clone_hit_x"),
        hit_y: read_words(d, "clone_hit_y"),
        fits: fits
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
    }
}

/// What the clone engine's host packer (`pack_batch`) makes of the events' `tracks`.
fn clone_layout(events: &[Vec<HitRecord>], tracks: &[Vec<Track>], n_planes: usize) -> CloneLayout {
    let hits: Vec<Vec<Vec<FitHit>>> = events
        .iter()
        .zip(tracks)
        .map(|(ev, ts)| {
            ts.iter()
                .map(|(h, _)| h.iter().map(|&i| FitHit::from(&ev[i as usize])).collect())
                .collect()
        })
        .collect();
    let clone_tracks: Vec<Vec<CloneTrack>> = hits
        .iter()
        .zip(tracks)
        .map(|(hs, ts)| {
            hs.iter()
                .zip(ts)
                .map(|(h, (_, fit))| CloneTrack { hits: h, fit })
                .collect()
        })
        .collect();
    let batch: Vec<&[CloneTrack]> = clone_tracks.iter().map(Vec::as_slice).collect();
    let b = kernels_on_cpu::clone_batch(&batch, n_planes);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
    CloneLayout {
        event_start: b.event_start,
        track_hit_start: b.track_hit_start,
        hit_plane: b.hit_plane,
        hit_x: bits(&b.hit_x),
        hit_y: bits(&b.hit_y),
        fits: b.fits.iter().map(|v| v.to_bits()).collect(),
    }
}

/// Both block sizes' selections, from scratch and appended, equal the CPU's on every
/// event; returns the CPU's tracks of the first call and how many of them its second
/// round chose (those a call without it lacks).
fn agree(
    binary: &Path,
    name: &str,
    det: &Detector,
    sim: &SimConfig,
    seed: u64,
    n_events: u64,
) -> (usize, usize) {
    let cfg = FinderConfig::from_detector(det, 1.0);
    let first_round = FinderConfig {
        divert_chains: false,
        ..cfg.clone()
    };
    let geo = FinderGeometry::new(det, &cfg);
    let fitter = KalmanFitter::new(det, cfg.candidate_fit());
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let events: Vec<Vec<HitRecord>> = simulate_events(det, sim, seed, 0, n_events)
        .map(|e| e.hits)
        .collect();
    let mut batch = Batch::default();
    let mut cpu = [Vec::new(), Vec::new()];
    let mut packed = Vec::new();
    let track_fitter = cfg.track_fit().map(|f| KalmanFitter::new(det, f));
    let mut diverted = 0;
    for hits in &events {
        cpu_pass(&geo, &cfg, hits, &mut buf);
        let one_round = cpu_select(&first_round, &fitter, &mut buf, hits.len(), false);
        cpu_pass(&geo, &cfg, hits, &mut buf);
        batch.push(hits, &buf);
        let first = cpu_select(&cfg, &fitter, &mut buf, hits.len(), false);
        diverted += first.tracks.len().saturating_sub(one_round.tracks.len());
        cpu[0].push(first);
        cpu[1].push(cpu_select(&cfg, &fitter, &mut buf, hits.len(), true));
        // The tracks as the finder writes them: fitted again with their own fit where it
        // has one.
        if let Some(f) = &track_fitter {
            ca::candidates::refit_accepted(f, &mut buf, cfg.track_fit_starts_from_candidate_fit());
        }
        packed.push(accepted_tracks(&buf));
    }
    for threads in [256, 128] {
        let (kernel, kernel_packed, kernel_clone_layout) = kernel_selections(
            binary,
            &cfg,
            &fitter,
            track_fitter.as_ref(),
            &batch,
            threads,
            &[0, 1],
        );
        for (e, (k, c)) in kernel_packed.iter().zip(&packed).enumerate() {
            assert!(
                k == c,
                "{name}, blocks of {threads}, event {e}: the packed tracks differ"
            );
        }
        assert!(
            kernel_clone_layout == clone_layout(&events, &packed, det.planes.len()),
            "{name}, blocks of {threads}: the clone step's input differs from its host packer's"
        );
        for (call, (k, c)) in kernel.iter().zip(&cpu).enumerate() {
            for (e, (k, c)) in k.iter().zip(c).enumerate() {
                let what = format!("{name}, blocks of {threads}, call {call}, event {e}");
                assert_eq!(
                    k.tracks.len(),
                    c.tracks.len(),
                    "{what}: tracks from the kernels against the CPU's"
                );
                for (i, (kt, ct)) in k.tracks.iter().zip(&c.tracks).enumerate() {
                    assert_eq!(kt.0, ct.0, "{what}: the hits of track {i}");
                    assert_eq!(kt.1, ct.1, "{what}: the fit of track {i}");
                }
                assert!(k.used == c.used, "{what}: the used flags differ");
            }
        }
    }
    let tracks: usize = cpu[0].iter().map(|s| s.tracks.len()).sum();
    let appended: usize = cpu[1].iter().map(|s| s.tracks.len()).sum();
    println!(
        "{name}: {} events, {tracks} tracks of the first call ({diverted} of them chosen by \
         its second round) and {appended} after the appended one, equal to the bit in both \
         block sizes",
        events.len()
    );
    (tracks, diverted)
}

#[test]
fn the_candidate_kernels_give_the_cpus_tracks_on_every_shipped_detector() {
    let central = SimConfig::preset(Preset::Central);
    let minbias = SimConfig::preset(Preset::Minbias);
    let no_field = {
        let mut det = load("detector.toml");
        det.field = Field::Uniform { b_tesla: [0.0; 3] };
        det
    };
    let mut diverted = 0;
    for (name, det, sim, n) in [
        ("uniform field, central", load("detector.toml"), &central, 2),
        (
            "uniform field, minimum bias",
            load("detector.toml"),
            &minbias,
            20,
        ),
        (
            "dipole map, central",
            load("tracking/dipole/detector_dipole.toml"),
            &central,
            2,
        ),
        (
            "forward map, central",
            load("tracking/forward/detector_forward.toml"),
            &SimConfig::forward(Preset::Central),
            2,
        ),
        ("no field, central", no_field, &central, 1),
    ] {
        let (tracks, d) = agree(kernel_binary(), name, &det, sim, 73, n);
        // The comparison is not empty: a central event holds a thousand tracks and more.
        assert!(tracks > 300, "{name}: only {tracks} tracks");
        diverted += d;
    }
    // The second round's kernels chose tracks the comparison covers.
    assert!(diverted > 0, "the second round chose no track");
}

/// An event's end triplets sorted in its slice of the key arena (where an event has more
/// than the shared memory holds) give the same order, so the same tracks.
#[test]
fn the_end_triplets_sorted_in_the_key_arena_give_the_cpus_tracks() {
    let central = SimConfig::preset(Preset::Central);
    let (tracks, _) = agree(
        kernel_binary_sorting_in_the_arena(),
        "uniform field, central, sorted in the arena",
        &load("detector.toml"),
        &central,
        74,
        1,
    );
    assert!(tracks > 300, "only {tracks} tracks");
}
