#!/usr/bin/env bash
# End-to-end EEG latency on the daemon: 256 channels x 20,484 sources (sLORETA), one sample
# per frame at 2 kHz over UDP, from frame arrival to decision, read from trigd's own
# Prometheus histograms. Needs python3 with numpy; runs on whatever backend is asked for.
#   bench/eeg_gpu_latency.sh [gpu|cpu]      (TRIGD_BIN overrides target/release/trigd)
set -euo pipefail
BACKEND=${1:-gpu}
B=${TRIGD_BIN:-target/release/trigd}
D=$(mktemp -d)
trap '[ "$PID" != 0 ] && kill $PID 2>/dev/null; rm -rf "$D"' EXIT
PID=0
python3 - "$D" <<'EOF'
import numpy as np, sys
d = sys.argv[1]; rng = np.random.default_rng(0)
import os; C, S = int(os.environ.get("EEG_C", 256)), int(os.environ.get("EEG_S", 20484))
np.save(f"{d}/lf.npy", (rng.standard_normal((C, 3 * S)) * 1e-7).astype(np.float32))
np.save(f"{d}/src.npy", rng.uniform(-0.07, 0.07, (S, 3)))
A = rng.standard_normal((C, C)); np.save(f"{d}/cov.npy", (A @ A.T / C + np.eye(C)) * 1e-12)
open(f"{d}/ch.txt", "w").write("\n".join(f"E{i:03d}" for i in range(C)) + "\n")
EOF
$B simulate eeg --lead-field $D/lf.npy --source-positions $D/src.npy --channels $D/ch.txt \
  --dipole-mm 10,10,10 --amplitude-nam 50 --burst-hz 10 --onsets-s 1,3 --noise-uv 1 \
  --sample-rate-hz 2000 --duration-s 5 --seed 0 --out $D/sim.bdf >/dev/null
$B convert $D/sim.bdf --out $D/sim.trgr --channels $D/ch.txt --block-samples 1 >/dev/null
cat > $D/cfg.toml <<EOF
[daemon]
workload = "eeg"
backend = "$BACKEND"
metrics_addr = "127.0.0.1:9555"
budget_ms = 5.0
batch_max = 1
[[input]]
listen = "udp://127.0.0.1:7555"
[eeg]
leadfield = "$D/lf.npy"
src = "$D/src.npy"
noise_cov = "$D/cov.npy"
channels = "$D/ch.txt"
method = "sLORETA"
lambda2 = 0.111
block_samples = 1
[eeg.roi]
sphere = { centre_mm = [10.0, 10.0, 10.0], radius_mm = 20.0 }
window_ms = 10.0
threshold = 1.0e30
refractory_ms = 100.0
EOF
$B run --config $D/cfg.toml >$D/run.out 2>$D/run.err & PID=$!
for i in $(seq 1 600); do
  curl -sf 127.0.0.1:9555/readyz >/dev/null 2>&1 && break; sleep 0.1
done
$B send $D/sim.trgr --to udp://127.0.0.1:7555 --rate 2000
sleep 1
curl -s 127.0.0.1:9555/metrics > $D/m.txt
kill -TERM $PID; wait $PID || true; PID=0
cat $D/run.out
python3 - "$D/m.txt" "$BACKEND" <<'EOF'
import sys, re
text = open(sys.argv[1]).read()
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
import os
print(f"| {os.environ.get('EEG_C', 256)} ch x {os.environ.get('EEG_S', 20484)} sources, 1 sample/frame at 2 kHz, backend {sys.argv[2]} | p50 (us) | p99 (us) |")
print("|---|---|---|")
print(f"| arrival to decision | {q('trigd_decision_latency_seconds', '', .5)*1e6:.1f} | {q('trigd_decision_latency_seconds', '', .99)*1e6:.1f} |")
for s in ["queue", "batch", "reconstruct", "decide", "sink"]:
    f = 'stage="%s"' % s
    print("| stage %s | %.1f | %.1f |" % (s, q('trigd_stage_seconds', f, .5) * 1e6, q('trigd_stage_seconds', f, .99) * 1e6))
EOF
