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
