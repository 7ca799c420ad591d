//! CPU throughput and latency of applying an EEG inverse kernel (the per-block hot path):
//! `out[s, t] = scale[s] * |K_s x_t|` for block sizes 1 and 32 samples, at 64 channels x
//! 5000 sources and 128 channels x 20000 sources, float64 and float32, random operator
//! (the cost does not depend on the values). One thread.
//!
//! Run: `cargo bench --bench eeg_cpu` (add `-- --quick` for fewer repetitions).
//! Output lines are `key=value` so bench/eeg_vs_mne.py can read them.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use trigd::eeg::kernel::InverseKernel;

fn random_kernel(n_channels: usize, n_sources: usize) -> InverseKernel {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    InverseKernel {
        n_channels,
        n_sources,
        kernel: (0..3 * n_sources * n_channels)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect(),
        source_scale: (0..n_sources).map(|_| rng.random_range(0.5..2.0)).collect(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn report(dtype: &str, n_channels: usize, n_sources: usize, block: usize, mut lat: Vec<Duration>) {
    lat.sort();
    let total: Duration = lat.iter().sum();
    let samples_per_s = (lat.len() * block) as f64 / total.as_secs_f64();
    println!(
        "impl=trigd dtype={dtype} n_channels={n_channels} n_sources={n_sources} block={block} \
         calls={} latency_us_median={:.1} latency_us_p99={:.1} samples_per_s={:.0}",
        lat.len(),
        percentile(&lat, 0.5).as_secs_f64() * 1e6,
        percentile(&lat, 0.99).as_secs_f64() * 1e6,
        samples_per_s
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_secs_f64(if quick { 0.5 } else { 2.0 });
    for &(n_channels, n_sources) in &[(64usize, 5000usize), (128, 20000)] {
        let k64 = random_kernel(n_channels, n_sources);
        let k32 = k64.to_f32();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for &block in &[1usize, 32] {
            let data: Vec<f64> = (0..n_channels * block)
                .map(|_| rng.random_range(-1e-5..1e-5))
                .collect();
            let data32: Vec<f32> = data.iter().map(|&v| v as f32).collect();
            let mut out = vec![0.0f64; n_sources * block];
            let mut out32 = vec![0.0f32; n_sources * block];
            // float64
            k64.apply_f64(&data, block, &mut out);
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed() < budget || lat.len() < 10 {
                let t = Instant::now();
                k64.apply_f64(&data, block, &mut out);
                lat.push(t.elapsed());
            }
            std::hint::black_box(&out);
            report("f64", n_channels, n_sources, block, lat);
            // float32
            k32.apply_f32(&data32, block, &mut out32);
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed() < budget || lat.len() < 10 {
                let t = Instant::now();
                k32.apply_f32(&data32, block, &mut out32);
                lat.push(t.elapsed());
            }
            std::hint::black_box(&out32);
            report("f32", n_channels, n_sources, block, lat);
        }
    }
}
