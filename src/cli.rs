//! The command line: `trigd run | replay | send | record | convert | simulate | eval | check | top | report`.
//! Parsing and flag-to-configuration overlay live here; the work is in the library.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{Config, InputConfig, Speed, WorkloadKind};
use crate::daemon::{self, Options};
use crate::pipeline::{Input, InputKind};
use crate::sources::replay::{EdfFeed, InputFormat, RecordingFeed, TrackmlFeed};
use crate::sources::Endpoint;
use crate::workload::Outputs;

#[derive(Parser, Debug)]
#[command(
    name = "trigd",
    version,
    about = "GPU trigger daemon: a decision for every detector event or EEG block, under a deadline"
)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `trigd=debug`.
    #[arg(long, global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon: take frames from the configured inputs until SIGINT/SIGTERM.
    Run(RunArgs),
    /// Decide every frame of a recording, a TrackML-style CSV directory or an EDF/BDF file.
    Replay(ReplayArgs),
    /// Play a recording to a daemon, as acquisition hardware would.
    Send(SendArgs),
    /// Write the frames arriving on a socket to a recording.
    Record(RecordArgs),
    /// Convert a TrackML-style CSV directory or an EDF/BDF file to a native recording.
    Convert(ConvertArgs),
    /// Generate data with truth.
    #[command(subcommand)]
    Simulate(SimulateCmd),
    /// Physics performance against truth.
    #[command(subcommand)]
    Eval(EvalCmd),
    /// Check a configuration file and exit.
    Check(CheckArgs),
    /// Write an HTML page of pictures from what a run left: decision log, tracks, source estimates.
    Report(ReportArgs),
    /// A running daemon at a glance: rates, outcomes, latency, rings, sinks, backend.
    Top(TopArgs),
    /// A farm of nodes on NATS JetStream: the farm-level accounting check.
    #[command(subcommand)]
    Farm(FarmCmd),
}

#[derive(Subcommand, Debug)]
enum FarmCmd {
    /// Read the input and decision streams and check frames in = distinct decisions out
    /// (exit 0 when they balance, 3 when not).
    Check(FarmCheckArgs),
}

#[derive(Args, Debug)]
struct FarmCheckArgs {
    /// The server, `nats://HOST:PORT`.
    #[arg(long)]
    nats: String,
    /// The frames' work-queue stream.
    #[arg(long, default_value = "FRAMES")]
    input: String,
    /// The nodes' durable consumer.
    #[arg(long, default_value = crate::farm::DEFAULT_DURABLE)]
    durable: String,
    /// The decision stream.
    #[arg(long, default_value = "DECISIONS")]
    decisions: String,
}

#[derive(Subcommand, Debug)]
enum SimulateCmd {
    /// Detector events from a target through the field, with truth (TrackML CSV and/or a recording).
    Tracking(crate::tracking::cli::SimulateTrackingArgs),
    /// EEG recordings (EDF/BDF) with a dipole at a chosen place and sensor noise.
    Eeg(crate::eeg::cli::SimulateEegArgs),
}

#[derive(Subcommand, Debug)]
enum EvalCmd {
    /// Efficiency, ghost and clone rates, TrackML score, resolution and pulls.
    Tracking(EvalTracking),
}

#[derive(Args, Debug)]
struct EvalTracking {
    #[command(flatten)]
    args: crate::tracking::cli::EvalTrackingArgs,
    /// Configuration with a [tracking] table (finder overrides); default: derived from the geometry.
    #[arg(long = "config")]
    config: Option<PathBuf>,
}

/// Settings shared by `run` and `replay` that override the configuration file.
#[derive(Args, Debug, Default)]
struct CommonArgs {
    /// Configuration file (TOML); flags override its values.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Workload: multiplicity, tracking or eeg.
    #[arg(long, value_enum)]
    workload: Option<WorkloadKind>,
    /// Backend: auto, gpu or cpu.
    #[arg(long)]
    backend: Option<String>,
    /// Detector geometry TOML (tracking).
    #[arg(long)]
    geometry: Option<PathBuf>,
    /// Decision log, JSON lines.
    #[arg(long)]
    decisions: Option<PathBuf>,
    /// Decision log, compact binary.
    #[arg(long)]
    decisions_bin: Option<PathBuf>,
    /// Recording of the accepted frames.
    #[arg(long)]
    accepted_out: Option<PathBuf>,
    /// EEG: lead field NPY [n_channels, 3 n_sources].
    #[arg(long)]
    leadfield: Option<PathBuf>,
    /// EEG: source positions NPY [n_sources, 3], metres.
    #[arg(long)]
    src: Option<PathBuf>,
    /// EEG: noise covariance NPY [n_channels, n_channels].
    #[arg(long)]
    noise_cov: Option<PathBuf>,
    /// EEG: channel names, one per line.
    #[arg(long)]
    channels: Option<PathBuf>,
    /// EEG: MNE, dSPM, sLORETA or eLORETA.
    #[arg(long)]
    method: Option<String>,
    /// EEG: regularisation lambda2.
    #[arg(long)]
    lambda2: Option<f64>,
    /// EEG: float32 (default) or float64 arithmetic on the CPU.
    #[arg(long)]
    precision: Option<String>,
    /// EEG: samples per frame when replaying EDF/BDF.
    #[arg(long)]
    block_samples: Option<usize>,
    /// Per-frame deadline in milliseconds from arrival.
    #[arg(long)]
    budget_ms: Option<f64>,
    /// Reconstruction workers.
    #[arg(long)]
    workers: Option<usize>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Input `udp://HOST:PORT`, `tcp://HOST:PORT`, `nats://HOST:PORT/STREAM` (a farm node
    /// pulling from a JetStream work queue) or an LSL EEG stream `lsl://type=EEG`
    /// (`lsl://name=X&unit=uV&drop=EOG`, or an XPath predicate) (repeatable); adds to the
    /// file's inputs.
    #[arg(long)]
    listen: Vec<String>,
    /// NATS inputs: the durable consumer the farm's nodes share (default `trigd`).
    #[arg(long)]
    durable: Option<String>,
    /// NATS inputs: seconds the server waits for an acknowledgement before it redelivers
    /// a frame to another node (default 30; applies when the consumer is created).
    #[arg(long)]
    ack_wait_s: Option<f64>,
    /// NATS: keep trying to reach the server at start for this many seconds (default 0:
    /// fail at once with a clear error).
    #[arg(long)]
    connect_retry_s: Option<f64>,
    /// Decisions to a NATS JetStream stream `nats://HOST:PORT/STREAM`.
    #[arg(long)]
    decisions_nats: Option<String>,
    /// Accepted frames to a NATS JetStream stream `nats://HOST:PORT/STREAM`.
    #[arg(long)]
    accepted_nats: Option<String>,
    /// Prometheus endpoint address (default 127.0.0.1:9187).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Sender network (CIDR) the `--listen` inputs accept (repeatable); others are refused.
    #[arg(long)]
    allow: Vec<crate::sources::Cidr>,
    /// Publish decisions as an LSL marker stream of this name (accepted blocks only,
    /// unless --lsl-markers-all).
    #[arg(long)]
    lsl_markers: Option<String>,
    /// A marker for every decision, not only the accepted ones.
    #[arg(long, requires = "lsl_markers")]
    lsl_markers_all: bool,
    /// Marker text: `json` (the decision record) or `code` (`accept roi`, ...).
    #[arg(long, requires = "lsl_markers")]
    lsl_markers_format: Option<String>,
    /// Publish the EEG region-of-interest statistic as an LSL stream of this name.
    #[arg(long)]
    lsl_statistic: Option<String>,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// A native recording, a TrackML-style CSV directory, or an EDF/BDF file.
    input: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
    /// Pace: `max` (as fast as possible, no deadlines) or a factor of the recorded pace.
    #[arg(long, default_value = "max")]
    speed: Speed,
    /// Tracking: write tracks in TrackML submission format (event_id,hit_id,track_id).
    #[arg(long)]
    tracks_out: Option<PathBuf>,
    /// EEG: write source amplitudes as NPY [n_sources, n_samples] float32.
    #[arg(long)]
    sources_out: Option<PathBuf>,
    /// Also serve metrics during the replay on this address.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Never show a progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args, Debug)]
struct SendArgs {
    /// Recording to play (with `--to lsl://...` also an EDF/BDF file).
    recording: PathBuf,
    /// Target `udp://HOST:PORT`, `tcp://HOST:PORT`, `nats://HOST:PORT/STREAM` (a
    /// JetStream work queue, created if missing; every frame acknowledged by the server), or
    /// an LSL outlet `lsl://name=NAME[&type=EEG][&source_id=ID]` played at the recorded rate.
    #[arg(long)]
    to: String,
    /// LSL: the channel names (one per line) of a native recording's EEG blocks, or the
    /// EDF/BDF channels to play (default: all).
    #[arg(long)]
    channels: Option<PathBuf>,
    /// Frames per second (default: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// NATS: keep trying to reach the server at start for this many seconds.
    #[arg(long, default_value_t = 0.0)]
    connect_retry_s: f64,
}

#[derive(Args, Debug)]
struct RecordArgs {
    /// Socket to listen on, `udp://HOST:PORT` or `tcp://HOST:PORT`, or a JetStream stream
    /// to consume, `nats://HOST:PORT/STREAM` (each frame acknowledged once written).
    #[arg(long)]
    listen: String,
    /// NATS: the durable consumer to read with.
    #[arg(long, default_value = "record")]
    durable: String,
    /// NATS: stop after this many frames (default: at SIGINT/SIGTERM).
    #[arg(long)]
    count: Option<u64>,
    /// Recording to write (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// fsync policy: never, always, every:N, interval:DURATION.
    #[arg(long, default_value = "interval:1s")]
    fsync: String,
}

#[derive(Args, Debug)]
struct ConvertArgs {
    /// A TrackML-style CSV directory or an EDF/BDF file.
    input: PathBuf,
    /// Recording to write.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Decision log (JSON lines) the run wrote with `--decisions`.
    #[arg(long)]
    decisions: PathBuf,
    /// Directory for index.html and the pictures (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Decisions per bin in the pictures over the run (default: about 50 bins).
    #[arg(long)]
    bin_decisions: Option<usize>,
    /// Tracking: the replay's `--tracks-out` (event_id,hit_id,track_id), for event displays.
    #[arg(long)]
    tracks_out: Option<PathBuf>,
    /// Tracking: the TrackML CSV directory the replay read.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Tracking: detector geometry TOML (draws the planes).
    #[arg(long)]
    geometry: Option<PathBuf>,
    /// Tracking: event to display (repeatable); default: the first accepted and the first rejected.
    #[arg(long = "event")]
    event: Vec<u64>,
    /// Tracking: the directory `trigd eval tracking --plots DIR` wrote; its SVGs join the page.
    #[arg(long)]
    eval: Option<PathBuf>,
    /// EEG: the replay's `--sources-out` (NPY [n_sources, n_samples]).
    #[arg(long)]
    sources_out: Option<PathBuf>,
    /// EEG: source positions NPY [n_sources, 3], metres (the replay's `--src`).
    #[arg(long)]
    src: Option<PathBuf>,
    /// EEG: the run's configuration; its [eeg.roi] (and [eeg] block_samples) are used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// EEG: region of interest as source indices, e.g. `194,195,196` (instead of --config).
    #[arg(long, value_delimiter = ',', conflicts_with = "roi_sphere_mm")]
    roi_sources: Option<Vec<u32>>,
    /// EEG: region of interest as a sphere `X,Y,Z,RADIUS` in mm (instead of --config).
    #[arg(long, allow_hyphen_values = true, value_name = "X,Y,Z,RADIUS")]
    roi_sphere_mm: Option<String>,
    /// EEG: the region's sliding window (with --roi-sources / --roi-sphere-mm).
    #[arg(long, default_value_t = 100.0)]
    roi_window_ms: f64,
    /// EEG: the trigger threshold (with --roi-sources / --roi-sphere-mm; default: none).
    #[arg(long)]
    roi_threshold: Option<f64>,
    /// EEG: the refractory period (with --roi-sources / --roi-sphere-mm).
    #[arg(long, default_value_t = 0.0)]
    roi_refractory_ms: f64,
    /// EEG: samples per frame of the replay (default: the configuration's, else 32).
    #[arg(long)]
    block_samples: Option<usize>,
    /// EEG: sample rate of the source estimates (default: from the decisions' time stamps).
    #[arg(long)]
    sample_rate_hz: Option<f64>,
    /// EEG: draw the source map at this sample (default: the peak of the ROI statistic).
    #[arg(long)]
    map_sample: Option<usize>,
}

#[derive(Args, Debug)]
struct TopArgs {
    /// The daemon's metrics endpoint (its `--metrics-addr`).
    #[arg(long, default_value = "127.0.0.1:9187")]
    metrics_addr: std::net::SocketAddr,
    /// Time between refreshes, milliseconds (the rates are over this interval).
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Print one screen (after two scrapes an interval apart) and exit.
    #[arg(long)]
    once: bool,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Configuration file to validate.
    #[arg(long)]
    config: PathBuf,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("trigd: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr)
        .try_init();
}

fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(a) => cmd_run(a),
        Command::Replay(a) => cmd_replay(a),
        Command::Send(a) => cmd_send(a),
        Command::Record(a) => cmd_record(a),
        Command::Farm(FarmCmd::Check(a)) => cmd_farm_check(a),
        Command::Convert(a) => cmd_convert(a),
        Command::Simulate(SimulateCmd::Tracking(a)) => {
            let mut writer = match &a.recording {
                Some(p) => Some(
                    crate::recording::RecordingWriter::create(
                        p,
                        crate::recording::FsyncPolicy::Never,
                    )
                    .with_context(|| format!("creating {}", p.display()))?,
                ),
                None => None,
            };
            let s = crate::tracking::cli::run_simulate(&a, |frame| match writer.as_mut() {
                Some(w) => w.append(frame).map(|_| ()).map_err(anyhow::Error::from),
                None => Ok(()),
            })?;
            if let Some(w) = writer {
                w.finish()?;
            }
            println!(
                "simulated {} events: {} hits, {} particles ({} reconstructable)",
                s.n_events, s.n_hits, s.n_particles, s.n_reconstructable
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate(SimulateCmd::Eeg(a)) => {
            crate::eeg::cli::run_simulate(&a)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval(EvalCmd::Tracking(e)) => {
            let overrides = match &e.config {
                Some(p) => {
                    let cfg = Config::from_file(p)?;
                    match cfg.tracking {
                        Some(mut t) => {
                            t.entry("geometry").or_insert_with(|| {
                                toml::Value::String(e.args.geometry.display().to_string())
                            });
                            let cfg = Config {
                                tracking: Some(t),
                                ..Config::default()
                            };
                            let names_min_p = cfg
                                .tracking
                                .as_ref()
                                .is_some_and(|t| t.contains_key("min_p_gev"));
                            let tc = crate::backend::tracking::TrackingConfig::from_config(&cfg)?;
                            Some((names_min_p.then_some(tc.min_p_gev), tc.finder))
                        }
                        None => None,
                    }
                }
                None => None,
            };
            // The finder looks for tracks from the momentum the particles are counted from,
            // unless the configuration names its own.
            let (min_p, mut ov) = overrides.unwrap_or((None, Default::default()));
            let min_p = min_p.unwrap_or(if e.args.min_p > 0.0 {
                e.args.min_p
            } else {
                crate::backend::tracking::DEFAULT_MIN_P_GEV
            });
            let (mut beam_min_p_gev, mut qop_assumed) = (0.0, false);
            if e.args.tracks.is_none() {
                // The configuration's finder is refused with its reason, as the daemon's.
                let det = crate::tracking::geometry::Detector::from_toml_file(&e.args.geometry)?;
                let cfg = crate::tracking::reco::FinderConfig::from_detector_with(&det, min_p, &ov);
                cfg.validate(&det)
                    .map_err(|err| anyhow::anyhow!("[tracking.finder]: {err}"))?;
                for w in crate::tracking::ca::summary::warnings(&det, &cfg) {
                    tracing::warn!("{}: {w}", e.args.geometry.display());
                }
                origin_from_first_events(&det, &e.args.events, e.args.max_events, min_p, &mut ov)?;
                spectrum_from_first_events(
                    &det,
                    &e.args.events,
                    e.args.max_events,
                    min_p,
                    &mut ov,
                )?;
                // The report's beam spot from the tracks the first events' measurement and
                // the daemon's watch take.
                let finder =
                    crate::tracking::reco::FinderConfig::from_detector_with(&det, min_p, &ov);
                beam_min_p_gev = crate::tracking::beam_spot::stiff_p_gev(&finder);
                qop_assumed = !finder.fit.fit_momentum;
            }
            let mut reco: Option<crate::tracking::reco::Reconstructor> = None;
            let mut finder = None;
            let args = crate::tracking::cli::EvalTrackingArgs {
                origin_z_mm: ov.origin_z_mm.unwrap_or(0.0),
                beam_min_p_gev,
                qop_assumed,
                ..e.args.clone()
            };
            let report = crate::tracking::cli::run_eval(&args, |det, hits| {
                let r = reco.get_or_insert_with(|| {
                    let cfg =
                        crate::tracking::reco::FinderConfig::from_detector_with(det, min_p, &ov);
                    finder = Some(cfg.clone());
                    crate::tracking::reco::Reconstructor::new(det, cfg)
                });
                let mut tracks = Vec::new();
                r.reconstruct(hits, &mut tracks);
                crate::backend::tracking::report_limits(r, None);
                Ok(tracks)
            })?;
            if let (Some(spot), Some(cfg)) = (&report.beam_spot, &finder) {
                if let Some(advice) = crate::tracking::beam_spot::origin_advice(spot, cfg) {
                    tracing::warn!("{advice}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(a) => cmd_report(a),
        Command::Top(a) => {
            crate::top::run(
                a.metrics_addr,
                std::time::Duration::from_millis(a.interval_ms.max(10)),
                a.once,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(a) => {
            let cfg = Config::from_file(&a.config)?;
            // A tracking or EEG configuration is built as the daemon builds it (for
            // tracking: the geometry and its field map read, the finder derived and
            // checked; for EEG: the inputs read, the operator built, the region resolved on
            // the source space), so that what `run` would refuse is refused here, and what
            // was derived is shown.
            let tracking = if cfg.daemon.workload == crate::config::WorkloadKind::Tracking
                || cfg.tracking.is_some()
            {
                Some(crate::backend::tracking::TrackingSetup::new(&cfg, None)?)
            } else {
                None
            };
            // The EEG operator is built without its cache: a check (perhaps by another
            // user than the daemon's) writes nothing the daemon later reads.
            let eeg =
                if cfg.daemon.workload == crate::config::WorkloadKind::Eeg || cfg.eeg.is_some() {
                    let mut uncached = cfg.clone();
                    if let Some(t) = uncached.eeg.as_mut() {
                        t.remove("cache");
                    }
                    Some(crate::backend::eeg::EegSetup::new(&uncached, None)?)
                } else {
                    None
                };
            println!(
                "{}: ok ({} inputs, workload {})",
                a.config.display(),
                cfg.inputs.len(),
                cfg.daemon.workload.as_str()
            );
            if let Some(t) = tracking {
                println!();
                print!(
                    "{}",
                    crate::tracking::ca::summary::summary(&t.detector, &t.finder)
                );
            }
            if let Some(e) = eeg {
                println!();
                print!("{}", e.summary());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Where the configuration gives no origin (its centre, or its box): the beam spot measured
/// from the tracks of the first events ([`crate::tracking::beam_spot::measure_origin`]);
/// where it lies off the default centre by more than a third of the box, the finder is
/// centred on it, and where the tracks spread wider than the box holds, the box is
/// widened to four spreads ([`crate::tracking::beam_spot::widened_origin`]), or, where none of the
/// origin is configured, the origin moved to the plane upstream where they come together
/// ([`crate::tracking::beam_spot::measure_origin_z`]); where they come from a region along
/// the beam longer than the box's share allows (a long target), the origin is made as
/// long ([`crate::tracking::beam_spot::longer_origin`]) before the box is measured
/// again; where a field measures their momenta and four spreads of the stiff ones are
/// well within the box, the box is narrowed to them
/// ([`crate::tracking::beam_spot::narrower_origin`]), and the centre judged against it. Each is said: a daemon needs them in its configuration, `[tracking.finder]
/// origin_x_mm`, `origin_y_mm`, `origin_z_mm`, `origin_half_x_mm`, `origin_half_y_mm`,
/// `origin_half_z_mm`. The caller has checked `det` and the finder
/// configuration `ov` gives.
fn origin_from_first_events(
    det: &crate::tracking::geometry::Detector,
    dir: &std::path::Path,
    max_events: Option<usize>,
    min_p: f64,
    ov: &mut crate::tracking::reco::FinderOverrides,
) -> anyhow::Result<()> {
    use crate::tracking::beam_spot;
    let (free_centre, free_box) = (
        ov.origin_x_mm.is_none() && ov.origin_y_mm.is_none(),
        ov.origin_half_x_mm.is_none() && ov.origin_half_y_mm.is_none(),
    );
    if !free_centre && !free_box {
        return Ok(());
    }
    let cfg = crate::tracking::reco::FinderConfig::from_detector_with(det, min_p, ov);
    let events = first_events(det, dir, max_events, beam_spot::ORIGIN_EVENTS)?;
    let Some(mut spot) = beam_spot::measure_origin(det, &cfg, &events) else {
        return Ok(());
    };
    let mut cfg = cfg;
    // The finder as `ov` now gives it, and the first events' tracks measured with it.
    let measure_again = |ov: &crate::tracking::reco::FinderOverrides| {
        let cfg = crate::tracking::reco::FinderConfig::from_detector_with(det, min_p, ov);
        beam_spot::measure_origin(det, &cfg, &events).map(|spot| (cfg, spot))
    };
    if ov.origin_z_mm.is_none()
        && free_centre
        && free_box
        && beam_spot::wider_origin(&spot, &cfg).is_some()
    {
        // Spread wider than the box: perhaps a target elsewhere in z.
        if let Some((at_origin, at_z)) = beam_spot::measure_origin_z(det, &cfg, &events) {
            if beam_spot::origin_elsewhere(&at_origin, &at_z, &cfg) {
                let z = (at_z.z_mm * 10.0).round() / 10.0;
                tracing::warn!(
                    "the configuration gives no origin, and the first events' {} tracks come from z = {z} mm (spread {:.3} x {:.3} mm there, {:.3} x {:.3} mm at z = {} mm): the finder's origin is moved there; a daemon needs [tracking.finder] origin_z_mm = {z}",
                    at_z.n_tracks,
                    at_z.spread_mm[0],
                    at_z.spread_mm[1],
                    at_origin.spread_mm[0],
                    at_origin.spread_mm[1],
                    cfg.origin_z_mm
                );
                eprintln!("origin measured from the first events' tracks at z = {z} mm");
                ov.origin_z_mm = Some(z);
                let Some(again) = measure_again(ov) else {
                    return Ok(());
                };
                (cfg, spot) = again;
            }
        }
    }
    if free_box && ov.origin_half_z_mm.is_none() {
        if let (Some(hz), Some(l)) = (beam_spot::longer_origin(&spot, &cfg), spot.length) {
            // A long target: the origin there and as long, then measured again (the box
            // below from the spread across the tracks' direction).
            let (z, hz) = if ov.origin_z_mm.is_none()
                && (l.z_centre_mm - cfg.origin_z_mm).abs() > 1.0_f64.max(0.25 * l.half_length_mm)
            {
                let z = (l.z_centre_mm * 10.0).round() / 10.0;
                ov.origin_z_mm = Some(z);
                (z, (l.half_length_mm * 10.0).ceil() / 10.0)
            } else {
                (cfg.origin_z_mm, hz)
            };
            tracing::warn!(
                "the configuration gives no origin length, and the first events' {} inclined tracks come from z = {:.1} mm, {:.1} mm either side (a track's error there {:.1} mm): the finder's origin is made as long; a daemon needs [tracking.finder] origin_z_mm = {z} and origin_half_z_mm = {hz}",
                l.n_tracks,
                l.z_centre_mm,
                l.half_length_mm,
                l.z_error_mm
            );
            eprintln!("origin length measured from the first events' tracks: z = {z} mm, half length {hz} mm");
            ov.origin_half_z_mm = Some(hz);
            let Some(again) = measure_again(ov) else {
                return Ok(());
            };
            (cfg, spot) = again;
        }
    }
    if free_box {
        // A widened box is measured again with itself until it settles: tracks found with a
        // box wider than the beam's may spread because of it (`settled_origin`).
        let wider = beam_spot::widened_origin(&spot, &cfg).map(|b| {
            match beam_spot::settled_origin(det, &cfg, &events, b) {
                Some((settled, s)) if settled != b => {
                    spot = s;
                    (
                        settled,
                        "wider than the default box holds, and found again with the wider box until it settles",
                        "set to four spreads of the tracks it finds,",
                        "settled",
                    )
                }
                _ => (
                    b,
                    "wider than the default box holds",
                    "widened to four spreads,",
                    "widened",
                ),
            }
        });
        let change = wider.or_else(|| {
            beam_spot::narrower_origin(&spot, &cfg).map(|b| {
                (
                    b,
                    "four spreads well within the default box (in busy events a narrower box holds fewer combinations)",
                    "narrowed to four spreads,",
                    "narrowed",
                )
            })
        });
        if let Some(([hx, hy], why, what, verb)) = change {
            tracing::warn!(
                "the configuration gives no origin box, and the first events' {} tracks spread {:.3} x {:.3} mm about their centre (z = {} mm), {why}: the finder's box is {what} {hx} x {hy} mm; a daemon needs [tracking.finder] origin_half_x_mm = {hx} and origin_half_y_mm = {hy}",
                spot.n_tracks,
                spot.spread_mm[0],
                spot.spread_mm[1],
                spot.z_mm
            );
            eprintln!("origin box {verb} to the first events' tracks: half sizes {hx} x {hy} mm");
            ov.origin_half_x_mm = Some(hx);
            ov.origin_half_y_mm = Some(hy);
            // The centre is then judged against the new box.
            (cfg.origin_half_x_mm, cfg.origin_half_y_mm) = (hx, hy);
        }
    }
    if free_centre && beam_spot::off_the_origin(&spot, &cfg) {
        let round = |v: f64| (v * 1e3).round() / 1e3;
        let (x, y) = (round(spot.centre_mm[0]), round(spot.centre_mm[1]));
        tracing::warn!(
            "the configuration gives no origin centre, and the first events' {} tracks come from x = {x} mm, y = {y} mm (z = {} mm), off the default (0, 0) by more than a third of the origin box: the finder is centred there; a daemon needs [tracking.finder] origin_x_mm = {x} and origin_y_mm = {y}",
            spot.n_tracks,
            spot.z_mm
        );
        eprintln!("origin centre measured from the first events' tracks: x = {x} mm, y = {y} mm");
        ov.origin_x_mm = Some(x);
        ov.origin_y_mm = Some(y);
    }
    Ok(())
}

/// The hits of the first events of a TrackML-style directory (at most `max_events`, and at
/// most `limit`), up to the first that cannot be read.
fn first_events(
    det: &crate::tracking::geometry::Detector,
    dir: &std::path::Path,
    max_events: Option<usize>,
    limit: usize,
) -> anyhow::Result<Vec<Vec<crate::frame::HitRecord>>> {
    Ok(crate::tracking::trackml::read_trackml_dir(dir)?
        .with_planes(det.planes.iter().map(|p| p.z_mm).collect())
        .take(max_events.unwrap_or(usize::MAX).min(limit))
        .map_while(Result::ok)
        .map(|ev| ev.hits)
        .collect())
}

/// Where no field measures the tracks' momenta and the configuration gives neither a
/// momentum nor a spectrum (`[tracking.finder.fit] p_no_field_gev`, `scatter_prior`): the
/// spectrum of the first events' tracks for the fit's scattering estimate
/// ([`crate::tracking::spectrum::measure_scatter_prior`]), said with what a daemon needs in
/// its configuration.
fn spectrum_from_first_events(
    det: &crate::tracking::geometry::Detector,
    dir: &std::path::Path,
    max_events: Option<usize>,
    min_p: f64,
    ov: &mut crate::tracking::reco::FinderOverrides,
) -> anyhow::Result<()> {
    use crate::tracking::spectrum;
    let cfg = crate::tracking::reco::FinderConfig::from_detector_with(det, min_p, ov);
    if !cfg.fit.estimates_scattering() || cfg.fit.scatter_prior.is_some() {
        return Ok(());
    }
    let events = first_events(det, dir, max_events, spectrum::MAX_EVENTS)?;
    let Some((w, n)) = spectrum::measure_scatter_prior(det, &cfg, &events) else {
        return Ok(());
    };
    // Four significant digits are far below what the sample tells.
    let w: Vec<f64> = w
        .iter()
        .map(|&v| {
            let scale = 10f64.powi(3 - v.log10().floor() as i32);
            (v * scale).round() / scale
        })
        .collect();
    let mean = spectrum::mean_p_gev(&w, cfg.fit.scatter_p_min_gev);
    let list = w
        .iter()
        .map(|v| format!("{v}"))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::warn!(
        "no field measures the tracks' momenta and the configuration gives no spectrum: the fit's scattering estimate takes the spectrum of the first events' {n} tracks (mean momentum {mean:.2} GeV/c); a daemon needs [tracking.finder.fit] scatter_prior = [{list}]"
    );
    eprintln!("scattering spectrum measured from the first events' {n} tracks: mean momentum {mean:.2} GeV/c");
    ov.fit.scatter_prior = Some(w);
    Ok(())
}

/// A replay of a TrackML-style directory with the tracking workload, where the
/// configuration gives no origin: the origin the first events' tracks show, as `trigd eval
/// tracking` finds it ([`origin_from_first_events`]), written into `[tracking.finder]`;
/// and, where no field measures the momenta and none is configured, the spectrum for the
/// fit's scattering ([`spectrum_from_first_events`]), into `[tracking.finder.fit]
/// scatter_prior`; the replay then decides as the evaluation reconstructs. (A live input
/// has no first events to read ahead: the daemon measures the decided events' beam spot
/// and warns instead, and takes the spectrum its configuration gives.)
fn origin_for_replay(cfg: &mut Config, dir: &std::path::Path) -> anyhow::Result<()> {
    // Errors in the configuration or the geometry are the daemon's to report.
    let Ok(tc) = crate::backend::tracking::TrackingConfig::from_config(cfg) else {
        return Ok(());
    };
    let Ok(det) = crate::tracking::geometry::Detector::from_toml_file(&tc.geometry) else {
        return Ok(());
    };
    let mut ov = tc.finder.clone();
    let finder = crate::tracking::reco::FinderConfig::from_detector_with(&det, tc.min_p_gev, &ov);
    if finder.validate(&det).is_err() {
        return Ok(());
    }
    origin_from_first_events(&det, dir, None, tc.min_p_gev, &mut ov)?;
    let table = cfg.tracking.get_or_insert_with(Default::default);
    let finder = table
        .entry("finder")
        .or_insert_with(|| toml::Value::Table(Default::default()));
    if let toml::Value::Table(f) = finder {
        for (key, now, before) in [
            ("origin_x_mm", ov.origin_x_mm, tc.finder.origin_x_mm),
            ("origin_y_mm", ov.origin_y_mm, tc.finder.origin_y_mm),
            ("origin_z_mm", ov.origin_z_mm, tc.finder.origin_z_mm),
            (
                "origin_half_x_mm",
                ov.origin_half_x_mm,
                tc.finder.origin_half_x_mm,
            ),
            (
                "origin_half_y_mm",
                ov.origin_half_y_mm,
                tc.finder.origin_half_y_mm,
            ),
            (
                "origin_half_z_mm",
                ov.origin_half_z_mm,
                tc.finder.origin_half_z_mm,
            ),
        ] {
            if let (Some(v), None) = (now, before) {
                f.insert(key.into(), toml::Value::Float(v));
            }
        }
    }
    // Then the spectrum, with the origin the finder now has.
    let before = ov.fit.scatter_prior.is_some();
    spectrum_from_first_events(&det, dir, None, tc.min_p_gev, &mut ov)?;
    if let (Some(w), false) = (&ov.fit.scatter_prior, before) {
        if let Some(toml::Value::Table(f)) = table.get_mut("finder") {
            let fit = f
                .entry("fit")
                .or_insert_with(|| toml::Value::Table(Default::default()));
            if let toml::Value::Table(fit) = fit {
                fit.insert(
                    "scatter_prior".into(),
                    toml::Value::Array(w.iter().map(|&v| toml::Value::Float(v)).collect()),
                );
            }
        }
    }
    Ok(())
}

/// Reads the configuration file (if any) and overlays the flags.
fn load_config(common: &CommonArgs) -> anyhow::Result<Config> {
    let mut cfg = match &common.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    if let Some(w) = common.workload {
        cfg.daemon.workload = w;
    }
    if let Some(b) = &common.backend {
        cfg.daemon.backend = b.clone();
    }
    if let Some(b) = common.budget_ms {
        cfg.daemon.budget_ms = b;
    }
    if let Some(w) = common.workers {
        cfg.daemon.workers = w;
    }
    if let Some(g) = &common.geometry {
        let t = cfg.tracking.get_or_insert_with(toml::Table::new);
        t.insert(
            "geometry".into(),
            toml::Value::String(g.display().to_string()),
        );
    }
    let eeg_flags: [(&str, Option<toml::Value>); 8] = [
        (
            "leadfield",
            common
                .leadfield
                .as_ref()
                .map(|p| toml::Value::String(p.display().to_string())),
        ),
        (
            "src",
            common
                .src
                .as_ref()
                .map(|p| toml::Value::String(p.display().to_string())),
        ),
        (
            "noise_cov",
            common
                .noise_cov
                .as_ref()
                .map(|p| toml::Value::String(p.display().to_string())),
        ),
        (
            "channels",
            common
                .channels
                .as_ref()
                .map(|p| toml::Value::String(p.display().to_string())),
        ),
        ("method", common.method.clone().map(toml::Value::String)),
        ("lambda2", common.lambda2.map(toml::Value::Float)),
        (
            "precision",
            common.precision.clone().map(toml::Value::String),
        ),
        (
            "block_samples",
            common.block_samples.map(|n| toml::Value::Integer(n as i64)),
        ),
    ];
    for (key, value) in eeg_flags {
        if let Some(v) = value {
            cfg.eeg
                .get_or_insert_with(toml::Table::new)
                .insert(key.into(), v);
        }
    }
    if let Some(p) = &common.decisions {
        cfg.output.decisions_jsonl = Some(p.clone());
    }
    if let Some(p) = &common.decisions_bin {
        cfg.output.decisions_binlog = Some(p.clone());
    }
    if let Some(p) = &common.accepted_out {
        cfg.output.accepted_recording = Some(p.clone());
    }
    Ok(cfg)
}

fn validated(cfg: Config) -> anyhow::Result<Config> {
    let name = cfg
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "command line".into());
    cfg.validate().map_err(|m| anyhow::anyhow!("{name}: {m}"))?;
    Ok(cfg)
}

/// 0: every frame decided and every decision written; 3: accounting violated; 4:
/// decisions (or accepted frames) not durably written.
fn exit_code(summary: &crate::pipeline::Summary) -> ExitCode {
    if !summary.balanced() {
        ExitCode::from(3)
    } else if summary.undelivered() > 0 {
        ExitCode::from(4)
    } else {
        ExitCode::SUCCESS
    }
}

fn cmd_run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = load_config(&a.common)?;
    for l in &a.listen {
        let mut ic = InputConfig {
            name: None,
            listen: Some(l.clone()),
            file: None,
            speed: None,
            allow: None,
            max_connections: None,
            max_frame_bytes: None,
            idle_timeout_s: None,
            stall_timeout_s: None,
            subject: None,
            durable: None,
            ack_wait_s: None,
            max_ack_pending: None,
            connect_retry_s: None,
            unit: None,
            drop_channels: None,
            extra_channels: None,
        };
        if ic.is_nats() {
            ic.durable = a.durable.clone();
            ic.ack_wait_s = a.ack_wait_s;
            ic.connect_retry_s = a.connect_retry_s;
        } else {
            ic.allow = (!a.allow.is_empty()).then(|| a.allow.clone());
        }
        cfg.inputs.push(ic);
    }
    if let Some(u) = &a.decisions_nats {
        cfg.output.decisions_nats = Some(u.clone());
    }
    if let Some(u) = &a.accepted_nats {
        cfg.output.accepted_nats = Some(u.clone());
    }
    if a.connect_retry_s.is_some() && cfg.output.nats_connect_retry_s.is_none() {
        cfg.output.nats_connect_retry_s = a.connect_retry_s;
    }
    if let Some(m) = a.metrics_addr {
        cfg.daemon.metrics_addr = m;
    }
    if let Some(n) = a.lsl_markers {
        cfg.output.lsl_markers = Some(n);
    }
    if a.lsl_markers_all {
        cfg.output.lsl_markers_all = Some(true);
    }
    if let Some(f) = a.lsl_markers_format {
        cfg.output.lsl_markers_format = Some(f);
    }
    if let Some(n) = a.lsl_statistic {
        cfg.output.lsl_statistic = Some(n);
    }
    let cfg = validated(cfg)?;
    anyhow::ensure!(
        !cfg.inputs.is_empty(),
        "no inputs: give --listen udp://HOST:PORT or [[input]] in --config"
    );
    let inputs = open_inputs(&cfg)?;
    let summary = daemon::execute(
        Options {
            config: cfg,
            deadlines: true,
            serve_metrics: true,
            reload_on_hup: true,
            notify: true,
            progress_total: None,
            outputs: Outputs::default(),
        },
        inputs,
    )?;
    daemon::print_summary(&summary, &mut std::io::stdout())?;
    Ok(exit_code(&summary))
}

/// Opens every configured input: binds sockets, opens files.
fn open_inputs(cfg: &Config) -> anyhow::Result<Vec<Input>> {
    let mut inputs = Vec::new();
    for (index, ic) in cfg.inputs.iter().enumerate() {
        let name = ic.display_name();
        let kind = match (&ic.listen, &ic.file) {
            (Some(_), _) if ic.is_nats() => {
                let spec = ic
                    .nats_spec(cfg.daemon.ring_slots)
                    .map_err(|e| anyhow::anyhow!("input {name}: {e}"))?;
                let url = spec.url.to_string();
                let source = crate::sources::nats::NatsSource::open(spec)
                    .with_context(|| format!("input {name}"))?;
                tracing::info!(input = %name, %url, "pulling frames from the work queue");
                InputKind::Nats(Box::new(source))
            }
            (Some(_), _) if ic.lsl_url().is_some() => {
                let url = ic
                    .lsl_url()
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("input {name}: {e}"))?
                    .context("an lsl:// input")?;
                crate::sources::lsl::LslInput::check_library()
                    .map_err(|e| anyhow::anyhow!("input {name}: {e}"))?;
                let (channels, block_samples) = eeg_channels_and_block(cfg)
                    .with_context(|| format!("input {name} (an LSL EEG stream)"))?;
                tracing::info!(input = %name, predicate = %url.predicate(), "resolving LSL stream");
                InputKind::Lsl(Box::new(crate::sources::lsl::LslInput {
                    url,
                    channels,
                    block_samples,
                    source_id: index as u32,
                }))
            }
            (Some(l), _) => {
                let ep: Endpoint = l
                    .parse()
                    .map_err(|e| anyhow::anyhow!("input {name}: {e}"))?;
                let bound = ep
                    .bind()
                    .with_context(|| format!("input {name}: binding {ep}"))?;
                tracing::info!(input = %name, addr = %bound.local_addr()?, "listening");
                InputKind::Socket(bound, ic.limits())
            }
            (None, Some(f)) => InputKind::File(
                open_feed(f, cfg, index as u32)?,
                ic.speed.unwrap_or(Speed::Max),
            ),
            (None, None) => anyhow::bail!("input {name} has neither listen nor file"),
        };
        inputs.push(Input { name, kind });
    }
    Ok(inputs)
}

/// The EEG channel list (the lead field's order) and the samples per frame.
fn eeg_channels_and_block(cfg: &Config) -> anyhow::Result<(Vec<String>, usize)> {
    let eeg = cfg.eeg.as_ref();
    let channels = eeg
        .and_then(|t| t.get("channels"))
        .and_then(|v| v.as_str())
        .context("needs the EEG channel list (--channels FILE or [eeg] channels)")?;
    let block = match eeg.and_then(|t| t.get("block_samples")) {
        Some(v) => v
            .as_integer()
            .filter(|n| (1..=1 << 20).contains(n))
            .context("eeg.block_samples must be an integer in 1..=1048576")?
            as usize,
        None => 32,
    };
    let channels = crate::eeg::cli::read_channel_names(Path::new(channels))?;
    Ok((channels, block))
}

/// A file input's frames. EDF/BDF files have no producer id: their frames get
/// `source_id` = the input's position, so several files are several EEG streams.
fn open_feed(
    path: &Path,
    cfg: &Config,
    index: u32,
) -> anyhow::Result<Box<dyn crate::pipeline::FrameFeed>> {
    match InputFormat::of(path) {
        InputFormat::Recording => Ok(Box::new(RecordingFeed::open(path)?)),
        InputFormat::TrackmlCsv => {
            // The detector's planes, to check each event's `layer_id` against its hits' z.
            let planes_z = crate::backend::tracking::TrackingConfig::from_config(cfg)
                .ok()
                .and_then(|t| crate::tracking::geometry::Detector::from_toml_file(&t.geometry).ok())
                .map(|d| d.planes.iter().map(|p| p.z_mm).collect())
                .unwrap_or_default();
            Ok(Box::new(TrackmlFeed::open(path, planes_z)?))
        }
        InputFormat::Edf => {
            let eeg = cfg.eeg.as_ref();
            let channels = eeg
                .and_then(|t| t.get("channels"))
                .and_then(|v| v.as_str())
                .context("an EDF/BDF input needs the EEG channel list (--channels FILE or [eeg] channels)")?;
            let block = match eeg.and_then(|t| t.get("block_samples")) {
                Some(v) => v
                    .as_integer()
                    .filter(|n| (1..=1 << 20).contains(n))
                    .context("eeg.block_samples must be an integer in 1..=1048576")?
                    as usize,
                None => 32,
            };
            let channels = crate::eeg::cli::read_channel_names(Path::new(channels))?;
            Ok(Box::new(
                EdfFeed::open(path, &channels, block)?.with_source_id(index),
            ))
        }
    }
}

fn cmd_replay(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = load_config(&a.common)?;
    if cfg.daemon.workload == WorkloadKind::Tracking && a.input.is_dir() {
        origin_for_replay(&mut cfg, &a.input)?;
    }
    cfg.inputs = vec![InputConfig {
        name: Some(a.input.display().to_string()),
        listen: None,
        file: Some(a.input.clone()),
        speed: Some(a.speed),
        allow: None,
        max_connections: None,
        max_frame_bytes: None,
        idle_timeout_s: None,
        stall_timeout_s: None,
        subject: None,
        durable: None,
        ack_wait_s: None,
        max_ack_pending: None,
        connect_retry_s: None,
        unit: None,
        drop_channels: None,
        extra_channels: None,
    }];
    if let Some(m) = a.metrics_addr {
        cfg.daemon.metrics_addr = m;
    }
    let cfg = validated(cfg)?;
    let inputs = open_inputs(&cfg)?;
    let total = match &inputs[0].kind {
        InputKind::File(f, _) => f.total(),
        InputKind::Socket(..) | InputKind::Nats(..) | InputKind::Lsl(..) => None,
    };
    let show_progress = !a.no_progress && std::io::stderr().is_terminal();
    let summary = daemon::execute(
        Options {
            config: cfg,
            // Throughput replay decides every frame; a paced replay behaves as live input.
            deadlines: a.speed != Speed::Max,
            serve_metrics: a.metrics_addr.is_some(),
            reload_on_hup: false,
            notify: false,
            progress_total: if show_progress { total } else { None },
            outputs: Outputs {
                tracks_out: a.tracks_out,
                sources_out: a.sources_out,
            },
        },
        inputs,
    )?;
    daemon::print_summary(&summary, &mut std::io::stdout())?;
    Ok(exit_code(&summary))
}

fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

fn is_nats(s: &str) -> bool {
    s.trim_start().to_ascii_lowercase().starts_with("nats://")
}

fn cmd_send(a: SendArgs) -> anyhow::Result<ExitCode> {
    if crate::lsl::url::is_lsl(&a.to) {
        anyhow::ensure!(
            a.rate.is_none(),
            "--rate does not apply to LSL: samples go out at the recorded rate"
        );
        let url: crate::lsl::url::LslUrl =
            a.to.parse().map_err(|e| anyhow::anyhow!("--to: {e}"))?;
        let channels = a
            .channels
            .as_deref()
            .map(crate::eeg::cli::read_channel_names)
            .transpose()?;
        let stop = stop_on_signals()?;
        let s = crate::lsl::play::play(&a.recording, &url, channels.as_deref(), &stop)?;
        println!(
            "played {} samples of {} channels at {} Hz to {url} in {:.3} s",
            s.samples, s.channels, s.rate_hz, s.seconds
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rec = crate::recording::Recording::open(&a.recording)
        .with_context(|| format!("opening {}", a.recording.display()))?;
    let stop = stop_on_signals()?;
    if is_nats(&a.to) {
        let url: crate::farm::NatsUrl = a.to.parse().map_err(|e| anyhow::anyhow!("--to: {e}"))?;
        anyhow::ensure!(
            a.connect_retry_s.is_finite() && a.connect_retry_s >= 0.0,
            "--connect-retry-s must be a number of seconds >= 0"
        );
        let s = crate::farm::publish_recording(
            &rec,
            &url,
            a.rate,
            std::time::Duration::from_secs_f64(a.connect_retry_s),
            &stop,
        )?;
        println!(
            "published {} frames to {url} in {:.3} s ({:.0} frames/s), every one acknowledged; {} already in the stream, {} sent again",
            s.frames,
            s.elapsed.as_secs_f64(),
            s.frames as f64 / s.elapsed.as_secs_f64().max(1e-9),
            s.duplicates,
            s.retries
        );
        return Ok(ExitCode::SUCCESS);
    }
    let to: Endpoint = a.to.parse().map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let s = crate::send::send(&rec, &to, a.rate, &stop)?;
    println!(
        "sent {} frames to {to} in {:.3} s ({:.0} frames/s)",
        s.frames_sent,
        s.elapsed.as_secs_f64(),
        s.rate_hz()
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_farm_check(a: FarmCheckArgs) -> anyhow::Result<ExitCode> {
    let url: crate::farm::NatsUrl = a.nats.parse().map_err(|e| anyhow::anyhow!("--nats: {e}"))?;
    let c = crate::farm::check(&url, &a.input, &a.durable, &a.decisions)?;
    println!(
        "frames in {}, waiting {}, unacknowledged {}; decisions {} ({} distinct frames): accept {} reject {} timeout {} dropped {} malformed {}",
        c.frames_in,
        c.frames_waiting,
        c.frames_unacked,
        c.decisions,
        c.distinct_decisions,
        c.outcomes[0],
        c.outcomes[1],
        c.outcomes[2],
        c.outcomes[3],
        c.outcomes[4]
    );
    if c.balanced() {
        println!("balanced: every frame has exactly one decision");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("NOT balanced");
        Ok(ExitCode::from(3))
    }
}

fn cmd_record(a: RecordArgs) -> anyhow::Result<ExitCode> {
    if is_nats(&a.listen) {
        let url: crate::farm::NatsUrl = a
            .listen
            .parse()
            .map_err(|e| anyhow::anyhow!("--listen: {e}"))?;
        let fsync = a
            .fsync
            .parse()
            .map_err(|e| anyhow::anyhow!("--fsync: {e}"))?;
        let stop = stop_on_signals()?;
        let n = crate::farm::record_stream(&url, &a.durable, &a.out, fsync, a.count, &stop)?;
        println!("recorded {n} frames from {url} to {}", a.out.display());
        return Ok(ExitCode::SUCCESS);
    }
    let listen: Endpoint = a
        .listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen: {e}"))?;
    let fsync = a
        .fsync
        .parse()
        .map_err(|e| anyhow::anyhow!("--fsync: {e}"))?;
    let stop = stop_on_signals()?;
    let s = crate::record::record(&listen, &a.out, fsync, &stop)?;
    println!(
        "recorded {} frames to {} ({} bytes); malformed {}; sequence gaps {} ({} missing), repeats {}",
        s.frames_written,
        s.path.display(),
        s.file_len_bytes,
        s.malformed_total(),
        s.sequence_gaps,
        s.sequence_missing,
        s.sequence_repeats
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_convert(a: ConvertArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&a.common)?;
    let mut feed = match InputFormat::of(&a.input) {
        InputFormat::Recording => {
            anyhow::bail!("{} is already a native recording", a.input.display())
        }
        _ => open_feed(&a.input, &cfg, 0)?,
    };
    let mut w =
        crate::recording::RecordingWriter::create(&a.out, crate::recording::FsyncPolicy::Never)
            .with_context(|| format!("creating {}", a.out.display()))?;
    let mut buf = Vec::new();
    let mut n = 0u64;
    while let Some(r) = feed.next_frame(&mut buf) {
        r.map_err(|e| anyhow::anyhow!("{}: {} ({})", a.input.display(), e.detail, e.reason))?;
        w.append(&buf)?;
        n += 1;
    }
    w.finish()?;
    println!("wrote {n} frames to {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// The region of interest and block length for `report`: the flags' region, else the
/// configuration's `[eeg.roi]`.
fn report_roi(
    a: &ReportArgs,
) -> anyhow::Result<(Option<crate::eeg::roi::RoiConfig>, Option<usize>)> {
    use crate::eeg::roi::{RoiConfig, RoiSphere};
    let eeg = match &a.config {
        Some(p) => Config::from_file(p)?.eeg,
        None => None,
    };
    let block_samples = match eeg.as_ref().and_then(|t| t.get("block_samples")) {
        Some(v) => Some(
            v.as_integer()
                .filter(|n| (1..=1 << 20).contains(n))
                .context("eeg.block_samples must be an integer in 1..=1048576")?
                as usize,
        ),
        None => None,
    };
    if a.block_samples.is_some_and(|n| !(1..=1 << 20).contains(&n)) {
        anyhow::bail!("--block-samples must be in 1..=1048576 (the replay's samples per frame)");
    }
    let block_samples = a.block_samples.or(block_samples);
    let from_flags = |sphere: Option<RoiSphere>, sources: Option<Vec<u32>>| RoiConfig {
        sphere,
        sources,
        window_ms: a.roi_window_ms,
        threshold: a.roi_threshold.unwrap_or(f64::MAX),
        refractory_ms: a.roi_refractory_ms,
    };
    let roi = match (&a.roi_sphere_mm, &a.roi_sources) {
        (Some(text), _) => {
            let v: Vec<f64> = text
                .split(',')
                .map(|x| x.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|_| {
                    anyhow::anyhow!(
                        "--roi-sphere-mm {text:?}: give X,Y,Z,RADIUS in mm, e.g. -30,-20,50,15"
                    )
                })?;
            let [x, y, z, r] = v[..] else {
                anyhow::bail!(
                    "--roi-sphere-mm {text:?}: give four numbers X,Y,Z,RADIUS in mm, e.g. -30,-20,50,15"
                );
            };
            Some(from_flags(
                Some(RoiSphere {
                    centre_mm: [x, y, z],
                    radius_mm: r,
                }),
                None,
            ))
        }
        (None, Some(s)) => Some(from_flags(None, Some(s.clone()))),
        (None, None) => match eeg.as_ref().and_then(|t| t.get("roi")) {
            Some(v) => Some(v.clone().try_into::<RoiConfig>().map_err(|e| {
                anyhow::anyhow!(
                    "{}: [eeg.roi]: {e}",
                    a.config
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )
            })?),
            None => None,
        },
    };
    if let Some(r) = &roi {
        r.validate()?;
    }
    Ok((roi, block_samples))
}

fn cmd_report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let (roi, block_samples) = report_roi(&a)?;
    let inputs = crate::report::ReportInputs {
        decisions: a.decisions,
        out: a.out,
        bin_decisions: a.bin_decisions,
        tracks: crate::report::TracksInput {
            tracks: a.tracks_out,
            events: a.events,
            geometry: a.geometry,
            chosen: a.event,
        },
        eval: a.eval,
        sources: crate::report::SourcesInput {
            sources: a.sources_out,
            positions: a.src,
            roi,
            sample_rate_hz: a.sample_rate_hz,
            block_samples,
            map_sample: a.map_sample,
        },
    };
    let w = crate::report::write_report(&inputs)?;
    println!(
        "wrote {} with {} pictures",
        w.index.display(),
        w.pictures.len()
    );
    for m in &w.missing {
        println!("not shown: {m}");
    }
    Ok(ExitCode::SUCCESS)
}
