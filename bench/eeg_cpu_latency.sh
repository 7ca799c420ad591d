#!/usr/bin/env bash
# End-to-end EEG latency through the daemon on the CPU backend: EEG_C channels x EEG_S
# sources (default 64 x 8,000, sLORETA), one sample per frame at EEG_RATE_HZ (default
# 2 kHz) for EEG_SECONDS (default 5) over UDP from `trigd send` on the same host, from frame
# arrival to decision. p50/p99/max come from every frame's `latency_us` in the decision log
# (exact, not bucketed; timeouts included); the per-stage split from trigd's Prometheus histograms
# (power-of-two buckets, interpolated). The CPU counterpart of bench/eeg_gpu_latency.sh.
#   EEG_THREADS=N (eeg.threads; unset: automatic)  EEG_PRECISION=f32|f64  EEG_BATCH_MAX=64
#   bench/eeg_cpu_latency.sh                       (TRIGD_BIN overrides target/release/trigd)
set -euo pipefail
B=${TRIGD_BIN:-target/release/trigd}
C=${EEG_C:-64}; S=${EEG_S:-8000}; RATE=${EEG_RATE_HZ:-2000}; SECS=${EEG_SECONDS:-5}
D=$(mktemp -d)
PID=0
trap '[ "$PID" != 0 ] && kill $PID 2>/dev/null; rm -rf "$D"' EXIT
EEG_C=$C EEG_S=$S python3 - "$D" <<'EOF'
import numpy as np, os, sys
d = sys.argv[1]; rng = np.random.default_rng(0)
C, S = int(os.environ["EEG_C"]), int(os.environ["EEG_S"])
np.save(f"{d}/lf.npy", (rng.standard_normal((C, 3 * S)) * 1e-7).astype(np.float32))
np.save(f"{d}/src.npy", rng.uniform(-0.07, 0.07, (S, 3)))
A = rng.standard_normal((C, C)); np.save(f"{d}/cov.npy", (A @ A.T / C + np.eye(C)) * 1e-12)
open(f"{d}/ch.txt", "w").write("\n".join(f"E{i:03d}" for i in range(C)) + "\n")
EOF
$B simulate eeg --lead-field $D/lf.npy --source-positions $D/src.npy --channels $D/ch.txt \
  --dipole-mm 10,10,10 --amplitude-nam 50 --burst-hz 10 --onsets-s 1,3 --noise-uv 1 \
  --sample-rate-hz $RATE --duration-s $SECS --seed 0 --out $D/sim.bdf >/dev/null
$B convert $D/sim.bdf --out $D/sim.trgr --channels $D/ch.txt --block-samples 1 >/dev/null
THREADS_LINE=""
[ -n "${EEG_THREADS:-}" ] && THREADS_LINE="threads = $EEG_THREADS"
cat > $D/cfg.toml <<EOF
[daemon]
workload = "eeg"
backend = "cpu"
metrics_addr = "127.0.0.1:9556"
budget_ms = 5.0
batch_max = ${EEG_BATCH_MAX:-64}
[[input]]
listen = "udp://127.0.0.1:7556"
[output]
decisions_jsonl = "$D/decisions.jsonl"
fsync = "never"
[eeg]
leadfield = "$D/lf.npy"
src = "$D/src.npy"
noise_cov = "$D/cov.npy"
channels = "$D/ch.txt"
method = "sLORETA"
lambda2 = 0.111
precision = "${EEG_PRECISION:-f32}"
block_samples = 1
$THREADS_LINE
[eeg.roi]
sphere = { centre_mm = [10.0, 10.0, 10.0], radius_mm = 20.0 }
window_ms = 10.0
threshold = 1.0e30
refractory_ms = 100.0
EOF
$B run --config $D/cfg.toml >$D/run.out 2>$D/run.err & PID=$!
for i in $(seq 1 600); do
  curl -sf 127.0.0.1:9556/readyz >/dev/null 2>&1 && break; sleep 0.1
done
$B send $D/sim.trgr --to udp://127.0.0.1:7556 --rate $RATE
sleep 1
curl -s 127.0.0.1:9556/metrics > $D/m.txt
kill -TERM $PID; wait $PID || true; PID=0
grep -o 'EEG product on the CPU.*' $D/run.err | head -1 || true
python3 - "$D" <<'EOF'
import json, os, re, sys
import numpy as np
d = sys.argv[1]
recs = [json.loads(l) for l in open(f"{d}/decisions.jsonl")]
# Every frame counts, timeouts included (a frame past its deadline is recorded at the time
# it was resolved, so it weighs in the tail as it should).
lat = np.array([r["latency_us"] for r in recs if "latency_us" in r])
outcomes = {}
for r in recs:
    outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
text = open(f"{d}/m.txt").read()
def q(name, filt, p):
    b = []
    for l in text.splitlines():
        if l.startswith(name + "_bucket{") and filt in l:
            le = re.search(r'le="([^"]+)"', l).group(1)
            b.append((float("inf") if le == "+Inf" else float(le), float(l.rsplit(" ", 1)[1])))
    b.sort(); tot = b[-1][1]; r = p * tot; prev = (0.0, 0.0)
    for le, c in b:
        if c >= r:
            return prev[0] if le == float("inf") else prev[0] + (le - prev[0]) * (r - prev[1]) / max(c - prev[1], 1e-12)
        prev = (le, c)
    return prev[0]
th = os.environ.get("EEG_THREADS", "auto")
print(f"| {os.environ.get('EEG_C', 64)} ch x {os.environ.get('EEG_S', 8000)} sources, 1 sample/frame at "
      f"{os.environ.get('EEG_RATE_HZ', 2000)} Hz, CPU, {os.environ.get('EEG_PRECISION', 'f32')}, threads {th} "
      f"| p50 (us) | p99 (us) | max (us) |")
print("|---|---|---|---|")
print(f"| arrival to decision ({len(lat)} frames, timeouts included; outcomes {outcomes}) | "
      f"{np.percentile(lat, 50):.1f} | {np.percentile(lat, 99):.1f} | {lat.max():.1f} |")
for s in ["queue", "batch", "reconstruct", "decide", "sink"]:
    f = 'stage="%s"' % s
    print("| stage %s (histogram) | %.1f | %.1f | |" % (s, q('trigd_stage_seconds', f, .5) * 1e6, q('trigd_stage_seconds', f, .99) * 1e6))
EOF
