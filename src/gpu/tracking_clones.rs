//! Clone suppression on the GPU: the CPU's [`mark_clones`](crate::tracking::ca::clones::mark_clones)
//! over a batch of events (`kernels/ca_clones.cu`), with the same decisions. Per event the
//! input is its accepted tracks in acceptance order, each with its hits (plane, x, y;
//! upstream first) and its fit ([`FitOutput`]: state at z, covariance); the output is one
//! mark per track, true for a clone. The comparisons do not depend on the marks, so every
//! short track is compared with its event's tracks in parallel first (a warp per short
//! track, which keeps the references that passed); then a warp per event walks the short
//! tracks in acceptance order as the CPU does (a track marked earlier is no longer a
//! reference) and decides from what was kept. The straight-line bound and the Runge-Kutta
//! comparison are the CPU's double-precision operations in the CPU's order
//! (`--fmad=false`, the field map's lookup of `kernels/field_map.cuh`), so the marks are
//! meant to be the CPU's exactly, and the tests compare them track by track.
//!
//! The cuts ([`CloneCuts`]: short-track length, bending bound, step, window), the planes'
//! z and the field (uniform value or map nodes) are uploaded once, in
//! [`GpuCloneEngine::new`], from the CPU's [`FinderGeometry`] and [`FinderConfig`]: the
//! kernel derives no cut. Batch buffers are allocated there too, from [`CloneLimits`]
//! (events per batch, tracks per event, hits per track); a batch beyond a limit is refused
//! as [`CloneError::Overflow`] before anything is copied; device errors are
//! [`CloneError::Device`].
//!
//! Two entries:
//! - [`GpuCloneEngine::mark_batch`] takes the tracks from host slices: packs them into
//!   the engine's pinned buffers, uploads, launches, and reads the marks back.
//! - [`GpuCloneEngine::launch`] enqueues the kernel on the engine's stream over a batch
//!   already on the device ([`DeviceCloneBatch`]: device buffers in the kernel's layout,
//!   see `kernels/ca_clones.cu`), for a pipeline whose tracks and fits stay on the
//!   device; the marks stay there for the next step.
//!
//! Per track some `12 n_hits + 172` bytes go up (hits, offsets, state and covariance in
//! double precision) and 4 come back: a central event's 2,000 tracks of about ten hits
//! are some 600 KB, 12 us on a PCIe 5 link (about 50 GB/s). The work is one pass over the
//! event's tracks per short track (a plane-mask test each, computed once per track into
//! the engine's scratch; the straight-line bound and the Runge-Kutta only for the few
//! tracks on disjoint planes), `n / 32` steps of a warp per short track, all short tracks
//! of the batch at once; the walk in order then reads about one word per track.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result as drv, CudaContext, CudaFunction, CudaStream};

use super::nvrtc::{KernelCache, LoadedModule};
use super::runtime::{copy_to_device, copy_to_host, DeviceBuffer, PinnedBuffer};
use super::{driver, GpuDevice, GpuError, KernelModule};
use crate::tracking::ca::clones::CloneCuts;
use crate::tracking::ca::cuts::FinderConfig;
use crate::tracking::ca::FinderGeometry;
use crate::tracking::geometry::Field;
use crate::tracking::kalman::{FitHit, FitOutput};
use crate::tracking::propagate::K_GEV_PER_T_MM;

const FIELD_MAP_HEADER: &str = include_str!("../../kernels/field_map.cuh");
const KERNEL_SOURCE: &str = include_str!("../../kernels/ca_clones.cu");
/// No contraction of products and sums into fused multiply-adds, which the CPU does not
/// make either: the comparisons decide on the same numbers.
const KERNEL_OPTIONS: [&str; 1] = ["--fmad=false"];

/// The module the engine compiles: the field map's header, then the step.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "ca_clones.cu",
        source: format!("{FIELD_MAP_HEADER}\n{KERNEL_SOURCE}"),
        options: &KERNEL_OPTIONS,
        engine: file!(),
    }
}

/// Threads per block of the kernels (four warps).
const BLOCK_THREADS: u32 = 128;
const WARP: usize = 32;
/// Words per track of the comparisons' scratch (REF_WORDS in kernels/ca_clones.cu).
const REF_WORDS: usize = 8;

/// Doubles per track in the fit array (FIT_WORDS in kernels/ca_clones.cu): z, the state
/// (5), the covariance's lower triangle (15).
pub const FIT_WORDS: usize = 21;

/// Entries of the parameter arrays (PI_*, PD_* in kernels/ca_clones.cu).
const PARAM_INTS: usize = 6;
const PARAM_DOUBLES: usize = 17;

/// One accepted track as the comparison takes it: its hits, upstream first, and its fit.
#[derive(Debug, Clone, Copy)]
pub struct CloneTrack<'a> {
    pub hits: &'a [FitHit],
    pub fit: &'a FitOutput,
}

/// The limits the engine's buffers are sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloneLimits {
    /// Most events in one batch.
    pub max_events: usize,
    /// Most accepted tracks of one event.
    pub max_tracks_per_event: usize,
    /// Most hits of one track.
    pub max_hits_per_track: usize,
}

impl Default for CloneLimits {
    /// 64 events of up to 2,048 tracks of up to 32 hits: 131,072 tracks, 48 MiB of hits
    /// and 21 MiB of fits.
    fn default() -> Self {
        Self {
            max_events: 64,
            max_tracks_per_event: 2048,
            max_hits_per_track: 32,
        }
    }
}

impl CloneLimits {
    /// Tracks of a full batch.
    pub fn max_tracks(&self) -> usize {
        self.max_events * self.max_tracks_per_event
    }

    /// Hits of a full batch.
    pub fn max_hits(&self) -> usize {
        self.max_tracks() * self.max_hits_per_track
    }

    /// Bytes of device memory for the batch buffers and the kernel's scratch (the tables
    /// and the field come on top); the pinned host staging is about the same again.
    pub fn device_bytes(&self) -> usize {
        4 * (self.max_events + 1)
            + 4 * (self.max_tracks() + 1)
            + 12 * self.max_hits()
            + 8 * FIT_WORDS * self.max_tracks()
            + 4 * self.max_tracks()
            + (8 + 4 * REF_WORDS) * self.max_tracks()
    }

    fn validate(&self) -> Result<(), GpuError> {
        if self.max_events == 0 || self.max_tracks_per_event == 0 || self.max_hits_per_track == 0 {
            return Err(GpuError::Config(format!(
                "clone limits must allow one event of one track of one hit (got {self:?})"
            )));
        }
        // Track and hit indices are 32-bit in the kernel.
        let hits = self
            .max_events
            .checked_mul(self.max_tracks_per_event)
            .and_then(|t| t.checked_mul(self.max_hits_per_track.max(FIT_WORDS)))
            .filter(|&h| h < i32::MAX as usize);
        if hits.is_none() {
            return Err(GpuError::Config(format!(
                "clone limits {self:?} exceed the kernel's 32-bit indices"
            )));
        }
        Ok(())
    }
}

/// Which limit a batch exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneLimit {
    Events,
    TracksPerEvent,
    HitsPerTrack,
}

impl std::fmt::Display for CloneLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CloneLimit::Events => "events per batch",
            CloneLimit::TracksPerEvent => "tracks per event",
            CloneLimit::HitsPerTrack => "hits per track",
        })
    }
}

/// Why a batch was not compared on the GPU.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    /// The batch exceeds a limit of the engine: nothing was copied; compare it on the CPU.
    #[error(
        "batch of {got} {limit} exceeds the GPU clone step's limit of {max}; compare it on the CPU"
    )]
    Overflow {
        limit: CloneLimit,
        got: usize,
        max: usize,
    },
    /// A hit names a plane the detector does not have (nothing was copied).
    #[error(
        "event {event}, track {track}: hit on plane {plane} of a detector of {n_planes} planes"
    )]
    BadPlane {
        event: usize,
        track: usize,
        plane: u16,
        n_planes: usize,
    },
    #[error(transparent)]
    Device(#[from] GpuError),
}

/// What the kernel reads besides the batch, from the CPU's structures.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneTables {
    /// The planes' z, mm.
    pub plane_z: Vec<f64>,
    /// Planes, longest short track (-1: no comparison), field map flag, map nodes per axis.
    pub ints: [i32; PARAM_INTS],
    /// Bending bounds (x, y), step, window, K, uniform field (3), map origin (3), map
    /// inverse steps (3), smallest window, |q/p| of the window, n_sigma of the q/p comparison.
    pub doubles: [f64; PARAM_DOUBLES],
    /// Field map nodes `[nx][ny][nz][3]` (one zero node in a uniform field).
    pub nodes: Vec<f32>,
}

impl CloneTables {
    pub fn new(geo: &FinderGeometry, cfg: &FinderConfig) -> Self {
        let cuts = CloneCuts::new(geo, cfg);
        let plane_z: Vec<f64> = geo.planes.iter().map(|p| p.z_mm).collect();
        let mut ints = [0i32; PARAM_INTS];
        ints[0] = plane_z.len() as i32;
        ints[1] = cuts.short_max.map_or(-1, |s| s as i32);
        let mut doubles = [0.0f64; PARAM_DOUBLES];
        doubles[0] = cuts.bend_x;
        doubles[1] = cuts.bend_y;
        doubles[2] = cuts.step_mm;
        doubles[3] = cuts.window_mm;
        doubles[4] = K_GEV_PER_T_MM;
        doubles[14] = cuts.window_floor_mm;
        doubles[15] = cuts.qop_ref;
        doubles[16] = cuts.n_sigma;
        let nodes = match &geo.field {
            Field::Uniform { b_tesla } => {
                doubles[5..8].copy_from_slice(b_tesla);
                ints[3..6].copy_from_slice(&[2, 2, 2]);
                vec![0.0; 3]
            }
            Field::Grid(map) => {
                ints[2] = 1;
                for a in 0..3 {
                    ints[3 + a] = map.dims[a] as i32;
                    doubles[8 + a] = map.origin_mm[a];
                    // As `FieldMap` rounds it for its lookups.
                    doubles[11 + a] = 1.0 / map.step_mm[a];
                }
                map.nodes_tesla.iter().flatten().copied().collect()
            }
        };
        Self {
            plane_z,
            ints,
            doubles,
            nodes,
        }
    }

    pub fn device_bytes(&self) -> usize {
        8 * self.plane_z.len() + 4 * PARAM_INTS + 8 * PARAM_DOUBLES + 4 * self.nodes.len()
    }
}

/// The counts of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchShape {
    pub n_events: usize,
    pub n_tracks: usize,
    pub n_hits: usize,
}

/// Checks a batch against the limits and the detector's planes; gives its counts.
pub fn check_batch(
    limits: &CloneLimits,
    n_planes: usize,
    events: &[&[CloneTrack<'_>]],
) -> Result<BatchShape, CloneError> {
    let over = |limit, got, max| CloneError::Overflow { limit, got, max };
    if events.len() > limits.max_events {
        return Err(over(CloneLimit::Events, events.len(), limits.max_events));
    }
    let mut shape = BatchShape {
        n_events: events.len(),
        ..Default::default()
    };
    for (e, tracks) in events.iter().enumerate() {
        if tracks.len() > limits.max_tracks_per_event {
            return Err(over(
                CloneLimit::TracksPerEvent,
                tracks.len(),
                limits.max_tracks_per_event,
            ));
        }
        for (t, track) in tracks.iter().enumerate() {
            if track.hits.len() > limits.max_hits_per_track {
                return Err(over(
                    CloneLimit::HitsPerTrack,
                    track.hits.len(),
                    limits.max_hits_per_track,
                ));
            }
            if let Some(h) = track.hits.iter().find(|h| h.plane as usize >= n_planes) {
                return Err(CloneError::BadPlane {
                    event: e,
                    track: t,
                    plane: h.plane,
                    n_planes,
                });
            }
            shape.n_hits += track.hits.len();
        }
        shape.n_tracks += tracks.len();
    }
    Ok(shape)
}

/// A batch in the kernel's layout in host memory (the engine's pinned staging buffers),
/// each slice at least as long as the batch needs (see [`DeviceCloneBatch`]).
pub struct BatchArrays<'a> {
    pub event_start: &'a mut [u32],
    pub track_hit_start: &'a mut [u32],
    pub hit_plane: &'a mut [u32],
    pub hit_x: &'a mut [f32],
    pub hit_y: &'a mut [f32],
    pub fits: &'a mut [f64],
}

/// Writes `events` (of counts `shape`, from [`check_batch`]) into `out` in the kernel's
/// layout: the events' tracks one after the other, each track's hits one after the other.
pub fn pack_batch(events: &[&[CloneTrack<'_>]], shape: BatchShape, out: BatchArrays<'_>) {
    let event_start = &mut out.event_start[..shape.n_events + 1];
    let track_hit_start = &mut out.track_hit_start[..shape.n_tracks + 1];
    let planes = &mut out.hit_plane[..shape.n_hits];
    let xs = &mut out.hit_x[..shape.n_hits];
    let ys = &mut out.hit_y[..shape.n_hits];
    let fits = &mut out.fits[..shape.n_tracks * FIT_WORDS];
    let (mut t, mut k) = (0usize, 0usize);
    for (e, tracks) in events.iter().enumerate() {
        event_start[e] = t as u32;
        for track in tracks.iter() {
            track_hit_start[t] = k as u32;
            for hit in track.hits {
                planes[k] = u32::from(hit.plane);
                xs[k] = hit.x_mm;
                ys[k] = hit.y_mm;
                k += 1;
            }
            let f = &mut fits[t * FIT_WORDS..(t + 1) * FIT_WORDS];
            f[0] = track.fit.z_mm;
            f[1..6].copy_from_slice(&track.fit.state);
            f[6..].copy_from_slice(&track.fit.cov);
            t += 1;
        }
    }
    event_start[shape.n_events] = t as u32;
    track_hit_start[shape.n_tracks] = k as u32;
    assert_eq!(
        (t, k),
        (shape.n_tracks, shape.n_hits),
        "shape of another batch"
    );
}

/// A batch on the device in the kernel's layout (`kernels/ca_clones.cu`): the offsets of
/// each event's tracks (`n_events + 1`, absolute track indices) and of each track's hits
/// (`n_tracks + 1`, absolute hit indices), the hits' planes and positions (`n_hits`), the
/// fits (`FIT_WORDS` doubles per track: z, state, covariance) and the marks written
/// (`n_tracks`). Offsets must be non-decreasing and within the counts; the kernel clamps
/// them to the counts, so a malformed batch reads and writes no memory outside these
/// buffers (its marks are then meaningless).
pub struct DeviceCloneBatch<'a> {
    pub shape: BatchShape,
    pub event_start: &'a DeviceBuffer<u32>,
    pub track_hit_start: &'a DeviceBuffer<u32>,
    pub hit_plane: &'a DeviceBuffer<u32>,
    pub hit_x: &'a DeviceBuffer<f32>,
    pub hit_y: &'a DeviceBuffer<f32>,
    pub fits: &'a DeviceBuffer<f64>,
    pub marks: &'a DeviceBuffer<u32>,
}

impl DeviceCloneBatch<'_> {
    /// Whether every buffer holds what the counts say.
    fn check(&self) -> Result<(), GpuError> {
        let s = self.shape;
        let need = [
            ("event offsets", self.event_start.len(), s.n_events + 1),
            ("track offsets", self.track_hit_start.len(), s.n_tracks + 1),
            ("hit planes", self.hit_plane.len(), s.n_hits),
            ("hit x", self.hit_x.len(), s.n_hits),
            ("hit y", self.hit_y.len(), s.n_hits),
            ("fits", self.fits.len(), s.n_tracks * FIT_WORDS),
            ("marks", self.marks.len(), s.n_tracks),
        ];
        for (what, got, want) in need {
            if got < want {
                return Err(GpuError::Config(format!(
                    "clone batch: {what} buffer of {got} elements, the batch needs {want}"
                )));
            }
        }
        if s.n_hits >= i32::MAX as usize || s.n_tracks * FIT_WORDS >= i32::MAX as usize {
            return Err(GpuError::Config(format!(
                "clone batch of {} tracks and {} hits exceeds the kernel's 32-bit indices",
                s.n_tracks, s.n_hits
            )));
        }
        Ok(())
    }
}

/// Sizes the engine is built for.
#[derive(Debug, Clone)]
pub struct CloneEngineConfig {
    pub limits: CloneLimits,
    pub cache: KernelCache,
    /// Whether batches come from host slices ([`GpuCloneEngine::mark_batch`]): their
    /// staging (host and device) is sized from `limits`. Without (a caller whose tracks
    /// are already on the device, [`GpuCloneEngine::launch`]), only the kernel's scratch
    /// is, and `mark_batch` takes batches of one track.
    pub host_batches: bool,
}

impl Default for CloneEngineConfig {
    fn default() -> Self {
        Self {
            limits: CloneLimits::default(),
            cache: KernelCache::from_env(),
            host_batches: true,
        }
    }
}

/// Host staging and device buffers of one batch.
struct Staging {
    event_start: PinnedBuffer<u32>,
    track_hit_start: PinnedBuffer<u32>,
    hit_plane: PinnedBuffer<u32>,
    hit_x: PinnedBuffer<f32>,
    hit_y: PinnedBuffer<f32>,
    fits: PinnedBuffer<f64>,
    marks: PinnedBuffer<u32>,
}

struct DeviceBatch {
    event_start: DeviceBuffer<u32>,
    track_hit_start: DeviceBuffer<u32>,
    hit_plane: DeviceBuffer<u32>,
    hit_x: DeviceBuffer<f32>,
    hit_y: DeviceBuffer<f32>,
    fits: DeviceBuffer<f64>,
    marks: DeviceBuffer<u32>,
}

impl DeviceBatch {
    fn view(&self, shape: BatchShape) -> DeviceCloneBatch<'_> {
        DeviceCloneBatch {
            shape,
            event_start: &self.event_start,
            track_hit_start: &self.track_hit_start,
            hit_plane: &self.hit_plane,
            hit_x: &self.hit_x,
            hit_y: &self.hit_y,
            fits: &self.fits,
            marks: &self.marks,
        }
    }
}

/// Clone suppression on one GPU. See the module documentation.
pub struct GpuCloneEngine {
    ctx: Arc<CudaContext>,
    _module: LoadedModule,
    masks_fn: CudaFunction,
    refs_fn: CudaFunction,
    clones_fn: CudaFunction,
    stream: Arc<CudaStream>,
    plane_z: DeviceBuffer<f64>,
    ints: DeviceBuffer<i32>,
    doubles: DeviceBuffer<f64>,
    nodes: DeviceBuffer<f32>,
    /// The kernels' scratch: per track its plane mask (`max_tracks` words) and the
    /// references its comparisons passed (`REF_WORDS` words per track).
    masks: DeviceBuffer<u64>,
    refs: DeviceBuffer<u32>,
    host: Staging,
    dev: DeviceBatch,
    limits: CloneLimits,
    n_planes: usize,
    /// Whether the kernel came from the on-disk cache, and how long loading took (ms).
    pub kernels_from_cache: bool,
    pub kernel_load_ms: f64,
}

impl GpuCloneEngine {
    /// Uploads the cuts, the planes' z and the field of `geo` and `cfg`, compiles or loads
    /// the kernel, and allocates the batch buffers for `config.limits`.
    pub fn new(
        device: &GpuDevice,
        geo: &FinderGeometry,
        cfg: &FinderConfig,
        config: CloneEngineConfig,
    ) -> Result<Self, GpuError> {
        let scratch_tracks = config.limits.max_tracks();
        let limits = if config.host_batches {
            config.limits
        } else {
            CloneLimits {
                max_events: 1,
                max_tracks_per_event: 1,
                ..config.limits
            }
        };
        limits.validate()?;
        let tables = CloneTables::new(geo, cfg);
        if tables.plane_z.is_empty() {
            return Err(GpuError::Config("the detector has no planes".into()));
        }
        let need = tables.device_bytes() + limits.device_bytes();
        let ctx = device.open()?;
        // SAFETY: the engine synchronises its one stream explicitly and uses no
        // cudarc-managed slices, so cudarc's per-allocation event tracking is off.
        unsafe { ctx.disable_event_tracking() };
        let (free, _) = driver("cuMemGetInfo", ctx.mem_get_info())?;
        if need > free {
            return Err(GpuError::Config(format!(
                "the clone engine needs {:.2} GiB of GPU memory, {} has {:.2} GiB free; lower its limits",
                need as f64 / (1u64 << 30) as f64,
                device.name,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        let module = kernel_module().load(&ctx, &device.arch(), &config.cache)?;
        let masks_fn = module.function("ca_clone_masks")?;
        let refs_fn = module.function("ca_clone_refs")?;
        let clones_fn = module.function("ca_clones")?;
        let stream = driver("cuStreamCreate", ctx.new_stream())?;
        let (events, tracks, hits) = (limits.max_events, limits.max_tracks(), limits.max_hits());
        let host = Staging {
            event_start: PinnedBuffer::new(&ctx, events + 1)?,
            track_hit_start: PinnedBuffer::new(&ctx, tracks + 1)?,
            hit_plane: PinnedBuffer::new(&ctx, hits)?,
            hit_x: PinnedBuffer::new(&ctx, hits)?,
            hit_y: PinnedBuffer::new(&ctx, hits)?,
            fits: PinnedBuffer::new(&ctx, tracks * FIT_WORDS)?,
            marks: PinnedBuffer::new(&ctx, tracks)?,
        };
        let dev = DeviceBatch {
            event_start: DeviceBuffer::new(&ctx, events + 1)?,
            track_hit_start: DeviceBuffer::new(&ctx, tracks + 1)?,
            hit_plane: DeviceBuffer::new(&ctx, hits)?,
            hit_x: DeviceBuffer::new(&ctx, hits)?,
            hit_y: DeviceBuffer::new(&ctx, hits)?,
            fits: DeviceBuffer::new(&ctx, tracks * FIT_WORDS)?,
            marks: DeviceBuffer::new(&ctx, tracks)?,
        };
        tracing::info!(
            "clone engine on {}: {} planes, up to {} events of {} tracks of {} hits per batch, {:.1} MiB",
            device.name,
            tables.plane_z.len(),
            limits.max_events,
            limits.max_tracks_per_event,
            limits.max_hits_per_track,
            need as f64 / (1u64 << 20) as f64
        );
        Ok(Self {
            plane_z: DeviceBuffer::from_host(&ctx, &tables.plane_z)?,
            ints: DeviceBuffer::from_host(&ctx, &tables.ints)?,
            doubles: DeviceBuffer::from_host(&ctx, &tables.doubles)?,
            nodes: DeviceBuffer::from_host(&ctx, &tables.nodes)?,
            masks: DeviceBuffer::new(&ctx, scratch_tracks.max(tracks))?,
            refs: DeviceBuffer::new(&ctx, scratch_tracks.max(tracks) * REF_WORDS)?,
            kernels_from_cache: module.from_cache,
            kernel_load_ms: module.load_ms,
            _module: module,
            masks_fn,
            refs_fn,
            clones_fn,
            stream,
            host,
            dev,
            limits,
            n_planes: tables.plane_z.len(),
            ctx,
        })
    }

    pub fn limits(&self) -> CloneLimits {
        self.limits
    }

    /// The stream [`Self::launch`] enqueues on: a caller that produced the batch on
    /// another stream makes this one wait for it (an event) before launching.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Marks the clones of a batch of events from host slices: `marks` is replaced by one
    /// flag per track (true: a clone), the events' tracks one after the other in the
    /// order given; returns how many are clones. A batch beyond the limits, or with a hit
    /// on a plane the detector does not have, is refused before anything is copied.
    pub fn mark_batch(
        &mut self,
        events: &[&[CloneTrack<'_>]],
        marks: &mut Vec<bool>,
    ) -> Result<usize, CloneError> {
        let shape = check_batch(&self.limits, self.n_planes, events)?;
        marks.clear();
        if shape.n_tracks == 0 {
            return Ok(0);
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        self.pack(events, shape);
        let run = self
            .upload(shape)
            .and_then(|()| self.launch(&self.dev.view(shape)))
            .and_then(|()| {
                copy_to_host(
                    &self.dev.marks,
                    &self.host.marks,
                    shape.n_tracks,
                    &self.stream,
                )
            })
            .and_then(|()| driver("cuStreamSynchronize", self.stream.synchronize()));
        if let Err(e) = run {
            // Drain whatever was enqueued so the buffers are free again.
            let _ = self.stream.synchronize();
            return Err(e.into());
        }
        marks.extend(
            self.host.marks.as_slice()[..shape.n_tracks]
                .iter()
                .map(|&m| m != 0),
        );
        Ok(marks.iter().filter(|&&m| m).count())
    }

    /// The kernel alone with the batch resident: uploads it once, then times `launches`
    /// launches back to back (no copies); returns the wall time of all.
    pub fn time_resident(
        &mut self,
        events: &[&[CloneTrack<'_>]],
        launches: usize,
    ) -> Result<Duration, CloneError> {
        let shape = check_batch(&self.limits, self.n_planes, events)?;
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        self.pack(events, shape);
        self.upload(shape)?;
        let view = self.dev.view(shape);
        self.launch(&view)?;
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        let start = Instant::now();
        for _ in 0..launches {
            self.launch(&view)?;
        }
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        Ok(start.elapsed())
    }

    /// Enqueues the clone comparison of a batch already on the device on
    /// [`Self::stream`]; the marks are written to `batch.marks` (read them after the
    /// stream has passed this launch). The buffers are checked against the counts; of the
    /// engine's limits only the tracks of a full batch apply (the kernel's scratch).
    pub fn launch(&self, batch: &DeviceCloneBatch<'_>) -> Result<(), GpuError> {
        batch.check()?;
        let s = batch.shape;
        if s.n_tracks > self.masks.len() {
            return Err(GpuError::Config(format!(
                "clone batch of {} tracks exceeds the engine's scratch of {} tracks",
                s.n_tracks,
                self.masks.len()
            )));
        }
        if s.n_events == 0 {
            return Ok(());
        }
        let mut event_start = batch.event_start.ptr();
        let mut n_events = s.n_events as i32;
        let mut track_hit_start = batch.track_hit_start.ptr();
        let mut n_tracks = s.n_tracks as i32;
        let mut hit_plane = batch.hit_plane.ptr();
        let mut hit_x = batch.hit_x.ptr();
        let mut hit_y = batch.hit_y.ptr();
        let mut n_hits = s.n_hits as i32;
        let mut fits = batch.fits.ptr();
        let mut plane_z = self.plane_z.ptr();
        let mut ints = self.ints.ptr();
        let mut doubles = self.doubles.ptr();
        let mut nodes = self.nodes.ptr();
        let mut marks = batch.marks.ptr();
        let mut masks = self.masks.ptr();
        let mut refs = self.refs.ptr();
        let mut params: [*mut std::ffi::c_void; 16] = [
            (&mut event_start as *mut u64).cast(),
            (&mut n_events as *mut i32).cast(),
            (&mut track_hit_start as *mut u64).cast(),
            (&mut n_tracks as *mut i32).cast(),
            (&mut hit_plane as *mut u64).cast(),
            (&mut hit_x as *mut u64).cast(),
            (&mut hit_y as *mut u64).cast(),
            (&mut n_hits as *mut i32).cast(),
            (&mut fits as *mut u64).cast(),
            (&mut plane_z as *mut u64).cast(),
            (&mut ints as *mut u64).cast(),
            (&mut doubles as *mut u64).cast(),
            (&mut nodes as *mut u64).cast(),
            (&mut marks as *mut u64).cast(),
            (&mut masks as *mut u64).cast(),
            (&mut refs as *mut u64).cast(),
        ];
        let warps_per_block = BLOCK_THREADS as usize / WARP;
        // A thread per track, a warp per track, a warp per event.
        let steps = [
            (
                &self.masks_fn,
                s.n_tracks.div_ceil(BLOCK_THREADS as usize),
                "cuLaunchKernel(ca_clone_masks)",
            ),
            (
                &self.refs_fn,
                s.n_tracks.div_ceil(warps_per_block),
                "cuLaunchKernel(ca_clone_refs)",
            ),
            (
                &self.clones_fn,
                s.n_events.div_ceil(warps_per_block),
                "cuLaunchKernel(ca_clones)",
            ),
        ];
        for (f, grid, name) in steps {
            // SAFETY: the parameters match the kernels' common signature and point to live
            // locals; the buffers and the scratch hold the counts passed (checked above);
            // the kernels write only the marks and the scratch, and they clamp every
            // offset and plane index they read to those counts and the planes' table.
            driver(name, unsafe {
                drv::launch_kernel(
                    f.cu_function(),
                    (grid.max(1) as u32, 1, 1),
                    (BLOCK_THREADS, 1, 1),
                    0,
                    self.stream.cu_stream(),
                    &mut params,
                )
            })?;
        }
        Ok(())
    }

    /// Writes the batch into the pinned staging buffers in the kernel's layout.
    fn pack(&mut self, events: &[&[CloneTrack<'_>]], shape: BatchShape) {
        let h = &mut self.host;
        pack_batch(
            events,
            shape,
            BatchArrays {
                event_start: h.event_start.as_mut_slice(),
                track_hit_start: h.track_hit_start.as_mut_slice(),
                hit_plane: h.hit_plane.as_mut_slice(),
                hit_x: h.hit_x.as_mut_slice(),
                hit_y: h.hit_y.as_mut_slice(),
                fits: h.fits.as_mut_slice(),
            },
        );
    }

    fn upload(&self, shape: BatchShape) -> Result<(), GpuError> {
        let (h, d, st) = (&self.host, &self.dev, &self.stream);
        copy_to_device(
            &h.event_start.as_slice()[..shape.n_events + 1],
            &d.event_start,
            0,
            st,
        )?;
        copy_to_device(
            &h.track_hit_start.as_slice()[..shape.n_tracks + 1],
            &d.track_hit_start,
            0,
            st,
        )?;
        copy_to_device(&h.hit_plane.as_slice()[..shape.n_hits], &d.hit_plane, 0, st)?;
        copy_to_device(&h.hit_x.as_slice()[..shape.n_hits], &d.hit_x, 0, st)?;
        copy_to_device(&h.hit_y.as_slice()[..shape.n_hits], &d.hit_y, 0, st)?;
        copy_to_device(
            &h.fits.as_slice()[..shape.n_tracks * FIT_WORDS],
            &d.fits,
            0,
            st,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::reco::synthetic::detector;

    /// A backend worker thread can own the engine.
    #[test]
    fn the_engine_can_move_to_a_worker_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<GpuCloneEngine>();
    }

    fn track(planes: &[u16]) -> (Vec<FitHit>, FitOutput) {
        let hits = planes
            .iter()
            .map(|&p| FitHit {
                plane: p,
                x_mm: f32::from(p),
                y_mm: 0.0,
            })
            .collect();
        (hits, FitOutput::default())
    }

    /// A batch beyond any limit, or with a hit past the last plane, is refused with the
    /// limit it exceeds; one within them gives its counts.
    #[test]
    fn batches_are_checked_against_the_limits_before_copying() {
        let limits = CloneLimits {
            max_events: 2,
            max_tracks_per_event: 3,
            max_hits_per_track: 4,
        };
        assert!(limits.validate().is_ok());
        let (h4, f) = track(&[0, 1, 2, 3]);
        let (h5, _) = track(&[0, 1, 2, 3, 4]);
        let (bad, _) = track(&[0, 8]);
        let t4 = CloneTrack { hits: &h4, fit: &f };
        let ok: &[CloneTrack] = &[t4, t4, t4];
        let shape = check_batch(&limits, 8, &[ok, ok]).unwrap();
        assert_eq!(
            shape,
            BatchShape {
                n_events: 2,
                n_tracks: 6,
                n_hits: 24
            }
        );
        let limit_of = |r: Result<BatchShape, CloneError>| match r {
            Err(CloneError::Overflow { limit, got, max }) => Some((limit, got, max)),
            _ => None,
        };
        assert_eq!(
            limit_of(check_batch(&limits, 8, &[ok, ok, ok])),
            Some((CloneLimit::Events, 3, 2))
        );
        let four: &[CloneTrack] = &[t4; 4];
        assert_eq!(
            limit_of(check_batch(&limits, 8, &[ok, four])),
            Some((CloneLimit::TracksPerEvent, 4, 3))
        );
        let long: &[CloneTrack] = &[CloneTrack { hits: &h5, fit: &f }];
        assert_eq!(
            limit_of(check_batch(&limits, 8, &[long])),
            Some((CloneLimit::HitsPerTrack, 5, 4))
        );
        let off: &[CloneTrack] = &[
            t4,
            CloneTrack {
                hits: &bad,
                fit: &f,
            },
        ];
        assert!(matches!(
            check_batch(&limits, 8, &[ok, off]),
            Err(CloneError::BadPlane {
                event: 1,
                track: 1,
                plane: 8,
                n_planes: 8
            })
        ));
        for bad in [
            CloneLimits {
                max_events: 0,
                ..limits
            },
            CloneLimits {
                max_tracks_per_event: 1 << 20,
                max_events: 1 << 10,
                max_hits_per_track: 32,
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    /// Packing lays the events' tracks and hits one after the other, with their offsets.
    #[test]
    fn batches_pack_in_the_kernels_layout() {
        let (h3, mut f) = track(&[0, 2, 5]);
        f.z_mm = 300.0;
        f.state = [1.0, 2.0, 3.0, 4.0, 5.0];
        f.cov[14] = 0.25;
        let (h2, g) = track(&[6, 7]);
        let a: &[CloneTrack] = &[CloneTrack { hits: &h3, fit: &f }];
        let b: &[CloneTrack] = &[CloneTrack { hits: &h2, fit: &g }, a[0]];
        let events = [a, &[], b];
        let shape = check_batch(&CloneLimits::default(), 8, &events).unwrap();
        let (mut es, mut ts) = (vec![9u32; 4], vec![9u32; 4]);
        let (mut p, mut x, mut y) = (vec![0u32; 8], vec![0f32; 8], vec![0f32; 8]);
        let mut fits = vec![0f64; 3 * FIT_WORDS];
        pack_batch(
            &events,
            shape,
            BatchArrays {
                event_start: &mut es,
                track_hit_start: &mut ts,
                hit_plane: &mut p,
                hit_x: &mut x,
                hit_y: &mut y,
                fits: &mut fits,
            },
        );
        assert_eq!(es, [0, 1, 1, 3]);
        assert_eq!(ts, [0, 3, 5, 8]);
        assert_eq!(p, [0, 2, 5, 6, 7, 0, 2, 5]);
        assert_eq!(x, [0.0, 2.0, 5.0, 6.0, 7.0, 0.0, 2.0, 5.0]);
        assert_eq!(fits[..6], [300.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(fits[2 * FIT_WORDS..2 * FIT_WORDS + 6], fits[..6]);
        assert_eq!(fits[FIT_WORDS - 1], 0.25);
    }

    /// The tables carry the CPU's cuts and field unchanged.
    #[test]
    fn tables_carry_the_cpu_cuts() {
        let det = detector(8, [0.1, 1.0, -0.2], 0.003, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let cuts = CloneCuts::new(&geo, &cfg);
        let t = CloneTables::new(&geo, &cfg);
        assert_eq!(
            t.plane_z,
            det.planes.iter().map(|p| p.z_mm).collect::<Vec<_>>()
        );
        assert_eq!(t.ints[..3], [8, 5, 0]);
        assert_eq!(
            t.doubles[..8],
            [
                cuts.bend_x,
                cuts.bend_y,
                cuts.step_mm,
                cfg.clone_window_mm,
                K_GEV_PER_T_MM,
                0.1,
                1.0,
                -0.2
            ]
        );
        assert!(cuts.bend_x != 0.0 && cuts.bend_y != 0.0);
    }
}
