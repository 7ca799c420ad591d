//! EDF, EDF+ and BDF recordings: reading them (header validation, physical scaling to
//! volts, annotations, block-by-block replay) and writing them (for `trigd simulate eeg`
//! and tests).
//!
//! What is read, and how:
//! - EDF (16-bit samples) and BDF (24-bit samples), plain or EDF+C / BDF+C (continuous).
//!   EDF+D / BDF+D (discontinuous) files are refused at open: their records are not
//!   contiguous in time, and replaying them as if they were would shift every event.
//! - Every header field is checked; a bad one gives [`EdfError::Field`] naming the field
//!   and its byte offset. A record count of `-1` (recording still open) is computed from
//!   the file size. A file shorter than its header declares is refused; bytes after the
//!   last whole data record are ignored.
//! - Physical values follow the header exactly, computed the way MNE-Python does so the
//!   two agree bit for bit: `cal = (phys_max - phys_min) / (dig_max - dig_min)`,
//!   `offset = phys_min - dig_min * cal`, `value = (digital * cal + offset) * unit`, where
//!   `unit` is 1e-6 for `uV`/`µV`/`μV`, 1e-3 for `mV` and 1 otherwise (so `V` signals and
//!   signals of other dimensions are returned as declared). This is the same number as
//!   `(digital - dig_min) * (phys_max - phys_min) / (dig_max - dig_min) + phys_min`.
//! - Signals may have different sample rates (samples per record). Each signal can be read
//!   at its own rate ([`EdfReader::read_signal`]); block replay ([`EdfReader::blocks`])
//!   needs one rate for all selected signals and refuses, naming the signal, otherwise.
//!   Nothing is resampled.
//! - Annotations come from every `EDF Annotations` / `BDF Annotations` signal (TALs:
//!   onset, optional duration, texts), onsets relative to the first sample as MNE reports
//!   them (the first record's time-keeping onset is subtracted).
//! - The file is memory-mapped; blocks are decoded from the mapping on demand, so a large
//!   recording is never loaded whole.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Size of the fixed part of the header.
const FIXED_HEADER_LEN: usize = 256;
/// Size of each signal's part of the header.
const SIGNAL_HEADER_LEN: usize = 256;
/// Upper bound on signals in one file (the 4-character field allows 9999).
pub const MAX_SIGNALS: usize = 9999;

/// Errors from reading or writing an EDF/BDF file.
#[derive(Debug, thiserror::Error)]
pub enum EdfError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("header field `{field}` at byte {offset}: {reason}")]
    Field {
        field: String,
        offset: usize,
        reason: String,
    },
    #[error(
        "file is {actual} bytes, shorter than the {needed} bytes its header declares ({what})"
    )]
    Truncated {
        actual: usize,
        needed: usize,
        what: String,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "signal {label:?} is sampled at {rate_hz} Hz, but {first_label:?} at {expected_hz} Hz: \
         block replay needs one rate, select signals of the same rate"
    )]
    MixedRates {
        label: String,
        rate_hz: f64,
        first_label: String,
        expected_hz: f64,
    },
    #[error("no signal labelled {0:?} in the file")]
    UnknownLabel(String),
    #[error("signal index {index} out of range: the file has {n_signals} signals")]
    BadSignal { index: usize, n_signals: usize },
    #[error("signal {index} ({label:?}) is an annotation signal, not a data signal")]
    AnnotationSignal { index: usize, label: String },
    #[error("samples {start}..{end} of signal {label:?} out of range: it has {n_samples}")]
    Range {
        label: String,
        start: usize,
        end: usize,
        n_samples: usize,
    },
    #[error("annotations in data record {record}: {reason}")]
    Annotation { record: usize, reason: String },
    #[error("cannot write: {0}")]
    Write(String),
}

fn field_err(field: impl Into<String>, offset: usize, reason: impl Into<String>) -> EdfError {
    EdfError::Field {
        field: field.into(),
        offset,
        reason: reason.into(),
    }
}

/// Sample width of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdfFormat {
    /// European Data Format: 16-bit two's complement samples.
    Edf,
    /// BioSemi Data Format: 24-bit two's complement samples.
    Bdf,
}

impl EdfFormat {
    pub fn bytes_per_sample(self) -> usize {
        match self {
            Self::Edf => 2,
            Self::Bdf => 3,
        }
    }
    fn digital_range(self) -> (i32, i32) {
        match self {
            Self::Edf => (-32768, 32767),
            Self::Bdf => (-8_388_608, 8_388_607),
        }
    }
    fn annotation_label(self) -> &'static str {
        match self {
            Self::Edf => "EDF Annotations",
            Self::Bdf => "BDF Annotations",
        }
    }
}

/// What the reserved header field says about the file's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdfVariant {
    /// Plain EDF / BDF (no `+C` / `+D` marker).
    Plain,
    /// EDF+C / BDF+C: records contiguous in time.
    Continuous,
}

/// One signal's header.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalHeader {
    /// Label with surrounding spaces trimmed.
    pub label: String,
    pub transducer: String,
    /// Physical dimension as written (`uV`, `mV`, `V`, ...), trimmed.
    pub physical_dimension: String,
    pub physical_min: f64,
    pub physical_max: f64,
    pub digital_min: i32,
    pub digital_max: i32,
    pub prefiltering: String,
    pub samples_per_record: usize,
    /// True for `EDF Annotations` / `BDF Annotations` signals.
    pub is_annotation: bool,
    /// Physical units per digital step.
    pub cal: f64,
    /// Physical value of digital 0.
    pub offset: f64,
    /// Factor from the physical dimension to SI (1e-6 for uV, 1e-3 for mV, else 1).
    pub unit_scale: f64,
}

impl SignalHeader {
    /// The value this signal's digital sample `d` stands for, in volts for voltage signals.
    #[inline]
    pub fn physical(&self, d: i32) -> f64 {
        (f64::from(d) * self.cal + self.offset) * self.unit_scale
    }
}

/// The whole header, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EdfHeader {
    pub format: EdfFormat,
    pub variant: EdfVariant,
    pub patient: String,
    pub recording: String,
    /// `dd.mm.yy` as written.
    pub start_date: String,
    /// `hh.mm.ss` as written.
    pub start_time: String,
    pub header_bytes: usize,
    /// Number of data records (computed from the file size when the header says -1).
    pub n_records: usize,
    pub record_duration_s: f64,
    pub signals: Vec<SignalHeader>,
    /// Bytes of one data record.
    pub record_bytes: usize,
    /// Byte offset of each signal inside a record.
    pub signal_offsets: Vec<usize>,
}

impl EdfHeader {
    /// Samples per second of signal `s`.
    pub fn sample_rate_hz(&self, s: usize) -> f64 {
        self.signals[s].samples_per_record as f64 / self.record_duration_s
    }
    /// Total samples of signal `s`.
    pub fn n_samples(&self, s: usize) -> usize {
        self.n_records * self.signals[s].samples_per_record
    }
}

/// One annotation from a TAL.
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// Seconds from the first sample.
    pub onset_s: f64,
    /// Seconds, when the TAL gives one.
    pub duration_s: Option<f64>,
    pub text: String,
}

fn trimmed(bytes: &[u8]) -> String {
    // Latin-1 decoding, as MNE does: every byte is a code point.
    let s: String = bytes.iter().map(|&b| b as char).collect();
    s.trim_matches(|c: char| c == ' ' || c == '\0').to_string()
}

fn ascii_field<'a>(bytes: &'a [u8], field: &str, offset: usize) -> Result<&'a str, EdfError> {
    let s = std::str::from_utf8(bytes).map_err(|_| field_err(field, offset, "not ASCII"))?;
    Ok(s.trim_matches(|c: char| c == ' ' || c == '\0'))
}

fn int_field(bytes: &[u8], field: &str, offset: usize) -> Result<i64, EdfError> {
    let s = ascii_field(bytes, field, offset)?;
    s.parse::<i64>()
        .map_err(|_| field_err(field, offset, format!("{s:?} is not an integer")))
}

fn float_field(bytes: &[u8], field: &str, offset: usize) -> Result<f64, EdfError> {
    let s = ascii_field(bytes, field, offset)?;
    let v = s
        .parse::<f64>()
        .map_err(|_| field_err(field, offset, format!("{s:?} is not a number")))?;
    if !v.is_finite() {
        return Err(field_err(field, offset, format!("{s:?} is not finite")));
    }
    Ok(v)
}

/// MNE's rule for the physical dimension.
fn unit_scale(dimension: &str) -> f64 {
    match dimension {
        "uV" | "\u{00b5}V" | "\u{03bc}V" => 1e-6,
        "mV" => 1e-3,
        _ => 1.0,
    }
}

/// Parses and validates the header from the start of a file of `file_len` bytes.
pub fn parse_header(bytes: &[u8], file_len: usize) -> Result<EdfHeader, EdfError> {
    if bytes.len() < FIXED_HEADER_LEN {
        return Err(EdfError::Truncated {
            actual: bytes.len(),
            needed: FIXED_HEADER_LEN,
            what: "fixed header".into(),
        });
    }
    let format = if bytes[0] == 0xFF && &bytes[1..8] == b"BIOSEMI" {
        EdfFormat::Bdf
    } else if &bytes[0..8] == b"0       " {
        EdfFormat::Edf
    } else {
        return Err(field_err(
            "version",
            0,
            format!(
                "{:?} is neither EDF (\"0\") nor BDF (0xFF \"BIOSEMI\")",
                trimmed(&bytes[0..8])
            ),
        ));
    };
    let patient = trimmed(&bytes[8..88]);
    let recording = trimmed(&bytes[88..168]);
    let start_date = trimmed(&bytes[168..176]);
    let start_time = trimmed(&bytes[176..184]);
    let header_bytes_decl = int_field(&bytes[184..192], "header_bytes", 184)?;
    let reserved = trimmed(&bytes[192..236]);
    let variant = if reserved.starts_with("EDF+D") || reserved.starts_with("BDF+D") {
        return Err(EdfError::Unsupported(format!(
            "discontinuous recording ({}, reserved field at byte 192): only continuous \
             EDF/EDF+C/BDF/BDF+C files can be replayed",
            &reserved[..5]
        )));
    } else if reserved.starts_with("EDF+C") || reserved.starts_with("BDF+C") {
        EdfVariant::Continuous
    } else {
        EdfVariant::Plain
    };
    let n_records_decl = int_field(&bytes[236..244], "n_records", 236)?;
    let record_duration_s = float_field(&bytes[244..252], "record_duration", 244)?;
    if record_duration_s <= 0.0 {
        return Err(field_err(
            "record_duration",
            244,
            format!("{record_duration_s} s: must be positive"),
        ));
    }
    let ns = int_field(&bytes[252..256], "n_signals", 252)?;
    if ns < 1 || ns as usize > MAX_SIGNALS {
        return Err(field_err(
            "n_signals",
            252,
            format!("{ns}: must be 1..={MAX_SIGNALS}"),
        ));
    }
    let ns = ns as usize;
    let header_bytes = FIXED_HEADER_LEN + ns * SIGNAL_HEADER_LEN;
    if header_bytes_decl != header_bytes as i64 {
        return Err(field_err(
            "header_bytes",
            184,
            format!("{header_bytes_decl}, but {ns} signals need 256 * (1 + {ns}) = {header_bytes}"),
        ));
    }
    if bytes.len() < header_bytes {
        return Err(EdfError::Truncated {
            actual: bytes.len(),
            needed: header_bytes,
            what: format!("header of {ns} signals"),
        });
    }
    // Signal fields are stored field by field: all labels, then all transducers, ...
    let col = |start: usize, width: usize, i: usize| -> (usize, &[u8]) {
        let off = FIXED_HEADER_LEN + start * ns + i * width;
        (off, &bytes[off..off + width])
    };
    let (dig_lo, dig_hi) = format.digital_range();
    let mut signals = Vec::with_capacity(ns);
    for i in 0..ns {
        let label = trimmed(col(0, 16, i).1);
        let transducer = trimmed(col(16, 80, i).1);
        let physical_dimension = trimmed(col(96, 8, i).1);
        let prefiltering = trimmed(col(136, 80, i).1);
        let is_annotation = label == "EDF Annotations" || label == "BDF Annotations";
        let (off, b) = col(216, 8, i);
        let spr = int_field(b, &format!("signal {i} samples_per_record"), off)?;
        if spr < 1 {
            return Err(field_err(
                format!("signal {i} samples_per_record"),
                off,
                format!("{spr}: must be positive"),
            ));
        }
        let num = |start: usize, name: &str| -> Result<f64, EdfError> {
            let (off, b) = col(start, 8, i);
            float_field(b, &format!("signal {i} {name}"), off)
        };
        let dig = |start: usize, name: &str| -> Result<i32, EdfError> {
            let (off, b) = col(start, 8, i);
            let field = format!("signal {i} {name}");
            let v = int_field(b, &field, off)?;
            if v < i64::from(dig_lo) || v > i64::from(dig_hi) {
                return Err(field_err(
                    field,
                    off,
                    format!("{v} outside the {dig_lo}..={dig_hi} of {format:?} samples"),
                ));
            }
            Ok(v as i32)
        };
        let (physical_min, physical_max, digital_min, digital_max, cal, offset, scale);
        if is_annotation {
            // Annotation signals carry text; their scaling fields are not used.
            (physical_min, physical_max, digital_min, digital_max) = (0.0, 1.0, 0, 1);
            (cal, offset, scale) = (1.0, 0.0, 1.0);
        } else {
            physical_min = num(104, "physical_min")?;
            physical_max = num(112, "physical_max")?;
            digital_min = dig(120, "digital_min")?;
            digital_max = dig(128, "digital_max")?;
            if digital_max <= digital_min {
                let (off, _) = col(128, 8, i);
                return Err(field_err(
                    format!("signal {i} digital_max"),
                    off,
                    format!("{digital_max} is not above digital_min {digital_min}"),
                ));
            }
            if physical_max == physical_min {
                let (off, _) = col(112, 8, i);
                return Err(field_err(
                    format!("signal {i} physical_max"),
                    off,
                    format!("{physical_max} equals physical_min: no scaling defined"),
                ));
            }
            cal = (physical_max - physical_min) / f64::from(digital_max - digital_min);
            offset = physical_min - f64::from(digital_min) * cal;
            scale = unit_scale(&physical_dimension);
        }
        signals.push(SignalHeader {
            label,
            transducer,
            physical_dimension,
            physical_min,
            physical_max,
            digital_min,
            digital_max,
            prefiltering,
            samples_per_record: spr as usize,
            is_annotation,
            cal,
            offset,
            unit_scale: scale,
        });
    }
    let bps = format.bytes_per_sample();
    let mut signal_offsets = Vec::with_capacity(ns);
    let mut record_bytes: usize = 0;
    for s in &signals {
        signal_offsets.push(record_bytes);
        record_bytes = s
            .samples_per_record
            .checked_mul(bps)
            .and_then(|b| record_bytes.checked_add(b))
            .ok_or_else(|| {
                field_err(
                    "samples_per_record",
                    FIXED_HEADER_LEN + 216 * ns,
                    "overflow",
                )
            })?;
    }
    let data_bytes = file_len.saturating_sub(header_bytes);
    let n_records = if n_records_decl == -1 {
        data_bytes / record_bytes
    } else if n_records_decl < 0 {
        return Err(field_err(
            "n_records",
            236,
            format!("{n_records_decl}: must be >= 0 or -1"),
        ));
    } else {
        let n = n_records_decl as usize;
        let needed = n
            .checked_mul(record_bytes)
            .and_then(|b| b.checked_add(header_bytes))
            .ok_or_else(|| field_err("n_records", 236, format!("{n} records overflow")))?;
        if file_len < needed {
            return Err(EdfError::Truncated {
                actual: file_len,
                needed,
                what: format!("{n} data records of {record_bytes} bytes (n_records at byte 236)"),
            });
        }
        n
    };
    Ok(EdfHeader {
        format,
        variant,
        patient,
        recording,
        start_date,
        start_time,
        header_bytes,
        n_records,
        record_duration_s,
        signals,
        record_bytes,
        signal_offsets,
    })
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// An open EDF/BDF file.
pub struct EdfReader {
    header: EdfHeader,
    data: Storage,
}

impl std::fmt::Debug for EdfReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdfReader")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl EdfReader {
    /// Opens and validates a file; the data records stay on disk (memory-mapped).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EdfError> {
        let path = path.as_ref();
        let io = |source| EdfError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; a file truncated by another process while
        // mapped is outside what this reader can guard against (as for any mmap reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header = parse_header(&map, map.len())?;
        Ok(Self {
            header,
            data: Storage::Mapped(map),
        })
    }

    /// Validates a whole file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, EdfError> {
        let header = parse_header(&bytes, bytes.len())?;
        Ok(Self {
            header,
            data: Storage::Owned(bytes),
        })
    }

    pub fn header(&self) -> &EdfHeader {
        &self.header
    }

    /// Labels of all signals (annotation signals included), trimmed.
    pub fn labels(&self) -> Vec<&str> {
        self.header
            .signals
            .iter()
            .map(|s| s.label.as_str())
            .collect()
    }

    /// Indices of the signals that carry samples (not annotations).
    pub fn data_signals(&self) -> Vec<usize> {
        (0..self.header.signals.len())
            .filter(|&i| !self.header.signals[i].is_annotation)
            .collect()
    }

    /// Indices of the data signals with these labels, in the order given.
    pub fn find_signals<S: AsRef<str>>(&self, labels: &[S]) -> Result<Vec<usize>, EdfError> {
        labels
            .iter()
            .map(|l| {
                let l = l.as_ref();
                self.header
                    .signals
                    .iter()
                    .position(|s| !s.is_annotation && s.label == l)
                    .ok_or_else(|| EdfError::UnknownLabel(l.to_string()))
            })
            .collect()
    }

    fn check_data_signal(&self, s: usize) -> Result<&SignalHeader, EdfError> {
        let n_signals = self.header.signals.len();
        let sig = self.header.signals.get(s).ok_or(EdfError::BadSignal {
            index: s,
            n_signals,
        })?;
        if sig.is_annotation {
            return Err(EdfError::AnnotationSignal {
                index: s,
                label: sig.label.clone(),
            });
        }
        Ok(sig)
    }

    #[inline]
    fn digital_at(&self, bytes: &[u8], pos: usize) -> i32 {
        match self.header.format {
            EdfFormat::Edf => i32::from(i16::from_le_bytes([bytes[pos], bytes[pos + 1]])),
            EdfFormat::Bdf => {
                let v = i32::from_le_bytes([0, bytes[pos], bytes[pos + 1], bytes[pos + 2]]);
                v >> 8
            }
        }
    }

    /// Reads `out.len()` samples of data signal `s` from sample `start`, in volts for
    /// voltage signals (see the module doc for the scaling).
    pub fn read_signal(&self, s: usize, start: usize, out: &mut [f64]) -> Result<(), EdfError> {
        self.read_signal_with(s, start, out.len(), |i, v| out[i] = v)
    }

    fn read_signal_with(
        &self,
        s: usize,
        start: usize,
        n: usize,
        mut put: impl FnMut(usize, f64),
    ) -> Result<(), EdfError> {
        let sig = self.check_data_signal(s)?;
        let total = self.header.n_samples(s);
        let end = start
            .checked_add(n)
            .filter(|&e| e <= total)
            .ok_or_else(|| EdfError::Range {
                label: sig.label.clone(),
                start,
                end: start.saturating_add(n),
                n_samples: total,
            })?;
        let bytes = self.data.bytes();
        let spr = sig.samples_per_record;
        let bps = self.header.format.bytes_per_sample();
        let mut i = start;
        while i < end {
            let record = i / spr;
            let k0 = i % spr;
            let k1 = spr.min(k0 + (end - i));
            let base = self.header.header_bytes
                + record * self.header.record_bytes
                + self.header.signal_offsets[s];
            for k in k0..k1 {
                let d = self.digital_at(bytes, base + k * bps);
                put(i - start + (k - k0), sig.physical(d));
            }
            i += k1 - k0;
        }
        Ok(())
    }

    /// All annotations of the file, in file order. Time-keeping TALs (no text) are not
    /// returned; onsets are relative to the first sample.
    pub fn annotations(&self) -> Result<Vec<Annotation>, EdfError> {
        let ann: Vec<usize> = (0..self.header.signals.len())
            .filter(|&i| self.header.signals[i].is_annotation)
            .collect();
        let mut out = Vec::new();
        let mut first_onset: Option<f64> = None;
        let bytes = self.data.bytes();
        let bps = self.header.format.bytes_per_sample();
        for r in 0..self.header.n_records {
            for (j, &s) in ann.iter().enumerate() {
                let base = self.header.header_bytes
                    + r * self.header.record_bytes
                    + self.header.signal_offsets[s];
                let len = self.header.signals[s].samples_per_record * bps;
                let keeping = parse_tals(&bytes[base..base + len], r, &mut out)?;
                if r == 0 && j == 0 {
                    first_onset = keeping;
                }
            }
        }
        if let Some(t0) = first_onset {
            for a in &mut out {
                a.onset_s -= t0;
            }
        }
        Ok(out)
    }

    /// Block replay of `signals` (indices of data signals of one sample rate),
    /// `block_len` samples at a time.
    pub fn blocks(&self, signals: &[usize], block_len: usize) -> Result<EegBlocks<'_>, EdfError> {
        if signals.is_empty() || block_len == 0 {
            return Err(EdfError::Unsupported(
                "block replay needs at least one signal and block_len > 0".into(),
            ));
        }
        let first = self.check_data_signal(signals[0])?;
        let spr = first.samples_per_record;
        for &s in signals {
            let sig = self.check_data_signal(s)?;
            if sig.samples_per_record != spr {
                return Err(EdfError::MixedRates {
                    label: sig.label.clone(),
                    rate_hz: self.header.sample_rate_hz(s),
                    first_label: first.label.clone(),
                    expected_hz: self.header.sample_rate_hz(signals[0]),
                });
            }
        }
        Ok(EegBlocks {
            reader: self,
            signals: signals.to_vec(),
            block_len,
            next_sample: 0,
            n_samples: self.header.n_samples(signals[0]),
            sample_rate_hz: self.header.sample_rate_hz(signals[0]),
        })
    }
}

/// Parses the TALs of one annotation signal in one record, appending annotations; returns
/// the time-keeping onset (the first TAL's onset when it has no text).
fn parse_tals(
    raw: &[u8],
    record: usize,
    out: &mut Vec<Annotation>,
) -> Result<Option<f64>, EdfError> {
    let err = |reason: String| EdfError::Annotation { record, reason };
    let mut keeping = None;
    let mut first = true;
    for tal in raw.split(|&b| b == 0).filter(|t| !t.is_empty()) {
        // tal = onset [0x15 duration] 0x14 (text 0x14)*
        let mut parts = tal.split(|&b| b == 0x14);
        let head = parts.next().unwrap_or_default();
        let mut hp = head.splitn(2, |&b| b == 0x15);
        let onset_b = hp.next().unwrap_or_default();
        let onset_str =
            std::str::from_utf8(onset_b).map_err(|_| err("onset is not ASCII".into()))?;
        if !(onset_str.starts_with('+') || onset_str.starts_with('-')) {
            return Err(err(format!(
                "onset {onset_str:?} does not start with + or -"
            )));
        }
        let onset: f64 = onset_str
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| err(format!("onset {onset_str:?} is not a number")))?;
        let duration = match hp.next() {
            Some(d) => {
                let ds = std::str::from_utf8(d).map_err(|_| err("duration is not ASCII".into()))?;
                Some(
                    ds.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite() && *v >= 0.0)
                        .ok_or_else(|| err(format!("duration {ds:?} is not a number")))?,
                )
            }
            None => None,
        };
        if !tal.contains(&0x14) {
            return Err(err(format!(
                "TAL at onset {onset_str} has no 0x14 separator"
            )));
        }
        let mut any_text = false;
        for text in parts.filter(|t| !t.is_empty()) {
            any_text = true;
            out.push(Annotation {
                onset_s: onset,
                duration_s: duration,
                text: String::from_utf8_lossy(text).into_owned(),
            });
        }
        if first && !any_text {
            keeping = Some(onset);
        }
        first = false;
    }
    Ok(keeping)
}

/// Where a block sits in the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// Index of the block's first sample since the start of the recording.
    pub first_sample: u64,
    /// Samples in this block (the last block may be shorter than `block_len`).
    pub n_samples: usize,
}

/// Iterates a recording block by block, channel-major, decoding from the mapping.
#[derive(Debug)]
pub struct EegBlocks<'a> {
    reader: &'a EdfReader,
    signals: Vec<usize>,
    block_len: usize,
    next_sample: usize,
    n_samples: usize,
    sample_rate_hz: f64,
}

impl EegBlocks<'_> {
    pub fn sample_rate_hz(&self) -> f64 {
        self.sample_rate_hz
    }
    pub fn n_channels(&self) -> usize {
        self.signals.len()
    }
    /// Samples per channel in the whole recording.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }
    /// Starts again from sample `sample` (clamped to the end).
    pub fn seek(&mut self, sample: usize) {
        self.next_sample = sample.min(self.n_samples);
    }

    fn next_with<T>(
        &mut self,
        out: &mut Vec<T>,
        conv: impl Fn(f64) -> T + Copy,
        zero: T,
    ) -> Result<Option<BlockInfo>, EdfError>
    where
        T: Copy,
    {
        let n = self.block_len.min(self.n_samples - self.next_sample);
        if n == 0 {
            return Ok(None);
        }
        out.clear();
        out.resize(self.signals.len() * n, zero);
        for (c, &s) in self.signals.iter().enumerate() {
            let row = &mut out[c * n..(c + 1) * n];
            self.reader
                .read_signal_with(s, self.next_sample, n, |i, v| row[i] = conv(v))?;
        }
        let info = BlockInfo {
            first_sample: self.next_sample as u64,
            n_samples: n,
        };
        self.next_sample += n;
        Ok(Some(info))
    }

    /// Next block as f32 volts, channel-major `[n_channels, n_samples]` (the frame layout).
    pub fn next_f32(&mut self, out: &mut Vec<f32>) -> Result<Option<BlockInfo>, EdfError> {
        self.next_with(out, |v| v as f32, 0.0)
    }

    /// Next block as f64 volts, channel-major `[n_channels, n_samples]`.
    pub fn next_f64(&mut self, out: &mut Vec<f64>) -> Result<Option<BlockInfo>, EdfError> {
        self.next_with(out, |v| v, 0.0)
    }
}

/// A signal to write: label, physical dimension and the physical/digital ranges.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteSignal {
    pub label: String,
    /// `uV`, `mV` or `V`; samples given to the writer are in volts and are divided by
    /// this dimension's scale.
    pub physical_dimension: String,
    pub physical_min: f64,
    pub physical_max: f64,
}

/// Formats `v` into at most 8 ASCII characters, as the header needs, keeping as many
/// digits as fit. Returns `None` if it cannot be written in 8 characters.
fn fit8(v: f64) -> Option<String> {
    if !v.is_finite() {
        return None;
    }
    let s = format!("{v}");
    if s.len() <= 8 {
        return Some(s);
    }
    for prec in (0..8).rev() {
        let s = format!("{v:.prec$}");
        if s.len() <= 8 {
            return Some(s);
        }
    }
    None
}

fn put_field(buf: &mut Vec<u8>, s: &str, width: usize) -> Result<(), EdfError> {
    if !s.is_ascii() || s.len() > width {
        return Err(EdfError::Write(format!(
            "{s:?} does not fit an ASCII header field of {width} bytes"
        )));
    }
    buf.extend_from_slice(s.as_bytes());
    buf.extend(std::iter::repeat_n(b' ', width - s.len()));
    Ok(())
}

/// Everything needed to write a continuous EDF+C / BDF+C file.
#[derive(Debug, Clone)]
pub struct EdfWriteSpec<'a> {
    pub format: EdfFormat,
    pub patient: String,
    pub recording: String,
    /// `dd.mm.yy`.
    pub start_date: String,
    /// `hh.mm.ss`.
    pub start_time: String,
    pub sample_rate_hz: f64,
    pub record_duration_s: f64,
    pub signals: Vec<WriteSignal>,
    /// Channel-major `[n_signals, n_samples]`, volts (for voltage dimensions).
    pub samples: &'a [f64],
    pub n_samples: usize,
    pub annotations: Vec<Annotation>,
}

/// Writes a continuous EDF+C or BDF+C file with an annotation signal (time-keeping TALs
/// plus `spec.annotations`). The sample count is padded with the digital value of 0 V
/// (or the nearest digital value) up to a whole number of records. Values outside a
/// signal's physical range are clipped to it, as every EDF writer does.
pub fn write_edf(path: impl AsRef<Path>, spec: &EdfWriteSpec<'_>) -> Result<(), EdfError> {
    let bytes = encode_edf(spec)?;
    let path = path.as_ref();
    let io = |source| EdfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(())
}

/// [`write_edf`] into memory.
pub fn encode_edf(spec: &EdfWriteSpec<'_>) -> Result<Vec<u8>, EdfError> {
    let ns_data = spec.signals.len();
    if ns_data == 0 || spec.samples.len() != ns_data * spec.n_samples {
        return Err(EdfError::Write(format!(
            "{} samples for {} signals of {} samples",
            spec.samples.len(),
            ns_data,
            spec.n_samples
        )));
    }
    let spr_f = spec.sample_rate_hz * spec.record_duration_s;
    let spr = spr_f.round();
    if !(spr >= 1.0 && (spr - spr_f).abs() < 1e-9 && spr < 1e7) {
        return Err(EdfError::Write(format!(
            "sample rate {} Hz times record duration {} s is not a whole number of samples",
            spec.sample_rate_hz, spec.record_duration_s
        )));
    }
    let spr = spr as usize;
    let n_records = spec.n_samples.div_ceil(spr).max(1);
    let bps = spec.format.bytes_per_sample();
    let (dig_lo, dig_hi) = spec.format.digital_range();
    let dur_s = fit8(spec.record_duration_s)
        .ok_or_else(|| EdfError::Write(format!("record duration {}", spec.record_duration_s)))?;
    // The duration as a reader will see it.
    let dur_read: f64 = dur_s.parse().map_err(|_| EdfError::Write(dur_s.clone()))?;

    // TALs per record: time keeping + the annotations whose onset falls in the record.
    let mut tals: Vec<Vec<u8>> = (0..n_records)
        .map(|r| format!("+{}\x14\x14\0", fmt_onset(r as f64 * dur_read)).into_bytes())
        .collect();
    for a in &spec.annotations {
        if !(a.onset_s.is_finite() && a.onset_s >= 0.0) || a.text.contains(['\0', '\x14', '\x15']) {
            return Err(EdfError::Write(format!("annotation {a:?}")));
        }
        let r = ((a.onset_s / dur_read).floor() as usize).min(n_records - 1);
        let mut t = format!("+{}", fmt_onset(a.onset_s));
        if let Some(d) = a.duration_s {
            t.push_str(&format!("\x15{}", fmt_onset(d)));
        }
        t.push('\x14');
        t.push_str(&a.text);
        t.push_str("\x14\0");
        tals[r].extend_from_slice(t.as_bytes());
    }
    let ann_bytes = tals.iter().map(Vec::len).max().unwrap_or(0);
    let ann_spr = ann_bytes.div_ceil(bps).max(1);

    // Header.
    let ns = ns_data + 1;
    let mut h = Vec::with_capacity(256 * (ns + 1));
    match spec.format {
        EdfFormat::Edf => put_field(&mut h, "0", 8)?,
        EdfFormat::Bdf => {
            h.push(0xFF);
            put_field(&mut h, "BIOSEMI", 7)?;
        }
    }
    put_field(&mut h, &spec.patient, 80)?;
    put_field(&mut h, &spec.recording, 80)?;
    put_field(&mut h, &spec.start_date, 8)?;
    put_field(&mut h, &spec.start_time, 8)?;
    put_field(&mut h, &(256 * (ns + 1)).to_string(), 8)?;
    put_field(
        &mut h,
        match spec.format {
            EdfFormat::Edf => "EDF+C",
            EdfFormat::Bdf => "BDF+C",
        },
        44,
    )?;
    put_field(&mut h, &n_records.to_string(), 8)?;
    put_field(&mut h, &dur_s, 8)?;
    put_field(&mut h, &ns.to_string(), 4)?;
    let ann_label = spec.format.annotation_label();
    for s in &spec.signals {
        put_field(&mut h, &s.label, 16)?;
    }
    put_field(&mut h, ann_label, 16)?;
    for _ in 0..ns {
        put_field(&mut h, "", 80)?;
    }
    for s in &spec.signals {
        put_field(&mut h, &s.physical_dimension, 8)?;
    }
    put_field(&mut h, "", 8)?;
    // Physical ranges as written (parsed back so scaling uses what a reader sees).
    let mut ranges = Vec::with_capacity(ns_data);
    for s in &spec.signals {
        let lo = fit8(s.physical_min)
            .ok_or_else(|| EdfError::Write(format!("physical_min {}", s.physical_min)))?;
        let hi = fit8(s.physical_max)
            .ok_or_else(|| EdfError::Write(format!("physical_max {}", s.physical_max)))?;
        let (lo_v, hi_v): (f64, f64) = (
            lo.parse().unwrap_or(f64::NAN),
            hi.parse().unwrap_or(f64::NAN),
        );
        if lo_v.partial_cmp(&hi_v) != Some(std::cmp::Ordering::Less) {
            return Err(EdfError::Write(format!(
                "signal {:?}: physical range {lo}..{hi}",
                s.label
            )));
        }
        ranges.push((lo, hi, lo_v, hi_v));
    }
    for r in &ranges {
        put_field(&mut h, &r.0, 8)?;
    }
    put_field(&mut h, "-1", 8)?;
    for r in &ranges {
        put_field(&mut h, &r.1, 8)?;
    }
    put_field(&mut h, "1", 8)?;
    for _ in 0..ns {
        put_field(&mut h, &dig_lo.to_string(), 8)?;
    }
    for _ in 0..ns {
        put_field(&mut h, &dig_hi.to_string(), 8)?;
    }
    for _ in 0..ns {
        put_field(&mut h, "", 80)?;
    }
    for _ in 0..ns_data {
        put_field(&mut h, &spr.to_string(), 8)?;
    }
    put_field(&mut h, &ann_spr.to_string(), 8)?;
    for _ in 0..ns {
        put_field(&mut h, "", 32)?;
    }
    debug_assert_eq!(h.len(), 256 * (ns + 1));

    // Data records.
    let record_bytes = (ns_data * spr + ann_spr) * bps;
    let mut out = h;
    out.reserve(n_records * record_bytes);
    let cal: Vec<(f64, f64, f64)> = spec
        .signals
        .iter()
        .zip(&ranges)
        .map(|(s, r)| {
            let cal = (r.3 - r.2) / (f64::from(dig_hi) - f64::from(dig_lo));
            (
                cal,
                r.2 - f64::from(dig_lo) * cal,
                unit_scale(&s.physical_dimension),
            )
        })
        .collect();
    let put = |out: &mut Vec<u8>, d: i32| {
        let b = d.to_le_bytes();
        out.extend_from_slice(&b[..bps]);
    };
    for (r, tal) in tals.iter().enumerate() {
        for (c, &(cal, offset, scale)) in cal.iter().enumerate() {
            for k in 0..spr {
                let t = r * spr + k;
                let v = if t < spec.n_samples {
                    spec.samples[c * spec.n_samples + t] / scale
                } else {
                    0.0
                };
                let v = if v.is_finite() { v } else { 0.0 };
                let d = ((v - offset) / cal)
                    .round()
                    .clamp(f64::from(dig_lo), f64::from(dig_hi));
                put(&mut out, d as i32);
            }
        }
        out.extend_from_slice(tal);
        out.extend(std::iter::repeat_n(0u8, ann_spr * bps - tal.len()));
    }
    Ok(out)
}

fn fmt_onset(t: f64) -> String {
    // Enough digits for sample-exact onsets at any practical rate; trailing zeros trimmed.
    let s = format!("{t:.7}");
    let s = s.trim_end_matches('0');
    s.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec_for(samples: &[f64], n: usize, format: EdfFormat) -> EdfWriteSpec<'_> {
        EdfWriteSpec {
            format,
            patient: "X X X X".into(),
            recording: "Startdate X X X X".into(),
            start_date: "21.11.26".into(),
            start_time: "23.00.00".into(),
            sample_rate_hz: 250.0,
            record_duration_s: 1.0,
            signals: (0..samples.len() / n)
                .map(|i| WriteSignal {
                    label: format!("EEG{i:03}"),
                    physical_dimension: "uV".into(),
                    physical_min: -500.0,
                    physical_max: 500.0,
                })
                .collect(),
            samples,
            n_samples: n,
            annotations: vec![Annotation {
                onset_s: 1.5,
                duration_s: Some(0.25),
                text: "burst".into(),
            }],
        }
    }

    fn sine(n_ch: usize, n: usize) -> Vec<f64> {
        (0..n_ch * n)
            .map(|i| 1e-4 * ((i % n) as f64 * 0.1 + (i / n) as f64).sin())
            .collect()
    }

    #[test]
    fn written_file_reads_back_within_one_digital_step() {
        for format in [EdfFormat::Edf, EdfFormat::Bdf] {
            let n = 700;
            let x = sine(3, n);
            let bytes = encode_edf(&spec_for(&x, n, format)).expect("encode");
            let r = EdfReader::from_bytes(bytes).expect("parse");
            assert_eq!(
                r.labels(),
                vec!["EEG000", "EEG001", "EEG002", format.annotation_label()]
            );
            assert_eq!(r.header().n_records, 3);
            assert_eq!(r.header().sample_rate_hz(0), 250.0);
            let step = r.header().signals[0].cal * 1e-6;
            let mut blocks = r.blocks(&r.data_signals(), 64).expect("blocks");
            let mut buf = Vec::new();
            let mut t0 = 0;
            while let Some(info) = blocks.next_f64(&mut buf).expect("block") {
                assert_eq!(info.first_sample as usize, t0);
                for c in 0..3 {
                    for k in 0..info.n_samples {
                        let t = t0 + k;
                        let want = if t < n { x[c * n + t] } else { 0.0 };
                        assert!((buf[c * info.n_samples + k] - want).abs() <= 0.5 * step + 1e-15);
                    }
                }
                t0 += info.n_samples;
            }
            assert_eq!(t0, 750);
            let ann = r.annotations().expect("annotations");
            assert_eq!(
                ann,
                vec![Annotation {
                    onset_s: 1.5,
                    duration_s: Some(0.25),
                    text: "burst".into()
                }]
            );
        }
    }

    #[test]
    fn bad_fields_are_named_with_their_offset() {
        let n = 250;
        let x = sine(2, n);
        let good = encode_edf(&spec_for(&x, n, EdfFormat::Edf)).expect("encode");
        let mut b = good.clone();
        b[236..244].copy_from_slice(b"abc     ");
        let e = EdfReader::from_bytes(b)
            .expect_err("bad n_records")
            .to_string();
        assert!(e.contains("n_records") && e.contains("236"), "{e}");
        let mut b = good.clone();
        b[184..192].copy_from_slice(b"999     ");
        let e = EdfReader::from_bytes(b)
            .expect_err("bad header bytes")
            .to_string();
        assert!(e.contains("header_bytes") && e.contains("184"), "{e}");
        // digital_min of signal 1: column at 256 + 120 * ns + 8 * 1, ns = 3
        let off = 256 + 120 * 3 + 8;
        let mut b = good.clone();
        b[off..off + 8].copy_from_slice(b"x1      ");
        let e = EdfReader::from_bytes(b)
            .expect_err("bad digital_min")
            .to_string();
        assert!(
            e.contains("signal 1 digital_min") && e.contains(&off.to_string()),
            "{e}"
        );
        // Truncated data.
        let e = EdfReader::from_bytes(good[..good.len() - 1].to_vec())
            .expect_err("short")
            .to_string();
        assert!(e.contains("shorter"), "{e}");
        // -1 records: computed from the file size.
        let mut b = good.clone();
        b[236..244].copy_from_slice(b"-1      ");
        assert_eq!(
            EdfReader::from_bytes(b)
                .expect("n_records -1")
                .header()
                .n_records,
            1
        );
        // Discontinuous refused.
        let mut b = good;
        b[192..197].copy_from_slice(b"EDF+D");
        let e = EdfReader::from_bytes(b).expect_err("EDF+D").to_string();
        assert!(e.contains("discontinuous"), "{e}");
    }

    #[test]
    fn mixed_rates_are_refused_for_blocks_and_named() {
        let n = 250;
        let x = sine(2, n);
        let mut b = encode_edf(&spec_for(&x, n, EdfFormat::Edf)).expect("encode");
        // Halve signal 1's samples per record: the record shrinks, so cut the file to match.
        let off = 256 + 216 * 3 + 8;
        b[off..off + 8].copy_from_slice(b"125     ");
        b.truncate(256 * 4 + (250 + 125 + 1) * 2 + 1000);
        let r = EdfReader::from_bytes(b).expect("parse");
        let e = r.blocks(&[0, 1], 10).expect_err("mixed").to_string();
        assert!(e.contains("EEG001") && e.contains("125"), "{e}");
        assert!(r.blocks(&[1], 10).is_ok());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            exercise(bytes);
        }

        #[test]
        fn corrupted_valid_files_never_panic(
            pos in proptest::collection::vec((0usize..2000, any::<u8>()), 1..8),
            cut in 0usize..3000,
        ) {
            let x = sine(2, 300);
            let mut b = encode_edf(&spec_for(&x, 300, EdfFormat::Bdf)).expect("encode");
            for (p, v) in pos {
                if p < b.len() { b[p] = v; }
            }
            b.truncate(cut.max(1).min(b.len()));
            exercise(b);
        }
    }

    fn exercise(bytes: Vec<u8>) {
        if let Ok(r) = EdfReader::from_bytes(bytes) {
            let _ = r.annotations();
            let sigs = r.data_signals();
            for &s in &sigs {
                let mut v = vec![0.0; r.header().n_samples(s).min(64)];
                let _ = r.read_signal(s, 0, &mut v);
            }
            if let Ok(mut blocks) = r.blocks(&sigs, 17) {
                let mut buf = Vec::new();
                while let Ok(Some(_)) = blocks.next_f32(&mut buf) {}
            }
        }
    }
}
