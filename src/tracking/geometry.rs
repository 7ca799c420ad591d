//! Detector geometry and magnetic field: planes perpendicular to z, ordered by z, each
//! with its size, resolution, material and efficiency; a uniform or grid field.
//!
//! A detector is described in TOML (`[[plane]]` tables and one `[field]` table, see
//! `fixtures/detector.toml`). Loading validates everything and refuses a description that
//! would make the simulation or the reconstruction meaningless, naming the file and the
//! offending plane or field key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use super::field::{FieldMap, FieldMapError};

/// One detector layer, perpendicular to the beam axis z.
#[derive(Debug, Clone, PartialEq)]
pub struct Plane {
    pub z_mm: f64,
    pub half_x_mm: f64,
    pub half_y_mm: f64,
    /// Hit resolution (one standard deviation).
    pub sigma_x_mm: f64,
    pub sigma_y_mm: f64,
    /// Material thickness in radiation lengths (multiple scattering).
    pub x0_fraction: f64,
    /// Probability that a crossing particle leaves a hit.
    pub efficiency: f64,
}

impl Plane {
    /// Whether `(x, y)` lies on the sensitive area (edges included).
    #[inline]
    pub fn contains(&self, x_mm: f64, y_mm: f64) -> bool {
        x_mm.abs() <= self.half_x_mm && y_mm.abs() <= self.half_y_mm
    }
}

/// Magnetic field in tesla as a function of position in millimetres.
#[derive(Debug, Clone)]
pub enum Field {
    Uniform {
        b_tesla: [f64; 3],
    },
    /// A map on a regular grid, trilinear; outside the grid, the field of the nearest point
    /// of the grid box (see [`FieldMap`]).
    Grid(FieldMap),
}

impl Field {
    /// Field at `pos_mm`, tesla.
    #[inline]
    pub fn at(&self, pos_mm: [f64; 3]) -> [f64; 3] {
        match self {
            Field::Uniform { b_tesla } => *b_tesla,
            Field::Grid(map) => map.at(pos_mm),
        }
    }

    /// [`Field::at`] at each of `pos_mm`, into `out` (of the same length), bit for bit
    /// (a map's lookups four at a time where the CPU can).
    pub fn at_many(&self, pos_mm: &[[f64; 3]], out: &mut [[f64; 3]]) {
        match self {
            Field::Uniform { b_tesla } => {
                assert_eq!(pos_mm.len(), out.len());
                out.fill(*b_tesla);
            }
            Field::Grid(map) => map.at_many(pos_mm, out),
        }
    }

    /// Single-precision lookup for hot paths (same interpolation, rounded).
    #[inline]
    pub fn at_f32(&self, pos_mm: [f32; 3]) -> [f32; 3] {
        match self {
            Field::Uniform { b_tesla } => b_tesla.map(|v| v as f32),
            Field::Grid(map) => map.at_f32(pos_mm),
        }
    }

    /// Whether the field is the same everywhere (a fitter may then use a closed form).
    pub fn is_uniform(&self) -> bool {
        matches!(self, Field::Uniform { .. })
    }
}

/// A detector: planes ordered by increasing z, and the field.
#[derive(Debug, Clone)]
pub struct Detector {
    pub planes: Vec<Plane>,
    pub field: Field,
}

/// Why a detector description was refused. Every variant names the file (or the name
/// given to [`Detector::from_toml_str`]).
#[derive(Debug, thiserror::Error)]
pub enum GeometryError {
    #[error("{origin}: cannot read detector description: {source}")]
    Io {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: {location}: {reason}")]
    Invalid {
        origin: String,
        location: String,
        reason: String,
    },
    #[error("{origin}: field file {}: {source}", path.display())]
    FieldFile {
        origin: String,
        path: PathBuf,
        #[source]
        source: FieldMapError,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDetector {
    #[serde(default)]
    plane: Vec<RawPlane>,
    field: RawField,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlane {
    z_mm: f64,
    half_x_mm: f64,
    half_y_mm: f64,
    sigma_x_mm: f64,
    sigma_y_mm: f64,
    x0_fraction: f64,
    efficiency: f64,
}

/// The largest `[field] refine` factor (the map's memory grows with its cube).
pub const MAX_REFINE: usize = 4;
/// Where `[field] refine` is not given: how far trilinear interpolation may miss the
/// field between nodes ([`FieldMap::interpolation_error`]), as a fraction of the map's
/// largest value, before the map is interpolated finer. The error falls with the square
/// of the step; a map whose lobes are several steps wide misses by a percent or more
/// (the drawn detectors' q/p pulls 1.12-1.14 on thin planes), one fine enough by under a
/// tenth of that.
pub const REFINE_TOLERANCE: f64 = 2e-3;
/// The most nodes an automatic refinement makes (about 50 MB in single precision).
pub const REFINE_MAX_NODES: usize = 1 << 22;
/// The most nodes a refinement asked for may make (about 200 MB in single precision).
pub const MAX_REFINED_NODES: usize = 1 << 24;
/// The largest automatic refinement.
pub const AUTO_REFINE_MAX: usize = 3;

/// The refinement of a map whose trilinear interpolation misses by up to `worst` tesla
/// (its largest value `b_max`): the least factor bringing `worst / factor^2` within
/// [`REFINE_TOLERANCE`] of `b_max`, at most [`AUTO_REFINE_MAX`] and within
/// [`REFINE_MAX_NODES`] nodes.
pub fn auto_refine(dims: [usize; 3], worst: f64, b_max: f64) -> usize {
    let nodes = |f: usize| dims.iter().map(|&n| (n - 1) * f + 1).product::<usize>();
    let mut f = 1;
    while f < AUTO_REFINE_MAX
        && worst > REFINE_TOLERANCE * b_max * (f * f) as f64
        && nodes(f + 1) <= REFINE_MAX_NODES
    {
        f += 1;
    }
    f
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawField {
    kind: String,
    b_tesla: Option<[f64; 3]>,
    file: Option<String>,
    origin_mm: Option<[f64; 3]>,
    step_mm: Option<[f64; 3]>,
    refine: Option<usize>,
}

impl Detector {
    /// Reads and validates a TOML description; a grid field file is found relative to
    /// the TOML file's directory.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, GeometryError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| GeometryError::Io {
            origin: origin.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_toml_str_in(&text, &origin, base)
    }

    /// Parses and validates a TOML description. `origin_name` names it in errors; a grid
    /// field file is found relative to `origin_name`'s directory (if it is a path).
    pub fn from_toml_str(s: &str, origin_name: &str) -> Result<Self, GeometryError> {
        let base = Path::new(origin_name).parent().unwrap_or(Path::new("."));
        Self::from_toml_str_in(s, origin_name, base)
    }

    /// As [`Detector::from_toml_str`], with relative field files resolved against `base_dir`.
    pub fn from_toml_str_in(
        s: &str,
        origin_name: &str,
        base_dir: &Path,
    ) -> Result<Self, GeometryError> {
        let origin = origin_name.to_string();
        let raw: RawDetector = toml::from_str(s).map_err(|e| GeometryError::Syntax {
            origin: origin.clone(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |location: String, reason: String| GeometryError::Invalid {
            origin: origin.clone(),
            location,
            reason,
        };
        if raw.plane.is_empty() {
            return Err(invalid(
                "[[plane]]".into(),
                "no planes: a detector needs at least one [[plane]]".into(),
            ));
        }
        let mut planes = Vec::with_capacity(raw.plane.len());
        for (i, p) in raw.plane.iter().enumerate() {
            let loc = |key: &str| format!("plane {i} {key}");
            let values = [
                ("z_mm", p.z_mm),
                ("half_x_mm", p.half_x_mm),
                ("half_y_mm", p.half_y_mm),
                ("sigma_x_mm", p.sigma_x_mm),
                ("sigma_y_mm", p.sigma_y_mm),
                ("x0_fraction", p.x0_fraction),
                ("efficiency", p.efficiency),
            ];
            for (key, v) in values {
                if !v.is_finite() {
                    return Err(invalid(loc(key), format!("{v} is not a finite number")));
                }
            }
            for (key, v) in [
                ("half_x_mm", p.half_x_mm),
                ("half_y_mm", p.half_y_mm),
                ("sigma_x_mm", p.sigma_x_mm),
                ("sigma_y_mm", p.sigma_y_mm),
            ] {
                if v <= 0.0 {
                    return Err(invalid(loc(key), format!("{v} must be positive")));
                }
            }
            if p.x0_fraction < 0.0 {
                return Err(invalid(
                    loc("x0_fraction"),
                    format!("{} must not be negative", p.x0_fraction),
                ));
            }
            if !(p.efficiency > 0.0 && p.efficiency <= 1.0) {
                return Err(invalid(
                    loc("efficiency"),
                    format!("{} must be in (0, 1]", p.efficiency),
                ));
            }
            if let Some(prev) = planes.last().map(|q: &Plane| q.z_mm) {
                if p.z_mm <= prev {
                    return Err(invalid(
                        loc("z_mm"),
                        format!(
                            "{} is not downstream of plane {} (z_mm {prev}): planes must be ordered by strictly increasing z",
                            p.z_mm,
                            i - 1
                        ),
                    ));
                }
            }
            planes.push(Plane {
                z_mm: p.z_mm,
                half_x_mm: p.half_x_mm,
                half_y_mm: p.half_y_mm,
                sigma_x_mm: p.sigma_x_mm,
                sigma_y_mm: p.sigma_y_mm,
                x0_fraction: p.x0_fraction,
                efficiency: p.efficiency,
            });
        }
        let f = &raw.field;
        let finite3 = |key: &str, v: [f64; 3]| -> Result<[f64; 3], GeometryError> {
            match v.iter().position(|x| !x.is_finite()) {
                Some(i) => Err(invalid(
                    format!("field {key}[{i}]"),
                    format!("{} is not a finite number", v[i]),
                )),
                None => Ok(v),
            }
        };
        let field = match f.kind.as_str() {
            "uniform" => {
                for (key, present) in [
                    ("file", f.file.is_some()),
                    ("origin_mm", f.origin_mm.is_some()),
                    ("step_mm", f.step_mm.is_some()),
                    ("refine", f.refine.is_some()),
                ] {
                    if present {
                        return Err(invalid(
                            format!("field {key}"),
                            "only used with kind = \"grid\"".into(),
                        ));
                    }
                }
                let b = f.b_tesla.ok_or_else(|| {
                    invalid(
                        "field b_tesla".into(),
                        "missing (kind = \"uniform\" needs b_tesla = [bx, by, bz])".into(),
                    )
                })?;
                Field::Uniform {
                    b_tesla: finite3("b_tesla", b)?,
                }
            }
            "grid" => {
                if f.b_tesla.is_some() {
                    return Err(invalid(
                        "field b_tesla".into(),
                        "only used with kind = \"uniform\"".into(),
                    ));
                }
                let file = f.file.as_ref().ok_or_else(|| {
                    invalid(
                        "field file".into(),
                        "missing (kind = \"grid\" needs file = \"map.npy\")".into(),
                    )
                })?;
                let origin_mm = finite3(
                    "origin_mm",
                    f.origin_mm.ok_or_else(|| {
                        invalid(
                            "field origin_mm".into(),
                            "missing for kind = \"grid\"".into(),
                        )
                    })?,
                )?;
                let step_mm = finite3(
                    "step_mm",
                    f.step_mm.ok_or_else(|| {
                        invalid("field step_mm".into(), "missing for kind = \"grid\"".into())
                    })?,
                )?;
                if let Some(i) = step_mm.iter().position(|&s| s <= 0.0) {
                    return Err(invalid(
                        format!("field step_mm[{i}]"),
                        format!("{} must be positive", step_mm[i]),
                    ));
                }
                let path = base_dir.join(file);
                let map = FieldMap::from_npy_file(&path, origin_mm, step_mm).map_err(|source| {
                    GeometryError::FieldFile {
                        origin: origin.clone(),
                        path: path.clone(),
                        source,
                    }
                })?;
                let (worst, rms) = map.interpolation_error();
                let b_max = map.max_abs_tesla();
                let refine = match f.refine {
                    Some(r) if (1..=MAX_REFINE).contains(&r) => r,
                    Some(r) => {
                        return Err(invalid(
                            "field refine".into(),
                            format!("{r} must be from 1 (the map as it is) to {MAX_REFINE}"),
                        ))
                    }
                    None => auto_refine(map.dims, worst, b_max),
                };
                let nodes: usize = map.dims.iter().map(|&n| (n - 1) * refine + 1).product();
                if nodes > MAX_REFINED_NODES {
                    return Err(invalid(
                        "field refine".into(),
                        format!(
                            "{refine} would make a map of {nodes} nodes, more than {MAX_REFINED_NODES}"
                        ),
                    ));
                }
                if refine > 1 || worst > REFINE_TOLERANCE * b_max {
                    tracing::info!(
                        "{}: between its nodes trilinear interpolation misses a smooth field by up to {:.4} T ({:.2} % of its largest value, {:.4} T rms); interpolated {}x finer ([field] refine)",
                        path.display(),
                        worst,
                        100.0 * worst / b_max.max(f64::MIN_POSITIVE),
                        rms,
                        refine
                    );
                }
                let map = map
                    .refined(refine)
                    .map_err(|source| GeometryError::FieldFile {
                        origin: origin.clone(),
                        path: path.clone(),
                        source,
                    })?;
                Field::Grid(map)
            }
            other => {
                return Err(invalid(
                    "field kind".into(),
                    format!("\"{other}\" is not a field kind: use \"uniform\" or \"grid\""),
                ));
            }
        };
        Ok(Detector { planes, field })
    }

    /// Index of the plane at `z_mm` (within 1 µm), if any.
    pub fn plane_at_z(&self, z_mm: f64) -> Option<usize> {
        self.planes
            .iter()
            .position(|p| (p.z_mm - z_mm).abs() < 1e-3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use npyz::WriterBuilder;

    const GOOD: &str = r#"
[[plane]]
z_mm = 100.0
half_x_mm = 50.0
half_y_mm = 40.0
sigma_x_mm = 0.01
sigma_y_mm = 0.012
x0_fraction = 0.004
efficiency = 0.99

[[plane]]
z_mm = 200.0
half_x_mm = 60.0
half_y_mm = 50.0
sigma_x_mm = 0.01
sigma_y_mm = 0.012
x0_fraction = 0.0
efficiency = 1.0

[field]
kind = "uniform"
b_tesla = [0.0, 1.0, 0.0]
"#;

    fn refuse(text: &str) -> String {
        match Detector::from_toml_str(text, "test.toml") {
            Ok(_) => panic!("accepted invalid geometry:\n{text}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with("test.toml"),
                    "error does not name the file: {msg}"
                );
                msg
            }
        }
    }

    #[test]
    fn valid_description_loads() {
        let d = Detector::from_toml_str(GOOD, "test.toml").unwrap();
        assert_eq!(d.planes.len(), 2);
        assert_eq!(d.planes[1].half_y_mm, 50.0);
        assert_eq!(d.field.at([1.0, 2.0, 3.0]), [0.0, 1.0, 0.0]);
        assert!(d.field.is_uniform());
        assert_eq!(d.plane_at_z(200.0), Some(1));
    }

    #[test]
    fn unordered_planes_are_refused() {
        let msg = refuse(&GOOD.replace("z_mm = 200.0", "z_mm = 50.0"));
        assert!(msg.contains("plane 1 z_mm"), "{msg}");
        let msg = refuse(&GOOD.replace("z_mm = 200.0", "z_mm = 100.0"));
        assert!(msg.contains("plane 1 z_mm"), "{msg}");
    }

    #[test]
    fn non_positive_sizes_and_sigmas_are_refused() {
        for (from, to, loc) in [
            ("half_x_mm = 60.0", "half_x_mm = 0.0", "plane 1 half_x_mm"),
            ("half_y_mm = 40.0", "half_y_mm = -1.0", "plane 0 half_y_mm"),
            (
                "sigma_x_mm = 0.01\nsigma_y_mm = 0.012\nx0_fraction = 0.0\n",
                "sigma_x_mm = 0.0\nsigma_y_mm = 0.012\nx0_fraction = 0.0\n",
                "plane 1 sigma_x_mm",
            ),
            (
                "sigma_y_mm = 0.012\nx0_fraction = 0.004",
                "sigma_y_mm = -0.012\nx0_fraction = 0.004",
                "plane 0 sigma_y_mm",
            ),
        ] {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "replacement {from} did not apply");
            let msg = refuse(&text);
            assert!(msg.contains(loc), "{msg} should name {loc}");
        }
    }

    #[test]
    fn efficiency_outside_unit_interval_is_refused() {
        for bad in ["0.0", "1.01", "-0.5"] {
            let msg = refuse(&GOOD.replace("efficiency = 1.0", &format!("efficiency = {bad}")));
            assert!(msg.contains("plane 1 efficiency"), "{msg}");
        }
    }

    #[test]
    fn negative_material_is_refused() {
        let msg = refuse(&GOOD.replace("x0_fraction = 0.004", "x0_fraction = -0.001"));
        assert!(msg.contains("plane 0 x0_fraction"), "{msg}");
    }

    #[test]
    fn non_finite_values_are_refused() {
        let msg = refuse(&GOOD.replace("z_mm = 200.0", "z_mm = nan"));
        assert!(msg.contains("plane 1 z_mm"), "{msg}");
        let msg = refuse(&GOOD.replace("half_x_mm = 50.0", "half_x_mm = inf"));
        assert!(msg.contains("plane 0 half_x_mm"), "{msg}");
        let msg = refuse(&GOOD.replace("b_tesla = [0.0, 1.0, 0.0]", "b_tesla = [0.0, nan, 0.0]"));
        assert!(msg.contains("field b_tesla[1]"), "{msg}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let msg =
            refuse(&GOOD.replace("efficiency = 0.99", "efficiency = 0.99\nthickness_mm = 0.3"));
        assert!(msg.contains("thickness_mm"), "{msg}");
        let msg = refuse(&GOOD.replace("kind = \"uniform\"", "kind = \"uniform\"\nscale = 2.0"));
        assert!(msg.contains("scale"), "{msg}");
        let msg = refuse(&format!("name = \"x\"\n{GOOD}"));
        assert!(msg.contains("name"), "{msg}");
        let msg = refuse(&GOOD.replace("kind = \"uniform\"", "kind = \"solenoid\""));
        assert!(msg.contains("field kind"), "{msg}");
    }

    #[test]
    fn missing_planes_or_field_are_refused() {
        let only_field = &GOOD[GOOD.find("[field]").unwrap()..];
        let msg = refuse(only_field);
        assert!(msg.contains("plane"), "{msg}");
        let no_field = &GOOD[..GOOD.find("[field]").unwrap()];
        let msg = refuse(no_field);
        assert!(msg.contains("field"), "{msg}");
    }

    fn write_npy(path: &Path, shape: &[u64], values: &[f32]) {
        let mut out = Vec::new();
        {
            let mut w = npyz::WriteOptions::<f32>::new()
                .default_dtype()
                .shape(shape)
                .writer(&mut out)
                .begin_nd()
                .unwrap();
            w.extend(values.iter().copied()).unwrap();
            w.finish().unwrap();
        }
        std::fs::write(path, out).unwrap();
    }

    fn grid_toml(file: &str) -> String {
        let planes = &GOOD[..GOOD.find("[field]").unwrap()];
        format!(
            "{planes}[field]\nkind = \"grid\"\nfile = \"{file}\"\norigin_mm = [-10.0, -20.0, 0.0]\nstep_mm = [10.0, 20.0, 50.0]\n"
        )
    }

    /// The positions of the nodes of [`grid_toml`]'s grid of `dims` nodes, in the map's
    /// (C) order.
    fn grid_nodes(dims: [usize; 3]) -> impl Iterator<Item = [f64; 3]> {
        (0..dims[0]).flat_map(move |ix| {
            (0..dims[1]).flat_map(move |iy| {
                (0..dims[2]).map(move |iz| {
                    [
                        -10.0 + 10.0 * ix as f64,
                        -20.0 + 20.0 * iy as f64,
                        50.0 * iz as f64,
                    ]
                })
            })
        })
    }

    /// A linear field sampled at the nodes: trilinear interpolation reproduces it exactly.
    fn linear_field(p: [f64; 3]) -> [f64; 3] {
        [
            0.5 + 0.01 * p[0] - 0.02 * p[1] + 0.001 * p[2],
            1.0 - 0.004 * p[0] + 0.003 * p[2],
            -0.25 + 0.002 * p[1],
        ]
    }

    #[test]
    fn grid_field_is_trilinear_and_exact_on_a_linear_field() {
        let dir = tempfile::tempdir().unwrap();
        let dims = [3u64, 4, 5];
        let values: Vec<f32> = grid_nodes(dims.map(|n| n as usize))
            .flat_map(|p| linear_field(p).map(|v| v as f32))
            .collect();
        write_npy(
            &dir.path().join("map.npy"),
            &[dims[0], dims[1], dims[2], 3],
            &values,
        );
        let toml_path = dir.path().join("det.toml");
        std::fs::write(&toml_path, grid_toml("map.npy")).unwrap();
        let det = Detector::from_toml_file(&toml_path).unwrap();
        assert!(!det.field.is_uniform());
        for p in [
            [-3.3, 7.1, 12.5],
            [0.0, 0.0, 0.0],
            [9.99, 39.0, 199.0],
            [-10.0, -20.0, 0.0],
            [4.0, -13.0, 111.0],
        ] {
            let got = det.field.at(p);
            let want = linear_field(p);
            for k in 0..3 {
                // Node values are f32: the interpolation is exact up to their rounding.
                assert!(
                    (got[k] - want[k]).abs() < 1e-6,
                    "at {p:?} component {k}: {} vs {}",
                    got[k],
                    want[k]
                );
            }
        }
        // Outside the grid: the field of the nearest point of the grid box.
        let outside = det.field.at([100.0, 5.0, -40.0]);
        let edge = linear_field([10.0, 5.0, 0.0]);
        for k in 0..3 {
            assert!((outside[k] - edge[k]).abs() < 1e-6);
        }
        let f = det.field.at_f32([4.0, -13.0, 111.0]);
        assert!((f[0] as f64 - linear_field([4.0, -13.0, 111.0])[0]).abs() < 1e-5);
    }

    /// `[field] refine`: a factor from 1 to [`MAX_REFINE`], or, left out, the factor the
    /// map's own interpolation error asks for ([`auto_refine`]): a lobe mapped coarsely
    /// is refined, a linear field is not.
    #[test]
    fn grid_field_is_refined_as_asked_or_as_its_interpolation_error_asks() {
        let dir = tempfile::tempdir().unwrap();
        let dims = [3usize, 4, 9];
        let lobe: Vec<f32> = grid_nodes(dims)
            .flat_map(|p| {
                let g = (-(p[2] - 200.0).powi(2) / (2.0 * 100.0 * 100.0)).exp();
                [0.0, g as f32, 0.0]
            })
            .collect();
        let linear: Vec<f32> = grid_nodes(dims)
            .flat_map(|p| linear_field(p).map(|v| v as f32))
            .collect();
        let shape = [dims[0] as u64, dims[1] as u64, dims[2] as u64, 3];
        write_npy(&dir.path().join("lobe.npy"), &shape, &lobe);
        write_npy(&dir.path().join("linear.npy"), &shape, &linear);
        let load = |file: &str, refine: Option<usize>| {
            let path = dir.path().join("det.toml");
            let extra = refine.map_or(String::new(), |r| format!("refine = {r}\n"));
            std::fs::write(&path, grid_toml(file) + &extra).unwrap();
            Detector::from_toml_file(&path).map(|d| match d.field {
                Field::Grid(m) => m,
                _ => panic!("a grid"),
            })
        };
        let refined = |f: usize| dims.map(|n| (n - 1) * f + 1);
        assert_eq!(load("lobe.npy", Some(1)).unwrap().dims, dims);
        assert_eq!(load("lobe.npy", Some(2)).unwrap().dims, refined(2));
        let map = load("lobe.npy", None).unwrap();
        assert_eq!(map.dims, refined(AUTO_REFINE_MAX));
        assert_eq!(map.step_mm, [10.0, 20.0, 50.0].map(|s| s / 3.0));
        assert_eq!(load("linear.npy", None).unwrap().dims, dims);
        for bad in [0, MAX_REFINE + 1] {
            let msg = load("lobe.npy", Some(bad)).unwrap_err().to_string();
            assert!(msg.contains("refine") && msg.contains("det.toml"), "{msg}");
        }
        // A factor that would make too large a map is refused (4 on 400 x 400 x 3 nodes:
        // 23 M nodes).
        let big = dir.path().join("big.npy");
        write_npy(&big, &[400, 400, 3, 3], &vec![0.0; 400 * 400 * 3 * 3]);
        let result = load("big.npy", Some(4));
        assert!(result.is_err(), "a map of 23 M nodes made");
        let msg = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("refine") && msg.contains("nodes"), "{msg}");
        assert!(load("big.npy", Some(1)).is_ok());
        // Within the node budget only.
        assert_eq!(auto_refine([400, 400, 400], 1.0, 1.0), 1);
        assert_eq!(auto_refine([10, 10, 10], 0.0, 1.0), 1);
        assert_eq!(
            auto_refine([10, 10, 10], 1.5 * REFINE_TOLERANCE, 1.0),
            1 + 1
        );
    }

    #[test]
    fn grid_field_file_of_wrong_shape_or_dtype_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let toml_path = dir.path().join("det.toml");
        std::fs::write(&toml_path, grid_toml("map.npy")).unwrap();
        let npy = dir.path().join("map.npy");

        write_npy(&npy, &[2, 2, 2, 2], &[0.0; 16]);
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("det.toml") && msg.contains("map.npy") && msg.contains("shape"),
            "{msg}"
        );

        write_npy(&npy, &[1, 2, 2, 3], &[0.0; 12]);
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("at least 2 nodes"), "{msg}");

        let mut out = Vec::new();
        {
            // Integers: float32 and float64 (NumPy's default) are read, nothing else.
            let mut w = npyz::WriteOptions::<i32>::new()
                .default_dtype()
                .shape(&[2, 2, 2, 3])
                .writer(&mut out)
                .begin_nd()
                .unwrap();
            w.extend([0i32; 24]).unwrap();
            w.finish().unwrap();
        }
        std::fs::write(&npy, out).unwrap();
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("dtype"), "{msg}");

        let mut vals = vec![0.0f32; 24];
        vals[7] = f32::NAN;
        write_npy(&npy, &[2, 2, 2, 3], &vals);
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("non-finite"), "{msg}");

        std::fs::write(&npy, b"not an npy file").unwrap();
        assert!(Detector::from_toml_file(&toml_path).is_err());
        std::fs::remove_file(&npy).unwrap();
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("map.npy"), "{msg}");

        let bad_step = grid_toml("map.npy").replace(
            "step_mm = [10.0, 20.0, 50.0]",
            "step_mm = [10.0, 0.0, 50.0]",
        );
        std::fs::write(&toml_path, bad_step).unwrap();
        let msg = Detector::from_toml_file(&toml_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("field step_mm[1]"), "{msg}");
    }

    #[test]
    fn committed_fixtures_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for name in [
            "fixtures/detector.toml",
            "fixtures/telescope.toml",
            "fixtures/tracking/dipole/detector_dipole.toml",
        ] {
            let d = Detector::from_toml_file(root.join(name)).unwrap_or_else(|e| panic!("{e}"));
            assert!(d.planes.len() >= 6, "{name}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = Detector::from_toml_str(&text, "fuzz.toml");
        }
        #[test]
        fn npy_field_parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = FieldMap::from_npy_bytes(&bytes, [0.0; 3], [1.0; 3]);
        }
    }
}
