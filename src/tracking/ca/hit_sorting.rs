//! Hit sorting and binning: the event's hits ordered by plane and, within a plane, by cell
//! of a regular x-y grid, so a search window on a plane is a few contiguous index ranges
//! (one per grid row). Counting sort in two passes, no allocation.

use super::{CaBuffers, FinderGeometry};
use crate::frame::HitRecord;

/// Sorts `input` into `buf.hits`; hits with an unknown plane or non-finite coordinates are
/// refused (counted in `overflow.bad_hits`), hits beyond `max_hits` are dropped (counted in
/// `overflow.hits`).
pub fn sort_hits(geo: &FinderGeometry, input: &[HitRecord], max_hits: usize, buf: &mut CaBuffers) {
    let n_planes = geo.planes.len();
    let sh = &mut buf.hits;
    let counts = &mut buf.scratch_u32;
    counts.clear();
    counts.resize(geo.n_bins + 1, 0);
    let mut accepted = 0usize;
    for h in input {
        let p = h.plane as usize;
        if p >= n_planes || !h.x_mm.is_finite() || !h.y_mm.is_finite() {
            buf.overflow.bad_hits += 1;
            continue;
        }
        if accepted == max_hits {
            buf.overflow.hits += 1;
            continue;
        }
        accepted += 1;
        counts[geo.bin(p, h.x_mm, h.y_mm) + 1] += 1;
    }
    // Prefix sums: bin_start[b] = first slot of bin b.
    for b in 0..geo.n_bins {
        counts[b + 1] += counts[b];
    }
    sh.bin_start.clear();
    sh.bin_start.extend_from_slice(counts);
    sh.x_mm.clear();
    sh.x_mm.resize(accepted, 0.0);
    sh.y_mm.clear();
    sh.y_mm.resize(accepted, 0.0);
    sh.plane.clear();
    sh.plane.resize(accepted, 0);
    sh.input_index.clear();
    sh.input_index.resize(accepted, 0);
    sh.used.clear();
    sh.used.resize(accepted, false);
    // Second pass: place (counts[b] is now the next free slot of bin b).
    let mut taken = 0usize;
    for (i, h) in input.iter().enumerate() {
        let p = h.plane as usize;
        if p >= n_planes || !h.x_mm.is_finite() || !h.y_mm.is_finite() {
            continue;
        }
        if taken == accepted {
            break;
        }
        taken += 1;
        let b = geo.bin(p, h.x_mm, h.y_mm);
        let slot = counts[b] as usize;
        counts[b] += 1;
        sh.x_mm[slot] = h.x_mm;
        sh.y_mm[slot] = h.y_mm;
        sh.plane[slot] = h.plane;
        sh.input_index[slot] = i as u32;
    }
}

/// Calls `f(first, end)` for the sorted-hit index ranges of plane `p` inside the box
/// `[x0, x1] x [y0, y1]` (bins overlapping the box; callers check the exact window).
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn for_each_range(
    geo: &FinderGeometry,
    bin_start: &[u32],
    p: usize,
    x0: f32,
    x1: f32,
    y0: f32,
    y1: f32,
    mut f: impl FnMut(usize, usize),
) {
    let g = &geo.planes[p];
    if !(x0 <= x1 && y0 <= y1) {
        return; // empty or not a number
    }
    // A box outside the plane still looks at the edge bins, where off-plane hits are.
    let (bx0, by0) = geo.bin_xy(p, x0, y0);
    let (bx1, by1) = geo.bin_xy(p, x1, y1);
    for by in by0..=by1 {
        let row = g.bin_offset + by * g.bins_x;
        let first = bin_start[row + bx0] as usize;
        let end = bin_start[row + bx1 + 1] as usize;
        if first < end {
            f(first, end);
        }
    }
}
