//! Online filtering of EEG blocks: Butterworth low-, high- and band-pass filters and a
//! notch, as cascades of second-order sections applied causally, channel by channel, with
//! the filter state carried from one block to the next.
//!
//! The design follows SciPy step for step so the coefficients agree with
//! `scipy.signal.butter(N, Wn, btype, fs=fs, output='sos')` to rounding: the analog
//! Butterworth prototype (`buttap`), frequency prewarping, the low/high/band-pass
//! transformation (`lp2lp_zpk`, `lp2hp_zpk`, `lp2bp_zpk`), the bilinear transform
//! (`bilinear_zpk`) and SciPy's pole-zero pairing into sections (`zpk2sos`,
//! `pairing='nearest'`). The notch is `scipy.signal.iirnotch(w0, Q, fs)` as one section.
//! Filtering is the transposed direct form II of `scipy.signal.sosfilt`, in f64, so
//! filtering a signal in blocks of any sizes gives what `sosfilt` gives on the whole.
//!
//! Nothing is filtered unless configured: [`FilterConfig::default`] is the identity.

use serde::Deserialize;

/// Errors in a filter specification.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FilterError {
    #[error("filter order {0} must be 1..=20")]
    Order(usize),
    #[error("cutoff {cutoff_hz} Hz must be inside (0, {nyquist_hz}) Hz, the Nyquist band at {fs_hz} Hz sampling")]
    Cutoff {
        cutoff_hz: f64,
        nyquist_hz: f64,
        fs_hz: f64,
    },
    #[error("band-pass edges {lo_hz}..{hi_hz} Hz: the low edge must be below the high edge")]
    BandOrder { lo_hz: f64, hi_hz: f64 },
    #[error("sample rate {0} Hz must be positive and finite")]
    SampleRate(f64),
    #[error("notch quality factor {0} must be positive and finite")]
    NotchQ(f64),
    #[error("filter config: set at most one of bandpass_hz, lowpass_hz, highpass_hz")]
    Conflicting,
}

/// Which response a Butterworth filter has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Band {
    Lowpass { cutoff_hz: f64 },
    Highpass { cutoff_hz: f64 },
    Bandpass { lo_hz: f64, hi_hz: f64 },
}

/// One second-order section `[b0, b1, b2, a0, a1, a2]` with `a0 = 1` (SciPy's layout).
pub type Section = [f64; 6];

/// The `[eeg.filter]` configuration. Every part is off unless set.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Band-pass edges in Hz, `[low, high]`.
    pub bandpass_hz: Option<[f64; 2]>,
    /// Low-pass cutoff in Hz (instead of a band-pass).
    pub lowpass_hz: Option<f64>,
    /// High-pass cutoff in Hz (instead of a band-pass).
    pub highpass_hz: Option<f64>,
    /// Butterworth order (a band-pass of order N has 2N poles, as in SciPy).
    pub order: usize,
    /// Frequency to remove (mains: 50 or 60).
    pub notch_hz: Option<f64>,
    /// Notch quality factor: centre frequency over -3 dB bandwidth.
    pub notch_q: f64,
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self {
            bandpass_hz: None,
            lowpass_hz: None,
            highpass_hz: None,
            order: 4,
            notch_hz: None,
            notch_q: 30.0,
        }
    }
}

impl FilterConfig {
    /// The cascade this configuration asks for at `fs_hz` (Butterworth sections first,
    /// then the notch); empty when nothing is configured.
    pub fn sections(&self, fs_hz: f64) -> Result<Vec<Section>, FilterError> {
        let band = match (self.bandpass_hz, self.lowpass_hz, self.highpass_hz) {
            (None, None, None) => None,
            (Some([lo_hz, hi_hz]), None, None) => Some(Band::Bandpass { lo_hz, hi_hz }),
            (None, Some(cutoff_hz), None) => Some(Band::Lowpass { cutoff_hz }),
            (None, None, Some(cutoff_hz)) => Some(Band::Highpass { cutoff_hz }),
            _ => return Err(FilterError::Conflicting),
        };
        let mut sos = match band {
            Some(b) => butter(self.order, b, fs_hz)?,
            None => Vec::new(),
        };
        if let Some(f0) = self.notch_hz {
            sos.push(iirnotch(f0, self.notch_q, fs_hz)?);
        }
        Ok(sos)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct C {
    re: f64,
    im: f64,
}

impl C {
    const fn new(re: f64, im: f64) -> Self {
        Self { re, im }
    }
    fn real(re: f64) -> Self {
        Self { re, im: 0.0 }
    }
    fn add(self, o: C) -> C {
        C::new(self.re + o.re, self.im + o.im)
    }
    fn sub(self, o: C) -> C {
        C::new(self.re - o.re, self.im - o.im)
    }
    fn mul(self, o: C) -> C {
        C::new(
            self.re * o.re - self.im * o.im,
            self.re * o.im + self.im * o.re,
        )
    }
    fn scale(self, s: f64) -> C {
        C::new(self.re * s, self.im * s)
    }
    fn conj(self) -> C {
        C::new(self.re, -self.im)
    }
    fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
    fn is_real(self) -> bool {
        self.im == 0.0
    }
    /// Smith's algorithm, as NumPy divides complex numbers.
    fn div(self, o: C) -> C {
        let (a, b, c, d) = (self.re, self.im, o.re, o.im);
        if c.abs() >= d.abs() {
            if c == 0.0 && d == 0.0 {
                return C::new(a / c, b / c);
            }
            let rat = d / c;
            let scl = 1.0 / (c + d * rat);
            C::new((a + b * rat) * scl, (b - a * rat) * scl)
        } else {
            let rat = c / d;
            let scl = 1.0 / (d + c * rat);
            C::new((a * rat + b) * scl, (b * rat - a) * scl)
        }
    }
    /// Principal square root (C99 `csqrt`).
    fn sqrt(self) -> C {
        let (a, b) = (self.re, self.im);
        if a == 0.0 && b == 0.0 {
            return C::new(0.0, b);
        }
        let t = ((a.abs() + self.abs()) / 2.0).sqrt();
        if a >= 0.0 {
            C::new(t, b / (2.0 * t))
        } else {
            C::new(b.abs() / (2.0 * t), t.copysign(b))
        }
    }
}

struct Zpk {
    z: Vec<C>,
    p: Vec<C>,
    k: f64,
}

/// `scipy.signal.buttap`.
fn buttap(n: usize) -> Zpk {
    let nf = n as f64;
    let p = (0..n)
        .map(|i| {
            let m = -(nf) + 1.0 + 2.0 * i as f64;
            let theta = std::f64::consts::PI * m / (2.0 * nf);
            // -exp(1j * theta)
            C::new(-theta.cos(), -theta.sin())
        })
        .collect();
    Zpk {
        z: Vec::new(),
        p,
        k: 1.0,
    }
}

/// Designs a digital Butterworth filter as second-order sections, as
/// `scipy.signal.butter(order, Wn, btype, fs=fs_hz, output='sos')`.
pub fn butter(order: usize, band: Band, fs_hz: f64) -> Result<Vec<Section>, FilterError> {
    if !(1..=20).contains(&order) {
        return Err(FilterError::Order(order));
    }
    if !(fs_hz.is_finite() && fs_hz > 0.0) {
        return Err(FilterError::SampleRate(fs_hz));
    }
    let nyq = fs_hz / 2.0;
    let check = |f: f64| {
        if f.is_finite() && f > 0.0 && f < nyq {
            Ok(f / nyq)
        } else {
            Err(FilterError::Cutoff {
                cutoff_hz: f,
                nyquist_hz: nyq,
                fs_hz,
            })
        }
    };
    // Prewarp, with the normalised fs = 2 that SciPy uses from here on.
    let warp = |wn: f64| 2.0 * 2.0 * (std::f64::consts::PI * wn / 2.0).tan();
    let proto = buttap(order);
    let degree = proto.p.len() - proto.z.len();
    let analog = match band {
        Band::Lowpass { cutoff_hz } => {
            let wo = warp(check(cutoff_hz)?);
            Zpk {
                z: proto.z.iter().map(|z| z.scale(wo)).collect(),
                p: proto.p.iter().map(|p| p.scale(wo)).collect(),
                k: proto.k * wo.powi(degree as i32),
            }
        }
        Band::Highpass { cutoff_hz } => {
            let wo = C::real(warp(check(cutoff_hz)?));
            let mut z: Vec<C> = proto.z.iter().map(|z| wo.div(*z)).collect();
            z.extend(std::iter::repeat_n(C::real(0.0), degree));
            let p = proto.p.iter().map(|p| wo.div(*p)).collect();
            let num = proto
                .z
                .iter()
                .fold(C::real(1.0), |acc, z| acc.mul(z.scale(-1.0)));
            let den = proto
                .p
                .iter()
                .fold(C::real(1.0), |acc, p| acc.mul(p.scale(-1.0)));
            Zpk {
                z,
                p,
                k: proto.k * num.div(den).re,
            }
        }
        Band::Bandpass { lo_hz, hi_hz } => {
            let (w0, w1) = (check(lo_hz)?, check(hi_hz)?);
            if w0 >= w1 {
                return Err(FilterError::BandOrder { lo_hz, hi_hz });
            }
            let (w0, w1) = (warp(w0), warp(w1));
            let bw = w1 - w0;
            let wo = (w0 * w1).sqrt();
            let shift = |v: &[C]| -> Vec<C> {
                let lp: Vec<C> = v.iter().map(|x| x.scale(bw / 2.0)).collect();
                let wo2 = C::real(wo * wo);
                let mut out: Vec<C> = lp
                    .iter()
                    .map(|x| x.add(x.mul(*x).sub(wo2).sqrt()))
                    .collect();
                out.extend(lp.iter().map(|x| x.sub(x.mul(*x).sub(wo2).sqrt())));
                out
            };
            let mut z = shift(&proto.z);
            z.extend(std::iter::repeat_n(C::real(0.0), degree));
            Zpk {
                z,
                p: shift(&proto.p),
                k: proto.k * bw.powi(degree as i32),
            }
        }
    };
    Ok(zpk2sos(bilinear(analog)))
}

/// `scipy.signal.bilinear_zpk` with fs = 2.
fn bilinear(a: Zpk) -> Zpk {
    let fs2 = C::real(4.0);
    let degree = a.p.len() - a.z.len();
    let mut z: Vec<C> = a.z.iter().map(|z| fs2.add(*z).div(fs2.sub(*z))).collect();
    z.extend(std::iter::repeat_n(C::real(-1.0), degree));
    let p = a.p.iter().map(|p| fs2.add(*p).div(fs2.sub(*p))).collect();
    let num = a.z.iter().fold(C::real(1.0), |acc, z| acc.mul(fs2.sub(*z)));
    let den = a.p.iter().fold(C::real(1.0), |acc, p| acc.mul(fs2.sub(*p)));
    Zpk {
        z,
        p,
        k: a.k * num.div(den).re,
    }
}

/// `scipy.signal._filter_design._cplxreal`: one of each conjugate pair (positive imaginary
/// part, pairs averaged), then the real values.
fn cplxreal(z: &[C]) -> Vec<C> {
    if z.is_empty() {
        return Vec::new();
    }
    let tol = 100.0 * f64::EPSILON;
    let mut z = z.to_vec();
    // Stable sort by real part, then |imag| (np.lexsort).
    z.sort_by(|a, b| {
        a.re.total_cmp(&b.re)
            .then(a.im.abs().total_cmp(&b.im.abs()))
    });
    let is_real = |c: &C| c.im.abs() <= tol * c.abs();
    let zr: Vec<C> = z
        .iter()
        .filter(|c| is_real(c))
        .map(|c| C::real(c.re))
        .collect();
    let rest: Vec<C> = z.iter().filter(|c| !is_real(c)).copied().collect();
    let mut zp: Vec<C> = rest.iter().filter(|c| c.im > 0.0).copied().collect();
    let mut zn: Vec<C> = rest.iter().filter(|c| c.im < 0.0).copied().collect();
    // Butterworth poles and zeros always come in conjugate pairs; keep going regardless.
    let n = zp.len().min(zn.len());
    zp.truncate(n);
    zn.truncate(n);
    // Runs of (approximately) equal real part, sorted by |imag|.
    let mut start = 0;
    while start < n {
        let mut stop = start + 1;
        while stop < n && zp[stop].re - zp[stop - 1].re <= tol * zp[stop - 1].abs() {
            stop += 1;
        }
        zp[start..stop].sort_by(|a, b| a.im.abs().total_cmp(&b.im.abs()));
        zn[start..stop].sort_by(|a, b| a.im.abs().total_cmp(&b.im.abs()));
        start = stop;
    }
    let mut out: Vec<C> = zp
        .iter()
        .zip(&zn)
        .map(|(p, q)| p.add(q.conj()).scale(0.5))
        .collect();
    out.extend(zr);
    out
}

fn idx_worst(p: &[C]) -> usize {
    let mut best = 0;
    for (i, x) in p.iter().enumerate() {
        if (1.0 - x.abs()).abs() < (1.0 - p[best].abs()).abs() {
            best = i;
        }
    }
    best
}

#[derive(Clone, Copy, PartialEq)]
enum Which {
    Real,
    Complex,
    Any,
}

fn nearest_idx(fro: &[C], to: C, which: Which) -> Option<usize> {
    let mut order: Vec<usize> = (0..fro.len()).collect();
    order.sort_by(|&a, &b| fro[a].sub(to).abs().total_cmp(&fro[b].sub(to).abs()));
    order.into_iter().find(|&i| match which {
        Which::Any => true,
        Which::Real => fro[i].is_real(),
        Which::Complex => !fro[i].is_real(),
    })
}

/// Polynomial with the given roots, real part (roots come in conjugate pairs).
fn poly(roots: &[C]) -> Vec<f64> {
    let mut a = vec![C::real(1.0)];
    for r in roots {
        let mut next = vec![C::real(0.0); a.len() + 1];
        for (i, c) in a.iter().enumerate() {
            next[i] = next[i].add(*c);
            next[i + 1] = next[i + 1].sub(c.mul(*r));
        }
        a = next;
    }
    a.iter().map(|c| c.re).collect()
}

fn single_section(z: &[C], p: &[C]) -> Section {
    let mut s = [0.0; 6];
    let b = poly(z);
    let a = poly(p);
    s[3 - b.len()..3].copy_from_slice(&b);
    s[6 - a.len()..6].copy_from_slice(&a);
    s
}

/// `scipy.signal.zpk2sos(z, p, k, pairing='nearest')` for a digital filter.
fn zpk2sos(zpk: Zpk) -> Vec<Section> {
    let Zpk { mut z, mut p, k } = zpk;
    if z.is_empty() && p.is_empty() {
        return vec![[k, 0.0, 0.0, 1.0, 0.0, 0.0]];
    }
    let np_ = p.len();
    let nz = z.len();
    p.extend(std::iter::repeat_n(C::real(0.0), nz.saturating_sub(np_)));
    z.extend(std::iter::repeat_n(C::real(0.0), np_.saturating_sub(nz)));
    let n_sections = p.len().max(z.len()).div_ceil(2);
    if p.len() % 2 == 1 {
        p.push(C::real(0.0));
        z.push(C::real(0.0));
    }
    let mut z = cplxreal(&z);
    let mut p = cplxreal(&p);
    let mut sos = vec![[0.0; 6]; n_sections];
    for si in (0..n_sections).rev() {
        if p.is_empty() {
            break;
        }
        let p1 = p.remove(idx_worst(&p));
        let n_real_p = p.iter().filter(|x| x.is_real()).count();
        if p1.is_real() && n_real_p == 0 {
            let z1 = match nearest_idx(&z, p1, Which::Real) {
                Some(i) => z.remove(i),
                None => C::real(0.0),
            };
            sos[si] = single_section(&[z1, C::real(0.0)], &[p1, C::real(0.0)]);
        } else if p.len() + 1 == z.len()
            && !p1.is_real()
            && n_real_p == 1
            && z.iter().filter(|x| x.is_real()).count() == 1
        {
            let z1 = match nearest_idx(&z, p1, Which::Complex) {
                Some(i) => z.remove(i),
                None => C::real(0.0),
            };
            sos[si] = single_section(&[z1, z1.conj()], &[p1, p1.conj()]);
        } else {
            let p2 = if p1.is_real() {
                let real_idx: Vec<usize> = (0..p.len()).filter(|&i| p[i].is_real()).collect();
                let reals: Vec<C> = real_idx.iter().map(|&i| p[i]).collect();
                p.remove(real_idx[idx_worst(&reals)])
            } else {
                p1.conj()
            };
            if let Some(i) = nearest_idx(&z, p1, Which::Any) {
                let z1 = z.remove(i);
                if !z1.is_real() {
                    sos[si] = single_section(&[z1, z1.conj()], &[p1, p2]);
                } else if let Some(j) = nearest_idx(&z, p1, Which::Real) {
                    let z2 = z.remove(j);
                    sos[si] = single_section(&[z1, z2], &[p1, p2]);
                } else {
                    sos[si] = single_section(&[z1], &[p1, p2]);
                }
            } else {
                sos[si] = single_section(&[], &[p1, p2]);
            }
        }
    }
    for c in &mut sos[0][..3] {
        *c *= k;
    }
    sos
}

/// `scipy.signal.iirnotch(f0_hz, q, fs=fs_hz)` as one section.
pub fn iirnotch(f0_hz: f64, q: f64, fs_hz: f64) -> Result<Section, FilterError> {
    if !(fs_hz.is_finite() && fs_hz > 0.0) {
        return Err(FilterError::SampleRate(fs_hz));
    }
    if !(q.is_finite() && q > 0.0) {
        return Err(FilterError::NotchQ(q));
    }
    let w0 = 2.0 * f0_hz / fs_hz;
    if !(w0 > 0.0 && w0 < 1.0) {
        return Err(FilterError::Cutoff {
            cutoff_hz: f0_hz,
            nyquist_hz: fs_hz / 2.0,
            fs_hz,
        });
    }
    let bw = w0 / q * std::f64::consts::PI;
    let w0 = w0 * std::f64::consts::PI;
    let beta = (bw / 2.0).tan();
    let gain = 1.0 / (1.0 + beta);
    Ok([
        gain,
        gain * (-2.0 * w0.cos()),
        gain,
        1.0,
        -2.0 * gain * w0.cos(),
        2.0 * gain - 1.0,
    ])
}

/// A cascade of sections applied to every channel of a stream of blocks, with the state
/// (two f64 per section per channel) kept between blocks. Sized once; filtering does not
/// allocate.
#[derive(Debug, Clone)]
pub struct BlockFilter {
    sections: Vec<Section>,
    n_channels: usize,
    /// `[channel][section][2]`, flattened.
    state: Vec<[f64; 2]>,
}

impl BlockFilter {
    /// A filter for `n_channels` channels from a configuration; `None` when the
    /// configuration asks for no filtering.
    pub fn from_config(
        config: &FilterConfig,
        fs_hz: f64,
        n_channels: usize,
    ) -> Result<Option<Self>, FilterError> {
        let sections = config.sections(fs_hz)?;
        Ok((!sections.is_empty()).then(|| Self::new(sections, n_channels)))
    }

    /// A filter from explicit sections (each normalised to `a0 = 1`), zero initial state.
    pub fn new(sections: Vec<Section>, n_channels: usize) -> Self {
        let sections = sections
            .into_iter()
            .map(|s| {
                let a0 = s[3];
                [s[0] / a0, s[1] / a0, s[2] / a0, 1.0, s[4] / a0, s[5] / a0]
            })
            .collect::<Vec<_>>();
        let state = vec![[0.0; 2]; sections.len() * n_channels];
        Self {
            sections,
            n_channels,
            state,
        }
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }
    pub fn n_channels(&self) -> usize {
        self.n_channels
    }

    /// Back to zero state (e.g. after a gap in the data).
    pub fn reset(&mut self) {
        self.state.iter_mut().for_each(|s| *s = [0.0; 2]);
    }

    #[inline]
    fn step(sections: &[Section], state: &mut [[f64; 2]], mut x: f64) -> f64 {
        for (s, zi) in sections.iter().zip(state.iter_mut()) {
            let y = s[0] * x + zi[0];
            zi[0] = s[1] * x - s[4] * y + zi[1];
            zi[1] = s[2] * x - s[5] * y;
            x = y;
        }
        x
    }

    /// Filters a channel-major block `[n_channels, n_times]` in place.
    pub fn process_f64(&mut self, data: &mut [f64], n_times: usize) {
        assert_eq!(
            data.len(),
            self.n_channels * n_times,
            "block must be [n_channels, n_times]"
        );
        let ns = self.sections.len();
        for c in 0..self.n_channels {
            let st = &mut self.state[c * ns..(c + 1) * ns];
            for v in &mut data[c * n_times..(c + 1) * n_times] {
                *v = Self::step(&self.sections, st, *v);
            }
        }
    }

    /// Filters a channel-major f32 block in place (state and arithmetic in f64).
    pub fn process_f32(&mut self, data: &mut [f32], n_times: usize) {
        assert_eq!(
            data.len(),
            self.n_channels * n_times,
            "block must be [n_channels, n_times]"
        );
        let ns = self.sections.len();
        for c in 0..self.n_channels {
            let st = &mut self.state[c * ns..(c + 1) * ns];
            for v in &mut data[c * n_times..(c + 1) * n_times] {
                *v = Self::step(&self.sections, st, f64::from(*v)) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowpass_has_unit_dc_gain_and_bandpass_blocks_dc() {
        for order in 1..=8 {
            let lp = butter(order, Band::Lowpass { cutoff_hz: 30.0 }, 250.0).expect("lp");
            let dc: f64 = lp
                .iter()
                .map(|s| (s[0] + s[1] + s[2]) / (s[3] + s[4] + s[5]))
                .product();
            assert!((dc - 1.0).abs() < 1e-9, "order {order}: dc gain {dc}");
            let bp = butter(
                order,
                Band::Bandpass {
                    lo_hz: 8.0,
                    hi_hz: 12.0,
                },
                250.0,
            )
            .expect("bp");
            assert_eq!(bp.len(), order);
            let dc: f64 = bp
                .iter()
                .map(|s| (s[0] + s[1] + s[2]) / (s[3] + s[4] + s[5]))
                .product();
            assert!(dc.abs() < 1e-9, "order {order}: band-pass dc gain {dc}");
        }
    }

    #[test]
    fn bad_specifications_are_refused() {
        assert!(matches!(
            butter(0, Band::Lowpass { cutoff_hz: 10.0 }, 100.0),
            Err(FilterError::Order(0))
        ));
        assert!(matches!(
            butter(4, Band::Lowpass { cutoff_hz: 60.0 }, 100.0),
            Err(FilterError::Cutoff { .. })
        ));
        assert!(matches!(
            butter(
                4,
                Band::Bandpass {
                    lo_hz: 12.0,
                    hi_hz: 8.0
                },
                100.0
            ),
            Err(FilterError::BandOrder { .. })
        ));
        assert!(iirnotch(50.0, 0.0, 250.0).is_err());
        let cfg = FilterConfig {
            bandpass_hz: Some([1.0, 40.0]),
            lowpass_hz: Some(30.0),
            ..Default::default()
        };
        assert_eq!(cfg.sections(250.0), Err(FilterError::Conflicting));
        assert!(BlockFilter::from_config(&FilterConfig::default(), 250.0, 4)
            .expect("none")
            .is_none());
    }

    #[test]
    fn config_parses_from_toml() {
        let cfg: FilterConfig =
            toml::from_str("bandpass_hz = [8.0, 12.0]\norder = 2\nnotch_hz = 50.0").expect("toml");
        assert_eq!(cfg.bandpass_hz, Some([8.0, 12.0]));
        assert_eq!(cfg.notch_q, 30.0);
        assert_eq!(cfg.sections(250.0).expect("sections").len(), 3);
        assert!(toml::from_str::<FilterConfig>("bandpas_hz = [8.0, 12.0]").is_err());
    }
}
