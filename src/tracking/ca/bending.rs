//! The bending the field gives a track between the planes, as the finder's windows need
//! it, from the field along the trajectories a track from the origin can take (not from
//! one sample of the field or its average).
//!
//! Between two chords of a trajectory, `(a, b)` and `(b, c)` on planes at `z_a < z_b < z_c`,
//! the slope changes by exactly `∫ w(z) κ(z) dz`, where `κ` is the curvature `d²x/dz²` and
//! `w` the *tent* rising linearly from 0 at `z_a` to 1 at `z_b` and falling back to 0 at
//! `z_c` (`∫ w = (z_c - z_a) / 2`). The curvature is `q/p` times the field's bending terms
//! (`K n (t_x t_y B_x - (1 + t_x²) B_y + t_y B_z)` in x), so what a window needs from the
//! field is the tent-weighted mean field along the track, not the field at the middle
//! plane: a field concentrated between the planes, fringe components and a field that
//! changes sign are all in that mean. The same holds with the origin as first point:
//! the pointing of a doublet `(i, j)` back to the origin bends by `z_i` times the tent
//! integral over `(origin, i, j)`.
//!
//! [`TentTable`] holds such a mean, per plane pair or triple, tabulated over the direction
//! of the straight line from the origin (a track above the minimum momentum stays within a
//! few centimetres of the line from the origin through its middle hit), looked up
//! bilinearly; its [`TentTable::bound`] is the largest magnitude over the acceptance, for
//! the windows that must hold every trajectory. [`max_field_tesla`] bounds the field itself
//! along the same lines, from the origin to the last plane.

use super::MAX_REACH;
use crate::tracking::geometry::Field;

/// Nodes per axis of a [`TentTable`]: the directions from the origin are sampled every
/// `2 t_max / (NODES - 3)`, one step beyond the slope limits on each side.
pub const NODES: usize = 17;
/// Integration steps per segment of a tent.
const STEPS: usize = 48;

/// The tent-weighted mean field over three planes along the lines from the origin,
/// tabulated over the lines' slopes.
#[derive(Debug, Clone)]
pub struct TentTable {
    t0: [f32; 2],
    inv_step: [f32; 2],
    /// Mean field (tesla) at node `(ix, iy)`, `ix * NODES + iy`.
    b: Vec<[f32; 3]>,
    /// Largest |component| over the nodes, tesla.
    pub bound: [f64; 3],
}

impl TentTable {
    /// The table of the tent `z_a < z_b < z_c` (mm) along the lines
    /// `(x, y) = origin + (t_x, t_y) (z - z_origin)` with `|t_x| <= t_max[0]`,
    /// `|t_y| <= t_max[1]`.
    pub fn new(field: &Field, origin: [f64; 3], z_mm: [f64; 3], t_max: [f64; 2]) -> Self {
        let step = t_max.map(|t| 2.0 * t.max(1e-3) / (NODES - 3) as f64);
        let t0 = [-t_max[0] - step[0], -t_max[1] - step[1]];
        let mut b = Vec::with_capacity(NODES * NODES);
        let mut bound = [0.0f64; 3];
        for ix in 0..NODES {
            for iy in 0..NODES {
                let t = [t0[0] + step[0] * ix as f64, t0[1] + step[1] * iy as f64];
                let m = tent_mean(field, origin, t, z_mm);
                for c in 0..3 {
                    bound[c] = bound[c].max(m[c].abs());
                }
                b.push(m.map(|v| v as f32));
            }
        }
        TentTable {
            t0: t0.map(|v| v as f32),
            inv_step: step.map(|s| (1.0 / s) as f32),
            b,
            bound,
        }
    }

    /// The mean field along the line of slopes `(tx, ty)` from the origin (bilinear
    /// between the nodes, clamped to the table; a NaN slope gives the first node's).
    #[inline(always)]
    pub fn at(&self, tx: f32, ty: f32) -> [f32; 3] {
        let top = (NODES - 1) as f32 - 1e-3;
        let u = ((tx - self.t0[0]) * self.inv_step[0]).max(0.0).min(top);
        let v = ((ty - self.t0[1]) * self.inv_step[1]).max(0.0).min(top);
        // In [0, NODES - 1): the casts truncate to the lower node.
        let (iu, iv) = (u as usize, v as usize);
        let (fu, fv) = (u - iu as f32, v - iv as f32);
        let n = |i: usize, j: usize| self.b[i * NODES + j];
        let (b00, b01, b10, b11) = (n(iu, iv), n(iu, iv + 1), n(iu + 1, iv), n(iu + 1, iv + 1));
        std::array::from_fn(|c| {
            let lo = b00[c] + fv * (b01[c] - b00[c]);
            let hi = b10[c] + fv * (b11[c] - b10[c]);
            lo + fu * (hi - lo)
        })
    }

    /// The table as [`Self::at`] reads it: first node's slopes, nodes per unit slope and
    /// the mean fields by node (`ix * NODES + iy`), for a device copy of the same lookup.
    pub fn nodes(&self) -> ([f32; 2], [f32; 2], &[[f32; 3]]) {
        (self.t0, self.inv_step, &self.b)
    }

    /// Largest |component| of the difference from `other` over the nodes (same slopes).
    pub fn bound_of_difference(&self, other: &TentTable) -> [f64; 3] {
        let mut d = [0.0f64; 3];
        for (a, b) in self.b.iter().zip(&other.b) {
            for c in 0..3 {
                d[c] = d[c].max((a[c] - b[c]).abs() as f64);
            }
        }
        d
    }
}

/// The tent-weighted mean of the field over `z_mm = [z_a, z_b, z_c]` along the line of
/// slopes `t` from `origin` (mm; trapezoids of at most `1 / STEPS` of a segment).
pub fn tent_mean(field: &Field, origin: [f64; 3], t: [f64; 2], z_mm: [f64; 3]) -> [f64; 3] {
    let [x0, y0, z_origin_mm] = origin;
    if let Field::Uniform { b_tesla } = field {
        return *b_tesla;
    }
    let [za, zb, zc] = z_mm;
    let mut sum = [0.0f64; 3];
    let mut weight = 0.0;
    for (lo, hi, rising) in [(za, zb, true), (zb, zc, false)] {
        let len = hi - lo;
        if len <= 0.0 {
            continue;
        }
        for k in 0..=STEPS {
            let u = k as f64 / STEPS as f64;
            let z = lo + u * len;
            let w_tent = if rising { u } else { 1.0 - u };
            let w_trap = if k == 0 || k == STEPS { 0.5 } else { 1.0 };
            let w = w_tent * w_trap * len / STEPS as f64;
            let lever = z - z_origin_mm;
            let b = field.at([x0 + t[0] * lever, y0 + t[1] * lever, z]);
            for c in 0..3 {
                sum[c] += w * b[c];
            }
            weight += w;
        }
    }
    if weight > 0.0 {
        sum.map(|v| v / weight)
    } else {
        let lever = zb - z_origin_mm;
        field.at([x0 + t[0] * lever, y0 + t[1] * lever, zb])
    }
}

/// Largest |component| of the field (tesla) on the lines from `origin` (mm) with slopes up
/// to `t_max` (one table step beyond), from the origin to `z_last_mm`.
pub fn max_field_tesla(
    field: &Field,
    origin: [f64; 3],
    z_last_mm: f64,
    t_max: [f64; 2],
) -> [f64; 3] {
    let [x0, y0, z_origin_mm] = origin;
    if let Field::Uniform { b_tesla } = field {
        return b_tesla.map(f64::abs);
    }
    let step = t_max.map(|t| 2.0 * t.max(1e-3) / (NODES - 3) as f64);
    let len = (z_last_mm - z_origin_mm).max(0.0);
    let n_z = ((len / 5.0).ceil() as usize).clamp(1, 4096);
    let mut bound = [0.0f64; 3];
    for ix in 0..NODES {
        for iy in 0..NODES {
            let t = [
                -t_max[0] - step[0] + step[0] * ix as f64,
                -t_max[1] - step[1] + step[1] * iy as f64,
            ];
            for k in 0..=n_z {
                let lever = len * k as f64 / n_z as f64;
                let b = field.at([x0 + t[0] * lever, y0 + t[1] * lever, z_origin_mm + lever]);
                for c in 0..3 {
                    bound[c] = bound[c].max(b[c].abs());
                }
            }
        }
    }
    bound
}

/// Mean fields a doublet's windows read at its middle hit, per node of a [`PairTents`]:
/// the pointing tent's three components, then each plane triple's (`s < MAX_REACH`).
pub const PAIR_FIELDS: usize = 3 + 3 * MAX_REACH;

/// The tables of one doublet plane pair `(i, j)` together: at each node, the pointing
/// tent's mean field and those of the plane triples `(i, j, j + 1 + s)` (zero where
/// there is no such tent), so that a lookup finds the cell once for all of them and
/// interpolates them as one row of [`PAIR_FIELDS`] values. Each value is the one its
/// [`TentTable::at`] gives, bit for bit (the same nodes, the same arithmetic).
#[derive(Debug, Clone)]
pub struct PairTents {
    t0: [f32; 2],
    inv_step: [f32; 2],
    /// Node `(ix, iy)` at `ix * NODES + iy`.
    b: Vec<PairRow>,
}

/// A node's [`PAIR_FIELDS`] values, padded with zeros to two vectors of eight, aligned.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct PairRow([f32; PAIR_ROW]);

/// Length of a [`PairRow`].
pub const PAIR_ROW: usize = 16;
const _: () = assert!(PAIR_FIELDS <= PAIR_ROW);

impl PairTents {
    /// The tables of a plane pair, all over the same slopes (`None` for no table: zero).
    fn new(pointing: Option<&TentTable>, triples: [Option<&TentTable>; MAX_REACH]) -> Option<Self> {
        let any = pointing.or(triples.iter().flatten().next().copied())?;
        let mut b = vec![PairRow([0.0f32; PAIR_ROW]); NODES * NODES];
        let tables = std::iter::once(pointing).chain(triples);
        for (k, t) in tables.enumerate() {
            let Some(t) = t else { continue };
            assert!(t.t0 == any.t0 && t.inv_step == any.inv_step);
            for (row, node) in b.iter_mut().zip(&t.b) {
                row.0[3 * k..3 * k + 3].copy_from_slice(node);
            }
        }
        Some(PairTents {
            t0: any.t0,
            inv_step: any.inv_step,
            b,
        })
    }

    /// The cell of [`TentTable::at`] for slopes `(tx, ty)`: the index of its lower node
    /// and the weights along the two axes.
    #[inline(always)]
    fn cell(&self, tx: f32, ty: f32) -> (usize, f32, f32) {
        let top = (NODES - 1) as f32 - 1e-3;
        let u = ((tx - self.t0[0]) * self.inv_step[0]).max(0.0).min(top);
        let v = ((ty - self.t0[1]) * self.inv_step[1]).max(0.0).min(top);
        // Truncation through `u32` (one conversion instruction, where `usize` takes a
        // branch on x86_64): `u` and `v` are in `[0, NODES - 1)`.
        let (iu, iv) = (u as u32 as usize, v as u32 as usize);
        let (fu, fv) = (u - iu as f32, v - iv as f32);
        // `iu`, `iv` are at most `NODES - 2`: the four nodes are the table's.
        (iu * NODES + iv, fu, fv)
    }

    /// Every mean field along the line of slopes `(tx, ty)` from the origin: the cell and
    /// weights of [`TentTable::at`], found once; the values past [`PAIR_FIELDS`] are zero.
    #[inline(always)]
    pub fn at(&self, tx: f32, ty: f32) -> [f32; PAIR_ROW] {
        let (k, fu, fv) = self.cell(tx, ty);
        let (b00, b01) = (&self.b[k].0, &self.b[k + 1].0);
        let (b10, b11) = (&self.b[k + NODES].0, &self.b[k + NODES + 1].0);
        let mut out = [0.0f32; PAIR_ROW];
        for c in 0..PAIR_FIELDS {
            let lo = b00[c] + fv * (b01[c] - b00[c]);
            let hi = b10[c] + fv * (b11[c] - b10[c]);
            out[c] = lo + fu * (hi - lo);
        }
        out
    }

    /// [`PairTents::at`] in two vectors of eight (the same operations in the same order,
    /// so the same values, bit for bit).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn at_avx2(&self, tx: f32, ty: f32) -> [f32; PAIR_ROW] {
        use std::arch::x86_64::*;
        let (k, fu, fv) = self.cell(tx, ty);
        // The cell's lower node is at most `(NODES - 2) * (NODES + 1)`: its three
        // neighbours are inside the table (checked, once, for the highest of them).
        let rows = &self.b[k..k + NODES + 2];
        let (fu, fv) = (_mm256_set1_ps(fu), _mm256_set1_ps(fv));
        let mut out = PairRow([0.0; PAIR_ROW]);
        for half in 0..2 {
            let o = 8 * half;
            // SAFETY: rows are 32-byte aligned arrays of 16 floats; `o + 8 <= 16`.
            let (b00, b01, b10, b11) = unsafe {
                (
                    _mm256_load_ps(rows[0].0.as_ptr().add(o)),
                    _mm256_load_ps(rows[1].0.as_ptr().add(o)),
                    _mm256_load_ps(rows[NODES].0.as_ptr().add(o)),
                    _mm256_load_ps(rows[NODES + 1].0.as_ptr().add(o)),
                )
            };
            let lo = _mm256_add_ps(b00, _mm256_mul_ps(fv, _mm256_sub_ps(b01, b00)));
            let hi = _mm256_add_ps(b10, _mm256_mul_ps(fv, _mm256_sub_ps(b11, b10)));
            let v = _mm256_add_ps(lo, _mm256_mul_ps(fu, _mm256_sub_ps(hi, lo)));
            // SAFETY: as above.
            unsafe { _mm256_store_ps(out.0.as_mut_ptr().add(o), v) };
        }
        out.0
    }
}

/// Most threads [`tables`] builds with.
const TABLE_THREADS: usize = 16;

/// The tables of the tents `zs` ([`TentTable::new`]), in their order, built on up to
/// [`TABLE_THREADS`] threads (a field map's detector has about a hundred, each about
/// thirty thousand field lookups); each table is its own computation, so the tables are
/// the same on any number of threads.
fn tables(field: &Field, origin: [f64; 3], zs: &[[f64; 3]], t_max: [f64; 2]) -> Vec<TentTable> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, TABLE_THREADS);
    // Every table takes about the same work: a run of them per thread.
    let per = zs.len().div_ceil(threads).max(1);
    let mut out: Vec<Option<TentTable>> = vec![None; zs.len()];
    std::thread::scope(|scope| {
        for (out, zs) in out.chunks_mut(per).zip(zs.chunks(per)) {
            scope.spawn(move || {
                for (o, &z) in out.iter_mut().zip(zs) {
                    *o = Some(TentTable::new(field, origin, z, t_max));
                }
            });
        }
    });
    out.into_iter()
        .map(|t| t.expect("every tent's table is built"))
        .collect()
}

/// The tent tables of a detector: per doublet planes `(i, j)` (`j <= i + MAX_REACH`) the pointing
/// tent `(origin, i, j)`, per plane triple `(i, j, j + 1 + s)` the triplet's tent; `None`
/// in a uniform field (the mean is the field) and where there is no such tent.
#[derive(Debug, Clone, Default)]
pub struct Bending {
    n_planes: usize,
    /// At `i * n_planes + j`.
    pub pointing: Vec<Option<TentTable>>,
    /// At `(i * n_planes + j) * MAX_REACH + s`.
    pub triple: Vec<Option<TentTable>>,
    /// The same tables by plane pair, at `i * n_planes + j` (what the windows read).
    pub pairs: Vec<Option<PairTents>>,
    /// Per plane, `1 / (z - z_origin)` (0 where the plane is not downstream of the origin).
    pub inv_lever: Vec<f32>,
}

impl Bending {
    /// Tables for the planes at `z_mm` (increasing), the origin at `origin` (mm) and
    /// directions up to the slope limits `t_max`.
    pub fn new(field: &Field, origin: [f64; 3], z_mm: &[f64], t_max: [f64; 2]) -> Self {
        let z_origin_mm = origin[2];
        let n = z_mm.len();
        let inv_lever = z_mm
            .iter()
            .map(|&z| {
                let l = z - z_origin_mm;
                if l > 1.0 {
                    (1.0 / l) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let mut b = Bending {
            n_planes: n,
            pointing: vec![None; n * n],
            triple: vec![None; n * n * MAX_REACH],
            pairs: vec![None; n * n],
            inv_lever,
        };
        if field.is_uniform() {
            return b;
        }
        // The tents, each with its place: (pointing, slot, planes' z).
        let mut tents = Vec::new();
        for i in 0..n {
            for j in (i + 1)..(i + 1 + MAX_REACH).min(n) {
                if z_mm[i] - z_origin_mm > 1.0 && z_mm[j] > z_mm[i] {
                    tents.push((true, i * n + j, [z_origin_mm, z_mm[i], z_mm[j]]));
                }
                for s in 0..MAX_REACH {
                    let k = j + 1 + s;
                    if k < n && z_mm[k] > z_mm[j] {
                        let slot = (i * n + j) * MAX_REACH + s;
                        tents.push((false, slot, [z_mm[i], z_mm[j], z_mm[k]]));
                    }
                }
            }
        }
        let zs: Vec<[f64; 3]> = tents.iter().map(|t| t.2).collect();
        for (&(pointing, slot, _), table) in tents.iter().zip(tables(field, origin, &zs, t_max)) {
            let to = if pointing {
                &mut b.pointing
            } else {
                &mut b.triple
            };
            to[slot] = Some(table);
        }
        for i in 0..n {
            for j in (i + 1)..(i + 1 + MAX_REACH).min(n) {
                let triples = std::array::from_fn(|s| b.triple(i, j, s));
                b.pairs[i * n + j] = PairTents::new(b.pointing(i, j), triples);
            }
        }
        b
    }

    /// The tables of doublet planes `(i, j)` together.
    #[inline(always)]
    pub fn pair(&self, i: usize, j: usize) -> Option<&PairTents> {
        self.pairs.get(i * self.n_planes + j)?.as_ref()
    }

    /// The pointing tent's table of doublet planes `(i, j)`.
    #[inline(always)]
    pub fn pointing(&self, i: usize, j: usize) -> Option<&TentTable> {
        self.pointing.get(i * self.n_planes + j)?.as_ref()
    }

    /// The triplet tent's table of planes `(i, j, j + 1 + s)` (`None` where there is none:
    /// `j <= i`, planes further apart than [`MAX_REACH`], or past the last plane).
    #[inline(always)]
    pub fn triple(&self, i: usize, j: usize, s: usize) -> Option<&TentTable> {
        if j >= self.n_planes || s >= MAX_REACH {
            return None;
        }
        self.triple
            .get((i * self.n_planes + j) * MAX_REACH + s)?
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::field::FieldMap;
    use crate::tracking::propagate::K_GEV_PER_T_MM;
    use crate::tracking::simulate::{propagate, StateVector};

    /// A map with `By(z)` given by `profile` (constant in x and y).
    fn map(profile: impl Fn(f64) -> f64) -> Field {
        let dims = [3, 3, 121];
        let mut nodes = Vec::new();
        for _ in 0..dims[0] * dims[1] {
            for iz in 0..dims[2] {
                nodes.push([0.0, profile(-100.0 + 10.0 * iz as f64) as f32, 0.0]);
            }
        }
        Field::Grid(
            FieldMap::new(
                dims,
                [-1000.0, -1000.0, -100.0],
                [1000.0, 1000.0, 10.0],
                nodes,
            )
            .unwrap(),
        )
    }

    /// The change of chord slope of a transported trajectory equals q/p times the tent
    /// integral of the bending, for fields concentrated in the middle, rising, and
    /// changing sign.
    #[test]
    fn chord_slope_change_is_the_tent_integral_of_the_bending() {
        let fields = [
            map(|z| 0.8 * (-0.5 * ((z - 560.0) / 260.0).powi(2)).exp()),
            map(|z| z / 1000.0),
            map(|z| if z < 500.0 { 0.6 } else { -0.6 }),
        ];
        let z = [250.0, 420.0, 630.0];
        for (f, field) in fields.iter().enumerate() {
            let mut s = StateVector {
                z_mm: 0.0,
                x_mm: 0.0,
                y_mm: 0.0,
                tx: 0.01,
                ty: 0.002,
                qop: 1.0 / 5.0,
            };
            let mut x = [0.0; 3];
            for (k, &zk) in z.iter().enumerate() {
                propagate(field, &mut s, zk, 1.0).unwrap();
                x[k] = s.x_mm;
            }
            let ds = (x[2] - x[1]) / (z[2] - z[1]) - (x[1] - x[0]) / (z[1] - z[0]);
            let b = tent_mean(field, [0.0; 3], [0.01, 0.002], z);
            // Small slopes (the track turns by 0.03 at most): d²x/dz² = -K q/p By (1 + O(t²)).
            let predicted = -K_GEV_PER_T_MM * s.qop * b[1] * 0.5 * (z[2] - z[0]);
            assert!(
                (ds - predicted).abs() < 3e-3 * predicted.abs() + 1e-7,
                "{ds} vs {predicted}"
            );
            // Where the field is not linear about the middle plane, the field there alone is
            // wrong by far more (the linear one: by its asymmetry in z).
            if f == 0 {
                continue;
            }
            let at_mid =
                -K_GEV_PER_T_MM * s.qop * field.at([0.0, 0.0, z[1]])[1] * 0.5 * (z[2] - z[0]);
            assert!(
                (ds - at_mid).abs() > 2e-2 * predicted.abs(),
                "{ds} vs {at_mid}"
            );
        }
    }

    /// The tables of a plane pair looked up together give each table's own lookup, bit
    /// for bit, and zero where a tent is missing (the last planes have no triples).
    #[test]
    fn pair_lookups_are_the_tables_lookups() {
        let field = map(|z| 0.8 * (-0.5 * ((z - 560.0) / 260.0).powi(2)).exp() - 0.1);
        let z = [250.0, 330.0, 420.0, 520.0, 630.0];
        let b = Bending::new(&field, [0.0; 3], &z, [0.3, 0.25]);
        let mut pairs = 0;
        for i in 0..z.len() {
            for j in (i + 1)..(i + 1 + MAX_REACH).min(z.len()) {
                let p = b
                    .pair(i, j)
                    .expect("a pair of planes downstream of the origin");
                pairs += 1;
                for (tx, ty) in [
                    (0.0, 0.0),
                    (0.11, -0.07),
                    (-0.29, 0.24),
                    (5.0, -5.0),
                    (-5.0, 5.0),
                    (0.3, 0.25),
                    (-0.3, -0.25),
                    (f32::NAN, 0.1),
                    (0.1, f32::NAN),
                ] {
                    let v = p.at(tx, ty);
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2.
                        let w = unsafe { p.at_avx2(tx, ty) };
                        assert_eq!(w.map(f32::to_bits), v.map(f32::to_bits), "({tx}, {ty})");
                    }
                    assert!(v[PAIR_FIELDS..].iter().all(|&x| x == 0.0));
                    let d = b.pointing(i, j).map_or([0.0; 3], |t| t.at(tx, ty));
                    assert_eq!(
                        v[..3].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        d.map(f32::to_bits)
                    );
                    for s in 0..MAX_REACH {
                        let g = b.triple(i, j, s).map_or([0.0; 3], |t| t.at(tx, ty));
                        let got = &v[3 + 3 * s..6 + 3 * s];
                        assert_eq!(
                            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            g.map(f32::to_bits)
                        );
                    }
                }
            }
        }
        assert_eq!(pairs, 3 + 3 + 2 + 1);
        assert!(b.triple(3, 4, 0).is_none() && b.pair(3, 4).is_some());
        // No alias of another triple's slot past the reach.
        assert!(b.triple(0, 1, 1).is_some() && b.triple(0, 2, 0).is_some());
        assert!(b.triple(0, 1, MAX_REACH).is_none());
    }

    #[test]
    fn table_lookups_interpolate_and_bound_the_nodes() {
        let field = map(|z| 0.8 * (-0.5 * ((z - 560.0) / 260.0).powi(2)).exp());
        let t = TentTable::new(&field, [0.0; 3], [330.0, 420.0, 520.0], [0.3, 0.3]);
        let direct = tent_mean(&field, [0.0; 3], [0.1, -0.05], [330.0, 420.0, 520.0]);
        let looked_up = t.at(0.1, -0.05);
        assert!(
            (looked_up[1] as f64 - direct[1]).abs() < 1e-4,
            "{looked_up:?} {direct:?}"
        );
        assert!(t.bound[1] >= direct[1].abs() && t.bound[1] < 0.8);
        // Out of the table and NaN: clamped, finite.
        assert!(t.at(9.0, f32::NAN).iter().all(|v| v.is_finite()));
        let uniform = Field::Uniform {
            b_tesla: [0.1, -1.0, 0.0],
        };
        assert_eq!(
            max_field_tesla(&uniform, [0.0; 3], 1000.0, [0.3, 0.3]),
            [0.1, 1.0, 0.0]
        );
        let sign = map(|z| if z < 500.0 { 0.6 } else { -0.7 });
        let m = max_field_tesla(&sign, [0.0; 3], 1000.0, [0.3, 0.3]);
        assert!((m[1] - 0.7).abs() < 1e-6, "{m:?}");
    }

    /// The tables built on several threads are those built one after the other, bit for
    /// bit, in the tents' order.
    #[test]
    fn tables_built_on_threads_are_the_tables_built_in_turn() {
        let field = map(|z| 0.8 * (-0.5 * ((z - 560.0) / 260.0).powi(2)).exp() - 0.1);
        let origin = [0.3, -0.2, 0.0];
        let t_max = [0.25, 0.2];
        let zs: Vec<[f64; 3]> = (0..23)
            .map(|k| {
                let a = 200.0 + 13.0 * k as f64;
                [a, a + 90.0 + k as f64, a + 250.0]
            })
            .collect();
        let built = tables(&field, origin, &zs, t_max);
        assert_eq!(built.len(), zs.len());
        for (t, &z) in built.iter().zip(&zs) {
            let one = TentTable::new(&field, origin, z, t_max);
            let bits = |t: &TentTable| {
                let (t0, inv, b) = t.nodes();
                let mut v: Vec<u64> = t0.iter().chain(&inv).map(|x| x.to_bits() as u64).collect();
                v.extend(b.iter().flatten().map(|x| x.to_bits() as u64));
                v.extend(t.bound.iter().map(|x| x.to_bits()));
                v
            };
            assert_eq!(bits(t), bits(&one), "{z:?}");
        }
        let detector = Bending::new(&field, origin, &[250.0, 330.0, 420.0, 520.0, 630.0], t_max);
        let again = Bending::new(&field, origin, &[250.0, 330.0, 420.0, 520.0, 630.0], t_max);
        assert!(detector.pointing.iter().flatten().count() > 0);
        for (a, b) in detector.triple.iter().zip(&again.triple) {
            assert_eq!(
                a.as_ref().map(|t| t.nodes().2.to_vec()),
                b.as_ref().map(|t| t.nodes().2.to_vec())
            );
        }
    }
}
