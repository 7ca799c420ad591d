//! `trigd simulate eeg`: the command-line face of [`super::simulate`]. Reads the lead
//! field, source positions and channel names, puts a bursting dipole on the source
//! nearest to the requested position, adds sensor noise and writes an EDF+C or BDF+C file
//! (burst centres as annotations), printing which source carries the dipole.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use npyz::WriterBuilder;

use super::edf::{self, Annotation, EdfFormat, EdfWriteSpec, WriteSignal};
use super::simulate::{read_npy_f64, simulate, DipoleSpec, SensorNoise};

/// Arguments of `trigd simulate eeg`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateEegArgs {
    /// Lead field NPY, float32/float64 `[n_channels, 3 * n_sources]`, V/(A·m).
    #[arg(long)]
    pub lead_field: PathBuf,
    /// Source positions NPY `[n_sources, 3]`, metres.
    #[arg(long)]
    pub source_positions: PathBuf,
    /// Channel names, one per line, in the lead field's row order.
    #[arg(long)]
    pub channels: PathBuf,
    /// Dipole position `x,y,z` in mm; the nearest source is used.
    #[arg(
        long,
        value_delimiter = ',',
        allow_negative_numbers = true,
        required = true
    )]
    pub dipole_mm: Vec<f64>,
    /// Dipole orientation `x,y,z` (normalised); radial when not given.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub orientation: Option<Vec<f64>>,
    /// Peak dipole moment in nAm.
    #[arg(long, default_value_t = 50.0)]
    pub amplitude_nam: f64,
    /// Frequency of the burst oscillation in Hz.
    #[arg(long, default_value_t = 10.0)]
    pub burst_hz: f64,
    /// Standard deviation of each burst's Gaussian envelope in ms.
    #[arg(long, default_value_t = 150.0)]
    pub burst_sigma_ms: f64,
    /// Burst centres in seconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,5,8")]
    pub onsets_s: Vec<f64>,
    /// White sensor noise, standard deviation in µV (ignored with --noise-cov).
    #[arg(long, default_value_t = 1.0)]
    pub noise_uv: f64,
    /// Noise covariance NPY `[n_channels, n_channels]` in V²; noise drawn through its
    /// Cholesky factor.
    #[arg(long)]
    pub noise_cov: Option<PathBuf>,
    #[arg(long, default_value_t = 250.0)]
    pub sample_rate_hz: f64,
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `edf` (16-bit) or `bdf` (24-bit); by default from the output's extension.
    #[arg(long)]
    pub format: Option<String>,
    /// Output EDF/BDF file.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the noise-free sensor signal as NPY float64 `[n_channels, n_samples]`.
    #[arg(long)]
    pub truth_out: Option<PathBuf>,
}

fn three(v: &[f64], what: &str) -> anyhow::Result<[f64; 3]> {
    match v {
        [x, y, z] if v.iter().all(|c| c.is_finite()) => Ok([*x, *y, *z]),
        _ => bail!("--{what} needs three finite numbers x,y,z, got {v:?}"),
    }
}

/// Reads channel names, one per line (blank lines skipped).
pub fn read_channel_names(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading channel names {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Record durations tried so that each record holds a whole number of samples.
const RECORD_DURATIONS_S: [f64; 9] = [1.0, 0.5, 0.25, 0.2, 0.1, 2.0, 4.0, 5.0, 10.0];

/// Runs `trigd simulate eeg`.
pub fn run_simulate(args: &SimulateEegArgs) -> anyhow::Result<()> {
    let lf = read_npy_f64(&args.lead_field)?;
    let pos = read_npy_f64(&args.source_positions)?;
    let names = read_channel_names(&args.channels)?;
    if pos.shape.len() != 2 || pos.shape[1] != 3 {
        bail!(
            "{}: source positions must be [n_sources, 3], got {:?}",
            args.source_positions.display(),
            pos.shape
        );
    }
    let n_sources = pos.shape[0];
    if lf.shape.len() != 2 || lf.shape[1] != 3 * n_sources {
        bail!(
            "{}: lead field must be [n_channels, 3 * {n_sources}] (free orientation), got {:?}",
            args.lead_field.display(),
            lf.shape
        );
    }
    let n_channels = lf.shape[0];
    if names.len() != n_channels {
        bail!(
            "{}: {} channel names for a lead field of {n_channels} channels",
            args.channels.display(),
            names.len()
        );
    }
    let positions: Vec<[f64; 3]> = pos
        .data
        .chunks_exact(3)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let noise = match &args.noise_cov {
        Some(path) => {
            let cov = read_npy_f64(path)?;
            if cov.shape != [n_channels, n_channels] {
                bail!(
                    "{}: noise covariance must be [{n_channels}, {n_channels}], got {:?}",
                    path.display(),
                    cov.shape
                );
            }
            SensorNoise::Covariance(cov.data)
        }
        None if args.noise_uv > 0.0 => SensorNoise::White {
            sd_v: args.noise_uv * 1e-6,
        },
        None if args.noise_uv == 0.0 => SensorNoise::None,
        None => bail!("--noise-uv {} must be >= 0", args.noise_uv),
    };
    let dipole = DipoleSpec {
        position_mm: three(&args.dipole_mm, "dipole-mm")?,
        orientation: args
            .orientation
            .as_deref()
            .map(|o| three(o, "orientation"))
            .transpose()?,
        amplitude_nam: args.amplitude_nam,
        burst_hz: args.burst_hz,
        burst_sigma_ms: args.burst_sigma_ms,
        onsets_s: args.onsets_s.clone(),
    };
    let n_samples = (args.duration_s * args.sample_rate_hz).round();
    if !(1.0..1e10).contains(&n_samples) {
        bail!(
            "--duration-s {} at --sample-rate-hz {} gives no samples",
            args.duration_s,
            args.sample_rate_hz
        );
    }
    let n_samples = n_samples as usize;
    let sim = simulate(
        &lf.data,
        n_channels,
        &positions,
        &dipole,
        &noise,
        args.sample_rate_hz,
        n_samples,
        args.seed,
    )?;

    let format = match args.format.as_deref() {
        Some("edf") => EdfFormat::Edf,
        Some("bdf") => EdfFormat::Bdf,
        Some(other) => bail!("--format {other}: expected edf or bdf"),
        None => match args
            .out
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("bdf") => EdfFormat::Bdf,
            _ => EdfFormat::Edf,
        },
    };
    let record_duration_s = RECORD_DURATIONS_S
        .iter()
        .copied()
        .find(|d| {
            let spr = args.sample_rate_hz * d;
            (spr - spr.round()).abs() < 1e-9 && spr >= 1.0
        })
        .with_context(|| {
            format!(
                "no EDF record duration holds a whole number of samples at {} Hz",
                args.sample_rate_hz
            )
        })?;
    // One symmetric physical range for all channels, in µV, rounded up to a whole µV.
    let max_uv = sim.data.iter().fold(0.0f64, |m, v| m.max(v.abs())) * 1e6;
    let range_uv = (max_uv * 1.05).ceil().max(1.0);
    let signals = names
        .iter()
        .map(|n| WriteSignal {
            label: n.clone(),
            physical_dimension: "uV".into(),
            physical_min: -range_uv,
            physical_max: range_uv,
        })
        .collect();
    let annotations = args
        .onsets_s
        .iter()
        .filter(|&&t| t >= 0.0 && t < args.duration_s)
        .map(|&t| Annotation {
            onset_s: t,
            duration_s: None,
            text: "burst".into(),
        })
        .collect();
    let spec = EdfWriteSpec {
        format,
        patient: "X X X X".into(),
        recording: format!("Startdate X X trigd_simulate_eeg seed_{}", args.seed),
        start_date: "01.01.00".into(),
        start_time: "00.00.00".into(),
        sample_rate_hz: args.sample_rate_hz,
        record_duration_s,
        signals,
        samples: &sim.data,
        n_samples,
        annotations,
    };
    edf::write_edf(&args.out, &spec).with_context(|| format!("writing {}", args.out.display()))?;
    if let Some(path) = &args.truth_out {
        npyz::WriteOptions::<f64>::new()
            .default_dtype()
            .shape(&[n_channels as u64, n_samples as u64])
            .writer(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            ))
            .begin_nd()
            .and_then(|mut w| {
                w.extend(sim.clean.iter().copied())?;
                w.finish()
            })
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let p = sim.source_position_m;
    println!(
        "dipole on source {} at ({:.1}, {:.1}, {:.1}) mm, {:.1} mm from the requested position; \
         orientation ({:.3}, {:.3}, {:.3}); wrote {} ({} channels, {} samples at {} Hz)",
        sim.source_index,
        p[0] * 1e3,
        p[1] * 1e3,
        p[2] * 1e3,
        sim.distance_mm,
        sim.orientation[0],
        sim.orientation[1],
        sim.orientation[2],
        args.out.display(),
        n_channels,
        n_samples,
        args.sample_rate_hz
    );
    Ok(())
}
