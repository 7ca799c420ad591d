//! Reconstruction backends: the CPU reference and, behind the same trait, the GPU.
//! A backend takes a batch of validated frames of one workload and returns one verdict per
//! frame; the pipeline around it owns deadlines, accounting and sinks.

use crate::frame::FrameView;

/// The GPUs a workload runs on for `--backend auto|gpu|cpu` (empty: the CPU). `gpu`
/// without a usable GPU is an error naming what is missing (driver, CUDA, device).
pub fn detect_gpus(choice: &str) -> anyhow::Result<Vec<crate::gpu::GpuDevice>> {
    let choice: crate::gpu::BackendChoice = choice.parse()?;
    Ok(crate::gpu::detect(choice)?)
}

/// Which implementation produced a verdict (the decision record's `backend` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Cpu,
    Gpu,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        }
    }
}

/// Workload-specific fields a verdict carries into the decision record.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Detail {
    #[default]
    None,
    /// Hit multiplicity trigger: hits and distinct planes seen.
    Multiplicity { n_hits: u32, n_planes: u32 },
    /// Tracking: tracks found and fitted, best momentum.
    Tracking { n_tracks: u32, max_p_gev: f32 },
    /// EEG: region-of-interest statistic and the peak source.
    Eeg {
        statistic: f64,
        peak_source: u32,
        peak_pos_mm: [f32; 3],
    },
}

/// The result of reconstructing and triggering one frame.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    pub accept: bool,
    /// Bit i set = trigger line i fired (names come from the trigger configuration).
    pub lines_fired: u64,
    pub detail: Detail,
    /// Set when the frame cannot be reconstructed as its workload needs (for example an EEG
    /// block whose channel count differs from the operator's): the frame's outcome is
    /// `malformed` with this reason instead of accept/reject.
    pub malformed: Option<&'static str>,
}

/// Error from a backend for a whole batch; the pipeline fails the batch over to the CPU.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("frame {index} of the batch is not a {expected} frame")]
    WrongKind {
        index: usize,
        expected: &'static str,
    },
    #[error("reconstruction failed: {0}")]
    Failed(String),
    #[error("device error: {0}")]
    Device(String),
}

/// A reconstruction backend for one workload.
pub trait Backend: Send {
    fn kind(&self) -> BackendKind;
    /// Names of the trigger lines, in bit order of [`Verdict::lines_fired`].
    fn line_names(&self) -> &[String];
    /// Reconstructs `batch` and pushes exactly `batch.len()` verdicts onto `out`, in order.
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError>;
    /// Applies new trigger thresholds (SIGHUP) between batches, without losing state or frames.
    fn reload(&mut self, cfg: &crate::config::Config) -> Result<(), String>;
    /// Called once when the worker stops: write workload outputs, release the device.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Where this backend reconstructs: `cpu`, or `gpuN` for the GPU of ordinal N (the
    /// `device` label of `trigd_worker_frames_total`, and the workers' log lines).
    fn device(&self) -> String {
        "cpu".to_string()
    }
}

pub mod eeg;
pub mod gpu_eeg;
pub mod gpu_tracking;
pub mod multiplicity;
pub mod tracking;
