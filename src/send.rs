//! `trigd send`: plays a recording to a daemon the way acquisition hardware would, one UDP
//! datagram per frame or frames back to back on a TCP connection, either as fast as the
//! network takes them or at a fixed rate on an absolute schedule (frame `i` leaves at
//! `t0 + i / rate`, so pacing errors never accumulate: a late frame does not delay the next
//! one's slot). Waiting sleeps while the slot is far and spins for the last stretch, which
//! keeps sends within microseconds of their slot at the cost of one busy core.

use std::io::{self, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::recording::Recording;
use crate::sources::Endpoint;

/// Largest UDP payload over IPv4 (65,535 minus the IP and UDP headers).
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Below this much time before a slot, stop sleeping and spin (OS sleeps overshoot by tens
/// of microseconds).
const SPIN_WINDOW: Duration = Duration::from_micros(200);
/// Longest single sleep, so the stop flag is seen promptly at low rates.
const MAX_SLEEP: Duration = Duration::from_millis(50);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("frame {index} is {len_bytes} bytes, more than fits in one UDP datagram ({MAX_UDP_PAYLOAD} bytes); send this recording over tcp:// instead")]
    TooLargeForUdp { index: usize, len_bytes: usize },
    #[error("rate {0} Hz is not a positive, finite number of frames per second")]
    BadRate(f64),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> SendError {
    let context = context.into();
    move |source| SendError::Io { context, source }
}

/// What a send did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendSummary {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    /// From the first frame's slot to the last send.
    pub elapsed: Duration,
    /// Latest any frame left after its slot (0 when unpaced).
    pub late_max_ns: u64,
    /// UDP sends the receiver's host answered with "port unreachable" (nobody listening);
    /// the frames are lost, as they would be from hardware.
    pub udp_refused: u64,
    /// The stop flag ended the send before the last frame.
    pub stopped_early: bool,
}

impl SendSummary {
    /// Achieved frames per second.
    pub fn rate_hz(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.frames_sent as f64 / s
        } else {
            0.0
        }
    }
}

/// Sends every frame of `rec` to `to`, at `rate_hz` frames per second or as fast as
/// possible (`None`), until done or `stop` is set. UDP frames larger than
/// [`MAX_UDP_PAYLOAD`] are refused before anything is sent.
pub fn send(
    rec: &Recording,
    to: &Endpoint,
    rate_hz: Option<f64>,
    stop: &AtomicBool,
) -> Result<SendSummary, SendError> {
    if let Some(r) = rate_hz {
        if !(r.is_finite() && r > 0.0) {
            return Err(SendError::BadRate(r));
        }
    }
    let pacer = rate_hz.map(Pacer::new);
    match to {
        Endpoint::Udp(addr) => send_udp(rec, *addr, pacer, stop),
        Endpoint::Tcp(addr) => send_tcp(rec, *addr, pacer, stop),
    }
}

/// The absolute schedule: slot `i` is `t0 + i * period`.
#[derive(Debug, Clone, Copy)]
struct Pacer {
    period_ns: f64,
}

impl Pacer {
    fn new(rate_hz: f64) -> Self {
        Self {
            period_ns: 1e9 / rate_hz,
        }
    }

    fn slot(&self, t0: Instant, i: u64) -> Instant {
        t0 + Duration::from_nanos((i as f64 * self.period_ns).round() as u64)
    }
}

/// Waits until `due`; returns how late it woke, or `None` if `stop` was set meanwhile.
fn wait_until(due: Instant, stop: &AtomicBool) -> Option<Duration> {
    loop {
        let now = Instant::now();
        if now >= due {
            return Some(now - due);
        }
        let left = due - now;
        if left > SPIN_WINDOW {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep((left - SPIN_WINDOW).min(MAX_SLEEP));
        } else {
            std::hint::spin_loop();
        }
    }
}

struct Progress {
    t0: Instant,
    summary: SendSummary,
}

impl Progress {
    fn new() -> Self {
        Self {
            t0: Instant::now(),
            summary: SendSummary {
                frames_sent: 0,
                bytes_sent: 0,
                elapsed: Duration::ZERO,
                late_max_ns: 0,
                udp_refused: 0,
                stopped_early: false,
            },
        }
    }

    /// Waits for frame `i`'s slot; `false` when the send must stop.
    fn before(&mut self, i: usize, pacer: Option<Pacer>, stop: &AtomicBool) -> bool {
        if stop.load(Ordering::Relaxed) {
            self.summary.stopped_early = true;
            return false;
        }
        if let Some(p) = pacer {
            match wait_until(p.slot(self.t0, i as u64), stop) {
                Some(late) => {
                    self.summary.late_max_ns = self.summary.late_max_ns.max(late.as_nanos() as u64)
                }
                None => {
                    self.summary.stopped_early = true;
                    return false;
                }
            }
        }
        true
    }

    fn sent(&mut self, len: usize) {
        self.summary.frames_sent += 1;
        self.summary.bytes_sent += len as u64;
    }

    fn done(mut self) -> SendSummary {
        self.summary.elapsed = self.t0.elapsed();
        self.summary
    }
}

fn send_udp(
    rec: &Recording,
    to: SocketAddr,
    pacer: Option<Pacer>,
    stop: &AtomicBool,
) -> Result<SendSummary, SendError> {
    if let Some(index) = (0..rec.len()).find(|&i| rec.entry(i).len_bytes as usize > MAX_UDP_PAYLOAD)
    {
        return Err(SendError::TooLargeForUdp {
            index,
            len_bytes: rec.entry(index).len_bytes as usize,
        });
    }
    let local: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal address")
    } else {
        "[::]:0".parse().expect("literal address")
    };
    let socket = UdpSocket::bind(local).map_err(io_err("binding a UDP socket to send from"))?;
    socket
        .connect(to)
        .map_err(io_err(format!("connecting the UDP socket to {to}")))?;
    let mut p = Progress::new();
    for (i, frame) in rec.iter().enumerate() {
        if !p.before(i, pacer, stop) {
            break;
        }
        loop {
            match socket.send(frame) {
                Ok(_) => {
                    p.sent(frame.len());
                    break;
                }
                // An ICMP "port unreachable" from an earlier datagram: reported on this
                // send, which itself did not go out. Count it and send again.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    p.summary.udp_refused += 1;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(format!("sending frame {i} to udp://{to}"))(e)),
            }
        }
    }
    Ok(p.done())
}

fn send_tcp(
    rec: &Recording,
    to: SocketAddr,
    pacer: Option<Pacer>,
    stop: &AtomicBool,
) -> Result<SendSummary, SendError> {
    let stream = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)
        .map_err(io_err(format!("connecting to tcp://{to}")))?;
    stream
        .set_nodelay(true)
        .map_err(io_err("setting TCP_NODELAY"))?;
    // Paced frames go out one write each, on their slot; unpaced ones are batched.
    let capacity = if pacer.is_some() { 0 } else { 256 << 10 };
    let mut out = BufWriter::with_capacity(capacity, &stream);
    let mut p = Progress::new();
    for (i, frame) in rec.iter().enumerate() {
        if !p.before(i, pacer, stop) {
            break;
        }
        out.write_all(frame)
            .map_err(io_err(format!("sending frame {i} to tcp://{to}")))?;
        p.sent(frame.len());
    }
    out.flush()
        .map_err(io_err(format!("sending to tcp://{to}")))?;
    drop(out);
    // Half-close so the daemon reads everything up to a clean end of stream.
    stream
        .shutdown(Shutdown::Write)
        .map_err(io_err(format!("closing the connection to tcp://{to}")))?;
    Ok(p.done())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_hit_event, HitRecord, Stamp};
    use crate::recording::{FsyncPolicy, RecordingWriter};
    use crate::sources::Received;
    use std::ops::ControlFlow;

    fn recording(n: usize, hits: usize) -> Recording {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.trgd");
        let mut w = RecordingWriter::create(&path, FsyncPolicy::Never).unwrap();
        for seq in 0..n as u64 {
            let hs = vec![
                HitRecord {
                    x_mm: 1.0,
                    y_mm: 2.0,
                    z_mm: 3.0,
                    plane: 1,
                    hit_id: 5
                };
                hits
            ];
            let mut b = Vec::new();
            encode_hit_event(
                &mut b,
                Stamp {
                    source_id: 4,
                    sequence: seq,
                    timestamp_ns: seq * 1000,
                },
                &hs,
            );
            w.append(&b).unwrap();
        }
        w.finish().unwrap();
        Recording::open(&path).unwrap()
    }

    /// Sends `rec` to a fresh source on `scheme` and returns the arrival times of the frames
    /// received (checked equal to the recording's frames, in order).
    fn send_and_receive(
        rec: &Recording,
        scheme: &str,
        rate_hz: Option<f64>,
    ) -> (SendSummary, Vec<Instant>) {
        let bound = format!("{scheme}://127.0.0.1:0")
            .parse::<Endpoint>()
            .unwrap()
            .bind()
            .unwrap();
        let to = bound.endpoint().unwrap();
        let stop_rx = AtomicBool::new(false);
        std::thread::scope(|s| {
            let rx = s.spawn(|| {
                let mut got = Vec::new();
                bound
                    .run(&stop_rx, |r, at| {
                        let Received::Frame(b) = r else {
                            panic!("malformed: {r:?}")
                        };
                        got.push((b.to_vec(), at));
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                got
            });
            let summary = send(rec, &to, rate_hz, &AtomicBool::new(false));
            std::thread::sleep(Duration::from_millis(200));
            stop_rx.store(true, Ordering::Relaxed);
            let got = rx.join().unwrap();
            let summary = summary.unwrap();
            assert_eq!(got.len(), rec.len(), "{scheme}");
            for (i, (b, _)) in got.iter().enumerate() {
                assert_eq!(&b[..], rec.frame(i));
            }
            (summary, got.into_iter().map(|(_, at)| at).collect())
        })
    }

    #[test]
    fn udp_and_tcp_deliver_every_frame_in_order() {
        for scheme in ["udp", "tcp"] {
            // Unpaced UDP could overrun the receiver's socket buffer on a loaded machine
            // (that is UDP); 5 kHz keeps loopback lossless while exercising the pacer.
            let (n, rate) = if scheme == "udp" {
                (100, Some(5_000.0))
            } else {
                (500, None)
            };
            let rec = recording(n, 3);
            let (s, _) = send_and_receive(&rec, scheme, rate);
            assert_eq!(s.frames_sent, n as u64);
            assert_eq!(
                s.bytes_sent,
                rec.iter().map(|f| f.len() as u64).sum::<u64>()
            );
            assert!(!s.stopped_early);
        }
    }

    #[test]
    fn pacing_follows_an_absolute_schedule() {
        let rec = recording(101, 1);
        let started = Instant::now();
        let (s, arrivals) = send_and_receive(&rec, "udp", Some(1_000.0));
        // Frame 100's slot is 100 ms after the first: it cannot arrive earlier, however the
        // receiving thread is scheduled (its arrival times alone bound nothing: a late
        // receiver reads a burst).
        let last = *arrivals.last().unwrap();
        assert!(
            last - started >= Duration::from_millis(100),
            "{:?}",
            last - started
        );
        assert!(s.elapsed >= Duration::from_millis(100), "{:?}", s.elapsed);
        // No drift: the last send left at its slot plus at most the latest wake-up, so the
        // per-send overheads did not add up. The slack covers one send and the summary,
        // not 100 frames' overheads.
        let bound = Duration::from_millis(100) + Duration::from_nanos(s.late_max_ns);
        assert!(
            s.elapsed < bound + Duration::from_millis(100),
            "{:?} against {bound:?}",
            s.elapsed
        );
    }

    #[test]
    fn the_schedule_does_not_accumulate_rounding() {
        // 3 kHz: a period of 333,333.33 ns. Slot i is rounded from i * period, never the
        // sum of i rounded periods.
        let p = Pacer::new(3_000.0);
        let t0 = Instant::now();
        assert_eq!(p.slot(t0, 3_000) - t0, Duration::from_secs(1));
        assert_eq!(p.slot(t0, 1) - t0, Duration::from_nanos(333_333));
        assert_eq!(p.slot(t0, 2) - t0, Duration::from_nanos(666_667));
    }

    #[test]
    fn udp_refuses_frames_that_do_not_fit_a_datagram() {
        let rec = recording(2, 4_000); // 80 kB frames
        let to: Endpoint = "udp://127.0.0.1:9".parse().unwrap();
        let e = send(&rec, &to, None, &AtomicBool::new(false)).unwrap_err();
        assert!(
            matches!(e, SendError::TooLargeForUdp { index: 0, len_bytes } if len_bytes > MAX_UDP_PAYLOAD)
        );
        assert!(e.to_string().contains("tcp://"));
    }

    #[test]
    fn bad_rates_and_unreachable_daemons_are_clear_errors() {
        let rec = recording(1, 1);
        let to: Endpoint = "udp://127.0.0.1:9".parse().unwrap();
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                send(&rec, &to, Some(r), &AtomicBool::new(false)),
                Err(SendError::BadRate(_))
            ));
        }
        // A port nobody listens on (bound then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = send(&rec, &Endpoint::Tcp(port), None, &AtomicBool::new(false)).unwrap_err();
        assert!(e.to_string().contains("connecting to tcp://"), "{e}");
    }

    #[test]
    fn stop_flag_ends_a_paced_send() {
        let rec = recording(10, 1);
        let to: Endpoint = "udp://127.0.0.1:9".parse().unwrap();
        let stop = AtomicBool::new(true);
        let s = send(&rec, &to, Some(1.0), &stop).unwrap();
        assert!(s.stopped_early);
        assert_eq!(s.frames_sent, 0);
    }
}
