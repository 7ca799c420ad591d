//! The inverse operator applied on the CPU's cores: the hot path of the CPU EEG backend.
//!
//! The kernel is repacked once into panels of `LANES` sources (16 in float32, 8 in
//! float64: one AVX-512 register), channel by channel, the x, y and z rows of the panel's
//! sources in three separate vectors, so the norm over orientations, the noise
//! normalisation and the region-of-interest statistics are computed on whole vectors in
//! the product's epilogue while the block is in registers. The full source estimate is
//! written only when asked for (`--sources-out`, the benchmarks); the daemon's decision
//! needs only the per-sample ROI power and the block's peak source.
//!
//! A block (or several frames that arrived together, side by side as columns: one-sample
//! frames then read the operator once per batch, as the GPU path does) is split by sources
//! over the threads of [`Workers`]: each thread reads its share of the operator once, and
//! the caller adds the threads' partial statistics in source order. Nothing is allocated
//! per block once the buffers have grown to the largest batch.
//!
//! On x86-64 with AVX-512 the product runs in a register-blocked kernel (3 orientations x
//! up to 8 samples of one panel held in 24 registers); elsewhere in portable code that the
//! compiler vectorises (with AVX2 and FMA when present).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::kernel::{BlockShapeError, InverseKernel};
use super::roi::{BlockStats, RoiMask};
use super::workers::{PartPanicked, Workers};

/// Samples (columns) held in registers per panel at most.
const NR_MAX: usize = 8;
/// Sources per panel at most (float32 lanes).
const LANES_MAX: usize = 16;
/// Packed samples one pass over the panels works on: with a panel of the operator and
/// the ROI sums of those columns it stays in the 32-48 KiB L1 data cache of current
/// cores. Longer blocks read the operator once per pass (from L2/L3: cheap next to the
/// multiply-adds of the pass).
const X_CHUNK_BYTES: usize = 128 * 1024;
/// A block with less work than reading this many bytes of operator (a few microseconds)
/// stays on the calling thread: waking the helpers would cost more than it saves.
const SPLIT_MIN_BYTES: usize = 1 << 20;

/// The arithmetic of the CPU path: `f32` (the default) or `f64`.
pub trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::fmt::Debug
    + 'static
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
{
    /// Sources per panel: one AVX-512 register.
    const LANES: usize;
    const ZERO: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The product of one panel (`[n_channels][3][LANES]`) with one column block
    /// (`[n_channels][NR]`), then the norm over orientations times `scale` (`[LANES]`),
    /// into `amp` (`[NR][LANES]`), with AVX-512. `next`, if not empty, is the next panel:
    /// its lines are fetched into cache while this one is multiplied.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; the slices must hold the sizes above.
    unsafe fn panel_avx512<const NR: usize>(
        k: &[Self],
        x: &[Self],
        c: usize,
        scale: &[Self],
        amp: &mut [Self],
        next: &[Self],
    );
}

/// The instruction set the product runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Portable,
    Avx2,
    Avx512,
}

impl Isa {
    /// The best this CPU has.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Columns per register block for `cols` columns.
    fn nr(self, cols: usize) -> usize {
        let max = if self == Isa::Avx512 { NR_MAX } else { 2 };
        [8, 4, 2, 1]
            .into_iter()
            .find(|&nr| nr <= max && nr <= cols)
            .unwrap_or(1)
    }
}

/// The operator in the panel layout, shared by every backend of a process.
#[derive(Debug, Clone)]
pub struct PackedInverse<T> {
    pub n_channels: usize,
    pub n_sources: usize,
    n_panels: usize,
    /// `[panel][channel][orientation][lane]`; lanes past `n_sources` are zero.
    kernel: Vec<T>,
    /// `[panel][lane]`, zero past `n_sources`.
    scale: Vec<T>,
    /// `[panel][lane]`: the source is in the region of interest.
    in_roi: Vec<bool>,
    /// Per panel: some source of it is in the region (the others skip the ROI sums).
    panel_in_roi: Vec<bool>,
    roi_count: usize,
}

impl<T: Real> PackedInverse<T> {
    /// Repacks `kernel` (rounded once to `T`) for the region `roi`.
    pub fn new(kernel: &InverseKernel, roi: &RoiMask) -> Self {
        assert_eq!(
            roi.n_sources(),
            kernel.n_sources,
            "the region must be over the kernel's sources"
        );
        let (c, l) = (kernel.n_channels, T::LANES);
        let n_panels = kernel.n_sources.div_ceil(l);
        let mut packed = vec![T::ZERO; n_panels * c * 3 * l];
        let mut scale = vec![T::ZERO; n_panels * l];
        let mut in_roi = vec![false; n_panels * l];
        for s in 0..kernel.n_sources {
            let (p, lane) = (s / l, s % l);
            for o in 0..3 {
                let row = &kernel.kernel[(3 * s + o) * c..(3 * s + o + 1) * c];
                for (ch, &v) in row.iter().enumerate() {
                    packed[((p * c + ch) * 3 + o) * l + lane] = T::from_f64(v);
                }
            }
            scale[s] = T::from_f64(kernel.source_scale[s]);
            in_roi[s] = roi.mask[s];
        }
        let panel_in_roi = in_roi.chunks_exact(l).map(|p| p.contains(&true)).collect();
        Self {
            n_channels: c,
            n_sources: kernel.n_sources,
            n_panels,
            kernel: packed,
            scale,
            in_roi,
            panel_in_roi,
            roi_count: roi.indices.len(),
        }
    }

    /// Bytes of operator one block reads.
    pub fn bytes(&self) -> usize {
        self.kernel.len() * std::mem::size_of::<T>()
    }

    /// The packed values (`[panel][channel][orientation][lane]`), for measuring how fast
    /// the machine can read them.
    pub fn values(&self) -> &[T] {
        &self.kernel
    }

    /// Panels of `LANES` sources.
    pub fn n_panels(&self) -> usize {
        self.n_panels
    }
}

/// Why a block was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Shape(#[from] BlockShapeError),
    #[error(transparent)]
    Panicked(#[from] PartPanicked),
}

/// One thread's partial statistics of a block.
#[derive(Default)]
struct Scratch {
    /// `[column][lane]`: sum over this thread's ROI sources of amplitude².
    roi: Vec<f64>,
    /// Per frame: this thread's strongest source and its power.
    peaks: Vec<(u32, f64)>,
    /// `[panel of this thread][lane]`: power of each source over its frame so far.
    power: Vec<f64>,
}

/// Where the threads write the source estimate (disjoint sources each).
#[derive(Clone, Copy)]
struct OutPtr<T> {
    ptr: *mut T,
    len: usize,
}
// SAFETY: every thread writes only the rows of its own sources (see `part`), and the owner
// of the slice waits for all of them before it uses the slice again.
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    #[inline(always)]
    fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "source estimate index out of range");
        // SAFETY: in bounds (checked); no other thread writes index `i`.
        unsafe { self.ptr.add(i).write(v) }
    }
}

/// What one part of a block needs.
struct Block<'a, T> {
    op: &'a PackedInverse<T>,
    /// Packed samples `[column block][channel][nr]`.
    x: &'a [T],
    n_times: usize,
    cols: usize,
    n_blocks: usize,
    out: Option<OutPtr<T>>,
}

/// The CPU product and statistics of one backend: the operator, the threads, the buffers.
pub struct CpuInverse<T: Real> {
    op: Arc<PackedInverse<T>>,
    workers: Workers,
    /// Panels of each part (thread).
    parts: Vec<Range<usize>>,
    isa: Isa,
    x: Vec<T>,
    scratch: Vec<Mutex<Scratch>>,
    stats: Vec<BlockStats>,
    /// See [`SPLIT_MIN_BYTES`].
    split_min_bytes: usize,
}

impl<T: Real> CpuInverse<T> {
    /// Starts `threads` threads (the caller counts as one) with the best instruction set
    /// of this CPU.
    pub fn new(op: Arc<PackedInverse<T>>, threads: usize) -> std::io::Result<Self> {
        Self::with_isa(op, threads, Isa::detect())
    }

    /// As [`Self::new`] with an instruction set no better than `isa` (tests, benchmarks).
    pub fn with_isa(op: Arc<PackedInverse<T>>, threads: usize, isa: Isa) -> std::io::Result<Self> {
        let isa = isa.min(Isa::detect());
        let workers = Workers::new(threads.max(1), "trigd-eeg")?;
        let n = workers.threads();
        let parts: Vec<Range<usize>> = (0..n)
            .map(|i| i * op.n_panels / n..(i + 1) * op.n_panels / n)
            .collect();
        // Part 0 also takes whole small blocks alone (see `parts_for`).
        let scratch = parts
            .iter()
            .enumerate()
            .map(|(i, r): (usize, &Range<usize>)| {
                let panels = if i == 0 { op.n_panels } else { r.len() };
                Mutex::new(Scratch {
                    power: vec![0.0; panels * T::LANES],
                    ..Scratch::default()
                })
            })
            .collect();
        Ok(Self {
            op,
            workers,
            parts,
            isa,
            x: Vec::new(),
            scratch,
            stats: Vec::new(),
            split_min_bytes: SPLIT_MIN_BYTES,
        })
    }

    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn operator(&self) -> &PackedInverse<T> {
        &self.op
    }

    /// The threads the product runs on (benchmarks measure the machine's floor on them).
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// The panels each thread takes.
    pub fn parts(&self) -> &[Range<usize>] {
        &self.parts
    }

    /// Splits every block, however small, over all threads (tests of the split on small
    /// operators).
    pub fn always_split(&mut self) {
        self.split_min_bytes = 0;
    }

    /// Threads a block of `cols` samples (over all its frames) is split over: all of them,
    /// or only the caller for a block too small to be worth waking the others.
    pub fn parts_for(&self, cols: usize) -> usize {
        if self.op.bytes().saturating_mul(cols) < self.split_min_bytes {
            1
        } else {
            self.parts.len()
        }
    }

    /// Sizes every buffer for batches of up to `max_frames` frames of `max_times` samples,
    /// so the hot path never allocates.
    pub fn reserve(&mut self, max_frames: usize, max_times: usize) {
        let cols = max_frames.max(1) * max_times.max(1);
        let c = self.op.n_channels;
        self.x.reserve((cols + NR_MAX) * c);
        for s in &self.scratch {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.roi.reserve(cols * T::LANES);
            s.peaks.reserve(max_frames.max(1));
        }
        if self.stats.len() < max_frames {
            self.stats.resize(max_frames, BlockStats::default());
        }
        for st in &mut self.stats {
            st.roi_power.reserve(max_times);
        }
    }

    /// One block: `data` channel-major `[n_channels, n_times]`; `amplitudes`, if given,
    /// source-major `[n_sources, n_times]` (`scale[s] * |K_s x_t|`).
    pub fn apply(
        &mut self,
        data: &[T],
        n_times: usize,
        amplitudes: Option<&mut [T]>,
    ) -> Result<&BlockStats, ApplyError> {
        let stats = self.process(data, n_times, amplitudes)?;
        Ok(&stats[0])
    }

    /// Frames that arrived together, all of `n_times` samples: `frames` holds them back to
    /// back, each channel-major `[n_channels, n_times]`; `amplitudes`, if given, receives
    /// each frame's `[n_sources, n_times]` back to back. Returns each frame's statistics.
    pub fn process(
        &mut self,
        frames: &[T],
        n_times: usize,
        amplitudes: Option<&mut [T]>,
    ) -> Result<&[BlockStats], ApplyError> {
        let (c, n_s) = (self.op.n_channels, self.op.n_sources);
        let per_frame = c * n_times;
        if n_times == 0 || frames.is_empty() || frames.len() % per_frame != 0 {
            return Err(BlockShapeError {
                what: "frames [n_frames, n_channels, n_times]",
                got: frames.len(),
                expected: per_frame * (frames.len() / per_frame.max(1)).max(1),
            }
            .into());
        }
        let n_frames = frames.len() / per_frame;
        if let Some(a) = &amplitudes {
            if a.len() != n_frames * n_s * n_times {
                return Err(BlockShapeError {
                    what: "amplitudes [n_frames, n_sources, n_times]",
                    got: a.len(),
                    expected: n_frames * n_s * n_times,
                }
                .into());
            }
        }
        let cols = n_frames * n_times;
        let nr = self.isa.nr(cols);
        let n_blocks = cols.div_ceil(nr);
        // Samples packed by column block, zero past the last column.
        self.x.clear();
        self.x.resize(n_blocks * c * nr, T::ZERO);
        for col in 0..cols {
            let (f, t) = (col / n_times, col % n_times);
            let (jb, j) = (col / nr, col % nr);
            let src = &frames[f * per_frame..(f + 1) * per_frame];
            let dst = &mut self.x[jb * c * nr..(jb + 1) * c * nr];
            for ch in 0..c {
                dst[ch * nr + j] = src[ch * n_times + t];
            }
        }
        for s in &self.scratch {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.roi.clear();
            s.roi.resize(cols * T::LANES, 0.0);
            s.peaks.clear();
            s.peaks.resize(n_frames, (0, f64::NEG_INFINITY));
        }
        let block = Block {
            op: &self.op,
            x: &self.x,
            n_times,
            cols,
            n_blocks,
            out: amplitudes.map(|a| OutPtr {
                ptr: a.as_mut_ptr(),
                len: a.len(),
            }),
        };
        let n_parts = self.parts_for(cols);
        let (parts, scratch, isa) = (&self.parts, &self.scratch, self.isa);
        if n_parts == 1 {
            let mut s = scratch[0].lock().unwrap_or_else(|e| e.into_inner());
            let all = 0..self.op.n_panels;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_part(isa, nr, &block, all, &mut s)
            }))
            .map_err(|_| PartPanicked)?;
        } else {
            self.workers.run(&|i| {
                let mut s = scratch[i].lock().unwrap_or_else(|e| e.into_inner());
                run_part(isa, nr, &block, parts[i].clone(), &mut s);
            })?;
        }
        // The threads' parts in source order.
        if self.stats.len() < n_frames {
            self.stats.resize(n_frames, BlockStats::default());
        }
        let inv = 1.0 / self.op.roi_count.max(1) as f64;
        for st in &mut self.stats[..n_frames] {
            st.roi_power.clear();
            st.roi_power.resize(n_times, 0.0);
            st.peak_source = 0;
            st.peak_power = f64::NEG_INFINITY;
        }
        for s in &scratch[..n_parts] {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            for (f, st) in self.stats[..n_frames].iter_mut().enumerate() {
                for (t, p) in st.roi_power.iter_mut().enumerate() {
                    let col = f * n_times + t;
                    *p += s.roi[col * T::LANES..(col + 1) * T::LANES]
                        .iter()
                        .sum::<f64>();
                }
                let (src, power) = s.peaks[f];
                if power > st.peak_power {
                    st.peak_power = power;
                    st.peak_source = src;
                }
            }
        }
        for st in &mut self.stats[..n_frames] {
            st.roi_power.iter_mut().for_each(|p| *p *= inv);
            if n_s == 0 || st.peak_power.is_nan() {
                st.peak_power = 0.0;
            }
        }
        Ok(&self.stats[..n_frames])
    }
}

/// One thread's share (`panels`) of a block, with the best kernel for `isa` and `nr`.
fn run_part<T: Real>(isa: Isa, nr: usize, b: &Block<'_, T>, panels: Range<usize>, s: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `isa` is never better than `Isa::detect()` (see `with_isa`).
        unsafe {
            match (isa, nr) {
                (Isa::Avx512, 8) => return part_avx512::<T, 8>(b, panels, s),
                (Isa::Avx512, 4) => return part_avx512::<T, 4>(b, panels, s),
                (Isa::Avx512, 2) => return part_avx512::<T, 2>(b, panels, s),
                (Isa::Avx512, _) => return part_avx512::<T, 1>(b, panels, s),
                (Isa::Avx2, 2) => return part_avx2::<T, 2>(b, panels, s),
                (Isa::Avx2, _) => return part_avx2::<T, 1>(b, panels, s),
                (Isa::Portable, _) => {}
            }
        }
    }
    let _ = isa;
    match nr {
        2 => part::<T, 2, 0>(b, panels, s),
        _ => part::<T, 1, 0>(b, panels, s),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn part_avx512<T: Real, const NR: usize>(
    b: &Block<'_, T>,
    panels: Range<usize>,
    s: &mut Scratch,
) {
    part::<T, NR, 2>(b, panels, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn part_avx2<T: Real, const NR: usize>(
    b: &Block<'_, T>,
    panels: Range<usize>,
    s: &mut Scratch,
) {
    part::<T, NR, 1>(b, panels, s)
}

/// The product of `panels` with every column block, then per column the norm over
/// orientations, the scale, the ROI power and each source's power over its frame.
/// `ISA`: 0 portable, 1 portable with FMA, 2 AVX-512.
#[inline(always)]
fn part<T: Real, const NR: usize, const ISA: u8>(
    b: &Block<'_, T>,
    panels: Range<usize>,
    s: &mut Scratch,
) {
    let (c, l, n_t) = (b.op.n_channels, T::LANES, b.n_times);
    let n_s = b.op.n_sources;
    let mut tile = [T::ZERO; NR_MAX * LANES_MAX];
    let per_chunk = (X_CHUNK_BYTES / (c * std::mem::size_of::<T>()) / NR).max(1);
    let p0 = panels.start;
    let mut cb0 = 0;
    while cb0 < b.n_blocks {
        let cb1 = (cb0 + per_chunk).min(b.n_blocks);
        for p in panels.clone() {
            let k = &b.op.kernel[p * c * 3 * l..(p + 1) * c * 3 * l];
            let scale = &b.op.scale[p * l..(p + 1) * l];
            let in_roi = &b.op.in_roi[p * l..(p + 1) * l];
            let any_roi = b.op.panel_in_roi[p];
            let valid = n_s.saturating_sub(p * l).min(l);
            let power = &mut s.power[(p - p0) * l..(p - p0 + 1) * l];
            for jb in cb0..cb1 {
                let x = &b.x[jb * c * NR..(jb + 1) * c * NR];
                if ISA == 2 {
                    // The first block of a pass fetches the next panel meanwhile: with few
                    // blocks per panel, reading the operator and multiplying then overlap.
                    // Not for one column per block (a one-sample frame alone): that loop
                    // only streams the operator, which the hardware prefetcher follows
                    // better than the extra prefetch instructions (bench/RESULTS.md).
                    let next = if NR > 1 && jb == cb0 && p + 1 < panels.end {
                        &b.op.kernel[(p + 1) * c * 3 * l..(p + 2) * c * 3 * l]
                    } else {
                        &[]
                    };
                    // SAFETY: ISA 2 runs only inside `part_avx512`, chosen after detection.
                    unsafe { T::panel_avx512::<NR>(k, x, c, scale, &mut tile, next) };
                } else {
                    panel_portable::<T, NR>(k, x, c, scale, &mut tile, ISA == 1);
                }
                for j in 0..NR {
                    let col = jb * NR + j;
                    if col >= b.cols {
                        break;
                    }
                    let (f, t) = (col / n_t, col % n_t);
                    if t == 0 {
                        power.fill(0.0);
                    }
                    let amp = &tile[j * l..(j + 1) * l];
                    for li in 0..l {
                        let q = amp[li].to_f64();
                        power[li] += q * q;
                    }
                    if any_roi {
                        let roi = &mut s.roi[col * l..(col + 1) * l];
                        for li in 0..l {
                            let q = amp[li].to_f64();
                            roi[li] += if in_roi[li] { q * q } else { 0.0 };
                        }
                    }
                    if let Some(out) = &b.out {
                        let base = (f * n_s + p * l) * n_t + t;
                        for (li, &a) in amp[..valid].iter().enumerate() {
                            out.write(base + li * n_t, a);
                        }
                    }
                    // Most panels hold no new peak: one vector comparison rules them out
                    // (compares and an or, no horizontal maximum: a frame of one sample
                    // does this once per panel and column).
                    if t == n_t - 1 && {
                        let best = s.peaks[f].1;
                        let mut higher = false;
                        for &pw in power.iter() {
                            higher |= pw > best;
                        }
                        higher
                    } {
                        let peak = &mut s.peaks[f];
                        for (li, &pw) in power[..valid].iter().enumerate() {
                            if pw > peak.1 {
                                *peak = ((p * l + li) as u32, pw);
                            }
                        }
                    }
                }
            }
        }
        cb0 = cb1;
    }
}

/// The panel product in plain code (any CPU; vectorised by the compiler), then the norm
/// over orientations times the scale.
#[inline(always)]
fn panel_portable<T: Real, const NR: usize>(
    k: &[T],
    x: &[T],
    c: usize,
    scale: &[T],
    amp: &mut [T],
    fma: bool,
) {
    let l = T::LANES;
    let mut acc = [T::ZERO; 3 * NR_MAX * LANES_MAX];
    let acc = &mut acc[..3 * NR * l];
    for (kc, xc) in k.chunks_exact(3 * l).zip(x.chunks_exact(NR)).take(c) {
        for (j, &xv) in xc.iter().enumerate() {
            for o in 0..3 {
                let a = &mut acc[(o * NR + j) * l..(o * NR + j + 1) * l];
                for (a, &kv) in a.iter_mut().zip(&kc[o * l..(o + 1) * l]) {
                    *a = if fma {
                        kv.mul_add(xv, *a)
                    } else {
                        *a + kv * xv
                    };
                }
            }
        }
    }
    for j in 0..NR {
        for li in 0..l {
            let (a, b, d) = (
                acc[j * l + li],
                acc[(NR + j) * l + li],
                acc[(2 * NR + j) * l + li],
            );
            amp[j * l + li] = scale[li] * (a * a + b * b + d * d).sqrt();
        }
    }
}

/// The AVX-512 panel kernel for one element type: 3 x NR accumulators in registers, the
/// operator's three vectors loaded once per channel, each sample broadcast.
macro_rules! avx512_panel {
    ($name:ident, $t:ty, $lanes:expr, $v:ty, $zero:ident, $load:ident, $set1:ident, $fmadd:ident, $add:ident, $mul:ident, $sqrt:ident, $store:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn $name<const NR: usize>(
            k: &[$t],
            x: &[$t],
            c: usize,
            scale: &[$t],
            amp: &mut [$t],
            next: &[$t],
        ) {
            use std::arch::x86_64::*;
            const L: usize = $lanes;
            // One channel of a panel is 3 * L values = 192 bytes = 3 cache lines.
            let pf = !next.is_empty();
            assert!(!pf || next.len() >= c * 3 * L);
            let np = next.as_ptr() as *const i8;
            let fetch = |ch: usize| {
                if pf {
                    let line = np.add(ch * 3 * L * std::mem::size_of::<$t>());
                    _mm_prefetch::<_MM_HINT_T0>(line);
                    _mm_prefetch::<_MM_HINT_T0>(line.add(64));
                    _mm_prefetch::<_MM_HINT_T0>(line.add(128));
                }
            };
            assert!(
                k.len() >= c * 3 * L
                    && x.len() >= c * NR
                    && scale.len() >= L
                    && amp.len() >= NR * L
            );
            let (kp, xp) = (k.as_ptr(), x.as_ptr());
            let mut acc: [[$v; NR]; 3] = [[$zero(); NR]; 3];
            if NR == 1 {
                // Two chains per orientation, so the adds do not wait on each other.
                let mut odd: [$v; 3] = [$zero(); 3];
                let mut ch = 0;
                while ch + 2 <= c {
                    fetch(ch);
                    fetch(ch + 1);
                    let x0 = $set1(*xp.add(ch));
                    let x1 = $set1(*xp.add(ch + 1));
                    for o in 0..3 {
                        acc[o][0] = $fmadd($load(kp.add((ch * 3 + o) * L)), x0, acc[o][0]);
                        odd[o] = $fmadd($load(kp.add(((ch + 1) * 3 + o) * L)), x1, odd[o]);
                    }
                    ch += 2;
                }
                if ch < c {
                    fetch(ch);
                    let x0 = $set1(*xp.add(ch));
                    for o in 0..3 {
                        acc[o][0] = $fmadd($load(kp.add((ch * 3 + o) * L)), x0, acc[o][0]);
                    }
                }
                for o in 0..3 {
                    acc[o][0] = $add(acc[o][0], odd[o]);
                }
            } else {
                for ch in 0..c {
                    fetch(ch);
                    let k0 = $load(kp.add(ch * 3 * L));
                    let k1 = $load(kp.add(ch * 3 * L + L));
                    let k2 = $load(kp.add(ch * 3 * L + 2 * L));
                    let xc = xp.add(ch * NR);
                    for j in 0..NR {
                        let xv = $set1(*xc.add(j));
                        acc[0][j] = $fmadd(k0, xv, acc[0][j]);
                        acc[1][j] = $fmadd(k1, xv, acc[1][j]);
                        acc[2][j] = $fmadd(k2, xv, acc[2][j]);
                    }
                }
            }
            let sc = $load(scale.as_ptr());
            let ap = amp.as_mut_ptr();
            for j in 0..NR {
                let n = $add(
                    $add($mul(acc[0][j], acc[0][j]), $mul(acc[1][j], acc[1][j])),
                    $mul(acc[2][j], acc[2][j]),
                );
                $store(ap.add(j * L), $mul(sc, $sqrt(n)));
            }
        }
    };
}

avx512_panel!(
    panel_f32_avx512,
    f32,
    16,
    __m512,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_mul_ps,
    _mm512_sqrt_ps,
    _mm512_storeu_ps
);
avx512_panel!(
    panel_f64_avx512,
    f64,
    8,
    __m512d,
    _mm512_setzero_pd,
    _mm512_loadu_pd,
    _mm512_set1_pd,
    _mm512_fmadd_pd,
    _mm512_add_pd,
    _mm512_mul_pd,
    _mm512_sqrt_pd,
    _mm512_storeu_pd
);

macro_rules! real_impl {
    ($t:ty, $lanes:expr, $avx512:ident) => {
        impl Real for $t {
            const LANES: usize = $lanes;
            const ZERO: $t = 0.0;
            #[inline(always)]
            fn from_f64(v: f64) -> $t {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn mul_add(self, a: $t, b: $t) -> $t {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            unsafe fn panel_avx512<const NR: usize>(
                k: &[$t],
                x: &[$t],
                c: usize,
                scale: &[$t],
                amp: &mut [$t],
                next: &[$t],
            ) {
                #[cfg(target_arch = "x86_64")]
                {
                    // SAFETY: the caller checked the CPU (trait contract).
                    unsafe { $avx512::<NR>(k, x, c, scale, amp, next) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    let _ = next;
                    panel_portable::<$t, NR>(k, x, c, scale, amp, false)
                }
            }
        }
    };
}

real_impl!(f32, 16, panel_f32_avx512);
real_impl!(f64, 8, panel_f64_avx512);

/// Threads for the CPU EEG product when the configuration leaves it open: the cores left
/// once each input has its source thread and the decisions their thread, shared among the
/// reconstruction workers; at least one.
pub fn default_threads(cores: usize, inputs: usize, workers: usize) -> usize {
    (cores.saturating_sub(inputs + 1) / workers.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eeg::roi::{block_stats, RoiConfig};
    use rand::{Rng, SeedableRng};

    fn random_kernel(n_channels: usize, n_sources: usize, seed: u64) -> InverseKernel {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        InverseKernel {
            n_channels,
            n_sources,
            kernel: (0..3 * n_sources * n_channels)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
            source_scale: (0..n_sources).map(|_| rng.random_range(0.5..2.0)).collect(),
        }
    }

    fn roi_every_third(n_sources: usize) -> RoiMask {
        let positions = vec![[0.0; 3]; n_sources];
        RoiConfig {
            sphere: None,
            sources: Some((0..n_sources as u32).step_by(3).collect()),
            window_ms: 1.0,
            threshold: 1.0,
            refractory_ms: 0.0,
        }
        .resolve(&positions)
        .expect("roi")
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    /// Every instruction set, thread count and batch shape gives the single-thread tiled
    /// product's amplitudes and `block_stats`' statistics, frame by frame.
    #[test]
    fn threads_and_batches_agree_with_the_reference() {
        let isas = [Isa::Portable, Isa::Avx2, Isa::Avx512];
        for &(c, n_s, n_t, n_f) in &[
            (7, 1, 1, 1),
            (13, 65, 33, 2),
            (32, 130, 1, 11),
            (64, 40, 5, 3),
        ] {
            let k = random_kernel(c, n_s, (c * 100 + n_s) as u64);
            let roi = roi_every_third(n_s);
            let op64 = Arc::new(PackedInverse::<f64>::new(&k, &roi));
            let op32 = Arc::new(PackedInverse::<f32>::new(&k, &roi));
            let k32 = k.to_f32();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
            let data: Vec<f64> = (0..n_f * c * n_t)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let data32: Vec<f32> = data.iter().map(|&v| v as f32).collect();
            // Reference, frame by frame.
            let mut want_amp = vec![0.0; n_f * n_s * n_t];
            let mut want_stats = Vec::new();
            for f in 0..n_f {
                let out = &mut want_amp[f * n_s * n_t..(f + 1) * n_s * n_t];
                k.apply_f64(&data[f * c * n_t..(f + 1) * c * n_t], n_t, out);
                let mut st = BlockStats::default();
                block_stats(out, n_t, &roi, &mut st);
                want_stats.push(st);
            }
            let mut want32 = vec![0.0f32; n_f * n_s * n_t];
            for f in 0..n_f {
                k32.apply_f32(
                    &data32[f * c * n_t..(f + 1) * c * n_t],
                    n_t,
                    &mut want32[f * n_s * n_t..(f + 1) * n_s * n_t],
                );
            }
            for isa in isas {
                for threads in [1, 2, 3] {
                    let mut e = CpuInverse::with_isa(op64.clone(), threads, isa).expect("threads");
                    e.always_split();
                    let mut amp = vec![f64::NAN; n_f * n_s * n_t];
                    let stats = e.process(&data, n_t, Some(&mut amp)).expect("apply");
                    for (a, b) in amp.iter().zip(&want_amp) {
                        assert!(close(*a, *b, 1e-12), "{isa:?} {threads}: {a} vs {b}");
                    }
                    for (got, want) in stats.iter().zip(&want_stats) {
                        assert_eq!(got.peak_source, want.peak_source);
                        assert!(close(got.peak_power, want.peak_power, 1e-12));
                        for (a, b) in got.roi_power.iter().zip(&want.roi_power) {
                            assert!(close(*a, *b, 1e-12), "roi {a} vs {b}");
                        }
                    }
                    let mut e32 =
                        CpuInverse::with_isa(op32.clone(), threads, isa).expect("threads");
                    let mut amp32 = vec![f32::NAN; n_f * n_s * n_t];
                    let stats32 = e32.process(&data32, n_t, Some(&mut amp32)).expect("apply");
                    for ((a, b), w) in amp32.iter().zip(&want32).zip(&want_amp) {
                        let (a, b) = (f64::from(*a), f64::from(*b));
                        assert!((a - b).abs() <= 1e-5 * w.abs().max(1.0), "{a} vs {b}");
                        assert!((a - w).abs() <= 1e-5 * w.abs().max(1.0), "{a} vs {w}");
                    }
                    for (got, want) in stats32.iter().zip(&want_stats) {
                        for (a, b) in got.roi_power.iter().zip(&want.roi_power) {
                            assert!(close(*a, *b, 1e-5), "roi {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    /// One-sample frames batched together give each frame what it gets alone.
    #[test]
    fn a_batch_of_one_sample_frames_is_each_frame_alone() {
        let (c, n_s) = (16, 50);
        let k = random_kernel(c, n_s, 3);
        let roi = roi_every_third(n_s);
        let op = Arc::new(PackedInverse::<f64>::new(&k, &roi));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let frames: Vec<f64> = (0..9 * c).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut batched = CpuInverse::new(op.clone(), 2).expect("threads");
        batched.always_split();
        let together: Vec<BlockStats> = batched.process(&frames, 1, None).expect("batch").to_vec();
        assert_eq!(together.len(), 9);
        let mut alone = CpuInverse::new(op, 2).expect("threads");
        for (f, want) in together.iter().enumerate() {
            let got = alone
                .apply(&frames[f * c..(f + 1) * c], 1, None)
                .expect("one");
            assert_eq!(got.peak_source, want.peak_source);
            assert!(close(got.roi_power[0], want.roi_power[0], 1e-12));
        }
    }

    /// Small blocks stay on the caller; the operator of a real head model is split.
    #[test]
    fn only_blocks_worth_it_are_split() {
        let small = random_kernel(8, 20, 1);
        let e = CpuInverse::new(
            Arc::new(PackedInverse::<f32>::new(&small, &roi_every_third(20))),
            3,
        )
        .expect("threads");
        assert_eq!(e.parts_for(1), 1);
        let big = random_kernel(64, 2000, 1);
        let e = CpuInverse::new(
            Arc::new(PackedInverse::<f32>::new(&big, &roi_every_third(2000))),
            3,
        )
        .expect("threads");
        assert_eq!(e.parts_for(1), 3);
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let k = random_kernel(4, 3, 1);
        let roi = roi_every_third(3);
        let mut e =
            CpuInverse::new(Arc::new(PackedInverse::<f32>::new(&k, &roi)), 2).expect("threads");
        assert!(e.process(&[0.0; 7], 2, None).is_err());
        assert!(e.process(&[], 2, None).is_err());
        let mut amp = vec![0.0; 5];
        assert!(e.process(&[0.0; 8], 2, Some(&mut amp)).is_err());
        assert!(e.process(&[0.0; 16], 2, None).is_ok());
    }

    #[test]
    fn default_threads_leave_the_sources_and_decisions_a_core() {
        assert_eq!(default_threads(2, 1, 1), 1);
        assert_eq!(default_threads(16, 1, 1), 14);
        assert_eq!(default_threads(16, 2, 2), 6);
        assert_eq!(default_threads(1, 4, 1), 1);
    }
}
