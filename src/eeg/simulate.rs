//! Simulated EEG with known truth: one current dipole on the source space, switched on in
//! bursts (a sinusoid under a Gaussian envelope), projected through the lead field, plus
//! sensor noise (white, or coloured by a noise covariance through its Cholesky factor).
//! Used by `trigd simulate eeg` to make recordings whose answer is known, and by tests.
//!
//! Units: lead field in V/(A·m) (MNE's convention, `[n_channels, 3 * n_sources]`, x/y/z
//! columns per source), source positions in metres, dipole moment in nAm, sensor data in
//! volts.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// Errors from loading inputs or simulating.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Input { path: PathBuf, reason: String },
    #[error("{0}")]
    Spec(String),
}

/// A float NPY array read whole: shape and values in C (row-major) order.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// Reads a `float32` or `float64` NPY file (either byte order, C or Fortran order).
pub fn read_npy_f64(path: &Path) -> Result<NpyArray, SimulateError> {
    let io = |source| SimulateError::Io {
        path: path.to_path_buf(),
        source,
    };
    let input = |reason: String| SimulateError::Input {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(io)?;
    crate::npy::check_header(&bytes).map_err(|e| input(e.to_string()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(io)?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let order = npy.order();
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => {
            return Err(input(format!(
                "dtype {} is not float32/float64",
                other.descr()
            )))
        }
    };
    let data: Vec<f64> = if descr.ends_with("f8") {
        npy.into_vec::<f64>().map_err(io)?
    } else if descr.ends_with("f4") {
        npy.into_vec::<f32>()
            .map_err(io)?
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        return Err(input(format!("dtype {descr} is not float32/float64")));
    };
    if data.iter().any(|v| !v.is_finite()) {
        return Err(input("contains NaN or infinite values".into()));
    }
    let data = if order == npyz::Order::Fortran && shape.len() == 2 {
        let (r, c) = (shape[0], shape[1]);
        let mut t = vec![0.0; data.len()];
        for i in 0..r {
            for j in 0..c {
                t[i * c + j] = data[j * r + i];
            }
        }
        t
    } else if order == npyz::Order::Fortran && shape.len() > 2 {
        return Err(input(
            "Fortran-ordered arrays of more than 2 dimensions are not supported".into(),
        ));
    } else {
        data
    };
    Ok(NpyArray { shape, data })
}

/// The dipole and its time course.
#[derive(Debug, Clone, PartialEq)]
pub struct DipoleSpec {
    /// Requested position; the dipole is put on the nearest source.
    pub position_mm: [f64; 3],
    /// Orientation (normalised here); `None` is radial (from the origin to the source).
    pub orientation: Option<[f64; 3]>,
    /// Peak moment in nAm.
    pub amplitude_nam: f64,
    /// Frequency of the sinusoid in Hz.
    pub burst_hz: f64,
    /// Standard deviation of the Gaussian envelope in ms.
    pub burst_sigma_ms: f64,
    /// Centres of the bursts, seconds from the first sample.
    pub onsets_s: Vec<f64>,
}

/// Sensor noise.
#[derive(Debug, Clone, PartialEq)]
pub enum SensorNoise {
    None,
    /// Independent Gaussian noise with this standard deviation in volts on every channel.
    White {
        sd_v: f64,
    },
    /// Gaussian noise with this covariance (`[n, n]`, V²), drawn as `L z` with `C = L Lᵀ`.
    Covariance(Vec<f64>),
}

/// A simulation's output and truth.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub n_channels: usize,
    pub n_samples: usize,
    /// Sensor data with noise, channel-major `[n_channels, n_samples]`, volts.
    pub data: Vec<f64>,
    /// The dipole's contribution alone, same layout.
    pub clean: Vec<f64>,
    /// Dipole moment over time, A·m.
    pub moment_am: Vec<f64>,
    pub source_index: usize,
    pub source_position_m: [f64; 3],
    /// Distance from the requested position to the source used.
    pub distance_mm: f64,
    pub orientation: [f64; 3],
}

/// Index of the source nearest to `position_mm`, and its distance in mm.
pub fn nearest_source(positions_m: &[[f64; 3]], position_mm: [f64; 3]) -> Option<(usize, f64)> {
    positions_m
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let d = ((p[0] * 1e3 - position_mm[0]).powi(2)
                + (p[1] * 1e3 - position_mm[1]).powi(2)
                + (p[2] * 1e3 - position_mm[2]).powi(2))
            .sqrt();
            (i, d)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Dipole moment (A·m) at each sample: the sum over bursts of
/// `amplitude * exp(-(t - onset)² / (2 sigma²)) * cos(2π f (t - onset))`.
pub fn burst_moment(spec: &DipoleSpec, fs_hz: f64, n_samples: usize) -> Vec<f64> {
    let q = spec.amplitude_nam * 1e-9;
    let sigma_s = spec.burst_sigma_ms * 1e-3;
    (0..n_samples)
        .map(|k| {
            let t = k as f64 / fs_hz;
            spec.onsets_s
                .iter()
                .map(|&on| {
                    let u = t - on;
                    (-(u * u) / (2.0 * sigma_s * sigma_s)).exp()
                        * (2.0 * std::f64::consts::PI * spec.burst_hz * u).cos()
                })
                .sum::<f64>()
                * q
        })
        .collect()
}

/// Lower Cholesky factor of a symmetric positive definite `[n, n]` matrix.
pub fn cholesky(c: &[f64], n: usize) -> Result<Vec<f64>, SimulateError> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum();
            if i == j {
                let d = c[i * n + i] - s;
                if d.is_nan() || d <= 0.0 {
                    return Err(SimulateError::Spec(format!(
                        "noise covariance is not positive definite (pivot {i} is {d:e}); \
                         regularise it or use white noise"
                    )));
                }
                l[i * n + i] = d.sqrt();
            } else {
                l[i * n + j] = (c[i * n + j] - s) / l[j * n + j];
            }
        }
    }
    Ok(l)
}

/// Runs a simulation: `lead_field` `[n_channels, 3 * n_sources]` row-major,
/// `positions_m` `[n_sources]`.
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    lead_field: &[f64],
    n_channels: usize,
    positions_m: &[[f64; 3]],
    dipole: &DipoleSpec,
    noise: &SensorNoise,
    fs_hz: f64,
    n_samples: usize,
    seed: u64,
) -> Result<Simulation, SimulateError> {
    let n_sources = positions_m.len();
    if lead_field.len() != n_channels * 3 * n_sources || n_channels == 0 || n_sources == 0 {
        return Err(SimulateError::Spec(format!(
            "lead field has {} values, expected {n_channels} channels x 3 x {n_sources} sources",
            lead_field.len()
        )));
    }
    if !(fs_hz.is_finite() && fs_hz > 0.0) || n_samples == 0 {
        return Err(SimulateError::Spec(format!(
            "sample rate {fs_hz} Hz and {n_samples} samples"
        )));
    }
    if !(dipole.amplitude_nam.is_finite()
        && dipole.burst_hz.is_finite()
        && dipole.burst_sigma_ms > 0.0)
    {
        return Err(SimulateError::Spec(format!("dipole {dipole:?}")));
    }
    let (s, distance_mm) = nearest_source(positions_m, dipole.position_mm)
        .ok_or_else(|| SimulateError::Spec("no sources".into()))?;
    let pos = positions_m[s];
    let raw = dipole.orientation.unwrap_or(pos);
    let norm = (raw[0] * raw[0] + raw[1] * raw[1] + raw[2] * raw[2]).sqrt();
    let orientation = if norm > 0.0 && norm.is_finite() {
        [raw[0] / norm, raw[1] / norm, raw[2] / norm]
    } else if dipole.orientation.is_none() {
        [0.0, 0.0, 1.0]
    } else {
        return Err(SimulateError::Spec(format!(
            "orientation {raw:?} has no direction"
        )));
    };
    // Gain of the oriented dipole on each channel: G[:, 3s..3s+3] . orientation.
    let gain: Vec<f64> = (0..n_channels)
        .map(|c| {
            let row = &lead_field[c * 3 * n_sources + 3 * s..c * 3 * n_sources + 3 * s + 3];
            row[0] * orientation[0] + row[1] * orientation[1] + row[2] * orientation[2]
        })
        .collect();
    let moment_am = burst_moment(dipole, fs_hz, n_samples);
    let mut clean = vec![0.0; n_channels * n_samples];
    for c in 0..n_channels {
        for t in 0..n_samples {
            clean[c * n_samples + t] = gain[c] * moment_am[t];
        }
    }
    let mut data = clean.clone();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    match noise {
        SensorNoise::None => {}
        SensorNoise::White { sd_v } => {
            for v in &mut data {
                let z: f64 = StandardNormal.sample(&mut rng);
                *v += sd_v * z;
            }
        }
        SensorNoise::Covariance(cov) => {
            if cov.len() != n_channels * n_channels {
                return Err(SimulateError::Spec(format!(
                    "noise covariance has {} values, expected {n_channels} x {n_channels}",
                    cov.len()
                )));
            }
            let l = cholesky(cov, n_channels)?;
            let mut z = vec![0.0; n_channels];
            for t in 0..n_samples {
                z.iter_mut()
                    .for_each(|v| *v = StandardNormal.sample(&mut rng));
                for c in 0..n_channels {
                    let e: f64 = (0..=c).map(|k| l[c * n_channels + k] * z[k]).sum();
                    data[c * n_samples + t] += e;
                }
            }
        }
    }
    Ok(Simulation {
        n_channels,
        n_samples,
        data,
        clean,
        moment_am,
        source_index: s,
        source_position_m: pos,
        distance_mm,
        orientation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_reproduces_the_covariance() {
        let c = [4.0, 2.0, 0.6, 2.0, 5.0, 1.0, 0.6, 1.0, 3.0];
        let l = cholesky(&c, 3).expect("spd");
        for i in 0..3 {
            for j in 0..3 {
                let v: f64 = (0..3).map(|k| l[i * 3 + k] * l[j * 3 + k]).sum();
                assert!((v - c[i * 3 + j]).abs() < 1e-12);
            }
        }
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_err());
    }

    #[test]
    fn coloured_noise_has_the_requested_covariance() {
        let n = 3;
        let cov = vec![4e-12, 2e-12, 0.0, 2e-12, 5e-12, 1e-12, 0.0, 1e-12, 3e-12];
        let lf = vec![0.0; n * 3];
        let dip = DipoleSpec {
            position_mm: [0.0; 3],
            orientation: None,
            amplitude_nam: 0.0,
            burst_hz: 10.0,
            burst_sigma_ms: 100.0,
            onsets_s: vec![],
        };
        let ns = 40_000;
        let sim = simulate(
            &lf,
            n,
            &[[0.0; 3]],
            &dip,
            &SensorNoise::Covariance(cov.clone()),
            1000.0,
            ns,
            5,
        )
        .expect("sim");
        for i in 0..n {
            for j in 0..n {
                let v: f64 = (0..ns)
                    .map(|t| sim.data[i * ns + t] * sim.data[j * ns + t])
                    .sum::<f64>()
                    / ns as f64;
                assert!((v - cov[i * n + j]).abs() < 0.05 * 5e-12, "({i},{j}) {v:e}");
            }
        }
    }
}
