//! What the finder derived for a detector, as `trigd check` prints it: the detector as the
//! finder sees it (planes, resolution, material, the field and whether it measures
//! momenta), each cut of [`FinderConfig`] with its value and the quantity it bounds (the
//! table of [`super::cuts`], with numbers), and what in the description deserves a look
//! before a run: a field map that does not cover the planes and the origin (outside its
//! grid the field is that of the grid's nearest point), a field too weak to measure the
//! momenta it was meant to.

use std::fmt::Write;

use crate::tracking::geometry::{Detector, Field};
use crate::tracking::kalman::bending_power;
use crate::tracking::simulate::highland_theta0;

use super::cuts::FinderConfig;

/// The markdown summary of `cfg` for `det`: the detector, the cuts, then the warnings of
/// [`warnings`] (none: a line saying so).
pub fn summary(det: &Detector, cfg: &FinderConfig) -> String {
    let mut s = String::new();
    let z: Vec<f64> = det.planes.iter().map(|p| p.z_mm).collect();
    let _ = writeln!(
        s,
        "tracking: {} planes from z = {:.1} to {:.1} mm",
        det.planes.len(),
        z.first().copied().unwrap_or(0.0),
        z.last().copied().unwrap_or(0.0)
    );
    let _ = writeln!(s, "field: {}", describe_field(&det.field));
    let (per_qop, length, sigma) = bending_power(det);
    let measured = cfg.fit.fit_momentum;
    let p_win = cfg.min_p_gev / cfg.momentum_slack;
    let _ = writeln!(
        s,
        "momenta: {} (a track of {:.2} GeV/c bends by {:.3} mm over the {:.0} mm of the \
         detector; the finest resolution is {:.3} mm)",
        if measured {
            "measured by the fit"
        } else {
            "not measured: the fit takes the scattering of the momentum cut and of the \
             tracks' kinks"
        },
        p_win,
        per_qop / p_win,
        length,
        sigma
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| plane | z (mm) | half x, y (mm) | sigma x, y (um) | x/X0 | efficiency | scattering at {:.2} GeV/c (mrad) |",
        p_win
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- |");
    for (i, p) in det.planes.iter().enumerate() {
        let theta = highland_theta0(p_win, 1.0, p.x0_fraction);
        let _ = writeln!(
            s,
            "| {i} | {:.1} | {:.1}, {:.1} | {:.1}, {:.1} | {:.4} | {:.3} | {:.3} |",
            p.z_mm,
            p.half_x_mm,
            p.half_y_mm,
            1e3 * p.sigma_x_mm,
            1e3 * p.sigma_y_mm,
            p.x0_fraction,
            p.efficiency,
            1e3 * theta
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "| cut | value | bounds |");
    let _ = writeln!(s, "| --- | --- | --- |");
    let mut row = |name: &str, value: String, bounds: &str| {
        let _ = writeln!(s, "| {name} | {value} | {bounds} |");
    };
    row(
        "min_p_gev",
        format!(
            "{} (windows at {:.3} GeV/c: momentum_slack {})",
            cfg.min_p_gev, p_win, cfg.momentum_slack
        ),
        "the momentum tracks are looked for from; every momentum-dependent window below is at it",
    );
    row(
        "origin",
        format!(
            "({:.3}, {:.3}, {:.1}) mm, box +-({:.3}, {:.3}, {:.3}) mm",
            cfg.origin_x_mm,
            cfg.origin_y_mm,
            cfg.origin_z_mm,
            cfg.origin_half_x_mm,
            cfg.origin_half_y_mm,
            cfg.origin_half_z_mm
        ),
        "where the tracks come from (three standard deviations of the beam on the target); \
         where the configuration gives none, `trigd eval tracking` measures it from the first \
         events",
    );
    row(
        "max_tx, max_ty",
        format!("{:.4}, {:.4}", cfg.max_tx, cfg.max_ty),
        "the slopes of tracks from the origin inside the acceptance, plus the bending at the \
         minimum momentum",
    );
    row(
        "max_curvature_x_per_mm, _y_",
        format!(
            "{:.3e}, {:.3e}",
            cfg.max_curvature_x_per_mm, cfg.max_curvature_y_per_mm
        ),
        "d2x/dz2 and d2y/dz2 at the minimum momentum in the largest field on the lines \
         through the acceptance",
    );
    row(
        "n_sigma",
        format!("{}", cfg.n_sigma),
        "standard deviations of scattering and resolution every window holds",
    );
    row(
        "slope_factor",
        format!("{:.3}", cfg.slope_factor),
        "the longest path through a plane's material at the largest slopes, over the \
         perpendicular one",
    );
    row(
        "triplet_chi2_max",
        format!("{:.2}", cfg.triplet_chi2_max),
        "the breaking angle not explained by the field, in units of scattering and resolution",
    );
    row(
        "neighbour_chi2_max",
        format!("{:.2}", cfg.neighbour_chi2_max),
        "the q/p difference of neighbouring triplets in units of their errors",
    );
    row(
        "min_hits",
        format!("{}", cfg.min_hits),
        "the fewest hits of a track",
    );
    row(
        "max_gap_planes",
        format!("{}", cfg.max_gap_planes),
        "the planes in a row a track may cross without a hit (plane inefficiency)",
    );
    row(
        "max_chi2_ndf",
        format!("{:.2}", cfg.max_chi2_ndf),
        "the fit's chi-square per degree of freedom",
    );
    row(
        "clone_window_mm",
        format!("{:.3}", cfg.clone_window_mm),
        "the scattering displacement over the detector at the minimum momentum",
    );
    row(
        "stiff_pass_p_factor",
        format!("{}", cfg.stiff_pass_p_factor),
        "the momentum (times the minimum) of a first run of each pass for the stiffer tracks",
    );
    let on = |b: bool| if b { "on" } else { "off" };
    row(
        "exchange_segments, first_hits_to_origin, second_hits_to_origin",
        format!(
            "{}, {}, {}",
            on(cfg.exchange_segments),
            on(cfg.first_hits_to_origin),
            on(cfg.second_hits_to_origin)
        ),
        "the exchange of segments between crossing tracks; the first hits, and before them \
         the second hits, chosen again with the origin as a measurement",
    );
    row(
        "keep_tracks_below_min_p",
        on(cfg.keep_tracks_below_min_p).to_string(),
        "whether tracks measured below the minimum momentum are output",
    );
    row(
        "fit: scatter_floor, scatter_qop_error",
        format!(
            "{}, {}",
            on(cfg.fit.scatter_floor),
            on(cfg.fit.scatter_qop_error)
        ),
        "the fit's scattering at most that of the momentum cut; its expectation over the \
         q/p's error where a seed's bending cancels",
    );
    let w = warnings(det, cfg);
    let _ = writeln!(s);
    if w.is_empty() {
        let _ = writeln!(s, "no warnings");
    }
    for line in w {
        let _ = writeln!(s, "warning: {line}");
    }
    s
}

/// The last node of a map's grid along axis `a`, mm.
fn grid_end(map: &crate::tracking::field::FieldMap, a: usize) -> f64 {
    map.origin_mm[a] + map.step_mm[a] * (map.dims[a] - 1) as f64
}

fn describe_field(field: &Field) -> String {
    match field {
        Field::Uniform { b_tesla } => {
            format!("uniform ({}, {}, {}) T", b_tesla[0], b_tesla[1], b_tesla[2])
        }
        Field::Grid(map) => {
            let end = |a: usize| grid_end(map, a);
            format!(
                "map of {} x {} x {} nodes, x {:.1} to {:.1}, y {:.1} to {:.1}, z {:.1} to {:.1} mm \
                 (steps {}, {}, {} mm), largest |B| {:.3} T",
                map.dims[0],
                map.dims[1],
                map.dims[2],
                map.origin_mm[0],
                end(0),
                map.origin_mm[1],
                end(1),
                map.origin_mm[2],
                end(2),
                map.step_mm[0],
                map.step_mm[1],
                map.step_mm[2],
                map.max_abs_tesla()
            )
        }
    }
}

/// What in the detector's description deserves a look before a run, a sentence each:
/// - a field map whose grid does not hold a plane's area or the origin, where the field it
///   gives there (that of the grid's nearest point) is more than a hundredth of its
///   largest: a map that ends inside the detector with a field at its edge bends the
///   tracks beyond it as if the field went on;
/// - a field too weak to measure momenta (the fit then does not measure them, and the
///   momentum cut only sets the scattering the windows allow: a field in gauss where
///   tesla was meant reads so).
pub fn warnings(det: &Detector, cfg: &FinderConfig) -> Vec<String> {
    let mut out = Vec::new();
    if let Field::Grid(map) = &det.field {
        let end = |a: usize| grid_end(map, a);
        let (lo, hi) = (map.origin_mm, [end(0), end(1), end(2)]);
        let largest = map.max_abs_tesla();
        // Each plane's area (and the origin) where it lies outside the grid, sampled every
        // grid step: the field the tracks get there is the grid's nearest point's.
        let mut beyond = Vec::new();
        let origin = [cfg.origin_x_mm, cfg.origin_y_mm, cfg.origin_z_mm];
        let mut places: Vec<(String, [f64; 2], [f64; 2], f64)> = det
            .planes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (
                    format!("plane {i} (z = {:.1} mm)", p.z_mm),
                    [-p.half_x_mm, p.half_x_mm],
                    [-p.half_y_mm, p.half_y_mm],
                    p.z_mm,
                )
            })
            .collect();
        places.push((
            format!("the origin (z = {:.1} mm)", origin[2]),
            [origin[0]; 2],
            [origin[1]; 2],
            origin[2],
        ));
        for (name, xs, ys, z) in places {
            let out_z = z < lo[2] - 0.5 * map.step_mm[2] || z > hi[2] + 0.5 * map.step_mm[2];
            let mut field = 0.0f64;
            let mut out_any = out_z;
            let n =
                |a: usize, r: [f64; 2]| ((r[1] - r[0]) / map.step_mm[a]).ceil().max(1.0) as usize;
            let (nx, ny) = (n(0, xs), n(1, ys));
            for ix in 0..=nx {
                for iy in 0..=ny {
                    let x = xs[0] + (xs[1] - xs[0]) * ix as f64 / nx as f64;
                    let y = ys[0] + (ys[1] - ys[0]) * iy as f64 / ny as f64;
                    let out = out_z
                        || x < lo[0] - 0.5 * map.step_mm[0]
                        || x > hi[0] + 0.5 * map.step_mm[0]
                        || y < lo[1] - 0.5 * map.step_mm[1]
                        || y > hi[1] + 0.5 * map.step_mm[1];
                    if out {
                        out_any = true;
                        let b = map.at([x, y, z]);
                        field = b.iter().fold(field, |m, &c| m.max(c.abs()));
                    }
                }
            }
            // A field below a hundredth of the map's largest beyond its grid bends nothing
            // the windows would notice.
            if out_any && field > 0.01 * largest {
                beyond.push(format!("{name}, up to {field:.3} T there"));
            }
        }
        if !beyond.is_empty() {
            out.push(format!(
                "the field map (x {:.1} to {:.1}, y {:.1} to {:.1}, z {:.1} to {:.1} mm) does \
                 not hold all of {}; outside its grid the field is that of the grid's nearest \
                 point: where the real field is weaker there, extend the map",
                lo[0],
                hi[0],
                lo[1],
                hi[1],
                lo[2],
                hi[2],
                beyond.join("; ")
            ));
        }
    }
    let has_field = match &det.field {
        Field::Uniform { b_tesla } => b_tesla.iter().any(|&b| b != 0.0),
        Field::Grid(map) => map.max_abs_tesla() > 0.0,
    };
    if !cfg.fit.fit_momentum && has_field {
        let (per_qop, _, sigma) = bending_power(det);
        let p_win = cfg.min_p_gev / cfg.momentum_slack;
        out.push(format!(
            "the field bends a track of {p_win:.2} GeV/c (the momentum cut less its slack) by \
             {:.4} mm, less than the finest resolution ({sigma:.4} mm): momenta are not \
             measured, and the momentum cut ({} GeV/c) only sets the scattering the windows \
             allow",
            per_qop / p_win,
            cfg.min_p_gev
        ));
    }
    out
}
