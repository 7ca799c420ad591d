//! The CPU EEG product against the machine's floor, measured in the same run on the same
//! threads: `out[s, t] = scale[s] * |K_s x_t|` plus the region-of-interest statistics, as
//! the CPU backend runs it (`CpuInverse`), for blocks of 1 and 32 samples, one-second
//! chunks, and batches of one-sample frames, float32 and float64.
//!
//! The floor of a block is the larger of
//! - the operator read once at the rate these threads stream the very same packed values
//!   (timed alternately with the product, so load on the machine hits both alike), and
//! - its multiply-adds at the rate these threads run a large square matrix product with
//!   faer (each thread its own 1024 x 1024 product, single-threaded faer: the cores' GEMM
//!   rate, taken as the best of three rounds before and after the blocks).
//!
//! `pct_of_floor` is floor time / trigd time (100 = at the floor), in wall time.
//! `cpu_us_median` and `pct_of_floor_cpu` use the calling thread's CPU time instead (the
//! product's, the stream's and faer's): on a machine shared with other work, a call longer than a
//! scheduler time slice waits for the core in wall time, and this separates that from
//! the cost of the code. `pct_of_fma_peak` puts
//! the product's rate against the cores' bare fused multiply-add peak (16 independent
//! AVX-512 chains per thread), a bound no matrix product reaches.
//!
//! Run: `cargo bench --bench eeg_cpu -- [--quick] [--threads N] [--sizes 64x8000,128x20000]
//!       [--blocks 1,32,512] [--batch 8] [--kernel K.npy --scale S.npy] [--amplitudes]`
//! `--kernel`/`--scale` apply a given operator (`[3 n_sources, n_channels]` row-major and
//! `[n_sources]`, e.g. MNE's assembled kernel and noise normalisation from
//! bench/eeg_vs_mne.py) instead of random ones. `--amplitudes` also writes the full source
//! estimate per block (what MNE's `apply_inverse_raw` returns); without it the product
//! keeps only the statistics, as the daemon does. Output lines are `key=value`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use trigd::eeg::cpu_apply::{CpuInverse, PackedInverse, Real};
use trigd::eeg::kernel::InverseKernel;
use trigd::eeg::roi::{RoiConfig, RoiMask};

struct Args {
    quick: bool,
    threads: usize,
    sizes: Vec<(usize, usize)>,
    blocks: Vec<usize>,
    batch: usize,
    kernel: Option<(PathBuf, PathBuf)>,
    amplitudes: bool,
    dtypes: Vec<String>,
}

fn parse_args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let val = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
    };
    let list = |s: String| -> Vec<usize> {
        s.split(',')
            .map(|v| v.parse().expect("a list of numbers"))
            .collect()
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Args {
        quick: argv.iter().any(|a| a == "--quick"),
        threads: val("--threads").map_or(cores, |v| v.parse().expect("--threads N")),
        sizes: val("--sizes").map_or(vec![(64, 8000), (128, 20000)], |v| {
            v.split(',')
                .map(|p| {
                    let (c, s) = p.split_once('x').expect("CxS");
                    (c.parse().expect("channels"), s.parse().expect("sources"))
                })
                .collect()
        }),
        blocks: val("--blocks").map_or(vec![1, 32, 512], list),
        batch: val("--batch").map_or(8, |v| v.parse().expect("--batch N")),
        kernel: val("--kernel").map(|k| {
            (
                PathBuf::from(k),
                PathBuf::from(val("--scale").expect("--kernel needs --scale")),
            )
        }),
        amplitudes: argv.iter().any(|a| a == "--amplitudes"),
        dtypes: val("--dtypes").map_or(vec!["f32".into(), "f64".into()], |v| {
            v.split(',').map(String::from).collect()
        }),
    }
}

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

fn npy_kernel(k: &Path, s: &Path) -> InverseKernel {
    let a = trigd::eeg::inputs::read_npy(k).expect("kernel npy");
    let b = trigd::eeg::inputs::read_npy(s).expect("scale npy");
    assert_eq!(a.shape.len(), 2, "kernel [3 n_sources, n_channels]");
    let (rows, n_channels) = (a.shape[0], a.shape[1]);
    assert_eq!(rows % 3, 0, "three rows per source");
    assert_eq!(b.data.len(), rows / 3, "one scale per source");
    InverseKernel {
        n_channels,
        n_sources: rows / 3,
        kernel: a.data,
        source_scale: b.data,
    }
}

/// A region of a tenth of the sources, neighbours in the source order as a sphere's
/// sources mostly are.
fn roi(n_sources: usize) -> RoiMask {
    RoiConfig {
        sphere: None,
        sources: Some((0..(n_sources as u32 / 10).max(1)).collect()),
        window_ms: 1.0,
        threshold: 1.0,
        refractory_ms: 0.0,
    }
    .resolve(&vec![[0.0; 3]; n_sources])
    .expect("roi")
}

/// CPU time of the calling thread, seconds: what a call cost this thread, whatever else
/// the machine runs (wall time includes the time other processes held the core).
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.99).round() as usize]
}

/// Sum of a slice at full vector width: the machine's rate of reading it.
#[inline(always)]
fn stream<T: Real>(v: &[T]) -> f64 {
    let mut acc = [T::ZERO; 64];
    let mut chunks = v.chunks_exact(64);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = *a + x;
        }
    }
    acc.iter().map(|a| a.to_f64()).sum::<f64>()
        + chunks.remainder().iter().map(|a| a.to_f64()).sum::<f64>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn stream_avx512<T: Real>(v: &[T]) -> f64 {
    stream(v)
}

fn stream_best<T: Real>(v: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: checked just above.
        return unsafe { stream_avx512(v) };
    }
    stream(v)
}

/// Every thread streams the packed operator of its own panels once (only the caller, all
/// of it, for a block the product keeps on the caller: `cols` samples in all).
fn stream_operator<T: Real>(e: &CpuInverse<T>, cols: usize) -> f64 {
    let op = e.operator();
    let per_panel = op.values().len() / op.n_panels().max(1);
    if e.parts_for(cols) == 1 {
        return stream_best(op.values());
    }
    let sums: Vec<Mutex<f64>> = (0..e.threads()).map(|_| Mutex::new(0.0)).collect();
    e.workers()
        .run(&|i| {
            let r = &e.parts()[i];
            let s = stream_best(&op.values()[r.start * per_panel..r.end * per_panel]);
            *sums[i].lock().expect("sum") = s;
        })
        .expect("stream");
    sums.iter().map(|s| *s.lock().expect("sum")).sum()
}

/// A thread's two factors and product.
type Operands<T> = (faer::Mat<T>, faer::Mat<T>, faer::Mat<T>);

/// Flops per second of the threads each running a 1024 x 1024 faer product: in wall time,
/// and in the calling thread's CPU time (times the threads), best of three rounds each.
fn gemm_rate<T: Real + faer::traits::ComplexField>(e: &CpuInverse<T>) -> (f64, f64) {
    let n = 1024;
    let mats: Vec<Mutex<Operands<T>>> = (0..e.threads())
        .map(|i| {
            let m = faer::Mat::<T>::from_fn(n, n, |r, c| {
                T::from_f64(((r * 7 + c * 3 + i) % 11) as f64 * 0.1)
            });
            Mutex::new((m.clone(), m, faer::Mat::<T>::zeros(n, n)))
        })
        .collect();
    let (mut best, mut best_cpu) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        let reps = 2;
        let (t, c0) = (Instant::now(), thread_cpu_s());
        e.workers()
            .run(&|i| {
                let mut g = mats[i].lock().expect("mats");
                let (a, b, c) = &mut *g;
                for _ in 0..reps {
                    faer::linalg::matmul::matmul(
                        c.as_mut(),
                        faer::Accum::Replace,
                        a.as_ref(),
                        b.as_ref(),
                        T::from_f64(1.0),
                        faer::Par::Seq,
                    );
                }
            })
            .expect("gemm");
        let cpu = thread_cpu_s() - c0;
        let flops = 2.0 * (n * n * n) as f64 * reps as f64 * e.threads() as f64;
        best = best.max(flops / t.elapsed().as_secs_f64());
        best_cpu = best_cpu.max(flops / cpu);
    }
    (best, best_cpu)
}

/// Independent fused multiply-adds in registers, 16 chains: the cores' peak.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: usize, double: bool) -> f64 {
    use std::arch::x86_64::*;
    if double {
        let (m, c) = (_mm512_set1_pd(0.999_999), _mm512_set1_pd(1e-7));
        let mut a = [_mm512_set1_pd(1.0); 16];
        for _ in 0..iters {
            for v in &mut a {
                *v = _mm512_fmadd_pd(*v, m, c);
            }
        }
        a.iter().map(|v| _mm512_reduce_add_pd(*v)).sum()
    } else {
        let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut a = [_mm512_set1_ps(1.0); 16];
        for _ in 0..iters {
            for v in &mut a {
                *v = _mm512_fmadd_ps(*v, m, c);
            }
        }
        a.iter().map(|v| f64::from(_mm512_reduce_add_ps(*v))).sum()
    }
}

/// Flops per second of the threads all running [`fma_loop_avx512`] (0 without AVX-512).
fn fma_peak<T: Real>(e: &CpuInverse<T>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let iters = 2_000_000;
        let double = T::LANES == 8;
        let mut best = 0.0f64;
        for _ in 0..3 {
            let t = Instant::now();
            e.workers()
                .run(&|_| {
                    // SAFETY: checked above.
                    std::hint::black_box(unsafe { fma_loop_avx512(iters, double) });
                })
                .expect("fma");
            let flops = (iters * 16 * T::LANES * 2 * e.threads()) as f64;
            best = best.max(flops / t.elapsed().as_secs_f64());
        }
        return best;
    }
    0.0
}

fn run<T: Real + faer::traits::ComplexField>(
    dtype: &str,
    k: &InverseKernel,
    args: &Args,
    budget: Duration,
) {
    let (c, n_s) = (k.n_channels, k.n_sources);
    let op = Arc::new(PackedInverse::<T>::new(k, &roi(n_s)));
    let mut e = CpuInverse::new(op, args.threads).expect("threads");
    let (gemm_before, gemm_cpu_before) = gemm_rate(&e);
    let bytes = e.operator().bytes() as f64;
    let mut shapes: Vec<(usize, usize)> = args.blocks.iter().map(|&b| (1, b)).collect();
    if args.batch > 1 {
        shapes.push((args.batch, 1));
    }
    let mut rows = Vec::new();
    for &(frames, block) in &shapes {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let data: Vec<T> = (0..frames * c * block)
            .map(|_| T::from_f64(rng.random_range(-1e-5..1e-5)))
            .collect();
        let mut amp = vec![T::ZERO; frames * n_s * block];
        e.reserve(frames, block);
        let mut call = |e: &mut CpuInverse<T>| {
            let a = if args.amplitudes {
                Some(amp.as_mut_slice())
            } else {
                None
            };
            std::hint::black_box(e.process(&data, block, a).expect("apply").len());
        };
        call(&mut e);
        let _ = stream_operator(&e, frames * block);
        // Alternate the product and the stream of the same operator on the same threads.
        let (mut lat, mut st, mut lat_cpu, mut st_cpu) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let start = Instant::now();
        while start.elapsed() < budget || lat.len() < 10 {
            let (t, c0) = (Instant::now(), thread_cpu_s());
            call(&mut e);
            lat.push(t.elapsed().as_secs_f64());
            lat_cpu.push(thread_cpu_s() - c0);
            let (t, c0) = (Instant::now(), thread_cpu_s());
            std::hint::black_box(stream_operator(&e, frames * block));
            st.push(t.elapsed().as_secs_f64());
            st_cpu.push(thread_cpu_s() - c0);
        }
        rows.push((frames, block, lat, st, lat_cpu, st_cpu));
    }
    let (gemm_after, gemm_cpu_after) = gemm_rate(&e);
    let gemm = gemm_before.max(gemm_after);
    let gemm_cpu = gemm_cpu_before.max(gemm_cpu_after);
    let peak = fma_peak(&e);
    println!(
        "floor dtype={dtype} threads={} isa={} n_channels={c} n_sources={n_s} operator_mb={:.2} \
         gemm_gflop_s={:.1} gemm_cpu_gflop_s={:.1} fma_peak_gflop_s={:.1}",
        e.threads(),
        e.isa().as_str(),
        bytes / 1e6,
        gemm / 1e9,
        gemm_cpu / 1e9,
        peak / 1e9
    );
    for (frames, block, mut lat, mut st, mut lat_cpu, mut st_cpu) in rows {
        let med = median(&mut lat);
        let stream_s = median(&mut st);
        let med_cpu = median(&mut lat_cpu);
        let floor_cpu =
            median(&mut st_cpu).max(2.0 * (3 * n_s * c * frames * block) as f64 / gemm_cpu);
        let flops = 2.0 * (3 * n_s * c * frames * block) as f64;
        let gemm_s = flops / gemm;
        let (floor_s, kind) = if stream_s >= gemm_s {
            (stream_s, "memory")
        } else {
            (gemm_s, "gemm")
        };
        println!(
            "impl=trigd dtype={dtype} threads={} n_channels={c} n_sources={n_s} frames={frames} block={block} \
             output={} calls={} latency_us_median={:.1} latency_us_p99={:.1} samples_per_s={:.0} \
             gflop_s={:.1} pct_of_fma_peak={:.0} stream_us={:.1} stream_gb_s={:.1} gemm_floor_us={:.1} floor_us={:.1} floor_kind={kind} \
             pct_of_floor={:.0} cpu_us_median={:.1} pct_of_floor_cpu={:.0}",
            e.threads(),
            if args.amplitudes { "amplitudes" } else { "stats" },
            lat.len(),
            med * 1e6,
            p99(&mut lat) * 1e6,
            (frames * block) as f64 / med,
            flops / med / 1e9,
            if peak > 0.0 { 100.0 * flops / med / peak } else { 0.0 },
            stream_s * 1e6,
            bytes / stream_s / 1e9,
            gemm_s * 1e6,
            floor_s * 1e6,
            100.0 * floor_s / med,
            med_cpu * 1e6,
            100.0 * floor_cpu / med_cpu,
        );
    }
}

fn main() {
    let args = parse_args();
    let budget = Duration::from_secs_f64(if args.quick { 0.5 } else { 2.0 });
    let kernels: Vec<InverseKernel> = match &args.kernel {
        Some((k, s)) => vec![npy_kernel(k, s)],
        None => args
            .sizes
            .iter()
            .map(|&(c, s)| random_kernel(c, s))
            .collect(),
    };
    for k in &kernels {
        for dtype in &args.dtypes {
            match dtype.as_str() {
                "f32" => run::<f32>("f32", k, &args, budget),
                "f64" => run::<f64>("f64", k, &args, budget),
                other => panic!("--dtypes: {other} is neither f32 nor f64"),
            }
        }
    }
}
