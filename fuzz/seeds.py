#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets, one directory per target.

    python3 fuzz/seeds.py TRIGD_BINARY OUT_DIR

Seeds are small valid inputs (from the fixtures, or written by `trigd simulate` /
`trigd replay` with the binary given) so that the fuzzer starts past the checksums and
magic numbers. Campaigns start from these seeds plus the committed corpus, and the merged
corpus (`-merge=1`) is what is committed under fuzz/corpus/TARGET/.
"""

import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def frame(kind: int, source: int, seq: int, payload: bytes) -> bytes:
    header = b"TRGF" + struct.pack(
        "<HHIIQQII", 1, kind, source, len(payload), seq, 1_000 * seq, crc32c(payload), 0
    )
    assert len(header) == 40
    return header + payload


def hit_event(hits) -> bytes:
    payload = struct.pack("<II", len(hits), 0)
    for i, (x, y, z, plane) in enumerate(hits):
        payload += struct.pack("<fffIHH", x, y, z, i + 1, plane, 0)
    return payload


def eeg_block(n_channels: int, n_samples: int) -> bytes:
    payload = struct.pack("<HHIdQ", n_channels, 0, n_samples, 250.0, 0)
    for c in range(n_channels):
        for t in range(n_samples):
            payload += struct.pack("<f", 1e-6 * (c - t))
    return payload


def npy(dtype: str, shape, values) -> bytes:
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        dtype,
        "".join(f"{s}, " for s in shape) if len(shape) != 1 else f"{shape[0]},",
    )
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    fmt = {"<f4": "f", "<f8": "d"}[dtype]
    return (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", len(header))
        + header.encode()
        + struct.pack("<%d%s" % (len(values), fmt), *values)
    )


def write(out: str, target: str, name: str, data: bytes) -> None:
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def fixture(path: str) -> bytes:
    with open(os.path.join(ROOT, "fixtures", path), "rb") as f:
        return f.read()


def head_lines(data: bytes, n: int) -> bytes:
    return b"\n".join(data.split(b"\n")[:n]) + b"\n"


def main() -> None:
    trigd, out = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp()

    # frame: a hit event, an empty event and an EEG block.
    hits = [(1.0 * p, -2.0 * p, 300.0 + 100.0 * p, p) for p in range(5)]
    write(out, "frame", "hits", frame(1, 7, 1, hit_event(hits)))
    write(out, "frame", "empty_event", frame(1, 7, 2, hit_event([])))
    write(out, "frame", "eeg_block", frame(2, 3, 1, eeg_block(2, 4)))

    # recording: finished files written by `trigd simulate`, and one cut before its index.
    rec = os.path.join(tmp, "events.trgd")
    subprocess.run(
        [trigd, "simulate", "tracking", "--multiplicity", "2", "--events", "3",
         "--seed", "1", "--geometry", os.path.join(ROOT, "fixtures/detector.toml"),
         "--out", os.path.join(tmp, "events"), "--recording", rec],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open(rec, "rb") as f:
        data = f.read()
    write(out, "recording", "finished", data)
    index_at = struct.unpack("<Q", data[-24:-16])[0]
    write(out, "recording", "torn", data[:index_at + 5])
    # Records alone (the target also reads its input behind a valid file header).
    write(out, "recording", "records", data[32:index_at])

    # binlog: a decision log written by `trigd replay`, and one record alone.
    binlog = os.path.join(tmp, "decisions.bin")
    subprocess.run(
        [trigd, "replay", os.path.join(ROOT, "fixtures/tracking/minbias"),
         "--workload", "tracking", "--backend", "cpu",
         "--geometry", os.path.join(ROOT, "fixtures/detector.toml"),
         "--decisions-bin", binlog],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open(binlog, "rb") as f:
        data = f.read()
    write(out, "binlog", "replay_minbias", data)
    # Three events of 112-byte records after the header; one record alone is what the
    # UDP decision stream carries.
    header_len = len(data) - 3 * 112
    assert data[header_len:header_len + 4] == b"TDR\x01"
    write(out, "binlog", "header_only", data[:header_len])
    write(out, "binlog", "one_record", data[header_len:header_len + 112])

    # daemon_config: the annotated example, and configurations of each kind of input and
    # workload (and one refused value).
    with open(os.path.join(ROOT, "deploy", "trigd.toml"), "rb") as f:
        write(out, "daemon_config", "deploy_trigd.toml", f.read())
    for name, text in [
        ("empty.toml", ""),
        ("nats_farm.toml", '[daemon]\nring_slots = 64\n[[input]]\n'
         'listen = "nats://127.0.0.1:4222/FRAMES"\nsubject = "FRAMES.>"\ndurable = "node"\n'
         'ack_wait_s = 2\nconnect_retry_s = 10\n[output]\n'
         'decisions_nats = "nats://127.0.0.1:4222/DECISIONS"\n'),
        ("lsl_eeg.toml", '[daemon]\nworkload = "eeg"\n[[input]]\n'
         'listen = "lsl://type=EEG&unit=uV"\ndrop_channels = ["Status"]\n'
         'extra_channels = "drop"\n[output]\nlsl_markers = "m"\nlsl_markers_format = "code"\n'),
        ("tracking_gpu.toml", '[daemon]\nworkload = "tracking"\nbackend = "auto"\n'
         'budget_ms = 5.0\ngpu_workers = 8\ngpu_wait = "yield"\nbatch_max = 32\n'
         'admission = "deadline"\n[[input]]\nlisten = "udp://127.0.0.1:7000"\n'
         '[tracking]\ngeometry = "fixtures/detector.toml"\n'),
        ("bad_wait.toml", '[daemon]\ngpu_wait = "sleep"\n'),
    ]:
        write(out, "daemon_config", name, text.encode())

    # detector_toml: the shipped geometries, and a small field map.
    for name in ["detector.toml", "telescope.toml", "tracking/forward/detector_forward.toml",
                 "tracking/dipole/detector_dipole.toml"]:
        write(out, "detector_toml", os.path.basename(name), fixture(name))
    write(out, "detector_toml", "field_2x2x2.npy",
          npy("<f4", (2, 2, 2, 3), [0.0, 1.0, 0.0] * 8))

    # edf: the fixture recordings.
    for name in ["eeg/dipole.edf", "edf/mne_export.edf"]:
        write(out, "edf", os.path.basename(name), fixture(name))

    # finder_overrides: overrides text, then hits of 10 bytes (x, y as f32, plane as u16).
    text = b"min_p_gev = 0.5\nmin_hits = 4\nallow_missing_plane = true\n"
    body = b""
    for t in range(3):
        for p in range(5):
            body += struct.pack("<ffH", 5.0 * t + 0.5 * p, -3.0 * t + 0.2 * p, p)
    write(out, "finder_overrides", "straight_tracks", bytes([len(text)]) + text + body)
    write(out, "finder_overrides", "hits_only", bytes([0]) + body)

    # kernel_cache_entry: a PTX and a CUBIN entry.
    for kind, name, payload in [(2, "ptx", b".version 8.0\n.target sm_90\n"), (1, "cubin", b"\x7fELF\x02\x01\x01")]:
        write(out, "kernel_cache_entry", name,
              b"TRIGDKC1" + bytes([kind]) + struct.pack("<QI", len(payload), crc32c(payload)) + payload)

    # npy: small fixture arrays of both dtypes.
    write(out, "npy", "noise_cov.npy", fixture("eeg/noise_cov.npy"))
    write(out, "npy", "source_pos.npy", fixture("eeg/source_pos.npy"))
    write(out, "npy", "sos.npy", fixture("filter/sos_bp_1_8.0_12.0_512.npy"))
    write(out, "npy", "f4_2x3.npy", npy("<f4", (2, 3), [1, 2, 3, 4, 5, 6]))

    # trackml_csv: the first rows of each file kind, and a submission.
    for kind in ["hits", "truth", "particles"]:
        write(out, "trackml_csv", kind, head_lines(fixture(f"tracking/minbias/event000000000-{kind}.csv"), 6))
    write(out, "trackml_csv", "submission", b"event_id,hit_id,track_id\n0,1,1\n0,2,1\n0,3,0\n")

    # trigger_lines: the lines of the module's documentation.
    write(out, "trigger_lines", "lines.toml",
          b'[[line]]\nname = "single_high_p"\nmin_tracks = 1\nmin_p_gev = 10.0\n\n'
          b'[[line]]\nname = "two_good_tracks"\nmin_tracks = 2\nmin_p_gev = 1.0\n'
          b'max_chi2_ndf = 3.0\nmin_hits = 6\n\n[[line]]\nname = "negative"\n'
          b'min_tracks = 1\ncharge = -1\n')


if __name__ == "__main__":
    main()
