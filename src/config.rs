//! Configuration: one TOML file (`trigd run --config FILE`), validated at start with errors
//! that name the file and the field, overlaid by the command-line flags a first run needs.
//! `deploy/trigd.toml` is the annotated example.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::sinks::file::Rotation;
use crate::sinks::guard::GuardSettings;
use crate::sinks::SinkPolicy;

/// Everything trigd reads at start (and re-reads on SIGHUP for trigger thresholds).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// The inputs, one source thread each (`[[input]]`).
    #[serde(default, rename = "input")]
    pub inputs: Vec<InputConfig>,
    #[serde(default)]
    pub output: OutputConfig,
    /// The hit-multiplicity trigger line: the multiplicity workload's only line (defaults
    /// apply when absent); for tracking, an extra line when this table is present.
    #[serde(default)]
    pub multiplicity: Option<MultiplicityConfig>,
    /// Tracking workload settings (`[tracking]`), read by the tracking backend.
    #[serde(default)]
    pub tracking: Option<toml::Table>,
    /// EEG workload settings (`[eeg]`), read by the EEG backend.
    #[serde(default)]
    pub eeg: Option<toml::Table>,
    /// Where this configuration came from (for error messages and SIGHUP reloads).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// What the frames are reconstructed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// Hit events, decided by the hit-multiplicity line alone.
    #[default]
    Multiplicity,
    /// Hit events: track finding, fitting, trigger lines.
    Tracking,
    /// EEG blocks: inverse estimate, region-of-interest trigger.
    Eeg,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Multiplicity => "multiplicity",
            Self::Tracking => "tracking",
            Self::Eeg => "eeg",
        }
    }
}

/// How a host thread waits for the work it queued on a GPU (the device's scheduling flag,
/// one for the whole process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GpuWait {
    /// The driver's choice: it spins while the process has no more CUDA contexts than the
    /// host has cores (trigd holds one per GPU), else yields.
    #[default]
    Auto,
    /// Busy-waits on its core: the soonest return, a core per waiting thread.
    Spin,
    /// Busy-waits but yields its core to any thread ready to run.
    Yield,
    /// Sleeps until the GPU signals: no core used while waiting, more time per wait (on
    /// an H200, a launch of 8 central events' stages 12-60 % longer than spinning).
    Block,
}

/// Whether socket inputs shed load before the deadline does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Take every frame there is room for; late frames time out.
    #[default]
    None,
    /// Drop a frame at its input (reason `overload`) when the work already queued in the
    /// rings, at the measured reconstruction time per frame, exceeds `budget_ms`: it could
    /// only time out.
    Deadline,
}

/// What a frame whose deadline passed before reconstruction is recorded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutPolicy {
    Accept,
    #[default]
    Reject,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Prometheus endpoint address; loopback unless you mean otherwise.
    pub metrics_addr: SocketAddr,
    pub workload: WorkloadKind,
    /// `auto`, `gpu` or `cpu`.
    pub backend: String,
    /// Time from a frame's arrival to its decision deadline.
    pub budget_ms: f64,
    pub timeout_policy: TimeoutPolicy,
    /// Largest batch handed to a backend at once.
    pub batch_max: usize,
    /// Longest a worker waits for a batch to fill after its first frame.
    pub batch_wait_us: u64,
    /// Frame slots per input (frames in flight per source).
    pub ring_slots: usize,
    /// Initial capacity of each slot; a larger frame grows its slot once.
    pub slot_bytes: usize,
    /// Reconstruction workers. EEG streams (one per frame `source_id`) are spread over them,
    /// each stream on one worker. On GPUs instead: EEG one worker per GPU, tracking
    /// `gpu_workers` per GPU.
    pub workers: usize,
    /// Tracking workers per GPU, each with its own tracker and stream, so one's host work
    /// (reading tracks back, deciding) overlaps another's kernels and their kernels fill
    /// the SMs together (a launch's candidate step runs one block per event). Default 4,
    /// or as many as the GPU's memory holds.
    pub gpu_workers: usize,
    /// How the host threads wait for their GPU work: `auto` (the driver's choice, which
    /// spins on a host with a core per GPU or more), `spin`, `yield` or `block`.
    pub gpu_wait: GpuWait,
    /// Load shedding at the socket inputs: `none` or `deadline`.
    pub admission: Admission,
}

/// Tracking workers per GPU by default.
pub const GPU_WORKERS_DEFAULT: usize = 4;

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 9187)),
            workload: WorkloadKind::Multiplicity,
            backend: "auto".into(),
            budget_ms: 10.0,
            timeout_policy: TimeoutPolicy::Reject,
            batch_max: 64,
            batch_wait_us: 0,
            ring_slots: 1024,
            slot_bytes: 64 * 1024,
            workers: 1,
            gpu_workers: GPU_WORKERS_DEFAULT,
            gpu_wait: GpuWait::Auto,
            admission: Admission::None,
        }
    }
}

impl DaemonConfig {
    pub fn budget(&self) -> Duration {
        Duration::from_secs_f64(self.budget_ms / 1e3)
    }
}

/// Replay pace: the recorded timestamps scaled by a factor, or as fast as possible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    Max,
    Factor(f64),
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        match s.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => Ok(Speed::Factor(f)),
            _ => Err(format!(
                "speed {s:?} is neither `max` nor a positive factor such as 1.0 or 2.0"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Speed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            F(f64),
        }
        match Raw::deserialize(d)? {
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
            Raw::F(f) => f.to_string().parse().map_err(serde::de::Error::custom),
        }
    }
}

/// One input: a socket (`listen = "udp://..."`) or a file (`file = "..."`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputConfig {
    /// Name used in metrics and decision records; defaults to the address or file.
    pub name: Option<String>,
    /// `udp://HOST:PORT` or `tcp://HOST:PORT`.
    pub listen: Option<String>,
    /// A native recording, a TrackML-style CSV directory, or an EDF/BDF file.
    pub file: Option<PathBuf>,
    /// File pace: `"max"` or a factor of the recorded pace.
    pub speed: Option<Speed>,
    /// Sender networks this socket input accepts (CIDR, e.g. `["10.0.0.0/8", "::1"]`);
    /// others are refused and counted. Absent: every sender.
    pub allow: Option<Vec<crate::sources::Cidr>>,
    /// TCP: connections served at once (default 64).
    pub max_connections: Option<usize>,
    /// TCP: largest frame a connection may send, bytes; bounds its receive buffer
    /// (default and most 16 MiB).
    pub max_frame_bytes: Option<usize>,
    /// TCP: close a connection that sends nothing for this long, seconds (default 300).
    pub idle_timeout_s: Option<f64>,
    /// TCP: close a connection that stops inside a frame for this long, seconds (default 10).
    pub stall_timeout_s: Option<f64>,
    /// NATS (`listen = "nats://HOST:PORT/STREAM"`): only messages on this subject (filter
    /// with `*` and `>`; default: every subject of the stream).
    pub subject: Option<String>,
    /// NATS: the durable consumer the farm's nodes share (default `trigd`).
    pub durable: Option<String>,
    /// NATS: how long the server waits for a frame's acknowledgement before it hands the
    /// frame to another node, seconds (default 30). Used when the consumer is created.
    pub ack_wait_s: Option<f64>,
    /// NATS: most frames delivered and unacknowledged over all nodes (default 65536).
    pub max_ack_pending: Option<i64>,
    /// NATS: keep trying to reach the server at start for this long, seconds, with a logged
    /// back-off (default 0: a clear error at once).
    pub connect_retry_s: Option<f64>,
    /// LSL: unit of the stream's samples (`uV`, `mV`, `V`, `microvolts`, ...), overriding
    /// the stream's `desc/channels/channel/unit` metadata.
    pub unit: Option<String>,
    /// LSL: stream channels to leave out, by label (trigger, EOG, status channels).
    pub drop_channels: Option<Vec<String>>,
    /// LSL: what a stream channel the lead field lacks is: `error` (default) or `drop`.
    pub extra_channels: Option<String>,
}

impl InputConfig {
    /// What this (socket) input admits.
    pub fn limits(&self) -> crate::sources::Limits {
        let d = crate::sources::Limits::default();
        crate::sources::Limits {
            allow: self.allow.clone().unwrap_or_default(),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_frame_bytes: self.max_frame_bytes.unwrap_or(d.max_frame_bytes),
            idle_timeout: self
                .idle_timeout_s
                .map_or(d.idle_timeout, Duration::from_secs_f64),
            stall_timeout: self
                .stall_timeout_s
                .map_or(d.stall_timeout, Duration::from_secs_f64),
        }
    }

    /// Whether this is a NATS JetStream input.
    pub fn is_nats(&self) -> bool {
        self.listen
            .as_deref()
            .is_some_and(|l| l.trim_start().to_ascii_lowercase().starts_with("nats://"))
    }

    /// The NATS input's settings; `in_flight_max` is the input's frame slots.
    pub fn nats_spec(
        &self,
        in_flight_max: usize,
    ) -> Result<crate::sources::nats::NatsInputSpec, String> {
        let listen = self.listen.as_deref().unwrap_or_default();
        let url: crate::farm::NatsUrl = listen.parse().map_err(|e| format!("{e}"))?;
        url.stream().map_err(|e| e.to_string())?;
        Ok(crate::sources::nats::NatsInputSpec {
            url,
            consumer: crate::farm::ConsumerSpec {
                durable: self
                    .durable
                    .clone()
                    .unwrap_or_else(|| crate::farm::DEFAULT_DURABLE.into()),
                filter_subject: self.subject.clone(),
                ack_wait: self
                    .ack_wait_s
                    .map_or(crate::farm::DEFAULT_ACK_WAIT, Duration::from_secs_f64),
                max_ack_pending: self
                    .max_ack_pending
                    .unwrap_or(crate::farm::DEFAULT_MAX_ACK_PENDING),
            },
            duplicate_window: crate::farm::DEFAULT_DUPLICATE_WINDOW,
            connect_retry: self
                .connect_retry_s
                .map_or(Duration::ZERO, Duration::from_secs_f64),
            in_flight_max,
        })
    }

    fn validate_nats(&self, i: usize) -> Result<(), String> {
        let nats_only = self.subject.is_some()
            || self.durable.is_some()
            || self.ack_wait_s.is_some()
            || self.max_ack_pending.is_some()
            || self.connect_retry_s.is_some();
        if !self.is_nats() {
            if nats_only {
                return Err(format!(
                    "input[{i}]: subject, durable, ack_wait_s, max_ack_pending and connect_retry_s apply to `listen = \"nats://...\"` inputs only"
                ));
            }
            return Ok(());
        }
        self.nats_spec(1)
            .map_err(|e| format!("input[{i}].listen: {e}"))?;
        if let Some(s) = &self.subject {
            if !crate::farm::valid_subject(s) {
                return Err(format!("input[{i}].subject {s:?} is not a NATS subject (tokens separated by dots, wildcards * and >)"));
            }
        }
        if let Some(d) = &self.durable {
            if !crate::farm::valid_name(d) {
                return Err(format!("input[{i}].durable {d:?} must be 1 to 64 printable characters without . * > / \\ or spaces"));
            }
        }
        for (name, v, max) in [
            ("ack_wait_s", self.ack_wait_s, 86_400.0),
            ("connect_retry_s", self.connect_retry_s, 86_400.0),
        ] {
            if v.is_some_and(|s| !(s.is_finite() && s >= 0.0 && s <= max)) {
                return Err(format!(
                    "input[{i}].{name} must be a number of seconds in [0, 86400]"
                ));
            }
        }
        if self.ack_wait_s.is_some_and(|s| s < 0.1) {
            return Err(format!("input[{i}].ack_wait_s must be at least 0.1"));
        }
        if self.max_ack_pending.is_some_and(|n| n < 1) {
            return Err(format!("input[{i}].max_ack_pending must be at least 1"));
        }
        if self.allow.is_some() {
            return Err(format!("input[{i}].allow applies to udp:// and tcp:// inputs; a NATS input takes what the server holds"));
        }
        Ok(())
    }

    fn validate_limits(&self, i: usize) -> Result<(), String> {
        let socket_only = self.allow.is_some()
            || self.max_connections.is_some()
            || self.max_frame_bytes.is_some()
            || self.idle_timeout_s.is_some()
            || self.stall_timeout_s.is_some();
        if socket_only && self.listen.is_none() {
            return Err(format!(
                "input[{i}]: allow, max_connections, max_frame_bytes, idle_timeout_s and stall_timeout_s apply to `listen` inputs only"
            ));
        }
        if self.allow.as_ref().is_some_and(Vec::is_empty) {
            return Err(format!(
                "input[{i}].allow is empty: it would refuse every sender (leave it out to accept all)"
            ));
        }
        if self.max_connections.is_some_and(|n| n == 0 || n > 4096) {
            return Err(format!("input[{i}].max_connections must be in 1..=4096"));
        }
        if self
            .max_frame_bytes
            .is_some_and(|n| !(crate::frame::HEADER_LEN..=crate::frame::MAX_FRAME_LEN).contains(&n))
        {
            return Err(format!(
                "input[{i}].max_frame_bytes must be in {}..={}",
                crate::frame::HEADER_LEN,
                crate::frame::MAX_FRAME_LEN
            ));
        }
        for (name, v) in [
            ("idle_timeout_s", self.idle_timeout_s),
            ("stall_timeout_s", self.stall_timeout_s),
        ] {
            if v.is_some_and(|s| !(s.is_finite() && s > 0.0 && s <= 86_400.0)) {
                return Err(format!(
                    "input[{i}].{name} must be a number of seconds in (0, 86400]"
                ));
            }
        }
        Ok(())
    }

    /// The `lsl://` address of an LSL input, with the table's options applied over the
    /// address's own; `None` for other inputs.
    pub fn lsl_url(&self) -> Option<Result<crate::lsl::url::LslUrl, String>> {
        let l = self
            .listen
            .as_ref()
            .filter(|l| crate::lsl::url::is_lsl(l))?;
        Some((|| {
            let mut u: crate::lsl::url::LslUrl = l.parse().map_err(|e| format!("{e}"))?;
            if let Some(unit) = &self.unit {
                u.options.unit = Some(unit.clone());
            }
            if let Some(d) = &self.drop_channels {
                u.options.drop.extend(d.iter().cloned());
            }
            match self.extra_channels.as_deref() {
                None => {}
                Some("drop") => u.options.drop_extra = true,
                Some("error") => u.options.drop_extra = false,
                Some(other) => {
                    return Err(format!(
                        "extra_channels = {other:?}: expected \"error\" or \"drop\""
                    ))
                }
            }
            if let Some(unit) = &u.options.unit {
                if crate::lsl::url::volts_per_unit(unit).is_none() {
                    return Err(format!(
                        "unit {unit:?} is not a voltage trigd knows (V, mV, uV/µV/microvolts, nV)"
                    ));
                }
            }
            Ok(u)
        })())
    }

    pub fn display_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        match (&self.listen, &self.file) {
            (Some(l), _) => l.clone(),
            (_, Some(f)) => f.display().to_string(),
            _ => "input".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct OutputConfig {
    /// JSON lines, one decision per line.
    pub decisions_jsonl: Option<PathBuf>,
    /// Compact binary decision log.
    pub decisions_binlog: Option<PathBuf>,
    /// UDP decision stream target `HOST:PORT`.
    pub decisions_udp: Option<SocketAddr>,
    /// A recording of the accepted frames (replayable).
    pub accepted_recording: Option<PathBuf>,
    /// fsync policy of written recordings: `never`, `always`, `every:N`, `interval:100ms`.
    pub fsync: Option<String>,
    /// What the JSON lines log does when it cannot write: `block` (default), `spill`, `drop`.
    pub jsonl_policy: Option<SinkPolicy>,
    /// Second path of the JSON lines log for `jsonl_policy = "spill"`.
    pub jsonl_spill: Option<PathBuf>,
    /// What the binary log does when it cannot write: `block` (default), `spill`, `drop`.
    pub binlog_policy: Option<SinkPolicy>,
    /// Second path of the binary log for `binlog_policy = "spill"`.
    pub binlog_spill: Option<PathBuf>,
    /// What the UDP decision stream does when a send fails: `drop` (the only choice: a
    /// datagram stream is best effort).
    pub udp_policy: Option<SinkPolicy>,
    /// Decisions a blocked log holds before it loses them (default 65536).
    pub sink_backlog: Option<usize>,
    /// How often a failing sink is tried again, milliseconds (default 100).
    pub sink_retry_ms: Option<u64>,
    /// Longest a blocked log pauses the inputs, seconds (default 30; 0: until it works
    /// again or the daemon stops).
    pub sink_block_max_s: Option<f64>,
    /// Rotate each decision log when it reaches this many bytes (default: never; SIGHUP
    /// reopens the logs for outside rotation).
    pub rotate_bytes: Option<u64>,
    /// Rotated decision logs kept (`FILE.1` .. `FILE.N`, default 5).
    pub rotate_keep: Option<usize>,
    /// Decisions to a NATS JetStream stream, `nats://HOST:PORT/STREAM` (created if missing;
    /// subjects `STREAM.WORKLOAD.OUTCOME`; de-duplicated per frame).
    pub decisions_nats: Option<String>,
    /// Accepted frames to a NATS JetStream stream of their own, `nats://HOST:PORT/STREAM`.
    pub accepted_nats: Option<String>,
    /// De-duplication window of the streams trigd creates, seconds (default 120): longer
    /// than the inputs' ack wait.
    pub nats_duplicate_window_s: Option<f64>,
    /// Keep trying to reach the NATS server of the outputs at start for this long, seconds
    /// (default 0: a clear error at once).
    pub nats_connect_retry_s: Option<f64>,
    /// Publish decisions as an LSL marker stream (type `Markers`, one string channel) of
    /// this name, each marker stamped with the LSL time of the block's last sample.
    pub lsl_markers: Option<String>,
    /// What a marker holds: `json` (the decision record, as in the JSON lines log; the
    /// default) or `code` (`accept roi`, `reject`, ...).
    pub lsl_markers_format: Option<String>,
    /// Markers for every decision (`true`) or for accepted blocks only (default).
    pub lsl_markers_all: Option<bool>,
    /// Publish the EEG region-of-interest statistic of every block as a one-channel LSL
    /// stream (type `TriggerStatistic`) of this name, for live plotting.
    pub lsl_statistic: Option<String>,
}

impl OutputConfig {
    /// Backlog, retry and pause limit of the decision sinks.
    pub fn guard_settings(&self) -> GuardSettings {
        let d = GuardSettings::default();
        GuardSettings {
            backlog: self.sink_backlog.unwrap_or(d.backlog),
            retry: self.sink_retry_ms.map_or(d.retry, Duration::from_millis),
            block_max: match self.sink_block_max_s {
                None => d.block_max,
                Some(0.0) => None,
                Some(s) => Some(Duration::from_secs_f64(s)),
            },
        }
    }

    pub fn nats_duplicate_window(&self) -> Duration {
        self.nats_duplicate_window_s.map_or(
            crate::farm::DEFAULT_DUPLICATE_WINDOW,
            Duration::from_secs_f64,
        )
    }

    pub fn nats_connect_retry(&self) -> Duration {
        self.nats_connect_retry_s
            .map_or(Duration::ZERO, Duration::from_secs_f64)
    }

    /// Size rotation of the decision logs.
    pub fn rotation(&self) -> Rotation {
        Rotation {
            max_bytes: self.rotate_bytes,
            keep: self.rotate_keep.unwrap_or(5),
        }
    }
}

/// Accept an event with at least `min_hits` hits on at least `min_planes` distinct planes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MultiplicityConfig {
    pub min_hits: u32,
    pub min_planes: u32,
}

impl Default for MultiplicityConfig {
    fn default() -> Self {
        Self {
            min_hits: 8,
            min_planes: 4,
        }
    }
}

/// A configuration error that names the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl Config {
    /// Reads and validates `path`.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            message: format!("cannot read: {e}"),
        })?;
        let mut cfg = Self::from_str_named(&text, &file)?;
        cfg.path = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Parses and validates TOML text; `file` names it in errors.
    pub fn from_str_named(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError {
            file: file.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        cfg.validate().map_err(|message| ConfigError {
            file: file.to_string(),
            message,
        })?;
        Ok(cfg)
    }

    fn validate_output(&self) -> Result<(), String> {
        let o = &self.output;
        for (what, path, policy, spill) in [
            ("jsonl", &o.decisions_jsonl, o.jsonl_policy, &o.jsonl_spill),
            (
                "binlog",
                &o.decisions_binlog,
                o.binlog_policy,
                &o.binlog_spill,
            ),
        ] {
            match (policy, spill) {
                (Some(SinkPolicy::Spill), None) => {
                    return Err(format!(
                    "output.{what}_policy = \"spill\" needs output.{what}_spill, the second path"
                ))
                }
                (Some(SinkPolicy::Spill), Some(s)) if Some(s) == path.as_ref() => {
                    return Err(format!(
                        "output.{what}_spill must differ from the log's own path"
                    ))
                }
                (p, Some(_)) if p != Some(SinkPolicy::Spill) => {
                    return Err(format!(
                        "output.{what}_spill applies only with {what}_policy = \"spill\""
                    ))
                }
                _ => {}
            }
        }
        if o.udp_policy.is_some_and(|p| p != SinkPolicy::Drop) {
            return Err(
                "output.udp_policy must be \"drop\": a datagram stream is best effort".into(),
            );
        }
        if o.sink_backlog.is_some_and(|n| n == 0 || n > 1 << 24) {
            return Err("output.sink_backlog must be in 1..=16777216".into());
        }
        if o.sink_retry_ms.is_some_and(|ms| ms == 0 || ms > 60_000) {
            return Err("output.sink_retry_ms must be in 1..=60000".into());
        }
        if o.sink_block_max_s
            .is_some_and(|s| !(s.is_finite() && s >= 0.0))
        {
            return Err("output.sink_block_max_s must be a number of seconds >= 0".into());
        }
        if o.rotate_bytes.is_some_and(|b| b < 4096) {
            return Err("output.rotate_bytes must be at least 4096".into());
        }
        if o.rotate_keep.is_some_and(|k| k == 0 || k > 1000) {
            return Err("output.rotate_keep must be in 1..=1000".into());
        }
        for (what, u) in [
            ("decisions_nats", &o.decisions_nats),
            ("accepted_nats", &o.accepted_nats),
        ] {
            if let Some(u) = u {
                let url: crate::farm::NatsUrl =
                    u.parse().map_err(|e| format!("output.{what}: {e}"))?;
                url.stream().map_err(|e| format!("output.{what}: {e}"))?;
            }
        }
        for (what, v) in [
            ("nats_duplicate_window_s", o.nats_duplicate_window_s),
            ("nats_connect_retry_s", o.nats_connect_retry_s),
        ] {
            if v.is_some_and(|s| !(s.is_finite() && (0.0..=86_400.0).contains(&s))) {
                return Err(format!(
                    "output.{what} must be a number of seconds in [0, 86400]"
                ));
            }
        }
        if o.nats_duplicate_window_s.is_some_and(|s| s < 1.0) {
            return Err("output.nats_duplicate_window_s must be at least 1".into());
        }
        if o.lsl_markers_format
            .as_deref()
            .is_some_and(|f| f != "json" && f != "code")
        {
            return Err("output.lsl_markers_format must be \"json\" or \"code\"".into());
        }
        for (what, name) in [
            ("lsl_markers", &o.lsl_markers),
            ("lsl_statistic", &o.lsl_statistic),
        ] {
            if name
                .as_deref()
                .is_some_and(|n| n.is_empty() || n.len() > 256 || n.contains('\0'))
            {
                return Err(format!(
                    "output.{what} must be a stream name of 1..=256 bytes"
                ));
            }
        }
        if o.lsl_markers.is_none()
            && (o.lsl_markers_format.is_some() || o.lsl_markers_all.is_some())
        {
            return Err(
                "output.lsl_markers_format and lsl_markers_all apply with output.lsl_markers only"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks what serde cannot: ranges and combinations. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        let d = &self.daemon;
        if !(d.budget_ms.is_finite() && d.budget_ms > 0.0) {
            return Err(format!(
                "daemon.budget_ms = {} must be a positive number of milliseconds",
                d.budget_ms
            ));
        }
        if d.batch_max == 0 || d.batch_max > 65536 {
            return Err(format!(
                "daemon.batch_max = {} must be in 1..=65536",
                d.batch_max
            ));
        }
        if d.ring_slots < 2 || d.ring_slots > 1 << 20 {
            return Err(format!(
                "daemon.ring_slots = {} must be in 2..=1048576",
                d.ring_slots
            ));
        }
        if d.slot_bytes < crate::frame::HEADER_LEN || d.slot_bytes > crate::frame::MAX_FRAME_LEN {
            return Err(format!(
                "daemon.slot_bytes = {} must be in 40..={}",
                d.slot_bytes,
                crate::frame::MAX_FRAME_LEN
            ));
        }
        if d.workers == 0 || d.workers > 256 {
            return Err(format!("daemon.workers = {} must be in 1..=256", d.workers));
        }
        if d.gpu_workers == 0 || d.gpu_workers > 16 {
            return Err(format!(
                "daemon.gpu_workers = {} must be in 1..=16",
                d.gpu_workers
            ));
        }
        if d.batch_wait_us > 1_000_000 {
            return Err(format!(
                "daemon.batch_wait_us = {} must be at most 1000000",
                d.batch_wait_us
            ));
        }
        if !matches!(d.backend.as_str(), "auto" | "gpu" | "cpu") {
            return Err(format!(
                "daemon.backend = {:?} must be one of auto, gpu, cpu",
                d.backend
            ));
        }
        if self.inputs.len() > u16::MAX as usize {
            return Err("too many [[input]] entries".into());
        }
        let mut names = std::collections::HashSet::new();
        for (i, input) in self.inputs.iter().enumerate() {
            match (&input.listen, &input.file) {
                (Some(_), None) if input.is_nats() => {
                    if input.speed.is_some() {
                        return Err(format!("input[{i}].speed applies to files only"));
                    }
                }
                (Some(l), None) if crate::lsl::url::is_lsl(l) => {
                    if let Some(Err(e)) = input.lsl_url() {
                        return Err(format!("input[{i}]: {e}"));
                    }
                    if self.daemon.workload != WorkloadKind::Eeg {
                        return Err(format!(
                            "input[{i}].listen = {l:?}: LSL inputs carry EEG; set daemon.workload = \"eeg\" (--workload eeg)"
                        ));
                    }
                    if input.speed.is_some()
                        || input.allow.is_some()
                        || input.max_connections.is_some()
                        || input.max_frame_bytes.is_some()
                        || input.idle_timeout_s.is_some()
                        || input.stall_timeout_s.is_some()
                    {
                        return Err(format!("input[{i}]: speed, allow, max_connections, max_frame_bytes, idle_timeout_s and stall_timeout_s do not apply to lsl:// inputs"));
                    }
                }
                (Some(l), None) => {
                    l.parse::<crate::sources::Endpoint>()
                        .map_err(|e| format!("input[{i}].listen: {e}"))?;
                    if input.unit.is_some()
                        || input.drop_channels.is_some()
                        || input.extra_channels.is_some()
                    {
                        return Err(format!("input[{i}]: unit, drop_channels and extra_channels apply to lsl:// inputs only"));
                    }
                    if input.speed.is_some() {
                        return Err(format!("input[{i}].speed applies to files only"));
                    }
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(format!(
                        "input[{i}] needs exactly one of `listen` or `file`"
                    ))
                }
            }
            input.validate_limits(i)?;
            input.validate_nats(i)?;
            if !names.insert(input.display_name()) {
                return Err(format!(
                    "input[{i}].name {:?} is used twice",
                    input.display_name()
                ));
            }
        }
        self.validate_output()?;
        if let Some(f) = &self.output.fsync {
            f.parse::<crate::recording::FsyncPolicy>()
                .map_err(|e| format!("output.fsync: {e}"))?;
        }
        if self
            .multiplicity
            .is_some_and(|m| m.min_hits == 0 && m.min_planes == 0)
        {
            // Accept-everything is legitimate but usually a mistake: say so in the log.
            tracing::warn!(
                "multiplicity.min_hits and min_planes are both 0: every event is accepted"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_loopback() {
        let cfg = Config::from_str_named("", "empty.toml").unwrap();
        assert_eq!(cfg.daemon.metrics_addr.to_string(), "127.0.0.1:9187");
        assert_eq!(cfg.daemon.workload, WorkloadKind::Multiplicity);
    }

    #[test]
    fn the_gpu_wait_is_read_and_a_bad_one_refused() {
        let cfg = Config::from_str_named("", "empty.toml").unwrap();
        assert_eq!(cfg.daemon.gpu_wait, GpuWait::Auto);
        for (text, want) in [
            ("auto", GpuWait::Auto),
            ("spin", GpuWait::Spin),
            ("yield", GpuWait::Yield),
            ("block", GpuWait::Block),
        ] {
            let cfg =
                Config::from_str_named(&format!("[daemon]\ngpu_wait = \"{text}\"\n"), "w.toml")
                    .unwrap();
            assert_eq!(cfg.daemon.gpu_wait, want);
        }
        let e = Config::from_str_named("[daemon]\ngpu_wait = \"sleep\"\n", "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sleep") && e.contains("yield"), "{e}");
    }

    #[test]
    fn nats_inputs_and_outputs_are_read_and_checked() {
        let cfg = Config::from_str_named(
            "[daemon]\nring_slots = 64\n[[input]]\nlisten = \"nats://127.0.0.1:4222/FRAMES\"\nsubject = \"FRAMES.>\"\ndurable = \"node\"\nack_wait_s = 2\nconnect_retry_s = 10\n[output]\ndecisions_nats = \"nats://127.0.0.1:4222/DECISIONS\"\n",
            "farm.toml",
        )
        .unwrap();
        let spec = cfg.inputs[0].nats_spec(cfg.daemon.ring_slots).unwrap();
        assert_eq!(spec.url.stream.as_deref(), Some("FRAMES"));
        assert_eq!(spec.consumer.durable, "node");
        assert_eq!(spec.consumer.filter_subject.as_deref(), Some("FRAMES.>"));
        assert_eq!(spec.consumer.ack_wait, Duration::from_secs(2));
        assert_eq!(spec.connect_retry, Duration::from_secs(10));
        assert_eq!(spec.in_flight_max, 64);
        for (bad, field) in [
            ("[[input]]\nlisten = \"nats://h:4222\"\n", "no stream"),
            (
                "[[input]]\nlisten = \"nats://h:4222/A.B\"\n",
                "input[0].listen",
            ),
            (
                "[[input]]\nlisten = \"udp://127.0.0.1:1\"\ndurable = \"x\"\n",
                "apply to `listen = \"nats://...\"` inputs only",
            ),
            (
                "[[input]]\nlisten = \"nats://h/S\"\nsubject = \"a..b\"\n",
                "input[0].subject",
            ),
            (
                "[[input]]\nlisten = \"nats://h/S\"\ndurable = \"a.b\"\n",
                "input[0].durable",
            ),
            (
                "[[input]]\nlisten = \"nats://h/S\"\nack_wait_s = 0\n",
                "ack_wait_s",
            ),
            (
                "[[input]]\nlisten = \"nats://h/S\"\nallow = [\"127.0.0.1\"]\n",
                "input[0].allow",
            ),
            (
                "[output]\ndecisions_nats = \"nats://h:4222\"\n",
                "output.decisions_nats",
            ),
            (
                "[output]\naccepted_nats = \"tcp://h:1/S\"\n",
                "output.accepted_nats",
            ),
            (
                "[output]\nnats_duplicate_window_s = 0.5\n",
                "nats_duplicate_window_s",
            ),
        ] {
            let e = Config::from_str_named(bad, "f.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let e = Config::from_str_named("[daemon]\nbudget_ms = -1\n", "a.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("a.toml: daemon.budget_ms"), "{e}");
        let e = Config::from_str_named("[daemon]\nbudget_msx = 1\n", "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("b.toml") && e.contains("budget_msx"), "{e}");
        let e = Config::from_str_named("[[input]]\nlisten = \"http://x\"\n", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("input[0].listen"), "{e}");
        let e = Config::from_str_named("[[input]]\nname=\"a\"\n", "d.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly one of"), "{e}");
    }

    #[test]
    fn lsl_inputs_and_outputs_are_checked() {
        let ok = "[daemon]\nworkload = \"eeg\"\n[[input]]\nlisten = \"lsl://type=EEG&unit=uV\"\ndrop_channels = [\"Status\"]\nextra_channels = \"drop\"\n[output]\nlsl_markers = \"m\"\nlsl_markers_format = \"code\"\n";
        let cfg = Config::from_str_named(ok, "ok.toml").unwrap();
        let u = cfg.inputs[0].lsl_url().unwrap().unwrap();
        assert_eq!(u.predicate(), "type='EEG'");
        assert_eq!(u.options.drop, vec!["Status"]);
        assert!(u.options.drop_extra);
        for (bad, want) in [
            ("[[input]]\nlisten = \"lsl://type=EEG\"\n", "workload = \"eeg\""),
            (
                "[daemon]\nworkload = \"eeg\"\n[[input]]\nlisten = \"lsl://type=EEG\"\nunit = \"furlong\"\n",
                "furlong",
            ),
            (
                "[daemon]\nworkload = \"eeg\"\n[[input]]\nlisten = \"lsl://type=EEG\"\nmax_connections = 3\n",
                "do not apply to lsl://",
            ),
            (
                "[daemon]\nworkload = \"eeg\"\n[[input]]\nlisten = \"lsl://type=EEG\"\nextra_channels = \"keep\"\n",
                "extra_channels",
            ),
            (
                "[[input]]\nlisten = \"udp://127.0.0.1:9\"\nunit = \"uV\"\n",
                "apply to lsl:// inputs only",
            ),
            ("[output]\nlsl_markers_all = true\n", "apply with output.lsl_markers"),
            ("[output]\nlsl_markers = \"m\"\nlsl_markers_format = \"xml\"\n", "json"),
        ] {
            let e = Config::from_str_named(bad, "bad.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn speed_parses() {
        assert_eq!("max".parse::<Speed>().unwrap(), Speed::Max);
        assert_eq!("2.0".parse::<Speed>().unwrap(), Speed::Factor(2.0));
        assert!("0".parse::<Speed>().is_err());
        assert!("fast".parse::<Speed>().is_err());
        let cfg =
            Config::from_str_named("[[input]]\nfile = \"x\"\nspeed = 1.5\n", "e.toml").unwrap();
        assert_eq!(cfg.inputs[0].speed, Some(Speed::Factor(1.5)));
    }
}
