//! TCP source: frames back to back on a byte stream, each delimited by its header's
//! `payload_len`. One thread serves the listener and up to [`MAX_TCP_CONNECTIONS`]
//! connections with `poll(2)`, so every frame, whichever connection it came on, goes to the
//! same `FnMut` closure without locks or copies.
//!
//! Per connection there is one receive buffer (256 KiB to start, grown once to the largest
//! frame seen, never beyond `MAX_FRAME_LEN`); reads fill it with as many frames as the
//! kernel has, and each complete frame is handed over as a slice of it. If a header fails
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

use super::{Received, SourceStats, POLL_INTERVAL, REASON_TRUNCATED};
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
    mut on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> io::Result<SourceStats> {
    listener.set_nonblocking(true)?;
    let mut conns: Vec<Connection> = Vec::with_capacity(MAX_TCP_CONNECTIONS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_TCP_CONNECTIONS + 1);
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
        if ready == 0 {
            continue;
        }
        // Connections first, in reverse so swap_remove keeps the fds/conns pairing valid.
        for i in (0..conns.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match service(&mut conns[i], &mut stats, &mut on) {
                After::Keep => {}
                After::Close => {
                    let c = conns.swap_remove(i);
                    tracing::debug!(peer = %c.peer, "TCP connection closed");
                }
                After::Break => return Ok(stats),
            }
        }
        if fds[0].revents != 0 {
            accept_all(listener, &mut conns, &mut stats);
        }
    }
    Ok(stats)
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn accept_all(listener: &TcpListener, conns: &mut Vec<Connection>, stats: &mut SourceStats) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                if conns.len() >= MAX_TCP_CONNECTIONS {
                    stats.connections_refused += 1;
                    tracing::warn!(%peer, "refusing TCP connection: {MAX_TCP_CONNECTIONS} already open");
                    continue;
                }
                if let Err(e) = stream.set_nonblocking(true) {
                    tracing::warn!(%peer, error = %e, "dropping TCP connection");
                    continue;
                }
                stats.connections += 1;
                tracing::debug!(%peer, "TCP connection accepted");
                conns.push(Connection {
                    stream,
                    peer,
                    buf: vec![0; CONN_BUFFER_BYTES],
                    start: 0,
                    end: 0,
                });
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock => return,
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                _ => {
                    // Out of file descriptors and the like: keep serving what is open.
                    tracing::warn!(error = %e, "accepting a TCP connection failed");
                    return;
                }
            },
        }
    }
}

/// Reads what `c` has ready and hands over every complete frame.
fn service(
    c: &mut Connection,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    for _ in 0..READS_PER_ROUND {
        if c.end == c.buf.len() {
            // No room left: move the partial frame to the front (extract() has grown the
            // buffer to fit it whole).
            c.buf.copy_within(c.start..c.end, 0);
            c.end -= c.start;
            c.start = 0;
            if c.end == c.buf.len() {
                // Not reached (extract() leaves room for the pending frame), but a full
                // buffer must never be read into: a 0-byte read would look like EOF.
                c.buf.resize(c.buf.len() * 2, 0);
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
        match extract(c, arrival, stats, on) {
            After::Keep => {}
            other => return other,
        }
    }
    After::Keep
}

/// Hands over the complete frames in `c.buf[c.start..c.end]`.
fn extract(
    c: &mut Connection,
    arrival: Instant,
    stats: &mut SourceStats,
    on: &mut impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> After {
    while c.end - c.start >= HEADER_LEN {
        let total = match frame::peek_header(&c.buf[c.start..c.end]) {
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
            // peek_header bounded `total` by MAX_FRAME_LEN: growing here is bounded too.
            if total > c.buf.len() {
                c.buf.resize(total, 0);
            }
            if c.start + total > c.buf.len() {
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
    use std::io::Write;
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
                    .run(&stop, |r, _| {
                        got.push(match r {
                            Received::Frame(b) => Got::Frame(b.to_vec()),
                            Received::Malformed { reason, .. } => Got::Malformed(reason),
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
                    Got::Malformed(r) => panic!("unexpected {r}"),
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
}
