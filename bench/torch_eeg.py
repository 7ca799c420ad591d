#!/usr/bin/env python3
"""The EEG block computation in PyTorch on the same GPU, as the comparison for
bench/gpu_eeg.rs: y = K x (FP32, no TF32), orientation norm times source scale, ROI mean
power per sample, peak source by total power. Same sizes as the Rust benchmark.

    python3 bench/torch_eeg.py [--quick]

Reports, per case: end-to-end latency per call (pinned host block in, statistics back on
the host; host wall clock after synchronisation) p50/p99 and samples/s; device-only time
of the compute (CUDA events) median; and for the one-sample case the same with the whole
step captured as a CUDA graph.
"""
import sys
import time

import torch

QUICK = "--quick" in sys.argv
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
dev = torch.device("cuda")


def pct(v, p):
    v = sorted(v)
    return v[round((len(v) - 1) * p)]


def make(c, s, roi_n=1000):
    g = torch.Generator(device=dev).manual_seed(1)
    k = torch.rand(3 * s, c, device=dev, generator=g) * 2 - 1
    scale = torch.rand(s, device=dev, generator=g) * 1.5 + 0.5
    roi = torch.tensor([(i * 7919) % s for i in range(min(roi_n, s))], device=dev)
    return k, scale, roi


def compute(k, scale, roi, x, s, b, t):
    # x: [b, c, t] on device -> samples as columns [c, b*t]
    c = x.shape[1]
    xs = x.permute(1, 0, 2).reshape(c, b * t)
    y = k @ xs  # [3s, b*t]
    amp = torch.linalg.vector_norm(y.view(s, 3, b * t), dim=1) * scale[:, None]
    p = amp * amp
    roi_power = p[roi].mean(0)  # [b*t]
    power = p.view(s, b, t).sum(2)  # [s, b]
    peak_power, peak = power.max(0)
    return roi_power, peak, peak_power


def run(name, c, s, t, batches):
    k, scale, roi = make(c, s)
    reps = 200 if QUICK else 1000
    rows = []
    for b in batches:
        xh = [torch.rand(b, c, t).pin_memory() * 2 - 1 for _ in range(8)]
        outs_h = None

        def step(i):
            x = xh[i % len(xh)].to(dev, non_blocking=True)
            r, pk, pp = compute(k, scale, roi, x, s, b, t)
            return r.cpu(), pk.cpu(), pp.cpu()

        for i in range(20):
            step(i)
        torch.cuda.synchronize()
        lat = []
        for i in range(reps if b == 1 else max(50, reps // b)):
            t0 = time.perf_counter()
            outs_h = step(i)
            lat.append((time.perf_counter() - t0) * 1e6)
        mean = sum(lat) / len(lat)
        # Device-only compute time with events.
        x = xh[0].to(dev)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dt = []
        for i in range(50):
            e0.record()
            compute(k, scale, roi, x, s, b, t)
            e1.record()
            torch.cuda.synchronize()
            dt.append(e0.elapsed_time(e1) * 1e3)
        sps = b * t / (mean * 1e-6)
        print(f"torch {name} batch {b}: end-to-end p50 {pct(lat, .5):.1f} us p99 {pct(lat, .99):.1f} us "
              f"{sps:.0f} samples/s; device compute median {pct(dt, .5):.1f} us", flush=True)
        rows.append(f"| {name} | torch eager, batch {b} | {sps:.0f} | {pct(lat, .5):.1f} | {pct(lat, .99):.1f} |")
        assert outs_h is not None and torch.isfinite(outs_h[0]).all()
    if t == 1:
        # The whole step (copy in, compute, copy out) as a CUDA graph.
        xh = torch.rand(1, c, t).pin_memory()
        xd = torch.empty(1, c, t, device=dev)
        out_h = [torch.empty(t).pin_memory(), torch.empty(1, dtype=torch.long).pin_memory(), torch.empty(1).pin_memory()]
        s_ = torch.cuda.Stream()
        s_.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s_):
            for _ in range(3):
                compute(k, scale, roi, xd, s, 1, t)
        torch.cuda.current_stream().wait_stream(s_)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            xd.copy_(xh, non_blocking=True)
            r, pk, pp = compute(k, scale, roi, xd, s, 1, t)
            out_h[0].copy_(r, non_blocking=True)
            out_h[1].copy_(pk, non_blocking=True)
            out_h[2].copy_(pp, non_blocking=True)
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        lat = []
        for _ in range(reps):
            t0 = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            lat.append((time.perf_counter() - t0) * 1e6)
        mean = sum(lat) / len(lat)
        print(f"torch {name} graph: end-to-end p50 {pct(lat, .5):.1f} us p99 {pct(lat, .99):.1f} us "
              f"{t / (mean * 1e-6):.0f} samples/s", flush=True)
        rows.append(f"| {name} | torch CUDA graph, batch 1 | {t / (mean * 1e-6):.0f} | {pct(lat, .5):.1f} | {pct(lat, .99):.1f} |")
    del k
    torch.cuda.empty_cache()
    return rows


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
    rows = ["| case | mode | samples/s | p50 us | p99 us |", "| --- | --- | ---: | ---: | ---: |"]
    rows += run("59ch x 195391src T=32", 59, 195391, 32, [1, 4, 16])
    rows += run("256ch x 20484src T=1", 256, 20484, 1, [1, 64])
    print()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
