//! Reading a decision log (JSON lines, as `src/sinks/jsonl.rs` writes it) and the run's
//! figures from it: latency quantiles and outcome fractions in bins of consecutive
//! decisions, the fraction of frames each trigger line fired on, the backend share and the
//! totals. The computations are pure functions of the records, so they are tested on
//! hand-made logs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::ReportError;
use crate::decision::Outcome;

/// One decision record, with the fields the report uses. Unknown fields are ignored, so a
/// log with workload fields the report does not know still reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub source: String,
    pub workload: String,
    #[serde(deserialize_with = "outcome_of")]
    pub outcome: Outcome,
    #[serde(default)]
    pub reason: Option<String>,
    /// For timeouts: the policy's resolution (`accept` | `reject`).
    #[serde(default)]
    pub resolved: Option<String>,
    pub lines: Vec<String>,
    pub latency_us: f64,
    pub backend: Option<String>,
    #[serde(default)]
    pub timestamp_ns: Option<u64>,
    /// Tracking: tracks fitted.
    #[serde(default)]
    pub n_tracks: Option<u64>,
    /// EEG: the block's largest window mean of ROI power.
    #[serde(default)]
    pub statistic: Option<f64>,
}

fn outcome_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Outcome, D::Error> {
    let s = String::deserialize(d)?;
    Outcome::ALL
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "outcome {s:?} is not one of accept, reject, timeout, dropped, malformed"
            ))
        })
}

impl Record {
    /// Whether the frame was kept: accepted, or timed out and resolved to accept.
    pub fn kept(&self) -> bool {
        self.outcome == Outcome::Accept
            || (self.outcome == Outcome::Timeout && self.resolved.as_deref() == Some("accept"))
    }
}

/// Parses a decision log's text; `path` names it in errors. Blank lines are skipped; an
/// empty log is an error (there is nothing to report).
pub fn parse_log(text: &str, path: &Path) -> Result<Vec<Record>, ReportError> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).map_err(|e| ReportError::Line {
            path: path.to_path_buf(),
            line: i as u64 + 1,
            reason: format!("not a decision record: {e}"),
        })?;
        if !(r.latency_us.is_finite() && r.latency_us >= 0.0) {
            return Err(ReportError::Line {
                path: path.to_path_buf(),
                line: i as u64 + 1,
                reason: format!("latency_us {} must be a non-negative number", r.latency_us),
            });
        }
        records.push(r);
    }
    if records.is_empty() {
        return Err(ReportError::Input {
            path: path.to_path_buf(),
            reason: "no decisions in the log: give the file `--decisions` wrote".into(),
        });
    }
    Ok(records)
}

/// Reads and parses a decision log.
pub fn read_log(path: &Path) -> Result<Vec<Record>, ReportError> {
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| ReportError::Input {
        path: path.to_path_buf(),
        reason: format!(
            "not UTF-8 text (byte {}): a decision log is JSON lines",
            e.utf8_error().valid_up_to()
        ),
    })?;
    parse_log(&text, path)
}

/// The value at quantile `q` (0..=1) of `sorted` (ascending) by the nearest rank: the
/// smallest value with at least a fraction `q` of the values at or below it.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Latency quantiles of one bin of consecutive decisions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyBin {
    /// Index in the log of the bin's first decision.
    pub first: usize,
    pub n: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Latency p50, p99 and max over bins of `per_bin` consecutive decisions (the last bin
/// may be shorter).
pub fn latency_over_time(records: &[Record], per_bin: usize) -> Vec<LatencyBin> {
    let per_bin = per_bin.max(1);
    records
        .chunks(per_bin)
        .enumerate()
        .map(|(b, chunk)| {
            let mut l: Vec<f64> = chunk.iter().map(|r| r.latency_us).collect();
            l.sort_by(f64::total_cmp);
            LatencyBin {
                first: b * per_bin,
                n: chunk.len(),
                p50_us: quantile(&l, 0.5),
                p99_us: quantile(&l, 0.99),
                max_us: l[l.len() - 1],
            }
        })
        .collect()
}

/// The fraction of each outcome in one bin of consecutive decisions, in the order of
/// [`Outcome::ALL`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutcomeBin {
    pub first: usize,
    pub n: usize,
    pub fraction: [f64; 5],
}

/// Outcome fractions over bins of `per_bin` consecutive decisions.
pub fn outcomes_over_time(records: &[Record], per_bin: usize) -> Vec<OutcomeBin> {
    let per_bin = per_bin.max(1);
    records
        .chunks(per_bin)
        .enumerate()
        .map(|(b, chunk)| {
            let mut count = [0usize; 5];
            for r in chunk {
                count[r.outcome.code() as usize] += 1;
            }
            OutcomeBin {
                first: b * per_bin,
                n: chunk.len(),
                fraction: count.map(|c| c as f64 / chunk.len() as f64),
            }
        })
        .collect()
}

/// How often one trigger line fired.
#[derive(Debug, Clone, PartialEq)]
pub struct LineShare {
    pub line: String,
    pub fired: usize,
    /// `fired` over every decision of the log.
    pub fraction: f64,
}

/// For each trigger line named in the log, the number and fraction of decisions it fired
/// on, by line name. A line that never fired is not in the log, so not here.
pub fn line_shares(records: &[Record]) -> Vec<LineShare> {
    let mut fired: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        for l in &r.lines {
            *fired.entry(l.as_str()).or_default() += 1;
        }
    }
    fired
        .into_iter()
        .map(|(line, n)| LineShare {
            line: line.to_string(),
            fired: n,
            fraction: n as f64 / records.len() as f64,
        })
        .collect()
}

/// Decisions per backend (`none` for decisions made without one: dropped, malformed).
pub fn backend_share(records: &[Record]) -> Vec<(String, usize)> {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        *n.entry(r.backend.as_deref().unwrap_or("none")).or_default() += 1;
    }
    n.into_iter().map(|(b, c)| (b.to_string(), c)).collect()
}

/// The run's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    pub decisions: usize,
    pub per_outcome: [usize; 5],
    pub kept: usize,
    pub sources: Vec<String>,
    pub workloads: Vec<String>,
    /// Dropped and malformed decisions by reason.
    pub reasons: Vec<(String, usize)>,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

pub fn totals(records: &[Record]) -> Totals {
    let mut per_outcome = [0usize; 5];
    let mut sources: Vec<String> = Vec::new();
    let mut workloads: Vec<String> = Vec::new();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        per_outcome[r.outcome.code() as usize] += 1;
        if !sources.contains(&r.source) {
            sources.push(r.source.clone());
        }
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload.clone());
        }
        if let Some(reason) = &r.reason {
            *reasons.entry(reason.as_str()).or_default() += 1;
        }
    }
    let mut l: Vec<f64> = records.iter().map(|r| r.latency_us).collect();
    l.sort_by(f64::total_cmp);
    Totals {
        decisions: records.len(),
        per_outcome,
        kept: records.iter().filter(|r| r.kept()).count(),
        sources,
        workloads,
        reasons: reasons
            .into_iter()
            .map(|(r, n)| (r.to_string(), n))
            .collect(),
        p50_us: quantile(&l, 0.5),
        p99_us: quantile(&l, 0.99),
        max_us: l.last().copied().unwrap_or(f64::NAN),
    }
}

/// Decisions per bin for the pictures over time: about 50 bins, at least one decision each.
pub fn default_bin(n_decisions: usize) -> usize {
    n_decisions.div_ceil(50).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, outcome: &str, lines: &[&str], latency_us: f64, backend: &str) -> String {
        let lines: Vec<String> = lines.iter().map(|l| format!("\"{l}\"")).collect();
        let backend = if backend == "none" {
            "null".to_string()
        } else {
            format!("\"{backend}\"")
        };
        format!(
            "{{\"seq\":{seq},\"source\":\"udp0\",\"source_id\":1,\"workload\":\"tracking\",\
             \"outcome\":\"{outcome}\",\"lines\":[{}],\"latency_us\":{latency_us},\
             \"backend\":{backend},\"timestamp_ns\":{}}}",
            lines.join(","),
            seq * 1000
        )
    }

    fn log(lines: &[String]) -> Vec<Record> {
        parse_log(&lines.join("\n"), Path::new("d.jsonl")).unwrap()
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn latency_quantiles_per_bin_of_consecutive_decisions() {
        // Bin 0: latencies 1..=10 (shuffled); bin 1: 100..=109; bin 2 (short): 1000, 5.
        let mut text = Vec::new();
        for (i, l) in [3, 1, 4, 10, 5, 9, 2, 6, 8, 7].iter().enumerate() {
            text.push(record(i as u64, "accept", &[], f64::from(*l), "cpu"));
        }
        for i in 0..10 {
            text.push(record(10 + i, "reject", &[], 109.0 - i as f64, "cpu"));
        }
        text.push(record(20, "accept", &[], 1000.0, "cpu"));
        text.push(record(21, "accept", &[], 5.0, "cpu"));
        let bins = latency_over_time(&log(&text), 10);
        assert_eq!(bins.len(), 3);
        assert_eq!(
            (
                bins[0].first,
                bins[0].n,
                bins[0].p50_us,
                bins[0].p99_us,
                bins[0].max_us
            ),
            (0, 10, 5.0, 10.0, 10.0)
        );
        assert_eq!(
            (bins[1].first, bins[1].p50_us, bins[1].max_us),
            (10, 104.0, 109.0)
        );
        assert_eq!(
            (bins[2].first, bins[2].n, bins[2].p50_us, bins[2].max_us),
            (20, 2, 5.0, 1000.0)
        );
    }

    #[test]
    fn outcome_fractions_per_bin() {
        let text = vec![
            record(0, "accept", &["a"], 1.0, "cpu"),
            record(1, "reject", &[], 1.0, "cpu"),
            record(2, "dropped", &[], 0.5, "none"),
            record(3, "dropped", &[], 0.5, "none"),
            record(4, "malformed", &[], 0.1, "none"),
        ];
        let bins = outcomes_over_time(&log(&text), 4);
        assert_eq!(bins.len(), 2);
        assert_eq!(bins[0].fraction, [0.25, 0.25, 0.0, 0.5, 0.0]);
        assert_eq!(bins[1].fraction, [0.0, 0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn each_line_fired_fraction_counts_every_decision() {
        let text = vec![
            record(0, "accept", &["two_tracks", "high_p"], 1.0, "gpu"),
            record(1, "accept", &["two_tracks"], 1.0, "gpu"),
            record(2, "reject", &[], 1.0, "cpu"),
            record(3, "dropped", &[], 1.0, "none"),
        ];
        let records = log(&text);
        let shares = line_shares(&records);
        assert_eq!(
            shares,
            vec![
                LineShare {
                    line: "high_p".into(),
                    fired: 1,
                    fraction: 0.25
                },
                LineShare {
                    line: "two_tracks".into(),
                    fired: 2,
                    fraction: 0.5
                },
            ]
        );
        assert_eq!(
            backend_share(&records),
            vec![("cpu".into(), 1), ("gpu".into(), 2), ("none".into(), 1)]
        );
        let t = totals(&records);
        assert_eq!(t.per_outcome, [2, 1, 0, 1, 0]);
        assert_eq!(t.kept, 2);
        assert_eq!(t.sources, vec!["udp0".to_string()]);
    }

    #[test]
    fn a_timeout_resolved_to_accept_is_kept() {
        let text = r#"{"seq":0,"source":"s","workload":"eeg","outcome":"timeout","reason":"deadline","resolved":"accept","lines":[],"latency_us":9.5,"backend":"cpu"}"#;
        let r = parse_log(text, Path::new("d.jsonl")).unwrap();
        assert!(r[0].kept());
        assert_eq!(totals(&r).reasons, vec![("deadline".to_string(), 1)]);
    }

    #[test]
    fn malformed_lines_are_named_by_number() {
        let good = record(0, "accept", &[], 1.0, "cpu");
        let cases = [
            (format!("{good}\n{{\"seq\":1,"), 2, "not a decision record"),
            (
                format!("{good}\n\n{}", good.replace("accept", "maybe")),
                3,
                "outcome \"maybe\"",
            ),
            (
                format!(
                    "{good}\n{}",
                    good.replace("\"latency_us\":1", "\"latency_us\":-1")
                ),
                2,
                "latency_us -1",
            ),
        ];
        for (text, line, what) in cases {
            let e = parse_log(&text, Path::new("run/d.jsonl")).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("run/d.jsonl: line {line}: ")) && msg.contains(what),
                "{msg}"
            );
        }
        let e = parse_log("\n\n", Path::new("d.jsonl")).unwrap_err();
        assert!(e.to_string().contains("no decisions"), "{e}");
    }
}
