//! The small HTTP endpoint on its own thread: `/metrics` (Prometheus text format),
//! `/healthz` (200 while the process runs), `/readyz` (200 once the pipeline is ready,
//! 503 before). Loopback by default ([`DEFAULT_ADDR`]).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::metrics::{Metrics, TEXT_CONTENT_TYPE};

/// Default listen address of the metrics endpoint.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9187";

/// How often the server thread looks at its stop flag when no request arrives.
const STOP_POLL: Duration = Duration::from_millis(200);

/// Error starting the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("metrics listen address {addr:?} is not a valid host:port: {source}")]
    Address { addr: String, source: io::Error },
    #[error("cannot listen for metrics on {addr}: {message} (is another trigd or exporter using the port? set another address in the configuration)")]
    Bind { addr: String, message: String },
    #[error("cannot start the metrics server thread: {0}")]
    Thread(io::Error),
}

/// Stops a running [`HttpServer`] from any thread (a signal handler thread, say).
#[derive(Clone)]
pub struct StopHandle {
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
}

impl StopHandle {
    /// Sets the stop flag and wakes the server thread; it exits after the current request.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.server.unblock();
    }
}

/// A running metrics endpoint. Dropping it stops the thread and waits for it.
pub struct HttpServer {
    local_addr: SocketAddr,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` (e.g. [`DEFAULT_ADDR`], or port 0 for any free port) and serves on a
    /// thread named `trigd-http`. `ready` is read on every `/readyz` request.
    pub fn start(
        addr: &str,
        metrics: Arc<Metrics>,
        ready: Arc<AtomicBool>,
    ) -> Result<Self, HttpError> {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| HttpError::Address {
                addr: addr.to_owned(),
                source,
            })?
            .collect();
        let server = Server::http(&resolved[..]).map_err(|e| HttpError::Bind {
            addr: addr.to_owned(),
            message: e.to_string(),
        })?;
        let local_addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| HttpError::Bind {
                addr: addr.to_owned(),
                message: "bound to a non-IP address".to_owned(),
            })?;
        let server = Arc::new(server);
        let stop = StopHandle {
            server: Arc::clone(&server),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let flag = Arc::clone(&stop.stop);
        let thread = std::thread::Builder::new()
            .name("trigd-http".to_owned())
            .spawn(move || serve(&server, &metrics, &ready, &flag))
            .map_err(HttpError::Thread)?;
        Ok(Self {
            local_addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address actually bound (the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle that stops the server from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops the server and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("metrics HTTP thread panicked");
            }
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve(server: &Server, metrics: &Metrics, ready: &AtomicBool, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match server.recv_timeout(STOP_POLL) {
            Ok(Some(req)) => respond(req, metrics, ready),
            Ok(None) => {}
            Err(e) => {
                if !stop.load(Ordering::SeqCst) {
                    tracing::warn!("metrics HTTP server: {e}");
                }
                // recv fails after unblock(); otherwise avoid spinning on a broken listener.
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

fn header(name: &str, value: &str) -> Header {
    // Both are ASCII constants of this module.
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}

fn text(status: u16, body: &str) -> Response<io::Cursor<Vec<u8>>> {
    Response::from_string(body)
        .with_status_code(status)
        .with_header(header("Content-Type", "text/plain; charset=utf-8"))
}

fn respond(req: Request, metrics: &Metrics, ready: &AtomicBool) {
    let is_get = matches!(req.method(), Method::Get | Method::Head);
    // The query string: only `peaks=keep` means something (to `/metrics`).
    let (path, query) = req.url().split_once('?').unwrap_or((req.url(), ""));
    let take_peaks = !query.split('&').any(|kv| kv == "peaks=keep");
    let resp = match (is_get, path) {
        (false, "/metrics" | "/healthz" | "/readyz") => {
            text(405, "method not allowed\n").with_header(header("Allow", "GET, HEAD"))
        }
        (true, "/metrics") => match metrics.render_with(take_peaks) {
            Ok(body) => {
                Response::from_string(body).with_header(header("Content-Type", TEXT_CONTENT_TYPE))
            }
            Err(e) => {
                tracing::error!("rendering metrics: {e}");
                text(500, &format!("rendering metrics: {e}\n"))
            }
        },
        (true, "/healthz") => text(200, "ok\n"),
        (true, "/readyz") if ready.load(Ordering::SeqCst) => text(200, "ready\n"),
        (true, "/readyz") => text(503, "not ready\n"),
        _ => text(404, "not found: try /metrics, /healthz or /readyz\n"),
    };
    if let Err(e) = req.respond(resp) {
        tracing::debug!("metrics HTTP client went away: {e}");
    }
}

/// Minimal HTTP GET used by tests and health checks: returns (status, headers, body).
/// Speaks HTTP/1.0 so that servers answer without chunked encoding; no redirects.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of HTTP headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line in {head:?}"),
            )
        })?;
    Ok((status, head.to_owned(), body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn endpoints_status_codes_and_content_type() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let mut src = metrics.source("udp0");
        src.received();
        src.count(Outcome::Accept, "");
        let ready = Arc::new(AtomicBool::new(false));
        let server =
            HttpServer::start("127.0.0.1:0", Arc::clone(&metrics), Arc::clone(&ready)).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let (status, head, body) = http_get(addr, "/metrics", T).unwrap();
        assert_eq!(status, 200);
        let ct = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type:")
                    .map(|v| v.trim().to_owned())
            })
            .unwrap();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        assert!(
            body.contains(r#"trigd_frames_total{outcome="accept",reason="",source="udp0"} 1"#),
            "{body}"
        );

        assert_eq!(http_get(addr, "/healthz", T).unwrap().0, 200);
        assert_eq!(http_get(addr, "/readyz", T).unwrap().0, 503);
        ready.store(true, Ordering::SeqCst);
        assert_eq!(http_get(addr, "/readyz", T).unwrap().0, 200);
        assert_eq!(http_get(addr, "/metrics?x=1", T).unwrap().0, 200);
        assert_eq!(http_get(addr, "/nope", T).unwrap().0, 404);

        server.shutdown();
        assert!(
            http_get(addr, "/healthz", Duration::from_millis(500)).is_err(),
            "still serving after shutdown"
        );
    }

    #[test]
    fn bind_error_names_the_address() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let ready = Arc::new(AtomicBool::new(true));
        let first =
            HttpServer::start("127.0.0.1:0", Arc::clone(&metrics), Arc::clone(&ready)).unwrap();
        let taken = first.local_addr().to_string();
        let err = HttpServer::start(&taken, metrics.clone(), ready.clone())
            .err()
            .expect("second bind on the same port must fail");
        assert!(err.to_string().contains(&taken), "{err}");
        let err = HttpServer::start("not an address", metrics, ready)
            .err()
            .unwrap();
        assert!(err.to_string().contains("not an address"), "{err}");
    }
}
