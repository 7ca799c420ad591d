//! A fixed set of helper threads for the EEG product on the CPU, started once with the
//! backend: the thread that owns a block runs part 0 of it and `n - 1` helpers run the
//! other parts, so a block on `n` threads costs one wake-up and one wait, and no thread
//! start or allocation (the helpers have started when `Workers::new` returns). Helpers
//! spin for a short while after each block (frames of one stream arrive every few hundred
//! microseconds at kHz rates) and then sleep until the next one.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// The work of one block: called once per part, `0..parts`, each on its own thread.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// Bumped for every block; a helper runs the block when it sees a new value.
    generation: AtomicU64,
    /// The block's work, valid while the owner waits in [`Workers::run`].
    job: AtomicPtr<Job<'static>>,
    /// Helpers done with the current block.
    done: AtomicUsize,
    /// A helper's part panicked in the current block.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Helpers that have started and wait for blocks.
    started: AtomicUsize,
}

/// Helper threads for splitting a block over `threads()` cores.
pub struct Workers {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

/// A part of a block failed (a bug, not bad input): the block's results are incomplete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an EEG worker thread panicked in its part of the block")]
pub struct PartPanicked;

impl Workers {
    /// `threads` in all, the caller included (at least 1: no helper).
    pub fn new(threads: usize, name: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            started: AtomicUsize::new(0),
        });
        let mut helpers = Vec::with_capacity(threads.saturating_sub(1));
        for part in 1..threads.max(1) {
            let mine = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("{name}-{part}"))
                .spawn(move || helper(&mine, part));
            match h {
                Ok(h) => helpers.push(h),
                Err(e) => {
                    let started = Workers { shared, helpers };
                    drop(started);
                    return Err(e);
                }
            }
        }
        // A thread allocates as it starts (its name, its thread-locals): wait until every
        // helper has, so that none of it falls into the first blocks, however late the
        // scheduler runs the new threads on a busy machine.
        while shared.started.load(Ordering::Acquire) < helpers.len() {
            std::thread::yield_now();
        }
        Ok(Self { shared, helpers })
    }

    /// Threads a block is split over, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `work(part)` for every part `0..threads()`, part 0 on the calling thread, and
    /// returns when all are done.
    pub fn run(&self, work: &(dyn Fn(usize) + Sync)) -> Result<(), PartPanicked> {
        if self.helpers.is_empty() {
            return catch_unwind(AssertUnwindSafe(|| work(0))).map_err(|_| PartPanicked);
        }
        let job = Job { run: work };
        // The helpers only read `job` between the generation bump below and their `done`
        // increment, and `Wait` does not let this frame go before they all did.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        self.shared.done.store(0, Ordering::Relaxed);
        self.shared.panicked.store(false, Ordering::Relaxed);
        self.shared.job.store(ptr, Ordering::Relaxed);
        self.shared.generation.fetch_add(1, Ordering::Release);
        for h in &self.helpers {
            h.thread().unpark();
        }
        let wait = Wait {
            shared: &self.shared,
            helpers: self.helpers.len(),
        };
        let own = catch_unwind(AssertUnwindSafe(|| work(0)));
        drop(wait);
        if own.is_err() || self.shared.panicked.load(Ordering::Acquire) {
            return Err(PartPanicked);
        }
        Ok(())
    }
}

/// Waits for the helpers of the current block (also when the caller's part unwinds).
struct Wait<'a> {
    shared: &'a Shared,
    helpers: usize,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.shared.done.load(Ordering::Acquire) < self.helpers {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

fn helper(shared: &Shared, part: usize) {
    shared.started.fetch_add(1, Ordering::Release);
    let mut seen = 0u64;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 && idle.elapsed() > SPIN {
                // Woken by the next block's unpark (or a spurious wake-up: look again).
                std::thread::park_timeout(Duration::from_millis(100));
            } else {
                std::hint::spin_loop();
            }
        };
        seen = generation;
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let job = shared.job.load(Ordering::Relaxed);
        // SAFETY: the owner published `job` before the generation bump (Release, read
        // above with Acquire) and waits for `done` before the job goes out of scope.
        let run = unsafe { (*job).run };
        if catch_unwind(AssertUnwindSafe(|| run(part))).is_err() {
            shared.panicked.store(true, Ordering::Release);
        }
        shared.done.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for h in &self.helpers {
            h.thread().unpark();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_part_runs_once_per_block() {
        for threads in [1, 2, 3, 5] {
            let w = Workers::new(threads, "test").expect("threads");
            assert_eq!(w.threads(), threads);
            let hits: Vec<AtomicU32> = (0..threads).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..200 {
                w.run(&|p| {
                    hits[p].fetch_add(1, Ordering::Relaxed);
                })
                .expect("no panic");
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 200);
            }
        }
    }

    #[test]
    fn a_panicking_part_is_an_error_and_the_workers_go_on() {
        let w = Workers::new(3, "test").expect("threads");
        let r = w.run(&|p| {
            if p == 2 {
                panic!("part 2 fails");
            }
        });
        assert_eq!(r, Err(PartPanicked));
        let n = AtomicU32::new(0);
        w.run(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .expect("next block runs");
        assert_eq!(n.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn helpers_wake_after_sleeping() {
        let w = Workers::new(2, "test").expect("threads");
        std::thread::sleep(SPIN * 3);
        let n = AtomicU32::new(0);
        w.run(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .expect("runs");
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }
}
