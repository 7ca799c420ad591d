//! File inputs for replay: native recordings (memory-mapped, frames copied once, into their
//! slot), TrackML-style CSV directories and EDF/BDF files (encoded into frames on the fly).
//! Each is a [`FrameFeed`] that the pipeline's file source paces.

use std::path::Path;

use crate::pipeline::{FeedError, FrameFeed};
use crate::recording::Recording;

/// Replays a native recording.
pub struct RecordingFeed {
    rec: Recording,
    next: usize,
}

impl RecordingFeed {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let rec = Recording::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(Self { rec, next: 0 })
    }
    pub fn recording(&self) -> &Recording {
        &self.rec
    }
}

impl FrameFeed for RecordingFeed {
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
        let f = self.rec.get(self.next)?;
        self.next += 1;
        buf.clear();
        buf.extend_from_slice(f);
        Some(Ok(()))
    }
    fn total(&self) -> Option<u64> {
        Some(self.rec.len() as u64)
    }
}

/// What kind of file an input path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    Recording,
    TrackmlCsv,
    Edf,
}

impl InputFormat {
    pub fn of(path: &Path) -> InputFormat {
        if path.is_dir() {
            return InputFormat::TrackmlCsv;
        }
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("edf") | Some("bdf") => InputFormat::Edf,
            _ => InputFormat::Recording,
        }
    }
}

/// Replays a TrackML-style CSV directory: one hit event per `eventNNNNNNNNN-hits.csv`, in
/// increasing event id; the frame's sequence number is the event id and its timestamp
/// `event_id` milliseconds (CSV files carry no time: `--speed 1.0` replays 1,000 events/s).
/// With the detector's planes, each event's planes are checked against them and taken from
/// the hits' z where `layer_id` numbers them otherwise
/// ([`crate::tracking::trackml::assign_planes`]; logged at the first such event).
pub struct TrackmlFeed {
    dir: crate::tracking::trackml::TrackmlDir,
    total: u64,
}

impl TrackmlFeed {
    /// `planes_z`: the detector's planes by increasing z (empty: `layer_id` as given).
    pub fn open(path: &Path, planes_z: Vec<f64>) -> anyhow::Result<Self> {
        let dir = crate::tracking::trackml::read_trackml_dir(path)?.with_planes(planes_z);
        let total = dir.len() as u64;
        Ok(Self { dir, total })
    }
}

impl FrameFeed for TrackmlFeed {
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
        let before = self.dir.relabelled().0;
        let ev = self.dir.next()?;
        if let (1, Some(note)) = self.dir.relabelled() {
            if before == 0 {
                tracing::warn!("{note}");
            }
        }
        buf.clear();
        Some(match ev {
            Ok(ev) => {
                let stamp = crate::frame::Stamp {
                    source_id: 0,
                    sequence: ev.event_id,
                    timestamp_ns: ev.event_id.saturating_mul(1_000_000),
                };
                crate::frame::encode_hit_event(buf, stamp, &ev.hits);
                Ok(())
            }
            Err(e) => Err(FeedError {
                reason: "bad_csv",
                detail: e.to_string(),
            }),
        })
    }
    fn total(&self) -> Option<u64> {
        Some(self.total)
    }
}

/// Replays an EDF/BDF file as EEG blocks of `block_samples`, channels picked by name in the
/// configured order. The frame's sequence number is the block index, its timestamp the
/// first sample's time from the start of the recording.
pub struct EdfFeed {
    reader: crate::eeg::edf::EdfReader,
    signals: Vec<usize>,
    sample_rate_hz: f64,
    block_samples: usize,
    n_samples: usize,
    next_sample: usize,
    seq: u64,
    scratch: Vec<f64>,
    block: Vec<f32>,
    /// The `source_id` of the frames (the EEG stream they belong to).
    source_id: u32,
}

impl EdfFeed {
    /// Opens `path`, matching `channels` (the operator's channel order) to its labels.
    pub fn open(path: &Path, channels: &[String], block_samples: usize) -> anyhow::Result<Self> {
        let reader = crate::eeg::edf::EdfReader::open(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let signals = reader.find_signals(channels).map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (the file has: {})",
                path.display(),
                reader.labels().join(", ")
            )
        })?;
        anyhow::ensure!(
            !signals.is_empty(),
            "{}: no channels to read",
            path.display()
        );
        let h = reader.header();
        let sample_rate_hz = h.sample_rate_hz(signals[0]);
        for &s in &signals {
            if h.sample_rate_hz(s) != sample_rate_hz {
                anyhow::bail!(
                    "{}: channel {} is sampled at {} Hz, {} at {} Hz: EEG channels must share one rate",
                    path.display(),
                    h.signals[s].label,
                    h.sample_rate_hz(s),
                    h.signals[signals[0]].label,
                    sample_rate_hz
                );
            }
        }
        let n_samples = h.n_samples(signals[0]);
        Ok(Self {
            reader,
            signals,
            sample_rate_hz,
            block_samples: block_samples.max(1),
            n_samples,
            next_sample: 0,
            seq: 0,
            scratch: Vec::new(),
            block: Vec::new(),
            source_id: 0,
        })
    }

    /// Frames carry `source_id` (default 0): each replayed file is its own EEG stream.
    pub fn with_source_id(mut self, source_id: u32) -> Self {
        self.source_id = source_id;
        self
    }
}

impl FrameFeed for EdfFeed {
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
        let n = self.block_samples.min(self.n_samples - self.next_sample);
        if n == 0 {
            return None;
        }
        buf.clear();
        self.block.clear();
        self.scratch.resize(n, 0.0);
        for &s in &self.signals {
            if let Err(e) = self
                .reader
                .read_signal(s, self.next_sample, &mut self.scratch)
            {
                self.next_sample += n;
                return Some(Err(FeedError {
                    reason: "bad_edf",
                    detail: e.to_string(),
                }));
            }
            self.block.extend(self.scratch.iter().map(|&v| v as f32));
        }
        let first = self.next_sample as u64;
        let stamp = crate::frame::Stamp {
            source_id: self.source_id,
            sequence: self.seq,
            timestamp_ns: (first as f64 / self.sample_rate_hz * 1e9) as u64,
        };
        crate::frame::encode_eeg_block(
            buf,
            stamp,
            self.signals.len(),
            self.sample_rate_hz,
            first,
            &self.block,
        );
        self.next_sample += n;
        self.seq += 1;
        Some(Ok(()))
    }
    fn total(&self) -> Option<u64> {
        Some(self.n_samples.div_ceil(self.block_samples) as u64)
    }
}
