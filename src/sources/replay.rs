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
        let rec = Recording::open(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
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
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("edf") | Some("bdf") => InputFormat::Edf,
            _ => InputFormat::Recording,
        }
    }
}

/// Replays a TrackML-style CSV directory: one hit event per `eventNNNNNNNNN-hits.csv`, in
/// increasing event id; the frame's sequence number is the event id and its timestamp
/// `event_id` milliseconds (CSV files carry no time: `--speed 1.0` replays 1,000 events/s).
pub struct TrackmlFeed {
    dir: crate::tracking::trackml::TrackmlDir,
    total: u64,
}

impl TrackmlFeed {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let dir = crate::tracking::trackml::read_trackml_dir(path)?;
        let total = dir.len() as u64;
        Ok(Self { dir, total })
    }
}

impl FrameFeed for TrackmlFeed {
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<Result<(), FeedError>> {
        let ev = self.dir.next()?;
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
            Err(e) => Err(FeedError { reason: "bad_csv", detail: e.to_string() }),
        })
    }
    fn total(&self) -> Option<u64> {
        Some(self.total)
    }
}
