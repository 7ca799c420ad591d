//! Event displays: one detector event as the replay saw it, in the bending view (x-z, the
//! dipole bends tracks in x) and the non-bending view (y-z): the planes of the geometry,
//! every hit (on a track: filled, in the track's colour; unused: hollow), and each track's
//! hits joined in z. The title carries the event's decision from the log.

use std::collections::HashMap;
use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::log::Record;
use super::style::{AXIS_DESC, LEGEND, PANEL_TITLE, TICK_LABEL, TITLE};
use super::{draw_svg, escape, Picture, ReportError, Section};
use crate::frame::HitRecord;
use crate::tracking::geometry::Detector;
use crate::tracking::trackml;

/// Distinct colours for tracks (Tableau 10 and its lighter half), cycled.
const TRACK_COLOURS: [RGBColor; 16] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x39, 0x3b, 0x79),
    RGBColor(0xad, 0x49, 0x41),
    RGBColor(0x31, 0xa3, 0x54),
    RGBColor(0x7b, 0x41, 0x73),
    RGBColor(0xe6, 0x55, 0x0d),
    RGBColor(0x63, 0x79, 0x39),
    RGBColor(0x31, 0x82, 0xbd),
];

/// One event ready to draw: its hits and the track of each (0: on no track).
#[derive(Debug, Clone)]
pub struct EventView {
    pub event_id: u64,
    pub hits: Vec<HitRecord>,
    pub track_of: Vec<u64>,
    /// The decision's words for the title, e.g. `accepted (lines: two_tracks)`.
    pub verdict: String,
}

impl EventView {
    /// Hits of each track, sorted by z, by track id.
    pub fn tracks(&self) -> Vec<(u64, Vec<&HitRecord>)> {
        let mut by_track: HashMap<u64, Vec<&HitRecord>> = HashMap::new();
        for (h, &t) in self.hits.iter().zip(&self.track_of) {
            if t != 0 {
                by_track.entry(t).or_default().push(h);
            }
        }
        let mut tracks: Vec<(u64, Vec<&HitRecord>)> = by_track.into_iter().collect();
        tracks.sort_by_key(|(t, _)| *t);
        for (_, hits) in &mut tracks {
            hits.sort_by(|a, b| a.z_mm.total_cmp(&b.z_mm));
        }
        tracks
    }
}

/// The events to draw: `chosen`, or the first kept and the first rejected tracking
/// decision of the log (by event id = the decision's `seq`, as the TrackML replay numbers
/// frames). Returns the ids and notes about what could not be found.
pub fn choose_events(records: &[Record], chosen: &[u64]) -> (Vec<u64>, Vec<String>) {
    if !chosen.is_empty() {
        return (chosen.to_vec(), Vec::new());
    }
    let tracking = || records.iter().filter(|r| r.workload == "tracking");
    let mut ids = Vec::new();
    let mut notes = Vec::new();
    match tracking().find(|r| r.kept()) {
        Some(r) => ids.push(r.seq),
        None => notes.push("no accepted tracking event in the log".to_string()),
    }
    match tracking().find(|r| r.outcome == crate::decision::Outcome::Reject) {
        Some(r) => ids.push(r.seq),
        None => notes.push(
            "no rejected tracking event in the log: choose events with --event N".to_string(),
        ),
    }
    (ids, notes)
}

/// The decision of event `id` in words.
fn verdict_of(records: &[Record], id: u64) -> String {
    match records
        .iter()
        .find(|r| r.workload == "tracking" && r.seq == id)
    {
        None => "no decision in the log".into(),
        Some(r) => {
            let word = match r.outcome {
                crate::decision::Outcome::Accept => "accepted",
                crate::decision::Outcome::Reject => "rejected",
                o => o.as_str(),
            };
            if r.lines.is_empty() {
                word.to_string()
            } else {
                format!("{word} (lines: {})", r.lines.join(", "))
            }
        }
    }
}

/// Joins the submission rows of one event with its hits; every submitted hit must be one
/// of the event's.
pub fn event_view(
    event: trackml::TrackmlEvent,
    rows: &HashMap<u32, u64>,
    tracks_path: &Path,
    verdict: String,
) -> Result<EventView, ReportError> {
    let index: HashMap<u32, usize> = event
        .hits
        .iter()
        .enumerate()
        .map(|(i, h)| (h.hit_id, i))
        .collect();
    let mut track_of = vec![0u64; event.hits.len()];
    let mut unknown: Vec<u32> = Vec::new();
    for (&hit_id, &track) in rows {
        match index.get(&hit_id) {
            Some(&i) => track_of[i] = track,
            None => unknown.push(hit_id),
        }
    }
    if let Some(hit_id) = unknown.iter().min() {
        return Err(ReportError::Input {
            path: tracks_path.to_path_buf(),
            reason: format!(
                "event {}: hit_id {hit_id} is not among the event's {} hits: give --events the \
                 directory the replay read",
                event.event_id,
                event.hits.len()
            ),
        });
    }
    Ok(EventView {
        event_id: event.event_id,
        hits: event.hits,
        track_of,
        verdict,
    })
}

pub fn section(
    records: &[Record],
    tracks_path: &Path,
    events_dir: &Path,
    geometry: Option<&Path>,
    chosen: &[u64],
    out: &Path,
) -> Result<Section, ReportError> {
    let bytes = std::fs::read(tracks_path).map_err(|source| ReportError::Io {
        path: tracks_path.to_path_buf(),
        source,
    })?;
    let rows = trackml::parse_submission_csv(&bytes, &tracks_path.display().to_string())?;
    let mut by_event: HashMap<u64, HashMap<u32, u64>> = HashMap::new();
    for (event_id, hit_id, track_id) in rows {
        by_event
            .entry(event_id)
            .or_default()
            .insert(hit_id, track_id);
    }
    let detector = geometry.map(Detector::from_toml_file).transpose()?;
    let (mut ids, mut notes) = choose_events(records, chosen);
    if ids.is_empty() {
        // No tracking decision to choose by: the first event of the tracks file.
        if let Some(&first) = by_event.keys().min() {
            ids.push(first);
        }
    }
    if detector.is_none() {
        notes.push("planes not drawn: pass --geometry DET.toml".into());
    }
    let empty = HashMap::new();
    let mut pictures = Vec::new();
    for id in ids {
        let event = trackml::read_event(events_dir, id)?;
        let rows = by_event.get(&id).unwrap_or(&empty);
        if rows.is_empty() {
            notes.push(format!(
                "event {id} has no rows in {}: all its hits are drawn as unused",
                tracks_path.display()
            ));
        }
        let view = event_view(event, rows, tracks_path, verdict_of(records, id))?;
        let file = format!("event_{id}.svg");
        draw_svg(out, &file, (1400, 640), |root| {
            draw_event(root, &view, detector.as_ref())
        })?;
        let n_tracks = view.tracks().len();
        let used = view.track_of.iter().filter(|&&t| t != 0).count();
        pictures.push(Picture {
            file,
            caption: format!(
                "Event {id}, {}: {} hits, {used} of them on {n_tracks} tracks (filled, one \
                 colour per track, joined in z), {} unused (hollow). Left: bending view x-z; \
                 right: non-bending view y-z; grey bars: the planes' extent.",
                view.verdict,
                view.hits.len(),
                view.hits.len() - used
            ),
        });
    }
    let mut html = format!(
        "<p>Tracks <code>{}</code>, events <code>{}</code>{}.</p>\n",
        escape(&tracks_path.display().to_string()),
        escape(&events_dir.display().to_string()),
        geometry
            .map(|g| format!(
                ", geometry <code>{}</code>",
                escape(&g.display().to_string())
            ))
            .unwrap_or_default()
    );
    for n in notes {
        html.push_str(&format!("<p class=\"missing\">{}</p>\n", escape(&n)));
    }
    Ok(Section {
        title: "Event display".into(),
        html,
        pictures,
    })
}

/// Which transverse coordinate a view shows.
#[derive(Clone, Copy)]
enum View {
    Bending,
    NonBending,
}

impl View {
    fn of(self, h: &HitRecord) -> f64 {
        match self {
            View::Bending => f64::from(h.x_mm),
            View::NonBending => f64::from(h.y_mm),
        }
    }
}

fn draw_event(
    root: DrawingArea<SVGBackend<'_>, Shift>,
    view: &EventView,
    detector: Option<&Detector>,
) -> Result<(), Box<dyn Error>> {
    root.fill(&WHITE)?;
    let title = format!(
        "Event {}: {}, {}, {}",
        view.event_id,
        view.verdict,
        super::count(view.tracks().len(), "track"),
        super::count(view.hits.len(), "hit")
    );
    let root = root.titled(&title, ("sans-serif", TITLE))?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    panel(left, view, detector, View::Bending)?;
    panel(right, view, detector, View::NonBending)?;
    root.present()?;
    Ok(())
}

fn panel(
    area: DrawingArea<SVGBackend<'_>, Shift>,
    view: &EventView,
    detector: Option<&Detector>,
    which: View,
) -> Result<(), Box<dyn Error>> {
    let planes: Vec<(f64, f64)> = detector
        .map(|d| {
            d.planes
                .iter()
                .map(|p| {
                    let half = match which {
                        View::Bending => p.half_x_mm,
                        View::NonBending => p.half_y_mm,
                    };
                    (p.z_mm, half)
                })
                .collect()
        })
        .unwrap_or_default();
    let z_hi = planes
        .iter()
        .map(|p| p.0)
        .chain(view.hits.iter().map(|h| f64::from(h.z_mm)))
        .fold(0.0, f64::max);
    let z_lo = planes
        .iter()
        .map(|p| p.0)
        .chain(view.hits.iter().map(|h| f64::from(h.z_mm)))
        .fold(0.0, f64::min);
    let t_max = planes
        .iter()
        .map(|p| p.1)
        .chain(view.hits.iter().map(|h| which.of(h).abs()))
        .fold(1.0, f64::max)
        * 1.08;
    let z_pad = (z_hi - z_lo).max(1.0) * 0.04;
    let (name, axis) = match which {
        View::Bending => ("Bending view (x-z)", "x (mm)"),
        View::NonBending => ("Non-bending view (y-z)", "y (mm)"),
    };
    let mut chart = ChartBuilder::on(&area)
        .margin(15)
        .caption(name, ("sans-serif", PANEL_TITLE))
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(z_lo - z_pad..z_hi + z_pad, -t_max..t_max)?;
    chart
        .configure_mesh()
        .x_desc("z (mm), along the beam")
        .y_desc(axis)
        .x_label_formatter(&|v| super::tick(*v))
        .y_label_formatter(&|v| super::tick(*v))
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .label_style(("sans-serif", TICK_LABEL))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.06))
        .draw()?;
    let plane_style = BLACK.mix(0.25).stroke_width(4);
    if !planes.is_empty() {
        chart
            .draw_series(
                planes
                    .iter()
                    .map(|&(z, half)| PathElement::new(vec![(z, -half), (z, half)], plane_style)),
            )?
            .label("plane")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x + 10, y - 6), (x + 10, y + 6)], plane_style)
            });
    }
    // The target, where tracks come from.
    chart
        .draw_series(std::iter::once(Cross::new(
            (0.0, 0.0),
            6,
            BLACK.stroke_width(2),
        )))?
        .label("target")
        .legend(|(x, y)| Cross::new((x + 10, y), 5, BLACK.stroke_width(2)));
    for (k, (t, hits)) in view.tracks().iter().enumerate() {
        let colour = TRACK_COLOURS[(*t as usize).wrapping_sub(1) % TRACK_COLOURS.len()];
        let points: Vec<(f64, f64)> = hits
            .iter()
            .map(|h| (f64::from(h.z_mm), which.of(h)))
            .collect();
        let line = chart.draw_series(LineSeries::new(points.clone(), colour.stroke_width(1)))?;
        if k == 0 {
            line.label("track (hits joined, one colour each)")
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
        }
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    let unused: Vec<(f64, f64)> = view
        .hits
        .iter()
        .zip(&view.track_of)
        .filter(|(_, &t)| t == 0)
        .map(|(h, _)| (f64::from(h.z_mm), which.of(h)))
        .collect();
    let unused_style = BLACK.mix(0.6).stroke_width(1);
    chart
        .draw_series(unused.iter().map(|&p| Circle::new(p, 3, unused_style)))?
        .label(format!("unused hit ({})", unused.len()))
        .legend(move |(x, y)| Circle::new((x + 10, y), 3, unused_style));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", LEGEND))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn rec(seq: u64, outcome: &str) -> Record {
        let line = format!(
            "{{\"seq\":{seq},\"source\":\"ev\",\"workload\":\"tracking\",\"outcome\":\"{outcome}\",\
             \"lines\":[],\"latency_us\":1.0,\"backend\":\"cpu\"}}"
        );
        super::super::log::parse_log(&line, Path::new("d.jsonl"))
            .unwrap()
            .remove(0)
    }

    #[test]
    fn default_events_are_the_first_accepted_and_the_first_rejected() {
        let log = vec![
            rec(4, "dropped"),
            rec(5, "reject"),
            rec(6, "accept"),
            rec(7, "reject"),
            rec(8, "accept"),
        ];
        assert_eq!(choose_events(&log, &[]).0, vec![6, 5]);
        assert_eq!(choose_events(&log, &[8]).0, vec![8]);
        let (ids, notes) = choose_events(&log[2..3], &[]);
        assert_eq!(ids, vec![6]);
        assert!(notes[0].contains("--event"), "{notes:?}");
    }

    fn hit(hit_id: u32, z_mm: f32) -> HitRecord {
        HitRecord {
            x_mm: 0.0,
            y_mm: 0.0,
            z_mm,
            plane: 0,
            hit_id,
        }
    }

    #[test]
    fn tracks_are_joined_in_z_and_foreign_hits_are_refused() {
        let event = trackml::TrackmlEvent {
            event_id: 3,
            hits: vec![hit(1, 500.0), hit(2, 300.0), hit(3, 400.0), hit(4, 300.0)],
            truth: None,
            particles: None,
        };
        let rows: HashMap<u32, u64> = [(1, 2), (2, 2), (3, 2), (4, 0)].into_iter().collect();
        let v = event_view(event.clone(), &rows, Path::new("t.csv"), "accepted".into()).unwrap();
        let tracks = v.tracks();
        assert_eq!(tracks.len(), 1);
        let ids: Vec<u32> = tracks[0].1.iter().map(|h| h.hit_id).collect();
        assert_eq!(ids, vec![2, 3, 1]);
        let foreign: HashMap<u32, u64> = [(9, 1)].into_iter().collect();
        let e = event_view(event, &foreign, Path::new("t.csv"), String::new()).unwrap_err();
        assert!(e.to_string().contains("hit_id 9"), "{e}");
    }
}
