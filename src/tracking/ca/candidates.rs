//! Candidates: from every triplet that is nobody's left neighbour (the downstream end of a
//! chain) with a level high enough for `min_hits`, follow the left neighbours of one level
//! lower to the upstream end, each time the one with the best score (its kink chi-square
//! plus the chi-square of its q/p against the q/p the chain has measured so far,
//! [`ChainQop`]: where two particles' segments come close, the one that continues the
//! same momentum; plus the best such score one step further, [`lookahead_score`]: the
//! one whose chain goes on smoothly), and where two neighbours were
//! as good (scores within [`FORK_CHI2`]) also the chain through the other one at
//! the closest such step, so that the fits choose between them (close pairs of particles
//! whose straight segments fit either continuation, as across a magnet with field-free
//! planes upstream); chains are taken longest first,
//! Kalman fitted in chunks and accepted best chi-square per degree of freedom first, each
//! hit used once (hits a better track took are left out and the rest refitted; a failed
//! fit gets a second chance without an end hit). A second round
//! ([`FinderConfig::divert_chains`]) walks the chains again from the end triplets whose
//! hits are all still free, choosing at each step among the left neighbours whose hit is
//! free: in a dense event a particle's own upstream hit is often second to another
//! particle's, which a better track then takes, leaving the chain too short. Only the
//! chains that left such a taken hit are fitted again (the others are the first round's).

// Lane loops index several structure-of-arrays quantities in lockstep (what LLVM
// vectorises); iterator chains over one of them would hide that.
#![allow(clippy::needless_range_loop)]

use super::cuts::FinderConfig;
use super::{CaBuffers, Candidate, Triplet};
use crate::tracking::kalman::{FitHit, FitOutput, KalmanFitter, SeedFields, LANES};

/// An unsigned key in the order of [`f32::total_cmp`].
#[inline]
fn total_key(x: f32) -> u32 {
    let b = x.to_bits() as i32;
    ((b ^ ((((b >> 31) as u32) >> 1) as i32)) as u32) ^ 0x8000_0000
}

/// Number of candidates fitted together before the greedy choice among them. The choice
/// ranks a chunk's candidates against each other, but takes a chunk's tracks before the
/// next chunk's chains are built: a chain of an earlier chunk that took hits of a better
/// chain of a later one is never outranked. So the chunk spans many end triplets: in busy
/// events with thick planes, 256 found up to 1.3 % more of the particles than 64, with
/// fewer ghosts, for about 1 % more work.
pub(crate) const CHUNK: usize = 256;

/// Extracts, fits and chooses candidates in one greedy pass: end triplets (nobody's left
/// neighbour, level high enough for `min_hits`) ordered by level (longest first) then kink
/// chi-square; each one's chain is built unless it touches a hit already used; chains are
/// Kalman fitted in chunks of [`CHUNK`] and accepted best first when the fit passes
/// `max_chi2_ndf` and their hits are still free. Tracks need `min_hits` hits (at least 3).
/// Fills `buf.candidates`, `buf.candidate_hits`, `buf.fits` and `buf.accepted`, after what
/// they hold when `append` (a second pass on the hits left), from scratch otherwise;
/// returns the time spent fitting, ns.
pub fn extract_and_select(
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    buf: &mut CaBuffers,
    min_hits: usize,
    append: bool,
) -> u64 {
    if !append {
        buf.candidates.clear();
        buf.candidate_hits.clear();
        buf.fit_hits.clear();
        buf.fits.clear();
        buf.seed_fields.clear();
        buf.accepted.clear();
    }
    let min_hits = min_hits.max(3);
    let min_level = (min_hits - 2) as u16;
    buf.order.clear();
    for t in 0..buf.triplets.len() {
        if !buf.has_right[t] && buf.level[t] >= min_level {
            if buf.order.len() == buf.order.capacity() {
                buf.overflow.candidates += 1;
                continue;
            }
            buf.order.push(t as u32);
        }
    }
    // Longest first, then by kink chi-square (`total_cmp`), then by index: one integer key
    // (chi-square, index) per end triplet, sorted, then placed by level (a counting sort,
    // stable: levels are few).
    let keys = &mut buf.order_keys;
    keys.clear();
    let mut max_level = 0;
    keys.extend(buf.order.iter().map(|&t| {
        max_level = max_level.max(buf.level[t as usize]);
        (total_key(buf.triplets[t as usize].chi2) as u64) << 32 | t as u64
    }));
    keys.sort_unstable();
    let level = |k: u64| buf.level[k as u32 as usize];
    if (max_level as usize) < MAX_CHAIN {
        // Position of each level's first end triplet, longest first.
        let mut first = [0u32; MAX_CHAIN + 1];
        for &k in keys.iter() {
            first[max_level as usize - level(k) as usize + 1] += 1;
        }
        for b in 1..first.len() {
            first[b] += first[b - 1];
        }
        for &k in keys.iter() {
            let b = &mut first[max_level as usize - level(k) as usize];
            buf.order[*b as usize] = k as u32;
            *b += 1;
        }
    } else {
        keys.sort_unstable_by_key(|&k| (std::cmp::Reverse(level(k)), k));
        for (o, &k) in buf.order.iter_mut().zip(keys.iter()) {
            *o = k as u32;
        }
    }
    let mut fit_ns = extract_round(cfg, fitter, buf, min_hits, false);
    if cfg.divert_chains {
        // Second round: the chains that ran into hits the first round's tracks took,
        // walked again around them.
        buf.used_before.clear();
        buf.used_before.extend_from_slice(&buf.hits.used);
        fit_ns += extract_round(cfg, fitter, buf, min_hits, true);
    }
    fit_ns
}

/// One round of [`extract_and_select`] over the end triplets in `buf.order`: chains built
/// ([`build_chain`], around the hits of `buf.used_before` when `divert`), fitted in
/// chunks and chosen; returns the time spent fitting, ns.
fn extract_round(
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    buf: &mut CaBuffers,
    min_hits: usize,
    divert: bool,
) -> u64 {
    let mut fit_ns = 0u64;
    let mut pending_from = buf.candidates.len();
    let n_order = buf.order.len();
    for oi in 0..=n_order {
        if oi < n_order {
            let t = buf.order[oi] as usize;
            if buf.candidates.len() == cfg.limits.max_candidates
                || buf.candidate_hits.len() + MAX_CHAIN > buf.candidate_hits.capacity() / 2
            {
                buf.overflow.candidates += 1;
            } else {
                let (c, fork) = build_chain(buf, t, min_hits, None, divert);
                if let Some(c) = c {
                    buf.candidates.push(c);
                }
                // Where two left neighbours were as good, the chain through the other one
                // too: the fits choose.
                if let Some(fork) = fork {
                    if buf.candidates.len() < cfg.limits.max_candidates
                        && buf.candidate_hits.len() + MAX_CHAIN <= buf.candidate_hits.capacity() / 2
                    {
                        if let (Some(c), _) = build_chain(buf, t, min_hits, Some(fork), divert) {
                            buf.candidates.push(c);
                        }
                    }
                }
            }
        }
        let pending = buf.candidates.len() - pending_from;
        // `>=`: a chain and its fork can take `pending` from CHUNK - 1 past CHUNK.
        if pending >= CHUNK || (oi == n_order && pending > 0) {
            let t0 = std::time::Instant::now();
            fit_range(fitter, buf, pending_from);
            fit_ns += t0.elapsed().as_nanos() as u64;
            choose(cfg, fitter, buf, pending_from, min_hits, &mut fit_ns);
            pending_from = buf.candidates.len();
        }
    }
    fit_ns
}

/// The q/p a chain has measured so far, to choose its next left neighbour by: the
/// inverse-variance weighted mean of its triplets' q/p estimates (each a measurement of
/// the same particle's q/p with its scattering and resolution error; triplets that do not
/// measure it, without field along their tent, weigh nothing).
#[derive(Default, Clone, Copy)]
pub(crate) struct ChainQop {
    /// Sum of 1 / sigma^2.
    w: f32,
    /// Sum of q/p / sigma^2.
    wq: f32,
}

impl ChainQop {
    pub(crate) fn add(&mut self, t: &Triplet) {
        let v = t.qop_sigma * t.qop_sigma;
        if v > 0.0 {
            self.w += 1.0 / v;
            self.wq += t.qop / v;
        }
    }

    /// A left neighbour's score: its kink chi-square plus the chi-square of its q/p against
    /// the chain's (the neighbour that continues the same particle agrees in both).
    pub(crate) fn score(&self, t: &Triplet) -> f32 {
        let v = t.qop_sigma * t.qop_sigma;
        if self.w > 0.0 && v > 0.0 {
            let d = t.qop - self.wq / self.w;
            t.chi2 + d * d / (v + 1.0 / self.w)
        } else {
            t.chi2
        }
    }
}

/// Left neighbour `l`'s score for a chain whose q/p so far is `link`, looking one step
/// further: its own score ([`ChainQop::score`]) plus the best score among its own left
/// neighbours of one level lower, for the chain continued through it. A particle's own
/// next triplet and another particle's can score alike (their kinks are both within the
/// scattering, and adjacent triplets' q/p estimates share a doublet, so they scatter
/// about each other by more than either's error); the wrong one then has no good
/// continuation, since the other particle's hits go on along another trajectory, while
/// the particle's own chain goes on with small kinks. Judging each step with the next one
/// keeps the walk on its particle.
pub(crate) fn lookahead_score(buf: &CaBuffers, link: &ChainQop, l: usize) -> f32 {
    let t = &buf.triplets[l];
    let mut c = link.score(t);
    let want = buf.level[l];
    if want > 1 {
        let mut next = *link;
        next.add(t);
        let (s, e) = (buf.left_start[l] as usize, buf.left_start[l + 1] as usize);
        let mut best = f32::INFINITY;
        for &m in &buf.left[s..e] {
            let m = m as usize;
            if buf.level[m] == want - 1 {
                best = best.min(next.score(&buf.triplets[m]));
            }
        }
        if best.is_finite() {
            c += best;
        }
    }
    c
}

/// Longest chain a candidate can have (one hit per plane).
pub(crate) const MAX_CHAIN: usize = crate::tracking::kalman::MAX_PLANES;
// The choice's sort keys hold a candidate's number of hits in 8 bits and its index in
// the chunk in 24.
const _: () = assert!(MAX_CHAIN < 256 && CHUNK < 1 << 24);

/// Left neighbours whose scores ([`ChainQop::score`]) differ by less than this are as good as each
/// other (about one standard deviation of the difference of two chi-squares of two degrees
/// of freedom): the chain is built through both.
pub(crate) const FORK_CHI2: f32 = 2.0;

/// Builds the chain ending with triplet `t` into `buf.candidate_hits` (upstream first),
/// following the left neighbour of one level lower with the best score
/// ([`ChainQop::score`]), except
/// at `fork = (triplet, left neighbour)`, where it takes that neighbour; `None` (and
/// nothing kept) when it touches a used hit. Without `fork`, also returns the step where
/// the second-best neighbour came closest to the best (within [`FORK_CHI2`]), as a fork.
/// With `divert` (the second round): nothing where one of the end triplet's hits is in
/// `buf.used_before`; at each step the best neighbour whose hit is not in it (the best
/// one only where every neighbour's is); nothing where no step left a better neighbour
/// for a free one (the first round's chain, tried already).
fn build_chain(
    buf: &mut CaBuffers,
    t: usize,
    min_hits: usize,
    fork: Option<(usize, usize)>,
    divert: bool,
) -> (Option<Candidate>, Option<(usize, usize)>) {
    let start = buf.candidate_hits.len();
    let tr = buf.triplets[t];
    let right = buf.doublets[tr.right as usize];
    let end_hits = [right.b, right.a, buf.doublets[tr.left as usize].a];
    if divert && end_hits.iter().any(|&h| buf.used_before[h as usize]) {
        return (None, None);
    }
    // Whether the walk left a neighbour whose hit was taken for one whose hit was not (a
    // fork's chain is kept either way: its main chain was).
    let mut diverted = fork.is_some();
    // The chain has `level + 2` hits: when too many of the end triplet's are taken, the
    // rest cannot make a track (the common case of the other ends of an accepted track).
    let used = &buf.hits.used;
    let taken = end_hits.iter().filter(|&&h| used[h as usize]).count();
    if buf.level[t] as usize + 2 - taken < min_hits {
        return (None, None);
    }
    let mut closest: Option<(usize, usize, f32)> = None;
    buf.candidate_hits.push(right.b);
    buf.candidate_hits.push(right.a);
    buf.candidate_hits.push(buf.doublets[tr.left as usize].a);
    let mut chi2 = tr.chi2;
    let mut cur = t;
    // The chain's q/p so far: the inverse-variance weighted mean of its triplets' q/p.
    let mut link = ChainQop::default();
    link.add(&tr);
    while buf.level[cur] > 1 && buf.candidate_hits.len() - start < MAX_CHAIN {
        let want = buf.level[cur] - 1;
        let (s, e) = (
            buf.left_start[cur] as usize,
            buf.left_start[cur + 1] as usize,
        );
        let mut best: Option<(usize, f32)> = None;
        let mut second: Option<(usize, f32)> = None;
        let mut best_taken: Option<(usize, f32)> = None;
        for &l in &buf.left[s..e] {
            let l = l as usize;
            if buf.level[l] != want {
                continue;
            }
            let c = lookahead_score(buf, &link, l);
            if divert && buf.used_before[buf.doublets[buf.triplets[l].left as usize].a as usize] {
                if best_taken.is_none_or(|(_, bc)| c < bc) {
                    best_taken = Some((l, c));
                }
                continue;
            }
            if best.is_none_or(|(_, bc)| c < bc) {
                second = best;
                best = Some((l, c));
            } else if second.is_none_or(|(_, sc)| c < sc) {
                second = Some((l, c));
            }
        }
        match (best, best_taken) {
            (Some((_, c)), Some((_, ct))) if ct < c => diverted = true,
            (None, Some(_)) => best = best_taken,
            _ => {}
        }
        let Some((mut l, c)) = best else { break };
        match fork {
            Some((at, other)) if at == cur => {
                l = other;
            }
            None => {
                if let Some((l2, c2)) = second {
                    let gap = c2 - c;
                    if gap < FORK_CHI2 && closest.is_none_or(|(_, _, g)| gap < g) {
                        closest = Some((cur, l2, gap));
                    }
                }
            }
            _ => {}
        }
        chi2 += buf.triplets[l].chi2;
        link.add(&buf.triplets[l]);
        buf.candidate_hits
            .push(buf.doublets[buf.triplets[l].left as usize].a);
        cur = l;
    }
    // Hits already taken by a better track are left out (a shared hit, or one stolen by
    // a neighbour); what remains must still make a track.
    let mut w = start;
    for r in start..buf.candidate_hits.len() {
        let h = buf.candidate_hits[r];
        if !buf.hits.used[h as usize] {
            buf.candidate_hits[w] = h;
            w += 1;
        }
    }
    buf.candidate_hits.truncate(w);
    let fork = closest.map(|(at, l, _)| (at, l));
    if divert && !diverted {
        // The first round's chain: tried already.
        buf.candidate_hits.truncate(start);
        return (None, None);
    }
    if w - start < min_hits {
        buf.candidate_hits.truncate(start);
        return (None, fork);
    }
    buf.candidate_hits[start..].reverse();
    let len = buf.candidate_hits.len() - start;
    let c = Candidate {
        start: start as u32,
        len: len as u16,
        chi2,
        ndf: 0,
        fit: 0,
    };
    (Some(c), fork)
}

fn good(cfg: &FinderConfig, c: &Candidate, min_hits: usize) -> bool {
    (c.len as usize) >= min_hits && c.ndf > 0 && (c.chi2 / c.ndf as f32) as f64 <= cfg.max_chi2_ndf
}

/// Greedy choice among the fitted candidates `from..`: longest, then best chi2/ndf first;
/// a failed fit gets a second chance without its last or its first hit.
fn choose(
    cfg: &FinderConfig,
    fitter: &KalmanFitter,
    buf: &mut CaBuffers,
    from: usize,
    min_hits: usize,
    fit_ns: &mut u64,
) {
    let n = buf.candidates.len();
    // Order of this chunk: longest first, then by chi2/ndf (`total_cmp`), then by index.
    let key = |c: &Candidate| {
        if c.ndf > 0 {
            c.chi2 / c.ndf as f32
        } else {
            f32::INFINITY
        }
    };
    // As one integer per candidate, sorted: 255 less its hits, chi2/ndf, its index in the
    // chunk (at most `CHUNK + 1` candidates: 24 bits). `order_keys` is free once the end
    // triplets are in `order`.
    debug_assert!(n - from <= CHUNK + 1);
    let keys = &mut buf.order_keys;
    keys.clear();
    keys.extend(
        buf.candidates[from..]
            .iter()
            .enumerate()
            .map(|(k, c)| (255 - c.len as u64) << 56 | (total_key(key(c)) as u64) << 24 | k as u64),
    );
    keys.sort_unstable();
    buf.scratch_u32.clear();
    buf.scratch_u32
        .extend(keys.iter().map(|&k| from as u32 + (k & 0xff_ffff) as u32));
    for i in 0..buf.scratch_u32.len() {
        let k = buf.scratch_u32[i] as usize;
        let c = buf.candidates[k];
        let free = buf.candidate_hits[c.start as usize..(c.start + c.len as u32) as usize]
            .iter()
            .all(|&h| !buf.hits.used[h as usize]);
        if !free {
            // Taken hits left out (a better track of this chunk took them), refitted.
            let n_free = buf.candidate_hits[c.start as usize..(c.start + c.len as u32) as usize]
                .iter()
                .filter(|&&h| !buf.hits.used[h as usize])
                .count();
            if n_free < min_hits
                || buf.candidates.len() == cfg.limits.max_candidates
                || buf.candidate_hits.len() + c.len as usize > buf.candidate_hits.capacity()
            {
                continue;
            }
            let start = buf.candidate_hits.len();
            for r in c.start as usize..(c.start + c.len as u32) as usize {
                let h = buf.candidate_hits[r];
                if !buf.hits.used[h as usize] {
                    buf.candidate_hits.push(h);
                }
            }
            let base = buf.candidates.len();
            buf.candidates.push(Candidate {
                start: start as u32,
                len: n_free as u16,
                chi2: 0.0,
                ndf: 0,
                fit: 0,
            });
            let t0 = std::time::Instant::now();
            fit_range(fitter, buf, base);
            *fit_ns += t0.elapsed().as_nanos() as u64;
            let cb = buf.candidates[base];
            if good(cfg, &cb, min_hits) {
                accept(cfg, buf, base);
            }
            continue;
        }
        if good(cfg, &c, min_hits) {
            accept(cfg, buf, k);
            continue;
        }
        if (c.len as usize) <= min_hits {
            continue;
        }
        // Second chance: without the last hit, then without the first.
        let base = buf.candidates.len();
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
        if buf.candidates.len() > base {
            let t0 = std::time::Instant::now();
            fit_range(fitter, buf, base);
            *fit_ns += t0.elapsed().as_nanos() as u64;
            let mut best: Option<usize> = None;
            for j in base..buf.candidates.len() {
                let cj = buf.candidates[j];
                if good(cfg, &cj, min_hits)
                    && best.is_none_or(|b| {
                        cj.chi2 / (cj.ndf as f32)
                            < buf.candidates[b].chi2 / buf.candidates[b].ndf as f32
                    })
                {
                    best = Some(j);
                }
            }
            if let Some(j) = best {
                accept(cfg, buf, j);
            }
        }
    }
}

fn accept(cfg: &FinderConfig, buf: &mut CaBuffers, k: usize) {
    if buf.accepted.len() == cfg.limits.max_tracks {
        buf.overflow.tracks += 1;
        return;
    }
    let c = buf.candidates[k];
    for i in c.start as usize..(c.start + c.len as u32) as usize {
        let h = buf.candidate_hits[i] as usize;
        buf.hits.used[h] = true;
    }
    buf.accepted.push(k as u32);
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
    buf.seed_fields.resize(n, SeedFields::default());
    let mut i = from;
    while i < n {
        let m = (n - i).min(LANES);
        let empty: &[FitHit] = &[];
        let mut slices: [&[FitHit]; LANES] = [empty; LANES];
        for k in 0..m {
            let c = &buf.candidates[i + k];
            slices[k] = &buf.fit_hits[c.start as usize..c.start as usize + c.len as usize];
        }
        fitter.fit_lanes_keeping_seeds::<f32, LANES>(
            &slices[..m],
            &mut buf.fits[i..i + m],
            &mut buf.seed_fields[i..i + m],
        );
        i += m;
    }
    for k in from..n {
        let c = &mut buf.candidates[k];
        c.fit = k as u32;
        take_fit(c, &buf.fits[k]);
    }
}

/// A candidate's chi-square (infinite where its fit failed) and degrees of freedom from
/// its fit.
fn take_fit(c: &mut Candidate, f: &FitOutput) {
    c.ndf = f.ndf;
    c.chi2 = if f.ok && f.ndf > 0 {
        f.chi2 as f32
    } else {
        f32::INFINITY
    };
}

/// Fits the accepted candidates again with `fitter`, in place of their fits, from the
/// hits [`fit_range`] laid out for them, in chunks of the fit's lanes (the fits of
/// `fit_batch`): without a field, each track with its own scattering after the candidates
/// were chosen with the momentum cut's (`FinderConfig::candidate_fit`). With
/// `from_candidate_fits` (`FinderConfig::track_fit_starts_from_candidate_fit`), the
/// candidates' fits are the tracks' fit's first fits, and only its pass at their momentum
/// is made (`KalmanFitter::fit_lanes_from_first`), with the seeds' fields those fits kept
/// (`buf.seed_fields`). The candidates' fits are kept in `buf.candidate_fits`.
pub fn refit_accepted(fitter: &KalmanFitter, buf: &mut CaBuffers, from_candidate_fits: bool) {
    let n = buf.accepted.len();
    buf.candidate_fits.clear();
    buf.candidate_fits.extend(buf.accepted.iter().map(|&k| {
        (
            k,
            (&buf.fits[buf.candidates[k as usize].fit as usize]).into(),
        )
    }));
    let mut out = [FitOutput::default(); LANES];
    let mut first = [FitOutput::default(); LANES];
    let mut seeds = [SeedFields::default(); LANES];
    for c0 in (0..n).step_by(LANES) {
        let m = (n - c0).min(LANES);
        let empty: &[FitHit] = &[];
        let mut slices: [&[FitHit]; LANES] = [empty; LANES];
        for (j, s) in slices.iter_mut().take(m).enumerate() {
            let c = &buf.candidates[buf.accepted[c0 + j] as usize];
            *s = &buf.fit_hits[c.start as usize..c.start as usize + c.len as usize];
            if from_candidate_fits {
                first[j] = buf.fits[c.fit as usize];
                seeds[j] = buf.seed_fields[c.fit as usize];
            }
        }
        if from_candidate_fits {
            let (f, s) = (&first[..m], &seeds[..m]);
            fitter.fit_lanes_from_first::<f32, LANES>(&slices[..m], f, s, &mut out[..m]);
        } else {
            fitter.fit_lanes::<f32, LANES>(&slices[..m], &mut out[..m]);
        }
        for (j, o) in out.iter().take(m).enumerate() {
            let c = &mut buf.candidates[buf.accepted[c0 + j] as usize];
            buf.fits[c.fit as usize] = *o;
            take_fit(c, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triplet(qop: f32, qop_sigma: f32, chi2: f32) -> Triplet {
        Triplet {
            left: 0,
            right: 0,
            qop,
            qop_sigma,
            chi2,
        }
    }

    /// Of two left neighbours with the same kink, the one whose q/p agrees with what the
    /// chain measured scores lower, by the chi-square of the difference; triplets that
    /// measure no q/p (no field along their tent) leave the kink alone and add nothing to
    /// the chain's estimate.
    #[test]
    fn a_chain_prefers_the_neighbour_that_continues_its_momentum() {
        let mut chain = ChainQop::default();
        assert_eq!(chain.score(&triplet(0.4, 0.05, 1.5)), 1.5);
        chain.add(&triplet(0.0, 0.0, 0.3));
        assert_eq!(chain.score(&triplet(0.4, 0.05, 1.5)), 1.5);
        chain.add(&triplet(-0.10, 0.01, 0.2));
        chain.add(&triplet(-0.10, 0.01, 0.1));
        let (same, other) = (triplet(-0.09, 0.02, 0.5), triplet(0.47, 0.02, 0.5));
        let s_same = chain.score(&same);
        let s_other = chain.score(&other);
        // The chain's q/p is -0.10 +- 0.01 / sqrt(2).
        let var = 0.02f32 * 0.02 + 0.01 * 0.01 / 2.0;
        assert!(
            (s_same - (0.5 + 0.01 * 0.01 / var)).abs() < 1e-3,
            "{s_same}"
        );
        assert!(
            (s_other - (0.5 + 0.57 * 0.57 / var)).abs() < 1.0,
            "{s_other}"
        );
        assert!(s_same < s_other);
        // A triplet without a measurement is scored by its kink alone.
        assert_eq!(chain.score(&triplet(0.0, 0.0, 2.5)), 2.5);
    }

    /// The walk's case: from an end triplet, the particle's own next triplet scores a
    /// little worse than another particle's (both kinks within the scattering, the own
    /// q/p three of its standard deviations off, as adjacent triplets' estimates can be),
    /// but the other one's only continuation kinks hard while the own one's goes on
    /// smoothly: looking one step further prefers the own one. A neighbour at the chain's
    /// upstream end (level 1) has nothing further: its score alone.
    #[test]
    fn looking_one_step_further_keeps_the_walk_on_its_particle() {
        // 0: the end triplet; 1: own next, 2: other next; 3: own after 1, 4: other after 2.
        let buf = CaBuffers {
            triplets: vec![
                triplet(0.250, 0.011, 0.2),
                triplet(0.214, 0.017, 0.88),
                triplet(0.284, 0.019, 0.78),
                triplet(0.221, 0.013, 0.01),
                triplet(0.230, 0.013, 4.88),
            ],
            level: vec![3, 2, 2, 1, 1],
            left: vec![1, 2, 3, 4],
            left_start: vec![0, 2, 3, 4, 4, 4],
            ..Default::default()
        };
        let mut chain = ChainQop::default();
        chain.add(&buf.triplets[0]);
        let (own, other) = (chain.score(&buf.triplets[1]), chain.score(&buf.triplets[2]));
        assert!(other < own, "{other} {own}");
        let (own_la, other_la) = (
            lookahead_score(&buf, &chain, 1),
            lookahead_score(&buf, &chain, 2),
        );
        assert!(own_la < other_la, "{own_la} {other_la}");
        let mut through_own = chain;
        through_own.add(&buf.triplets[1]);
        assert_eq!(own_la, own + through_own.score(&buf.triplets[3]));
        assert_eq!(
            lookahead_score(&buf, &through_own, 3),
            through_own.score(&buf.triplets[3])
        );
    }

    #[test]
    fn total_key_orders_as_total_cmp() {
        let v = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-38,
            2.0,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
        ];
        for a in v {
            for b in v {
                assert_eq!(total_key(a).cmp(&total_key(b)), a.total_cmp(&b), "{a} {b}");
            }
        }
    }
}
