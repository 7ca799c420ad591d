//! Triplets: two doublets `(a, b)` and `(b, c)` sharing the middle hit.
//!
//! Tracks come from the origin region, so the doublet `(a, b)` and the origin define a
//! parabola whose curvature gives a first q/p estimate; the continuation `(b, c)` must
//! have the slope this parabola predicts, within a window made of the origin's half size
//! (a hard bound) plus `n_sigma` times the Gaussian errors (scattering upstream of `b`, at
//! `b` and at skipped planes, and the hit resolution). The scattering terms use the
//! largest |q/p| the doublet allows (its pointing estimate plus its uncertainty, at most
//! the momentum cut), so stiff doublets get narrow windows.
//!
//! The change of slope at `b` is then split into the part the field explains (the
//! triplet's own curvature estimate q/p, from the bending direction of the equations of
//! motion at `b`) and the rest, the breaking angle, which multiple scattering and the hit
//! resolution must explain: its chi-square is computed at the largest |q/p| both estimates
//! allow and cut at `triplet_chi2_max`; |q/p| must stay below the momentum cut within its
//! resolution.
//!
//! The step runs in three phases over chunks of [`CHUNK`] doublets, in `f32` on lanes of
//! [`LANES`] (the layout the GPU shares, and vector instructions on the CPU): the windows
//! of every doublet of the chunk (lane-parallel, no branches), the search of the
//! continuations inside them (every outgoing doublet of the middle hit, a handful, compared
//! eight at a time against the window of its plane triple: no search structure, no
//! branches but the loop), and the kink test of the pairs found (lane-parallel). Pairs
//! are tested in the order they were found, so triplets come out ordered by left doublet
//! and, within one, by right doublet, whatever the chunking.

// Negated comparisons keep NaN out of every window (a NaN fails each test); the lane
// loops index several arrays by lane.
#![allow(clippy::neg_cmp_op_on_partial_ord, clippy::needless_range_loop)]

use super::cuts::FinderConfig;
use super::doublets::{box_cells, scan_cells, slopes, PlaneWindows};
use super::neighbours::compatible;
use super::{
    push_doublet, CaBuffers, Doublet, DoubletLanes, FinderGeometry, Kernel, SortedHits, Triplet,
    MAX_REACH,
};
use crate::tracking::geometry::Field;
use crate::tracking::propagate::K_GEV_PER_T_MM;

/// Lanes of the lane-parallel phases.
pub const LANES: usize = 8;
/// Doublets per chunk (a multiple of [`LANES`]).
pub const CHUNK: usize = 128;
const _: () = assert!(CHUNK % LANES == 0 && PAIRS % LANES == 0);
/// Capacity of the pair buffer (`CaBuffers::trip_candidates`): pairs are tested whenever
/// it is full.
pub const CANDIDATES: usize = 1024;

/// A pair of doublets inside each other's windows: left doublet (index in its chunk),
/// right doublet, and which plane triple (`s`: next plane or one skipped).
#[derive(Debug, Clone, Copy, Default)]
pub struct Candidate {
    pub left: u32,
    pub right: u32,
    pub s: u32,
}

/// The cuts of one call, in `f32`.
#[derive(Clone, Copy)]
pub(crate) struct Cuts {
    pub(crate) qop_max: f32,
    pub(crate) n_sigma: f32,
    pub(crate) mass2: f32,
    pub(crate) sf2_max: f32,
    pub(crate) chi2_max: f32,
    pub(crate) fit_momentum: f32,
    /// Uniform field, tesla (`None`: the tent-weighted mean fields of
    /// [`super::bending`], looked up at each middle hit).
    pub(crate) uniform: Option<[f32; 3]>,
    /// Slope limits of the doublets.
    pub(crate) max_t: [f32; 2],
    /// Largest plane distance of the doublets (1 to [`MAX_REACH`]).
    pub(crate) reach: u8,
    /// The origin's centre in x and y, mm: the pointing parabolas and the tents' slopes
    /// are taken from it.
    pub(crate) origin: [f32; 2],
}

/// Per doublet of a chunk: its slopes, field and windows on the continuation's slope
/// (kept in `CaBuffers::trip_windows` between calls).
#[derive(Debug)]
pub struct ChunkWindows {
    t1x: [f32; CHUNK],
    t1y: [f32; CHUNK],
    /// The tent-weighted mean field of each plane triple (`s`), per component.
    bg: [[[f32; CHUNK]; 3]; MAX_REACH],
    q_hi: [f32; CHUNK],
    /// Index of the plane pair's [`super::PairLanes`].
    pair: [u32; CHUNK],
    pred_x: [[f32; CHUNK]; MAX_REACH],
    pred_y: [[f32; CHUNK]; MAX_REACH],
    wx: [[f32; CHUNK]; MAX_REACH],
    wy: [[f32; CHUNK]; MAX_REACH],
    /// The union of the windows in x (`lo > hi` when there is none).
    lo: [f32; CHUNK],
    hi: [f32; CHUNK],
}

impl ChunkWindows {
    pub fn new() -> Box<Self> {
        Box::new(ChunkWindows {
            t1x: [0.0; CHUNK],
            t1y: [0.0; CHUNK],
            bg: [[[0.0; CHUNK]; 3]; MAX_REACH],
            q_hi: [0.0; CHUNK],
            pair: [0; CHUNK],
            pred_x: [[0.0; CHUNK]; MAX_REACH],
            pred_y: [[0.0; CHUNK]; MAX_REACH],
            wx: [[0.0; CHUNK]; MAX_REACH],
            wy: [[0.0; CHUNK]; MAX_REACH],
            lo: [0.0; CHUNK],
            hi: [0.0; CHUNK],
        })
    }
}

/// Squared [`super::slope_factor`] (one square root).
#[inline(always)]
fn slope_factor2(tx: f32, ty: f32) -> f32 {
    let t = tx.abs().max(ty.abs());
    let n2 = 1.0 + tx * tx + ty * ty;
    (1.0 + t * t) * n2 * n2.sqrt()
}

/// Curvature terms of the equations of motion (as [`crate::tracking::propagate::bending`]).
#[inline(always)]
fn bending(tx: f32, ty: f32, b: [f32; 3]) -> (f32, f32) {
    let ax = tx * ty * b[0] - (1.0 + tx * tx) * b[1] + ty * b[2];
    let ay = (1.0 + ty * ty) * b[0] - tx * ty * b[1] - tx * b[2];
    (ax, ay)
}

/// Fills `buf.triplets` (ordered by left doublet); `reach`
/// is the largest plane distance of the doublets (as given to
/// [`super::doublets::find_doublets`]).
pub fn find_triplets(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    find_triplets_with(Kernel::detect(), geo, cfg, reach, buf)
}

/// [`find_triplets`] with the given kernel (the portable one where the CPU lacks it).
pub fn find_triplets_with(
    kernel: Kernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    buf: &mut CaBuffers,
) {
    dispatch(kernel, geo, cfg, Search::Full { reach }, buf)
}

/// Which search a call of the step makes.
#[derive(Clone, Copy)]
enum Search {
    /// Every doublet is a left doublet ([`find_triplets`]).
    Full { reach: usize },
    /// Upstream from the seed planes ([`find_triplets_seeded`]).
    Seeded {
        seed_planes: usize,
        to_last_plane: bool,
        /// Right doublets of a middle hit from which its left doublets' windows are
        /// computed once each ([`WINDOW_PER_LEFT_FROM`]).
        window_per_left_from: usize,
    },
}

fn dispatch(
    kernel: Kernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    search: Search,
    buf: &mut CaBuffers,
) {
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        unsafe { search_avx2(geo, cfg, search, buf) };
        return;
    }
    let _ = kernel;
    search_portable(geo, cfg, search, buf)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn search_avx2(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    search: Search,
    buf: &mut CaBuffers,
) {
    search_impl::<true>(geo, cfg, search, buf)
}

#[inline(never)]
fn search_portable(geo: &FinderGeometry, cfg: &FinderConfig, search: Search, buf: &mut CaBuffers) {
    search_impl::<false>(geo, cfg, search, buf)
}

#[inline(always)]
fn search_impl<const AVX2: bool>(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    search: Search,
    buf: &mut CaBuffers,
) {
    match search {
        Search::Full { reach } => find_triplets_impl::<AVX2>(geo, cfg, reach, buf),
        Search::Seeded {
            seed_planes,
            to_last_plane,
            window_per_left_from,
        } => {
            let from = window_per_left_from;
            find_triplets_seeded_impl::<AVX2>(geo, cfg, seed_planes, to_last_plane, from, buf)
        }
    }
}

/// Right doublets `h..min(h + 8, e)` inside the window of their plane triple (`win[s]`:
/// predicted slopes x and y, half widths x and y; `s` the doublet's skipped planes): a bit
/// per doublet inside.
#[inline(always)]
fn match_group(lanes: &DoubletLanes, h: usize, e: usize, win: &[[f32; 4]; MAX_REACH]) -> u32 {
    let (tx, ty, gap) = (&lanes.tx, &lanes.ty, &lanes.gap);
    let mut bits = 0u32;
    for k in 0..(e - h).min(8) {
        let d = h + k;
        let Some(w) = win.get(gap[d] as usize) else {
            continue;
        };
        if (tx[d] - w[0]).abs() <= w[2] && (ty[d] - w[1]).abs() <= w[3] {
            bits |= 1 << k;
        }
    }
    bits
}

/// [`match_group`] with eight doublets per vector comparison.
///
/// # Safety
/// The CPU must support AVX2; `h < e` and `e` at most the number of doublets.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn match_avx2<const R: usize>(
    lanes: &DoubletLanes,
    h: usize,
    e: usize,
    win: &[[f32; 4]; MAX_REACH],
) -> u32 {
    use std::arch::x86_64::*;
    let (tx, ty, gap) = (&lanes.tx, &lanes.ty, &lanes.gap);
    assert!(h < e && e <= tx.len() && e <= ty.len() && e <= gap.len());
    let left = e - h;
    let (px, py, pg) = (tx.as_ptr().add(h), ty.as_ptr().add(h), gap.as_ptr().add(h));
    let (vx, vy, vg, valid) = if left >= 8 {
        (
            _mm256_loadu_ps(px),
            _mm256_loadu_ps(py),
            _mm256_loadu_ps(pg),
            0xffu32,
        )
    } else {
        // Masked loads read only the lanes inside the slices.
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left as i32), lane);
        (
            _mm256_maskload_ps(px, m),
            _mm256_maskload_ps(py, m),
            _mm256_maskload_ps(pg, m),
            (1u32 << left) - 1,
        )
    };
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let inside = |w: &[f32; 4]| {
        let dx = _mm256_and_ps(_mm256_sub_ps(vx, _mm256_set1_ps(w[0])), abs);
        let dy = _mm256_and_ps(_mm256_sub_ps(vy, _mm256_set1_ps(w[1])), abs);
        _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_LE_OQ>(dx, _mm256_set1_ps(w[2])),
            _mm256_cmp_ps::<_CMP_LE_OQ>(dy, _mm256_set1_ps(w[3])),
        )
    };
    // Each doublet against the window of its gap; the windows past the reach `R` are
    // closed: not computed.
    let mut pass = _mm256_setzero_ps();
    for (s, w) in win.iter().enumerate().take(R) {
        let of_gap = _mm256_cmp_ps::<_CMP_EQ_OQ>(vg, _mm256_set1_ps(s as f32));
        pass = _mm256_or_ps(pass, _mm256_and_ps(of_gap, inside(w)));
    }
    _mm256_movemask_ps(pass) as u32 & valid
}

/// The cuts of a call, in `f32`.
pub(crate) fn cuts(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize) -> Cuts {
    Cuts {
        qop_max: cfg.qop_max() as f32,
        n_sigma: cfg.n_sigma as f32,
        mass2: (cfg.fit.mass_gev * cfg.fit.mass_gev) as f32,
        sf2_max: (cfg.slope_factor * cfg.slope_factor) as f32,
        chi2_max: cfg.triplet_chi2_max as f32,
        fit_momentum: if cfg.fit.fit_momentum { 1.0 } else { 0.0 },
        uniform: match geo.field {
            Field::Uniform { b_tesla } => Some(b_tesla.map(|v| v as f32)),
            #[allow(unreachable_patterns)]
            _ => None,
        },
        max_t: [cfg.max_tx as f32, cfg.max_ty as f32],
        reach: reach.clamp(1, MAX_REACH) as u8,
        origin: [cfg.origin_x_mm as f32, cfg.origin_y_mm as f32],
    }
}

/// The tent-weighted mean fields of a doublet on planes `(pa, pb)` whose middle hit is at
/// `(xb, yb)`: the pointing tent `(origin, pa, pb)` and the triplet tents
/// `(pa, pb, pb + 1 + s)` for `s < reach` (zero where there is none), tesla.
#[inline(always)]
fn tent_fields<const AVX2: bool>(
    geo: &FinderGeometry,
    cuts: &Cuts,
    (pa, pb): (usize, usize),
    xb: f32,
    yb: f32,
) -> ([f32; 3], [[f32; 3]; MAX_REACH]) {
    if let Some(b) = cuts.uniform {
        return (b, [b; MAX_REACH]);
    }
    let bend = &geo.bending;
    let Some(tents) = bend.pair(pa, pb) else {
        return ([0.0; 3], [[0.0; 3]; MAX_REACH]);
    };
    let inv = bend.inv_lever[pb];
    let (tx, ty) = ((xb - cuts.origin[0]) * inv, (yb - cuts.origin[1]) * inv);
    #[cfg(target_arch = "x86_64")]
    let v = if AVX2 {
        // SAFETY: this instance only runs where the CPU has AVX2.
        unsafe { tents.at_avx2(tx, ty) }
    } else {
        tents.at(tx, ty)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let v = tents.at(tx, ty);
    let bd = [v[0], v[1], v[2]];
    // The triples past the reach stay zero.
    let bg = std::array::from_fn(|s| {
        if s < cuts.reach as usize {
            [v[3 + 3 * s], v[4 + 3 * s], v[5 + 3 * s]]
        } else {
            [0.0; 3]
        }
    });
    (bd, bg)
}

#[inline(always)]
fn find_triplets_impl<const AVX2: bool>(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    buf: &mut CaBuffers,
) {
    buf.triplets.clear();
    let cuts = cuts(geo, cfg, reach);
    let mut w = buf.trip_windows.take().unwrap_or_else(ChunkWindows::new);
    let mut cands = std::mem::take(&mut buf.trip_candidates);
    let lefts = Lefts::Range(0..buf.doublets.len());
    let (wr, cr) = (&mut w, &mut cands);
    match cuts.reach {
        1 => left_doublets_outgoing::<AVX2, 1>(geo, &cuts, cfg, buf, lefts, None, wr, cr),
        2 => left_doublets_outgoing::<AVX2, 2>(geo, &cuts, cfg, buf, lefts, None, wr, cr),
        _ => left_doublets_outgoing::<AVX2, 3>(geo, &cuts, cfg, buf, lefts, None, wr, cr),
    }
    buf.trip_candidates = cands;
    buf.trip_windows = Some(w);
}

/// The left doublets of a call of [`left_doublets_outgoing`].
#[derive(Clone)]
enum Lefts<'a> {
    Range(std::ops::Range<usize>),
    /// Doublets all on the planes `planes`.
    Ids {
        ids: &'a [u32],
        planes: (usize, usize),
    },
}

impl Lefts<'_> {
    fn len(&self) -> usize {
        match self {
            Lefts::Range(r) => r.len(),
            Lefts::Ids { ids, .. } => ids.len(),
        }
    }

    fn get(&self, k: usize) -> u32 {
        match self {
            Lefts::Range(r) => (r.start + k) as u32,
            Lefts::Ids { ids, .. } => ids[k],
        }
    }

    /// The planes of every doublet, where they share them.
    fn planes(&self) -> Option<(usize, usize)> {
        match self {
            Lefts::Range(_) => None,
            Lefts::Ids { planes, .. } => Some(*planes),
        }
    }
}

/// The right doublets of the seeded step's middle hits, copied together: for middle hit
/// `h`, entries `start[h - first]..start[h - first + 1]` of `lanes` (slopes, no gap) and
/// `ids` (their indices in `CaBuffers::doublets`); for the back boxes, their middle
/// hits' positions, the boxes and the grid cells these overlap.
///
/// Where the right doublets are the left doublets of the triplets found on the plane
/// after (`downstream`), a new triplet is of use only as the left neighbour of one of
/// those (a chain that ends on it is too short for the pass): per entry, those triplets
/// are `t2[r][0]..t2[r][1]` in `CaBuffers::triplets`.
#[derive(Debug, Default)]
pub struct Rights {
    first: usize,
    start: Vec<u32>,
    lanes: DoubletLanes,
    ids: Vec<u32>,
    downstream: bool,
    t2: Vec<[u32; 2]>,
    xb: Vec<f32>,
    yb: Vec<f32>,
    /// Per middle hit with right doublets (by `h - first`): the pointing and first
    /// triplet tents' mean fields there ([`tent_fields`]), looked up once for its back
    /// boxes and its pairs, or for the windows of its left doublets on a seed plane.
    fields: Vec<[f32; 6]>,
    /// The doublet planes `fields` was looked up for (`None` until it is).
    fields_planes: Option<(usize, usize)>,
    boxes: [Vec<f32>; 4],
    /// First and last column, first and last row.
    cells: [Vec<u16>; 4],
}

impl Rights {
    /// Empty lists for the hits `first..end`.
    fn reset(&mut self, first: usize, end: usize) {
        self.first = first;
        self.start.clear();
        self.start.resize(end - first + 1, 0);
        self.lanes.tx.clear();
        self.lanes.ty.clear();
        self.lanes.gap.clear();
        self.ids.clear();
        self.downstream = false;
        self.t2.clear();
        self.fields_planes = None;
    }

    /// [`Rights::fields`] of the doublet planes `planes` at every middle hit that has
    /// right doublets.
    #[inline(always)]
    fn fill_fields<const AVX2: bool>(
        &mut self,
        geo: &FinderGeometry,
        cuts: &Cuts,
        planes: (usize, usize),
        sh: &SortedHits,
    ) {
        self.fields.clear();
        self.fields.resize(self.start.len() - 1, [0.0; 6]);
        for (k, w) in self.start.windows(2).enumerate() {
            if w[1] > w[0] {
                let h = self.first + k;
                let (bd, bg) = tent_fields::<AVX2>(geo, cuts, planes, sh.x_mm[h], sh.y_mm[h]);
                self.fields[k] = [bd[0], bd[1], bd[2], bg[0][0], bg[0][1], bg[0][2]];
            }
        }
        self.fields_planes = Some(planes);
    }

    /// The slopes of the doublets `ids`, as lanes.
    #[inline(always)]
    fn fill_lanes(&mut self, doublets: &[Doublet]) {
        for &d in &self.ids {
            let d = &doublets[d as usize];
            self.lanes.tx.push(d.tx);
            self.lanes.ty.push(d.ty);
            self.lanes.gap.push(0.0);
        }
    }

    /// The back box of every right doublet on plane `i` ([`BackWindow::bounds`] with the
    /// widths of [`BackWindow::local_widths`]), and its cells there (an empty box keeps
    /// `x0 > x1` or `y0 > y1`).
    #[inline(always)]
    fn back_boxes<const AVX2: bool>(
        &mut self,
        geo: &FinderGeometry,
        cuts: &Cuts,
        back: &BackWindow,
        i: usize,
        sh: &SortedHits,
    ) {
        let n = self.ids.len();
        // The middle hit of each right doublet, and the fields there.
        self.xb.clear();
        self.yb.clear();
        self.fill_fields::<AVX2>(geo, cuts, back.planes, sh);
        for (k, w) in self.start.windows(2).enumerate() {
            let m = (w[1] - w[0]) as usize;
            let h = self.first + k;
            self.xb.extend(std::iter::repeat_n(sh.x_mm[h], m));
            self.yb.extend(std::iter::repeat_n(sh.y_mm[h], m));
        }
        let mut group = 0;
        let g = &geo.planes[i];
        for b in self.boxes.iter_mut() {
            b.clear();
            b.resize(n, 0.0);
        }
        for r in 0..n {
            let (xb, yb) = (self.xb[r], self.yb[r]);
            let (tx, ty) = (self.lanes.tx[r], self.lanes.ty[r]);
            let (x0, x1) = back.bounds(0, xb as f64, tx, back.w[0]);
            let (y0, y1) = back.bounds(1, yb as f64, ty, back.w[1]);
            let [wx, wy] = if let Some(w) = back.long_widths(xb, yb) {
                w
            } else if back.qkh != 0.0 {
                // The middle hit's group (`start` is increasing).
                while self.start[group + 1] as usize <= r {
                    group += 1;
                }
                back.local_widths(xb, yb, Some(&self.fields[group]), [x0, x1, y0, y1])
            } else if back.slope.is_some() {
                back.local_widths(xb, yb, None, [x0, x1, y0, y1])
            } else {
                back.w
            };
            let ((x0, x1), (y0, y1)) = (
                back.bounds(0, xb as f64, tx, wx),
                back.bounds(1, yb as f64, ty, wy),
            );
            let [bx0, bx1, by0, by1] = &mut self.boxes;
            (bx0[r], bx1[r], by0[r], by1[r]) = (x0, x1, y0, y1);
        }
        for k in 0..4 {
            let cells = &mut self.cells[k];
            cells.clear();
            cells.extend(self.boxes[k].iter().map(|&v| g.bin_1d(k / 2, v)));
        }
    }

    #[inline(always)]
    fn of(&self, h: usize) -> (usize, usize) {
        let k = h - self.first;
        (self.start[k] as usize, self.start[k + 1] as usize)
    }
}

/// Capacity of [`Pairs`]: the pairs are tested whenever it is full.
pub const PAIRS: usize = 256;

/// The seeded step's pairs of a left doublet made from a back box and a right doublet of
/// its middle hit, by quantity, in the order the full search would test them (left
/// doublets in order, each one's right doublets in order), with what the window and kink
/// tests read: the left doublet's first hit and slopes, the right doublet's slopes and the
/// tent-weighted mean fields of the pointing and triplet tents at the middle hit. At most [`PAIRS`], on the plane pair `planes`.
#[derive(Debug)]
pub struct Pairs {
    n: usize,
    planes: (usize, usize),
    left: [u32; PAIRS],
    right: [u32; PAIRS],
    /// The right doublet's entry in [`Rights`].
    slot: [u32; PAIRS],
    xa: [f32; PAIRS],
    ya: [f32; PAIRS],
    t1: [[f32; PAIRS]; 2],
    t2: [[f32; PAIRS]; 2],
    /// Pointing tent's field, then the triplet tent's, per component.
    b: [[f32; PAIRS]; 6],
}

impl Pairs {
    pub fn new() -> Box<Self> {
        Box::new(Pairs {
            n: 0,
            planes: (0, 0),
            left: [0; PAIRS],
            right: [0; PAIRS],
            slot: [0; PAIRS],
            xa: [0.0; PAIRS],
            ya: [0.0; PAIRS],
            t1: [[0.0; PAIRS]; 2],
            t2: [[0.0; PAIRS]; 2],
            b: [[0.0; PAIRS]; 6],
        })
    }

    /// Appends a pair; when full, tests them all (`test`) and starts again.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn push(
        &mut self,
        left: u32,
        right: u32,
        slot: u32,
        a: [f32; 2],
        t1: [f32; 2],
        t2: [f32; 2],
        b: [f32; 6],
        test: &mut impl FnMut(&Pairs),
    ) {
        let k = self.n;
        self.left[k] = left;
        self.right[k] = right;
        self.slot[k] = slot;
        self.xa[k] = a[0];
        self.ya[k] = a[1];
        for c in 0..2 {
            self.t1[c][k] = t1[c];
            self.t2[c][k] = t2[c];
        }
        for c in 0..6 {
            self.b[c][k] = b[c];
        }
        self.n = k + 1;
        if self.n == PAIRS {
            test(self);
            self.n = 0;
        }
    }
}

/// Triplets of the pairs `pairs` (reach 1), eight at a time, appended to `triplets`: the
/// window of the left doublet (as [`chunk_windows`] computes it) must hold the right
/// doublet's slopes, then the kink test ([`kink_tests`]). The same arithmetic as the two
/// phases of [`left_doublets_outgoing`], without storing the windows in between. Where
/// the right doublets start triplets found downstream (`rights.downstream`), a triplet is
/// kept only as the left neighbour of one of them ([`super::neighbours::compatible`]).
#[inline(always)]
fn pair_tests(
    geo: &FinderGeometry,
    cuts: &Cuts,
    cfg: &FinderConfig,
    pairs: &Pairs,
    rights: &Rights,
    triplets: &mut Vec<Triplet>,
    overflow: &mut super::Overflow,
) {
    let n = pairs.n;
    if n == 0 {
        return;
    }
    let (pf, tg) = plane_pair_lanes(geo, cuts, pairs.planes);
    // Whole lanes (`PAIRS` is a multiple of `LANES`); those past `n` are not kept.
    for c0 in (0..n).step_by(LANES) {
        let at = |v: &[f32; PAIRS]| -> [f32; LANES] { std::array::from_fn(|l| v[c0 + l]) };
        let (xa, ya) = (at(&pairs.xa), at(&pairs.ya));
        let t1 = [at(&pairs.t1[0]), at(&pairs.t1[1])];
        let t2 = [at(&pairs.t2[0]), at(&pairs.t2[1])];
        let bd = [at(&pairs.b[0]), at(&pairs.b[1]), at(&pairs.b[2])];
        let bg = [at(&pairs.b[3]), at(&pairs.b[4]), at(&pairs.b[5])];
        let bgs = std::array::from_fn(|k| if k == 0 { bg } else { [[0.0; LANES]; 3] });
        let win = window_lanes::<1>(cuts, &pf, &xa, &ya, &t1[0], &t1[1], &bd, &bgs);
        let (pass, res) = kink_lanes(cuts, &t1, &t2, &bg, &win[OUT_Q_HI], &tg);
        let mut bits = 0u32;
        for l in 0..LANES {
            // The window test of `match_avx2` (closed windows have a negative width).
            let inside = (t2[0][l] - win[0][l]).abs() <= win[2][l]
                && (t2[1][l] - win[1][l]).abs() <= win[3][l];
            bits |= ((inside && pass[l]) as u32) << l;
        }
        if n - c0 < LANES {
            bits &= (1 << (n - c0)) - 1;
        }
        while bits != 0 {
            let l = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let t = Triplet {
                left: pairs.left[c0 + l],
                right: pairs.right[c0 + l],
                qop: res[0][l],
                qop_sigma: res[1][l],
                chi2: res[2][l],
            };
            keep_triplet(cfg, t, pairs.slot[c0 + l], rights, triplets, overflow);
        }
    }
}

/// The window's constants of the plane pair `planes` ([`pair_constants`]) and the kink
/// test's of its plane triple without a gap (half lever arm, scattering per (q/p)^2,
/// resolution variance), in every lane.
#[inline(always)]
fn plane_pair_lanes(
    geo: &FinderGeometry,
    cuts: &Cuts,
    planes: (usize, usize),
) -> ([[f32; LANES]; PF_N], [[f32; LANES]; 3]) {
    let p = &geo.pair_lanes[planes.0 * geo.planes.len() + planes.1];
    let mut pf = [[0.0f32; LANES]; PF_N];
    for l in 0..LANES {
        pair_constants(p, cuts.reach, &mut pf, l);
    }
    let tg = [
        [p.half[0]; LANES],
        [p.theta2_per_qop2[0]; LANES],
        [p.var_res[0]; LANES],
    ];
    (pf, tg)
}

/// Appends triplet `t`, whose right doublet is entry `slot` of `rights`, to `triplets`:
/// where the right doublets start triplets found downstream (`rights.downstream`), only
/// as the left neighbour of one of them; counted as an overflow beyond the limit.
#[inline(always)]
fn keep_triplet(
    cfg: &FinderConfig,
    t: Triplet,
    slot: u32,
    rights: &Rights,
    triplets: &mut Vec<Triplet>,
    overflow: &mut super::Overflow,
) {
    if rights.downstream {
        let [s, e] = rights.t2[slot as usize];
        let downstream = &triplets[s as usize..e as usize];
        if !downstream.iter().any(|r| compatible(cfg, &t, r)) {
            return;
        }
    }
    if triplets.len() == cfg.limits.max_triplets {
        overflow.triplets += 1;
        return;
    }
    triplets.push(t);
}

/// Right doublets of a middle hit from which its left doublets' windows are computed once
/// each ([`middle_hit_tests`]) rather than once per pair ([`pair_tests`]): where a dense
/// plane or wide windows give a middle hit many right doublets, the pairs computed the
/// same window again for each of them (on the drawn sample `random:4`'s central events,
/// about nine right doublets a pair's middle hit; a tenth of the triplet step's time).
pub const WINDOW_PER_LEFT_FROM: usize = 3;

/// A left doublet of [`middle_hit_tests`]: its index, first hit and slopes.
#[derive(Debug, Clone, Copy)]
pub struct MiddleLeft {
    pub id: u32,
    pub xa: [f32; 2],
    pub t1: [f32; 2],
}

/// The triplets of the left doublets `lefts` (on the plane pair `planes`, in the order
/// the full search tests them) of one middle hit with the right doublets `s..e` of
/// `rights`, whose fields there are `field`: what [`pair_tests`] makes of the pairs of
/// each left doublet with each right doublet, in the same order and with the same
/// arithmetic, each left doublet's window computed once (lanes of left doublets), every
/// right doublet compared with it, and the kink test ([`kink_lanes`]) of the pairs inside
/// it, eight at a time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn middle_hit_tests(
    geo: &FinderGeometry,
    cuts: &Cuts,
    cfg: &FinderConfig,
    planes: (usize, usize),
    lefts: &[MiddleLeft],
    rights: &Rights,
    (s, e): (usize, usize),
    field: [f32; 6],
    triplets: &mut Vec<Triplet>,
    overflow: &mut super::Overflow,
) {
    if lefts.is_empty() || s == e {
        return;
    }
    let (pf, tg) = plane_pair_lanes(geo, cuts, planes);
    let bd: [[f32; LANES]; 3] = std::array::from_fn(|c| [field[c]; LANES]);
    let bg: [[f32; LANES]; 3] = std::array::from_fn(|c| [field[3 + c]; LANES]);
    let bgs = std::array::from_fn(|k| if k == 0 { bg } else { [[0.0; LANES]; 3] });
    // The pairs inside their windows, waiting for the kink test: left (in `lefts`),
    // right entry, and the left's largest |q/p|.
    let mut inside: [(usize, usize, f32); LANES] = [(0, 0, 0.0); LANES];
    let mut n_inside = 0;
    let mut kinks = |inside: &[(usize, usize, f32)], triplets: &mut Vec<Triplet>| {
        let at = |l: usize| inside[l.min(inside.len() - 1)];
        let t1 = [
            std::array::from_fn(|l| lefts[at(l).0].t1[0]),
            std::array::from_fn(|l| lefts[at(l).0].t1[1]),
        ];
        let t2 = [
            std::array::from_fn(|l| rights.lanes.tx[at(l).1]),
            std::array::from_fn(|l| rights.lanes.ty[at(l).1]),
        ];
        let q_hi = std::array::from_fn(|l| at(l).2);
        let (pass, res) = kink_lanes(cuts, &t1, &t2, &bg, &q_hi, &tg);
        for (l, &(k, r, _)) in inside.iter().enumerate() {
            if pass[l] {
                let t = Triplet {
                    left: lefts[k].id,
                    right: rights.ids[r],
                    qop: res[0][l],
                    qop_sigma: res[1][l],
                    chi2: res[2][l],
                };
                keep_triplet(cfg, t, r as u32, rights, triplets, overflow);
            }
        }
    };
    for c0 in (0..lefts.len()).step_by(LANES) {
        let n = LANES.min(lefts.len() - c0);
        let at = |l: usize| &lefts[c0 + l.min(n - 1)];
        let xa = std::array::from_fn(|l| at(l).xa[0]);
        let ya = std::array::from_fn(|l| at(l).xa[1]);
        let t1x = std::array::from_fn(|l| at(l).t1[0]);
        let t1y = std::array::from_fn(|l| at(l).t1[1]);
        let win = window_lanes::<1>(cuts, &pf, &xa, &ya, &t1x, &t1y, &bd, &bgs);
        for l in 0..n {
            for r in s..e {
                // The window test of `pair_tests`.
                let hit = (rights.lanes.tx[r] - win[0][l]).abs() <= win[2][l]
                    && (rights.lanes.ty[r] - win[1][l]).abs() <= win[3][l];
                if hit {
                    inside[n_inside] = (c0 + l, r, win[OUT_Q_HI][l]);
                    n_inside += 1;
                    if n_inside == LANES {
                        kinks(&inside, triplets);
                        n_inside = 0;
                    }
                }
            }
        }
    }
    if n_inside > 0 {
        kinks(&inside[..n_inside], triplets);
    }
}

/// Triplets of the left doublets `lefts`: every right doublet of the middle hit (its
/// outgoing doublets, or its entries in `rights`) compared with the window (phase 2 by
/// vector comparison).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn left_doublets_outgoing<const AVX2: bool, const R: usize>(
    geo: &FinderGeometry,
    cuts: &Cuts,
    cfg: &FinderConfig,
    buf: &mut CaBuffers,
    lefts: Lefts,
    rights: Option<&Rights>,
    w: &mut ChunkWindows,
    cands: &mut Vec<Candidate>,
) {
    cands.clear();
    // Out of `buf` while the kink tests append triplets (no doublet is made here).
    let dbl_lanes = std::mem::take(&mut buf.dbl_lanes);
    let mut ids = [0u32; CHUNK];
    let n_left = lefts.len();
    for c0 in (0..n_left).step_by(CHUNK) {
        if buf.stop_when_full && buf.triplets.len() >= cfg.limits.max_triplets {
            break;
        }
        let c1 = (c0 + CHUNK).min(n_left);
        for (k, id) in ids[..c1 - c0].iter_mut().enumerate() {
            *id = lefts.get(c0 + k);
        }
        let ids = &ids[..c1 - c0];
        for p0 in (0..ids.len()).step_by(LANES) {
            let lane_ids = &ids[p0..(p0 + LANES).min(ids.len())];
            // The fields at the middle hits, where they were looked up once per hit.
            let planes = lefts.planes();
            let fields = rights.filter(|r| R == 1 && planes.is_some() && r.fields_planes == planes);
            chunk_windows::<AVX2, R>(geo, cuts, buf, lane_ids, lefts.planes(), fields, p0, w);
        }
        for (i, &d1) in ids.iter().enumerate() {
            let (lo, hi) = (w.lo[i], w.hi[i]);
            if !(lo <= hi) {
                continue;
            }
            // Every right doublet of the middle hit, eight at a time, against the window
            // of its plane triple (closed windows have a negative width).
            let b = buf.doublets[d1 as usize].b as usize;
            let (lanes, s, e, map) = match rights {
                None => (
                    &dbl_lanes,
                    buf.dbl_start[b] as usize,
                    buf.dbl_start[b + 1] as usize,
                    None,
                ),
                Some(r) => {
                    let (s, e) = r.of(b);
                    (&r.lanes, s, e, Some(&r.ids[..]))
                }
            };
            let win: [[f32; 4]; MAX_REACH] =
                std::array::from_fn(|s| [w.pred_x[s][i], w.pred_y[s][i], w.wx[s][i], w.wy[s][i]]);
            let mut h = s;
            while h < e {
                #[cfg(target_arch = "x86_64")]
                let mut bits = if AVX2 {
                    // SAFETY: this instance only runs where the CPU has AVX2.
                    unsafe { match_avx2::<R>(lanes, h, e, &win) }
                } else {
                    match_group(lanes, h, e, &win)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let mut bits = match_group(lanes, h, e, &win);
                while bits != 0 {
                    let k = bits.trailing_zeros();
                    bits &= bits - 1;
                    let r = h + k as usize;
                    cands.push(Candidate {
                        left: i as u32,
                        right: map.map_or(r as u32, |m| m[r]),
                        s: lanes.gap[r] as u32,
                    });
                    if cands.len() == CANDIDATES {
                        kink_tests(geo, cuts, cfg, buf, cands, ids, w);
                        cands.clear();
                    }
                }
                h += 8;
            }
        }
        kink_tests(geo, cuts, cfg, buf, cands, ids, w);
        cands.clear();
    }
    buf.dbl_lanes = dbl_lanes;
}

/// Triplets of a first pass on consecutive planes that needs tracks ending on the last
/// `seed_planes` planes (tracks of at least `n_planes - seed_planes + 1` hits without a
/// gap), by following them upstream from there, where the hits are least dense: doublets
/// (`super::doublets::find_doublets_with` with `a_planes` the last `seed_planes` before
/// the last plane, reach 1) exist between the seed planes only; going upstream, plane by
/// plane, the right doublets of a middle hit are the left doublets of the triplets found
/// on the plane after it (or all its doublets on a seed plane), and its left doublets are
/// made here from the hits inside a box on the plane before it that holds every hit
/// whose doublet could put one of those right doublets inside its continuation window
/// (the window at the largest |q/p| and slope factor the step allows), and which also
/// pass the doublet step's window. The pairs are then tested with the full search's
/// window and kink arithmetic: each new left doublet with every right doublet of its
/// middle hit, eight pairs at a time ([`Pairs`]: a middle hit mostly has one right
/// doublet there, so a window per left doublet is not worth storing), or, where a middle
/// hit has [`WINDOW_PER_LEFT_FROM`] right doublets or more (dense planes, wide windows),
/// each left doublet's window once for all of them ([`middle_hit_tests`], the same
/// triplets in the same order), or, on a seed plane, through the full search's phases. The chains that end on a seed plane are those of the full
/// search; doublets and triplets no such chain reaches are never made. Upstream of the
/// seed planes, where no chain of the pass can end, in a field that is not uniform, a
/// triplet is kept only where the neighbour cut ([`super::neighbours::compatible`]) links
/// it to one of the triplets found on the plane after it: any other is the end of a chain too short for the pass, and
/// its left doublet is not followed further upstream (across a magnet whose upstream
/// planes see no field, most triplets there bend by a q/p their continuation does not
/// have). Triplets come out ordered by the plane of their middle hit.
///
/// With `to_last_plane`, a chain may end on a seed plane before the last only where its
/// last doublet may leave the detector ([`FinderGeometry::may_leave`]): a doublet onto
/// such a plane is a right doublet when it continues downstream or may leave. The
/// triplets are then those that [`prune_dead_ends`] keeps of the full search's.
pub fn find_triplets_seeded(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    seed_planes: usize,
    to_last_plane: bool,
    buf: &mut CaBuffers,
) {
    find_triplets_seeded_with(Kernel::detect(), geo, cfg, seed_planes, to_last_plane, buf)
}

/// [`find_triplets_seeded`] with the given kernel (the portable one where the CPU lacks it).
pub fn find_triplets_seeded_with(
    kernel: Kernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    seed_planes: usize,
    to_last_plane: bool,
    buf: &mut CaBuffers,
) {
    let search = Search::Seeded {
        seed_planes,
        to_last_plane,
        window_per_left_from: WINDOW_PER_LEFT_FROM,
    };
    dispatch(kernel, geo, cfg, search, buf)
}

/// Keeps the triplets of a search on consecutive planes (triplets ordered by left doublet,
/// doublets by first hit, as [`find_triplets`] makes them) that lie on a chain of
/// triplets, each sharing its right doublet with the next one's left, that ends on the
/// last plane, or on a plane from `first_end_plane` on with a last doublet that may leave
/// the detector ([`FinderGeometry::may_leave`]): the triplets [`find_triplets_seeded`]
/// makes with `to_last_plane`. Returns the number removed.
pub fn prune_dead_ends(geo: &FinderGeometry, first_end_plane: usize, buf: &mut CaBuffers) -> usize {
    let last = geo.planes.len().saturating_sub(1);
    let CaBuffers {
        hits,
        doublets,
        triplets,
        doublet_marks: continues,
        triplet_marks: keep,
        ..
    } = buf;
    continues.clear();
    continues.resize(doublets.len(), false);
    keep.clear();
    keep.resize(triplets.len(), false);
    // A triplet's right doublet starts on a later plane than its left one, so the
    // triplets continuing it come later in the order: one sweep from the end.
    for (k, t) in triplets.iter().enumerate().rev() {
        let r = &doublets[t.right as usize];
        let c = r.b as usize;
        let p = hits.plane[c] as usize;
        let live = p == last
            || continues[t.right as usize]
            || (p >= first_end_plane && geo.may_leave(p, hits.x_mm[c], hits.y_mm[c], r.tx, r.ty));
        keep[k] = live;
        if live {
            continues[t.left as usize] = true;
        }
    }
    let before = triplets.len();
    let mut k = 0;
    triplets.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    before - triplets.len()
}

/// The planes whose hits start the seeded pass's doublets: the last `seed_planes` before
/// the last plane.
pub fn seed_doublet_planes(n_planes: usize, seed_planes: usize) -> std::ops::Range<usize> {
    let end = n_planes.saturating_sub(1);
    end.saturating_sub(seed_planes.max(1))..end
}

/// Where on plane `i` the hits `a` lie whose doublet window on plane `j = i + 1` (the
/// doublet step's box, [`PlaneWindows`]) can hold a middle hit `b`: a box around `b`
/// seen back from the origin. The seeded step cuts its back boxes to it, which in a
/// strong non-uniform field (where the back box bounds the bending of every slope the
/// doublets may have) can be most of the plane while the doublet windows stay narrow.
///
/// Each window is centred near the line from the origin's centre through `a`, at
/// `g xa + (1 - g) o` with `g = (z_j - z_o) / (z_i - z_o)` (without pointing, `g = 1`),
/// and reaches at most `H` from it, the largest reach over the plane's hits, measured on
/// their boxes: a window holds `xb` only where `|xb - g xa - (1 - g) o| <= H`. The bounds
/// are computed in `f64` and rounded outwards to `f32`, so the box holds every such hit.
struct InverseWindow {
    g: f64,
    origin: [f64; 2],
    /// The largest reach in x and y; `None` where no hit of the plane has a window.
    reach: Option<[f64; 2]>,
}

impl InverseWindow {
    /// From the doublet windows `boxes` (`[x0, x1, y0, y1]` by quantity) of the hits of
    /// plane `pw`, the first of which is sorted hit `first`.
    fn new(pw: &PlaneWindows, boxes: &[Vec<f32>; 4], sh: &SortedHits, first: usize) -> Self {
        let g = if pw.pointing {
            1.0 + pw.targets[0].dz as f64 * pw.inv_lever_a as f64
        } else {
            1.0
        };
        let origin = pw.origin_c.map(|v| v as f64);
        let mut reach: Option<[f64; 2]> = None;
        for k in 0..boxes[0].len() {
            let b = [boxes[0][k], boxes[1][k], boxes[2][k], boxes[3][k]].map(|v| v as f64);
            if !(b[0] <= b[1] && b[2] <= b[3]) {
                continue;
            }
            let c = [
                g * sh.x_mm[first + k] as f64 + (1.0 - g) * origin[0],
                g * sh.y_mm[first + k] as f64 + (1.0 - g) * origin[1],
            ];
            let r = [
                (b[1] - c[0]).max(c[0] - b[0]),
                (b[3] - c[1]).max(c[1] - b[2]),
            ];
            let m = reach.get_or_insert([0.0; 2]);
            m[0] = m[0].max(r[0]);
            m[1] = m[1].max(r[1]);
        }
        InverseWindow { g, origin, reach }
    }

    /// The box `[x0, x1, y0, y1]` on plane `i` of the hits whose window can hold `(xb,
    /// yb)`, or `None` where there is none.
    #[inline(always)]
    fn of(&self, xb: f32, yb: f32) -> Option<[f32; 4]> {
        let [hx, hy] = self.reach?;
        if !(hx.is_finite() && hy.is_finite()) {
            // Unbounded windows: every hit.
            return Some([
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::INFINITY,
            ]);
        }
        let back = |v: f32, h: f64, o: f64| {
            let lo = (v as f64 - h - (1.0 - self.g) * o) / self.g;
            let hi = (v as f64 + h - (1.0 - self.g) * o) / self.g;
            // A relative margin for the rounding of the f32 inputs' products.
            let m = 1e-6 * (lo.abs().max(hi.abs()) + h + 1.0);
            (down(lo - m), up(hi + m))
        };
        let (x0, x1) = back(xb, hx, self.origin[0]);
        let (y0, y1) = back(yb, hy, self.origin[1]);
        Some([x0, x1, y0, y1])
    }
}

/// The largest `f32` at most `v`.
fn down(v: f64) -> f32 {
    let f = v as f32;
    if f as f64 > v {
        f.next_down()
    } else {
        f
    }
}

/// The smallest `f32` at least `v`.
fn up(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) < v {
        f.next_up()
    } else {
        f
    }
}

/// The box on plane `i` holding every hit `a` whose doublet `(a, b)` with the middle hit
/// `b` on plane `j = i + 1` could have a right doublet of slopes `t2` inside its
/// continuation window (plane triple `(i, j, j + 1)`), whatever the doublet's momentum
/// estimate and slope factor.
#[derive(Clone, Copy)]
struct BackWindow {
    /// `pred = a t1 - c (xb - x0)`: the predicted slope from the left doublet's slope
    /// `t1`, with its first hit at `xb - dz t1` and the origin's centre at `x0` (`inv_a =
    /// 1 / a`).
    inv_a: f64,
    c: f64,
    /// The origin's centre in x and y, mm.
    origin: [f64; 2],
    dz: f64,
    /// Largest window half widths in x and y.
    w: [f64; 2],
    /// The half widths without the tents' difference (origin size, scattering and
    /// resolution), and the largest |q/p| times the field constant and the half lever
    /// arm, which the difference of the tents' bending multiplies (0 where it does not
    /// enter: [`BackWindow::local_widths`]).
    base: [f64; 2],
    qkh: f64,
    planes: (usize, usize),
    max_t: [f64; 2],
    /// The bound of the window's bending at each tent's own mean slope
    /// ([`SlopeBound::widths`]); `None` where the window takes no q/p from the pointing
    /// tent.
    slope: Option<SlopeBound>,
    /// The pointing tent's largest field components (tesla), for the slope bound where
    /// the fields at the middle hit are not looked up.
    b_pointing: [f64; 3],
    /// With a long origin (`origin_half_z_mm`), the widths per middle hit
    /// ([`BackWindow::long_widths`]) instead of the two above.
    long: Option<LongBack>,
}

/// The back window's widths with a long origin: the continuation window's hard error
/// grows with the chord slope to the first hit and with the pointing curvature
/// ([`super::PairLanes::hard_slope`], `kappa_rel`), both bounded per middle hit over the
/// left doublets' slopes up to the limits.
#[derive(Clone, Copy)]
struct LongBack {
    hard: [f64; 2],
    hard_slope: f64,
    kappa_rel: f64,
    inv_zi: f64,
    two_inv_zj: f64,
    /// `n_sigma` times the pointing curvature's Gaussian width, the window's Gaussian
    /// half width, and the triplet tent's bending difference from the pointing tent's.
    sig: f64,
    gauss: f64,
    db: Option<[f64; 3]>,
    /// The triplet tent's half length.
    h: f64,
}

/// The bending function's components ([`bending`]) bounded for slopes up to `tx`, `ty` and
/// field components up to `b` (all absolute).
#[inline(always)]
fn bend_bound(tx: f64, ty: f64, b: [f64; 3]) -> (f64, f64) {
    (
        tx * ty * b[0] + (1.0 + tx * tx) * b[1] + ty * b[2],
        (1.0 + ty * ty) * b[0] + tx * ty * b[1] + tx * b[2],
    )
}

/// How far the continuation window's prediction and width move because [`window_lanes`]
/// takes the pointing and the triplet tents' bending each at its own mean slope: the two
/// slopes differ by the pointing curvature times `zq` (a quarter of the middle plane's
/// distance to the origin plus half the triplet tent's half length), the bending factor's
/// derivatives in the slopes are bounded at the slopes the doublets can have plus that
/// difference, and the largest q/p multiplies the product over the tent's half length.
#[derive(Clone, Copy)]
struct SlopeBound {
    q: f64,
    h: f64,
    zq: f64,
    /// The pointing curvature's hard error and Gaussian width (`n_sigma` of them) per
    /// coordinate, beyond `q` times the bending.
    extra: [f64; 2],
}

impl SlopeBound {
    /// The largest difference of the two tents' mean slopes from a doublet of slopes up
    /// to `t`: the pointing curvature's bound times `zq`.
    fn dt(&self, t: [f64; 2], b: [f64; 3]) -> [f64; 2] {
        let (ax, ay) = bend_bound(t[0], t[1], b);
        let kq = K_GEV_PER_T_MM * self.q * (1.0 + t[0] * t[0] + t[1] * t[1]).sqrt();
        [
            (kq * ax + self.extra[0]) * self.zq,
            (kq * ay + self.extra[1]) * self.zq,
        ]
    }

    /// The bound in x and y for doublet slopes up to `t` (absolute) in a pointing field
    /// of components up to `b` (absolute, tesla): the bending function's derivatives in
    /// the slopes ([`bending`] times `K sqrt(1 + tx^2 + ty^2)`) times the slopes'
    /// difference, times the largest q/p and the tent's half length; and that difference
    /// ([`Self::dt`]).
    fn widths(&self, t: [f64; 2], b: [f64; 3]) -> ([f64; 2], [f64; 2]) {
        let [dtx, dty] = self.dt(t, b);
        let (tx, ty) = (t[0] + dtx, t[1] + dty);
        let (ax, ay) = bend_bound(tx, ty, b);
        let n = (1.0 + tx * tx + ty * ty).sqrt();
        let k = K_GEV_PER_T_MM;
        let (jxx, jxy) = (
            k * (tx * ax + n * (ty * b[0] + 2.0 * tx * b[1])),
            k * (ty * ax + n * (tx * b[0] + b[2])),
        );
        let (jyx, jyy) = (
            k * (tx * ay + n * (ty * b[1] + b[2])),
            k * (ty * ay + n * (2.0 * ty * b[0] + tx * b[1])),
        );
        let qh = self.q * self.h;
        (
            [qh * (jxx * dtx + jxy * dty), qh * (jyx * dtx + jyy * dty)],
            [dtx, dty],
        )
    }
}

impl BackWindow {
    /// `None` where the plane triple has no window.
    fn new(geo: &FinderGeometry, cuts: &Cuts, i: usize) -> Option<Self> {
        let n = geo.planes.len();
        let j = i + 1;
        let p = &geo.pair_lanes[i * n + j];
        if p.n_triples.min(cuts.reach) == 0 {
            return None;
        }
        let f = |v: f32| v as f64;
        let dz = geo.planes[j].z_mm - geo.planes[i].z_mm;
        let (pointing, h) = (f(p.pointing), f(p.half[0]));
        let k = pointing * f(p.two_inv_zj) * h;
        let (q, sf2) = (f(cuts.qop_max), f(cuts.sf2_max));
        let kvar = f(p.kvar_ms_per_qop2) * sf2 * q * q + f(p.kvar_res);
        let ms2 = q * q * (1.0 + f(cuts.mass2) * q * q) * sf2;
        let var = kvar * h * h + f(p.theta2_per_qop2[0]) * ms2 + f(p.var_res[0]);
        let gauss = f(cuts.n_sigma) * var.sqrt();
        // Where the pointing and the triplet tents see different fields, the prediction
        // moves and the window widens by together at most the largest q/p times the
        // difference of their bending ([`window_lanes`]).
        let tents = pointing * f(cuts.fit_momentum) > 0.0;
        // The middle plane's distance to the origin plane (pointing pairs only).
        let zj = if pointing > 0.0 {
            2.0 / f(p.two_inv_zj)
        } else {
            0.0
        };
        let slope = tents.then(|| {
            let sig = f(cuts.n_sigma) * kvar.sqrt();
            SlopeBound {
                q,
                h,
                zq: 0.25 * zj + 0.5 * h,
                extra: [f(p.hard_kx) + sig, f(p.hard_ky) + sig],
            }
        });
        let (slope_w, slope_dt) = slope.map_or(([0.0; 2], [0.0; 2]), |sb| {
            sb.widths(cuts.max_t.map(f), geo.pointing_b_max_tesla[i * n + j])
        });
        let profile = match (
            geo.bending.pointing(i, j),
            geo.bending.triple(i, j, 0),
            tents,
        ) {
            (Some(d), Some(g), true) => {
                let db = g.bound_of_difference(d);
                // At the triplet tent's own slope, up to the slopes' difference further out.
                let [tx, ty] = cuts.max_t.map(f);
                let (tx, ty) = (tx + slope_dt[0], ty + slope_dt[1]);
                let kn = K_GEV_PER_T_MM * (1.0 + tx * tx + ty * ty).sqrt();
                let (ax, ay) = bend_bound(tx, ty, db);
                [q * kn * ax * h, q * kn * ay * h]
            }
            _ => [0.0; 2],
        };
        // A relative margin for the single-precision arithmetic of the window.
        let w = |hard: f32, c: usize| {
            (f(hard) * h + gauss + profile[c] + slope_w[c]) * (1.0 + 1e-4) + 1e-7
        };
        let has_tents =
            geo.bending.pointing(i, j).is_some() && geo.bending.triple(i, j, 0).is_some();
        let long = (pointing > 0.0 && (p.hard_slope > 0.0 || p.kappa_rel > 0.0)).then(|| {
            let sig = slope.map_or(0.0, |sb| sb.extra[0] - f(p.hard_kx));
            LongBack {
                hard: [f(p.hard_kx), f(p.hard_ky)],
                hard_slope: f(p.hard_slope),
                kappa_rel: f(p.kappa_rel),
                inv_zi: f(p.inv_zi),
                two_inv_zj: f(p.two_inv_zj),
                sig,
                gauss,
                db: match (
                    geo.bending.pointing(i, j),
                    geo.bending.triple(i, j, 0),
                    tents,
                ) {
                    (Some(d), Some(g), true) => Some(g.bound_of_difference(d)),
                    _ => None,
                },
                h,
            }
        });
        Some(BackWindow {
            inv_a: 1.0 / (1.0 + k * (1.0 + dz * f(p.inv_zi))),
            c: k * f(p.inv_zi),
            origin: cuts.origin.map(f),
            dz,
            w: [w(p.hard_kx, 0), w(p.hard_ky, 1)],
            base: [f(p.hard_kx) * h + gauss, f(p.hard_ky) * h + gauss],
            qkh: if tents && has_tents {
                q * K_GEV_PER_T_MM * h
            } else {
                0.0
            },
            planes: (i, j),
            max_t: cuts.max_t.map(f),
            slope,
            b_pointing: geo.pointing_b_max_tesla[i * n + j],
            long,
        })
    }

    /// With a long origin, the half widths for the middle hit at `(xb, yb)`: the window
    /// of [`Self::new`] with the hard error at its largest over left doublets of slopes up
    /// to the limits (the chord slope from the origin's centre to the first hit at most
    /// `(|xb - x_c| + dz max_t) / z_i`, the pointing curvature at most that plus `max_t`
    /// over half `z_j`), the slope bound's curvature and q/p widened alike.
    fn long_widths(&self, xb: f32, yb: f32) -> Option<[f64; 2]> {
        let lb = self.long.as_ref()?;
        let v = [xb as f64, yb as f64];
        let hard: [f64; 2] = std::array::from_fn(|c| {
            let r = ((v[c] - self.origin[c]).abs() + self.dz * self.max_t[c]) * lb.inv_zi;
            let kappa = (self.max_t[c] + r) * lb.two_inv_zj;
            lb.hard[c] + lb.hard_slope * r + lb.kappa_rel * kappa
        });
        let (sw, dt) = self.slope.map_or(([0.0; 2], [0.0; 2]), |sb| {
            let sb = SlopeBound {
                q: sb.q * (1.0 + lb.kappa_rel),
                extra: [hard[0] + lb.sig, hard[1] + lb.sig],
                ..sb
            };
            sb.widths(self.max_t, self.b_pointing)
        });
        let h = lb.h;
        let profile = match lb.db {
            Some(db) if self.qkh != 0.0 => {
                let (tx, ty) = (self.max_t[0] + dt[0], self.max_t[1] + dt[1]);
                let (ax, ay) = bend_bound(tx, ty, db);
                let kn = self.qkh * (1.0 + lb.kappa_rel) * (1.0 + tx * tx + ty * ty).sqrt();
                [kn * ax, kn * ay]
            }
            _ => [0.0; 2],
        };
        Some(std::array::from_fn(|c| {
            (hard[c] * h + lb.gauss + profile[c] + sw[c]) * (1.0 + 1e-4) + 1e-7
        }))
    }

    /// The half widths for the middle hit at `(xb, yb)` whose box with the largest widths
    /// is `wide` (`[x0, x1, y0, y1]`): the difference of the tents' bending taken at the
    /// middle hit (`field`: the pointing and first triplet tents' mean fields there, as the
    /// window looks them up, [`tent_fields`]) and at the largest slopes of the doublets from that box to it, instead of the largest over
    /// the acceptance. Every hit whose doublet's window can hold the right doublet lies in
    /// the wide box, so its slopes are among those.
    #[inline(always)]
    fn local_widths(&self, xb: f32, yb: f32, field: Option<&[f32; 6]>, wide: [f32; 4]) -> [f64; 2] {
        let slope = |v: f32, lo: f32, hi: f32, c: usize| {
            let (a, b) = (
                (v as f64 - hi as f64) / self.dz,
                (v as f64 - lo as f64) / self.dz,
            );
            a.abs().max(b.abs()).min(self.max_t[c])
        };
        let tx = slope(xb, wide[0], wide[1], 0);
        let ty = slope(yb, wide[2], wide[3], 1);
        // The bending at each tent's own slope ([`SlopeBound`]), with the pointing tent's
        // field at the middle hit where it is looked up.
        let b_pointing = field.map_or(self.b_pointing, |f| {
            std::array::from_fn(|c| (f[c] as f64).abs())
        });
        let (sw, [dx, dy]) = self
            .slope
            .map_or(([0.0; 2], [0.0; 2]), |sb| sb.widths([tx, ty], b_pointing));
        let (ax, ay, kn) = match field {
            Some(field) if self.qkh != 0.0 => {
                // The pointing tent's field, then the first triplet tent's ([`tent_fields`]).
                let db: [f64; 3] =
                    std::array::from_fn(|c| (field[3 + c] as f64 - field[c] as f64).abs());
                // The triplet tent's bending is taken at its own slope: up to the slopes'
                // difference further out.
                let (tx, ty) = (tx + dx, ty + dy);
                let (ax, ay) = bend_bound(tx, ty, db);
                (ax, ay, self.qkh * (1.0 + tx * tx + ty * ty).sqrt())
            }
            _ => (0.0, 0.0, 0.0),
        };
        let w = |c: usize, a: f64| {
            ((self.base[c] + kn * a + sw[c]) * (1.0 + 1e-4) + 1e-7).min(self.w[c])
        };
        [w(0, ax), w(1, ay)]
    }

    /// The box's bounds in coordinate `c` (0: x, 1: y) on plane `i`, for the middle hit's
    /// coordinate `v`, the right doublet's slope `t2` in that coordinate and the half
    /// width `w`.
    #[inline(always)]
    fn bounds(&self, c: usize, v: f64, t2: f32, w: f64) -> (f32, f32) {
        let t = t2 as f64 + self.c * (v - self.origin[c]);
        let (e0, e1) = ((t - w) * self.inv_a, (t + w) * self.inv_a);
        let (t1_lo, t1_hi) = (e0.min(e1), e0.max(e1));
        let margin = 1e-3 + 1e-5 * (v.abs() + self.dz * (t1_lo.abs() + t1_hi.abs()));
        (
            (v - self.dz * t1_hi - margin) as f32,
            (v - self.dz * t1_lo + margin) as f32,
        )
    }
}

#[inline(always)]
fn find_triplets_seeded_impl<const AVX2: bool>(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    seed_planes: usize,
    to_last_plane: bool,
    window_per_left_from: usize,
    buf: &mut CaBuffers,
) {
    buf.triplets.clear();
    let n_planes = geo.planes.len();
    let n_hits = buf.hits.x_mm.len();
    if n_planes < 3 {
        return;
    }
    let seeds = seed_doublet_planes(n_planes, seed_planes);
    let cuts = cuts(geo, cfg, 1);
    let mut w = buf.trip_windows.take().unwrap_or_else(ChunkWindows::new);
    let mut cands = std::mem::take(&mut buf.trip_candidates);
    let mut lefts = std::mem::take(&mut buf.left_ids);
    let mut rights = std::mem::take(&mut buf.seed_rights);
    let mut hit_boxes = std::mem::take(&mut buf.hit_boxes);
    let mut marks = std::mem::take(&mut buf.hit_marks);
    let mut pairs = buf.seed_pairs.take().unwrap_or_else(Pairs::new);
    let mut middle_lefts = std::mem::take(&mut buf.middle_lefts);
    marks.clear();
    marks.resize(n_hits, u32::MAX);
    // Triplets of the step before (the plane after), whose left doublets are this step's
    // right doublets.
    let mut block = 0;
    for j in (1..n_planes - 1).rev() {
        if buf.stop_when_full
            && (buf.triplets.len() >= cfg.limits.max_triplets
                || buf.doublets.len() >= cfg.limits.max_doublets)
        {
            break;
        }
        let i = j - 1;
        let (fi, ei) = buf.hits.plane_range(&geo.planes[i]);
        let (fj, ej) = buf.hits.plane_range(&geo.planes[j]);
        // The right doublets, by middle hit.
        rights.reset(fj, ej);
        if seeds.contains(&j) && to_last_plane && j + 2 < n_planes {
            // Onto a seed plane before the last: the doublets that continue into the last
            // step's triplets (its left doublets) or may leave the detector.
            let (d0, d1) = (buf.dbl_start[fj], buf.dbl_start[ej]);
            let continues = &mut buf.doublet_marks;
            continues.clear();
            continues.resize((d1 - d0) as usize, false);
            for t in &buf.triplets[block..] {
                continues[(t.left - d0) as usize] = true;
            }
            let sh = &buf.hits;
            for h in fj..ej {
                for d in buf.dbl_start[h]..buf.dbl_start[h + 1] {
                    let db = &buf.doublets[d as usize];
                    let c = db.b as usize;
                    if continues[(d - d0) as usize]
                        || geo.may_leave(j + 1, sh.x_mm[c], sh.y_mm[c], db.tx, db.ty)
                    {
                        rights.ids.push(d);
                    }
                }
                rights.start[h - fj + 1] = rights.ids.len() as u32;
            }
        } else if seeds.contains(&j) {
            let d0 = buf.dbl_start[fj];
            for h in fj..ej {
                rights.start[h - fj + 1] = buf.dbl_start[h + 1] - d0;
            }
            rights.ids.extend(d0..buf.dbl_start[ej]);
        } else {
            // The distinct left doublets of the last step's triplets (consecutive: triplets
            // come out grouped by left doublet), by first hit (counting sort).
            let mut last = u32::MAX;
            for t in &buf.triplets[block..] {
                if t.left != last {
                    last = t.left;
                    rights.start[buf.doublets[t.left as usize].a as usize - fj + 1] += 1;
                }
            }
            for k in 0..(ej - fj) {
                rights.start[k + 1] += rights.start[k];
            }
            let n = rights.start[ej - fj] as usize;
            rights.ids.resize(n, 0);
            rights.t2.resize(n, [0; 2]);
            // In a uniform field a doublet's pointing measures q/p as the triplets do, its
            // window and kink test hold a triplet to it and nearly all pass the neighbour
            // cut (without a field all do): the test would cost more than it saves.
            rights.downstream = cuts.uniform.is_none();
            let (mut k, end) = (block, buf.triplets.len());
            while k < end {
                // One left doublet's triplets.
                let (left, first) = (buf.triplets[k].left, k);
                while k < end && buf.triplets[k].left == left {
                    k += 1;
                }
                let slot = &mut rights.start[buf.doublets[left as usize].a as usize - fj];
                let r = *slot as usize;
                rights.ids[r] = left;
                rights.t2[r] = [first as u32, k as u32];
                *slot += 1;
            }
            // Back to the starts.
            for k in (1..=(ej - fj)).rev() {
                rights.start[k] = rights.start[k - 1];
            }
            rights.start[0] = 0;
        }
        rights.fill_lanes(&buf.doublets);
        // This step's triplets from here on.
        block = buf.triplets.len();
        // The left doublets of the middle hits that have right doublets.
        let pw = PlaneWindows::new(geo, cfg, i, 1);
        lefts.clear();
        pairs.n = 0;
        pairs.planes = (i, j);
        if seeds.contains(&i) {
            for d in buf.dbl_start[fi]..buf.dbl_start[ei] {
                let b = buf.doublets[d as usize].b as usize;
                let (s, e) = rights.of(b);
                if s < e {
                    lefts.push(d);
                }
            }
            // A middle hit there has many left doublets: its fields once for all (in a
            // uniform field the lookup is the field itself).
            if cuts.uniform.is_none() {
                rights.fill_fields::<AVX2>(geo, &cuts, (i, j), &buf.hits);
            }
        } else if let (Some(back), Some((_, inv_dz))) =
            (BackWindow::new(geo, &cuts, i), pw.target(0))
        {
            // The doublet windows of the hits of plane i, eight at a time.
            for v in hit_boxes.iter_mut() {
                v.clear();
            }
            for c0 in (fi..ei).step_by(LANES) {
                let (_, _, boxes) = pw.boxes_of(&buf.hits, c0, ei);
                let n = LANES.min(ei - c0);
                for (v, b) in hit_boxes.iter_mut().zip(&boxes[0]) {
                    v.extend_from_slice(&b[..n]);
                }
            }
            rights.back_boxes::<AVX2>(geo, &cuts, &back, i, &buf.hits);
            let inverse = InverseWindow::new(&pw, &hit_boxes, &buf.hits, fi);
            let CaBuffers {
                hits: sh,
                doublets,
                dbl_lanes,
                overflow,
                triplets,
                ..
            } = &mut *buf;
            let max_doublets = cfg.limits.max_doublets;
            for b in fj..ej {
                let (s, e) = rights.of(b);
                if s == e || sh.used[b] {
                    continue;
                }
                let (xb, yb) = (sh.x_mm[b], sh.y_mm[b]);
                let field = rights.fields[b - fj];
                // Many right doublets: the left doublets' windows once each, after the
                // scan; else each new left doublet's pairs as it is made.
                let per_left = e - s >= window_per_left_from;
                middle_lefts.clear();
                let mut emit = |a: usize| {
                    if marks[a] == b as u32 {
                        return;
                    }
                    marks[a] = b as u32;
                    // The doublet window of `a`, as the doublet step tests it.
                    let k = a - fi;
                    let bx = [
                        hit_boxes[0][k],
                        hit_boxes[1][k],
                        hit_boxes[2][k],
                        hit_boxes[3][k],
                    ];
                    if sh.used[a] || !(xb >= bx[0] && xb <= bx[1] && yb >= bx[2] && yb <= bx[3]) {
                        return;
                    }
                    let (tx, ty) = slopes(xb, yb, sh.x_mm[a] as f64, sh.y_mm[a] as f64, inv_dz);
                    let d = Doublet {
                        a: a as u32,
                        b: b as u32,
                        tx,
                        ty,
                    };
                    if let Some(k) =
                        push_doublet(doublets, dbl_lanes, overflow, max_doublets, d, 0.0)
                    {
                        let xa = [sh.x_mm[a], sh.y_mm[a]];
                        if per_left {
                            middle_lefts.push(MiddleLeft {
                                id: k as u32,
                                xa,
                                t1: [tx, ty],
                            });
                            return;
                        }
                        for r in s..e {
                            let t2 = [rights.lanes.tx[r], rights.lanes.ty[r]];
                            let id = rights.ids[r];
                            let mut test = |p: &Pairs| {
                                pair_tests(geo, &cuts, cfg, p, &rights, triplets, overflow);
                            };
                            let (k, r) = (k as u32, r as u32);
                            pairs.push(k, id, r, xa, [tx, ty], t2, field, &mut test);
                        }
                    }
                };
                // Only the hits whose doublet window can hold `b`: the back boxes cut to
                // them hold the same hits `emit` takes, in the same order.
                let Some(inv) = inverse.of(xb, yb) else {
                    continue;
                };
                for r in s..e {
                    let b = &rights.boxes;
                    let bx = [b[0][r], b[1][r], b[2][r], b[3][r]];
                    if bx[0] <= bx[1] && bx[2] <= bx[3] {
                        let cut = [
                            bx[0].max(inv[0]),
                            bx[1].min(inv[1]),
                            bx[2].max(inv[2]),
                            bx[3].min(inv[3]),
                        ];
                        if cut == bx {
                            let c = &rights.cells;
                            let cells = [c[0][r], c[1][r], c[2][r], c[3][r]];
                            scan_cells::<AVX2>(geo, sh, i, bx, cells, &mut emit);
                        } else if cut[0] <= cut[1] && cut[2] <= cut[3] {
                            let cells = box_cells(geo, i, cut);
                            scan_cells::<AVX2>(geo, sh, i, cut, cells, &mut emit);
                        }
                    }
                }
                // The new left doublets' pairs with the middle hit's right doublets, in
                // the order the full search tests them: those already pending first.
                if per_left {
                    pair_tests(geo, &cuts, cfg, &pairs, &rights, triplets, overflow);
                    pairs.n = 0;
                    middle_hit_tests(
                        geo,
                        &cuts,
                        cfg,
                        (i, j),
                        &middle_lefts,
                        &rights,
                        (s, e),
                        field,
                        triplets,
                        overflow,
                    );
                }
            }
        }
        if seeds.contains(&i) {
            let l = Lefts::Ids {
                ids: &lefts,
                planes: (i, j),
            };
            let r = Some(&rights);
            left_doublets_outgoing::<AVX2, 1>(geo, &cuts, cfg, buf, l, r, &mut w, &mut cands);
        } else {
            // The pairs left.
            pair_tests(
                geo,
                &cuts,
                cfg,
                &pairs,
                &rights,
                &mut buf.triplets,
                &mut buf.overflow,
            );
            pairs.n = 0;
        }
    }
    // Blocks of triplets by middle plane, upstream first: the blocks came out the other
    // way round.
    buf.triplets.reverse();
    let mid =
        |buf: &CaBuffers, t: &Triplet| buf.hits.plane[buf.doublets[t.left as usize].b as usize];
    let mut s = 0;
    while s < buf.triplets.len() {
        let p = mid(buf, &buf.triplets[s]);
        let mut e = s + 1;
        while e < buf.triplets.len() && mid(buf, &buf.triplets[e]) == p {
            e += 1;
        }
        buf.triplets[s..e].reverse();
        s = e;
    }
    buf.left_ids = lefts;
    buf.seed_rights = rights;
    buf.hit_boxes = hit_boxes;
    buf.hit_marks = marks;
    buf.seed_pairs = Some(pairs);
    buf.middle_lefts = middle_lefts;
    buf.trip_candidates = cands;
    buf.trip_windows = Some(w);
}

/// Rows of [`window_lanes`]' output after the windows: the union in x, the largest |q/p|.
const OUT_LO: usize = 4 * MAX_REACH;
const OUT_HI: usize = OUT_LO + 1;
const OUT_Q_HI: usize = OUT_LO + 2;
const OUT_N: usize = OUT_LO + 3;

/// Rows of [`pair_constants`]' table: the pair's seven scalars, then per plane triple `s`
/// its half lever arm, scattering per (q/p)^2, resolution variance and whether its window
/// is open.
const PF_HALF: usize = 9;
const PF_TH2: usize = PF_HALF + MAX_REACH;
const PF_VAR: usize = PF_TH2 + MAX_REACH;
const PF_OPEN: usize = PF_VAR + MAX_REACH;
const PF_N: usize = PF_OPEN + MAX_REACH;

/// The constants of plane pair `p` by quantity, in lane `l` of `pf` (so the arithmetic
/// of [`window_lanes`] runs on whole lanes).
#[inline(always)]
fn pair_constants(p: &super::PairLanes, reach: u8, pf: &mut [[f32; LANES]; PF_N], l: usize) {
    let n_win = p.n_triples.min(reach);
    pf[0][l] = p.pointing;
    pf[1][l] = p.inv_zi;
    pf[2][l] = p.two_inv_zj;
    pf[3][l] = p.hard_kx;
    pf[4][l] = p.hard_ky;
    pf[5][l] = p.kvar_ms_per_qop2;
    pf[6][l] = p.kvar_res;
    pf[7][l] = p.hard_slope;
    pf[8][l] = p.kappa_rel;
    for s in 0..MAX_REACH {
        pf[PF_HALF + s][l] = p.half[s];
        pf[PF_TH2 + s][l] = p.theta2_per_qop2[s];
        pf[PF_VAR + s][l] = p.var_res[s];
        pf[PF_OPEN + s][l] = if (s as u8) < n_win { 1.0 } else { 0.0 };
    }
}

/// Phase 1: the windows of doublets `ids` (at most [`LANES`]; all on the planes `planes`
/// where given), stored at `i0..` in `w`; the fields at their middle hits from `fields`
/// ([`Rights::fill_fields`] of those planes, reach 1) where given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_windows<const AVX2: bool, const R: usize>(
    geo: &FinderGeometry,
    cuts: &Cuts,
    buf: &CaBuffers,
    ids: &[u32],
    planes: Option<(usize, usize)>,
    fields: Option<&Rights>,
    i0: usize,
    w: &mut ChunkWindows,
) {
    let n_planes = geo.planes.len();
    let sh = &buf.hits;
    let mut pf = [[0.0f32; LANES]; PF_N];
    let (mut xa, mut ya) = ([0.0f32; LANES], [0.0f32; LANES]);
    let (mut t1x, mut t1y) = ([0.0f32; LANES], [0.0f32; LANES]);
    let mut bd = [[0.0f32; LANES]; 3];
    let mut bg = [[[0.0f32; LANES]; 3]; MAX_REACH];
    if let Some((pa, pb)) = planes {
        // One plane pair: its constants in every lane.
        let p = &geo.pair_lanes[pa * n_planes + pb];
        for l in 0..LANES {
            pair_constants(p, cuts.reach, &mut pf, l);
        }
    }
    for l in 0..LANES {
        // Lanes past the end repeat the last doublet (results not stored).
        let d = buf.doublets[ids[l.min(ids.len() - 1)] as usize];
        let (pa, pb) = planes.unwrap_or((
            sh.plane[d.a as usize] as usize,
            sh.plane[d.b as usize] as usize,
        ));
        let pair = pa * n_planes + pb;
        if planes.is_none() {
            pair_constants(&geo.pair_lanes[pair], cuts.reach, &mut pf, l);
        }
        xa[l] = sh.x_mm[d.a as usize];
        ya[l] = sh.y_mm[d.a as usize];
        t1x[l] = d.tx;
        t1y[l] = d.ty;
        let (xb, yb) = (sh.x_mm[d.b as usize], sh.y_mm[d.b as usize]);
        // Without outgoing doublets the middle hit has no continuation to test: its
        // window is never read and the field tables need not be looked up (a uniform
        // field needs none; the lefts of one plane pair come with right doublets).
        let b = d.b as usize;
        let looked_up = cuts.uniform.is_some() || planes.is_some();
        let (d_field, g_field) = if let Some(r) = fields {
            // The same lookup, once per middle hit (the triples past the first are zero
            // at reach 1).
            let f = &r.fields[b - r.first];
            let mut g = [[0.0; 3]; MAX_REACH];
            g[0] = [f[3], f[4], f[5]];
            ([f[0], f[1], f[2]], g)
        } else if looked_up || buf.dbl_start[b] < buf.dbl_start[b + 1] {
            tent_fields::<AVX2>(geo, cuts, (pa, pb), xb, yb)
        } else {
            ([0.0; 3], [[0.0; 3]; MAX_REACH])
        };
        for c in 0..3 {
            bd[c][l] = d_field[c];
            for s in 0..R {
                bg[s][c][l] = g_field[s][c];
            }
        }
        w.pair[i0 + l] = pair as u32;
    }
    let out = window_lanes::<R>(cuts, &pf, &xa, &ya, &t1x, &t1y, &bd, &bg);
    // Whole lanes (`i0 + LANES <= CHUNK`); those past the end are never read.
    let r = i0..i0 + LANES;
    w.t1x[r.clone()].copy_from_slice(&t1x);
    w.t1y[r.clone()].copy_from_slice(&t1y);
    for s in 0..R {
        for c in 0..3 {
            w.bg[s][c][r.clone()].copy_from_slice(&bg[s][c]);
        }
    }
    for s in 0..MAX_REACH {
        w.pred_x[s][r.clone()].copy_from_slice(&out[s * 4]);
        w.pred_y[s][r.clone()].copy_from_slice(&out[s * 4 + 1]);
        w.wx[s][r.clone()].copy_from_slice(&out[s * 4 + 2]);
        w.wy[s][r.clone()].copy_from_slice(&out[s * 4 + 3]);
    }
    w.lo[r.clone()].copy_from_slice(&out[OUT_LO]);
    w.hi[r.clone()].copy_from_slice(&out[OUT_HI]);
    w.q_hi[r].copy_from_slice(&out[OUT_Q_HI]);
}

/// The continuation windows of eight doublets from their first hits `(xa, ya)`, slopes
/// `(t1x, t1y)`, the tent-weighted mean fields of their pointing tents `bd` and of their
/// plane triples `bg` ([`super::bending`]) and plane pairs' constants `pf`
/// ([`pair_constants`]): per lane, the predicted slopes x and y and the half widths x and y
/// of window `s` (`out[4 s..4 s + 4]`, closed from the reach `R` on), the union of the open
/// windows in x (`out[OUT_LO]`, `out[OUT_HI]`) and the doublet's largest |q/p|
/// (`out[OUT_Q_HI]`). A closed window has a negative width.
///
/// The pointing parabola's curvature `kappa` predicts the change of chord slope
/// `kappa h` where the field is the same along the pointing and the triplet tents; where
/// it is not, the q/p the doublet allows (its estimate and errors, within the cut, an
/// interval `q_c +- dq`) carries the difference `q (c_g - c_d) h` of the bending per unit
/// q/p over the two tents: the prediction moves by `q_c (c_g - c_d) h` and the window
/// widens by `dq |c_g - c_d| h` (together at most `qmax |c_g - c_d| h`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn window_lanes<const R: usize>(
    cuts: &Cuts,
    pf: &[[f32; LANES]; PF_N],
    xa: &[f32; LANES],
    ya: &[f32; LANES],
    t1x: &[f32; LANES],
    t1y: &[f32; LANES],
    bd: &[[f32; LANES]; 3],
    bg: &[[[f32; LANES]; 3]; MAX_REACH],
) -> [[f32; LANES]; OUT_N] {
    let ns = cuts.n_sigma;
    let qmax = cuts.qop_max;
    let mut out = [[0.0f32; LANES]; OUT_N];
    for l in 0..LANES {
        let (pointing, inv_zi, two_inv_zj) = (pf[0][l], pf[1][l], pf[2][l]);
        let (kvar_ms_per_qop2, kvar_res) = (pf[5][l], pf[6][l]);
        let (tx, ty) = (t1x[l], t1y[l]);
        // Pointing parabola through the origin, a and b: curvature, its hard error from
        // the origin's size (and length) and its Gaussian variance (scattering per
        // (q/p)^2, resolution).
        let (ra, rya) = (xa[l] - cuts.origin[0], ya[l] - cuts.origin[1]);
        let kappa_x = pointing * (tx - ra * inv_zi) * two_inv_zj;
        let kappa_y = pointing * (ty - rya * inv_zi) * two_inv_zj;
        let (hard_slope, kappa_rel) = (pf[7][l], pf[8][l]);
        let hard_kx = pf[3][l] + hard_slope * (ra * inv_zi).abs() + kappa_rel * kappa_x.abs();
        let hard_ky = pf[4][l] + hard_slope * (rya * inv_zi).abs() + kappa_rel * kappa_y.abs();
        let sf2 = slope_factor2(tx, ty).min(cuts.sf2_max);
        let kvar_ms = kvar_ms_per_qop2 * sf2;
        // Curvature d2(x, y)/dz2 per unit q/p over the pointing tent, at the tent's mean
        // slope (the mean of its chords origin-a and a-b): in a strong field at large
        // slopes the bending factor changes along the track.
        let tpx = tx + pointing * 0.5 * (ra * inv_zi - tx);
        let tpy = ty + pointing * 0.5 * (rya * inv_zi - ty);
        let n1 = (1.0 + tpx * tpx + tpy * tpy).sqrt();
        let (ax, ay) = bending(tpx, tpy, [bd[0][l], bd[1][l], bd[2][l]]);
        let k = K_GEV_PER_T_MM as f32 * n1;
        let (cx, cy) = (k * ax, k * ay);
        let c2 = cx * cx + cy * cy;
        // Largest |q/p| of the doublet: its pointing estimate plus errors (with a field
        // and a pointing window), else the cut. Where the pointing tent has (almost) no
        // field the estimate's errors are unbounded and the cut applies.
        let use_ptg = cuts.fit_momentum * pointing > 0.0;
        let inv_c2 = 1.0 / if use_ptg { c2.max(1e-30) } else { 1.0 };
        let q_ptg = (kappa_x * cx + kappa_y * cy) * inv_c2;
        let hard = (hard_kx * cx.abs() + hard_ky * cy.abs()) * inv_c2;
        let sigma = ((kvar_ms * qmax * qmax + kvar_res) * inv_c2).sqrt();
        let q_ptg_hi = (q_ptg.abs() + hard + ns * sigma).min(qmax);
        let q_hi = if use_ptg { q_ptg_hi } else { qmax };
        // The q/p the doublet allows within the cut, `q_c +- dq` (inside `+-qmax`; at the
        // nearest end of the cut where its estimate is out of reach).
        let (q_c, dq) = if use_ptg {
            let d = hard + ns * sigma;
            let (q_lo, q_hi) = ((q_ptg - d).max(-qmax), (q_ptg + d).min(qmax));
            if q_lo <= q_hi {
                (0.5 * (q_lo + q_hi), 0.5 * (q_hi - q_lo))
            } else {
                (q_ptg.max(-qmax).min(qmax), 0.0)
            }
        } else {
            (0.0, 0.0)
        };
        let ms2 = q_hi * q_hi * (1.0 + cuts.mass2 * q_hi * q_hi) * sf2;
        let kvar = kvar_ms * q_hi * q_hi + kvar_res;
        let mut lo = f32::INFINITY;
        let mut hi = f32::NEG_INFINITY;
        // The windows past the reach stay closed.
        for s in R..MAX_REACH {
            out[s * 4 + 2][l] = -1.0;
        }
        for s in 0..R {
            let h = pf[PF_HALF + s][l];
            let var = kvar * h * h + pf[PF_TH2 + s][l] * ms2 + pf[PF_VAR + s][l];
            let gauss = ns * var.sqrt();
            // Bending per unit q/p over the triplet's tent at its mean slope (the chord a-b
            // plus half the predicted change), less the pointing tent's.
            let (ttx, tty) = (tx + 0.5 * kappa_x * h, ty + 0.5 * kappa_y * h);
            let kt = K_GEV_PER_T_MM as f32 * (1.0 + ttx * ttx + tty * tty).sqrt();
            let (gx, gy) = bending(ttx, tty, [bg[s][0][l], bg[s][1][l], bg[s][2][l]]);
            let (dcx, dcy) = ((kt * gx - cx) * h, (kt * gy - cy) * h);
            let pred_x = tx + kappa_x * h + q_c * dcx;
            let pred_y = ty + kappa_y * h + q_c * dcy;
            // A plane triple outside the detector or beyond the reach gets no window.
            let open = pf[PF_OPEN + s][l] > 0.0;
            let wx = if open {
                hard_kx * h + gauss + dq * dcx.abs()
            } else {
                -1.0
            };
            let wy = hard_ky * h + gauss + dq * dcy.abs();
            lo = if open { lo.min(pred_x - wx) } else { lo };
            hi = if open { hi.max(pred_x + wx) } else { hi };
            out[s * 4][l] = pred_x;
            out[s * 4 + 1][l] = pred_y;
            out[s * 4 + 2][l] = wx;
            out[s * 4 + 3][l] = wy;
        }
        out[OUT_LO][l] = lo;
        out[OUT_HI][l] = hi;
        out[OUT_Q_HI][l] = q_hi;
    }
    out
}

/// Phase 3: the kink test of `cands` (left doublets `ids[left]` of the chunk), in order;
/// the pairs that pass become triplets.
#[inline(always)]
fn kink_tests(
    geo: &FinderGeometry,
    cuts: &Cuts,
    cfg: &FinderConfig,
    buf: &mut CaBuffers,
    cands: &[Candidate],
    ids: &[u32],
    w: &ChunkWindows,
) {
    for group in cands.chunks(LANES) {
        let mut t1 = [[0.0f32; LANES]; 2];
        let mut t2 = [[0.0f32; LANES]; 2];
        let mut bf = [[0.0f32; LANES]; 3];
        let mut q_hi = [0.0f32; LANES];
        let mut tg = [[0.0f32; LANES]; 3];
        for l in 0..LANES {
            let c = group[l.min(group.len() - 1)];
            let i = c.left as usize;
            let s = c.s as usize;
            let r = buf.doublets[c.right as usize];
            t1[0][l] = w.t1x[i];
            t1[1][l] = w.t1y[i];
            t2[0][l] = r.tx;
            t2[1][l] = r.ty;
            for k in 0..3 {
                bf[k][l] = w.bg[s][k][i];
            }
            q_hi[l] = w.q_hi[i];
            let p = &geo.pair_lanes[w.pair[i] as usize];
            tg[0][l] = p.half[s];
            tg[1][l] = p.theta2_per_qop2[s];
            tg[2][l] = p.var_res[s];
        }
        let (pass, res) = kink_lanes(cuts, &t1, &t2, &bf, &q_hi, &tg);
        for (l, c) in group.iter().enumerate() {
            if !pass[l] {
                continue;
            }
            if buf.triplets.len() == cfg.limits.max_triplets {
                buf.overflow.triplets += 1;
                continue;
            }
            buf.triplets.push(Triplet {
                left: ids[c.left as usize],
                right: c.right,
                qop: res[0][l],
                qop_sigma: res[1][l],
                chi2: res[2][l],
            });
        }
    }
}

/// The kink test of eight doublet pairs from the slopes `t1` of the left and `t2` of the
/// right doublets, the tent-weighted mean field `bf` of their plane triple, the left doublet's largest |q/p|
/// `q_hi` and the plane triple's constants `tg` (half lever arm, scattering per
/// (q/p)^2, resolution variance): per lane, whether it passes, and q/p, its error and
/// the chi-square.
#[inline(always)]
fn kink_lanes(
    cuts: &Cuts,
    t1: &[[f32; LANES]; 2],
    t2: &[[f32; LANES]; 2],
    bf: &[[f32; LANES]; 3],
    q_hi: &[f32; LANES],
    tg: &[[f32; LANES]; 3],
) -> ([bool; LANES], [[f32; LANES]; 3]) {
    let ns = cuts.n_sigma;
    let qmax = cuts.qop_max;
    let ms_qmax = qmax * qmax * (1.0 + cuts.mass2 * qmax * qmax);
    let kk = K_GEV_PER_T_MM as f32;
    let mut pass = [false; LANES];
    let mut res = [[0.0f32; LANES]; 3];
    for l in 0..LANES {
        let (t1x, t1y, t2x, t2y) = (t1[0][l], t1[1][l], t2[0][l], t2[1][l]);
        let (half, th2, var_res) = (tg[0][l], tg[1][l], tg[2][l]);
        let (dx, dy) = (t2x - t1x, t2y - t1y);
        let (tmx, tmy) = (0.5 * (t1x + t2x), 0.5 * (t1y + t2y));
        let n2 = 1.0 + tmx * tmx + tmy * tmy;
        let (bx, by) = bending(tmx, tmy, [bf[0][l], bf[1][l], bf[2][l]]);
        let gk = kk * n2.sqrt() * half;
        let (gx, gy) = (gk * bx, gk * by);
        let g2 = gx * gx + gy * gy;
        let measure = cuts.fit_momentum > 0.0 && g2 > 0.0;
        let inv_g2 = 1.0 / if measure { g2 } else { 1.0 };
        let qop = if measure {
            (dx * gx + dy * gy) * inv_g2
        } else {
            0.0
        };
        let (rx, ry) = (dx - gx * qop, dy - gy * qop);
        let r2 = rx * rx + ry * ry;
        // Scattering at b and at skipped planes, per (q/p)^2, with the slope factor.
        let th = th2 * slope_factor2(tmx, tmy).min(cuts.sf2_max);
        let var_max = th * ms_qmax + var_res;
        let sigma_max = (var_max * inv_g2).sqrt();
        // Largest |q/p| both estimates allow.
        let q = (qop.abs() + ns * sigma_max).min(q_hi[l]);
        let v_q = th * q * q * (1.0 + cuts.mass2 * q * q) + var_res;
        let v = if measure { v_q } else { var_max };
        let in_momentum = !measure || !(qop.abs() > qmax + ns * sigma_max);
        pass[l] = in_momentum && !(r2 > cuts.chi2_max * v);
        res[0][l] = qop;
        res[1][l] = if measure { (v * inv_g2).sqrt() } else { 0.0 };
        res[2][l] = r2 / v;
    }
    (pass, res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HitRecord;
    use crate::tracking::ca::{doublets::find_doublets, hit_sorting::sort_hits};
    use crate::tracking::geometry::Detector;
    use crate::tracking::reco::synthetic::{detector, track};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The inverse window of the seeded step holds every hit of the plane whose doublet
    /// window holds the middle hit, on the forward tracker's planes (its field, and an
    /// origin off the axis), for middle hits inside the windows and on their corners.
    #[test]
    fn the_inverse_window_holds_every_hit_whose_window_holds_the_middle_hit() {
        use rand::Rng;
        let det = Detector::from_toml_file(std::path::Path::new(
            "fixtures/tracking/forward/detector_forward.toml",
        ))
        .expect("fixture");
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for (origin, pointing) in [(0.0, true), (1.5, true), (0.0, false)] {
            let mut cfg = FinderConfig::from_detector(&det, 1.0);
            cfg.origin_x_mm = origin;
            cfg.origin_y_mm = -origin;
            if !pointing {
                cfg.origin_half_x_mm = f64::INFINITY;
                cfg.origin_half_y_mm = f64::INFINITY;
            }
            let geo = FinderGeometry::new(&det, &cfg);
            for i in 0..det.planes.len() - 1 {
                let pw = PlaneWindows::new(&geo, &cfg, i, 1);
                assert_eq!(pw.pointing, pointing);
                let pl = &det.planes[i];
                let mut sh = SortedHits::default();
                for _ in 0..500 {
                    sh.x_mm
                        .push(rng.random_range(-pl.half_x_mm..pl.half_x_mm) as f32);
                    sh.y_mm
                        .push(rng.random_range(-pl.half_y_mm..pl.half_y_mm) as f32);
                }
                let mut boxes: [Vec<f32>; 4] = Default::default();
                for c0 in (0..500).step_by(LANES) {
                    let (_, _, b) = pw.boxes_of(&sh, c0, 500);
                    for (v, q) in boxes.iter_mut().zip(&b[0]) {
                        v.extend_from_slice(&q[..LANES.min(500 - c0)]);
                    }
                }
                let inverse = InverseWindow::new(&pw, &boxes, &sh, 0);
                let inside =
                    |b: [f32; 4], x: f32, y: f32| x >= b[0] && x <= b[1] && y >= b[2] && y <= b[3];
                let window = |k: usize| [0, 1, 2, 3].map(|q| boxes[q][k]);
                // Middle hits at random inside some window, and on windows' corners.
                let mut middles = Vec::new();
                for k in 0..100 {
                    let w = window(k);
                    if w[0] <= w[1] && w[2] <= w[3] {
                        middles
                            .push((rng.random_range(w[0]..=w[1]), rng.random_range(w[2]..=w[3])));
                        middles.extend([(w[0], w[2]), (w[1], w[3]), (w[0], w[3]), (w[1], w[2])]);
                    }
                }
                assert!(middles.len() > 100, "plane {i}");
                let mut held = 0;
                for (xb, yb) in middles {
                    let inv = inverse.of(xb, yb).expect("windows");
                    for k in 0..500 {
                        if inside(window(k), xb, yb) {
                            held += 1;
                            assert!(
                                inside(inv, sh.x_mm[k], sh.y_mm[k]),
                                "plane {i}, origin {origin}: hit {k} outside {inv:?}"
                            );
                        }
                    }
                }
                assert!(held > 0);
            }
        }
    }

    /// The input hit indices of triplet `t`'s three hits.
    fn input_hits(buf: &CaBuffers, t: &Triplet) -> [u32; 3] {
        let input = |h: u32| buf.hits.input_index[h as usize];
        let (l, r) = (
            buf.doublets[t.left as usize],
            buf.doublets[t.right as usize],
        );
        assert_eq!(l.b, r.a);
        [input(l.a), input(l.b), input(r.b)]
    }

    /// Runs the steps up to the triplets; returns the triplets as input hit indices with
    /// their q/p.
    fn triplets(det: &Detector, hits: &[HitRecord]) -> Vec<([u32; 3], f32)> {
        let cfg = FinderConfig::from_detector(det, 1.0);
        let geo = FinderGeometry::new(det, &cfg);
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
        find_doublets(&geo, &cfg, 2, &mut buf);
        find_triplets(&geo, &cfg, 2, &mut buf);
        let mut out: Vec<([u32; 3], f32)> = buf
            .triplets
            .iter()
            .map(|t| (input_hits(&buf, t), t.qop))
            .collect();
        out.sort_by_key(|a| a.0);
        out
    }

    /// Plane triples `(i, j, k)` a track crossing every plane makes, skipping at most one
    /// plane per doublet.
    fn expected(n: u32) -> Vec<[u32; 3]> {
        let mut v = Vec::new();
        for i in 0..n {
            for j in (i + 1)..(i + 3).min(n) {
                for k in (j + 1)..(j + 3).min(n) {
                    v.push([i, j, k]);
                }
            }
        }
        v
    }

    #[test]
    fn straight_track_without_field_makes_every_triplet_with_zero_curvature() {
        let det = detector(6, [0.0; 3], 0.003, 0.01);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut hits = Vec::new();
        track(
            &det,
            [0.3, -0.2, 0.08, -0.05, 0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let t = triplets(&det, &hits);
        let found: Vec<[u32; 3]> = t.iter().map(|x| x.0).collect();
        assert_eq!(found, expected(6));
        assert!(t.iter().all(|x| x.1 == 0.0));
    }

    #[test]
    fn helix_triplets_measure_the_momentum() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for &(p, q) in &[(1.2, 1.0), (3.0, -1.0), (20.0, 1.0)] {
            let mut hits = Vec::new();
            track(
                &det,
                [0.1, -0.1, 0.05 * q, 0.04, q / p],
                true,
                true,
                &mut rng,
                &mut hits,
            );
            let t = triplets(&det, &hits);
            let found: Vec<[u32; 3]> = t.iter().map(|x| x.0).collect();
            assert_eq!(found, expected(8), "p {p}");
            let mean = t.iter().map(|x| x.1 as f64).sum::<f64>() / t.len() as f64;
            assert!(
                (mean - q / p).abs() < 0.1 / p + 0.02,
                "p {p}: mean q/p {mean}"
            );
        }
    }

    /// In a strong field at large slopes the bending factor (1 + t^2) sqrt(1 + tx^2 + ty^2)
    /// changes along a track near the minimum momentum: a window that took both tents'
    /// bending at the left doublet's slope predicted the next chord a millimetre off over
    /// these lever arms, which only a wide origin box covered. With a beam spot of 0.05 mm
    /// every triplet of such a track (exact hits) must still be found.
    #[test]
    fn windows_hold_at_large_slopes_in_a_strong_field_with_a_small_origin_box() {
        let det = detector(9, [1.4, 0.0, 0.0], 0.003, 0.006);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        cfg.origin_half_x_mm = 0.05;
        cfg.origin_half_y_mm = 0.05;
        let geo = FinderGeometry::new(&det, &cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(19);
        for &(tx, ty, qop) in &[
            (0.12, 0.10, 1.0 / 1.02),
            (-0.15, 0.08, -1.0 / 1.05),
            (0.05, -0.20, 1.0 / 1.1),
        ] {
            let mut hits = Vec::new();
            track(
                &det,
                [0.0, 0.0, tx, ty, qop],
                false,
                false,
                &mut rng,
                &mut hits,
            );
            let n = hits.len();
            assert!(n >= 7, "the track leaves after {n} planes");
            let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
            sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
            find_doublets(&geo, &cfg, 1, &mut buf);
            find_triplets(&geo, &cfg, 1, &mut buf);
            let found: Vec<[u32; 3]> = buf.triplets.iter().map(|t| input_hits(&buf, t)).collect();
            for a in 0..n - 2 {
                let want = [a as u32, a as u32 + 1, a as u32 + 2];
                assert!(
                    found.contains(&want),
                    "slopes ({tx}, {ty}), q/p {qop}: triplet {want:?} missing, found {found:?}"
                );
            }
        }
    }

    #[test]
    fn kink_cut_follows_the_triplet_momentum() {
        // The same breaking angle (1.5 mrad in y at the second plane: within the kink cut's
        // `n_sigma` of scattering and resolution at 1.2 GeV/c, far beyond them at 20 GeV/c,
        // where the scattering is 17 times smaller) is kept on a soft track and refused on
        // a stiff one.
        let det = detector(4, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        for &(p, keep) in &[(1.2, true), (20.0, false)] {
            let mut hits = Vec::new();
            track(
                &det,
                [0.0, 0.0, 0.05, 0.03, 1.0 / p],
                false,
                false,
                &mut rng,
                &mut hits,
            );
            // Kink at plane 1 (z = 400): planes 2 and 3 move by 0.15 and 0.30 mm in y.
            hits[2].y_mm += 0.15;
            hits[3].y_mm += 0.30;
            let t = triplets(&det, &hits);
            let has = t.iter().any(|x| x.0 == [0, 1, 2]);
            assert_eq!(has, keep, "p {p}: {t:?}");
            // Downstream of the kink the track is straight again.
            assert!(t.iter().any(|x| x.0 == [1, 2, 3]), "p {p}");
        }
    }

    #[test]
    fn both_kernels_find_the_same_triplets_in_a_busy_event() {
        use rand::Rng;
        let det = detector(6, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(15);
        let mut hits = Vec::new();
        for _ in 0..300 {
            let q = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let p = rng.random_range(1.0..30.0);
            let start = [
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.25..0.25),
                rng.random_range(-0.25..0.25),
                q / p,
            ];
            track(&det, start, true, true, &mut rng, &mut hits);
        }
        for i in 0..3000 {
            hits.push(HitRecord {
                x_mm: rng.random_range(-200.0..200.0),
                y_mm: rng.random_range(-200.0..200.0),
                z_mm: 0.0,
                plane: (i % 6) as u16,
                hit_id: hits.len() as u32,
            });
        }
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        for reach in [1, 2] {
            let run = |kernel: Kernel| {
                let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
                sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
                find_doublets(&geo, &cfg, reach, &mut buf);
                find_triplets_with(kernel, &geo, &cfg, reach, &mut buf);
                let t: Vec<_> = buf
                    .triplets
                    .iter()
                    .map(|t| (t.left, t.right, t.qop, t.qop_sigma, t.chi2))
                    .collect();
                (t, buf.doublets.len())
            };
            let (portable, n_doublets) = run(Kernel::Portable);
            assert!(portable.len() > 300, "{} triplets", portable.len());
            assert!(n_doublets > 300, "{n_doublets} doublets");
            assert_eq!(run(Kernel::detect()).0, portable, "reach {reach}");
        }
    }

    /// The seeded step's windows computed once per left doublet of a middle hit
    /// ([`middle_hit_tests`]) give the pairs' triplets ([`pair_tests`]) exactly: the same
    /// triplets, in the same order, to the bit, on central events of the uniform field,
    /// the dipole map and the forward tracker's field (where the neighbour test against
    /// the triplets downstream runs too), whichever middle hits take that way.
    #[test]
    fn windows_per_left_doublet_give_the_pairs_triplets() {
        use crate::tracking::ca::doublets::find_doublets_with;
        use crate::tracking::simulate::{simulate_events, Preset, SimConfig};
        for file in [
            "fixtures/detector.toml",
            "fixtures/tracking/dipole/detector_dipole.toml",
            "fixtures/tracking/forward/detector_forward.toml",
        ] {
            let det = Detector::from_toml_file(std::path::Path::new(file))
                .expect("fixtures (tests run from the crate root)");
            let cfg = FinderConfig::from_detector(&det, 1.0);
            let geo = FinderGeometry::new(&det, &cfg);
            let n = det.planes.len();
            let seed_planes = (n + 1).saturating_sub(cfg.first_pass_min_hits.max(3));
            let sim = SimConfig::preset(Preset::Central);
            let ev = simulate_events(&det, &sim, 5, 0, 1)
                .next()
                .expect("an event");
            let kernel = Kernel::detect();
            let run = |from: usize| {
                let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
                sort_hits(&geo, &ev.hits, cfg.limits.max_hits, &mut buf);
                let a_planes = seed_doublet_planes(n, seed_planes);
                find_doublets_with(kernel, &geo, &cfg, 1, a_planes, &mut buf);
                let search = Search::Seeded {
                    seed_planes,
                    to_last_plane: cfg.first_pass_to_last_plane,
                    window_per_left_from: from,
                };
                dispatch(kernel, &geo, &cfg, search, &mut buf);
                let bits = |v: f32| v.to_bits();
                buf.triplets
                    .iter()
                    .map(|t| {
                        (
                            t.left,
                            t.right,
                            bits(t.qop),
                            bits(t.qop_sigma),
                            bits(t.chi2),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let pairs = run(usize::MAX);
            assert!(pairs.len() > 5000, "{file}: {} triplets", pairs.len());
            for from in [1, 2, WINDOW_PER_LEFT_FROM] {
                assert!(
                    run(from) == pairs,
                    "{file}: windows from {from} right doublets"
                );
            }
        }
    }

    #[test]
    fn crossing_tracks_do_not_exchange_hits() {
        let det = detector(8, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let mut hits = Vec::new();
        let (a, _) = track(
            &det,
            [0.0, 0.0, 0.10, 0.02, 0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let _ = track(
            &det,
            [0.0, 0.0, -0.03, 0.021, -0.5],
            true,
            true,
            &mut rng,
            &mut hits,
        );
        let t = triplets(&det, &hits);
        let owner = |h: u32| if a.contains(&h) { 0 } else { 1 };
        for (ids, _) in &t {
            assert!(
                ids.iter().all(|&h| owner(h) == owner(ids[0])),
                "mixed triplet {ids:?}"
            );
        }
        assert_eq!(t.len(), 2 * expected(8).len());
    }

    #[test]
    fn early_track_ends_are_kept_only_where_the_track_may_leave() {
        // Five planes (300 mm half size); tracks of at least four hits end on plane 3 or
        // 4. One track crosses every plane; one stops on plane 3 pointing at the middle
        // of plane 4; one stops on plane 3 heading out of plane 4 (x = 282 mm on plane 3,
        // 329 mm at plane 4's z).
        let det = detector(5, [0.0, 0.5, 0.0], 0.003, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        let mut hits = Vec::new();
        let starts = [
            [0.1, 0.2, 0.05, 0.02, 0.3],
            [-0.2, 0.1, -0.1, 0.06, -0.3],
            [0.0, -0.1, 0.47, -0.03, 0.2],
        ];
        let mut tracks = Vec::new();
        for (k, start) in starts.iter().enumerate() {
            let (mut ids, _) = track(&det, *start, false, true, &mut rng, &mut hits);
            if k > 0 {
                ids.pop();
                hits.pop();
            }
            tracks.push(ids);
        }
        let (a, last) = (&hits[tracks[2][2] as usize], &hits[tracks[2][3] as usize]);
        let t = (last.x_mm - a.x_mm) / (last.z_mm - a.z_mm);
        assert!(last.x_mm < 300.0 && last.x_mm + 100.0 * t > 300.0);
        assert!(geo.may_leave(3, last.x_mm, last.y_mm, t, 0.0));
        let mid = &hits[tracks[1][3] as usize];
        assert!(!geo.may_leave(3, mid.x_mm, mid.y_mm, -0.1, 0.06));
        assert!(geo.may_leave(4, 0.0, 0.0, 0.0, 0.0));
        assert!(geo.may_leave(3, f32::NAN, 0.0, 0.0, 0.0));

        let input_triplets = |buf: &CaBuffers| {
            let mut v: Vec<[u32; 3]> = buf.triplets.iter().map(|t| input_hits(buf, t)).collect();
            v.sort();
            v
        };
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
        find_doublets(&geo, &cfg, 1, &mut buf);
        find_triplets(&geo, &cfg, 1, &mut buf);
        assert_eq!(buf.triplets.len(), 3 + 2 + 2);
        assert_eq!(prune_dead_ends(&geo, 3, &mut buf), 2);
        let kept = input_triplets(&buf);
        let mut expected: Vec<[u32; 3]> = [&tracks[0][..], &tracks[2][..]]
            .iter()
            .flat_map(|ids| ids.windows(3).map(|w| [w[0], w[1], w[2]]))
            .collect();
        expected.sort();
        assert_eq!(kept, expected);

        // The seeded search makes the same triplets; without `to_last_plane` it keeps the
        // early end too.
        for (to_last_plane, n) in [(true, 5), (false, 7)] {
            let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
            sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
            let a_planes = seed_doublet_planes(5, 2);
            crate::tracking::ca::doublets::find_doublets_with(
                Kernel::detect(),
                &geo,
                &cfg,
                1,
                a_planes,
                &mut buf,
            );
            find_triplets_seeded(&geo, &cfg, 2, to_last_plane, &mut buf);
            assert_eq!(buf.triplets.len(), n, "{to_last_plane}");
            if to_last_plane {
                assert_eq!(input_triplets(&buf), expected);
            }
        }
    }
}
