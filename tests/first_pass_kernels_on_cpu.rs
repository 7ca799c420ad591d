//! The GPU finder's first-pass kernels (`kernels/ca_doublets.cu`, `ca_triplets.cu`,
//! `ca_neighbours.cu` and `ca_evolution.cu` after `kernels/ca_common.cuh`, as the engine
//! compiles them) run on the CPU (`tests/kernels_on_cpu/ca_first_pass.cpp`) on the CPU
//! finder's own sorted hits of fresh events, with the tables the engine uploads
//! ([`CaTables`], built from the CPU's doublet windows, pair lanes and tent tables), each
//! step from the kernels' previous one: the doublets must be the CPU's (`find_doublets`), in
//! the same order, their slopes to the bit, with the same gaps; the triplets the CPU's
//! (`find_triplets`, the full search), their q/p, its error and the kink chi-square to the
//! bit, with their planes; each triplet's left neighbours (`find_neighbours`), whether it
//! has a right one, and its level in the automaton (`evolve`). On the shipped detectors (a
//! uniform field, the dipole and forward field maps, the field that reverses, no field) and
//! for both reaches the finder's passes use (consecutive planes, and over missing planes).
//! This checks the windows', kinks' and neighbours' arithmetic and order of operations
//! (compiled without contraction, as NVRTC's `--fmad=false`), the grid's cells, the tent
//! lookups, the triplets' write through each warp's queue and the evolution plane by plane
//! on every CI run, without a GPU. A later pass too: with a third of the hits taken by
//! earlier tracks, the free hits gathered (`ca_free_flags`, `ca_free_hits`) and the
//! doublets' windows scanning them only, written through each warp's queue.
//! The hits' sorting into the grid by the kernels (`ca_bin_hits`, a block's threads
//! together, `ca_place_hits`, `ca_rank_hits`) must also be the CPU's (`sort_hits`). The
//! candidates and what only a GPU shows are left to `tests/gpu_tracking.rs`.
//!
//! Needs a C++20 compiler (`g++`, installed by `./setup.sh`; `CXX` overrides).

mod gpu_common;
mod kernels_on_cpu;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gpu_common::load;
use kernels_on_cpu::{read_words, write_arg};
use trigd::frame::HitRecord;
use trigd::gpu::tracking_ca::CaTables;
use trigd::tracking::ca::{self, CaBuffers, FinderGeometry};
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::reco::FinderConfig;
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

/// The kernel on the CPU, compiled once per test run.
fn kernel_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled(&BINARY, "ca_first_pass.cpp", "ca_first_pass_on_cpu")
}

/// A doublet as both sides give it: its hits, its slopes' bits, its gap.
type Row = (u32, u32, u32, u32, u32);

/// An event's sorted hits as the engine uploads them, and in a later pass the hits earlier
/// tracks took (by input hit) with each sorted hit's input index.
struct Sorted {
    x: Vec<f32>,
    y: Vec<f32>,
    plane: Vec<u32>,
    bin_start: Vec<u32>,
    input: Vec<u32>,
    used: Option<Vec<u32>>,
}

/// The hits a later pass finds taken: every third input hit (the pattern is the test's;
/// any decides which windows scan which hits the same way on both sides).
fn taken(input_index: usize) -> bool {
    input_index % 3 == 0
}

/// A triplet as both sides give it: its doublets, its q/p, error and chi-square's bits, its
/// first and last planes (`TPLANE`), its count of left neighbours, whether it has a right
/// one, its level in the automaton.
type TripletRow = (u32, u32, u32, u32, u32, u32, u32, u32, u32);

/// The kernels' doublets and triplets of the events whose sorted hits (the CPU's) are
/// `sorted`, the events' one after the other.
fn kernel_steps(
    tables: &CaTables,
    max_hits: usize,
    inputs: &[Vec<HitRecord>],
    sorted: &[Sorted],
    dead_ends: Option<usize>,
) -> (Vec<Row>, Vec<TripletRow>, Vec<u32>, Vec<u32>) {
    let (mut sx, mut sy, mut splane) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hit_start, mut n_sorted, mut bin_start) = (Vec::new(), Vec::new(), Vec::new());
    let (mut sinput, mut used) = (Vec::new(), Vec::new());
    for sh in sorted {
        assert_eq!(sh.bin_start.len(), tables.n_bins + 1);
        sinput.extend_from_slice(&sh.input);
        if let Some(u) = &sh.used {
            // The engine indexes an event's input hits and its sorted ones from the same
            // start: every simulated hit is sorted.
            assert_eq!(u.len(), sh.x.len());
            used.extend_from_slice(u);
        }
        hit_start.push(sx.len() as u32);
        n_sorted.push(sh.x.len() as u32);
        sx.extend_from_slice(&sh.x);
        sy.extend_from_slice(&sh.y);
        splane.extend_from_slice(&sh.plane);
        bin_start.extend_from_slice(&sh.bin_start);
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    write_arg(d, "sx", &sx);
    write_arg(d, "sy", &sy);
    write_arg(d, "splane", &splane);
    write_arg(d, "hit_start", &hit_start);
    write_arg(d, "n_sorted", &n_sorted);
    write_arg(d, "bin_start", &bin_start);
    // The events' input hits, for the kernels' own sorting.
    let mut in_start = vec![0u32];
    let (mut in_x, mut in_y, mut in_plane) = (Vec::new(), Vec::new(), Vec::new());
    for hits in inputs {
        in_x.extend(hits.iter().map(|h| h.x_mm));
        in_y.extend(hits.iter().map(|h| h.y_mm));
        in_plane.extend(hits.iter().map(|h| h.plane as u32));
        in_start.push(in_x.len() as u32);
    }
    write_arg(d, "in_x", &in_x);
    write_arg(d, "in_y", &in_y);
    write_arg(d, "in_plane", &in_plane);
    write_arg(d, "in_start", &in_start);
    write_arg(d, "max_hits", &[max_hits as u32]);
    if sorted.iter().any(|s| s.used.is_some()) {
        write_arg(d, "used", &used);
        write_arg(d, "sinput", &sinput);
    }
    write_arg(d, "plf", &tables.plane_f32);
    write_arg(d, "pli", &tables.plane_i32);
    write_arg(d, "pld", &tables.plane_f64);
    write_arg(d, "g", &tables.globals);
    write_arg(d, "prf", &tables.pair_f32);
    write_arg(d, "pri", &tables.pair_i32);
    write_arg(d, "tents", &tables.tents);
    write_arg(d, "shape", &[tables.n_planes as i32, tables.reach as i32]);
    write_arg(d, "nb_chi2", &[tables.neighbour_chi2_max]);
    if let Some(first_end) = dead_ends {
        write_arg(d, "dead_ends", &[first_end as u32]);
        write_arg(d, "exits", &tables.exits);
    }
    kernels_on_cpu::run(kernel_binary(), d);
    let words = read_words(d, "dbl");
    let gaps = read_words(d, "dgap");
    assert_eq!(words.len(), 4 * gaps.len());
    // The events' doublets and triplets one after the other (each event's at its place in
    // the arena).
    let doublets = gaps
        .iter()
        .enumerate()
        .map(|(k, &gap)| {
            let w = &words[4 * k..4 * k + 4];
            (w[0], w[1], w[2], w[3], gap)
        })
        .collect();
    let trip = read_words(d, "trip");
    let triplets = trip
        .chunks_exact(9)
        .map(|w| (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]))
        .collect();
    let left = read_words(d, "left");
    let kernel_sorted = read_words(d, "sorted");
    (doublets, triplets, left, kernel_sorted)
}

/// The CPU's sorting of the events as the kernels' harness writes its own: per event the
/// sorted count, then per sorted hit x and y bits, plane and input index, then the cells'
/// starts.
fn sorting_words(sorted: &[Sorted]) -> Vec<u32> {
    let mut w = Vec::new();
    for sh in sorted {
        w.push(sh.x.len() as u32);
        for h in 0..sh.x.len() {
            w.extend([
                sh.x[h].to_bits(),
                sh.y[h].to_bits(),
                sh.plane[h],
                sh.input[h],
            ]);
        }
        w.extend_from_slice(&sh.bin_start);
    }
    w
}

/// The CPU finder's sorted hits, doublets and triplets of one event for `reach`.
fn cpu_steps(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    later: bool,
    dead_ends: Option<usize>,
    hits: &[HitRecord],
    buf: &mut CaBuffers,
) -> (Sorted, Vec<Row>, Vec<TripletRow>, Vec<u32>) {
    ca::hit_sorting::sort_hits(geo, hits, cfg.limits.max_hits, buf);
    if later {
        for (u, &i) in buf.hits.used.iter_mut().zip(&buf.hits.input_index) {
            *u = taken(i as usize);
        }
    }
    ca::doublets::find_doublets(geo, cfg, reach, buf);
    ca::triplets::find_triplets(geo, cfg, reach, buf);
    if let Some(first_end) = dead_ends {
        let removed = ca::triplets::prune_dead_ends(geo, first_end, buf);
        // The pruning is not empty: a central event's first pass has dead ends.
        assert!(removed > 100, "only {removed} dead ends pruned");
    }
    ca::neighbours::find_neighbours(cfg, buf);
    ca::evolution::evolve(buf, geo.planes.len());
    assert!(
        !buf.overflow.any(),
        "the CPU overflowed: {:?}",
        buf.overflow
    );
    let sh = Sorted {
        x: buf.hits.x_mm.clone(),
        y: buf.hits.y_mm.clone(),
        plane: buf.hits.plane.iter().map(|&p| p as u32).collect(),
        bin_start: buf.hits.bin_start.clone(),
        input: buf.hits.input_index.clone(),
        used: later.then(|| (0..hits.len()).map(|i| taken(i) as u32).collect()),
    };
    let rows = buf
        .doublets
        .iter()
        .map(|d| {
            let gap = sh.plane[d.b as usize] - sh.plane[d.a as usize] - 1;
            (d.a, d.b, d.tx.to_bits(), d.ty.to_bits(), gap)
        })
        .collect();
    let triplets = buf
        .triplets
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let (l, r) = (
                buf.doublets[t.left as usize],
                buf.doublets[t.right as usize],
            );
            let planes = sh.plane[l.a as usize] | sh.plane[r.b as usize] << 16;
            (
                t.left,
                t.right,
                t.qop.to_bits(),
                t.qop_sigma.to_bits(),
                t.chi2.to_bits(),
                planes,
                buf.left_start[k + 1] - buf.left_start[k],
                buf.has_right[k] as u32,
                buf.level[k] as u32,
            )
        })
        .collect();
    (sh, rows, triplets, buf.left.clone())
}

/// Every event's doublets from the kernel equal the CPU's, for each reach of the passes;
/// with `dead_ends`, the first pass's (reach 1) with its dead ends pruned, as the engine
/// runs it for a finder whose first pass runs to the last plane.
fn agree(
    name: &str,
    det: &Detector,
    sim: &SimConfig,
    seed: u64,
    n_events: u64,
    later: bool,
    dead_ends: bool,
) -> usize {
    let mut cfg = FinderConfig::from_detector(det, 1.0);
    // The full search over missing planes of a central event in a field map makes some 2
    // million triplets (the finder itself runs it after a pass has taken most hits).
    cfg.limits.max_triplets = 4_000_000;
    let geo = FinderGeometry::new(det, &cfg);
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let events: Vec<Vec<HitRecord>> = simulate_events(det, sim, seed, 0, n_events)
        .map(|e| e.hits)
        .collect();
    let mut reaches = vec![1];
    if cfg.allow_missing_plane && cfg.max_gap_planes > 0 && !dead_ends {
        reaches.push((1 + cfg.max_gap_planes).min(ca::MAX_REACH));
    }
    // The first plane a chain may end on by leaving the detector (the GPU tracker's
    // `Passes`): the planes before the last `seed_planes`.
    let n_planes = det.planes.len();
    let first_end = dead_ends.then(|| {
        assert!(
            cfg.allow_missing_plane
                && cfg.first_pass_min_hits <= n_planes
                && cfg.first_pass_to_last_plane,
            "{name}: the first pass does not run to the last plane"
        );
        let seed_planes = (n_planes + 1).saturating_sub(cfg.first_pass_min_hits.max(3));
        n_planes - seed_planes.min(n_planes)
    });
    let (mut total, mut trip_total) = (0, 0);
    for reach in reaches {
        let tables = CaTables::new(&geo, &cfg, reach);
        let mut sorted = Vec::new();
        let (mut cpu, mut cpu_trip, mut cpu_left) = (Vec::new(), Vec::new(), Vec::new());
        for h in &events {
            let (sh, d, t, l) = cpu_steps(&geo, &cfg, reach, later, first_end, h, &mut buf);
            sorted.push(sh);
            cpu.push(d);
            cpu_trip.push(t);
            cpu_left.extend(l);
        }
        let (gpu, gpu_trip, gpu_left, gpu_sorted) =
            kernel_steps(&tables, cfg.limits.max_hits, &events, &sorted, first_end);
        // The kernels' own sorting of the hits into the grid is the CPU's.
        assert!(
            gpu_sorted == sorting_words(&sorted),
            "{name}, reach {reach}: the kernels' hit sorting differs from the CPU's"
        );
        let all_cpu: Vec<Row> = cpu.iter().flatten().copied().collect();
        assert_eq!(
            gpu.len(),
            all_cpu.len(),
            "{name}, reach {reach}: {} doublets from the kernel, {} from the CPU",
            gpu.len(),
            all_cpu.len()
        );
        let mut at = 0;
        for (e, rows) in cpu.iter().enumerate() {
            for (k, want) in rows.iter().enumerate() {
                assert_eq!(
                    gpu[at + k],
                    *want,
                    "{name}, reach {reach}, event {e}, doublet {k}: kernel (a, b, tx, ty, gap) \
                     against the CPU's"
                );
            }
            at += rows.len();
        }
        let all_trip: Vec<TripletRow> = cpu_trip.iter().flatten().copied().collect();
        assert_eq!(
            gpu_trip.len(),
            all_trip.len(),
            "{name}, reach {reach}: {} triplets from the kernel, {} from the CPU",
            gpu_trip.len(),
            all_trip.len()
        );
        let mut at = 0;
        for (e, rows) in cpu_trip.iter().enumerate() {
            for (k, want) in rows.iter().enumerate() {
                assert_eq!(
                    gpu_trip[at + k],
                    *want,
                    "{name}, reach {reach}, event {e}, triplet {k}: kernel (left, right, q/p, \
                     sigma, chi2, planes, left neighbours, has a right one, level) against the \
                     CPU's"
                );
            }
            at += rows.len();
        }
        // The left neighbours themselves, triplet after triplet.
        assert!(
            gpu_left == cpu_left,
            "{name}, reach {reach}: the left neighbours differ ({} against {})",
            gpu_left.len(),
            cpu_left.len()
        );
        println!(
            "{name}, reach {reach}: {} events, {} doublets, {} triplets, {} neighbour links \
             and the levels equal to the bit",
            events.len(),
            all_cpu.len(),
            all_trip.len(),
            cpu_left.len()
        );
        total += all_cpu.len();
        trip_total += all_trip.len();
    }
    assert!(trip_total > 0, "{name}: no triplets");
    total
}

#[test]
fn the_first_pass_kernels_give_the_cpus_steps_on_every_shipped_detector() {
    let central = SimConfig::preset(Preset::Central);
    let minbias = SimConfig::preset(Preset::Minbias);
    let no_field = {
        let mut det = load("detector.toml");
        det.field = Field::Uniform { b_tesla: [0.0; 3] };
        det
    };
    for (name, det, sim, n) in [
        ("uniform field, central", load("detector.toml"), &central, 2),
        (
            "uniform field, minimum bias",
            load("detector.toml"),
            &minbias,
            40,
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
        (
            "reversing field, central",
            load("tracking/reversing/detector_reversing.toml"),
            &SimConfig::forward(Preset::Central),
            2,
        ),
        ("no field, central", no_field, &central, 2),
    ] {
        let doublets = agree(name, &det, sim, 71, n, false, false);
        // The comparison is not empty: a central event makes tens of thousands.
        assert!(doublets > 1000, "{name}: only {doublets} doublets");
    }
}

/// A later pass: a third of the hits taken by earlier tracks, the windows scanning the
/// free hits only (`ca_free_flags`, `ca_free_hits`, the doublets' write through each
/// warp's queue), then the triplets, neighbours and levels of those doublets.
#[test]
fn a_later_pass_over_the_free_hits_gives_the_cpus_steps() {
    let central = SimConfig::preset(Preset::Central);
    for (name, det, sim) in [
        (
            "uniform field, central, later pass",
            load("detector.toml"),
            &central,
        ),
        (
            "dipole map, central, later pass",
            load("tracking/dipole/detector_dipole.toml"),
            &central,
        ),
        (
            "forward map, central, later pass",
            load("tracking/forward/detector_forward.toml"),
            &SimConfig::forward(Preset::Central),
        ),
    ] {
        let doublets = agree(name, &det, sim, 72, 2, true, false);
        assert!(doublets > 1000, "{name}: only {doublets} doublets");
    }
}

/// The first pass of a finder whose first pass runs to the last plane, as the engine runs
/// it: its triplets' dead ends pruned (`ca_dead_ends_clear`, `ca_dead_ends` plane by plane,
/// the per-event scan of the marks, `ca_dead_ends_gather`, `ca_dead_ends_copy_back`), then
/// the neighbours and levels of the triplets kept: the CPU's `prune_dead_ends` and steps.
#[test]
fn the_first_pass_with_its_dead_ends_pruned_gives_the_cpus_steps() {
    let central = SimConfig::preset(Preset::Central);
    let mut pruned_any = false;
    for (name, det, sim) in [
        (
            "uniform field, central, dead ends",
            load("detector.toml"),
            &central,
        ),
        (
            "dipole map, central, dead ends",
            load("tracking/dipole/detector_dipole.toml"),
            &central,
        ),
        (
            "forward map, central, dead ends",
            load("tracking/forward/detector_forward.toml"),
            &SimConfig::forward(Preset::Central),
        ),
    ] {
        let cfg = FinderConfig::from_detector(&det, 1.0);
        if !cfg.first_pass_to_last_plane {
            continue;
        }
        let doublets = agree(name, &det, sim, 76, 2, false, true);
        assert!(doublets > 1000, "{name}: only {doublets} doublets");
        pruned_any = true;
    }
    assert!(
        pruned_any,
        "no shipped detector's first pass runs to the last plane"
    );
}

/// A per-event hit limit between the events' sizes: the kernels fail the events beyond it
/// (the CPU would drop hits; the engine hands such an event to the CPU path), whichever of
/// an event's blocks binned its hits, and sort the others as the CPU does.
#[test]
fn the_events_beyond_the_hit_limit_fail_and_the_others_are_sorted_as_the_cpus() {
    let det = load("detector.toml");
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
    let mut events: Vec<Vec<HitRecord>> =
        simulate_events(&det, &SimConfig::preset(Preset::Minbias), 76, 0, 3)
            .map(|e| e.hits)
            .collect();
    let central = SimConfig::preset(Preset::Central);
    let central = simulate_events(&det, &central, 76, 0, 1).next();
    events.insert(1, central.expect("a central event").hits);
    let limit = events
        .iter()
        .map(|e| e.len())
        .filter(|&n| n < 5_000)
        .max()
        .unwrap();
    let sorted: Vec<Sorted> = events
        .iter()
        .map(|hits| {
            ca::hit_sorting::sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
            Sorted {
                x: buf.hits.x_mm.clone(),
                y: buf.hits.y_mm.clone(),
                plane: buf.hits.plane.iter().map(|&p| p as u32).collect(),
                bin_start: buf.hits.bin_start.clone(),
                input: buf.hits.input_index.clone(),
                used: None,
            }
        })
        .collect();
    let tables = CaTables::new(&geo, &cfg, 1);
    let (_, _, _, words) = kernel_steps(&tables, limit, &events, &sorted, None);
    let cells = tables.n_bins + 1;
    let mut at = 0;
    let mut failed = Vec::new();
    for (e, (hits, sh)) in events.iter().zip(&sorted).enumerate() {
        let dropped = buf.overflow.hits;
        ca::hit_sorting::sort_hits(&geo, hits, limit, &mut buf);
        let beyond = buf.overflow.hits > dropped;
        if words[at] == u32::MAX {
            failed.push(e);
            assert!(beyond, "event {e} failed within the limit");
            at += 1 + cells;
        } else {
            assert!(!beyond, "event {e} beyond the limit was sorted");
            let n = 1 + 4 * sh.x.len() + cells;
            assert!(
                words[at..at + n] == sorting_words(std::slice::from_ref(sh)),
                "event {e}: the kernels' hit sorting differs from the CPU's"
            );
            at += n;
        }
    }
    assert_eq!(at, words.len());
    assert_eq!(failed, [1], "the central event alone fails");
}
