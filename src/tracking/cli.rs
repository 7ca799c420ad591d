//! Command-line pieces of the tracking workload: `trigd simulate tracking` and
//! `trigd eval tracking`. The top-level CLI flattens these argument structs and calls the
//! `run_*` functions, passing in what this library does not own (the recording writer,
//! the reconstruction).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::eval::{EvalConfig, EvalReport, Evaluator};
use super::geometry::Detector;
use super::simulate::{self, Preset, SimConfig};
use super::track::Track;
use super::trackml;
use crate::frame::{HitRecord, Stamp};

/// `trigd simulate tracking`: events with truth from a detector description.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateTrackingArgs {
    /// Detector description (TOML: [[plane]] tables and a [field]).
    #[arg(long, default_value = "fixtures/detector.toml")]
    pub geometry: PathBuf,
    /// Event class: minbias (tens of tracks) or central (over a thousand).
    #[arg(long, value_enum, default_value = "minbias")]
    pub preset: Preset,
    /// Number of events.
    #[arg(long, default_value_t = 10)]
    pub events: u64,
    /// Id of the first event (events are numbered consecutively).
    #[arg(long, default_value_t = 0)]
    pub first_event: u64,
    /// Random seed: the same seed and event id give the same event.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Mean noise hits per plane (overrides the preset).
    #[arg(long)]
    pub noise_per_plane: Option<f64>,
    /// Mean charged multiplicity per event (overrides the preset).
    #[arg(long)]
    pub multiplicity: Option<f64>,
    #[command(flatten)]
    pub spectrum: SpectrumArgs,
    /// Directory for TrackML-style CSV events (created if missing).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Native recording of the hit-event frames.
    #[arg(long)]
    pub recording: Option<PathBuf>,
    /// Source id stamped on the frames.
    #[arg(long, default_value_t = 1)]
    pub source_id: u32,
    /// Event rate for the frames' timestamps, Hz.
    #[arg(long, default_value_t = 1000.0)]
    pub rate_hz: f64,
}

/// The momentum spectrum of `trigd simulate tracking`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SpectrumArgs {
    /// Momentum law: `hadronic` (transverse momentum and rapidity of a fixed-target
    /// interaction) or `exponential` (p from `--p-min-gev` with mean `--p-mean-gev`, polar
    /// angle |N(0, `--theta-sigma-rad`)|).
    #[arg(long, value_enum, default_value = "hadronic")]
    pub spectrum: SpectrumKind,
    /// Lowest momentum of the exponential spectrum, GeV/c.
    #[arg(long, default_value_t = 0.6)]
    pub p_min_gev: f64,
    /// Mean momentum of the exponential spectrum, GeV/c.
    #[arg(long, default_value_t = 4.6)]
    pub p_mean_gev: f64,
    /// Width of the exponential spectrum's polar angle, radians.
    #[arg(long, default_value_t = 0.12)]
    pub theta_sigma_rad: f64,
    /// Beam spot, one standard deviation in x and y, mm (overrides the preset's 0.3).
    #[arg(long)]
    pub beam_sigma_mm: Option<f64>,
    /// Beam spot's centre in x, mm (default 0: on the geometry's axis).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub beam_x_mm: f64,
    /// Beam spot's centre in y, mm.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub beam_y_mm: f64,
    /// The target's length along z, mm: vertices uniform over it (overrides the preset's
    /// 1 mm; a liquid or segmented target is tens of millimetres or more).
    #[arg(long, allow_negative_numbers = true)]
    pub target_length_mm: Option<f64>,
    /// z of the target's centre, mm (overrides the preset's 0, the geometry's origin).
    #[arg(long, allow_negative_numbers = true)]
    pub target_z_mm: Option<f64>,
}

/// See [`SpectrumArgs::spectrum`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SpectrumKind {
    #[default]
    Hadronic,
    Exponential,
}

impl SpectrumArgs {
    /// Applies the spectrum to `cfg`; an error names a value out of range.
    pub fn apply(&self, cfg: &mut SimConfig) -> anyhow::Result<()> {
        if let Some(s) = self.beam_sigma_mm {
            anyhow::ensure!(
                s.is_finite() && s >= 0.0,
                "--beam-sigma-mm {s} must be >= 0"
            );
            cfg.beam_sigma_xy_mm = s;
        }
        for (name, v) in [
            ("--beam-x-mm", self.beam_x_mm),
            ("--beam-y-mm", self.beam_y_mm),
        ] {
            anyhow::ensure!(v.is_finite(), "{name} {v} must be finite");
        }
        cfg.beam_centre_mm = [self.beam_x_mm, self.beam_y_mm];
        if let Some(l) = self.target_length_mm {
            anyhow::ensure!(
                l.is_finite() && l >= 0.0,
                "--target-length-mm {l} must be >= 0"
            );
            cfg.target_thickness_mm = l;
        }
        if let Some(z) = self.target_z_mm {
            anyhow::ensure!(z.is_finite(), "--target-z-mm {z} must be finite");
            cfg.target_z_mm = z;
        }
        if self.spectrum == SpectrumKind::Exponential {
            let (lo, mean, th) = (self.p_min_gev, self.p_mean_gev, self.theta_sigma_rad);
            anyhow::ensure!(
                lo.is_finite() && lo > 0.0 && mean.is_finite() && mean > lo,
                "--p-min-gev {lo} must be positive and below --p-mean-gev {mean}"
            );
            anyhow::ensure!(
                th.is_finite() && th >= 0.0,
                "--theta-sigma-rad {th} must be >= 0"
            );
            cfg.spectrum = simulate::Spectrum::Exponential {
                p_min_gev: lo,
                p_mean_gev: mean,
                theta_sigma_rad: th,
            };
        }
        Ok(())
    }
}

/// What a simulation run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulateSummary {
    pub n_events: u64,
    pub n_hits: u64,
    pub n_particles: u64,
    /// Particles with hits on at least 4 planes.
    pub n_reconstructable: u64,
}

/// Runs the simulation. CSV events go to `--out`; when `--recording` is given, each event's
/// native frame (sequence = event id, timestamps spaced by 1 / `--rate-hz` from the start
/// of the run) is handed to `write_frame`, which the caller connects to a recording writer
/// opened at `args.recording`. At least one of `--out` and `--recording` is required.
pub fn run_simulate(
    args: &SimulateTrackingArgs,
    mut write_frame: impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<SimulateSummary> {
    if args.out.is_none() && args.recording.is_none() {
        anyhow::bail!("nothing to write: give --out DIR (CSV events) and/or --recording FILE");
    }
    if !(args.rate_hz.is_finite() && args.rate_hz > 0.0) {
        anyhow::bail!("--rate-hz {} must be positive", args.rate_hz);
    }
    let det = Detector::from_toml_file(&args.geometry)?;
    let mut cfg = SimConfig::preset(args.preset);
    if let Some(n) = args.noise_per_plane {
        anyhow::ensure!(
            n.is_finite() && n >= 0.0,
            "--noise-per-plane {n} must be >= 0"
        );
        cfg.noise_hits_per_plane = n;
    }
    if let Some(m) = args.multiplicity {
        anyhow::ensure!(m.is_finite() && m >= 0.0, "--multiplicity {m} must be >= 0");
        cfg.multiplicity_mean = m;
    }
    args.spectrum.apply(&mut cfg)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let t0_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let interval_ns = (1e9 / args.rate_hz) as u64;
    let mut summary = SimulateSummary {
        n_events: 0,
        n_hits: 0,
        n_particles: 0,
        n_reconstructable: 0,
    };
    for ev in simulate::simulate_events(&det, &cfg, args.seed, args.first_event, args.events) {
        if let Some(dir) = &args.out {
            trackml::write_event(dir, &ev)?;
        }
        if args.recording.is_some() {
            let stamp = Stamp {
                source_id: args.source_id,
                sequence: ev.event_id,
                timestamp_ns: t0_ns + (ev.event_id - args.first_event) * interval_ns,
            };
            write_frame(&simulate::encode_event_frame(&ev, stamp))
                .with_context(|| format!("writing event {}", ev.event_id))?;
        }
        summary.n_events += 1;
        summary.n_hits += ev.hits.len() as u64;
        summary.n_particles += ev.particles.len() as u64;
        summary.n_reconstructable += ev
            .particles
            .iter()
            .filter(|p| p.n_hits as usize >= simulate::RECONSTRUCTABLE_MIN_PLANES)
            .count() as u64;
    }
    Ok(summary)
}

/// `trigd eval tracking`: physics performance against truth.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalTrackingArgs {
    /// TrackML-style CSV directory with truth (`trigd simulate tracking --out`).
    pub events: PathBuf,
    /// Detector description (used to carry truth to a track's z when needed).
    #[arg(long, default_value = "fixtures/detector.toml")]
    pub geometry: PathBuf,
    /// Score this submission file (`event_id,hit_id,track_id`) instead of reconstructing.
    #[arg(long)]
    pub tracks: Option<PathBuf>,
    /// Write the plots (SVG and PNG) here: efficiency by momentum, planes hit and missing
    /// planes, ghost rate by fitted momentum, and pulls.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the markdown summary to this file (it is printed in any case).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Momentum a particle needs to count as reconstructable, GeV/c; also the momentum
    /// the finder looks for tracks from, unless `--config` names `[tracking] min_p_gev`
    /// (0: every particle counts, the finder at its default).
    #[arg(long, default_value_t = super::eval::RECONSTRUCTABLE_MIN_P_GEV)]
    pub min_p: f64,
    /// Distinct planes with hits a particle needs to count as reconstructable.
    #[arg(long, default_value_t = 4)]
    pub min_planes: usize,
    /// Evaluate at most this many events.
    #[arg(long)]
    pub max_events: Option<usize>,
    /// z of the plane the report's beam spot is measured on (the finder's origin), mm.
    #[arg(skip)]
    pub origin_z_mm: f64,
    /// Fitted momentum from which tracks measure the report's beam spot, GeV/c (0: all).
    #[arg(skip)]
    pub beam_min_p_gev: f64,
    /// Whether the finder's fit assumes q/p instead of measuring it (no q/p pulls).
    #[arg(skip)]
    pub qop_assumed: bool,
}

/// Groups submission rows into per-event tracks (indices into the event's hits).
fn submission_tracks(
    path: &Path,
) -> anyhow::Result<std::collections::HashMap<u64, Vec<(u32, u64)>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let rows = trackml::parse_submission_csv(&bytes, &path.display().to_string())?;
    let mut by_event: std::collections::HashMap<u64, Vec<(u32, u64)>> =
        std::collections::HashMap::new();
    for (event_id, hit_id, track_id) in rows {
        by_event
            .entry(event_id)
            .or_default()
            .push((hit_id, track_id));
    }
    Ok(by_event)
}

fn tracks_from_submission(
    event_id: u64,
    hits: &[HitRecord],
    rows: &[(u32, u64)],
    origin: &Path,
) -> anyhow::Result<Vec<Track>> {
    let index: std::collections::HashMap<u32, u32> = hits
        .iter()
        .enumerate()
        .map(|(i, h)| (h.hit_id, i as u32))
        .collect();
    let mut by_track: std::collections::BTreeMap<u64, Vec<u32>> = std::collections::BTreeMap::new();
    for &(hit_id, track_id) in rows {
        let &i = index.get(&hit_id).with_context(|| {
            format!(
                "{}: event {event_id}: hit_id {hit_id} is not in the event",
                origin.display()
            )
        })?;
        if track_id != 0 {
            by_track.entry(track_id).or_default().push(i);
        }
    }
    Ok(by_track
        .into_values()
        .map(|mut hits_of| {
            hits_of.sort_by(|&a, &b| hits[a as usize].z_mm.total_cmp(&hits[b as usize].z_mm));
            Track {
                hits: hits_of,
                ..Track::default()
            }
        })
        .collect())
}

/// Runs the evaluation over `args.events`. Tracks come from `--tracks` when given, else from
/// `reconstruct(detector, hits)` for each event. Prints the markdown summary to stdout and
/// writes the files asked for.
pub fn run_eval(
    args: &EvalTrackingArgs,
    mut reconstruct: impl FnMut(&Detector, &[HitRecord]) -> anyhow::Result<Vec<Track>>,
) -> anyhow::Result<EvalReport> {
    let det = Detector::from_toml_file(&args.geometry)?;
    anyhow::ensure!(
        args.min_p.is_finite() && args.min_p >= 0.0,
        "--min-p {} must be >= 0",
        args.min_p
    );
    let cfg = EvalConfig {
        min_p_gev: args.min_p,
        min_planes: args.min_planes,
        origin_z_mm: args.origin_z_mm,
        beam_min_p_gev: args.beam_min_p_gev,
        qop_assumed: args.qop_assumed,
        ..EvalConfig::default()
    };
    let submission = args.tracks.as_deref().map(submission_tracks).transpose()?;
    let mut evaluator = Evaluator::new(cfg, Some(&det));
    let limit = args.max_events.unwrap_or(usize::MAX);
    // Each event's planes checked against the description's: taken from the hits' z where
    // `layer_id` numbers the planes otherwise.
    let mut events = trackml::read_trackml_dir(&args.events)?
        .with_planes(det.planes.iter().map(|p| p.z_mm).collect());
    let mut n_events = 0u64;
    for ev in events.by_ref().take(limit) {
        n_events += 1;
        let ev = ev?;
        let truth = ev.truth.as_ref().with_context(|| {
            format!(
                "{}: event {} has no truth file: evaluation needs eventNNNNNNNNN-truth.csv",
                args.events.display(),
                ev.event_id
            )
        })?;
        let tracks = match (&submission, &args.tracks) {
            (Some(rows), Some(path)) => tracks_from_submission(
                ev.event_id,
                &ev.hits,
                rows.get(&ev.event_id).map_or(&[][..], |r| r.as_slice()),
                path,
            )?,
            _ => reconstruct(&det, &ev.hits)
                .with_context(|| format!("reconstructing event {}", ev.event_id))?,
        };
        evaluator.add_event(
            ev.event_id,
            &ev.hits,
            truth,
            ev.particles.as_deref(),
            &tracks,
        )?;
    }
    if let (n, Some(note)) = events.relabelled() {
        tracing::warn!("{note} (in {n} of {n_events} events)");
    }
    let report = evaluator.finish();
    let markdown = report.to_markdown();
    print!("{markdown}");
    std::io::stdout().flush().ok();
    if let Some(path) = &args.markdown {
        std::fs::write(path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &args.plots {
        super::eval::write_plots(&report, dir)
            .map_err(|e| anyhow::anyhow!("writing plots to {}: {e}", dir.display()))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn simulate_then_score_a_submission() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("events");
        let args = SimulateTrackingArgs {
            geometry: root().join("fixtures/detector.toml"),
            preset: Preset::Minbias,
            events: 3,
            first_event: 10,
            seed: 5,
            noise_per_plane: None,
            multiplicity: None,
            spectrum: SpectrumArgs::default(),
            out: Some(out.clone()),
            recording: Some(dir.path().join("rec.trgd")),
            source_id: 3,
            rate_hz: 1000.0,
        };
        let mut frames = Vec::new();
        let summary = run_simulate(&args, |f| {
            frames.push(f.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(summary.n_events, 3);
        assert_eq!(frames.len(), 3);
        let f = crate::frame::parse(&frames[1]).unwrap();
        assert_eq!((f.sequence(), f.source_id()), (11, 3));

        // A submission from the truth itself: the perfect score.
        let mut sub = b"event_id,hit_id,track_id\n".to_vec();
        for ev in trackml::read_trackml_dir(&out).unwrap() {
            let ev = ev.unwrap();
            for (h, t) in ev.hits.iter().zip(ev.truth.unwrap()) {
                writeln!(sub, "{},{},{}", ev.event_id, h.hit_id, t.particle_id).unwrap();
            }
        }
        let sub_path = dir.path().join("sub.csv");
        std::fs::write(&sub_path, sub).unwrap();
        let eval_args = EvalTrackingArgs {
            events: out.clone(),
            geometry: root().join("fixtures/detector.toml"),
            tracks: Some(sub_path),
            plots: Some(dir.path().join("plots")),
            json: Some(dir.path().join("report.json")),
            markdown: None,
            min_p: 1.0,
            min_planes: 4,
            max_events: None,
            origin_z_mm: 0.0,
            beam_min_p_gev: 0.0,
            qop_assumed: false,
        };
        let report = run_eval(&eval_args, |_, _| {
            panic!("must not reconstruct with --tracks")
        })
        .unwrap();
        assert_eq!(report.n_events, 3);
        assert_eq!(report.efficiency, 1.0);
        assert!((report.trackml_score - 1.0).abs() < 1e-9);
        for name in [
            "pulls",
            "efficiency_vs_p",
            "efficiency_vs_planes",
            "efficiency_vs_missing",
            "ghosts_vs_p",
        ] {
            assert!(
                dir.path().join(format!("plots/{name}.svg")).exists(),
                "{name}"
            );
            assert!(
                dir.path().join(format!("plots/{name}.png")).exists(),
                "{name}"
            );
        }
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap())
                .unwrap();
        assert_eq!(json["n_events"], 3);

        // The reconstruction hook: no tracks at all gives zero efficiency.
        let eval_args = EvalTrackingArgs {
            tracks: None,
            plots: None,
            json: None,
            ..eval_args
        };
        let report = run_eval(&eval_args, |_, _| Ok(Vec::new())).unwrap();
        assert_eq!((report.efficiency, report.n_tracks), (0.0, 0));
    }

    #[test]
    fn simulate_needs_an_output() {
        let args = SimulateTrackingArgs {
            geometry: root().join("fixtures/detector.toml"),
            preset: Preset::Minbias,
            events: 1,
            first_event: 0,
            seed: 1,
            noise_per_plane: None,
            multiplicity: None,
            spectrum: SpectrumArgs::default(),
            out: None,
            recording: None,
            source_id: 1,
            rate_hz: 1000.0,
        };
        assert!(run_simulate(&args, |_| Ok(())).is_err());
    }
}
