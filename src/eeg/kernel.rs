//! The inverse operator reduced to what each block needs: one matrix from channel data
//! (volts, as recorded; re-referencing projection and whitening folded in) to the three
//! orientation components of every source, and a per-source factor applied after the norm
//! over orientations (noise normalisation for dSPM and sLORETA, 1 otherwise).
//! This is the hot path on the CPU and the layout the GPU uploads.

/// An applied inverse kernel. `kernel` is row-major `[3 * n_sources, n_channels]`: rows
/// `3s, 3s+1, 3s+2` are the x, y, z components of source `s`.
#[derive(Debug, Clone)]
pub struct InverseKernel {
    pub n_channels: usize,
    pub n_sources: usize,
    pub kernel: Vec<f64>,
    /// Multiplies the orientation norm of each source (length `n_sources`).
    pub source_scale: Vec<f64>,
}

impl InverseKernel {
    /// Source amplitudes for a block: `data` is channel-major `[n_channels, n_times]`,
    /// `out` is source-major `[n_sources, n_times]`: `out[s, t] = scale[s] * |K_s x_t|`.
    pub fn apply_f64(&self, data: &[f64], n_times: usize, out: &mut [f64]) {
        assert_eq!(data.len(), self.n_channels * n_times);
        assert_eq!(out.len(), self.n_sources * n_times);
        let c = self.n_channels;
        for s in 0..self.n_sources {
            for t in 0..n_times {
                let mut sq = 0.0;
                for j in 0..3 {
                    let row = &self.kernel[(3 * s + j) * c..(3 * s + j + 1) * c];
                    let v: f64 = row
                        .iter()
                        .enumerate()
                        .map(|(ch, k)| k * data[ch * n_times + t])
                        .sum();
                    sq += v * v;
                }
                out[s * n_times + t] = self.source_scale[s] * sq.sqrt();
            }
        }
    }
}
