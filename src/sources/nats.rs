//! NATS JetStream source: trigd as one node of a farm, pulling frames from a work-queue
//! stream through a durable pull consumer that every node shares. One message is one frame
//! (the frame format unchanged).
//!
//! - Back-pressure: a node pulls only as many messages as it has room for: the messages it
//!   holds unacknowledged never exceed its frame slots (`ring_slots`), so a pulled frame
//!   always finds a slot and the input never drops.
//! - Acknowledgement: the [`Puller`] keeps each message it handed over, keyed by its stream
//!   sequence number (the frame's *delivery*); the decision thread passes that number to the
//!   [`Acker`] only once the frame's decision is written and flushed by every sink. A node
//!   that dies leaves its unacknowledged frames to the server, which redelivers them to the
//!   other nodes after the consumer's ack wait.
//! - A malformed message gets its `malformed` decision and is acknowledged like any other,
//!   so it is never redelivered for ever.
//! - The server restarting: pulls fail and are tried again with a logged back-off while the
//!   client reconnects; frames not yet acknowledged come back from the server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;

use crate::farm::{self, Backoff, ConsumerSpec, FarmError, NatsUrl, StreamSpec};

/// How long one pull request waits on the server for messages.
const PULL_EXPIRES: Duration = Duration::from_millis(500);
/// Most messages asked for in one pull request.
const PULL_MAX: usize = 256;
/// How often the consumer's state (pending, redelivered) is read for the metrics.
const INFO_EVERY: Duration = Duration::from_secs(1);

/// How a NATS input is set up (`--listen nats://HOST:PORT/STREAM`, or `[[input]]` with
/// `subject`, `durable`, `ack_wait_s`, `max_ack_pending`, `connect_retry_s`).
#[derive(Debug, Clone)]
pub struct NatsInputSpec {
    pub url: NatsUrl,
    pub consumer: ConsumerSpec,
    pub duplicate_window: Duration,
    /// How long to keep trying to reach the server at start (zero: fail at once).
    pub connect_retry: Duration,
    /// Most messages held unacknowledged (the input's frame slots).
    pub in_flight_max: usize,
}

/// The consumer's state as the server reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerState {
    /// Messages in the stream not yet delivered to any node.
    pub pending: u64,
    /// Messages delivered and not yet acknowledged, over all nodes.
    pub ack_pending: u64,
    /// Messages delivered more than once (still unacknowledged), over all nodes.
    pub redelivered: u64,
}

/// What this node did with the consumer.
#[derive(Debug, Default)]
pub struct NatsCounters {
    /// Messages pulled from the server.
    pub pulled: AtomicU64,
    /// Messages this node received that had been delivered before (to it or another node).
    pub redelivered: AtomicU64,
    /// Messages acknowledged after their decision was written.
    pub acked: AtomicU64,
}

/// Messages handed to the pipeline and not yet acknowledged, by stream sequence.
type InFlight = Arc<Mutex<HashMap<u64, jetstream::Message>>>;

/// A connected NATS input: the consumer exists and the stream too.
pub struct NatsSource {
    spec: NatsInputSpec,
    client: async_nats::Client,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    in_flight: InFlight,
    counters: Arc<NatsCounters>,
}

impl std::fmt::Debug for NatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSource")
            .field("url", &self.spec.url.to_string())
            .field("durable", &self.spec.consumer.durable)
            .finish()
    }
}

impl NatsSource {
    /// Connects (with the spec's retry), and creates the work-queue stream and the durable
    /// consumer if they are missing.
    pub fn open(spec: NatsInputSpec) -> Result<Self, FarmError> {
        let stream_name = spec.url.stream()?.to_string();
        let client = farm::connect(&spec.url, spec.connect_retry)?;
        let js = farm::js_context(client.clone());
        let consumer = farm::runtime().block_on(async {
            let stream = farm::ensure_stream(
                &js,
                &StreamSpec {
                    name: stream_name,
                    work_queue: true,
                    duplicate_window: spec.duplicate_window,
                },
            )
            .await?;
            farm::ensure_consumer(&stream, &spec.consumer).await
        })?;
        // Sized once for the most messages held, so holding one never allocates.
        let in_flight = HashMap::with_capacity(spec.in_flight_max.max(1));
        Ok(Self {
            spec,
            client,
            consumer,
            in_flight: Arc::new(Mutex::new(in_flight)),
            counters: Arc::new(NatsCounters::default()),
        })
    }

    pub fn counters(&self) -> Arc<NatsCounters> {
        self.counters.clone()
    }

    /// The acknowledging half: it takes the deliveries whose decisions are written.
    pub fn acker(&self) -> Acker {
        Acker {
            client: self.client.clone(),
            in_flight: self.in_flight.clone(),
            counters: self.counters.clone(),
        }
    }

    /// Pulls frames until `stop` is set, handing each one (its bytes, its delivery = stream
    /// sequence, whether it was delivered before, its arrival) to `on`, which may wait for room but must take it. `state` is
    /// called about once a second with the consumer's state.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        mut state: impl FnMut(ConsumerState),
        mut on: impl FnMut(&[u8], u64, bool, Instant),
    ) -> anyhow::Result<super::SourceStats> {
        let limit = self.spec.in_flight_max.max(1);
        // Pull again once a quarter of the room is free (or nothing is held), so a busy
        // node does not send a request per acknowledged frame.
        let pull_at = (limit / 4).clamp(1, PULL_MAX);
        let mut stats = super::SourceStats::default();
        let counters = self.counters.clone();
        let in_flight = self.in_flight.clone();
        let consumer = &mut self.consumer;
        farm::runtime().block_on(async {
            let mut backoff = Backoff::default();
            let mut failures = 0u64;
            let mut last_info: Option<Instant> = None;
            while !stop.load(Ordering::Relaxed) {
                if last_info.is_none_or(|t| t.elapsed() >= INFO_EVERY) {
                    last_info = Some(Instant::now());
                    if let Ok(Ok(info)) =
                        tokio::time::timeout(Duration::from_secs(1), consumer.info()).await
                    {
                        state(ConsumerState {
                            pending: info.num_pending,
                            ack_pending: info.num_ack_pending as u64,
                            redelivered: info.num_redelivered as u64,
                        });
                    }
                }
                let held = in_flight.lock().map(|m| m.len()).unwrap_or(limit);
                let room = limit.saturating_sub(held);
                if room < pull_at && held > 0 {
                    tokio::time::sleep(Duration::from_micros(500)).await;
                    continue;
                }
                if room == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let request = consumer
                    .batch()
                    .max_messages(room.min(PULL_MAX))
                    .expires(PULL_EXPIRES)
                    .messages();
                let mut batch = match tokio::time::timeout(farm::REQUEST_TIMEOUT, request).await {
                    Ok(Ok(b)) => b,
                    Ok(Err(e)) => {
                        pull_failed(&mut backoff, &mut failures, &e.to_string()).await;
                        continue;
                    }
                    Err(_) => {
                        pull_failed(&mut backoff, &mut failures, "timed out").await;
                        continue;
                    }
                };
                // Messages come as the server has them; the request ends after PULL_EXPIRES
                // (the client ends the batch), and a dead connection ends it too.
                let deadline = Instant::now() + PULL_EXPIRES + Duration::from_secs(1);
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let next = match tokio::time::timeout(left, batch.next()).await {
                        Ok(n) => n,
                        Err(_) => break,
                    };
                    let msg = match next {
                        None => break,
                        Some(Ok(m)) => m,
                        Some(Err(e)) => {
                            pull_failed(&mut backoff, &mut failures, &e.to_string()).await;
                            break;
                        }
                    };
                    if failures > 0 {
                        tracing::info!(failures, "pulling frames from NATS again");
                        failures = 0;
                    }
                    backoff.reset();
                    let arrival = Instant::now();
                    let (delivery, redelivered) = match msg.info() {
                        Ok(i) => (i.stream_sequence, i.delivered > 1),
                        // Not a JetStream delivery (cannot be acknowledged): decided, never
                        // acknowledged.
                        Err(_) => (0, false),
                    };
                    counters.pulled.fetch_add(1, Ordering::Relaxed);
                    if redelivered {
                        counters.redelivered.fetch_add(1, Ordering::Relaxed);
                    }
                    stats.frames += 1;
                    stats.bytes += msg.payload.len() as u64;
                    let payload = msg.payload.clone();
                    if delivery != 0 {
                        // Held before it is handed over: its acknowledgement can come at once.
                        if let Ok(mut m) = in_flight.lock() {
                            m.insert(delivery, msg);
                        }
                    }
                    on(&payload, delivery, redelivered, arrival);
                }
            }
        });
        Ok(stats)
    }
}

/// A pull that failed (server away): logged (the first, then every 10th), then a back-off.
async fn pull_failed(backoff: &mut Backoff, failures: &mut u64, why: &str) {
    *failures += 1;
    let d = backoff.next_delay();
    if *failures == 1 || *failures % 10 == 0 {
        tracing::warn!(
            failures = *failures,
            retry_in_ms = d.as_millis() as u64,
            "pulling frames from NATS failed: {why}; trying again"
        );
    }
    tokio::time::sleep(d).await;
}

/// Acknowledges the deliveries whose decisions are written, on its own thread.
pub struct Acker {
    client: async_nats::Client,
    in_flight: InFlight,
    counters: Arc<NatsCounters>,
}

impl Acker {
    /// Acknowledges every delivery that arrives on `written` until the channel closes (the
    /// decision thread has finished), then flushes the connection.
    pub fn run(self, written: crossbeam_channel::Receiver<u64>, mut acked: impl FnMut(u64)) {
        let mut batch: Vec<jetstream::Message> = Vec::with_capacity(PULL_MAX);
        while let Ok(first) = written.recv() {
            {
                let Ok(mut held) = self.in_flight.lock() else {
                    return;
                };
                batch.extend(held.remove(&first));
                while batch.len() < PULL_MAX {
                    match written.try_recv() {
                        Ok(d) => batch.extend(held.remove(&d)),
                        Err(_) => break,
                    }
                }
            }
            let n = batch.len() as u64;
            farm::runtime().block_on(async {
                for m in batch.drain(..) {
                    // A lost acknowledgement only means a redelivery, decided again and
                    // stored once.
                    if let Err(e) = m.ack().await {
                        tracing::debug!("acknowledging a frame: {e}");
                    }
                }
            });
            self.counters.acked.fetch_add(n, Ordering::Relaxed);
            acked(n);
        }
        let _ = farm::runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await
        });
    }
}
