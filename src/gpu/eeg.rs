//! The EEG engine on the GPU: the inverse kernel resident on the device in float32, each
//! batch of sample blocks multiplied with it by one cuBLAS SGEMM, then one fused kernel
//! (orientation norm, source scale, optional amplitudes, per-tile peak) and one small
//! per-frame pass (region-of-interest mean power per sample, frame peak).
//!
//! Per frame the result is what the region-of-interest trigger needs from a block
//! ([`EegBlockOutput`]): `roi_power[t]` = mean over ROI sources of amplitude², the peak
//! source = argmax over all sources of Σ_t amplitude² (ties to the lowest index) and its
//! power; the amplitudes themselves only when asked for (`--sources-out`).
//!
//! Layout. The kernel is row-major `[3S, C]`, which cuBLAS (column-major) sees as
//! `[C, 3S]`; the host stages each batch sample-major `[F*T, C]` (a transpose of the
//! channel-major blocks, done while copying into pinned memory), which cuBLAS sees as
//! `[C, F*T]`. So `Y = op(K) X` is one "TN" SGEMM with m = 3S, n = F*T, k = C and
//! `Y` column-major `[3S, F*T]`: each sample's 3S components are contiguous, which the
//! fused kernel reads coalesced. Plain FP32 math (pedantic mode: no TF32), so results
//! agree with the CPU's float64 path to about 1e-6.
//!
//! On sm_80 and later the default is the fused path instead ([`EegProduct::Fused`]): one
//! kernel multiplies on the tensor cores in 3xTF32 (each float32 operand split into a TF32
//! head and tail; head·head + head·tail + tail·head keeps float32 accuracy) and computes the
//! orientation norm, the scale, each source's power over the frame and the per-tile peak
//! from the accumulators in registers, so `Y` is never written; a second small kernel
//! computes the ROI rows in plain float32 and reduces the frame. The operator is packed
//! once at upload in the tensor cores' fragment order ([`pack_fragments`]).
//!
//! Memory is allocated once, in [`GpuEegEngine::new`], for the configured maximum batch.
//! Each of the (at least two) slots has its own stream, cuBLAS handle, pinned staging and
//! device buffers, so the copy-in of one batch overlaps the compute of the previous one
//! ([`GpuEegEngine::submit`] / [`GpuEegEngine::wait`]). A fixed batch shape is recorded
//! once as a CUDA graph and replayed, which cuts launch overhead for one-sample frames.

use std::sync::Arc;

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaStream,
};

use super::nvrtc::{KernelCache, LoadedModule};
use super::runtime::{copy_to_device, copy_to_host, Blas, DeviceBuffer, Graph, PinnedBuffer};
use super::{driver, GpuDevice, GpuError, KernelModule};
use crate::eeg::kernel::InverseKernel;

const KERNEL_SOURCE: &str = include_str!("../../kernels/eeg.cu");

/// The module the engine compiles (no NVRTC options beyond the architecture's).
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "eeg.cu",
        source: KERNEL_SOURCE.to_string(),
        options: &[],
        engine: file!(),
    }
}

/// Sources per block of `eeg_source_power` (SOURCE_TILE in kernels/eeg.cu).
const SOURCE_TILE: usize = 256;
/// Threads per block of `eeg_frame_stats` (STATS_THREADS in kernels/eeg.cu).
const STATS_THREADS: u32 = 256;
/// Warps per block of `eeg_fused_tf32x3` (FUSED_WARPS in kernels/eeg.cu); each warp
/// takes a group of 16 sources.
const FUSED_WARPS: usize = 4;
/// Sources per fragment group of the fused kernel.
const FUSED_GROUP: usize = 16;
/// ROI sources per block of `eeg_roi_partial` (ROI_WARPS: one per warp); each block
/// writes one partial sum per sample.
const ROI_WARPS: usize = 16;
/// Shortest block for which `Auto` picks the fused path: the tensor-core tiles cover 32
/// samples of one frame, so one-sample frames waste most of them and read the operator
/// once per frame; cuBLAS reads it once per batch.
const FUSED_MIN_SAMPLES: usize = 16;

/// How the product and the statistics run on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EegProduct {
    /// `Fused` where the device has TF32 tensor cores (sm_80+) and blocks have at least
    /// 16 samples, `Blas` otherwise.
    #[default]
    Auto,
    /// cuBLAS SGEMM into `Y`, then the norm/statistics kernels reading `Y`.
    Blas,
    /// One 3xTF32 tensor-core kernel with the statistics fused (sm_80+).
    Fused,
}

impl std::str::FromStr for EegProduct {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "blas" => Ok(Self::Blas),
            "fused" => Ok(Self::Fused),
            _ => Err(format!("unknown GPU product '{s}' (auto|blas|fused)")),
        }
    }
}

/// Packs the row-major operator `[3S, C]` into the fused kernel's fragment order:
/// sources in groups of 16, per group per k-step of 8 channels per component per lane the
/// four values of that lane's m16n8k8 A fragment (row `lane/4 + 8*(r%2)`, channel
/// `lane%4 + 4*(r/2)` of the k-step), zero outside the operator. Returns the packed values
/// and the number of k-steps.
pub fn pack_fragments(k: &[f32], n_channels: usize, n_sources: usize) -> (Vec<f32>, usize) {
    let c = n_channels;
    let ksteps = c.div_ceil(8);
    let groups = n_sources.div_ceil(FUSED_GROUP);
    let mut out = vec![0f32; groups * ksteps * 3 * 32 * 4];
    let mut i = 0;
    for g in 0..groups {
        for ks in 0..ksteps {
            for m in 0..3 {
                for lane in 0..32 {
                    for r in 0..4 {
                        let src = g * FUSED_GROUP + lane / 4 + 8 * (r % 2);
                        let ch = 8 * ks + lane % 4 + 4 * (r / 2);
                        if src < n_sources && ch < c {
                            out[i] = k[(3 * src + m) * c + ch];
                        }
                        i += 1;
                    }
                }
            }
        }
    }
    (out, ksteps)
}

/// What one frame (one block of samples) yields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EegBlockOutput {
    /// Source-major `[S, T]` amplitudes, filled only when asked for; empty otherwise.
    pub amplitudes: Vec<f32>,
    /// Per sample: mean over ROI sources of amplitude² (length T).
    pub roi_power: Vec<f64>,
    /// Argmax over all sources of Σ_t amplitude²; ties go to the lowest index.
    pub peak_source: u32,
    /// Σ_t amplitude² of the peak source.
    pub peak_power: f64,
}

/// Sizes the engine is built for; everything is allocated once from these.
#[derive(Debug, Clone)]
pub struct EegEngineConfig {
    /// Largest block length T accepted (samples per frame).
    pub max_samples_per_frame: usize,
    /// Largest number of frames in one launch.
    pub max_frames_per_batch: usize,
    /// Concurrent batches in flight (streams); at least 2 so copies overlap compute.
    pub slots: usize,
    /// Allocate amplitude buffers (needed for `want_amplitudes`, i.e. `--sources-out`).
    pub amplitudes: bool,
    /// Record each batch shape as a CUDA graph on first use and replay it.
    pub use_graphs: bool,
    /// Product and statistics path.
    pub product: EegProduct,
    pub cache: KernelCache,
}

impl Default for EegEngineConfig {
    fn default() -> Self {
        Self {
            max_samples_per_frame: 32,
            max_frames_per_batch: 16,
            slots: 2,
            amplitudes: false,
            use_graphs: true,
            product: EegProduct::Auto,
            cache: KernelCache::from_env(),
        }
    }
}

/// A batch in flight; hand it back to [`GpuEegEngine::wait`].
#[derive(Debug)]
#[must_use = "a submitted batch must be waited for"]
pub struct BatchTicket {
    slot: usize,
    id: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    n_frames: usize,
    n_times: usize,
    amplitudes: bool,
}

struct Slot {
    /// First, so that they are destroyed before the stream and buffers their launches
    /// name (fields drop in order).
    graphs: Vec<(Shape, Graph)>,
    stream: Arc<CudaStream>,
    blas: Blas,
    /// Sample-major `[F*T, C]` staging for the next batch.
    x_host: PinnedBuffer<f32>,
    x_dev: DeviceBuffer<f32>,
    /// Column-major `[3S, F*T]` (one element on the fused path, which never writes it).
    y_dev: DeviceBuffer<f32>,
    /// Fused path: ROI power partial sums `[F][chunks][T]`.
    partial_dev: DeviceBuffer<f32>,
    tile_power: DeviceBuffer<f32>,
    tile_source: DeviceBuffer<i32>,
    /// `[F*T]` ROI power bits, `[F]` peak power bits, `[F]` peak source.
    stats_dev: DeviceBuffer<u32>,
    stats_host: PinnedBuffer<u32>,
    amp_dev: Option<DeviceBuffer<f32>>,
    amp_host: Option<PinnedBuffer<f32>>,
    done: CudaEvent,
    pending: Option<(u64, Shape)>,
}

/// Per-stage device times of one batch, microseconds (from CUDA events).
#[derive(Debug, Clone, Copy, Default)]
pub struct StageTimes {
    pub copy_in_us: f64,
    /// cuBLAS SGEMM, or on the fused path the fused product + norm + peak kernel.
    pub gemm_us: f64,
    /// The norm kernel reading `Y` (zero on the fused path).
    pub source_power_us: f64,
    /// Frame statistics (on the fused path: the ROI rows' product and the reductions).
    pub frame_stats_us: f64,
    pub copy_out_us: f64,
}

/// The EEG inverse on one GPU. See the module documentation.
pub struct GpuEegEngine {
    /// First, so that their recorded graphs are destroyed before the kernel module
    /// (fields drop in order).
    slots: Vec<Slot>,
    ctx: Arc<CudaContext>,
    device: GpuDevice,
    _module: LoadedModule,
    source_power_fn: CudaFunction,
    frame_stats_fn: CudaFunction,
    fused_fn: CudaFunction,
    roi_partial_fn: CudaFunction,
    fused_reduce_fn: CudaFunction,
    /// Whether this engine runs the fused path.
    fused: bool,
    /// Fused path: the operator in fragment order, its k-steps, the ROI rows `[3R, C]` and
    /// their scales.
    kfrag_dev: DeviceBuffer<f32>,
    ksteps: usize,
    k_roi_dev: DeviceBuffer<f32>,
    roi_scale_dev: DeviceBuffer<f32>,
    n_channels: usize,
    n_sources: usize,
    n_tiles: usize,
    kernel_dev: DeviceBuffer<f32>,
    scale_dev: DeviceBuffer<f32>,
    roi_dev: DeviceBuffer<i32>,
    n_roi: usize,
    next_slot: usize,
    next_ticket: u64,
    config: EegEngineConfig,
    graphs_enabled: bool,
    inject_fault: bool,
    /// Whether the kernels came from the on-disk cache, and how long loading took (ms).
    pub kernels_from_cache: bool,
    pub kernel_load_ms: f64,
}

/// `v`, or one zero when it is empty (device buffers are never empty).
fn non_empty(v: Vec<f32>) -> Vec<f32> {
    if v.is_empty() {
        vec![0.0]
    } else {
        v
    }
}

/// Samples `eeg_roi_partial` stages in shared memory per pass: at most 32 (one per lane)
/// and at most what fits in 40 KiB with the padded row stride `C + 1`.
fn roi_samples_per_pass(n_channels: usize, n_times: usize) -> usize {
    (40 * 1024 / (4 * (n_channels + 1)))
        .clamp(1, 32)
        .min(n_times.max(1))
}

/// The stats buffer length for `n_frames` frames of `n_times` samples.
fn stats_len(n_frames: usize, n_times: usize) -> usize {
    n_frames * n_times + 2 * n_frames
}

/// Writes channel-major frames `[C, T]` into the sample-major staging `[F*T, C]`.
pub(crate) fn stage_frames(
    frames: &[&[f32]],
    n_channels: usize,
    n_times: usize,
    staging: &mut [f32],
) {
    let c = n_channels;
    for (f, frame) in frames.iter().enumerate() {
        debug_assert_eq!(frame.len(), c * n_times);
        let base = f * n_times * c;
        for ch in 0..c {
            let row = &frame[ch * n_times..(ch + 1) * n_times];
            for (t, &v) in row.iter().enumerate() {
                staging[base + t * c + ch] = v;
            }
        }
    }
}

/// Reads frame `f`'s statistics out of the packed stats buffer.
pub(crate) fn unpack_stats(
    stats: &[u32],
    n_frames: usize,
    n_times: usize,
    f: usize,
    out: &mut EegBlockOutput,
) {
    let roi = &stats[f * n_times..(f + 1) * n_times];
    out.roi_power.clear();
    out.roi_power
        .extend(roi.iter().map(|&b| f64::from(f32::from_bits(b))));
    out.peak_power = f64::from(f32::from_bits(stats[n_frames * n_times + f]));
    out.peak_source = stats[n_frames * n_times + n_frames + f];
}

impl GpuEegEngine {
    /// Uploads `kernel` (as float32) and the ROI, compiles or loads the kernels, and
    /// allocates every buffer for `config`'s largest batch.
    pub fn new(
        device: &GpuDevice,
        kernel: &InverseKernel,
        roi_source_indices: &[u32],
        config: EegEngineConfig,
    ) -> Result<Self, GpuError> {
        let (c, s) = (kernel.n_channels, kernel.n_sources);
        if c == 0 || s == 0 {
            return Err(GpuError::Config(format!(
                "inverse kernel has {c} channels and {s} sources"
            )));
        }
        if kernel.kernel.len() != 3 * s * c || kernel.source_scale.len() != s {
            return Err(GpuError::Config(format!(
                "inverse kernel arrays do not match {c} channels x {s} sources ({} kernel values, {} scales)",
                kernel.kernel.len(),
                kernel.source_scale.len()
            )));
        }
        if let Some(bad) = roi_source_indices.iter().find(|&&r| r as usize >= s) {
            return Err(GpuError::Config(format!(
                "ROI source index {bad} is out of range (n_sources {s})"
            )));
        }
        if config.max_samples_per_frame == 0
            || config.max_frames_per_batch == 0
            || config.slots == 0
        {
            return Err(GpuError::Config("engine limits must be positive".into()));
        }
        if 3 * s > i32::MAX as usize || c > i32::MAX as usize {
            return Err(GpuError::Config(format!(
                "{s} sources exceed cuBLAS's int dimensions"
            )));
        }
        let slots_n = config.slots.max(2);
        let max_samples = config.max_samples_per_frame * config.max_frames_per_batch;
        let fused = match config.product {
            EegProduct::Blas => false,
            EegProduct::Auto => {
                device.compute_capability.0 >= 8
                    && config.max_samples_per_frame >= FUSED_MIN_SAMPLES
            }
            EegProduct::Fused => {
                if device.compute_capability.0 < 8 {
                    return Err(GpuError::Config(format!(
                        "the fused EEG product needs TF32 tensor cores (sm_80 or later); {} is {}",
                        device.name,
                        device.arch()
                    )));
                }
                true
            }
        };
        let n_tiles = if fused {
            s.div_ceil(FUSED_GROUP * FUSED_WARPS)
        } else {
            s.div_ceil(SOURCE_TILE)
        };
        let y_len = if fused { 1 } else { 3 * s * max_samples };
        let roi_chunks = roi_source_indices.len().div_ceil(ROI_WARPS).max(1);
        let partial_len = if fused { roi_chunks * max_samples } else { 1 };
        let ksteps = c.div_ceil(8);
        let op_len = if fused {
            s.div_ceil(FUSED_GROUP) * FUSED_GROUP * 3 * ksteps * 8
                + 3 * roi_source_indices.len() * c
        } else {
            3 * s * c
        };

        // Back-of-the-envelope memory check before allocating.
        let per_slot = 4
            * (max_samples * c
                + y_len
                + partial_len
                + 2 * n_tiles * config.max_frames_per_batch
                + stats_len(config.max_frames_per_batch, config.max_samples_per_frame)
                + if config.amplitudes {
                    s * max_samples
                } else {
                    0
                })
            + Blas::WORKSPACE_BYTES;
        let need = 4 * (op_len + s + 2 * roi_source_indices.len()) + slots_n * per_slot;

        let ctx = device.open()?;
        // SAFETY: the engine synchronises its streams explicitly (events per slot) and
        // uses no cudarc-managed slices, so cudarc's per-allocation event tracking is off.
        unsafe { ctx.disable_event_tracking() };
        let (free, _) = driver("cuMemGetInfo", ctx.mem_get_info())?;
        if need > free {
            return Err(GpuError::Config(format!(
                "the EEG engine needs {:.2} GiB of GPU memory, {} has {:.2} GiB free; lower max_frames_per_batch",
                need as f64 / (1u64 << 30) as f64,
                device.name,
                free as f64 / (1u64 << 30) as f64
            )));
        }

        let module = kernel_module().load(&ctx, &device.arch(), &config.cache)?;
        let source_power_fn = module.function("eeg_source_power")?;
        let frame_stats_fn = module.function("eeg_frame_stats")?;
        let fused_fn = module.function("eeg_fused_tf32x3")?;
        let roi_partial_fn = module.function("eeg_roi_partial")?;
        let fused_reduce_fn = module.function("eeg_fused_reduce")?;

        let k32: Vec<f32> = kernel.kernel.iter().map(|&v| v as f32).collect();
        let scale32: Vec<f32> = kernel.source_scale.iter().map(|&v| v as f32).collect();
        let roi32: Vec<i32> = roi_source_indices.iter().map(|&r| r as i32).collect();
        let scale_dev = DeviceBuffer::from_host(&ctx, &scale32)?;
        let roi_dev = DeviceBuffer::from_host(&ctx, &roi32)?;
        let (kernel_dev, kfrag_dev, k_roi_dev, roi_scale_dev) = if fused {
            let (frag, _) = pack_fragments(&k32, c, s);
            let mut k_roi = Vec::with_capacity(3 * roi32.len() * c);
            for &r in roi_source_indices {
                let r = r as usize;
                k_roi.extend_from_slice(&k32[3 * r * c..3 * (r + 1) * c]);
            }
            let roi_scale: Vec<f32> = roi_source_indices
                .iter()
                .map(|&r| scale32[r as usize])
                .collect();
            (
                DeviceBuffer::new(&ctx, 1)?,
                DeviceBuffer::from_host(&ctx, &frag)?,
                DeviceBuffer::from_host(&ctx, &non_empty(k_roi))?,
                DeviceBuffer::from_host(&ctx, &non_empty(roi_scale))?,
            )
        } else {
            (
                DeviceBuffer::from_host(&ctx, &k32)?,
                DeviceBuffer::new(&ctx, 1)?,
                DeviceBuffer::new(&ctx, 1)?,
                DeviceBuffer::new(&ctx, 1)?,
            )
        };

        let mut slots = Vec::with_capacity(slots_n);
        for _ in 0..slots_n {
            let stream = driver("cuStreamCreate", ctx.new_stream())?;
            let blas = Blas::new(&ctx, &stream)?;
            let max_f = config.max_frames_per_batch;
            slots.push(Slot {
                blas,
                x_host: PinnedBuffer::new(&ctx, max_samples * c)?,
                x_dev: DeviceBuffer::new(&ctx, max_samples * c)?,
                y_dev: DeviceBuffer::new(&ctx, y_len)?,
                partial_dev: DeviceBuffer::new(&ctx, partial_len)?,
                tile_power: DeviceBuffer::new(&ctx, n_tiles * max_f)?,
                tile_source: DeviceBuffer::new(&ctx, n_tiles * max_f)?,
                stats_dev: DeviceBuffer::new(&ctx, stats_len(max_f, config.max_samples_per_frame))?,
                stats_host: PinnedBuffer::new(
                    &ctx,
                    stats_len(max_f, config.max_samples_per_frame),
                )?,
                amp_dev: if config.amplitudes {
                    Some(DeviceBuffer::new(&ctx, s * max_samples)?)
                } else {
                    None
                },
                amp_host: if config.amplitudes {
                    Some(PinnedBuffer::new(&ctx, s * max_samples)?)
                } else {
                    None
                },
                done: driver("cuEventCreate", ctx.new_event(None))?,
                pending: None,
                graphs: Vec::new(),
                stream,
            });
        }
        tracing::info!(
            "EEG engine on {}: {c} channels, {s} sources, ROI {} sources, up to {} x {} samples per launch, {}, {:.2} GiB",
            device.name,
            roi_source_indices.len(),
            config.max_frames_per_batch,
            config.max_samples_per_frame,
            if fused {
                "fused 3xTF32 product and statistics"
            } else {
                "cuBLAS SGEMM then statistics"
            },
            need as f64 / (1u64 << 30) as f64
        );
        Ok(Self {
            ctx,
            device: device.clone(),
            kernels_from_cache: module.from_cache,
            kernel_load_ms: module.load_ms,
            _module: module,
            source_power_fn,
            frame_stats_fn,
            fused_fn,
            roi_partial_fn,
            fused_reduce_fn,
            fused,
            kfrag_dev,
            ksteps,
            k_roi_dev,
            roi_scale_dev,
            n_channels: c,
            n_sources: s,
            n_tiles,
            kernel_dev,
            scale_dev,
            roi_dev,
            n_roi: roi_source_indices.len(),
            slots,
            next_slot: 0,
            next_ticket: 0,
            graphs_enabled: config.use_graphs,
            config,
            inject_fault: false,
        })
    }

    pub fn device(&self) -> &GpuDevice {
        &self.device
    }

    pub fn n_channels(&self) -> usize {
        self.n_channels
    }

    pub fn n_sources(&self) -> usize {
        self.n_sources
    }

    pub fn config(&self) -> &EegEngineConfig {
        &self.config
    }

    /// Whether the fused tensor-core path runs (else cuBLAS then the statistics kernels).
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// Test hook: the next batch's launch is made with an invalid configuration, so the
    /// driver itself rejects it and the batch returns that error (as a real device fault
    /// would); the engine stays usable afterwards.
    pub fn inject_device_error(&mut self) {
        self.inject_fault = true;
    }

    /// Test hook: fills every device output buffer with 0xff bytes (NaN as float) so a
    /// result element that is never written shows up.
    pub fn poison_device_outputs(&mut self) -> Result<(), GpuError> {
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        for slot in &self.slots {
            slot.y_dev.fill_bytes(0xff, &slot.stream)?;
            slot.partial_dev.fill_bytes(0xff, &slot.stream)?;
            slot.tile_power.fill_bytes(0xff, &slot.stream)?;
            slot.tile_source.fill_bytes(0xff, &slot.stream)?;
            slot.stats_dev.fill_bytes(0xff, &slot.stream)?;
            if let Some(a) = &slot.amp_dev {
                a.fill_bytes(0xff, &slot.stream)?;
            }
            driver("cuStreamSynchronize", slot.stream.synchronize())?;
        }
        Ok(())
    }

    /// One block, synchronously: `data` is channel-major `[C, n_times]`.
    pub fn process(
        &mut self,
        data: &[f32],
        n_times: usize,
        want_amplitudes: bool,
        out: &mut EegBlockOutput,
    ) -> Result<(), GpuError> {
        let ticket = self.submit(&[data], n_times, want_amplitudes)?;
        self.wait(ticket, std::slice::from_mut(out))
    }

    /// Several consecutive blocks of equal length in one launch (one GEMM), synchronously.
    pub fn process_batch(
        &mut self,
        frames: &[&[f32]],
        n_times: usize,
        want_amplitudes: bool,
        outs: &mut Vec<EegBlockOutput>,
    ) -> Result<(), GpuError> {
        let ticket = self.submit(frames, n_times, want_amplitudes)?;
        outs.resize_with(frames.len(), EegBlockOutput::default);
        self.wait(ticket, outs)
    }

    /// Stages `frames` (each channel-major `[C, n_times]`) and enqueues their processing on
    /// the next free slot; returns at once. At most `slots` batches may be in flight; each
    /// ticket must be passed to [`Self::wait`], in any order.
    pub fn submit(
        &mut self,
        frames: &[&[f32]],
        n_times: usize,
        want_amplitudes: bool,
    ) -> Result<BatchTicket, GpuError> {
        let f = frames.len();
        if f == 0 || f > self.config.max_frames_per_batch {
            return Err(GpuError::Config(format!(
                "batch of {f} frames (engine built for 1..={})",
                self.config.max_frames_per_batch
            )));
        }
        if n_times == 0 || n_times > self.config.max_samples_per_frame {
            return Err(GpuError::Config(format!(
                "block of {n_times} samples (engine built for 1..={})",
                self.config.max_samples_per_frame
            )));
        }
        if let Some((i, fr)) = frames
            .iter()
            .enumerate()
            .find(|(_, fr)| fr.len() != self.n_channels * n_times)
        {
            return Err(GpuError::Config(format!(
                "frame {i} has {} values, expected {} channels x {n_times} samples",
                fr.len(),
                self.n_channels
            )));
        }
        if want_amplitudes && !self.config.amplitudes {
            return Err(GpuError::Config(
                "amplitudes requested but the engine was built without them".into(),
            ));
        }
        let n_slots = self.slots.len();
        let slot_i = (0..n_slots)
            .map(|k| (self.next_slot + k) % n_slots)
            .find(|&i| self.slots[i].pending.is_none())
            .ok_or_else(|| {
                GpuError::Config(format!(
                    "all {n_slots} slots are in flight: wait for a ticket before submitting more"
                ))
            })?;
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let shape = Shape {
            n_frames: f,
            n_times,
            amplitudes: want_amplitudes,
        };
        {
            let slot = &mut self.slots[slot_i];
            let staging = &mut slot.x_host.as_mut_slice()[..f * n_times * self.n_channels];
            stage_frames(frames, self.n_channels, n_times, staging);
        }
        let result = self.launch(slot_i, shape);
        if let Err(e) = result {
            // Drain whatever was enqueued so the slot's buffers are free again.
            let _ = self.slots[slot_i].stream.synchronize();
            return Err(e);
        }
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.slots[slot_i].pending = Some((id, shape));
        self.next_slot = (slot_i + 1) % self.slots.len();
        Ok(BatchTicket { slot: slot_i, id })
    }

    /// Waits for a submitted batch and writes one output per frame into `outs`
    /// (`outs.len()` must be the batch's frame count).
    pub fn wait(
        &mut self,
        ticket: BatchTicket,
        outs: &mut [EegBlockOutput],
    ) -> Result<(), GpuError> {
        let slot = self
            .slots
            .get_mut(ticket.slot)
            .ok_or_else(|| GpuError::Config("ticket from another engine".into()))?;
        let shape = match slot.pending {
            Some((id, shape)) if id == ticket.id => shape,
            _ => {
                return Err(GpuError::Config(
                    "ticket is not in flight on this engine".into(),
                ))
            }
        };
        slot.pending = None;
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        driver("cuEventSynchronize", slot.done.synchronize())?;
        if outs.len() != shape.n_frames {
            return Err(GpuError::Config(format!(
                "{} outputs given for a batch of {} frames",
                outs.len(),
                shape.n_frames
            )));
        }
        let (f, t, s) = (shape.n_frames, shape.n_times, self.n_sources);
        let stats = &slot.stats_host.as_slice()[..stats_len(f, t)];
        for (i, out) in outs.iter_mut().enumerate() {
            unpack_stats(stats, f, t, i, out);
            out.amplitudes.clear();
            if shape.amplitudes {
                if let Some(a) = &slot.amp_host {
                    out.amplitudes
                        .extend_from_slice(&a.as_slice()[i * s * t..(i + 1) * s * t]);
                }
            }
        }
        Ok(())
    }

    /// Enqueues one batch on a slot's stream, through a recorded graph when enabled.
    fn launch(&mut self, slot_i: usize, shape: Shape) -> Result<(), GpuError> {
        if std::mem::take(&mut self.inject_fault) {
            self.enqueue(slot_i, shape, true)?;
        } else if self.graphs_enabled {
            let have = self.slots[slot_i]
                .graphs
                .iter()
                .position(|(s, _)| *s == shape);
            let idx = match have {
                Some(i) => i,
                None => {
                    let captured = {
                        let this = &*self;
                        Graph::capture(&this.slots[slot_i].stream, || {
                            this.enqueue(slot_i, shape, false)
                        })
                    };
                    match captured {
                        Ok(g) => {
                            self.slots[slot_i].graphs.push((shape, g));
                            self.slots[slot_i].graphs.len() - 1
                        }
                        Err(e) => {
                            tracing::warn!(
                                "CUDA graph capture failed ({e}); launching directly from now on"
                            );
                            self.graphs_enabled = false;
                            usize::MAX
                        }
                    }
                }
            };
            if idx == usize::MAX {
                self.enqueue(slot_i, shape, false)?;
            } else {
                let slot = &self.slots[slot_i];
                slot.graphs[idx].1.launch(&slot.stream)?;
            }
        } else {
            self.enqueue(slot_i, shape, false)?;
        }
        let slot = &self.slots[slot_i];
        driver("cuEventRecord", slot.done.record(&slot.stream))
    }

    /// Copies in, multiplies, reduces, copies out, all on the slot's stream.
    fn enqueue(&self, slot_i: usize, shape: Shape, faulty: bool) -> Result<(), GpuError> {
        self.enqueue_marked(slot_i, shape, faulty, &mut |_| Ok(()))
    }

    /// [`Self::enqueue`], calling `mark(k)` on the stream at the start of stage k (copy in,
    /// product, norm, statistics, copy out) and `mark(5)` after the statistics' copy out.
    fn enqueue_marked(
        &self,
        slot_i: usize,
        shape: Shape,
        faulty: bool,
        mark: &mut dyn FnMut(usize) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let slot = &self.slots[slot_i];
        let (c, s) = (self.n_channels, self.n_sources);
        let (f, t) = (shape.n_frames, shape.n_times);
        let n = f * t;
        mark(0)?;
        copy_to_device(
            &slot.x_host.as_slice()[..n * c],
            &slot.x_dev,
            0,
            &slot.stream,
        )?;
        mark(1)?;
        if self.fused {
            self.launch_fused(slot, shape, faulty)?;
            mark(2)?;
            mark(3)?;
            self.launch_roi_partial(slot, shape)?;
            self.launch_fused_reduce(slot, shape)?;
        } else {
            self.product_blas(slot, n)?;
            mark(2)?;
            self.launch_source_power(slot, shape, faulty)?;
            mark(3)?;
            self.launch_frame_stats(slot, shape)?;
        }
        mark(4)?;
        // The slot's pinned buffers are read only in `wait`, after the done event.
        copy_to_host(
            &slot.stats_dev,
            &slot.stats_host,
            stats_len(f, t),
            &slot.stream,
        )?;
        mark(5)?;
        if shape.amplitudes {
            if let (Some(ad), Some(ah)) = (&slot.amp_dev, &slot.amp_host) {
                copy_to_host(ad, ah, s * n, &slot.stream)?;
            }
        }
        Ok(())
    }

    fn product_blas(&self, slot: &Slot, n: usize) -> Result<(), GpuError> {
        let (c, s) = (self.n_channels, self.n_sources);
        slot.blas.sgemm(
            true,
            false,
            3 * s,
            n,
            c,
            self.kernel_dev.ptr(),
            c,
            slot.x_dev.ptr(),
            c,
            slot.y_dev.ptr(),
            3 * s,
        )
    }

    fn launch_fused(&self, slot: &Slot, shape: Shape, faulty: bool) -> Result<(), GpuError> {
        let mut kfrag = self.kfrag_dev.ptr();
        let mut ksteps = self.ksteps as i32;
        let mut x = slot.x_dev.ptr();
        let mut n_channels = self.n_channels as i32;
        let mut scale = self.scale_dev.ptr();
        let mut n_sources = self.n_sources as i32;
        let mut n_frames = shape.n_frames as i32;
        let mut n_times = shape.n_times as i32;
        let mut amp: u64 = match (&slot.amp_dev, shape.amplitudes) {
            (Some(a), true) => a.ptr(),
            _ => 0,
        };
        let mut tile_power = slot.tile_power.ptr();
        let mut tile_source = slot.tile_source.ptr();
        let mut params: [*mut std::ffi::c_void; 11] = [
            (&mut kfrag as *mut u64).cast(),
            (&mut ksteps as *mut i32).cast(),
            (&mut x as *mut u64).cast(),
            (&mut n_channels as *mut i32).cast(),
            (&mut scale as *mut u64).cast(),
            (&mut n_sources as *mut i32).cast(),
            (&mut n_frames as *mut i32).cast(),
            (&mut n_times as *mut i32).cast(),
            (&mut amp as *mut u64).cast(),
            (&mut tile_power as *mut u64).cast(),
            (&mut tile_source as *mut u64).cast(),
        ];
        let block = if faulty {
            4096
        } else {
            (32 * FUSED_WARPS) as u32
        };
        // SAFETY: parameters match the kernel's signature and point to live locals; the
        // buffers are sized for this shape (checked in `submit`), the packed operator for
        // `n_tiles * FUSED_WARPS` groups or fewer (the kernel skips groups past the end).
        driver("cuLaunchKernel(eeg_fused_tf32x3)", unsafe {
            drv::launch_kernel(
                self.fused_fn.cu_function(),
                (self.n_tiles as u32, 1, 1),
                (block, 1, 1),
                0,
                slot.stream.cu_stream(),
                &mut params,
            )
        })
    }

    fn roi_chunks(&self) -> usize {
        self.n_roi.div_ceil(ROI_WARPS).max(1)
    }

    fn launch_roi_partial(&self, slot: &Slot, shape: Shape) -> Result<(), GpuError> {
        let (f, t) = (shape.n_frames, shape.n_times);
        let mut k_roi = self.k_roi_dev.ptr();
        let mut roi_scale = self.roi_scale_dev.ptr();
        let mut n_roi = self.n_roi as i32;
        let mut x = slot.x_dev.ptr();
        let mut n_channels = self.n_channels as i32;
        let mut n_times = t as i32;
        let ts = roi_samples_per_pass(self.n_channels, t);
        let mut ts_i = ts as i32;
        let mut partial = slot.partial_dev.ptr();
        let mut params: [*mut std::ffi::c_void; 8] = [
            (&mut k_roi as *mut u64).cast(),
            (&mut roi_scale as *mut u64).cast(),
            (&mut n_roi as *mut i32).cast(),
            (&mut x as *mut u64).cast(),
            (&mut n_channels as *mut i32).cast(),
            (&mut n_times as *mut i32).cast(),
            (&mut ts_i as *mut i32).cast(),
            (&mut partial as *mut u64).cast(),
        ];
        // SAFETY: as in `launch_fused`; `partial_dev` holds `F * chunks * T`.
        driver("cuLaunchKernel(eeg_roi_partial)", unsafe {
            drv::launch_kernel(
                self.roi_partial_fn.cu_function(),
                (f as u32, self.roi_chunks() as u32, 1),
                ((32 * ROI_WARPS) as u32, 1, 1),
                (4 * ts * (self.n_channels + 1)) as u32,
                slot.stream.cu_stream(),
                &mut params,
            )
        })
    }

    fn launch_fused_reduce(&self, slot: &Slot, shape: Shape) -> Result<(), GpuError> {
        let (f, t) = (shape.n_frames, shape.n_times);
        let mut partial = slot.partial_dev.ptr();
        let mut n_partials = self.roi_chunks() as i32;
        let mut n_roi = self.n_roi as i32;
        let mut n_times = t as i32;
        let mut tile_power = slot.tile_power.ptr();
        let mut tile_source = slot.tile_source.ptr();
        let mut n_tiles = self.n_tiles as i32;
        let mut roi_power = slot.stats_dev.ptr();
        let mut peak_power = slot.stats_dev.ptr_at(f * t);
        let mut peak_source = slot.stats_dev.ptr_at(f * t + f);
        let mut params: [*mut std::ffi::c_void; 10] = [
            (&mut partial as *mut u64).cast(),
            (&mut n_partials as *mut i32).cast(),
            (&mut n_roi as *mut i32).cast(),
            (&mut n_times as *mut i32).cast(),
            (&mut tile_power as *mut u64).cast(),
            (&mut tile_source as *mut u64).cast(),
            (&mut n_tiles as *mut i32).cast(),
            (&mut roi_power as *mut u64).cast(),
            (&mut peak_power as *mut u64).cast(),
            (&mut peak_source as *mut u64).cast(),
        ];
        // SAFETY: as in `launch_fused`.
        driver("cuLaunchKernel(eeg_fused_reduce)", unsafe {
            drv::launch_kernel(
                self.fused_reduce_fn.cu_function(),
                (f as u32, 1, 1),
                (STATS_THREADS, 1, 1),
                0,
                slot.stream.cu_stream(),
                &mut params,
            )
        })
    }

    fn launch_source_power(&self, slot: &Slot, shape: Shape, faulty: bool) -> Result<(), GpuError> {
        let mut y = slot.y_dev.ptr();
        let mut ld_y = (3 * self.n_sources) as i64;
        let mut scale = self.scale_dev.ptr();
        let mut n_sources = self.n_sources as i32;
        let mut n_times = shape.n_times as i32;
        let mut amp: u64 = match (&slot.amp_dev, shape.amplitudes) {
            (Some(a), true) => a.ptr(),
            _ => 0,
        };
        let mut tile_power = slot.tile_power.ptr();
        let mut tile_source = slot.tile_source.ptr();
        let mut params: [*mut std::ffi::c_void; 8] = [
            (&mut y as *mut u64).cast(),
            (&mut ld_y as *mut i64).cast(),
            (&mut scale as *mut u64).cast(),
            (&mut n_sources as *mut i32).cast(),
            (&mut n_times as *mut i32).cast(),
            (&mut amp as *mut u64).cast(),
            (&mut tile_power as *mut u64).cast(),
            (&mut tile_source as *mut u64).cast(),
        ];
        // An injected fault asks for more threads per block than any GPU allows.
        let block = if faulty { 4096 } else { SOURCE_TILE as u32 };
        // SAFETY: parameters match the kernel's signature and point to live locals; the
        // buffers are sized for this shape (checked in `submit`).
        driver("cuLaunchKernel(eeg_source_power)", unsafe {
            drv::launch_kernel(
                self.source_power_fn.cu_function(),
                (self.n_tiles as u32, shape.n_frames as u32, 1),
                (block, 1, 1),
                0,
                slot.stream.cu_stream(),
                &mut params,
            )
        })
    }

    fn launch_frame_stats(&self, slot: &Slot, shape: Shape) -> Result<(), GpuError> {
        let (f, t) = (shape.n_frames, shape.n_times);
        let mut y = slot.y_dev.ptr();
        let mut ld_y = (3 * self.n_sources) as i64;
        let mut scale = self.scale_dev.ptr();
        let mut n_times = t as i32;
        let mut roi = self.roi_dev.ptr();
        let mut n_roi = self.n_roi as i32;
        let mut tile_power = slot.tile_power.ptr();
        let mut tile_source = slot.tile_source.ptr();
        let mut n_tiles = self.n_tiles as i32;
        let mut roi_power = slot.stats_dev.ptr();
        let mut peak_power = slot.stats_dev.ptr_at(f * t);
        let mut peak_source = slot.stats_dev.ptr_at(f * t + f);
        let mut params: [*mut std::ffi::c_void; 12] = [
            (&mut y as *mut u64).cast(),
            (&mut ld_y as *mut i64).cast(),
            (&mut scale as *mut u64).cast(),
            (&mut n_times as *mut i32).cast(),
            (&mut roi as *mut u64).cast(),
            (&mut n_roi as *mut i32).cast(),
            (&mut tile_power as *mut u64).cast(),
            (&mut tile_source as *mut u64).cast(),
            (&mut n_tiles as *mut i32).cast(),
            (&mut roi_power as *mut u64).cast(),
            (&mut peak_power as *mut u64).cast(),
            (&mut peak_source as *mut u64).cast(),
        ];
        // SAFETY: as in `launch_source_power`.
        driver("cuLaunchKernel(eeg_frame_stats)", unsafe {
            drv::launch_kernel(
                self.frame_stats_fn.cu_function(),
                (f as u32, t as u32, 1),
                (STATS_THREADS, 1, 1),
                0,
                slot.stream.cu_stream(),
                &mut params,
            )
        })
    }

    /// Device time of each stage for one batch of `n_frames` x `n_times` (whatever is
    /// staged in slot 0), median over `reps` runs. For benchmarks.
    pub fn profile_stages(
        &mut self,
        n_frames: usize,
        n_times: usize,
        reps: usize,
    ) -> Result<StageTimes, GpuError> {
        if n_frames == 0
            || n_frames > self.config.max_frames_per_batch
            || n_times == 0
            || n_times > self.config.max_samples_per_frame
        {
            return Err(GpuError::Config(
                "profile shape outside the engine's limits".into(),
            ));
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let shape = Shape {
            n_frames,
            n_times,
            amplitudes: false,
        };
        let slot = &self.slots[0];
        let ev = || {
            driver(
                "cuEventCreate",
                self.ctx
                    .new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT)),
            )
        };
        let e: Vec<CudaEvent> = (0..6).map(|_| ev()).collect::<Result<_, _>>()?;
        let mut samples: Vec<[f64; 5]> = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            self.enqueue_marked(0, shape, false, &mut |i| {
                driver("cuEventRecord", e[i].record(&slot.stream))
            })?;
            driver("cuStreamSynchronize", slot.stream.synchronize())?;
            let mut row = [0.0; 5];
            for (i, r) in row.iter_mut().enumerate() {
                *r = f64::from(driver("cuEventElapsedTime", e[i].elapsed_ms(&e[i + 1]))?) * 1e3;
            }
            samples.push(row);
        }
        let median = |k: usize| {
            let mut v: Vec<f64> = samples.iter().map(|r| r[k]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok(StageTimes {
            copy_in_us: median(0),
            gemm_us: median(1),
            source_power_us: median(2),
            frame_stats_us: median(3),
            copy_out_us: median(4),
        })
    }
}

impl Drop for GpuEegEngine {
    fn drop(&mut self) {
        // Let in-flight work finish before the buffers it uses are freed.
        if self.ctx.bind_to_thread().is_ok() {
            for slot in &self.slots {
                let _ = slot.stream.synchronize();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The engine's host-side layout work, checked against a float32 CPU version of the
    //! whole computation, which is itself checked against the float64 reference
    //! (`InverseKernel::apply_f64`). The device part runs in tests/gpu.rs.
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The GPU computation on the CPU in float32: the same layouts and the same reductions.
    #[allow(clippy::too_many_arguments)]
    fn reference_f32(
        k: &[f32],
        scale: &[f32],
        c: usize,
        s: usize,
        staged: &[f32],
        f: usize,
        t: usize,
        roi: &[u32],
    ) -> Vec<u32> {
        let n = f * t;
        // Y column-major [3S, n] = op(K) X, X column-major [C, n].
        let mut y = vec![0f32; 3 * s * n];
        for g in 0..n {
            for r in 0..3 * s {
                y[g * 3 * s + r] = (0..c).map(|ch| k[r * c + ch] * staged[g * c + ch]).sum();
            }
        }
        let amp = |g: usize, src: usize| {
            let v = &y[g * 3 * s + 3 * src..g * 3 * s + 3 * src + 3];
            scale[src] * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt()
        };
        let mut stats = vec![0u32; stats_len(f, t)];
        for fr in 0..f {
            for tt in 0..t {
                let sum: f32 = roi
                    .iter()
                    .map(|&r| amp(fr * t + tt, r as usize).powi(2))
                    .sum();
                stats[fr * t + tt] = (sum / roi.len() as f32).to_bits();
            }
            let mut best = (-1f32, 0u32);
            for src in 0..s {
                let p: f32 = (0..t).map(|tt| amp(fr * t + tt, src).powi(2)).sum();
                if p > best.0 {
                    best = (p, src as u32);
                }
            }
            stats[f * t + fr] = best.0.to_bits();
            stats[f * t + f + fr] = best.1;
        }
        stats
    }

    /// The fused kernel's product, with each operator value read from the packed buffer
    /// where the m16n8k8 A fragment layout puts it (PTX ISA: lane `4*(row%8) + k%4`,
    /// register `row/8 + 2*(k/4)`), must be the plain product: the packing and the layout
    /// the kernel assumes agree.
    #[test]
    fn fragment_packing_matches_the_mma_layout() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for (c, s) in [(59usize, 45usize), (8, 16), (3, 1), (17, 33)] {
            let k: Vec<f32> = (0..3 * s * c)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let (frag, ksteps) = pack_fragments(&k, c, s);
            assert_eq!(ksteps, c.div_ceil(8));
            assert_eq!(frag.len(), s.div_ceil(16) * ksteps * 3 * 32 * 4);
            let x: Vec<f32> = (0..c).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            for src in 0..s.div_ceil(16) * 16 {
                let (g, row) = (src / 16, src % 16);
                for m in 0..3 {
                    let mut y = 0f64;
                    for ks in 0..ksteps {
                        for kk in 0..8 {
                            let lane = 4 * (row % 8) + kk % 4;
                            let r = row / 8 + 2 * (kk / 4);
                            let a = frag[(((g * ksteps + ks) * 3 + m) * 32 + lane) * 4 + r];
                            let ch = 8 * ks + kk;
                            if ch < c {
                                y += f64::from(a) * f64::from(x[ch]);
                            } else {
                                assert_eq!(a, 0.0, "channel padding is zero");
                            }
                        }
                    }
                    let want: f64 = if src < s {
                        (0..c)
                            .map(|ch| f64::from(k[(3 * src + m) * c + ch]) * f64::from(x[ch]))
                            .sum()
                    } else {
                        0.0
                    };
                    assert!(
                        (y - want).abs() < 1e-9,
                        "c {c} s {s} src {src} m {m}: {y} vs {want}"
                    );
                }
            }
        }
    }

    /// The pipeline moves one engine into each GPU worker thread.
    #[test]
    fn engine_can_move_to_a_worker_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<GpuEegEngine>();
        assert_send::<BatchTicket>();
    }

    #[test]
    fn staged_layout_and_packed_stats_reproduce_the_f64_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (c, s, t, f) = (5, 37, 3, 4);
        let kernel = InverseKernel {
            n_channels: c,
            n_sources: s,
            kernel: (0..3 * s * c)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
            source_scale: (0..s).map(|_| rng.random_range(0.5..2.0)).collect(),
        };
        let roi = [2u32, 5, 11, 36];
        let frames: Vec<Vec<f32>> = (0..f)
            .map(|_| (0..c * t).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        let refs: Vec<&[f32]> = frames.iter().map(Vec::as_slice).collect();
        let mut staged = vec![f32::NAN; f * t * c];
        stage_frames(&refs, c, t, &mut staged);
        assert!(
            staged.iter().all(|v| v.is_finite()),
            "every staged value written"
        );
        let k32: Vec<f32> = kernel.kernel.iter().map(|&v| v as f32).collect();
        let s32: Vec<f32> = kernel.source_scale.iter().map(|&v| v as f32).collect();
        let stats = reference_f32(&k32, &s32, c, s, &staged, f, t, &roi);

        for (fr, frame) in frames.iter().enumerate() {
            let mut out = EegBlockOutput::default();
            unpack_stats(&stats, f, t, fr, &mut out);
            let data64: Vec<f64> = frame.iter().map(|&v| f64::from(v)).collect();
            let mut amp = vec![0.0; s * t];
            kernel.apply_f64(&data64, t, &mut amp);
            for tt in 0..t {
                let want: f64 = roi
                    .iter()
                    .map(|&r| amp[r as usize * t + tt].powi(2))
                    .sum::<f64>()
                    / roi.len() as f64;
                assert!(
                    (out.roi_power[tt] - want).abs() <= 1e-5 * want,
                    "{} vs {want}",
                    out.roi_power[tt]
                );
            }
            let power: Vec<f64> = (0..s)
                .map(|src| (0..t).map(|tt| amp[src * t + tt].powi(2)).sum())
                .collect();
            let best = (0..s).fold(0, |b, i| if power[i] > power[b] { i } else { b });
            assert_eq!(out.peak_source as usize, best);
            assert!((out.peak_power - power[best]).abs() <= 1e-5 * power[best]);
        }
    }
}
