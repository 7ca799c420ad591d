//! `trigd record`: writes every valid frame that arrives on a UDP or TCP endpoint to a
//! recording, byte for byte, until stopped. Frames that fail validation are not written;
//! they are counted by their `malformed` reason and logged (the first few of each reason in
//! full, then only counted), so a capture of a misbehaving producer is still clean.

use std::collections::BTreeMap;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::frame;
use crate::recording::{FsyncPolicy, RecordingError, RecordingWriter, FLAG_LIVE_CAPTURE};
use crate::sources::{BoundSource, Endpoint, Received, SequenceTracker, SourceStats};

/// Malformed frames of one reason logged in full before the rest are only counted.
const MALFORMED_LOGGED_PER_REASON: u64 = 10;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot listen on {endpoint}: {source}")]
    Bind {
        endpoint: Endpoint,
        #[source]
        source: io::Error,
    },
    #[error("receiving on {endpoint} failed: {source}")]
    Receive {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Recording(#[from] RecordingError),
}

/// What a capture did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    pub path: PathBuf,
    pub frames_written: u64,
    pub file_len_bytes: u64,
    /// Frames refused, by `malformed` reason label.
    pub malformed: BTreeMap<&'static str, u64>,
    /// Sequence gaps, missing frames and repeats over the frames written.
    pub sequence_gaps: u64,
    pub sequence_missing: u64,
    pub sequence_repeats: u64,
    pub source: SourceStats,
}

impl RecordSummary {
    pub fn malformed_total(&self) -> u64 {
        self.malformed.values().sum()
    }
}

/// Binds `listen` and records to `out` (which must not exist) until `stop` is set.
pub fn record(
    listen: &Endpoint,
    out: &Path,
    fsync: FsyncPolicy,
    stop: &AtomicBool,
) -> Result<RecordSummary, RecordError> {
    let source = listen.bind().map_err(|source| RecordError::Bind {
        endpoint: *listen,
        source,
    })?;
    record_from(&source, out, fsync, stop)
}

/// Records from an already bound source (lets a caller bind port 0 and learn the port).
/// The file is finished (index written) when the source stops, also when receiving failed;
/// a write error stops the capture at once and leaves a file that reads up to the failure.
pub fn record_from(
    source: &BoundSource,
    out: &Path,
    fsync: FsyncPolicy,
    stop: &AtomicBool,
) -> Result<RecordSummary, RecordError> {
    let endpoint = source
        .endpoint()
        .map(|e| e.to_string())
        .unwrap_or_else(|_| "the source".into());
    let mut writer = RecordingWriter::create_with_flags(out, fsync, FLAG_LIVE_CAPTURE)?;
    tracing::info!(%endpoint, path = %out.display(), %fsync, "recording");
    let mut malformed: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut sequences = SequenceTracker::new();
    let mut write_failure: Option<RecordingError> = None;
    let mut note_malformed = |reason: &'static str, detail: &dyn std::fmt::Display| {
        let n = malformed.entry(reason).or_insert(0);
        *n += 1;
        if *n <= MALFORMED_LOGGED_PER_REASON {
            tracing::warn!(reason, "skipping malformed frame: {detail}");
            if *n == MALFORMED_LOGGED_PER_REASON {
                tracing::warn!(
                    reason,
                    "further malformed frames of this reason are only counted"
                );
            }
        }
    };
    let received = source.run(stop, |r, _arrival| match r {
        Received::Frame(bytes) => match writer.append(bytes) {
            Ok(_) => {
                if let Ok(h) = frame::peek_header(bytes) {
                    sequences.observe(h.source_id.get(), h.sequence.get());
                }
                ControlFlow::Continue(())
            }
            Err(RecordingError::InvalidFrame(e)) => {
                note_malformed(e.reason(), &e);
                ControlFlow::Continue(())
            }
            Err(e) => {
                write_failure = Some(e);
                ControlFlow::Break(())
            }
        },
        Received::Malformed { reason, detail } => {
            note_malformed(reason, &detail);
            ControlFlow::Continue(())
        }
        Received::Refused { reason, peer } => {
            tracing::debug!(%peer, reason, "refused");
            ControlFlow::Continue(())
        }
        // Socket sources never lose samples this way.
        Received::Lost { .. } => ControlFlow::Continue(()),
    });
    if let Some(e) = write_failure {
        // Dropping the writer flushes what it can; readers rebuild the index.
        drop(writer);
        return Err(e.into());
    }
    let written = writer.finish()?;
    let stats = received.map_err(|source| RecordError::Receive { endpoint, source })?;
    let summary = RecordSummary {
        path: written.path,
        frames_written: written.frames,
        file_len_bytes: written.file_len_bytes,
        malformed,
        sequence_gaps: sequences.gaps(),
        sequence_missing: sequences.missing(),
        sequence_repeats: sequences.repeats(),
        source: stats,
    };
    tracing::info!(
        frames = summary.frames_written,
        malformed = summary.malformed_total(),
        gaps = summary.sequence_gaps,
        repeats = summary.sequence_repeats,
        path = %summary.path.display(),
        "recording finished"
    );
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_hit_event, HitRecord, Stamp};
    use crate::recording::Recording;
    use crate::send::send;
    use std::io::Write;
    use std::net::{TcpStream, UdpSocket};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn hit_frame(seq: u64) -> Vec<u8> {
        let hits = vec![
            HitRecord {
                x_mm: 1.0,
                y_mm: 2.0,
                z_mm: 3.0,
                plane: 1,
                hit_id: 5
            };
            (seq % 4) as usize
        ];
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            Stamp {
                source_id: 2,
                sequence: seq,
                timestamp_ns: 10 * seq,
            },
            &hits,
        );
        b
    }

    /// Sets the flag when dropped, so a failing test stops its source thread instead of
    /// hanging the scope that waits for it.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Records on `scheme` while `drive` sends to it; returns the summary and the file.
    fn capture(
        scheme: &str,
        dir: &Path,
        drive: impl FnOnce(Endpoint),
    ) -> (RecordSummary, Recording) {
        let source = format!("{scheme}://127.0.0.1:0")
            .parse::<Endpoint>()
            .unwrap()
            .bind()
            .unwrap();
        let to = source.endpoint().unwrap();
        let out = dir.join(format!("{scheme}.trgd"));
        let stop = AtomicBool::new(false);
        let summary = std::thread::scope(|s| {
            let rx = s.spawn(|| record_from(&source, &out, FsyncPolicy::EveryFrames(16), &stop));
            let _stop_on_panic = StopOnDrop(&stop);
            drive(to);
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
            rx.join().unwrap().unwrap()
        });
        let rec = Recording::open(&out).unwrap();
        assert!(rec.torn_tail().is_none());
        assert_eq!(rec.flags(), FLAG_LIVE_CAPTURE);
        (summary, rec)
    }

    #[test]
    fn udp_capture_keeps_valid_frames_and_counts_malformed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (summary, rec) = capture("udp", dir.path(), |to| {
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for seq in [0, 1, 2, 5, 6, 3] {
                tx.send_to(&hit_frame(seq), to.addr()).unwrap();
                if seq == 2 {
                    let mut bad = hit_frame(3);
                    let n = bad.len();
                    bad[n - 1] ^= 1;
                    tx.send_to(&bad, to.addr()).unwrap();
                    tx.send_to(b"short", to.addr()).unwrap();
                }
            }
        });
        let seqs: Vec<u64> = rec
            .iter()
            .map(|f| frame::parse(f).unwrap().sequence())
            .collect();
        assert_eq!(seqs, [0, 1, 2, 5, 6, 3]);
        assert_eq!(rec.frame(3), &hit_frame(5)[..]);
        assert_eq!(summary.frames_written, 6);
        assert_eq!(
            summary.malformed,
            BTreeMap::from([("bad_crc", 1), ("too_short", 1)])
        );
        assert_eq!(
            (
                summary.sequence_gaps,
                summary.sequence_missing,
                summary.sequence_repeats
            ),
            (1, 2, 1)
        );
        assert_eq!(summary.source.frames, 8);
    }

    #[test]
    fn send_then_record_over_tcp_reproduces_the_recording() {
        let dir = tempfile::tempdir().unwrap();
        let original = dir.path().join("original.trgd");
        let mut w = RecordingWriter::create(&original, FsyncPolicy::Never).unwrap();
        for seq in 0..300 {
            w.append(&hit_frame(seq)).unwrap();
        }
        w.finish().unwrap();
        let original = Recording::open(&original).unwrap();
        let (summary, copy) = capture("tcp", dir.path(), |to| {
            send(&original, &to, None, &AtomicBool::new(false)).unwrap();
            // A second producer that dies mid-frame: counted, the capture goes on.
            let mut s = TcpStream::connect(to.addr()).unwrap();
            s.write_all(&hit_frame(1003)[..50]).unwrap();
        });
        assert_eq!(copy.len(), 300);
        assert!(copy.iter().eq(original.iter()));
        assert_eq!(summary.malformed, BTreeMap::from([("truncated", 1)]));
        assert_eq!(summary.source.connections, 2);
    }

    #[test]
    fn bind_failure_and_existing_output_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = Endpoint::Tcp(taken.local_addr().unwrap());
        let e = record(
            &listen,
            &dir.path().join("x.trgd"),
            FsyncPolicy::Never,
            &AtomicBool::new(true),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("cannot listen on tcp://127.0.0.1:"),
            "{e}"
        );
        let existing = dir.path().join("exists.trgd");
        std::fs::write(&existing, b"keep me").unwrap();
        let e = record(
            &"udp://127.0.0.1:0".parse().unwrap(),
            &existing,
            FsyncPolicy::Never,
            &AtomicBool::new(true),
        )
        .unwrap_err();
        assert!(e.to_string().contains("refusing to overwrite"), "{e}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
    }
}
