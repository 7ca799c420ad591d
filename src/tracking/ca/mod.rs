//! Cellular-automaton track finding, one file per step of the algorithm:
//! [`hit_sorting`] (hits by plane into grid bins) -> [`doublets`] (hit pairs on consecutive
//! planes or skipping up to [`MAX_REACH`] - 1, inside windows from the geometry and the minimum momentum) ->
//! [`triplets`] (two doublets sharing a hit with a multiple-scattering-compatible kink and a
//! curvature within the momentum cut) -> [`neighbours`] (triplets sharing two hits with
//! compatible curvature) -> [`evolution`] (CA levels) -> [`candidates`] (longest, best
//! chains first, each hit once, Kalman fitted) -> [`clones`] (ghost and clone suppression) ->
//! [`exchange`] (tracks that cross exchange segments where the pair fits better).
//!
//! The steps from the doublets on run in two passes: the first on doublets of consecutive
//! planes only, for tracks of at least `first_pass_min_hits` hits (no gap inside); the
//! second, with the doublets skipping up to `max_gap_planes` planes (one or two in a row),
//! on the hits the first pass left (tracks with inefficient planes, short tracks). Most hits are taken by the first pass, whose
//! doublets are a fraction of the combinations the skipping ones make. The first pass
//! keeps only chains that reach the last plane or may leave the detector before it
//! (`first_pass_to_last_plane`, [`FinderGeometry::may_leave`]): a track that stops early
//! because the next plane missed its hit is the second pass's. In a busy event
//! (`stiff_pass_min_hits`) the first pass runs twice: first with the cuts of the tracks
//! above `stiff_pass_p_factor` times the minimum momentum
//! ([`cuts::FinderConfig::stiff_pass`]: bending, scattering and slope windows that much
//! narrower), then with the configuration's on the hits the stiff tracks left, as the
//! iterations of CBM's cellular automaton search fast tracks before slow ones: most tracks
//! are stiff, and the wide windows of the soft ones then search a fraction of the hits.
//! The second pass does the same in a busy event: the stiff tracks with a gap first (those
//! of at least [`cuts::FinderConfig::stiff_gap_pass_min_hits`] hits), then the others.
//!
//! The first pass follows its tracks upstream from the planes they can end on, where the
//! hits are least dense (`follow_seeds`): doublets are searched in the wide pointing
//! windows between those planes only, and further upstream a middle hit's incoming
//! doublets are made from the hits inside a narrow box on the plane before it, the hits
//! whose doublet could continue into one of its outgoing doublets
//! ([`triplets::find_triplets_seeded`]). It gives the tracks of the full search, without
//! the doublets and triplets no chain to a seed plane reaches: upstream of the seed planes
//! (in a field map) a triplet is kept only as the left neighbour (neighbour cut) of a
//! triplet found on the plane after it. A later pass's doublet step searches a copy of the
//! hits not used yet.
//!
//! The window searches (doublets, continuations) and the continuation test compare eight
//! hits or doublets per vector instruction (AVX2, chosen at run time: [`Kernel`]); the
//! portable kernel gives the same results.
//!
//! The steps share the buffers in [`CaBuffers`], sized once from [`cuts::Limits`];
//! every push is bounded and an overflow is counted in [`Overflow`] instead of growing. A
//! pass whose doublets, triplets or neighbours fill their buffer chooses nothing from the
//! truncated lists: it runs again with every momentum-dependent window derived at twice
//! the momentum (then four times, ..: [`cuts::FinderConfig::overflow_p_steps`]), which
//! narrows the bending and scattering windows and so the combinations, and then once more
//! at its own momentum on the hits the stiffer tracks left, as CBM's iterations go from
//! fast to slow tracks ([`crate::tracking::reco::Reconstructor`]).

pub mod bending;
pub mod candidates;
pub mod clones;
pub mod cuts;
pub mod doublets;
pub mod evolution;
pub mod exchange;
pub mod first_hits;
pub mod hit_sorting;
pub mod neighbours;
pub mod summary;
pub mod triplets;

use crate::tracking::geometry::{Detector, Field};
use crate::tracking::kalman::FitHit;
pub use cuts::{max_curvature_per_mm, slope_factor};

/// The largest plane distance of a doublet: consecutive planes (1), or skipping one (2) or
/// two planes in a row (3).
pub const MAX_REACH: usize = 3;
use cuts::{FinderConfig, Limits};

/// Which code the finder's vector steps run: compiled for the target's baseline, or for
/// AVX2 (chosen at run time). Both find the same doublets and triplets: the AVX2 code uses
/// the same operations in the same order (no fused multiply-adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Portable,
    Avx2,
}

impl Kernel {
    /// The best kernel this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return Kernel::Avx2;
        }
        Kernel::Portable
    }
}

/// Hits sorted by plane and grid bin, structure of arrays.
#[derive(Debug, Default)]
pub struct SortedHits {
    pub x_mm: Vec<f32>,
    pub y_mm: Vec<f32>,
    pub plane: Vec<u16>,
    /// Index of the hit in the event's input slice.
    pub input_index: Vec<u32>,
    /// `bin_start[b]..bin_start[b + 1]` are the hits of global bin `b` (planes one after
    /// the other, rows of y bins, x fastest); one more entry than bins.
    pub bin_start: Vec<u32>,
    /// Used by an accepted track.
    pub used: Vec<bool>,
}

impl SortedHits {
    /// Room for `n_hits` hits in `n_bins` bins.
    fn reserve(&mut self, n_hits: usize, n_bins: usize) {
        self.x_mm.reserve(n_hits);
        self.y_mm.reserve(n_hits);
        self.plane.reserve(n_hits);
        self.input_index.reserve(n_hits);
        self.used.reserve(n_hits);
        self.bin_start.reserve(n_bins + 1);
    }

    /// The hits `first..end` of plane `g`.
    #[inline]
    pub fn plane_range(&self, g: &PlaneGeometry) -> (usize, usize) {
        (
            self.bin_start[g.bin_offset] as usize,
            self.bin_start[g.bin_offset + g.bins_x * g.bins_y] as usize,
        )
    }
}

/// Two hits on planes `i < j` (`j = i + 1`, or up to `i + MAX_REACH` when planes are
/// skipped).
#[derive(Debug, Clone, Copy, Default)]
pub struct Doublet {
    /// Sorted-hit indices, upstream first.
    pub a: u32,
    pub b: u32,
    pub tx: f32,
    pub ty: f32,
}

/// Doublet `d`'s slopes `tx[d]`, `ty[d]` (as in `CaBuffers::doublets[d]`) and the planes it
/// skips `gap[d]` (0 to `MAX_REACH - 1`, as `f32`), structure of arrays.
#[derive(Debug, Default)]
pub struct DoubletLanes {
    pub tx: Vec<f32>,
    pub ty: Vec<f32>,
    pub gap: Vec<f32>,
}

/// Appends doublet `d` skipping `gap` planes to `doublets` and `lanes` and returns its
/// index; `None`, counted in `overflow.doublets`, once `max` are stored.
#[inline(always)]
pub(crate) fn push_doublet(
    doublets: &mut Vec<Doublet>,
    lanes: &mut DoubletLanes,
    overflow: &mut Overflow,
    max: usize,
    d: Doublet,
    gap: f32,
) -> Option<usize> {
    if doublets.len() >= max {
        overflow.doublets += 1;
        return None;
    }
    doublets.push(d);
    lanes.tx.push(d.tx);
    lanes.ty.push(d.ty);
    lanes.gap.push(gap);
    Some(doublets.len() - 1)
}

/// Three hits from two doublets sharing the middle hit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Triplet {
    /// Doublet indices (a, b) and (b, c).
    pub left: u32,
    pub right: u32,
    /// Curvature estimate, e/(GeV/c) (0 without field).
    pub qop: f32,
    /// Its standard deviation (multiple scattering and resolution).
    pub qop_sigma: f32,
    /// Kink chi-square (the part of the slope change not explained by the field).
    pub chi2: f32,
}

/// Counts of things dropped because a buffer was full, per event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overflow {
    pub hits: u32,
    pub doublets: u32,
    pub triplets: u32,
    pub neighbours: u32,
    pub candidates: u32,
    pub tracks: u32,
    /// Hits with an unknown plane or non-finite coordinates (not an overflow: refused).
    pub bad_hits: u32,
    /// Passes run again at a higher momentum because they filled a buffer
    /// ([`cuts::FinderConfig::overflow_p_steps`]); each comes with the count of what it
    /// dropped in the step it filled.
    pub raised: u32,
}

impl Overflow {
    /// The steps whose buffers can fill, in the finder's order (the `step` label of
    /// `trigd_tracking_finder_limit_total`).
    pub const STEPS: [&'static str; 6] = [
        "hits",
        "doublets",
        "triplets",
        "neighbours",
        "candidates",
        "tracks",
    ];

    /// What each of [`Self::STEPS`] dropped.
    pub fn counts(&self) -> [u32; 6] {
        [
            self.hits,
            self.doublets,
            self.triplets,
            self.neighbours,
            self.candidates,
            self.tracks,
        ]
    }

    pub fn any(&self) -> bool {
        self.counts().iter().any(|&n| n > 0)
    }
}

/// A track candidate: a range of `CaBuffers::candidate_hits` (sorted-hit indices, upstream
/// first) and its ranking.
#[derive(Debug, Clone, Copy, Default)]
pub struct Candidate {
    pub start: u32,
    pub len: u16,
    pub chi2: f32,
    pub ndf: u16,
    /// Index of the fit in `CaBuffers::fits`.
    pub fit: u32,
}

/// Per-plane constants of the finder, derived once from the detector and the config.
#[derive(Debug, Clone)]
pub struct PlaneGeometry {
    pub z_mm: f64,
    pub half_x_mm: f64,
    pub half_y_mm: f64,
    pub var_x: f64,
    pub var_y: f64,
    pub bins_x: usize,
    pub bins_y: usize,
    /// Bins per mm in x and y.
    pub bin_scale_x: f64,
    pub bin_scale_y: f64,
    /// `half_x_mm`, `half_y_mm` and the bin scales in `f32`, for [`FinderGeometry::bin_xy`].
    pub half_f32: [f32; 2],
    pub bin_scale_f32: [f32; 2],
    /// First global bin of this plane.
    pub bin_offset: usize,
    /// Scattering angle variance crossing this plane at the minimum momentum.
    pub theta2_min_p: f64,
    /// Scattering angle variance per (q/p)^2 (for momentum-dependent cuts).
    pub theta2_per_qop2: f64,
    /// RMS displacement at the origin plane of a segment leaving this plane, from scattering
    /// in this and all upstream planes, at the minimum momentum, mm.
    pub ms_origin_mm: f64,
    /// For a doublet ending on this plane: the distance to the next plane, and that plane's
    /// half sizes less the largest deviation of a track from the doublet's straight
    /// extrapolation (curvature at the momentum cut, scattering on this plane and the hit
    /// resolution, at `n_sigma`). See [`FinderGeometry::may_leave`]. Zero on the last plane.
    pub exit: [f32; 3],
}

impl PlaneGeometry {
    /// Bin column (`axis` 0) or row (1) of the coordinate `v`, clamped to the grid
    /// (positions off the plane, infinite ones too, fall in the edge cells; not a number in
    /// the first). The arithmetic is `f32` and monotonic in the position, and the same for
    /// the hits (hit sorting) as for the windows, so a window's cells hold every hit inside
    /// it.
    #[inline(always)]
    pub fn bin_1d(&self, axis: usize, v: f32) -> u16 {
        let n = if axis == 0 { self.bins_x } else { self.bins_y };
        let f = (v + self.half_f32[axis]) * self.bin_scale_f32[axis];
        // Clamped first (`max` takes NaN to 0), then truncated: the floor of a value in
        // `[0, n - 1]`, which lane loops compute eight at a time.
        let top = (n.clamp(1, 1 << 16) - 1) as f32;
        let f = f.max(0.0).min(top);
        // SAFETY: `f` is finite and in `[0, top]`, `top <= u16::MAX`.
        unsafe { f.to_int_unchecked::<u16>() }
    }
}

/// Constants of a doublet's planes `(i, j)`, `i < j`, for the triplet step.
#[derive(Debug, Clone, Copy, Default)]
pub struct PairGeometry {
    /// `1 / (z_j - z_i)`.
    pub inv_dz: f64,
    /// The origin lies upstream of plane `i` and is finite: the pointing parabola is used.
    pub pointing: bool,
    /// `1 / (z_i - z_origin)` and `2 / (z_j - z_origin)`.
    pub inv_zi: f64,
    pub two_inv_zj: f64,
    /// Curvature error of the pointing parabola per mm of origin displacement,
    /// `2 / ((z_i - z_origin) (z_j - z_origin))`.
    pub kappa_per_mm: f64,
    /// Its variance from scattering in planes up to `i` at the minimum momentum (times the
    /// squared slope factor and (q/p)^2 relative to the minimum momentum's).
    pub kappa_var_ms: f64,
    /// Its variance from the resolution of the two hits.
    pub kappa_var_res: f64,
}

/// Constants of a triplet's planes `(i, j, k)` for the triplet step.
#[derive(Debug, Clone, Copy, Default)]
pub struct TripleGeometry {
    /// `(z_k - z_i) / 2`: the change of chord slope per unit curvature.
    pub half: f64,
    /// Scattering angle variance per (q/p)^2 at `j` and at planes skipped between `i` and
    /// `k` (normal incidence).
    pub theta2_per_qop2: f64,
    /// Variance of the change of chord slope from the resolution of the three hits.
    pub var_res: f64,
}

/// The constants of a doublet's planes `(i, j)` the triplet step needs, in `f32`, for its
/// lane-parallel arithmetic: one record per doublet lane.
#[derive(Debug, Clone, Copy, Default)]
pub struct PairLanes {
    /// 1 when the pointing parabola is used (see [`PairGeometry::pointing`]), else 0.
    pub pointing: f32,
    pub inv_zi: f32,
    pub two_inv_zj: f32,
    /// Hard curvature errors in x and y: the origin's half size through the pointing
    /// parabola, or without pointing the curvature bounds.
    pub hard_kx: f32,
    pub hard_ky: f32,
    /// A long origin (`origin_half_z_mm`, `hz`): the hard error grows by `hard_slope`
    /// times the chord slope from the origin's centre to the first hit and by
    /// `kappa_rel` times the pointing curvature itself (the parabola's levers are
    /// `hz` shorter or longer); 0 for a thin target.
    pub hard_slope: f32,
    pub kappa_rel: f32,
    /// Curvature variance from scattering per (q/p)^2 (without the slope factor) and from
    /// the resolution (0 without pointing).
    pub kvar_ms_per_qop2: f32,
    pub kvar_res: f32,
    /// Plane triples `(i, j, j + 1 + s)` inside the detector (0 to `MAX_REACH`).
    pub n_triples: u8,
    /// Per `s`: [`TripleGeometry::half`], `theta2_per_qop2`, `var_res`.
    pub half: [f32; MAX_REACH],
    pub theta2_per_qop2: [f32; MAX_REACH],
    pub var_res: [f32; MAX_REACH],
}

/// The geometry tables of the finder.
#[derive(Debug, Clone)]
pub struct FinderGeometry {
    pub planes: Vec<PlaneGeometry>,
    /// Doublet planes `(i, j)` at `i * n_planes + j`.
    pub pairs: Vec<PairGeometry>,
    /// Triplet planes `(i, j, j + 1 + s)`, `s` in `0..MAX_REACH`, at
    /// `(i * n_planes + j) * MAX_REACH + s`.
    pub triples: Vec<TripleGeometry>,
    /// [`PairLanes`] of planes `(i, j)` at `i * n_planes + j`.
    pub pair_lanes: Vec<PairLanes>,
    pub n_bins: usize,
    pub field: crate::tracking::geometry::Field,
    /// The tent-weighted mean fields of the plane pairs and triples ([`bending`]); shared
    /// with the geometries of [`FinderGeometry::sharing_field_tables`].
    pub bending: std::sync::Arc<bending::Bending>,
    /// Per doublet planes `(i, j)` at `i * n_planes + j`: the largest |B| components of
    /// the pointing tent `(origin, i, j)` over the acceptance, tesla (the field in a
    /// uniform field).
    pub pointing_b_max_tesla: Vec<[f64; 3]>,
    /// The largest |B| components on the lines through the acceptance from the origin to
    /// the last plane, tesla (the field in a uniform field).
    pub b_max_tesla: [f64; 3],
}

/// The field's tables of a finder: the tents' mean fields, the largest field of each
/// pointing tent, the largest on the lines through the acceptance.
type FieldTables = (std::sync::Arc<bending::Bending>, Vec<[f64; 3]>, [f64; 3]);

/// How many field tables [`FinderGeometry`] keeps for the next finder built.
pub const FIELD_TABLES_KEPT: usize = 4;

/// The field tables kept, newest last.
static FIELD_TABLES: std::sync::Mutex<Vec<(FieldTablesKey, FieldTables)>> =
    std::sync::Mutex::new(Vec::new());

/// What a field map's tables are a function of: the map's nodes (held, so that no other
/// map can take their place in memory while they are kept) and [`FieldTablesOf`].
struct FieldTablesKey {
    nodes: std::sync::Arc<[[f32; 3]]>,
    of: FieldTablesOf,
}

/// The rest of a [`FieldTablesKey`]: the map's grid, the planes' z, the origin and the
/// slope limits.
#[derive(PartialEq)]
struct FieldTablesOf {
    grid: ([usize; 3], [f64; 3], [f64; 3]),
    zs: Vec<f64>,
    origin: [f64; 3],
    t_max: [f64; 2],
}

impl FieldTablesKey {
    fn same(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.nodes, &other.nodes) && self.of == other.of
    }
}

impl FinderGeometry {
    pub fn new(det: &Detector, cfg: &FinderConfig) -> Self {
        Self::build(det, cfg, None)
    }

    /// The tables of `cfg`, with the field's tables (the tents' mean fields and the field
    /// bounds over the acceptance) of `of` instead of their own: for a configuration whose
    /// slope limits lie within `of`'s (a higher minimum momentum), whose field tables
    /// cover its slopes and bound the field over an acceptance at least as wide. Cheap to
    /// build (the field tables are the costly part of [`Self::new`] in a field map).
    pub fn sharing_field_tables(det: &Detector, cfg: &FinderConfig, of: &FinderGeometry) -> Self {
        Self::build(det, cfg, Some(of))
    }

    /// This geometry with the grid of `of` (a geometry of the same planes): the passes of
    /// one event search hits sorted once, into the configuration's grid, so a pass's
    /// geometry for another momentum (narrower windows) must keep that grid.
    pub fn with_grid_of(mut self, of: &FinderGeometry) -> Self {
        assert_eq!(
            self.planes.len(),
            of.planes.len(),
            "a geometry of other planes"
        );
        for (g, o) in self.planes.iter_mut().zip(&of.planes) {
            g.bins_x = o.bins_x;
            g.bins_y = o.bins_y;
            g.bin_scale_x = o.bin_scale_x;
            g.bin_scale_y = o.bin_scale_y;
            g.bin_scale_f32 = o.bin_scale_f32;
            g.bin_offset = o.bin_offset;
        }
        self.n_bins = of.n_bins;
        self
    }

    fn build(det: &Detector, cfg: &FinderConfig, field_tables: Option<&FinderGeometry>) -> Self {
        let mut planes = Vec::with_capacity(det.planes.len());
        let mut offset = 0;
        let mut ms_sum = 0.0;
        let qop = 1.0 / cfg.min_p_gev.max(1e-3);
        let m2 = cfg.fit.mass_gev * cfg.fit.mass_gev;
        for p in &det.planes {
            let bins_x = cfg.bins_x.clamp(1, 1024);
            let bins_y = cfg.bins_y.clamp(1, 1024);
            let x0 = p.x0_fraction.max(0.0);
            let per_qop2 = if x0 > 0.0 {
                let f = 0.0136 * (1.0 + 0.038 * x0.ln());
                f * f * x0
            } else {
                0.0
            };
            let theta2 = per_qop2 * qop * qop * (1.0 + m2 * qop * qop);
            let lever = (p.z_mm - cfg.origin_z_mm).max(0.0);
            ms_sum += theta2 * lever * lever;
            planes.push(PlaneGeometry {
                z_mm: p.z_mm,
                half_x_mm: p.half_x_mm,
                half_y_mm: p.half_y_mm,
                var_x: p.sigma_x_mm * p.sigma_x_mm,
                var_y: p.sigma_y_mm * p.sigma_y_mm,
                bins_x,
                bins_y,
                bin_scale_x: bins_x as f64 / (2.0 * p.half_x_mm),
                bin_scale_y: bins_y as f64 / (2.0 * p.half_y_mm),
                half_f32: [p.half_x_mm as f32, p.half_y_mm as f32],
                bin_scale_f32: [
                    (bins_x as f64 / (2.0 * p.half_x_mm)) as f32,
                    (bins_y as f64 / (2.0 * p.half_y_mm)) as f32,
                ],
                bin_offset: offset,
                theta2_min_p: theta2,
                theta2_per_qop2: per_qop2,
                ms_origin_mm: ms_sum.sqrt(),
                exit: [0.0; 3],
            });
            offset += bins_x * bins_y;
        }
        for p in 1..planes.len().saturating_sub(1) {
            let (ga, gb, gc) = (&planes[p - 1], &planes[p], &planes[p + 1]);
            let (dz0, dz1) = (gb.z_mm - ga.z_mm, gc.z_mm - gb.z_mm);
            let ms = cfg.n_sigma * gb.theta2_min_p.sqrt() * cfg.slope_factor * dz1;
            let margin = |curvature: f64, var_a: f64, var_b: f64, var_c: f64| {
                // The chord's slope differs from the tangent's at b by up to half the
                // curvature times dz0; the extrapolation bends by up to dz1^2 / 2 more.
                let bend = curvature.abs() * dz1 * (dz0 + dz1) / 2.0;
                let res =
                    cfg.n_sigma * (((var_a + var_b) / (dz0 * dz0)).sqrt() * dz1 + var_c.sqrt());
                (bend + ms + res) * (1.0 + 1e-3) + 1e-3
            };
            let mx = margin(cfg.max_curvature_x_per_mm, ga.var_x, gb.var_x, gc.var_x);
            let my = margin(cfg.max_curvature_y_per_mm, ga.var_y, gb.var_y, gc.var_y);
            planes[p].exit = [
                dz1 as f32,
                (gc.half_x_mm - mx) as f32,
                (gc.half_y_mm - my) as f32,
            ];
        }
        let (bending, pointing_b_max_tesla, b_max_tesla) = match field_tables {
            Some(g) => (
                g.bending.clone(),
                g.pointing_b_max_tesla.clone(),
                g.b_max_tesla,
            ),
            None => Self::field_tables(det, cfg),
        };
        let n = planes.len();
        let mut pairs = vec![PairGeometry::default(); n * n];
        let mut triples = vec![TripleGeometry::default(); n * n * MAX_REACH];
        let var_hit = |g: &PlaneGeometry| g.var_x.max(g.var_y);
        let origin_finite = cfg.origin_half_x_mm.is_finite() && cfg.origin_half_y_mm.is_finite();
        let hz = cfg.origin_half_z_mm.max(0.0);
        for i in 0..n {
            for j in (i + 1)..n {
                let (gi, gj) = (&planes[i], &planes[j]);
                let dz = gj.z_mm - gi.z_mm;
                if dz <= 0.0 {
                    continue;
                }
                let (zi, zj) = (gi.z_mm - cfg.origin_z_mm, gj.z_mm - cfg.origin_z_mm);
                let pointing = origin_finite && zi - hz > 1.0;
                let pg = &mut pairs[i * n + j];
                pg.inv_dz = 1.0 / dz;
                pg.pointing = pointing;
                if pointing {
                    let f = 2.0 / (zi * zj);
                    let r = 1.0 / dz + 1.0 / zi;
                    pg.inv_zi = 1.0 / zi;
                    pg.two_inv_zj = 2.0 / zj;
                    pg.kappa_per_mm = f;
                    pg.kappa_var_ms = f * f * gi.ms_origin_mm * gi.ms_origin_mm;
                    pg.kappa_var_res =
                        4.0 / (zj * zj) * (var_hit(gi) * r * r + var_hit(gj) / (dz * dz));
                }
                for s in 0..MAX_REACH {
                    let k = j + 1 + s;
                    if k >= n {
                        break;
                    }
                    let gk = &planes[k];
                    let dz2 = gk.z_mm - gj.z_mm;
                    if dz2 <= 0.0 {
                        continue;
                    }
                    let w = 1.0 / dz + 1.0 / dz2;
                    let half = 0.5 * (gk.z_mm - gi.z_mm);
                    let theta2_per_qop2: f64 =
                        ((i + 1)..k).map(|p| planes[p].theta2_per_qop2).sum();
                    let var_res =
                        var_hit(gi) / (dz * dz) + var_hit(gj) * w * w + var_hit(gk) / (dz2 * dz2);
                    triples[(i * n + j) * MAX_REACH + s] = TripleGeometry {
                        half,
                        theta2_per_qop2,
                        var_res,
                    };
                }
            }
        }
        // `ms_origin_mm` (hence `kappa_var_ms`) is tabulated at the minimum momentum.
        let q_table = 1.0 / cfg.min_p_gev.max(1e-3);
        let mut pair_lanes = vec![PairLanes::default(); n * n];
        for i in 0..n {
            for j in (i + 1)..n {
                let pg = &pairs[i * n + j];
                let mut pl = if pg.pointing {
                    // A parabola through (z_v, x_v) anywhere in the origin region against
                    // the one through the centre: the curvature differs by at most
                    // `2 (half + hz |x_a - x_c| / z_i) / ((z_i - hz) (z_j - hz))` from the
                    // chord to the first hit, and `hz / (z_j - hz)` of itself from the
                    // lever to the second.
                    let (zi, zj) = (1.0 / pg.inv_zi, 2.0 / pg.two_inv_zj);
                    let g = (zi * zj) / ((zi - hz) * (zj - hz));
                    PairLanes {
                        pointing: 1.0,
                        inv_zi: pg.inv_zi as f32,
                        two_inv_zj: pg.two_inv_zj as f32,
                        hard_kx: (pg.kappa_per_mm * g * cfg.origin_half_x_mm) as f32,
                        hard_ky: (pg.kappa_per_mm * g * cfg.origin_half_y_mm) as f32,
                        hard_slope: (pg.kappa_per_mm * g * hz) as f32,
                        kappa_rel: (hz / (zj - hz)) as f32,
                        kvar_ms_per_qop2: (pg.kappa_var_ms / (q_table * q_table)) as f32,
                        kvar_res: pg.kappa_var_res as f32,
                        ..Default::default()
                    }
                } else {
                    PairLanes {
                        hard_kx: cfg.max_curvature_x_per_mm as f32,
                        hard_ky: cfg.max_curvature_y_per_mm as f32,
                        ..Default::default()
                    }
                };
                for s in 0..MAX_REACH {
                    let tg = &triples[(i * n + j) * MAX_REACH + s];
                    if j + 1 + s >= n || tg.half <= 0.0 {
                        break;
                    }
                    pl.n_triples += 1;
                    pl.half[s] = tg.half as f32;
                    pl.theta2_per_qop2[s] = tg.theta2_per_qop2 as f32;
                    pl.var_res[s] = tg.var_res as f32;
                }
                pair_lanes[i * n + j] = pl;
            }
        }
        let mut geo = FinderGeometry {
            planes,
            pairs,
            triples,
            pair_lanes,
            n_bins: offset,
            field: det.field.clone(),
            bending,
            pointing_b_max_tesla,
            b_max_tesla,
        };
        match field_tables {
            // A pass's geometry sharing the configuration's tables searches its grid.
            Some(of) => geo.with_grid_of(of),
            None => {
                geo.fit_rows_to_windows(cfg);
                geo
            }
        }
    }

    /// Grid rows no finer than the windows that search them: a window scans every row it
    /// overlaps, so rows much lower than the narrowest window into a plane cost a row's
    /// overhead each for the same hits (a test-beam telescope's pointing windows, its
    /// origin box seen over a lever as long as the gap, are ten of the default rows
    /// high). Plane `j` gets rows about as high as the narrowest doublet window into it
    /// (from a hit on the axis of any plane upstream within [`MAX_REACH`], at the centre
    /// of the origin), at most `cfg.bins_y` of them; plane 0 keeps `cfg.bins_y`. The
    /// grid decides only which hits a window compares, never which it keeps: doublets,
    /// and so tracks, are the same on any grid.
    fn fit_rows_to_windows(&mut self, cfg: &FinderConfig) {
        let n = self.planes.len();
        let mut lowest = vec![f64::INFINITY; n];
        for i in 0..n {
            let pw = doublets::PlaneWindows::new(self, cfg, i, MAX_REACH);
            let centre = [cfg.origin_x_mm as f32; doublets::LANES];
            let centre_y = [cfg.origin_y_mm as f32; doublets::LANES];
            let boxes = pw.boxes(&centre, &centre_y);
            let mut k = 0;
            while let Some((j, _)) = pw.target(k) {
                let h = f64::from(boxes[k][3][0] - boxes[k][2][0]);
                if h.is_finite() && h > 0.0 && boxes[k][0][0] <= boxes[k][1][0] {
                    lowest[j] = lowest[j].min(h);
                }
                k += 1;
            }
        }
        let max_rows = cfg.bins_y.clamp(1, 1024);
        let rows: Vec<usize> = self
            .planes
            .iter()
            .zip(&lowest)
            .map(|(g, &h)| {
                if h.is_finite() {
                    ((2.0 * g.half_y_mm / h).ceil() as usize).clamp(1, max_rows)
                } else {
                    max_rows
                }
            })
            .collect();
        self.set_rows(&rows);
    }

    /// Gives plane `j` `rows[j]` grid rows, the cells laid out again plane after plane.
    pub(crate) fn set_rows(&mut self, rows: &[usize]) {
        let mut offset = 0;
        for (g, &r) in self.planes.iter_mut().zip(rows) {
            g.bins_y = r;
            g.bin_scale_y = r as f64 / (2.0 * g.half_y_mm);
            g.bin_scale_f32[1] = g.bin_scale_y as f32;
            g.bin_offset = offset;
            offset += g.bins_x * g.bins_y;
        }
        self.n_bins = offset;
    }

    /// The tents' mean fields, the largest field of each pointing tent and the largest on
    /// the lines through the acceptance ([`Self::bending`], [`Self::pointing_b_max_tesla`],
    /// [`Self::b_max_tesla`]).
    ///
    /// In a field map they take most of the time of building the finder (a tenth of a
    /// second and more), and one process builds the finder of one detector several times
    /// (the origin and spectrum measured from the first events, each worker's finder), so
    /// the last [`FIELD_TABLES_KEPT`] are kept, with what they are a function of: the map
    /// (the same nodes), the planes' z, the origin and the slope limits.
    fn field_tables(det: &Detector, cfg: &FinderConfig) -> FieldTables {
        let Field::Grid(map) = &det.field else {
            return Self::field_tables_of(det, cfg);
        };
        let key = FieldTablesKey {
            nodes: map.nodes_tesla.clone(),
            of: FieldTablesOf {
                grid: (map.dims, map.origin_mm, map.step_mm),
                zs: det.planes.iter().map(|p| p.z_mm).collect(),
                origin: cfg.origin_mm(),
                t_max: [cfg.max_tx, cfg.max_ty],
            },
        };
        // The tables are built under the lock: workers building the same finder at once
        // wait for the first instead of each building it.
        let mut kept = FIELD_TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = kept.iter().find(|(k, _)| k.same(&key)) {
            return t.clone();
        }
        let t = Self::field_tables_of(det, cfg);
        if kept.len() >= FIELD_TABLES_KEPT {
            kept.remove(0);
        }
        kept.push((key, t.clone()));
        t
    }

    fn field_tables_of(det: &Detector, cfg: &FinderConfig) -> FieldTables {
        let zs: Vec<f64> = det.planes.iter().map(|p| p.z_mm).collect();
        let t_max = [cfg.max_tx, cfg.max_ty];
        let bending = bending::Bending::new(&det.field, cfg.origin_mm(), &zs, t_max);
        let n = zs.len();
        let mut pointing_b_max_tesla = vec![[0.0f64; 3]; n * n];
        for i in 0..n {
            for j in (i + 1)..n {
                pointing_b_max_tesla[i * n + j] = match (&det.field, bending.pointing(i, j)) {
                    (Field::Uniform { b_tesla }, _) => b_tesla.map(f64::abs),
                    (_, Some(t)) => t.bound,
                    // No pointing tent (the origin is not upstream): the field anywhere.
                    (_, None) => {
                        bending::max_field_tesla(&det.field, cfg.origin_mm(), zs[j], t_max)
                    }
                };
            }
        }
        let b_max_tesla = match &det.field {
            Field::Uniform { b_tesla } => b_tesla.map(f64::abs),
            f => bending::max_field_tesla(
                f,
                cfg.origin_mm(),
                zs.last().copied().unwrap_or(0.0),
                t_max,
            ),
        };
        (
            std::sync::Arc::new(bending),
            pointing_b_max_tesla,
            b_max_tesla,
        )
    }

    /// The largest hit resolution of any plane, x or y, mm.
    pub fn sigma_max_mm(&self) -> f64 {
        self.planes
            .iter()
            .map(|p| p.var_x.max(p.var_y))
            .fold(0.0, f64::max)
            .sqrt()
    }

    /// Whether a track whose last doublet ends at `(x, y)` on plane `p` with slopes
    /// `(tx, ty)` may leave the detector before the next plane: its extrapolation, widened
    /// by [`PlaneGeometry::exit`]'s margin, reaches outside that plane. Always on the last
    /// plane.
    #[inline]
    pub fn may_leave(&self, p: usize, x: f32, y: f32, tx: f32, ty: f32) -> bool {
        if p + 1 >= self.planes.len() {
            return true;
        }
        let [dz, hx, hy] = self.planes[p].exit;
        // Negated so that a NaN counts as leaving.
        !((x + dz * tx).abs() <= hx && (y + dz * ty).abs() <= hy)
    }

    /// Global bin of `(x, y)` on plane `p` (clamped to the plane's grid).
    #[inline]
    pub fn bin(&self, p: usize, x: f32, y: f32) -> usize {
        let g = &self.planes[p];
        let (bx, by) = self.bin_xy(p, x, y);
        g.bin_offset + by * g.bins_x + bx
    }

    /// Bin column and row of `(x, y)` on plane `p` ([`PlaneGeometry::bin_1d`]).
    #[inline(always)]
    pub fn bin_xy(&self, p: usize, x: f32, y: f32) -> (usize, usize) {
        let g = &self.planes[p];
        (g.bin_1d(0, x) as usize, g.bin_1d(1, y) as usize)
    }
}

/// All per-event working memory of the finder, reserved once.
#[derive(Debug, Default)]
pub struct CaBuffers {
    pub hits: SortedHits,
    /// The hits not used yet, for a later pass's doublet step (`input_index`: the index in
    /// `hits`).
    pub free_hits: SortedHits,
    pub doublets: Vec<Doublet>,
    /// The doublets' slopes and gaps as lanes, for the triplet step's vector search.
    pub dbl_lanes: DoubletLanes,
    /// Per sorted hit: its outgoing doublets `dbl_start[h]..dbl_start[h + 1]`.
    pub dbl_start: Vec<u32>,
    pub triplets: Vec<Triplet>,
    /// The seeded triplet step's marks per hit (the last middle hit it was tried with)
    /// and the left doublets of a plane.
    pub hit_marks: Vec<u32>,
    pub left_ids: Vec<u32>,
    /// Per doublet: whether it continues into a triplet further downstream (the seeded
    /// triplet step's possible track ends; [`triplets::prune_dead_ends`]), and per
    /// triplet: whether it is kept.
    pub doublet_marks: Vec<bool>,
    pub triplet_marks: Vec<bool>,
    /// The seeded triplet step's right doublets by middle hit.
    pub seed_rights: triplets::Rights,
    /// The seeded triplet step's pairs of left doublets from back boxes and right
    /// doublets.
    pub seed_pairs: Option<Box<triplets::Pairs>>,
    /// The seeded step's new left doublets of one middle hit.
    pub middle_lefts: Vec<triplets::MiddleLeft>,
    /// The seeded triplet step's doublet windows of the hits of a plane, `[x0, x1, y0, y1]`
    /// by quantity.
    pub hit_boxes: [Vec<f32>; 4],
    /// Pairs of doublets inside each other's slope windows, waiting for the triplet step's
    /// kink test (bounded: tested whenever full).
    pub trip_candidates: Vec<triplets::Candidate>,
    /// The triplet step's per-chunk windows (allocated once).
    pub trip_windows: Option<Box<triplets::ChunkWindows>>,
    /// Per triplet: left neighbours `left_start[t]..left_start[t + 1]` in `left`.
    pub left_start: Vec<u32>,
    pub left: Vec<u32>,
    /// Per triplet: whether some triplet has it as left neighbour.
    pub has_right: Vec<bool>,
    /// CA level per triplet.
    pub level: Vec<u16>,
    pub candidates: Vec<Candidate>,
    pub candidate_hits: Vec<u32>,
    pub fits: Vec<crate::tracking::kalman::FitOutput>,
    /// Per fit in `fits` made by the candidates' fit: the fields its seed measured in a
    /// field map, for the tracks' fit of the same hits ([`candidates::refit_accepted`]).
    pub seed_fields: Vec<crate::tracking::kalman::SeedFields>,
    pub fit_hits: Vec<FitHit>,
    /// Accepted candidate indices, in acceptance order.
    pub accepted: Vec<u32>,
    /// What the exchange reads of the candidates' fits of the accepted candidates (with
    /// their index) that the tracks' fit replaced in `fits`, in acceptance order ([`candidates::refit_accepted`]; empty
    /// where the tracks' fit is the candidates'): the exchange of segments compares the
    /// candidates' chi-squares and reads them here instead of fitting the tracks again.
    pub candidate_fits: Vec<(u32, exchange::CandidateFit)>,
    /// Per doublet: triplets whose right doublet it is, `end_start[d]..end_start[d + 1]` in
    /// `ending`.
    pub end_start: Vec<u32>,
    pub ending: Vec<u32>,
    /// Candidate order for extraction, and its sort keys.
    pub order: Vec<u32>,
    pub order_keys: Vec<u64>,
    pub overflow: Overflow,
    pub scratch_u32: Vec<u32>,
    pub scratch_u64: Vec<u64>,
    /// Per accepted track: whether clone suppression marked it ([`clones::mark_clones`]).
    pub clone_marks: Vec<bool>,
    /// Per input hit: its global bin, `u32::MAX` when refused or dropped (hit sorting).
    pub hit_bin: Vec<u32>,
    /// Per sorted hit: whether it was used when the candidate step's second round began
    /// (the round's chains avoid those hits, [`candidates::extract_and_select`]).
    pub used_before: Vec<bool>,
    /// Set while a pass that gives up on a full buffer runs: the triplet and neighbour
    /// steps then stop once their buffer is full (the counts of what they dropped are
    /// then lower bounds), the pass being run again anyway.
    pub stop_when_full: bool,
}

impl CaBuffers {
    /// Buffers with every capacity reserved to its limit.
    pub fn with_limits(limits: &Limits, n_bins: usize) -> Self {
        let mut b = CaBuffers::default();
        let h = limits.max_hits;
        b.hits.reserve(h, n_bins);
        b.free_hits.reserve(h, n_bins);
        b.dbl_start.reserve(h + 1);
        b.doublets.reserve(limits.max_doublets);
        b.dbl_lanes.tx.reserve(limits.max_doublets);
        b.dbl_lanes.ty.reserve(limits.max_doublets);
        b.dbl_lanes.gap.reserve(limits.max_doublets);
        b.hit_marks.reserve(h + 1);
        b.left_ids.reserve(limits.max_doublets);
        b.seed_pairs = Some(triplets::Pairs::new());
        b.doublet_marks.reserve(limits.max_doublets);
        b.triplet_marks.reserve(limits.max_triplets);
        for v in b.hit_boxes.iter_mut() {
            v.reserve(h);
        }
        b.trip_candidates.reserve(triplets::CANDIDATES);
        b.trip_windows = Some(triplets::ChunkWindows::new());
        b.triplets.reserve(limits.max_triplets);
        b.left_start.reserve(limits.max_triplets + 1);
        b.has_right.reserve(limits.max_triplets);
        b.level.reserve(limits.max_triplets);
        b.left.reserve(limits.max_neighbours);
        b.candidates.reserve(limits.max_candidates);
        b.candidate_hits.reserve(limits.max_candidates * 16);
        b.fits.reserve(limits.max_candidates);
        b.accepted.reserve(limits.max_tracks);
        b.end_start.reserve(limits.max_doublets + 1);
        b.ending.reserve(limits.max_triplets);
        b.order.reserve(limits.max_triplets);
        b.order_keys.reserve(limits.max_candidates);
        b.scratch_u32
            .reserve(limits.max_triplets.max(n_bins + 1).max(h + 1));
        b.scratch_u64.reserve(limits.max_tracks);
        b.clone_marks.reserve(limits.max_tracks);
        b.hit_bin.reserve(h);
        b.used_before.reserve(h);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::field::FieldMap;
    use crate::tracking::reco::synthetic;

    /// A detector of six planes in a map of `By` rising along z by `slope` tesla per metre.
    fn in_a_map(slope: f64) -> Detector {
        let mut det = synthetic::detector(6, [0.0; 3], 0.01, 0.01);
        let dims = [3, 3, 41];
        let mut nodes = Vec::new();
        for _ in 0..dims[0] * dims[1] {
            for iz in 0..dims[2] {
                nodes.push([0.0, (0.2 + slope * 0.025 * iz as f64) as f32, 0.01]);
            }
        }
        let map = FieldMap::new(dims, [-2000.0, -2000.0, 0.0], [2000.0, 2000.0, 25.0], nodes);
        det.field = Field::Grid(map.expect("map"));
        det
    }

    /// The field tables kept for a detector are handed to the next finder of the same
    /// map, planes, origin and slope limits, and equal a finder's built afresh; another
    /// map (even of the same values), origin or momentum gets its own.
    #[test]
    fn finders_of_one_map_share_its_kept_field_tables_and_no_other() {
        let det = in_a_map(0.5);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        // Built one after the other (other tests' finders could push the tables out of
        // the few kept only between them).
        let a = FinderGeometry::new(&det, &cfg);
        let b = FinderGeometry::new(&det, &cfg);
        let copy = FinderGeometry::new(&det.clone(), &cfg);
        assert!(std::sync::Arc::ptr_eq(&a.bending, &b.bending));
        // A copy of the detector shares the map's nodes, and with them the tables.
        assert!(std::sync::Arc::ptr_eq(&copy.bending, &a.bending));
        assert_eq!(a.pointing_b_max_tesla, b.pointing_b_max_tesla);
        assert_eq!(a.b_max_tesla, b.b_max_tesla);
        let fresh = FinderGeometry::field_tables_of(&det, &cfg);
        assert_eq!(fresh.1, a.pointing_b_max_tesla);
        assert_eq!(fresh.2, a.b_max_tesla);
        for (x, y) in fresh.0.triple.iter().zip(&a.bending.triple) {
            assert_eq!(
                x.as_ref().map(|t| t.nodes().2.to_vec()),
                y.as_ref().map(|t| t.nodes().2.to_vec())
            );
        }
        let others = [
            FinderGeometry::new(&in_a_map(0.5), &cfg),
            FinderGeometry::new(&in_a_map(-0.5), &cfg),
            FinderGeometry::new(
                &det,
                &FinderConfig {
                    origin_x_mm: 1.0,
                    ..cfg.clone()
                },
            ),
            FinderGeometry::new(&det, &cfg.at_momentum_factor(&det, 3.0)),
        ];
        for g in &others {
            assert!(!std::sync::Arc::ptr_eq(&g.bending, &a.bending));
        }
        // The stiffer finder's slope limits are narrower: other tables.
        assert!(others[3].bending.pointing.iter().flatten().count() > 0);
    }
}
