#!/usr/bin/env python3
"""EEG latency through trigd over the Lab Streaming Layer, against the same over UDP.

An amplifier written with pylsl pushes one sample at a time at --rate-hz (default 2 kHz),
each stamped with the LSL clock at its push; trigd decides one sample per frame
(eeg.block_samples = 1, sLORETA on the fixture lead field unless --leadfield etc. say
otherwise) and publishes a marker for every decision (--lsl-markers-all, short codes); a
pylsl inlet in another process takes each marker at once. Reported:

- lsl  end to end: marker received by the inlet - the sample's LSL time stamp (what a
  stimulus program listening to the markers sees);
- lsl  in trigd: trigd_lsl_marker_latency_seconds (sample time stamp to marker push),
  quantiles from the histogram's power-of-two buckets (interpolated);
- udp  end to end: the same samples as trigd frames in UDP datagrams, stamped at send,
  to the decision datagram (output.decisions_udp) received back, same host;
- added by LSL: lsl minus udp, end to end, p50 and p99.

Usage: bench/lsl_latency.py --backend cpu|gpu [--seconds 10] [--rate-hz 2000]
       (TRIGD_BIN overrides target/release/trigd; needs pylsl: ./setup.sh)
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FX = os.path.join(ROOT, "fixtures", "eeg")


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def hist_quantile(text, name, q):
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    want = q * total
    lo, prev = 0.0, 0.0
    for le, c in buckets:
        if c >= want:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (want - prev) / max(c - prev, 1e-9)
        lo, prev = le, c
    return lo


# CRC-32C (Castagnoli), for trigd frames over UDP.
_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def eeg_frame(seq, ts_ns, rate, first, samples_v):
    payload = struct.pack("<HHIdQ", len(samples_v), 0, 1, rate, first) + struct.pack("<%df" % len(samples_v), *samples_v)
    header = b"TRGF" + struct.pack("<HHIIQQII", 1, 2, 0, len(payload), seq, ts_ns, crc32c(payload), 0)
    return header + payload


def channels():
    with open(os.path.join(FX, "channels.txt")) as f:
        return [l.strip() for l in f if l.strip()]


def trigd_cmd(args, listen, extra):
    b = os.environ.get("TRIGD_BIN", os.path.join(ROOT, "target", "release", "trigd"))
    return [b, "run", "--workload", "eeg", "--backend", args.backend,
            "--leadfield", args.leadfield, "--src", args.src, "--noise-cov", args.noise_cov,
            "--channels", args.channels, "--method", "sLORETA", "--lambda2", "0.111",
            "--block-samples", "1", "--budget-ms", "50", "--listen", listen] + extra


def wait_metrics(port, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        try:
            return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=1).read().decode()
        except Exception:
            time.sleep(0.2)
    sys.exit("trigd did not start (no metrics on port %d)" % port)


def listen_markers(name, out_path, seconds):
    """Child process: a pylsl inlet on trigd's markers; writes one latency per marker."""
    import pylsl
    found = pylsl.resolve_byprop("name", name, 1, 30.0)
    if not found:
        sys.exit("marker stream not found")
    inlet = pylsl.StreamInlet(found[0])
    inlet.open_stream(10.0)
    lat = []
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        m, ts = inlet.pull_sample(0.2)
        if m is not None:
            lat.append(pylsl.local_clock() - ts)
    with open(out_path, "w") as f:
        json.dump(lat, f)


def run_lsl(args, tmp):
    import pylsl
    tag = "%d" % os.getpid()
    amp, markers = "bench-amp-" + tag, "bench-markers-" + tag
    port = args.metrics_port
    trigd = subprocess.Popen(
        trigd_cmd(args, "lsl://name=" + amp, [
            "--config", os.path.join(FX, "roi.toml"), "--lsl-markers", markers,
            "--lsl-markers-all", "--lsl-markers-format", "code",
            "--metrics-addr", "127.0.0.1:%d" % port]),
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "trigd-lsl.log"), "w"))
    try:
        wait_metrics(port)
        lat_path = os.path.join(tmp, "lsl-lat.json")
        listener = subprocess.Popen([sys.executable, __file__, "--role", "listen", "--markers", markers,
                                     "--out", lat_path, "--seconds", str(args.seconds + 8)],
                                    stdout=subprocess.PIPE)
        listener.stdout.readline()
        labels = channels()
        info = pylsl.StreamInfo(amp, "EEG", len(labels), args.rate_hz, "float32", "bench-" + tag)
        chans = info.desc().append_child("channels")
        for l in labels:
            ch = chans.append_child("channel")
            ch.append_child_value("label", l)
            ch.append_child_value("unit", "microvolts")
        outlet = pylsl.StreamOutlet(info, 1, 10)
        if not outlet.wait_for_consumers(30):
            sys.exit("trigd did not connect to the bench amplifier")
        time.sleep(1.5)  # trigd's clock offset estimate settles
        rng = random.Random(0)
        n = int(args.seconds * args.rate_hz)
        t0 = pylsl.local_clock() + 0.05
        for i in range(n):
            due = t0 + i / args.rate_hz
            while pylsl.local_clock() < due:
                pass
            outlet.push_sample([rng.gauss(0.0, 10.0) for _ in labels], pylsl.local_clock(), True)
        listener.wait()
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port).read().decode()
        with open(lat_path) as f:
            lat = json.load(f)
        return n, lat, text
    finally:
        trigd.terminate()
        trigd.wait()


def listen_udp(out_path, seconds):
    """Child process: receives trigd's decision datagrams; one latency per decision."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.2)
    print(rx.getsockname()[1], flush=True)
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            b, _ = rx.recvfrom(2048)
        except socket.timeout:
            continue
        now = time.time_ns()
        ts = struct.unpack_from("<Q", b, 16)[0]
        lat.append((now - ts) / 1e9)
    with open(out_path, "w") as f:
        json.dump(lat, f)


def run_udp(args, tmp):
    port = args.metrics_port + 1
    lat_path = os.path.join(tmp, "udp-lat.json")
    listener = subprocess.Popen([sys.executable, __file__, "--role", "listen-udp", "--out", lat_path,
                                 "--seconds", str(args.seconds + 6)], stdout=subprocess.PIPE)
    rx_port = int(listener.stdout.readline())
    cfg = os.path.join(tmp, "udp.toml")
    with open(os.path.join(FX, "roi.toml")) as f:
        roi = f.read()
    with open(cfg, "w") as f:
        f.write("[output]\ndecisions_udp = \"127.0.0.1:%d\"\n\n%s" % (rx_port, roi))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    in_port = probe.getsockname()[1]
    probe.close()
    trigd = subprocess.Popen(
        trigd_cmd(args, "udp://127.0.0.1:%d" % in_port, ["--config", cfg, "--metrics-addr", "127.0.0.1:%d" % port]),
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "trigd-udp.log"), "w"))
    try:
        wait_metrics(port)
        time.sleep(1.5)
        labels = channels()
        rng = random.Random(0)
        n = int(args.seconds * args.rate_hz)
        t0 = time.perf_counter() + 0.05
        for i in range(n):
            due = t0 + i / args.rate_hz
            while time.perf_counter() < due:
                pass
            samples = [rng.gauss(0.0, 10.0) * 1e-6 for _ in labels]
            tx.sendto(eeg_frame(i, time.time_ns(), args.rate_hz, i, samples), ("127.0.0.1", in_port))
        listener.wait()
        with open(lat_path) as f:
            return n, json.load(f)
    finally:
        trigd.terminate()
        trigd.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--rate-hz", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--leadfield", default=os.path.join(FX, "leadfield.npy"))
    p.add_argument("--src", default=os.path.join(FX, "source_pos.npy"))
    p.add_argument("--noise-cov", default=os.path.join(FX, "noise_cov.npy"))
    p.add_argument("--channels", default=os.path.join(FX, "channels.txt"))
    p.add_argument("--metrics-port", type=int, default=9571)
    p.add_argument("--skip-udp", action="store_true")
    p.add_argument("--role", default="bench")
    p.add_argument("--markers")
    p.add_argument("--out")
    args = p.parse_args()
    if args.role == "listen":
        listen_markers(args.markers, args.out, args.seconds)
        return
    if args.role == "listen-udp":
        listen_udp(args.out, args.seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "lsl_api.cfg")
        with open(cfg, "w") as f:
            f.write("[ports]\nIPv6 = disable\n[lab]\nSessionID = trigd-bench-%d\nKnownPeers = {127.0.0.1}\n"
                    "[multicast]\nResolveScope = machine\n" % os.getpid())
        os.environ["LSLAPICFG"] = cfg
        n, lat, text = run_lsl(args, tmp)
        ms = 1e3
        print("backend %s, %.0f Hz, one sample per frame, %d samples, %d channels" % (
            args.backend, args.rate_hz, n, len(channels())))
        print("lsl end to end  (sample stamp -> marker at a pylsl inlet): n %d  p50 %.3f ms  p99 %.3f ms  max %.3f ms" % (
            len(lat), quantile(lat, 0.5) * ms, quantile(lat, 0.99) * ms, max(lat) * ms))
        name = "trigd_lsl_marker_latency_seconds"
        print("lsl in trigd    (sample stamp -> marker push, histogram):  p50 %.3f ms  p99 %.3f ms" % (
            hist_quantile(text, name, 0.5) * ms, hist_quantile(text, name, 0.99) * ms))
        if not args.skip_udp:
            n_u, lat_u = run_udp(args, tmp)
            print("udp end to end  (frame stamp -> decision datagram back): n %d  p50 %.3f ms  p99 %.3f ms  max %.3f ms" % (
                len(lat_u), quantile(lat_u, 0.5) * ms, quantile(lat_u, 0.99) * ms, max(lat_u) * ms))
            print("added by LSL over UDP: p50 %+.3f ms  p99 %+.3f ms" % (
                (quantile(lat, 0.5) - quantile(lat_u, 0.5)) * ms, (quantile(lat, 0.99) - quantile(lat_u, 0.99)) * ms))


if __name__ == "__main__":
    main()
