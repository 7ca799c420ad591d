//! Fuzz entry points: one function per target under `fuzz/fuzz_targets/`, each feeding
//! arbitrary bytes to a parser and checking what must hold for any input (no panic, and
//! whatever parses agrees with itself or re-encodes to the same bytes).
//!
//! The fuzz targets are one-line wrappers around these functions, and
//! `tests/fuzz_corpus.rs` replays every committed corpus file through the same functions
//! with an ordinary `cargo test`, so the two cannot drift apart. A panic here is a finding:
//! the assertions are the property under test.

use std::path::Path;

use crate::frame::{self, HitRecord};
use crate::recording;
use crate::sinks::binlog::{decode_record, encode_header, encode_record, parse_binlog};
use crate::tracking::geometry::{Detector, Field, Plane};
use crate::tracking::reco::{FinderConfig, FinderOverrides, Reconstructor};
use zerocopy::IntoBytes;

/// A fuzz target's name (its file name under `fuzz/fuzz_targets/` and its corpus directory
/// under `fuzz/corpus/`) and its entry point.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target, by name.
pub const TARGETS: &[Target] = &[
    ("binlog", binlog),
    ("daemon_config", daemon_config),
    ("detector_toml", detector_toml),
    ("edf", edf),
    ("finder_overrides", finder_overrides),
    ("frame", frame),
    ("kernel_cache_entry", kernel_cache_entry),
    ("nats_url", nats_url),
    ("lsl_meta", lsl_meta),
    ("npy", npy),
    ("recording", recording),
    ("trackml_csv", trackml_csv),
    ("trigger_lines", trigger_lines),
];

/// The binary decision log reader and the single-record decoder (UDP stream): whatever
/// parses re-encodes to the same bytes (one encoding per log).
pub fn binlog(data: &[u8]) {
    if let Ok((names, decisions)) = parse_binlog(data) {
        let mut out = encode_header(&names).expect("parsed names re-encode");
        for d in &decisions {
            out.extend_from_slice(&encode_record(d).expect("parsed record re-encodes"));
        }
        assert_eq!(out, data);
    }
    if let Ok(d) = decode_record(data) {
        assert_eq!(
            encode_record(&d).expect("decoded record re-encodes")[..],
            data[..]
        );
    }
}

/// The farm's `nats://HOST:PORT/STREAM` address parser and the subject and name checks:
/// whatever parses prints to an address that parses back to the same value, and a parsed
/// stream name is a valid name.
pub fn nats_url(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::farm::valid_subject(text);
    let _ = crate::farm::valid_name(text);
    if let Ok(u) = text.parse::<crate::farm::NatsUrl>() {
        let again: crate::farm::NatsUrl = u
            .to_string()
            .parse()
            .expect("a printed address parses again");
        assert_eq!(again, u);
        if let Some(s) = &u.stream {
            assert!(crate::farm::valid_name(s));
        }
        assert!(u.port > 0);
    }
}

/// The daemon's configuration file (`trigd.toml`: every section, its checks, and the
/// inputs' address parsers): any text gives a configuration or an error naming the file;
/// what parses parses again to the same configuration, and every input's address reads.
pub fn daemon_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match crate::config::Config::from_str_named(text, "fuzz.toml") {
        Ok(cfg) => {
            let again = crate::config::Config::from_str_named(text, "fuzz.toml")
                .expect("a configuration that parsed once parses again");
            assert_eq!(format!("{cfg:?}"), format!("{again:?}"));
            for input in &cfg.inputs {
                let _ = input.nats_spec(cfg.daemon.ring_slots);
            }
        }
        Err(e) => assert!(e.to_string().contains("fuzz.toml"), "{e}"),
    }
}

/// The detector description parser (TOML) and the NPY field-map reader.
pub fn detector_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Detector::from_toml_str(text, "fuzz.toml");
    }
    if let Ok(map) = crate::tracking::field::FieldMap::from_npy_bytes(data, [0.0; 3], [1.0; 3]) {
        // The interpolation error and a refinement of any map read (small ones, so that
        // the target stays fast): a refined map keeps the grid's extent and its nodes, or
        // is an error where the cubics leave single precision.
        let (worst, rms) = map.interpolation_error();
        assert!(worst >= rms && rms >= 0.0);
        if map.nodes_tesla.len() <= 4096 {
            if let Ok(fine) = map.refined(2) {
                assert_eq!(fine.dims, map.dims.map(|n| 2 * n - 1));
                assert_eq!(fine.nodes_tesla[0], map.nodes_tesla[0]);
            }
        }
    }
}

/// The `lsl://` address parser and the LSL stream description reader with its channel
/// plan. The first byte says how many of the following bytes are the address; the rest is
/// the stream's XML description. Any input gives a value or an error; a plan always maps
/// each lead field channel to the stream channel of the same label (never a shift).
pub fn lsl_meta(data: &[u8]) {
    use crate::lsl::meta::{parse_stream_xml, plan_channels};
    use crate::lsl::url::{LslOptions, LslUrl};
    let split = data
        .first()
        .map(|&b| b as usize + 1)
        .unwrap_or(0)
        .min(data.len());
    let (address, xml) = data.split_at(split);
    if let Ok(text) = std::str::from_utf8(address.get(1..).unwrap_or(&[])) {
        if let Ok(u) = text.parse::<LslUrl>() {
            assert!(!u.predicate().is_empty());
            assert!(u.raw.is_some() || !u.fields.is_empty());
        }
    }
    let Ok(xml) = std::str::from_utf8(xml) else {
        return;
    };
    let Ok(meta) = parse_stream_xml(xml) else {
        return;
    };
    // The lead field: every other described label, in reverse order.
    let configured: Vec<String> = meta
        .channels
        .iter()
        .rev()
        .step_by(2)
        .map(|c| c.label.clone())
        .collect();
    for options in [
        LslOptions::default(),
        LslOptions {
            unit: Some("uV".into()),
            drop_extra: true,
            ..LslOptions::default()
        },
    ] {
        if let Ok(plan) = plan_channels(&meta, &configured, &options) {
            assert_eq!(plan.stream_index.len(), configured.len());
            assert_eq!(plan.volts_per_unit.len(), configured.len());
            for (k, &i) in plan.stream_index.iter().enumerate() {
                assert_eq!(meta.channels[i].label, configured[k]);
            }
        }
    }
}

/// The EDF/BDF reader: header validation, annotations (TALs) and block decoding return
/// errors, never panic.
pub fn edf(data: &[u8]) {
    if let Ok(reader) = crate::eeg::edf::EdfReader::from_bytes(data.to_vec()) {
        let _ = reader.annotations();
        let signals = reader.data_signals();
        for &s in &signals {
            let n = reader.header().n_samples(s).min(256);
            let mut out = vec![0.0; n];
            let _ = reader.read_signal(s, 0, &mut out);
        }
        if let Ok(mut blocks) = reader.blocks(&signals, 31) {
            let mut buf = Vec::new();
            let mut n_blocks = 0;
            while let Ok(Some(_)) = blocks.next_f32(&mut buf) {
                n_blocks += 1;
                if n_blocks > 64 {
                    break;
                }
            }
        }
    }
}

/// The `[finder]` overrides parser and the reconstruction on arbitrary hits: the first
/// byte says how many of the following bytes are overrides text, the rest are hits of 10
/// bytes each (x and y as `f32`, plane as `u16`, little-endian); an input of odd length
/// has no field (the fit then estimates each track's momentum from its scattering). Any
/// input gives a configuration or an error, and any hits give tracks whose hit indices
/// lie in the event.
pub fn finder_overrides(data: &[u8]) {
    let det = Detector {
        planes: (0..5)
            .map(|i| Plane {
                z_mm: 300.0 + 100.0 * i as f64,
                half_x_mm: 100.0,
                half_y_mm: 100.0,
                sigma_x_mm: 0.01,
                sigma_y_mm: 0.01,
                x0_fraction: 0.004,
                efficiency: 1.0,
            })
            .collect(),
        field: Field::Uniform {
            b_tesla: [0.0, if data.len() % 2 == 1 { 0.0 } else { 1.0 }, 0.0],
        },
    };
    let split = data
        .first()
        .map(|&b| b as usize)
        .unwrap_or(0)
        .min(data.len());
    let (text, rest) = data.split_at(split);
    let ov = std::str::from_utf8(text)
        .ok()
        .and_then(|t| FinderOverrides::from_toml_str(t).ok())
        .unwrap_or_default();
    let mut cfg = FinderConfig::from_detector_with(&det, 1.0, &ov);
    // The first hits against the origin (by default only near it) run unless the input says.
    cfg.first_hits_to_origin = ov.first_hits_to_origin.unwrap_or(true);
    cfg.limits.max_doublets = cfg.limits.max_doublets.min(1 << 14);
    cfg.limits.max_triplets = cfg.limits.max_triplets.min(1 << 14);
    cfg.limits.max_neighbours = cfg.limits.max_neighbours.min(1 << 15);
    if cfg.validate(&det).is_err() {
        return;
    }
    let hits: Vec<HitRecord> = rest
        .chunks_exact(10)
        .map(|c| HitRecord {
            x_mm: f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            y_mm: f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            z_mm: 0.0,
            plane: u16::from_le_bytes([c[8], c[9]]) % 8,
            hit_id: 0,
        })
        .collect();
    let mut reco = Reconstructor::new(&det, cfg);
    let mut tracks = Vec::new();
    reco.reconstruct(&hits, &mut tracks);
    // Every hit in one track at most, each track's hits on planes in increasing order.
    let mut used = vec![false; hits.len()];
    for t in &tracks {
        assert!(t.hits.iter().all(|&h| (h as usize) < hits.len()));
        for &h in &t.hits {
            assert!(!used[h as usize], "hit {h} in two tracks");
            used[h as usize] = true;
        }
        assert!(t
            .hits
            .windows(2)
            .all(|w| hits[w[0] as usize].plane < hits[w[1] as usize].plane));
    }
}

/// `frame::parse` and `frame::peek_header` (which framing on TCP relies on): whatever
/// parses agrees with its own header, and `peek_header` accepts it too.
pub fn frame(data: &[u8]) {
    let peeked = frame::peek_header(data).is_ok();
    // Never a panic, whatever the CRC; what it accepts is well formed.
    let validated = frame::parse_validated(data);
    if let Ok(view) = &validated {
        assert!(peeked, "parse_validated accepted what peek_header refused");
        assert_eq!(
            frame::HEADER_LEN + view.header.payload_len.get() as usize,
            data.len()
        );
    }
    if let Ok(view) = frame::parse(data) {
        assert!(peeked, "parse accepted what peek_header refused");
        assert_eq!(
            frame::HEADER_LEN + view.header.payload_len.get() as usize,
            data.len()
        );
        // What parse accepts, parse_validated (the workers' view) sees alike.
        let v = validated.expect("parse_validated refused what parse accepted");
        assert_eq!(v.header.as_bytes(), view.header.as_bytes());
        match (v.payload, view.payload) {
            (frame::Payload::Hits(a), frame::Payload::Hits(b)) => {
                assert_eq!(a.as_bytes(), b.as_bytes())
            }
            (frame::Payload::Eeg(a), frame::Payload::Eeg(b)) => {
                assert_eq!(a.header.as_bytes(), b.header.as_bytes());
                assert_eq!(a.samples.as_bytes(), b.samples.as_bytes());
            }
            _ => panic!("parse and parse_validated disagree on the kind"),
        }
    }
}

/// The kernel-cache entry parser: whatever parses encodes back to the same bytes.
pub fn kernel_cache_entry(data: &[u8]) {
    if let Ok(image) = crate::gpu::nvrtc::decode_cache_entry(data) {
        assert_eq!(crate::gpu::nvrtc::encode_cache_entry(&image), data);
    }
}

/// The NPY reader (`npy::parse`: lead field, source positions, noise covariance, and the
/// tracking field map, whose own checks `detector_toml` fuzzes) and the inverse-kernel
/// cache parser.
pub fn npy(data: &[u8]) {
    let _ = crate::eeg::inputs::parse_npy(data, Path::new("fuzz.npy"));
    let _ = crate::eeg::kernel::InverseKernel::parse_cache(data, Path::new("fuzz.bin"));
}

/// The recording reader (`Recording::from_bytes`, the checks of `Recording::open` without
/// the file): every frame it hands out lies in the input and has a valid frame header. The
/// input is read twice: as a whole file, and behind a valid file header so that the record,
/// index and trailer parsing is reached.
pub fn recording(data: &[u8]) {
    fn check(bytes: Vec<u8>) {
        if let Ok(rec) = recording::Recording::from_bytes(bytes) {
            for (i, f) in rec.iter().enumerate() {
                assert!(frame::peek_header(f).is_ok());
                assert_eq!(rec.entry(i).len_bytes as usize, f.len());
            }
            if let Some(t) = rec.torn_tail() {
                assert!(t.usable_len_bytes <= t.file_len_bytes);
            }
            let _ = rec.index_at_or_after_timestamp(u64::MAX / 2);
        }
    }
    check(data.to_vec());
    let mut with_header = recording::encode_file_header(0, 0).to_vec();
    with_header.extend_from_slice(data);
    check(with_header);
}

/// The TrackML-style CSV parsers (hits, truth, particles, submission).
pub fn trackml_csv(data: &[u8]) {
    crate::tracking::trackml::fuzz_parsers(data);
}

/// The trigger-line configuration parser: any text gives lines or an error; accepted lines
/// are within the limit and evaluate on an empty event.
pub fn trigger_lines(data: &[u8]) {
    use crate::tracking::lines::{evaluate, parse_lines, MAX_LINES};
    use crate::tracking::track::{Track, TrackState};
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(lines) = parse_lines(text) {
            assert!(lines.len() <= MAX_LINES);
            assert_eq!(evaluate(&lines, &[]), 0, "a line fired without tracks");
            // Tracks at the edges of every cut: a measured momentum, one with an error as
            // large as itself, q/p zero, NaN and infinite, a NaN covariance, no hits.
            let track = |qop: f32, var_qop: f32, n_hits: u32| {
                let mut cov = [0.0f32; 15];
                cov[14] = var_qop;
                Track {
                    hits: (0..n_hits).collect(),
                    state: TrackState {
                        z_mm: 100.0,
                        x_mm: 0.0,
                        y_mm: 0.0,
                        tx: 0.05,
                        ty: -0.02,
                        qop,
                    },
                    cov,
                    chi2: 4.0,
                    ndf: 5,
                }
            };
            let tracks = [
                track(0.1, 1e-6, 8),
                track(-0.05, 0.01, 6),
                track(0.0, 0.0, 4),
                track(f32::NAN, 1.0, 4),
                track(f32::INFINITY, 0.0, 3),
                track(0.5, f32::NAN, 0),
            ];
            let all = evaluate(&lines, &tracks);
            // A line that fires on a part of the tracks fires on all of them.
            for k in 0..tracks.len() {
                assert_eq!(evaluate(&lines, &tracks[k..=k]) & !all, 0);
            }
        }
    }
}
