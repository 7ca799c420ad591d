//! The EEG workload on the CPU: per block, the optional causal filter (state carried across
//! blocks), the inverse kernel (MNE, dSPM, sLORETA or eLORETA, built once as MNE-Python
//! builds it), the region-of-interest statistics and the sliding-window trigger. The GPU
//! backend shares the set-up and everything after the per-block statistics.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use npyz::WriterBuilder;
use serde::Deserialize;

use super::{Backend, BackendError, BackendKind, Detail, Verdict};
use crate::config::Config;
use crate::eeg::cpu_apply::{CpuInverse, PackedInverse, Real};
use crate::eeg::filter::{BlockFilter, FilterConfig};
use crate::eeg::inputs::{EegInputPaths, EegInputs};
use crate::eeg::inverse::Method;
use crate::eeg::kernel::{InverseKernel, InverseKernelF32};
use crate::eeg::roi::{BlockStats, RoiConfig, RoiMask, RoiTrigger};
use crate::frame::{EegBlockView, FrameView, Payload};

/// Name of the region-of-interest line.
pub const LINE_NAME: &str = "roi";

/// Arithmetic of the CPU path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    F64,
}

/// The `[eeg]` table of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EegConfig {
    /// Lead field NPY `[n_channels, 3 n_sources]`.
    pub leadfield: PathBuf,
    /// Source positions NPY `[n_sources, 3]`, metres.
    pub src: PathBuf,
    /// Noise covariance NPY `[n_channels, n_channels]`.
    pub noise_cov: PathBuf,
    /// Channel names, one per line: the order of the channels in every frame.
    pub channels: PathBuf,
    /// `MNE`, `dSPM`, `sLORETA` or `eLORETA`.
    #[serde(default = "default_method")]
    pub method: String,
    /// Regularisation, MNE's `lambda2` (1/SNR^2; 1/9 is MNE's default for evoked data).
    #[serde(default = "default_lambda2")]
    pub lambda2: f64,
    #[serde(default)]
    pub precision: Precision,
    /// Threads of each CPU worker's product (the worker's own thread included). Absent:
    /// the cores left once every input has its thread and the decisions theirs, shared
    /// among the workers, at least 1.
    pub threads: Option<usize>,
    /// Inverse kernel cache file (rebuilt when the inputs or method change).
    pub cache: Option<PathBuf>,
    /// Samples per frame when EDF/BDF files are replayed or converted.
    #[serde(default = "default_block_samples")]
    pub block_samples: usize,
    #[serde(default)]
    pub filter: FilterConfig,
    /// The region of interest and its trigger; without one nothing is accepted.
    pub roi: Option<RoiConfig>,
}

fn default_method() -> String {
    "sLORETA".into()
}
fn default_lambda2() -> f64 {
    1.0 / 9.0
}
fn default_block_samples() -> usize {
    32
}

/// Parses MNE's method names.
pub fn parse_method(s: &str) -> anyhow::Result<Method> {
    Method::ALL
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            anyhow::anyhow!("eeg.method {s:?} must be one of MNE, dSPM, sLORETA, eLORETA")
        })
}

impl EegConfig {
    pub fn from_config(cfg: &Config) -> anyhow::Result<EegConfig> {
        let table = cfg.eeg.clone().ok_or_else(|| {
            anyhow::anyhow!("the eeg workload needs [eeg] leadfield, src, noise_cov and channels (or --leadfield, --src, --noise-cov, --channels)")
        })?;
        let ec: EegConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e| anyhow::anyhow!("[eeg]: {e}"))?;
        parse_method(&ec.method)?;
        if !(ec.lambda2.is_finite() && ec.lambda2 > 0.0) {
            anyhow::bail!("eeg.lambda2 = {} must be positive", ec.lambda2);
        }
        if ec.block_samples == 0 || ec.block_samples > 1 << 20 {
            anyhow::bail!(
                "eeg.block_samples = {} must be in 1..=1048576",
                ec.block_samples
            );
        }
        if let Some(t) = ec.threads {
            if t == 0 || t > 1024 {
                anyhow::bail!("eeg.threads = {t} must be in 1..=1024 (or absent: automatic)");
            }
        }
        if let Some(r) = &ec.roi {
            r.validate()
                .map_err(|e| anyhow::anyhow!("[eeg.roi]: {e}"))?;
        }
        Ok(ec)
    }
}

/// Everything the EEG backends share, built once at start.
pub struct EegSetup {
    pub config: EegConfig,
    pub inputs: EegInputs,
    pub kernel: Arc<InverseKernel>,
    pub kernel_f32: Arc<InverseKernelF32>,
    pub positions_m: Vec<[f64; 3]>,
    pub roi: RoiMask,
    pub sources_out: Option<Arc<Mutex<SourcesOut>>>,
    /// The operator in the CPU product's layout, built by the first CPU backend that needs
    /// it and shared by the others.
    packed_f32: OnceLock<Arc<PackedInverse<f32>>>,
    packed_f64: OnceLock<Arc<PackedInverse<f64>>>,
}

impl EegSetup {
    pub fn new(cfg: &Config, sources_out: Option<&Path>) -> anyhow::Result<Self> {
        let config = EegConfig::from_config(cfg)?;
        let inputs = EegInputs::load(&EegInputPaths {
            lead_field: config.leadfield.clone(),
            source_positions: config.src.clone(),
            noise_covariance: config.noise_cov.clone(),
            channel_names: config.channels.clone(),
        })?;
        let method = parse_method(&config.method)?;
        let t0 = std::time::Instant::now();
        let kernel = match &config.cache {
            Some(cache) => {
                let (k, outcome) =
                    InverseKernel::load_or_build(cache, &inputs, method, config.lambda2)?;
                tracing::info!(cache = %cache.display(), ?outcome, "inverse kernel");
                k
            }
            None => InverseKernel::build(&inputs, method, config.lambda2)?,
        };
        tracing::info!(
            method = method.as_str(),
            channels = kernel.n_channels,
            sources = kernel.n_sources,
            seconds = t0.elapsed().as_secs_f64(),
            "inverse operator ready"
        );
        let positions_m: Vec<[f64; 3]> = inputs
            .source_positions_m
            .chunks_exact(3)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        let roi = match &config.roi {
            Some(r) => r
                .resolve(&positions_m)
                .map_err(|e| anyhow::anyhow!("[eeg.roi]: {e}"))?,
            None => {
                tracing::warn!(
                    "no [eeg.roi]: the statistic covers every source and nothing is accepted"
                );
                let all = RoiConfig {
                    sphere: None,
                    sources: Some((0..kernel.n_sources as u32).collect()),
                    window_ms: 1.0,
                    threshold: f64::MAX,
                    refractory_ms: 0.0,
                };
                all.resolve(&positions_m)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
            }
        };
        let sources_out =
            sources_out.map(|p| Arc::new(Mutex::new(SourcesOut::new(p, kernel.n_sources))));
        let kernel_f32 = Arc::new(kernel.to_f32());
        Ok(Self {
            config,
            inputs,
            kernel: Arc::new(kernel),
            kernel_f32,
            positions_m,
            roi,
            sources_out,
            packed_f32: OnceLock::new(),
            packed_f64: OnceLock::new(),
        })
    }

    /// What `trigd check` prints of an EEG configuration: the operator built (channels,
    /// sources, method, regularisation, precision), the filter, the region of interest and
    /// its trigger, and a warning where nothing can be accepted (no region).
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let c = &self.config;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "eeg: {} channels, {} sources, {} with lambda2 = {} in {}",
            self.kernel.n_channels,
            self.kernel.n_sources,
            c.method,
            c.lambda2,
            match c.precision {
                Precision::F32 => "float32",
                Precision::F64 => "float64",
            }
        );
        let f = &c.filter;
        let band = match (f.bandpass_hz, f.lowpass_hz, f.highpass_hz) {
            (Some([lo, hi]), _, _) => format!("band-pass {lo}-{hi} Hz, order {}", f.order),
            (None, Some(lo), _) => format!("low-pass {lo} Hz, order {}", f.order),
            (None, None, Some(hi)) => format!("high-pass {hi} Hz, order {}", f.order),
            _ => "none".to_string(),
        };
        let notch = f.notch_hz.map_or(String::new(), |n| {
            format!(", notch {n} Hz (Q {})", f.notch_q)
        });
        let _ = writeln!(s, "filter: {band}{notch}");
        let _ = writeln!(s, "frames of EDF/BDF files: {} samples", c.block_samples);
        match &c.roi {
            Some(r) => {
                let region = match (&r.sphere, &r.sources) {
                    (Some(sp), _) => format!(
                        "the sources within {} mm of ({}, {}, {}) mm",
                        sp.radius_mm, sp.centre_mm[0], sp.centre_mm[1], sp.centre_mm[2]
                    ),
                    _ => "the sources listed".to_string(),
                };
                let _ = writeln!(
                    s,
                    "region of interest: {} sources ({region}); fires when the mean power over \
                     {} ms reaches {}, then not for {} ms",
                    self.roi.indices.len(),
                    r.window_ms,
                    r.threshold,
                    r.refractory_ms
                );
                let _ = writeln!(s, "no warnings");
            }
            None => {
                let _ = writeln!(
                    s,
                    "warning: no [eeg.roi]: the statistic covers every source and no frame is \
                     accepted"
                );
            }
        }
        s
    }

    /// The float32 operator in the CPU layout.
    pub fn packed_f32(&self) -> Arc<PackedInverse<f32>> {
        self.packed_f32
            .get_or_init(|| Arc::new(PackedInverse::new(&self.kernel, &self.roi)))
            .clone()
    }

    /// The float64 operator in the CPU layout.
    pub fn packed_f64(&self) -> Arc<PackedInverse<f64>> {
        self.packed_f64
            .get_or_init(|| Arc::new(PackedInverse::new(&self.kernel, &self.roi)))
            .clone()
    }

    /// The trigger for a stream at `fs_hz`.
    pub fn trigger(&self, fs_hz: f64) -> Result<RoiTrigger, String> {
        match &self.config.roi {
            Some(r) => r.trigger(fs_hz).map_err(|e| e.to_string()),
            None => Ok(RoiTrigger::new(1, f64::MAX, 0)),
        }
    }
}

/// Source amplitudes of the whole run, for `--sources-out` (NPY `[n_sources, n_samples]`
/// float32, as MNE's `stc.data`).
pub struct SourcesOut {
    path: PathBuf,
    rows: Vec<Vec<f32>>,
}

/// Refuse to hold more than this in memory for `--sources-out`.
const SOURCES_OUT_MAX_BYTES: usize = 8 << 30;

impl SourcesOut {
    fn new(path: &Path, n_sources: usize) -> Self {
        Self {
            path: path.to_path_buf(),
            rows: vec![Vec::new(); n_sources],
        }
    }
    /// Appends a block `[n_sources, n_times]`.
    pub fn push_block<A: Copy + Into<f64>>(
        &mut self,
        amplitudes: &[A],
        n_times: usize,
    ) -> Result<(), String> {
        let have = self.rows.first().map_or(0, Vec::len);
        if (have + n_times) * self.rows.len() * 4 > SOURCES_OUT_MAX_BYTES {
            return Err(format!(
                "--sources-out would exceed {} GiB; replay a shorter file",
                SOURCES_OUT_MAX_BYTES >> 30
            ));
        }
        for (s, row) in self.rows.iter_mut().enumerate() {
            row.extend(
                amplitudes[s * n_times..(s + 1) * n_times]
                    .iter()
                    .map(|&a| a.into() as f32),
            );
        }
        Ok(())
    }
    pub fn write(&mut self) -> anyhow::Result<()> {
        let n_times = self.rows.first().map_or(0, Vec::len);
        let shape = [self.rows.len() as u64, n_times as u64];
        let f = std::fs::File::create(&self.path)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", self.path.display()))?;
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&shape)
            .writer(std::io::BufWriter::new(f))
            .begin_nd()?;
        for row in &self.rows {
            w.extend(row.iter().copied())?;
        }
        w.finish()?;
        tracing::info!(path = %self.path.display(), sources = shape[0], samples = shape[1], "source estimates written");
        Ok(())
    }
}

/// Per-stream state after the product: filter, trigger, statistics. Shared by the CPU and
/// GPU backends.
#[derive(Clone)]
pub struct EegStream {
    pub filter: Option<BlockFilter>,
    pub trigger: Option<RoiTrigger>,
    pub sample_rate_hz: f64,
    pub stats: BlockStats,
    /// `first_sample` the next block continues from; a block that starts elsewhere (samples
    /// lost, the stream restarted) restarts the filter and the trigger window.
    pub next_sample: Option<u64>,
    /// Breaks in the stream's samples seen so far.
    pub breaks: u64,
}

impl EegStream {
    pub fn new() -> Self {
        Self {
            filter: None,
            trigger: None,
            sample_rate_hz: 0.0,
            stats: BlockStats::with_capacity(1024),
            next_sample: None,
            breaks: 0,
        }
    }

    /// Checks a block against the stream (channels, sample rate) and sets the stream up on
    /// the first block. Returns the reason to call the frame malformed, if any.
    pub fn admit(&mut self, setup: &EegSetup, b: &EegBlockView<'_>) -> Result<(), &'static str> {
        if b.n_channels() != setup.kernel.n_channels {
            return Err("channel_count");
        }
        let fs = b.header.sample_rate_hz.get();
        if self.trigger.is_none() {
            self.trigger = Some(setup.trigger(fs).map_err(|e| {
                tracing::error!("EEG trigger: {e}");
                "sample_rate"
            })?);
            self.filter = BlockFilter::from_config(&setup.config.filter, fs, b.n_channels())
                .map_err(|e| {
                    tracing::error!("EEG filter at {fs} Hz: {e}");
                    "sample_rate"
                })?;
            self.sample_rate_hz = fs;
        } else if fs != self.sample_rate_hz {
            return Err("sample_rate");
        }
        let first = b.header.first_sample.get();
        if self.next_sample.is_some_and(|n| n != first) {
            // A filter run across the break would ring with the step between unrelated
            // samples, and the window would average power from both sides of it.
            if let Some(f) = self.filter.as_mut() {
                f.reset();
            }
            if let Some(t) = self.trigger.as_mut() {
                t.restart_window();
            }
            self.breaks += 1;
            tracing::debug!(
                expected = self.next_sample,
                first_sample = first,
                "EEG stream broke: filter and trigger window restarted"
            );
        }
        self.next_sample = Some(first.saturating_add(u64::from(b.header.n_samples.get())));
        Ok(())
    }

    /// The verdict from `self.stats` (filled by the backend for this block).
    pub fn decide(&mut self, setup: &EegSetup, first_sample: u64) -> Verdict {
        let trigger = self.trigger.as_mut().expect("admit sets the trigger up");
        let d = trigger.push_block(&self.stats.roi_power, first_sample);
        let peak = self.stats.peak_source as usize;
        let p = setup.positions_m.get(peak).copied().unwrap_or([0.0; 3]);
        Verdict {
            accept: d.fired,
            lines_fired: d.fired as u64,
            detail: Detail::Eeg {
                statistic: if d.peak_statistic.is_finite() {
                    d.peak_statistic
                } else {
                    0.0
                },
                peak_source: self.stats.peak_source,
                peak_pos_mm: [
                    (p[0] * 1e3) as f32,
                    (p[1] * 1e3) as f32,
                    (p[2] * 1e3) as f32,
                ],
            },
            malformed: None,
        }
    }
}

impl EegStream {
    /// New thresholds and timing (SIGHUP). The region itself needs a restart; the window
    /// starts again.
    pub fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        let ec = EegConfig::from_config(cfg).map_err(|e| format!("{e:#}"))?;
        if let (Some(r), fs) = (&ec.roi, self.sample_rate_hz) {
            if fs > 0.0 {
                self.trigger = Some(r.trigger(fs).map_err(|e| e.to_string())?);
            }
        }
        Ok(())
    }
}

impl Default for EegStream {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`EegStreams::save_filters`] keeps of a stream: its id, filter state, the sample
/// its next block continues from and its breaks so far.
pub type SavedStream = (u32, Option<BlockFilter>, Option<u64>, u64);

/// The EEG streams one worker serves, told apart by the frame header's `source_id` (one
/// amplifier or producer each): every stream keeps its own filter state, trigger window
/// and statistics. The pipeline sends all frames of one `source_id` to the same worker, in
/// order, so a stream lives in exactly one of these maps.
#[derive(Clone, Default)]
pub struct EegStreams {
    streams: std::collections::BTreeMap<u32, EegStream>,
}

impl EegStreams {
    pub fn new() -> Self {
        Self::default()
    }

    /// The stream of `source_id`, created on its first block.
    pub fn get(&mut self, source_id: u32) -> &mut EegStream {
        self.streams.entry(source_id).or_default()
    }

    /// Streams seen so far.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// The filter state of every stream and where its samples continue (restored when a
    /// device batch fails, so the CPU's run of the batch starts from the same state).
    pub fn save_filters(&self, into: &mut Vec<SavedStream>) {
        into.clear();
        into.extend(
            self.streams
                .iter()
                .map(|(&id, s)| (id, s.filter.clone(), s.next_sample, s.breaks)),
        );
    }

    /// Puts back what [`Self::save_filters`] saved; streams created since start afresh.
    pub fn restore_filters(&mut self, saved: &mut Vec<SavedStream>) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            match saved.iter().position(|(s, ..)| *s == id) {
                Some(i) => {
                    let (_, f, next, breaks) = saved.swap_remove(i);
                    let stream = self.get(id);
                    stream.filter = f;
                    stream.next_sample = next;
                    stream.breaks = breaks;
                }
                None => {
                    self.streams.remove(&id);
                }
            }
        }
    }

    /// New thresholds and timing for every stream (SIGHUP).
    pub fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        for s in self.streams.values_mut() {
            s.reload(cfg)?;
        }
        Ok(())
    }
}

/// The CPU product of one worker, in the configured precision.
enum Engine {
    F32(CpuInverse<f32>),
    F64(CpuInverse<f64>),
}

/// Frames of one batch staged for the product, in one precision.
struct Staged<T> {
    /// Admitted frames back to back, each channel-major `[n_channels, n_times]`, filtered.
    data: Vec<T>,
    /// The source estimate of a group, for `--sources-out`.
    amplitudes: Vec<T>,
}

impl<T> Staged<T> {
    fn new() -> Self {
        Self {
            data: Vec::new(),
            amplitudes: Vec::new(),
        }
    }
}

/// The CPU EEG backend of one worker (its streams keep filter and window state across
/// blocks). The frames of a batch are filtered per stream in arrival order, then frames of
/// equal length go through the product together (one read of the operator), split over
/// the worker's threads, and are decided in order.
pub struct CpuEeg {
    setup: Arc<EegSetup>,
    /// Shared with the GPU backend this one stands behind, if any.
    streams: Arc<Mutex<EegStreams>>,
    names: Vec<String>,
    engine: Engine,
    s32: Staged<f32>,
    s64: Staged<f64>,
    /// Per frame of the batch: why it is malformed, if it is.
    admitted: Vec<Option<&'static str>>,
    /// Samples of each staged frame.
    n_times_of: Vec<usize>,
    /// Statistics of each staged frame.
    staged_stats: Vec<BlockStats>,
}

impl CpuEeg {
    /// A backend whose product runs on `threads` threads (its own included), with buffers
    /// sized for batches of `max_frames` blocks of the configured length.
    pub fn new(
        setup: Arc<EegSetup>,
        streams: Arc<Mutex<EegStreams>>,
        threads: usize,
        max_frames: usize,
    ) -> anyhow::Result<Self> {
        let max_times = setup.config.block_samples.max(1);
        let max_frames = max_frames.max(1);
        let spawn = |e: std::io::Error| anyhow::anyhow!("starting EEG worker threads: {e}");
        let engine = match setup.config.precision {
            Precision::F32 => {
                let mut e = CpuInverse::new(setup.packed_f32(), threads).map_err(spawn)?;
                e.reserve(max_frames, max_times);
                Engine::F32(e)
            }
            Precision::F64 => {
                let mut e = CpuInverse::new(setup.packed_f64(), threads).map_err(spawn)?;
                e.reserve(max_frames, max_times);
                Engine::F64(e)
            }
        };
        let (n_threads, isa) = match &engine {
            Engine::F32(e) => (e.threads(), e.isa()),
            Engine::F64(e) => (e.threads(), e.isa()),
        };
        tracing::info!(
            threads = n_threads,
            isa = isa.as_str(),
            precision = ?setup.config.precision,
            "EEG product on the CPU"
        );
        let block = setup.kernel.n_channels * max_times * max_frames;
        let mut s32 = Staged::new();
        let mut s64 = Staged::new();
        match setup.config.precision {
            Precision::F32 => s32.data.reserve(block),
            Precision::F64 => s64.data.reserve(block),
        }
        Ok(Self {
            setup,
            streams,
            names: vec![LINE_NAME.to_string()],
            engine,
            s32,
            s64,
            admitted: Vec::with_capacity(max_frames),
            n_times_of: Vec::with_capacity(max_frames),
            staged_stats: vec![BlockStats::with_capacity(max_times); max_frames],
        })
    }

    /// Threads of this worker's product.
    pub fn threads(&self) -> usize {
        match &self.engine {
            Engine::F32(e) => e.threads(),
            Engine::F64(e) => e.threads(),
        }
    }
}

/// Filters and stages one admitted frame.
fn stage<T: Real>(
    staged: &mut Staged<T>,
    b: &EegBlockView<'_>,
    filter: Option<&mut BlockFilter>,
    run: impl FnOnce(&mut BlockFilter, &mut [T], usize),
) {
    let start = staged.data.len();
    staged
        .data
        .extend(b.samples.iter().map(|v| T::from_f64(f64::from(v.get()))));
    if let Some(fl) = filter {
        run(fl, &mut staged.data[start..], b.n_samples());
    }
}

/// The product of the staged frames, group by group of equal length; each frame's
/// statistics into `stats`, its amplitudes to `--sources-out` if asked for.
fn reconstruct<T: Real + Into<f64>>(
    engine: &mut CpuInverse<T>,
    staged: &mut Staged<T>,
    n_times_of: &[usize],
    stats: &mut Vec<BlockStats>,
    setup: &EegSetup,
) -> Result<(), BackendError> {
    let (c, n_s) = (setup.kernel.n_channels, setup.kernel.n_sources);
    if stats.len() < n_times_of.len() {
        stats.resize(n_times_of.len(), BlockStats::default());
    }
    let (mut i, mut offset) = (0, 0);
    while i < n_times_of.len() {
        let t = n_times_of[i];
        let j = i + n_times_of[i..].iter().take_while(|&&n| n == t).count();
        let len = (j - i) * c * t;
        let frames = &staged.data[offset..offset + len];
        let amplitudes = match setup.sources_out {
            Some(_) => {
                staged.amplitudes.clear();
                staged.amplitudes.resize((j - i) * n_s * t, T::ZERO);
                Some(staged.amplitudes.as_mut_slice())
            }
            None => None,
        };
        let got = engine
            .process(frames, t, amplitudes)
            .map_err(|e| BackendError::Failed(e.to_string()))?;
        for (dst, src) in stats[i..j].iter_mut().zip(got) {
            dst.roi_power.clear();
            dst.roi_power.extend_from_slice(&src.roi_power);
            dst.peak_source = src.peak_source;
            dst.peak_power = src.peak_power;
        }
        if let Some(so) = &setup.sources_out {
            let mut so = so
                .lock()
                .map_err(|_| BackendError::Failed("sources-out poisoned".into()))?;
            for f in 0..j - i {
                so.push_block(&staged.amplitudes[f * n_s * t..(f + 1) * n_s * t], t)
                    .map_err(BackendError::Failed)?;
            }
        }
        offset += len;
        i = j;
    }
    Ok(())
}

impl Backend for CpuEeg {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn line_names(&self) -> &[String] {
        &self.names
    }
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        let streams = self.streams.clone();
        let mut streams = streams
            .lock()
            .map_err(|_| BackendError::Failed("EEG stream state poisoned".into()))?;
        self.admitted.clear();
        self.n_times_of.clear();
        self.s32.data.clear();
        self.s64.data.clear();
        for (index, f) in batch.iter().enumerate() {
            let Payload::Eeg(b) = f.payload else {
                return Err(BackendError::WrongKind {
                    index,
                    expected: "eeg_block",
                });
            };
            let stream = streams.get(f.header.source_id.get());
            if let Err(reason) = stream.admit(&self.setup, &b) {
                self.admitted.push(Some(reason));
                continue;
            }
            match self.engine {
                Engine::F32(_) => stage(&mut self.s32, &b, stream.filter.as_mut(), |fl, d, n| {
                    fl.process_f32(d, n)
                }),
                Engine::F64(_) => stage(&mut self.s64, &b, stream.filter.as_mut(), |fl, d, n| {
                    fl.process_f64(d, n)
                }),
            }
            self.admitted.push(None);
            self.n_times_of.push(b.n_samples());
        }
        match &mut self.engine {
            Engine::F32(e) => reconstruct(
                e,
                &mut self.s32,
                &self.n_times_of,
                &mut self.staged_stats,
                &self.setup,
            )?,
            Engine::F64(e) => reconstruct(
                e,
                &mut self.s64,
                &self.n_times_of,
                &mut self.staged_stats,
                &self.setup,
            )?,
        }
        // Decide in arrival order.
        let mut k = 0;
        for (f, adm) in batch.iter().zip(&self.admitted) {
            if let Some(reason) = adm {
                out.push(Verdict {
                    malformed: Some(reason),
                    ..Default::default()
                });
                continue;
            }
            let Payload::Eeg(b) = f.payload else {
                unreachable!("checked above")
            };
            let stream = streams.get(f.header.source_id.get());
            let st = &self.staged_stats[k];
            k += 1;
            stream.stats.roi_power.clear();
            stream.stats.roi_power.extend_from_slice(&st.roi_power);
            stream.stats.peak_source = st.peak_source;
            stream.stats.peak_power = st.peak_power;
            out.push(stream.decide(&self.setup, b.header.first_sample.get()));
        }
        Ok(())
    }
    fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        let mut streams = self
            .streams
            .lock()
            .map_err(|_| "EEG stream state poisoned".to_string())?;
        streams.reload(cfg)
    }
}
