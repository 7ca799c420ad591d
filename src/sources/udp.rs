//! UDP source: one datagram is one frame. The receive buffer (64 KiB, larger than any UDP
//! datagram) is allocated once; each datagram is handed to the caller as a borrowed slice
//! with the time it was taken from the socket.

use std::io;
use std::net::UdpSocket;
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::limits::REFUSED_NOT_ALLOWED;
use super::{Limits, Received, SourceStats, POLL_INTERVAL};

/// Size of the datagram buffer: above the 65,507-byte UDP payload limit, so no datagram is
/// ever cut short.
pub const UDP_BUFFER_BYTES: usize = 64 << 10;

/// Kernel receive buffer asked for on bind. At 100 kHz of 1 kB frames this holds about
/// 80 ms of traffic, enough to ride out a stalled consumer thread.
pub const RECV_BUFFER_BYTES: usize = 8 << 20;

/// Receives datagrams on `socket` until `stop` is set or `on` returns `Break`. Sets the
/// socket's read timeout to [`POLL_INTERVAL`] so the flag is looked at regularly. Every
/// datagram is passed as [`Received::Frame`]; framing errors cannot occur on UDP, and
/// validation is left to the caller. ICMP errors reported on the socket (from earlier
/// sends on it) are ignored.
pub fn run_udp(
    socket: &UdpSocket,
    stop: &AtomicBool,
    on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> io::Result<SourceStats> {
    run_udp_limited(socket, &Limits::default(), stop, on)
}

/// [`run_udp`] for the senders `limits` allows: a datagram from any other address is
/// handed over as [`Received::Refused`] (without its bytes) and is not a frame.
pub fn run_udp_limited(
    socket: &UdpSocket,
    limits: &Limits,
    stop: &AtomicBool,
    mut on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
) -> io::Result<SourceStats> {
    socket.set_read_timeout(Some(POLL_INTERVAL))?;
    let mut buf = vec![0u8; UDP_BUFFER_BYTES];
    let mut stats = SourceStats::default();
    while !stop.load(Ordering::Relaxed) {
        match socket.recv_from(&mut buf) {
            Ok((_, peer)) if !limits.allows(peer.ip()) => {
                stats.refused += 1;
                let refused = Received::Refused {
                    reason: REFUSED_NOT_ALLOWED,
                    peer,
                };
                if on(refused, Instant::now()).is_break() {
                    break;
                }
            }
            Ok((n, _peer)) => {
                let arrival = Instant::now();
                stats.frames += 1;
                stats.bytes += n as u64;
                if on(Received::Frame(&buf[..n]), arrival).is_break() {
                    break;
                }
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted
                | io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset => {}
                _ => return Err(e),
            },
        }
    }
    Ok(stats)
}

/// Asks for a [`RECV_BUFFER_BYTES`] kernel receive buffer; best effort (the kernel caps it
/// at `net.core.rmem_max`), logs the size obtained.
pub(crate) fn enlarge_recv_buffer(socket: &UdpSocket) {
    let fd = socket.as_raw_fd();
    let want = RECV_BUFFER_BYTES as libc::c_int;
    let mut got: libc::c_int = 0;
    let mut got_len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd is a valid socket owned by `socket` for the duration of the calls; the
    // option values point at live c_ints of the sizes passed.
    let (set, get) = unsafe {
        (
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&want as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ),
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&mut got as *mut libc::c_int).cast(),
                &mut got_len,
            ),
        )
    };
    if set != 0 || get != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "could not enlarge the UDP receive buffer");
    } else {
        tracing::debug!(
            requested_bytes = want,
            granted_bytes = got,
            "UDP receive buffer"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_hit_event, HitRecord, Stamp};
    use crate::sources::Endpoint;
    use std::time::Duration;

    #[test]
    fn datagrams_arrive_whole_and_stop_is_prompt() {
        let bound = "udp://127.0.0.1:0"
            .parse::<Endpoint>()
            .unwrap()
            .bind()
            .unwrap();
        let to = bound.local_addr().unwrap();
        let stop = AtomicBool::new(false);
        let mut frames = Vec::new();
        for seq in 0..20u64 {
            let mut b = Vec::new();
            let hits = vec![
                HitRecord {
                    x_mm: 1.0,
                    y_mm: 2.0,
                    z_mm: 3.0,
                    plane: 1,
                    hit_id: 5
                };
                seq as usize
            ];
            encode_hit_event(
                &mut b,
                Stamp {
                    source_id: 1,
                    sequence: seq,
                    timestamp_ns: seq,
                },
                &hits,
            );
            frames.push(b);
        }
        let mut big = vec![0xabu8; 60_000];
        big[..4].copy_from_slice(b"junk");
        std::thread::scope(|s| {
            let rx = s.spawn(|| {
                let mut got: Vec<Vec<u8>> = Vec::new();
                let stats = bound
                    .run(&stop, |r, _at| {
                        let Received::Frame(b) = r else {
                            panic!("UDP never reports malformed")
                        };
                        got.push(b.to_vec());
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                (got, stats)
            });
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for f in &frames {
                tx.send_to(f, to).unwrap();
            }
            tx.send_to(&big, to).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            stop.store(true, Ordering::Relaxed);
            let (got, stats) = rx.join().unwrap();
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "stop took {:?}",
                t.elapsed()
            );
            assert_eq!(got.len(), 21);
            assert_eq!(&got[..20], &frames[..]);
            assert_eq!(got[20], big);
            assert_eq!(stats.frames, 21);
            assert_eq!(
                stats.bytes,
                frames.iter().map(|f| f.len() as u64).sum::<u64>() + 60_000
            );
        });
    }

    #[test]
    fn break_from_the_closure_stops_the_source() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sock.local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            tx.send_to(b"x", to).unwrap();
        }
        let stop = AtomicBool::new(false);
        let stats = run_udp(&sock, &stop, |_, _| ControlFlow::Break(())).unwrap();
        assert_eq!(stats.frames, 1);
    }

    #[test]
    fn datagrams_from_outside_the_allowlist_are_refused_and_never_framed() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sock.local_addr().unwrap();
        let limits = Limits {
            allow: vec!["127.0.0.1/32".parse().unwrap()],
            ..Limits::default()
        };
        let other = UdpSocket::bind("127.0.0.2:0").unwrap();
        let allowed = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..5u8 {
            other.send_to(&[i; 64], to).unwrap();
            allowed.send_to(&[100 + i; 64], to).unwrap();
        }
        let stop = AtomicBool::new(false);
        let mut frames = Vec::new();
        let mut refused = Vec::new();
        let stats = run_udp_limited(&sock, &limits, &stop, |r, _| {
            match r {
                Received::Frame(b) => frames.push(b[0]),
                Received::Refused { reason, peer } => refused.push((reason, peer)),
                Received::Malformed { .. } | Received::Lost { .. } => {
                    panic!("UDP never reports malformed or lost")
                }
            }
            if frames.len() + refused.len() == 10 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert_eq!(frames, vec![100, 101, 102, 103, 104]);
        assert_eq!(refused.len(), 5);
        assert!(refused
            .iter()
            .all(|(r, p)| *r == REFUSED_NOT_ALLOWED && p.ip().to_string() == "127.0.0.2"));
        assert_eq!((stats.frames, stats.refused), (5, 5));
    }
}
