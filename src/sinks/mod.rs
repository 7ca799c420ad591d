//! Decision sinks: where every [`Decision`] goes after the trigger. Each sink writes the
//! same record in its own form: JSON lines for people and scripts ([`jsonl`]), a compact
//! binary log for tools and replays ([`binlog`]), a UDP datagram stream for downstream
//! DAQ ([`udp`]). The decision thread owns the sinks and calls them in order.

use std::io;

use crate::decision::{Decision, Names};

pub mod binlog;
pub mod jsonl;
pub mod udp;

/// A destination for decision records. `write` is called once per decision, in decision
/// order, from the decision thread; `flush` at the end of a batch and at shutdown.
pub trait Sink: Send {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

/// Several sinks fed the same decisions. Every sink sees every decision even when an
/// earlier one fails; the first error is returned.
impl Sink for Vec<Box<dyn Sink>> {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()> {
        let mut first = Ok(());
        for s in self.iter_mut() {
            let r = s.write(d, names);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
    fn flush(&mut self) -> io::Result<()> {
        let mut first = Ok(());
        for s in self.iter_mut() {
            let r = s.flush();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

#[cfg(test)]
pub(crate) mod testdata {
    use crate::backend::{BackendKind, Detail};
    use crate::decision::{Decision, Names, Outcome, Workload};

    pub fn names() -> Names {
        Names {
            sources: vec!["udp0".into(), "replay \"quoted\"\\path\n".into()],
            lines: vec!["two_tracks".into(), "high_pt".into(), "roi_power".into()],
        }
    }

    /// One decision of every kind the pipeline makes.
    pub fn decisions() -> Vec<Decision> {
        let base = Decision {
            source: 0,
            source_id: 42,
            seq: 1,
            timestamp_ns: 1_790_000_000_123_456_789,
            workload: Workload::Tracking,
            outcome: Outcome::Accept,
            accepted: true,
            reason: "",
            lines_fired: 0b011,
            latency_ns: 183_457,
            backend: Some(BackendKind::Gpu),
            detail: Detail::Tracking {
                n_tracks: 3,
                max_p_gev: 12.625,
            },
        };
        vec![
            base.clone(),
            Decision {
                seq: 2,
                outcome: Outcome::Reject,
                accepted: false,
                lines_fired: 0,
                backend: Some(BackendKind::Cpu),
                workload: Workload::Multiplicity,
                detail: Detail::Multiplicity {
                    n_hits: 17,
                    n_planes: 4,
                },
                ..base.clone()
            },
            Decision {
                seq: 3,
                source: 1,
                workload: Workload::Eeg,
                outcome: Outcome::Timeout,
                accepted: true,
                reason: "deadline",
                lines_fired: 0b100,
                latency_ns: 5_000_001,
                detail: Detail::Eeg {
                    statistic: 3.25e-3,
                    peak_source: 8191,
                    peak_pos_mm: [-41.5, 12.0, 70.25],
                },
                ..base.clone()
            },
            Decision {
                seq: 4,
                outcome: Outcome::Dropped,
                accepted: false,
                reason: "ring_full",
                lines_fired: 0,
                backend: None,
                detail: Detail::None,
                ..base.clone()
            },
            Decision {
                seq: 0,
                source_id: 0,
                timestamp_ns: 0,
                outcome: Outcome::Malformed,
                accepted: false,
                reason: "bad_crc",
                lines_fired: 0,
                latency_ns: 900,
                backend: None,
                detail: Detail::None,
                ..base
            },
        ]
    }
}
