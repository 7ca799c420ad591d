//! Doublets: pairs of hits on planes `i` and `i + 1` (and up to `i + reach`, at most
//! `i + MAX_REACH`, when planes may be missing), kept when the pair's slopes lie inside the detector's slope limits and its
//! straight extrapolation points back to the origin region within a window made of
//! (a) the origin's half size, (b) the bending of a track at the minimum momentum,
//! (c) `n_sigma` times the multiple scattering of the planes up to `i` at that momentum
//! (with the slope factor of the direction the hit is seen from the origin) and
//! (d) `n_sigma` times the hit resolution propagated to the origin. Hits already used by a
//! track (in an earlier pass) are left out.
//!
//! The windows of [`LANES`] hits of a plane are computed together in `f32` (no branches,
//! vector instructions); each window is a box on the target plane, and the hits in it are
//! found by scanning, per grid row the box overlaps, the row's cells between the box's
//! columns (one contiguous range of the sorted hits) with a vector comparison of eight
//! hits at a time (AVX2, chosen at run time; the portable kernel compares one by one and
//! finds the same doublets).

// Negated comparisons keep NaN out of every window (a NaN fails each test); the lane
// loops index several arrays by lane.
#![allow(clippy::neg_cmp_op_on_partial_ord, clippy::needless_range_loop)]

use super::cuts::FinderConfig;
use super::{push_doublet, CaBuffers, Doublet, FinderGeometry, Kernel, MAX_REACH};
use crate::tracking::propagate::K_GEV_PER_T_MM;
use std::ops::Range;

/// Hits whose windows are computed together.
pub(crate) const LANES: usize = 8;

/// Fills `buf.doublets` (with `buf.dbl_lanes`) and `buf.dbl_start`
/// (per sorted hit, its outgoing doublets) with the pairs of hits not yet used by a track,
/// on planes at most `reach` apart (1: consecutive planes only; 2: also skipping one; 3:
/// also skipping two in a row).
/// Each hit's doublets are ordered by target plane, then by grid cell and x.
pub fn find_doublets(geo: &FinderGeometry, cfg: &FinderConfig, reach: usize, buf: &mut CaBuffers) {
    let n_planes = geo.planes.len();
    find_doublets_with(Kernel::detect(), geo, cfg, reach, 0..n_planes, buf)
}

/// [`find_doublets`] with the given kernel (the portable one where the CPU lacks it), from
/// the hits of the planes `a_planes` only (the others get no outgoing doublets).
pub fn find_doublets_with(
    kernel: Kernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    a_planes: Range<usize>,
    buf: &mut CaBuffers,
) {
    find_doublets_in(kernel, geo, cfg, reach, a_planes, None, buf)
}

/// [`find_doublets_with`], searching the hits not used yet through a copy of them
/// (`CaBuffers::free_hits`) when `free_copy` says so; `None`: when most hits are used
/// (a later pass), so that the windows do not scan the used ones. Both find the same
/// doublets.
pub(crate) fn find_doublets_in(
    kernel: Kernel,
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    a_planes: Range<usize>,
    free_copy: Option<bool>,
    buf: &mut CaBuffers,
) {
    let n_hits = buf.hits.used.len();
    let copy = free_copy.unwrap_or_else(|| {
        n_hits * 2 > geo.n_bins && buf.hits.used.iter().filter(|&&u| u).count() * 2 > n_hits
    });
    if copy {
        super::hit_sorting::free_hits(&buf.hits, &mut buf.free_hits, &mut buf.scratch_u32);
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        unsafe { find_doublets_avx2(geo, cfg, reach, a_planes, copy, buf) };
        return;
    }
    let _ = kernel;
    find_doublets_portable(geo, cfg, reach, a_planes, copy, buf)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_doublets_avx2(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    a_planes: Range<usize>,
    copy: bool,
    buf: &mut CaBuffers,
) {
    find_doublets_impl::<true>(geo, cfg, reach, a_planes, copy, buf)
}

#[inline(never)]
fn find_doublets_portable(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    a_planes: Range<usize>,
    copy: bool,
    buf: &mut CaBuffers,
) {
    find_doublets_impl::<false>(geo, cfg, reach, a_planes, copy, buf)
}

/// A target plane of the doublets leaving plane `i`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Target {
    pub(crate) plane: usize,
    pub(crate) dz: f32,
    pub(crate) inv_dz: f64,
    /// Bending lever `(z_i - z_o) (z_j - z_o) / 2`, mm^2.
    pub(crate) bend: f32,
    /// Resolution terms of the window at the origin, mm.
    pub(crate) meas_x: f32,
    pub(crate) meas_y: f32,
    /// Largest |B| components of the pointing tent `(origin, i, j)`, tesla.
    pub(crate) b: [f32; 3],
}

/// The doublet windows of the hits of one plane `i`: per target plane `j`, a box on plane
/// `j` per hit, computed for [`LANES`] hits at once in `f32`. The triplet step uses the
/// same boxes for the doublets it makes, so both find the same ones.
#[derive(Clone, Copy)]
pub(crate) struct PlaneWindows {
    pub(crate) pointing: bool,
    pub(crate) inv_lever_a: f32,
    pub(crate) ms: f32,
    pub(crate) targets: [Target; MAX_REACH],
    pub(crate) n_target: usize,
    pub(crate) max_t: [f32; 2],
    pub(crate) max_c: [f32; 2],
    pub(crate) sf_max: f32,
    pub(crate) origin_half: [f32; 2],
    /// The origin's centre in x and y, mm.
    pub(crate) origin_c: [f32; 2],
    /// A long origin (`origin_half_z_mm`, `hz`) seen from this plane (lever `a`): the box
    /// at a hit offset `r` from the centre is `(half + hz |r| / a) a / (a - hz)`, the
    /// largest miss at the origin plane of a line through the hit from anywhere in the
    /// region (its slope up to `(|r| + half) / (a - hz)`). `hz / a`, and `a / (a - hz)`;
    /// 0 and 1 for a thin target.
    pub(crate) hz_inv_a: f32,
    pub(crate) box_scale: f32,
    pub(crate) k_qop: f32,
}

/// Per target, the boxes `[x0, x1, y0, y1]` of [`LANES`] hits (an empty box has
/// `x0 > x1` or `y0 > y1`).
pub(crate) type Boxes = [[[f32; LANES]; 4]; MAX_REACH];

impl PlaneWindows {
    /// Windows of plane `i` towards the planes `i + 1 ..= i + reach` (reach 1 to
    /// [`MAX_REACH`]).
    pub(crate) fn new(geo: &FinderGeometry, cfg: &FinderConfig, i: usize, reach: usize) -> Self {
        let n_planes = geo.planes.len();
        let gi = &geo.planes[i];
        let lever_a = gi.z_mm - cfg.origin_z_mm;
        let hz = cfg.origin_half_z_mm.max(0.0);
        let mut targets = [Target::default(); MAX_REACH];
        let mut n_target = 0;
        for j in (i + 1)..(i + 1 + reach.clamp(1, MAX_REACH)).min(n_planes) {
            let gj = &geo.planes[j];
            let dz = gj.z_mm - gi.z_mm;
            if dz <= 0.0 {
                continue;
            }
            let lever_b = gj.z_mm - cfg.origin_z_mm;
            let meas = |vi: f64, vj: f64| {
                (cfg.n_sigma * ((vi * lever_b * lever_b + vj * lever_a * lever_a).sqrt() / dz))
                    as f32
            };
            targets[n_target] = Target {
                plane: j,
                dz: dz as f32,
                inv_dz: 1.0 / dz,
                // The pointing tent's sagitta at the chord, from the region's upstream
                // end (the lever to plane j is longer by `hz`).
                bend: (0.5 * lever_a * (lever_b + hz)) as f32,
                meas_x: meas(gi.var_x, gj.var_x),
                meas_y: meas(gi.var_y, gj.var_y),
                b: geo.pointing_b_max_tesla[i * n_planes + j].map(|v| v as f32),
            };
            n_target += 1;
        }
        PlaneWindows {
            pointing: lever_a - hz > 1.0
                && cfg.origin_half_x_mm.is_finite()
                && cfg.origin_half_y_mm.is_finite(),
            inv_lever_a: (1.0 / lever_a) as f32,
            ms: (cfg.n_sigma * gi.ms_origin_mm) as f32,
            targets,
            n_target,
            max_t: [cfg.max_tx as f32, cfg.max_ty as f32],
            max_c: [
                cfg.max_curvature_x_per_mm as f32,
                cfg.max_curvature_y_per_mm as f32,
            ],
            sf_max: cfg.slope_factor as f32,
            origin_half: [cfg.origin_half_x_mm as f32, cfg.origin_half_y_mm as f32],
            origin_c: [cfg.origin_x_mm as f32, cfg.origin_y_mm as f32],
            // (Without pointing, unused: kept finite.)
            hz_inv_a: if lever_a - hz > 1.0 {
                (hz / lever_a) as f32
            } else {
                0.0
            },
            box_scale: if lever_a - hz > 1.0 {
                (lever_a / (lever_a - hz)) as f32
            } else {
                1.0
            },
            k_qop: (K_GEV_PER_T_MM * cfg.qop_max()) as f32,
        }
    }

    /// Target `k`'s plane and `1 / dz`, or `None` past the targets.
    #[inline(always)]
    pub(crate) fn target(&self, k: usize) -> Option<(usize, f64)> {
        (k < self.n_target).then(|| (self.targets[k].plane, self.targets[k].inv_dz))
    }

    /// The coordinates and boxes of the sorted hits `c0..min(c0 + LANES, end)` of this
    /// plane (lanes past `end` repeat the last hit).
    #[inline(always)]
    pub(crate) fn boxes_of(
        &self,
        sh: &super::SortedHits,
        c0: usize,
        end: usize,
    ) -> ([f32; LANES], [f32; LANES], Boxes) {
        let (mut xa, mut ya) = ([0.0f32; LANES], [0.0f32; LANES]);
        for l in 0..LANES {
            let h = (c0 + l).min(end - 1);
            xa[l] = sh.x_mm[h];
            ya[l] = sh.y_mm[h];
        }
        let boxes = self.boxes(&xa, &ya);
        (xa, ya, boxes)
    }

    /// The boxes of hits at `(xa, ya)` on this plane: first the per-hit quantities, then
    /// the boxes target by target, each a loop over whole lanes (vector instructions).
    #[inline(always)]
    pub(crate) fn boxes(&self, xa: &[f32; LANES], ya: &[f32; LANES]) -> Boxes {
        let [max_tx, max_ty] = self.max_t;
        let (mut tx, mut ty) = ([0.0f32; LANES], [0.0f32; LANES]);
        let (mut knn, mut sf) = ([0.0f32; LANES], [0.0f32; LANES]);
        // The hits' offsets from the origin's centre.
        let (mut rx, mut ry) = ([0.0f32; LANES], [0.0f32; LANES]);
        for l in 0..LANES {
            rx[l] = xa[l] - self.origin_c[0];
            ry[l] = ya[l] - self.origin_c[1];
            // The direction this hit is seen from the origin (the curvature bound at the
            // largest slopes would be wider), and the slope factor.
            tx[l] = (rx[l].abs() * self.inv_lever_a + 0.05).min(max_tx);
            ty[l] = (ry[l].abs() * self.inv_lever_a + 0.05).min(max_ty);
            let n2 = 1.0 + tx[l] * tx[l] + ty[l] * ty[l];
            let nn = n2.sqrt();
            knn[l] = self.k_qop * nn;
            let t = tx[l].max(ty[l]);
            sf[l] = (((1.0 + t * t) * n2).sqrt() * nn.sqrt()).min(self.sf_max);
        }
        let mut boxes = [[[0.0f32; LANES]; 4]; MAX_REACH];
        for (k, tg) in self.targets[..self.n_target].iter().enumerate() {
            let bx = &mut boxes[k];
            let b = tg.b;
            for l in 0..LANES {
                // Curvature bound from the largest field of the pointing tent.
                let (tx, ty) = (tx[l], ty[l]);
                let ax = tx * ty * b[0] + (1.0 + tx * tx) * b[1] + ty * b[2];
                let ay = (1.0 + ty * ty) * b[0] + tx * ty * b[1] + tx * b[2];
                let kx = (knn[l] * ax).min(self.max_c[0]);
                let ky = (knn[l] * ay).min(self.max_c[1]);
                let (mut tx0, mut tx1, mut ty0, mut ty1) = (-max_tx, max_tx, -max_ty, max_ty);
                if self.pointing {
                    let hx = (self.origin_half[0] + self.hz_inv_a * rx[l].abs()) * self.box_scale;
                    let hy = (self.origin_half[1] + self.hz_inv_a * ry[l].abs()) * self.box_scale;
                    let wx = hx + tg.bend * kx + self.ms * sf[l] + tg.meas_x;
                    let wy = hy + tg.bend * ky + self.ms * sf[l] + tg.meas_y;
                    tx0 = tx0.max((rx[l] - wx) * self.inv_lever_a);
                    tx1 = tx1.min((rx[l] + wx) * self.inv_lever_a);
                    ty0 = ty0.max((ry[l] - wy) * self.inv_lever_a);
                    ty1 = ty1.min((ry[l] + wy) * self.inv_lever_a);
                }
                let open = tx0 <= tx1 && ty0 <= ty1;
                bx[0][l] = xa[l] + tg.dz * tx0;
                bx[1][l] = if open {
                    xa[l] + tg.dz * tx1
                } else {
                    f32::NEG_INFINITY
                };
                bx[2][l] = ya[l] + tg.dz * ty0;
                bx[3][l] = ya[l] + tg.dz * ty1;
            }
        }
        boxes
    }
}

/// Row ranges longer than this are narrowed by binary search before the scan.
const BISECT_MIN: usize = 24;
/// The same for the vector scan (eight hits per comparison).
const BISECT_MIN_AVX2: usize = 64;

/// Calls `emit(h)` for the hits of plane `j` inside the box `bx` (`[x0, x1, y0, y1]`), row
/// by row of the grid, in sorted order.
#[inline(always)]
pub(crate) fn scan_box<const AVX2: bool>(
    geo: &FinderGeometry,
    sh: &super::SortedHits,
    j: usize,
    bx: [f32; 4],
    emit: &mut impl FnMut(usize),
) {
    if !(bx[0] <= bx[1] && bx[2] <= bx[3]) {
        return;
    }
    scan_cells::<AVX2>(geo, sh, j, bx, box_cells(geo, j, bx), emit);
}

/// The grid cells of plane `j` a box `[x0, x1, y0, y1]` overlaps: first and last column,
/// first and last row.
#[inline(always)]
pub(crate) fn box_cells(geo: &FinderGeometry, j: usize, bx: [f32; 4]) -> [u16; 4] {
    let (bx0, by0) = geo.bin_xy(j, bx[0], bx[2]);
    let (bx1, by1) = geo.bin_xy(j, bx[1], bx[3]);
    [bx0 as u16, bx1 as u16, by0 as u16, by1 as u16]
}

/// [`scan_box`] of a non-empty box whose cells ([`box_cells`]) are known.
#[inline(always)]
pub(crate) fn scan_cells<const AVX2: bool>(
    geo: &FinderGeometry,
    sh: &super::SortedHits,
    j: usize,
    bx: [f32; 4],
    cells: [u16; 4],
    emit: &mut impl FnMut(usize),
) {
    let gj = &geo.planes[j];
    let [bx0, bx1, by0, by1] = cells.map(|c| c as usize);
    for by in by0..=by1 {
        let row = gj.bin_offset + by * gj.bins_x;
        let mut s = sh.bin_start[row + bx0] as usize;
        let mut e = sh.bin_start[row + bx1 + 1] as usize;
        if e - s > if AVX2 { BISECT_MIN_AVX2 } else { BISECT_MIN } {
            // A long row range (narrow windows): the x range by binary search, the row
            // being sorted by x.
            let xs = &sh.x_mm[s..e];
            let (lo, hi) = (
                xs.partition_point(|&x| x < bx[0]),
                xs.partition_point(|&x| x <= bx[1]),
            );
            (s, e) = (s + lo, s + hi);
        }
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: the AVX2 instances only run where the CPU has AVX2.
            unsafe { scan_avx2(&sh.x_mm, &sh.y_mm, s, e, bx, emit) };
            continue;
        }
        scan(&sh.x_mm, &sh.y_mm, s, e, bx, emit);
    }
}

#[inline(always)]
fn find_doublets_impl<const AVX2: bool>(
    geo: &FinderGeometry,
    cfg: &FinderConfig,
    reach: usize,
    a_planes: Range<usize>,
    copy: bool,
    buf: &mut CaBuffers,
) {
    let n_planes = geo.planes.len();
    let CaBuffers {
        hits,
        free_hits,
        doublets,
        dbl_lanes,
        dbl_start,
        overflow,
        ..
    } = buf;
    let n_hits = hits.x_mm.len();
    // The hits searched, and their indices in `hits` (in the copy: `input_index`).
    let (sh, index) = if copy {
        (&*free_hits, Some(&free_hits.input_index[..]))
    } else {
        (&*hits, None)
    };
    let index = |h: usize| index.map_or(h, |m| m[h] as usize);
    doublets.clear();
    dbl_lanes.tx.clear();
    dbl_lanes.ty.clear();
    dbl_lanes.gap.clear();
    dbl_start.clear();
    dbl_start.resize(n_hits + 1, 0);
    // Hits before `next` have their `dbl_start`.
    let mut next = 0;
    let max_doublets = cfg.limits.max_doublets;
    let a_planes = a_planes.start.min(n_planes)..a_planes.end.min(n_planes);
    for i in a_planes {
        let gi = &geo.planes[i];
        let (first, end) = sh.plane_range(gi);
        let pw = PlaneWindows::new(geo, cfg, i, reach);
        for c0 in (first..end).step_by(LANES) {
            let n = (end - c0).min(LANES);
            let (xa, ya, boxes) = pw.boxes_of(sh, c0, end);
            for l in 0..n {
                let a = c0 + l;
                let ia = index(a);
                for h in next..=ia {
                    dbl_start[h] = doublets.len() as u32;
                }
                next = ia + 1;
                if sh.used[a] {
                    continue;
                }
                let (xa64, ya64) = (xa[l] as f64, ya[l] as f64);
                let mut k = 0;
                while let Some((j, inv_dz)) = pw.target(k) {
                    let bx = [
                        boxes[k][0][l],
                        boxes[k][1][l],
                        boxes[k][2][l],
                        boxes[k][3][l],
                    ];
                    let gap = (j - i - 1) as f32;
                    let mut emit = |b: usize| {
                        if sh.used[b] {
                            return;
                        }
                        let (tx, ty) = slopes(sh.x_mm[b], sh.y_mm[b], xa64, ya64, inv_dz);
                        let d = Doublet {
                            a: ia as u32,
                            b: index(b) as u32,
                            tx,
                            ty,
                        };
                        push_doublet(doublets, dbl_lanes, overflow, max_doublets, d, gap);
                    };
                    scan_box::<AVX2>(geo, sh, j, bx, &mut emit);
                    k += 1;
                }
            }
        }
    }
    // The hits after the last searched one, and the end.
    let total = doublets.len() as u32;
    for h in next..=n_hits {
        dbl_start[h] = total;
    }
}

/// Slopes of a doublet from its hits (`(xa, ya)` upstream), as the doublet step stores
/// them.
#[inline(always)]
pub(crate) fn slopes(xb: f32, yb: f32, xa: f64, ya: f64, inv_dz: f64) -> (f32, f32) {
    (
        ((xb as f64 - xa) * inv_dz) as f32,
        ((yb as f64 - ya) * inv_dz) as f32,
    )
}

/// Calls `emit(h)` for the hits `h` in `s..e` inside the box `[x0, x1] x [y0, y1]`, in order.
#[inline(always)]
fn scan(xs: &[f32], ys: &[f32], s: usize, e: usize, bx: [f32; 4], emit: &mut impl FnMut(usize)) {
    for h in s..e {
        let (x, y) = (xs[h], ys[h]);
        if x >= bx[0] && x <= bx[1] && y >= bx[2] && y <= bx[3] {
            emit(h);
        }
    }
}

/// [`scan`] comparing eight hits at a time.
///
/// # Safety
/// The CPU must support AVX2; `s <= e <= xs.len(), ys.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scan_avx2(
    xs: &[f32],
    ys: &[f32],
    s: usize,
    e: usize,
    bx: [f32; 4],
    emit: &mut impl FnMut(usize),
) {
    use std::arch::x86_64::*;
    assert!(s <= e && e <= xs.len() && e <= ys.len());
    let (x0, x1) = (_mm256_set1_ps(bx[0]), _mm256_set1_ps(bx[1]));
    let (y0, y1) = (_mm256_set1_ps(bx[2]), _mm256_set1_ps(bx[3]));
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut h = s;
    while h < e {
        let left = e - h;
        let (px, py) = (xs.as_ptr().add(h), ys.as_ptr().add(h));
        let (vx, vy, valid) = if left >= 8 {
            (_mm256_loadu_ps(px), _mm256_loadu_ps(py), 0xff)
        } else {
            // Masked loads read only the lanes inside the slices.
            let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left as i32), lane);
            (
                _mm256_maskload_ps(px, m),
                _mm256_maskload_ps(py, m),
                (1u32 << left) - 1,
            )
        };
        let inside = _mm256_and_ps(
            _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(vx, x0),
                _mm256_cmp_ps::<_CMP_LE_OQ>(vx, x1),
            ),
            _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(vy, y0),
                _mm256_cmp_ps::<_CMP_LE_OQ>(vy, y1),
            ),
        );
        let mut bits = _mm256_movemask_ps(inside) as u32 & valid;
        while bits != 0 {
            emit(h + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
        h += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HitRecord;
    use crate::tracking::ca::hit_sorting::sort_hits;
    use crate::tracking::reco::synthetic::{detector, track};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Doublets of an event as input hit pairs with their slopes, for a grid of
    /// `bins_x` x `bins_y` cells per plane.
    fn doublets(
        hits: &[HitRecord],
        bins: (usize, usize),
        reach: usize,
        kernel: Kernel,
    ) -> Vec<(u32, u32, f32, f32)> {
        let det = detector(5, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        (cfg.bins_x, cfg.bins_y) = bins;
        let geo = FinderGeometry::new(&det, &cfg);
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, hits, cfg.limits.max_hits, &mut buf);
        find_doublets_with(kernel, &geo, &cfg, reach, 0..geo.planes.len(), &mut buf);
        let ii = &buf.hits.input_index;
        // Per hit, its outgoing doublets; the slope arrays match the doublets.
        for h in 0..buf.hits.x_mm.len() {
            let (s, e) = (buf.dbl_start[h] as usize, buf.dbl_start[h + 1] as usize);
            assert!(buf.doublets[s..e].iter().all(|d| d.a as usize == h));
        }
        assert_eq!(
            buf.dbl_start[buf.hits.x_mm.len()] as usize,
            buf.doublets.len()
        );
        for (k, d) in buf.doublets.iter().enumerate() {
            assert_eq!((buf.dbl_lanes.tx[k], buf.dbl_lanes.ty[k]), (d.tx, d.ty));
            let gap = buf.hits.plane[d.b as usize] - buf.hits.plane[d.a as usize] - 1;
            assert_eq!(buf.dbl_lanes.gap[k], gap as f32);
        }
        let mut out: Vec<_> = buf
            .doublets
            .iter()
            .map(|d| (ii[d.a as usize], ii[d.b as usize], d.tx, d.ty))
            .collect();
        out.sort_by_key(|d| (d.0, d.1));
        out
    }

    #[test]
    fn doublets_do_not_depend_on_the_grid_or_the_kernel_and_hold_every_track_segment() {
        let det = detector(5, [0.0, 0.8, 0.0], 0.004, 0.016);
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut hits = Vec::new();
        let mut segments = Vec::new();
        for _ in 0..150 {
            let q = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let p = rng.random_range(1.2..20.0);
            let start = [
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.2..0.2),
                rng.random_range(-0.2..0.2),
                q / p,
            ];
            let (ids, _) = track(&det, start, true, true, &mut rng, &mut hits);
            segments.extend(ids.windows(2).map(|w| (w[0], w[1])));
        }
        // Noise hits fill the planes.
        for i in 0..2000 {
            hits.push(HitRecord {
                x_mm: rng.random_range(-150.0..150.0),
                y_mm: rng.random_range(-150.0..150.0),
                z_mm: 0.0,
                plane: (i % 5) as u16,
                hit_id: hits.len() as u32,
            });
        }
        for reach in 1..=MAX_REACH {
            // One cell per plane: every hit of the plane is a candidate of every window.
            let all = doublets(&hits, (1, 1), reach, Kernel::Portable);
            assert!(all.len() > segments.len());
            for bins in [(1, 1), (8, 128), (2, 512), (16, 16), (32, 128)] {
                // The vector kernel (where the CPU has it) finds the same doublets.
                for kernel in [Kernel::Portable, Kernel::detect()] {
                    assert_eq!(
                        doublets(&hits, bins, reach, kernel),
                        all,
                        "bins {bins:?}, {kernel:?}"
                    );
                }
            }
            let pairs: Vec<(u32, u32)> = all.iter().map(|d| (d.0, d.1)).collect();
            let missing = segments
                .iter()
                .filter(|s| pairs.binary_search(s).is_err())
                .count();
            assert_eq!(missing, 0, "reach {reach}");
            // Slopes are those of the two hits.
            for &(a, b, tx, ty) in &all {
                let (ha, hb) = (&hits[a as usize], &hits[b as usize]);
                let dz = 100.0 * (hb.plane - ha.plane) as f32;
                assert!((tx - (hb.x_mm - ha.x_mm) / dz).abs() < 1e-5);
                assert!((ty - (hb.y_mm - ha.y_mm) / dz).abs() < 1e-5);
                assert!(hb.plane > ha.plane && hb.plane - ha.plane <= reach as u16);
            }
        }
    }

    #[test]
    fn a_later_pass_finds_the_same_doublets_through_the_copy_of_the_free_hits() {
        let det = detector(5, [0.0, 0.8, 0.0], 0.004, 0.016);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut hits = Vec::new();
        for _ in 0..300 {
            let start = [
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.5..0.5),
                rng.random_range(-0.2..0.2),
                rng.random_range(-0.2..0.2),
                rng.random_range(-0.8..0.8),
            ];
            track(&det, start, true, true, &mut rng, &mut hits);
        }
        let mut buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
        // Most hits taken by an earlier pass.
        for u in buf.hits.used.iter_mut() {
            *u = rng.random_bool(0.7);
        }
        let n_hits = buf.hits.x_mm.len();
        for reach in 1..=MAX_REACH {
            for a_planes in [0..5, 1..3] {
                let mut found = Vec::new();
                for copy in [false, true] {
                    for kernel in [Kernel::Portable, Kernel::detect()] {
                        let planes = a_planes.clone();
                        find_doublets_in(kernel, &geo, &cfg, reach, planes, Some(copy), &mut buf);
                        // Per hit its outgoing doublets, none with a used hit.
                        for h in 0..n_hits {
                            let (s, e) = (buf.dbl_start[h] as usize, buf.dbl_start[h + 1] as usize);
                            assert!(buf.doublets[s..e].iter().all(|d| d.a as usize == h));
                        }
                        assert_eq!(buf.dbl_start[n_hits] as usize, buf.doublets.len());
                        assert!(buf.doublets.iter().all(|d| {
                            !buf.hits.used[d.a as usize] && !buf.hits.used[d.b as usize]
                        }));
                        let d: Vec<_> = buf
                            .doublets
                            .iter()
                            .map(|d| (d.a, d.b, d.tx, d.ty))
                            .collect();
                        found.push((d, buf.dbl_lanes.gap.clone()));
                    }
                }
                assert!(found[0].0.len() > 50, "{}", found[0].0.len());
                assert!(found.iter().all(|f| *f == found[0]), "reach {reach}");
            }
        }
    }
}
