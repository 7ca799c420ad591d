//! The cellular automaton's track finding on the GPU, over a batch of events: the steps of
//! [`crate::tracking::ca`] (the CPU finder, the reference) as kernels in `kernels/`, one
//! file per step and named as the CPU's: `ca_hit_sorting.cu`, `ca_doublets.cu`,
//! `ca_triplets.cu`, `ca_neighbours.cu`, `ca_evolution.cu`, with what they share
//! (layouts, the per-event scan, the batch budget) in `ca_common.cuh`. This stage runs the
//! full (unseeded) search of one pass on an event's fresh hits, as
//! [`crate::tracking::ca::doublets::find_doublets`],
//! [`crate::tracking::ca::triplets::find_triplets`],
//! [`crate::tracking::ca::neighbours::find_neighbours`] and
//! [`crate::tracking::ca::evolution::evolve`] make it with the same `reach`; per event its
//! sorted hits, doublets, triplets, neighbour links and levels are the CPU's arrays, index
//! for index. Then, on those arrays, the candidate step of the pass
//! ([`GpuCaEngine::select_candidates`], `ca_candidates.cu`), as
//! [`crate::tracking::ca::candidates::extract_and_select`] makes it: the same accepted
//! tracks, in the same order, with the same fits and used hits. The first pass's dead
//! ends (`ca_dead_ends.cu`, as [`crate::tracking::ca::triplets::prune_dead_ends`]) and a
//! later pass on the hits the earlier one left ([`GpuCaEngine::run_pass`] with the tables
//! of another reach: the doublet step's windows search a copy of the free hits only,
//! `ca_free_hits`, as the CPU's `free_hits`) complete the finder's passes;
//! [`GpuCaEngine::read_tracks`] packs every event's accepted tracks (`ca_tracks.cu`), runs
//! clone suppression on them in place and reads them back.
//! [`super::tracking::GpuTracker`] puts the passes together as `Reconstructor` does.
//!
//! # Design
//!
//! **Batch and arenas.** A batch is up to [`CaLimits::max_events`] events whose hits go up
//! once, concatenated (structure of arrays: x, y, plane; `hit_start[e]` the first hit of
//! event `e`). Every array of the steps is a per-batch arena allocated once in
//! [`GpuCaEngine::new`] from [`CaLimits`] (hits, doublets, triplets, neighbour links per
//! batch; the grid's cells per event): nothing is allocated per batch. Events are placed
//! in an arena one after the other (`base[e]`, `n[e]`), so a batch of small events and
//! one of a few busy ones use the same memory.
//!
//! **Tables from the CPU finder.** The kernels derive no cut, window or field value: the
//! per-plane grid and doublet windows (`PlaneWindows`, built by the CPU's own
//! constructor for the pass's reach), the per-plane-pair constants of the triplet step
//! (`FinderGeometry::pair_lanes`), the triplet step's cuts (its `Cuts`), the
//! tent-weighted mean field tables ([`crate::tracking::ca::bending`]) and the neighbour
//! cut are read from the CPU's structures at set-up ([`CaTables::new`]) and uploaded, so
//! a change to the CPU's cuts or windows reaches the GPU with no change here.
//!
//! **A row of blocks per event.** Each kernel runs on a grid of (blocks per event,
//! events), the blocks of an event striding over its items (hits, doublets, triplets);
//! the blocks per event are chosen per batch so that the batch fills the GPU (about four
//! blocks per multiprocessor), whether it holds a few busy events or many small ones.
//! Items are indexed within the event as the CPU indexes them, so the GPU's arrays for
//! an event are comparable to the CPU's element by element. A counting pass stores every
//! item's count, so the writing pass skips the items that make nothing (most doublets
//! make no triplet).
//!
//! **Deterministic by construction.** A step that makes a variable number of outputs per
//! item runs twice: it counts per item, a per-event exclusive scan (`ca_event_scan`: a
//! few blocks per event take its tiles in turn, each adding the sums its predecessors
//! published) gives each item its offset, a budget pass (`ca_event_budget`) places the
//! events in the arena, and the same kernel then writes each item's outputs at its
//! offset, in the CPU's order. Where atomics place things (hits into grid cells,
//! triplets into their right doublet's list), a following pass orders them by key (a
//! hit's rank by x and input index; a list sorted by triplet index). No output depends
//! on the order threads arrive in: repeated runs give the same bytes.
//!
//! **Recorded launches.** A pass's kernels (after its copies and clears, which follow the
//! launch's hits) and a candidate step's are recorded once per batch size and pass as a
//! CUDA graph and replayed with one call ([`GpuCaEngine::set_graphs`]): a launch of a few
//! events holds some 170 kernels, and each launch call costs the host microseconds, more
//! where several trackers share a device. Every argument of a recorded launch follows
//! from the sequence's key; the per-event scans' epochs, new for every scan, count from a
//! device word set on the stream before each sequence.
//!
//! **Bounded, with overflow handed back.** An event whose hits, doublets, triplets or
//! neighbour links exceed the CPU finder's own per-event limit ([`Limits`], where the CPU
//! would drop some) or do not fit in what is left of the batch's arena fails at that step:
//! it is counted per step ([`CaBatchSummary::overflow`]) and marked
//! ([`CaBatchSummary::failed`]), the later steps skip it, and the caller runs that event on
//! the CPU path. Nothing is truncated silently. A device error is returned as a
//! [`GpuError`] for the whole batch (the caller fails it over to the CPU).
//!
//! **Arithmetic.** The kernels are compiled with `--fmad=false` and repeat the CPU's
//! single-precision operations in the same order (the CPU's lanes make no fused
//! multiply-adds either), the doublet slopes and neighbour cut in double as the CPU does,
//! so windows and cuts decide alike to the last bit.
//!
//! **Evolution.** Every left neighbour of a triplet starts one plane further upstream, so
//! the levels are set plane by plane, upstream first (one launch per plane): the CPU's
//! fixed point with no iteration to convergence.
//!
//! **Candidates.** The greedy choice is sequential by nature (a track takes hits from the
//! ones after it), so the choice of an event is one block; what does not depend on it
//! runs before, for the whole batch. `ca_candidates_order` sorts an event's end triplets
//! (a block of `ORDER_THREADS` per event) by one 64-bit key (level, kink chi-square by
//! `total_cmp`, index: the CPU's order, no ties); `ca_candidates_chains` walks every end
//! triplet's chain and its fork (the walk does not read the used flags), a thread each;
//! then `ca_candidates` works through an event's end triplets a window of its block's
//! threads at a time: each thread leaves out of one end triplet's walked chains the hits
//! used as of the window's start (what the CPU sees: the flags change only in the
//! choice), the block places them in order with the CPU's limits until the chunk holds
//! `CHUNK` (256) candidates (the rest of the window is filtered again after the choice),
//! the chunk is fitted one candidate per thread with the fit of
//! `kalman_fit.cu` (a device function, with the fitter's own tables,
//! [`super::tracking_fit::FitTables`]), staged in shared memory and ranked by the block,
//! and the block's first warp makes the choice (each candidate's hits checked and taken
//! by its lanes together; refits and second chances in one lane). The second round
//! ([`FinderConfig::divert_chains`]) runs the same two kernels again: the walks read the
//! used flags as the first round left them (a chain that left no taken hit is not walked
//! again, `NO_CHAIN`), and the choice appends.
//! Candidates (their hits as the event's input indices), fits and accepted tracks live in
//! per-event shares of arenas sized from [`CaLimits`] and stay on the device across
//! passes (`append`); the used flags are per input hit. An event where the CPU would count
//! a candidate or track overflow, or that outgrows its share, fails with
//! [`CaStep::Candidates`].
//!
//! # What is left
//!
//! The seeded first pass (`follow_seeds`): the GPU runs the full search, whose tracks are
//! the seeded pass's (the CPU's test `following_the_seeds_finds_the_tracks_of_the_full_search`).
//! The trigger lines run on the host on the tracks that come back. For speed
//! (`bench/RESULTS.md`, "Tracking on the GPU, first steps" and "end to end"): the doublet
//! continuation search is one thread per left doublet with loops of different lengths;
//! the per-event scans and the one-thread budget dominate batches of small events; the
//! next batch's packing and upload do not overlap this one's steps yet; [`GpuCaEngine::run`]
//! returns its summary in fresh vectors (a caller-owned summary would keep the hot path
//! free of allocation); and the candidate step's chunks run one after the other in one
//! block per event, so a batch of a few central events (some 2,000 tracks, 35 chunks
//! each) keeps a few multiprocessors busy for milliseconds (`bench/RESULTS.md`).

use std::sync::Arc;

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaFunction, CudaStream};

use super::nvrtc::{KernelCache, LoadedModule};
use super::runtime::{copy_to_device, copy_to_host, DeviceBuffer, Graph, PinnedBuffer};
use super::tracking_clones::{BatchShape as CloneShape, DeviceCloneBatch, GpuCloneEngine};
use super::tracking_fit::FitTables;
use super::{driver, GpuDevice, GpuError, KernelModule};
use crate::frame::HitRecord;
use crate::tracking::ca::bending::NODES;
use crate::tracking::ca::cuts::{FinderConfig, Limits, MomentumCut};
use crate::tracking::ca::doublets::PlaneWindows;
use crate::tracking::ca::exchange::ExchangeCuts;
use crate::tracking::ca::first_hits::FirstHitCuts;
use crate::tracking::ca::{Doublet, FinderGeometry, Triplet, MAX_REACH};
use crate::tracking::geometry::Field;
use crate::tracking::kalman::{FitOutput, KalmanFitter};
use crate::tracking::propagate::K_GEV_PER_T_MM;

/// The kernels of the steps, one file each, compiled together as one module.
const COMMON: &str = include_str!("../../kernels/ca_common.cuh");
const STEPS: [&str; 11] = [
    include_str!("../../kernels/ca_hit_sorting.cu"),
    include_str!("../../kernels/ca_doublets.cu"),
    include_str!("../../kernels/ca_triplets.cu"),
    include_str!("../../kernels/ca_dead_ends.cu"),
    include_str!("../../kernels/ca_neighbours.cu"),
    include_str!("../../kernels/ca_evolution.cu"),
    // The fit of one candidate as a device function, then the candidate step that uses it.
    include_str!("../../kernels/kalman_fit.cu"),
    include_str!("../../kernels/ca_candidates.cu"),
    include_str!("../../kernels/ca_tracks.cu"),
    // The first hits against the origin on the packed tracks (uses the fit and tent_at).
    include_str!("../../kernels/ca_first_hits.cu"),
    // The exchange of segments on the packed tracks (uses the fit and the first-hit
    // step's sorts).
    include_str!("../../kernels/ca_exchange.cu"),
];
/// The windows and cuts must round as the CPU's: no fused multiply-adds.
const KERNEL_OPTIONS: [&str; 1] = ["--fmad=false"];

/// The module the engine compiles: the common header, then the steps.
pub fn kernel_module() -> KernelModule {
    let mut source = String::from(COMMON);
    for s in STEPS {
        source.push('\n');
        source.push_str(s);
    }
    KernelModule {
        name: "tracking_ca.cu",
        source,
        options: &KERNEL_OPTIONS,
        engine: file!(),
    }
}

/// Threads per block (CA_THREADS in ca_common.cuh).
const THREADS: u32 = 256;
/// Threads of the per-event scan's blocks (SCAN_THREADS in ca_common.cuh).
const SCAN_THREADS: u32 = 256;
/// Items of one tile of the per-event scan (SCAN_TILE in ca_common.cuh).
const SCAN_TILE: usize = SCAN_THREADS as usize * 8;
/// Blocks of the per-event scan per multiprocessor, over the batch.
const SCAN_BLOCKS_PER_SM: u32 = 4;
/// Most blocks of the per-event scan per event: more only wait on each other's tickets
/// and sums (`bench/RESULTS.md`).
const SCAN_MAX_BLOCKS: u32 = 32;
/// Epochs of the per-event scan's status words (SCAN_EPOCH_BITS in ca_common.cuh).
const SCAN_EPOCHS: u32 = 1 << 30;
/// Most per-event scans in one recorded sequence of launches (a pass has seven).
const SCAN_SEQUENCE_MAX: u32 = 64;
/// Recorded sequences kept per engine (one per pass or candidate step and batch size);
/// the oldest goes first.
const GRAPH_CACHE: usize = 512;

/// What a recorded sequence of launches was recorded for: every argument of its
/// launches follows from it (and from the engine, whose arenas and tables stay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SequenceKey {
    /// A pass's steps after its copies ([`GpuCaEngine::pass_kernels`]).
    Pass {
        events: u32,
        first: bool,
        opts: PassOptions,
    },
    /// The candidate step ([`GpuCaEngine::candidate_kernels`]).
    Candidates {
        events: u32,
        min_hits: usize,
        append: bool,
        small: bool,
    },
}

/// The candidate step asked of an engine built without the fitter's tables.
fn no_fitter() -> GpuError {
    GpuError::Config(
        "the CA engine was built without a fitter: build it with GpuCaEngine::with_fitter for the candidate step".into(),
    )
}

/// A recorded sequence, with the per-event scans and kernels it launches.
struct Sequence {
    key: SequenceKey,
    graph: Graph,
    scans: u32,
    kernels: u32,
}
/// Threads per event of the candidate step (CAND_THREADS in ca_candidates.cu).
const CAND_THREADS: u32 = 256;
/// Threads per event of the candidate step in its smaller blocks, two to a
/// multiprocessor (CAND_THREADS_SMALL, `ca_candidates_small`).
const CAND_THREADS_SMALL: u32 = 128;

/// The blocks the candidate step runs in (the same results in either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CandidateBlocks {
    /// Blocks of `CAND_THREADS` (256) where the launch has no more events than the device
    /// has multiprocessors (each event's block has one to itself: a chunk's fits in one
    /// round), else of `CAND_THREADS_SMALL` (128: two events to a multiprocessor, one's
    /// serial choice beside the other's fits; 16-37 % more minimum-bias events/s,
    /// `bench/RESULTS.md`).
    #[default]
    Auto,
    /// Blocks of 256 threads.
    Large,
    /// Blocks of 128 threads.
    Small,
}
/// Words per fit in the fit arena (FIT_WORDS in ca_candidates.cu, the fit kernel's
/// output words).
const FIT_WORDS: usize = super::tracking_fit::OUT_WORDS;

// Table layouts (ca_common.cuh).
const PLF: usize = 34;
const PLI: usize = 8;
const PLD: usize = 4;
const PRF: usize = 20;
const PRI: usize = 4;
const G_N: usize = 22;
const TENT_FLOATS: usize = 4 + NODES * NODES * 3;

/// The step at which an event left the GPU path (FAIL_* in ca_common.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaStep {
    Hits,
    Doublets,
    Triplets,
    Neighbours,
    /// Candidate extraction, fit and choice: the CPU would count a candidate or track
    /// overflow, or the event's candidates exceed its share of the batch's arenas.
    Candidates,
}

impl CaStep {
    pub const ALL: [CaStep; 5] = [
        CaStep::Hits,
        CaStep::Doublets,
        CaStep::Triplets,
        CaStep::Neighbours,
        CaStep::Candidates,
    ];

    fn code(self) -> u32 {
        match self {
            CaStep::Hits => 1,
            CaStep::Doublets => 2,
            CaStep::Triplets => 3,
            CaStep::Neighbours => 4,
            CaStep::Candidates => 5,
        }
    }

    fn from_code(c: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == c)
    }

    /// The `step` label of `trigd_tracking_overflow_total`.
    pub fn name(self) -> &'static str {
        match self {
            CaStep::Hits => "hits",
            CaStep::Doublets => "doublets",
            CaStep::Triplets => "triplets",
            CaStep::Neighbours => "neighbours",
            CaStep::Candidates => "candidates",
        }
    }
}

/// Doublets per hit whose second hits the doublet count keeps for the write
/// (`kernels/ca_doublets.cu`, `DBL_CACHE`): a hit with more is scanned again.
pub const DBL_CACHE: usize = 16;

/// Blocks of [`THREADS`] per multiprocessor that the doublet and triplet kernels are
/// bounded to (`ITEM_MIN_BLOCKS` in `kernels/ca_common.cuh`): their grids are one wave of
/// them over the batch's events.
const ITEM_BLOCKS_PER_SM: u32 = 4;
/// Threads of `ca_candidates_order`'s blocks (ORDER_THREADS in kernels/ca_candidates.cu).
const ORDER_THREADS: u32 = 1024;

/// The sizes of a batch's arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaLimits {
    pub max_events: usize,
    /// Hits of all the batch's events together.
    pub max_hits: usize,
    pub max_doublets: usize,
    pub max_triplets: usize,
    pub max_neighbours: usize,
    /// Track candidates (with their fits and the accepted list) and their hits, of all
    /// the batch's events together: each event gets an equal share, kept across passes.
    pub max_candidates: usize,
    pub max_candidate_hits: usize,
    /// Hits of the walked chains of every end triplet (and of its fork), of all the
    /// batch's events together (each event's placed after the one before).
    pub max_chain_hits: usize,
}

impl Default for CaLimits {
    /// 512 events, 4 Mi hits (some 250 central events), 16 Mi doublets and triplets, 32
    /// Mi neighbour links, 1 Mi candidates (2,048 per event in a full batch) of 16 Mi
    /// hits, 32 Mi hits of walked chains: about 3.8 GiB with the grid of 10 planes of 8 x
    /// 128 cells.
    fn default() -> Self {
        CaLimits {
            max_events: 512,
            max_hits: 1 << 22,
            max_doublets: 1 << 24,
            max_triplets: 1 << 24,
            max_neighbours: 1 << 25,
            max_candidates: 1 << 20,
            max_candidate_hits: 1 << 24,
            max_chain_hits: 1 << 25,
        }
    }
}

impl CaLimits {
    /// Bytes of device memory for the arenas, with `n_bins` grid cells per event.
    pub fn device_bytes(&self, n_bins: usize) -> usize {
        // Per candidate: its record, fit and accepted slot; packed out, its hit range
        // and fit; for the clone step, its first hit, fit in double and mark. Per
        // candidate hit: the hit, packed out, and the clone step's plane, x and y.
        let per_candidate = (4 + FIT_WORDS + 1) + (2 + FIT_WORDS) + (2 + 2 * CLONE_FIT_WORDS);
        4 * ((16 + DBL_CACHE) * self.max_hits
            + 4 * self.max_events * (n_bins + 1)
            + 25 * self.max_events
            + 2
            + 11 * self.max_doublets
            // The per-event scan's status words and tickets (64 bits each).
            + 2 * (self.scan_tiles(n_bins) + self.max_events)
            + 26 * self.max_triplets
            + self.max_neighbours
            + per_candidate * self.max_candidates
            + 5 * self.max_candidate_hits
            + self.max_chain_hits)
    }

    /// Status words of the per-event scan: one per tile of the largest array it scans
    /// (cells, sorted hits, doublets or triplets of the batch), and one more per event.
    fn scan_tiles(&self, n_bins: usize) -> usize {
        let items = (self.max_events * (n_bins + 1))
            .max(self.max_hits)
            .max(self.max_doublets)
            .max(self.max_triplets);
        items / SCAN_TILE + self.max_events + 1
    }

    /// Bytes of device memory for the first-hit step's scratch, where it runs on the
    /// device ([`GpuCaEngine::set_first_hits`]).
    pub fn first_hit_bytes(&self) -> usize {
        FirstHitsDevice::scratch_bytes(self)
    }

    /// Bytes of device memory for the exchange step's scratch with `n_planes` planes, where
    /// it runs on the device ([`GpuCaEngine::set_exchange`]).
    pub fn exchange_bytes(&self, n_planes: usize) -> usize {
        ExchangeDevice::scratch_bytes(self, n_planes)
    }

    /// Each event's share of the candidate arenas in a batch of `n_events`: candidates
    /// (also fits and accepted tracks) and candidate hits.
    pub fn candidate_share(&self, n_events: usize) -> (usize, usize) {
        let n = n_events.max(1);
        (self.max_candidates / n, self.max_candidate_hits / n)
    }

    fn validate(&self) -> Result<(), GpuError> {
        let all = [
            self.max_events,
            self.max_hits,
            self.max_doublets,
            self.max_triplets,
            self.max_neighbours,
            self.max_candidates,
            self.max_candidate_hits,
            self.max_chain_hits,
        ];
        if all.contains(&0) || all.iter().any(|&v| v > (u32::MAX / 2) as usize) {
            return Err(GpuError::Config(format!(
                "tracking arena limits must be between 1 and 2^31 (got {self:?})"
            )));
        }
        // Events are the grid's second dimension.
        if self.max_events > 65_535 {
            return Err(GpuError::Config(format!(
                "at most 65535 events per tracking batch (got {})",
                self.max_events
            )));
        }
        Ok(())
    }
}

/// The CPU finder's windows, cuts and field tables, laid out for the kernels
/// (ca_common.cuh). Built from the CPU's own structures: nothing is derived here.
#[derive(Debug, Clone)]
pub struct CaTables {
    pub n_planes: usize,
    pub n_bins: usize,
    pub reach: usize,
    /// Per plane: grid, doublet windows, bending lever.
    pub plane_f32: Vec<f32>,
    pub plane_i32: Vec<i32>,
    pub plane_f64: Vec<f64>,
    /// Per plane pair: [`crate::tracking::ca::PairLanes`], and its tent tables' indices.
    pub pair_f32: Vec<f32>,
    pub pair_i32: Vec<i32>,
    /// The tent tables, [`TENT_FLOATS`] floats each.
    pub tents: Vec<f32>,
    /// Window limits and the triplet step's cuts.
    pub globals: Vec<f32>,
    pub neighbour_chi2_max: f64,
    /// The candidates' chi-square per degree of freedom cut.
    pub max_chi2_ndf: f64,
    /// The candidate step's second round ([`FinderConfig::divert_chains`]).
    pub divert_chains: bool,
    /// Per-event limits of the CPU finder.
    pub limits: Limits,
    /// Per plane: the exit margin and half sizes of [`FinderGeometry::may_leave`] (the
    /// dead-end step's, at the pass's momentum).
    pub exits: Vec<f32>,
}

impl CaTables {
    /// The tables of one pass with doublets on planes up to `reach` apart (1 to
    /// [`MAX_REACH`]).
    pub fn new(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize) -> Self {
        let reach = reach.clamp(1, MAX_REACH);
        let n = geo.planes.len();
        let mut plane_f32 = vec![0.0f32; n * PLF];
        let mut plane_i32 = vec![0i32; n * PLI];
        let mut plane_f64 = vec![0.0f64; n * PLD];
        let mut globals = vec![0.0f32; G_N];
        for (i, g) in geo.planes.iter().enumerate() {
            let pw = PlaneWindows::new(geo, cfg, i, reach);
            let f = &mut plane_f32[i * PLF..(i + 1) * PLF];
            f[0] = g.half_f32[0];
            f[1] = g.half_f32[1];
            f[2] = g.bin_scale_f32[0];
            f[3] = g.bin_scale_f32[1];
            f[4] = if pw.pointing { 1.0 } else { 0.0 };
            f[5] = pw.inv_lever_a;
            f[6] = pw.ms;
            f[7] = geo.bending.inv_lever.get(i).copied().unwrap_or(0.0);
            f[32] = pw.hz_inv_a;
            f[33] = pw.box_scale;
            let ints = &mut plane_i32[i * PLI..(i + 1) * PLI];
            ints[0] = g.bins_x as i32;
            ints[1] = g.bins_y as i32;
            ints[2] = g.bin_offset as i32;
            ints[3] = pw.n_target as i32;
            for k in 0..pw.n_target {
                let t = &pw.targets[k];
                let r = &mut f[8 + 8 * k..16 + 8 * k];
                r[..7].copy_from_slice(&[t.dz, t.bend, t.meas_x, t.meas_y, t.b[0], t.b[1], t.b[2]]);
                ints[4 + k] = t.plane as i32;
                plane_f64[i * PLD + k] = t.inv_dz;
            }
            if i == 0 {
                globals[0] = pw.max_t[0];
                globals[1] = pw.max_t[1];
                globals[2] = pw.max_c[0];
                globals[3] = pw.max_c[1];
                globals[4] = pw.sf_max;
                globals[5] = pw.origin_half[0];
                globals[6] = pw.origin_half[1];
                globals[7] = pw.k_qop;
                globals[20] = pw.origin_c[0];
                globals[21] = pw.origin_c[1];
            }
        }
        let cuts = crate::tracking::ca::triplets::cuts(geo, cfg, reach);
        globals[8] = cuts.qop_max;
        globals[9] = cuts.n_sigma;
        globals[10] = cuts.mass2;
        globals[11] = cuts.sf2_max;
        globals[12] = cuts.chi2_max;
        globals[13] = cuts.fit_momentum;
        if let Some(b) = cuts.uniform {
            globals[14] = 1.0;
            globals[15..18].copy_from_slice(&b);
        }
        globals[18] = K_GEV_PER_T_MM as f32;
        // globals[19]: the fewest sorted hits of an event the pass runs on (every event;
        // see `for_events_of`).
        let mut pair_f32 = vec![0.0f32; n * n * PRF];
        let mut pair_i32 = vec![-1i32; n * n * PRI];
        let mut tents = Vec::new();
        let mut add_tent = |t: &crate::tracking::ca::bending::TentTable| -> i32 {
            let (t0, inv_step, b) = t.nodes();
            let k = tents.len() / TENT_FLOATS;
            tents.extend_from_slice(&[t0[0], t0[1], inv_step[0], inv_step[1]]);
            tents.extend(b.iter().flatten());
            k as i32
        };
        let map = !matches!(geo.field, Field::Uniform { .. });
        for i in 0..n {
            for j in (i + 1)..n {
                let p = &geo.pair_lanes[i * n + j];
                let f = &mut pair_f32[(i * n + j) * PRF..(i * n + j + 1) * PRF];
                f[..8].copy_from_slice(&[
                    p.pointing,
                    p.inv_zi,
                    p.two_inv_zj,
                    p.hard_kx,
                    p.hard_ky,
                    p.kvar_ms_per_qop2,
                    p.kvar_res,
                    p.n_triples as f32,
                ]);
                f[8..11].copy_from_slice(&p.half);
                f[11..14].copy_from_slice(&p.theta2_per_qop2);
                f[14..17].copy_from_slice(&p.var_res);
                f[17] = p.hard_slope;
                f[18] = p.kappa_rel;
                if map {
                    let ints = &mut pair_i32[(i * n + j) * PRI..(i * n + j + 1) * PRI];
                    if let Some(t) = geo.bending.pointing(i, j) {
                        ints[0] = add_tent(t);
                    }
                    for s in 0..MAX_REACH {
                        if let Some(t) = geo.bending.triple(i, j, s) {
                            ints[1 + s] = add_tent(t);
                        }
                    }
                }
            }
        }
        CaTables {
            n_planes: n,
            n_bins: geo.n_bins,
            reach,
            plane_f32,
            plane_i32,
            plane_f64,
            pair_f32,
            pair_i32,
            tents,
            globals,
            neighbour_chi2_max: cfg.neighbour_chi2_max,
            max_chi2_ndf: cfg.max_chi2_ndf,
            divert_chains: cfg.divert_chains,
            limits: cfg.limits.clone(),
            exits: geo.planes.iter().flat_map(|p| p.exit).collect(),
        }
    }

    /// The pass runs on events of at least `min_hits` sorted hits only (the others make
    /// no doublets in it, hence nothing), as the CPU runs its stiff-track pass on busy
    /// events only.
    pub fn for_events_of(mut self, min_hits: usize) -> Self {
        self.globals[19] = min_hits.min(u32::MAX as usize) as f32;
        self
    }
}

/// What a batch gave, per event (small: read back after every batch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaBatchSummary {
    /// Per event: the step it failed at (to be run on the CPU), or `None`.
    pub failed: Vec<Option<CaStep>>,
    /// Events failed per step, in [`CaStep::ALL`]'s order.
    pub overflow: [u32; 5],
    /// Per event: sorted hits, doublets, triplets, neighbour links (0 where failed).
    pub hits: Vec<u32>,
    pub doublets: Vec<u32>,
    pub triplets: Vec<u32>,
    pub neighbours: Vec<u32>,
    /// Per event: candidates and accepted tracks so far (all passes; 0 where failed, and
    /// after [`GpuCaEngine::run`] before any candidate step).
    pub candidates: Vec<u32>,
    pub tracks: Vec<u32>,
}

/// Pinned host memory the packed tracks come back to.
struct TracksHost {
    /// Per event: tracks, hits, first track, first hit.
    counts: PinnedBuffer<u32>,
    tracks: PinnedBuffer<[u32; 2]>,
    fits: PinnedBuffer<u32>,
    hits: PinnedBuffer<u32>,
    marks: PinnedBuffer<u32>,
}

/// Doubles per track of the clone step's fits.
const CLONE_FIT_WORDS: usize = super::tracking_clones::FIT_WORDS;

/// The accepted tracks of every event of a batch, packed ([`GpuCaEngine::read_tracks`]):
/// event `e`'s tracks are `first_track[e]..first_track[e + 1]`. The tracks themselves stay
/// in the engine's pinned buffers they were read back to (no second copy on the host):
/// [`GpuCaEngine::tracks_view`] reads them. A failed event has none.
#[derive(Debug, Clone, Default)]
pub struct BatchTracks {
    pub first_track: Vec<u32>,
    /// Tracks and hits of the batch.
    pub n_tracks: usize,
    pub n_hits: usize,
    /// Whether the clone step marked the tracks.
    pub clones_marked: bool,
    /// Whether the first hits were chosen again against the origin on the device
    /// ([`GpuCaEngine::set_first_hits`]): the tracks below the minimum momentum are then
    /// marked too (mark 2) and the tracks are as the CPU's step leaves them.
    pub first_hits_done: bool,
    /// Per event where `first_hits_done`: non-zero where the event was beyond the step's
    /// limits on the device (its tracks as the finder left them: run it on the CPU).
    pub first_hits_failed: Vec<u32>,
    /// Whether the segments of crossing tracks were exchanged on the device
    /// ([`GpuCaEngine::set_exchange`]): the tracks below the minimum momentum are then
    /// marked (mark 2) before it, and the tracks are as the CPU's step leaves them.
    pub exchange_done: bool,
    /// Per event where `exchange_done`: non-zero where the event was beyond the step's
    /// limits on the device (its tracks as the finder left them: run it on the CPU).
    pub exchange_failed: Vec<u32>,
}

/// The accepted tracks of a batch where they were read back to ([`GpuCaEngine::tracks_view`]):
/// track `t`'s hits (the event's input indices, upstream first) are
/// `hits[track_hits[t].0..][..track_hits[t].1]`, its fit `fit(t)`, its clone mark
/// `is_clone(t)`.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub first_track: &'a [u32],
    pub track_hits: &'a [[u32; 2]],
    pub fits: &'a [u32],
    pub hits: &'a [u32],
    /// Per track: non-zero where the clone step marked it, or (2) where the first-hit step
    /// on the device found it below the minimum momentum (empty without a clone step).
    pub marks: &'a [u32],
}

/// Hits of a batch from which they are laid out for the copy up on several host threads.
const PACK_THREADS_FROM_HITS: usize = 1 << 18;

/// Lays the hits of `events` out one after the other in `xs`, `ys`, `ps` (as long as the
/// hits together), the events dealt in chunks to `threads` host threads.
fn pack_hits(
    events: &[&[HitRecord]],
    xs: &mut [f32],
    ys: &mut [f32],
    ps: &mut [u32],
    threads: usize,
) {
    let pack = |evs: &[&[HitRecord]], xs: &mut [f32], ys: &mut [f32], ps: &mut [u32]| {
        let mut k = 0;
        for ev in evs {
            for h in ev.iter() {
                xs[k] = h.x_mm;
                ys[k] = h.y_mm;
                ps[k] = h.plane as u32;
                k += 1;
            }
        }
    };
    if threads <= 1 || events.len() < 2 {
        pack(events, xs, ys, ps);
        return;
    }
    let chunk = events.len().div_ceil(threads);
    std::thread::scope(|s| {
        let (mut xr, mut yr, mut pr) = (xs, ys, ps);
        for evs in events.chunks(chunk) {
            let len: usize = evs.iter().map(|e| e.len()).sum();
            let (xa, xb) = std::mem::take(&mut xr).split_at_mut(len);
            let (ya, yb) = std::mem::take(&mut yr).split_at_mut(len);
            let (pa, pb) = std::mem::take(&mut pr).split_at_mut(len);
            (xr, yr, pr) = (xb, yb, pb);
            s.spawn(move || pack(evs, xa, ya, pa));
        }
    });
}

/// A device fit record (`FIT_WORDS` words: state, covariance, z, chi-square in float32
/// bits, then ndf and the ok flag) as the CPU's [`FitOutput`].
fn fit_of_words(w: &[u32]) -> FitOutput {
    let f = |i: usize| f64::from(f32::from_bits(w[i]));
    FitOutput {
        state: std::array::from_fn(f),
        cov: std::array::from_fn(|i| f(5 + i)),
        z_mm: f(20),
        chi2: f(21),
        ndf: w[22].min(u16::MAX as u32) as u16,
        ok: w[23] != 0,
    }
}

impl BatchView<'_> {
    /// Tracks of event `e`.
    pub fn tracks_of(&self, e: usize) -> std::ops::Range<usize> {
        self.first_track[e] as usize..self.first_track[e + 1] as usize
    }

    /// Tracks of the batch.
    pub fn n_tracks(&self) -> usize {
        self.track_hits.len()
    }

    /// The hits of track `t`.
    pub fn hits_of(&self, t: usize) -> &[u32] {
        let [at, len] = self.track_hits[t];
        &self.hits[at as usize..at as usize + len as usize]
    }

    /// Whether the clone step marked track `t`.
    pub fn is_clone(&self, t: usize) -> bool {
        self.marks.get(t).is_some_and(|&m| m != 0)
    }

    /// Writes track `t`'s hits and fit into `track` (as the CPU's
    /// [`FitOutput::write_track`]: the fit's single-precision values as they are).
    pub fn write_track(&self, t: usize, track: &mut crate::tracking::track::Track) {
        track.hits.clear();
        track.hits.extend_from_slice(self.hits_of(t));
        let w = &self.fits[t * FIT_WORDS..(t + 1) * FIT_WORDS];
        let f = |i: usize| f32::from_bits(w[i]);
        track.state = crate::tracking::track::TrackState {
            z_mm: f(20),
            x_mm: f(0),
            y_mm: f(1),
            tx: f(2),
            ty: f(3),
            qop: f(4),
        };
        for i in 0..15 {
            track.cov[i] = f(5 + i);
        }
        track.chi2 = f(21);
        track.ndf = w[22].min(u16::MAX as u32) as u16;
    }

    /// The fit of track `t`, as the CPU's [`FitOutput`].
    pub fn fit(&self, t: usize) -> FitOutput {
        fit_of_words(&self.fits[t * FIT_WORDS..(t + 1) * FIT_WORDS])
    }
}

/// One accepted track read back: its hits as the event's input indices, upstream first
/// (as the CPU's `Reconstructor` writes them), and its fit.
#[derive(Debug, Clone, Default)]
pub struct CaTrack {
    pub hits: Vec<u32>,
    pub fit: FitOutput,
}

/// An event's accepted tracks in acceptance order and its per-input-hit used flags (read
/// back for comparison and tests; not the hot path).
#[derive(Debug, Clone, Default)]
pub struct CaEventTracks {
    pub tracks: Vec<CaTrack>,
    pub used: Vec<bool>,
}

impl CaEventTracks {
    /// Every hit index, fit word (floats by their bits) and flag as 32-bit words, for
    /// comparisons to the bit.
    pub fn to_words(&self) -> Vec<u32> {
        let mut w = Vec::new();
        for t in &self.tracks {
            w.push(t.hits.len() as u32);
            w.extend_from_slice(&t.hits);
            let f = &t.fit;
            w.extend(f.state.iter().map(|&v| (v as f32).to_bits()));
            w.extend(f.cov.iter().map(|&v| (v as f32).to_bits()));
            w.extend_from_slice(&[
                (f.z_mm as f32).to_bits(),
                (f.chi2 as f32).to_bits(),
                f.ndf as u32,
                f.ok as u32,
            ]);
        }
        w.extend(self.used.iter().map(|&u| u as u32));
        w
    }
}

/// One event's arrays as the CPU finder's [`crate::tracking::ca::CaBuffers`] holds them
/// after the pass (read back for comparison and tests; not the hot path).
#[derive(Debug, Clone, Default)]
pub struct CaEventResult {
    /// Per sorted hit: its index in the event's input, and the cells' `bin_start`.
    pub input_index: Vec<u32>,
    pub bin_start: Vec<u32>,
    pub doublets: Vec<Doublet>,
    /// Per doublet: the planes it skips.
    pub gap: Vec<u32>,
    /// Per sorted hit: its outgoing doublets `dbl_start[h]..dbl_start[h + 1]`.
    pub dbl_start: Vec<u32>,
    pub triplets: Vec<Triplet>,
    pub left_start: Vec<u32>,
    pub left: Vec<u32>,
    pub has_right: Vec<bool>,
    pub level: Vec<u16>,
}

impl CaEventResult {
    /// The first difference between these arrays and the CPU finder's of the same pass
    /// (`cpu` after its steps), if any: the sorted hits, the doublets and triplets (as
    /// sets first, for a clearer message, then in order, floats to the bit), the
    /// neighbour links and the levels.
    pub fn difference(&self, cpu: &crate::tracking::ca::CaBuffers) -> Option<String> {
        fn first<T: PartialEq + std::fmt::Debug>(what: &str, a: &[T], b: &[T]) -> Option<String> {
            if a.len() != b.len() {
                return Some(format!(
                    "{what}: {} on the GPU, {} on the CPU",
                    a.len(),
                    b.len()
                ));
            }
            let k = a.iter().zip(b).position(|(x, y)| x != y)?;
            Some(format!("{what}[{k}]: GPU {:?}, CPU {:?}", a[k], b[k]))
        }
        let dbl = |d: &Doublet| (d.a, d.b, d.tx.to_bits(), d.ty.to_bits());
        let trip = |t: &Triplet| {
            (
                t.left,
                t.right,
                t.qop.to_bits(),
                t.qop_sigma.to_bits(),
                t.chi2.to_bits(),
            )
        };
        let sorted = |mut v: Vec<(u32, u32)>| {
            v.sort_unstable();
            v
        };
        let cpu_gap: Vec<u32> = cpu.dbl_lanes.gap.iter().map(|&g| g as u32).collect();
        first("input_index", &self.input_index, &cpu.hits.input_index)
            .or_else(|| first("bin_start", &self.bin_start, &cpu.hits.bin_start))
            .or_else(|| {
                first(
                    "doublet (a, b) set",
                    &sorted(self.doublets.iter().map(|d| (d.a, d.b)).collect()),
                    &sorted(cpu.doublets.iter().map(|d| (d.a, d.b)).collect()),
                )
            })
            .or_else(|| {
                let g: Vec<_> = self.doublets.iter().map(dbl).collect();
                let c: Vec<_> = cpu.doublets.iter().map(dbl).collect();
                first("doublets", &g, &c)
            })
            .or_else(|| first("gap", &self.gap, &cpu_gap))
            .or_else(|| first("dbl_start", &self.dbl_start, &cpu.dbl_start))
            .or_else(|| {
                first(
                    "triplet (left, right) set",
                    &sorted(self.triplets.iter().map(|t| (t.left, t.right)).collect()),
                    &sorted(cpu.triplets.iter().map(|t| (t.left, t.right)).collect()),
                )
            })
            .or_else(|| {
                let g: Vec<_> = self.triplets.iter().map(trip).collect();
                let c: Vec<_> = cpu.triplets.iter().map(trip).collect();
                first("triplets", &g, &c)
            })
            .or_else(|| first("left_start", &self.left_start, &cpu.left_start))
            .or_else(|| first("left", &self.left, &cpu.left))
            .or_else(|| first("has_right", &self.has_right, &cpu.has_right))
            .or_else(|| first("level", &self.level, &cpu.level))
    }

    /// Every array as 32-bit words (floats by their bits), for comparisons to the bit.
    pub fn to_words(&self) -> Vec<u32> {
        let mut w = Vec::new();
        w.extend_from_slice(&self.input_index);
        w.extend_from_slice(&self.bin_start);
        for d in &self.doublets {
            w.extend_from_slice(&[d.a, d.b, d.tx.to_bits(), d.ty.to_bits()]);
        }
        w.extend_from_slice(&self.gap);
        w.extend_from_slice(&self.dbl_start);
        for t in &self.triplets {
            w.extend_from_slice(&[
                t.left,
                t.right,
                t.qop.to_bits(),
                t.qop_sigma.to_bits(),
                t.chi2.to_bits(),
            ]);
        }
        w.extend_from_slice(&self.left_start);
        w.extend_from_slice(&self.left);
        w.extend(self.has_right.iter().map(|&b| b as u32));
        w.extend(self.level.iter().map(|&l| l as u32));
        w
    }
}

/// Device time of each kernel of the last profiled batch, milliseconds, in launch order.
pub type KernelTimes = Vec<(&'static str, f64)>;

struct Kernels {
    event_scan: CudaFunction,
    event_budget: CudaFunction,
    bin_hits: CudaFunction,
    place_hits: CudaFunction,
    rank_hits: CudaFunction,
    free_flags: CudaFunction,
    free_hits: CudaFunction,
    doublets: CudaFunction,
    triplets: CudaFunction,
    neighbours_ending: CudaFunction,
    neighbours_sort_ending: CudaFunction,
    neighbours: CudaFunction,
    evolution: CudaFunction,
    dead_ends_clear: CudaFunction,
    dead_ends: CudaFunction,
    dead_ends_gather: CudaFunction,
    dead_ends_copy_back: CudaFunction,
    candidates_order: CudaFunction,
    candidates_chains: CudaFunction,
    candidates: CudaFunction,
    candidates_small: CudaFunction,
    tracks_count: CudaFunction,
    tracks_pack: CudaFunction,
    tracks_clone_input: CudaFunction,
    first_hits: CudaFunction,
    exchange_begin: CudaFunction,
    exchange_fit_changed: CudaFunction,
    exchange_pairs: CudaFunction,
    exchange_pairs_changed: CudaFunction,
    exchange_fit_needed: CudaFunction,
    exchange_evaluate: CudaFunction,
    exchange_choose: CudaFunction,
    exchange_end: CudaFunction,
}

/// A pass's tables on the device (reach-dependent windows and cuts; see [`CaTables`]).
struct DeviceTables {
    tables: CaTables,
    plane_f32: DeviceBuffer<f32>,
    plane_i32: DeviceBuffer<i32>,
    plane_f64: DeviceBuffer<f64>,
    pair_f32: DeviceBuffer<f32>,
    pair_i32: DeviceBuffer<i32>,
    tents: DeviceBuffer<f32>,
    globals: DeviceBuffer<f32>,
    exits: DeviceBuffer<f32>,
}

impl DeviceTables {
    fn new(ctx: &Arc<CudaContext>, tables: CaTables) -> Result<Self, GpuError> {
        let tents = if tables.tents.is_empty() {
            vec![0.0f32; TENT_FLOATS]
        } else {
            tables.tents.clone()
        };
        Ok(DeviceTables {
            plane_f32: DeviceBuffer::from_host(ctx, &tables.plane_f32)?,
            plane_i32: DeviceBuffer::from_host(ctx, &tables.plane_i32)?,
            plane_f64: DeviceBuffer::from_host(ctx, &tables.plane_f64)?,
            pair_f32: DeviceBuffer::from_host(ctx, &tables.pair_f32)?,
            pair_i32: DeviceBuffer::from_host(ctx, &tables.pair_i32)?,
            tents: DeviceBuffer::from_host(ctx, &tents)?,
            globals: DeviceBuffer::from_host(ctx, &tables.globals)?,
            exits: DeviceBuffer::from_host(ctx, &tables.exits)?,
            tables,
        })
    }
}

/// What one pass of the steps does beyond the full search on the event's hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassOptions {
    /// Which of the engine's passes (its tables, in the order of the reaches given to
    /// [`GpuCaEngine::with_passes`]).
    pub pass: usize,
    /// Drop the triplets whose chains cannot reach the last plane or leave the detector
    /// from this plane on ([`crate::tracking::ca::triplets::prune_dead_ends`]).
    pub dead_ends_from_plane: Option<usize>,
    /// Skip the hits marked used (the tracks of the earlier pass): a later pass on the
    /// hits already sorted, with no new copy of hits.
    pub skip_used: bool,
}

/// Pairs of prediction and hit of an event's share in the first-hit step's arenas, per
/// candidate slot of its share (`kernels/ca_first_hits.cu`: an event with more goes to the
/// CPU, counted).
pub const FIRST_HIT_PAIRS_PER_SLOT: usize = 4;
/// Words of a pair record (`FhEdge`: the rank's order bits, prediction, pool place).
const FIRST_HIT_PAIR_WORDS: usize = 4;
/// Doubles of the first-hit step's parameters before the planes' (`FHD_PLANES`), and per
/// plane.
const FIRST_HIT_PARAMS: usize = 16;
/// Where among them the bending constant lies (`FHD_K`).
const FIRST_HIT_K: usize = 14;
const FIRST_HIT_PLANE_PARAMS: usize = 4;
/// Threads of the first-hit step's block (`FH_THREADS`).
const FIRST_HIT_THREADS: u32 = 512;
/// Most planes the device step takes (`FH_MAX_PLANES`).
pub const FIRST_HIT_MAX_PLANES: usize = 64;

/// The first-hit step's parameters as its kernel reads them (`kernels/ca_first_hits.cu`:
/// `FHD_*`, `FHI_*`): doubles and ints, from its cuts, the momentum cut and whether the
/// changed tracks are fitted last with the tracks' own fit.
pub fn first_hit_params(
    cuts: &FirstHitCuts,
    cut: MomentumCut,
    track_fit: bool,
) -> (Vec<f64>, Vec<i32>) {
    let n = cuts.n_planes();
    let mut d = vec![0.0f64; FIRST_HIT_PARAMS + FIRST_HIT_PLANE_PARAMS * n];
    d[0] = cuts.origin_xy_mm[0];
    d[1] = cuts.origin_xy_mm[1];
    d[2] = cuts.origin_z_mm;
    d[3] = cuts.origin_var[0];
    d[4] = cuts.origin_var[1];
    d[5] = cuts.mass2;
    d[6] = cuts.qop_cut;
    d[7] = cuts.chi2_max;
    d[8] = cuts.max_chi2_ndf;
    d[9] = cut.max_qop;
    d[10] = cut.n_sigma;
    let b = cuts.uniform_field();
    d[11..14].copy_from_slice(&b.unwrap_or([0.0; 3]));
    d[FIRST_HIT_K] = K_GEV_PER_T_MM;
    for p in 0..n {
        let o = FIRST_HIT_PARAMS + FIRST_HIT_PLANE_PARAMS * p;
        d[o] = cuts.z_mm[p];
        d[o + 1] = cuts.var_hit[p][0];
        d[o + 2] = cuts.var_hit[p][1];
        d[o + 3] = cuts.theta2_per_qop2[p];
    }
    let i = vec![
        n as i32,
        cuts.min_hits.min(i32::MAX as usize) as i32,
        b.is_some() as i32,
        track_fit as i32,
        cuts.second_hits as i32,
    ];
    (d, i)
}

/// The first-hit step on the device ([`GpuCaEngine::set_first_hits`]): its parameters and
/// scratch, per candidate slot (predictions, changes' fits), per hit (the pool, claims)
/// and per pair.
struct FirstHitsDevice {
    params_f64: DeviceBuffer<f64>,
    params_i32: DeviceBuffer<i32>,
    pred_d: DeviceBuffer<f64>,
    pred_u: DeviceBuffer<u32>,
    pool_h: DeviceBuffer<u32>,
    pool_key: DeviceBuffer<u64>,
    claims: DeviceBuffer<u32>,
    edges: DeviceBuffer<u32>,
    contested: DeviceBuffer<u32>,
    chg_fit: DeviceBuffer<u32>,
    failed: DeviceBuffer<u32>,
    /// The per-event failures read back with the tracks.
    failed_host: PinnedBuffer<u32>,
    /// Most pairs of an event, below its share of the arenas
    /// ([`GpuCaEngine::limit_first_hit_pairs`]).
    pair_limit: usize,
}

impl FirstHitsDevice {
    /// Bytes of its scratch for `limits`.
    fn scratch_bytes(l: &CaLimits) -> usize {
        let per_slot = 8 * 8
            + 8 * 4
            + 2 * FIT_WORDS * 4
            + 2 * FIRST_HIT_PAIRS_PER_SLOT * FIRST_HIT_PAIR_WORDS * 4;
        per_slot * l.max_candidates + 28 * l.max_hits + 4 * l.max_events
    }

    /// `track_fit`: whether the changed tracks are fitted last with the tracks' own fit
    /// ([`GpuCaEngine::set_track_fitter`]).
    fn new(
        ctx: &Arc<CudaContext>,
        cuts: &FirstHitCuts,
        cut: MomentumCut,
        track_fit: bool,
        l: &CaLimits,
    ) -> Result<Self, GpuError> {
        let (d, i) = first_hit_params(cuts, cut, track_fit);
        let slots = l.max_candidates;
        let pairs = FIRST_HIT_PAIRS_PER_SLOT * slots * FIRST_HIT_PAIR_WORDS;
        Ok(FirstHitsDevice {
            params_f64: DeviceBuffer::from_host(ctx, &d)?,
            params_i32: DeviceBuffer::from_host(ctx, &i)?,
            pred_d: DeviceBuffer::new(ctx, 8 * slots)?,
            pred_u: DeviceBuffer::new(ctx, 8 * slots)?,
            // Room for each event's pool sorted (a power of two, at most twice its hits).
            pool_h: DeviceBuffer::new(ctx, 2 * l.max_hits)?,
            pool_key: DeviceBuffer::new(ctx, 2 * l.max_hits)?,
            claims: DeviceBuffer::new(ctx, l.max_hits)?,
            edges: DeviceBuffer::new(ctx, pairs)?,
            contested: DeviceBuffer::new(ctx, pairs)?,
            // Per change, its candidates' fit and its track's fit before the change.
            chg_fit: DeviceBuffer::new(ctx, 2 * FIT_WORDS * slots)?,
            failed: DeviceBuffer::new(ctx, l.max_events)?,
            failed_host: PinnedBuffer::new(ctx, l.max_events)?,
            pair_limit: usize::MAX,
        })
    }
}

/// Threads of the exchange step's kernels with one block per event (`EX_THREADS` in
/// `kernels/ca_exchange.cu`; the others have [`THREADS`], `EX_WIDE_THREADS`).
const EXCHANGE_THREADS: u32 = 512;
/// Blocks per multiprocessor over the batch of the exchange step's kernels with several
/// blocks per event (searches and fits), at most [`EXCHANGE_MAX_BLOCKS`] per event.
const EXCHANGE_BLOCKS_PER_SM: u32 = 4;
const EXCHANGE_MAX_BLOCKS: u32 = 32;
/// Words of the exchange step's state per event (`EX_STATE`).
const EXCHANGE_STATE_WORDS: usize = 8;
/// Most planes the device's exchange step takes (`EX_MAX_PLANES`).
pub const EXCHANGE_MAX_PLANES: usize = 63;
/// Pairs of tracks to try an exchange of, per track of an event (the event's share of the
/// step's arenas; an event with more goes to the CPU, counted). The spectrometer's
/// central events make fewer pairs than tracks in every round.
pub const EXCHANGE_PAIRS_PER_TRACK: usize = 32;
/// Floats and doubles of the exchange step's parameters before the planes'
/// (`EXF_PLANES`, `EXD_PLANES`), and per plane.
const EXCHANGE_F32: usize = 8;
const EXCHANGE_F32_PER_PLANE: usize = 5;
const EXCHANGE_F64: usize = 3;
const EXCHANGE_F64_PER_PLANE: usize = 5;

/// The exchange step's parameters as its kernels read them (`kernels/ca_exchange.cu`:
/// `EXF_*`, `EXD_*`, `EXI_*`): floats, doubles and ints, from its cuts, the momentum cut
/// and whether the tracks have a fit of their own (the exchanged tracks' final fit).
pub fn exchange_params(
    cuts: &ExchangeCuts,
    cut: MomentumCut,
    track_fit: bool,
) -> (Vec<f32>, Vec<f64>, Vec<i32>) {
    let n = cuts.window_mm.len();
    let mut f = vec![0.0f32; EXCHANGE_F32 + EXCHANGE_F32_PER_PLANE * n];
    f[0] = cuts.qop_ref;
    if let Some(jb) = &cuts.bending {
        f[1] = 1.0;
        if let Some(b) = jb.uniform {
            f[2] = 1.0;
            f[3..6].copy_from_slice(&b);
        }
        f[6..8].copy_from_slice(&jb.origin);
    }
    let mut d = vec![0.0f64; EXCHANGE_F64 + EXCHANGE_F64_PER_PLANE * n];
    d[0] = cuts.max_chi2_ndf;
    d[1] = cut.max_qop;
    d[2] = cut.n_sigma;
    for p in 0..n {
        let o = EXCHANGE_F32 + EXCHANGE_F32_PER_PLANE * p;
        f[o] = cuts.res_mm[p];
        f[o + 1] = cuts.scatter_mm[p][0];
        f[o + 2] = cuts.scatter_mm[p][1];
        f[o + 3] = cuts.window_mm[p];
        f[o + 4] = cuts
            .bending
            .as_ref()
            .map_or(0.0, |jb| jb.tables.inv_lever[p]);
        let o = EXCHANGE_F64 + EXCHANGE_F64_PER_PLANE * p;
        d[o] = cuts.z_mm[p];
        d[o + 1] = cuts.kink_var[p];
        d[o + 2] = cuts.res_var[p];
        d[o + 3] = cuts.hit_var[p][0];
        d[o + 4] = cuts.hit_var[p][1];
    }
    let i = vec![
        n as i32,
        cuts.min_hits.min(i32::MAX as usize) as i32,
        track_fit as i32,
        cuts.evidence as i32,
    ];
    (f, d, i)
}

/// The exchange of segments on the device ([`GpuCaEngine::set_exchange`]): its parameters
/// and scratch, per packed track (its working hit list, chi-square, |q/p| bound, q/p, its
/// fit's x, y and their covariance at the first hit, flags, its share of pairs and gains)
/// and per hit
/// (its track); the pairs are found through the grid the hits were sorted into at the
/// launch's start.
struct ExchangeDevice {
    params_f32: DeviceBuffer<f32>,
    params_f64: DeviceBuffer<f64>,
    params_i32: DeviceBuffer<i32>,
    lists: DeviceBuffer<u32>,
    lens: DeviceBuffer<u32>,
    chi2: DeviceBuffer<f32>,
    qop: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    first: DeviceBuffer<f32>,
    owner: DeviceBuffer<u32>,
    pairs: DeviceBuffer<u32>,
    gains: DeviceBuffer<u64>,
    flags: DeviceBuffer<u32>,
    state: DeviceBuffer<u32>,
    /// The events that go on after a round, and its copy on the host.
    active: DeviceBuffer<u32>,
    active_host: PinnedBuffer<u32>,
    failed: DeviceBuffer<u32>,
    failed_host: PinnedBuffer<u32>,
    /// Most pairs of an event, below its share of the arenas
    /// ([`GpuCaEngine::limit_exchange_pairs`]).
    pair_limit: usize,
}

impl ExchangeDevice {
    /// Bytes of its scratch for `limits` and `n_planes`.
    fn scratch_bytes(l: &CaLimits, n_planes: usize) -> usize {
        let per_track = 4 * (n_planes + 10) + EXCHANGE_PAIRS_PER_TRACK * (4 + 2 * 8);
        per_track * l.max_candidates
            + 4 * l.max_hits
            + 4 * (1 + EXCHANGE_STATE_WORDS) * l.max_events
    }

    fn new(
        ctx: &Arc<CudaContext>,
        cuts: &ExchangeCuts,
        cut: MomentumCut,
        track_fit: bool,
        l: &CaLimits,
    ) -> Result<Self, GpuError> {
        let n = cuts.window_mm.len();
        let (f, d, i) = exchange_params(cuts, cut, track_fit);
        let slots = l.max_candidates;
        let pairs = EXCHANGE_PAIRS_PER_TRACK * slots;
        Ok(ExchangeDevice {
            params_f32: DeviceBuffer::from_host(ctx, &f)?,
            params_f64: DeviceBuffer::from_host(ctx, &d)?,
            params_i32: DeviceBuffer::from_host(ctx, &i)?,
            lists: DeviceBuffer::new(ctx, n.max(1) * slots)?,
            lens: DeviceBuffer::new(ctx, slots)?,
            chi2: DeviceBuffer::new(ctx, slots)?,
            qop: DeviceBuffer::new(ctx, slots)?,
            q: DeviceBuffer::new(ctx, slots)?,
            first: DeviceBuffer::new(ctx, 5 * slots)?,
            owner: DeviceBuffer::new(ctx, l.max_hits)?,
            pairs: DeviceBuffer::new(ctx, pairs)?,
            // Room for each event's gains sorted (at most twice its share of pairs).
            gains: DeviceBuffer::new(ctx, 2 * pairs)?,
            flags: DeviceBuffer::new(ctx, slots)?,
            state: DeviceBuffer::new(ctx, EXCHANGE_STATE_WORDS * l.max_events)?,
            active: DeviceBuffer::new(ctx, 1)?,
            active_host: PinnedBuffer::new(ctx, 1)?,
            failed: DeviceBuffer::new(ctx, l.max_events)?,
            failed_host: PinnedBuffer::new(ctx, l.max_events)?,
            pair_limit: usize::MAX,
        })
    }
}

/// The fitter's tables on the device (`FitTables`, as the fit engine uploads them).
struct FitDevice {
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
}

impl FitDevice {
    fn new(ctx: &Arc<CudaContext>, fitter: &KalmanFitter) -> Result<Self, GpuError> {
        let t = FitTables::new(fitter);
        if t.rows32.is_empty() {
            return Err(GpuError::Config(
                "the detector has no planes to fit on".into(),
            ));
        }
        Ok(FitDevice {
            rows32: DeviceBuffer::from_host(ctx, &t.rows32)?,
            rows64: DeviceBuffer::from_host(ctx, &t.rows64)?,
            gap_steps: DeviceBuffer::from_host(ctx, &t.gap_steps)?,
            gap_kind: DeviceBuffer::from_host(ctx, &t.gap_kind)?,
            gap_slice: DeviceBuffer::from_host(ctx, &t.gap_slice)?,
            slices: DeviceBuffer::from_host(ctx, &t.slices)?,
            ints: DeviceBuffer::from_host(ctx, &t.ints)?,
            floats: DeviceBuffer::from_host(ctx, &t.floats)?,
            doubles: DeviceBuffer::from_host(ctx, &t.doubles)?,
            nodes: DeviceBuffer::from_host(ctx, &t.nodes)?,
        })
    }
}

/// A kernel argument, passed by address to the driver.
#[derive(Clone, Copy)]
enum Arg {
    Ptr(u64),
    U32(u32),
    I32(i32),
    F64(f64),
}

/// The arenas of a batch (see the module documentation).
struct Arenas {
    in_x: DeviceBuffer<f32>,
    in_y: DeviceBuffer<f32>,
    in_plane: DeviceBuffer<u32>,
    hit_start: DeviceBuffer<u32>,
    hit_bin: DeviceBuffer<u32>,
    scratch: DeviceBuffer<u32>,
    sx: DeviceBuffer<f32>,
    sy: DeviceBuffer<f32>,
    splane: DeviceBuffer<u32>,
    sinput: DeviceBuffer<u32>,
    n_sorted: DeviceBuffer<u32>,
    bin_count: DeviceBuffer<u32>,
    bin_start: DeviceBuffer<u32>,
    bin_cursor: DeviceBuffer<u32>,
    /// A later pass's search (`ca_free_hits`): per event the sorted hits no track took,
    /// in sorted order (x, y, sorted index), their places, the cells' starts among them
    /// and their count.
    fx: DeviceBuffer<f32>,
    fy: DeviceBuffer<f32>,
    fmap: DeviceBuffer<u32>,
    free_prefix: DeviceBuffer<u32>,
    free_start: DeviceBuffer<u32>,
    n_free: DeviceBuffer<u32>,
    failed: DeviceBuffer<u32>,
    overflow: DeviceBuffer<u32>,
    /// Per event: scan totals, and per step base and count.
    total: DeviceBuffer<u32>,
    dbl_base: DeviceBuffer<u32>,
    dbl_n: DeviceBuffer<u32>,
    trip_base: DeviceBuffer<u32>,
    trip_n: DeviceBuffer<u32>,
    nb_base: DeviceBuffer<u32>,
    nb_n: DeviceBuffer<u32>,
    dbl_count: DeviceBuffer<u32>,
    dbl_off: DeviceBuffer<u32>,
    /// Per hit, the second hits of its first [`DBL_CACHE`] doublets, from the count for
    /// the write.
    dcache: DeviceBuffer<u32>,
    /// Per doublet: a, b, tx, ty (bits) in one 16-byte record.
    dbl: DeviceBuffer<[u32; 4]>,
    dgap: DeviceBuffer<u32>,
    trip_count: DeviceBuffer<u32>,
    trip_off: DeviceBuffer<u32>,
    end_count: DeviceBuffer<u32>,
    end_off: DeviceBuffer<u32>,
    end_cursor: DeviceBuffer<u32>,
    tleft: DeviceBuffer<u32>,
    tright: DeviceBuffer<u32>,
    tqop: DeviceBuffer<f32>,
    tsigma: DeviceBuffer<f32>,
    tchi2: DeviceBuffer<f32>,
    tplane: DeviceBuffer<u32>,
    has_right: DeviceBuffer<u32>,
    nb_count: DeviceBuffer<u32>,
    nb_off: DeviceBuffer<u32>,
    ending: DeviceBuffer<u32>,
    level: DeviceBuffer<u32>,
    left: DeviceBuffer<u32>,
    /// Candidate step: the end triplets' order keys (two per triplet: each event's slice
    /// is sorted padded to a power of two) and their count per event.
    keys: DeviceBuffer<u64>,
    n_end: DeviceBuffer<u32>,
    /// Per end triplet (in order, at the event's triplet base): where its walked chain and
    /// its fork's start in the event's chain hits, and whether it has a fork; per event:
    /// the chain hits' total, base and count.
    chain_off: DeviceBuffer<u32>,
    chain_fork: DeviceBuffer<u32>,
    chain_hits: DeviceBuffer<u32>,
    chain_total: DeviceBuffer<u32>,
    chain_base: DeviceBuffer<u32>,
    chain_n: DeviceBuffer<u32>,
    /// Per input hit: used by an accepted track.
    used: DeviceBuffer<u32>,
    /// Per candidate: start in the event's candidate hits, length, chi2 (bits), ndf.
    cand: DeviceBuffer<[u32; 4]>,
    cand_hits: DeviceBuffer<u32>,
    /// Per candidate: its fit, FIT_WORDS words.
    fits: DeviceBuffer<u32>,
    accepted: DeviceBuffer<u32>,
    /// Per event: candidates, candidate hits, accepted tracks so far.
    n_cand: DeviceBuffer<u32>,
    n_cand_hits: DeviceBuffer<u32>,
    n_accepted: DeviceBuffer<u32>,
    /// The tracks out (ca_tracks.cu): per event tracks and hits, and where they start in
    /// the packed arrays; per track (first hit, length), its fit, and the hits.
    trk_n: DeviceBuffer<u32>,
    trk_hits: DeviceBuffer<u32>,
    trk_base: DeviceBuffer<u32>,
    trk_hit_base: DeviceBuffer<u32>,
    out_tracks: DeviceBuffer<[u32; 2]>,
    out_fits: DeviceBuffer<u32>,
    out_hits: DeviceBuffer<u32>,
    /// The packed tracks as the clone step takes them (kernels/ca_clones.cu), and its
    /// marks.
    cl_event_start: DeviceBuffer<u32>,
    cl_track_hit_start: DeviceBuffer<u32>,
    cl_plane: DeviceBuffer<u32>,
    cl_x: DeviceBuffer<f32>,
    cl_y: DeviceBuffer<f32>,
    cl_fits: DeviceBuffer<f64>,
    cl_marks: DeviceBuffer<u32>,
    /// Dead ends: per doublet, continued by a kept triplet; per triplet, kept and its
    /// place among the kept; the kept triplets' second arrays.
    continues: DeviceBuffer<u32>,
    keep: DeviceBuffer<u32>,
    koff: DeviceBuffer<u32>,
    k_left: DeviceBuffer<u32>,
    k_right: DeviceBuffer<u32>,
    k_qop: DeviceBuffer<f32>,
    k_sigma: DeviceBuffer<f32>,
    k_chi2: DeviceBuffer<f32>,
    k_plane: DeviceBuffer<u32>,
    /// The per-event scan's status word per tile of SCAN_TILE items (for the largest
    /// array it scans, and one more per event) and its ticket per event.
    scan_status: DeviceBuffer<u64>,
    scan_tickets: DeviceBuffer<u64>,
}

impl Arenas {
    fn new(ctx: &Arc<CudaContext>, l: &CaLimits, n_bins: usize) -> Result<Self, GpuError> {
        let (h, e, d, t) = (l.max_hits, l.max_events, l.max_doublets, l.max_triplets);
        let bins = e * (n_bins + 1);
        let u = |n: usize| DeviceBuffer::<u32>::new(ctx, n);
        let f = |n: usize| DeviceBuffer::<f32>::new(ctx, n);
        Ok(Arenas {
            in_x: f(h)?,
            in_y: f(h)?,
            in_plane: u(h)?,
            hit_start: u(e + 1)?,
            hit_bin: u(h)?,
            scratch: u(h)?,
            sx: f(h)?,
            sy: f(h)?,
            splane: u(h)?,
            sinput: u(h)?,
            n_sorted: u(e)?,
            bin_count: u(bins)?,
            bin_start: u(bins)?,
            bin_cursor: u(bins)?,
            fx: f(h)?,
            fy: f(h)?,
            fmap: u(h)?,
            free_prefix: u(h)?,
            free_start: u(bins)?,
            n_free: u(e)?,
            failed: u(e)?,
            overflow: u(8)?,
            total: u(e)?,
            dbl_base: u(e)?,
            dbl_n: u(e)?,
            trip_base: u(e)?,
            trip_n: u(e)?,
            nb_base: u(e)?,
            nb_n: u(e)?,
            dbl_count: u(h)?,
            dbl_off: u(h)?,
            dcache: u(h * DBL_CACHE)?,
            dbl: DeviceBuffer::new(ctx, d)?,
            dgap: u(d)?,
            trip_count: u(d)?,
            trip_off: u(d)?,
            end_count: u(d)?,
            end_off: u(d)?,
            end_cursor: u(d)?,
            tleft: u(t)?,
            tright: u(t)?,
            tqop: f(t)?,
            tsigma: f(t)?,
            tchi2: f(t)?,
            tplane: u(t)?,
            has_right: u(t)?,
            nb_count: u(t)?,
            nb_off: u(t)?,
            ending: u(t)?,
            level: u(t)?,
            left: u(l.max_neighbours)?,
            keys: DeviceBuffer::new(ctx, 2 * t)?,
            n_end: u(e)?,
            chain_off: u(t)?,
            chain_fork: u(t)?,
            chain_hits: u(l.max_chain_hits)?,
            chain_total: u(e)?,
            chain_base: u(e)?,
            chain_n: u(e)?,
            used: u(h)?,
            cand: DeviceBuffer::new(ctx, l.max_candidates)?,
            cand_hits: u(l.max_candidate_hits)?,
            fits: u(l.max_candidates * FIT_WORDS)?,
            accepted: u(l.max_candidates)?,
            n_cand: u(e)?,
            n_cand_hits: u(e)?,
            n_accepted: u(e)?,
            trk_n: u(e)?,
            trk_hits: u(e)?,
            trk_base: u(e)?,
            trk_hit_base: u(e)?,
            out_tracks: DeviceBuffer::new(ctx, l.max_candidates)?,
            out_fits: u(l.max_candidates * FIT_WORDS)?,
            out_hits: u(l.max_candidate_hits)?,
            cl_event_start: u(e + 1)?,
            cl_track_hit_start: u(l.max_candidates + 1)?,
            cl_plane: u(l.max_candidate_hits)?,
            cl_x: f(l.max_candidate_hits)?,
            cl_y: f(l.max_candidate_hits)?,
            cl_fits: DeviceBuffer::new(ctx, l.max_candidates * CLONE_FIT_WORDS)?,
            cl_marks: u(l.max_candidates)?,
            continues: u(d)?,
            keep: u(t)?,
            koff: u(t)?,
            k_left: u(t)?,
            k_right: u(t)?,
            k_qop: f(t)?,
            k_sigma: f(t)?,
            k_chi2: f(t)?,
            k_plane: u(t)?,
            scan_status: DeviceBuffer::new(ctx, l.scan_tiles(n_bins))?,
            scan_tickets: DeviceBuffer::new(ctx, e)?,
        })
    }
}

/// The CA steps on one GPU. See the module documentation.
pub struct GpuCaEngine {
    /// The sequences of launches recorded as CUDA graphs, replayed with one call each.
    /// First, so that they are destroyed before the module, the stream and the arenas
    /// their launches name (fields drop in order).
    graphs: Vec<Sequence>,
    /// Host threads that lay a large batch's hits out for the copy up (and write the
    /// tracks, [`super::tracking::GpuTracker`]).
    host_threads: usize,
    ctx: Arc<CudaContext>,
    device: GpuDevice,
    _module: LoadedModule,
    k: Kernels,
    stream: Arc<CudaStream>,
    /// The tables of each pass (the first pass's are [`Self::tables`]).
    passes: Vec<DeviceTables>,
    /// The fitter's tables, for the candidate step (engines built with a fitter).
    fit: Option<FitDevice>,
    /// The parameters (ints, floats, doubles of `FitTables`) of the fit the accepted
    /// tracks are fitted again with where it differs from the candidates'
    /// ([`Self::set_track_fitter`]).
    track_fit: Option<(DeviceBuffer<i32>, DeviceBuffer<f32>, DeviceBuffer<f64>)>,
    /// Whether the tracks' fit starts from the candidates' fits
    /// ([`Self::set_track_fitter`]).
    track_fit_from_candidates: bool,
    /// The first-hit step's parameters and scratch, where it runs on the device
    /// ([`Self::set_first_hits`]).
    first_hits: Option<FirstHitsDevice>,
    /// The exchange of segments' parameters and scratch, where it runs on the device
    /// ([`Self::set_exchange`]).
    exchange: Option<ExchangeDevice>,
    /// The candidate step's blocks ([`Self::set_candidate_blocks`]).
    candidate_blocks: CandidateBlocks,
    /// The cells per event, once per event (the item counts of the cells' scan).
    cells_n: DeviceBuffer<u32>,
    a: Arenas,
    host_x: PinnedBuffer<f32>,
    host_y: PinnedBuffer<f32>,
    host_plane: PinnedBuffer<u32>,
    host_start: PinnedBuffer<u32>,
    /// The per-event summary read back after each batch.
    summary_host: PinnedBuffer<u32>,
    /// The packed tracks of a batch, read back ([`Self::read_tracks`]).
    tracks_host: TracksHost,
    limits: CaLimits,
    /// Events and hits of the batch in the device buffers.
    n_events: usize,
    n_hits: usize,
    /// Kernel times of the last batch run with `profile`.
    times: KernelTimes,
    /// Device events of a profiled candidate step.
    marks: Vec<(&'static str, cudarc::driver::CudaEvent)>,
    inject_fault: bool,
    /// Host time spent in the driver's kernel launches since [`Self::take_enqueue`], ns,
    /// and their number.
    enqueue_ns: u64,
    enqueues: u32,
    /// The per-event scan's epoch of the last launch (0: its status words not yet
    /// cleared).
    scan_epoch: u32,
    /// The epoch the scans of the sequence on the stream count from (set on the stream
    /// before each sequence), and the scans of the sequence being launched.
    scan_base: DeviceBuffer<u32>,
    scan_k: u32,
    /// Whether sequences are recorded and replayed ([`Self::set_graphs`]).
    graphs_enabled: bool,
    pub kernels_from_cache: bool,
    pub kernel_load_ms: f64,
}

impl GpuCaEngine {
    /// Fits the accepted tracks again, where their tracks are packed, with `fitter`'s
    /// parameters (the detector's tables are the candidates' fitter's: the two fits differ
    /// only in their settings), as the CPU finder does
    /// ([`crate::tracking::reco::FinderConfig::track_fit`]); with `from_candidate_fits`
    /// ([`crate::tracking::reco::FinderConfig::track_fit_starts_from_candidate_fit`]),
    /// from the candidates' fits as their first fits.
    pub fn set_track_fitter(
        &mut self,
        fitter: &KalmanFitter,
        from_candidate_fits: bool,
    ) -> Result<(), GpuError> {
        let t = FitTables::new(fitter);
        let ctx = &self.ctx;
        self.track_fit = Some((
            DeviceBuffer::from_host(ctx, &t.ints)?,
            DeviceBuffer::from_host(ctx, &t.floats)?,
            DeviceBuffer::from_host(ctx, &t.doubles)?,
        ));
        self.track_fit_from_candidates = from_candidate_fits;
        Ok(())
    }

    /// Runs the first-hit step ([`crate::tracking::ca::first_hits`]) on the device on the
    /// packed tracks, after the clone step and the momentum cut `cut`, as the CPU runs it
    /// on an event's tracks; [`Self::read_tracks`] then reads back the tracks as the step
    /// leaves them (`first_hits_done`). It needs the candidates' fitter (and the tracks'
    /// where [`Self::set_track_fitter`] gave one: set that first), the clone step in
    /// [`Self::read_tracks`], and the pointing tents of the last pass's tables (the
    /// finder's configuration's).
    pub fn set_first_hits(
        &mut self,
        cuts: &FirstHitCuts,
        cut: MomentumCut,
    ) -> Result<(), GpuError> {
        if self.fit.is_none() {
            return Err(GpuError::Config(
                "the first-hit step on the device needs the candidates' fitter".into(),
            ));
        }
        if cuts.n_planes() != self.tables().n_planes || cuts.n_planes() > FIRST_HIT_MAX_PLANES {
            return Err(GpuError::Config(format!(
                "the first-hit step on the device takes the engine's {} planes, at most {FIRST_HIT_MAX_PLANES}; it has {}",
                self.tables().n_planes,
                cuts.n_planes()
            )));
        }
        self.check_free(
            "the first-hit step",
            FirstHitsDevice::scratch_bytes(&self.limits),
        )?;
        let track_fit = self.track_fit.is_some();
        let fh = FirstHitsDevice::new(&self.ctx, cuts, cut, track_fit, &self.limits)?;
        self.first_hits = Some(fh);
        Ok(())
    }

    /// An error naming `step` where the GPU has less than `need` bytes free for its scratch.
    fn check_free(&self, step: &str, need: usize) -> Result<(), GpuError> {
        let (free, _) = driver("cuMemGetInfo", self.ctx.mem_get_info())?;
        if need > free {
            return Err(GpuError::Config(format!(
                "{step} needs {:.2} GiB of GPU memory, {} has {:.2} GiB free",
                need as f64 / (1u64 << 30) as f64,
                self.device.name,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        Ok(())
    }

    /// Test hook: the first-hit step takes at most `per_event` pairs of track and hit
    /// per event (below its share of the arenas), so that busy events exceed it.
    pub fn limit_first_hit_pairs(&mut self, per_event: usize) {
        if let Some(f) = &mut self.first_hits {
            f.pair_limit = per_event;
        }
    }

    /// Runs the exchange of segments ([`crate::tracking::ca::exchange`]) on the device on
    /// the packed tracks, after the clone step and the momentum cut `cut` (which it then
    /// applies, marking the tracks below it), before the first-hit step where that runs on
    /// the device too, as the CPU runs them on an event's tracks; [`Self::read_tracks`]
    /// then reads back the tracks as the step leaves them (`exchange_done`). It needs the
    /// candidates' fitter (and the tracks' where [`Self::set_track_fitter`] gave one: set
    /// that first) and the clone step in [`Self::read_tracks`].
    pub fn set_exchange(&mut self, cuts: &ExchangeCuts, cut: MomentumCut) -> Result<(), GpuError> {
        if self.fit.is_none() {
            return Err(GpuError::Config(
                "the exchange of segments on the device needs the candidates' fitter".into(),
            ));
        }
        let n = cuts.window_mm.len();
        if n != self.tables().n_planes || n > EXCHANGE_MAX_PLANES {
            return Err(GpuError::Config(format!(
                "the exchange of segments on the device takes the engine's {} planes, at most {EXCHANGE_MAX_PLANES}; it has {n}",
                self.tables().n_planes,
            )));
        }
        self.check_free(
            "the exchange of segments",
            ExchangeDevice::scratch_bytes(&self.limits, n),
        )?;
        let track_fit = self.track_fit.is_some();
        self.exchange = Some(ExchangeDevice::new(
            &self.ctx,
            cuts,
            cut,
            track_fit,
            &self.limits,
        )?);
        Ok(())
    }

    /// Whether the exchange of segments runs on the device ([`Self::set_exchange`]).
    pub fn exchange_on_device(&self) -> bool {
        self.exchange.is_some()
    }

    /// Test hook: the exchange step takes at most `per_event` pairs of tracks per event
    /// (below its share of the arenas), so that busy events exceed it.
    pub fn limit_exchange_pairs(&mut self, per_event: usize) {
        if let Some(x) = &mut self.exchange {
            x.pair_limit = per_event;
        }
    }

    /// Whether the first-hit step runs on the device ([`Self::set_first_hits`]).
    pub fn first_hits_on_device(&self) -> bool {
        self.first_hits.is_some()
    }

    /// Uploads the finder's tables for a pass of `reach`, compiles or loads the kernels and
    /// allocates the arenas for `limits`. Without a fitter: the steps up to evolution
    /// ([`Self::with_fitter`] for the candidate step too).
    pub fn new(
        device: &GpuDevice,
        geo: &FinderGeometry,
        cfg: &FinderConfig,
        reach: usize,
        limits: CaLimits,
        cache: &KernelCache,
    ) -> Result<Self, GpuError> {
        Self::with_passes(device, geo, cfg, None, &[reach], limits, cache)
    }

    /// [`Self::new`], with `fitter`'s tables uploaded for the candidate step
    /// ([`Self::select_candidates`]): `fitter` is the CPU finder's (`Reconstructor`'s).
    pub fn with_fitter(
        device: &GpuDevice,
        geo: &FinderGeometry,
        cfg: &FinderConfig,
        fitter: &KalmanFitter,
        reach: usize,
        limits: CaLimits,
        cache: &KernelCache,
    ) -> Result<Self, GpuError> {
        Self::with_passes(device, geo, cfg, Some(fitter), &[reach], limits, cache)
    }

    /// The engine of several passes, one per reach (at least one): [`Self::run_pass`]
    /// runs pass `k` with the tables of `reaches[k]`; with `fitter`, also the candidate
    /// step ([`Self::with_fitter`]).
    pub fn with_passes(
        device: &GpuDevice,
        geo: &FinderGeometry,
        cfg: &FinderConfig,
        fitter: Option<&KalmanFitter>,
        reaches: &[usize],
        limits: CaLimits,
        cache: &KernelCache,
    ) -> Result<Self, GpuError> {
        let tables = reaches
            .iter()
            .map(|&r| CaTables::new(geo, cfg, r))
            .collect();
        Self::with_tables(device, tables, fitter, limits, cache)
    }

    /// The engine of several passes, each with its own tables (at least one; the passes'
    /// cuts may differ, as the stiff-track pass's do, but not their grid or limits):
    /// [`Self::run_pass`] runs pass `k` with `tables[k]`.
    pub fn with_tables(
        device: &GpuDevice,
        tables: Vec<CaTables>,
        fitter: Option<&KalmanFitter>,
        limits: CaLimits,
        cache: &KernelCache,
    ) -> Result<Self, GpuError> {
        limits.validate()?;
        let mut tables = tables.into_iter();
        let Some(first) = tables.next() else {
            return Err(GpuError::Config(
                "a tracking engine needs at least one pass".into(),
            ));
        };
        if first.n_planes == 0 {
            return Err(GpuError::Config("the detector has no planes".into()));
        }
        let later: Vec<CaTables> = tables.collect();
        // Hits are sorted into the grid once, by the first pass's tables.
        let grid = |t: &CaTables| -> Vec<u32> {
            let mut g = vec![t.n_planes as u32, t.n_bins as u32];
            for i in 0..t.n_planes {
                g.extend(
                    t.plane_f32[i * PLF..i * PLF + 4]
                        .iter()
                        .map(|v| v.to_bits()),
                );
                g.extend(t.plane_i32[i * PLI..i * PLI + 3].iter().map(|&v| v as u32));
            }
            g
        };
        let first_grid = grid(&first);
        if later
            .iter()
            .any(|t| grid(t) != first_grid || t.limits != first.limits)
        {
            return Err(GpuError::Config(
                "the passes of a tracking engine must share the planes' grid and the limits".into(),
            ));
        }
        let reaches: Vec<usize> = std::iter::once(first.reach)
            .chain(later.iter().map(|t| t.reach))
            .collect();
        let tables = first;
        let ctx = device.open()?;
        // SAFETY: the engine synchronises its one stream explicitly and uses no
        // cudarc-managed slices.
        unsafe { ctx.disable_event_tracking() };
        let need = limits.device_bytes(tables.n_bins);
        let (free, _) = driver("cuMemGetInfo", ctx.mem_get_info())?;
        if need > free {
            return Err(GpuError::Config(format!(
                "the tracking arenas need {:.2} GiB of GPU memory, {} has {:.2} GiB free; lower the limits",
                need as f64 / (1u64 << 30) as f64,
                device.name,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        let module = kernel_module().load(&ctx, &device.arch(), cache)?;
        let k = Kernels {
            event_scan: module.function("ca_event_scan")?,
            event_budget: module.function("ca_event_budget")?,
            bin_hits: module.function("ca_bin_hits")?,
            place_hits: module.function("ca_place_hits")?,
            rank_hits: module.function("ca_rank_hits")?,
            free_flags: module.function("ca_free_flags")?,
            free_hits: module.function("ca_free_hits")?,
            doublets: module.function("ca_doublets")?,
            triplets: module.function("ca_triplets")?,
            neighbours_ending: module.function("ca_neighbours_ending")?,
            neighbours_sort_ending: module.function("ca_neighbours_sort_ending")?,
            neighbours: module.function("ca_neighbours")?,
            evolution: module.function("ca_evolution")?,
            dead_ends_clear: module.function("ca_dead_ends_clear")?,
            dead_ends: module.function("ca_dead_ends")?,
            dead_ends_gather: module.function("ca_dead_ends_gather")?,
            dead_ends_copy_back: module.function("ca_dead_ends_copy_back")?,
            candidates_order: module.function("ca_candidates_order")?,
            candidates_chains: module.function("ca_candidates_chains")?,
            candidates: module.function("ca_candidates")?,
            candidates_small: module.function("ca_candidates_small")?,
            tracks_count: module.function("ca_tracks_count")?,
            tracks_pack: module.function("ca_tracks_pack")?,
            tracks_clone_input: module.function("ca_tracks_clone_input")?,
            first_hits: module.function("ca_first_hits")?,
            exchange_begin: module.function("ca_exchange_begin")?,
            exchange_fit_changed: module.function("ca_exchange_fit_changed")?,
            exchange_pairs: module.function("ca_exchange_pairs")?,
            exchange_pairs_changed: module.function("ca_exchange_pairs_changed")?,
            exchange_fit_needed: module.function("ca_exchange_fit_needed")?,
            exchange_evaluate: module.function("ca_exchange_evaluate")?,
            exchange_choose: module.function("ca_exchange_choose")?,
            exchange_end: module.function("ca_exchange_end")?,
        };
        let fit = fitter.map(|f| FitDevice::new(&ctx, f)).transpose()?;
        let stream = driver("cuStreamCreate", ctx.new_stream())?;
        let n_bins = tables.n_bins;
        let mut passes = vec![DeviceTables::new(&ctx, tables)?];
        for t in later {
            passes.push(DeviceTables::new(&ctx, t)?);
        }
        let engine = GpuCaEngine {
            passes,
            fit,
            track_fit: None,
            track_fit_from_candidates: false,
            first_hits: None,
            exchange: None,
            candidate_blocks: CandidateBlocks::Auto,
            cells_n: DeviceBuffer::from_host(&ctx, &vec![n_bins as u32; limits.max_events])?,
            a: Arenas::new(&ctx, &limits, n_bins)?,
            host_x: PinnedBuffer::new(&ctx, limits.max_hits)?,
            host_y: PinnedBuffer::new(&ctx, limits.max_hits)?,
            host_plane: PinnedBuffer::new(&ctx, limits.max_hits)?,
            host_start: PinnedBuffer::new(&ctx, limits.max_events + 1)?,
            summary_host: PinnedBuffer::new(&ctx, 7 * limits.max_events + 8)?,
            host_threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, 8),
            tracks_host: TracksHost {
                counts: PinnedBuffer::new(&ctx, 4 * limits.max_events)?,
                tracks: PinnedBuffer::new(&ctx, limits.max_candidates)?,
                fits: PinnedBuffer::new(&ctx, limits.max_candidates * FIT_WORDS)?,
                hits: PinnedBuffer::new(&ctx, limits.max_candidate_hits)?,
                marks: PinnedBuffer::new(&ctx, limits.max_candidates)?,
            },
            kernels_from_cache: module.from_cache,
            kernel_load_ms: module.load_ms,
            _module: module,
            k,
            stream,
            device: device.clone(),
            limits,
            n_events: 0,
            n_hits: 0,
            times: Vec::new(),
            marks: Vec::new(),
            inject_fault: false,
            enqueue_ns: 0,
            enqueues: 0,
            scan_epoch: 0,
            scan_base: DeviceBuffer::new(&ctx, 1)?,
            scan_k: 0,
            graphs: Vec::new(),
            graphs_enabled: true,
            ctx,
        };
        tracing::info!(
            "CA engine on {}: {} planes, reaches {:?}, arenas {:.1} MiB",
            device.name,
            engine.tables().n_planes,
            reaches,
            need as f64 / (1u64 << 20) as f64
        );
        Ok(engine)
    }

    pub fn device(&self) -> &GpuDevice {
        &self.device
    }

    pub fn limits(&self) -> CaLimits {
        self.limits
    }

    /// The first pass's tables.
    pub fn tables(&self) -> &CaTables {
        &self.passes[0].tables
    }

    /// Per-kernel device times of the last batch run by [`Self::run_profiled`].
    pub fn kernel_times(&self) -> &KernelTimes {
        &self.times
    }

    /// Test hook: the next batch's first launch is made with an invalid configuration, so
    /// the driver rejects it and the batch returns that error.
    pub fn inject_device_error(&mut self) {
        self.inject_fault = true;
    }

    /// Runs the steps on a batch of events (each its hits); returns the per-event summary.
    /// A batch with more events or hits than the arenas hold is refused before anything
    /// is copied (the caller splits it or runs it on the CPU).
    pub fn run(&mut self, events: &[&[HitRecord]]) -> Result<CaBatchSummary, GpuError> {
        self.run_inner(events, PassOptions::default(), false)
    }

    /// [`Self::run`], timing each kernel with device events ([`Self::kernel_times`]).
    pub fn run_profiled(&mut self, events: &[&[HitRecord]]) -> Result<CaBatchSummary, GpuError> {
        self.run_inner(events, PassOptions::default(), true)
    }

    /// The first pass on a new batch (hits go up, are sorted, then the steps) with
    /// `opts` (`skip_used` is ignored: no hit is used yet).
    pub fn run_first(
        &mut self,
        events: &[&[HitRecord]],
        opts: PassOptions,
    ) -> Result<CaBatchSummary, GpuError> {
        self.run_inner(events, opts, false)
    }

    /// A later pass on the batch already on the device: the steps from the doublets on,
    /// with the tables of `opts.pass`, on the hits sorted by the first pass (skipping
    /// the used ones with `opts.skip_used`). An event that failed in an earlier pass
    /// stays failed.
    pub fn run_pass(&mut self, opts: PassOptions) -> Result<CaBatchSummary, GpuError> {
        if opts.pass >= self.passes.len() {
            return Err(GpuError::Config(format!(
                "pass {} of an engine with {} passes",
                opts.pass,
                self.passes.len()
            )));
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let r = self
            .enqueue_steps(opts, false)
            .and_then(|()| self.enqueue_summary())
            .and_then(|()| {
                driver("cuStreamSynchronize", self.stream.synchronize())?;
                Ok(self.summary())
            });
        if r.is_err() {
            let _ = self.stream.synchronize();
        }
        r
    }

    /// Marks the hits taken by an earlier pass, per event by input index (tests and
    /// comparison: the candidate step marks them on the device).
    pub fn set_used(&mut self, used: &[Vec<bool>]) -> Result<(), GpuError> {
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        for (e, u) in used.iter().enumerate().take(self.n_events) {
            let hs = self.read(&self.a.hit_start, e, 1)?[0] as usize;
            let words: Vec<u32> = u.iter().map(|&b| b as u32).collect();
            if hs + words.len() > self.a.used.len() {
                return Err(GpuError::Config("used marks beyond the hit arena".into()));
            }
            copy_to_device(&words, &self.a.used, hs, &self.stream)?;
            driver("cuStreamSynchronize", self.stream.synchronize())?;
        }
        Ok(())
    }

    fn run_inner(
        &mut self,
        events: &[&[HitRecord]],
        opts: PassOptions,
        profile: bool,
    ) -> Result<CaBatchSummary, GpuError> {
        let n_hits: usize = events.iter().map(|e| e.len()).sum();
        if events.len() > self.limits.max_events || n_hits > self.limits.max_hits {
            return Err(GpuError::Config(format!(
                "a batch of {} events and {n_hits} hits exceeds the arenas ({} events, {} hits); run it on the CPU",
                events.len(),
                self.limits.max_events,
                self.limits.max_hits
            )));
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        {
            let (xs, ys, ps, st) = (
                self.host_x.as_mut_slice(),
                self.host_y.as_mut_slice(),
                self.host_plane.as_mut_slice(),
                self.host_start.as_mut_slice(),
            );
            let mut k = 0;
            for (e, ev) in events.iter().enumerate() {
                st[e] = k as u32;
                k += ev.len();
            }
            st[events.len()] = k as u32;
            let threads = if n_hits >= PACK_THREADS_FROM_HITS {
                self.host_threads
            } else {
                1
            };
            pack_hits(
                events,
                &mut xs[..n_hits],
                &mut ys[..n_hits],
                &mut ps[..n_hits],
                threads,
            );
        }
        self.n_events = events.len();
        self.n_hits = n_hits;
        let r = self
            .enqueue(n_hits, opts, profile)
            .and_then(|()| self.enqueue_summary())
            .and_then(|()| {
                driver("cuStreamSynchronize", self.stream.synchronize())?;
                Ok(self.summary())
            });
        if r.is_err() {
            let _ = self.stream.synchronize();
        }
        r
    }

    /// Launches `f` on `grid` (blocks per event, events) of [`THREADS`] threads
    /// ([`SCAN_THREADS`] for the per-event scan, [`FIRST_HIT_THREADS`] for the first-hit
    /// step).
    fn launch(&mut self, f: &'static str, grid: (u32, u32), args: &[Arg]) -> Result<(), GpuError> {
        let threads = match f {
            "ca_event_scan" => SCAN_THREADS,
            "ca_first_hits" => FIRST_HIT_THREADS,
            "ca_exchange_begin" | "ca_exchange_choose" | "ca_exchange_end" => EXCHANGE_THREADS,
            _ => THREADS,
        };
        self.launch_block(f, grid, threads, args)
    }

    /// Launches `f` on `grid` (blocks per event, events) of `threads` threads.
    fn launch_block(
        &mut self,
        f: &'static str,
        grid: (u32, u32),
        threads: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        let func = match f {
            "ca_candidates_order" => &self.k.candidates_order,
            "ca_candidates_chains" => &self.k.candidates_chains,
            "ca_candidates" => &self.k.candidates,
            "ca_candidates_small" => &self.k.candidates_small,
            "ca_tracks_count" => &self.k.tracks_count,
            "ca_tracks_pack" => &self.k.tracks_pack,
            "ca_tracks_clone_input" => &self.k.tracks_clone_input,
            "ca_first_hits" => &self.k.first_hits,
            "ca_exchange_begin" => &self.k.exchange_begin,
            "ca_exchange_fit_changed" => &self.k.exchange_fit_changed,
            "ca_exchange_pairs" => &self.k.exchange_pairs,
            "ca_exchange_pairs_changed" => &self.k.exchange_pairs_changed,
            "ca_exchange_fit_needed" => &self.k.exchange_fit_needed,
            "ca_exchange_evaluate" => &self.k.exchange_evaluate,
            "ca_exchange_choose" => &self.k.exchange_choose,
            "ca_exchange_end" => &self.k.exchange_end,
            "ca_event_scan" => &self.k.event_scan,
            "ca_event_budget" => &self.k.event_budget,
            "ca_bin_hits" => &self.k.bin_hits,
            "ca_place_hits" => &self.k.place_hits,
            "ca_rank_hits" => &self.k.rank_hits,
            "ca_free_flags" => &self.k.free_flags,
            "ca_free_hits" => &self.k.free_hits,
            "ca_doublets" => &self.k.doublets,
            "ca_triplets" => &self.k.triplets,
            "ca_neighbours_ending" => &self.k.neighbours_ending,
            "ca_neighbours_sort_ending" => &self.k.neighbours_sort_ending,
            "ca_neighbours" => &self.k.neighbours,
            "ca_dead_ends_clear" => &self.k.dead_ends_clear,
            "ca_dead_ends" => &self.k.dead_ends,
            "ca_dead_ends_gather" => &self.k.dead_ends_gather,
            "ca_dead_ends_copy_back" => &self.k.dead_ends_copy_back,
            _ => &self.k.evolution,
        };
        let mut store = [0u64; 64];
        let mut ptrs = [std::ptr::null_mut::<std::ffi::c_void>(); 64];
        assert!(args.len() <= 64);
        for (i, a) in args.iter().enumerate() {
            store[i] = match *a {
                Arg::Ptr(p) => p,
                Arg::U32(v) => v as u64,
                Arg::I32(v) => v as u32 as u64,
                Arg::F64(v) => v.to_bits(),
            };
        }
        for i in 0..args.len() {
            // The driver reads each parameter's size from its address (little-endian: a
            // 32-bit value is the low half of its slot).
            ptrs[i] = (&mut store[i] as *mut u64).cast();
        }
        let faulty = std::mem::take(&mut self.inject_fault);
        let block = if faulty { 4096 } else { threads };
        let grid = (grid.0.max(1), grid.1.max(1), 1);
        let t0 = std::time::Instant::now();
        // SAFETY: the arguments follow the kernel's signature in kernels/ca_*.cu; every
        // pointer is a live arena or table sized for the batch (checked in `run`).
        let r = driver("cuLaunchKernel", unsafe {
            drv::launch_kernel(
                func.cu_function(),
                grid,
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut ptrs[..args.len()],
            )
        });
        self.enqueue_ns += t0.elapsed().as_nanos() as u64;
        self.enqueues += 1;
        r
    }

    /// The host's time in the driver's kernel launches of this engine since the last
    /// call, milliseconds, and their number; both start again from zero.
    pub fn take_enqueue(&mut self) -> (f64, u32) {
        let r = (self.enqueue_ns as f64 * 1e-6, self.enqueues);
        (self.enqueue_ns, self.enqueues) = (0, 0);
        r
    }

    /// Launches the per-event scan over `e` events (its arguments `args` as
    /// `ca_event_scan` takes them before the status words), with the sequence's next
    /// epoch ([`Self::sequence`]), on [`SCAN_BLOCKS_PER_SM`] blocks per multiprocessor
    /// over the batch (at most [`SCAN_MAX_BLOCKS`] per event).
    fn launch_scan(&mut self, e: u32, args: [Arg; 8]) -> Result<(), GpuError> {
        self.scan_k += 1;
        assert!(self.scan_k <= SCAN_SEQUENCE_MAX, "scans of one sequence");
        let sms = self.device.multiprocessors.max(1) as u32;
        let blocks = (SCAN_BLOCKS_PER_SM * sms)
            .div_ceil(e.max(1))
            .clamp(1, SCAN_MAX_BLOCKS);
        let [a0, a1, a2, a3, a4, a5, a6, a7] = args;
        #[rustfmt::skip]
        let all = [a0, a1, a2, a3, a4, a5, a6, a7, Arg::Ptr(self.a.scan_status.ptr()),
            Arg::Ptr(self.a.scan_tickets.ptr()), Arg::Ptr(self.scan_base.ptr()),
            Arg::U32(self.scan_k)];
        self.launch("ca_event_scan", (blocks, e), &all)
    }

    /// Records and replays sequences of launches as CUDA graphs (the default), or launches
    /// each kernel (`false`); the tracks are the same either way.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs_enabled = on;
        self.graphs.clear();
    }

    /// The sequences of launches recorded as CUDA graphs so far.
    pub fn recorded_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// Enqueues the launches `launches` makes for `key`: the first time through a
    /// recording, then by replaying it, in one call; each kernel launched directly where
    /// `direct` (the profiled runs, which time kernels between them), after an injected
    /// fault, or where graphs are off or a recording failed. Before it, on the stream:
    /// the epoch its per-event scans count from, and the scans' status words cleared
    /// where the epochs would wrap.
    fn sequence(
        &mut self,
        key: SequenceKey,
        direct: bool,
        launches: impl Fn(&mut Self) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        if self.scan_epoch == 0 || self.scan_epoch + SCAN_SEQUENCE_MAX >= SCAN_EPOCHS {
            // The first launch, or the epochs wrap: no word of an earlier epoch may read
            // as a later one's.
            self.zero(&self.a.scan_status, self.a.scan_status.len())?;
            self.zero(&self.a.scan_tickets, self.a.scan_tickets.len())?;
            self.scan_epoch = 0;
        }
        // SAFETY: one word of this allocation, on the engine's stream.
        driver("cuMemsetD32Async", unsafe {
            drv_sys::cuMemsetD32Async(
                self.scan_base.ptr(),
                self.scan_epoch,
                1,
                self.stream.cu_stream(),
            )
            .result()
        })?;
        self.scan_k = 0;
        let recorded = if direct || !self.graphs_enabled || self.inject_fault {
            None
        } else {
            self.recorded(key, &launches)
        };
        let Some(at) = recorded else {
            // The epochs of scans launched before a failed launch are spent all the same.
            let r = launches(self);
            self.scan_epoch += self.scan_k;
            return r;
        };
        let t0 = std::time::Instant::now();
        let g = &self.graphs[at];
        // Its scans' epochs are spent whether the launch succeeds or not.
        self.scan_epoch += g.scans;
        self.enqueues += g.kernels;
        let r = g.graph.launch(&self.stream);
        self.enqueue_ns += t0.elapsed().as_nanos() as u64;
        r
    }

    /// The index of `key`'s recorded sequence, recorded from `launches` where it is not
    /// yet; `None` where the recording fails, which turns graphs off from then on (with a
    /// warning), nothing enqueued.
    fn recorded(
        &mut self,
        key: SequenceKey,
        launches: &impl Fn(&mut Self) -> Result<(), GpuError>,
    ) -> Option<usize> {
        if let Some(i) = self.graphs.iter().position(|g| g.key == key) {
            return Some(i);
        }
        let stream = self.stream.clone();
        let before = self.enqueues;
        let recorded = Graph::capture(&stream, || launches(self));
        let kernels = self.enqueues - before;
        // Counted when replayed.
        self.enqueues = before;
        // The scans it numbered; a direct launch after a failure numbers them again.
        let scans = self.scan_k;
        self.scan_k = 0;
        match recorded {
            Ok(graph) => {
                if self.graphs.len() == GRAPH_CACHE {
                    self.graphs.remove(0);
                }
                self.graphs.push(Sequence {
                    key,
                    graph,
                    scans,
                    kernels,
                });
                Some(self.graphs.len() - 1)
            }
            Err(e) => {
                tracing::warn!(
                    "CUDA graph recording of the tracking steps failed ({e}); launching each kernel from now on"
                );
                self.graphs_enabled = false;
                self.graphs.clear();
                None
            }
        }
    }

    /// Clears the first `n` elements of `buf` (of 32 or 64 bits) on the stream.
    fn zero<T: Copy>(&self, buf: &DeviceBuffer<T>, n: usize) -> Result<(), GpuError> {
        const { assert!(std::mem::size_of::<T>() % 4 == 0) };
        let words = n * (std::mem::size_of::<T>() / 4);
        if words == 0 {
            return Ok(());
        }
        // SAFETY: `n` elements of this allocation, in 32-bit words.
        driver("cuMemsetD32Async", unsafe {
            drv_sys::cuMemsetD32Async(buf.ptr(), 0, words, self.stream.cu_stream()).result()
        })
    }

    /// Enqueues the copies and every step of the batch's first pass.
    fn enqueue(&mut self, n_hits: usize, opts: PassOptions, profile: bool) -> Result<(), GpuError> {
        self.enqueue_pass(
            Some(n_hits),
            PassOptions {
                skip_used: false,
                ..opts
            },
            profile,
        )
    }

    /// Enqueues the steps of a later pass on the sorted hits of the batch.
    fn enqueue_steps(&mut self, opts: PassOptions, profile: bool) -> Result<(), GpuError> {
        self.enqueue_pass(None, opts, profile)
    }

    /// The steps of one pass; with `first = Some(n_hits)` also the copies of the hits and
    /// the hit sorting.
    fn enqueue_pass(
        &mut self,
        first: Option<usize>,
        opts: PassOptions,
        profile: bool,
    ) -> Result<(), GpuError> {
        let e = self.n_events as u32;
        let a = &self.a;
        let n_bins = self.passes[opts.pass.min(self.passes.len() - 1)]
            .tables
            .n_bins;
        if let Some(n_hits) = first {
            copy_to_device(&self.host_x.as_slice()[..n_hits], &a.in_x, 0, &self.stream)?;
            copy_to_device(&self.host_y.as_slice()[..n_hits], &a.in_y, 0, &self.stream)?;
            copy_to_device(
                &self.host_plane.as_slice()[..n_hits],
                &a.in_plane,
                0,
                &self.stream,
            )?;
            copy_to_device(
                &self.host_start.as_slice()[..e as usize + 1],
                &a.hit_start,
                0,
                &self.stream,
            )?;
            let bins = e as usize * (n_bins + 1);
            self.zero(&a.bin_count, bins)?;
            self.zero(&a.bin_cursor, bins)?;
            self.zero(&a.failed, e as usize)?;
            self.zero(&a.overflow, 8)?;
            // Fresh hits: none used, no candidates yet.
            self.zero(&a.used, n_hits)?;
            self.zero(&a.n_cand, e as usize)?;
            self.zero(&a.n_cand_hits, e as usize)?;
            self.zero(&a.n_accepted, e as usize)?;
        }
        if opts.skip_used {
            // The doublets' count skips the used hits: they make none.
            self.zero(&a.dbl_count, self.n_hits)?;
        }
        let first = first.is_some();
        let key = SequenceKey::Pass {
            events: e,
            first,
            opts,
        };
        self.sequence(key, profile, |s| s.pass_kernels(first, opts, profile))
    }

    /// The kernels of one pass, after its copies ([`Self::enqueue_pass`]); with `first`
    /// also the hit sorting.
    fn pass_kernels(
        &mut self,
        first: bool,
        opts: PassOptions,
        profile: bool,
    ) -> Result<(), GpuError> {
        use Arg::{Ptr, I32, U32};
        let e = self.n_events as u32;
        let sms = self.device.multiprocessors.max(1) as u32;
        let bpe = self.blocks_per_event(e);
        // The doublet and triplet kernels, bounded to ITEM_BLOCKS_PER_SM blocks per
        // multiprocessor, in one wave of them: a second, partial wave (five blocks per
        // event where three or four fit) leaves most multiprocessors fewer warps to hide
        // the loads' latency.
        let bpe_wave = (ITEM_BLOCKS_PER_SM * sms / e.max(1)).clamp(1, 64);
        let a = &self.a;
        let dt = &self.passes[opts.pass.min(self.passes.len() - 1)];
        let tb = &dt.tables;
        let (n_planes, n_bins, reach) = (tb.n_planes as i32, tb.n_bins as i32, tb.reach as i32);
        let lim = &tb.limits;
        let per_event = |v: usize| v.min(u32::MAX as usize) as u32;
        let (max_hits, max_d, max_t, max_n) = (
            per_event(lim.max_hits),
            per_event(lim.max_doublets),
            per_event(lim.max_triplets),
            per_event(lim.max_neighbours),
        );
        // Pointers (copied out so `self` can be borrowed mutably for the launches).
        let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
        let pf = |b: &DeviceBuffer<f32>| Ptr(b.ptr());
        let (in_x, in_y, in_plane, hit_start) =
            (pf(&a.in_x), pf(&a.in_y), p(&a.in_plane), p(&a.hit_start));
        let (hit_bin, scratch, sx, sy, splane, sinput) = (
            p(&a.hit_bin),
            p(&a.scratch),
            pf(&a.sx),
            pf(&a.sy),
            p(&a.splane),
            p(&a.sinput),
        );
        let (n_sorted, bin_count, bin_start, bin_cursor) = (
            p(&a.n_sorted),
            p(&a.bin_count),
            p(&a.bin_start),
            p(&a.bin_cursor),
        );
        let (failed, overflow, total) = (p(&a.failed), p(&a.overflow), p(&a.total));
        let (dbl_base, dbl_n, trip_base, trip_n, nb_base, nb_n) = (
            p(&a.dbl_base),
            p(&a.dbl_n),
            p(&a.trip_base),
            p(&a.trip_n),
            p(&a.nb_base),
            p(&a.nb_n),
        );
        let (dbl_count, dbl_off, dbl, dgap, dcache) = (
            p(&a.dbl_count),
            p(&a.dbl_off),
            Ptr(a.dbl.ptr()),
            p(&a.dgap),
            p(&a.dcache),
        );
        let (trip_count, trip_off, end_count, end_off, end_cursor) = (
            p(&a.trip_count),
            p(&a.trip_off),
            p(&a.end_count),
            p(&a.end_off),
            p(&a.end_cursor),
        );
        let (tleft, tright, tqop, tsigma, tchi2, tplane, has_right) = (
            p(&a.tleft),
            p(&a.tright),
            pf(&a.tqop),
            pf(&a.tsigma),
            pf(&a.tchi2),
            p(&a.tplane),
            p(&a.has_right),
        );
        let (nb_count, nb_off, ending, level, left) = (
            p(&a.nb_count),
            p(&a.nb_off),
            p(&a.ending),
            p(&a.level),
            p(&a.left),
        );
        let (plf, pli, pld, prf, pri, tents, g) = (
            Ptr(dt.plane_f32.ptr()),
            Ptr(dt.plane_i32.ptr()),
            Ptr(dt.plane_f64.ptr()),
            Ptr(dt.pair_f32.ptr()),
            Ptr(dt.pair_i32.ptr()),
            Ptr(dt.tents.ptr()),
            Ptr(dt.globals.ptr()),
        );
        let used = p(&a.used);
        let (fx, fy, fmap, free_prefix, free_start, n_free) = (
            pf(&a.fx),
            pf(&a.fy),
            p(&a.fmap),
            p(&a.free_prefix),
            p(&a.free_start),
            p(&a.n_free),
        );
        let (continues, keep, koff) = (p(&a.continues), p(&a.keep), p(&a.koff));
        let (k_left, k_right, k_qop, k_sigma, k_chi2, k_plane) = (
            p(&a.k_left),
            p(&a.k_right),
            pf(&a.k_qop),
            pf(&a.k_sigma),
            pf(&a.k_chi2),
            p(&a.k_plane),
        );
        let exits = pf(&dt.exits);
        let null = Ptr(0);
        let cells_n = p(&self.cells_n);
        let chi2 = Arg::F64(tb.neighbour_chi2_max);
        let (cap_d, cap_t, cap_n) = (
            self.limits.max_doublets as u32,
            self.limits.max_triplets as u32,
            self.limits.max_neighbours as u32,
        );

        let mut marks: Vec<(&'static str, cudarc::driver::CudaEvent)> = Vec::new();
        let mut mark = |name: &'static str, s: &Self| -> Result<(), GpuError> {
            if profile {
                let ev = driver(
                    "cuEventRecord",
                    s.stream
                        .record_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT)),
                )?;
                marks.push((name, ev));
            }
            Ok(())
        };
        mark("start", self)?;
        if first {
            // Hit sorting.
            #[rustfmt::skip]
            self.launch("ca_bin_hits", (bpe, e), &[in_x, in_y, in_plane, hit_start, plf, pli,
                I32(n_planes), I32(n_bins), hit_bin, bin_count])?;
            mark("hit_sorting: bin", self)?;
            #[rustfmt::skip]
            self.launch_scan(e, [bin_count, bin_start, null, cells_n,
                U32(n_bins as u32 + 1), failed, total, I32(1)])?;
            mark("hit_sorting: scan", self)?;
            #[rustfmt::skip]
            self.launch("ca_place_hits", (bpe, e), &[hit_start, hit_bin, bin_start, bin_cursor,
                I32(n_bins), U32(max_hits), n_sorted, failed, overflow, scratch])?;
            mark("hit_sorting: place", self)?;
            #[rustfmt::skip]
            self.launch("ca_rank_hits", (bpe, e), &[in_x, in_y, in_plane, hit_start, hit_bin,
                bin_start, I32(n_bins), n_sorted, failed, scratch, sx, sy, splane, sinput])?;
            mark("hit_sorting: rank", self)?;
        }
        if opts.skip_used {
            // The hits no track took, for the doublets' windows.
            #[rustfmt::skip]
            self.launch("ca_free_flags", (bpe, e), &[hit_start, n_sorted, sinput, used, failed,
                scratch])?;
            #[rustfmt::skip]
            self.launch_scan(e, [scratch, free_prefix, hit_start, n_sorted, U32(0),
                failed, n_free, I32(0)])?;
            #[rustfmt::skip]
            self.launch("ca_free_hits", (bpe, e), &[hit_start, n_sorted, bin_start, I32(n_bins),
                failed, scratch, free_prefix, n_free, sx, sy, fx, fy, fmap, free_start])?;
            mark("hit_sorting: free hits", self)?;
        }
        // Doublets.
        let (fx, fy, fmap, free_start) = if opts.skip_used {
            (fx, fy, fmap, free_start)
        } else {
            (null, null, null, null)
        };
        #[rustfmt::skip]
        let dargs = |write: i32| [sx, sy, splane, hit_start, n_sorted, bin_start, fx, fy, fmap,
            free_start, n_free, I32(n_bins), plf, pli, pld, g, failed, I32(write), dbl_count,
            dbl_off, dbl_base, dbl, dgap, dcache];
        self.launch("ca_doublets", (bpe_wave, e), &dargs(0))?;
        mark("doublets: count", self)?;
        #[rustfmt::skip]
        self.launch_scan(e, [dbl_count, dbl_off, hit_start, n_sorted, U32(0), failed,
            total, I32(0)])?;
        #[rustfmt::skip]
        self.launch("ca_event_budget", (1, 1), &[total, dbl_base, dbl_n, failed, U32(e), U32(max_d),
            U32(cap_d), U32(CaStep::Doublets.code()), overflow])?;
        mark("doublets: scan", self)?;
        self.launch("ca_doublets", (bpe_wave, e), &dargs(1))?;
        mark("doublets: write", self)?;
        // Triplets.
        #[rustfmt::skip]
        let targs = |write: i32| [sx, sy, splane, hit_start, dbl_count, dbl_off, dbl_base, dbl_n,
            dbl, dgap, plf, prf, pri, tents, g, I32(n_planes), I32(reach), failed,
            I32(write), trip_count, trip_off, trip_base, tleft, tright, tqop, tsigma, tchi2,
            tplane, has_right, end_count, end_cursor];
        self.launch("ca_triplets", (bpe_wave, e), &targs(0))?;
        mark("triplets: count", self)?;
        #[rustfmt::skip]
        self.launch_scan(e, [trip_count, trip_off, dbl_base, dbl_n, U32(0), failed,
            total, I32(0)])?;
        #[rustfmt::skip]
        self.launch("ca_event_budget", (1, 1), &[total, trip_base, trip_n, failed, U32(e), U32(max_t),
            U32(cap_t), U32(CaStep::Triplets.code()), overflow])?;
        mark("triplets: scan", self)?;
        self.launch("ca_triplets", (bpe_wave, e), &targs(1))?;
        mark("triplets: write", self)?;
        if let Some(first_end) = opts.dead_ends_from_plane {
            // Dead ends: plane by plane downstream first, then the kept ones to the front.
            #[rustfmt::skip]
            self.launch("ca_dead_ends_clear", (bpe, e), &[dbl_base, dbl_n, failed, continues])?;
            for plane in (0..n_planes as u32).rev() {
                #[rustfmt::skip]
                self.launch("ca_dead_ends", (bpe, e), &[sx, sy, hit_start, dbl_base, dbl,
                    trip_base, trip_n, tleft, tright, tplane, exits, I32(n_planes),
                    U32(first_end.min(u32::MAX as usize) as u32), failed, U32(plane), continues,
                    keep])?;
            }
            #[rustfmt::skip]
            self.launch_scan(e, [keep, koff, trip_base, trip_n, U32(0), failed,
                total, I32(0)])?;
            #[rustfmt::skip]
            self.launch("ca_dead_ends_gather", (bpe, e), &[trip_base, trip_n, failed, keep, koff,
                tleft, tright, tqop, tsigma, tchi2, tplane, k_left, k_right, k_qop, k_sigma,
                k_chi2, k_plane])?;
            #[rustfmt::skip]
            self.launch("ca_dead_ends_copy_back", (bpe, e), &[trip_base, trip_n, failed, total,
                k_left, k_right, k_qop, k_sigma, k_chi2, k_plane, tleft, tright, tqop, tsigma,
                tchi2, tplane, has_right])?;
            mark("triplets: dead ends", self)?;
        }
        // Neighbours: the triplets by right doublet, then the links.
        #[rustfmt::skip]
        let eargs = |write: i32| [dbl_base, trip_base, trip_n, tright, failed, I32(write),
            end_count, end_off, end_cursor, ending];
        self.launch("ca_neighbours_ending", (bpe, e), &eargs(0))?;
        #[rustfmt::skip]
        self.launch_scan(e, [end_count, end_off, dbl_base, dbl_n, U32(0), failed,
            total, I32(0)])?;
        self.launch("ca_neighbours_ending", (bpe, e), &eargs(1))?;
        #[rustfmt::skip]
        self.launch("ca_neighbours_sort_ending", (bpe, e), &[dbl_base, dbl_n, trip_base, failed,
            end_count, end_off, ending])?;
        mark("neighbours: index", self)?;
        #[rustfmt::skip]
        let nargs = |write: i32| [dbl_base, trip_base, trip_n, tleft, tqop, tsigma, end_count,
            end_off, ending, chi2, failed, I32(write), nb_count, nb_off, nb_base, left, has_right];
        self.launch("ca_neighbours", (bpe, e), &nargs(0))?;
        mark("neighbours: count", self)?;
        #[rustfmt::skip]
        self.launch_scan(e, [nb_count, nb_off, trip_base, trip_n, U32(0), failed,
            total, I32(0)])?;
        #[rustfmt::skip]
        self.launch("ca_event_budget", (1, 1), &[total, nb_base, nb_n, failed, U32(e), U32(max_n),
            U32(cap_n), U32(CaStep::Neighbours.code()), overflow])?;
        mark("neighbours: scan", self)?;
        self.launch("ca_neighbours", (bpe, e), &nargs(1))?;
        mark("neighbours: write", self)?;
        // Evolution, plane by plane.
        for plane in 0..n_planes as u32 {
            #[rustfmt::skip]
            self.launch("ca_evolution", (bpe, e), &[trip_base, trip_n, tplane, nb_count, nb_off, nb_base,
                left, failed, U32(plane), level])?;
        }
        mark("evolution", self)?;
        if profile {
            driver("cuStreamSynchronize", self.stream.synchronize())?;
            let mut times = Vec::with_capacity(marks.len());
            for w in marks.windows(2) {
                let ms = driver("cuEventElapsedTime", w[0].1.elapsed_ms(&w[1].1))?;
                times.push((w[1].0, ms as f64));
            }
            self.times = times;
        }
        Ok(())
    }

    /// The candidate step of a pass on the last batch ([`Self::run`]): what
    /// [`crate::tracking::ca::candidates::extract_and_select`] does with `min_hits` and
    /// `append`, for every event that has not failed, on the arrays the steps left on the
    /// device. With `append`, the event's candidates, fits and accepted tracks of an
    /// earlier pass are kept and added to (the used flags are per input hit, kept since
    /// `run`); otherwise they start empty. An event where the CPU would count a candidate
    /// or track overflow, or whose candidates exceed its share of the arenas
    /// ([`CaLimits::candidate_share`]), fails with [`CaStep::Candidates`] (to be run on the
    /// CPU). Needs an engine built [`Self::with_fitter`].
    pub fn select_candidates(
        &mut self,
        min_hits: usize,
        append: bool,
    ) -> Result<CaBatchSummary, GpuError> {
        self.select_inner(min_hits, append, false)
    }

    /// [`Self::select_candidates`], timing its two kernels with device events
    /// ([`Self::kernel_times`]).
    pub fn select_candidates_profiled(
        &mut self,
        min_hits: usize,
        append: bool,
    ) -> Result<CaBatchSummary, GpuError> {
        self.select_inner(min_hits, append, true)
    }

    fn select_inner(
        &mut self,
        min_hits: usize,
        append: bool,
        profile: bool,
    ) -> Result<CaBatchSummary, GpuError> {
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let r = self
            .enqueue_candidates(min_hits, append, profile)
            .and_then(|()| self.enqueue_summary())
            .and_then(|()| {
                driver("cuStreamSynchronize", self.stream.synchronize())?;
                Ok(self.summary())
            });
        if r.is_err() {
            let _ = self.stream.synchronize();
        }
        if r.is_ok() && profile {
            let mut times = Vec::with_capacity(self.marks.len());
            for w in self.marks.windows(2) {
                let ms = driver("cuEventElapsedTime", w[0].1.elapsed_ms(&w[1].1))?;
                times.push((w[1].0, ms as f64));
            }
            self.times = times;
        }
        self.marks.clear();
        r
    }

    fn enqueue_candidates(
        &mut self,
        min_hits: usize,
        append: bool,
        profile: bool,
    ) -> Result<(), GpuError> {
        if self.fit.is_none() {
            return Err(no_fitter());
        }
        let e = self.n_events;
        if e == 0 {
            return Ok(());
        }
        let sms = self.device.multiprocessors.max(1) as usize;
        let small = match self.candidate_blocks {
            CandidateBlocks::Auto => e > sms,
            CandidateBlocks::Large => false,
            CandidateBlocks::Small => true,
        };
        let key = SequenceKey::Candidates {
            events: e as u32,
            min_hits,
            append,
            small,
        };
        self.sequence(key, profile, |s| {
            s.candidate_kernels(min_hits, append, small, profile)
        })
    }

    /// The candidate step's kernels ([`Self::enqueue_candidates`]), in blocks of
    /// `CAND_THREADS_SMALL` threads where `small`.
    fn candidate_kernels(
        &mut self,
        min_hits: usize,
        append: bool,
        small: bool,
        profile: bool,
    ) -> Result<(), GpuError> {
        use Arg::{Ptr, F64, I32, U32};
        let Some(fit) = &self.fit else {
            return Err(no_fitter());
        };
        let e = self.n_events;
        // As extract_and_select: at least three hits, end triplets of level min_hits - 2.
        let min_hits = min_hits.clamp(3, u32::MAX as usize);
        let min_level = (min_hits - 2) as u32;
        let lim = &self.tables().limits;
        let to_u32 = |v: usize| v.min(u32::MAX as usize) as u32;
        // The CPU's candidate-hit capacity (`CaBuffers::with_limits` reserves 16 per
        // candidate; a vector holds at least four).
        let hits_cap = to_u32(lim.max_candidates.saturating_mul(16).max(4));
        let (max_cand, max_tracks) = (to_u32(lim.max_candidates), to_u32(lim.max_tracks));
        let (share_c, share_h) = self.limits.candidate_share(e);
        let a = &self.a;
        let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
        let pf = |b: &DeviceBuffer<f32>| Ptr(b.ptr());
        #[rustfmt::skip]
        let order_args = [p(&a.trip_base), p(&a.trip_n), p(&a.level), p(&a.has_right),
            pf(&a.tchi2), p(&a.failed), p(&a.overflow), U32(min_level), Ptr(a.keys.ptr()),
            p(&a.n_end), p(&a.chain_off), p(&a.chain_total)];
        #[rustfmt::skip]
        let budget_args = [p(&a.chain_total), p(&a.chain_base), p(&a.chain_n), p(&a.failed),
            U32(e as u32), U32(u32::MAX), U32(to_u32(self.limits.max_chain_hits)),
            U32(CaStep::Candidates.code()), p(&a.overflow)];
        #[rustfmt::skip]
        let chain_args = |divert: bool| [p(&a.hit_start), p(&a.sinput), Ptr(a.dbl.ptr()),
            p(&a.dbl_base), p(&a.trip_base), p(&a.tleft), p(&a.tright), pf(&a.tchi2),
            pf(&a.tqop), pf(&a.tsigma), p(&a.level),
            p(&a.nb_off), p(&a.nb_count), p(&a.nb_base), p(&a.left), Ptr(a.keys.ptr()),
            p(&a.n_end), p(&a.failed), p(&a.chain_off), p(&a.chain_base), p(&a.chain_fork),
            p(&a.chain_hits), p(&a.used), I32(divert as i32)];
        #[rustfmt::skip]
        let cand_args = |a_round: bool| [pf(&a.in_x), pf(&a.in_y), p(&a.in_plane), p(&a.hit_start),
            p(&a.sinput), Ptr(a.dbl.ptr()), p(&a.dbl_base), p(&a.trip_base), p(&a.tleft),
            p(&a.tright), pf(&a.tchi2), p(&a.level), p(&a.nb_off), p(&a.nb_count),
            p(&a.nb_base), p(&a.left), Ptr(a.keys.ptr()), p(&a.n_end), p(&a.chain_off),
            p(&a.chain_base), p(&a.chain_fork), p(&a.chain_hits), p(&a.failed),
            p(&a.overflow), p(&a.used), Ptr(a.cand.ptr()), p(&a.cand_hits), p(&a.fits),
            p(&a.accepted), p(&a.n_cand), p(&a.n_cand_hits), p(&a.n_accepted),
            U32(to_u32(share_c)), U32(to_u32(share_h)), U32(max_cand), U32(hits_cap),
            U32(max_tracks), U32(min_hits as u32), F64(self.tables().max_chi2_ndf),
            I32(a_round as i32), Ptr(fit.rows32.ptr()), Ptr(fit.rows64.ptr()),
            Ptr(fit.gap_steps.ptr()), Ptr(fit.gap_kind.ptr()), Ptr(fit.gap_slice.ptr()),
            Ptr(fit.slices.ptr()), Ptr(fit.floats.ptr()), Ptr(fit.doubles.ptr()),
            Ptr(fit.ints.ptr()), Ptr(fit.nodes.ptr())];
        let divert = self.tables().divert_chains;
        let (chains1, chains2) = (chain_args(false), chain_args(true));
        let (cand1, cand2) = (cand_args(append), cand_args(true));
        self.mark_if(profile, "start")?;
        let bpe = self.blocks_per_event(e as u32);
        self.launch_block(
            "ca_candidates_order",
            (1, e as u32),
            ORDER_THREADS,
            &order_args,
        )?;
        self.launch("ca_event_budget", (1, 1), &budget_args)?;
        self.mark_if(profile, "candidates: order")?;
        self.launch("ca_candidates_chains", (bpe, e as u32), &chains1)?;
        self.mark_if(profile, "candidates: chains")?;
        let (cand, threads) = if small {
            ("ca_candidates_small", CAND_THREADS_SMALL)
        } else {
            ("ca_candidates", CAND_THREADS)
        };
        self.launch_block(cand, (1, e as u32), threads, &cand1)?;
        self.mark_if(profile, "candidates: fits, choice")?;
        if divert {
            // The second round (FinderConfig::divert_chains): the chains walked again
            // around the hits the first round's tracks took, then chosen as before.
            self.launch("ca_candidates_chains", (bpe, e as u32), &chains2)?;
            self.launch_block(cand, (1, e as u32), threads, &cand2)?;
            self.mark_if(profile, "candidates: second round")?;
        }
        if profile {
            driver("cuStreamSynchronize", self.stream.synchronize())?;
        }
        Ok(())
    }

    fn mark_if(&mut self, profile: bool, name: &'static str) -> Result<(), GpuError> {
        if profile {
            let ev = driver(
                "cuEventRecord",
                self.stream
                    .record_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT)),
            )?;
            self.marks.push((name, ev));
        }
        Ok(())
    }

    /// Reads back the accepted tracks of event `e` of the last batch after
    /// [`Self::select_candidates`], in acceptance order, and its used flags per input hit
    /// (tests and comparison; not the hot path). `None` where the event failed.
    /// Every event's accepted tracks of the last batch, packed on the device and read back
    /// in one copy per array (the hot path's read-back; a failed event has none).
    /// With `clones`, the clone step runs on the packed tracks on the device too and
    /// `out.clone` holds its marks.
    pub fn read_tracks(
        &mut self,
        clones: Option<&GpuCloneEngine>,
        out: &mut BatchTracks,
    ) -> Result<(), GpuError> {
        out.first_track.clear();
        out.n_tracks = 0;
        out.n_hits = 0;
        out.clones_marked = false;
        out.first_hits_done = false;
        out.first_hits_failed.clear();
        out.exchange_done = false;
        out.exchange_failed.clear();
        out.first_track.push(0);
        if self.n_events == 0 {
            return Ok(());
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let r = self.pack_tracks(clones, out);
        if r.is_err() {
            let _ = self.stream.synchronize();
            if let Some(c) = clones {
                let _ = c.stream().synchronize();
            }
        }
        r
    }

    /// Blocks per event for the steps over an event's items: about four per
    /// multiprocessor over a launch of `events` (a few busy events or many small ones).
    fn blocks_per_event(&self, events: u32) -> u32 {
        let sms = self.device.multiprocessors.max(1) as u32;
        (4 * sms).div_ceil(events.max(1)).clamp(1, 64)
    }

    fn pack_tracks(
        &mut self,
        clones: Option<&GpuCloneEngine>,
        out: &mut BatchTracks,
    ) -> Result<(), GpuError> {
        use Arg::{Ptr, I32, U32};
        let e = self.n_events;
        let (share_c, share_h) = self.limits.candidate_share(e);
        let a = &self.a;
        let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
        let pf = |b: &DeviceBuffer<f32>| Ptr(b.ptr());
        // The accepted tracks' fit: the candidates' tables with the track fit's
        // parameters, where there is one (`refit`: 1 in full, 2 from the candidates'
        // fits as its first fits).
        let (refit, fit_args) = match (&self.fit, &self.track_fit) {
            (Some(f), t) => {
                let (ints, floats, doubles) = match t {
                    Some((i, fl, d)) => (i.ptr(), fl.ptr(), d.ptr()),
                    None => (f.ints.ptr(), f.floats.ptr(), f.doubles.ptr()),
                };
                (
                    match t {
                        None => 0,
                        Some(_) if self.track_fit_from_candidates => 2,
                        Some(_) => 1,
                    },
                    [
                        f.rows32.ptr(),
                        f.rows64.ptr(),
                        f.gap_steps.ptr(),
                        f.gap_kind.ptr(),
                        f.gap_slice.ptr(),
                        f.slices.ptr(),
                        floats,
                        doubles,
                        ints,
                        f.nodes.ptr(),
                    ],
                )
            }
            // No candidate step without a fitter: nothing to fit (pointers unread).
            (None, _) => (0, [a.in_x.ptr(); 10]),
        };
        #[rustfmt::skip]
        let count_args = [p(&a.failed), p(&a.n_accepted), p(&a.accepted), Ptr(a.cand.ptr()),
            U32(share_c as u32), p(&a.trk_n), p(&a.trk_hits)];
        // Placing the events cannot fail: an event's tracks are among its candidates.
        let place = |total: &DeviceBuffer<u32>, base: &DeviceBuffer<u32>, cap: usize| {
            [
                p(total),
                p(base),
                p(&a.total),
                p(&a.failed),
                U32(e as u32),
                U32(u32::MAX),
                U32(cap.min(u32::MAX as usize) as u32),
                U32(0),
                p(&a.overflow),
            ]
        };
        let place_t = place(&a.trk_n, &a.trk_base, self.limits.max_candidates);
        let place_h = place(&a.trk_hits, &a.trk_hit_base, self.limits.max_candidate_hits);
        #[rustfmt::skip]
        let pack_args = [p(&a.failed), p(&a.n_accepted), p(&a.accepted), Ptr(a.cand.ptr()),
            p(&a.cand_hits), p(&a.fits), U32(share_c as u32), U32(share_h as u32),
            p(&a.trk_base), p(&a.trk_hit_base), Ptr(a.out_tracks.ptr()), p(&a.out_fits),
            p(&a.out_hits), I32(refit), pf(&a.in_x), pf(&a.in_y), p(&a.in_plane),
            p(&a.hit_start), Ptr(fit_args[0]), Ptr(fit_args[1]), Ptr(fit_args[2]),
            Ptr(fit_args[3]), Ptr(fit_args[4]), Ptr(fit_args[5]), Ptr(fit_args[6]),
            Ptr(fit_args[7]), Ptr(fit_args[8]), Ptr(fit_args[9])];
        self.launch("ca_tracks_count", (1, e as u32), &count_args)?;
        self.launch("ca_event_budget", (1, 1), &place_t)?;
        self.launch("ca_event_budget", (1, 1), &place_h)?;
        let bpe = self.blocks_per_event(e as u32);
        self.launch("ca_tracks_pack", (bpe, e as u32), &pack_args)?;
        let h = &mut self.tracks_host;
        for (k, src) in [
            &self.a.trk_n,
            &self.a.trk_hits,
            &self.a.trk_base,
            &self.a.trk_hit_base,
        ]
        .into_iter()
        .enumerate()
        {
            // SAFETY: `e` words of the device buffer into the k-th quarter of `counts`
            // (4 e words); read after the stream's synchronisation.
            driver("cuMemcpyDtoHAsync", unsafe {
                drv_sys::cuMemcpyDtoHAsync_v2(
                    h.counts.as_mut_slice()[k * e..(k + 1) * e]
                        .as_mut_ptr()
                        .cast(),
                    src.ptr(),
                    e * 4,
                    self.stream.cu_stream(),
                )
                .result()
            })?;
        }
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        // A few words per event: copied out of the pinned buffer.
        let c = h.counts.as_slice()[..4 * e].to_vec();
        let (n, nh, base, hbase) = (&c[..e], &c[e..2 * e], &c[2 * e..3 * e], &c[3 * e..4 * e]);
        let n_t = (base[e - 1] + n[e - 1]) as usize;
        let n_h = (hbase[e - 1] + nh[e - 1]) as usize;
        if let (Some(engine), true) = (clones, n_t > 0) {
            use Arg::{Ptr, U32};
            let a = &self.a;
            let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
            let pf = |b: &DeviceBuffer<f32>| Ptr(b.ptr());
            #[rustfmt::skip]
            let args = [U32(e as u32), p(&a.failed), p(&a.trk_n), p(&a.trk_base), p(&a.trk_hits),
                p(&a.trk_hit_base), p(&a.hit_start), pf(&a.in_x), pf(&a.in_y), p(&a.in_plane),
                Ptr(a.out_tracks.ptr()), p(&a.out_fits), p(&a.out_hits), p(&a.cl_event_start),
                p(&a.cl_track_hit_start), p(&a.cl_plane), pf(&a.cl_x), pf(&a.cl_y),
                Ptr(a.cl_fits.ptr())];
            self.launch("ca_tracks_clone_input", (bpe, e as u32), &args)?;
            driver("cuStreamSynchronize", self.stream.synchronize())?;
            let a = &self.a;
            engine.launch(&DeviceCloneBatch {
                shape: CloneShape {
                    n_events: e,
                    n_tracks: n_t,
                    n_hits: n_h,
                },
                event_start: &a.cl_event_start,
                track_hit_start: &a.cl_track_hit_start,
                hit_plane: &a.cl_plane,
                hit_x: &a.cl_x,
                hit_y: &a.cl_y,
                fits: &a.cl_fits,
                marks: &a.cl_marks,
            })?;
            if self.first_hits.is_some() || self.exchange.is_some() {
                // The steps read the clone marks and write their own: after the clone
                // step, on this stream (the exchange first, as the CPU), the marks copied
                // after them.
                driver("cuStreamSynchronize", engine.stream().synchronize())?;
                if self.exchange.is_some() {
                    self.launch_exchange()?;
                }
                if self.first_hits.is_some() {
                    self.launch_first_hits()?;
                }
                let a = &self.a;
                copy_to_host(&a.cl_marks, &self.tracks_host.marks, n_t, &self.stream)?;
                if let Some(f) = &self.first_hits {
                    copy_to_host(&f.failed, &f.failed_host, e, &self.stream)?;
                    out.first_hits_done = true;
                }
                if let Some(x) = &self.exchange {
                    copy_to_host(&x.failed, &x.failed_host, e, &self.stream)?;
                    out.exchange_done = true;
                }
            } else {
                let a = &self.a;
                copy_to_host(&a.cl_marks, &self.tracks_host.marks, n_t, engine.stream())?;
            }
        }
        let h = &mut self.tracks_host;
        copy_to_host(&self.a.out_tracks, &h.tracks, n_t, &self.stream)?;
        copy_to_host(&self.a.out_fits, &h.fits, n_t * FIT_WORDS, &self.stream)?;
        copy_to_host(&self.a.out_hits, &h.hits, n_h, &self.stream)?;
        driver("cuStreamSynchronize", self.stream.synchronize())?;
        out.first_track.clear();
        out.first_track.push(0);
        for k in 0..e {
            out.first_track.push(base[k] + n[k]);
        }
        out.n_tracks = n_t;
        out.n_hits = n_h;
        if let (true, Some(f)) = (out.first_hits_done, &self.first_hits) {
            out.first_hits_failed
                .extend_from_slice(&f.failed_host.as_slice()[..e]);
        }
        if let (true, Some(x)) = (out.exchange_done, &self.exchange) {
            out.exchange_failed
                .extend_from_slice(&x.failed_host.as_slice()[..e]);
        }
        if let Some(engine) = clones {
            if n_t > 0 {
                driver("cuStreamSynchronize", engine.stream().synchronize())?;
                out.clones_marked = true;
            }
        }
        Ok(())
    }

    /// Enqueues the first-hit step on the packed tracks (`kernels/ca_first_hits.cu`).
    fn launch_first_hits(&mut self) -> Result<(), GpuError> {
        use Arg::{Ptr, U32};
        let e = self.n_events;
        let (share_c, _) = self.limits.candidate_share(e);
        let (Some(fh), Some(f)) = (&self.first_hits, &self.fit) else {
            return Ok(());
        };
        let a = &self.a;
        let dt = &self.passes[self.passes.len() - 1];
        let (tpi, tpf, tpd) = match &self.track_fit {
            Some((i, fl, d)) => (i.ptr(), fl.ptr(), d.ptr()),
            None => (f.ints.ptr(), f.floats.ptr(), f.doubles.ptr()),
        };
        let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
        #[rustfmt::skip]
        let args = [p(&a.failed), p(&a.trk_n), p(&a.trk_base), p(&a.hit_start), Ptr(a.in_x.ptr()),
            Ptr(a.in_y.ptr()), p(&a.in_plane), Ptr(a.out_tracks.ptr()), p(&a.out_fits),
            p(&a.out_hits), p(&a.cl_marks), Ptr(fh.params_f64.ptr()), Ptr(fh.params_i32.ptr()),
            Ptr(dt.pair_i32.ptr()), Ptr(dt.tents.ptr()), Ptr(fh.pred_d.ptr()), p(&fh.pred_u),
            p(&fh.pool_h), Ptr(fh.pool_key.ptr()), p(&fh.claims), p(&fh.edges), p(&fh.contested),
            U32((FIRST_HIT_PAIRS_PER_SLOT * share_c).min(fh.pair_limit).min(u32::MAX as usize) as u32),
            p(&fh.chg_fit), p(&fh.failed), Ptr(f.rows32.ptr()), Ptr(f.rows64.ptr()),
            Ptr(f.gap_steps.ptr()), Ptr(f.gap_kind.ptr()), Ptr(f.gap_slice.ptr()),
            Ptr(f.slices.ptr()), Ptr(f.floats.ptr()), Ptr(f.doubles.ptr()), Ptr(f.ints.ptr()),
            Ptr(f.nodes.ptr()), Ptr(tpf), Ptr(tpd), Ptr(tpi)];
        self.launch("ca_first_hits", (1, e as u32), &args)
    }

    /// Enqueues the exchange of segments on the packed tracks (`kernels/ca_exchange.cu`):
    /// its first kernel, every round's ([`crate::tracking::ca::exchange::MAX_ROUNDS`]; an
    /// event whose exchanges are done leaves each at once), its last.
    fn launch_exchange(&mut self) -> Result<(), GpuError> {
        use crate::tracking::ca::exchange::MAX_ROUNDS;
        use Arg::{Ptr, I32, U32};
        let e = self.n_events;
        let (Some(x), Some(f)) = (&self.exchange, &self.fit) else {
            return Ok(());
        };
        let a = &self.a;
        // The hits sorted into the grid at the launch's start (every pass has the same
        // grid: the first's tables).
        let grid = &self.passes[0];
        // The tents of the last pass's tables (the kinks' bending, as the first hits').
        let last = &self.passes[self.passes.len() - 1];
        let (tpi, tpf, tpd) = match &self.track_fit {
            Some((i, fl, d)) => (i.ptr(), fl.ptr(), d.ptr()),
            None => (f.ints.ptr(), f.floats.ptr(), f.doubles.ptr()),
        };
        let p = |b: &DeviceBuffer<u32>| Ptr(b.ptr());
        #[rustfmt::skip]
        let args = [p(&a.failed), p(&a.trk_n), p(&a.trk_base), p(&a.trk_hit_base),
            p(&a.hit_start), Ptr(a.in_x.ptr()), Ptr(a.in_y.ptr()), p(&a.in_plane),
            Ptr(a.out_tracks.ptr()), p(&a.out_fits), p(&a.out_hits), p(&a.cl_marks),
            Ptr(x.params_f32.ptr()), Ptr(x.params_f64.ptr()), Ptr(x.params_i32.ptr()),
            p(&x.lists), p(&x.lens), Ptr(x.chi2.ptr()), Ptr(x.qop.ptr()), Ptr(x.first.ptr()),
            p(&x.flags),
            p(&x.owner), Ptr(a.sx.ptr()), p(&a.sinput), p(&a.bin_start),
            I32(grid.tables.n_bins as i32), Ptr(grid.plane_f32.ptr()), Ptr(grid.plane_i32.ptr()),
            p(&x.pairs),
            Ptr(x.gains.ptr()), U32(EXCHANGE_PAIRS_PER_TRACK as u32),
            U32(x.pair_limit.min(u32::MAX as usize) as u32), p(&x.state), p(&x.failed),
            p(&x.active),
            Ptr(f.rows32.ptr()), Ptr(f.rows64.ptr()), Ptr(f.gap_steps.ptr()),
            Ptr(f.gap_kind.ptr()), Ptr(f.gap_slice.ptr()), Ptr(f.slices.ptr()),
            Ptr(f.floats.ptr()), Ptr(f.doubles.ptr()), Ptr(f.ints.ptr()), Ptr(f.nodes.ptr()),
            Ptr(tpf), Ptr(tpd), Ptr(tpi), Ptr(last.pair_i32.ptr()), Ptr(last.tents.ptr()),
            Ptr(x.q.ptr())];
        let sms = self.device.multiprocessors.max(1) as u32;
        let wide = (EXCHANGE_BLOCKS_PER_SM * sms)
            .div_ceil(e.max(1) as u32)
            .clamp(1, EXCHANGE_MAX_BLOCKS);
        // The pairs' search takes a thread per hit of a changed track in the first round,
        // a group of lanes per hit in the later ones (`EX_SEARCH_LANES`): more blocks.
        let search = (4 * wide).min(4 * EXCHANGE_MAX_BLOCKS);
        let ev = e as u32;
        self.launch("ca_exchange_begin", (1, ev), &args)?;
        for round in 0..MAX_ROUNDS {
            if round > 0 {
                self.launch("ca_exchange_fit_changed", (wide, ev), &args)?;
            }
            let pairs = if round == 0 {
                "ca_exchange_pairs"
            } else {
                "ca_exchange_pairs_changed"
            };
            self.launch(pairs, (search, ev), &args)?;
            self.launch("ca_exchange_fit_needed", (wide, ev), &args)?;
            self.launch("ca_exchange_evaluate", (wide, ev), &args)?;
            if let Some(x) = &self.exchange {
                self.zero(&x.active, 1)?;
            }
            self.launch("ca_exchange_choose", (1, ev), &args)?;
            // The rounds end where no event made an exchange in this one.
            if let Some(x) = &self.exchange {
                copy_to_host(&x.active, &x.active_host, 1, &self.stream)?;
                driver("cuStreamSynchronize", self.stream.synchronize())?;
                if x.active_host.as_slice()[0] == 0 {
                    break;
                }
            }
        }
        self.launch("ca_exchange_end", (1, ev), &args)
    }

    /// The blocks the candidate step runs in (default [`CandidateBlocks::Auto`]).
    pub fn set_candidate_blocks(&mut self, blocks: CandidateBlocks) {
        self.candidate_blocks = blocks;
    }

    /// Host threads that lay a large batch's hits out for the copy up, and that the
    /// tracker writes a large launch's tracks on (default: the host's cores, at most 8).
    pub fn set_host_threads(&mut self, threads: usize) {
        self.host_threads = threads.clamp(1, 8);
    }

    pub fn host_threads(&self) -> usize {
        self.host_threads
    }

    /// The tracks [`Self::read_tracks`] read back into `b`, where they lie (valid until the
    /// engine's next read).
    pub fn tracks_view<'a>(&'a self, b: &'a BatchTracks) -> BatchView<'a> {
        let h = &self.tracks_host;
        let (n_t, n_h) = (b.n_tracks, b.n_hits);
        BatchView {
            first_track: &b.first_track,
            track_hits: &h.tracks.as_slice()[..n_t],
            fits: &h.fits.as_slice()[..n_t * FIT_WORDS],
            hits: &h.hits.as_slice()[..n_h],
            marks: if b.clones_marked {
                &h.marks.as_slice()[..n_t]
            } else {
                &[]
            },
        }
    }

    pub fn event_tracks(&self, e: usize) -> Result<Option<CaEventTracks>, GpuError> {
        if e >= self.n_events {
            return Err(GpuError::Config(format!(
                "event {e} is not in the batch of {}",
                self.n_events
            )));
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        if self.read(&self.a.failed, e, 1)?[0] != 0 {
            return Ok(None);
        }
        let (share_c, share_h) = self.limits.candidate_share(self.n_events);
        let bounds = self.read(&self.a.hit_start, e, 2)?;
        let (hs, n_in) = (bounds[0] as usize, (bounds[1] - bounds[0]) as usize);
        let nc = self.read(&self.a.n_cand, e, 1)?[0] as usize;
        let nh = self.read(&self.a.n_cand_hits, e, 1)?[0] as usize;
        let na = self.read(&self.a.n_accepted, e, 1)?[0] as usize;
        let accepted = self.read(&self.a.accepted, e * share_c, na)?;
        let cands = self.read(&self.a.cand, e * share_c, nc)?;
        let hits = self.read(&self.a.cand_hits, e * share_h, nh)?;
        let fits = self.read(&self.a.fits, e * share_c * FIT_WORDS, nc * FIT_WORDS)?;
        let mut tracks = Vec::with_capacity(na);
        for &k in &accepted {
            let k = k as usize;
            let c = cands.get(k).ok_or_else(|| {
                GpuError::Config(format!("accepted candidate {k} of {nc} in event {e}"))
            })?;
            let (start, len) = (c[0] as usize, c[1] as usize);
            let h = hits.get(start..start + len).ok_or_else(|| {
                GpuError::Config(format!("candidate {k} hits past {nh} in event {e}"))
            })?;
            tracks.push(CaTrack {
                hits: h.to_vec(),
                fit: fit_of_words(&fits[k * FIT_WORDS..(k + 1) * FIT_WORDS]),
            });
        }
        let used = self
            .read(&self.a.used, hs, n_in)?
            .into_iter()
            .map(|u| u != 0)
            .collect();
        Ok(Some(CaEventTracks { tracks, used }))
    }

    fn read<T: Copy + Default>(
        &self,
        buf: &DeviceBuffer<T>,
        offset: usize,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let mut out = vec![T::default(); len];
        if len == 0 {
            return Ok(out);
        }
        if offset + len > buf.len() {
            return Err(GpuError::Config(format!(
                "read of {len} elements at {offset} past a buffer of {}",
                buf.len()
            )));
        }
        // SAFETY: bounds checked; synchronous copy into `out`.
        driver("cuMemcpyDtoH", unsafe {
            drv::memcpy_dtoh_sync(&mut out, buf.ptr_at(offset))
        })?;
        Ok(out)
    }

    /// Enqueues the copies of the per-event summary (failure codes, overflow counts, the
    /// steps' counts) into one pinned buffer, read after the stream's one synchronisation.
    fn enqueue_summary(&mut self) -> Result<(), GpuError> {
        let e = self.n_events;
        let a = &self.a;
        let parts: [(&DeviceBuffer<u32>, usize); 8] = [
            (&a.failed, e),
            (&a.overflow, 8),
            (&a.n_sorted, e),
            (&a.dbl_n, e),
            (&a.trip_n, e),
            (&a.nb_n, e),
            (&a.n_cand, e),
            (&a.n_accepted, e),
        ];
        let host = self.summary_host.as_mut_slice();
        let mut at = 0;
        for (src, n) in parts {
            if at + n > host.len() || n > src.len() {
                return Err(GpuError::Config("summary larger than its buffer".into()));
            }
            // SAFETY: `n` elements fit both the device buffer and the pinned buffer from
            // `at`; the host reads them only after synchronising the stream.
            driver("cuMemcpyDtoHAsync", unsafe {
                drv_sys::cuMemcpyDtoHAsync_v2(
                    host[at..].as_mut_ptr().cast(),
                    src.ptr(),
                    n * 4,
                    self.stream.cu_stream(),
                )
                .result()
            })?;
            at += n;
        }
        Ok(())
    }

    /// The summary copied by [`Self::enqueue_summary`] (the stream synchronised).
    fn summary(&self) -> CaBatchSummary {
        let e = self.n_events;
        let host = self.summary_host.as_slice();
        let (failed_codes, rest) = host.split_at(e);
        let (ov, rest) = rest.split_at(8);
        let (hits, rest) = rest.split_at(e);
        let (doublets, rest) = rest.split_at(e);
        let (triplets, rest) = rest.split_at(e);
        let (neighbours, rest) = rest.split_at(e);
        let (candidates, rest) = rest.split_at(e);
        let tracks = &rest[..e];
        let failed: Vec<Option<CaStep>> =
            failed_codes.iter().map(|&c| CaStep::from_code(c)).collect();
        let zero_if = |v: &[u32], step: u32| -> Vec<u32> {
            v.iter()
                .zip(failed_codes)
                .map(|(&n, &f)| if f != 0 && f <= step { 0 } else { n })
                .collect()
        };
        CaBatchSummary {
            overflow: [ov[1], ov[2], ov[3], ov[4], ov[5]],
            hits: zero_if(hits, 1),
            doublets: zero_if(doublets, 2),
            triplets: zero_if(triplets, 3),
            neighbours: zero_if(neighbours, 4),
            candidates: zero_if(candidates, 5),
            tracks: zero_if(tracks, 5),
            failed,
        }
    }

    /// Reads back the arrays of event `e` of the last batch (tests and comparison; not the
    /// hot path). `None` where the event failed.
    pub fn event_result(&self, e: usize) -> Result<Option<CaEventResult>, GpuError> {
        if e >= self.n_events {
            return Err(GpuError::Config(format!(
                "event {e} is not in the batch of {}",
                self.n_events
            )));
        }
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        if self.read(&self.a.failed, e, 1)?[0] != 0 {
            return Ok(None);
        }
        let hs = self.read(&self.a.hit_start, e, 1)?[0] as usize;
        let nh = self.read(&self.a.n_sorted, e, 1)?[0] as usize;
        let nb = self.tables().n_bins + 1;
        let db = self.read(&self.a.dbl_base, e, 1)?[0] as usize;
        let nd = self.read(&self.a.dbl_n, e, 1)?[0] as usize;
        let tb = self.read(&self.a.trip_base, e, 1)?[0] as usize;
        let nt = self.read(&self.a.trip_n, e, 1)?[0] as usize;
        let nbb = self.read(&self.a.nb_base, e, 1)?[0] as usize;
        let nn = self.read(&self.a.nb_n, e, 1)?[0] as usize;
        let input_index = self.read(&self.a.sinput, hs, nh)?;
        let bin_start = self.read(&self.a.bin_start, e * nb, nb)?;
        let records = self.read(&self.a.dbl, db, nd)?;
        let gap = self.read(&self.a.dgap, db, nd)?;
        let doublets = records
            .iter()
            .map(|r| Doublet {
                a: r[0],
                b: r[1],
                tx: f32::from_bits(r[2]),
                ty: f32::from_bits(r[3]),
            })
            .collect();
        let dbl_off = self.read(&self.a.dbl_off, hs, nh)?;
        let mut dbl_start = dbl_off;
        dbl_start.push(nd as u32);
        let (tl, tr, tq, ts, tc) = (
            self.read(&self.a.tleft, tb, nt)?,
            self.read(&self.a.tright, tb, nt)?,
            self.read(&self.a.tqop, tb, nt)?,
            self.read(&self.a.tsigma, tb, nt)?,
            self.read(&self.a.tchi2, tb, nt)?,
        );
        let triplets = (0..nt)
            .map(|k| Triplet {
                left: tl[k],
                right: tr[k],
                qop: tq[k],
                qop_sigma: ts[k],
                chi2: tc[k],
            })
            .collect();
        let mut left_start = self.read(&self.a.nb_off, tb, nt)?;
        left_start.push(nn as u32);
        let left = self.read(&self.a.left, nbb, nn)?;
        let has_right = self
            .read(&self.a.has_right, tb, nt)?
            .into_iter()
            .map(|v| v != 0)
            .collect();
        let level = self
            .read(&self.a.level, tb, nt)?
            .into_iter()
            .map(|v| v.min(u16::MAX as u32) as u16)
            .collect();
        Ok(Some(CaEventResult {
            input_index,
            bin_start,
            doublets,
            gap,
            dbl_start,
            triplets,
            left_start,
            left,
            has_right,
            level,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::geometry::Detector;
    use std::path::Path;

    #[test]
    fn hits_laid_out_on_several_threads_are_those_of_one() {
        // Events of uneven sizes, some empty, more events than threads and fewer.
        let events: Vec<Vec<HitRecord>> = (0..37)
            .map(|e| {
                (0..(e * 7919) % 53)
                    .map(|i| HitRecord {
                        x_mm: e as f32 + i as f32 * 0.25,
                        y_mm: -(i as f32),
                        z_mm: 0.0,
                        plane: (i % 9) as u16,
                        hit_id: i as u32,
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[HitRecord]> = events.iter().map(|e| e.as_slice()).collect();
        let n: usize = refs.iter().map(|e| e.len()).sum();
        let run = |threads: usize, refs: &[&[HitRecord]]| {
            let n: usize = refs.iter().map(|e| e.len()).sum();
            let (mut x, mut y, mut p) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![u32::MAX; n]);
            pack_hits(refs, &mut x, &mut y, &mut p, threads);
            (x, y, p)
        };
        let one = run(1, &refs);
        let mut k = 0;
        for ev in &events {
            for h in ev {
                assert_eq!(
                    (one.0[k], one.1[k], one.2[k]),
                    (h.x_mm, h.y_mm, h.plane as u32)
                );
                k += 1;
            }
        }
        assert_eq!(k, n);
        for threads in [2, 3, 8, 64] {
            assert_eq!(run(threads, &refs), one, "{threads} threads");
            assert_eq!(run(threads, &refs[..1]), run(1, &refs[..1]));
        }
    }

    #[test]
    fn the_engine_can_move_to_a_worker_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<GpuCaEngine>();
    }

    #[test]
    fn tables_are_the_cpu_finders_own() {
        let det = Detector::from_toml_file(Path::new("fixtures/detector.toml")).unwrap();
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        for reach in 1..=MAX_REACH {
            let t = CaTables::new(&geo, &cfg, reach);
            let n = geo.planes.len();
            assert_eq!((t.n_planes, t.n_bins, t.reach), (n, geo.n_bins, reach));
            for i in 0..n {
                let pw = PlaneWindows::new(&geo, &cfg, i, reach);
                assert_eq!(t.plane_i32[i * PLI + 3] as usize, pw.n_target);
                assert_eq!(pw.n_target, reach.min(n - 1 - i));
                assert_eq!(t.plane_i32[i * PLI + 2] as usize, geo.planes[i].bin_offset);
                for k in 0..pw.n_target {
                    assert_eq!(t.plane_i32[i * PLI + 4 + k] as usize, i + 1 + k);
                    assert_eq!(t.plane_f64[i * PLD + k], pw.targets[k].inv_dz);
                    assert_eq!(t.plane_f32[i * PLF + 8 + 8 * k], pw.targets[k].dz);
                }
            }
            let p = &geo.pair_lanes[n + 2];
            assert_eq!(t.pair_f32[(n + 2) * PRF + 3], p.hard_kx);
            assert_eq!(t.pair_f32[(n + 2) * PRF + 7], p.n_triples as f32);
            // A uniform field: its value, no tent tables.
            assert_eq!(t.globals[14], 1.0);
            assert!(t.tents.is_empty());
            assert!(t.pair_i32.iter().all(|&k| k == -1));
            assert_eq!(t.globals[9], cfg.n_sigma as f32);
        }
        // A long origin: its constants per plane and per plane pair (a thin one's are 0
        // and 1).
        for half_z in [0.0, 40.0] {
            let cfg = FinderConfig {
                origin_half_z_mm: half_z,
                ..cfg.clone()
            };
            let geo = FinderGeometry::new(&det, &cfg);
            let t = CaTables::new(&geo, &cfg, 2);
            let n = geo.planes.len();
            for i in 0..n {
                let pw = PlaneWindows::new(&geo, &cfg, i, 2);
                let f = &t.plane_f32[i * PLF..(i + 1) * PLF];
                assert_eq!((f[32], f[33]), (pw.hz_inv_a, pw.box_scale));
                let lever = geo.planes[i].z_mm - cfg.origin_z_mm;
                let want = (half_z / lever) as f32;
                assert!(
                    (f[32] - want).abs() <= 1e-6 * want.max(1.0),
                    "{} {want}",
                    f[32]
                );
                assert_eq!(f[33] == 1.0, half_z == 0.0);
            }
            let p = &geo.pair_lanes[n + 2];
            assert_eq!(t.pair_f32[(n + 2) * PRF + 17], p.hard_slope);
            assert_eq!(t.pair_f32[(n + 2) * PRF + 18], p.kappa_rel);
            assert_eq!(p.hard_slope > 0.0 && p.kappa_rel > 0.0, half_z > 0.0);
        }
        // A field map: every tent table of the CPU's bending, once each.
        let det =
            Detector::from_toml_file(Path::new("fixtures/tracking/forward/detector_forward.toml"))
                .unwrap();
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let t = CaTables::new(&geo, &cfg, 2);
        assert_eq!(t.globals[14], 0.0);
        let tables = geo.bending.pointing.iter().flatten().count()
            + geo.bending.triple.iter().flatten().count();
        assert_eq!(t.tents.len(), tables * TENT_FLOATS);
        let n = geo.planes.len();
        let k = t.pair_i32[(n + 2) * PRI + 1] as usize;
        let tab = geo.bending.triple(1, 2, 0).unwrap();
        let (t0, inv, b) = tab.nodes();
        assert_eq!(
            &t.tents[k * TENT_FLOATS..k * TENT_FLOATS + 4],
            &[t0[0], t0[1], inv[0], inv[1]]
        );
        assert_eq!(t.tents[k * TENT_FLOATS + 4 + 3 * 20 + 1], b[20][1]);
    }

    /// The value of `#define NAME` in the step whose source defines `kernel`.
    /// The value of `#define NAME` in `src`, without a trailing comment.
    fn source_define(src: &str, name: &str) -> String {
        let prefix = format!("#define {name} ");
        let line = src.lines().find(|l| l.starts_with(&prefix));
        let line = line.unwrap_or_else(|| panic!("{name} is defined in the kernel's source"));
        line[prefix.len()..]
            .split("//")
            .next()
            .unwrap()
            .trim()
            .to_string()
    }

    fn kernel_define(kernel: &str, name: &str) -> String {
        let src = std::iter::once(&COMMON)
            .chain(STEPS.iter())
            .find(|s| {
                // `void NAME(`, or `void __launch_bounds__(...) NAME(`, perhaps with the
                // name on a line of its own.
                let call = format!("{kernel}(");
                s.lines().any(|l| {
                    l.trim_start().starts_with(&call)
                        || l.contains(&format!("void {call}"))
                        || l.contains(&format!(") {call}"))
                })
            })
            .unwrap_or_else(|| panic!("{kernel} is in one of the steps"));
        let prefix = format!("#define {name} ");
        let line = src
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{name} is not defined beside {kernel}"));
        line[prefix.len()..].trim().to_string()
    }

    #[test]
    fn the_candidate_kernels_constants_are_the_cpus() {
        use crate::tracking::ca::candidates::{CHUNK, FORK_CHI2, MAX_CHAIN};
        let def = |name: &str| kernel_define("ca_candidates_order", name);
        assert_eq!(def("CAND_CHUNK"), CHUNK.to_string());
        assert_eq!(def("ORDER_THREADS"), ORDER_THREADS.to_string());
        assert_eq!(def("MAX_CHAIN"), MAX_CHAIN.to_string());
        assert_eq!(def("FORK_CHI2"), format!("{FORK_CHI2:.1}f"));
        assert_eq!(def("FIT_WORDS"), FIT_WORDS.to_string());
        assert_eq!(def("CAND_THREADS"), CAND_THREADS.to_string());
        assert_eq!(def("CAND_THREADS_SMALL"), CAND_THREADS_SMALL.to_string());
    }

    /// The first-hit kernel's bounds and layout are the CPU step's and the host's.
    #[test]
    fn the_first_hit_kernels_constants_are_the_cpus() {
        use crate::tracking::ca::first_hits::{
            HOLD, MATCH_COLS, MATCH_ROWS, MAX_PAIRS_PER_TRACK, MAX_WINDOW_ROWS, SPOT_FLOOR,
            SPOT_SAMPLE, SPOT_TRACKS,
        };
        let src = include_str!("../../kernels/ca_first_hits.cu");
        assert!(STEPS.contains(&src));
        let def = |name: &str| source_define(src, name);
        assert_eq!(def("FH_HOLD").parse::<f64>().unwrap(), HOLD);
        assert_eq!(def("FH_SPOT_FLOOR").parse::<f64>().unwrap(), SPOT_FLOOR);
        assert_eq!(
            def("FH_NEAR_ORIGIN_RATIO").parse::<f64>().unwrap(),
            crate::tracking::ca::first_hits::NEAR_ORIGIN_RATIO
        );
        assert_eq!(def("FH_MAX_WINDOW_ROWS"), MAX_WINDOW_ROWS.to_string());
        assert_eq!(
            def("FH_MAX_PAIRS_PER_TRACK"),
            MAX_PAIRS_PER_TRACK.to_string()
        );
        assert_eq!(def("FH_SPOT_TRACKS"), SPOT_TRACKS.to_string());
        assert_eq!(def("FH_MATCH_ROWS"), MATCH_ROWS.to_string());
        assert_eq!(def("FH_MATCH_COLS"), MATCH_COLS.to_string());
        assert_eq!(def("FH_SPOT_SAMPLE"), SPOT_SAMPLE.to_string());
        assert_eq!(def("FH_MAX_PLANES"), FIRST_HIT_MAX_PLANES.to_string());
        assert_eq!(def("FHD_PLANES"), FIRST_HIT_PARAMS.to_string());
        assert_eq!(def("FHD_K"), FIRST_HIT_K.to_string());
        assert_eq!(def("FH_THREADS"), FIRST_HIT_THREADS.to_string());
        // The spot's sample (at most 2 SPOT_SAMPLE - 1) fits the shared sort of 1,024.
        const { assert!(2 * SPOT_SAMPLE - 1 <= 1024) };
    }

    #[test]
    fn the_exchange_kernels_constants_are_the_cpus() {
        use crate::tracking::ca::exchange::{
            FIRST_HIT_SLACK, MAX_ROUNDS, MIN_GAIN, PRE_TEST, RETRY_WITHIN,
        };
        let src = include_str!("../../kernels/ca_exchange.cu");
        assert!(STEPS.contains(&src));
        // Float literals without their suffix.
        let def = |name: &str| source_define(src, name).trim_end_matches('f').to_string();
        assert_eq!(def("EX_MIN_GAIN").parse::<f32>().unwrap(), MIN_GAIN);
        assert_eq!(def("EX_PRE_TEST").parse::<f64>().unwrap(), PRE_TEST);
        assert_eq!(def("EX_RETRY_WITHIN").parse::<f32>().unwrap(), RETRY_WITHIN);
        assert_eq!(def("EX_MAX_ROUNDS"), MAX_ROUNDS.to_string());
        assert_eq!(def("EX_MAX_PLANES"), EXCHANGE_MAX_PLANES.to_string());
        assert_eq!(def("EX_THREADS"), EXCHANGE_THREADS.to_string());
        assert_eq!(def("EX_WIDE_THREADS"), THREADS.to_string());
        assert_eq!(def("EX_STATE"), EXCHANGE_STATE_WORDS.to_string());
        assert_eq!(def("EXF_PLANES"), EXCHANGE_F32.to_string());
        assert_eq!(def("EXD_PLANES"), EXCHANGE_F64.to_string());
        assert_eq!(def("EXD_PER_PLANE"), EXCHANGE_F64_PER_PLANE.to_string());
        let first_hit_min = def("EX_FIRST_HIT_MIN");
        let first_hit_min = first_hit_min.trim_matches(|c| c == '(' || c == ')');
        assert_eq!(
            first_hit_min.parse::<f64>().unwrap(),
            (MIN_GAIN - FIRST_HIT_SLACK) as f64
        );
        // The pair's word: tracks in 13 bits, the boundary (at most the planes) in 6.
        assert_eq!(def("EX_MAX_TRACKS"), (1 << 13).to_string());
        const { assert!(EXCHANGE_MAX_PLANES < 64) };
    }

    #[test]
    fn the_doublet_kernels_cache_is_the_hosts() {
        assert_eq!(
            kernel_define("ca_doublets", "DBL_CACHE"),
            DBL_CACHE.to_string()
        );
    }

    #[test]
    fn the_block_sizes_are_the_kernels() {
        let def = |name: &str| kernel_define("ca_event_scan", name);
        assert_eq!(def("CA_THREADS"), THREADS.to_string());
        assert_eq!(def("SCAN_THREADS"), SCAN_THREADS.to_string());
        assert_eq!(
            def("SCAN_ITEMS").parse::<usize>().unwrap() * SCAN_THREADS as usize,
            SCAN_TILE
        );
        assert_eq!(
            1u32 << def("SCAN_EPOCH_BITS").parse::<u32>().unwrap(),
            SCAN_EPOCHS
        );
        assert_eq!(def("ITEM_MIN_BLOCKS"), ITEM_BLOCKS_PER_SM.to_string());
    }

    #[test]
    fn arenas_are_sized_from_the_limits() {
        let l = CaLimits {
            max_events: 10,
            max_hits: 1000,
            max_doublets: 5000,
            max_triplets: 6000,
            max_neighbours: 7000,
            max_candidates: 100,
            max_candidate_hits: 1600,
            max_chain_hits: 5000,
        };
        assert!(l.validate().is_ok());
        assert_eq!(
            l.device_bytes(99),
            4 * ((16 + 16) * 1000
                + 4 * 10 * 100
                + 25 * 10
                + 2
                + 11 * 5000
                + 2 * ((6000 / 2048 + 10 + 1) + 10)
                + 26 * 6000
                + 7000
                + (29 + 26 + 44) * 100
                + 5 * 1600
                + 5000)
        );
        // Each event of a batch gets an equal share of the candidate arenas.
        assert_eq!(l.candidate_share(10), (10, 160));
        assert_eq!(l.candidate_share(3), (33, 533));
        for bad in [
            CaLimits { max_events: 0, ..l },
            CaLimits {
                max_events: 70_000,
                ..l
            },
            CaLimits {
                max_doublets: usize::MAX / 4,
                ..l
            },
            CaLimits {
                max_candidates: 0,
                ..l
            },
        ] {
            assert!(bad.validate().is_err());
        }
        assert_eq!(CaStep::from_code(3), Some(CaStep::Triplets));
        assert_eq!(CaStep::from_code(0), None);
        assert_eq!(CaStep::Neighbours.name(), "neighbours");
        assert_eq!(CaStep::from_code(5), Some(CaStep::Candidates));
        assert_eq!(CaStep::Candidates.name(), "candidates");
    }
}
