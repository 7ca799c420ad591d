//! The EEG workload on the GPU behind the backend trait: the host filters (state carried
//! across blocks), the device runs the product and the fused statistics
//! ([`crate::gpu::eeg::GpuEegEngine`]), the host runs the sliding-window trigger. The
//! streams' state (one per frame `source_id`) is shared with the CPU fallback, and a failed
//! batch leaves it as it was, so the CPU redoes exactly that batch and the decisions
//! continue as if nothing happened. One backend per GPU; the pipeline sends each stream's
//! frames to one worker.

use std::sync::{Arc, Mutex};

use super::eeg::{EegSetup, EegStreams, LINE_NAME};
use super::{Backend, BackendError, BackendKind, Verdict};
use crate::config::Config;
use crate::frame::{FrameView, Payload};
use crate::gpu::eeg::{EegBlockOutput, EegEngineConfig, GpuEegEngine};
use crate::gpu::runtime::BatchSizer;
use crate::gpu::GpuDevice;

/// The GPU EEG backend.
pub struct GpuEeg {
    setup: Arc<EegSetup>,
    streams: Arc<Mutex<EegStreams>>,
    engine: GpuEegEngine,
    /// Filter states saved before a batch (restored when the device fails it).
    saved: Vec<super::eeg::SavedStream>,
    names: Vec<String>,
    max_frames: usize,
    /// Frames per launch, from the deadline and the measured cost per frame.
    sizer: BatchSizer,
    /// Filtered samples of the batch's admitted frames, channel-major each.
    staged: Vec<Vec<f32>>,
    outs: Vec<EegBlockOutput>,
    /// Per frame of the batch: why it is malformed, if it is (reused across batches).
    admitted: Vec<Option<&'static str>>,
    /// Samples of each staged frame (reused across batches).
    n_times_of: Vec<usize>,
    group_outs: Vec<EegBlockOutput>,
    /// The GPU's ordinal.
    ordinal: usize,
}

impl GpuEeg {
    /// Builds the engine on `device` for blocks of up to `max_samples` samples and batches of
    /// up to `max_frames` frames.
    pub fn new(
        setup: Arc<EegSetup>,
        streams: Arc<Mutex<EegStreams>>,
        device: &GpuDevice,
        max_samples: usize,
        max_frames: usize,
        budget_us: f64,
    ) -> anyhow::Result<Self> {
        let config = EegEngineConfig {
            max_samples_per_frame: max_samples.max(1),
            max_frames_per_batch: max_frames.max(1),
            amplitudes: setup.sources_out.is_some(),
            ..EegEngineConfig::default()
        };
        let mut engine = GpuEegEngine::new(device, &setup.kernel, &setup.roi.indices, config)?;
        // Warm up before the first frame: cuBLAS initialisation and graph capture of the
        // common shapes (one frame of one sample, one frame of a full block) would otherwise
        // fall on the first frames and push them past their deadline.
        let warm = vec![0.0f32; setup.kernel.n_channels * max_samples.max(1)];
        let mut out = EegBlockOutput::default();
        for t in [1, max_samples.max(1)] {
            engine.process(
                &warm[..setup.kernel.n_channels * t],
                t,
                setup.sources_out.is_some(),
                &mut out,
            )?;
        }
        tracing::info!(device = %device, "EEG inverse resident on the GPU");
        Ok(Self {
            ordinal: device.ordinal,
            setup,
            streams,
            engine,
            saved: Vec::new(),
            names: vec![LINE_NAME.to_string()],
            max_frames: max_frames.max(1),
            // Half the deadline for the device work; the rest is queueing and decisions.
            sizer: BatchSizer::new(budget_us / 2.0, max_frames.max(1)),
            staged: Vec::new(),
            outs: Vec::new(),
            admitted: Vec::new(),
            n_times_of: Vec::new(),
            group_outs: Vec::new(),
        })
    }

    /// Makes the next batch fail as a device error would (fail-over tests).
    pub fn inject_device_error(&mut self) {
        self.engine.inject_device_error();
    }
}

impl Backend for GpuEeg {
    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }
    fn device(&self) -> String {
        format!("gpu{}", self.ordinal)
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
        // Everything below may fail on the device: keep the state to restore.
        streams.save_filters(&mut self.saved);
        let mut admitted = std::mem::take(&mut self.admitted);
        admitted.clear();
        let mut n_staged = 0;
        let mut n_times_of = std::mem::take(&mut self.n_times_of);
        n_times_of.clear();
        for (index, f) in batch.iter().enumerate() {
            let Payload::Eeg(b) = f.payload else {
                streams.restore_filters(&mut self.saved);
                return Err(BackendError::WrongKind {
                    index,
                    expected: "eeg_block",
                });
            };
            let stream = streams.get(f.header.source_id.get());
            if let Err(reason) = stream.admit(&self.setup, &b) {
                admitted.push(Some(reason));
                continue;
            }
            if b.n_samples() > self.engine.config().max_samples_per_frame {
                admitted.push(Some("block_too_long"));
                continue;
            }
            admitted.push(None);
            if self.staged.len() <= n_staged {
                self.staged.push(Vec::new());
            }
            let buf = &mut self.staged[n_staged];
            buf.clear();
            buf.extend(b.samples.iter().map(|v| v.get()));
            if let Some(fl) = stream.filter.as_mut() {
                fl.process_f32(buf, b.n_samples());
            }
            n_times_of.push(b.n_samples());
            n_staged += 1;
        }
        // Consecutive frames of equal length go to the device together.
        self.outs.clear();
        let want_amp = self.setup.sources_out.is_some();
        let mut i = 0;
        while i < n_staged {
            let t = n_times_of[i];
            let mut j = i + 1;
            let limit = self.sizer.next_batch().clamp(1, self.max_frames);
            while j < n_staged && n_times_of[j] == t && j - i < limit {
                j += 1;
            }
            let launched = std::time::Instant::now();
            let frames: Vec<&[f32]> = self.staged[i..j].iter().map(Vec::as_slice).collect();
            if let Err(e) = self
                .engine
                .process_batch(&frames, t, want_amp, &mut self.group_outs)
            {
                streams.restore_filters(&mut self.saved);
                return Err(BackendError::Device(e.to_string()));
            }
            self.sizer
                .record(j - i, launched.elapsed().as_secs_f64() * 1e6);
            self.outs.append(&mut self.group_outs);
            i = j;
        }
        // All device work succeeded: decide in order.
        let mut k = 0;
        for (f, &adm) in batch.iter().zip(&admitted) {
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
            let o = &mut self.outs[k];
            k += 1;
            let stream = streams.get(f.header.source_id.get());
            stream.stats.roi_power.clear();
            stream.stats.roi_power.extend_from_slice(&o.roi_power);
            stream.stats.peak_source = o.peak_source;
            stream.stats.peak_power = o.peak_power;
            if let Some(so) = &self.setup.sources_out {
                let mut so = so
                    .lock()
                    .map_err(|_| BackendError::Failed("sources-out poisoned".into()))?;
                so.push_block(&o.amplitudes, b.n_samples())
                    .map_err(BackendError::Failed)?;
            }
            out.push(stream.decide(&self.setup, b.header.first_sample.get()));
        }
        self.admitted = admitted;
        self.n_times_of = n_times_of;
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
