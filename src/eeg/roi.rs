//! The region-of-interest decision for EEG: which sources form the region, what each
//! block contributes (per-sample mean power over the region, and the block's strongest
//! source), and the host-side trigger that fires when the power, averaged over a sliding
//! window, reaches a threshold, outside a refractory period.
//!
//! The per-block work is split in two so the GPU can fuse the first half with the inverse:
//! [`block_stats`] (pure, per block) and [`RoiTrigger`] (state across blocks, on the host).
//! Sums run in f64, over sources in ascending index order, so a backend that keeps that
//! order agrees to rounding.

use serde::Deserialize;

/// Errors in the `[eeg.roi]` configuration or its resolution against a source space.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoiError {
    #[error("[eeg.roi] config: {0}")]
    Config(String),
    #[error(
        "[eeg.roi] config selects no source: the sphere at {centre_mm:?} mm of radius {radius_mm} mm \
         contains none of the {n_sources} sources (the nearest is {nearest_mm:.1} mm from the centre)"
    )]
    EmptySphere {
        centre_mm: [f64; 3],
        radius_mm: f64,
        n_sources: usize,
        nearest_mm: f64,
    },
    #[error("[eeg.roi] config: source index {index} out of range, the source space has {n_sources} sources")]
    SourceIndex { index: u32, n_sources: usize },
}

/// A sphere in the source space's coordinates.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoiSphere {
    pub centre_mm: [f64; 3],
    pub radius_mm: f64,
}

/// The `[eeg.roi]` configuration: a region given as a sphere or as explicit source
/// indices, and the trigger's window, threshold and refractory period.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoiConfig {
    pub sphere: Option<RoiSphere>,
    pub sources: Option<Vec<u32>>,
    /// Length of the sliding window over which ROI power is averaged.
    pub window_ms: f64,
    /// The trigger fires when the window mean of ROI power reaches this value (in the
    /// squared units of the source amplitudes).
    pub threshold: f64,
    /// No second firing within this time after a firing.
    #[serde(default)]
    pub refractory_ms: f64,
}

impl RoiConfig {
    /// Checks the fields that do not depend on the source space.
    pub fn validate(&self) -> Result<(), RoiError> {
        let bad = |m: String| Err(RoiError::Config(m));
        match (&self.sphere, &self.sources) {
            (Some(_), Some(_)) => return bad("set either `sphere` or `sources`, not both".into()),
            (None, None) => {
                return bad("set `sphere` (centre_mm, radius_mm) or `sources` (indices)".into())
            }
            (Some(s), None) => {
                if !s.centre_mm.iter().all(|v| v.is_finite()) {
                    return bad(format!("sphere centre_mm {:?} is not finite", s.centre_mm));
                }
                if !(s.radius_mm.is_finite() && s.radius_mm > 0.0) {
                    return bad(format!("sphere radius_mm {} must be positive", s.radius_mm));
                }
            }
            (None, Some(v)) if v.is_empty() => {
                return bad("`sources` is empty: the region has no source".into())
            }
            _ => {}
        }
        if !(self.window_ms.is_finite() && self.window_ms > 0.0) {
            return bad(format!("window_ms {} must be positive", self.window_ms));
        }
        if !self.threshold.is_finite() {
            return bad(format!("threshold {} must be finite", self.threshold));
        }
        if !(self.refractory_ms.is_finite() && self.refractory_ms >= 0.0) {
            return bad(format!("refractory_ms {} must be >= 0", self.refractory_ms));
        }
        Ok(())
    }

    /// The region as a mask over `positions_m` (`[n_sources][x, y, z]`, metres).
    pub fn resolve(&self, positions_m: &[[f64; 3]]) -> Result<RoiMask, RoiError> {
        self.validate()?;
        let n = positions_m.len();
        let mut mask = vec![false; n];
        if let Some(idx) = &self.sources {
            for &i in idx {
                *mask.get_mut(i as usize).ok_or(RoiError::SourceIndex {
                    index: i,
                    n_sources: n,
                })? = true;
            }
        } else if let Some(s) = &self.sphere {
            let mut nearest_mm = f64::INFINITY;
            for (m, p) in mask.iter_mut().zip(positions_m) {
                let d_mm = ((p[0] * 1e3 - s.centre_mm[0]).powi(2)
                    + (p[1] * 1e3 - s.centre_mm[1]).powi(2)
                    + (p[2] * 1e3 - s.centre_mm[2]).powi(2))
                .sqrt();
                nearest_mm = nearest_mm.min(d_mm);
                *m = d_mm <= s.radius_mm;
            }
            if !mask.iter().any(|&m| m) {
                return Err(RoiError::EmptySphere {
                    centre_mm: s.centre_mm,
                    radius_mm: s.radius_mm,
                    n_sources: n,
                    nearest_mm,
                });
            }
        }
        Ok(RoiMask::from_mask(mask))
    }

    /// The trigger for this configuration at `fs_hz`.
    pub fn trigger(&self, fs_hz: f64) -> Result<RoiTrigger, RoiError> {
        self.validate()?;
        if !(fs_hz.is_finite() && fs_hz > 0.0) {
            return Err(RoiError::Config(format!(
                "sample rate {fs_hz} Hz must be positive"
            )));
        }
        let window = ((self.window_ms * fs_hz / 1e3).round() as usize).max(1);
        let refractory = (self.refractory_ms * fs_hz / 1e3).round() as u64;
        Ok(RoiTrigger::new(window, self.threshold, refractory))
    }
}

/// The sources of the region: a mask and the same as sorted indices.
#[derive(Debug, Clone, PartialEq)]
pub struct RoiMask {
    pub mask: Vec<bool>,
    /// Ascending source indices in the region (never empty).
    pub indices: Vec<u32>,
}

impl RoiMask {
    fn from_mask(mask: Vec<bool>) -> Self {
        let indices = (0..mask.len() as u32)
            .filter(|&i| mask[i as usize])
            .collect();
        Self { mask, indices }
    }
    pub fn n_sources(&self) -> usize {
        self.mask.len()
    }
}

/// What one block contributes to the decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockStats {
    /// Per sample: mean over the region's sources of amplitude².
    pub roi_power: Vec<f64>,
    /// Source with the largest sum over the block of amplitude² (lowest index on ties).
    pub peak_source: u32,
    /// That sum.
    pub peak_power: f64,
}

impl BlockStats {
    /// Preallocated for blocks of up to `n_times` samples.
    pub fn with_capacity(n_times: usize) -> Self {
        Self {
            roi_power: Vec::with_capacity(n_times),
            peak_source: 0,
            peak_power: 0.0,
        }
    }
}

/// A source amplitude type the statistics accept (f32 from the GPU, f64 from the CPU).
pub trait Amplitude: Copy {
    fn to_f64(self) -> f64;
}
impl Amplitude for f32 {
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}
impl Amplitude for f64 {
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
}

/// Per-block statistics from source amplitudes, source-major `[n_sources, n_times]`.
/// Does not allocate once `out.roi_power` has capacity for `n_times`.
pub fn block_stats<A: Amplitude>(
    amplitudes: &[A],
    n_times: usize,
    roi: &RoiMask,
    out: &mut BlockStats,
) {
    let n_sources = roi.n_sources();
    assert_eq!(
        amplitudes.len(),
        n_sources * n_times,
        "amplitudes must be [n_sources, n_times]"
    );
    out.roi_power.clear();
    out.roi_power.resize(n_times, 0.0);
    for &s in &roi.indices {
        let row = &amplitudes[s as usize * n_times..(s as usize + 1) * n_times];
        for (acc, a) in out.roi_power.iter_mut().zip(row) {
            let a = a.to_f64();
            *acc += a * a;
        }
    }
    let inv = 1.0 / roi.indices.len() as f64;
    out.roi_power.iter_mut().for_each(|p| *p *= inv);
    out.peak_source = 0;
    out.peak_power = f64::NEG_INFINITY;
    for s in 0..n_sources {
        let row = &amplitudes[s * n_times..(s + 1) * n_times];
        let power: f64 = row.iter().map(|a| a.to_f64() * a.to_f64()).sum();
        if power > out.peak_power {
            out.peak_power = power;
            out.peak_source = s as u32;
        }
    }
    if n_sources == 0 || out.peak_power.is_nan() {
        out.peak_power = 0.0;
    }
}

/// What the trigger decided for one block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoiDecision {
    /// Whether the trigger fired in this block.
    pub fired: bool,
    /// The first firing sample if it fired, else the block's last sample.
    pub sample: u64,
    /// The window mean at `sample`.
    pub statistic: f64,
    /// The largest window mean in the block.
    pub peak_statistic: f64,
    /// Firings in this block (more than one only if the refractory period is shorter
    /// than a block).
    pub n_fired: u32,
}

/// Sliding-window mean of ROI power with a threshold and a refractory period, fed block by
/// block. The window holds the last `window` samples (a fixed ring); it is evaluated at
/// every sample and may fire only once it is full.
#[derive(Debug, Clone)]
pub struct RoiTrigger {
    ring: Vec<f64>,
    head: usize,
    filled: usize,
    sum: f64,
    /// Samples since the running sum was last recomputed from the ring.
    since_exact: usize,
    threshold: f64,
    refractory_samples: u64,
    last_fired: Option<u64>,
}

impl RoiTrigger {
    pub fn new(window_samples: usize, threshold: f64, refractory_samples: u64) -> Self {
        let w = window_samples.max(1);
        Self {
            ring: vec![0.0; w],
            head: 0,
            filled: 0,
            sum: 0.0,
            since_exact: 0,
            threshold,
            refractory_samples,
            last_fired: None,
        }
    }

    pub fn window_samples(&self) -> usize {
        self.ring.len()
    }

    /// Empties the window, as after a break in the stream's samples: the statistic is not
    /// computed over samples on both sides of a gap, and the window must fill again with
    /// samples after it before it may fire. The refractory period still counts from the
    /// last firing (sample indices stay on the stream's time line).
    pub fn restart_window(&mut self) {
        self.ring.fill(0.0);
        self.head = 0;
        self.filled = 0;
        self.sum = 0.0;
        self.since_exact = 0;
    }

    /// Sample index of the last firing.
    pub fn last_fired(&self) -> Option<u64> {
        self.last_fired
    }

    /// Adds one sample of ROI power and returns the window mean.
    #[inline]
    fn push(&mut self, p: f64) -> f64 {
        let w = self.ring.len();
        self.sum += p - self.ring[self.head];
        self.ring[self.head] = p;
        self.head = (self.head + 1) % w;
        self.filled = (self.filled + 1).min(w);
        self.since_exact += 1;
        // Bound the drift of the running sum: recompute exactly once per window length.
        if self.since_exact >= w {
            self.sum = self.ring.iter().sum();
            self.since_exact = 0;
        }
        self.sum / self.filled as f64
    }

    /// Feeds one block's `roi_power`, whose first sample has index `first_sample`.
    pub fn push_block(&mut self, roi_power: &[f64], first_sample: u64) -> RoiDecision {
        let mut d = RoiDecision {
            fired: false,
            sample: first_sample + (roi_power.len() as u64).saturating_sub(1),
            statistic: f64::NAN,
            peak_statistic: f64::NEG_INFINITY,
            n_fired: 0,
        };
        for (k, &p) in roi_power.iter().enumerate() {
            let stat = self.push(p);
            let t = first_sample + k as u64;
            d.peak_statistic = d.peak_statistic.max(stat);
            let full = self.filled == self.ring.len();
            let free = self
                .last_fired
                .is_none_or(|f| t >= f + self.refractory_samples.max(1));
            if full && free && stat >= self.threshold {
                self.last_fired = Some(t);
                d.n_fired += 1;
                if !d.fired {
                    d.fired = true;
                    d.sample = t;
                    d.statistic = stat;
                }
            }
            if !d.fired {
                d.statistic = stat;
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn grid() -> Vec<[f64; 3]> {
        // 5 x 5 x 5 sources, 10 mm apart, centred on the origin (metres).
        let mut v = Vec::new();
        for i in -2..=2 {
            for j in -2..=2 {
                for k in -2..=2 {
                    v.push([i as f64 * 0.01, j as f64 * 0.01, k as f64 * 0.01]);
                }
            }
        }
        v
    }

    fn cfg(sphere: Option<RoiSphere>, sources: Option<Vec<u32>>) -> RoiConfig {
        RoiConfig {
            sphere,
            sources,
            window_ms: 40.0,
            threshold: 1.0,
            refractory_ms: 100.0,
        }
    }

    #[test]
    fn sphere_selects_the_sources_within_its_radius() {
        let pos = grid();
        let c = cfg(
            Some(RoiSphere {
                centre_mm: [10.0, 0.0, 0.0],
                radius_mm: 10.5,
            }),
            None,
        );
        let m = c.resolve(&pos).expect("resolve");
        // The centre and its 6 neighbours at 10 mm (one of them is the origin).
        assert_eq!(m.indices.len(), 7);
        for &i in &m.indices {
            let p = pos[i as usize];
            let d =
                ((p[0] * 1e3 - 10.0).powi(2) + (p[1] * 1e3).powi(2) + (p[2] * 1e3).powi(2)).sqrt();
            assert!(d <= 10.5);
        }
        let origin = pos
            .iter()
            .position(|p| *p == [0.0, 0.0, 0.0])
            .expect("origin") as u32;
        assert!(m.indices.contains(&origin));
    }

    #[test]
    fn empty_or_invalid_regions_are_errors_naming_the_config() {
        let pos = grid();
        let e = cfg(
            Some(RoiSphere {
                centre_mm: [500.0, 0.0, 0.0],
                radius_mm: 5.0,
            }),
            None,
        )
        .resolve(&pos)
        .expect_err("empty");
        assert!(
            e.to_string().contains("[eeg.roi]") && e.to_string().contains("480.0 mm"),
            "{e}"
        );
        assert!(cfg(None, Some(vec![])).resolve(&pos).is_err());
        assert!(cfg(None, None).resolve(&pos).is_err());
        assert!(matches!(
            cfg(None, Some(vec![125])).resolve(&pos),
            Err(RoiError::SourceIndex {
                index: 125,
                n_sources: 125
            })
        ));
        let mut c = cfg(None, Some(vec![1]));
        c.window_ms = 0.0;
        assert!(c.validate().is_err());
        let toml_cfg: RoiConfig =
            toml::from_str("sources = [3, 1]\nwindow_ms = 50.0\nthreshold = 2.0").expect("toml");
        assert_eq!(toml_cfg.resolve(&pos).expect("resolve").indices, vec![1, 3]);
    }

    #[test]
    fn block_stats_mean_power_and_peak_with_ties_to_lowest() {
        let roi = RoiMask::from_mask(vec![false, true, true, false]);
        let n_t = 3;
        // sources 0..4, source-major
        let a: Vec<f32> = vec![3.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0];
        let mut out = BlockStats::with_capacity(n_t);
        block_stats(&a, n_t, &roi, &mut out);
        assert_eq!(out.roi_power, vec![0.5, 2.5, 2.0]);
        // sums: 9, 5, 5, 9 -> tie between 0 and 3, lowest wins
        assert_eq!((out.peak_source, out.peak_power), (0, 9.0));
    }

    #[test]
    fn window_across_blocks_equals_whole_signal() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let n: usize = 3000;
        let power: Vec<f64> = (0..n)
            .map(|t| rng.random::<f64>() + if (1000..1200).contains(&t) { 3.0 } else { 0.0 })
            .collect();
        let w: usize = 25;
        // Whole-signal reference computed directly.
        let reference: Vec<f64> = (0..n)
            .map(|t| {
                let lo = (t + 1).saturating_sub(w);
                power[lo..=t].iter().sum::<f64>() / (t + 1 - lo) as f64
            })
            .collect();
        let mut trig = RoiTrigger::new(w, f64::INFINITY, 0);
        let mut t = 0;
        while t < n {
            let len = rng.random_range(1..=97).min(n - t);
            let d = trig.push_block(&power[t..t + len], t as u64);
            assert!((d.statistic - reference[t + len - 1]).abs() < 1e-12);
            let peak = reference[t..t + len]
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            assert!((d.peak_statistic - peak).abs() < 1e-12);
            t += len;
        }
    }

    #[test]
    fn refractory_period_is_honoured() {
        // Power above threshold everywhere: fires at the first full window, then once per
        // refractory period, whatever the block sizes.
        let w = 10;
        let refr = 100;
        let power = vec![2.0; 1000];
        for block in [1, 7, 64, 1000] {
            let mut trig = RoiTrigger::new(w, 1.5, refr);
            let mut fired = Vec::new();
            for (b, chunk) in power.chunks(block).enumerate() {
                let d = trig.push_block(chunk, (b * block) as u64);
                if d.fired {
                    fired.push(d.sample);
                }
            }
            let want: Vec<u64> = (0..)
                .map(|i| 9 + i * refr)
                .take_while(|&s| s < 1000)
                .collect();
            if block < refr as usize {
                assert_eq!(fired, want, "block {block}");
            } else {
                assert_eq!(fired, vec![9]);
                assert_eq!(trig.last_fired(), Some(909));
            }
        }
        // Below threshold never fires.
        let mut trig = RoiTrigger::new(w, 2.5, refr);
        assert!(!trig.push_block(&power, 0).fired);
    }

    #[test]
    fn a_restarted_window_fires_only_on_samples_after_the_break() {
        // Window of 4 samples, threshold 1.0: high power before a break, low after it.
        let mut trig = RoiTrigger::new(4, 1.0, 0);
        assert!(
            !trig.push_block(&[2.0, 2.0, 2.0], 0).fired,
            "window not full yet"
        );
        trig.restart_window();
        // Without the restart the window (2, 2, 2, 0.5) would average 1.625 and fire.
        let d = trig.push_block(&[0.5, 0.5, 0.5, 0.5], 100);
        assert!(!d.fired);
        assert_eq!(d.statistic, 0.5);
        // The window refilled with power after the break fires as a fresh one would.
        let mut fresh = RoiTrigger::new(4, 1.0, 0);
        let mut restarted = trig.clone();
        restarted.restart_window();
        let p = [3.0, 1.0, 0.2, 0.9, 4.0, 0.1];
        let (a, b) = (restarted.push_block(&p, 200), fresh.push_block(&p, 200));
        assert_eq!(
            (a.fired, a.sample, a.statistic),
            (b.fired, b.sample, b.statistic)
        );
        assert!(a.fired);
    }
}
