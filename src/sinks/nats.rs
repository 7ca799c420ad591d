//! NATS JetStream decision stream: each decision is published as its JSON record (the
//! JSON lines format without the newline) on `STREAM.WORKLOAD.OUTCOME`, with a
//! `Nats-Msg-Id` that names the frame, so a frame decided twice (redelivered after a node
//! died) is stored once within the stream's duplicate window.
//!
//! The id is the frame's `SOURCE_ID.SEQ` from its header; a frame whose header could not
//! be read (all zeros) that came from a NATS input is named by its delivery, `d.STREAM_SEQ`.
//!
//! `write` sends the publish and keeps it; `flush` waits for the server's acknowledgement
//! of every publish sent, so a decision counts as written only once the stream holds it.
//! Publishes that failed stay and are sent again, with the same id, on the next flush.
//!
//! Unlike the file logs, each record costs allocations (the client takes owned payloads and
//! subjects): the decision stream is for farms, where a frame's network round trips cost
//! far more.

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::io;

use async_nats::jetstream::{self, context::PublishAckFuture};

use super::Sink;
use crate::decision::{Decision, Names, Outcome, Workload};
use crate::farm::{self, NatsUrl, StreamSpec};

/// Publishes held before `write` waits for the oldest half (bounds memory between flushes).
const MAX_UNFLUSHED: usize = 8192;

struct Publish {
    subject: usize,
    id: String,
    payload: bytes::Bytes,
    ack: Option<PublishAckFuture>,
}

/// Decisions to a JetStream stream.
pub struct NatsSink {
    js: jetstream::Context,
    target: String,
    /// `STREAM.WORKLOAD.OUTCOME` for every workload and outcome, made once.
    subjects: Vec<String>,
    line: Vec<u8>,
    unflushed: VecDeque<Publish>,
}

fn subject_index(w: Workload, o: Outcome) -> usize {
    w.code() as usize * Outcome::ALL.len() + o.code() as usize
}

/// The message id of a decision (see the module documentation).
pub fn decision_msg_id(d: &Decision) -> Option<String> {
    if d.source_id == 0 && d.seq == 0 && d.timestamp_ns == 0 {
        (d.delivery != 0).then(|| format!("d.{}", d.delivery))
    } else {
        Some(farm::frame_msg_id(d.source_id, d.seq))
    }
}

/// Connects to the server of `url` and creates its output stream (limits retention,
/// subjects `STREAM.>`) if missing; the JetStream context and the stream's name.
fn open_stream(
    url: &NatsUrl,
    duplicate_window: std::time::Duration,
    connect_retry: std::time::Duration,
) -> Result<(jetstream::Context, String), farm::FarmError> {
    let stream = url.stream()?.to_string();
    let client = farm::connect(url, connect_retry)?;
    let js = farm::js_context(client);
    farm::runtime().block_on(farm::ensure_stream(
        &js,
        &StreamSpec {
            name: stream.clone(),
            work_queue: false,
            duplicate_window,
        },
    ))?;
    Ok((js, stream))
}

impl NatsSink {
    /// Connects and creates the stream (limits retention, subjects `STREAM.>`) if missing.
    pub fn connect(
        url: &NatsUrl,
        duplicate_window: std::time::Duration,
        connect_retry: std::time::Duration,
    ) -> Result<Self, farm::FarmError> {
        let (js, stream) = open_stream(url, duplicate_window, connect_retry)?;
        let workloads = [Workload::Multiplicity, Workload::Tracking, Workload::Eeg];
        let mut subjects = vec![String::new(); workloads.len() * Outcome::ALL.len()];
        for w in workloads {
            for o in Outcome::ALL {
                subjects[subject_index(w, o)] = format!("{stream}.{}.{}", w.as_str(), o.as_str());
            }
        }
        Ok(Self {
            js,
            target: url.to_string(),
            subjects,
            line: Vec::with_capacity(1024),
            unflushed: VecDeque::with_capacity(MAX_UNFLUSHED),
        })
    }

    fn send(&self, p: &Publish) -> io::Result<PublishAckFuture> {
        let mut m = jetstream::message::PublishMessage::build().payload(p.payload.clone());
        if !p.id.is_empty() {
            m = m.message_id(&p.id);
        }
        farm::runtime()
            .block_on(self.js.send_publish(self.subjects[p.subject].clone(), m))
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e))
    }

    /// Waits for the acknowledgements of the oldest `n` publishes, in order. At the first
    /// failure it stops (a server that is away would otherwise cost every publish its own
    /// timeout): that publish is kept to be sent again, with the same id, by the next
    /// flush, and so are the ones behind it.
    fn settle(&mut self, n: usize) -> io::Result<()> {
        for _ in 0..n.min(self.unflushed.len()) {
            let Some(mut p) = self.unflushed.pop_front() else {
                break;
            };
            let ack = match p.ack.take() {
                Some(f) => Ok(f),
                None => self.send(&p),
            };
            let r = ack.and_then(|f| {
                farm::runtime()
                    .block_on(f.into_future())
                    .map(|_| ())
                    .map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e))
            });
            if let Err(e) = r {
                self.unflushed.push_front(p);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Sink for NatsSink {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()> {
        if self.unflushed.len() >= MAX_UNFLUSHED {
            self.settle(MAX_UNFLUSHED / 2)?;
        }
        self.line.clear();
        super::jsonl::write_decision(&mut self.line, d, names)?;
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        let mut p = Publish {
            subject: subject_index(d.workload, d.outcome),
            id: decision_msg_id(d).unwrap_or_default(),
            payload: bytes::Bytes::copy_from_slice(&self.line),
            ack: None,
        };
        p.ack = Some(self.send(&p)?);
        self.unflushed.push_back(p);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.settle(self.unflushed.len())
    }

    fn kind(&self) -> &'static str {
        "nats"
    }

    fn target(&self) -> String {
        self.target.clone()
    }
}

/// Accepted frames to a JetStream stream of their own (`STREAM.frames`, limits retention),
/// each with its frame's message id; every publish is acknowledged before it returns, so an
/// accepted frame is in the stream before its input frame is acknowledged.
pub struct NatsAccepted {
    js: jetstream::Context,
    subject: String,
}

impl NatsAccepted {
    pub fn connect(
        url: &NatsUrl,
        duplicate_window: std::time::Duration,
        connect_retry: std::time::Duration,
    ) -> Result<Self, farm::FarmError> {
        let (js, stream) = open_stream(url, duplicate_window, connect_retry)?;
        Ok(Self {
            js,
            subject: farm::frame_subject(&stream),
        })
    }

    /// Publishes one frame and waits for the stream to hold it.
    pub fn publish(&mut self, frame: &[u8]) -> io::Result<()> {
        let mut m = jetstream::message::PublishMessage::build()
            .payload(bytes::Bytes::copy_from_slice(frame));
        if let Ok(v) = crate::frame::parse(frame) {
            m = m.message_id(farm::frame_msg_id(v.source_id(), v.sequence()));
        }
        farm::runtime()
            .block_on(async {
                self.js
                    .send_publish(self.subject.clone(), m)
                    .await?
                    .await
                    .map(|_| ())
            })
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::testdata;

    #[test]
    fn message_ids_name_the_frame_or_its_delivery() {
        let ds = testdata::decisions();
        assert_eq!(decision_msg_id(&ds[0]).as_deref(), Some("42.1"));
        // The unreadable malformed frame: no id unless it came from NATS.
        let mut m = ds[4].clone();
        assert_eq!(decision_msg_id(&m), None);
        m.delivery = 77;
        assert_eq!(decision_msg_id(&m).as_deref(), Some("d.77"));
        let mut read = ds[1].clone();
        read.delivery = 5;
        assert_eq!(decision_msg_id(&read).as_deref(), Some("42.2"));
    }

    #[test]
    fn every_workload_and_outcome_has_its_own_subject_slot() {
        let mut seen = std::collections::HashSet::new();
        for w in [Workload::Multiplicity, Workload::Tracking, Workload::Eeg] {
            for o in Outcome::ALL {
                assert!(seen.insert(subject_index(w, o)));
            }
        }
        assert_eq!(seen.len(), 15);
        assert!(seen.iter().all(|&i| i < 15));
    }
}
