//! GPU EEG engine benchmark (run on a machine with a CUDA GPU):
//!
//!     cargo bench --bench gpu_eeg                 # or the built binary, with --quick
//!
//! Measures, in one run: the device's floors (device-to-device copy bandwidth, FP32 SGEMM
//! rate); the seed case (59 channels x 195,391 sources, 32-sample blocks): block latency
//! p50/p99, pipelined throughput per batch size, the batch the BatchSizer picks for a 1 ms
//! budget, each stage's device time against its floor; the one-sample case (256 channels
//! x 20,484 sources, T = 1) latency with and without CUDA graphs; and the CPU float64 path
//! of the same build on a few blocks. Results are printed as `key value` lines and a table.

use std::collections::VecDeque;
use std::time::Instant;

use cudarc::driver::sys as drv_sys;
use trigd::eeg::kernel::InverseKernel;
use trigd::gpu::eeg::{EegBlockOutput, EegEngineConfig, EegProduct, GpuEegEngine, StageTimes};
use trigd::gpu::nvrtc::KernelCache;
use trigd::gpu::runtime::{BatchSizer, Blas, DeviceBuffer};
use trigd::gpu::{detect, BackendChoice, GpuDevice, GpuError};

/// xorshift64*: fast uniform values in [-1, 1) for large random operators.
struct Rand(u64);
impl Rand {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (v >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn summary(mut v: Vec<f64>) -> (f64, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    (
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        *v.last().unwrap_or(&f64::NAN),
        mean,
    )
}

fn random_kernel(rng: &mut Rand, c: usize, s: usize) -> InverseKernel {
    InverseKernel {
        n_channels: c,
        n_sources: s,
        kernel: (0..3 * s * c).map(|_| rng.next_f64()).collect(),
        source_scale: (0..s).map(|_| 1.25 + 0.75 * rng.next_f64()).collect(),
    }
}

fn event_ms(
    dev_ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
) -> Result<cudarc::driver::CudaEvent, GpuError> {
    dev_ctx
        .new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| GpuError::Driver {
            call: "cuEventCreate",
            code: format!("{e:?}"),
        })
}

fn drv<T>(call: &'static str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Driver {
        call,
        code: format!("{e:?}"),
    })
}

/// (copy bandwidth GB/s counting read + write, SGEMM TFLOP/s).
fn floors(dev: &GpuDevice) -> Result<(f64, f64), GpuError> {
    let ctx = dev.open()?;
    let stream = drv("cuStreamCreate", ctx.new_stream())?;
    let bytes = 1usize << 30;
    let a = DeviceBuffer::<u8>::new(&ctx, bytes)?;
    let b = DeviceBuffer::<u8>::new(&ctx, bytes)?;
    a.fill_bytes(0x3c, &stream)?;
    let (e0, e1) = (event_ms(&ctx)?, event_ms(&ctx)?);
    let mut t = Vec::new();
    for i in 0..13 {
        drv("cuEventRecord", e0.record(&stream))?;
        // SAFETY: both allocations are `bytes` long.
        drv("cuMemcpyDtoDAsync", unsafe {
            drv_sys::cuMemcpyDtoDAsync_v2(b.ptr(), a.ptr(), bytes, stream.cu_stream()).result()
        })?;
        drv("cuEventRecord", e1.record(&stream))?;
        let ms = drv("cuEventElapsedTime", e0.elapsed_ms(&e1))? as f64;
        if i >= 3 {
            t.push(ms);
        }
    }
    let (copy_ms, ..) = summary(t);
    let bw = 2.0 * bytes as f64 / (copy_ms * 1e-3) / 1e9;

    let n = 8192usize;
    let mut rng = Rand(0x9e37_79b9_7f4a_7c15);
    let host: Vec<f32> = (0..n * n).map(|_| rng.next_f64() as f32).collect();
    let ma = DeviceBuffer::from_host(&ctx, &host)?;
    let mb = DeviceBuffer::from_host(&ctx, &host)?;
    let mc = DeviceBuffer::<f32>::new(&ctx, n * n)?;
    let blas = Blas::new(&ctx, &stream)?;
    let mut t = Vec::new();
    for i in 0..6 {
        drv("cuEventRecord", e0.record(&stream))?;
        blas.sgemm(false, false, n, n, n, ma.ptr(), n, mb.ptr(), n, mc.ptr(), n)?;
        drv("cuEventRecord", e1.record(&stream))?;
        let ms = drv("cuEventElapsedTime", e0.elapsed_ms(&e1))? as f64;
        if i >= 1 {
            t.push(ms);
        }
    }
    let (gemm_ms, ..) = summary(t);
    let tflops = 2.0 * (n as f64).powi(3) / (gemm_ms * 1e-3) / 1e12;
    // The seed case's product in both orientations: Y column-major [3S, n] (what the
    // engine runs) and its transpose [n, 3S] (a layout to consider next).
    let (s3, c) = (3 * 195_391usize, 59usize);
    let kd = DeviceBuffer::<f32>::new(&ctx, s3 * c)?;
    let xd = DeviceBuffer::<f32>::new(&ctx, c * 512)?;
    let yd = DeviceBuffer::<f32>::new(&ctx, s3 * 512)?;
    kd.fill_bytes(0x3c, &stream)?;
    xd.fill_bytes(0x3d, &stream)?;
    for n in [32usize, 512] {
        let mut row = Vec::new();
        for transposed in [false, true] {
            let mut t = Vec::new();
            for i in 0..12 {
                drv("cuEventRecord", e0.record(&stream))?;
                if transposed {
                    blas.sgemm(true, false, n, s3, c, xd.ptr(), c, kd.ptr(), c, yd.ptr(), n)?;
                } else {
                    blas.sgemm(
                        true,
                        false,
                        s3,
                        n,
                        c,
                        kd.ptr(),
                        c,
                        xd.ptr(),
                        c,
                        yd.ptr(),
                        s3,
                    )?;
                }
                drv("cuEventRecord", e1.record(&stream))?;
                let ms = drv("cuEventElapsedTime", e0.elapsed_ms(&e1))? as f64;
                if i >= 2 {
                    t.push(ms * 1e3);
                }
            }
            row.push(summary(t).0);
        }
        println!(
            "sgemm seed shape 3S={s3} C={c} n={n}: Y[3S,n] {:.1} us, Y^T[n,3S] {:.1} us ({:.1} / {:.1} TFLOP/s)",
            row[0],
            row[1],
            2.0 * (s3 * c * n) as f64 / (row[0] * 1e-6) / 1e12,
            2.0 * (s3 * c * n) as f64 / (row[1] * 1e-6) / 1e12
        );
    }
    drv("cuStreamSynchronize", stream.synchronize())?;
    Ok((bw, tflops))
}

struct Case {
    name: &'static str,
    c: usize,
    s: usize,
    t: usize,
    max_frames: usize,
}

fn frames(rng: &mut Rand, c: usize, t: usize, n: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|_| (0..c * t).map(|_| rng.next_f64() as f32).collect())
        .collect()
}

/// Synchronous per-block latency (host wall clock around `process`), microseconds.
fn latency(
    eng: &mut GpuEegEngine,
    data: &[Vec<f32>],
    t: usize,
    reps: usize,
) -> Result<Vec<f64>, GpuError> {
    let mut out = EegBlockOutput::default();
    for d in data.iter().take(20) {
        eng.process(d, t, false, &mut out)?;
    }
    let mut lat = Vec::with_capacity(reps);
    for i in 0..reps {
        let d = &data[i % data.len()];
        let t0 = Instant::now();
        eng.process(d, t, false, &mut out)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(lat)
}

/// Two batches in flight; returns (samples/s, per-batch latency us from submit to results).
fn pipelined(
    eng: &mut GpuEegEngine,
    data: &[Vec<f32>],
    t: usize,
    batch: usize,
    n_batches: usize,
) -> Result<(f64, Vec<f64>), GpuError> {
    let mut outs = vec![EegBlockOutput::default(); batch];
    let mut q: VecDeque<(_, Instant)> = VecDeque::new();
    let mut lat = Vec::with_capacity(n_batches);
    let t0 = Instant::now();
    for b in 0..n_batches {
        if q.len() == 2 {
            let (tk, ts) = q.pop_front().expect("two in flight");
            eng.wait(tk, &mut outs)?;
            lat.push(ts.elapsed().as_secs_f64() * 1e6);
        }
        let refs: Vec<&[f32]> = (0..batch)
            .map(|i| data[(b * batch + i) % data.len()].as_slice())
            .collect();
        let ts = Instant::now();
        q.push_back((eng.submit(&refs, t, false)?, ts));
    }
    while let Some((tk, ts)) = q.pop_front() {
        eng.wait(tk, &mut outs)?;
        lat.push(ts.elapsed().as_secs_f64() * 1e6);
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(((n_batches * batch * t) as f64 / secs, lat))
}

fn stage_line(name: &str, st: &StageTimes, op_bytes: f64, flops: f64, bw: f64, tflops: f64) {
    let floor_bw_us = op_bytes / (bw * 1e9) * 1e6;
    let floor_flop_us = flops / (tflops * 1e12) * 1e6;
    println!(
        "stages {name}: copy_in {:.1} us | gemm {:.1} us (floor {:.1} us: max(operator {:.0} MB / {:.0} GB/s = {:.1}, {:.2} GFLOP / {:.1} TFLOP/s = {:.1})) | source_power {:.1} us | frame_stats {:.1} us | copy_out {:.1} us | total {:.1} us",
        st.copy_in_us,
        st.gemm_us,
        floor_bw_us.max(floor_flop_us),
        op_bytes / 1e6,
        bw,
        floor_bw_us,
        flops / 1e9,
        tflops,
        floor_flop_us,
        st.source_power_us,
        st.frame_stats_us,
        st.copy_out_us,
        st.copy_in_us + st.gemm_us + st.source_power_us + st.frame_stats_us + st.copy_out_us
    );
}

fn run_case(
    dev: &GpuDevice,
    case: &Case,
    bw: f64,
    tflops: f64,
    quick: bool,
    table: &mut Vec<String>,
) -> Result<(), GpuError> {
    let mut rng = Rand(0x1234_5678_9abc_def1 ^ case.s as u64);
    let t_gen = Instant::now();
    let k = random_kernel(&mut rng, case.c, case.s);
    let roi: Vec<u32> = (0..1000.min(case.s))
        .map(|i| ((i * 7919) % case.s) as u32)
        .collect();
    eprintln!(
        "{}: operator generated in {:.1} s",
        case.name,
        t_gen.elapsed().as_secs_f64()
    );
    let data = frames(&mut rng, case.c, case.t, 64);
    let (c, s, t) = (case.c, case.s, case.t);
    let op_bytes = (3 * s * c * 4) as f64;
    let mut runs = Vec::new();
    if dev.compute_capability.0 >= 8 {
        runs.push((true, EegProduct::Fused));
        runs.push((false, EegProduct::Fused));
    }
    runs.push((true, EegProduct::Blas));
    runs.push((false, EegProduct::Blas));
    for (graphs, product) in runs {
        let config = EegEngineConfig {
            max_samples_per_frame: t,
            max_frames_per_batch: case.max_frames,
            slots: 2,
            amplitudes: false,
            use_graphs: graphs,
            product,
            cache: KernelCache::from_env(),
        };
        let pname = match product {
            EegProduct::Fused => "fused 3xTF32",
            _ => "cuBLAS",
        };
        let name = format!("{} {pname}", case.name);
        let t_new = Instant::now();
        let mut eng = GpuEegEngine::new(dev, &k, &roi, config)?;
        println!(
            "{} graphs={graphs}: engine start {:.0} ms (kernels from cache: {}, {:.1} ms)",
            name,
            t_new.elapsed().as_secs_f64() * 1e3,
            eng.kernels_from_cache,
            eng.kernel_load_ms
        );
        let reps = if quick { 200 } else { 2000 };
        let (p50, p99, max, mean) = summary(latency(&mut eng, &data, t, reps)?);
        println!(
            "{} graphs={graphs}: block latency p50 {p50:.1} us p99 {p99:.1} us max {max:.1} us; serial {:.0} samples/s",
            name,
            t as f64 / (mean * 1e-6)
        );
        table.push(format!(
            "| {} | 1 frame, sync, graphs={graphs} | {:.0} | {p50:.1} | {p99:.1} |",
            name,
            t as f64 / (mean * 1e-6)
        ));
        if !graphs {
            continue;
        }
        let mut b = 1;
        while b <= case.max_frames {
            let n_batches = if quick {
                50
            } else {
                (4000 / b).clamp(100, 1000)
            };
            let (sps, lat) = pipelined(&mut eng, &data, t, b, n_batches)?;
            let (lp50, lp99, ..) = summary(lat);
            println!(
                "{}: pipelined batch {b}: {sps:.0} samples/s, batch latency p50 {lp50:.1} us p99 {lp99:.1} us",
                name
            );
            table.push(format!(
                "| {} | batch {b}, 2 in flight | {sps:.0} | {lp50:.1} | {lp99:.1} |",
                name
            ));
            b *= 2;
        }
        // Let the sizer pick the batch for a 1 ms budget per batch.
        let mut sizer = BatchSizer::new(1000.0, case.max_frames);
        let mut outs = Vec::new();
        let mut chosen = Vec::new();
        for i in 0..300 {
            let n = sizer.next_batch();
            let refs: Vec<&[f32]> = (0..n)
                .map(|j| data[(i + j) % data.len()].as_slice())
                .collect();
            let t0 = Instant::now();
            eng.process_batch(&refs, t, false, &mut outs)?;
            sizer.record(n, t0.elapsed().as_secs_f64() * 1e6);
            chosen.push(n);
        }
        let n = sizer.next_batch();
        println!(
            "{}: BatchSizer (1000 us budget) picks {n} frames; model {:?} (fixed us, per-frame us); predicted {:.0} us",
            name,
            sizer.model(),
            sizer.predict_us(n).unwrap_or(f64::NAN)
        );
        for f in [1, case.max_frames] {
            // Stage the first frames into slot 0 for the profile.
            let refs: Vec<&[f32]> = (0..f).map(|j| data[j % data.len()].as_slice()).collect();
            let mut outs = Vec::new();
            eng.process_batch(&refs, t, false, &mut outs)?;
            let mut outs2 = Vec::new();
            eng.process_batch(&refs, t, false, &mut outs2)?;
            let st = eng.profile_stages(f, t, if quick { 10 } else { 50 })?;
            let flops = 2.0 * (3 * s * c * f * t) as f64;
            stage_line(
                &format!("{} batch {f}", name),
                &st,
                op_bytes,
                flops,
                bw,
                tflops,
            );
            let y_bytes = (3 * s * f * t * 4) as f64;
            println!(
                "  source_power floor {:.1} us (reads Y {:.0} MB once); gemm achieved {:.0} GB/s operator read, {:.2} TFLOP/s",
                y_bytes / (bw * 1e9) * 1e6,
                y_bytes / 1e6,
                op_bytes / (st.gemm_us * 1e-6) / 1e9,
                flops / (st.gemm_us * 1e-6) / 1e12
            );
        }
    }
    // CPU float64 path of the same build (single thread), a few blocks.
    let n_cpu = if s > 100_000 { 2 } else { 10 };
    let mut amp = vec![0.0; s * t];
    let t0 = Instant::now();
    for d in data.iter().take(n_cpu) {
        let d64: Vec<f64> = d.iter().map(|&v| f64::from(v)).collect();
        k.apply_f64(&d64, t, &mut amp);
    }
    let per_block_us = t0.elapsed().as_secs_f64() * 1e6 / n_cpu as f64;
    println!(
        "{}: CPU apply_f64: {:.0} us per block, {:.0} samples/s ({n_cpu} blocks)",
        case.name,
        per_block_us,
        t as f64 / (per_block_us * 1e-6)
    );
    table.push(format!(
        "| {} | CPU apply_f64, 1 thread | {:.0} | {:.0} | - |",
        case.name,
        t as f64 / (per_block_us * 1e-6),
        per_block_us
    ));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let devices = detect(BackendChoice::Gpu)?;
    let dev = &devices[0];
    println!("device {dev}");
    let (bw, tflops) = floors(dev)?;
    println!("floor: device-to-device copy {bw:.0} GB/s (read + write); FP32 SGEMM 8192^3 {tflops:.1} TFLOP/s");
    let mut table = vec![
        "| case | mode | samples/s | p50 us | p99 us |".to_string(),
        "| --- | --- | ---: | ---: | ---: |".to_string(),
    ];
    let cases = [
        Case {
            name: "59ch x 195391src T=32",
            c: 59,
            s: 195_391,
            t: 32,
            max_frames: 16,
        },
        Case {
            name: "256ch x 20484src T=1",
            c: 256,
            s: 20_484,
            t: 1,
            max_frames: 64,
        },
    ];
    for case in &cases {
        run_case(dev, case, bw, tflops, quick, &mut table)?;
    }
    println!("\n{}", table.join("\n"));
    Ok(())
}
