//! Candidates: from every triplet that is nobody's left neighbour (the downstream end of a
//! chain) with a level high enough for `min_hits`, follow the left neighbours of one level
//! lower (best kink chi-square first) to the upstream end. All candidates are Kalman fitted;
//! those with a good fit are then taken longest first and best chi-square per degree of
//! freedom first, each hit used once.

use super::{CaBuffers, Candidate};
use crate::tracking::kalman::{FitHit, FitOutput, KalmanFitter, LANES};
use crate::tracking::reco::FinderConfig;

/// Fills `buf.candidates` and `buf.candidate_hits` (sorted-hit indices, upstream first).
pub fn extract_candidates(cfg: &FinderConfig, buf: &mut CaBuffers) {
    buf.candidates.clear();
    buf.candidate_hits.clear();
    let min_level = cfg.min_hits.saturating_sub(2).max(1) as u16;
    let n = buf.triplets.len();
    let max_hits_total = buf
        .candidate_hits
        .capacity()
        .max(cfg.limits.max_candidates * 4);
    for t in 0..n {
        if buf.has_right[t] || buf.level[t] < min_level {
            continue;
        }
        if buf.candidates.len() == cfg.limits.max_candidates
            || buf.candidate_hits.len() + buf.level[t] as usize + 2 > max_hits_total
        {
            buf.overflow.candidates += 1;
            continue;
        }
        let start = buf.candidate_hits.len();
        let tr = buf.triplets[t];
        let right = buf.doublets[tr.right as usize];
        buf.candidate_hits.push(right.b);
        buf.candidate_hits.push(right.a);
        buf.candidate_hits.push(buf.doublets[tr.left as usize].a);
        let mut chi2 = tr.chi2;
        let mut cur = t;
        while buf.level[cur] > 1 {
            let want = buf.level[cur] - 1;
            let (s, e) = (
                buf.left_start[cur] as usize,
                buf.left_start[cur + 1] as usize,
            );
            let mut best: Option<(usize, f32)> = None;
            for &l in &buf.left[s..e] {
                let l = l as usize;
                if buf.level[l] != want {
                    continue;
                }
                let c = buf.triplets[l].chi2;
                if best.is_none_or(|(_, bc)| c < bc) {
                    best = Some((l, c));
                }
            }
            let Some((l, c)) = best else { break };
            chi2 += c;
            buf.candidate_hits
                .push(buf.doublets[buf.triplets[l].left as usize].a);
            cur = l;
        }
        buf.candidate_hits[start..].reverse();
        let len = buf.candidate_hits.len() - start;
        buf.candidates.push(Candidate {
            start: start as u32,
            len: len as u16,
            chi2,
            ndf: 0,
            fit: 0,
        });
    }
}

/// Fits every candidate (single-precision lanes) into `buf.fits`; a candidate whose fit
/// fails the `max_chi2_ndf` cut is given a second chance without its last hit and without
/// its first hit (a chain extended by a noise hit or another particle's hit at one end),
/// when that leaves `min_hits`.
pub fn fit_candidates(cfg: &FinderConfig, fitter: &KalmanFitter, buf: &mut CaBuffers) {
    buf.fit_hits.clear();
    buf.fits.clear();
    fit_range(fitter, buf, 0);
    let n0 = buf.candidates.len();
    for k in 0..n0 {
        let c = buf.candidates[k];
        let good = c.ndf > 0 && (c.chi2 / c.ndf as f32) as f64 <= cfg.max_chi2_ndf;
        if good || (c.len as usize) <= cfg.min_hits.max(3) {
            continue;
        }
        for (skip_first, skip_last) in [(0usize, 1usize), (1, 0)] {
            if buf.candidates.len() == cfg.limits.max_candidates
                || buf.candidate_hits.len() + c.len as usize > buf.candidate_hits.capacity()
            {
                buf.overflow.candidates += 1;
                continue;
            }
            let start = buf.candidate_hits.len();
            let (s, e) = (
                c.start as usize + skip_first,
                c.start as usize + c.len as usize - skip_last,
            );
            buf.candidate_hits.extend_from_within(s..e);
            buf.candidates.push(Candidate {
                start: start as u32,
                len: (e - s) as u16,
                chi2: 0.0,
                ndf: 0,
                fit: 0,
            });
        }
    }
    fit_range(fitter, buf, n0);
}

/// Fits candidates `from..` (appending to `buf.fit_hits` and `buf.fits`).
fn fit_range(fitter: &KalmanFitter, buf: &mut CaBuffers, from: usize) {
    let hits_from = buf.fit_hits.len();
    for &h in &buf.candidate_hits[hits_from..] {
        let h = h as usize;
        buf.fit_hits.push(FitHit {
            plane: buf.hits.plane[h],
            x_mm: buf.hits.x_mm[h],
            y_mm: buf.hits.y_mm[h],
        });
    }
    let n = buf.candidates.len();
    buf.fits.resize(n, FitOutput::default());
    let mut i = from;
    while i < n {
        let m = (n - i).min(LANES);
        let empty: &[FitHit] = &[];
        let mut slices: [&[FitHit]; LANES] = [empty; LANES];
        for k in 0..m {
            let c = &buf.candidates[i + k];
            slices[k] = &buf.fit_hits[c.start as usize..c.start as usize + c.len as usize];
        }
        fitter.fit_lanes::<f32, LANES>(&slices[..m], &mut buf.fits[i..i + m]);
        i += m;
    }
    for k in from..n {
        let f = &buf.fits[k];
        let c = &mut buf.candidates[k];
        c.fit = k as u32;
        c.ndf = f.ndf;
        c.chi2 = if f.ok && f.ndf > 0 {
            f.chi2 as f32
        } else {
            f32::INFINITY
        };
    }
}

/// Chooses candidates: good fit (`max_chi2_ndf`), at least `min_hits`, longest first, then
/// lowest chi-square per degree of freedom, none of whose hits is already used. Fills
/// `buf.accepted` and marks the hits used.
pub fn select_candidates(cfg: &FinderConfig, buf: &mut CaBuffers) {
    buf.order.clear();
    for (k, c) in buf.candidates.iter().enumerate() {
        if (c.len as usize) >= cfg.min_hits
            && c.ndf > 0
            && (c.chi2 / c.ndf as f32) as f64 <= cfg.max_chi2_ndf
        {
            buf.order.push(k as u32);
        }
    }
    let cands = &buf.candidates;
    buf.order.sort_unstable_by(|&a, &b| {
        let (ca, cb) = (&cands[a as usize], &cands[b as usize]);
        cb.len
            .cmp(&ca.len)
            .then((ca.chi2 / ca.ndf as f32).total_cmp(&(cb.chi2 / cb.ndf as f32)))
            .then(a.cmp(&b))
    });
    buf.accepted.clear();
    for &k in &buf.order {
        let c = &buf.candidates[k as usize];
        let hits = &buf.candidate_hits[c.start as usize..c.start as usize + c.len as usize];
        if hits.iter().any(|&h| buf.hits.used[h as usize]) {
            continue;
        }
        if buf.accepted.len() == cfg.limits.max_tracks {
            buf.overflow.tracks += 1;
            continue;
        }
        for &h in hits {
            buf.hits.used[h as usize] = true;
        }
        buf.accepted.push(k);
    }
}
