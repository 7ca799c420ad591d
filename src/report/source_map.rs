//! EEG source maps from `--sources-out`: the region-of-interest statistic against time,
//! computed from the source estimates with the library's own [`block_stats`] and
//! [`RoiTrigger`] (the daemon's decision, sample by sample), with the threshold, the
//! firings and the accepted decisions of the log; and the source power in three
//! orthogonal views (sagittal, coronal, axial) at the statistic's peak.
//!
//! The sample rate is not in the NPY file: it comes from `--sample-rate-hz`, or from the
//! EEG decisions' time stamps (block `k` starts at `k * block_samples / fs`) with the
//! replay's block length.

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::log::Record;
use super::style::{AXIS_DESC, LEGEND, PANEL_TITLE, TICK_LABEL, TITLE};
use super::{draw_svg, escape, Picture, ReportError, Section, SourcesInput};
use crate::eeg::inputs::read_npy_matrix;
use crate::eeg::roi::{block_stats, BlockStats, RoiConfig, RoiTrigger};

/// The statistic of a whole recording, sample by sample.
#[derive(Debug, Clone, PartialEq)]
pub struct RoiSeries {
    /// Window mean of ROI power at each sample (what the trigger compares).
    pub statistic: Vec<f64>,
    /// Samples at which the trigger fired.
    pub fired: Vec<usize>,
    pub window_samples: usize,
    /// `None` when no region is configured (nothing can fire).
    pub threshold: Option<f64>,
    /// Sources of the region.
    pub roi: Vec<u32>,
}

/// Runs the daemon's region-of-interest statistic over source amplitudes `[n_sources,
/// n_times]` (source-major), one sample at a time, as the daemon does block by block: the
/// per-sample ROI power from [`block_stats`] and the sliding window, threshold and
/// refractory period of [`RoiTrigger`]. Without a region: every source, a one-sample
/// window and no threshold, as the daemon runs without `[eeg.roi]`.
pub fn roi_series(
    amplitudes: &[f64],
    n_times: usize,
    positions_m: &[[f64; 3]],
    roi: Option<&RoiConfig>,
    fs_hz: f64,
) -> Result<RoiSeries, ReportError> {
    let (mask, mut trigger, threshold) = match roi {
        Some(r) => (
            r.resolve(positions_m)?,
            r.trigger(fs_hz)?,
            // f64::MAX: a region without a threshold (`--roi-sources` and no `--roi-threshold`).
            Some(r.threshold).filter(|&t| t < f64::MAX),
        ),
        None => {
            let all = RoiConfig {
                sphere: None,
                sources: Some((0..positions_m.len() as u32).collect()),
                window_ms: 1.0,
                threshold: f64::MAX,
                refractory_ms: 0.0,
            };
            (
                all.resolve(positions_m)?,
                RoiTrigger::new(1, f64::MAX, 0),
                None,
            )
        }
    };
    let mut stats = BlockStats::with_capacity(n_times);
    block_stats(amplitudes, n_times, &mask, &mut stats);
    let mut statistic = Vec::with_capacity(n_times);
    let mut fired = Vec::new();
    for (t, p) in stats.roi_power.iter().enumerate() {
        let d = trigger.push_block(std::slice::from_ref(p), t as u64);
        statistic.push(d.statistic);
        if d.fired {
            fired.push(t);
        }
    }
    Ok(RoiSeries {
        statistic,
        fired,
        window_samples: trigger.window_samples(),
        threshold,
        roi: mask.indices,
    })
}

/// The sample with the largest statistic once the window is full (the whole run if it is
/// shorter than the window).
pub fn peak_sample(s: &RoiSeries) -> usize {
    let start = if s.statistic.len() >= s.window_samples {
        s.window_samples - 1
    } else {
        0
    };
    (start..s.statistic.len())
        .filter(|&t| s.statistic[t].is_finite())
        .max_by(|&a, &b| s.statistic[a].total_cmp(&s.statistic[b]).then(b.cmp(&a)))
        .unwrap_or(0)
}

/// Each source's power (amplitude²) averaged over the `window` samples ending at `t`.
pub fn power_at(amplitudes: &[f64], n_times: usize, t: usize, window: usize) -> Vec<f64> {
    let first = (t + 1).saturating_sub(window.max(1));
    amplitudes
        .chunks_exact(n_times)
        .map(|row| {
            let w = &row[first..=t];
            w.iter().map(|a| a * a).sum::<f64>() / w.len() as f64
        })
        .collect()
}

/// The sample rate from the EEG decisions' time stamps: block `seq` starts at sample
/// `seq * block_samples`, stamped `that / fs` seconds. Uses the decision with the latest
/// time stamp of the first EEG source.
pub fn sample_rate_from_log(records: &[Record], block_samples: usize) -> Option<f64> {
    let first = records.iter().find(|r| r.workload == "eeg")?;
    let last = records
        .iter()
        .filter(|r| r.workload == "eeg" && r.source == first.source && r.seq > 0)
        .filter_map(|r| r.timestamp_ns.map(|ts| (r.seq, ts)))
        .filter(|&(_, ts)| ts > 0)
        .max_by_key(|&(_, ts)| ts)?;
    let fs = (last.0 as f64 * block_samples as f64) / (last.1 as f64 * 1e-9);
    fs.is_finite().then_some(fs)
}

pub fn section(
    records: &[Record],
    sources_path: &Path,
    positions_path: &Path,
    input: &SourcesInput,
    out: &Path,
) -> Result<Section, ReportError> {
    let (n_sources, n_times, amplitudes) = read_npy_matrix(
        sources_path,
        None,
        None,
        "source estimates [n_sources, n_samples]",
    )?;
    let (_, _, pos) = read_npy_matrix(
        positions_path,
        Some(n_sources),
        Some(3),
        "source positions [n_sources, 3] (the replay's --src)",
    )?;
    let positions_m: Vec<[f64; 3]> = pos.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
    let block_samples = input.block_samples.unwrap_or(32);
    let fs_hz = match input.sample_rate_hz {
        Some(fs) => fs,
        None => sample_rate_from_log(records, block_samples).ok_or_else(|| {
            ReportError::Usage(
                "the sample rate of the source estimates is unknown: the decision log has no \
                 time-stamped EEG decisions; pass --sample-rate-hz"
                    .into(),
            )
        })?,
    };
    if !(fs_hz.is_finite() && fs_hz > 0.0) {
        return Err(ReportError::Usage(format!(
            "sample rate {fs_hz} Hz must be positive"
        )));
    }
    let series = roi_series(
        &amplitudes,
        n_times,
        &positions_m,
        input.roi.as_ref(),
        fs_hz,
    )?;
    let t_map = match input.map_sample {
        Some(t) if t < n_times => t,
        Some(t) => {
            return Err(ReportError::Input {
                path: sources_path.to_path_buf(),
                reason: format!("--map-sample {t} is past the last sample ({})", n_times - 1),
            })
        }
        None => peak_sample(&series),
    };
    let power = power_at(&amplitudes, n_times, t_map, series.window_samples);
    if !(power.iter().chain(&series.statistic).all(|v| v.is_finite())) {
        return Err(ReportError::Input {
            path: sources_path.to_path_buf(),
            reason: "source power overflows (amplitudes beyond 1e154): not source estimates \
                     of a replay"
                .into(),
        });
    }

    // Accepted EEG blocks of the log, as time spans.
    let block_s = block_samples as f64 / fs_hz;
    let accepted: Vec<(f64, f64)> = records
        .iter()
        .filter(|r| r.workload == "eeg" && r.kept())
        .filter_map(|r| r.timestamp_ns)
        .map(|ts| (ts as f64 * 1e-9, ts as f64 * 1e-9 + block_s))
        .collect();

    let window_ms = series.window_samples as f64 * 1e3 / fs_hz;
    let mut pictures = Vec::new();
    draw_svg(out, "roi_statistic.svg", (1200, 480), |root| {
        statistic_plot(root, &series, fs_hz, t_map, &accepted)
    })?;
    pictures.push(Picture {
        file: "roi_statistic.svg".into(),
        caption: format!(
            "Region-of-interest statistic (mean source power over the {} region sources, \
             averaged over a {window_ms:.1} ms window) against time, {}; triangles: where the \
             trigger fires on these estimates; green bands: blocks the log accepted; dotted: \
             the sample of the map.",
            series.roi.len(),
            match series.threshold {
                Some(th) => format!("with the threshold {} (red)", super::tick(th)),
                None => "no region of interest configured, so no threshold".into(),
            }
        ),
    });
    draw_svg(out, "source_map.svg", (1500, 560), |root| {
        map_plot(
            root,
            &positions_m,
            &power,
            &series.roi,
            t_map,
            fs_hz,
            window_ms,
        )
    })?;
    let strongest = (0..power.len())
        .max_by(|&a, &b| power[a].total_cmp(&power[b]))
        .unwrap_or(0);
    let p = positions_m[strongest];
    pictures.push(Picture {
        file: "source_map.svg".into(),
        caption: format!(
            "Source power (amplitude², mean over the {window_ms:.1} ms window ending at \
             t = {:.4} s, sample {t_map}) of all {n_sources} sources, seen from the side \
             (sagittal), the back (coronal) and above (axial), head coordinates in mm; along each \
             line of sight the strongest source is drawn on top. Red \
             rings: the region of interest; black cross: the strongest source ({strongest}, \
             at {:.0}, {:.0}, {:.0} mm).",
            t_map as f64 / fs_hz,
            p[0] * 1e3,
            p[1] * 1e3,
            p[2] * 1e3
        ),
    });

    let mut html = format!(
        "<p>Source estimates <code>{}</code> ({n_sources} sources, {n_times} samples at \
         {fs_hz} Hz{}), positions <code>{}</code>.</p>\n",
        escape(&sources_path.display().to_string()),
        if input.sample_rate_hz.is_some() {
            String::new()
        } else {
            format!(", from the log's time stamps with blocks of {block_samples} samples")
        },
        escape(&positions_path.display().to_string())
    );
    let log_accepted = accepted.len();
    let fired_blocks = {
        let mut b: Vec<usize> = series.fired.iter().map(|t| t / block_samples).collect();
        b.dedup();
        b.len()
    };
    html.push_str(&format!(
        "<p>The log has {log_accepted} accepted EEG decisions; the region given here fires \
         at {} samples, in {fired_blocks} blocks of {block_samples}.{}</p>\n",
        series.fired.len(),
        if log_accepted != fired_blocks {
            " They differ: give the run's own [eeg.roi] (--config) and block length \
             (--block-samples)."
        } else {
            ""
        }
    ));
    Ok(Section {
        title: "EEG source map".into(),
        html,
        pictures,
    })
}

/// Viridis (matplotlib's default colour map: perceptually uniform, readable in grey and
/// by colour-blind readers) at `h` in 0..=1, interpolated between eight of its colours.
pub fn viridis(h: f64) -> RGBColor {
    const ANCHORS: [(u8, u8, u8); 8] = [
        (68, 1, 84),
        (70, 50, 127),
        (54, 92, 141),
        (39, 127, 143),
        (31, 162, 136),
        (74, 194, 110),
        (160, 219, 57),
        (254, 232, 37),
    ];
    let h = if h.is_finite() {
        h.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = h * (ANCHORS.len() - 1) as f64;
    let i = (x.floor() as usize).min(ANCHORS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (f64::from(a) * (1.0 - f) + f64::from(b) * f).round() as u8;
    let (a, b) = (ANCHORS[i], ANCHORS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// At most about `buckets` pairs of (sample, value): the min and the max of each bucket,
/// in time order, so a long recording draws as its envelope.
fn envelope(v: &[f64], buckets: usize) -> Vec<(usize, f64)> {
    if v.len() <= 2 * buckets {
        return v.iter().copied().enumerate().collect();
    }
    let step = v.len().div_ceil(buckets);
    let mut out = Vec::with_capacity(2 * buckets);
    for (b, chunk) in v.chunks(step).enumerate() {
        let lo = (0..chunk.len()).min_by(|&i, &j| chunk[i].total_cmp(&chunk[j]));
        let hi = (0..chunk.len()).max_by(|&i, &j| chunk[i].total_cmp(&chunk[j]));
        if let (Some(lo), Some(hi)) = (lo, hi) {
            let (a, c) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            out.push((b * step + a, chunk[a]));
            out.push((b * step + c, chunk[c]));
        }
    }
    out
}

fn statistic_plot(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    s: &RoiSeries,
    fs_hz: f64,
    t_map: usize,
    accepted: &[(f64, f64)],
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let finite = s.statistic.iter().copied().filter(|v| v.is_finite());
    let data_max = finite.fold(0.0, f64::max);
    // A threshold far above the data would flatten the curve: drawn only within reach.
    let threshold = s
        .threshold
        .filter(|&th| th.is_finite() && th > 0.0 && (data_max == 0.0 || th <= 10.0 * data_max));
    let y_max = threshold.map_or(data_max, |th| data_max.max(th));
    // Head room above the curve for the legend.
    let y_max = if y_max > 0.0 && (y_max * 1.5).is_finite() {
        y_max * 1.5
    } else {
        1.0
    };
    let t_end = s.statistic.len().max(1) as f64 / fs_hz;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            "Region-of-interest statistic against time",
            ("sans-serif", TITLE),
        )
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..t_end, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("window mean of ROI power (amplitude²)")
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .label_style(("sans-serif", TICK_LABEL))
        .y_label_formatter(&|v| super::tick(*v))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let band = RGBColor(0x2c, 0xa0, 0x2c);
    if !accepted.is_empty() {
        chart
            .draw_series(accepted.iter().map(|&(a, b)| {
                Rectangle::new([(a, 0.0), (b.min(t_end), y_max)], band.mix(0.18).filled())
            }))?
            .label("accepted decision (log)")
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 20, y + 6)], band.mix(0.3).filled())
            });
    }
    let line = RGBColor(0x1f, 0x77, 0xb4);
    let points: Vec<(f64, f64)> = envelope(&s.statistic, 2000)
        .into_iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(t, v)| (t as f64 / fs_hz, v))
        .collect();
    chart
        .draw_series(LineSeries::new(points, line.stroke_width(2)))?
        .label(format!("statistic ({}-sample window)", s.window_samples))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], line.stroke_width(2)));
    if let Some(th) = threshold {
        let red = RGBColor(0xd6, 0x27, 0x28);
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, th), (t_end, th)],
                8,
                5,
                red.stroke_width(2),
            ))?
            .label(format!("threshold {}", super::tick(th)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
    }
    if !s.fired.is_empty() {
        chart
            .draw_series(s.fired.iter().map(|&t| {
                let v = s.statistic[t];
                TriangleMarker::new((t as f64 / fs_hz, v), 7, band.filled())
            }))?
            .label(format!("trigger ({} firings)", s.fired.len()))
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, band.filled()));
    }
    let tm = t_map as f64 / fs_hz;
    chart
        .draw_series(DashedLineSeries::new(
            [(tm, 0.0), (tm, y_max)],
            3,
            4,
            BLACK.stroke_width(1),
        ))?
        .label(format!("map sample ({tm:.3} s)"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", LEGEND))
        .draw()?;
    root.present()?;
    Ok(())
}

fn map_plot(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    positions_m: &[[f64; 3]],
    power: &[f64],
    roi: &[u32],
    t_map: usize,
    fs_hz: f64,
    window_ms: f64,
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "Source power at t = {:.3} s (sample {t_map}), {window_ms:.1} ms window",
            t_map as f64 / fs_hz
        ),
        ("sans-serif", TITLE),
    )?;
    let (w, _) = root.dim_in_pixel();
    let (views, bar) = root.split_horizontally(w - 170);
    let panels = views.split_evenly((1, 3));
    let mm: Vec<[f64; 3]> = positions_m
        .iter()
        .map(|p| [p[0] * 1e3, p[1] * 1e3, p[2] * 1e3])
        .collect();
    // One span for every axis, so the three views keep the head's proportions.
    let mut lo = [f64::INFINITY; 3];
    let mut hi = [f64::NEG_INFINITY; 3];
    for p in &mm {
        for k in 0..3 {
            lo[k] = lo[k].min(p[k]);
            hi[k] = hi[k].max(p[k]);
        }
    }
    let span = (0..3).map(|k| hi[k] - lo[k]).fold(1.0, f64::max) * 1.15;
    let range = |k: usize| {
        let c = (lo[k] + hi[k]) / 2.0;
        c - span / 2.0..c + span / 2.0
    };
    let p_max = power.iter().copied().fold(0.0, f64::max);
    let norm = |p: f64| if p_max > 0.0 { p / p_max } else { 0.0 };
    let mut order: Vec<usize> = (0..mm.len()).collect();
    order.sort_by(|&a, &b| power[a].total_cmp(&power[b]));
    let strongest = order.last().copied().unwrap_or(0);
    let views_spec: [(&str, usize, usize, &str, &str); 3] = [
        (
            "Sagittal (from the right)",
            1,
            2,
            "y (mm), posterior to anterior",
            "z (mm)",
        ),
        (
            "Coronal (from behind)",
            0,
            2,
            "x (mm), left to right",
            "z (mm)",
        ),
        (
            "Axial (from above)",
            0,
            1,
            "x (mm), left to right",
            "y (mm)",
        ),
    ];
    let red = RGBColor(0xd6, 0x27, 0x28);
    for (panel, (name, a, b, x_desc, y_desc)) in panels.iter().zip(views_spec) {
        let mut chart = ChartBuilder::on(panel)
            .margin(12)
            .caption(name, ("sans-serif", PANEL_TITLE))
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(range(a), range(b))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(5)
            .y_labels(5)
            .x_label_formatter(&|v| super::tick(*v))
            .y_label_formatter(&|v| super::tick(*v))
            .axis_desc_style(("sans-serif", AXIS_DESC - 2))
            .label_style(("sans-serif", TICK_LABEL))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.06))
            .draw()?;
        // Weakest first, so the strongest sources are drawn on top.
        chart.draw_series(
            order
                .iter()
                .map(|&s| Circle::new((mm[s][a], mm[s][b]), 5, viridis(norm(power[s])).filled())),
        )?;
        chart.draw_series(roi.iter().map(|&s| {
            Circle::new(
                (mm[s as usize][a], mm[s as usize][b]),
                8,
                red.stroke_width(2),
            )
        }))?;
        chart.draw_series(std::iter::once(Cross::new(
            (mm[strongest][a], mm[strongest][b]),
            9,
            BLACK.stroke_width(3),
        )))?;
    }
    colour_bar(bar, p_max)?;
    root.present()?;
    Ok(())
}

/// The colour scale, with the map's legend (region of interest, strongest source) under it.
fn colour_bar(area: DrawingArea<SVGBackend<'_>, Shift>, p_max: f64) -> Result<(), Box<dyn Error>> {
    let top = if p_max > 0.0 { p_max } else { 1.0 };
    let h = area.dim_in_pixel().1 as i32;
    let font = ("sans-serif", LEGEND).into_font();
    let red = RGBColor(0xd6, 0x27, 0x28);
    area.draw(&Circle::new((12, h - 62), 7, red.stroke_width(2)))?;
    area.draw(&Text::new("region", (26, h - 70), font.clone()))?;
    area.draw(&Cross::new((12, h - 36), 7, BLACK.stroke_width(3)))?;
    area.draw(&Text::new("strongest", (26, h - 44), font))?;
    let mut chart = ChartBuilder::on(&area)
        .margin_top(45)
        .margin_bottom(90)
        .margin_left(10)
        .margin_right(10)
        .y_label_area_size(95)
        .build_cartesian_2d(0.0..1.0, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_y_mesh()
        .x_labels(0)
        .y_desc("power (amplitude²)")
        .y_label_formatter(&|v| super::tick(*v))
        .axis_desc_style(("sans-serif", AXIS_DESC - 2))
        .label_style(("sans-serif", TICK_LABEL))
        .draw()?;
    let steps = 100;
    chart.draw_series((0..steps).map(|i| {
        let a = top * i as f64 / steps as f64;
        let b = top * (i + 1) as f64 / steps as f64;
        Rectangle::new(
            [(0.0, a), (1.0, b)],
            viridis((i as f64 + 0.5) / steps as f64).filled(),
        )
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of_sources(n: usize) -> Vec<[f64; 3]> {
        (0..n).map(|i| [i as f64 * 0.01, 0.0, 0.0]).collect()
    }

    #[test]
    fn the_statistic_is_the_window_mean_of_roi_power_and_fires_over_threshold() {
        // Two sources, 8 samples at 1 kHz; the region is source 1, whose amplitude is 2
        // from sample 4 on (power 4). A 2 ms window: mean power 0, .., 2 at sample 4, then 4.
        let n_times = 8;
        let mut a = vec![0.5; 2 * n_times];
        for t in 0..n_times {
            a[n_times + t] = if t >= 4 { 2.0 } else { 0.0 };
        }
        let roi = RoiConfig {
            sphere: None,
            sources: Some(vec![1]),
            window_ms: 2.0,
            threshold: 3.0,
            refractory_ms: 2.0,
        };
        let s = roi_series(&a, n_times, &line_of_sources(2), Some(&roi), 1000.0).unwrap();
        assert_eq!(s.statistic, vec![0.0, 0.0, 0.0, 0.0, 2.0, 4.0, 4.0, 4.0]);
        assert_eq!(s.fired, vec![5, 7]);
        assert_eq!(s.window_samples, 2);
        assert_eq!(s.threshold, Some(3.0));
        assert_eq!(peak_sample(&s), 5);
        let p = power_at(&a, n_times, 4, 2);
        assert_eq!(p, vec![0.25, 2.0]);
    }

    #[test]
    fn without_a_region_every_source_counts_and_nothing_fires() {
        let a = vec![1.0, 3.0, 3.0, 1.0];
        let s = roi_series(&a, 2, &line_of_sources(2), None, 100.0).unwrap();
        assert_eq!(s.statistic, vec![5.0, 5.0]);
        assert!(s.fired.is_empty());
        assert_eq!(s.threshold, None);
        assert_eq!(s.roi, vec![0, 1]);
        // A region given without a threshold (f64::MAX) has none to draw either.
        let roi = RoiConfig {
            sphere: None,
            sources: Some(vec![0]),
            window_ms: 10.0,
            threshold: f64::MAX,
            refractory_ms: 0.0,
        };
        let given = roi_series(&a, 2, &line_of_sources(2), Some(&roi), 100.0).unwrap();
        assert_eq!((given.statistic, given.threshold), (vec![1.0, 9.0], None));
    }

    #[test]
    fn sample_rate_from_block_time_stamps() {
        let text: Vec<String> = (0..4)
            .map(|k| {
                format!(
                    "{{\"seq\":{k},\"source\":\"a.edf\",\"workload\":\"eeg\",\"outcome\":\"reject\",\
                     \"lines\":[],\"latency_us\":1.0,\"backend\":\"cpu\",\"timestamp_ns\":{}}}",
                    k * 125_000_000
                )
            })
            .collect();
        let r = super::super::log::parse_log(&text.join("\n"), Path::new("d")).unwrap();
        assert_eq!(sample_rate_from_log(&r, 32), Some(256.0));
        assert_eq!(sample_rate_from_log(&r[..1], 32), None);
    }

    #[test]
    fn the_envelope_keeps_every_extreme() {
        let v: Vec<f64> = (0..10_000).map(|i| ((i * 37) % 101) as f64).collect();
        let e = envelope(&v, 100);
        assert!(e.len() <= 200);
        assert!(e.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(e.iter().map(|p| p.1).fold(0.0, f64::max), 100.0);
        assert_eq!(e.iter().map(|p| p.1).fold(f64::MAX, f64::min), 0.0);
    }
}
