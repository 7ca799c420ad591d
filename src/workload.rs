//! Per-workload set-up: which backend each worker runs, the CPU fallback behind a GPU
//! backend, and the workload's own outputs (`--tracks-out`, `--sources-out`), written when
//! the run ends.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::multiplicity::CpuMultiplicity;
use crate::backend::{Backend, BackendKind};
use crate::config::{Config, WorkloadKind};

/// Workload outputs requested on the command line.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// Tracking: TrackML submission file `event_id,hit_id,track_id`.
    pub tracks_out: Option<PathBuf>,
    /// EEG: NPY `[n_sources, n_samples]` float32 source amplitudes.
    pub sources_out: Option<PathBuf>,
}

/// A prepared workload: everything expensive (geometry, inverse operator, GPU context) is
/// built once here; [`Plan::make`] then hands each worker its backend.
pub struct Plan {
    cfg: Arc<Config>,
    kind: BackendKind,
}

/// Builds the plan for `cfg`'s workload.
pub fn plan(cfg: &Arc<Config>, outputs: &Outputs) -> anyhow::Result<Plan> {
    match cfg.daemon.workload {
        WorkloadKind::Multiplicity => {
            if outputs.tracks_out.is_some() || outputs.sources_out.is_some() {
                anyhow::bail!("--tracks-out needs --workload tracking and --sources-out needs --workload eeg");
            }
            if cfg.daemon.backend == "gpu" {
                anyhow::bail!("the multiplicity workload runs on the CPU only; use --backend cpu or auto");
            }
            Ok(Plan { cfg: cfg.clone(), kind: BackendKind::Cpu })
        }
        other => anyhow::bail!("workload {} is not available in this build", other.as_str()),
    }
}

impl Plan {
    /// The backend kind that takes batches first.
    pub fn primary_kind(&self) -> BackendKind {
        self.kind
    }

    /// The backend of worker `w`.
    pub fn make(&self, _w: usize) -> anyhow::Result<Box<dyn Backend>> {
        match self.cfg.daemon.workload {
            WorkloadKind::Multiplicity => Ok(Box::new(CpuMultiplicity::new(self.cfg.multiplicity.unwrap_or_default()))),
            other => anyhow::bail!("workload {} is not available in this build", other.as_str()),
        }
    }

    /// Whether a CPU backend stands behind the primary (a GPU) to take failed batches.
    pub fn has_fallback(&self) -> bool {
        self.kind == BackendKind::Gpu
    }

    /// The CPU backend of worker `w` that takes the batches its GPU backend failed.
    pub fn make_fallback(&self, w: usize) -> anyhow::Result<Box<dyn Backend>> {
        let _ = w;
        anyhow::bail!("no fallback backend for this workload")
    }

    /// Writes the workload's outputs after the last frame.
    pub fn finish(&self) -> anyhow::Result<()> {
        Ok(())
    }
}
