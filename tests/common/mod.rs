//! Shared helpers for the integration tests: run the real `trigd` binary, learn the
//! addresses it bound from its log, make frames.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use trigd::frame::{encode_hit_event, HitRecord, Stamp};

/// The binary under test (`TRIGD_BIN` overrides, for running built tests elsewhere).
pub fn trigd_bin() -> PathBuf {
    std::env::var_os("TRIGD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_trigd")))
}

/// The crate root (fixtures live under it).
pub fn root() -> PathBuf {
    std::env::var_os("TRIGD_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// `trigd check` on a configuration whose text is `body` (written to a temporary file).
pub fn trigd_check(body: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("check.toml");
    std::fs::write(&cfg, body).unwrap();
    Command::new(trigd_bin())
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap()
}

/// The standard output of a command that must have succeeded (else a panic with both
/// streams).
pub fn stdout_of_success(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A running daemon with its log lines streamed to a channel.
pub struct Daemon {
    pub child: Child,
    pub log: Receiver<String>,
    pub lines: Vec<String>,
    stdout: Option<std::process::ChildStdout>,
}

impl Daemon {
    pub fn spawn(args: &[&str]) -> Daemon {
        Daemon::spawn_with_env(args, &[])
    }

    /// As [`Daemon::spawn`], with extra environment variables.
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut child = Command::new(trigd_bin())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start trigd");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take();
        Daemon {
            child,
            log: rx,
            lines: Vec::new(),
            stdout,
        }
    }

    /// Waits for a log line containing `needle`; returns it.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.lines.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(l) => {
                    self.lines.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no log line with {needle:?} within {timeout:?}; log so far:\n{}",
                    self.lines.join("\n")
                ),
            }
        }
    }

    /// The address in the first log line containing `needle` (after `addr=`).
    pub fn addr_from_log(&mut self, needle: &str) -> SocketAddr {
        let line = self.wait_for(needle, Duration::from_secs(20));
        let at = line
            .find("addr=")
            .unwrap_or_else(|| panic!("no addr= in {line}"));
        let rest = &line[at + 5..];
        let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
        rest[..end]
            .trim_matches('"')
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Waits for exit; returns (exit code, stdout, all log lines).
    pub fn wait(mut self, timeout: Duration) -> (i32, String, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut out = String::new();
                if let Some(mut s) = self.stdout.take() {
                    s.read_to_string(&mut out).unwrap();
                }
                while let Ok(l) = self.log.recv_timeout(Duration::from_millis(200)) {
                    self.lines.push(l);
                }
                return (
                    st.code().unwrap_or(-1),
                    out,
                    std::mem::take(&mut self.lines),
                );
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "trigd did not exit within {timeout:?}; log:\n{}",
                    self.lines.join("\n")
                );
            }
            while let Ok(l) = self.log.try_recv() {
                self.lines.push(l);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A hit event with `n_hits` hits spread over `n_planes` planes.
pub fn hit_frame(source_id: u32, seq: u64, n_hits: usize, n_planes: u16) -> Vec<u8> {
    let hits: Vec<HitRecord> = (0..n_hits)
        .map(|i| HitRecord {
            x_mm: i as f32 * 0.5,
            y_mm: -(i as f32),
            z_mm: 100.0 * (i as u16 % n_planes.max(1)) as f32,
            plane: i as u16 % n_planes.max(1),
            hit_id: i as u32 + 1,
        })
        .collect();
    let mut b = Vec::new();
    encode_hit_event(
        &mut b,
        Stamp {
            source_id,
            sequence: seq,
            timestamp_ns: 1_000_000 * seq,
        },
        &hits,
    );
    b
}

/// A plain HTTP GET; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Sum of the values of a metric family's samples whose labels contain every `labels` pair.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name)
                && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Reads a JSON lines decision file.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The integer after `label` in a summary printed by trigd (e.g. "accept 12").
pub fn summary_count(stdout: &str, label: &str) -> u64 {
    let at = stdout
        .find(label)
        .unwrap_or_else(|| panic!("{label} not in summary:\n{stdout}"));
    stdout[at + label.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label}:\n{stdout}"))
}

/// Polls `/metrics` at `addr` until `cond(text)` holds (30 s at most); the text.
pub fn wait_metrics(addr: SocketAddr, cond: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(addr, "/metrics");
        assert_eq!(status, 200);
        if cond(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never satisfied the condition:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Per device label (`gpuN`, `cpu`): the frames the workers say, in their closing log
/// lines ("worker W reconstructed N frames in B batches on DEVICE ..."), they
/// reconstructed there.
pub fn frames_by_device(log: &str) -> std::collections::HashMap<String, u64> {
    let mut by = std::collections::HashMap::new();
    for l in log.lines() {
        let Some((_, rest)) = l.split_once(" reconstructed ") else {
            continue;
        };
        let frames: u64 = rest
            .split(' ')
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or(0);
        let device = rest
            .split_once(" batches on ")
            .and_then(|(_, d)| d.split(' ').next())
            .unwrap_or("?");
        *by.entry(device.to_string()).or_default() += frames;
    }
    by
}
