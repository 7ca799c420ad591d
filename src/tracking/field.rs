//! Magnetic field maps on a regular grid: loading from NPY (float32, shape `[nx, ny, nz, 3]`,
//! tesla) and trilinear interpolation.
//!
//! Outside the grid the field is that of the nearest point of the grid box (each coordinate
//! is clamped to the box before interpolating). Clamping keeps the field continuous, which
//! the Runge-Kutta transport needs; a map should therefore extend to where the field has
//! fallen to (near) zero, as measured dipole maps do.

use std::path::Path;

/// A field map on a regular grid. Node `(ix, iy, iz)` sits at
/// `origin_mm + (ix, iy, iz) * step_mm` and holds `(bx, by, bz)` in tesla.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldMap {
    /// Number of nodes along x, y, z (each at least 2).
    pub dims: [usize; 3],
    pub origin_mm: [f64; 3],
    pub step_mm: [f64; 3],
    /// Node values, C order of `[nx, ny, nz]`: index `(ix * ny + iy) * nz + iz`. Shared by
    /// every clone of the map (each worker's finder tables and fitter hold the one map).
    pub nodes_tesla: std::sync::Arc<[[f32; 3]]>,
    inv_step_mm: [f64; 3],
    /// `origin_mm` and `inv_step_mm` in `f32`, for [`FieldMap::at_f32`].
    origin_f32: [f32; 3],
    inv_step_f32: [f32; 3],
}

/// Why a field map was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FieldMapError {
    #[error("grid needs at least 2 nodes along each axis, got {0:?}")]
    TooFewNodes([usize; 3]),
    #[error("step_mm[{axis}] = {value} must be positive and finite")]
    BadStep { axis: usize, value: f64 },
    #[error("origin_mm[{axis}] = {value} is not finite")]
    BadOrigin { axis: usize, value: f64 },
    #[error("{got} node values for a {dims:?} grid (expected {expected})")]
    WrongLength {
        dims: [usize; 3],
        got: usize,
        expected: usize,
    },
    #[error("node {index} (ix {ix}, iy {iy}, iz {iz}) has a non-finite value")]
    NonFinite {
        index: usize,
        ix: usize,
        iy: usize,
        iz: usize,
    },
    #[error("cannot read NPY: {0}")]
    Npy(String),
    #[error("NPY shape is {0:?}, expected [nx, ny, nz, 3]")]
    WrongShape(Vec<u64>),
}

impl FieldMap {
    /// Builds a map, checking sizes and that every value is finite.
    pub fn new(
        dims: [usize; 3],
        origin_mm: [f64; 3],
        step_mm: [f64; 3],
        nodes_tesla: Vec<[f32; 3]>,
    ) -> Result<Self, FieldMapError> {
        if dims.iter().any(|&n| n < 2) {
            return Err(FieldMapError::TooFewNodes(dims));
        }
        for axis in 0..3 {
            let s = step_mm[axis];
            if !(s.is_finite() && s > 0.0) {
                return Err(FieldMapError::BadStep { axis, value: s });
            }
            if !origin_mm[axis].is_finite() {
                return Err(FieldMapError::BadOrigin {
                    axis,
                    value: origin_mm[axis],
                });
            }
        }
        let expected = dims[0] * dims[1] * dims[2];
        if nodes_tesla.len() != expected {
            return Err(FieldMapError::WrongLength {
                dims,
                got: nodes_tesla.len(),
                expected,
            });
        }
        if let Some(index) = nodes_tesla
            .iter()
            .position(|b| b.iter().any(|v| !v.is_finite()))
        {
            let iz = index % dims[2];
            let iy = (index / dims[2]) % dims[1];
            let ix = index / (dims[1] * dims[2]);
            return Err(FieldMapError::NonFinite { index, ix, iy, iz });
        }
        let inv_step_mm = [1.0 / step_mm[0], 1.0 / step_mm[1], 1.0 / step_mm[2]];
        Ok(Self {
            dims,
            origin_mm,
            step_mm,
            nodes_tesla: nodes_tesla.into(),
            inv_step_mm,
            origin_f32: origin_mm.map(|v| v as f32),
            inv_step_f32: inv_step_mm.map(|v| v as f32),
        })
    }

    /// Reads an NPY of shape `[nx, ny, nz, 3]` (tesla): float32 as the format asks, or
    /// float64 as NumPy writes by default (rounded to float32, far below any field map's
    /// accuracy), in either byte order and C or Fortran order
    /// ([`crate::npy::parse`], which refuses truncated or oversized data before
    /// allocating).
    pub fn from_npy_bytes(
        bytes: &[u8],
        origin_mm: [f64; 3],
        step_mm: [f64; 3],
    ) -> Result<Self, FieldMapError> {
        let arr = crate::npy::parse(bytes).map_err(FieldMapError::Npy)?;
        let shape = arr.shape;
        if shape.len() != 4 || shape[3] != 3 {
            return Err(FieldMapError::WrongShape(
                shape.iter().map(|&d| d as u64).collect(),
            ));
        }
        let dims = [shape[0], shape[1], shape[2]];
        let nodes = arr
            .data
            .chunks_exact(3)
            .map(|c| [c[0] as f32, c[1] as f32, c[2] as f32])
            .collect();
        Self::new(dims, origin_mm, step_mm, nodes)
    }

    /// Reads a field map file (see [`FieldMap::from_npy_bytes`]).
    pub fn from_npy_file(
        path: &Path,
        origin_mm: [f64; 3],
        step_mm: [f64; 3],
    ) -> Result<Self, FieldMapError> {
        let bytes = std::fs::read(path).map_err(|e| FieldMapError::Npy(e.to_string()))?;
        Self::from_npy_bytes(&bytes, origin_mm, step_mm)
    }

    /// How far trilinear interpolation between the nodes can miss a smooth field, from
    /// the map itself: along each axis, at the middle of every cell with a node on either
    /// side of it, the cubic (Catmull-Rom) value minus the linear one, `(-b0 + b1 + b2 -
    /// b3) / 16` (about `h^2 / 8` times the field's second derivative). Returns the largest
    /// and the root mean square of these over the three components, tesla.
    pub fn interpolation_error(&self) -> (f64, f64) {
        let [nx, ny, nz] = self.dims;
        let (mut worst, mut sum, mut n) = (0.0f64, 0.0f64, 0usize);
        let stride = [ny * nz, nz, 1];
        for axis in 0..3 {
            if self.dims[axis] < 4 {
                continue;
            }
            for ix in 0..nx {
                for iy in 0..ny {
                    for iz in 0..nz {
                        let i = [ix, iy, iz];
                        if i[axis] + 3 >= self.dims[axis] {
                            continue;
                        }
                        let base = (ix * ny + iy) * nz + iz;
                        let at = |k: usize| self.nodes_tesla[base + k * stride[axis]];
                        let (b0, b1, b2, b3) = (at(0), at(1), at(2), at(3));
                        for c in 0..3 {
                            let d = (-(b0[c] as f64) + b1[c] as f64 + b2[c] as f64 - b3[c] as f64)
                                / 16.0;
                            worst = worst.max(d.abs());
                            sum += d * d;
                            n += 1;
                        }
                    }
                }
            }
        }
        (worst, if n == 0 { 0.0 } else { (sum / n as f64).sqrt() })
    }

    /// The largest |component| of any node, tesla.
    pub fn max_abs_tesla(&self) -> f64 {
        self.nodes_tesla
            .iter()
            .flat_map(|b| b.iter())
            .fold(0.0f64, |m, &v| m.max((v as f64).abs()))
    }

    /// The map on a grid `factor` times finer along each axis (steps divided by it, the
    /// same origin and extent, every node of this map kept), the new nodes interpolated
    /// with Catmull-Rom cubics along each axis in turn (beyond the first and last node,
    /// the line through the last two: a linear field is kept to the map's edge). A magnetic field is smooth on the scale of a map's grid, and
    /// the cubic follows its curvature between the nodes, where trilinear interpolation on
    /// a coarse grid cuts the corners: a lobe of 90 mm mapped every 30 mm is missed by up
    /// to 2 % between nodes, which shows in the fitted q/p of thin, precise detectors.
    /// Lookups on the finer grid stay trilinear (as on the GPU), at `factor^3` times the
    /// memory. `factor` 1 returns a copy.
    pub fn refined(&self, factor: usize) -> Result<FieldMap, FieldMapError> {
        let f = factor.max(1);
        let mut dims = self.dims;
        let mut nodes: Vec<[f64; 3]> = self
            .nodes_tesla
            .iter()
            .map(|b| b.map(|v| v as f64))
            .collect();
        for axis in 0..3 {
            if f == 1 {
                break;
            }
            let n = dims[axis];
            let m = (n - 1) * f + 1;
            let mut out_dims = dims;
            out_dims[axis] = m;
            // Strides of the axis in the input and the output, and the count of lines.
            let stride = |d: [usize; 3]| match axis {
                0 => d[1] * d[2],
                1 => d[2],
                _ => 1,
            };
            let (si, so) = (stride(dims), stride(out_dims));
            let mut out = vec![[0.0f64; 3]; out_dims[0] * out_dims[1] * out_dims[2]];
            // Each line along the axis: its first node's index in the input and output.
            let (outer, inner) = match axis {
                0 => (1, dims[1] * dims[2]),
                1 => (dims[0], dims[2]),
                _ => (dims[0] * dims[1], 1),
            };
            for o in 0..outer {
                for i in 0..inner {
                    let (bi, bo) = match axis {
                        0 => (i, i),
                        1 => (o * n * dims[2] + i, o * m * dims[2] + i),
                        _ => (o * n, o * m),
                    };
                    let at = |k: usize| nodes[bi + k * si];
                    // Beyond the ends, the line through the last two nodes (a linear
                    // field stays linear up to the map's edge).
                    let node = |k: isize| -> [f64; 3] {
                        let last = n as isize - 1;
                        if k < 0 {
                            let (a, b) = (at(0), at(1));
                            std::array::from_fn(|c| 2.0 * a[c] - b[c])
                        } else if k > last {
                            let (a, b) = (at(n - 1), at(n - 2));
                            std::array::from_fn(|c| 2.0 * a[c] - b[c])
                        } else {
                            at(k as usize)
                        }
                    };
                    for k in 0..n - 1 {
                        let (p0, p1, p2, p3) = (
                            node(k as isize - 1),
                            node(k as isize),
                            node(k as isize + 1),
                            node(k as isize + 2),
                        );
                        for j in 0..f {
                            let t = j as f64 / f as f64;
                            let (t2, t3) = (t * t, t * t * t);
                            let w = [
                                0.5 * (-t3 + 2.0 * t2 - t),
                                0.5 * (3.0 * t3 - 5.0 * t2 + 2.0),
                                0.5 * (-3.0 * t3 + 4.0 * t2 + t),
                                0.5 * (t3 - t2),
                            ];
                            let v: [f64; 3] = std::array::from_fn(|c| {
                                if j == 0 {
                                    p1[c]
                                } else {
                                    w[0] * p0[c] + w[1] * p1[c] + w[2] * p2[c] + w[3] * p3[c]
                                }
                            });
                            out[bo + (k * f + j) * so] = v;
                        }
                    }
                    out[bo + (m - 1) * so] = node(n as isize - 1);
                }
            }
            nodes = out;
            dims = out_dims;
        }
        let step = self.step_mm.map(|s| s / f as f64);
        let nodes32 = nodes.into_iter().map(|b| b.map(|v| v as f32)).collect();
        FieldMap::new(dims, self.origin_mm, step, nodes32)
    }

    #[inline]
    fn node(&self, ix: usize, iy: usize, iz: usize) -> [f32; 3] {
        self.nodes_tesla[(ix * self.dims[1] + iy) * self.dims[2] + iz]
    }

    /// Cell index and fractional position along one axis, clamped to the grid.
    #[inline]
    fn locate(&self, axis: usize, pos_mm: f64) -> (usize, f64) {
        let n = self.dims[axis];
        let u = (pos_mm - self.origin_mm[axis]) * self.inv_step_mm[axis];
        // NaN positions land on the first cell rather than indexing out of bounds.
        let u = if u.is_nan() {
            0.0
        } else {
            u.clamp(0.0, (n - 1) as f64)
        };
        // `u` is in `[0, n - 1]`: truncation is the floor (without a library call, which
        // baseline x86_64 does not inline).
        let i = (u as usize).min(n - 2);
        (i, u - i as f64)
    }

    /// [`FieldMap::at`] in single precision, for the fitter's hot path: the same clamping
    /// and interpolation, with the cell found by one conversion per axis.
    #[inline]
    pub fn at_f32(&self, pos_mm: [f32; 3]) -> [f32; 3] {
        let mut cell = [0usize; 3];
        let mut frac = [0.0f32; 3];
        for axis in 0..3 {
            let n = self.dims[axis];
            let u = (pos_mm[axis] - self.origin_f32[axis]) * self.inv_step_f32[axis];
            // `max` takes NaN to 0 (the first cell, as `at`).
            let u = u.max(0.0).min((n - 1) as f32);
            let i = (u as usize).min(n - 2);
            cell[axis] = i;
            frac[axis] = u - i as f32;
        }
        let (sy, sx) = (self.dims[2], self.dims[1] * self.dims[2]);
        let base = cell[0] * sx + cell[1] * sy + cell[2];
        let [fx, fy, fz] = frac;
        // The eight nodes of the cell (`cell[a] <= dims[a] - 2`, so all in the grid).
        let c = &self.nodes_tesla[base..=base + sx + sy + 1];
        let lerp = |a: [f32; 3], b: [f32; 3], t: f32| -> [f32; 3] {
            [
                a[0] + t * (b[0] - a[0]),
                a[1] + t * (b[1] - a[1]),
                a[2] + t * (b[2] - a[2]),
            ]
        };
        let c00 = lerp(c[0], c[1], fz);
        let c01 = lerp(c[sy], c[sy + 1], fz);
        let c10 = lerp(c[sx], c[sx + 1], fz);
        let c11 = lerp(c[sx + sy], c[sx + sy + 1], fz);
        lerp(lerp(c00, c01, fy), lerp(c10, c11, fy), fx)
    }

    /// [`FieldMap::at`] at each of `pos_mm`, into `out` (of the same length), bit for bit:
    /// four lookups at a time in vector registers where the CPU has AVX2 (the same
    /// operations on each lane, in the same order, without fused multiply-adds).
    pub fn at_many(&self, pos_mm: &[[f64; 3]], out: &mut [[f64; 3]]) {
        assert_eq!(pos_mm.len(), out.len());
        let mut k = 0;
        // The vector path gathers with 32-bit indices into the node values.
        #[cfg(target_arch = "x86_64")]
        if self.nodes_tesla.len() * 3 < i32::MAX as usize
            && std::arch::is_x86_feature_detected!("avx2")
        {
            // SAFETY: the CPU has AVX2, and the node values' indices fit an `i32`.
            k = unsafe { self.at_many_avx2(pos_mm, out) };
        }
        for (p, o) in pos_mm[k..].iter().zip(&mut out[k..]) {
            *o = self.at(*p);
        }
    }

    /// The lookups of [`FieldMap::at_many`] four at a time ([`FieldMap::at4_avx2`], inlined
    /// here), as many as make whole groups of four; returns how many.
    ///
    /// # Safety
    /// As [`FieldMap::at4_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn at_many_avx2(&self, pos_mm: &[[f64; 3]], out: &mut [[f64; 3]]) -> usize {
        let n = pos_mm.len().min(out.len()) / 4 * 4;
        for (p, o) in pos_mm[..n]
            .chunks_exact(4)
            .zip(out[..n].chunks_exact_mut(4))
        {
            let p = [p[0], p[1], p[2], p[3]];
            // SAFETY: as this function's.
            let b = unsafe { self.at4_avx2(&p) };
            o.copy_from_slice(&b);
        }
        n
    }

    /// Four lookups of [`FieldMap::at`], one per lane of `f64` vectors.
    ///
    /// # Safety
    /// The CPU must have AVX2, and `3 * nodes_tesla.len()` must fit an `i32`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn at4_avx2(&self, p: &[[f64; 3]; 4]) -> [[f64; 3]; 4] {
        use std::arch::x86_64::*;
        let zero = _mm256_setzero_pd();
        let one = _mm256_set1_pd(1.0);
        let mut cell = [_mm_setzero_si128(); 3];
        let mut frac = [zero; 3];
        for axis in 0..3 {
            let n = self.dims[axis];
            let pos = _mm256_setr_pd(p[0][axis], p[1][axis], p[2][axis], p[3][axis]);
            let u = _mm256_mul_pd(
                _mm256_sub_pd(pos, _mm256_set1_pd(self.origin_mm[axis])),
                _mm256_set1_pd(self.inv_step_mm[axis]),
            );
            // `locate`: NaN to 0 (`max` returns its second operand where the first is
            // NaN), clamped to `[0, n - 1]`, truncated, at most `n - 2`.
            let u = _mm256_min_pd(_mm256_max_pd(u, zero), _mm256_set1_pd((n - 1) as f64));
            let i = _mm_min_epi32(_mm256_cvttpd_epi32(u), _mm_set1_epi32((n - 2) as i32));
            cell[axis] = i;
            frac[axis] = _mm256_sub_pd(u, _mm256_cvtepi32_pd(i));
        }
        let (sy, sx) = (self.dims[2] as i32, (self.dims[1] * self.dims[2]) as i32);
        let base = _mm_add_epi32(
            _mm_add_epi32(
                _mm_mullo_epi32(cell[0], _mm_set1_epi32(sx)),
                _mm_mullo_epi32(cell[1], _mm_set1_epi32(sy)),
            ),
            cell[2],
        );
        // Index of each lane's first value in the flat `f32` node values.
        let base = _mm_mullo_epi32(base, _mm_set1_epi32(3));
        let mut first = [0i32; 4];
        _mm_storeu_si128(first.as_mut_ptr().cast(), base);
        let [fx, fy, fz] = frac;
        let (gx, gy, gz) = (
            _mm256_sub_pd(one, fx),
            _mm256_sub_pd(one, fy),
            _mm256_sub_pd(one, fz),
        );
        // The corners' weights in `at`'s order (x outer, then y, then z), per lane.
        let mut w = [[0.0f64; 4]; 8];
        let mut k = 0;
        for wx in [gx, fx] {
            for wy in [gy, fy] {
                for wz in [gz, fz] {
                    _mm256_storeu_pd(w[k].as_mut_ptr(), _mm256_mul_pd(_mm256_mul_pd(wx, wy), wz));
                    k += 1;
                }
            }
        }
        // Lane by lane, the cell's nodes read as rows: nodes `iz` and `iz + 1` of one
        // `(ix, iy)` are six floats in a row, read as node `iz` with one float more and,
        // from two floats on (so that no read passes node `iz + 1`'s z), node `iz + 1`
        // moved down by one; each widened to `f64` (x, y, z and one lane unused) and
        // summed with its weight in `at`'s order: the same operations as `at`, so the same
        // values (four loads of 128 bits per lookup instead of six four-lane gathers, slow
        // on AMD Zen 2).
        let values = self.nodes_tesla.as_ptr() as *const f32;
        let mut out = [[0.0f64; 3]; 4];
        for (l, o) in out.iter_mut().enumerate() {
            let mut b = zero;
            let mut k = 0;
            for dx in 0..2 {
                for dy in 0..2 {
                    // SAFETY: `cell[a] <= dims[a] - 2`: nodes `(ix + dx, iy + dy, iz)` and
                    // `iz + 1` are in the grid, and every float read, from the first
                    // node's x to the second's z, is one of theirs.
                    let a = values.add(first[l] as usize + 3 * (dx * sx + dy * sy) as usize);
                    let v0 = _mm_loadu_ps(a);
                    let v1 = _mm_permute_ps::<0b00_11_10_01>(_mm_loadu_ps(a.add(2)));
                    for v in [v0, v1] {
                        let wk = _mm256_set1_pd(w[k][l]);
                        b = _mm256_add_pd(b, _mm256_mul_pd(wk, _mm256_cvtps_pd(v)));
                        k += 1;
                    }
                }
            }
            let mut lanes = [0.0f64; 4];
            _mm256_storeu_pd(lanes.as_mut_ptr(), b);
            *o = [lanes[0], lanes[1], lanes[2]];
        }
        out
    }

    /// Field at `pos_mm` in tesla, trilinear between the eight surrounding nodes.
    #[inline]
    pub fn at(&self, pos_mm: [f64; 3]) -> [f64; 3] {
        let (ix, fx) = self.locate(0, pos_mm[0]);
        let (iy, fy) = self.locate(1, pos_mm[1]);
        let (iz, fz) = self.locate(2, pos_mm[2]);
        let mut b = [0.0f64; 3];
        for (dx, wx) in [(0, 1.0 - fx), (1, fx)] {
            for (dy, wy) in [(0, 1.0 - fy), (1, fy)] {
                for (dz, wz) in [(0, 1.0 - fz), (1, fz)] {
                    let w = wx * wy * wz;
                    let v = self.node(ix + dx, iy + dy, iz + dz);
                    b[0] += w * v[0] as f64;
                    b[1] += w * v[1] as f64;
                    b[2] += w * v[2] as f64;
                }
            }
        }
        b
    }
}

/// The field map sampled at a list of z: per z a slice of the map's (x, y) nodes, whose
/// bilinear interpolation is the map's trilinear one at that z (the interpolation is
/// separable). The fitter's Runge-Kutta steps read the field at z values known before the
/// fit (the ends and middles of their steps between two planes), so each lookup is a
/// bilinear one on a slice made at construction: four nodes instead of eight, no search
/// along z, and the cell of all lanes of a pack found with vector instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSlices {
    /// Nodes along x and y (each at least 2).
    pub dims: [usize; 2],
    /// `[origin_x, origin_y, 1 / step_x, 1 / step_y]` in mm and 1/mm, in single and
    /// double precision (as the map rounds them for its lookups).
    pub grid32: [f32; 4],
    pub grid64: [f64; 4],
    /// The z of each slice, mm.
    pub z_mm: Vec<f64>,
    /// Node values `(bx, by, bz)`, tesla: slice `k`, node `(ix, iy)` at
    /// `(k * nx + ix) * ny + iy`; in single precision (rounded from the double-precision
    /// values) and in double precision.
    pub nodes32: Vec<[f32; 3]>,
    pub nodes64: Vec<[f64; 3]>,
}

impl FieldSlices {
    /// Nodes per slice.
    #[inline(always)]
    pub fn slice_len(&self) -> usize {
        self.dims[0] * self.dims[1]
    }

    /// Number of slices.
    pub fn len(&self) -> usize {
        self.z_mm.len()
    }

    /// Whether there are no slices.
    pub fn is_empty(&self) -> bool {
        self.z_mm.is_empty()
    }

    /// Cell index and fractional position along axis `a` (0 = x, 1 = y) of slices, in
    /// single precision: clamped to the grid as [`FieldMap::at_f32`] does (NaN to the first
    /// cell).
    #[inline(always)]
    pub fn locate_f32(&self, a: usize, pos_mm: f32) -> (usize, f32) {
        let n = self.dims[a];
        let u = (pos_mm - self.grid32[a]) * self.grid32[2 + a];
        let u = u.max(0.0).min((n - 1) as f32);
        let i = (u as usize).min(n - 2);
        (i, u - i as f32)
    }

    /// [`FieldSlices::locate_f32`] in double precision.
    #[inline(always)]
    pub fn locate_f64(&self, a: usize, pos_mm: f64) -> (usize, f64) {
        let n = self.dims[a];
        let u = (pos_mm - self.grid64[a]) * self.grid64[2 + a];
        let u = u.max(0.0).min((n - 1) as f64);
        let i = (u as usize).min(n - 2);
        (i, u - i as f64)
    }

    /// Field on slice `k` at `(x, y)`, bilinear in single precision: along y first, then
    /// along x, each as `a + f (b - a)`.
    #[inline(always)]
    pub fn at_f32(&self, k: usize, x_mm: f32, y_mm: f32) -> [f32; 3] {
        let (ix, fx) = self.locate_f32(0, x_mm);
        let (iy, fy) = self.locate_f32(1, y_mm);
        let ny = self.dims[1];
        let base = k * self.slice_len() + ix * ny + iy;
        let c = &self.nodes32[base..=base + ny + 1];
        std::array::from_fn(|j| {
            let v0 = c[0][j] + fy * (c[1][j] - c[0][j]);
            let v1 = c[ny][j] + fy * (c[ny + 1][j] - c[ny][j]);
            v0 + fx * (v1 - v0)
        })
    }

    /// [`FieldSlices::at_f32`] in double precision.
    #[inline(always)]
    pub fn at_f64(&self, k: usize, x_mm: f64, y_mm: f64) -> [f64; 3] {
        let (ix, fx) = self.locate_f64(0, x_mm);
        let (iy, fy) = self.locate_f64(1, y_mm);
        let ny = self.dims[1];
        let base = k * self.slice_len() + ix * ny + iy;
        let c = &self.nodes64[base..=base + ny + 1];
        std::array::from_fn(|j| {
            let v0 = c[0][j] + fy * (c[1][j] - c[0][j]);
            let v1 = c[ny][j] + fy * (c[ny + 1][j] - c[ny][j]);
            v0 + fx * (v1 - v0)
        })
    }
}

impl FieldMap {
    /// The map sampled at each of `z_mm` (see [`FieldSlices`]): node `(ix, iy)` of slice
    /// `k` is the map at `(x_ix, y_iy, z_k)`, linear in z between the map's nodes (clamped
    /// to the grid as every lookup is).
    pub fn slices(&self, z_mm: &[f64]) -> FieldSlices {
        let [nx, ny, _] = self.dims;
        let mut nodes64 = Vec::with_capacity(z_mm.len() * nx * ny);
        for &z in z_mm {
            let (iz, fz) = self.locate(2, z);
            for ix in 0..nx {
                for iy in 0..ny {
                    let a = self.node(ix, iy, iz);
                    let b = self.node(ix, iy, iz + 1);
                    nodes64.push(std::array::from_fn(|j| {
                        a[j] as f64 + fz * (b[j] as f64 - a[j] as f64)
                    }));
                }
            }
        }
        let grid64 = [
            self.origin_mm[0],
            self.origin_mm[1],
            self.inv_step_mm[0],
            self.inv_step_mm[1],
        ];
        FieldSlices {
            dims: [nx, ny],
            grid32: grid64.map(|v| v as f32),
            grid64,
            z_mm: z_mm.to_vec(),
            nodes32: nodes64.iter().map(|b| b.map(|v| v as f32)).collect(),
            nodes64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of `f` sampled at the nodes of `dims` from `origin` by `step`.
    fn sampled(
        dims: [usize; 3],
        origin: [f64; 3],
        step: [f64; 3],
        f: impl Fn([f64; 3]) -> [f64; 3],
    ) -> FieldMap {
        let mut nodes = Vec::new();
        for ix in 0..dims[0] {
            for iy in 0..dims[1] {
                for iz in 0..dims[2] {
                    let p = [0, 1, 2].map(|a| origin[a] + step[a] * [ix, iy, iz][a] as f64);
                    nodes.push(f(p).map(|v| v as f32));
                }
            }
        }
        FieldMap::new(dims, origin, step, nodes).unwrap()
    }

    /// Catmull-Rom cubics reproduce a quadratic: away from the map's ends (where the
    /// cubic leans on a node extrapolated linearly), the refined nodes are the quadratic
    /// field itself; every node of the coarse map is kept as it was; a linear field stays
    /// linear up to the edges.
    #[test]
    fn a_refined_map_keeps_its_nodes_and_follows_a_quadratic_field() {
        let quad = |p: [f64; 3]| {
            let [x, y, z] = p.map(|v| v / 100.0);
            [
                0.1 + 0.2 * x * x - 0.1 * x * z,
                1.0 - 0.3 * z * z + 0.05 * y * y + 0.1 * x * y,
                -0.2 * y * z + 0.1 * z,
            ]
        };
        let coarse = sampled([6, 5, 8], [-100.0, -80.0, 0.0], [40.0, 40.0, 50.0], quad);
        let f = 3;
        let fine = coarse.refined(f).unwrap();
        assert_eq!(fine.dims, [16, 13, 22]);
        assert_eq!(fine.step_mm, [40.0 / 3.0, 40.0 / 3.0, 50.0 / 3.0]);
        assert_eq!(fine.origin_mm, coarse.origin_mm);
        let [_, ny, nz] = fine.dims;
        for ix in 0..fine.dims[0] {
            for iy in 0..ny {
                for iz in 0..nz {
                    let i = [ix, iy, iz];
                    let b = fine.nodes_tesla[(ix * ny + iy) * nz + iz];
                    if i.iter().all(|&k| k % f == 0) {
                        assert_eq!(b, coarse.node(ix / f, iy / f, iz / f));
                    }
                    let inner = (0..3).all(|a| i[a] >= f && i[a] + f < fine.dims[a]);
                    if inner {
                        let p =
                            [0, 1, 2].map(|a| fine.origin_mm[a] + fine.step_mm[a] * i[a] as f64);
                        let want = quad(p);
                        for c in 0..3 {
                            assert!(
                                (b[c] as f64 - want[c]).abs() < 1e-5,
                                "node {i:?} component {c}: {} against {}",
                                b[c],
                                want[c]
                            );
                        }
                    }
                }
            }
        }
        // A linear map is its own interpolation: no error, and refined it is the same
        // field everywhere.
        let linear = sampled([4, 4, 4], [0.0; 3], [10.0; 3], |p| {
            [0.01 * p[0], 1.0, -0.02 * p[2]]
        });
        assert!(linear.interpolation_error().0 < 1e-7);
        let twice = linear.refined(2).unwrap();
        for p in [[3.3, 7.1, 12.5], [29.0, 0.5, 14.9]] {
            let (a, b) = (linear.at(p), twice.at(p));
            assert!((0..3).all(|c| (a[c] - b[c]).abs() < 1e-6), "{a:?} {b:?}");
        }
        assert_eq!(coarse.refined(1).unwrap(), coarse);
    }

    /// A lobe 90 mm wide mapped every 30 mm: trilinear lookups between the nodes miss it
    /// by up to a few percent, which the map's own estimate sees; the map refined three
    /// times misses it by several times less.
    #[test]
    fn a_coarse_lobe_is_followed_closer_on_the_refined_map() {
        let lobe = |p: [f64; 3]| {
            let g = (-(p[2] - 300.0).powi(2) / (2.0 * 90.0 * 90.0)).exp();
            let r = (-(p[0] * p[0] + p[1] * p[1]) / (2.0 * 400.0 * 400.0)).exp();
            [0.02 * g * p[1] / 100.0, 0.9 * g * r, 0.0]
        };
        let coarse = sampled([21, 21, 25], [-300.0, -300.0, 0.0], [30.0; 3], lobe);
        let (worst, rms) = coarse.interpolation_error();
        assert!(worst > 0.01 * 0.9 && rms > 0.0, "{worst} {rms}");
        let fine = coarse.refined(3).unwrap();
        let (mut e_coarse, mut e_fine, mut n) = (0.0, 0.0, 0);
        for ix in 0..40 {
            for iz in 0..240 {
                let p = [-200.0 + 10.3 * ix as f64, 17.0, 60.0 + 2.01 * iz as f64];
                let want = lobe(p)[1];
                e_coarse += (coarse.at(p)[1] - want).powi(2);
                e_fine += (fine.at(p)[1] - want).powi(2);
                n += 1;
            }
        }
        let (e_coarse, e_fine) = ((e_coarse / n as f64).sqrt(), (e_fine / n as f64).sqrt());
        assert!(e_fine * 4.0 < e_coarse, "rms {e_fine} against {e_coarse}");
    }

    /// A field map's header goes through the same bound as the EEG inputs' (see
    /// `crate::npy`): brackets nested dozens deep took the header parser minutes.
    #[test]
    fn deeply_nested_header_is_refused_at_once() {
        let header = format!("{{'descr': {}'<f4', }}\n", "[".repeat(40));
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        let started = std::time::Instant::now();
        let err = FieldMap::from_npy_bytes(&bytes, [0.0; 3], [1.0; 3]).unwrap_err();
        assert!(err.to_string().contains("nests brackets"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    /// NPY bytes of `values` (given in C order) written with `descr` (`<f4`, `>f4`, `<f8`,
    /// `>f8`) in C or Fortran order, as NumPy would write them.
    fn npy_bytes(descr: &str, fortran: bool, shape: &[usize], values: &[f64]) -> Vec<u8> {
        use npyz::{DType, Order, WriteOptions, WriterBuilder};
        // The file's element order: C order, or the first index fastest.
        let mut order: Vec<usize> = (0..values.len()).collect();
        if fortran {
            order.clear();
            let mut idx = vec![0usize; shape.len()];
            for _ in 0..values.len() {
                order.push(idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i));
                for (i, d) in idx.iter_mut().zip(shape) {
                    *i += 1;
                    if *i < *d {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        let dtype = DType::Plain(descr.parse().unwrap());
        let layout = if fortran { Order::Fortran } else { Order::C };
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut out = Vec::new();
        fn write<T: npyz::AutoSerialize>(
            dtype: DType,
            layout: Order,
            dims: &[u64],
            out: &mut Vec<u8>,
            items: impl Iterator<Item = T>,
        ) {
            let mut w = WriteOptions::<T>::new()
                .dtype(dtype)
                .order(layout)
                .shape(dims)
                .writer(out)
                .begin_nd()
                .unwrap();
            w.extend(items).unwrap();
            w.finish().unwrap();
        }
        let items = order.iter().map(|&k| values[k]);
        if descr.ends_with('4') {
            write(dtype, layout, &dims, &mut out, items.map(|v| v as f32));
        } else {
            write(dtype, layout, &dims, &mut out, items);
        }
        out
    }

    /// A map written as NumPy writes by default (float64), big-endian or in Fortran order
    /// reads as the same map as float32 in C order; other dtypes and shapes are refused.
    #[test]
    fn float64_big_endian_and_fortran_maps_read_as_the_float32_map() {
        let shape = [3usize, 2, 4, 3];
        let values: Vec<f64> = (0..72).map(|i| 0.01 * i as f64 - 0.3).collect();
        let reference = FieldMap::from_npy_bytes(
            &npy_bytes("<f4", false, &shape, &values),
            [0.0; 3],
            [10.0; 3],
        )
        .unwrap();
        for (descr, fortran) in [
            ("<f8", false),
            (">f8", false),
            (">f4", false),
            ("<f4", true),
            ("<f8", true),
        ] {
            let map = FieldMap::from_npy_bytes(
                &npy_bytes(descr, fortran, &shape, &values),
                [0.0; 3],
                [10.0; 3],
            )
            .unwrap_or_else(|e| panic!("{descr} fortran {fortran}: {e}"));
            for p in [[1.0, 2.0, 3.0], [15.0, 7.0, 22.0], [-5.0, 30.0, 12.5]] {
                assert_eq!(
                    map.at(p),
                    reference.at(p),
                    "{descr} fortran {fortran} at {p:?}"
                );
            }
        }
        let err = FieldMap::from_npy_bytes(
            &npy_bytes("<f8", false, &[4, 6, 3], &values),
            [0.0; 3],
            [1.0; 3],
        )
        .unwrap_err();
        assert!(matches!(err, FieldMapError::WrongShape(_)), "{err}");
        let mut ints = npy_bytes("<f4", false, &shape, &values);
        let at = ints.windows(3).position(|w| w == b"<f4").unwrap();
        ints[at..at + 3].copy_from_slice(b"<i4");
        let err = FieldMap::from_npy_bytes(&ints, [0.0; 3], [1.0; 3]).unwrap_err();
        assert!(err.to_string().contains("not float32 or float64"), "{err}");
    }

    /// A slice's bilinear interpolation is the map's trilinear one at the slice's z,
    /// inside the grid and clamped outside it.
    #[test]
    fn slices_interpolate_as_the_map_at_their_z() {
        let dims = [5, 4, 6];
        let mut nodes = Vec::new();
        for ix in 0..dims[0] {
            for iy in 0..dims[1] {
                for iz in 0..dims[2] {
                    let (x, y, z) = (ix as f32, iy as f32, iz as f32);
                    nodes.push([0.1 * x * z - 0.2 * y, 1.0 + 0.05 * x * y * z, 0.3 * z * z]);
                }
            }
        }
        let map = FieldMap::new(dims, [-100.0, -50.0, 10.0], [50.0, 40.0, 30.0], nodes).unwrap();
        let zs = [-20.0, 10.0, 47.5, 100.0, 171.0, 400.0];
        let s = map.slices(&zs);
        assert_eq!((s.len(), s.dims), (zs.len(), [5, 4]));
        for (k, &z) in zs.iter().enumerate() {
            for &(x, y) in &[
                (-100.0, -50.0),
                (-37.5, 11.0),
                (12.3, 77.7),
                (99.0, 69.0),
                (-400.0, 300.0),
                (1e9, -1e9),
            ] {
                let m = map.at([x, y, z]);
                let a = s.at_f64(k, x, y);
                let b = s.at_f32(k, x as f32, y as f32);
                for j in 0..3 {
                    assert!(
                        (a[j] - m[j]).abs() < 1e-12 * (1.0 + m[j].abs()),
                        "{k} {x} {y}"
                    );
                    assert!((b[j] as f64 - m[j]).abs() < 1e-5 * (1.0 + m[j].abs()));
                }
            }
        }
        // NaN positions read the first cell, as the map's lookups do.
        assert_eq!(s.at_f32(1, f32::NAN, f32::NAN), s.at_f32(1, -1e9, -1e9));
    }

    /// Lookups four at a time are the single lookups, bit for bit: inside the grid, on
    /// its nodes and last nodes, clamped outside it and at NaN.
    #[test]
    fn many_lookups_are_the_single_lookups_bit_for_bit() {
        let dims = [4, 5, 3];
        let nodes = (0..dims[0] * dims[1] * dims[2])
            .map(|k| {
                let v = k as f32;
                [0.013 * v - 0.2, (0.37 * v).sin(), 1.0 / (1.0 + v)]
            })
            .collect();
        let map = FieldMap::new(dims, [-60.0, -40.0, 100.0], [40.0, 20.0, 25.0], nodes).unwrap();
        let mut pos = vec![
            [-60.0, -40.0, 100.0],
            [-13.7, 2.9, 121.1],
            [60.0, 40.0, 150.0],
            [59.999, 39.99, 149.9],
            [1e6, -1e6, 20.0],
            [f64::NAN, 0.3, 130.0],
            [-60.0, -40.0, f64::NAN],
            [20.0, 0.0, 125.0],
        ];
        for k in 0..41 {
            let t = k as f64 * 0.731;
            pos.push([-70.0 + 3.3 * t, -45.0 + 2.1 * t, 95.0 + 1.6 * t]);
        }
        let mut out = vec![[0.0; 3]; pos.len()];
        map.at_many(&pos, &mut out);
        for (p, o) in pos.iter().zip(&out) {
            assert_eq!(o.map(f64::to_bits), map.at(*p).map(f64::to_bits), "{p:?}");
        }
    }
}
