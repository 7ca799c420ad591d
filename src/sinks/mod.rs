//! Decision sinks: where every [`Decision`] goes after the trigger. Each sink writes the
//! same record in its own form: JSON lines for people and scripts ([`jsonl`]), a compact
//! binary log for tools and replays ([`binlog`]), a UDP datagram stream for downstream
//! DAQ ([`udp`]), LSL markers for stimulus programs ([`lsl`]). The decision thread owns the sinks and calls them in order, each behind
//! a [`guard::GuardedSink`] that counts its errors and applies its [`SinkPolicy`].

use std::io;

use serde::Deserialize;

use crate::decision::{Decision, Names};

pub mod binlog;
pub mod file;
pub mod guard;
pub mod jsonl;
pub mod lsl;
pub mod nats;
pub mod udp;

/// A destination for decision records. `write` is called once per decision, in decision
/// order, from the decision thread; `flush` at the end of a batch and at shutdown.
///
/// `write` takes a record whole or not at all: after an error nothing of the record is
/// buffered, so the same record can be written again. `flush` keeps what it could not
/// write and tries it again on the next call.
pub trait Sink: Send {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
    /// Label of the sink in metrics and logs (`jsonl`, `binlog`, `udp`).
    fn kind(&self) -> &'static str {
        "other"
    }
    /// Where the records go (a path, an address), for logs.
    fn target(&self) -> String {
        String::new()
    }
    /// Closes and opens the destination again (SIGHUP, after a log was moved away).
    fn reopen(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a sink does with decisions it cannot write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkPolicy {
    /// Keep the decisions (a bounded backlog) and pause the inputs until the sink takes
    /// them again: frames queue in the rings, then drop with reason `sink_blocked`.
    /// The default of decision logs.
    Block,
    /// Write to a second path while the first fails; go back once it works again.
    Spill,
    /// Count the decision as lost and go on: for best-effort sinks (the UDP stream).
    Drop,
}

impl SinkPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Spill => "spill",
            Self::Drop => "drop",
        }
    }
}

/// The label of an OS error in `trigd_sink_errors_total{kind}`: a fixed, small set.
pub fn error_kind(e: &io::Error) -> &'static str {
    use io::ErrorKind as K;
    match e.kind() {
        K::StorageFull => "storage_full",
        K::PermissionDenied => "permission_denied",
        K::NotFound => "not_found",
        K::ConnectionRefused => "connection_refused",
        K::ConnectionReset | K::BrokenPipe | K::NotConnected => "connection_lost",
        K::WouldBlock => "would_block",
        K::WriteZero => "short_write",
        K::InvalidInput | K::InvalidData => "invalid_record",
        _ => match e.raw_os_error() {
            Some(libc::EIO) => "io",
            Some(libc::EDQUOT) => "quota",
            Some(libc::EFBIG) => "file_too_large",
            _ => "other",
        },
    }
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
            delivery: 0,
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
