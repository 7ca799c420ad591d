#!/usr/bin/env python3
"""MNE-Python and trigd applying the same MNE-built inverse operator, in one run.

For each size (64 channels x ~8,000 sources and 128 channels x ~20,000 sources by
default) this builds a real inverse operator with MNE (sphere head model, a
standard_1005 subset, a volume source space whose grid step gives about that many
sources, make_forward_solution, noise covariance from simulated noise with the average
reference as a projection, make_inverse_operator(loose=1, depth=0.8)), prepares it for
dSPM with lambda2 = 1/9, and exports MNE's assembled kernel (projection and whitening
folded in, `[3 n_sources, n_channels]`) and its noise normalisation (`[n_sources]`) to
.npy, so trigd applies exactly MNE's numbers. Then, for blocks of 1 and 32 samples and
one-second chunks, on the same number of threads for both sides:

  mne_apply_inverse_raw  apply_inverse_raw(raw_block, inv_prepared, ..., prepared=True)
                         as users call it (assembles the kernel, multiplies, combines
                         the orientations, builds the SourceEstimate)
  numpy_kernel           combine_xyz(K @ x) * noise_norm with MNE's kernel: the bare
                         NumPy/BLAS product, not an MNE API
  trigd                  `cargo bench --bench eeg_cpu -- --kernel K.npy --scale N.npy
                         --amplitudes` (CpuInverse: the full source estimate written,
                         like MNE's, plus the ROI statistics), float64 and float32

The two sides alternate `--rounds` times (MNE, trigd, MNE, trigd, ...); the table gives
the median over rounds of each side's median call time, and the speed-up per round.
Before timing, the script checks that `combine_xyz(K @ x) * noise_norm` reproduces
MNE's `apply_inverse_raw` on the same block (the export is MNE's operator).

Threads: EEG_BENCH_THREADS (default: all cores) sets OMP/OPENBLAS/MKL_NUM_THREADS for
NumPy's BLAS and `--threads` for trigd.

BLAS: the table's header names the BLAS NumPy runs and the kernel it chose
(threadpoolctl). On machines where OPENBLAS_CORETYPE is set to an older core (some
environments pin `Haswell`, AVX2, for old OpenBLAS builds), NumPy's OpenBLAS runs at about
half its speed on an AVX-512 CPU and MNE's side is understated; the script warns, and a
fair comparison unsets it for the bench alone:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 bench/eeg_vs_mne.py

Run from the crate root:  python3 bench/eeg_vs_mne.py [--quick] [--rounds N]
                          [--sizes 64:7.0,128:4.7] [--keep DIR]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

THREADS = os.environ.get("EEG_BENCH_THREADS", str(os.cpu_count() or 1))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = THREADS

import numpy as np  # noqa: E402

import mne  # noqa: E402
from mne.minimum_norm import (  # noqa: E402
    apply_inverse_raw,
    make_inverse_operator,
    prepare_inverse_operator,
)
from mne.minimum_norm.inverse import _assemble_kernel, combine_xyz  # noqa: E402

METHOD = "dSPM"
LAMBDA2 = 1.0 / 9.0
SFREQ = 512.0
BLOCKS = [1, 32, int(SFREQ)]


def build(n_ch, pos_mm, rng):
    montage = mne.channels.make_standard_montage("standard_1005")
    names = [n for n in montage.ch_names if not n.startswith(("M", "A", "T3", "T4", "T5", "T6"))]
    step = len(names) / n_ch
    names = [names[int(i * step)] for i in range(n_ch)]
    info = mne.create_info(names, SFREQ, "eeg")
    info.set_montage(montage)
    sphere = mne.make_sphere_model(r0=(0.0, 0.0, 0.04), head_radius=0.09)
    src = mne.setup_volume_source_space(sphere=sphere, pos=pos_mm, mindist=5.0)
    fwd = mne.make_forward_solution(info, None, src, sphere, eeg=True, meg=False, n_jobs=1)
    noise = mne.io.RawArray(5e-6 * rng.standard_normal((n_ch, int(30 * SFREQ))), info.copy())
    noise.set_eeg_reference(projection=True)
    cov = mne.compute_raw_covariance(noise, method="empirical")
    inv = make_inverse_operator(noise.info, fwd, cov, loose=1.0, depth=0.8)
    return noise.info, inv


def timeit(fn, budget_s, min_calls=3):
    lat = []
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s or len(lat) < min_calls:
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    return float(np.median(lat)), len(lat)


def blas_description():
    """The BLAS NumPy calls, its kernel and threads, as threadpoolctl reports them."""
    try:
        import threadpoolctl
    except ImportError:
        return "BLAS unknown (threadpoolctl not installed)"
    libs = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')} "
        f"threads {i.get('num_threads')}" for i in libs) or "no BLAS found"


def run_trigd(kpath, npath, quick, extra=()):
    cmd = ["cargo", "bench", "--bench", "eeg_cpu", "--", "--kernel", kpath, "--scale", npath,
           "--threads", THREADS, "--blocks", ",".join(map(str, BLOCKS)), "--batch", "1",
           *extra]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ, CARGO_BUILD_JOBS=os.environ.get("CARGO_BUILD_JOBS", "1"))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("impl=trigd"):
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            rows[(kv["dtype"], int(kv["block"]))] = kv
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="64:6.1,128:4.5",
                    help="channels:grid step mm, comma-separated")
    ap.add_argument("--keep", help="write the exported operators here")
    args = ap.parse_args()
    if os.environ.get("OPENBLAS_CORETYPE"):
        print(f"# WARNING: OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} pins NumPy's "
              "OpenBLAS kernel; unset it for a fair comparison (see the docstring)",
              file=sys.stderr, flush=True)
    mne.set_log_level("ERROR")
    rng = np.random.default_rng(0)
    budget = 0.5 if args.quick else 1.5
    outdir = args.keep or tempfile.mkdtemp(prefix="eeg_vs_mne_")
    os.makedirs(outdir, exist_ok=True)
    sizes = [(int(a), float(b)) for a, b in (s.split(":") for s in args.sizes.split(","))]
    ops = []
    for n_ch, pos_mm in sizes:
        t = time.perf_counter()
        info, inv = build(n_ch, pos_mm, rng)
        prepared = prepare_inverse_operator(inv, 1, LAMBDA2, METHOD)
        K, noise_norm, _, _ = _assemble_kernel(prepared, None, METHOD, None)
        n_src = inv["nsource"]
        assert K.shape == (3 * n_src, n_ch), K.shape
        noise_norm = np.asarray(noise_norm).reshape(-1)
        assert noise_norm.shape == (n_src,), noise_norm.shape
        kpath = os.path.join(outdir, f"kernel_{n_ch}x{n_src}.npy")
        npath = os.path.join(outdir, f"noise_norm_{n_ch}x{n_src}.npy")
        np.save(kpath, np.ascontiguousarray(K, dtype=np.float64))
        np.save(npath, noise_norm.astype(np.float64))
        # The export reproduces MNE's own result.
        raw = mne.io.RawArray(1e-5 * rng.standard_normal((n_ch, 32)), info.copy())
        stc = apply_inverse_raw(raw, prepared, LAMBDA2, METHOD, prepared=True)
        mine = combine_xyz(K @ raw.get_data()) * noise_norm[:, None]
        err = np.abs(mine - stc.data).max() / np.abs(stc.data).max()
        assert err < 1e-10, f"exported kernel differs from MNE's apply_inverse_raw: {err}"
        print(f"# {n_ch} ch x {n_src} sources: operator built in {time.perf_counter() - t:.1f} s, "
              f"export reproduces apply_inverse_raw to {err:.1e}", flush=True)
        ops.append((n_ch, n_src, info, prepared, K, noise_norm[:, None], kpath, npath))

    # side -> (n_ch, dtype, block) -> [median per round]
    results = {}
    def put(side, key, v):
        results.setdefault(side, {}).setdefault(key, []).append(v)
    for rnd in range(args.rounds):
        for n_ch, n_src, info, prepared, K, nn, kpath, npath in ops:
            for block in BLOCKS:
                raw = mne.io.RawArray(1e-5 * rng.standard_normal((n_ch, block)), info.copy())
                x = raw.get_data()
                med, _ = timeit(lambda: apply_inverse_raw(raw, prepared, LAMBDA2, METHOD,
                                                          prepared=True), budget)
                put("mne_apply_inverse_raw", (n_ch, n_src, "f64", block), med)
                med, _ = timeit(lambda: combine_xyz(K @ x) * nn, budget)
                put("numpy_kernel", (n_ch, n_src, "f64", block), med)
            for extra, side in ((["--amplitudes"], "trigd"), ([], "trigd_stats_only")):
                rows = run_trigd(kpath, npath, args.quick, extra)
                for (dtype, block), kv in rows.items():
                    put(side, (n_ch, n_src, dtype, block), float(kv["latency_us_median"]) / 1e6)
                    if side == "trigd":
                        put("trigd_pct_of_floor", (n_ch, n_src, dtype, block),
                            float(kv["pct_of_floor"]))
        print(f"# round {rnd + 1}/{args.rounds} done", flush=True)

    print(f"mne {mne.__version__}, numpy {np.__version__}, threads {THREADS} for both "
          f"(OMP/OPENBLAS/MKL_NUM_THREADS={THREADS}, trigd --threads {THREADS}), "
          f"{METHOD}, lambda2 = 1/9, {args.rounds} rounds; NumPy's BLAS: "
          f"{blas_description()}")
    print("| impl | dtype | channels | sources | block | median over rounds, us | samples/s |")
    print("|---|---|---|---|---|---|---|")
    for side in ("mne_apply_inverse_raw", "numpy_kernel", "trigd", "trigd_stats_only"):
        for key in sorted(results.get(side, {})):
            n_ch, n_src, dtype, block = key
            med = float(np.median(results[side][key]))
            print(f"| {side} | {dtype} | {n_ch} | {n_src} | {block} | {med * 1e6:.1f} | {block / med:.0f} |")
    print()
    print("| channels | sources | block | trigd f64 vs MNE (per round) | trigd f32 vs MNE | "
          "trigd f64 vs numpy_kernel | trigd % of floor f64 / f32 |")
    print("|---|---|---|---|---|---|---|")
    mne_r = results["mne_apply_inverse_raw"]
    for key in sorted(mne_r):
        n_ch, n_src, _, block = key
        t64 = results["trigd"].get((n_ch, n_src, "f64", block))
        t32 = results["trigd"].get((n_ch, n_src, "f32", block))
        npk = results["numpy_kernel"][key]
        if not t64 or not t32:
            continue
        per_round = [m / t for m, t in zip(mne_r[key], t64)]
        s32 = np.median([m / t for m, t in zip(mne_r[key], t32)])
        snp = np.median([m / t for m, t in zip(npk, t64)])
        pct = results["trigd_pct_of_floor"]
        print(f"| {n_ch} | {n_src} | {block} | {np.median(per_round):.1f}x "
              f"({', '.join(f'{r:.1f}' for r in per_round)}) | {s32:.1f}x | {snp:.1f}x | "
              f"{np.median(pct[(n_ch, n_src, 'f64', block)]):.0f} / "
              f"{np.median(pct[(n_ch, n_src, 'f32', block)]):.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
