//! The EEG workload on the GPU behind the backend trait.

use std::sync::Arc;

use super::eeg::EegSetup;
use super::{Backend, BackendKind};

/// Which backend the EEG workload runs on for `--backend auto|gpu|cpu`.
pub fn eeg_backend_kind(choice: &str) -> anyhow::Result<BackendKind> {
    match choice {
        "cpu" | "auto" => Ok(BackendKind::Cpu),
        "gpu" => anyhow::bail!("--backend gpu: no GPU backend in this build"),
        other => anyhow::bail!("backend {other:?} must be auto, gpu or cpu"),
    }
}

/// The GPU EEG backend of worker `w`.
pub fn make_eeg_backend(setup: Arc<EegSetup>, w: usize) -> anyhow::Result<Box<dyn Backend>> {
    let _ = (setup, w);
    anyhow::bail!("no GPU backend in this build")
}
