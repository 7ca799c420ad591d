//! eLORETA weights and kernel, as MNE-Python 1.13's `_compute_eloreta` computes them for a
//! free-orientation (loose=1) operator with `force_equal=False`: one 3x3 weight matrix per
//! source, fitted by fixed-point iteration (Pascual-Marqui's scheme, Nolte's code), then
//! the kernel from the SVD of the whitened lead field times the weights' square roots.
//!
//! Each iteration: normalise `R` so that `trace(G R G^T) = n_nzero`; `N` = the stabilised
//! inverse of `G R G^T + lambda2 I` over its `n_nzero` largest eigenvalues; then per source
//! `R_s = (G_s^T N G_s)^(-1/2)` (eigenvalues at or below `1e-7 * max` dropped); stop when
//! the relative change of `R` falls under `eps`. The depth prior is not used (eLORETA
//! compensates depth itself); the orientation prior is 1 for free orientation, so
//! re-applying it is the identity and is skipped.

use faer::{Mat, MatRef, Side};

use super::inverse::{eigen_fields_trans, reginv, row_major, InverseError, Whitening};

/// MNE's `eloreta_options` defaults: `eps=1e-6`, `max_iter=20`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EloretaOptions {
    pub eps: f64,
    pub max_iter: usize,
}

impl Default for EloretaOptions {
    fn default() -> Self {
        Self {
            eps: 1e-6,
            max_iter: 20,
        }
    }
}

/// Per-source symmetric 3x3 weights, row-major.
type Weights = Vec<[f64; 9]>;

/// `_sym_mat_pow(A, power, rcond=1e-7)` for a symmetric 3x3 (lower triangle read).
fn sym_pow3(a: &[f64; 9], power: f64, source_index: usize) -> Result<[f64; 9], InverseError> {
    let m = MatRef::from_row_major_slice(a.as_slice(), 3, 3);
    let evd = m
        .self_adjoint_eigen(Side::Lower)
        .map_err(|_| InverseError::Decomposition {
            what: "eLORETA 3x3 eigendecomposition",
        })?;
    let s: Vec<f64> = evd.S().column_vector().iter().copied().collect();
    let u = evd.U();
    let limit = s[2] * 1e-7;
    if s.iter().any(|&v| v < -limit) {
        return Err(InverseError::EloretaNotPsd { source_index });
    }
    // s <= limit: inf for negative powers (contributes 0), 0 for positive ones.
    let f: Vec<f64> = s
        .iter()
        .map(|&v| if v <= limit { 0.0 } else { v.powf(power) })
        .collect();
    let mut out = [0.0; 9];
    for i in 0..3 {
        for j in 0..3 {
            out[i * 3 + j] = (0..3).map(|k| u[(i, k)] * f[k] * u[(j, k)]).sum();
        }
    }
    Ok(out)
}

/// `_normalize_R`: returns `G R G^T / norm` and divides `R` by `norm = trace / n_nzero`.
fn normalize_weights(gw: MatRef<'_, f64>, r: &mut Weights, n_nzero: usize) -> Mat<f64> {
    let n = gw.nrows();
    // R G^T: [3 n_sources, n]
    let rgt = Mat::from_fn(3 * r.len(), n, |row, c| {
        let (s, i) = (row / 3, row % 3);
        (0..3)
            .map(|j| r[s][i * 3 + j] * gw[(c, 3 * s + j)])
            .sum::<f64>()
    });
    let mut grgt = gw * &rgt;
    let norm = (0..n).map(|i| grgt[(i, i)]).sum::<f64>() / n_nzero as f64;
    for j in 0..n {
        for i in 0..n {
            grgt[(i, j)] /= norm;
        }
    }
    for w in r.iter_mut() {
        for v in w.iter_mut() {
            *v /= norm;
        }
    }
    grgt
}

/// The eLORETA kernel, row-major `[3 n_sources, n_channels]`, projection and whitening
/// folded in. `gw` is the whitened lead field `W G`.
pub(crate) fn eloreta_kernel(
    gw: MatRef<'_, f64>,
    white: &Whitening,
    lambda2: f64,
    options: &EloretaOptions,
) -> Result<Vec<f64>, InverseError> {
    let n = gw.nrows();
    let n_sources = gw.ncols() / 3;
    let n_nzero = white.n_nzero;
    let identity = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    let mut r: Weights = vec![identity; n_sources];
    let mut grgt = normalize_weights(gw, &mut r, n_nzero);
    let mut converged = false;
    for iteration in 0..options.max_iter {
        let evd =
            grgt.self_adjoint_eigen(Side::Lower)
                .map_err(|_| InverseError::Decomposition {
                    what: "eLORETA G R G^T eigendecomposition",
                })?;
        let s: Vec<f64> = evd.S().column_vector().iter().map(|v| v.abs()).collect();
        let u = evd.U();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        order.truncate(n_nzero);
        // N = u diag(1 / (s + lambda2)) u^T over the kept eigenvalues.
        let us = Mat::from_fn(n, order.len(), |i, k| {
            let sk = s[order[k]];
            let f = if sk > 0.0 { 1.0 / (sk + lambda2) } else { 0.0 };
            u[(i, order[k])] * f
        });
        let uk = Mat::from_fn(n, order.len(), |i, k| u[(i, order[k])]);
        let big_n = &us * uk.transpose();
        let ng = &big_n * gw;
        let r_last = r.clone();
        for (src, w) in r.iter_mut().enumerate() {
            let mut m = [0.0; 9];
            for i in 0..3 {
                for j in 0..3 {
                    m[i * 3 + j] = (0..n)
                        .map(|c| gw[(c, 3 * src + i)] * ng[(c, 3 * src + j)])
                        .sum();
                }
            }
            *w = sym_pow3(&m, -0.5, src)?;
        }
        grgt = normalize_weights(gw, &mut r, n_nzero);
        let (mut diff, mut last) = (0.0, 0.0);
        for (a, b) in r.iter().flatten().zip(r_last.iter().flatten()) {
            diff += (a - b) * (a - b);
            last += b * b;
        }
        let delta = (diff / last).sqrt();
        tracing::debug!(iteration = iteration + 1, delta, "eLORETA weight iteration");
        if delta < options.eps {
            converged = true;
            break;
        }
    }
    if !converged {
        tracing::warn!(
            eps = options.eps,
            max_iter = options.max_iter,
            "eLORETA weight fitting did not converge"
        );
    }
    let _ = normalize_weights(gw, &mut r, n_nzero);
    let r_sqrt: Weights = r
        .iter()
        .enumerate()
        .map(|(src, w)| sym_pow3(w, 0.5, src))
        .collect::<Result<_, _>>()?;
    // A = G R^(1/2): A[c, 3s+i] = sum_j R_sqrt[s][i, j] G[c, 3s+j]
    let a = Mat::from_fn(n, 3 * n_sources, |c, col| {
        let (s, i) = (col / 3, col % 3);
        (0..3)
            .map(|j| r_sqrt[s][i * 3 + j] * gw[(c, 3 * s + j)])
            .sum::<f64>()
    });
    let svd = a.thin_svd().map_err(|_| InverseError::Decomposition {
        what: "eLORETA SVD",
    })?;
    let sing: Vec<f64> = svd.S().column_vector().iter().copied().collect();
    let reg = reginv(&sing, n_nzero, lambda2);
    let v = svd.V();
    // Weighted eigen leads: R^(1/2) V per source block.
    let leads = Mat::from_fn(3 * n_sources, v.ncols(), |row, m| {
        let (s, i) = (row / 3, row % 3);
        (0..3)
            .map(|j| r_sqrt[s][i * 3 + j] * v[(3 * s + j, m)])
            .sum::<f64>()
    });
    let trans = eigen_fields_trans(svd.U(), &reg, white);
    let k = &leads * &trans;
    Ok(row_major(k.as_ref()))
}
