//! What the GPU tests share: the device, the seed of their fresh events, the fixtures.

#![allow(dead_code)]

use std::path::PathBuf;

use trigd::gpu::{detect, BackendChoice, GpuDevice};
use trigd::tracking::geometry::Detector;

/// The first GPU (the tests that call this are ignored without one).
pub fn device() -> GpuDevice {
    detect(BackendChoice::Gpu)
        .expect("a GPU is needed for this test")
        .into_iter()
        .next()
        .expect("detect(Gpu) returned no device")
}

/// Fresh events each run; the seed is printed so a failure can be replayed with
/// `TRIGD_TEST_SEED`.
pub fn seed() -> u64 {
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

/// A fixture, relative to `TRIGD_FIXTURES` or `fixtures/` of the working directory.
pub fn fixture(rel: &str) -> PathBuf {
    let base = std::env::var_os("TRIGD_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("fixtures"));
    base.join(rel)
}

/// A shipped detector.
pub fn load(rel: &str) -> Detector {
    Detector::from_toml_file(fixture(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e} (run from the repository root)"))
}

/// The shipped spectrometer, its derived finder configuration at 1 GeV/c, and `n` fresh
/// minimum-bias events' hits.
pub fn minbias_spectrometer(
    n: u64,
) -> (
    Detector,
    trigd::tracking::reco::FinderConfig,
    Vec<Vec<trigd::frame::HitRecord>>,
) {
    use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};
    let det = load("detector.toml");
    let cfg = trigd::tracking::reco::FinderConfig::from_detector(&det, 1.0);
    let events = simulate_events(&det, &SimConfig::preset(Preset::Minbias), seed(), 0, n)
        .map(|e| e.hits)
        .collect();
    (det, cfg, events)
}
