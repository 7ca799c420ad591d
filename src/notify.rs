//! systemd's readiness and watchdog protocol (`sd_notify(3)`), spoken by `trigd run` when
//! systemd starts it with `Type=notify`: `READY=1` once the inputs are bound and the
//! backends are built (the GPU's context made and its kernels compiled), `STATUS=` lines
//! with the rates and the active backend, `STOPPING=1` when the drain begins, and
//! `WATCHDOG=1` from the decision thread only while the pipeline makes progress
//! ([`Watchdog`]).
//!
//! The protocol is one datagram per message on the `AF_UNIX` socket named by
//! `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`); the watchdog
//! period is `$WATCHDOG_USEC`, for the process `$WATCHDOG_PID` if that is set. Without
//! `$NOTIFY_SOCKET` nothing is sent and nothing costs anything.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// `$WATCHDOG_USEC`: the manager restarts the service when no `WATCHDOG=1` came for
    /// this long.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier systemd asked for through the environment, if any. A socket named but
    /// unusable is an error: a unit with `Type=notify` would otherwise time out at start
    /// without a word.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let path = path.to_string_lossy().into_owned();
        if path.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is set but empty: unset it, or name the manager's socket",
            ));
        }
        let watchdog = watchdog_from_env(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Notifier::connect(&path, watchdog).map(Some)
    }

    /// A notifier sending to `path` (a socket path, or `@name` for an abstract socket).
    pub fn connect(path: &str, watchdog: Option<Duration>) -> io::Result<Notifier> {
        let addr = match path.strip_prefix('@') {
            Some(name) => abstract_addr(name)?,
            None => SocketAddr::from_pathname(path)?,
        };
        let sock = UnixDatagram::unbound()?;
        Ok(Notifier {
            sock,
            addr,
            watchdog,
        })
    }

    /// The watchdog period systemd enforces, if it enforces one.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends one message (`KEY=value` lines). A failure is returned, never retried: the
    /// manager may have gone away, which does not stop the pipeline.
    pub fn send(&self, message: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(message.as_bytes(), &self.addr)
            .map(|_| ())
    }

    /// Sends and logs a failure once per kind of message at debug level (a service manager
    /// that stopped listening is not the pipeline's fault).
    pub fn send_or_log(&self, message: &str) {
        if let Err(e) = self.send(message) {
            tracing::debug!("notification {message:?} not sent: {e}");
        }
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &str) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &str) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract notification sockets exist on Linux only",
    ))
}

/// `$WATCHDOG_USEC` for this process: ignored when `$WATCHDOG_PID` names another process
/// (the variables were meant for a parent) or when it is not a positive number.
pub fn watchdog_from_env(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Whether each worker is inside a batch, and since when: written by the worker around
/// each batch, read by the decision thread. A worker inside one batch for longer than the
/// stall limit is wedged (a hung device call, a backend in an endless loop).
#[derive(Debug)]
pub struct Heartbeats {
    epoch: Instant,
    /// Per worker: 0 while idle, else 1 + nanoseconds from `epoch` to the batch's start.
    busy_since: Vec<AtomicU64>,
}

impl Heartbeats {
    pub fn new(workers: usize) -> Arc<Heartbeats> {
        Arc::new(Heartbeats {
            epoch: Instant::now(),
            busy_since: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Worker `w` starts a batch.
    #[inline]
    pub fn begin(&self, w: usize) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        self.busy_since[w].store(ns + 1, Ordering::Relaxed);
    }

    /// Worker `w` finished its batch.
    #[inline]
    pub fn end(&self, w: usize) {
        self.busy_since[w].store(0, Ordering::Relaxed);
    }

    /// The first worker inside one batch for longer than `limit`, and for how long.
    pub fn stalled(&self, limit: Duration) -> Option<(usize, Duration)> {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.busy_since.iter().enumerate().find_map(|(w, b)| {
            let since = b.load(Ordering::Relaxed);
            let busy = Duration::from_nanos(now.saturating_sub(since.checked_sub(1)?));
            (busy > limit).then_some((w, busy))
        })
    }
}

/// How often the decision thread tells the manager how the run goes.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// The decision thread's side of the protocol. [`Watchdog::tick`] runs once per pass of
/// the decision loop, so a decision thread that hangs (a decision log on a filesystem that
/// stopped answering) stops the pings by not running; a worker wedged in one batch stops
/// them through [`Heartbeats`]. Pings go out at half the manager's period, and a worker
/// counts as wedged after half the period in one batch, so the manager restarts the
/// service between one and one and a half periods after a thread hangs.
pub struct Watchdog {
    notifier: Arc<Notifier>,
    heartbeats: Arc<Heartbeats>,
    backend: &'static str,
    ping_every: Option<Duration>,
    last_ping: Instant,
    last_status: Instant,
    decided_at_status: u64,
    wedged: Option<usize>,
    stopping: bool,
}

impl Watchdog {
    pub fn new(
        notifier: Arc<Notifier>,
        heartbeats: Arc<Heartbeats>,
        backend: &'static str,
    ) -> Self {
        let ping_every = notifier.watchdog().map(|p| p / 2);
        let now = Instant::now();
        Watchdog {
            notifier,
            heartbeats,
            backend,
            ping_every,
            last_ping: now,
            last_status: now,
            decided_at_status: 0,
            wedged: None,
            stopping: false,
        }
    }

    /// The pipeline is running: inputs bound, backends built.
    pub fn ready(&mut self, inputs: usize) {
        self.notifier.send_or_log(&format!(
            "READY=1\nSTATUS=running: {inputs} input(s), backend {}",
            self.backend
        ));
        if self.ping_every.is_some() {
            self.notifier.send_or_log("WATCHDOG=1");
        }
        self.last_ping = Instant::now();
    }

    /// One pass of the decision loop; `decided` counts the decisions so far, `stopping`
    /// says the drain has begun.
    pub fn tick(&mut self, decided: u64, stopping: bool) {
        let now = Instant::now();
        if stopping && !self.stopping {
            self.stopping = true;
            self.notifier.send_or_log(&format!(
                "STOPPING=1\nSTATUS=draining: {decided} frames decided"
            ));
        }
        if let Some(every) = self.ping_every {
            if now.duration_since(self.last_ping) >= every {
                match self.heartbeats.stalled(every) {
                    Some((w, busy)) => {
                        if self.wedged != Some(w) {
                            self.wedged = Some(w);
                            tracing::error!(
                                worker = w,
                                busy_ms = busy.as_millis() as u64,
                                "worker wedged in one batch: watchdog pings withheld"
                            );
                            self.notifier.send_or_log(&format!(
                                "STATUS=worker {w} wedged for {} ms",
                                busy.as_millis()
                            ));
                        }
                    }
                    None => {
                        if self.wedged.take().is_some() {
                            tracing::info!("workers progress again: watchdog pings resumed");
                        }
                        self.notifier.send_or_log("WATCHDOG=1");
                        self.last_ping = now;
                    }
                }
            }
        }
        let since = now.duration_since(self.last_status);
        if !self.stopping && self.wedged.is_none() && since >= STATUS_EVERY {
            let rate = (decided - self.decided_at_status) as f64 / since.as_secs_f64();
            self.notifier.send_or_log(&format!(
                "STATUS=running: {decided} frames decided, {rate:.0} frames/s, backend {}",
                self.backend
            ));
            self.last_status = now;
            self.decided_at_status = decided;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> (tempfile::TempDir, UnixDatagram, String) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        (dir, sock, path.to_string_lossy().into_owned())
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn watchdog_period_is_for_this_process_only() {
        assert_eq!(
            watchdog_from_env(Some("2000000"), None, 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watchdog_from_env(Some("2000000"), Some("7"), 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(watchdog_from_env(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_from_env(Some("0"), None, 7), None);
        assert_eq!(watchdog_from_env(Some("soon"), None, 7), None);
        assert_eq!(watchdog_from_env(None, None, 7), None);
    }

    #[test]
    fn messages_reach_a_path_socket_and_an_abstract_one() {
        let (_dir, sock, path) = listener();
        let n = Notifier::connect(&path, None).unwrap();
        n.send("READY=1").unwrap();
        assert_eq!(recv(&sock), "READY=1");

        let name = format!("trigd-notify-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&abstract_addr(&name).unwrap()).unwrap();
        abs.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = Notifier::connect(&format!("@{name}"), None).unwrap();
        n.send("STOPPING=1").unwrap();
        assert_eq!(recv(&abs), "STOPPING=1");
    }

    #[test]
    fn a_busy_worker_is_stalled_only_past_the_limit() {
        let hb = Heartbeats::new(2);
        assert_eq!(hb.stalled(Duration::ZERO), None, "idle workers never stall");
        hb.begin(1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(hb.stalled(Duration::from_secs(10)), None);
        let (w, busy) = hb.stalled(Duration::from_millis(10)).expect("stalled");
        assert_eq!(w, 1);
        assert!(busy >= Duration::from_millis(20));
        hb.end(1);
        assert_eq!(hb.stalled(Duration::ZERO), None);
    }

    #[test]
    fn pings_stop_while_a_worker_is_wedged_and_resume_after() {
        let (_dir, sock, path) = listener();
        let n = Arc::new(Notifier::connect(&path, Some(Duration::from_millis(40))).unwrap());
        let hb = Heartbeats::new(1);
        let mut wd = Watchdog::new(n, hb.clone(), "cpu");
        wd.ready(1);
        assert!(recv(&sock).starts_with("READY=1\nSTATUS=running"));
        assert_eq!(recv(&sock), "WATCHDOG=1");
        std::thread::sleep(Duration::from_millis(25));
        wd.tick(10, false);
        assert_eq!(recv(&sock), "WATCHDOG=1");
        hb.begin(0);
        std::thread::sleep(Duration::from_millis(25));
        wd.tick(10, false);
        assert!(recv(&sock).starts_with("STATUS=worker 0 wedged"));
        std::thread::sleep(Duration::from_millis(25));
        wd.tick(10, false);
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(sock.recv(&mut buf).is_err(), "no ping while wedged");
        hb.end(0);
        wd.tick(11, true);
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(recv(&sock).starts_with("STOPPING=1"));
        assert_eq!(recv(&sock), "WATCHDOG=1");
    }
}
