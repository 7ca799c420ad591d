//! The run seen from its decision log: the latency histogram, latency quantiles and outcome
//! fractions over the run (bins of consecutive decisions, so a burst of drops or a slow
//! stretch shows where it happened), the fraction of frames each trigger line fired on,
//! the backend share, and a table of totals.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::log::{self, Record};
use super::style::{AXIS_DESC, LEGEND, TICK_LABEL, TITLE};
use super::{draw_svg, escape, row, Picture, ReportError, Section};
use crate::decision::Outcome;

/// Colour of each outcome, in the order of [`Outcome::ALL`].
pub const OUTCOME_COLOURS: [RGBColor; 5] = [
    RGBColor(0x2c, 0xa0, 0x2c), // accept: green
    RGBColor(0x7f, 0x7f, 0x7f), // reject: grey
    RGBColor(0xff, 0x7f, 0x0e), // timeout: orange
    RGBColor(0xd6, 0x27, 0x28), // dropped: red
    RGBColor(0x94, 0x67, 0xbd), // malformed: purple
];
const P50: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const P99: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
const MAX: RGBColor = RGBColor(0xd6, 0x27, 0x28);

pub fn section(records: &[Record], per_bin: usize, out: &Path) -> Result<Section, ReportError> {
    let t = log::totals(records);
    let mut pictures = Vec::new();

    draw_svg(out, "latency_histogram.svg", (900, 450), |root| {
        latency_histogram(root, records, &t)
    })?;
    pictures.push(Picture {
        file: "latency_histogram.svg".into(),
        caption: format!(
            "Latency from arrival to decision of all {} (bins even in the logarithm when the \
             latencies span more than a decade), with p50 {:.1} µs, p99 {:.1} µs and max \
             {:.1} µs.",
            super::count(t.decisions, "decision"),
            t.p50_us,
            t.p99_us,
            t.max_us
        ),
    });

    let lat = log::latency_over_time(records, per_bin);
    draw_svg(out, "latency_over_time.svg", (900, 450), |root| {
        latency_over_time(root, &lat, records.len(), per_bin)
    })?;
    pictures.push(Picture {
        file: "latency_over_time.svg".into(),
        caption: format!(
            "Latency quantiles in bins of {} in the order of the log.",
            super::count(per_bin, "decision")
        ),
    });

    let outcomes = log::outcomes_over_time(records, per_bin);
    draw_svg(out, "outcomes_over_time.svg", (900, 450), |root| {
        outcomes_over_time(root, &outcomes, &t, records.len(), per_bin)
    })?;
    pictures.push(Picture {
        file: "outcomes_over_time.svg".into(),
        caption: format!(
            "Fraction of each outcome in bins of {} in the order of the log; the dropped \
             fraction is the drop rate. Outcomes that never occurred are left out.",
            super::count(per_bin, "decision")
        ),
    });

    let lines = log::line_shares(records);
    let kept_fraction = t.kept as f64 / t.decisions as f64;
    draw_svg(out, "trigger_lines.svg", (800, 420), |root| {
        let mut bars: Vec<(String, f64, RGBColor)> = lines
            .iter()
            .map(|l| (l.line.clone(), l.fraction, P50))
            .collect();
        bars.push(("kept (any line)".into(), kept_fraction, OUTCOME_COLOURS[0]));
        fraction_bars(
            root,
            "Accepted fraction per trigger line",
            "fraction of all decisions",
            &bars,
        )
    })?;
    pictures.push(Picture {
        file: "trigger_lines.svg".into(),
        caption: "Fraction of all decisions on which each trigger line fired, and the \
                  fraction kept (accepted, or timed out and resolved to accept). A line that \
                  never fired does not appear in the log."
            .into(),
    });

    let backends = log::backend_share(records);
    draw_svg(out, "backend_share.svg", (800, 420), |root| {
        let bars: Vec<(String, f64, RGBColor)> = backends
            .iter()
            .map(|(b, n)| {
                let colour = match b.as_str() {
                    "gpu" => OUTCOME_COLOURS[0],
                    "cpu" => P50,
                    _ => OUTCOME_COLOURS[1],
                };
                (b.clone(), *n as f64 / t.decisions as f64, colour)
            })
            .collect();
        fraction_bars(root, "Backend share", "fraction of all decisions", &bars)
    })?;
    pictures.push(Picture {
        file: "backend_share.svg".into(),
        caption: "Which backend decided each frame (\"none\": dropped or malformed frames, \
                  decided without reconstruction)."
            .into(),
    });

    Ok(Section {
        title: "Run".into(),
        html: totals_html(&t, &backends),
        pictures,
    })
}

fn totals_html(t: &log::Totals, backends: &[(String, usize)]) -> String {
    let pct = |n: usize| format!("{:.2} %", 100.0 * n as f64 / t.decisions as f64);
    let mut h = String::from("<table>\n<tr><th>decisions</th><th>count</th><th>share</th></tr>\n");
    h.push_str(&row(&[
        "all".into(),
        t.decisions.to_string(),
        "100 %".into(),
    ]));
    for o in Outcome::ALL {
        let n = t.per_outcome[o.code() as usize];
        h.push_str(&row(&[o.as_str().into(), n.to_string(), pct(n)]));
    }
    h.push_str(&row(&["kept".into(), t.kept.to_string(), pct(t.kept)]));
    for (reason, n) in &t.reasons {
        h.push_str(&row(&[format!("reason {reason}"), n.to_string(), pct(*n)]));
    }
    for (b, n) in backends {
        h.push_str(&row(&[format!("backend {b}"), n.to_string(), pct(*n)]));
    }
    h.push_str("</table>\n<table>\n<tr><th>latency, arrival to decision</th><th>µs</th></tr>\n");
    for (name, v) in [("p50", t.p50_us), ("p99", t.p99_us), ("max", t.max_us)] {
        h.push_str(&row(&[name.into(), format!("{v:.1}")]));
    }
    h.push_str("</table>\n");
    let _ = writeln!(
        h,
        "<p>Sources: {}. Workloads: {}.</p>",
        t.sources
            .iter()
            .map(|s| format!("<code>{}</code>", escape(s)))
            .collect::<Vec<_>>()
            .join(", "),
        escape(&t.workloads.join(", "))
    );
    h
}

/// The mesh with the pictures' text sizes and tick labels.
fn labelled_mesh(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x_desc: &str,
    y_desc: &str,
    x_label: &dyn Fn(&f64) -> String,
    y_label: &dyn Fn(&f64) -> String,
) -> Result<(), Box<dyn Error>> {
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(x_label)
        .y_label_formatter(y_label)
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .label_style(("sans-serif", TICK_LABEL))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    Ok(())
}

/// Labels only the whole numbers of an axis that counts decisions.
fn whole(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else {
        String::new()
    }
}

/// A latency axis: logarithmic (drawn as log10 on a linear axis, labelled in µs) when the
/// latencies span more than a decade, linear otherwise.
#[derive(Clone, Copy)]
struct LatencyAxis {
    log: bool,
}

impl LatencyAxis {
    fn for_range(lo_us: f64, hi_us: f64) -> Self {
        Self {
            log: lo_us > 0.0 && hi_us / lo_us > 10.0,
        }
    }
    fn to_axis(self, us: f64) -> f64 {
        if self.log {
            us.max(1e-3).log10()
        } else {
            us
        }
    }
    fn us_at(self, v: f64) -> f64 {
        if self.log {
            10f64.powf(v)
        } else {
            v
        }
    }
    /// Axis range around `[lo_us, hi_us]` with a margin.
    /// Room at the top for the legend: `headroom`, a fraction of the span.
    fn range(self, lo_us: f64, hi_us: f64, headroom: f64) -> std::ops::Range<f64> {
        let (a, b) = (self.to_axis(lo_us), self.to_axis(hi_us));
        let pad = ((b - a) * 0.08).max(if self.log {
            0.05
        } else {
            b.abs() * 0.05 + 1e-3
        });
        let lo = if self.log {
            a - pad
        } else {
            (a - pad).max(0.0)
        };
        let hi = b + pad;
        lo..hi + (hi - lo) * headroom
    }
    fn desc(self) -> &'static str {
        if self.log {
            "latency (µs, logarithmic)"
        } else {
            "latency (µs)"
        }
    }
    fn label(self) -> impl Fn(&f64) -> String {
        move |v: &f64| super::tick(self.us_at(*v))
    }
}

fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), Box<dyn Error>>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", LEGEND))
        .draw()?;
    Ok(())
}

fn latency_histogram(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    records: &[Record],
    t: &log::Totals,
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let lat: Vec<f64> = records.iter().map(|r| r.latency_us).collect();
    let lo_us = lat
        .iter()
        .copied()
        .filter(|&l| l > 0.0)
        .fold(f64::INFINITY, f64::min);
    let hi_us = lat.iter().copied().fold(0.0, f64::max);
    let lo_us = if lo_us.is_finite() {
        lo_us
    } else {
        hi_us.max(1.0)
    };
    let axis = LatencyAxis::for_range(lo_us, hi_us);
    let x_range = axis.range(lo_us, hi_us, 0.0);
    // Trigger latencies have long tails: bins even in log10 when the span is wide.
    let n_bins = 40usize;
    let width = (x_range.end - x_range.start) / n_bins as f64;
    let mut counts = vec![0usize; n_bins];
    for &l in &lat {
        let b = ((axis.to_axis(l) - x_range.start) / width).floor();
        counts[(b.max(0.0) as usize).min(n_bins - 1)] += 1;
    }
    // Head room above the bars for the legend.
    let y_max = counts.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.45;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            format!(
                "Latency, arrival to decision ({})",
                super::count(records.len(), "decision")
            ),
            ("sans-serif", TITLE),
        )
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(x_range.clone(), 0.0..y_max)?;
    labelled_mesh(
        &mut chart,
        axis.desc(),
        "decisions per bin",
        &axis.label(),
        &whole,
    )?;
    chart.draw_series(
        counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let x0 = x_range.start + i as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, n as f64)], P50.mix(0.55).filled())
            }),
    )?;
    for (name, v, colour) in [
        ("p50", t.p50_us, P50),
        ("p99", t.p99_us, P99),
        ("max", t.max_us, MAX),
    ] {
        let x = axis.to_axis(v);
        chart
            .draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, y_max)],
                6,
                4,
                colour.stroke_width(2),
            ))?
            .label(format!("{name} {v:.1} µs"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

fn latency_over_time(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    bins: &[log::LatencyBin],
    n: usize,
    per_bin: usize,
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let lo_us = bins.iter().map(|b| b.p50_us).fold(f64::INFINITY, f64::min);
    let hi_us = bins.iter().map(|b| b.max_us).fold(0.0, f64::max);
    let axis = LatencyAxis::for_range(lo_us, hi_us);
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            format!(
                "Latency quantiles over the run ({} per bin)",
                super::count(per_bin, "decision")
            ),
            ("sans-serif", TITLE),
        )
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..n.max(1) as f64, axis.range(lo_us, hi_us, 0.35))?;
    labelled_mesh(
        &mut chart,
        "decision number (order of the log)",
        axis.desc(),
        &whole,
        &axis.label(),
    )?;
    let centre = |b: &log::LatencyBin| b.first as f64 + b.n as f64 / 2.0;
    type Pick = fn(&log::LatencyBin) -> f64;
    let series: [(&str, Pick, RGBColor); 3] = [
        ("max", |b| b.max_us, MAX),
        ("p99", |b| b.p99_us, P99),
        ("p50", |b| b.p50_us, P50),
    ];
    for (name, pick, colour) in series {
        let points: Vec<(f64, f64)> = bins
            .iter()
            .map(|b| (centre(b), axis.to_axis(pick(b))))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

fn outcomes_over_time(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    bins: &[log::OutcomeBin],
    t: &log::Totals,
    n: usize,
    per_bin: usize,
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            format!(
                "Outcomes over the run ({} per bin)",
                super::count(per_bin, "decision")
            ),
            ("sans-serif", TITLE),
        )
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..n.max(1) as f64, 0.0..1.4)?;
    labelled_mesh(
        &mut chart,
        "decision number (order of the log)",
        "fraction of the bin's decisions",
        &whole,
        // The space above 1 holds the legend; no fraction lives there.
        &|v| {
            if *v > 1.0 + 1e-9 {
                String::new()
            } else {
                super::tick(*v)
            }
        },
    )?;
    for o in Outcome::ALL {
        let k = o.code() as usize;
        if t.per_outcome[k] == 0 {
            continue;
        }
        let colour = OUTCOME_COLOURS[k];
        let points: Vec<(f64, f64)> = bins
            .iter()
            .map(|b| (b.first as f64 + b.n as f64 / 2.0, b.fraction[k]))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(format!("{} ({})", o.as_str(), t.per_outcome[k]))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

/// Vertical bars of fractions (0..1), one per named category, with the value above each.
fn fraction_bars(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y_desc: &str,
    bars: &[(String, f64, RGBColor)],
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let n = bars.len().max(1);
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let label = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(title, ("sans-serif", TITLE))
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.6..n as f64 - 0.4, 0.0..1.12)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_label_formatter(&|v| super::tick(*v))
        .y_desc(y_desc)
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .label_style(("sans-serif", AXIS_DESC))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, f, colour))| {
        let x = i as f64;
        Rectangle::new([(x - 0.3, 0.0), (x + 0.3, *f)], colour.mix(0.8).filled())
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, f, _))| {
        Text::new(
            format!("{:.1} %", 100.0 * f),
            (i as f64 - 0.12, f + 0.05),
            ("sans-serif", LEGEND),
        )
    }))?;
    root.present()?;
    Ok(())
}
