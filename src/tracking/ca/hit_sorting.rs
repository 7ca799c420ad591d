//! Hit sorting and binning: the event's hits ordered by plane, within a plane by cell of a
//! regular x-y grid and within a cell by x, so every grid row of a plane is sorted by x and
//! a search window is, per row it overlaps, one contiguous index range (the cells between
//! its columns; [`super::doublets::scan_box`]). Counting sort in two passes and an
//! insertion sort per cell (a few hits), no allocation.

use super::{CaBuffers, FinderGeometry, SortedHits};
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
    let hit_bin = &mut buf.hit_bin;
    hit_bin.clear();
    let mut accepted = 0usize;
    for h in input {
        let p = h.plane as usize;
        if p >= n_planes || !h.x_mm.is_finite() || !h.y_mm.is_finite() {
            buf.overflow.bad_hits += 1;
            hit_bin.push(u32::MAX);
            continue;
        }
        if accepted == max_hits {
            buf.overflow.hits += 1;
            hit_bin.push(u32::MAX);
            continue;
        }
        accepted += 1;
        let b = geo.bin(p, h.x_mm, h.y_mm);
        hit_bin.push(b as u32);
        counts[b + 1] += 1;
    }
    // Prefix sums: bin_start[b] = first slot of bin b.
    let mut acc = 0u32;
    for c in counts.iter_mut() {
        acc += *c;
        *c = acc;
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
    for (i, (h, &b)) in input.iter().zip(buf.hit_bin.iter()).enumerate() {
        if b == u32::MAX {
            continue;
        }
        let b = b as usize;
        let slot = counts[b] as usize;
        counts[b] += 1;
        sh.x_mm[slot] = h.x_mm;
        sh.y_mm[slot] = h.y_mm;
        sh.plane[slot] = h.plane;
        sh.input_index[slot] = i as u32;
    }
    // Each cell by x (insertion sort moving the four arrays together; ties keep input order).
    for b in 0..geo.n_bins {
        let (s, e) = (sh.bin_start[b] as usize, sh.bin_start[b + 1] as usize);
        for i in (s + 1)..e {
            let (x, y, p, ii) = (sh.x_mm[i], sh.y_mm[i], sh.plane[i], sh.input_index[i]);
            let mut j = i;
            while j > s && sh.x_mm[j - 1] > x {
                sh.x_mm[j] = sh.x_mm[j - 1];
                sh.y_mm[j] = sh.y_mm[j - 1];
                sh.plane[j] = sh.plane[j - 1];
                sh.input_index[j] = sh.input_index[j - 1];
                j -= 1;
            }
            sh.x_mm[j] = x;
            sh.y_mm[j] = y;
            sh.plane[j] = p;
            sh.input_index[j] = ii;
        }
    }
}

/// Copies the hits of `sh` not used yet into `out`, in the same order and bins
/// (`out.input_index`: the index in `sh`; none is marked used). `prefix` is scratch space
/// (the number of free hits before each hit). Branch-free: every hit is written, at the
/// slot of the next free one, and only a free hit moves the slot on.
pub fn free_hits(sh: &SortedHits, out: &mut SortedHits, prefix: &mut Vec<u32>) {
    let n = sh.x_mm.len();
    let n_bins = sh.bin_start.len().saturating_sub(1);
    out.x_mm.resize(n, 0.0);
    out.y_mm.resize(n, 0.0);
    out.plane.resize(n, 0);
    out.input_index.resize(n, 0);
    prefix.clear();
    prefix.resize(n + 1, 0);
    let (x, y, plane, index) = (
        &mut out.x_mm[..n],
        &mut out.y_mm[..n],
        &mut out.plane[..n],
        &mut out.input_index[..n],
    );
    let mut w = 0;
    for (h, before) in prefix[..n].iter_mut().enumerate() {
        *before = w as u32;
        // `w <= h < n`.
        x[w] = sh.x_mm[h];
        y[w] = sh.y_mm[h];
        plane[w] = sh.plane[h];
        index[w] = h as u32;
        w += !sh.used[h] as usize;
    }
    prefix[n] = w as u32;
    out.x_mm.truncate(w);
    out.y_mm.truncate(w);
    out.plane.truncate(w);
    out.input_index.truncate(w);
    out.bin_start.clear();
    out.bin_start.extend(
        sh.bin_start[..n_bins + 1]
            .iter()
            .map(|&s| prefix[s as usize]),
    );
    out.used.clear();
    out.used.resize(w, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::ca::cuts::FinderConfig;
    use crate::tracking::ca::doublets::scan_box;
    use crate::tracking::ca::Kernel;
    use crate::tracking::reco::synthetic::detector;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The finder's configuration, geometry and buffers for three planes of 600 x 600 mm.
    fn three_planes() -> (FinderConfig, FinderGeometry, CaBuffers) {
        let det = detector(3, [0.0; 3], 0.0, 0.01);
        let cfg = FinderConfig::from_detector(&det, 1.0);
        let geo = FinderGeometry::new(&det, &cfg);
        let buf = CaBuffers::with_limits(&cfg.limits, geo.n_bins);
        (cfg, geo, buf)
    }

    /// `n` hits uniform in `-half..half` in x and y, on the three planes in turn.
    fn uniform_hits(rng: &mut ChaCha8Rng, n: u32, half: f32) -> Vec<HitRecord> {
        (0..n)
            .map(|i| HitRecord {
                x_mm: rng.random_range(-half..half),
                y_mm: rng.random_range(-half..half),
                z_mm: 0.0,
                plane: (i % 3) as u16,
                hit_id: i,
            })
            .collect()
    }

    #[test]
    fn bins_are_the_floor_of_the_position_clamped_to_the_grid() {
        let det = detector(2, [0.0; 3], 0.0, 0.01);
        let mut cfg = FinderConfig::from_detector(&det, 1.0);
        (cfg.bins_x, cfg.bins_y) = (6, 4);
        let geo = FinderGeometry::new(&det, &cfg);
        // Planes of 600 x 600 mm: cells of 100 x 150 mm from (-300, -300).
        assert_eq!(geo.bin_xy(1, -300.0, -300.0), (0, 0));
        assert_eq!(geo.bin_xy(1, -200.5, -150.5), (0, 0));
        assert_eq!(geo.bin_xy(1, -199.5, -149.5), (1, 1));
        assert_eq!(geo.bin_xy(1, 0.0, 0.0), (3, 2));
        assert_eq!(geo.bin_xy(1, 299.9, 299.9), (5, 3));
        // The far edges and just below the near ones.
        assert_eq!(geo.bin_xy(1, 300.0, 300.0), (5, 3));
        assert_eq!(geo.bin_xy(1, -300.5, -300.1), (0, 0));
        // Outside the plane: the edge cells; not a number: the first.
        assert_eq!(geo.bin_xy(1, -1e4, 1e4), (0, 3));
        assert_eq!(geo.bin_xy(1, f32::INFINITY, f32::NEG_INFINITY), (5, 0));
        assert_eq!(geo.bin_xy(1, f32::NAN, 1e30), (0, 3));
        assert_eq!(geo.bin(1, 0.0, 0.0), geo.planes[1].bin_offset + 2 * 6 + 3);
    }

    #[test]
    fn window_boxes_find_exactly_the_hits_inside() {
        let (cfg, geo, mut buf) = three_planes();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let hits = uniform_hits(&mut rng, 3000, 320.0);
        sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
        let sh = &buf.hits;
        assert_eq!(sh.x_mm.len(), 3000);
        // Every hit once, on its plane, rows sorted by x.
        let mut seen: Vec<u32> = sh.input_index.clone();
        seen.sort_unstable();
        assert!(seen.iter().enumerate().all(|(i, &h)| h == i as u32));
        for (k, &h) in sh.input_index.iter().enumerate() {
            assert_eq!(sh.plane[k], hits[h as usize].plane);
        }
        let g = &geo.planes[1];
        for row in 0..g.bins_y {
            let r = g.bin_offset + row * g.bins_x;
            let (s, e) = (
                sh.bin_start[r] as usize,
                sh.bin_start[r + g.bins_x] as usize,
            );
            assert!(sh.x_mm[s..e].windows(2).all(|w| w[0] <= w[1]), "row {row}");
        }
        // Boxes of all sizes (a grid cell, a few rows, most of the plane, off the plane)
        // give exactly the hits inside, in sorted order, with both kernels.
        for bx in [
            [-37.5f32, 12.25, 40.0, 47.0],
            [-0.3, 0.2, -0.1, 0.1],
            [-250.0, 250.0, -5.0, 5.0],
            [-280.0, 280.0, -280.0, 280.0],
            [400.0, 500.0, 0.0, 10.0],
        ] {
            let want: Vec<usize> = (0..sh.x_mm.len())
                .filter(|&k| {
                    sh.plane[k] == 1
                        && sh.x_mm[k] >= bx[0]
                        && sh.x_mm[k] <= bx[1]
                        && sh.y_mm[k] >= bx[2]
                        && sh.y_mm[k] <= bx[3]
                })
                .collect();
            let mut got = Vec::new();
            scan_box::<false>(&geo, sh, 1, bx, &mut |k| got.push(k));
            got.sort_unstable();
            assert_eq!(got, want, "{bx:?}");
            if Kernel::detect() == Kernel::Avx2 {
                let mut got = Vec::new();
                #[cfg(target_arch = "x86_64")]
                scan_box::<true>(&geo, sh, 1, bx, &mut |k| got.push(k));
                got.sort_unstable();
                assert_eq!(got, want, "{bx:?}, AVX2");
            }
        }
    }

    #[test]
    fn the_copy_of_the_free_hits_keeps_their_order_and_bins() {
        let (cfg, geo, mut buf) = three_planes();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let hits = uniform_hits(&mut rng, 2000, 300.0);
        sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
        for u in buf.hits.used.iter_mut() {
            *u = rng.random_bool(0.8);
        }
        // Twice: the second copy reuses the first one's storage.
        for _ in 0..2 {
            free_hits(&buf.hits, &mut buf.free_hits, &mut buf.scratch_u32);
            let (sh, fh) = (&buf.hits, &buf.free_hits);
            let want: Vec<u32> = (0..sh.x_mm.len() as u32)
                .filter(|&h| !sh.used[h as usize])
                .collect();
            assert_eq!(fh.input_index, want);
            assert!(want.len() > 300 && want.len() < 500, "{}", want.len());
            assert_eq!(fh.used, vec![false; want.len()]);
            for (k, &h) in fh.input_index.iter().enumerate() {
                let h = h as usize;
                assert_eq!(
                    (fh.x_mm[k], fh.y_mm[k], fh.plane[k]),
                    (sh.x_mm[h], sh.y_mm[h], sh.plane[h])
                );
            }
            // Each bin holds the free hits of the same bin of `sh`.
            assert_eq!(fh.bin_start.len(), sh.bin_start.len());
            for b in 0..geo.n_bins {
                let got = &fh.input_index[fh.bin_start[b] as usize..fh.bin_start[b + 1] as usize];
                assert!(got
                    .iter()
                    .all(|&h| h >= sh.bin_start[b] && h < sh.bin_start[b + 1]));
            }
            assert_eq!(*fh.bin_start.last().unwrap() as usize, want.len());
        }
    }

    #[test]
    fn dense_cells_are_sorted_by_x_with_ties_in_input_order() {
        let (cfg, geo, mut buf) = three_planes();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // Most hits in a few cells near the centre, on a coarse x raster (ties, -0 and +0).
        let hits: Vec<HitRecord> = (0..4000)
            .map(|i| {
                let x = (rng.random_range(-40i32..40) as f32) * 0.25;
                HitRecord {
                    x_mm: if x == 0.0 && i % 2 == 0 { -0.0 } else { x },
                    y_mm: rng.random_range(-3.0..3.0),
                    z_mm: 0.0,
                    plane: (i % 3) as u16,
                    hit_id: i,
                }
            })
            .collect();
        sort_hits(&geo, &hits, cfg.limits.max_hits, &mut buf);
        let sh = &buf.hits;
        let mut dense = 0;
        for b in 0..geo.n_bins {
            let (s, e) = (sh.bin_start[b] as usize, sh.bin_start[b + 1] as usize);
            dense += (e - s > 16) as usize;
            for k in s..e {
                let h = &hits[sh.input_index[k] as usize];
                assert_eq!(
                    (sh.x_mm[k], sh.y_mm[k], sh.plane[k]),
                    (h.x_mm, h.y_mm, h.plane)
                );
                assert_eq!(geo.bin(h.plane as usize, h.x_mm, h.y_mm), b);
            }
            for k in (s + 1)..e {
                let (x0, x1) = (sh.x_mm[k - 1], sh.x_mm[k]);
                assert!(x0 < x1 || (x0 == x1 && sh.input_index[k - 1] < sh.input_index[k]));
            }
        }
        assert!(dense > 3, "{dense}");
        assert_eq!(sh.x_mm.len(), hits.len());
    }
}
