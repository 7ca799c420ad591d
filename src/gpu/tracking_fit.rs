//! The Kalman fit on the GPU: a batch of track candidates from many events fitted at once,
//! one thread per candidate (`kernels/kalman_fit.cu`), with the CPU fitter
//! ([`crate::tracking::kalman::KalmanFitter`]) as the reference it mirrors step by step:
//! the same seed, the same Runge-Kutta steps (one per gap in a uniform field or where the
//! field map's profile is parabolic, several of at most `max_step_mm` elsewhere), the same
//! covariance transport, update, scattering, chi-square and degrees of freedom, in the
//! same number types. The kernel is compiled with `--fmad=false`, so the GPU's fits are
//! the CPU's to the last bits or within a few units of the last place.
//!
//! Memory is allocated once, in [`GpuFitEngine::new`], from the configured limits
//! ([`FitLimits`]: candidates per batch, hits per candidate): the plane constants and the
//! field (uniform value or map nodes) stay on the device; each batch's hits go up once,
//! in structure-of-arrays layout (hit `k` of every candidate contiguous, so the threads
//! of a warp read one line), and the fitted states, covariances, chi-squares and degrees
//! of freedom come back in the same layout. A batch beyond a limit is refused as a
//! [`FitError::Overflow`] before anything is copied (the caller counts it and fits that
//! batch on the CPU); every device error is returned as [`FitError::Device`].
//!
//! Per fit, about `12 n_hits + 96` bytes cross the bus (hits in, 24 words out): with 8-hit
//! candidates some 190 bytes, so a PCIe 5 link (about 50 GB/s) carries at most about
//! 2.5e8 fits per second; the fit itself is some 3,000 single-precision operations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result as drv, CudaContext, CudaFunction, CudaStream};

use super::nvrtc::{KernelCache, LoadedModule};
use super::runtime::{copy_to_device, copy_to_host, DeviceBuffer, PinnedBuffer};
use super::{driver, GpuDevice, GpuError, KernelModule};
use crate::tracking::geometry::Field;
use crate::tracking::kalman::{FitHit, FitOutput, KalmanFitter, SCATTER_GRID, SCATTER_P_MAX_GEV};

const KERNEL_SOURCE: &str = include_str!("../../kernels/kalman_fit.cu");
/// NVRTC options of the fit: no contraction of products and sums into fused
/// multiply-adds, which the CPU fitter does not make either.
const KERNEL_OPTIONS: [&str; 1] = ["--fmad=false"];

/// The module the engine compiles.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "kalman_fit.cu",
        source: KERNEL_SOURCE.to_string(),
        options: &KERNEL_OPTIONS,
        engine: file!(),
    }
}

/// Threads per block of `kalman_fit`.
const BLOCK_THREADS: u32 = 128;
/// Candidates are laid out in rows of a multiple of this (a warp's coalesced line).
const STRIDE_ALIGN: usize = 32;
/// Candidates packed together, row by row ([`pack_hits`]): their hits (a few KiB) stay
/// in the first-level cache while the rows are written.
const PACK_BLOCK: usize = 256;
/// Words per candidate in the output (OUT_WORDS in kernels/kalman_fit.cu): state (5),
/// covariance (15), z, chi-square (floats), ndf, ok (integers).
pub const OUT_WORDS: usize = 24;

/// Row indices of the output.
const OUT_COV: usize = 5;
const OUT_Z: usize = 20;
const OUT_CHI2: usize = 21;
const OUT_NDF: usize = 22;
const OUT_OK: usize = 23;

/// How the step over a gap reads the field (GAP_* in kernels/kalman_fit.cu, the CPU's
/// `GapField`).
const GAP_BY_ONLY: i32 = 0;
const GAP_UNIFORM: i32 = 1;
const GAP_MAP: i32 = 2;
const GAP_PROFILE: i32 = 3;

/// Entries of the parameter arrays (PI_*, PF_*, PD_* in kernels/kalman_fit.cu).
const PARAM_INTS: usize = 10;
const PARAM_FLOATS: usize = 15;
const PARAM_DOUBLES: usize = 9 + SCATTER_GRID;

/// The result of one fit: the CPU fitter's own record, so that either backend fills the
/// same type and a batch refused by the GPU is fitted by the CPU into the same place.
pub type FittedTrack = FitOutput;

/// The limits the engine's buffers are sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitLimits {
    /// Most candidates in one batch.
    pub max_candidates: usize,
    /// Most hits of one candidate.
    pub max_hits_per_candidate: usize,
}

impl Default for FitLimits {
    /// 65,536 candidates (some 40 central events) of up to 32 hits: 25 MiB of hits and
    /// 6 MiB of results per direction.
    fn default() -> Self {
        Self {
            max_candidates: 1 << 16,
            max_hits_per_candidate: 32,
        }
    }
}

impl FitLimits {
    /// Candidate rows of the buffers (the limit rounded up to whole warps).
    pub fn stride(&self) -> usize {
        self.max_candidates.div_ceil(STRIDE_ALIGN) * STRIDE_ALIGN
    }

    /// 32-bit words of the hit buffer (host staging and device).
    pub fn input_words(&self) -> usize {
        self.stride() * (1 + 3 * self.max_hits_per_candidate)
    }

    /// 32-bit words of the result buffer (device and host).
    pub fn output_words(&self) -> usize {
        self.stride() * OUT_WORDS
    }

    /// Bytes of device memory for the batch buffers (the tables and the field come on top).
    pub fn device_bytes(&self) -> usize {
        4 * (self.input_words() + self.output_words())
    }

    fn validate(&self) -> Result<(), GpuError> {
        if self.max_candidates == 0 || self.max_hits_per_candidate < 3 {
            return Err(GpuError::Config(format!(
                "fit limits must allow at least one candidate of three hits (got {} candidates of {} hits)",
                self.max_candidates, self.max_hits_per_candidate
            )));
        }
        // Every word index of the kernel fits in 32 bits with room to spare.
        let words = self
            .max_candidates
            .checked_add(STRIDE_ALIGN)
            .and_then(|s| s.checked_mul(1 + 3 * self.max_hits_per_candidate))
            .filter(|&w| w < i32::MAX as usize);
        if words.is_none() {
            return Err(GpuError::Config(format!(
                "fit limits of {} candidates of {} hits exceed the kernel's 32-bit indices",
                self.max_candidates, self.max_hits_per_candidate
            )));
        }
        Ok(())
    }
}

/// Which limit a batch exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitLimit {
    Candidates,
    HitsPerCandidate,
}

impl std::fmt::Display for FitLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FitLimit::Candidates => "candidates per batch",
            FitLimit::HitsPerCandidate => "hits per candidate",
        })
    }
}

/// Why a batch was not fitted on the GPU.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// The batch exceeds a limit of the engine: nothing was copied or truncated; fit the
    /// batch on the CPU (and count it).
    #[error("batch of {got} {limit} exceeds the GPU fit's limit of {max}; fit it on the CPU")]
    Overflow {
        limit: FitLimit,
        got: usize,
        max: usize,
    },
    #[error(transparent)]
    Device(#[from] GpuError),
}

/// The shape of one batch in the structure-of-arrays buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchShape {
    /// Candidates in the batch.
    pub n: usize,
    /// Row length of every per-candidate quantity (`n` rounded up to whole warps).
    pub stride: usize,
    /// Most hits of one candidate in the batch (rows of hits).
    pub kmax: usize,
}

impl BatchShape {
    /// Words of the batch's hits: per candidate its hit count, then `kmax` rows each of x,
    /// y and plane.
    pub fn input_words(&self) -> usize {
        self.stride * (1 + 3 * self.kmax)
    }

    pub fn output_words(&self) -> usize {
        self.stride * OUT_WORDS
    }
}

/// Checks a batch against the limits and gives its shape; a batch beyond a limit is an
/// [`FitError::Overflow`].
pub fn check_batch(limits: &FitLimits, tracks: &[&[FitHit]]) -> Result<BatchShape, FitError> {
    let n = tracks.len();
    if n > limits.max_candidates {
        return Err(FitError::Overflow {
            limit: FitLimit::Candidates,
            got: n,
            max: limits.max_candidates,
        });
    }
    let kmax = tracks.iter().map(|t| t.len()).max().unwrap_or(0);
    if kmax > limits.max_hits_per_candidate {
        return Err(FitError::Overflow {
            limit: FitLimit::HitsPerCandidate,
            got: kmax,
            max: limits.max_hits_per_candidate,
        });
    }
    Ok(BatchShape {
        n,
        stride: n.div_ceil(STRIDE_ALIGN) * STRIDE_ALIGN,
        kmax,
    })
}

/// Writes the batch's hits into `words` (at least `shape.input_words()` long) in the
/// kernel's layout: `[n_hits][x rows][y rows][plane rows]`, hit `k` of candidate `c` at
/// `k * stride + c` of its region. Entries past a candidate's hits are not written (the
/// kernel reads only a candidate's own hits).
pub fn pack_hits(tracks: &[&[FitHit]], shape: &BatchShape, words: &mut [u32]) {
    let s = shape.stride;
    let rows = shape.kmax * s;
    assert!(tracks.len() == shape.n && words.len() >= shape.input_words());
    let (counts, rest) = words.split_at_mut(s);
    let (xs, rest) = rest.split_at_mut(rows);
    let (ys, planes) = rest.split_at_mut(rows);
    for (c, t) in tracks.iter().enumerate() {
        counts[c] = t.len() as u32;
    }
    // A block of candidates at a time, row by row inside it: the writes run along the
    // rows and the block's hits stay in the cache over its rows.
    for c0 in (0..shape.n).step_by(PACK_BLOCK) {
        let block = &tracks[c0..(c0 + PACK_BLOCK).min(shape.n)];
        for k in 0..shape.kmax {
            let row = k * s + c0..k * s + c0 + block.len();
            let (xr, yr, pr) = (&mut xs[row.clone()], &mut ys[row.clone()], &mut planes[row]);
            for (c, t) in block.iter().enumerate() {
                if let Some(h) = t.get(k) {
                    xr[c] = h.x_mm.to_bits();
                    yr[c] = h.y_mm.to_bits();
                    pr[c] = u32::from(h.plane);
                }
            }
        }
    }
}

/// The hits of candidate `c` read back from a packed batch (the inverse of [`pack_hits`]).
pub fn unpack_hits(words: &[u32], shape: &BatchShape, c: usize) -> Vec<FitHit> {
    let s = shape.stride;
    let rows = shape.kmax * s;
    let n = words[c] as usize;
    (0..n)
        .map(|k| FitHit {
            x_mm: f32::from_bits(words[s + k * s + c]),
            y_mm: f32::from_bits(words[s + rows + k * s + c]),
            plane: words[s + 2 * rows + k * s + c] as u16,
        })
        .collect()
}

/// Writes one fit into the output layout (what the kernel does; for tests of the reading
/// side).
pub fn pack_output(fit: &FittedTrack, shape: &BatchShape, c: usize, words: &mut [u32]) {
    let s = shape.stride;
    for (i, v) in fit.state.iter().enumerate() {
        words[i * s + c] = (*v as f32).to_bits();
    }
    for (i, v) in fit.cov.iter().enumerate() {
        words[(OUT_COV + i) * s + c] = (*v as f32).to_bits();
    }
    words[OUT_Z * s + c] = (fit.z_mm as f32).to_bits();
    words[OUT_CHI2 * s + c] = (fit.chi2 as f32).to_bits();
    words[OUT_NDF * s + c] = u32::from(fit.ndf);
    words[OUT_OK * s + c] = u32::from(fit.ok);
}

/// Reads the batch's fits out of the output layout into `out` (replaced).
pub fn unpack_outputs(words: &[u32], shape: &BatchShape, out: &mut Vec<FittedTrack>) {
    let s = shape.stride;
    let f = |row: usize, c: usize| f64::from(f32::from_bits(words[row * s + c]));
    out.clear();
    out.extend((0..shape.n).map(|c| FitOutput {
        z_mm: f(OUT_Z, c),
        state: std::array::from_fn(|i| f(i, c)),
        cov: std::array::from_fn(|i| f(OUT_COV + i, c)),
        chi2: f(OUT_CHI2, c),
        ndf: words[OUT_NDF * s + c].min(u32::from(u16::MAX)) as u16,
        ok: words[OUT_OK * s + c] != 0,
    }));
}

/// What the kernel reads besides the hits, built from the CPU fitter: per plane the
/// constants in single and double precision, the number of Runge-Kutta steps and the
/// field source of the step over the gap to the plane, the fit settings, and the field.
#[derive(Debug, Clone, PartialEq)]
pub struct FitTables {
    /// Per plane `[z, var_x, var_y, x0, ln_x0, seed_db]` rounded to `f32`
    /// ([`KalmanFitter::plane_constants`]).
    pub rows32: Vec<f32>,
    pub rows64: Vec<f64>,
    /// Per plane `p`: steps over the gap from plane `p + 1` to `p`.
    pub gap_steps: Vec<i32>,
    /// Per plane `p`: how that step reads the field (uniform along y, uniform, map,
    /// parabolic profile of the map).
    pub gap_kind: Vec<i32>,
    /// Per plane `p`: the first of the map's slices that the steps over that gap read
    /// (0 in a uniform field).
    pub gap_slice: Vec<i32>,
    /// The map's slices at the z of the steps' stages (`nodes32` of
    /// [`FieldSlices`](crate::tracking::field::FieldSlices),
    /// `[slice][nx][ny][3]`; one zero node in a uniform field).
    pub slices: Vec<f32>,
    pub ints: [i32; PARAM_INTS],
    pub floats: [f32; PARAM_FLOATS],
    pub doubles: [f64; PARAM_DOUBLES],
    /// Field map nodes `[nx][ny][nz][3]` (one zero node in a uniform field).
    pub nodes: Vec<f32>,
}

impl FitTables {
    /// The tables of `fitter`'s detector and settings. The steps per gap are those the
    /// CPU takes: a track that reaches plane `p + 1` sits at its z (rounded to `f32`), so
    /// every track steps over the gap to `p` in the same number of steps.
    pub fn new(fitter: &KalmanFitter) -> Self {
        let rows64 = fitter.plane_constants();
        let n = rows64.len();
        let cfg = fitter.config();
        let profile = fitter.gap_profiles();
        let parabolic = |p: usize| profile.get(p).copied().unwrap_or(false);
        let rows32: Vec<f32> = rows64.iter().flat_map(|r| r.map(|v| v as f32)).collect();
        // The CPU's steps (a track that reaches plane `p + 1` sits at its z, rounded to
        // `f32`, so every track takes the same steps over the gap to `p`).
        let gap_steps: Vec<i32> = fitter.gap_steps().iter().map(|&k| k as i32).collect();
        let (field_slices, slice_first) = fitter.field_slices();
        let (gap_slice, slices) = match field_slices {
            Some(s) => (
                slice_first.iter().map(|&k| k as i32).collect(),
                s.nodes32.iter().flatten().copied().collect(),
            ),
            None => (vec![0; n], vec![0.0; 3]),
        };
        let field = fitter.field();
        let gap_kind = (0..n)
            .map(|p| match field {
                Field::Uniform { b_tesla } if b_tesla[0] == 0.0 && b_tesla[2] == 0.0 => GAP_BY_ONLY,
                Field::Uniform { .. } => GAP_UNIFORM,
                Field::Grid(_) if parabolic(p) => GAP_PROFILE,
                Field::Grid(_) => GAP_MAP,
            })
            .collect();
        let q_fixed = 1.0 / cfg.p_no_field_gev.unwrap_or(SCATTER_P_MAX_GEV).max(1e-3);
        let mut floats = [0.0f32; PARAM_FLOATS];
        floats[0] = q_fixed as f32;
        floats[1] = (q_fixed * q_fixed) as f32;
        floats[2] = cfg.qop_prior_rel as f32;
        floats[3] = cfg.qop_prior_floor as f32;
        floats[4] = (cfg.mass_gev * cfg.mass_gev) as f32;
        let mut doubles = [0.0f64; PARAM_DOUBLES];
        doubles[0] = cfg.mass_gev;
        // The bounds of `scattering_qop`.
        doubles[7] = 1.0 / SCATTER_P_MAX_GEV;
        doubles[8] = 1.0 / cfg.scatter_p_min_gev;
        // Its prior.
        doubles[9..].copy_from_slice(&cfg.scatter_weights());
        let mut ints = [0i32; PARAM_INTS];
        ints[0] = n as i32;
        ints[1] = i32::from(cfg.fit_momentum);
        ints[6] = i32::from(cfg.estimates_scattering());
        ints[7] = i32::from(cfg.scatters_with_qop_error());
        ints[9] = i32::from(cfg.scatter_at_prefit && cfg.fit_momentum);
        if let Some(q) = cfg.scatter_qop_max() {
            ints[8] = 1;
            floats[14] = q as f32;
        }
        let nodes = match field {
            Field::Uniform { b_tesla } => {
                for k in 0..3 {
                    floats[5 + k] = b_tesla[k] as f32;
                }
                ints[2..5].copy_from_slice(&[2, 2, 2]);
                vec![0.0; 3]
            }
            Field::Grid(map) => {
                ints[5] = 1;
                for a in 0..3 {
                    ints[2 + a] = map.dims[a] as i32;
                    // As `FieldMap` rounds them for its two lookups.
                    let inv_step = 1.0 / map.step_mm[a];
                    floats[8 + a] = map.origin_mm[a] as f32;
                    floats[11 + a] = inv_step as f32;
                    doubles[1 + a] = map.origin_mm[a];
                    doubles[4 + a] = inv_step;
                }
                map.nodes_tesla.iter().flatten().copied().collect()
            }
        };
        Self {
            rows32,
            rows64: rows64.iter().flatten().copied().collect(),
            gap_steps,
            gap_kind,
            gap_slice,
            slices,
            ints,
            floats,
            doubles,
            nodes,
        }
    }

    /// Bytes the tables take on the device.
    pub fn device_bytes(&self) -> usize {
        4 * (self.rows32.len()
            + self.gap_steps.len()
            + self.gap_kind.len()
            + self.gap_slice.len()
            + self.slices.len()
            + self.nodes.len())
            + 8 * self.rows64.len()
            + 4 * (PARAM_INTS + PARAM_FLOATS)
            + 8 * PARAM_DOUBLES
    }
}

/// Sizes the engine is built for.
#[derive(Debug, Clone)]
pub struct FitEngineConfig {
    pub limits: FitLimits,
    pub cache: KernelCache,
}

impl Default for FitEngineConfig {
    fn default() -> Self {
        Self {
            limits: FitLimits::default(),
            cache: KernelCache::from_env(),
        }
    }
}

/// Where the time of the last batch went, microseconds (host clock).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FitTimes {
    /// Writing the hits into the pinned staging buffer.
    pub pack_us: f64,
    /// Copy in, kernel, copy out, until the stream is done.
    pub device_us: f64,
    /// Reading the results out of the pinned buffer.
    pub unpack_us: f64,
}

/// The Kalman fit on one GPU. See the module documentation.
pub struct GpuFitEngine {
    ctx: Arc<CudaContext>,
    device: GpuDevice,
    _module: LoadedModule,
    fit_fn: CudaFunction,
    stream: Arc<CudaStream>,
    rows32: DeviceBuffer<f32>,
    rows64: DeviceBuffer<f64>,
    gap_steps: DeviceBuffer<i32>,
    gap_kind: DeviceBuffer<i32>,
    gap_slice: DeviceBuffer<i32>,
    slices: DeviceBuffer<f32>,
    ints: DeviceBuffer<i32>,
    floats: DeviceBuffer<f32>,
    doubles: DeviceBuffer<f64>,
    nodes: DeviceBuffer<f32>,
    hits_host: PinnedBuffer<u32>,
    hits_dev: DeviceBuffer<u32>,
    out_dev: DeviceBuffer<u32>,
    out_host: PinnedBuffer<u32>,
    limits: FitLimits,
    inject_fault: bool,
    times: FitTimes,
    /// Whether the kernel came from the on-disk cache, and how long loading took (ms).
    pub kernels_from_cache: bool,
    pub kernel_load_ms: f64,
}

impl GpuFitEngine {
    /// Uploads `fitter`'s tables and field, compiles or loads the kernel, and allocates
    /// the batch buffers for `config.limits`.
    pub fn new(
        device: &GpuDevice,
        fitter: &KalmanFitter,
        config: FitEngineConfig,
    ) -> Result<Self, GpuError> {
        let limits = config.limits;
        limits.validate()?;
        let tables = FitTables::new(fitter);
        if tables.rows32.is_empty() {
            return Err(GpuError::Config(
                "the detector has no planes to fit on".into(),
            ));
        }
        let need = tables.device_bytes() + limits.device_bytes();
        let ctx = device.open()?;
        // SAFETY: the engine synchronises its one stream explicitly and uses no
        // cudarc-managed slices, so cudarc's per-allocation event tracking is off.
        unsafe { ctx.disable_event_tracking() };
        let (free, _) = driver("cuMemGetInfo", ctx.mem_get_info())?;
        if need > free {
            return Err(GpuError::Config(format!(
                "the fit engine needs {:.2} GiB of GPU memory, {} has {:.2} GiB free; lower max_candidates",
                need as f64 / (1u64 << 30) as f64,
                device.name,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        let module = kernel_module().load(&ctx, &device.arch(), &config.cache)?;
        let fit_fn = module.function("kalman_fit")?;
        let stream = driver("cuStreamCreate", ctx.new_stream())?;
        let engine = Self {
            rows32: DeviceBuffer::from_host(&ctx, &tables.rows32)?,
            rows64: DeviceBuffer::from_host(&ctx, &tables.rows64)?,
            gap_steps: DeviceBuffer::from_host(&ctx, &tables.gap_steps)?,
            gap_kind: DeviceBuffer::from_host(&ctx, &tables.gap_kind)?,
            gap_slice: DeviceBuffer::from_host(&ctx, &tables.gap_slice)?,
            slices: DeviceBuffer::from_host(&ctx, &tables.slices)?,
            ints: DeviceBuffer::from_host(&ctx, &tables.ints)?,
            floats: DeviceBuffer::from_host(&ctx, &tables.floats)?,
            doubles: DeviceBuffer::from_host(&ctx, &tables.doubles)?,
            nodes: DeviceBuffer::from_host(&ctx, &tables.nodes)?,
            hits_host: PinnedBuffer::new(&ctx, limits.input_words())?,
            hits_dev: DeviceBuffer::new(&ctx, limits.input_words())?,
            out_dev: DeviceBuffer::new(&ctx, limits.output_words())?,
            out_host: PinnedBuffer::new(&ctx, limits.output_words())?,
            kernels_from_cache: module.from_cache,
            kernel_load_ms: module.load_ms,
            _module: module,
            fit_fn,
            stream,
            device: device.clone(),
            limits,
            inject_fault: false,
            times: FitTimes::default(),
            ctx,
        };
        tracing::info!(
            "Kalman fit engine on {}: {} planes, up to {} candidates of {} hits per batch, {:.1} MiB",
            device.name,
            tables.rows32.len() / 5,
            limits.max_candidates,
            limits.max_hits_per_candidate,
            need as f64 / (1u64 << 20) as f64
        );
        Ok(engine)
    }

    pub fn device(&self) -> &GpuDevice {
        &self.device
    }

    pub fn limits(&self) -> FitLimits {
        self.limits
    }

    /// Where the time of the last batch fitted by [`Self::fit_batch_into`] went.
    pub fn last_times(&self) -> FitTimes {
        self.times
    }

    /// Test hook: the next batch's launch is made with an invalid configuration, so the
    /// driver itself rejects it and the batch returns that error (as a real device fault
    /// would); the engine stays usable afterwards.
    pub fn inject_device_error(&mut self) {
        self.inject_fault = true;
    }

    /// Fits a batch of candidates (each its hits ordered by plane, upstream first): one
    /// result per candidate, in order, as [`KalmanFitter::fit_batch`] gives them.
    pub fn fit_batch(&mut self, tracks: &[&[FitHit]]) -> Result<Vec<FittedTrack>, FitError> {
        let mut out = Vec::with_capacity(tracks.len());
        self.fit_batch_into(tracks, &mut out)?;
        Ok(out)
    }

    /// [`Self::fit_batch`] into `out` (replaced; its capacity reused).
    pub fn fit_batch_into(
        &mut self,
        tracks: &[&[FitHit]],
        out: &mut Vec<FittedTrack>,
    ) -> Result<(), FitError> {
        let shape = check_batch(&self.limits, tracks)?;
        out.clear();
        if shape.n == 0 {
            return Ok(());
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let t0 = Instant::now();
        pack_hits(
            tracks,
            &shape,
            &mut self.hits_host.as_mut_slice()[..shape.input_words()],
        );
        let t1 = Instant::now();
        let run = self
            .upload(&shape)
            .and_then(|()| self.launch(&shape))
            .and_then(|()| {
                copy_to_host(
                    &self.out_dev,
                    &self.out_host,
                    shape.output_words(),
                    &self.stream,
                )
            })
            .and_then(|()| driver("cuStreamSynchronize", self.stream.synchronize()));
        if let Err(e) = run {
            // Drain whatever was enqueued so the buffers are free again.
            let _ = self.stream.synchronize();
            return Err(e.into());
        }
        let t2 = Instant::now();
        unpack_outputs(
            &self.out_host.as_slice()[..shape.output_words()],
            &shape,
            out,
        );
        let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
        self.times = FitTimes {
            pack_us: us(t0, t1),
            device_us: us(t1, t2),
            unpack_us: us(t2, Instant::now()),
        };
        Ok(())
    }

    /// The fit alone with the hits resident: uploads the batch once, then times `launches`
    /// launches of the kernel back to back (no copies); returns the wall time of all.
    pub fn time_resident(
        &mut self,
        tracks: &[&[FitHit]],
        launches: usize,
    ) -> Result<Duration, FitError> {
        let shape = check_batch(&self.limits, tracks)?;
        if shape.n == 0 {
            return Ok(Duration::ZERO);
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        pack_hits(
            tracks,
            &shape,
            &mut self.hits_host.as_mut_slice()[..shape.input_words()],
        );
        self.upload(&shape)?;
        self.launch(&shape)?;
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        let start = Instant::now();
        for _ in 0..launches {
            self.launch(&shape)?;
        }
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        Ok(start.elapsed())
    }

    fn upload(&self, shape: &BatchShape) -> Result<(), GpuError> {
        copy_to_device(
            &self.hits_host.as_slice()[..shape.input_words()],
            &self.hits_dev,
            0,
            &self.stream,
        )
    }

    fn launch(&mut self, shape: &BatchShape) -> Result<(), GpuError> {
        let faulty = std::mem::take(&mut self.inject_fault);
        let mut hits = self.hits_dev.ptr();
        let mut n_tracks = shape.n as i32;
        let mut stride = shape.stride as i32;
        let mut kmax = shape.kmax as i32;
        let mut rows32 = self.rows32.ptr();
        let mut rows64 = self.rows64.ptr();
        let mut gap_steps = self.gap_steps.ptr();
        let mut gap_kind = self.gap_kind.ptr();
        let mut gap_slice = self.gap_slice.ptr();
        let mut slices = self.slices.ptr();
        let mut floats = self.floats.ptr();
        let mut doubles = self.doubles.ptr();
        let mut ints = self.ints.ptr();
        let mut nodes = self.nodes.ptr();
        let mut out = self.out_dev.ptr();
        let mut params: [*mut std::ffi::c_void; 15] = [
            (&mut hits as *mut u64).cast(),
            (&mut n_tracks as *mut i32).cast(),
            (&mut stride as *mut i32).cast(),
            (&mut kmax as *mut i32).cast(),
            (&mut rows32 as *mut u64).cast(),
            (&mut rows64 as *mut u64).cast(),
            (&mut gap_steps as *mut u64).cast(),
            (&mut gap_kind as *mut u64).cast(),
            (&mut gap_slice as *mut u64).cast(),
            (&mut slices as *mut u64).cast(),
            (&mut floats as *mut u64).cast(),
            (&mut doubles as *mut u64).cast(),
            (&mut ints as *mut u64).cast(),
            (&mut nodes as *mut u64).cast(),
            (&mut out as *mut u64).cast(),
        ];
        let block = if faulty { 4096 } else { BLOCK_THREADS };
        let grid = shape.n.div_ceil(BLOCK_THREADS as usize) as u32;
        // SAFETY: the parameters match the kernel's signature and point to live locals;
        // the hit and output buffers hold `shape`'s words (`check_batch` against the
        // limits they were allocated for), the tables hold every plane index the kernel
        // reads (it checks the planes of a candidate against their count first).
        driver("cuLaunchKernel(kalman_fit)", unsafe {
            drv::launch_kernel(
                self.fit_fn.cu_function(),
                (grid, 1, 1),
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::geometry::Detector;
    use crate::tracking::kalman::FitConfig;
    use crate::tracking::kalman::ROW;
    use std::path::Path;

    fn hits(planes: &[u16], seed: f32) -> Vec<FitHit> {
        planes
            .iter()
            .map(|&p| FitHit {
                plane: p,
                x_mm: seed + 0.25 * f32::from(p),
                y_mm: -seed * f32::from(p) - 1.5,
            })
            .collect()
    }

    /// A backend worker thread can own the engine.
    #[test]
    fn the_engine_can_move_to_a_worker_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<GpuFitEngine>();
    }

    #[test]
    fn buffers_are_sized_from_the_limits() {
        let limits = FitLimits {
            max_candidates: 1000,
            max_hits_per_candidate: 10,
        };
        assert_eq!(limits.stride(), 1024);
        assert_eq!(limits.input_words(), 1024 * 31);
        assert_eq!(limits.output_words(), 1024 * OUT_WORDS);
        assert_eq!(limits.device_bytes(), 4 * 1024 * (31 + OUT_WORDS));
        // Any batch within the limits fits the buffers.
        let t = hits(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 1.0);
        let batch: Vec<&[FitHit]> = vec![&t; 1000];
        let shape = check_batch(&limits, &batch).unwrap();
        assert_eq!(shape.stride, 1024);
        assert!(shape.input_words() <= limits.input_words());
        assert!(shape.output_words() <= limits.output_words());
        assert!(limits.validate().is_ok());
        for bad in [
            FitLimits {
                max_candidates: 0,
                max_hits_per_candidate: 8,
            },
            FitLimits {
                max_candidates: 10,
                max_hits_per_candidate: 2,
            },
            FitLimits {
                max_candidates: usize::MAX / 2,
                max_hits_per_candidate: 64,
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_beyond_a_limit_is_an_overflow() {
        let limits = FitLimits {
            max_candidates: 4,
            max_hits_per_candidate: 5,
        };
        let short = hits(&[0, 1, 2], 0.5);
        let long = hits(&[0, 1, 2, 3, 4, 5], 0.5);
        let five: Vec<&[FitHit]> = vec![&short; 5];
        match check_batch(&limits, &five) {
            Err(FitError::Overflow { limit, got, max }) => {
                assert_eq!((limit, got, max), (FitLimit::Candidates, 5, 4));
            }
            other => panic!("{other:?}"),
        }
        let with_long: Vec<&[FitHit]> = vec![&short, &long];
        match check_batch(&limits, &with_long) {
            Err(e @ FitError::Overflow { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("hits per candidate") && msg.contains("CPU"),
                    "{msg}"
                );
            }
            other => panic!("{other:?}"),
        }
        // At the limits exactly: accepted.
        let four: Vec<&[FitHit]> = vec![&short, &short, &short, &long[..5]];
        let shape = check_batch(&limits, &four).unwrap();
        assert_eq!((shape.n, shape.stride, shape.kmax), (4, 32, 5));
        let empty = check_batch(&limits, &[]).unwrap();
        assert_eq!((empty.n, empty.stride, empty.kmax), (0, 0, 0));
    }

    #[test]
    fn hits_round_trip_through_the_packed_layout() {
        let a = hits(&[0, 2, 3, 5, 6, 7], 1.25);
        let b = hits(&[1, 2, 3], -7.5);
        let c = vec![
            FitHit {
                plane: 9,
                x_mm: f32::NAN,
                y_mm: -0.0,
            },
            FitHit {
                plane: u16::MAX,
                x_mm: f32::INFINITY,
                y_mm: 1e-38,
            },
        ];
        let d: Vec<FitHit> = Vec::new();
        let mut batch: Vec<&[FitHit]> = vec![&a, &b, &c, &d, &a];
        // Over more than one packing block.
        let e: Vec<Vec<FitHit>> = (0..2 * PACK_BLOCK + 7)
            .map(|k| hits(&[0, 1, 2, 4, 5][..3 + k % 3], k as f32))
            .collect();
        batch.extend(e.iter().map(|v| &v[..]));
        let shape = check_batch(&FitLimits::default(), &batch).unwrap();
        assert_eq!(shape.kmax, 6);
        let mut words = vec![0xdead_beef; shape.input_words()];
        pack_hits(&batch, &shape, &mut words);
        for (i, t) in batch.iter().enumerate() {
            let back = unpack_hits(&words, &shape, i);
            assert_eq!(back.len(), t.len());
            for (x, y) in back.iter().zip(t.iter()) {
                assert_eq!(x.plane, y.plane);
                assert_eq!(x.x_mm.to_bits(), y.x_mm.to_bits());
                assert_eq!(x.y_mm.to_bits(), y.y_mm.to_bits());
            }
        }
        // Hit k of consecutive candidates is contiguous (what a warp reads at once).
        assert_eq!(words[shape.stride], a[0].x_mm.to_bits());
        assert_eq!(words[shape.stride + 1], b[0].x_mm.to_bits());
    }

    #[test]
    fn fits_round_trip_through_the_output_layout() {
        let shape = BatchShape {
            n: 3,
            stride: 32,
            kmax: 8,
        };
        let fits: Vec<FittedTrack> = (0..3)
            .map(|k| FitOutput {
                z_mm: 300.0 + k as f64,
                state: std::array::from_fn(|i| f64::from((i as f32 + 0.5) * (k as f32 - 1.3))),
                cov: std::array::from_fn(|i| f64::from(1e-6f32 * (i + 1) as f32)),
                chi2: f64::from(3.25f32 * k as f32),
                ndf: 11 + k as u16,
                ok: k != 1,
            })
            .collect();
        let mut words = vec![0u32; shape.output_words()];
        for (c, f) in fits.iter().enumerate() {
            pack_output(f, &shape, c, &mut words);
        }
        let mut back = vec![FitOutput::default(); 7];
        unpack_outputs(&words, &shape, &mut back);
        assert_eq!(back, fits);
    }

    #[test]
    fn tables_follow_the_cpu_fitter() {
        let uniform = Detector::from_toml_file(Path::new("fixtures/detector.toml")).unwrap();
        let forward =
            Detector::from_toml_file(Path::new("fixtures/tracking/forward/detector_forward.toml"))
                .unwrap();
        let f = KalmanFitter::new(&uniform, FitConfig::from_detector(&uniform));
        let t = FitTables::new(&f);
        let n = uniform.planes.len();
        assert_eq!(t.rows32.len(), ROW * n);
        assert_eq!(t.rows64.len(), ROW * n);
        assert_eq!(t.rows32[0], uniform.planes[0].z_mm as f32);
        // A uniform field along y: one step per gap, the stages without Bx and Bz.
        assert!(t.gap_steps.iter().all(|&s| s == 1));
        assert!(t.gap_kind.iter().all(|&k| k == GAP_BY_ONLY));
        assert_eq!(t.ints[0], n as i32);
        assert_eq!(t.ints[5], 0);
        assert_eq!(t.floats[6], 0.8);

        let mut cfg = FitConfig::from_detector(&forward);
        let f = KalmanFitter::new(&forward, cfg.clone());
        let t = FitTables::new(&f);
        // The field map: parabolic profiles in one step where the CPU reads them, the
        // CPU's steps (at most those of max_step_mm) over the other gaps.
        for p in 0..forward.planes.len() - 1 {
            let dz = forward.planes[p + 1].z_mm - forward.planes[p].z_mm;
            if f.gap_profiles()[p] {
                assert_eq!((t.gap_kind[p], t.gap_steps[p]), (GAP_PROFILE, 1));
            } else {
                assert_eq!(t.gap_kind[p], GAP_MAP);
                assert_eq!(t.gap_steps[p] as usize, f.gap_steps()[p], "{p}");
                assert!(
                    t.gap_steps[p] <= (dz / cfg.max_step_mm).ceil() as i32,
                    "{p}"
                );
            }
        }
        assert!(t.gap_kind.contains(&GAP_PROFILE));
        assert_eq!(t.ints[5], 1);
        // The slices of each gap follow those of the gap after it: 2 steps + 1 each.
        let (Some(slices), first) = f.field_slices() else {
            panic!("a field map has slices")
        };
        assert_eq!(t.slices.len(), 3 * slices.nodes32.len());
        for p in 0..forward.planes.len() - 1 {
            assert_eq!(t.gap_slice[p] as usize, first[p]);
            assert_eq!(first[p + 1], first[p] + 2 * t.gap_steps[p] as usize + 1);
        }
        assert!(FitTables::new(&KalmanFitter::new(
            &uniform,
            FitConfig::from_detector(&uniform)
        ))
        .gap_slice
        .iter()
        .all(|&k| k == 0));
        let Field::Grid(map) = &forward.field else {
            panic!("forward detector has a map")
        };
        assert_eq!(t.nodes.len(), 3 * map.nodes_tesla.len());
        assert_eq!(&t.ints[2..5], &map.dims.map(|d| d as i32));
        // Steps as long as the detector: one step everywhere.
        cfg.max_step_mm = 1e6;
        let t = FitTables::new(&KalmanFitter::new(&forward, cfg));
        assert!(t.gap_steps.iter().all(|&s| s == 1));
    }
}
