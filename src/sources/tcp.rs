//! TCP source: frames back to back on a byte stream, each delimited by its header's
//! `payload_len`. One thread serves the listener and up to [`MAX_TCP_CONNECTIONS`]
//! connections with `poll(2)`, so every frame, whichever connection it came on, goes to the
//! same `FnMut` closure without locks or copies.
//!
//! Per connection there is one receive buffer (256 KiB to start, doubled as the bytes of a
//! larger frame actually arrive, never beyond that frame's size nor the input's
//! `max_frame_bytes`): a header that announces a huge frame costs nothing until its bytes
//! come. Reads fill the buffer with as many frames as the kernel has, and each complete
//! frame is handed over as a slice of it. The input's [`Limits`] bound the connections
//! (more are refused), their senders (an allowlist), and their silence: a connection that
//! sends nothing for `idle_timeout`, or stops inside a frame for `stall_timeout`, is
//! closed; each is reported as [`Received::Refused`]. If a header fails
//! [`frame::peek_header`] (bad magic, version, reserved word or size) the stream has lost
//! sync: that is reported as [`Received::Malformed`] and the connection is closed; the
//! others and the listener go on. A connection that closes inside a frame reports
//! `truncated`.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::limits::{REFUSED_IDLE, REFUSED_NOT_ALLOWED, REFUSED_STALLED, REFUSED_TOO_MANY};
use super::{Limits, Received, SourceStats, POLL_INTERVAL, REASON_TRUNCATED};
use crate::frame::{self, HEADER_LEN};

/// Connections served at once; further ones are accepted and closed at once (logged).
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// Starting receive buffer per connection.
const CONN_BUFFER_BYTES: usize = 256 << 10;
/// Reads per connection per poll round, so one busy producer cannot starve the others.
const READS_PER_ROUND: usize = 16;

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// Last time bytes arrived (or the connection was accepted).
    last_bytes: Instant,
}

enum After {
    Keep,
    Close,
    Break,
}

/// Accepts connections on `listener` and frames what they send until `stop` is set or `on`
/// returns `Break`. Puts the listener in non-blocking mode. Incomplete frames pending when
/// the loop stops are discarded (they never fully arrived).
pub fn run_tcp(
    listener: &TcpListener,
    stop: &AtomicBool,
    on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> io::Result<SourceStats> {
    run_tcp_limited(listener, &Limits::default(), stop, on)
}

/// [`run_tcp`] within `limits`: senders outside the allowlist and connections beyond
/// `max_connections` are refused at accept; idle and stalled connections are closed.
pub fn run_tcp_limited(
    listener: &TcpListener,
    limits: &Limits,
    stop: &AtomicBool,
    mut on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> io::Result<SourceStats> {
    listener.set_nonblocking(true)?;
    let max_conns = limits.max_connections.max(1);
    let mut conns: Vec<Connection> = Vec::with_capacity(max_conns);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(max_conns + 1);
    let mut stats = SourceStats::default();
    let timeout_ms = POLL_INTERVAL.as_millis() as libc::c_int;
    while !stop.load(Ordering::Relaxed) {
        fds.clear();
        fds.push(pollfd(listener.as_raw_fd()));
        fds.extend(conns.iter().map(|c| pollfd(c.stream.as_raw_fd())));
        // SAFETY: `fds` is a live, initialised slice of pollfd of the length passed; every
        // fd in it belongs to the listener or a connection that outlives the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Connections first, in reverse so swap_remove keeps the fds/conns pairing valid.
        let now = Instant::now();
        for i in (0..conns.len()).rev() {
            let after = if ready > 0 && fds[i + 1].revents != 0 {
                service(&mut conns[i], limits, &mut stats, &mut on)
            } else {
                timed_out(&conns[i], limits, now, &mut stats, &mut on)
            };
            match after {
                After::Keep => {}
                After::Close => {
                    let c = conns.swap_remove(i);
                    tracing::debug!(peer = %c.peer, "TCP connection closed");
                }
                After::Break => return Ok(stats),
            }
        }
        if ready > 0 && fds[0].revents != 0 {
            if let After::Break = accept_all(listener, limits, &mut conns, &mut stats, &mut on) {
                return Ok(stats);
            }
        }
    }
    Ok(stats)
}

/// Closes a connection silent for longer than its limit: `idle` between frames, `stalled`
/// inside one (its partial frame is discarded, never decided: it never arrived).
fn timed_out(
    c: &Connection,
    limits: &Limits,
    now: Instant,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    let inside_frame = c.end > c.start;
    let (limit, reason) = if inside_frame {
        (limits.stall_timeout, REFUSED_STALLED)
    } else {
        (limits.idle_timeout, REFUSED_IDLE)
    };
    if now.saturating_duration_since(c.last_bytes) < limit {
        return After::Keep;
    }
    stats.refused += 1;
    tracing::warn!(
        peer = %c.peer,
        reason,
        pending_bytes = c.end - c.start,
        "closing a TCP connection silent for {limit:?}"
    );
    if on(
        Received::Refused {
            reason,
            peer: c.peer,
        },
        now,
    )
    .is_break()
    {
        After::Break
    } else {
        After::Close
    }
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn accept_all(
    listener: &TcpListener,
    limits: &Limits,
    conns: &mut Vec<Connection>,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                // Refused connections are closed at once (the stream is dropped).
                let refused = if !limits.allows(peer.ip()) {
                    tracing::debug!(%peer, "refusing TCP connection: sender not allowed");
                    Some(REFUSED_NOT_ALLOWED)
                } else if conns.len() >= limits.max_connections.max(1) {
                    stats.connections_refused += 1;
                    tracing::warn!(%peer, "refusing TCP connection: {} already open", conns.len());
                    Some(REFUSED_TOO_MANY)
                } else {
                    None
                };
                if let Some(reason) = refused {
                    drop(stream);
                    stats.refused += 1;
                    if on(Received::Refused { reason, peer }, Instant::now()).is_break() {
                        return After::Break;
                    }
                    continue;
                }
                if let Err(e) = stream.set_nonblocking(true) {
                    tracing::warn!(%peer, error = %e, "dropping TCP connection");
                    continue;
                }
                stats.connections += 1;
                tracing::debug!(%peer, "TCP connection accepted");
                let first = CONN_BUFFER_BYTES.min(limits.max_frame_bytes.max(HEADER_LEN));
                stats.buffer_bytes_max = stats.buffer_bytes_max.max(first);
                conns.push(Connection {
                    stream,
                    peer,
                    buf: vec![0; first],
                    start: 0,
                    end: 0,
                    last_bytes: Instant::now(),
                });
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock => return After::Keep,
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                _ => {
                    // Out of file descriptors and the like: keep serving what is open.
                    tracing::warn!(error = %e, "accepting a TCP connection failed");
                    return After::Keep;
                }
            },
        }
    }
}

/// Reads what `c` has ready and hands over every complete frame.
fn service(
    c: &mut Connection,
    limits: &Limits,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    for _ in 0..READS_PER_ROUND {
        if c.end == c.buf.len() {
            // No room left: move the partial frame to the front.
            c.buf.copy_within(c.start..c.end, 0);
            c.end -= c.start;
            c.start = 0;
            if c.end == c.buf.len() {
                // The pending frame is larger than the buffer and its bytes keep coming:
                // double, up to the frame's size (extract() checked it against the limit).
                // A full buffer must never be read into: a 0-byte read would look like EOF.
                let total = frame::peek_header(&c.buf[..c.end])
                    .map(|h| HEADER_LEN + h.payload_len.get() as usize)
                    .unwrap_or(c.buf.len() + 1);
                let grown = (c.buf.len() * 2)
                    .min(total.min(limits.max_frame_bytes))
                    .max(c.buf.len() + 1);
                c.buf.resize(grown, 0);
                stats.buffer_bytes_max = stats.buffer_bytes_max.max(grown);
            }
        }
        let n = match c.stream.read(&mut c.buf[c.end..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return After::Keep,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::debug!(peer = %c.peer, error = %e, "TCP read failed");
                0
            }
        };
        if n == 0 {
            return closed(c, stats, on);
        }
        c.end += n;
        let arrival = Instant::now();
        c.last_bytes = arrival;
        match extract(c, limits, arrival, stats, on) {
            After::Keep => {}
            other => return other,
        }
    }
    After::Keep
}

/// Hands over the complete frames in `c.buf[c.start..c.end]`.
fn extract(
    c: &mut Connection,
    limits: &Limits,
    arrival: Instant,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    while c.end - c.start >= HEADER_LEN {
        let total = match frame::peek_header(&c.buf[c.start..c.end]) {
            Ok(h) if HEADER_LEN + h.payload_len.get() as usize > limits.max_frame_bytes => {
                stats.malformed += 1;
                let total = HEADER_LEN + h.payload_len.get() as usize;
                let flow = on(
                    Received::Malformed {
                        reason: "too_large",
                        detail: format!(
                            "TCP stream from {} announces a {total}-byte frame, over this input's max_frame_bytes = {}; closing the connection",
                            c.peer, limits.max_frame_bytes
                        ),
                    },
                    arrival,
                );
                return if flow.is_break() {
                    After::Break
                } else {
                    After::Close
                };
            }
            Ok(h) => HEADER_LEN + h.payload_len.get() as usize,
            Err(e) => {
                stats.malformed += 1;
                let flow = on(
                    Received::Malformed {
                        reason: e.reason(),
                        detail: format!(
                            "TCP stream from {} lost sync: {e}; closing the connection",
                            c.peer
                        ),
                    },
                    arrival,
                );
                return if flow.is_break() {
                    After::Break
                } else {
                    After::Close
                };
            }
        };
        if c.end - c.start < total {
            // Not all there yet. Make room after the partial frame by moving it to the
            // front; service() grows the buffer only when its bytes fill it.
            if c.start + total > c.buf.len() && c.start > 0 {
                c.buf.copy_within(c.start..c.end, 0);
                c.end -= c.start;
                c.start = 0;
            }
            return After::Keep;
        }
        stats.frames += 1;
        stats.bytes += total as u64;
        let flow = on(Received::Frame(&c.buf[c.start..c.start + total]), arrival);
        c.start += total;
        if flow.is_break() {
            return After::Break;
        }
    }
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
    }
    After::Keep
}

fn closed(
    c: &mut Connection,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    let pending = c.end - c.start;
    if pending == 0 {
        return After::Close;
    }
    stats.malformed += 1;
    let expected = if pending >= HEADER_LEN {
        frame::peek_header(&c.buf[c.start..c.end])
            .map(|h| format!("a {}-byte frame", HEADER_LEN + h.payload_len.get() as usize))
            .unwrap_or_else(|_| "a frame".into())
    } else {
        "a frame header".into()
    };
    let flow = on(
        Received::Malformed {
            reason: REASON_TRUNCATED,
            detail: format!(
                "TCP connection from {} closed {pending} bytes into {expected}",
                c.peer
            ),
        },
        Instant::now(),
    );
    if flow.is_break() {
        After::Break
    } else {
        After::Close
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_hit_event, HitRecord, Stamp};
    use crate::sources::Endpoint;
    use std::io::{Read, Write};
    use std::time::Duration;

    fn hit_frame(source_id: u32, seq: u64, n: usize) -> Vec<u8> {
        let hits = vec![
            HitRecord {
                x_mm: 1.0,
                y_mm: 2.0,
                z_mm: 3.0,
                plane: 1,
                hit_id: 5
            };
            n
        ];
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            Stamp {
                source_id,
                sequence: seq,
                timestamp_ns: seq,
            },
            &hits,
        );
        b
    }

    #[derive(Debug, PartialEq)]
    enum Got {
        Frame(Vec<u8>),
        Malformed(&'static str),
        Refused(&'static str),
    }

    /// Sets the flag when dropped, so a failing test stops the source thread instead of
    /// hanging the scope that waits for it.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Runs a TCP source on a loopback port while `drive` talks to it, then stops it.
    fn with_source(drive: impl FnOnce(SocketAddr)) -> (Vec<Got>, SourceStats) {
        with_limited_source(&Limits::default(), drive)
    }

    /// [`with_source`] within `limits`.
    fn with_limited_source(
        limits: &Limits,
        drive: impl FnOnce(SocketAddr),
    ) -> (Vec<Got>, SourceStats) {
        let bound = "tcp://127.0.0.1:0"
            .parse::<Endpoint>()
            .unwrap()
            .bind()
            .unwrap();
        let addr = bound.local_addr().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let rx = s.spawn(|| {
                let mut got = Vec::new();
                let stats = bound
                    .run_limited(limits, &stop, |r, _| {
                        got.push(match r {
                            Received::Frame(b) => Got::Frame(b.to_vec()),
                            Received::Malformed { reason, .. } => Got::Malformed(reason),
                            Received::Refused { reason, .. } => Got::Refused(reason),
                            Received::Lost { .. } => panic!("TCP never reports lost samples"),
                        });
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                (got, stats)
            });
            let _stop_on_panic = StopOnDrop(&stop);
            drive(addr);
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
            rx.join().unwrap()
        })
    }

    #[test]
    fn frames_split_across_writes_and_larger_than_the_buffer_arrive_whole() {
        let frames: Vec<Vec<u8>> = vec![
            hit_frame(1, 0, 0),
            hit_frame(1, 1, 3),
            hit_frame(1, 2, 20_000), // 400 kB: larger than the starting buffer
            hit_frame(1, 3, 1),
        ];
        let stream: Vec<u8> = frames.concat();
        let (got, stats) = with_source(|addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            // Awkward write sizes so headers and payloads are cut everywhere.
            for chunk in stream.chunks(7_777) {
                s.write_all(chunk).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let want: Vec<Got> = frames.into_iter().map(Got::Frame).collect();
        assert_eq!(got, want);
        assert_eq!(
            (stats.frames, stats.malformed, stats.connections),
            (4, 0, 1)
        );
    }

    #[test]
    fn several_connections_feed_one_closure() {
        let (got, stats) = with_source(|addr| {
            let mut a = TcpStream::connect(addr).unwrap();
            let mut b = TcpStream::connect(addr).unwrap();
            for seq in 0..50 {
                a.write_all(&hit_frame(1, seq, 2)).unwrap();
                b.write_all(&hit_frame(2, seq, 3)).unwrap();
            }
        });
        assert_eq!(stats.connections, 2);
        for src in [1u32, 2] {
            let seqs: Vec<u64> = got
                .iter()
                .filter_map(|g| match g {
                    Got::Frame(b) => {
                        let v = frame::parse(b).unwrap();
                        (v.source_id() == src).then_some(v.sequence())
                    }
                    Got::Malformed(r) | Got::Refused(r) => panic!("unexpected {r}"),
                })
                .collect();
            assert_eq!(seqs, (0..50).collect::<Vec<_>>(), "source {src}");
        }
    }

    #[test]
    fn lost_sync_closes_only_that_connection() {
        let (got, stats) = with_source(|addr| {
            let mut bad = TcpStream::connect(addr).unwrap();
            let mut good = TcpStream::connect(addr).unwrap();
            bad.write_all(&hit_frame(1, 0, 1)).unwrap();
            let mut junk = hit_frame(1, 1, 1);
            junk[0] = b'X';
            bad.write_all(&junk).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            // The server closed `bad`; `good` still works.
            good.write_all(&hit_frame(2, 0, 1)).unwrap();
        });
        assert_eq!(
            got,
            vec![
                Got::Frame(hit_frame(1, 0, 1)),
                Got::Malformed("bad_magic"),
                Got::Frame(hit_frame(2, 0, 1)),
            ]
        );
        assert_eq!((stats.frames, stats.malformed), (2, 1));
    }

    #[test]
    fn oversized_header_is_refused_before_any_allocation() {
        let (got, _) = with_source(|addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut f = hit_frame(1, 0, 1);
            f[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // payload_len
            s.write_all(&f[..HEADER_LEN]).unwrap();
        });
        assert_eq!(got, vec![Got::Malformed("too_large")]);
    }

    #[test]
    fn connection_closed_mid_frame_is_truncated() {
        for cut in [5, HEADER_LEN, HEADER_LEN + 3] {
            let (got, stats) = with_source(|addr| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&hit_frame(1, 0, 2)).unwrap();
                s.write_all(&hit_frame(1, 1, 2)[..cut]).unwrap();
            });
            assert_eq!(
                got,
                vec![
                    Got::Frame(hit_frame(1, 0, 2)),
                    Got::Malformed(REASON_TRUNCATED)
                ],
                "cut at {cut}"
            );
            assert_eq!(stats.malformed, 1);
        }
    }

    /// A client socket bound to `from` (any address of 127/8 is this host), connected to `to`.
    fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
        let sock = socket2_free_connect(from, to);
        sock.set_nodelay(true).unwrap();
        sock
    }

    /// `connect(2)` from a chosen local address without an extra crate.
    fn socket2_free_connect(from: &str, to: SocketAddr) -> TcpStream {
        use std::os::fd::FromRawFd;
        let from: std::net::Ipv4Addr = from.parse().unwrap();
        let SocketAddr::V4(to) = to else {
            panic!("IPv4 only")
        };
        let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: plain socket calls on a descriptor this function owns; the addresses are
        // live sockaddr_in values of the length passed.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let local = sin(from, 0);
            assert_eq!(
                libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len),
                0
            );
            let remote = sin(*to.ip(), to.port());
            assert_eq!(
                libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len),
                0,
                "{}",
                io::Error::last_os_error()
            );
            TcpStream::from_raw_fd(fd)
        }
    }

    /// The server closed the connection: a read sees EOF or a reset.
    fn closed_by_server(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        matches!(s.read(&mut b), Ok(0) | Err(_))
    }

    #[test]
    fn senders_outside_the_allowlist_are_refused_and_never_framed() {
        let limits = Limits {
            allow: vec!["127.0.0.1/32".parse().unwrap()],
            ..Limits::default()
        };
        let (got, stats) = with_limited_source(&limits, |addr| {
            let mut other = connect_from("127.0.0.2", addr);
            let _ = other.write_all(&hit_frame(9, 0, 1));
            assert!(closed_by_server(&mut other), "refused connection left open");
            let mut ok = connect_from("127.0.0.1", addr);
            ok.write_all(&hit_frame(1, 0, 1)).unwrap();
        });
        assert_eq!(
            got,
            vec![
                Got::Refused(REFUSED_NOT_ALLOWED),
                Got::Frame(hit_frame(1, 0, 1))
            ]
        );
        assert_eq!((stats.refused, stats.connections, stats.frames), (1, 1, 1));
    }

    #[test]
    fn connections_beyond_the_limit_are_refused() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let (got, stats) = with_limited_source(&limits, |addr| {
            let mut a = TcpStream::connect(addr).unwrap();
            let mut b = TcpStream::connect(addr).unwrap();
            a.write_all(&hit_frame(1, 0, 1)).unwrap();
            b.write_all(&hit_frame(2, 0, 1)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let mut c = TcpStream::connect(addr).unwrap();
            assert!(closed_by_server(&mut c), "third connection left open");
        });
        let refused: Vec<&Got> = got
            .iter()
            .filter(|g| matches!(g, Got::Refused(_)))
            .collect();
        assert_eq!(refused, vec![&Got::Refused(REFUSED_TOO_MANY)]);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((stats.connections, stats.connections_refused), (2, 1));
    }

    #[test]
    fn a_huge_announced_frame_that_stalls_is_closed_and_costs_only_what_arrived() {
        let limits = Limits {
            stall_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let sent = 600_000;
        let (got, stats) = with_limited_source(&limits, |addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            // A header announcing the largest frame there is, then a part of it, then silence.
            let mut f = hit_frame(1, 0, 1);
            let payload = (crate::frame::MAX_FRAME_LEN - HEADER_LEN) as u32;
            f[12..16].copy_from_slice(&payload.to_le_bytes());
            s.write_all(&f[..HEADER_LEN]).unwrap();
            s.write_all(&vec![0u8; sent - HEADER_LEN]).unwrap();
            let t = Instant::now();
            assert!(closed_by_server(&mut s), "stalled connection left open");
            let waited = t.elapsed();
            assert!(
                waited >= Duration::from_millis(200) && waited < Duration::from_secs(3),
                "closed after {waited:?}"
            );
        });
        assert_eq!(got, vec![Got::Refused(REFUSED_STALLED)]);
        assert_eq!(stats.frames, 0);
        assert!(
            stats.buffer_bytes_max <= 2 * sent,
            "a 16 MiB announcement cost {} bytes for {sent} received",
            stats.buffer_bytes_max
        );
    }

    #[test]
    fn a_frame_over_the_input_limit_is_too_large_and_closes_the_connection() {
        let limits = Limits {
            max_frame_bytes: 1000,
            ..Limits::default()
        };
        let (got, stats) = with_limited_source(&limits, |addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&hit_frame(1, 0, 2)).unwrap();
            s.write_all(&hit_frame(1, 1, 100)).unwrap(); // 2,040 bytes
            assert!(closed_by_server(&mut s));
        });
        assert_eq!(
            got,
            vec![Got::Frame(hit_frame(1, 0, 2)), Got::Malformed("too_large")]
        );
        assert!(stats.buffer_bytes_max <= 1000, "{}", stats.buffer_bytes_max);
    }

    #[test]
    fn an_idle_connection_is_closed() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let (got, _) = with_limited_source(&limits, |addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&hit_frame(1, 0, 2)).unwrap();
            assert!(closed_by_server(&mut s));
        });
        assert_eq!(
            got,
            vec![Got::Frame(hit_frame(1, 0, 2)), Got::Refused(REFUSED_IDLE)]
        );
    }
}
