//! Compact binary decision log: a header with magic, version and the names table (sources,
//! trigger lines), then one fixed-size little-endian [`DecisionRecord`] per decision. The
//! same record is the payload of the UDP decision stream ([`super::udp`]).
//!
//! Layout (all little-endian):
//!
//! ```text
//! header:  "TRIGDLOG" | version u16 = 1 | record_size u16 = 112 | n_sources u32 | n_lines u32
//!          | n_sources x (len u16, UTF-8 bytes) | n_lines x (len u16, UTF-8 bytes)
//!          | crc32c u32 of all header bytes before it
//! record:  112 bytes, see DecisionRecord; its last 4 bytes are the crc32c of the first 108
//! ```
//!
//! Every record is checked right before it is written and right after it is read back
//! (codes in range, source and lines inside the names table, CRC).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use zerocopy::little_endian::{F32, F64, U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::file::{LogFile, LogOut, Rotation};
use super::Sink;
use crate::backend::{BackendKind, Detail};
use crate::decision::{Decision, Names, Outcome, Workload};

pub const FILE_MAGIC: [u8; 8] = *b"TRIGDLOG";
pub const FORMAT_VERSION: u16 = 1;
/// Magic and version at the start of each record ("TDR" + format version 1).
pub const RECORD_MAGIC: [u8; 4] = *b"TDR\x01";
pub const RECORD_SIZE: usize = 112;
/// Longest reason the record holds, bytes.
pub const REASON_MAX_LEN: usize = 32;
/// Longest source or line name in the header, bytes.
pub const NAME_MAX_LEN: usize = 1024;
/// Most sources (decision source index is u16).
pub const SOURCES_MAX: usize = 1 << 16;
/// Most trigger lines (lines_fired is a u64 mask).
pub const LINES_MAX: usize = 64;
/// Most distinct reasons outside [`KNOWN_REASONS`] a process keeps when reading logs.
const INTERNED_REASONS_MAX: usize = 1024;

/// Reasons the pipeline produces; reading maps these to the same static strings.
pub static KNOWN_REASONS: &[&str] = &[
    "ring_full",
    "deadline",
    "other",
    "too_short",
    "bad_magic",
    "bad_version",
    "bad_kind",
    "reserved_nonzero",
    "length_mismatch",
    "too_large",
    "bad_crc",
    "bad_payload",
    "non_finite",
    "sink_blocked",
    "overload",
    "shutdown",
    "backend_error",
    "wrong_kind",
];

/// One decision, fixed size, little-endian, no padding.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DecisionRecord {
    pub magic: [u8; 4],
    pub source_id: U32,
    pub seq: U64,
    pub timestamp_ns: U64,
    pub latency_ns: U64,
    pub lines_fired: U64,
    pub source: U16,
    /// [`Workload::code`].
    pub workload: u8,
    /// [`Outcome::code`].
    pub outcome: u8,
    pub accepted: u8,
    /// 0 none, 1 cpu, 2 gpu.
    pub backend: u8,
    /// 0 none, 1 multiplicity, 2 tracking, 3 eeg.
    pub detail_kind: u8,
    pub reason_len: u8,
    /// EEG statistic.
    pub statistic: F64,
    /// n_hits | n_tracks | peak_source.
    pub detail_a: U32,
    /// n_planes.
    pub detail_b: U32,
    /// max_p_gev in [0] | peak_pos_mm.
    pub detail_f: [F32; 3],
    pub reason: [u8; REASON_MAX_LEN],
    /// crc32c of the bytes before it.
    pub crc32c: U32,
}

const _: () = assert!(std::mem::size_of::<DecisionRecord>() == RECORD_SIZE);

/// A record that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("record is {0} bytes, expected {RECORD_SIZE}")]
    Size(usize),
    #[error("bad record magic {0:02x?}, expected {RECORD_MAGIC:02x?}")]
    Magic([u8; 4]),
    #[error("record crc32c {stored:#010x} does not match contents {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("bad {field} code {value}")]
    Code { field: &'static str, value: u8 },
    #[error("reason {0:?} is longer than {REASON_MAX_LEN} bytes")]
    ReasonTooLong(String),
    #[error("reason length {0} exceeds {REASON_MAX_LEN}")]
    ReasonLength(u8),
    #[error("reason is not UTF-8")]
    ReasonNotUtf8,
    #[error("record is not in canonical form (unused field or reason padding not zero)")]
    NonCanonical,
    #[error("more than {INTERNED_REASONS_MAX} distinct unknown reasons")]
    TooManyReasons,
    #[error("accepted = {accepted} contradicts outcome {outcome}")]
    Accepted {
        outcome: &'static str,
        accepted: bool,
    },
    #[error("source index {source_index} outside the names table ({n_sources} sources)")]
    Source { source_index: u16, n_sources: usize },
    #[error("lines_fired {mask:#x} names lines beyond the {n_lines} configured")]
    Lines { mask: u64, n_lines: usize },
}

/// A binary log that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum BinlogError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("reading the decision log: {0}")]
    Read(#[from] io::Error),
    #[error("not a trigd decision log: magic {0:02x?}, expected \"TRIGDLOG\"")]
    Magic([u8; 8]),
    #[error("decision log format version {0}, this trigd reads version {FORMAT_VERSION}")]
    Version(u16),
    #[error("decision log records are {0} bytes, this trigd reads {RECORD_SIZE}")]
    RecordSize(u16),
    #[error("decision log header lists {count} {what}, at most {max} allowed")]
    TooMany {
        what: &'static str,
        count: u64,
        max: usize,
    },
    #[error("{what} name {index} is {len} bytes, at most {NAME_MAX_LEN} allowed")]
    NameTooLong {
        what: &'static str,
        index: usize,
        len: usize,
    },
    #[error("{what} name {index} is not UTF-8")]
    NameNotUtf8 { what: &'static str, index: usize },
    #[error("decision log header crc32c {stored:#010x} does not match contents {computed:#010x}")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("decision log ends inside the header")]
    TruncatedHeader,
    #[error("decision log ends inside record {index} (byte offset {offset}, {got} of {RECORD_SIZE} bytes)")]
    TruncatedRecord { index: u64, offset: u64, got: usize },
    #[error("record {index} at byte offset {offset}: {source}")]
    Record {
        index: u64,
        offset: u64,
        source: RecordError,
    },
}

impl From<RecordError> for io::Error {
    fn from(e: RecordError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

fn workload_from_code(c: u8) -> Option<Workload> {
    [Workload::Multiplicity, Workload::Tracking, Workload::Eeg]
        .into_iter()
        .find(|w| w.code() == c)
}

fn backend_code(b: Option<BackendKind>) -> u8 {
    match b {
        None => 0,
        Some(BackendKind::Cpu) => 1,
        Some(BackendKind::Gpu) => 2,
    }
}

fn check_accepted(outcome: Outcome, accepted: bool) -> Result<(), RecordError> {
    if outcome != Outcome::Timeout && accepted != (outcome == Outcome::Accept) {
        return Err(RecordError::Accepted {
            outcome: outcome.as_str(),
            accepted,
        });
    }
    Ok(())
}

/// Checks `d` against the names table it will be read back with.
pub fn check_against_names(
    d: &Decision,
    n_sources: usize,
    n_lines: usize,
) -> Result<(), RecordError> {
    if usize::from(d.source) >= n_sources {
        return Err(RecordError::Source {
            source_index: d.source,
            n_sources,
        });
    }
    if n_lines < 64 && d.lines_fired >> n_lines != 0 {
        return Err(RecordError::Lines {
            mask: d.lines_fired,
            n_lines,
        });
    }
    Ok(())
}

impl DecisionRecord {
    /// Encodes `d` (no heap allocation); fails on a reason longer than [`REASON_MAX_LEN`]
    /// or an `accepted` flag that contradicts the outcome.
    pub fn from_decision(d: &Decision) -> Result<Self, RecordError> {
        check_accepted(d.outcome, d.accepted)?;
        let reason = d.reason.as_bytes();
        if reason.len() > REASON_MAX_LEN {
            return Err(RecordError::ReasonTooLong(d.reason.to_owned()));
        }
        let mut r = DecisionRecord::new_zeroed();
        r.magic = RECORD_MAGIC;
        r.source_id = d.source_id.into();
        r.seq = d.seq.into();
        r.timestamp_ns = d.timestamp_ns.into();
        r.latency_ns = d.latency_ns.into();
        r.lines_fired = d.lines_fired.into();
        r.source = d.source.into();
        r.workload = d.workload.code();
        r.outcome = d.outcome.code();
        r.accepted = u8::from(d.accepted);
        r.backend = backend_code(d.backend);
        match d.detail {
            Detail::None => r.detail_kind = 0,
            Detail::Multiplicity { n_hits, n_planes } => {
                r.detail_kind = 1;
                r.detail_a = n_hits.into();
                r.detail_b = n_planes.into();
            }
            Detail::Tracking {
                n_tracks,
                max_p_gev,
            } => {
                r.detail_kind = 2;
                r.detail_a = n_tracks.into();
                r.detail_f[0] = max_p_gev.into();
            }
            Detail::Eeg {
                statistic,
                peak_source,
                peak_pos_mm,
            } => {
                r.detail_kind = 3;
                r.statistic = statistic.into();
                r.detail_a = peak_source.into();
                r.detail_f = peak_pos_mm.map(F32::new);
            }
        }
        r.reason_len = reason.len() as u8; // <= REASON_MAX_LEN, checked above
        r.reason[..reason.len()].copy_from_slice(reason);
        r.crc32c = crc32c::crc32c(&r.as_bytes()[..RECORD_SIZE - 4]).into();
        Ok(r)
    }

    /// Decodes and checks a record (magic, CRC, codes, reason).
    pub fn to_decision(&self) -> Result<Decision, RecordError> {
        if self.magic != RECORD_MAGIC {
            return Err(RecordError::Magic(self.magic));
        }
        let computed = crc32c::crc32c(&self.as_bytes()[..RECORD_SIZE - 4]);
        if computed != self.crc32c.get() {
            return Err(RecordError::Crc {
                stored: self.crc32c.get(),
                computed,
            });
        }
        let code = |field, value| RecordError::Code { field, value };
        let workload = workload_from_code(self.workload).ok_or(code("workload", self.workload))?;
        let outcome = Outcome::from_code(self.outcome).ok_or(code("outcome", self.outcome))?;
        let accepted = match self.accepted {
            0 => false,
            1 => true,
            v => return Err(code("accepted", v)),
        };
        check_accepted(outcome, accepted)?;
        let backend = match self.backend {
            0 => None,
            1 => Some(BackendKind::Cpu),
            2 => Some(BackendKind::Gpu),
            v => return Err(code("backend", v)),
        };
        let detail = match self.detail_kind {
            0 => Detail::None,
            1 => Detail::Multiplicity {
                n_hits: self.detail_a.get(),
                n_planes: self.detail_b.get(),
            },
            2 => Detail::Tracking {
                n_tracks: self.detail_a.get(),
                max_p_gev: self.detail_f[0].get(),
            },
            3 => Detail::Eeg {
                statistic: self.statistic.get(),
                peak_source: self.detail_a.get(),
                peak_pos_mm: self.detail_f.map(F32::get),
            },
            v => return Err(code("detail", v)),
        };
        let len = usize::from(self.reason_len);
        if len > REASON_MAX_LEN {
            return Err(RecordError::ReasonLength(self.reason_len));
        }
        let reason =
            std::str::from_utf8(&self.reason[..len]).map_err(|_| RecordError::ReasonNotUtf8)?;
        let d = Decision {
            delivery: 0,
            source: self.source.get(),
            source_id: self.source_id.get(),
            seq: self.seq.get(),
            timestamp_ns: self.timestamp_ns.get(),
            workload,
            outcome,
            accepted,
            reason: intern_reason(reason)?,
            lines_fired: self.lines_fired.get(),
            latency_ns: self.latency_ns.get(),
            backend,
            detail,
        };
        // Unused detail fields and reason padding must be zero: one encoding per decision.
        if DecisionRecord::from_decision(&d)?.as_bytes() != self.as_bytes() {
            return Err(RecordError::NonCanonical);
        }
        Ok(d)
    }
}

/// Encodes one record to its [`RECORD_SIZE`] bytes (what the UDP stream sends).
pub fn encode_record(d: &Decision) -> Result<[u8; RECORD_SIZE], RecordError> {
    let r = DecisionRecord::from_decision(d)?;
    let mut out = [0u8; RECORD_SIZE];
    out.copy_from_slice(r.as_bytes());
    Ok(out)
}

/// Decodes one record from exactly [`RECORD_SIZE`] bytes (a UDP datagram, say).
pub fn decode_record(bytes: &[u8]) -> Result<Decision, RecordError> {
    let r = DecisionRecord::read_from_bytes(bytes).map_err(|_| RecordError::Size(bytes.len()))?;
    r.to_decision()
}

/// Maps a reason read from a log to a `&'static str`: known reasons to the pipeline's own
/// strings, others to a bounded process-wide pool.
fn intern_reason(s: &str) -> Result<&'static str, RecordError> {
    if s.is_empty() {
        return Ok("");
    }
    if let Some(k) = KNOWN_REASONS.iter().find(|k| **k == s) {
        return Ok(k);
    }
    static POOL: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(k) = pool.iter().find(|k| **k == s) {
        return Ok(k);
    }
    if pool.len() >= INTERNED_REASONS_MAX {
        return Err(RecordError::TooManyReasons);
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    pool.push(leaked);
    Ok(leaked)
}

/// Header bytes for `names`.
pub fn encode_header(names: &Names) -> Result<Vec<u8>, BinlogError> {
    for (what, list, max) in [
        ("source", &names.sources, SOURCES_MAX),
        ("line", &names.lines, LINES_MAX),
    ] {
        if list.len() > max {
            return Err(BinlogError::TooMany {
                what,
                count: list.len() as u64,
                max,
            });
        }
        for (index, n) in list.iter().enumerate() {
            if n.len() > NAME_MAX_LEN {
                return Err(BinlogError::NameTooLong {
                    what,
                    index,
                    len: n.len(),
                });
            }
        }
    }
    let mut h = Vec::with_capacity(
        24 + names
            .sources
            .iter()
            .chain(&names.lines)
            .map(|n| 2 + n.len())
            .sum::<usize>(),
    );
    h.extend_from_slice(&FILE_MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&(RECORD_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&(names.sources.len() as u32).to_le_bytes());
    h.extend_from_slice(&(names.lines.len() as u32).to_le_bytes());
    for n in names.sources.iter().chain(&names.lines) {
        h.extend_from_slice(&(n.len() as u16).to_le_bytes());
        h.extend_from_slice(n.as_bytes());
    }
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    Ok(h)
}

/// Writes decisions to a binary log through a `BufWriter`. A record is handed over in one
/// piece, so a failed write leaves no partial record behind.
pub struct BinlogSink<W: LogOut> {
    out: W,
    n_sources: usize,
    n_lines: usize,
}

impl BinlogSink<LogFile> {
    /// Creates (truncates) `path` and writes the header for `names`.
    pub fn create(path: impl AsRef<Path>, names: &Names) -> Result<Self, BinlogError> {
        Self::create_rotating(path, names, Rotation::default())
    }

    /// Creates (truncates) `path`, rotated by size as `rotation` says; every file of the
    /// rotation starts with the header.
    pub fn create_rotating(
        path: impl AsRef<Path>,
        names: &Names,
        rotation: Rotation,
    ) -> Result<Self, BinlogError> {
        let path = path.as_ref();
        let file = LogFile::create(path, encode_header(names)?, rotation, 256 * RECORD_SIZE)
            .map_err(|source| BinlogError::Io {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            out: file,
            n_sources: names.sources.len(),
            n_lines: names.lines.len(),
        })
    }
}

impl<W: LogOut> BinlogSink<W> {
    /// Writes the header for `names` to `out`; records follow.
    pub fn new(mut out: W, names: &Names) -> Result<Self, BinlogError> {
        out.write_all(&encode_header(names)?)?;
        Ok(Self {
            out,
            n_sources: names.sources.len(),
            n_lines: names.lines.len(),
        })
    }

    /// Flushes and returns the writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: LogOut> Sink for BinlogSink<W> {
    /// `names` must be the table the log was created with (it is in the header).
    fn write(&mut self, d: &Decision, _names: &Names) -> io::Result<()> {
        check_against_names(d, self.n_sources, self.n_lines)?;
        let r = DecisionRecord::from_decision(d)?;
        self.out.write_all(r.as_bytes())?;
        self.out.after_record()
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
    fn kind(&self) -> &'static str {
        "binlog"
    }
    fn target(&self) -> String {
        self.out.target()
    }
    fn reopen(&mut self) -> io::Result<()> {
        self.out.reopen()
    }
}

/// Fills `buf` from `r`, returning how many bytes were read (< len only at end of input).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Appends `n` bytes of `input` to `header`; a short read is a truncated header.
fn take(input: &mut impl Read, n: usize, header: &mut Vec<u8>) -> Result<(), BinlogError> {
    let start = header.len();
    header.resize(start + n, 0);
    if read_full(input, &mut header[start..])? < n {
        return Err(BinlogError::TruncatedHeader);
    }
    Ok(())
}

/// Streams decisions out of a binary log.
pub struct BinlogReader<R: Read> {
    input: R,
    names: Names,
    offset: u64,
    index: u64,
}

impl BinlogReader<BufReader<File>> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, BinlogError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| BinlogError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::new(BufReader::new(file))
    }
}

impl<R: Read> BinlogReader<R> {
    /// Reads and checks the header.
    pub fn new(mut input: R) -> Result<Self, BinlogError> {
        let mut header = Vec::with_capacity(64);
        take(&mut input, 20, &mut header)?;
        let magic: [u8; 8] = header[0..8].try_into().unwrap_or_default();
        if magic != FILE_MAGIC {
            return Err(BinlogError::Magic(magic));
        }
        let u16_at = |h: &[u8], i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |h: &[u8], i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let version = u16_at(&header, 8);
        if version != FORMAT_VERSION {
            return Err(BinlogError::Version(version));
        }
        let record_size = u16_at(&header, 10);
        if usize::from(record_size) != RECORD_SIZE {
            return Err(BinlogError::RecordSize(record_size));
        }
        let mut names = Names::default();
        let counts = [
            ("source", u32_at(&header, 12), SOURCES_MAX),
            ("line", u32_at(&header, 16), LINES_MAX),
        ];
        for (what, count, max) in counts {
            if count as usize > max {
                return Err(BinlogError::TooMany {
                    what,
                    count: u64::from(count),
                    max,
                });
            }
            for index in 0..count as usize {
                let at = header.len();
                take(&mut input, 2, &mut header)?;
                let len = usize::from(u16_at(&header, at));
                if len > NAME_MAX_LEN {
                    return Err(BinlogError::NameTooLong { what, index, len });
                }
                let at = header.len();
                take(&mut input, len, &mut header)?;
                let name = std::str::from_utf8(&header[at..])
                    .map_err(|_| BinlogError::NameNotUtf8 { what, index })?;
                if what == "source" {
                    &mut names.sources
                } else {
                    &mut names.lines
                }
                .push(name.to_owned());
            }
        }
        let computed = crc32c::crc32c(&header);
        let mut crc = [0u8; 4];
        if read_full(&mut input, &mut crc)? < 4 {
            return Err(BinlogError::TruncatedHeader);
        }
        let stored = u32::from_le_bytes(crc);
        if stored != computed {
            return Err(BinlogError::HeaderCrc { stored, computed });
        }
        Ok(Self {
            input,
            names,
            offset: header.len() as u64 + 4,
            index: 0,
        })
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The next decision, `None` at a clean end of the log.
    pub fn next_decision(&mut self) -> Result<Option<Decision>, BinlogError> {
        let mut r = DecisionRecord::new_zeroed();
        let got = read_full(&mut self.input, r.as_mut_bytes())?;
        let (index, offset) = (self.index, self.offset);
        if got == 0 {
            return Ok(None);
        }
        if got < RECORD_SIZE {
            return Err(BinlogError::TruncatedRecord { index, offset, got });
        }
        let wrap = |source| BinlogError::Record {
            index,
            offset,
            source,
        };
        let d = r.to_decision().map_err(wrap)?;
        check_against_names(&d, self.names.sources.len(), self.names.lines.len()).map_err(wrap)?;
        self.index += 1;
        self.offset += RECORD_SIZE as u64;
        Ok(Some(d))
    }
}

impl<R: Read> Iterator for BinlogReader<R> {
    type Item = Result<Decision, BinlogError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_decision().transpose()
    }
}

/// Reads a whole binary log: its names table and every decision.
pub fn read_binlog(path: impl AsRef<Path>) -> Result<(Names, Vec<Decision>), BinlogError> {
    let mut r = BinlogReader::open(path)?;
    let mut out = Vec::new();
    while let Some(d) = r.next_decision()? {
        out.push(d);
    }
    Ok((r.names, out))
}

/// Parses a binary log held in memory (fuzzing, tools reading from a pipe).
pub fn parse_binlog(bytes: &[u8]) -> Result<(Names, Vec<Decision>), BinlogError> {
    let mut r = BinlogReader::new(bytes)?;
    let mut out = Vec::with_capacity(bytes.len() / RECORD_SIZE);
    while let Some(d) = r.next_decision()? {
        out.push(d);
    }
    Ok((r.names, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::testdata;
    use proptest::prelude::*;

    fn log_bytes(names: &Names, decisions: &[Decision]) -> Vec<u8> {
        let mut sink = BinlogSink::new(Vec::new(), names).unwrap();
        for d in decisions {
            sink.write(d, names).unwrap();
        }
        sink.into_inner().unwrap()
    }

    #[test]
    fn file_round_trip_gives_equal_names_and_decisions() {
        let names = testdata::names();
        let decisions = testdata::decisions();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.bin");
        let mut sink = BinlogSink::create(&path, &names).unwrap();
        for d in &decisions {
            sink.write(d, &names).unwrap();
        }
        sink.flush().unwrap();
        drop(sink);
        let (names_back, back) = read_binlog(&path).unwrap();
        assert_eq!(names_back.sources, names.sources);
        assert_eq!(names_back.lines, names.lines);
        assert_eq!(back, decisions);
        // Reasons come back as the pipeline's own static strings.
        assert!(std::ptr::eq(back[3].reason, KNOWN_REASONS[0]));
        let header = encode_header(&names).unwrap().len() as u64;
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            header + (RECORD_SIZE * decisions.len()) as u64
        );
    }

    #[test]
    fn corruption_is_reported_with_record_index_and_offset() {
        let names = testdata::names();
        let decisions = testdata::decisions();
        let bytes = log_bytes(&names, &decisions);
        let header = encode_header(&names).unwrap().len();

        let mut flipped = bytes.clone();
        flipped[header + RECORD_SIZE + 20] ^= 0x40;
        match parse_binlog(&flipped) {
            Err(BinlogError::Record {
                index: 1,
                offset,
                source: RecordError::Crc { .. },
            }) => {
                assert_eq!(offset as usize, header + RECORD_SIZE)
            }
            other => panic!("{other:?}"),
        }
        match parse_binlog(&bytes[..bytes.len() - 1]) {
            Err(BinlogError::TruncatedRecord { index: 4, got, .. }) => {
                assert_eq!(got, RECORD_SIZE - 1)
            }
            other => panic!("{other:?}"),
        }
        let mut name_flip = bytes.clone();
        name_flip[23] ^= 1;
        assert!(
            matches!(parse_binlog(&name_flip), Err(BinlogError::HeaderCrc { .. })),
            "header names are covered by the CRC"
        );
        assert!(matches!(
            parse_binlog(b"TRIGDLOX"),
            Err(BinlogError::TruncatedHeader)
        ));
        assert!(matches!(
            parse_binlog(b"NOTALOG!____________"),
            Err(BinlogError::Magic(_))
        ));
    }

    #[test]
    fn writer_refuses_records_the_reader_would_refuse() {
        let names = testdata::names();
        let mut sink = BinlogSink::new(Vec::new(), &names).unwrap();
        let mut d = testdata::decisions()[0].clone();
        d.source = 2;
        assert!(
            sink.write(&d, &names).is_err(),
            "source outside the names table"
        );
        d.source = 0;
        d.lines_fired = 1 << 3;
        assert!(
            sink.write(&d, &names).is_err(),
            "line outside the names table"
        );
        d.lines_fired = 0;
        d.accepted = false;
        assert!(
            sink.write(&d, &names).is_err(),
            "accept outcome with accepted = false"
        );
        d.accepted = true;
        d.reason = "a_reason_that_is_far_too_long_for_the_record";
        assert!(sink.write(&d, &names).is_err());
        d.reason = "some_new_reason";
        sink.write(&d, &names).unwrap();
        let (_, back) = parse_binlog(&sink.into_inner().unwrap()).unwrap();
        assert_eq!(back, vec![d]);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_binlog(&bytes);
            let _ = decode_record(&bytes);
        }

        #[test]
        fn random_bytes_after_a_valid_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut bytes = encode_header(&testdata::names()).unwrap();
            bytes.extend_from_slice(&tail);
            let _ = parse_binlog(&bytes);
        }

        #[test]
        fn mutated_valid_logs_never_panic(pos in 0usize..1000, xor in 1u8..=255) {
            let mut bytes = log_bytes(&testdata::names(), &testdata::decisions());
            let i = pos % bytes.len();
            bytes[i] ^= xor;
            prop_assert!(parse_binlog(&bytes).is_err(), "a flipped byte at {} went unnoticed", i);
        }
    }
}
