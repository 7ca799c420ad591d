#!/usr/bin/env python3
"""An LSL amplifier and stimulus program for trigd's tests, written with pylsl only (no
trigd code): plays an EDF recording as an LSL EEG outlet with its channel labels and
units in the stream's metadata (desc/channels/channel/{label,unit,type}), and listens to
trigd's marker stream with a pylsl inlet.

The EDF file is read here by a few lines of Python of its own (16-bit EDF, one sample
rate), samples are pushed in microvolts (as amplifiers publish them) at the recorded rate,
each stamped t0 + i / rate on the LSL clock, so the time of every sample is known exactly.

Options let the outlet stop and come back (another outlet, same source id) after a pause,
skipping samples, as an amplifier that was switched off and on would.

Writes a JSON summary to --out: t0, rate, samples pushed, the markers received (time
stamp and text) and where the pause fell.
"""

import argparse
import json
import struct
import sys
import threading
import time

import pylsl


def read_edf(path):
    """Returns (labels, units, rate_hz, samples[channel][t]) in physical units."""
    with open(path, "rb") as f:
        raw = f.read()
    n_records = int(raw[236:244].decode().strip())
    duration = float(raw[244:252].decode().strip())
    ns = int(raw[252:256].decode().strip())
    pos = 256

    def field(width):
        nonlocal pos
        out = [raw[pos + i * width:pos + (i + 1) * width].decode("latin-1").strip() for i in range(ns)]
        pos += ns * width
        return out

    labels = field(16)
    field(80)
    units = field(8)
    pmin = [float(x) for x in field(8)]
    pmax = [float(x) for x in field(8)]
    dmin = [float(x) for x in field(8)]
    dmax = [float(x) for x in field(8)]
    field(80)
    spr = [int(x) for x in field(8)]
    field(32)
    data_start = int(raw[184:192].decode().strip())
    signals = [s for s in range(ns) if labels[s] != "EDF Annotations"]
    rate = spr[signals[0]] / duration
    record_bytes = 2 * sum(spr)
    samples = [[] for _ in signals]
    for r in range(n_records):
        off = data_start + r * record_bytes
        for s in range(ns):
            vals = struct.unpack_from("<%dh" % spr[s], raw, off)
            off += 2 * spr[s]
            if s in signals:
                k = signals.index(s)
                g = (pmax[s] - pmin[s]) / (dmax[s] - dmin[s])
                samples[k].extend((v - dmin[s]) * g + pmin[s] for v in vals)
    return [labels[s] for s in signals], [units[s] for s in signals], rate, samples


def to_microvolts(unit):
    return {"uV": 1.0, "µV": 1.0, "mV": 1e3, "V": 1e6, "nV": 1e-3}[unit]


def make_outlet(args, labels, rate):
    info = pylsl.StreamInfo(args.name, "EEG", len(labels), rate, "float32", args.source_id)
    chans = info.desc().append_child("channels")
    for label in labels:
        ch = chans.append_child("channel")
        ch.append_child_value("label", label)
        ch.append_child_value("unit", "microvolts")
        ch.append_child_value("type", "EEG")
    info.desc().append_child_value("manufacturer", "trigd test player")
    outlet = pylsl.StreamOutlet(info, 8, 30)
    if not outlet.wait_for_consumers(args.consumer_wait_s):
        sys.exit("lsl_player: nobody connected to the EEG outlet within %.0f s" % args.consumer_wait_s)
    return outlet


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--edf", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--source-id", default="trigd-test-amp")
    p.add_argument("--markers", help="name of trigd's marker stream to listen to")
    p.add_argument("--expect-markers", type=int, default=0)
    p.add_argument("--marker-wait-s", type=float, default=10.0)
    p.add_argument("--consumer-wait-s", type=float, default=60.0)
    p.add_argument("--pause-at", type=int, help="stop the outlet before this sample")
    p.add_argument("--pause-s", type=float, default=1.0)
    p.add_argument("--skip", type=int, default=0, help="samples never sent during the pause")
    p.add_argument("--extra-label", help="publish one more channel with this label")
    p.add_argument("--omit-label", help="leave this channel out of the stream")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    labels, units, rate, samples = read_edf(args.edf)
    scale = [to_microvolts(u) for u in units]
    if args.omit_label:
        k = labels.index(args.omit_label)
        del labels[k], units[k], scale[k], samples[k]
    if args.extra_label:
        labels.append(args.extra_label)
        scale.append(1.0)
        samples.append([0.0] * len(samples[0]))
    n = len(samples[0])

    markers = []
    done = threading.Event()
    if args.markers:
        found = pylsl.resolve_byprop("name", args.markers, 1, 30.0)
        if not found:
            sys.exit("lsl_player: trigd's marker stream %r not found" % args.markers)
        inlet = pylsl.StreamInlet(found[0])
        inlet.open_stream(10.0)

        def listen():
            while not done.is_set():
                m, ts = inlet.pull_sample(0.1)
                if m is not None:
                    markers.append({"ts": ts, "text": m[0]})

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()

    outlet = make_outlet(args, labels, rate)
    t0 = pylsl.local_clock() + 0.05
    pushed = 0
    i = 0
    restarted_at = None
    while i < n:
        if args.pause_at is not None and i == args.pause_at and restarted_at is None:
            # liblsl sends pushed samples from its own threads: give it time to send the
            # last ones before the outlet goes (the test wants blocks before the pause whole).
            linger = min(0.3, args.pause_s)
            time.sleep(linger)
            del outlet
            time.sleep(args.pause_s - linger)
            i += args.skip
            restarted_at = i
            outlet = make_outlet(args, labels, rate)
            continue
        ts = t0 + i / rate
        wait = ts - pylsl.local_clock()
        if wait > 0:
            time.sleep(wait)
        outlet.push_sample([samples[c][i] * scale[c] for c in range(len(labels))], ts)
        pushed += 1
        i += 1

    if args.markers:
        end = time.monotonic() + args.marker_wait_s
        while time.monotonic() < end and len(markers) < args.expect_markers:
            time.sleep(0.05)
        # A little longer: a marker beyond the expected count must be seen too.
        time.sleep(0.3)
        done.set()
    else:
        time.sleep(0.5)
    with open(args.out, "w") as f:
        json.dump({
            "t0": t0, "rate": rate, "pushed": pushed, "n": n, "labels": labels,
            "restarted_at": restarted_at, "markers": list(markers),
        }, f)


if __name__ == "__main__":
    main()
