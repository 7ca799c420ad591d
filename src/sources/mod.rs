//! Sources: where frames enter the daemon. Each source is a blocking loop on its own thread
//! that frames bytes from the network into whole frames and hands each one, borrowed from a
//! buffer allocated once, to a caller's closure together with its arrival time. Sources only
//! frame; validation (`frame::parse`) is the pipeline's job, so every frame that arrives gets
//! exactly one outcome there.
//!
//! - [`udp`]: one datagram is one frame.
//! - [`tcp`]: a byte stream of frames back to back, delimited by each header's `payload_len`.
//! - [`lsl`]: a Lab Streaming Layer EEG stream, its samples gathered into EEG block frames.
//!
//! Both loops stop within about [`POLL_INTERVAL`] of the shared stop flag being set, or as
//! soon as the closure returns [`ControlFlow::Break`].

pub mod limits;
pub mod lsl;
pub mod nats;
pub mod replay;
pub mod tcp;
pub mod udp;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

pub use limits::{Cidr, Limits};
pub use tcp::{run_tcp, run_tcp_limited, MAX_TCP_CONNECTIONS};
pub use udp::{run_udp, run_udp_limited, UDP_BUFFER_BYTES};

/// How long a source blocks waiting for data before it looks at the stop flag again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Where frames come from (or, for `send`, go to): `udp://HOST:PORT` or `tcp://HOST:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Udp(SocketAddr),
    Tcp(SocketAddr),
}

/// A string that is not an [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint {input:?}: {why}; expected udp://HOST:PORT or tcp://HOST:PORT (e.g. udp://0.0.0.0:9000, tcp://[::1]:9000)")]
pub struct ParseEndpointError {
    pub input: String,
    pub why: String,
}

impl FromStr for Endpoint {
    type Err = ParseEndpointError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: String| ParseEndpointError {
            input: s.to_string(),
            why,
        };
        let Some((scheme, rest)) = s.trim().split_once("://") else {
            return Err(err("no scheme".into()));
        };
        let make: fn(SocketAddr) -> Endpoint = match scheme.to_ascii_lowercase().as_str() {
            "udp" => Endpoint::Udp,
            "tcp" => Endpoint::Tcp,
            other => return Err(err(format!("unknown scheme {other:?}"))),
        };
        if let Ok(addr) = rest.parse::<SocketAddr>() {
            return Ok(make(addr));
        }
        // A host name (localhost, a DAQ node): resolve it once, now.
        let mut addrs = rest
            .to_socket_addrs()
            .map_err(|e| err(format!("cannot resolve {rest:?} ({e})")))?;
        addrs
            .next()
            .map(make)
            .ok_or_else(|| err(format!("{rest:?} resolves to no address")))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Udp(a) => write!(f, "udp://{a}"),
            Self::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl Endpoint {
    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::Udp(a) | Self::Tcp(a) => *a,
        }
    }

    /// Binds a listening source on this endpoint (port 0 picks a free port; see
    /// [`BoundSource::local_addr`]). UDP sockets ask for a large receive buffer
    /// ([`udp::RECV_BUFFER_BYTES`], capped by the kernel's `net.core.rmem_max`) so bursts
    /// wait in the kernel instead of being dropped.
    pub fn bind(&self) -> io::Result<BoundSource> {
        match self {
            Self::Udp(a) => {
                let s = UdpSocket::bind(a)?;
                udp::enlarge_recv_buffer(&s);
                Ok(BoundSource::Udp(s))
            }
            Self::Tcp(a) => Ok(BoundSource::Tcp(TcpListener::bind(a)?)),
        }
    }
}

/// A bound, listening source, ready to [`run`](BoundSource::run) on its own thread.
#[derive(Debug)]
pub enum BoundSource {
    Udp(UdpSocket),
    Tcp(TcpListener),
}

impl BoundSource {
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Self::Udp(s) => s.local_addr(),
            Self::Tcp(l) => l.local_addr(),
        }
    }

    /// The endpoint actually bound (with the port the OS chose for port 0).
    pub fn endpoint(&self) -> io::Result<Endpoint> {
        Ok(match self {
            Self::Udp(s) => Endpoint::Udp(s.local_addr()?),
            Self::Tcp(l) => Endpoint::Tcp(l.local_addr()?),
        })
    }

    /// Runs [`run_udp`] or [`run_tcp`] until `stop` is set or `on` breaks.
    pub fn run(
        &self,
        stop: &AtomicBool,
        on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
    ) -> io::Result<SourceStats> {
        self.run_limited(&Limits::default(), stop, on)
    }

    /// [`BoundSource::run`] admitting only what `limits` lets in.
    pub fn run_limited(
        &self,
        limits: &Limits,
        stop: &AtomicBool,
        on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
    ) -> io::Result<SourceStats> {
        match self {
            Self::Udp(s) => run_udp_limited(s, limits, stop, on),
            Self::Tcp(l) => run_tcp_limited(l, limits, stop, on),
        }
    }
}

/// What a source hands to its caller.
#[derive(Debug)]
pub enum Received<'a> {
    /// One whole frame's bytes (header and payload, contiguous), borrowed from the source's
    /// buffer until the closure returns. Not yet validated.
    Frame(&'a [u8]),
    /// Bytes that could not be framed: `reason` is a [`crate::frame::FrameError::reason`]
    /// label or `truncated` (a TCP connection closed inside a frame).
    Malformed {
        reason: &'static str,
        detail: String,
    },
    /// A datagram or connection refused by the input's [`Limits`] (reason one of
    /// [`limits::REFUSED_REASONS`]); it is not a frame and never enters the pipeline.
    Refused {
        reason: &'static str,
        peer: SocketAddr,
    },
    /// Samples that never arrived: a live stream (LSL) went away and came back. Stands for
    /// the `frames` blocks the missing `samples` spanned, the first of them numbered
    /// `sequence`; it gets one decision record (`dropped`, `reason`).
    Lost {
        reason: &'static str,
        source_id: u32,
        sequence: u64,
        timestamp_ns: u64,
        samples: u64,
        frames: u64,
    },
}

/// Reason label for a TCP connection that closed inside a frame.
pub const REASON_TRUNCATED: &str = "truncated";

/// Counters a source returns when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// [`Received::Frame`]s handed to the closure.
    pub frames: u64,
    /// [`Received::Malformed`]s handed to the closure.
    pub malformed: u64,
    /// Bytes of the frames handed over.
    pub bytes: u64,
    /// TCP connections accepted.
    pub connections: u64,
    /// TCP connections refused because the most connections were open.
    pub connections_refused: u64,
    /// Datagrams and connections refused by the input's [`Limits`] (allowlist, idle,
    /// stalled, connections), all reasons together.
    pub refused: u64,
    /// TCP: the largest receive buffer any connection held, bytes.
    pub buffer_bytes_max: usize,
}

/// What a frame's sequence number says about the frames of its producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    /// The first frame seen from this producer.
    First,
    /// Exactly one more than the last.
    InOrder,
    /// Ahead of the last by more than one: this many frames are missing between them.
    Gap(u64),
    /// Not after the last one seen (a duplicate or a late frame).
    Repeat,
}

/// Follows each producer's (`source_id`'s) sequence numbers and counts gaps and repeats.
/// One per source thread; memory grows by one entry per distinct producer.
#[derive(Debug, Clone, Default)]
pub struct SequenceTracker {
    last: HashMap<u32, u64>,
    gaps: u64,
    missing: u64,
    repeats: u64,
}

impl SequenceTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `sequence` from producer `source_id`. A repeat does not move the producer's
    /// position: after 5, 3 the next in-order number is still 6.
    pub fn observe(&mut self, source_id: u32, sequence: u64) -> SeqEvent {
        let Some(last) = self.last.get_mut(&source_id) else {
            self.last.insert(source_id, sequence);
            return SeqEvent::First;
        };
        if sequence <= *last {
            self.repeats += 1;
            return SeqEvent::Repeat;
        }
        let missing = sequence - *last - 1;
        *last = sequence;
        if missing == 0 {
            SeqEvent::InOrder
        } else {
            self.gaps += 1;
            self.missing += missing;
            SeqEvent::Gap(missing)
        }
    }

    /// Number of gaps seen (each a run of one or more missing frames).
    pub fn gaps(&self) -> u64 {
        self.gaps
    }
    /// Frames missing in all gaps together.
    pub fn missing(&self) -> u64 {
        self.missing
    }
    /// Frames whose sequence number was not after the last one seen.
    pub fn repeats(&self) -> u64 {
        self.repeats
    }
    /// Distinct producers seen.
    pub fn producers(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print() {
        let e: Endpoint = "udp://127.0.0.1:9000".parse().unwrap();
        assert_eq!(e, Endpoint::Udp("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(e.to_string(), "udp://127.0.0.1:9000");
        let e: Endpoint = "tcp://[::1]:7".parse().unwrap();
        assert_eq!(e, Endpoint::Tcp("[::1]:7".parse().unwrap()));
        assert_eq!(e.to_string().parse::<Endpoint>().unwrap(), e);
        let e: Endpoint = "tcp://localhost:9001".parse().unwrap();
        assert!(e.addr().ip().is_loopback());
        assert_eq!(e.addr().port(), 9001);
        for bad in [
            "127.0.0.1:9000",
            "http://127.0.0.1:80",
            "udp://127.0.0.1",
            "udp://",
            "tcp://127.0.0.1:99999",
        ] {
            let err = bad.parse::<Endpoint>().unwrap_err().to_string();
            assert!(err.contains("expected udp://HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn sequence_tracker_counts_gaps_and_repeats_per_producer() {
        let mut t = SequenceTracker::new();
        assert_eq!(t.observe(1, 10), SeqEvent::First);
        assert_eq!(t.observe(2, 0), SeqEvent::First);
        assert_eq!(t.observe(1, 11), SeqEvent::InOrder);
        assert_eq!(t.observe(1, 15), SeqEvent::Gap(3));
        assert_eq!(t.observe(2, 1), SeqEvent::InOrder);
        assert_eq!(t.observe(1, 15), SeqEvent::Repeat);
        assert_eq!(t.observe(1, 12), SeqEvent::Repeat);
        assert_eq!(t.observe(1, 16), SeqEvent::InOrder);
        assert_eq!(t.observe(2, 3), SeqEvent::Gap(1));
        assert_eq!(t.observe(3, u64::MAX), SeqEvent::First);
        assert_eq!(t.observe(3, u64::MAX), SeqEvent::Repeat);
        assert_eq!(
            (t.gaps(), t.missing(), t.repeats(), t.producers()),
            (2, 4, 3, 3)
        );
    }
}
