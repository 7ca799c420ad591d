//! Recording files: frames as they arrived, stored back to back as their exact wire bytes,
//! so that a replay feeds the pipeline byte for byte what the network fed it.
//!
//! Layout (all little-endian; `docs/FORMAT.md` is the producer-facing description):
//!
//! ```text
//! file header (32 B) | record* | index block | trailer (32 B)
//! record      = frame_len u32 | frame_crc32c u32 | frame bytes (frame_len)
//! index block = "TRGDINDX" | entry (32 B) * frame_count
//! trailer     = "TRGDTAIL" | index_offset u64 | frame_count u64 | index_crc32c u32 | trailer_crc32c u32
//! ```
//!
//! The writer ([`RecordingWriter`]) only ever appends; the index and trailer are written by
//! [`RecordingWriter::finish`]. A writer that dies first (killed process, power loss, drop
//! without `finish`) leaves a file whose complete records still read: [`Recording::open`]
//! rebuilds the index by scanning and reports the [`TornTail`]. Corruption anywhere else is an
//! error naming the byte offset, never a panic and never a silently shortened replay.
//!
//! Reading maps the file ([`memmap2`]) and hands out frames as borrowed slices of the map: no
//! frame is copied. Every record is checked once on open (record CRC-32C over the whole frame,
//! frame header via [`frame::peek_header`], length agreement), which pairs with the full
//! [`frame::parse`] check the writer does before a frame goes to disk.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::frame::{self, FrameError, HEADER_LEN, MAX_FRAME_LEN};

/// `b"TRGDREC\0"`: first 8 bytes of every recording.
pub const FILE_MAGIC: [u8; 8] = *b"TRGDREC\0";
/// The only recording version this build reads and writes.
pub const FILE_VERSION: u16 = 1;
/// Size of the file header in bytes.
pub const FILE_HEADER_LEN: usize = 32;
/// Size of the header in front of every stored frame.
pub const RECORD_HEADER_LEN: usize = 8;
/// Marks the start of the index block written by `finish`.
pub const INDEX_MAGIC: [u8; 8] = *b"TRGDINDX";
/// Size of one index entry.
pub const INDEX_ENTRY_LEN: usize = 32;
/// Marks the trailer, the last 32 bytes of a finished recording.
pub const TRAILER_MAGIC: [u8; 8] = *b"TRGDTAIL";
/// Size of the trailer.
pub const TRAILER_LEN: usize = 32;

/// File header flag: the frames were captured live from the network (`trigd record`), as
/// opposed to converted or simulated. Informational.
pub const FLAG_LIVE_CAPTURE: u32 = 1;
/// Every flag this build understands; a file with another bit set is refused, so a later
/// version can add flags that change how a file must be read.
pub const KNOWN_FLAGS: u32 = FLAG_LIVE_CAPTURE;

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct FileHeader {
    magic: [u8; 8],
    version: U16,
    header_len: U16,
    flags: U32,
    created_unix_ns: U64,
    reserved: U32,
    /// CRC-32C of bytes 0..28 of the header.
    header_crc32c: U32,
}
const _: () = assert!(std::mem::size_of::<FileHeader>() == FILE_HEADER_LEN);

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordHeader {
    frame_len: U32,
    /// CRC-32C of the whole frame (frame header and payload).
    frame_crc32c: U32,
}
const _: () = assert!(std::mem::size_of::<RecordHeader>() == RECORD_HEADER_LEN);

/// One index entry as stored on disk (32 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct IndexEntry {
    /// Offset of the record header from the start of the file.
    record_offset: U64,
    frame_len: U32,
    source_id: U32,
    sequence: U64,
    timestamp_ns: U64,
}
const _: () = assert!(std::mem::size_of::<IndexEntry>() == INDEX_ENTRY_LEN);

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Trailer {
    magic: [u8; 8],
    /// Offset of the index block (its `TRGDINDX` marker).
    index_offset: U64,
    frame_count: U64,
    /// CRC-32C of the index entries (not the marker).
    index_crc32c: U32,
    /// CRC-32C of bytes 0..28 of the trailer.
    trailer_crc32c: U32,
}
const _: () = assert!(std::mem::size_of::<Trailer>() == TRAILER_LEN);

/// Why a recording could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("refusing to overwrite {0}: the file exists (remove it or choose another name)")]
    Exists(PathBuf),
    #[error("{len}-byte file is shorter than the {FILE_HEADER_LEN}-byte recording header: not a trigd recording")]
    TooShort { len: u64 },
    #[error("bad magic {found:02x?}: not a trigd recording{hint}")]
    BadMagic { found: [u8; 8], hint: &'static str },
    #[error("recording version {0} is not supported, this build reads version {FILE_VERSION}")]
    UnsupportedVersion(u16),
    #[error("recording header is corrupt: {0}")]
    BadHeader(String),
    #[error("recording uses flags {0:#x} that this build does not know")]
    UnknownFlags(u32),
    #[error("corrupt record at byte offset {offset}: {detail}")]
    CorruptRecord { offset: u64, detail: String },
    #[error("corrupt index or trailer at byte offset {offset}: {detail}")]
    CorruptFooter { offset: u64, detail: String },
    #[error("refusing to record a malformed frame ({reason}): {0}", reason = .0.reason())]
    InvalidFrame(#[source] FrameError),
}

impl RecordingError {
    fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// When the writer forces written frames to stable storage (`fsync`/`fdatasync`).
/// Written text form: `never`, `always`, `every:N` (frames), `interval:DURATION` where the
/// duration takes a unit `ns`, `us`, `ms` or `s` (`interval:100ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Leave it to the OS; data reaches disk at its pace (and on `finish`, no sync either).
    Never,
    /// After every `n` frames (and on `finish`).
    EveryFrames(u64),
    /// When at least this long has passed since the last sync, checked on each append (and
    /// on `finish`).
    Interval(Duration),
    /// After every frame: the slowest, loses nothing acknowledged.
    Always,
}

/// A string that is not an [`FsyncPolicy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fsync policy {input:?}: {why}; expected never, always, every:N (frames, N >= 1) or interval:DURATION (e.g. interval:100ms, interval:2s)")]
pub struct ParseFsyncPolicyError {
    pub input: String,
    pub why: &'static str,
}

impl FromStr for FsyncPolicy {
    type Err = ParseFsyncPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseFsyncPolicyError {
            input: s.to_string(),
            why,
        };
        let t = s.trim();
        match t {
            "never" => return Ok(Self::Never),
            "always" => return Ok(Self::Always),
            _ => {}
        }
        if let Some(n) = t.strip_prefix("every:") {
            let n: u64 = n
                .trim()
                .parse()
                .map_err(|_| err("N is not a whole number"))?;
            if n == 0 {
                return Err(err("N must be at least 1"));
            }
            return Ok(Self::EveryFrames(n));
        }
        if let Some(d) = t.strip_prefix("interval:") {
            return parse_duration(d.trim()).map(Self::Interval).map_err(err);
        }
        Err(err("unknown policy"))
    }
}

fn parse_duration(s: &str) -> Result<Duration, &'static str> {
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or("the duration needs a unit (ns, us, ms, s)")?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "the duration does not start with a whole number")?;
    let d = match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err("unknown duration unit (use ns, us, ms or s)"),
    };
    if d.is_zero() {
        return Err("the interval must be longer than zero (use always)");
    }
    Ok(d)
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Never => f.write_str("never"),
            Self::Always => f.write_str("always"),
            Self::EveryFrames(n) => write!(f, "every:{n}"),
            Self::Interval(d) => {
                let ns = d.as_nanos();
                if ns % 1_000_000_000 == 0 {
                    write!(f, "interval:{}s", ns / 1_000_000_000)
                } else if ns % 1_000_000 == 0 {
                    write!(f, "interval:{}ms", ns / 1_000_000)
                } else if ns % 1_000 == 0 {
                    write!(f, "interval:{}us", ns / 1_000)
                } else {
                    write!(f, "interval:{ns}ns")
                }
            }
        }
    }
}

/// The 32-byte file header a writer puts first (exposed for tools and fuzzing that build
/// recordings by hand).
pub fn encode_file_header(flags: u32, created_unix_ns: u64) -> [u8; FILE_HEADER_LEN] {
    let mut header = FileHeader {
        magic: FILE_MAGIC,
        version: FILE_VERSION.into(),
        header_len: (FILE_HEADER_LEN as u16).into(),
        flags: flags.into(),
        created_unix_ns: created_unix_ns.into(),
        reserved: 0.into(),
        header_crc32c: 0.into(),
    };
    header.header_crc32c = crc32c::crc32c(&header.as_bytes()[..28]).into();
    let mut out = [0u8; FILE_HEADER_LEN];
    out.copy_from_slice(header.as_bytes());
    out
}

/// What a finished recording holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSummary {
    pub path: PathBuf,
    pub frames: u64,
    pub file_len_bytes: u64,
}

/// Appends frames to a new recording file. Create, `append` each frame, `finish`.
pub struct RecordingWriter {
    out: Option<BufWriter<File>>,
    path: PathBuf,
    fsync: FsyncPolicy,
    /// Bytes written so far (the offset of the next record).
    pos_bytes: u64,
    index: Vec<IndexEntry>,
    frames_since_sync: u64,
    last_sync: Instant,
}

const WRITE_BUFFER_BYTES: usize = 256 << 10;

impl RecordingWriter {
    /// Creates a new recording at `path` (which must not exist) with no flags set.
    pub fn create(path: impl AsRef<Path>, fsync: FsyncPolicy) -> Result<Self, RecordingError> {
        Self::create_with_flags(path, fsync, 0)
    }

    /// Creates a new recording with file-header `flags` (see [`KNOWN_FLAGS`]).
    pub fn create_with_flags(
        path: impl AsRef<Path>,
        fsync: FsyncPolicy,
        flags: u32,
    ) -> Result<Self, RecordingError> {
        let path = path.as_ref().to_path_buf();
        assert_eq!(
            flags & !KNOWN_FLAGS,
            0,
            "unknown recording flags {flags:#x}"
        );
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    RecordingError::Exists(path.clone())
                } else {
                    RecordingError::io(format!("creating recording {}", path.display()), e)
                }
            })?;
        let created_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let header = encode_file_header(flags, created_unix_ns);
        let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        let mut writer = Self {
            path,
            fsync,
            pos_bytes: 0,
            index: Vec::with_capacity(1 << 14),
            frames_since_sync: 0,
            last_sync: Instant::now(),
            out: None,
        };
        out.write_all(&header)
            .and_then(|()| out.flush())
            .map_err(|e| writer.io_err("writing the recording header", e))?;
        writer.out = Some(out);
        writer.pos_bytes = FILE_HEADER_LEN as u64;
        Ok(writer)
    }

    fn io_err(&self, what: &str, e: io::Error) -> RecordingError {
        RecordingError::io(format!("{what} of {}", self.path.display()), e)
    }

    /// Validates `frame` with [`frame::parse`] and appends it; returns its frame number.
    /// A malformed frame is refused with [`RecordingError::InvalidFrame`] and nothing is
    /// written, so a recording only ever holds frames that parse.
    pub fn append(&mut self, frame_bytes: &[u8]) -> Result<u64, RecordingError> {
        let view = frame::parse(frame_bytes).map_err(RecordingError::InvalidFrame)?;
        // parse() bounds the frame to MAX_FRAME_LEN (16 MiB), so it fits the u32 length.
        debug_assert!(frame_bytes.len() <= MAX_FRAME_LEN);
        let entry = IndexEntry {
            record_offset: self.pos_bytes.into(),
            frame_len: (frame_bytes.len() as u32).into(),
            source_id: view.source_id().into(),
            sequence: view.sequence().into(),
            timestamp_ns: view.timestamp_ns().into(),
        };
        let record = RecordHeader {
            frame_len: (frame_bytes.len() as u32).into(),
            frame_crc32c: crc32c::crc32c(frame_bytes).into(),
        };
        let Some(out) = self.out.as_mut() else {
            unreachable!("writer used after finish")
        };
        if let Err(e) = out
            .write_all(record.as_bytes())
            .and_then(|()| out.write_all(frame_bytes))
        {
            return Err(self.io_err("appending a frame", e));
        }
        self.pos_bytes += (RECORD_HEADER_LEN + frame_bytes.len()) as u64;
        self.index.push(entry);
        self.frames_since_sync += 1;
        let due = match self.fsync {
            FsyncPolicy::Never => false,
            FsyncPolicy::Always => true,
            FsyncPolicy::EveryFrames(n) => self.frames_since_sync >= n,
            FsyncPolicy::Interval(d) => self.last_sync.elapsed() >= d,
        };
        if due {
            self.sync()?;
        }
        Ok(self.index.len() as u64 - 1)
    }

    /// Hands the buffered records to the operating system (no fsync): they survive the
    /// process being killed, as the decision logs do after their flush.
    pub fn flush(&mut self) -> Result<(), RecordingError> {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        if let Err(e) = out.flush() {
            return Err(self.io_err("flushing", e));
        }
        Ok(())
    }

    /// Flushes buffered frames and forces them to stable storage, whatever the policy.
    pub fn sync(&mut self) -> Result<(), RecordingError> {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        if let Err(e) = out.flush().and_then(|()| out.get_ref().sync_data()) {
            return Err(self.io_err("syncing", e));
        }
        self.frames_since_sync = 0;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Frames appended so far.
    pub fn frames(&self) -> u64 {
        self.index.len() as u64
    }

    /// Bytes written so far (header and records; buffered bytes included).
    pub fn len_bytes(&self) -> u64 {
        self.pos_bytes
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the index and the trailer, flushes, and (unless the policy is `Never`) syncs.
    pub fn finish(mut self) -> Result<WriteSummary, RecordingError> {
        let Some(mut out) = self.out.take() else {
            unreachable!("finish called twice")
        };
        let entries = self.index.as_slice().as_bytes();
        let index_offset = self.pos_bytes;
        let mut trailer = Trailer {
            magic: TRAILER_MAGIC,
            index_offset: index_offset.into(),
            frame_count: (self.index.len() as u64).into(),
            index_crc32c: crc32c::crc32c(entries).into(),
            trailer_crc32c: 0.into(),
        };
        trailer.trailer_crc32c = crc32c::crc32c(&trailer.as_bytes()[..28]).into();
        let written = out
            .write_all(&INDEX_MAGIC)
            .and_then(|()| out.write_all(entries))
            .and_then(|()| out.write_all(trailer.as_bytes()))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            return Err(self.io_err("writing the index", e));
        }
        if self.fsync != FsyncPolicy::Never {
            if let Err(e) = out.get_ref().sync_all() {
                return Err(self.io_err("syncing", e));
            }
        }
        let file_len_bytes =
            index_offset + (INDEX_MAGIC.len() + entries.len() + TRAILER_LEN) as u64;
        Ok(WriteSummary {
            path: self.path.clone(),
            frames: self.index.len() as u64,
            file_len_bytes,
        })
    }
}

impl Drop for RecordingWriter {
    /// Without `finish`, the frames written so far are flushed (and synced unless the policy
    /// is `Never`) but no index is written: readers rebuild it by scanning.
    fn drop(&mut self) {
        if let Some(mut out) = self.out.take() {
            let r = out.flush().and_then(|()| {
                if self.fsync == FsyncPolicy::Never {
                    Ok(())
                } else {
                    out.get_ref().sync_data()
                }
            });
            if let Err(e) = r {
                tracing::warn!(path = %self.path.display(), error = %e, "recording dropped without finish and could not be flushed");
            }
        }
    }
}

/// How a recording's end falls short of a finished file. The frames before
/// `usable_len_bytes` are complete and verified; everything after is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornTail {
    pub cause: TornCause,
    /// Bytes of the file that hold the header and complete records.
    pub usable_len_bytes: u64,
    pub file_len_bytes: u64,
}

/// Why a recording has no valid index at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TornCause {
    /// The file ends cleanly after a record but has no index (the writer never finished).
    NoFooter,
    /// The file ends inside the record that starts at `offset`.
    PartialRecord { offset: u64 },
    /// The file ends inside the index block that starts at `offset`.
    PartialFooter { offset: u64 },
    /// Only zero bytes follow `offset` (space allocated but never written, e.g. after a crash).
    ZeroFilled { offset: u64 },
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ignored = self.file_len_bytes - self.usable_len_bytes;
        match self.cause {
            TornCause::NoFooter => write!(f, "no index at the end (writer did not finish)"),
            TornCause::PartialRecord { offset } => {
                write!(f, "file ends inside the record at byte offset {offset}")
            }
            TornCause::PartialFooter { offset } => {
                write!(f, "file ends inside the index at byte offset {offset}")
            }
            TornCause::ZeroFilled { offset } => {
                write!(f, "only zero bytes after byte offset {offset}")
            }
        }?;
        write!(f, "; {ignored} trailing bytes ignored")
    }
}

/// Metadata of one stored frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEntry {
    /// Offset of the frame's first byte (its frame header) in the file.
    pub offset_bytes: u64,
    pub len_bytes: u32,
    pub source_id: u32,
    pub sequence: u64,
    pub timestamp_ns: u64,
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}

enum IndexStore {
    /// The index block of a finished file, validated on open: entries at `start..start+32*count`.
    OnDisk { start: usize, count: usize },
    /// Rebuilt by scanning a file without a valid index.
    Rebuilt(Vec<IndexEntry>),
}

/// A recording opened for reading: frames are borrowed slices of the mapped file.
pub struct Recording {
    bytes: Storage,
    index: IndexStore,
    torn: Option<TornTail>,
    flags: u32,
    created_unix_ns: u64,
    timestamps_sorted: bool,
}

impl fmt::Debug for Recording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recording")
            .field("frames", &self.len())
            .field("file_len_bytes", &self.bytes.len())
            .field("torn", &self.torn)
            .field("flags", &self.flags)
            .finish()
    }
}

impl Recording {
    /// Maps and verifies the recording at `path`. A torn tail is not an error: the complete
    /// prefix is returned, [`Recording::torn_tail`] says what was cut off, and a warning is
    /// logged once. The file must not be truncated by anyone while it is open (the map would
    /// fault); appending to it is harmless (the new frames are not seen).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RecordingError> {
        let path = path.as_ref();
        let file = File::open(path)
            .map_err(|e| RecordingError::io(format!("opening recording {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| RecordingError::io(format!("reading metadata of {}", path.display()), e))?
            .len();
        if len < FILE_HEADER_LEN as u64 {
            return Err(RecordingError::TooShort { len });
        }
        // SAFETY: the map is read-only and lives as long as `Recording`; the file is not
        // truncated while open (documented precondition above), so every mapped page stays
        // backed.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| RecordingError::io(format!("mapping recording {}", path.display()), e))?;
        let rec = Self::from_storage(Storage::Mapped(map))?;
        if let Some(t) = rec.torn {
            tracing::warn!(
                path = %path.display(),
                frames = rec.len(),
                "recording has a torn tail, replaying the complete prefix: {t}"
            );
        }
        Ok(rec)
    }

    /// Reads a recording held in memory (tests, fuzzing, recordings fetched over a network).
    /// Same checks as [`Recording::open`]; a torn tail is reported but not logged.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, RecordingError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(bytes: Storage) -> Result<Self, RecordingError> {
        let layout = read_layout(&bytes)?;
        let mut rec = Self {
            bytes,
            index: layout.index,
            torn: layout.torn,
            flags: layout.flags,
            created_unix_ns: layout.created_unix_ns,
            timestamps_sorted: false,
        };
        rec.timestamps_sorted = rec
            .entries()
            .windows(2)
            .all(|w| w[0].timestamp_ns.get() <= w[1].timestamp_ns.get());
        Ok(rec)
    }

    fn entries(&self) -> &[IndexEntry] {
        match &self.index {
            IndexStore::OnDisk { start, count } => {
                let end = start + count * INDEX_ENTRY_LEN;
                // Bounds and length were validated in read_layout; IndexEntry is Unaligned.
                <[IndexEntry]>::ref_from_bytes(&self.bytes[*start..end])
                    .expect("index block validated on open")
            }
            IndexStore::Rebuilt(v) => v,
        }
    }

    /// Number of complete frames.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The exact wire bytes of frame `i` (header + payload), borrowed from the map.
    /// Panics if `i >= len()`, like slice indexing; see [`Recording::get`].
    pub fn frame(&self, i: usize) -> &[u8] {
        self.frame_of(&self.entries()[i])
    }

    fn frame_of(&self, e: &IndexEntry) -> &[u8] {
        let start = e.record_offset.get() as usize + RECORD_HEADER_LEN;
        &self.bytes[start..start + e.frame_len.get() as usize]
    }

    /// Frame `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (i < self.len()).then(|| self.frame(i))
    }

    /// Metadata of frame `i` from the index. Panics if `i >= len()`.
    pub fn entry(&self, i: usize) -> FrameEntry {
        let e = &self.entries()[i];
        FrameEntry {
            offset_bytes: e.record_offset.get() + RECORD_HEADER_LEN as u64,
            len_bytes: e.frame_len.get(),
            source_id: e.source_id.get(),
            sequence: e.sequence.get(),
            timestamp_ns: e.timestamp_ns.get(),
        }
    }

    /// All frames in file (= arrival) order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.entries().iter().map(move |e| self.frame_of(e))
    }

    /// Index of the first frame, in file order, whose timestamp is `>= ns`; `None` if there
    /// is none. Binary search when timestamps never decrease through the file (checked on
    /// open), a linear scan otherwise (frames from several producers may interleave).
    pub fn index_at_or_after_timestamp(&self, ns: u64) -> Option<usize> {
        let entries = self.entries();
        let i = if self.timestamps_sorted {
            entries.partition_point(|e| e.timestamp_ns.get() < ns)
        } else {
            entries
                .iter()
                .position(|e| e.timestamp_ns.get() >= ns)
                .unwrap_or(entries.len())
        };
        (i < entries.len()).then_some(i)
    }

    /// `Some` when the file was not finished (no index) or ends inside a record or the index.
    pub fn torn_tail(&self) -> Option<TornTail> {
        self.torn
    }

    /// File header flags (see [`FLAG_LIVE_CAPTURE`]).
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// When the writer created the file, nanoseconds since the Unix epoch (writer's clock).
    pub fn created_unix_ns(&self) -> u64 {
        self.created_unix_ns
    }

    /// Size of the whole file, torn bytes included.
    pub fn file_len_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }
}

struct Layout {
    index: IndexStore,
    torn: Option<TornTail>,
    flags: u32,
    created_unix_ns: u64,
}

/// Checks the file header, then either validates the trailer, index and every record of a
/// finished file, or scans the records of an unfinished one.
fn read_layout(bytes: &[u8]) -> Result<Layout, RecordingError> {
    let file_len = bytes.len() as u64;
    let Ok((header, _)) = FileHeader::ref_from_prefix(bytes) else {
        return Err(RecordingError::TooShort { len: file_len });
    };
    if header.magic != FILE_MAGIC {
        let hint = if header.magic[..4] == frame::MAGIC {
            " (it starts with a frame: raw frames need a recording header, see docs/FORMAT.md)"
        } else {
            ""
        };
        return Err(RecordingError::BadMagic {
            found: header.magic,
            hint,
        });
    }
    if header.version.get() != FILE_VERSION {
        return Err(RecordingError::UnsupportedVersion(header.version.get()));
    }
    let crc = crc32c::crc32c(&bytes[..28]);
    if crc != header.header_crc32c.get() {
        return Err(RecordingError::BadHeader(format!(
            "header CRC-32C {crc:#010x} does not match the stored {:#010x}",
            header.header_crc32c.get()
        )));
    }
    if header.header_len.get() as usize != FILE_HEADER_LEN {
        return Err(RecordingError::BadHeader(format!(
            "header length {} is not {FILE_HEADER_LEN}",
            header.header_len.get()
        )));
    }
    if header.reserved.get() != 0 {
        return Err(RecordingError::BadHeader(
            "reserved header field is not zero".into(),
        ));
    }
    let flags = header.flags.get();
    if flags & !KNOWN_FLAGS != 0 {
        return Err(RecordingError::UnknownFlags(flags & !KNOWN_FLAGS));
    }
    let created_unix_ns = header.created_unix_ns.get();
    let (index, torn) = if has_trailer(bytes) {
        (read_finished(bytes)?, None)
    } else {
        let (entries, torn) = scan(bytes)?;
        (IndexStore::Rebuilt(entries), Some(torn))
    };
    Ok(Layout {
        index,
        torn,
        flags,
        created_unix_ns,
    })
}

/// A finished file ends with the trailer magic and a trailer whose own CRC holds. Anything
/// else (a torn file whose last frame happens to contain the magic, a damaged trailer) is
/// read by scanning, which verifies every record just the same.
fn has_trailer(bytes: &[u8]) -> bool {
    if bytes.len() < FILE_HEADER_LEN + INDEX_MAGIC.len() + TRAILER_LEN {
        return false;
    }
    let t = &bytes[bytes.len() - TRAILER_LEN..];
    t[..8] == TRAILER_MAGIC && crc32c::crc32c(&t[..28]).to_le_bytes() == t[28..32]
}

/// A verified record: where its frame lies and what its header says.
fn check_record(bytes: &[u8], offset: usize, end: usize) -> Result<IndexEntry, RecordingError> {
    let corrupt = |detail: String| RecordingError::CorruptRecord {
        offset: offset as u64,
        detail,
    };
    let Ok((rh, _)) = RecordHeader::ref_from_prefix(&bytes[offset..end]) else {
        return Err(corrupt(format!(
            "{} bytes left, too few for an {RECORD_HEADER_LEN}-byte record header",
            end - offset
        )));
    };
    let frame_len = rh.frame_len.get() as usize;
    if !(HEADER_LEN..=MAX_FRAME_LEN).contains(&frame_len) {
        return Err(corrupt(format!(
            "record declares a {frame_len}-byte frame, outside {HEADER_LEN}..={MAX_FRAME_LEN}"
        )));
    }
    let start = offset + RECORD_HEADER_LEN;
    if frame_len > end - start {
        return Err(corrupt(format!(
            "record declares a {frame_len}-byte frame but only {} bytes follow",
            end - start
        )));
    }
    let frame_bytes = &bytes[start..start + frame_len];
    let crc = crc32c::crc32c(frame_bytes);
    if crc != rh.frame_crc32c.get() {
        return Err(corrupt(format!(
            "record CRC-32C {crc:#010x} does not match the stored {:#010x}",
            rh.frame_crc32c.get()
        )));
    }
    let fh = frame::peek_header(frame_bytes).map_err(|e| corrupt(format!("stored frame: {e}")))?;
    if HEADER_LEN + fh.payload_len.get() as usize != frame_len {
        return Err(corrupt(format!(
            "stored frame declares a {}-byte payload but the record holds {} bytes after the frame header",
            fh.payload_len.get(),
            frame_len - HEADER_LEN
        )));
    }
    Ok(IndexEntry {
        record_offset: (offset as u64).into(),
        frame_len: (frame_len as u32).into(),
        source_id: fh.source_id,
        sequence: fh.sequence,
        timestamp_ns: fh.timestamp_ns,
    })
}

fn read_finished(bytes: &[u8]) -> Result<IndexStore, RecordingError> {
    let len = bytes.len();
    let trailer_at = len - TRAILER_LEN;
    let footer = |offset: usize, detail: String| RecordingError::CorruptFooter {
        offset: offset as u64,
        detail,
    };
    let Ok(trailer) = Trailer::ref_from_bytes(&bytes[trailer_at..]) else {
        unreachable!("trailer slice is TRAILER_LEN bytes")
    };
    // has_trailer() checked the trailer's own CRC.
    let index_offset = trailer.index_offset.get();
    let count = trailer.frame_count.get();
    let expected_len = count
        .checked_mul(INDEX_ENTRY_LEN as u64)
        .and_then(|n| n.checked_add(index_offset))
        .and_then(|n| n.checked_add((INDEX_MAGIC.len() + TRAILER_LEN) as u64));
    if index_offset < FILE_HEADER_LEN as u64 || expected_len != Some(len as u64) {
        return Err(footer(
            trailer_at,
            format!(
                "trailer places {count} index entries at byte offset {index_offset}, which does not fit a {len}-byte file"
            ),
        ));
    }
    // Both fit in the file, hence in usize.
    let index_offset = index_offset as usize;
    let count = count as usize;
    if bytes[index_offset..index_offset + 8] != INDEX_MAGIC {
        return Err(footer(
            index_offset,
            "index block does not start with \"TRGDINDX\"".into(),
        ));
    }
    let start = index_offset + INDEX_MAGIC.len();
    let entry_bytes = &bytes[start..trailer_at];
    let crc = crc32c::crc32c(entry_bytes);
    if crc != trailer.index_crc32c.get() {
        return Err(footer(
            start,
            format!(
                "index CRC-32C {crc:#010x} does not match the trailer's {:#010x}",
                trailer.index_crc32c.get()
            ),
        ));
    }
    let Ok(entries) = <[IndexEntry]>::ref_from_bytes(entry_bytes) else {
        unreachable!("index length is a multiple of INDEX_ENTRY_LEN by the size check")
    };
    let mut pos = FILE_HEADER_LEN;
    for (i, e) in entries.iter().enumerate() {
        let entry_at = start + i * INDEX_ENTRY_LEN;
        if e.record_offset.get() != pos as u64 {
            return Err(footer(
                entry_at,
                format!(
                    "index entry {i} points at byte offset {} but record {i} starts at {pos}",
                    e.record_offset.get()
                ),
            ));
        }
        let found = check_record(bytes, pos, index_offset)?;
        if found.as_bytes() != e.as_bytes() {
            return Err(footer(
                entry_at,
                format!("index entry {i} does not match the record at byte offset {pos} (length, source, sequence or timestamp differ)"),
            ));
        }
        pos += RECORD_HEADER_LEN + found.frame_len.get() as usize;
    }
    if pos != index_offset {
        return Err(RecordingError::CorruptRecord {
            offset: pos as u64,
            detail: format!(
                "{} bytes between the last indexed record and the index",
                index_offset - pos
            ),
        });
    }
    Ok(IndexStore::OnDisk { start, count })
}

/// Walks the records of a file without a (valid) trailer, stopping at the torn tail.
fn scan(bytes: &[u8]) -> Result<(Vec<IndexEntry>, TornTail), RecordingError> {
    let len = bytes.len();
    let mut entries = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    let cause = loop {
        let rest = &bytes[pos..];
        if rest.is_empty() {
            break TornCause::NoFooter;
        }
        let offset = pos as u64;
        let n = rest.len().min(INDEX_MAGIC.len());
        if rest[..n] == INDEX_MAGIC[..n] {
            break TornCause::PartialFooter { offset };
        }
        if rest.iter().all(|&b| b == 0) {
            break TornCause::ZeroFilled { offset };
        }
        if rest.len() < RECORD_HEADER_LEN {
            break TornCause::PartialRecord { offset };
        }
        let declared = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if (HEADER_LEN..=MAX_FRAME_LEN).contains(&declared)
            && rest.len() < RECORD_HEADER_LEN + declared
        {
            // Runs past the end: a torn last record, unless the frame header that follows
            // (when it is all there) disagrees with the record's length; then the length
            // itself is damaged and the "tail" would hide the rest of the file.
            let frame_start = &rest[RECORD_HEADER_LEN..];
            let agrees = match frame::peek_header(frame_start) {
                Ok(h) => HEADER_LEN + h.payload_len.get() as usize == declared,
                Err(_) => frame_start.len() < HEADER_LEN,
            };
            if agrees {
                break TornCause::PartialRecord { offset };
            }
            return Err(RecordingError::CorruptRecord {
                offset,
                detail: format!(
                    "record declares a {declared}-byte frame running past the end of the file, but the frame there does not match that length"
                ),
            });
        }
        let e = check_record(bytes, pos, len)?;
        pos += RECORD_HEADER_LEN + e.frame_len.get() as usize;
        entries.push(e);
    };
    Ok((
        entries,
        TornTail {
            cause,
            usable_len_bytes: pos as u64,
            file_len_bytes: len as u64,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_eeg_block, encode_hit_event, HitRecord, Stamp};
    use proptest::prelude::*;

    fn hit_frame(seq: u64, ts: u64, n_hits: usize) -> Vec<u8> {
        let hits: Vec<HitRecord> = (0..n_hits)
            .map(|i| HitRecord {
                x_mm: i as f32 * 0.5,
                y_mm: -(i as f32),
                z_mm: 100.0 + i as f32,
                plane: (i % 8) as u16,
                hit_id: i as u32 + 1,
            })
            .collect();
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            Stamp {
                source_id: 3,
                sequence: seq,
                timestamp_ns: ts,
            },
            &hits,
        );
        b
    }

    fn frames(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| hit_frame(i as u64, 1_000 + 10 * i as u64, i % 5))
            .collect()
    }

    fn write(dir: &Path, name: &str, frames: &[Vec<u8>], finish: bool) -> PathBuf {
        let path = dir.join(name);
        let mut w = RecordingWriter::create(&path, FsyncPolicy::Never).unwrap();
        for f in frames {
            w.append(f).unwrap();
        }
        if finish {
            let s = w.finish().unwrap();
            assert_eq!(s.frames, frames.len() as u64);
            assert_eq!(s.file_len_bytes, std::fs::metadata(&path).unwrap().len());
        }
        path
    }

    /// In-memory recording bytes, finished or not.
    fn recording_bytes(frames: &[Vec<u8>], finish: bool) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::read(write(dir.path(), "r.trgd", frames, finish)).unwrap()
    }

    #[test]
    fn round_trip_gives_the_exact_wire_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut fs = frames(20);
        let mut eeg = Vec::new();
        encode_eeg_block(
            &mut eeg,
            Stamp {
                source_id: 9,
                sequence: 0,
                timestamp_ns: 5_000,
            },
            2,
            256.0,
            0,
            &[1e-6, 2e-6, 3e-6, 4e-6],
        );
        fs.push(eeg);
        let path = write(dir.path(), "r.trgd", &fs, true);
        let rec = Recording::open(&path).unwrap();
        assert_eq!(rec.len(), fs.len());
        assert!(rec.torn_tail().is_none());
        for (i, f) in fs.iter().enumerate() {
            assert_eq!(rec.frame(i), &f[..]);
            let v = frame::parse(rec.frame(i)).unwrap();
            let e = rec.entry(i);
            assert_eq!(
                (
                    e.sequence,
                    e.timestamp_ns,
                    e.source_id,
                    e.len_bytes as usize
                ),
                (v.sequence(), v.timestamp_ns(), v.source_id(), f.len())
            );
        }
        assert!(rec.iter().eq(fs.iter().map(|f| &f[..])));
        assert_eq!(rec.get(fs.len()), None);
        assert!(rec.created_unix_ns() > 1_700_000_000_000_000_000);
    }

    #[test]
    fn empty_recording_round_trips() {
        let bytes = recording_bytes(&[], true);
        let rec = Recording::from_bytes(bytes).unwrap();
        assert!(rec.is_empty());
        assert!(rec.torn_tail().is_none());
        assert_eq!(rec.index_at_or_after_timestamp(0), None);
    }

    #[test]
    fn append_refuses_malformed_frames_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.trgd");
        let mut w = RecordingWriter::create(&path, FsyncPolicy::Never).unwrap();
        let mut bad = hit_frame(0, 0, 2);
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        match w.append(&bad) {
            Err(RecordingError::InvalidFrame(e)) => assert_eq!(e.reason(), "bad_crc"),
            other => panic!("expected InvalidFrame, got {other:?}"),
        }
        assert_eq!(w.frames(), 0);
        assert_eq!(w.len_bytes(), FILE_HEADER_LEN as u64);
        w.finish().unwrap();
        assert!(Recording::open(&path).unwrap().is_empty());
    }

    #[test]
    fn create_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "r.trgd", &frames(1), true);
        assert!(matches!(
            RecordingWriter::create(&path, FsyncPolicy::Never),
            Err(RecordingError::Exists(_))
        ));
        assert_eq!(Recording::open(&path).unwrap().len(), 1);
    }

    #[test]
    fn writer_dropped_without_finish_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let fs = frames(7);
        let path = write(dir.path(), "killed.trgd", &fs, false);
        let rec = Recording::open(&path).unwrap();
        assert_eq!(rec.len(), 7);
        let torn = rec.torn_tail().unwrap();
        assert_eq!(torn.cause, TornCause::NoFooter);
        assert_eq!(torn.usable_len_bytes, torn.file_len_bytes);
        assert!(rec.iter().eq(fs.iter().map(|f| &f[..])));
    }

    #[test]
    fn every_fsync_policy_writes_a_readable_file() {
        let dir = tempfile::tempdir().unwrap();
        let policies = [
            FsyncPolicy::Never,
            FsyncPolicy::Always,
            FsyncPolicy::EveryFrames(2),
            FsyncPolicy::Interval(Duration::from_millis(1)),
        ];
        for (k, p) in policies.into_iter().enumerate() {
            let path = dir.path().join(format!("{k}.trgd"));
            let mut w = RecordingWriter::create(&path, p).unwrap();
            for f in frames(5) {
                w.append(&f).unwrap();
            }
            w.finish().unwrap();
            assert_eq!(Recording::open(&path).unwrap().len(), 5, "{p}");
        }
    }

    #[test]
    fn fsync_policies_parse_and_print() {
        let cases = [
            ("never", FsyncPolicy::Never),
            ("always", FsyncPolicy::Always),
            ("every:1000", FsyncPolicy::EveryFrames(1000)),
            (
                "interval:100ms",
                FsyncPolicy::Interval(Duration::from_millis(100)),
            ),
            ("interval:2s", FsyncPolicy::Interval(Duration::from_secs(2))),
            (
                "interval:250us",
                FsyncPolicy::Interval(Duration::from_micros(250)),
            ),
            (
                "interval:7ns",
                FsyncPolicy::Interval(Duration::from_nanos(7)),
            ),
        ];
        for (s, p) in cases {
            assert_eq!(s.parse::<FsyncPolicy>().unwrap(), p);
            assert_eq!(p.to_string(), s);
        }
        for bad in [
            "",
            "sometimes",
            "every:",
            "every:0",
            "every:-3",
            "interval:",
            "interval:10",
            "interval:0ms",
            "interval:5min",
            "interval:ms",
        ] {
            let e = bad.parse::<FsyncPolicy>().unwrap_err();
            assert!(e.to_string().contains("expected never, always"), "{e}");
        }
    }

    #[test]
    fn seek_by_frame_number_and_timestamp() {
        let fs = frames(50); // timestamps 1000, 1010, ...
        let rec = Recording::from_bytes(recording_bytes(&fs, true)).unwrap();
        assert_eq!(rec.index_at_or_after_timestamp(0), Some(0));
        assert_eq!(rec.index_at_or_after_timestamp(1_000), Some(0));
        assert_eq!(rec.index_at_or_after_timestamp(1_001), Some(1));
        assert_eq!(rec.index_at_or_after_timestamp(1_250), Some(25));
        assert_eq!(rec.index_at_or_after_timestamp(1_490), Some(49));
        assert_eq!(rec.index_at_or_after_timestamp(1_491), None);
        assert_eq!(rec.frame(33), &fs[33][..]);
        // Interleaved producers: timestamps out of order, the first in file order wins.
        let mixed = vec![
            hit_frame(0, 500, 1),
            hit_frame(1, 100, 1),
            hit_frame(2, 300, 1),
        ];
        let rec = Recording::from_bytes(recording_bytes(&mixed, false)).unwrap();
        assert_eq!(rec.index_at_or_after_timestamp(200), Some(0));
        assert_eq!(rec.index_at_or_after_timestamp(501), None);
        assert_eq!(rec.index_at_or_after_timestamp(50), Some(0));
    }

    #[test]
    fn garbage_files_are_refused_with_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "shorter than the 32-byte recording header"),
            (
                b"hello world, this is not a recording file".to_vec(),
                "not a trigd recording",
            ),
            (hit_frame(0, 0, 3), "raw frames need a recording header"),
        ];
        for (i, (bytes, msg)) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("g{i}"));
            std::fs::write(&p, &bytes).unwrap();
            let e = Recording::open(&p).unwrap_err().to_string();
            assert!(e.contains(msg), "{e}");
        }
        let e = Recording::open(dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("opening recording"), "{e}");
        let good = recording_bytes(&frames(3), true);
        let mut v = good.clone();
        v[8] = 2;
        assert!(matches!(
            Recording::from_bytes(v),
            Err(RecordingError::UnsupportedVersion(2))
        ));
        let mut v = good.clone();
        v[20] ^= 1; // creation time, covered by the header CRC
        assert!(matches!(
            Recording::from_bytes(v),
            Err(RecordingError::BadHeader(_))
        ));
    }

    #[test]
    fn corrupt_middle_record_names_its_offset() {
        let fs = frames(6);
        for finish in [true, false] {
            let good = recording_bytes(&fs, finish);
            let rec = Recording::from_bytes(good.clone()).unwrap();
            let target = rec.entry(2);
            let record_offset = target.offset_bytes - RECORD_HEADER_LEN as u64;
            let mut v = good.clone();
            v[target.offset_bytes as usize + HEADER_LEN + 1] ^= 0x10;
            let e = Recording::from_bytes(v).unwrap_err();
            assert!(
                matches!(e, RecordingError::CorruptRecord { offset, .. } if offset == record_offset),
                "{e}"
            );
            assert!(e
                .to_string()
                .contains(&format!("byte offset {record_offset}")));
            // A record length that runs into the next records.
            let mut v = good.clone();
            v[record_offset as usize] = 0xff;
            v[record_offset as usize + 1] = 0xff;
            let e = Recording::from_bytes(v).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("byte offset {record_offset}")),
                "{e}"
            );
        }
    }

    #[test]
    fn corrupt_index_is_an_error() {
        let good = recording_bytes(&frames(4), true);
        let len = good.len();
        for at in [
            len - TRAILER_LEN - 5,
            len - TRAILER_LEN - 4 * INDEX_ENTRY_LEN,
        ] {
            let mut v = good.clone();
            v[at] ^= 0x01;
            let e = Recording::from_bytes(v).unwrap_err();
            assert!(
                matches!(e, RecordingError::CorruptFooter { .. }),
                "at {at}: {e}"
            );
        }
    }

    #[test]
    fn damaged_trailer_falls_back_to_scanning() {
        let fs = frames(4);
        let good = recording_bytes(&fs, true);
        let records_end = recording_bytes(&fs, false).len() as u64;
        let mut v = good.clone();
        let at = v.len() - 10;
        v[at] ^= 0x01;
        let rec = Recording::from_bytes(v).unwrap();
        assert_eq!(rec.len(), 4);
        assert_eq!(
            rec.torn_tail().unwrap().cause,
            TornCause::PartialFooter {
                offset: records_end
            }
        );
    }

    #[test]
    fn zero_filled_tail_is_torn_not_corrupt() {
        let fs = frames(3);
        let mut v = recording_bytes(&fs, false);
        let usable = v.len();
        v.resize(usable + 4096, 0);
        let rec = Recording::from_bytes(v).unwrap();
        assert_eq!(rec.len(), 3);
        let t = rec.torn_tail().unwrap();
        assert_eq!(
            t.cause,
            TornCause::ZeroFilled {
                offset: usable as u64
            }
        );
        assert_eq!(t.usable_len_bytes, usable as u64);
    }

    #[test]
    fn torn_footer_keeps_every_frame() {
        let fs = frames(4);
        let finished = recording_bytes(&fs, true);
        let records_end = recording_bytes(&fs, false).len();
        for cut in records_end + 1..finished.len() {
            let rec = Recording::from_bytes(finished[..cut].to_vec()).unwrap();
            assert_eq!(rec.len(), 4, "cut at {cut}");
            assert_eq!(
                rec.torn_tail().unwrap().cause,
                TornCause::PartialFooter {
                    offset: records_end as u64
                }
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A writer killed at any byte of the last record leaves exactly the complete prefix.
        #[test]
        fn torn_tail_at_every_byte_of_the_last_frame(n in 1usize..6, hits in 0usize..4, finish in any::<bool>()) {
            let mut fs = frames(n);
            fs.push(hit_frame(99, 99_000, hits));
            let full = recording_bytes(&fs, finish);
            let prefix = recording_bytes(&fs[..n], false).len();
            for cut in prefix..prefix + RECORD_HEADER_LEN + fs[n].len() {
                let rec = Recording::from_bytes(full[..cut].to_vec()).unwrap();
                prop_assert_eq!(rec.len(), n);
                prop_assert!(rec.iter().eq(fs[..n].iter().map(|f| &f[..])));
                let t = rec.torn_tail().unwrap();
                prop_assert_eq!(t.usable_len_bytes, prefix as u64);
                let want = if cut == prefix { TornCause::NoFooter } else { TornCause::PartialRecord { offset: prefix as u64 } };
                prop_assert_eq!(t.cause, want);
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Recording::from_bytes(bytes);
        }

        /// Random bytes after a valid header, and random damage to a valid file: an error or
        /// a recording whose frames all sit inside the file, never a panic.
        #[test]
        fn damaged_recordings_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..256),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4),
            finish in any::<bool>(),
        ) {
            let good = recording_bytes(&frames(3), finish);
            let mut v = good[..FILE_HEADER_LEN].to_vec();
            v.extend_from_slice(&tail);
            let _ = Recording::from_bytes(v);
            let mut v = good.clone();
            for (at, x) in flips {
                let i = at.index(v.len());
                v[i] ^= x;
            }
            if let Ok(rec) = Recording::from_bytes(v) {
                for f in rec.iter() {
                    prop_assert!(frame::peek_header(f).is_ok());
                }
            }
        }
    }
}
