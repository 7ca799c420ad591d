#!/usr/bin/env python3
"""MNE-Python's apply_inverse_raw against trigd's kernel apply, same sizes, one run.

For 64 channels x ~5000 sources and 128 channels x ~20000 sources this builds a real
inverse operator with MNE (sphere head model, standard_1005 montage subset, volume source
space with the grid step chosen to give about that many sources, make_forward_solution,
noise covariance from simulated noise, make_inverse_operator loose=1 depth=0.8), then
times, per block of 1 and 32 samples (dSPM, lambda2 = 1/9):
  mne_prepared    apply_inverse_raw(raw_block, inv_prepared, ..., prepared=True)
                  (what MNE does per call once the operator is prepared: assemble the
                  kernel, multiply, combine orientations, build the stc)
  numpy_kernel    K @ x with MNE's assembled kernel, then combine_xyz and noise norm
                  (a lower bound for any NumPy implementation, not an MNE API)
then runs `cargo bench --bench eeg_cpu -- --quick` (trigd, one thread, random operator
of the same size: the cost does not depend on the values) and prints both.

Run from the crate root:  python3 bench/eeg_vs_mne.py  [--skip-trigd]
"""

import os
import re
import subprocess
import sys
import time

# One BLAS thread, as trigd's bench uses one thread (and a shared machine is not
# oversubscribed). Set EEG_BENCH_THREADS to change it.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ.get("EEG_BENCH_THREADS", "1"))

import numpy as np  # noqa: E402

import mne  # noqa: E402
from mne.minimum_norm import (  # noqa: E402
    apply_inverse_raw,
    make_inverse_operator,
    prepare_inverse_operator,
)
from mne.minimum_norm.inverse import _assemble_kernel, combine_xyz  # noqa: E402

SIZES = [(64, 7.5), (128, 4.7)]  # (channels, grid step mm) -> ~5000, ~20000 sources
BLOCKS = [1, 32]
LAMBDA2 = 1.0 / 9.0
SFREQ = 512.0


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
    return info, inv


def timeit(fn, budget_s=2.0, min_calls=3):
    lat = []
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s or len(lat) < min_calls:
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    lat = np.array(lat)
    return np.median(lat), np.percentile(lat, 99), len(lat)


def main():
    mne.set_log_level("ERROR")
    rng = np.random.default_rng(0)
    rows = []
    for n_ch, pos_mm in SIZES:
        info, inv = build(n_ch, pos_mm, rng)
        n_src = inv["nsource"]
        prepared = prepare_inverse_operator(inv, 1, LAMBDA2, "dSPM")
        K, noise_norm, _, _ = _assemble_kernel(prepared, None, "dSPM", None)
        for block in BLOCKS:
            raw = mne.io.RawArray(1e-5 * rng.standard_normal((n_ch, block)), info.copy())
            raw.set_eeg_reference(projection=True)
            x = raw.get_data()

            def mne_call():
                apply_inverse_raw(raw, prepared, LAMBDA2, "dSPM", prepared=True)

            def numpy_call():
                combine_xyz(K @ x) * noise_norm

            for name, fn in (("mne_prepared", mne_call), ("numpy_kernel", numpy_call)):
                med, p99, calls = timeit(fn)
                rows.append((name, "f64", n_ch, n_src, block, calls, med * 1e6, p99 * 1e6, block / med))
    trigd = []
    if "--skip-trigd" not in sys.argv:
        out = subprocess.run(
            ["cargo", "bench", "--bench", "eeg_cpu", "--", "--quick"],
            check=True, capture_output=True, text=True,
        ).stdout
        for line in out.splitlines():
            if line.startswith("impl=trigd"):
                kv = dict(re.findall(r"(\w+)=(\S+)", line))
                trigd.append(kv)
                rows.append(("trigd", kv["dtype"], int(kv["n_channels"]), int(kv["n_sources"]),
                             int(kv["block"]), int(kv["calls"]), float(kv["latency_us_median"]),
                             float(kv["latency_us_p99"]), float(kv["samples_per_s"])))
    print(f"mne {mne.__version__}, numpy {np.__version__}, BLAS threads {os.environ['OMP_NUM_THREADS']}")
    print("| impl | dtype | channels | sources | block | calls | latency median us | p99 us | samples/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.1f} | {r[7]:.1f} | {r[8]:.0f} |")
    # Speed-up of trigd f64 over MNE per (channels, block); sizes differ slightly in
    # sources (MNE's grid count vs the round number): compare per source.
    for r in rows:
        if r[0] != "mne_prepared":
            continue
        for t in rows:
            if t[0] == "trigd" and t[1] == "f64" and t[2] == r[2] and t[4] == r[4]:
                ratio = (r[6] / r[3]) / (t[6] / t[3])
                print(f"speed-up trigd f64 vs MNE apply_inverse_raw, {r[2]} ch, block {r[4]}: "
                      f"{ratio:.1f}x (per-source latency)")


if __name__ == "__main__":
    main()
