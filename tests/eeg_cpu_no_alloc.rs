//! The CPU EEG product allocates nothing per frame once its buffers are reserved: a
//! counting allocator, armed only around the calls, counts every allocation of every
//! thread of this process (the caller's and the product's worker threads alike) while
//! single samples, batches of one-sample frames and blocks go through `CpuInverse::process`
//! on two threads, in f32 and f64, with and without the source estimate written.
//!
//! One check in its own binary with its own `main` (no test harness): no other test, and
//! none of the harness's threads, allocates while the counter is armed. The harness's main
//! thread registers a test it has started after the test's thread runs, so on a busy machine
//! its allocations fell inside the armed window.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use trigd::eeg::cpu_apply::{CpuInverse, PackedInverse, Real};
use trigd::eeg::kernel::InverseKernel;
use trigd::eeg::roi::RoiConfig;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn kernel(n_channels: usize, n_sources: usize) -> InverseKernel {
    // Deterministic values; the cost does not depend on them.
    let mut v = 0.37f64;
    let mut next = || {
        v = (v * 3.9 * (1.0 - v)).clamp(1e-6, 1.0 - 1e-6);
        v - 0.5
    };
    InverseKernel {
        n_channels,
        n_sources,
        kernel: (0..3 * n_sources * n_channels).map(|_| next()).collect(),
        source_scale: (0..n_sources).map(|_| 1.0 + next()).collect(),
    }
}

/// Allocations counted over `rounds` calls of every shape, after one warm-up call each.
fn allocations_per_round<T: Real>(k: &InverseKernel, rounds: usize) -> usize {
    let positions = vec![[0.0; 3]; k.n_sources];
    let roi = RoiConfig {
        sphere: None,
        sources: Some((0..k.n_sources as u32).step_by(5).collect()),
        window_ms: 1.0,
        threshold: 1.0,
        refractory_ms: 0.0,
    }
    .resolve(&positions)
    .expect("roi");
    let op = Arc::new(PackedInverse::<T>::new(k, &roi));
    let mut e = CpuInverse::new(op, 2).expect("threads");
    // (frames, samples per frame): one sample, a batch of one-sample frames, blocks.
    let shapes = [(1usize, 1usize), (8, 1), (3, 1), (1, 32), (2, 16)];
    let max_frames = shapes.iter().map(|s| s.0).max().unwrap();
    let max_times = shapes.iter().map(|s| s.1).max().unwrap();
    e.reserve(max_frames, max_times);
    let c = k.n_channels;
    let inputs: Vec<Vec<T>> = shapes
        .iter()
        .map(|&(f, t)| {
            (0..f * c * t)
                .map(|i| T::from_f64(((i % 17) as f64 - 8.0) * 1e-6))
                .collect()
        })
        .collect();
    let mut amplitudes: Vec<Vec<T>> = shapes
        .iter()
        .map(|&(f, t)| vec![T::ZERO; f * k.n_sources * t])
        .collect();
    let run = |e: &mut CpuInverse<T>, amplitudes: &mut Vec<Vec<T>>| {
        for (i, &(_, t)) in shapes.iter().enumerate() {
            let stats = e.process(&inputs[i], t, None).expect("stats");
            assert!(stats
                .iter()
                .all(|s| s.roi_power.iter().all(|p| p.is_finite())));
            e.process(&inputs[i], t, Some(amplitudes[i].as_mut_slice()))
                .expect("amplitudes");
        }
    };
    run(&mut e, &mut amplitudes);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    for _ in 0..rounds {
        run(&mut e, &mut amplitudes);
    }
    ARMED.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst)
}

fn main() {
    the_product_allocates_nothing_per_frame();
    println!("the_product_allocates_nothing_per_frame ... ok");
}

fn the_product_allocates_nothing_per_frame() {
    let k = kernel(16, 700);
    let n32 = allocations_per_round::<f32>(&k, 50);
    let n64 = allocations_per_round::<f64>(&k, 50);
    assert_eq!(
        (n32, n64),
        (0, 0),
        "allocations over 50 rounds of 5 shapes (f32, f64)"
    );
    // The counter works: an allocation while armed is counted.
    ARMED.store(true, Ordering::SeqCst);
    let v = std::hint::black_box(vec![1u8; 64]);
    ARMED.store(false, Ordering::SeqCst);
    drop(v);
    assert!(
        ALLOCATIONS.load(Ordering::SeqCst) >= 1,
        "the counter counts"
    );
}
