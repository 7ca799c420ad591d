//! The inverse operator, built numerically as MNE-Python 1.13 builds it for EEG with an
//! average reference projection: `make_inverse_operator(info, fwd, noise_cov, loose=1.0,
//! depth=0.8)`, then `prepare_inverse_operator(inv, nave=1, lambda2, method)` and
//! `_assemble_kernel`, so that `apply_inverse_raw(raw, inv, lambda2, method, pick_ori=None)`
//! and [`InverseKernel::apply_f64`] give the same numbers.
//!
//! Steps (names follow MNE's `minimum_norm/inverse.py`, `cov.py`, `forward/forward.py`):
//! 1. projector `P = I - 1 1^T / n` (the average reference);
//! 2. noise covariance `P C P`, its rank estimated as MNE does (singular values above
//!    `n * max * eps`; n - 1 with the projection), eigen-decomposed, the smallest
//!    `n - rank` eigenvalues set to zero; whitener `W` = rows `u_i^T / sqrt(e_i)` for
//!    `e_i > 0`, zero rows otherwise (`compute_whitener(pca="white")`);
//! 3. depth prior from the unwhitened lead field (`compute_depth_prior` with
//!    `limit_depth_chs=True`, `combine_xyz="spectral"`, `limit=10`, `exp=0.8`);
//! 4. whitened, weighted gain `W G diag(sqrt(depth))`, scaled so its squared Frobenius
//!    norm equals the number of non-zero noise eigenvalues (`scale`, trace normalisation);
//! 5. its thin SVD `U s V^T`, `reginv = s / (s^2 + lambda2)` over the first `n_nzero`;
//! 6. kernel `K = diag(source_std) V diag(reginv) U^T W P`;
//! 7. noise normalisation for dSPM (`reginv`) and sLORETA (`reginv * sqrt(1 + s^2/lambda2)`),
//!    combined over the three orientations; eLORETA in [`super::eloreta`].
//!
//! The noise covariance is used as given (MNE does not regularise it in
//! `make_inverse_operator`; regularise before export if wanted).

use faer::{Mat, MatRef, Side};

use super::eloreta::{eloreta_kernel, EloretaOptions};
use super::inputs::EegInputs;
use super::kernel::InverseKernel;

/// Inverse methods, as MNE names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Minimum-norm estimate.
    Mne,
    /// Dynamic statistical parametric mapping (noise-normalised MNE).
    DSpm,
    /// Standardised low-resolution tomography.
    SLoreta,
    /// Exact low-resolution tomography (iterative weights).
    ELoreta,
}

impl Method {
    pub const ALL: [Method; 4] = [Method::Mne, Method::DSpm, Method::SLoreta, Method::ELoreta];

    /// MNE's spelling: "MNE", "dSPM", "sLORETA", "eLORETA".
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Mne => "MNE",
            Method::DSpm => "dSPM",
            Method::SLoreta => "sLORETA",
            Method::ELoreta => "eLORETA",
        }
    }

    /// Stable code used in the kernel cache file.
    pub(crate) fn code(self) -> u8 {
        match self {
            Method::Mne => 0,
            Method::DSpm => 1,
            Method::SLoreta => 2,
            Method::ELoreta => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.code() == code)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Method {
    type Err = InverseError;
    /// Case-insensitive: "mne", "dspm", "sloreta", "eloreta".
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| InverseError::UnknownMethod(s.to_string()))
    }
}

/// Why an inverse operator could not be built.
#[derive(Debug, thiserror::Error)]
pub enum InverseError {
    #[error("unknown inverse method {0:?}: use MNE, dSPM, sLORETA or eLORETA")]
    UnknownMethod(String),
    #[error("lambda2 must be finite and > 0, got {0}")]
    Lambda2(f64),
    #[error("the projected noise covariance has rank 0: nothing to whiten with")]
    RankZero,
    #[error("{what} did not converge")]
    Decomposition { what: &'static str },
    #[error("eLORETA: source {source_index} weight matrix is not positive semi-definite")]
    EloretaNotPsd { source_index: usize },
}

/// Options of the build; the defaults are MNE's (`depth=0.8`, `limit=10`, eLORETA
/// `eps=1e-6`, `max_iter=20`, `force_equal=False`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InverseOptions {
    pub depth_exponent: f64,
    pub depth_limit: f64,
    pub eloreta: EloretaOptions,
}

impl Default for InverseOptions {
    fn default() -> Self {
        Self {
            depth_exponent: 0.8,
            depth_limit: 10.0,
            eloreta: EloretaOptions::default(),
        }
    }
}

/// Average-reference projector and noise whitener, as MNE computes them.
pub(crate) struct Whitening {
    /// `I - 1 1^T / n`.
    pub projector: Mat<f64>,
    /// `[n, n]`; rows for zeroed eigenvalues are zero.
    pub whitener: Mat<f64>,
    /// Number of non-zero noise eigenvalues (`n_nzero` in MNE).
    pub n_nzero: usize,
}

pub(crate) fn whitening(noise_covariance: &[f64], n: usize) -> Result<Whitening, InverseError> {
    let inv_n = 1.0 / n as f64;
    let projector = Mat::from_fn(n, n, |i, j| if i == j { 1.0 - inv_n } else { -inv_n });
    let c = MatRef::from_row_major_slice(noise_covariance, n, n);
    let cp = &projector * c * projector.transpose();
    // Rank as `_estimate_rank_from_s(tol="auto")`: count s > n * max(s) * eps.
    let sv = cp
        .singular_values()
        .map_err(|_| InverseError::Decomposition {
            what: "noise covariance SVD",
        })?;
    let s_max = sv.iter().fold(0.0f64, |m, &v| m.max(v));
    let tol = sv.len() as f64 * s_max * f64::EPSILON;
    let rank = sv.iter().filter(|&&v| v > tol).count();
    if rank == 0 {
        return Err(InverseError::RankZero);
    }
    let evd = cp
        .self_adjoint_eigen(Side::Lower)
        .map_err(|_| InverseError::Decomposition {
            what: "noise covariance eigendecomposition",
        })?;
    let mut eig: Vec<f64> = evd.S().column_vector().iter().copied().collect();
    let u = evd.U();
    // `eig[:-rank] = 0` (ascending order), then `compute_whitener` zeroes what is not > 0.
    for e in eig.iter_mut().take(n - rank) {
        *e = 0.0;
    }
    let whitener = Mat::from_fn(n, n, |i, j| {
        if eig[i] > 0.0 {
            u[(j, i)] / eig[i].sqrt()
        } else {
            0.0
        }
    });
    let n_nzero = eig.iter().filter(|&&e| e > 0.0).count();
    Ok(Whitening {
        projector,
        whitener,
        n_nzero,
    })
}

/// Depth prior per source (`compute_depth_prior`, spectral norm of `G_k^T G_k`, all EEG
/// channels, unwhitened lead field), before repetition over the three orientations.
pub(crate) fn depth_prior(
    gain: MatRef<'_, f64>,
    exponent: f64,
    limit: f64,
) -> Result<Vec<f64>, InverseError> {
    let n_sources = gain.ncols() / 3;
    let mut w = Vec::with_capacity(n_sources);
    for s in 0..n_sources {
        let gk = gain.subcols(3 * s, 3);
        let gtg = gk.transpose() * gk;
        let eig =
            gtg.self_adjoint_eigenvalues(Side::Lower)
                .map_err(|_| InverseError::Decomposition {
                    what: "depth prior 3x3 eigenvalues",
                })?;
        let d = eig.iter().fold(0.0f64, |m, &v| m.max(v.abs()));
        w.push(1.0 / d);
    }
    let mut ws = w.clone();
    ws.sort_by(f64::total_cmp);
    let weight_limit = limit * limit;
    let mut lim = ws[n_sources - 1];
    if ws[n_sources - 1] > weight_limit * ws[0] {
        if let Some(&v) = ws.iter().find(|&&v| v > weight_limit * ws[0]) {
            lim = v;
        }
    }
    Ok(w.into_iter()
        .map(|v| (v / lim).min(1.0).powf(exponent))
        .collect())
}

/// `reginv = s / (s^2 + lambda2)` over the first `n_nzero` singular values, 0 after.
pub(crate) fn reginv(sing: &[f64], n_nzero: usize, lambda2: f64) -> Vec<f64> {
    sing.iter()
        .enumerate()
        .map(|(i, &s)| {
            if i < n_nzero && s > 0.0 {
                s / (s * s + lambda2)
            } else {
                0.0
            }
        })
        .collect()
}

/// `diag(reginv) U^T W P`: `[k, n]`, what the eigen leads multiply.
pub(crate) fn eigen_fields_trans(
    u: MatRef<'_, f64>,
    reginv: &[f64],
    white: &Whitening,
) -> Mat<f64> {
    let wp = &white.whitener * &white.projector;
    let mut trans = u.transpose() * &wp;
    for (i, &r) in reginv.iter().enumerate() {
        for j in 0..trans.ncols() {
            trans[(i, j)] *= r;
        }
    }
    trans
}

pub(crate) fn row_major(m: MatRef<'_, f64>) -> Vec<f64> {
    let mut out = Vec::with_capacity(m.nrows() * m.ncols());
    for i in 0..m.nrows() {
        for j in 0..m.ncols() {
            out.push(m[(i, j)]);
        }
    }
    out
}

impl InverseKernel {
    /// Build the kernel for `method` with MNE's defaults (see [`InverseOptions`]).
    pub fn build(inputs: &EegInputs, method: Method, lambda2: f64) -> Result<Self, InverseError> {
        Self::build_with(inputs, method, lambda2, &InverseOptions::default())
    }

    /// Build the kernel with explicit options.
    pub fn build_with(
        inputs: &EegInputs,
        method: Method,
        lambda2: f64,
        options: &InverseOptions,
    ) -> Result<Self, InverseError> {
        if !(lambda2.is_finite() && lambda2 > 0.0) {
            return Err(InverseError::Lambda2(lambda2));
        }
        let n = inputs.n_channels;
        let n_sources = inputs.n_sources;
        let n_cols = 3 * n_sources;
        let g = MatRef::from_row_major_slice(&inputs.lead_field, n, n_cols);
        let white = whitening(&inputs.noise_covariance, n)?;
        let gw = &white.whitener * g;
        if method == Method::ELoreta {
            // eLORETA ignores the depth prior; orientation prior is 1 for loose=1.
            let kernel = eloreta_kernel(gw.as_ref(), &white, lambda2, &options.eloreta)?;
            return Ok(Self {
                n_channels: n,
                n_sources,
                kernel,
                source_scale: vec![1.0; n_sources],
            });
        }
        let depth = depth_prior(g, options.depth_exponent, options.depth_limit)?;
        let mut source_std: Vec<f64> = (0..n_cols).map(|j| depth[j / 3].sqrt()).collect();
        let mut gain = Mat::from_fn(n, n_cols, |i, j| gw[(i, j)] * source_std[j]);
        let trace_grgt: f64 = (0..n_cols)
            .map(|j| gain.col(j).iter().map(|v| v * v).sum::<f64>())
            .sum();
        let scale = (white.n_nzero as f64 / trace_grgt).sqrt();
        for v in source_std.iter_mut() {
            *v *= scale;
        }
        for j in 0..n_cols {
            for i in 0..n {
                gain[(i, j)] *= scale;
            }
        }
        let svd = gain.thin_svd().map_err(|_| InverseError::Decomposition {
            what: "SVD of the whitened weighted lead field",
        })?;
        let sing: Vec<f64> = svd.S().column_vector().iter().copied().collect();
        let reg = reginv(&sing, white.n_nzero, lambda2);
        let trans = eigen_fields_trans(svd.U(), &reg, &white);
        let eigen_leads = svd.V(); // [3 n_sources, k]
        let mut k = eigen_leads * &trans;
        for (r, &sd) in source_std.iter().enumerate() {
            for c in 0..n {
                k[(r, c)] *= sd;
            }
        }
        let source_scale = match method {
            Method::Mne => vec![1.0; n_sources],
            Method::DSpm | Method::SLoreta => {
                let weight: Vec<f64> = if method == Method::DSpm {
                    reg.clone()
                } else {
                    reg.iter()
                        .zip(&sing)
                        .map(|(r, s)| r * (1.0 + s * s / lambda2).sqrt())
                        .collect()
                };
                (0..n_sources)
                    .map(|s| {
                        let sq: f64 = (3 * s..3 * s + 3)
                            .map(|row| {
                                weight
                                    .iter()
                                    .enumerate()
                                    .map(|(m, w)| {
                                        let v = source_std[row] * eigen_leads[(row, m)] * w;
                                        v * v
                                    })
                                    .sum::<f64>()
                            })
                            .sum();
                        1.0 / sq.sqrt().abs()
                    })
                    .collect()
            }
            Method::ELoreta => unreachable!("handled above"),
        };
        Ok(Self {
            n_channels: n,
            n_sources,
            kernel: row_major(k.as_ref()),
            source_scale,
        })
    }
}
