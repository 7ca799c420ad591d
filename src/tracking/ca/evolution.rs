//! Evolution of the cellular automaton: every triplet starts at level 1; a triplet's level
//! becomes 1 + the highest level of its left neighbours, iterated until nothing changes.
//! Triplets are stored by the plane of their middle hit, so every left neighbour of a
//! triplet is stored before it: one sweep in storage order
//! reaches the fixed point (the GPU iterates the same rule in parallel, at most once per
//! plane). A neighbour list that breaks this order (not made by
//! [`super::neighbours::find_neighbours`]) falls back to repeated sweeps.

use super::CaBuffers;

/// Fills `buf.level`; returns the number of sweeps made.
pub fn evolve(buf: &mut CaBuffers, n_planes: usize) -> usize {
    let n = buf.triplets.len();
    buf.level.clear();
    buf.level.resize(n, 1);
    let max_sweeps = n_planes.max(1) + 1;
    let mut sweeps = 0;
    loop {
        sweeps += 1;
        let mut changed = false;
        let mut ordered = true;
        for t in 0..n {
            let (s, e) = (buf.left_start[t] as usize, buf.left_start[t + 1] as usize);
            let mut best = 0u16;
            for &l in &buf.left[s..e] {
                ordered &= (l as usize) < t;
                best = best.max(buf.level[l as usize]);
            }
            let lv = best.saturating_add(1);
            if lv != buf.level[t] {
                buf.level[t] = lv;
                changed = true;
            }
        }
        if ordered || !changed || sweeps >= max_sweeps {
            return sweeps;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::ca::Triplet;

    fn buffers(left: &[&[u32]]) -> CaBuffers {
        let mut b = CaBuffers {
            triplets: vec![Triplet::default(); left.len()],
            ..Default::default()
        };
        for l in left {
            b.left_start.push(b.left.len() as u32);
            b.left.extend_from_slice(l);
        }
        b.left_start.push(b.left.len() as u32);
        b
    }

    #[test]
    fn levels_in_storage_order_take_one_sweep() {
        // 0 <- 1 <- 2 <- 3, and 4 alone with left neighbours 0 and 2.
        let mut b = buffers(&[&[], &[0], &[1], &[2], &[0, 2]]);
        assert_eq!(evolve(&mut b, 8), 1);
        assert_eq!(b.level, vec![1, 2, 3, 4, 4]);
    }

    #[test]
    fn out_of_order_neighbours_are_swept_to_the_fixed_point() {
        // 0 has left neighbour 1, which has left neighbour 2: stored downstream first.
        let mut b = buffers(&[&[1], &[2], &[]]);
        let sweeps = evolve(&mut b, 8);
        assert_eq!(b.level, vec![3, 2, 1]);
        assert!(sweeps >= 3, "{sweeps}");
    }
}
