//! Reconstructed tracks: the finder's hits and the fitter's state, the contract between
//! track finding, fitting, evaluation, trigger lines and the GPU path.

/// Track parameters at a plane: position, slopes and charge over momentum.
/// `tx = dx/dz`, `ty = dy/dz`, `qop = q/p` in units of e/(GeV/c).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TrackState {
    pub z_mm: f32,
    pub x_mm: f32,
    pub y_mm: f32,
    pub tx: f32,
    pub ty: f32,
    pub qop: f32,
}

impl TrackState {
    /// Momentum magnitude, GeV/c (infinite for qop = 0).
    pub fn p_gev(&self) -> f32 {
        1.0 / self.qop.abs()
    }
}

/// A found and fitted track.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Track {
    /// Indices into the event's hit slice, ordered by plane (upstream first).
    pub hits: Vec<u32>,
    /// Fitted state at the z of the most upstream hit.
    pub state: TrackState,
    /// Covariance of (x, y, tx, ty, qop), lower triangle row by row (15 values).
    pub cov: [f32; 15],
    pub chi2: f32,
    pub ndf: u16,
}

impl Track {
    /// Chi-square per degree of freedom (infinite if ndf = 0).
    pub fn chi2_ndf(&self) -> f32 {
        if self.ndf == 0 {
            f32::INFINITY
        } else {
            self.chi2 / self.ndf as f32
        }
    }
    /// Variance of parameter `i` (0 = x, 1 = y, 2 = tx, 3 = ty, 4 = qop).
    pub fn var(&self, i: usize) -> f32 {
        self.cov[i * (i + 1) / 2 + i]
    }
    /// Whether the fit measured the momentum: q/p finite and not zero, with an error
    /// below nine tenths of itself (a fit in a detector without field keeps the q/p it
    /// assumes with an error as large, up to rounding: it knows nothing of the momentum).
    pub fn momentum_measured(&self) -> bool {
        let qop = self.state.qop as f64;
        let var = self.var(4) as f64;
        qop != 0.0 && qop.is_finite() && (var < 0.81 * qop * qop || var.is_nan())
    }
    /// Whether the fit took q/p from the hits: q/p finite and not zero, with a variance
    /// other than its square. A fit in a detector without field reports the q/p it
    /// assumes (a given momentum, or the scattering's estimate) with exactly that
    /// variance, up to the rounding of single precision (a relative 1e-7; the threshold is
    /// 1e-4); a fit in a field has a variance from the bending its hits show, however
    /// poorly they measure it. Unlike [`Self::momentum_measured`], this does not look at
    /// how large the error is against the fitted value, so it selects tracks without
    /// regard to how far their fit fell from the truth (the q/p pulls of
    /// `trigd eval tracking`). A fit that assumes q/p in a stray field, too weak to
    /// measure momenta, still moves the variance by a few per cent and passes this test:
    /// only the fit's configuration tells it (`EvalConfig::qop_assumed`).
    pub fn momentum_fitted(&self) -> bool {
        let qop = self.state.qop as f64;
        let var = self.var(4) as f64;
        qop != 0.0 && qop.is_finite() && (var - qop * qop).abs() > 1e-4 * qop * qop
    }
    /// Whether the fit measured the momentum to `rel`: q/p finite and not zero, with an
    /// error at most `rel` of itself (a NaN error is not within any; a trigger line's
    /// `max_dp_over_p`).
    pub fn momentum_measured_to(&self, rel: f64) -> bool {
        let qop = self.state.qop as f64;
        let sigma = (self.var(4) as f64).sqrt();
        qop != 0.0 && qop.is_finite() && sigma <= rel * qop.abs()
    }
}
