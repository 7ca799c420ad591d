//! UDP decision stream: one datagram per decision carrying the binary log's fixed
//! [`DecisionRecord`] (112 bytes, see [`super::binlog`]; decode with
//! [`super::binlog::decode_record`]). Sending never blocks the decision thread: the socket
//! is non-blocking, and a failed send (full socket buffer, nobody listening) is returned
//! to the sink's guard, which counts it and drops the datagram (policy `drop`). Receivers
//! map the record's source index to a name through the configuration.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};

use prometheus::IntCounter;
use zerocopy::IntoBytes;

use super::binlog::DecisionRecord;
use super::Sink;
use crate::decision::{Decision, Names};

pub struct UdpSink {
    socket: UdpSocket,
    target: SocketAddr,
    sent: u64,
    send_errors: u64,
    error_counter: Option<IntCounter>,
}

impl UdpSink {
    /// A sink sending to `target` (`host:port`) from an ephemeral port of the same family.
    pub fn connect(target: &str) -> io::Result<Self> {
        let addr = target
            .to_socket_addrs()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("decision stream target {target:?}: {e}"))
            })?
            .next()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("decision stream target {target:?} resolves to no address"),
                )
            })?;
        let local: SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding a UDP socket for the decision stream: {e}"),
            )
        })?;
        socket
            .connect(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("decision stream to {addr}: {e}")))?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket,
            target: addr,
            sent: 0,
            send_errors: 0,
            error_counter: None,
        })
    }

    /// Also counts send errors in `counter` (`Metrics::udp_send_errors`).
    pub fn with_error_counter(mut self, counter: IntCounter) -> Self {
        self.error_counter = Some(counter);
        self
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }
    /// Datagrams sent whole.
    pub fn sent(&self) -> u64 {
        self.sent
    }
    /// Datagrams lost to send errors.
    pub fn send_errors(&self) -> u64 {
        self.send_errors
    }

    fn count_error(&mut self, e: &io::Error) {
        self.send_errors += 1;
        if let Some(c) = &self.error_counter {
            c.inc();
        }
        tracing::debug!(
            "decision stream to {}: send failed ({e}); {} datagrams lost so far",
            self.target,
            self.send_errors
        );
    }
}

impl Sink for UdpSink {
    /// Encoding and send errors are returned (and send errors counted here too); the
    /// datagram is not retried.
    fn write(&mut self, d: &Decision, _names: &Names) -> io::Result<()> {
        let r = DecisionRecord::from_decision(d)?;
        let e = match self.socket.send(r.as_bytes()) {
            Ok(n) if n == std::mem::size_of::<DecisionRecord>() => {
                self.sent += 1;
                return Ok(());
            }
            Ok(n) => io::Error::new(io::ErrorKind::WriteZero, format!("short send of {n} bytes")),
            Err(e) => e,
        };
        self.count_error(&e);
        Err(e)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "udp"
    }
    fn target(&self) -> String {
        self.target.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::binlog::{decode_record, RECORD_SIZE};
    use crate::sinks::testdata;
    use std::time::Duration;

    #[test]
    fn datagrams_arrive_on_a_loopback_socket_and_decode_equal() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let names = testdata::names();
        let decisions = testdata::decisions();
        let mut sink = UdpSink::connect(&rx.local_addr().unwrap().to_string()).unwrap();
        for d in &decisions {
            sink.write(d, &names).unwrap();
        }
        assert_eq!(sink.sent(), decisions.len() as u64);
        let mut buf = [0u8; 2048];
        for d in &decisions {
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(n, RECORD_SIZE);
            assert_eq!(from.port(), sink.socket.local_addr().unwrap().port());
            assert_eq!(&decode_record(&buf[..n]).unwrap(), d);
        }
    }

    #[test]
    fn nobody_listening_is_counted_and_returned() {
        // Bind then drop a socket so its port is (almost certainly) closed: Linux reports
        // ICMP port unreachable as ECONNREFUSED on the next send of a connected socket.
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let registry_counter = IntCounter::new("errs", "test").unwrap();
        let mut sink = UdpSink::connect(&format!("127.0.0.1:{port}"))
            .unwrap()
            .with_error_counter(registry_counter.clone());
        let names = testdata::names();
        let d = &testdata::decisions()[0];
        let mut returned = 0;
        for _ in 0..20 {
            if let Err(e) = sink.write(d, &names) {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
                returned += 1;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(returned, sink.send_errors());
        assert_eq!(sink.sent() + sink.send_errors(), 20);
        assert!(
            sink.send_errors() > 0,
            "no send error reported for a closed port"
        );
        assert_eq!(registry_counter.get(), sink.send_errors());
    }

    #[test]
    fn bad_target_is_a_clear_error() {
        let err = UdpSink::connect("no-port-here").err().unwrap();
        assert!(err.to_string().contains("no-port-here"), "{err}");
    }
}
