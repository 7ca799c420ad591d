//! `trigd run` under systemd's notification protocol, with the real binary and a stand-in
//! for the service manager (a datagram socket named by `$NOTIFY_SOCKET`): `READY=1` with a
//! status once the input is bound, `WATCHDOG=1` at half of `$WATCHDOG_USEC` while the
//! pipeline is idle and healthy, no ping while the decision thread hangs on a decision log
//! that stopped taking writes (a FIFO nobody reads, as a hung filesystem would), pings again
//! once it drains, and `STOPPING=1` when SIGTERM starts the drain.

mod common;

use std::io::Read;
use std::net::UdpSocket;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(30);

/// Messages from the daemon, each with the time it arrived.
struct Manager {
    sock: UnixDatagram,
}

impl Manager {
    /// The next message within `timeout`, if any.
    fn next(&self, timeout: Duration) -> Option<(Instant, String)> {
        self.sock.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 1024];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            )),
            Err(_) => None,
        }
    }

    /// Waits for a message starting with `prefix`, returning it and what came before.
    fn until(&self, prefix: &str, timeout: Duration) -> (String, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {prefix:?} message; got {before:?}");
            if let Some((_, m)) = self.next(left) {
                if m.starts_with(prefix) {
                    return (m, before);
                }
                before.push(m);
            }
        }
    }

    /// The pings received during `span`.
    fn pings_during(&self, span: Duration) -> usize {
        let end = Instant::now() + span;
        let mut pings = 0;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if let Some((_, m)) = self.next(left.max(Duration::from_millis(1))) {
                pings += usize::from(m == "WATCHDOG=1");
            }
        }
        pings
    }
}

#[test]
fn readiness_watchdog_and_drain_follow_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let manager = Manager {
        sock: UnixDatagram::bind(&sock_path).unwrap(),
    };
    let fifo = dir.path().join("decisions.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    // A reader that reads nothing yet: the daemon's writes fill the pipe, then block.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();

    // The manager's period: 400 ms, so pings every 200 ms.
    let mut d = Daemon::spawn_with_env(
        &[
            "run",
            "--listen",
            "udp://127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--decisions",
            fifo.to_str().unwrap(),
            "--budget-ms",
            "60000",
        ],
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let (ready, _) = manager.until("READY=1", T);
    assert!(
        ready.contains("\nSTATUS=running: 1 input(s), backend cpu"),
        "{ready:?}"
    );
    let udp = d.addr_from_log("listening");

    // Idle and healthy: about five pings a second.
    let idle = manager.pings_during(Duration::from_millis(1200));
    assert!((3..=8).contains(&idle), "{idle} pings in 1.2 s while idle");

    // Frames whose decisions overfill the pipe (64 KiB; a decision line is over 100
    // bytes): the decision thread blocks in its write and the pings stop.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 0..1500u64 {
        sock.send_to(&hit_frame(1, seq, 10, 5), udp).unwrap();
        if seq % 100 == 99 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The flush that blocks comes within a flush period (250 ms) of the frames.
    std::thread::sleep(Duration::from_millis(600));
    while manager.next(Duration::from_millis(1)).is_some() {}
    let hung = manager.pings_during(Duration::from_millis(1500));
    assert_eq!(
        hung, 0,
        "pings went on while the decision thread was blocked"
    );

    // Drain the pipe from now on: the decision thread writes again, the pings resume.
    let drained = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 65536];
        let deadline = Instant::now() + T;
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break, // the daemon closed its end
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "the daemon never closed the log");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("reading the decision FIFO: {e}"),
            }
        }
        String::from_utf8(all).unwrap()
    });
    manager.until("WATCHDOG=1", Duration::from_secs(5));
    let resumed = manager.pings_during(Duration::from_millis(1000));
    assert!(resumed >= 2, "{resumed} pings in 1 s after the log drained");

    d.signal("TERM");
    let (stopping, _) = manager.until("STOPPING=1", T);
    assert!(stopping.contains("STATUS=draining"), "{stopping:?}");
    let (code, stdout, _) = d.wait(T);
    assert_eq!(code, 0, "{stdout}");
    let lines = drained.join().unwrap();
    let decided = lines.lines().count() as u64;
    assert_eq!(decided, summary_count(&stdout, "frames"), "{stdout}");
    assert!(decided >= 1400, "loopback UDP lost too much: {decided}");
}

#[test]
fn an_empty_notify_socket_is_an_error() {
    let d = Daemon::spawn_with_env(
        &[
            "run",
            "--listen",
            "udp://127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        &[("NOTIFY_SOCKET", "")],
    );
    let (code, _, log) = d.wait(T);
    assert_ne!(code, 0, "an empty NOTIFY_SOCKET must not be ignored");
    assert!(
        log.iter().any(|l| l.contains("NOTIFY_SOCKET")),
        "the error names the variable: {log:?}"
    );
}
