//! The GPU fit's kernel source (`kernels/kalman_fit.cu`) compiled for the CPU and run with
//! one thread per candidate as the engine launches it (`tests/kernels_on_cpu/kalman_fit.cpp`),
//! on batches packed as the engine packs them ([`pack_hits`], [`FitTables`]): its fits must
//! be the CPU fitter's, to the tolerance `tests/gpu_tracking_fit.rs` holds the GPU to
//! (`tests/fit_common`), on the CPU finder's tracks of fresh central events of every
//! shipped detector, of the reversing field and of forward disks in a solenoid (a field
//! along the beam, a uniform field's general path), with the variants that reach the
//! fit's other paths; compiled for the CPU, the kernel's mathematical functions are the
//! CPU fitter's, so every fit must be the same to the bit. This checks the kernel's logic and its order of operations (compiled
//! without contraction, as NVRTC's `--fmad=false`) on every CI run, without a GPU; what
//! only a GPU shows (NVRTC compiling it, the device's own mathematical functions, memory
//! faults) is left to `tests/gpu_tracking_fit.rs` and `tests/kernels_compile.rs`.
//!
//! Needs a C++20 compiler (`g++`, installed by `./setup.sh`; `CXX` overrides).

mod fit_common;
mod gpu_common;
mod kernels_on_cpu;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fit_common::{compare, detectors, found_tracks, with_variants};
use gpu_common::{load, seed};
use kernels_on_cpu::{read_words, write_arg};
use trigd::gpu::tracking_fit::{
    check_batch, pack_hits, unpack_outputs, FitLimits, FitTables, FittedTrack,
};
use trigd::tracking::ca::cuts::FinderConfig;
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::kalman::{FitHit, FitOutput, KalmanFitter};
use trigd::tracking::simulate::{Preset, SimConfig};

/// The kernel on the CPU, compiled once per test run.
fn kernel_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    kernels_on_cpu::compiled(&BINARY, "kalman_fit.cpp", "kalman_fit_on_cpu")
}

/// The kernel's fits of `tracks` with `fitter`'s tables, as the engine would return them.
fn kernel_fits(fitter: &KalmanFitter, tracks: &[&[FitHit]]) -> Vec<FittedTrack> {
    kernel_fits_within(fitter, tracks, None)
}

/// [`kernel_fits`], with `within` each track's retry only within its bound
/// (`kalman_fit_track_within`, the exchange's trial fits).
fn kernel_fits_within(
    fitter: &KalmanFitter,
    tracks: &[&[FitHit]],
    within: Option<&[f32]>,
) -> Vec<FittedTrack> {
    let shape = check_batch(&FitLimits::default(), tracks).expect("within the limits");
    let mut words = vec![0u32; shape.input_words()];
    pack_hits(tracks, &shape, &mut words);
    let t = FitTables::new(fitter);
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    write_arg(
        d,
        "shape",
        &[
            shape.n as i32,
            shape.stride as i32,
            shape.kmax as i32,
            within.is_some() as i32,
        ],
    );
    if let Some(w) = within {
        write_arg(d, "within", w);
    }
    write_arg(d, "hits", &words);
    kernels_on_cpu::write_fit_tables(d, &t);
    kernels_on_cpu::run(kernel_binary(), d);
    let out_words = read_words(d, "out");
    assert_eq!(out_words.len(), shape.output_words());
    let mut out = Vec::new();
    unpack_outputs(&out_words, &shape, &mut out);
    out
}

/// The shipped detectors of the GPU test, the reversing field, and eight planes in a
/// 2 T solenoid (a uniform field with a component along the beam).
fn all_detectors() -> Vec<(&'static str, Detector, SimConfig)> {
    let mut all = detectors();
    all.push((
        "reversing map",
        load("tracking/reversing/detector_reversing.toml"),
        SimConfig::preset(Preset::Central),
    ));
    let mut solenoid = load("detector.toml");
    solenoid.field = Field::Uniform {
        b_tesla: [0.0, 0.0, 2.0],
    };
    all.push((
        "solenoid (the uniform detector's planes)",
        solenoid,
        SimConfig::preset(Preset::Central),
    ));
    all
}

#[test]
fn the_fit_kernel_on_the_cpu_gives_the_cpu_fitters_fits() {
    let s = seed();
    let mut prefit = 0;
    for (name, det, sim) in all_detectors() {
        let (fitter, found) = found_tracks(&det, &sim, s, 1);
        let all = with_variants(&found, det.planes.len());
        let refs: Vec<&[FitHit]> = all.iter().map(|v| &v[..]).collect();
        let mut cpu = Vec::new();
        fitter.fit_batch(&refs, &mut cpu);
        let kernel = kernel_fits(&fitter, &refs);
        let a = compare(name, &cpu, &kernel);
        // Compiled for the CPU, the kernel's mathematical functions are the CPU fitter's:
        // every fit is the same to the bit.
        assert_eq!(a.bit_identical, a.ok, "{name}: {a:?}");
        assert!(found.len() > 300, "{name}: {} tracks found", found.len());
        assert!(a.ok * 10 > all.len() * 9, "{name}: {a:?}");
        assert!(
            a.ok < all.len(),
            "{name}: the unfittable variants were fitted"
        );
        // The accepted tracks' fit where the field is a map: made again with every
        // plane's scattering at the first fit's q/p (`FitConfig::scatter_at_prefit`).
        let cfg = FinderConfig::from_detector(&det, 0.5);
        if let Some(track_cfg) = cfg.track_fit().filter(|f| f.scatter_at_prefit) {
            let track_fitter = KalmanFitter::new(&det, track_cfg);
            let mut again = Vec::new();
            track_fitter.fit_batch(&refs, &mut again);
            let kernel = kernel_fits(&track_fitter, &refs);
            let b = compare(name, &again, &kernel);
            assert_eq!(b.bit_identical, b.ok, "{name}, the tracks' fit: {b:?}");
            assert_eq!(b.ok, a.ok, "{name}, the tracks' fit: {b:?}");
            // Not the candidates' fit: most chi-squares move.
            let moved = cpu
                .iter()
                .zip(&again)
                .filter(|(c, t)| c.ok && t.ok && c.chi2 != t.chi2)
                .count();
            assert!(moved * 2 > b.ok, "{name}: {moved} of {} fits moved", b.ok);
            prefit += 1;
        }
    }
    assert!(prefit >= 2, "{prefit} detectors with a field map");
}

/// The exchange's trial fits, whose retry is made only within a bound
/// (`kalman_fit_track_within`): the kernel's fits are the CPU's
/// (`KalmanFitter::fit_each_retry_within`) to the bit, on found tracks and on mixed ones
/// (one track's upstream hits joined to another's downstream ones, as an exchange makes
/// them), with bounds below, about and above their fits' chi-squares, and the bounds do
/// change fits (retries spared).
#[test]
fn the_fit_kernel_retries_within_a_bound_as_the_cpu() {
    let s = seed();
    for (name, det, sim) in all_detectors().into_iter().take(3) {
        let (fitter, found) = found_tracks(&det, &sim, s, 1);
        let mut all: Vec<Vec<FitHit>> = found.iter().take(400).cloned().collect();
        let n = all.len();
        for i in 0..n {
            let (a, b) = (&all[i], &all[(i * 7 + 3) % n]);
            let cut = a[a.len() / 2].plane;
            let mut m: Vec<FitHit> = a.iter().filter(|h| h.plane < cut).copied().collect();
            m.extend(b.iter().filter(|h| h.plane >= cut).copied());
            all.push(m);
        }
        let refs: Vec<&[FitHit]> = all.iter().map(|v| &v[..]).collect();
        let mut plain = Vec::new();
        fitter.fit_batch(&refs, &mut plain);
        let items: Vec<usize> = (0..refs.len()).collect();
        let mut changed = 0;
        for scale in [0.0f32, 0.5, 2.0] {
            let within: Vec<f32> = plain
                .iter()
                .map(|p| if p.ok { p.chi2 as f32 * scale } else { 10.0 })
                .collect();
            let mut cpu = vec![FitOutput::default(); refs.len()];
            fitter.fit_each_retry_within(&items, |&k| refs[k], |&k| within[k], &mut cpu);
            let kernel = kernel_fits_within(&fitter, &refs, Some(&within));
            let a = compare(name, &cpu, &kernel);
            assert_eq!(a.bit_identical, a.ok, "{name} at {scale}: {a:?}");
            changed += cpu
                .iter()
                .zip(&plain)
                .filter(|(c, p)| c.chi2.to_bits() != p.chi2.to_bits())
                .count();
        }
        assert!(changed > 0, "{name}: no retry was spared");
    }
}
