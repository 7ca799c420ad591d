//! Wires a configuration into a running pipeline: inputs, backends, sinks, the metrics
//! endpoint and signals. `trigd run` and `trigd replay` both come through [`execute`]; they
//! differ only in their inputs and in whether deadlines apply.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;

use crate::backend::BackendKind;
use crate::config::{Config, WorkloadKind};
use crate::decision::{Decision, Names, Outcome, Workload};
use crate::metrics::{BackendMetrics, Metrics, RingMetrics, SourceMetrics};
use crate::pipeline::{self, Input, Observe, Runtime, Stage, Summary};
use crate::ring::Fill;
use crate::sinks::guard::GuardedSink;
use crate::sinks::{Sink, SinkPolicy};
use crate::sources::limits::REFUSED_REASONS;
use crate::workload;

/// How a run differs between the daemon and a replay.
pub struct Options {
    pub config: Config,
    /// Deadlines apply (live sources, paced replay).
    pub deadlines: bool,
    /// Serve `/metrics` on `config.daemon.metrics_addr`.
    pub serve_metrics: bool,
    /// Handle SIGHUP (reload thresholds) in addition to SIGINT/SIGTERM.
    pub reload_on_hup: bool,
    /// Speak systemd's notification protocol when `$NOTIFY_SOCKET` is set (the daemon).
    pub notify: bool,
    /// Show a progress bar for this many frames (a terminal replay).
    pub progress_total: Option<u64>,
    /// Workload outputs.
    pub outputs: workload::Outputs,
}

/// Runs the pipeline over `inputs` until they end or a signal stops it. Returns the summary;
/// the caller turns an unbalanced accounting into a non-zero exit code.
pub fn execute(opts: Options, inputs: Vec<Input>) -> anyhow::Result<Summary> {
    let cfg = Arc::new(opts.config);
    let metrics = Arc::new(Metrics::new().context("creating metrics")?);
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let reopen = Arc::new(AtomicBool::new(false));
    let reload = if opts.reload_on_hup {
        Some(spawn_reloader(cfg.clone(), stop.clone(), reopen.clone())?)
    } else {
        None
    };

    let http = if opts.serve_metrics {
        let server = crate::http::HttpServer::start(
            &cfg.daemon.metrics_addr.to_string(),
            metrics.clone(),
            ready.clone(),
        )
        .with_context(|| format!("serving metrics on {}", cfg.daemon.metrics_addr))?;
        tracing::info!(addr = %server.local_addr(), "metrics at http://{}/metrics", server.local_addr());
        Some(server)
    } else {
        None
    };

    let workload = match cfg.daemon.workload {
        WorkloadKind::Multiplicity => Workload::Multiplicity,
        WorkloadKind::Tracking => Workload::Tracking,
        WorkloadKind::Eeg => Workload::Eeg,
    };
    let plan = workload::plan(&cfg, &opts.outputs, Some(metrics.clone()))
        .context("setting up the workload")?
        .with_deadlines(opts.deadlines);
    let active = plan.primary_kind();
    for kind in [BackendKind::Cpu, BackendKind::Gpu] {
        metrics.backend(kind).set_active(kind == active);
    }
    tracing::info!(
        workload = workload.as_str(),
        backend = active.as_str(),
        "reconstruction backend"
    );

    let source_names: Vec<String> = inputs.iter().map(|i| i.name.clone()).collect();
    for i in &inputs {
        if matches!(i.kind, crate::pipeline::InputKind::Lsl(_)) {
            metrics.prepare_stream(&i.name);
        }
    }
    let source_metrics: Vec<SourceMetrics> =
        source_names.iter().map(|n| metrics.source(n)).collect();
    // Refusal counters resolved now, so they are exported at 0 and a flood of refused
    // datagrams costs one atomic increment each.
    let refused = source_names
        .iter()
        .map(|n| REFUSED_REASONS.map(|r| metrics.input_refused(n, r)))
        .collect();
    let observer = Arc::new(MetricsObserver {
        metrics: metrics.clone(),
        sources: source_metrics,
        refused,
        backends: [
            metrics.backend(BackendKind::Cpu),
            metrics.backend(BackendKind::Gpu),
        ],
        stages: metrics.stages(),
        rings: Mutex::new(Vec::new()),
        nats: inputs
            .iter()
            .map(|i| {
                matches!(i.kind, pipeline::InputKind::Nats(_)).then(|| metrics.nats_source(&i.name))
            })
            .collect(),
    });

    let progress = opts.progress_total.map(|total| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} frames {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress_cb = progress.clone().map(|bar| {
        Box::new(move |n: u64| {
            if n % 4096 == 0 {
                bar.set_position(n)
            }
        }) as Box<dyn Fn(u64) + Send>
    });

    let output = cfg.output.clone();
    let fsync = match &output.fsync {
        Some(f) => f
            .parse()
            .map_err(|e| anyhow::anyhow!("output.fsync: {e}"))?,
        None => crate::recording::FsyncPolicy::Never,
    };
    // The accepted-frame recording: written by the decision thread, finished after the run.
    let accepted = match &output.accepted_recording {
        Some(path) => Some(Arc::new(Mutex::new(Some(
            crate::recording::RecordingWriter::create(path, fsync).with_context(|| {
                format!("creating the accepted-frame recording {}", path.display())
            })?,
        )))),
        None => None,
    };
    // Accepted frames to a JetStream stream of their own, each publish acknowledged.
    let mut accepted_nats = match &output.accepted_nats {
        Some(u) => {
            let url: crate::farm::NatsUrl = u
                .parse()
                .map_err(|e| anyhow::anyhow!("output.accepted_nats: {e}"))?;
            Some(
                crate::sinks::nats::NatsAccepted::connect(
                    &url,
                    output.nats_duplicate_window(),
                    output.nats_connect_retry(),
                )
                .with_context(|| format!("accepted frames to {url}"))?,
            )
        }
        None => None,
    };
    // A NATS input acknowledges a frame once its decision is written; its accepted copy
    // must then be out of the process too, or a node killed after the acknowledgement
    // would lose it from the recording while the work queue never hands it out again.
    let flush_accepted = cfg.inputs.iter().any(|i| i.is_nats());
    let accepted_cb = (accepted.is_some() || accepted_nats.is_some()).then(|| {
        let w = accepted.clone();
        Box::new(move |bytes: &[u8]| -> std::io::Result<()> {
            if let Some(w) = &w {
                let mut g = w
                    .lock()
                    .map_err(|_| std::io::Error::other("accepted recording poisoned"))?;
                if let Some(w) = g.as_mut() {
                    w.append(bytes).map(|_| ()).map_err(std::io::Error::other)?;
                    if flush_accepted {
                        w.flush().map_err(std::io::Error::other)?;
                    }
                }
            }
            match accepted_nats.as_mut() {
                Some(n) => n.publish(bytes),
                None => Ok(()),
            }
        }) as Box<dyn FnMut(&[u8]) -> std::io::Result<()> + Send>
    });

    let mut decisions = None::<crate::metrics::DecisionMetrics>;
    let metrics_for_decisions = metrics.clone();
    let make_sinks = |names: &Names| -> anyhow::Result<Vec<GuardedSink>> {
        let sinks = build_sinks(&output, names, &metrics)?;
        for s in &sinks {
            metrics.prepare_sink(s.kind());
        }
        if output.accepted_recording.is_some() || output.accepted_nats.is_some() {
            metrics.prepare_sink("recording");
        }
        Ok(sinks)
    };
    let on_decision = {
        let m = metrics_for_decisions;
        move |d: &Decision, names: &Names| {
            let dm = decisions.get_or_insert_with(|| m.decisions(names));
            dm.record(d);
        }
    };

    let notify = if opts.notify {
        crate::notify::Notifier::from_env()
            .context("connecting to the service manager's $NOTIFY_SOCKET")?
            .map(Arc::new)
    } else {
        None
    };
    if let Some(n) = &notify {
        tracing::info!(
            watchdog_ms = n.watchdog().map(|d| d.as_millis() as u64),
            "notifying the service manager"
        );
    }

    let mut daemon_cfg = cfg.daemon.clone();
    daemon_cfg.workers = plan.workers();
    daemon_cfg.batch_max = plan.batch_max();
    if daemon_cfg.batch_max != cfg.daemon.batch_max {
        tracing::info!(
            batch_max = daemon_cfg.batch_max,
            "tracking on GPUs: up to {} frames per batch (daemon.batch_max {}, ring_slots {})",
            daemon_cfg.batch_max,
            cfg.daemon.batch_max,
            cfg.daemon.ring_slots
        );
    }
    // Frames that may legitimately be between arrival and decision while running: the slot
    // pools (the ring metrics add their own capacity).
    metrics.add_in_flight_frames((daemon_cfg.batch_max * daemon_cfg.workers) as u64);
    let rt = Runtime {
        ordered_by_source: plan.ordered_by_source(),
        daemon: daemon_cfg,
        workload,
        deadlines: opts.deadlines,
        make_sinks: Box::new(make_sinks),
        on_decision: Box::new(on_decision),
        accepted: accepted_cb,
        observer: observer.clone(),
        stop: stop.clone(),
        reload,
        ready: Some(ready.clone()),
        progress: progress_cb,
        reopen: Some(reopen),
        notify,
    };
    let started = Instant::now();
    let make = |w: usize| plan.make(w);
    let make_fallback = |w: usize| plan.make_fallback(w);
    let fallback: Option<pipeline::BackendFactory<'_>> = if plan.has_fallback() {
        Some(&make_fallback)
    } else {
        None
    };
    let result = pipeline::run(rt, inputs, &make, fallback);
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }
    let mut summary = result?;
    summary.finder_limits = metrics.finder_limits();
    summary.passes_raised = metrics.passes_raised().get();
    if let Some(w) = accepted {
        if let Some(w) = w
            .lock()
            .map_err(|_| anyhow::anyhow!("accepted recording poisoned"))?
            .take()
        {
            w.finish()
                .context("finishing the accepted-frame recording")?;
        }
    }
    plan.finish().context("writing workload outputs")?;
    // Everything is drained: the exported accounting must balance exactly.
    for (name, received, decided) in metrics.check_accounting(Some(0)) {
        tracing::error!(source = %name, received, decided, "metrics accounting violated");
    }
    for (i, s) in summary.sources.iter().enumerate() {
        if !s.balanced() {
            tracing::error!(
                source = %source_names[i],
                frames_in = s.frames_in,
                decided = s.decided(),
                "accounting violated: frames in != sum of outcomes"
            );
        }
    }
    tracing::info!(
        elapsed_s = started.elapsed().as_secs_f64(),
        frames = summary.frames_in(),
        "run ended"
    );
    if let Some(h) = http {
        h.shutdown();
    }
    Ok(summary)
}

/// Every configured decision sink behind its failure policy (a spill path is created
/// up front, so a spill that cannot even start stops the run before any frame).
fn build_sinks(
    output: &crate::config::OutputConfig,
    names: &Names,
    metrics: &Metrics,
) -> anyhow::Result<Vec<GuardedSink>> {
    let udp_errors = &metrics.udp_send_errors();
    use crate::sinks::binlog::BinlogSink;
    use crate::sinks::jsonl::JsonlSink;
    let settings = output.guard_settings();
    let rotation = output.rotation();
    let mut sinks = Vec::new();
    if let Some(p) = &output.decisions_jsonl {
        let policy = output.jsonl_policy.unwrap_or(SinkPolicy::Block);
        let sink = JsonlSink::create_rotating(p, rotation)
            .with_context(|| format!("creating {}", p.display()))?;
        let spill: Option<Box<dyn Sink>> = match (&output.jsonl_spill, policy) {
            (Some(sp), SinkPolicy::Spill) => Some(Box::new(
                JsonlSink::create_rotating(sp, rotation)
                    .with_context(|| format!("creating the spill path {}", sp.display()))?,
            )),
            _ => None,
        };
        sinks.push(GuardedSink::new(Box::new(sink), policy, spill, settings));
    }
    if let Some(p) = &output.decisions_binlog {
        let policy = output.binlog_policy.unwrap_or(SinkPolicy::Block);
        let sink = BinlogSink::create_rotating(p, names, rotation)
            .with_context(|| format!("creating {}", p.display()))?;
        let spill: Option<Box<dyn Sink>> = match (&output.binlog_spill, policy) {
            (Some(sp), SinkPolicy::Spill) => Some(Box::new(
                BinlogSink::create_rotating(sp, names, rotation)
                    .with_context(|| format!("creating the spill path {}", sp.display()))?,
            )),
            _ => None,
        };
        sinks.push(GuardedSink::new(Box::new(sink), policy, spill, settings));
    }
    if let Some(u) = &output.decisions_nats {
        let url: crate::farm::NatsUrl = u
            .parse()
            .map_err(|e| anyhow::anyhow!("output.decisions_nats: {e}"))?;
        let sink = crate::sinks::nats::NatsSink::connect(
            &url,
            output.nats_duplicate_window(),
            output.nats_connect_retry(),
        )
        .with_context(|| format!("decision stream {url}"))?;
        sinks.push(GuardedSink::new(
            Box::new(sink),
            SinkPolicy::Block,
            None,
            settings,
        ));
    }
    if let Some(a) = &output.decisions_udp {
        let sink = crate::sinks::udp::UdpSink::connect(&a.to_string())
            .map(|u| u.with_error_counter(udp_errors.clone()))
            .with_context(|| format!("decision stream to {a}"))?;
        sinks.push(GuardedSink::new(
            Box::new(sink),
            output.udp_policy.unwrap_or(SinkPolicy::Drop),
            None,
            settings,
        ));
    }
    if let Some(name) = &output.lsl_markers {
        use crate::sinks::lsl::{LslMarkerSink, MarkerFormat};
        let format = MarkerFormat::parse(output.lsl_markers_format.as_deref())?;
        let sink = LslMarkerSink::open(name, format, output.lsl_markers_all.unwrap_or(false))
            .with_context(|| format!("publishing the LSL marker stream {name:?}"))?
            .with_latency(metrics.lsl_marker_latency());
        sinks.push(GuardedSink::new(
            Box::new(sink),
            SinkPolicy::Drop,
            None,
            settings,
        ));
    }
    if let Some(name) = &output.lsl_statistic {
        let sink = crate::sinks::lsl::LslStatisticSink::open(name)
            .with_context(|| format!("publishing the LSL statistic stream {name:?}"))?;
        sinks.push(GuardedSink::new(
            Box::new(sink),
            SinkPolicy::Drop,
            None,
            settings,
        ));
    }
    Ok(sinks)
}

/// SIGHUP: reopen the decision logs, re-read the configuration file and hand it to the
/// workers.
fn spawn_reloader(
    cfg: Arc<Config>,
    stop: Arc<AtomicBool>,
    reopen: Arc<AtomicBool>,
) -> anyhow::Result<crossbeam_channel::Receiver<Arc<Config>>> {
    let (tx, rx) = crossbeam_channel::bounded(4);
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .context("installing the SIGHUP handler")?;
    let handle = signals.handle();
    std::thread::Builder::new().name("reload".into()).spawn(move || {
        for _ in signals.forever() {
            // Decision logs reopen on every SIGHUP (after logrotate moved them away).
            reopen.store(true, Ordering::Release);
            let Some(path) = cfg.path.clone() else {
                tracing::warn!("SIGHUP: no configuration file to reload (started without --config)");
                continue;
            };
            match reload_config(&path, &cfg) {
                Ok(new) => {
                    tracing::info!(file = %path.display(), "SIGHUP: reloading trigger thresholds");
                    if tx.send(Arc::new(new)).is_err() {
                        break;
                    }
                }
                Err(e) => tracing::error!("SIGHUP: keeping the running configuration: {e:#}"),
            }
        }
    })?;
    std::thread::Builder::new()
        .name("reload-stop".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            handle.close();
        })?;
    Ok(rx)
}

/// Reads `path` again; only trigger thresholds may change while running.
fn reload_config(path: &Path, running: &Config) -> anyhow::Result<Config> {
    let mut new = Config::from_file(path)?;
    if new.daemon.workload != running.daemon.workload {
        anyhow::bail!("daemon.workload cannot change without a restart");
    }
    // Keep everything but the thresholds as running: inputs, outputs and the daemon section
    // need a restart.
    new.inputs = running.inputs.clone();
    new.output = running.output.clone();
    new.daemon = running.daemon.clone();
    Ok(new)
}

/// Feeds the pipeline's observations into Prometheus.
struct MetricsObserver {
    metrics: Arc<Metrics>,
    sources: Vec<SourceMetrics>,
    /// Per source, `trigd_input_refused_total` children in [`REFUSED_REASONS`] order.
    refused: Vec<[prometheus::IntCounter; REFUSED_REASONS.len()]>,
    backends: [BackendMetrics; 2],
    stages: [prometheus::Histogram; 5],
    rings: Mutex<Vec<(String, RingMetrics)>>,
    /// Per source, a NATS input's metrics (`None` for other inputs).
    nats: Vec<Option<crate::metrics::NatsSourceMetrics>>,
}

impl Observe for MetricsObserver {
    fn received(&self, source: u16) {
        if let Some(s) = self.sources.get(source as usize) {
            s.received();
        }
    }
    fn stage(&self, stage: Stage, seconds: f64) {
        let i = Stage::ALL.iter().position(|s| *s == stage).unwrap_or(0);
        self.stages[i].observe(seconds);
    }
    fn batch(&self, backend: BackendKind, size: usize) {
        self.backends[backend as usize].observe_batch(size);
    }
    fn worker_frames(&self, worker: usize, device: &str) -> Option<pipeline::FrameCount> {
        let c = self.metrics.worker_frames(worker, device);
        Some(Box::new(move |n| c.inc_by(n)))
    }
    fn sequence_gap(&self, source: u16, missing: u64) {
        if let Some(s) = self.sources.get(source as usize) {
            s.sequence_gap(missing);
        }
    }
    fn sequence_repeat(&self, source: u16) {
        if let Some(s) = self.sources.get(source as usize) {
            s.sequence_repeat();
        }
    }
    fn failover(&self) {
        self.metrics.failovers().inc();
    }
    fn sink_error(&self, sink: &'static str, error: &std::io::Error) {
        self.metrics
            .sink_error(sink, crate::sinks::error_kind(error));
    }
    fn sink_lost(&self, sink: &'static str, n: u64) {
        self.metrics.sink_lost(sink, n);
    }
    fn refused(&self, source: u16, reason: &'static str) {
        let i = REFUSED_REASONS.iter().position(|r| *r == reason);
        if let (Some(c), Some(i)) = (self.refused.get(source as usize), i) {
            c[i].inc();
        }
    }
    fn ring_fill(&self, ring: &str, fill: &Fill) {
        let mut rings = match self.rings.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some((_, m)) = rings.iter().find(|(n, _)| n == ring) {
            m.set_fill(fill.len());
        } else {
            let m = self.metrics.ring(ring, fill.capacity());
            m.set_fill(fill.len());
            self.metrics.watch_ring(ring, fill.clone());
            rings.push((ring.to_string(), m));
        }
    }
    fn stream_gap(&self, source: u16, samples: u64) {
        if let Some(s) = self.sources.get(source as usize) {
            self.metrics.stream_gap(s.name(), samples);
        }
    }
    fn accounting(&self, source: u16, balanced: bool) {
        if let Some(s) = self.sources.get(source as usize) {
            let _ = (s, balanced);
        }
    }
    fn consumer_state(&self, source: u16, state: &crate::sources::nats::ConsumerState) {
        if let Some(n) = self.nats.get(source as usize).and_then(Option::as_ref) {
            n.pending.set(state.pending as i64);
            n.ack_pending.set(state.ack_pending as i64);
            n.consumer_redelivered.set(state.redelivered as i64);
        }
    }
    fn redelivered(&self, source: u16) {
        if let Some(n) = self.nats.get(source as usize).and_then(Option::as_ref) {
            n.redelivered.inc();
        }
    }
    fn acked(&self, source: u16, n: u64) {
        if let Some(m) = self.nats.get(source as usize).and_then(Option::as_ref) {
            m.acked.inc_by(n);
        }
    }
}

/// Prints the end-of-run summary: frames/s, outcomes, latency quantiles.
pub fn print_summary(summary: &Summary, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let secs = summary.elapsed.as_secs_f64().max(1e-9);
    let n = summary.frames_in();
    writeln!(
        out,
        "frames      {n} in {secs:.3} s = {:.0} frames/s (backends started in {:.3} s before)",
        n as f64 / secs,
        summary.startup.as_secs_f64()
    )?;
    let outcomes: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| format!("{} {}", o.as_str(), summary.outcome(*o)))
        .collect();
    writeln!(out, "outcomes    {}", outcomes.join(", "))?;
    let l = &summary.latency;
    writeln!(
        out,
        "latency     p50 {:.1} us, p99 {:.1} us, max {:.1} us (arrival to decision)",
        l.quantile_ns(0.5) as f64 / 1e3,
        l.quantile_ns(0.99) as f64 / 1e3,
        l.max_ns() as f64 / 1e3
    )?;
    writeln!(
        out,
        "backend     cpu {} gpu {} (failovers {})",
        summary.by_backend[0], summary.by_backend[1], summary.failovers
    )?;
    for s in &summary.sources {
        if s.sequence_gaps + s.sequence_repeats > 0 {
            writeln!(
                out,
                "sequence    {}: {} missing, {} repeated",
                s.name, s.sequence_gaps, s.sequence_repeats
            )?;
        }
    }
    for s in &summary.sinks {
        if s.errors + s.lost + s.spilled == 0 {
            continue;
        }
        let policy = s.policy.map_or("", SinkPolicy::as_str);
        writeln!(
            out,
            "sink        {} {}: {} errors, {} decisions not written, {} spilled (policy {policy})",
            s.kind, s.target, s.errors, s.lost, s.spilled
        )?;
    }
    if !summary.finder_limits.is_empty() {
        let steps: Vec<String> = summary
            .finder_limits
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        writeln!(
            out,
            "tracking    events that filled the finder's buffers: {} ({} passes raised; \
             tracks below the raised momentum may be missing)",
            steps.join(", "),
            summary.passes_raised
        )?;
    }
    if summary.recording_lost > 0 {
        writeln!(
            out,
            "sink        recording: {} accepted frames not recorded",
            summary.recording_lost
        )?;
    }
    let undelivered = summary.undelivered();
    writeln!(
        out,
        "written     {}",
        if undelivered == 0 {
            "every decision reached every log".to_string()
        } else {
            format!("FAILED: {undelivered} decisions or accepted frames not durably written")
        }
    )?;
    let balanced = summary.balanced();
    writeln!(
        out,
        "accounting  {}",
        if balanced {
            "balanced"
        } else {
            "VIOLATED: frames in != decisions"
        }
    )?;
    Ok(())
}
