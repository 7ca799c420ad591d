//! Decisions: every frame that enters trigd leaves as exactly one [`Decision`], whatever
//! happened to it. This is the record every sink writes and every metric counts.

use crate::backend::{BackendKind, Detail};

/// What happened to a frame. Frames in = the sum of these, per source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Accept,
    Reject,
    /// The deadline passed before reconstruction; resolved by the configured policy.
    Timeout,
    /// Not reconstructed for lack of room (reason `ring_full`, ...).
    Dropped,
    /// Failed validation (reason names the check).
    Malformed,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Self::Accept,
        Self::Reject,
        Self::Timeout,
        Self::Dropped,
        Self::Malformed,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Reject => "reject",
            Self::Timeout => "timeout",
            Self::Dropped => "dropped",
            Self::Malformed => "malformed",
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.get(c as usize).copied()
    }
}

/// The workload a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Hit multiplicity only (the default trigger before reconstruction is configured).
    Multiplicity,
    Tracking,
    Eeg,
}

impl Workload {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Multiplicity => "multiplicity",
            Self::Tracking => "tracking",
            Self::Eeg => "eeg",
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// One frame's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Index of the input (source) in the configuration; names live in [`crate::decision::Names`].
    pub source: u16,
    /// Producer's source id and sequence number from the frame header (0 if unreadable).
    pub source_id: u32,
    pub seq: u64,
    /// Producer's acquisition timestamp (0 if unreadable).
    pub timestamp_ns: u64,
    pub workload: Workload,
    pub outcome: Outcome,
    /// For `timeout`: whether the policy accepted the frame. For others, `outcome == Accept`.
    pub accepted: bool,
    /// Why (`ring_full`, `bad_crc`, `deadline`, ...); empty for plain accept/reject.
    pub reason: &'static str,
    /// Bit i = trigger line i fired.
    pub lines_fired: u64,
    /// Arrival to decision, nanoseconds.
    pub latency_ns: u64,
    pub backend: Option<BackendKind>,
    pub detail: Detail,
    /// How the input names this frame's delivery, to acknowledge it once the decision is
    /// written: a NATS input's stream sequence number; 0 for inputs that acknowledge
    /// nothing. Not part of the decision record.
    pub delivery: u64,
}

/// Names that decision records refer to by index: sources and trigger lines.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub sources: Vec<String>,
    pub lines: Vec<String>,
}

impl Names {
    pub fn source(&self, i: u16) -> &str {
        self.sources
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("?")
    }
    /// Names of the lines set in `mask`, in line order.
    pub fn lines_of(&self, mask: u64) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i < 64 && mask & (1u64 << i) != 0)
            .map(|(_, n)| n.as_str())
    }
}
