//! The GPU clone step's kernel source (`kernels/ca_clones.cu` after
//! `kernels/field_map.cuh`) compiled for the CPU and run with each warp's 32 lanes as 32
//! threads (`tests/kernels_on_cpu/warp.h`), on batches packed as the GPU engine packs them
//! ([`pack_batch`], [`CloneTables`]): its marks must be the CPU's ([`mark_clones`]) on
//! fresh simulated events of the three shipped detectors and on the constructed cases.
//! This checks the kernels' logic (the order of the short tracks, the votes, the tests and
//! their double-precision arithmetic, compiled without contraction as NVRTC's
//! `--fmad=false`) on every CI run, without a GPU; `tests/gpu_tracking_clones.rs` runs the
//! same comparisons on a GPU.
//!
//! Needs a C++20 compiler (`g++`, installed by `./setup.sh`; `CXX` overrides).
//!
//! [`mark_clones`]: trigd::tracking::ca::clones::mark_clones

mod clones_common;
mod gpu_common;
mod kernels_on_cpu;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use clones_common::{
    constructed_cases, constructed_events, count, found_events, seed, shipped_detectors,
    EventTracks,
};
use kernels_on_cpu::{read_words, write_arg};
use trigd::gpu::tracking_clones::{CloneTables, CloneTrack};
use trigd::tracking::ca::FinderGeometry;
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::Preset;

/// The kernel on the CPU, compiled once per test run: as the GPU runs it, and with step 2
/// keeping no short reference and one (`REF_MAX`), so that step 3's full comparison in
/// order and its mixed cases run on every event too.
fn kernel_binaries() -> &'static [PathBuf] {
    static BINARIES: OnceLock<Vec<PathBuf>> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let variants = [("", None), ("_ref0", Some("0u")), ("_ref1", Some("1u"))];
        let builds: Vec<_> = variants
            .iter()
            .map(|(suffix, ref_max)| {
                let defines: Vec<String> = ref_max.iter().map(|r| format!("REF_MAX={r}")).collect();
                kernels_on_cpu::start(
                    "ca_clones.cpp",
                    &format!("ca_clones_on_cpu{suffix}"),
                    &defines,
                )
            })
            .collect();
        builds.into_iter().map(kernels_on_cpu::finish).collect()
    })
}

/// The kernel's marks of `events` on the CPU.
fn kernel_marks(geo: &FinderGeometry, cfg: &FinderConfig, events: &[EventTracks]) -> Vec<bool> {
    let tracks: Vec<Vec<CloneTrack>> = events.iter().map(EventTracks::tracks).collect();
    let batch: Vec<&[CloneTrack]> = tracks.iter().map(Vec::as_slice).collect();
    let b = kernels_on_cpu::clone_batch(&batch, geo.planes.len());
    let tables = CloneTables::new(geo, cfg);
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    write_arg(d, "ints", &tables.ints);
    write_arg(d, "doubles", &tables.doubles);
    write_arg(d, "plane_z", &tables.plane_z);
    write_arg(d, "nodes", &tables.nodes);
    write_arg(d, "event_start", &b.event_start);
    write_arg(d, "track_hit_start", &b.track_hit_start);
    write_arg(d, "hit_plane", &b.hit_plane);
    write_arg(d, "hit_x", &b.hit_x);
    write_arg(d, "hit_y", &b.hit_y);
    write_arg(d, "fits", &b.fits);
    let mut variants = kernel_binaries().iter().map(|binary| {
        let out = Command::new(binary)
            .arg(d)
            .output()
            .expect("run the kernel");
        assert!(
            out.status.success(),
            "kernel on the CPU failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let words = read_words(d, "marks");
        assert_eq!(
            words.len(),
            b.track_hit_start.len() - 1,
            "one mark per track"
        );
        let marks: Vec<bool> = words
            .into_iter()
            .map(|w| match w {
                0 => false,
                1 => true,
                m => panic!("mark {m:#x}: not written, or not a mark"),
            })
            .collect();
        (binary, marks)
    });
    let (_, marks) = variants.next().expect("the kernel as the GPU runs it");
    for (binary, other) in variants {
        assert_eq!(
            other,
            marks,
            "{}: the marks of step 2 with fewer references kept differ",
            binary.display()
        );
    }
    marks
}

/// The kernel's marks against the CPU's, event by event; returns the clones.
fn assert_same_marks(kernel: &[bool], events: &[EventTracks], what: &str) -> usize {
    let mut k = 0;
    for (e, ev) in events.iter().enumerate() {
        let n = ev.cpu_marks.len();
        let got = &kernel[k..k + n];
        if let Some(t) = (0..n).find(|&t| got[t] != ev.cpu_marks[t]) {
            panic!(
                "{what}: event {e} track {t} of {n}: kernel marks {}, CPU {}; hits {:?}, fit {:?}",
                got[t], ev.cpu_marks[t], ev.hits[t], ev.fits[t]
            );
        }
        k += n;
    }
    assert_eq!(k, kernel.len(), "{what}: one mark per track");
    count(kernel)
}

#[test]
fn kernel_marks_the_cpus_clones_on_simulated_events() {
    let seed = seed();
    let mut total = 0;
    for (name, det, forward) in shipped_detectors() {
        let mut reco = Reconstructor::new(&det, FinderConfig::from_detector(&det, 0.5));
        for (preset, n_events) in [(Preset::Central, 2), (Preset::Minbias, 16)] {
            let events = found_events(&mut reco, &det, forward, preset, seed, n_events);
            let what = format!("{name} {preset:?}");
            let kernel = kernel_marks(reco.geometry(), reco.config(), &events);
            let clones = assert_same_marks(&kernel, &events, &what);
            eprintln!(
                "{what}: kernel and CPU agree on {n_events} events, {} tracks, {clones} clones",
                kernel.len()
            );
            total += clones;
        }
    }
    // One in two hundred tracks is split in two (`found_events`): the shorter piece is a
    // clone.
    assert!(
        total > 0,
        "the simulated events gave no clone: the comparison exercised nothing"
    );
}

#[test]
fn kernel_marks_the_constructed_clones() {
    let (det, cases) = constructed_cases();
    let cfg = FinderConfig::from_detector(&det, 1.0);
    let geo = FinderGeometry::new(&det, &cfg);
    let events = constructed_events(&geo, &cfg, &cases);
    let kernel = kernel_marks(&geo, &cfg, &events);
    assert_eq!(assert_same_marks(&kernel, &events, "constructed"), 10);
}
