//! Shared by the tests of the GPU fit (`tests/gpu_tracking_fit.rs`, on a GPU) and of its
//! kernel source run on the CPU (`tests/fit_kernel_on_cpu.rs`): the shipped detectors, the
//! CPU finder's tracks on fresh simulated central events and variants of them that reach
//! the fit's other paths, and the comparison of two fits track by track.
//!
//! Tolerance. The GPU kernel mirrors the CPU's single-precision operations one by one and
//! is compiled without fused multiply-adds, so the fits should agree to the last bits; what
//! is allowed is float32 noise far below any physical meaning: every state component
//! within 1e-3 of its standard error (the CPU's own single-precision fit is checked against
//! its double-precision reference to 2e-2 of it), every covariance entry within 1e-4 of
//! `sqrt(C_ii C_jj)`, the chi-square within 1e-3 relative, ndf, z and the ok flag equal.

#![allow(dead_code)]

use crate::gpu_common::load;
use trigd::tracking::geometry::{Detector, Field};
use trigd::tracking::kalman::{tri, FitHit, FitOutput, KalmanFitter};
use trigd::tracking::reco::{FinderConfig, Reconstructor};
use trigd::tracking::simulate::{simulate_events, Preset, SimConfig};

/// The shipped detectors: name, geometry, central-event simulation.
pub fn detectors() -> Vec<(&'static str, Detector, SimConfig)> {
    vec![
        (
            "uniform (detector.toml)",
            load("detector.toml"),
            SimConfig::preset(Preset::Central),
        ),
        (
            "dipole map",
            load("tracking/dipole/detector_dipole.toml"),
            SimConfig::preset(Preset::Central),
        ),
        (
            "forward map",
            load("tracking/forward/detector_forward.toml"),
            SimConfig::forward(Preset::Central),
        ),
        (
            "no field (the uniform detector's planes)",
            {
                let mut det = load("detector.toml");
                det.field = Field::Uniform { b_tesla: [0.0; 3] };
                det
            },
            SimConfig::preset(Preset::Central),
        ),
    ]
}

/// The CPU finder's tracks of `n_events` fresh central events as fit inputs, and the
/// reconstruction's fitter.
pub fn found_tracks(
    det: &Detector,
    sim: &SimConfig,
    seed: u64,
    n_events: u64,
) -> (KalmanFitter, Vec<Vec<FitHit>>) {
    let mut reco = Reconstructor::new(det, FinderConfig::from_detector(det, 0.5));
    let mut tracks = Vec::new();
    let mut out = Vec::new();
    for ev in simulate_events(det, sim, seed, 0, n_events) {
        reco.reconstruct(&ev.hits, &mut tracks);
        for t in &tracks {
            out.push(
                t.hits
                    .iter()
                    .map(|&i| {
                        let h = &ev.hits[i as usize];
                        FitHit {
                            plane: h.plane,
                            x_mm: h.x_mm,
                            y_mm: h.y_mm,
                        }
                    })
                    .collect(),
            );
        }
    }
    (reco.fitter().clone(), out)
}

/// The found tracks and variants that reach the fit's other paths: without the
/// second-to-last hit (the seed spans a missing plane: the scattering of skipped planes),
/// without the second hit, truncated to three hits, and a few that cannot be fitted (two
/// hits, planes out of order, a plane past the detector, a non-finite coordinate).
pub fn with_variants(found: &[Vec<FitHit>], n_planes: usize) -> Vec<Vec<FitHit>> {
    let mut all = found.to_vec();
    for (k, t) in found.iter().enumerate() {
        let n = t.len();
        if n >= 5 {
            let mut v = t.clone();
            v.remove(n - 2);
            all.push(v);
            let mut v = t.clone();
            v.remove(1);
            all.push(v);
        }
        if k % 7 == 0 && n >= 3 {
            all.push(t[n - 3..].to_vec());
        }
        if k % 97 == 0 && n >= 4 {
            all.push(t[..2].to_vec());
            let mut v = t.clone();
            v.swap(1, 2);
            all.push(v);
            let mut v = t.clone();
            v[n - 1].plane = n_planes as u16;
            all.push(v);
            let mut v = t.clone();
            v[1].x_mm = f32::NAN;
            all.push(v);
        }
    }
    all
}

#[derive(Debug, Default)]
pub struct Agreement {
    pub tracks: usize,
    pub ok: usize,
    pub bit_identical: usize,
    /// Largest |GPU - CPU| / sigma over the state components.
    pub state_sigma_max: f64,
    /// Largest |GPU - CPU| / sqrt(C_ii C_jj) over the covariance entries.
    pub cov_rel_max: f64,
    /// Largest |GPU - CPU| / |chi2|.
    pub chi2_rel_max: f64,
    /// Fits the CPU marks ok with a negative chi-square.
    pub negative_chi2: usize,
}

pub fn compare(what: &str, cpu: &[FitOutput], gpu: &[FitOutput]) -> Agreement {
    assert_eq!(cpu.len(), gpu.len(), "{what}");
    let mut a = Agreement {
        tracks: cpu.len(),
        ..Agreement::default()
    };
    for (k, (c, g)) in cpu.iter().zip(gpu).enumerate() {
        assert_eq!(c.ok, g.ok, "{what} track {k}: ok {} vs {}", c.ok, g.ok);
        assert_eq!(c.ndf, g.ndf, "{what} track {k}");
        if !c.ok {
            // Unfittable candidates give the empty record; failed fits their numbers.
            if *c == FitOutput::default() {
                assert_eq!(*g, FitOutput::default(), "{what} track {k}");
            }
            continue;
        }
        a.ok += 1;
        assert_eq!(c.z_mm, g.z_mm, "{what} track {k}");
        if c == g {
            a.bit_identical += 1;
        }
        // A difference in units of a scale (zero where the values are equal, also where
        // the CPU's scale is zero).
        let ratio = |d: f64, scale: f64| if d == 0.0 { 0.0 } else { d / scale };
        for i in 0..5 {
            let sigma = c.cov[tri(i, i)].sqrt();
            let d = ratio((g.state[i] - c.state[i]).abs(), sigma);
            a.state_sigma_max = a.state_sigma_max.max(d);
            assert!(
                d <= 1e-3,
                "{what} track {k} param {i}: GPU {} CPU {} ({d} sigma)",
                g.state[i],
                c.state[i]
            );
        }
        for i in 0..5 {
            for j in 0..=i {
                let scale = (c.cov[tri(i, i)] * c.cov[tri(j, j)]).sqrt();
                let d = ratio((g.cov[tri(i, j)] - c.cov[tri(i, j)]).abs(), scale);
                a.cov_rel_max = a.cov_rel_max.max(d);
                assert!(
                    d <= 1e-4,
                    "{what} track {k} cov ({i},{j}): GPU {} CPU {}",
                    g.cov[tri(i, j)],
                    c.cov[tri(i, j)]
                );
            }
        }
        // The CPU marks a few fits ok whose chi-square came out negative (a covariance
        // that lost its positive definiteness in single precision): counted, and compared
        // as the others.
        if c.chi2 < 0.0 {
            a.negative_chi2 += 1;
        }
        let d = (g.chi2 - c.chi2).abs();
        a.chi2_rel_max = a.chi2_rel_max.max(ratio(d, c.chi2.abs()));
        assert!(
            d <= 1e-3 * c.chi2.abs() + 1e-6,
            "{what} track {k} chi2: GPU {} CPU {}",
            g.chi2,
            c.chi2
        );
    }
    eprintln!("{what}: {a:?}");
    a
}
