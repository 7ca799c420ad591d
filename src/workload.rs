//! Per-workload set-up: which backend each worker runs, the CPU fallback behind a GPU
//! backend, and the workload's own outputs (`--tracks-out`, `--sources-out`), written when
//! the run ends.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::backend::eeg::{CpuEeg, EegSetup, EegStreams};
use crate::backend::gpu_eeg::GpuEeg;
use crate::backend::gpu_tracking::GpuTracking;
use crate::backend::multiplicity::CpuMultiplicity;
use crate::backend::tracking::{CpuTracking, TrackingSetup};
use crate::backend::{Backend, BackendKind};
use crate::config::{Config, WorkloadKind};
use crate::metrics::Metrics;

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
    tracking: Option<TrackingSetup>,
    eeg: Option<Arc<EegSetup>>,
    /// Per worker: the state of its EEG streams, shared by its GPU backend and its CPU
    /// fallback.
    eeg_streams: Vec<Arc<Mutex<EegStreams>>>,
    gpus: Vec<crate::gpu::GpuDevice>,
    metrics: Option<Arc<Metrics>>,
    /// Whether frames have deadlines (`trigd run`, paced replays): GPU tracking launches
    /// are sized to fit them; without (`replay --speed max`) to the largest launch.
    deadlines: bool,
    /// Tracking on GPUs: the GPU (index into `gpus`) of each worker, `gpu_workers` per GPU
    /// where its memory holds that many trackers, the GPUs taken in turn.
    tracking_gpu_of: Vec<usize>,
}

/// How many tracking workers `dev` can hold, at most `wanted`, at least one: each
/// tracker's arenas (those of launches of [`GPU_TRACKING_LAUNCH`] events, with room for a
/// grid of 16 Ki cells), the first-hit step's and the exchange step's scratch where the
/// finder runs them (the exchange's for the detector's `n_planes`), and 1 GiB
/// for its fit and clone engines and what else the GPU holds. (One that cannot fit even one tracker fails at start, saying how much it needs.)
fn trackers_fitting(
    dev: &crate::gpu::GpuDevice,
    finder: &crate::tracking::reco::FinderConfig,
    n_planes: usize,
    wanted: usize,
) -> usize {
    let limits = crate::gpu::tracking::TrackerLimits::for_batch(finder, GPU_TRACKING_LAUNCH);
    let first_hits = if finder.first_hits_to_origin {
        limits.ca.first_hit_bytes()
    } else {
        0
    };
    let exchange = if finder.exchange_segments {
        limits.ca.exchange_bytes(n_planes)
    } else {
        0
    };
    let per_tracker = limits.ca.device_bytes(1 << 14) + first_hits + exchange + (1 << 30);
    (dev.memory_bytes / per_tracker).clamp(1, wanted.max(1))
}

/// Builds the plan for `cfg`'s workload (`metrics`: where the backends count what they
/// count beyond the pipeline's accounting, such as the GPU tracking's overflows).
pub fn plan(
    cfg: &Arc<Config>,
    outputs: &Outputs,
    metrics: Option<Arc<Metrics>>,
) -> anyhow::Result<Plan> {
    let mut plan = plan_workload(cfg, outputs)?;
    plan.metrics = metrics;
    Ok(plan)
}

fn plan_workload(cfg: &Arc<Config>, outputs: &Outputs) -> anyhow::Result<Plan> {
    // Before any GPU is opened.
    crate::gpu::set_wait(cfg.daemon.gpu_wait);
    match cfg.daemon.workload {
        WorkloadKind::Multiplicity => {
            if outputs.tracks_out.is_some() || outputs.sources_out.is_some() {
                anyhow::bail!(
                    "--tracks-out needs --workload tracking and --sources-out needs --workload eeg"
                );
            }
            if cfg.daemon.backend == "gpu" {
                anyhow::bail!(
                    "the multiplicity workload runs on the CPU only; use --backend cpu or auto"
                );
            }
            Ok(Plan::new(cfg, BackendKind::Cpu, None, None, Vec::new()))
        }
        WorkloadKind::Tracking => {
            if outputs.sources_out.is_some() {
                anyhow::bail!("--sources-out needs --workload eeg");
            }
            let setup = TrackingSetup::new(cfg, outputs.tracks_out.as_deref())?;
            let gpus = crate::backend::detect_gpus(&cfg.daemon.backend)?;
            let kind = if gpus.is_empty() {
                BackendKind::Cpu
            } else {
                BackendKind::Gpu
            };
            Ok(Plan::new(cfg, kind, Some(setup), None, gpus))
        }
        WorkloadKind::Eeg => {
            if outputs.tracks_out.is_some() {
                anyhow::bail!("--tracks-out needs --workload tracking");
            }
            let setup = Arc::new(EegSetup::new(cfg, outputs.sources_out.as_deref())?);
            let gpus = crate::backend::detect_gpus(&cfg.daemon.backend)?;
            let kind = if gpus.is_empty() {
                BackendKind::Cpu
            } else {
                BackendKind::Gpu
            };
            Ok(Plan::new(cfg, kind, None, Some(setup), gpus))
        }
    }
}

/// Events per GPU tracking launch at most (the tracker's arenas are sized for it; the
/// backend's sizer keeps launches within the deadline).
const GPU_TRACKING_LAUNCH: usize = 512;

impl Plan {
    fn new(
        cfg: &Arc<Config>,
        kind: BackendKind,
        tracking: Option<TrackingSetup>,
        eeg: Option<Arc<EegSetup>>,
        gpus: Vec<crate::gpu::GpuDevice>,
    ) -> Plan {
        let mut plan = Plan {
            cfg: cfg.clone(),
            kind,
            tracking,
            eeg,
            eeg_streams: Vec::new(),
            gpus,
            metrics: None,
            deadlines: true,
            tracking_gpu_of: Vec::new(),
        };
        if let (Some(t), BackendKind::Gpu) = (&plan.tracking, plan.kind) {
            let per_gpu: Vec<usize> = plan
                .gpus
                .iter()
                .map(|d| {
                    let n_planes = t.detector.planes.len();
                    trackers_fitting(d, &t.finder, n_planes, cfg.daemon.gpu_workers)
                })
                .collect();
            for (&n, d) in per_gpu.iter().zip(&plan.gpus) {
                if n < cfg.daemon.gpu_workers {
                    // The default asks for as many as fit; a number the user set, warned.
                    if cfg.daemon.gpu_workers == crate::config::GPU_WORKERS_DEFAULT {
                        tracing::info!(
                            device = %d,
                            "GPU {} holds the arenas of {n} tracking worker(s)",
                            d.ordinal
                        );
                    } else {
                        tracing::warn!(
                            device = %d,
                            "GPU {} holds the arenas of {n} tracking worker(s), not daemon.gpu_workers = {}",
                            d.ordinal,
                            cfg.daemon.gpu_workers
                        );
                    }
                }
            }
            let most = per_gpu.iter().copied().max().unwrap_or(0);
            for k in 0..most {
                for (g, &n) in per_gpu.iter().enumerate() {
                    if k < n {
                        plan.tracking_gpu_of.push(g);
                    }
                }
            }
        }
        plan.eeg_streams = (0..plan.workers())
            .map(|_| Arc::new(Mutex::new(EegStreams::new())))
            .collect();
        if plan.eeg.is_some() {
            if plan.kind == BackendKind::Gpu {
                tracing::info!(
                    "EEG: {} worker(s), one per GPU; each stream (frame source_id) stays on one worker",
                    plan.workers()
                );
            } else if cfg.daemon.workers != plan.workers() {
                tracing::warn!("EEG with --sources-out: running one worker");
            }
        }
        plan
    }

    /// Whether all frames of one producer (`source_id`) must go to the same worker in
    /// order: the EEG streams keep filter and window state across blocks.
    pub fn ordered_by_source(&self) -> bool {
        self.eeg.is_some()
    }

    /// Whether frames have deadlines (default: yes). Without, GPU tracking launches are as
    /// large as the arenas allow, for throughput.
    pub fn with_deadlines(mut self, deadlines: bool) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// The backend kind that takes batches first.
    pub fn primary_kind(&self) -> BackendKind {
        self.kind
    }

    /// The backend of worker `w`.
    pub fn make(&self, w: usize) -> anyhow::Result<Box<dyn Backend>> {
        match (&self.tracking, &self.eeg) {
            (Some(t), _) if self.kind == BackendKind::Gpu => {
                let dev = &self.gpus[self.tracking_gpu_of[w % self.tracking_gpu_of.len()]];
                tracing::info!(worker = w, device = %dev, "tracking worker on GPU {}", dev.ordinal);
                Ok(Box::new(GpuTracking::new(
                    t,
                    dev,
                    GPU_TRACKING_LAUNCH,
                    if self.deadlines {
                        self.cfg.daemon.budget_ms * 1e3
                    } else {
                        f64::INFINITY
                    },
                    // The host's cores shared among the tracking workers.
                    (std::thread::available_parallelism().map_or(1, |n| n.get()) / self.workers())
                        .max(1),
                    self.metrics.clone(),
                )?))
            }
            (Some(t), _) => {
                let threads = self.tracking_threads(t);
                tracing::info!(
                    worker = w,
                    threads,
                    "tracking worker {w} on the CPU, {threads} thread(s) per batch"
                );
                Ok(Box::new(CpuTracking::new(
                    t,
                    threads,
                    self.metrics.clone(),
                )?))
            }
            (_, Some(e)) if self.kind == BackendKind::Gpu => {
                // One stream of blocks keeps its order and state on one GPU.
                let dev = &self.gpus[w % self.gpus.len()];
                tracing::info!(worker = w, device = %dev, "EEG worker on GPU {}", dev.ordinal);
                let max_frames = self.cfg.daemon.batch_max.min(256);
                let max_samples = e.config.block_samples.max(1);
                Ok(Box::new(GpuEeg::new(
                    e.clone(),
                    self.eeg_streams[w].clone(),
                    dev,
                    max_samples,
                    max_frames,
                    self.cfg.daemon.budget_ms * 1e3,
                )?))
            }
            (_, Some(e)) => Ok(Box::new(CpuEeg::new(
                e.clone(),
                self.eeg_streams[w].clone(),
                self.eeg_threads(e),
                self.cfg.daemon.batch_max,
            )?)),
            (None, None) => Ok(Box::new(CpuMultiplicity::new(
                self.cfg.multiplicity.unwrap_or_default(),
            ))),
        }
    }

    /// Frames a worker takes off its rings at once: `daemon.batch_max`, and for tracking on
    /// GPUs at least half of a worker's share of an input's slots (at most 4096). The worker
    /// takes only what is queued (and what arrives within `batch_wait_us`), and splits a
    /// batch into launches that fit the deadline: under load its launches grow to what
    /// keeps the GPU efficient (a launch of 64 minimum-bias events costs about what one of
    /// 512 does), while the input always keeps half its slots.
    pub fn batch_max(&self) -> usize {
        let cfg = &self.cfg.daemon;
        if self.tracking.is_some() && self.kind == BackendKind::Gpu {
            let share = cfg.ring_slots / (2 * self.workers());
            cfg.batch_max.max(share.min(4096))
        } else {
            cfg.batch_max
        }
    }

    /// Reconstruction workers: on GPUs one per GPU for EEG (each stream on one),
    /// `daemon.gpu_workers` per GPU for tracking (events spread over them), on the CPU
    /// `daemon.workers`
    /// (streams are spread over them by `source_id`), and one when `--sources-out` writes
    /// a single stream's amplitudes; otherwise `daemon.workers`.
    pub fn workers(&self) -> usize {
        match &self.eeg {
            Some(e) if e.sources_out.is_some() => 1,
            Some(_) if self.kind == BackendKind::Gpu => self.gpus.len().max(1),
            None if self.kind == BackendKind::Gpu && !self.tracking_gpu_of.is_empty() => {
                self.tracking_gpu_of.len()
            }
            _ => self.cfg.daemon.workers.max(1),
        }
    }

    /// Threads each CPU tracking backend reconstructs a batch on: `tracking.threads`, or
    /// the cores left once the inputs and the decision thread have theirs, shared among
    /// the workers (as for EEG).
    pub fn tracking_threads(&self, t: &TrackingSetup) -> usize {
        t.config.threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            crate::eeg::cpu_apply::default_threads(
                cores,
                self.cfg.inputs.len().max(1),
                self.workers(),
            )
        })
    }

    /// Threads of each CPU EEG worker's product: `eeg.threads`, or the cores left once
    /// the inputs and the decision thread have theirs, shared among the workers.
    pub fn eeg_threads(&self, e: &EegSetup) -> usize {
        e.config.threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            crate::eeg::cpu_apply::default_threads(
                cores,
                self.cfg.inputs.len().max(1),
                self.workers(),
            )
        })
    }

    /// Whether a CPU backend stands behind the primary (a GPU) to take failed batches.
    pub fn has_fallback(&self) -> bool {
        self.kind == BackendKind::Gpu
    }

    /// The CPU backend of worker `w` that takes the batches its GPU backend failed.
    pub fn make_fallback(&self, w: usize) -> anyhow::Result<Box<dyn Backend>> {
        match (&self.tracking, &self.eeg) {
            (Some(t), _) => Ok(Box::new(CpuTracking::new(
                t,
                self.tracking_threads(t),
                self.metrics.clone(),
            )?)),
            (_, Some(e)) => Ok(Box::new(CpuEeg::new(
                e.clone(),
                self.eeg_streams[w].clone(),
                self.eeg_threads(e),
                self.cfg.daemon.batch_max,
            )?)),
            (None, None) => anyhow::bail!("no fallback backend for this workload"),
        }
    }

    /// Writes the workload's outputs after the last frame.
    pub fn finish(&self) -> anyhow::Result<()> {
        if let Some(so) = self.eeg.as_ref().and_then(|e| e.sources_out.as_ref()) {
            so.lock()
                .map_err(|_| anyhow::anyhow!("sources-out poisoned"))?
                .write()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::geometry::Detector;
    use crate::tracking::reco::FinderConfig;

    fn gpu(gib: usize) -> crate::gpu::GpuDevice {
        crate::gpu::GpuDevice {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (9, 0),
            memory_bytes: gib << 30,
            multiprocessors: 132,
        }
    }

    /// A GPU gets as many tracking workers as its memory holds trackers, at most the
    /// configured number and at least one.
    #[test]
    fn tracking_workers_per_gpu_follow_its_memory() {
        let det = Detector::from_toml_file(std::path::Path::new("fixtures/detector.toml")).unwrap();
        let finder = FinderConfig::from_detector(&det, 1.0);
        let limits = crate::gpu::tracking::TrackerLimits::for_batch(&finder, GPU_TRACKING_LAUNCH);
        // With the exchange of segments' scratch (on by default).
        let n = det.planes.len();
        assert!(finder.exchange_segments);
        let exchange = limits.ca.exchange_bytes(n);
        let one = limits.ca.device_bytes(1 << 14) + exchange + (1 << 30);
        println!(
            "one tracker: {:.2} GiB, {:.2} GiB of it the exchange's",
            one as f64 / (1u64 << 30) as f64,
            exchange as f64 / (1u64 << 30) as f64
        );
        assert!(exchange > 1 << 28, "the exchange's scratch: {exchange}");
        assert!(one > 2 << 30, "a tracker takes GiBs: {one}");
        assert_eq!(trackers_fitting(&gpu(80), &finder, n, 2), 2, "an H100");
        assert_eq!(trackers_fitting(&gpu(80), &finder, n, 1), 1);
        assert_eq!(trackers_fitting(&gpu(8), &finder, n, 2), 1, "an 8 GB card");
        assert_eq!(trackers_fitting(&gpu(2), &finder, n, 2), 1, "at least one");
        let fits = one.div_ceil(1 << 30);
        assert_eq!(trackers_fitting(&gpu(2 * fits), &finder, n, 4), 2);
    }

    /// The tracking plan on faked GPUs: `gpu_workers` per GPU where memory allows, the
    /// GPUs taken in turn, and batches of half a worker's share of the slots.
    #[test]
    fn tracking_on_faked_gpus_spreads_workers_over_them() {
        let cfg = Arc::new(
            Config::from_str_named(
                "[daemon]\nworkload = \"tracking\"\nring_slots = 4096\n[tracking]\ngeometry = \"fixtures/detector.toml\"\n",
                "test",
            )
            .unwrap(),
        );
        let setup = || TrackingSetup::new(&cfg, None).unwrap();
        let devices = |gib: &[usize]| -> Vec<crate::gpu::GpuDevice> {
            gib.iter()
                .enumerate()
                .map(|(k, &g)| crate::gpu::GpuDevice {
                    ordinal: k,
                    ..gpu(g)
                })
                .collect()
        };
        // Two H100s: the default four workers each, alternating.
        assert_eq!(cfg.daemon.gpu_workers, crate::config::GPU_WORKERS_DEFAULT);
        let plan = Plan::new(
            &cfg,
            BackendKind::Gpu,
            Some(setup()),
            None,
            devices(&[80, 80]),
        );
        assert_eq!(plan.workers(), 8);
        assert_eq!(plan.tracking_gpu_of, [0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(plan.batch_max(), 4096 / (2 * 8));
        assert!(plan.has_fallback());
        // A small card beside a large one: one worker there.
        let plan = Plan::new(
            &cfg,
            BackendKind::Gpu,
            Some(setup()),
            None,
            devices(&[80, 8]),
        );
        assert_eq!(plan.tracking_gpu_of, [0, 1, 0, 0, 0]);
        // Two workers per GPU where the configuration says so.
        let two = Arc::new(
            Config::from_str_named(
                "[daemon]\nworkload = \"tracking\"\nring_slots = 4096\ngpu_workers = 2\n[tracking]\ngeometry = \"fixtures/detector.toml\"\n",
                "test",
            )
            .unwrap(),
        );
        let plan = Plan::new(
            &two,
            BackendKind::Gpu,
            Some(TrackingSetup::new(&two, None).unwrap()),
            None,
            devices(&[80, 80]),
        );
        assert_eq!(plan.tracking_gpu_of, [0, 1, 0, 1]);
        assert_eq!(plan.batch_max(), 4096 / (2 * 4));
        // On the CPU: daemon.workers, batch_max as configured.
        let plan = Plan::new(&cfg, BackendKind::Cpu, Some(setup()), None, Vec::new());
        assert_eq!(plan.workers(), 1);
        assert_eq!(plan.batch_max(), 64);
        assert!(!plan.has_fallback());
    }
}
