//! `trigd top`: a running daemon at a glance on a terminal, read from its own metrics
//! endpoint (nothing else is needed on the host): frame rates, outcomes and drop reasons,
//! decision latency quantiles over the last interval, ring fill, sink health, readiness and
//! the active backend, refreshed live.
//!
//! Two scrapes an interval apart give the rates; quantiles come from the difference of the
//! latency histograms' buckets, interpolated inside a bucket as Prometheus's
//! `histogram_quantile` does. It scrapes `/metrics?peaks=keep`, so the ring peaks stay for
//! Prometheus.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One sample of the text exposition format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus's text format (0.0.4): comments skipped, label values unescaped.
/// A line that does not parse is an error naming it.
pub fn parse_metrics(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("metrics line {}: cannot read {line:?}", i + 1);
        let (name, rest) = match line.find(['{', ' ']) {
            Some(at) => line.split_at(at),
            None => return Err(bad()),
        };
        let mut labels = BTreeMap::new();
        let rest = if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut end = None;
            // A label name up to '=', or the closing brace.
            while let Some(&(start, c)) = chars.peek() {
                if c == '}' {
                    end = Some(start + 1);
                    break;
                }
                if c == ',' || c == ' ' {
                    chars.next();
                    continue;
                }
                let mut key = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return Err(bad());
                }
                let mut value = String::new();
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(c) => value.push(c),
                            None => return Err(bad()),
                        },
                        '"' => {
                            closed = true;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                if !closed {
                    return Err(bad());
                }
                labels.insert(key.trim().to_string(), value);
            }
            match end {
                Some(e) => &body[e..],
                None => return Err(bad()),
            }
        } else {
            rest
        };
        let value = rest.split_whitespace().next().ok_or_else(bad)?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad())?,
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(out)
}

/// One scrape, with the time it was taken.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub at: Instant,
    pub samples: Vec<Sample>,
    /// `/readyz` answered 200.
    pub ready: bool,
}

impl Scrape {
    fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Sums of `name` grouped by the value of `label`.
    fn by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            let k = s.labels.get(label).cloned().unwrap_or_default();
            *m.entry(k).or_insert(0.0) += s.value;
        }
        m
    }

    /// The cumulative latency buckets summed over backends and workloads: (le, count).
    fn latency_buckets(&self) -> Vec<(f64, f64)> {
        let mut m: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == "trigd_decision_latency_seconds_bucket")
        {
            let Some(le) = s.labels.get("le") else {
                continue;
            };
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse() {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            m.entry(le.to_bits()).or_insert((le, 0.0)).1 += s.value;
        }
        let mut v: Vec<(f64, f64)> = m.into_values().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// The `q` quantile of cumulative buckets `(le, count)`, linear inside the bucket (as
/// `histogram_quantile`); `None` without observations. A quantile in the `+Inf` bucket is
/// the largest finite bound.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let inside = count - prev.1;
            let frac = if inside > 0.0 {
                (rank - prev.1) / inside
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, count);
    }
    Some(prev.0)
}

/// The screen for the interval between two scrapes of the same daemon.
pub fn render(addr: &str, a: &Scrape, b: &Scrape) -> String {
    let dt = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    let rate = |name: &str, f: &[(&str, &str)]| (b.sum(name, f) - a.sum(name, f)).max(0.0) / dt;
    let mut o = String::new();
    let version = b
        .samples
        .iter()
        .find(|s| s.name == "trigd_build_info")
        .and_then(|s| s.labels.get("version").cloned())
        .unwrap_or_else(|| "?".into());
    let backend = b
        .by("trigd_backend_active", "backend")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, _)| k)
        .collect::<Vec<_>>()
        .join("+");
    let started = b.sum("trigd_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(started);
    let _ = writeln!(
        o,
        "trigd {version} at {addr}   backend {}   {}   up {}",
        if backend.is_empty() { "none" } else { &backend },
        if b.ready { "ready" } else { "NOT READY" },
        human_duration((now - started).max(0.0))
    );
    let received = b.sum("trigd_frames_received_total", &[]);
    let _ = writeln!(
        o,
        "frames   in {:>10.0}/s   total {:>12.0}   failovers {:.0}   refused {:.0}",
        rate("trigd_frames_received_total", &[]),
        received,
        b.sum("trigd_backend_failovers_total", &[]),
        b.sum("trigd_input_refused_total", &[]),
    );
    // Frames per device (each GPU, the CPU): with several GPUs, each should carry a share.
    let devices = b.by("trigd_worker_frames_total", "device");
    if !devices.is_empty() {
        let list: Vec<String> = devices
            .iter()
            .map(|(d, total)| {
                let r = rate("trigd_worker_frames_total", &[("device", d)]);
                format!("{d} {r:.0}/s ({total:.0})")
            })
            .collect();
        let _ = writeln!(o, "devices  {}", list.join("   "));
    }
    let _ = writeln!(o, "outcome         rate/s        total");
    let totals = b.by("trigd_frames_total", "outcome");
    for outcome in ["accept", "reject", "timeout", "dropped", "malformed"] {
        let _ = writeln!(
            o,
            "  {outcome:<10} {:>11.0} {:>12.0}",
            rate("trigd_frames_total", &[("outcome", outcome)]),
            totals.get(outcome).copied().unwrap_or(0.0)
        );
    }
    let reasons: Vec<(String, f64)> = b
        .samples
        .iter()
        .filter(|s| s.name == "trigd_frames_total" && s.value > 0.0)
        .filter_map(|s| {
            let r = s.labels.get("reason")?;
            let outcome = s.labels.get("outcome")?;
            (!r.is_empty()).then(|| (format!("{outcome}/{r}"), s.value))
        })
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_insert(0.0) += v;
            m
        })
        .into_iter()
        .collect();
    if !reasons.is_empty() {
        let list: Vec<String> = reasons.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
        let _ = writeln!(o, "  reasons: {}", list.join(", "));
    }
    let (ba, bb) = (a.latency_buckets(), b.latency_buckets());
    let window: Vec<(f64, f64)> = bb
        .iter()
        .map(|&(le, n)| {
            let before = ba.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1);
            (le, (n - before).max(0.0))
        })
        .collect();
    let q = |buckets: &[(f64, f64)], p| {
        bucket_quantile(buckets, p).map_or("-".to_string(), human_seconds)
    };
    let _ = writeln!(
        o,
        "latency  last {:.1} s: p50 {}  p99 {}  ({} decisions)   since start: p50 {}  p99 {}",
        dt,
        q(&window, 0.5),
        q(&window, 0.99),
        window.last().map_or(0.0, |x| x.1),
        q(&bb, 0.5),
        q(&bb, 0.99),
    );
    let fill = b.by("trigd_ring_fill_ratio", "ring");
    let peak = b.by("trigd_ring_fill_max_ratio", "ring");
    if !fill.is_empty() {
        let _ = writeln!(
            o,
            "ring                                   fill   peak (last scrape)"
        );
        for (ring, f) in &fill {
            let _ = writeln!(
                o,
                "  {ring:<36} {:>5.1}%  {:>5.1}%",
                100.0 * f,
                100.0 * peak.get(ring).copied().unwrap_or(0.0)
            );
        }
    }
    let mut sinks: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for s in &b.samples {
        let Some(sink) = s.labels.get("sink") else {
            continue;
        };
        let e = sinks.entry(sink.clone()).or_default();
        match s.name.as_str() {
            "trigd_sink_errors_total" => {
                e.0 += s.value;
                e.2 += s.value - a.sum(&s.name, &label_pairs(&s.labels));
            }
            "trigd_sink_lost_total" => e.1 += s.value,
            _ => {}
        }
    }
    if !sinks.is_empty() {
        let _ = writeln!(o, "sink       state     errors     lost");
        for (sink, (errors, lost, new)) in &sinks {
            let state = if *new > 0.0 { "FAILING" } else { "ok" };
            let _ = writeln!(o, "  {sink:<8} {state:<8} {errors:>7.0} {lost:>8.0}");
        }
    }
    o
}

fn label_pairs(labels: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn human_seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn human_duration(s: f64) -> String {
    let s = s as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Scrapes the daemon at `addr` once.
pub fn scrape(addr: SocketAddr) -> anyhow::Result<Scrape> {
    use anyhow::Context;
    let timeout = Duration::from_secs(2);
    let (status, _, body) = crate::http::http_get(addr, "/metrics?peaks=keep", timeout)
        .with_context(|| format!("no trigd metrics endpoint at {addr}: is the daemon running there (`--metrics-addr`)?"))?;
    anyhow::ensure!(status == 200, "{addr}/metrics answered HTTP {status}");
    let samples = parse_metrics(&body).map_err(|e| anyhow::anyhow!("{addr}/metrics: {e}"))?;
    anyhow::ensure!(
        samples.iter().any(|s| s.name.starts_with("trigd_")),
        "{addr}/metrics has no trigd_ metrics: is this a trigd daemon?"
    );
    let ready = crate::http::http_get(addr, "/readyz", timeout)
        .map(|(s, _, _)| s == 200)
        .unwrap_or(false);
    Ok(Scrape {
        at: Instant::now(),
        samples,
        ready,
    })
}

/// Runs `trigd top`: redraws every `interval` until interrupted, or prints one screen
/// (`once`) after two scrapes an interval apart.
pub fn run(addr: SocketAddr, interval: Duration, once: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let mut prev = scrape(addr)?;
    let mut out = std::io::stdout();
    loop {
        let until = Instant::now() + interval;
        while Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20).min(interval));
        }
        let next = scrape(addr)?;
        let screen = render(&addr.to_string(), &prev, &next);
        if once {
            out.write_all(screen.as_bytes())?;
            return Ok(());
        }
        // Clear the screen and home the cursor, then the new screen.
        write!(out, "\x1b[2J\x1b[H{screen}")?;
        out.flush()?;
        prev = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = r#"# HELP trigd_frames_total x
# TYPE trigd_frames_total counter
trigd_build_info{git_commit="abc",version="0.1.0"} 1
trigd_backend_active{backend="cpu"} 0
trigd_backend_active{backend="gpu"} 1
trigd_frames_received_total{source="udp0"} 1000
trigd_frames_total{outcome="accept",reason="",source="udp0"} 100
trigd_frames_total{outcome="reject",reason="",source="udp0"} 890
trigd_frames_total{outcome="dropped",reason="ring_full",source="udp0"} 10
trigd_decision_latency_seconds_bucket{backend="gpu",workload="tracking",le="0.001"} 500
trigd_decision_latency_seconds_bucket{backend="gpu",workload="tracking",le="0.002"} 990
trigd_decision_latency_seconds_bucket{backend="gpu",workload="tracking",le="+Inf"} 990
trigd_ring_fill_ratio{ring="udp0->w0"} 0.25
trigd_ring_fill_max_ratio{ring="udp0->w0"} 0.5
trigd_sink_errors_total{kind="storage_full",sink="jsonl"} 1
trigd_sink_lost_total{sink="jsonl"} 0
trigd_start_time_seconds 1.7e9
trigd_worker_frames_total{device="gpu0",worker="0"} 500
trigd_worker_frames_total{device="gpu1",worker="1"} 490
trigd_worker_frames_total{device="cpu",worker="0"} 0
"#;

    fn scrape_of(text: &str, at: Instant) -> Scrape {
        Scrape {
            at,
            samples: parse_metrics(text).unwrap(),
            ready: true,
        }
    }

    #[test]
    fn parses_labels_with_escapes_and_special_values() {
        let s = parse_metrics(
            "a{x=\"q\\\"uote\",y=\"line\\nbreak\"} 2.5\nb +Inf\n# c 3\nd{le=\"+Inf\"} 7 1700000000\n",
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].labels["x"], "q\"uote");
        assert_eq!(s[0].labels["y"], "line\nbreak");
        assert_eq!(s[0].value, 2.5);
        assert!(s[1].value.is_infinite());
        assert_eq!(s[2].labels["le"], "+Inf");
        assert_eq!(s[2].value, 7.0);
        let e = parse_metrics("ok 1\nbroken{x=\"1\" 2\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket() {
        let b = [(0.001, 50.0), (0.002, 100.0), (f64::INFINITY, 100.0)];
        assert!((bucket_quantile(&b, 0.5).unwrap() - 0.001).abs() < 1e-12);
        assert!((bucket_quantile(&b, 0.75).unwrap() - 0.0015).abs() < 1e-12);
        assert!((bucket_quantile(&b, 0.25).unwrap() - 0.0005).abs() < 1e-12);
        let tail = [(0.001, 10.0), (f64::INFINITY, 20.0)];
        assert_eq!(bucket_quantile(&tail, 0.99), Some(0.001));
        assert_eq!(bucket_quantile(&[(0.001, 0.0)], 0.5), None);
    }

    #[test]
    fn the_screen_shows_rates_outcomes_latency_rings_and_sinks() {
        let t0 = Instant::now();
        let a = scrape_of(A, t0);
        // Two seconds later: 2,000 more frames in, 1,000 accepted, a second sink error.
        let b_text = A
            .replace("{source=\"udp0\"} 1000", "{source=\"udp0\"} 3000")
            .replace("source=\"udp0\"} 100\n", "source=\"udp0\"} 1100\n")
            .replace("source=\"udp0\"} 890", "source=\"udp0\"} 1880")
            .replace("le=\"0.002\"} 990", "le=\"0.002\"} 2980")
            .replace("le=\"+Inf\"} 990", "le=\"+Inf\"} 2990")
            .replace("sink=\"jsonl\"} 1\n", "sink=\"jsonl\"} 2\n")
            .replace("worker=\"0\"} 500", "worker=\"0\"} 1500")
            .replace("worker=\"1\"} 490", "worker=\"1\"} 1490");
        let b = scrape_of(&b_text, t0 + Duration::from_secs(2));
        let screen = render("127.0.0.1:9187", &a, &b);
        assert!(screen.contains("backend gpu"), "{screen}");
        assert!(screen.contains("ready"), "{screen}");
        assert!(screen.contains("in       1000/s"), "{screen}");
        let accept = screen.lines().find(|l| l.contains("accept")).unwrap();
        assert_eq!(
            accept.split_whitespace().collect::<Vec<_>>(),
            ["accept", "500", "1100"]
        );
        assert!(screen.contains("reasons: dropped/ring_full 10"), "{screen}");
        assert!(
            screen.contains("devices  cpu 0/s (0)   gpu0 500/s (1500)   gpu1 500/s (1490)"),
            "{screen}"
        );
        // The window's 2,000 decisions all lie in (1 ms, 2 ms]: p50 at 1.5 ms.
        assert!(screen.contains("p50 1.50 ms"), "{screen}");
        assert!(screen.contains("2000 decisions"), "{screen}");
        assert!(screen.contains("25.0%   50.0%"), "{screen}");
        let sink = screen.lines().find(|l| l.contains("jsonl")).unwrap();
        assert!(sink.contains("FAILING"), "{sink}");
        // Without a new error the sink is ok again.
        let c = scrape_of(&b_text, t0 + Duration::from_secs(4));
        let screen = render("x", &b, &c);
        let sink = screen.lines().find(|l| l.contains("jsonl")).unwrap();
        assert!(sink.contains(" ok "), "{sink}");
    }
}
