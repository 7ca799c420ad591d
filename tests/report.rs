//! `trigd report` through the real binary on the shipped fixtures: a replay leaves a
//! decision log, tracks and source estimates; the report names every picture it wrote, and
//! each is an SVG with the content its kind needs (bars, one mark per hit, the sources).

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{read_jsonl, root, trigd_bin};

fn trigd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(trigd_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running trigd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (code, stdout, stderr) = trigd(args);
    assert_eq!(code, 0, "trigd {args:?}\n{stdout}\n{stderr}");
    stdout
}

fn fixture(rel: &str) -> String {
    root().join(rel).display().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The `src` of every `<img>` of the page.
fn pictures_of(html: &str) -> Vec<String> {
    html.split("<img src=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect()
}

/// Parses an SVG file as XML; returns its text.
fn svg(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(
        doc.root_element().tag_name().name(),
        "svg",
        "{}",
        path.display()
    );
    text
}

/// Elements named `tag` in an SVG document.
fn count(svg_text: &str, tag: &str) -> usize {
    let doc = roxmltree::Document::parse(svg_text).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == tag)
        .count()
}

/// Checks the page names every picture it is expected to, and each is a valid SVG with
/// drawing in it.
fn check_page(out: &Path, expected: &[&str]) -> Vec<String> {
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    let pictures = pictures_of(&html);
    let named: HashSet<&str> = pictures.iter().map(String::as_str).collect();
    for e in expected {
        assert!(
            named.contains(e),
            "index.html does not show {e}: {pictures:?}"
        );
    }
    for p in &pictures {
        let text = svg(&out.join(p));
        let marks = count(&text, "rect")
            + count(&text, "circle")
            + count(&text, "polyline")
            + count(&text, "path");
        assert!(marks >= 5, "{p} has only {marks} drawn elements");
        assert!(count(&text, "text") >= 3, "{p} has no labels");
    }
    pictures
}

/// The bars of the latency histogram: filled rectangles that are neither the background
/// nor the legend's box (both are white, or have no fill).
fn bars(svg_text: &str) -> usize {
    let doc = roxmltree::Document::parse(svg_text).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == "rect")
        .filter(|n| {
            let fill = n.attribute("fill").unwrap_or("none");
            fill != "none" && fill != "#FFFFFF"
        })
        .count()
}

#[test]
fn a_tracking_replay_gives_a_page_with_the_run_and_event_displays() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let decisions = d.join("decisions.jsonl");
    let tracks = d.join("tracks.csv");
    let events = fixture("fixtures/tracking/minbias");
    let geometry = fixture("fixtures/detector.toml");
    ok(&[
        "replay",
        &events,
        "--workload",
        "tracking",
        "--geometry",
        &geometry,
        "--decisions",
        s(&decisions),
        "--tracks-out",
        s(&tracks),
        "--no-progress",
    ]);
    let log = read_jsonl(&decisions);
    let first_accepted = log
        .iter()
        .find(|r| r["outcome"] == "accept")
        .expect("the minimum-bias fixture has an accepted event")["seq"]
        .as_u64()
        .unwrap();

    let out = d.join("report");
    let stdout = ok(&[
        "report",
        "--decisions",
        s(&decisions),
        "--tracks-out",
        s(&tracks),
        "--events",
        &events,
        "--geometry",
        &geometry,
        "--out",
        s(&out),
    ]);
    assert!(stdout.contains("index.html"), "{stdout}");
    let display = format!("event_{first_accepted}.svg");
    check_page(
        &out,
        &[
            "latency_histogram.svg",
            "latency_over_time.svg",
            "outcomes_over_time.svg",
            "trigger_lines.svg",
            "backend_share.svg",
            &display,
        ],
    );
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    // A section left out says what to pass; the EEG one is not offered to a tracking run.
    assert!(html.contains("pass --eval DIR"), "{html}");
    assert!(!html.contains("EEG source map"), "{html}");

    let histogram = svg(&out.join("latency_histogram.svg"));
    assert!(bars(&histogram) >= 1, "the latency histogram has no bars");

    // The event display marks every hit of the event in both views.
    let hits_file = PathBuf::from(&events).join(format!("event{first_accepted:09}-hits.csv"));
    let n_hits = std::fs::read_to_string(hits_file).unwrap().lines().count() - 1;
    let event = svg(&out.join(&display));
    let circles = count(&event, "circle");
    assert!(
        circles >= 2 * n_hits,
        "{circles} circles for {n_hits} hits in two views"
    );
    assert!(event.contains("accepted"), "the title carries the decision");
    assert!(event.contains("Bending view") && event.contains("Non-bending view"));
    // One polyline per track per view, at least.
    let n_tracks = log.iter().find(|r| r["seq"] == first_accepted).unwrap()["n_tracks"]
        .as_u64()
        .unwrap() as usize;
    assert!(count(&event, "polyline") >= 2 * n_tracks);
}

#[test]
fn an_eeg_replay_gives_the_roi_statistic_and_the_source_map() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let decisions = d.join("eeg.jsonl");
    let sources = d.join("sources.npy");
    let positions = fixture("fixtures/eeg/source_pos.npy");
    let roi = fixture("fixtures/eeg/roi.toml");
    ok(&[
        "replay",
        &fixture("fixtures/eeg/dipole.edf"),
        "--workload",
        "eeg",
        "--leadfield",
        &fixture("fixtures/eeg/leadfield.npy"),
        "--src",
        &positions,
        "--noise-cov",
        &fixture("fixtures/eeg/noise_cov.npy"),
        "--channels",
        &fixture("fixtures/eeg/channels.txt"),
        "--method",
        "sLORETA",
        "--lambda2",
        "0.111",
        "--config",
        &roi,
        "--backend",
        "cpu",
        "--sources-out",
        s(&sources),
        "--decisions",
        s(&decisions),
        "--no-progress",
    ]);
    let accepted = read_jsonl(&decisions)
        .iter()
        .filter(|r| r["outcome"] == "accept")
        .count();
    assert!(accepted > 0, "the fixture's ROI fires on the dipole");

    let out = d.join("report");
    ok(&[
        "report",
        "--decisions",
        s(&decisions),
        "--sources-out",
        s(&sources),
        "--src",
        &positions,
        "--config",
        &roi,
        "--out",
        s(&out),
    ]);
    check_page(&out, &["roi_statistic.svg", "source_map.svg"]);
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        !html.contains("Event display"),
        "tracking sections are not offered"
    );
    // The statistic recomputed from the source estimates fires in the blocks the daemon
    // accepted.
    assert!(
        html.contains(&format!("The log has {accepted} accepted EEG decisions"))
            && html.contains(&format!("in {accepted} blocks of 32."))
            && !html.contains("They differ"),
        "{html}"
    );
    // Every source in each of the three views.
    let map = svg(&out.join("source_map.svg"));
    let n_sources = 313;
    assert!(count(&map, "circle") >= 3 * n_sources);
    for view in ["Sagittal", "Coronal", "Axial"] {
        assert!(map.contains(view), "{view} view missing");
    }
    let stat = svg(&out.join("roi_statistic.svg"));
    assert!(stat.contains("threshold 0.75"), "the threshold is drawn");
}

#[test]
fn the_eval_plots_join_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plots = d.join("plots");
    ok(&[
        "eval",
        "tracking",
        &fixture("fixtures/tracking/minbias"),
        "--geometry",
        &fixture("fixtures/detector.toml"),
        "--plots",
        s(&plots),
    ]);
    let decisions = d.join("d.jsonl");
    std::fs::write(
        &decisions,
        "{\"seq\":0,\"source\":\"s\",\"workload\":\"tracking\",\"outcome\":\"reject\",\"lines\":[],\"latency_us\":12.5,\"backend\":\"cpu\"}\n",
    )
    .unwrap();
    let out = d.join("report");
    ok(&[
        "report",
        "--decisions",
        s(&decisions),
        "--eval",
        s(&plots),
        "--out",
        s(&out),
    ]);
    check_page(&out, &["eval/efficiency_vs_p.svg", "eval/pulls.svg"]);
}

#[test]
fn a_malformed_decision_log_is_refused_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("d.jsonl");
    let good = "{\"seq\":0,\"source\":\"s\",\"workload\":\"tracking\",\"outcome\":\"accept\",\"lines\":[\"track\"],\"latency_us\":12.5,\"backend\":\"cpu\"}";
    std::fs::write(
        &decisions,
        format!("{good}\n{good}\n{{\"seq\":2,\"outcome\n"),
    )
    .unwrap();
    let out = dir.path().join("report");
    let (code, _, stderr) = trigd(&["report", "--decisions", s(&decisions), "--out", s(&out)]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains(&format!("{}: line 3:", decisions.display())),
        "{stderr}"
    );
    assert!(!out.join("index.html").exists());

    // Tracks that do not belong to the events given.
    std::fs::write(&decisions, format!("{good}\n")).unwrap();
    let tracks = dir.path().join("tracks.csv");
    std::fs::write(&tracks, "event_id,hit_id,track_id\n0,999999,1\n").unwrap();
    let (code, _, stderr) = trigd(&[
        "report",
        "--decisions",
        s(&decisions),
        "--tracks-out",
        s(&tracks),
        "--events",
        &fixture("fixtures/tracking/minbias"),
        "--out",
        s(&out),
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("tracks.csv") && stderr.contains("hit_id 999999"),
        "{stderr}"
    );
}
