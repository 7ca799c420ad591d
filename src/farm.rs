//! The farm: many trigd nodes behind one NATS JetStream server (or cluster). Frames come
//! from a work-queue stream through a durable pull consumer that every node shares
//! ([`crate::sources::nats`]); decisions go to a stream of their own with a message id per
//! frame, so a frame that was redelivered and decided twice is stored once
//! ([`crate::sinks::nats`]). This module holds what those pieces share: the
//! `nats://HOST:PORT/STREAM` address, the small async runtime the client runs on, connecting
//! (with an optional logged back-off), creating the streams and the consumer when they are
//! missing, and the commands around a farm: publishing a recording (`trigd send --to
//! nats://...`), recording a stream (`trigd record --listen nats://...`) and the farm-level
//! accounting check (`trigd farm check`).
//!
//! trigd's threads stay blocking: the client runs on one runtime worker thread
//! ([`runtime`]), and the source, acknowledgement and decision threads hand work to it with
//! `block_on`, talking to the rest of the pipeline through the usual bounded rings.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;

use crate::recording::Recording;

/// Default NATS client port.
pub const DEFAULT_PORT: u16 = 4222;
/// Default durable consumer name shared by the nodes of a farm.
pub const DEFAULT_DURABLE: &str = "trigd";
/// Default time the server waits for a node's acknowledgement before redelivering.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// Default de-duplication window of the streams trigd creates: longer than the ack wait,
/// so a frame redelivered after a node died and decided again is still recognised.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Most acknowledgements the consumer lets be outstanding over all nodes.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 65_536;
/// How long one request to the server (publish ack, consumer info) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A `nats://HOST:PORT[/STREAM]` address. The stream is required where frames are read or
/// decisions written, absent for commands that talk to the server only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsUrl {
    pub host: String,
    pub port: u16,
    pub stream: Option<String>,
}

/// A string that is not a [`NatsUrl`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NATS address {input:?}: {why}; expected nats://HOST:PORT/STREAM (e.g. nats://127.0.0.1:4222/FRAMES)")]
pub struct ParseNatsUrlError {
    pub input: String,
    pub why: String,
}

/// Whether `name` may name a JetStream stream or consumer: 1 to 64 printable ASCII
/// characters without whitespace, `.`, `*`, `>`, `/` or `\` (they are subject tokens and
/// file names on the server).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'.' | b'*' | b'>' | b'/' | b'\\'))
}

/// Whether `s` is a subject (or a filter with `*` and `>` wildcards): dot-separated,
/// non-empty tokens of printable ASCII; `>` only as the last token.
pub fn valid_subject(s: &str) -> bool {
    if s.is_empty() || s.len() > 255 {
        return false;
    }
    let tokens: Vec<&str> = s.split('.').collect();
    tokens.iter().enumerate().all(|(i, t)| {
        !t.is_empty()
            && t.bytes().all(|b| b.is_ascii_graphic())
            && (*t != ">" || i == tokens.len() - 1)
            && (t.len() == 1 || !t.contains(['*', '>']))
    })
}

impl FromStr for NatsUrl {
    type Err = ParseNatsUrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| ParseNatsUrlError {
            input: s.to_string(),
            why: why.to_string(),
        };
        let rest = s.trim();
        let Some((scheme, rest)) = rest.split_once("://") else {
            return Err(err("no scheme"));
        };
        if !scheme.eq_ignore_ascii_case("nats") {
            return Err(err("the scheme is not nats"));
        }
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        if authority.contains('@') {
            return Err(err("credentials in the address are not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((h, after)) = v6.split_once(']') else {
                return Err(err("unclosed [ in an IPv6 address"));
            };
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(err("junk after the IPv6 address")),
            };
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(err("not an IPv6 address"));
            }
            (format!("[{h}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(err("no host"));
        }
        if !host.starts_with('[')
            && !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        {
            return Err(err("the host is not a name or an address"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(err("the port is not a number in 1..=65535")),
                Ok(p) => p,
            },
        };
        let stream = match path {
            None | Some("") => None,
            Some(p) if valid_name(p) => Some(p.to_string()),
            Some(_) => return Err(err(
                "the stream name must be 1 to 64 printable characters without . * > / \\ or spaces",
            )),
        };
        Ok(NatsUrl { host, port, stream })
    }
}

impl fmt::Display for NatsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nats://{}:{}", self.host, self.port)?;
        if let Some(s) = &self.stream {
            write!(f, "/{s}")?;
        }
        Ok(())
    }
}

impl NatsUrl {
    /// The server address the client connects to.
    pub fn server(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    /// The stream, or an error that says where it goes in the address.
    pub fn stream(&self) -> Result<&str, FarmError> {
        self.stream
            .as_deref()
            .ok_or_else(|| FarmError::NoStream(self.to_string()))
    }
}

/// What can go wrong talking to the farm's server.
#[derive(Debug, thiserror::Error)]
pub enum FarmError {
    #[error("{0}: no stream named; write nats://HOST:PORT/STREAM")]
    NoStream(String),
    #[error("cannot reach the NATS server at {server}: {why} (is nats-server running with JetStream, `nats-server -js`? set connect_retry_s to wait for it)")]
    Unreachable { server: String, why: String },
    #[error("NATS {what}: {why}")]
    Server { what: String, why: String },
}

fn server_err(what: impl Into<String>) -> impl FnOnce(String) -> FarmError {
    let what = what.into();
    move |why| FarmError::Server { what, why }
}

/// The process's NATS runtime: one worker thread drives every connection; the blocking
/// threads reach it with `block_on`.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nats-client")
            .enable_all()
            .build()
            .expect("creating a one-thread tokio runtime (out of threads or memory)")
    })
}

/// A JetStream context on `client` (made inside the runtime, which its acknowledgement
/// task runs on).
pub fn js_context(client: async_nats::Client) -> jetstream::Context {
    let _rt = runtime().enter();
    jetstream::new(client)
}

/// Back-off between tries: doubles from 100 ms to 5 s.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);
    /// The wait before the next try.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Connects to `url`'s server. Unreachable: a clear error at once when `retry_for` is
/// zero, otherwise tries again with a logged back-off until `retry_for` has passed. Once
/// connected the client reconnects by itself, for ever, after the server goes away.
pub fn connect(url: &NatsUrl, retry_for: Duration) -> Result<async_nats::Client, FarmError> {
    let server = url.server();
    let started = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        let opts = async_nats::ConnectOptions::new()
            .name("trigd")
            .connection_timeout(Duration::from_secs(2))
            .request_timeout(Some(REQUEST_TIMEOUT))
            .max_reconnects(None)
            .reconnect_delay_callback(|n| Duration::from_millis((50 * n as u64).min(1000)))
            .event_callback(|e| async move {
                match e {
                    async_nats::Event::Connected => {
                        tracing::info!("NATS connection (re)established")
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("NATS connection lost; reconnecting")
                    }
                    other => tracing::debug!("NATS: {other}"),
                }
            });
        match runtime().block_on(async_nats::connect_with_options(&server, opts)) {
            Ok(c) => return Ok(c),
            Err(e) => {
                let why = e.to_string();
                if started.elapsed() >= retry_for {
                    return Err(FarmError::Unreachable { server, why });
                }
                let d = backoff.next_delay();
                tracing::warn!(
                    server = %server,
                    retry_in_ms = d.as_millis() as u64,
                    "cannot reach the NATS server: {why}; trying again"
                );
                std::thread::sleep(d);
            }
        }
    }
}

/// How trigd creates a stream it needs and does not find.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub name: String,
    /// A work queue (frames: each message goes to one consumer, removed when acknowledged)
    /// or a limits stream (decisions, accepted frames: kept).
    pub work_queue: bool,
    pub duplicate_window: Duration,
}

impl StreamSpec {
    /// The subjects of a stream trigd creates: every subject below its name.
    pub fn subjects(&self) -> String {
        format!("{}.>", self.name)
    }
}

/// Gets the stream, creating it (file storage, subjects `NAME.>`) if it is missing. An
/// existing stream is used as it is; a different retention is logged.
pub async fn ensure_stream(
    js: &jetstream::Context,
    spec: &StreamSpec,
) -> Result<stream::Stream, FarmError> {
    let config = stream::Config {
        name: spec.name.clone(),
        subjects: vec![spec.subjects()],
        retention: if spec.work_queue {
            stream::RetentionPolicy::WorkQueue
        } else {
            stream::RetentionPolicy::Limits
        },
        storage: stream::StorageType::File,
        duplicate_window: spec.duplicate_window,
        ..Default::default()
    };
    let mut s = create_racing(
        format!("creating stream {}", spec.name),
        || js.get_or_create_stream(config.clone()),
        || js.get_stream(&spec.name),
    )
    .await?;
    let info = s
        .info()
        .await
        .map_err(|e| e.to_string())
        .map_err(server_err(format!("stream {}", spec.name)))?;
    let wq = info.config.retention == stream::RetentionPolicy::WorkQueue;
    if wq != spec.work_queue {
        tracing::warn!(
            stream = %spec.name,
            "stream exists with retention {:?}; trigd would create it as {}",
            info.config.retention,
            if spec.work_queue { "a work queue" } else { "a limits stream" }
        );
    }
    Ok(s)
}

/// The durable pull consumer the nodes of a farm share.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub durable: String,
    /// Only messages on these subjects (empty: all of the stream).
    pub filter_subject: Option<String>,
    pub ack_wait: Duration,
    pub max_ack_pending: i64,
}

/// Gets the durable consumer, creating it (explicit acknowledgement) if it is missing.
pub async fn ensure_consumer(
    stream: &stream::Stream,
    spec: &ConsumerSpec,
) -> Result<jetstream::consumer::Consumer<pull::Config>, FarmError> {
    let config = pull::Config {
        durable_name: Some(spec.durable.clone()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_ack_pending: spec.max_ack_pending,
        filter_subject: spec.filter_subject.clone().unwrap_or_default(),
        ..Default::default()
    };
    create_racing(
        format!("creating consumer {}", spec.durable),
        || stream.get_or_create_consumer(&spec.durable, config.clone()),
        || stream.get_consumer(&spec.durable),
    )
    .await
}

/// What `create` gets or creates, where other nodes may be creating it at the same time:
/// the nodes of a farm start together, two may both miss a stream or consumer, and the one
/// whose creation loses the race is refused (name in use, subjects overlap). What the
/// winner created is then there for `get` to take. Up to [`CREATE_ATTEMPTS`] tries; the
/// first error is kept for the case where nothing is found.
async fn create_racing<T, E1, E2, C, CF, G, GF>(
    what: String,
    create: C,
    get: G,
) -> Result<T, FarmError>
where
    E1: fmt::Display,
    C: Fn() -> CF,
    CF: std::future::Future<Output = Result<T, E1>>,
    G: Fn() -> GF,
    GF: std::future::Future<Output = Result<T, E2>>,
{
    let mut first_err = None;
    for attempt in 0..CREATE_ATTEMPTS {
        match create().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                tracing::debug!(attempt, "{what}: {e}");
                first_err.get_or_insert_with(|| e.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50 * (attempt as u64 + 1))).await;
        if let Ok(v) = get().await {
            return Ok(v);
        }
    }
    Err(server_err(what)(first_err.unwrap_or_default()))
}

/// Tries at creating a stream or consumer that other nodes may be creating at the same time.
const CREATE_ATTEMPTS: usize = 4;

/// The `Nats-Msg-Id` of a frame: its producer's id and sequence number.
pub fn frame_msg_id(source_id: u32, seq: u64) -> String {
    format!("{source_id}.{seq}")
}

/// The subject a frame is published on in stream `stream`.
pub fn frame_subject(stream: &str) -> String {
    format!("{stream}.frames")
}

/// What [`publish_recording`] did.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublishSummary {
    pub frames: u64,
    /// Frames the stream already held (same message id within its duplicate window).
    pub duplicates: u64,
    /// Publishes tried again after a failed or missing acknowledgement.
    pub retries: u64,
    pub elapsed: Duration,
    pub stopped_early: bool,
}

/// Publishes outstanding at once: enough to keep the connection busy.
const PUBLISH_WINDOW: usize = 512;

/// Publishes every frame of `rec` to the stream of `url` (created as a work queue if
/// missing), each with its message id, at `rate_hz` or as fast as the server acknowledges.
/// Every frame is acknowledged by the server before this returns; a publish whose
/// acknowledgement fails (server restarting) is sent again with the same id.
pub fn publish_recording(
    rec: &Recording,
    url: &NatsUrl,
    rate_hz: Option<f64>,
    retry_for: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<PublishSummary> {
    if let Some(r) = rate_hz {
        anyhow::ensure!(
            r.is_finite() && r > 0.0,
            "rate {r} Hz is not a positive, finite number of frames per second"
        );
    }
    let stream = url.stream()?.to_string();
    let client = connect(url, retry_for)?;
    let js = js_context(client.clone());
    let spec = StreamSpec {
        name: stream.clone(),
        work_queue: true,
        duplicate_window: DEFAULT_DUPLICATE_WINDOW,
    };
    let subject = frame_subject(&stream);
    runtime().block_on(async {
        ensure_stream(&js, &spec).await?;
        let mut summary = PublishSummary::default();
        let t0 = Instant::now();
        let period = rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut window: VecDeque<Pending> = VecDeque::with_capacity(PUBLISH_WINDOW);
        let publish = |payload: bytes::Bytes, id: String| publish_frame(&js, &subject, payload, id);
        for (i, bytes) in rec.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                summary.stopped_early = true;
                break;
            }
            if let Some(p) = period {
                let due = t0 + p.mul_f64(i as f64);
                let now = Instant::now();
                if due > now {
                    tokio::time::sleep(due - now).await;
                }
            }
            let id = match crate::frame::parse(bytes) {
                Ok(v) => frame_msg_id(v.source_id(), v.sequence()),
                // A damaged frame still goes out (the nodes decide it `malformed`), with
                // an id of its place in the recording.
                Err(_) => format!("rec.{i}"),
            };
            let payload = bytes::Bytes::copy_from_slice(bytes);
            let fut = publish(payload.clone(), id.clone()).await;
            window.push_back((payload, id, fut));
            if window.len() >= PUBLISH_WINDOW {
                if let Some(p) = window.pop_front() {
                    settle(&js, &subject, p, &mut summary).await;
                }
            }
        }
        while let Some(p) = window.pop_front() {
            settle(&js, &subject, p, &mut summary).await;
        }
        summary.elapsed = t0.elapsed();
        Ok(summary)
    })
}

/// A publish in flight: the payload and id kept to send it again.
type Pending = (
    bytes::Bytes,
    String,
    Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>,
);

/// Sends one frame with its message id; the acknowledgement is awaited later.
async fn publish_frame(
    js: &jetstream::Context,
    subject: &str,
    payload: bytes::Bytes,
    id: String,
) -> Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError> {
    js.send_publish(
        subject.to_string(),
        jetstream::message::PublishMessage::build()
            .payload(payload)
            .message_id(id),
    )
    .await
}

/// Waits for a publish's acknowledgement, sending it again (same id, so stored once) with
/// a back-off until the server takes it.
async fn settle(js: &jetstream::Context, subject: &str, p: Pending, summary: &mut PublishSummary) {
    let (payload, id, mut fut) = p;
    let mut backoff = Backoff::default();
    loop {
        let why = match fut {
            Ok(f) => match f.await {
                Ok(ack) => {
                    summary.frames += 1;
                    summary.duplicates += ack.duplicate as u64;
                    return;
                }
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        summary.retries += 1;
        let d = backoff.next_delay();
        tracing::warn!(
            "frame {id} not acknowledged by the server ({why}); sending it again in {} ms",
            d.as_millis()
        );
        tokio::time::sleep(d).await;
        fut = publish_frame(js, subject, payload.clone(), id.clone()).await;
    }
}

/// Consumes the stream of `url` with the durable consumer `durable` (created if missing)
/// and appends every valid frame to a new recording at `out`; each message is acknowledged
/// once its frame is written and synced (a malformed one is counted, logged and
/// acknowledged). Stops after `count` frames or when `stop` is set. Returns the frames
/// written.
pub fn record_stream(
    url: &NatsUrl,
    durable: &str,
    out: &std::path::Path,
    fsync: crate::recording::FsyncPolicy,
    count: Option<u64>,
    stop: &AtomicBool,
) -> anyhow::Result<u64> {
    let stream_name = url.stream()?.to_string();
    let client = connect(url, Duration::ZERO)?;
    let js = js_context(client.clone());
    let mut writer = crate::recording::RecordingWriter::create(out, fsync)?;
    let mut written = 0u64;
    let mut malformed = 0u64;
    runtime().block_on(async {
        let stream = ensure_stream(
            &js,
            &StreamSpec {
                name: stream_name,
                work_queue: true,
                duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            },
        )
        .await?;
        let consumer = ensure_consumer(
            &stream,
            &ConsumerSpec {
                durable: durable.to_string(),
                filter_subject: None,
                ack_wait: DEFAULT_ACK_WAIT,
                max_ack_pending: DEFAULT_MAX_ACK_PENDING,
            },
        )
        .await?;
        let mut backoff = Backoff::default();
        while !stop.load(Ordering::Relaxed) && count.is_none_or(|c| written < c) {
            let want = count.map_or(256, |c| (c - written).min(256) as usize);
            let mut batch = match consumer
                .batch()
                .max_messages(want)
                .expires(Duration::from_millis(500))
                .messages()
                .await
            {
                Ok(b) => b,
                Err(e) => {
                    let d = backoff.next_delay();
                    tracing::warn!(
                        "pulling from {url}: {e}; trying again in {} ms",
                        d.as_millis()
                    );
                    tokio::time::sleep(d).await;
                    continue;
                }
            };
            let mut got = Vec::new();
            while let Some(m) = batch.next().await {
                match m {
                    Ok(m) => got.push(m),
                    Err(e) => {
                        tracing::warn!("pulling from {url}: {e}");
                        break;
                    }
                }
            }
            backoff.reset();
            for m in &got {
                match writer.append(&m.payload) {
                    Ok(_) => written += 1,
                    Err(crate::recording::RecordingError::InvalidFrame(_)) => {
                        malformed += 1;
                        tracing::warn!("a malformed frame in {url} was not recorded");
                    }
                    Err(e) => return Err(anyhow::Error::from(e).context("writing the recording")),
                }
            }
            if !got.is_empty() {
                writer.sync()?;
            }
            for m in &got {
                if let Err(e) = m.ack().await {
                    tracing::warn!("acknowledging a recorded frame: {e}");
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), client.flush()).await;
        Ok::<(), anyhow::Error>(())
    })?;
    writer.finish()?;
    if malformed > 0 {
        tracing::warn!(malformed, "malformed frames were skipped");
    }
    Ok(written)
}

/// What the farm check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FarmCount {
    /// Frames the input stream ever took (its last sequence number).
    pub frames_in: u64,
    /// Frames still waiting in the input stream.
    pub frames_waiting: u64,
    /// Frames delivered to a node and not yet acknowledged.
    pub frames_unacked: u64,
    /// Messages in the decision stream.
    pub decisions: u64,
    /// Distinct frames among them (by message id).
    pub distinct_decisions: u64,
    /// Decisions per outcome, in [`crate::decision::Outcome::ALL`] order.
    pub outcomes: [u64; 5],
}

impl FarmCount {
    /// Every frame that went in has exactly one decision, and none is still on its way.
    pub fn balanced(&self) -> bool {
        self.frames_waiting == 0
            && self.frames_unacked == 0
            && self.decisions == self.distinct_decisions
            && self.distinct_decisions == self.frames_in
    }
}

/// Reads every message of a stream from the start (an ephemeral consumer, nothing
/// acknowledged or removed) and hands its headers' message id and payload to `each`.
pub async fn read_stream(
    js: &jetstream::Context,
    stream_name: &str,
    mut each: impl FnMut(Option<&str>, &[u8]),
) -> Result<u64, FarmError> {
    let mut s = js
        .get_stream(stream_name)
        .await
        .map_err(|e| e.to_string())
        .map_err(server_err(format!("stream {stream_name}")))?;
    let total = s
        .info()
        .await
        .map_err(|e| e.to_string())
        .map_err(server_err(format!("stream {stream_name}")))?
        .state
        .messages;
    if total == 0 {
        return Ok(0);
    }
    let consumer = s
        .create_consumer(pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())
        .map_err(server_err(format!("reading stream {stream_name}")))?;
    let mut n = 0u64;
    while n < total {
        let mut batch = consumer
            .batch()
            .max_messages(((total - n) as usize).min(4096))
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(|e| e.to_string())
            .map_err(server_err(format!("reading stream {stream_name}")))?;
        let before = n;
        while let Some(m) = batch.next().await {
            let m = m
                .map_err(|e| e.to_string())
                .map_err(server_err(format!("reading stream {stream_name}")))?;
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str());
            each(id, &m.payload);
            n += 1;
        }
        if n == before {
            break;
        }
    }
    Ok(n)
}

/// The farm-level accounting: frames the input stream took against the distinct decisions
/// in the decision stream.
pub fn check(
    url: &NatsUrl,
    input: &str,
    durable: &str,
    decisions: &str,
) -> anyhow::Result<FarmCount> {
    let client = connect(url, Duration::ZERO)?;
    let js = js_context(client);
    runtime().block_on(async {
        let mut count = FarmCount::default();
        let mut s = js
            .get_stream(input)
            .await
            .map_err(|e| anyhow::anyhow!("input stream {input}: {e}"))?;
        let state = s.info().await?.state.clone();
        count.frames_in = state.last_sequence;
        count.frames_waiting = state.messages;
        if let Ok(mut c) = s.get_consumer::<pull::Config>(durable).await {
            count.frames_unacked = c.info().await?.num_ack_pending as u64;
        }
        let mut ids = HashSet::new();
        let mut outcomes = [0u64; 5];
        count.decisions = read_stream(&js, decisions, |id, payload| {
            if let Some(id) = id {
                ids.insert(id.to_string());
            }
            if let Some(o) = outcome_of(payload) {
                outcomes[o as usize] += 1;
            }
        })
        .await?;
        count.distinct_decisions = ids.len() as u64;
        count.outcomes = outcomes;
        Ok(count)
    })
}

/// The outcome field of a decision record (JSON).
fn outcome_of(payload: &[u8]) -> Option<crate::decision::Outcome> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let o = v.get("outcome")?.as_str()?;
    crate::decision::Outcome::ALL
        .into_iter()
        .find(|x| x.as_str() == o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        let u: NatsUrl = "nats://127.0.0.1:4222/FRAMES".parse().unwrap();
        assert_eq!(
            u,
            NatsUrl {
                host: "127.0.0.1".into(),
                port: 4222,
                stream: Some("FRAMES".into())
            }
        );
        assert_eq!(u.to_string().parse::<NatsUrl>().unwrap(), u);
        assert_eq!(u.server(), "nats://127.0.0.1:4222");
        let u: NatsUrl = "NATS://[::1]/D".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("[::1]", DEFAULT_PORT));
        let u: NatsUrl = "nats://farm-1.daq:5000".parse().unwrap();
        assert_eq!(u.stream, None);
        assert!(u.stream().unwrap_err().to_string().contains("no stream"));
        for bad in [
            "udp://1.2.3.4:5",
            "nats://",
            "nats://:4222/S",
            "nats://h:0/S",
            "nats://h:99999/S",
            "nats://h:4222/A.B",
            "nats://h:4222/A B",
            "nats://h:4222/a/b",
            "nats://u:p@h:4222/S",
            "nats://[::1/S",
            "nats://[zz]:1/S",
            "nats://h;rm:1/S",
        ] {
            let e = bad.parse::<NatsUrl>().unwrap_err().to_string();
            assert!(e.contains("expected nats://HOST:PORT/STREAM"), "{bad}: {e}");
        }
    }

    #[test]
    fn subjects_and_names_are_checked() {
        for good in ["FRAMES.>", "a.*.c", "x", "D.tracking.accept"] {
            assert!(valid_subject(good), "{good}");
        }
        for bad in ["", "a..b", ".a", "a.>.b", "a b", "a.b*", "a.>x"] {
            assert!(!valid_subject(bad), "{bad}");
        }
        assert!(valid_name("DECISIONS_1"));
        assert!(!valid_name("a.b") && !valid_name("") && !valid_name(&"x".repeat(65)));
    }

    #[test]
    fn backoff_doubles_to_a_ceiling() {
        let mut b = Backoff::default();
        let d: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(d, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn farm_count_balances_only_when_every_frame_has_one_decision() {
        let ok = FarmCount {
            frames_in: 10,
            decisions: 10,
            distinct_decisions: 10,
            ..Default::default()
        };
        assert!(ok.balanced());
        for bad in [
            FarmCount {
                decisions: 11,
                ..ok.clone()
            },
            FarmCount {
                distinct_decisions: 9,
                decisions: 9,
                ..ok.clone()
            },
            FarmCount {
                frames_waiting: 1,
                ..ok.clone()
            },
            FarmCount {
                frames_unacked: 1,
                ..ok.clone()
            },
        ] {
            assert!(!bad.balanced(), "{bad:?}");
        }
    }
}
