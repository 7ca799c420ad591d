//! JSON lines decision log: one object per decision, for people, `jq` and scripts.
//!
//! ```text
//! {"seq":7,"source":"udp0","source_id":42,"workload":"tracking","outcome":"accept",
//!  "lines":["two_tracks"],"latency_us":183.457,"backend":"gpu","timestamp_ns":...,
//!  "n_tracks":3,"max_p_gev":12.625}
//! ```
//!
//! `reason` appears only when non-empty, `resolved` (`accept`|`reject`) only for timeouts,
//! `backend` is `null` for decisions made without a backend. Detail fields are flattened:
//! multiplicity `n_hits,n_planes`; tracking `n_tracks,max_p_gev`; EEG
//! `statistic,peak_source,peak_pos_mm:[x,y,z]`. Non-finite floats are written as `null`.
//! Records are formatted straight into a `BufWriter` (no per-record heap allocation).

use std::fmt::Display;
use std::io::{self, Write};
use std::path::Path;

use super::file::{LogFile, LogOut, Rotation};
use super::Sink;
use crate::backend::Detail;
use crate::decision::{Decision, Names, Outcome};

/// Writes one JSON object per decision, newline-terminated. Each record is formatted into
/// a reused line buffer first and handed to the writer in one piece, so a failed write
/// leaves no partial record behind (a `BufWriter` takes a short record whole or not at all).
pub struct JsonlSink<W: LogOut> {
    out: W,
    line: Vec<u8>,
}

impl JsonlSink<LogFile> {
    /// Creates (truncates) `path`.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::create_rotating(path, Rotation::default())
    }

    /// Creates (truncates) `path`, rotated by size as `rotation` says.
    pub fn create_rotating(path: impl AsRef<Path>, rotation: Rotation) -> io::Result<Self> {
        let file = LogFile::create(path.as_ref(), Vec::new(), rotation, 64 * 1024)?;
        Ok(Self::new(file))
    }
}

impl<W: LogOut> JsonlSink<W> {
    /// Writes to `out` as is; wrap files and sockets in a `BufWriter`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            line: Vec::with_capacity(1024),
        }
    }

    /// Flushes and returns the writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes `s` as a JSON string literal.
fn write_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    out.write_all(b"\"")?;
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.write_all(&bytes[start..i])?;
        if esc.is_empty() {
            write!(out, "\\u{b:04x}")?;
        } else {
            out.write_all(esc)?;
        }
        start = i + 1;
    }
    out.write_all(&bytes[start..])?;
    out.write_all(b"\"")
}

/// Writes a float as a JSON number (shortest round-trip form), `null` if not finite.
fn write_float<F: Display>(out: &mut impl Write, v: F, finite: bool) -> io::Result<()> {
    if finite {
        write!(out, "{v}")
    } else {
        out.write_all(b"null")
    }
}

/// Formats one decision as a JSON object followed by `\n`.
pub fn write_decision(out: &mut impl Write, d: &Decision, names: &Names) -> io::Result<()> {
    write!(out, "{{\"seq\":{},\"source\":", d.seq)?;
    write_str(out, names.source(d.source))?;
    write!(
        out,
        ",\"source_id\":{},\"workload\":\"{}\",\"outcome\":\"{}\"",
        d.source_id,
        d.workload.as_str(),
        d.outcome.as_str()
    )?;
    if !d.reason.is_empty() {
        out.write_all(b",\"reason\":")?;
        write_str(out, d.reason)?;
    }
    if d.outcome == Outcome::Timeout {
        let resolved = if d.accepted { "accept" } else { "reject" };
        write!(out, ",\"resolved\":\"{resolved}\"")?;
    }
    out.write_all(b",\"lines\":[")?;
    for (i, line) in names.lines_of(d.lines_fired).enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        write_str(out, line)?;
    }
    // Exact decimal microseconds from integer nanoseconds (3 decimals, trailing zeros kept).
    write!(
        out,
        "],\"latency_us\":{}.{:03},\"backend\":",
        d.latency_ns / 1000,
        d.latency_ns % 1000
    )?;
    match d.backend {
        Some(b) => write!(out, "\"{}\"", b.as_str())?,
        None => out.write_all(b"null")?,
    }
    write!(out, ",\"timestamp_ns\":{}", d.timestamp_ns)?;
    match d.detail {
        Detail::None => {}
        Detail::Multiplicity { n_hits, n_planes } => {
            write!(out, ",\"n_hits\":{n_hits},\"n_planes\":{n_planes}")?;
        }
        Detail::Tracking {
            n_tracks,
            max_p_gev,
        } => {
            write!(out, ",\"n_tracks\":{n_tracks},\"max_p_gev\":")?;
            write_float(out, max_p_gev, max_p_gev.is_finite())?;
        }
        Detail::Eeg {
            statistic,
            peak_source,
            peak_pos_mm,
        } => {
            out.write_all(b",\"statistic\":")?;
            write_float(out, statistic, statistic.is_finite())?;
            write!(out, ",\"peak_source\":{peak_source},\"peak_pos_mm\":[")?;
            for (i, v) in peak_pos_mm.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_float(out, v, v.is_finite())?;
            }
            out.write_all(b"]")?;
        }
    }
    out.write_all(b"}\n")
}

impl<W: LogOut> Sink for JsonlSink<W> {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()> {
        self.line.clear();
        write_decision(&mut self.line, d, names)?;
        self.out.write_all(&self.line)?;
        self.out.after_record()
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
    fn kind(&self) -> &'static str {
        "jsonl"
    }
    fn target(&self) -> String {
        self.out.target()
    }
    fn reopen(&mut self) -> io::Result<()> {
        self.out.reopen()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::testdata;
    use serde_json::Value;

    fn lines_of(v: &Value) -> Vec<String> {
        v["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_field_parses_back_with_serde_json() {
        let names = testdata::names();
        let decisions = testdata::decisions();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let mut sink = JsonlSink::create(&path).unwrap();
        for d in &decisions {
            sink.write(d, &names).unwrap();
        }
        sink.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), decisions.len());
        for (row, d) in rows.iter().zip(&decisions) {
            let v: Value = serde_json::from_str(row).unwrap_or_else(|e| panic!("{e}: {row}"));
            assert_eq!(v["seq"].as_u64(), Some(d.seq));
            assert_eq!(v["source"].as_str(), Some(names.source(d.source)));
            assert_eq!(v["source_id"].as_u64(), Some(u64::from(d.source_id)));
            assert_eq!(v["workload"].as_str(), Some(d.workload.as_str()));
            assert_eq!(v["outcome"].as_str(), Some(d.outcome.as_str()));
            assert_eq!(
                v.get("reason").and_then(Value::as_str).unwrap_or(""),
                d.reason
            );
            assert_eq!(
                lines_of(&v),
                names.lines_of(d.lines_fired).collect::<Vec<_>>()
            );
            let latency_us = v["latency_us"].as_f64().unwrap();
            assert!(
                (latency_us * 1000.0 - d.latency_ns as f64).abs() < 1e-6,
                "{latency_us}"
            );
            assert_eq!(v["backend"].as_str(), d.backend.map(|b| b.as_str()));
            assert_eq!(v["timestamp_ns"].as_u64(), Some(d.timestamp_ns));
            let resolved = v.get("resolved").and_then(Value::as_str);
            match d.outcome {
                Outcome::Timeout => {
                    assert_eq!(resolved, Some(if d.accepted { "accept" } else { "reject" }))
                }
                _ => assert_eq!(resolved, None),
            }
            match d.detail {
                Detail::None => assert!(
                    v.get("n_hits").is_none()
                        && v.get("n_tracks").is_none()
                        && v.get("statistic").is_none()
                ),
                Detail::Multiplicity { n_hits, n_planes } => {
                    assert_eq!(v["n_hits"].as_u64(), Some(u64::from(n_hits)));
                    assert_eq!(v["n_planes"].as_u64(), Some(u64::from(n_planes)));
                }
                Detail::Tracking {
                    n_tracks,
                    max_p_gev,
                } => {
                    assert_eq!(v["n_tracks"].as_u64(), Some(u64::from(n_tracks)));
                    assert_eq!(v["max_p_gev"].as_f64().map(|p| p as f32), Some(max_p_gev));
                }
                Detail::Eeg {
                    statistic,
                    peak_source,
                    peak_pos_mm,
                } => {
                    assert_eq!(v["statistic"].as_f64(), Some(statistic));
                    assert_eq!(v["peak_source"].as_u64(), Some(u64::from(peak_source)));
                    let pos: Vec<f32> = v["peak_pos_mm"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect();
                    assert_eq!(pos, peak_pos_mm);
                }
            }
        }
        // The name with quotes, a backslash and a newline survived escaping.
        let v: Value = serde_json::from_str(rows[2]).unwrap();
        assert_eq!(v["source"].as_str(), Some("replay \"quoted\"\\path\n"));
    }

    #[test]
    fn non_finite_floats_become_null_and_keep_the_line_valid() {
        let names = testdata::names();
        let mut d = testdata::decisions()[2].clone();
        d.detail = Detail::Eeg {
            statistic: f64::NAN,
            peak_source: 1,
            peak_pos_mm: [f32::INFINITY, 0.0, 1e-30],
        };
        let mut buf = Vec::new();
        write_decision(&mut buf, &d, &names).unwrap();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert!(v["statistic"].is_null());
        assert!(v["peak_pos_mm"][0].is_null());
        assert_eq!(v["peak_pos_mm"][2].as_f64().map(|x| x as f32), Some(1e-30));
    }

    #[test]
    fn control_characters_are_escaped() {
        let mut buf = Vec::new();
        write_str(&mut buf, "a\u{1}b\u{7f}é").unwrap();
        let s: String = serde_json::from_slice(&buf).unwrap();
        assert_eq!(s, "a\u{1}b\u{7f}é");
    }
}
