//! `trigd report`: the pictures people look at before they trust a run, written as SVG
//! files beside one self-contained `index.html`. Each section reads what a run leaves:
//!
//! - [`run`]: the decision log (latency, outcomes and drops over the run, trigger lines,
//!   backends, totals);
//! - [`event_display`]: `--tracks-out` with the replayed TrackML events and the geometry
//!   (planes, hits and tracks in the bending and non-bending views);
//! - the SVGs `trigd eval tracking --plots DIR` wrote (copied beside the page);
//! - [`source_map`]: `--sources-out` with the source positions (power in three orthogonal
//!   views at the peak of the region-of-interest statistic, and that statistic against time
//!   with the threshold and the triggers).
//!
//! Only the decision log is required; a section whose inputs are missing is replaced by a
//! line saying what to pass.

pub mod event_display;
pub mod log;
pub mod run;
pub mod source_map;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::eeg::roi::RoiConfig;

/// Why a report could not be written. Every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: line {line}: {reason}", path.display())]
    Line {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("{}: {reason}", path.display())]
    Input { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Trackml(#[from] crate::tracking::trackml::TrackmlError),
    #[error(transparent)]
    Geometry(#[from] crate::tracking::geometry::GeometryError),
    #[error(transparent)]
    Eeg(#[from] crate::eeg::inputs::EegInputError),
    #[error("{0}")]
    Roi(#[from] crate::eeg::roi::RoiError),
    #[error("drawing {}: {reason}", path.display())]
    Draw { path: PathBuf, reason: String },
    #[error(
        "no TrueType font for the pictures' text: install DejaVu Sans (Debian: fonts-dejavu-core) \
         or set TRIGD_FONT to a .ttf file"
    )]
    NoFont,
    #[error("{0}")]
    Usage(String),
}

/// The event display's inputs.
#[derive(Debug, Clone, Default)]
pub struct TracksInput {
    /// TrackML submission `event_id,hit_id,track_id` (`--tracks-out` of the replay).
    pub tracks: Option<PathBuf>,
    /// The TrackML CSV directory the replay read.
    pub events: Option<PathBuf>,
    /// Detector geometry TOML (the planes).
    pub geometry: Option<PathBuf>,
    /// Events to draw; empty: the first accepted and the first rejected.
    pub chosen: Vec<u64>,
}

/// The source map's inputs.
#[derive(Debug, Clone, Default)]
pub struct SourcesInput {
    /// NPY `[n_sources, n_samples]` (`--sources-out` of the replay).
    pub sources: Option<PathBuf>,
    /// NPY `[n_sources, 3]`, metres.
    pub positions: Option<PathBuf>,
    /// The region of interest and its trigger, as the run's `[eeg.roi]`; `None`: every
    /// source, a window of one sample, no threshold (what the daemon does without one).
    pub roi: Option<RoiConfig>,
    /// Sample rate; `None`: from the EEG decisions' time stamps.
    pub sample_rate_hz: Option<f64>,
    /// Samples per frame of the replay (its `--block-samples`); `None`: the replay's
    /// default, 32.
    pub block_samples: Option<usize>,
    /// Draw the map at this sample instead of the statistic's peak.
    pub map_sample: Option<usize>,
}

/// Everything `trigd report` reads.
#[derive(Debug, Clone)]
pub struct ReportInputs {
    pub decisions: PathBuf,
    pub out: PathBuf,
    /// Decisions per bin in the pictures over the run; `None`: about 50 bins.
    pub bin_decisions: Option<usize>,
    pub tracks: TracksInput,
    /// The directory `trigd eval tracking --plots DIR` wrote.
    pub eval: Option<PathBuf>,
    pub sources: SourcesInput,
}

/// One picture of the page: an SVG file in the output directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    /// Path relative to the output directory.
    pub file: String,
    pub caption: String,
}

/// One section of the page.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub title: String,
    /// Text above the pictures (HTML, already escaped).
    pub html: String,
    pub pictures: Vec<Picture>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    pub index: PathBuf,
    pub pictures: Vec<String>,
    /// Sections left out, with what to pass to get them.
    pub missing: Vec<String>,
}

/// Writes `index.html` and the pictures into `inputs.out`.
pub fn write_report(inputs: &ReportInputs) -> Result<Written, ReportError> {
    if !crate::tracking::eval::plot::ensure_font() {
        return Err(ReportError::NoFont);
    }
    let records = log::read_log(&inputs.decisions)?;
    std::fs::create_dir_all(&inputs.out).map_err(|source| ReportError::Io {
        path: inputs.out.clone(),
        source,
    })?;
    let mut sections = Vec::new();
    // Sections left out are listed for the workloads the log has.
    let mut missing = Vec::new();
    let has = |workload: &str| records.iter().any(|r| r.workload == workload);

    let bin = inputs
        .bin_decisions
        .unwrap_or_else(|| log::default_bin(records.len()));
    sections.push(run::section(&records, bin, &inputs.out)?);

    let t = &inputs.tracks;
    match (&t.tracks, &t.events) {
        (Some(tracks), Some(events)) => sections.push(event_display::section(
            &records,
            tracks,
            events,
            t.geometry.as_deref(),
            &t.chosen,
            &inputs.out,
        )?),
        _ if has("tracking") => missing.push(
            "Event display: pass --tracks-out tracks.csv (the replay's) --events DIR (the \
             TrackML CSV directory it read) --geometry DET.toml"
                .to_string(),
        ),
        _ => {}
    }

    match &inputs.eval {
        Some(dir) => sections.push(eval_section(dir, &inputs.out)?),
        None if has("tracking") => missing.push(
            "Tracking physics: pass --eval DIR (the directory `trigd eval tracking --plots DIR` \
             wrote)"
                .to_string(),
        ),
        None => {}
    }

    let s = &inputs.sources;
    match (&s.sources, &s.positions) {
        (Some(sources), Some(positions)) => sections.push(source_map::section(
            &records,
            sources,
            positions,
            s,
            &inputs.out,
        )?),
        _ if has("eeg") => missing.push(
            "EEG source map: pass --sources-out sources.npy (the replay's) --src \
             source_pos.npy, and the run's region of interest with --config FILE ([eeg.roi]) \
             or --roi-sources / --roi-sphere-mm"
                .to_string(),
        ),
        _ => {}
    }

    let index = inputs.out.join("index.html");
    let html = page(&inputs.decisions, &sections, &missing);
    std::fs::write(&index, html).map_err(|source| ReportError::Io {
        path: index.clone(),
        source,
    })?;
    Ok(Written {
        index,
        pictures: sections
            .iter()
            .flat_map(|s| s.pictures.iter().map(|p| p.file.clone()))
            .collect(),
        missing,
    })
}

/// Copies the SVGs of an `eval --plots` directory beside the page, under `eval/`.
fn eval_section(dir: &Path, out: &Path) -> Result<Section, ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(ReportError::Input {
            path: dir.to_path_buf(),
            reason: "no SVG pictures here: give the directory `trigd eval tracking EVENTS \
                     --geometry DET.toml --plots DIR` wrote"
                .into(),
        });
    }
    let target = out.join("eval");
    std::fs::create_dir_all(&target).map_err(io(&target))?;
    let mut pictures = Vec::new();
    for name in names {
        let from = dir.join(&name);
        std::fs::copy(&from, target.join(&name)).map_err(io(&from))?;
        let caption = match name.trim_end_matches(".svg") {
            "efficiency_vs_p" => "Tracking efficiency against the true momentum; the red line is the momentum cut.",
            "ghosts_vs_p" => "Ghost rate (tracks matched to no particle) against the fitted momentum.",
            "efficiency_vs_planes" => "Efficiency by the number of planes the particle crossed.",
            "efficiency_vs_missing" => "Efficiency by the number of planes without a hit.",
            "pulls" => "Pulls of the fitted track parameters at the first plane, with the Gaussian of their robust mean and width.",
            _ => "",
        };
        pictures.push(Picture {
            file: format!("eval/{name}"),
            caption: caption.to_string(),
        });
    }
    Ok(Section {
        title: "Tracking physics (trigd eval)".into(),
        html: format!(
            "<p>From <code>{}</code>.</p>",
            escape(&dir.display().to_string())
        ),
        pictures,
    })
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn page(decisions: &Path, sections: &[Section], missing: &[String]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>trigd report: {log}</title>\n<style>\n\
         body {{ font-family: 'DejaVu Sans', sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }}\n\
         h1 {{ font-size: 1.6em; }} h2 {{ border-bottom: 1px solid #ccc; margin-top: 2em; }}\n\
         figure {{ margin: 1em 0; }} figure img {{ max-width: 100%; border: 1px solid #eee; }}\n\
         figcaption {{ color: #555; font-size: 0.9em; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         td, th {{ border: 1px solid #ccc; padding: 0.2em 0.7em; text-align: right; }}\n\
         th {{ background: #f4f4f4; }} td:first-child, th:first-child {{ text-align: left; }}\n\
         .missing {{ color: #8a5a00; }}\n\
         </style>\n</head>\n<body>\n<h1>trigd report</h1>\n<p>Decision log <code>{log}</code>.</p>\n",
        log = escape(&decisions.display().to_string())
    );
    for s in sections {
        let _ = writeln!(h, "<h2>{}</h2>\n{}", escape(&s.title), s.html);
        for p in &s.pictures {
            let _ = writeln!(
                h,
                "<figure><img src=\"{f}\" alt=\"{f}\"><figcaption>{c}</figcaption></figure>",
                f = escape(&p.file),
                c = escape(&p.caption)
            );
        }
    }
    if !missing.is_empty() {
        h.push_str("<h2>Not shown</h2>\n<ul>\n");
        for m in missing {
            let _ = writeln!(h, "<li class=\"missing\">{}</li>", escape(m));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</body>\n</html>\n");
    h
}

/// Draws one SVG picture at `out/file` with `draw`, naming the file in errors.
pub(crate) fn draw_svg(
    out: &Path,
    file: &str,
    size: (u32, u32),
    draw: impl FnOnce(
        plotters::drawing::DrawingArea<plotters::prelude::SVGBackend<'_>, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), ReportError> {
    use plotters::prelude::*;
    let path = out.join(file);
    let root = SVGBackend::new(&path, size).into_drawing_area();
    let drawn = draw(root).map_err(|e| e.to_string());
    drawn.map_err(|reason| ReportError::Draw { path, reason })
}

/// Text sizes shared by the pictures (pixels), readable at the page's width.
pub(crate) mod style {
    pub const TITLE: u32 = 22;
    pub const PANEL_TITLE: u32 = 18;
    pub const AXIS_DESC: u32 = 16;
    pub const TICK_LABEL: u32 = 13;
    pub const LEGEND: u32 = 14;
}

/// A tick label: plain numbers with a few significant digits, powers of ten only for very
/// large or small values.
pub(crate) fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        // Exactly: EEG powers in MNE's units are about 1e-18.
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        // Three significant digits, without trailing zeros.
        let digits = (2.0 - a.log10().floor()).max(0.0) as usize;
        let s = format!("{v:.digits$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// `n` and the noun, plural unless `n` is 1.
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A table row of HTML cells.
pub(crate) fn row(cells: &[String]) -> String {
    let mut r = String::from("<tr>");
    for c in cells {
        let _ = write!(r, "<td>{}</td>", escape(c));
    }
    r.push_str("</tr>\n");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short_plain_numbers() {
        assert_eq!(tick(300.0), "300");
        assert_eq!(tick(-50.0), "-50");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1.6), "1.6");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(0.9), "0.9");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.234), "1.23");
        assert_eq!(tick(0.0125), "0.0125");
        assert_eq!(tick(2.5e-18), "2.5e-18");
        assert_eq!(tick(3.0e6), "3.0e6");
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
