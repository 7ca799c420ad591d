//! Trigger lines over fitted tracks: each line fires when at least `min_tracks` tracks
//! pass its per-track cuts (momentum, fit quality, number of hits, slope). Line `i` is bit
//! `i` of the event's line mask (at most 64 lines).
//!
//! ```toml
//! [[line]]
//! name = "two_tracks_2gev"
//! min_tracks = 2
//! min_p_gev = 2.0
//! max_chi2_ndf = 3.0
//! min_hits = 5
//!
//! [[line]]
//! name = "single_20gev"
//! min_tracks = 1
//! min_p_gev = 20.0
//! max_dp_over_p = 0.2   # only momenta the field measured to 20 %
//! ```
//!
//! A momentum cut reads the fitted momentum, measured or not: a track the field hardly
//! bends (near the axis of a solenoid, whose field bends a track by its slope; a weak
//! field; no field at all, where the fit takes its momentum from the scattering) has a
//! momentum with an error as large as itself, up to any value. `max_dp_over_p` keeps such
//! tracks out of a line: its cut is on the fit's relative error of q/p.

use crate::tracking::track::Track;
use serde::Deserialize;

/// Most lines in one configuration (one bit each in a `u64`).
pub const MAX_LINES: usize = 64;

/// One trigger line. Absent cuts do not cut.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineConfig {
    /// Unique name (metrics label, decision records).
    pub name: String,
    /// Tracks that must pass the per-track cuts for the line to fire.
    pub min_tracks: u32,
    /// Minimum momentum, GeV/c.
    #[serde(default)]
    pub min_p_gev: f64,
    /// Maximum momentum, GeV/c.
    #[serde(default = "infinite")]
    pub max_p_gev: f64,
    /// Maximum fit chi-square per degree of freedom.
    #[serde(default = "infinite")]
    pub max_chi2_ndf: f64,
    /// Minimum number of hits.
    #[serde(default)]
    pub min_hits: u32,
    /// Maximum relative error of the fitted momentum, `sigma(q/p) / |q/p|` (the fit's
    /// covariance); absent: any. A track whose q/p is zero or not finite passes only
    /// without this cut.
    #[serde(default = "infinite")]
    pub max_dp_over_p: f64,
    /// Maximum slope `sqrt(tx^2 + ty^2)` (angle to the beam axis).
    #[serde(default = "infinite")]
    pub max_slope: f64,
    /// Required charge sign (+1 or -1); absent: either.
    #[serde(default)]
    pub charge: Option<i8>,
}

fn infinite() -> f64 {
    f64::INFINITY
}

/// Why a line configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    #[error("too many trigger lines: {0} (at most 64, one bit each)")]
    TooMany(usize),
    #[error("trigger line {index}: empty name")]
    EmptyName { index: usize },
    #[error("trigger line \"{0}\" is defined twice (names must be unique)")]
    Duplicate(String),
    #[error("trigger line \"{name}\": {field} {reason}")]
    Invalid {
        name: String,
        field: &'static str,
        reason: &'static str,
    },
    #[error("trigger lines: {0}")]
    Syntax(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinesFile {
    #[serde(default)]
    line: Vec<LineConfig>,
}

/// Parses `[[line]]` tables from TOML text and validates them.
pub fn parse_lines(toml_text: &str) -> Result<Vec<LineConfig>, LineError> {
    let f: LinesFile = toml::from_str(toml_text)
        .map_err(|e| LineError::Syntax(e.to_string().trim_end().to_string()))?;
    validate(&f.line)?;
    Ok(f.line)
}

/// Checks names are unique and non-empty, at most 64 lines, cuts are numbers in range.
pub fn validate(lines: &[LineConfig]) -> Result<(), LineError> {
    if lines.len() > MAX_LINES {
        return Err(LineError::TooMany(lines.len()));
    }
    for (i, l) in lines.iter().enumerate() {
        if l.name.trim().is_empty() {
            return Err(LineError::EmptyName { index: i });
        }
        if lines[..i].iter().any(|o| o.name == l.name) {
            return Err(LineError::Duplicate(l.name.clone()));
        }
        let inv = |field, reason| {
            Err(LineError::Invalid {
                name: l.name.clone(),
                field,
                reason,
            })
        };
        if l.min_tracks == 0 {
            return inv("min_tracks", "must be at least 1");
        }
        if l.min_p_gev.is_nan() || l.min_p_gev < 0.0 {
            return inv("min_p_gev", "must be zero or positive");
        }
        if l.max_p_gev.is_nan() || l.max_p_gev < l.min_p_gev {
            return inv("max_p_gev", "must be at least min_p_gev");
        }
        if l.max_chi2_ndf.is_nan() || l.max_chi2_ndf <= 0.0 {
            return inv("max_chi2_ndf", "must be positive");
        }
        if l.max_dp_over_p.is_nan() || l.max_dp_over_p <= 0.0 {
            return inv("max_dp_over_p", "must be positive");
        }
        if l.max_slope.is_nan() || l.max_slope <= 0.0 {
            return inv("max_slope", "must be positive");
        }
        if let Some(c) = l.charge {
            if c != 1 && c != -1 {
                return inv("charge", "must be 1 or -1");
            }
        }
    }
    Ok(())
}

impl LineConfig {
    /// Whether one track passes this line's per-track cuts.
    #[inline]
    pub fn accepts(&self, t: &Track) -> bool {
        let p = t.state.p_gev() as f64;
        let slope2 = (t.state.tx * t.state.tx + t.state.ty * t.state.ty) as f64;
        p >= self.min_p_gev
            && p <= self.max_p_gev
            && (t.chi2_ndf() as f64) <= self.max_chi2_ndf
            && t.hits.len() as u64 >= self.min_hits as u64
            && slope2 <= self.max_slope * self.max_slope
            && (self.max_dp_over_p == f64::INFINITY || t.momentum_measured_to(self.max_dp_over_p))
            && self
                .charge
                .is_none_or(|c| (t.state.qop > 0.0) == (c > 0) && t.state.qop != 0.0)
    }
}

/// The event's line mask: bit `i` set when line `i` fired (lines beyond 64 are ignored;
/// [`validate`] refuses them).
pub fn evaluate(lines: &[LineConfig], tracks: &[Track]) -> u64 {
    let mut mask = 0u64;
    for (i, line) in lines.iter().take(MAX_LINES).enumerate() {
        let mut n = 0u32;
        for t in tracks {
            if line.accepts(t) {
                n += 1;
                if n >= line.min_tracks {
                    mask |= 1 << i;
                    break;
                }
            }
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracking::track::TrackState;
    use proptest::prelude::*;

    fn track(p: f32, q: f32, chi2_ndf: f32, n_hits: usize) -> Track {
        Track {
            hits: (0..n_hits as u32).collect(),
            state: TrackState {
                z_mm: 300.0,
                x_mm: 0.0,
                y_mm: 0.0,
                tx: 0.1,
                ty: 0.0,
                qop: q / p,
            },
            cov: [0.0; 15],
            chi2: chi2_ndf * 10.0,
            ndf: 10,
        }
    }

    const LINES: &str = r#"
[[line]]
name = "single_high_p"
min_tracks = 1
min_p_gev = 10.0

[[line]]
name = "two_good_tracks"
min_tracks = 2
min_p_gev = 1.0
max_chi2_ndf = 3.0
min_hits = 6

[[line]]
name = "negative"
min_tracks = 1
charge = -1
"#;

    #[test]
    fn lines_fire_on_the_tracks_that_pass_their_cuts() {
        let lines = parse_lines(LINES).unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(evaluate(&lines, &[]), 0);
        let a = track(12.0, 1.0, 1.0, 8);
        let b = track(2.0, 1.0, 1.0, 8);
        let bad_fit = track(2.0, 1.0, 4.0, 8);
        let short = track(2.0, -1.0, 1.0, 4);
        assert_eq!(evaluate(&lines, std::slice::from_ref(&a)), 0b001);
        assert_eq!(evaluate(&lines, &[a.clone(), b.clone()]), 0b011);
        assert_eq!(evaluate(&lines, &[b.clone(), bad_fit]), 0b000);
        assert_eq!(evaluate(&lines, &[b, short]), 0b100);
    }

    #[test]
    fn invalid_configurations_are_refused_with_the_line_named() {
        let dup =
            "[[line]]\nname = \"a\"\nmin_tracks = 1\n[[line]]\nname = \"a\"\nmin_tracks = 2\n";
        assert_eq!(parse_lines(dup), Err(LineError::Duplicate("a".into())));
        let unknown = "[[line]]\nname = \"a\"\nmin_tracks = 1\nmin_pt = 3.0\n";
        assert!(matches!(parse_lines(unknown), Err(LineError::Syntax(_))));
        let zero = "[[line]]\nname = \"z\"\nmin_tracks = 0\n";
        assert!(matches!(
            parse_lines(zero),
            Err(LineError::Invalid {
                field: "min_tracks",
                ..
            })
        ));
        let charge = "[[line]]\nname = \"c\"\nmin_tracks = 1\ncharge = 2\n";
        assert!(matches!(
            parse_lines(charge),
            Err(LineError::Invalid {
                field: "charge",
                ..
            })
        ));
        let many: String = (0..65)
            .map(|i| format!("[[line]]\nname = \"l{i}\"\nmin_tracks = 1\n"))
            .collect();
        assert_eq!(parse_lines(&many), Err(LineError::TooMany(65)));
        let ok64: String = (0..64)
            .map(|i| format!("[[line]]\nname = \"l{i}\"\nmin_tracks = 1\n"))
            .collect();
        let lines = parse_lines(&ok64).unwrap();
        assert_eq!(evaluate(&lines, &[track(1.0, 1.0, 1.0, 5)]), u64::MAX);
    }

    /// A momentum line with `max_dp_over_p` fires on a measured momentum only: in a
    /// solenoid a track near the axis is fitted at any momentum with an error as large.
    #[test]
    fn a_momentum_line_can_require_the_momentum_measured() {
        let lines = parse_lines(
            "[[line]]\nname = \"high_p\"\nmin_tracks = 1\nmin_p_gev = 20.0\n\
             [[line]]\nname = \"high_p_measured\"\nmin_tracks = 1\nmin_p_gev = 20.0\n\
             max_dp_over_p = 0.2\n",
        )
        .unwrap();
        let with_error = |rel: f32| {
            let mut t = track(50.0, 1.0, 1.0, 8);
            t.cov[14] = (rel * t.state.qop).powi(2);
            t
        };
        assert_eq!(evaluate(&lines, &[with_error(0.1)]), 0b11);
        assert_eq!(evaluate(&lines, &[with_error(0.19)]), 0b11);
        assert_eq!(evaluate(&lines, &[with_error(0.21)]), 0b01);
        assert_eq!(evaluate(&lines, &[with_error(0.3)]), 0b01);
        assert_eq!(evaluate(&lines, &[with_error(1.0)]), 0b01);
        let mut nan = with_error(0.1);
        nan.cov[14] = f32::NAN;
        assert_eq!(evaluate(&lines, &[nan]), 0b01);
        let mut zero = with_error(0.1);
        zero.state.qop = 0.0;
        assert_eq!(evaluate(&lines[1..], &[zero]), 0);
        let bad = "[[line]]\nname = \"b\"\nmin_tracks = 1\nmax_dp_over_p = 0.0\n";
        assert!(matches!(
            parse_lines(bad),
            Err(LineError::Invalid {
                field: "max_dp_over_p",
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn random_text_never_panics_the_parser(s in "\\PC{0,200}") {
            let _ = parse_lines(&s);
        }

        #[test]
        fn random_bytes_never_panic_the_parser(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_lines(&String::from_utf8_lossy(&b));
        }
    }
}
