//! Lock-free single-producer/single-consumer rings and the frame slots that travel in them.
//!
//! Every source owns a fixed pool of [`Slot`]s allocated at start-up. A slot goes
//! source -> worker (filled with a frame) -> decision thread (with its verdict) and back to
//! the source through a return ring, so the hot path never allocates: the number of frames
//! in flight per source is bounded by its pool. Rings are `ringbuf`'s SPSC ring; `bench/rings.rs`
//! measures it against `rtrb` on this workload (numbers in `bench/RESULTS.md`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::{HeapCons, HeapProd, HeapRb};

/// Sending half of an SPSC ring. Never blocks: a full ring hands the item back.
pub struct Tx<T> {
    inner: HeapProd<T>,
    len: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

/// Receiving half of an SPSC ring.
pub struct Rx<T> {
    inner: HeapCons<T>,
    len: Arc<AtomicUsize>,
}

/// An observer of a ring's fill level, for metrics (may be read from any thread): the
/// current level and the peak since the last [`Fill::take_max`], so a burst between two
/// scrapes is seen.
#[derive(Clone, Debug)]
pub struct Fill {
    len: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    capacity: usize,
}

impl Fill {
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
    /// The largest level since the previous call (or creation); starts a new peak at the
    /// current level.
    pub fn take_max(&self) -> usize {
        let now = self.len();
        self.max.swap(now, Ordering::Relaxed).max(now)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn ratio(&self) -> f64 {
        self.len() as f64 / self.capacity as f64
    }
}

/// Creates a ring of `capacity` items (at least 1).
pub fn channel<T>(capacity: usize) -> (Tx<T>, Rx<T>, Fill) {
    let capacity = capacity.max(1);
    let (p, c) = HeapRb::<T>::new(capacity).split();
    let len = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    (
        Tx {
            inner: p,
            len: len.clone(),
            max: max.clone(),
        },
        Rx {
            inner: c,
            len: len.clone(),
        },
        Fill { len, max, capacity },
    )
}

impl<T> Tx<T> {
    /// Pushes `item`, or returns it if the ring is full.
    #[inline]
    pub fn try_push(&mut self, item: T) -> Result<(), T> {
        self.inner.try_push(item)?;
        let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
        // A plain load first: the peak rarely moves, and a load does not contend.
        if len > self.max.load(Ordering::Relaxed) {
            self.max.fetch_max(len, Ordering::Relaxed);
        }
        Ok(())
    }
    pub fn is_full(&self) -> bool {
        self.inner.is_full()
    }
}

impl<T> Rx<T> {
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        let item = self.inner.try_pop()?;
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some(item)
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

/// One frame in flight: its bytes (capacity fixed at start-up, grown only for a frame larger
/// than any before it), where and when it arrived.
pub struct Slot {
    pub bytes: Vec<u8>,
    /// Index of the input (source) the frame came from.
    pub source: u16,
    pub arrival: Instant,
    /// The input's name for this delivery, acknowledged once the decision is written (a
    /// NATS stream sequence); 0: nothing to acknowledge.
    pub delivery: u64,
}

impl Slot {
    pub fn with_capacity(bytes: usize, source: u16) -> Box<Slot> {
        Box::new(Slot {
            bytes: Vec::with_capacity(bytes),
            source,
            arrival: Instant::now(),
            delivery: 0,
        })
    }
    /// Copies `frame` into the slot, reusing its buffer.
    #[inline]
    pub fn fill(&mut self, frame: &[u8], arrival: Instant) {
        self.bytes.clear();
        self.bytes.extend_from_slice(frame);
        self.arrival = arrival;
        self.delivery = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ring_hands_the_item_back_and_fill_tracks_length() {
        let (mut tx, mut rx, fill) = channel::<u32>(2);
        assert!(tx.try_push(1).is_ok());
        assert!(tx.try_push(2).is_ok());
        assert_eq!(tx.try_push(3), Err(3));
        assert_eq!(fill.len(), 2);
        assert_eq!(fill.ratio(), 1.0);
        assert_eq!(rx.try_pop(), Some(1));
        assert_eq!(fill.len(), 1);
        assert_eq!(rx.try_pop(), Some(2));
        assert_eq!(rx.try_pop(), None);
        assert!(fill.is_empty());
        // The burst to 2 is remembered once, then the peak restarts at the current level.
        assert_eq!(fill.take_max(), 2);
        assert_eq!(fill.take_max(), 0);
        tx.try_push(4).unwrap();
        rx.try_pop();
        assert_eq!(fill.take_max(), 1);
    }

    #[test]
    fn items_cross_threads_in_order() {
        let (mut tx, mut rx, _) = channel::<u64>(8);
        let n = 100_000u64;
        let t = std::thread::spawn(move || {
            for i in 0..n {
                let mut v = i;
                while let Err(back) = tx.try_push(v) {
                    v = back;
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0;
        while next < n {
            if let Some(v) = rx.try_pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        t.join().unwrap();
    }

    #[test]
    fn slot_reuses_its_buffer() {
        let mut s = Slot::with_capacity(64, 0);
        let p = s.bytes.as_ptr();
        s.fill(&[1, 2, 3], Instant::now());
        s.fill(&[4; 60], Instant::now());
        assert_eq!(s.bytes.as_ptr(), p);
        assert_eq!(s.bytes.len(), 60);
    }
}
