//! The files an EEG inverse operator is built from, read and checked: the lead field
//! (NPY `[n_channels, 3 * n_sources]`, free orientation, MNE's units V/(A m)), the source
//! positions (NPY `[n_sources, 3]`, metres), the noise covariance (NPY
//! `[n_channels, n_channels]`, V^2) and the channel names (text, one per line, in the lead
//! field's row order). Every refusal names the file and says what is wrong, so a user can
//! fix the export that produced it. Also matches the channel labels of a recording (EDF
//! labels, say) to the configured channels by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use faer::{MatRef, Side};

/// Relative tolerance for covariance symmetry: `|C_ij - C_ji| <= tol * max|C|`.
pub const COVARIANCE_SYMMETRY_TOL: f64 = 1e-8;
/// Relative tolerance for positive semi-definiteness: the smallest eigenvalue must be
/// `>= -tol * largest eigenvalue` (allows rounding in float32 files).
pub const COVARIANCE_PSD_TOL: f64 = 1e-6;

/// Why an input file was refused.
#[derive(Debug, thiserror::Error)]
pub enum EegInputError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a usable NPY array: {reason}")]
    Npy { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("inputs do not fit together: {0}")]
    Mismatch(String),
    #[error(
        "{} configured channel(s) missing from the data: {missing:?} (the data has: {available:?})",
        missing.len()
    )]
    MissingChannels {
        missing: Vec<String>,
        available: Vec<String>,
    },
    #[error(
        "data channel label {label:?} appears more than once (positions {first} and {second})"
    )]
    DuplicateDataChannel {
        label: String,
        first: usize,
        second: usize,
    },
}

fn invalid(path: &Path, reason: impl Into<String>) -> EegInputError {
    EegInputError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

pub use crate::npy::NpyArray;

/// Parse an NPY file's bytes ([`crate::npy::parse`]: float32 or float64, any byte order, C
/// or Fortran order); `path` only labels errors.
pub fn parse_npy(bytes: &[u8], path: &Path) -> Result<NpyArray, EegInputError> {
    crate::npy::parse(bytes).map_err(|reason| EegInputError::Npy {
        path: path.to_path_buf(),
        reason,
    })
}

/// Read and parse an NPY file.
pub fn read_npy(path: &Path) -> Result<NpyArray, EegInputError> {
    let bytes = std::fs::read(path).map_err(|source| EegInputError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_npy(&bytes, path)
}

/// Read a 2-D NPY array of finite values with the expected number of columns (and rows,
/// when given). Names the first non-finite element by row and column.
pub fn read_npy_matrix(
    path: &Path,
    rows: Option<usize>,
    cols: Option<usize>,
    what: &str,
) -> Result<(usize, usize, Vec<f64>), EegInputError> {
    let a = read_npy(path)?;
    if a.shape.len() != 2 {
        return Err(invalid(
            path,
            format!("{what} must be 2-D, found shape {:?}", a.shape),
        ));
    }
    let (r, c) = (a.shape[0], a.shape[1]);
    if rows.is_some_and(|n| n != r) || cols.is_some_and(|n| n != c) || r == 0 || c == 0 {
        let want = |d: Option<usize>| d.map_or("any".to_string(), |n| n.to_string());
        return Err(invalid(
            path,
            format!(
                "{what} has shape [{r}, {c}], expected [{}, {}] (non-empty)",
                want(rows),
                want(cols)
            ),
        ));
    }
    check_finite(path, &a.data, c)?;
    Ok((r, c, a.data))
}

fn check_finite(path: &Path, data: &[f64], cols: usize) -> Result<(), EegInputError> {
    if let Some(pos) = data.iter().position(|v| !v.is_finite()) {
        return Err(invalid(
            path,
            format!(
                "non-finite value {} at row {}, column {}",
                data[pos],
                pos / cols,
                pos % cols
            ),
        ));
    }
    Ok(())
}

/// Parse channel names: one per line, surrounding whitespace trimmed, a trailing empty
/// line allowed; refuses empty names and duplicates.
pub fn parse_channel_names(text: &str, path: &Path) -> Result<Vec<String>, EegInputError> {
    let mut lines: Vec<&str> = text.lines().collect();
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    if lines.is_empty() {
        return Err(invalid(path, "no channel names"));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut names = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let name = line.trim();
        if name.is_empty() {
            return Err(invalid(
                path,
                format!("line {} is an empty channel name", i + 1),
            ));
        }
        if let Some(first) = seen.insert(name, i) {
            return Err(invalid(
                path,
                format!(
                    "channel name {name:?} appears twice (lines {} and {})",
                    first + 1,
                    i + 1
                ),
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// Where the four input files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EegInputPaths {
    pub lead_field: PathBuf,
    pub source_positions: PathBuf,
    pub noise_covariance: PathBuf,
    pub channel_names: PathBuf,
}

/// Checked inputs for an inverse operator. All matrices row-major, f64.
#[derive(Debug, Clone)]
pub struct EegInputs {
    pub channel_names: Vec<String>,
    pub n_channels: usize,
    pub n_sources: usize,
    /// `[n_channels, 3 * n_sources]`, V/(A m); columns `3s..3s+3` are x, y, z of source `s`.
    pub lead_field: Vec<f64>,
    /// `[n_sources, 3]`, metres.
    pub source_positions_m: Vec<f64>,
    /// `[n_channels, n_channels]`, V^2.
    pub noise_covariance: Vec<f64>,
    /// Hash of everything above (FNV-1a 64 over names and values), to tell whether a cached
    /// operator was built from these inputs.
    pub content_hash: u64,
}

impl EegInputs {
    /// Read and check the four files.
    pub fn load(paths: &EegInputPaths) -> Result<Self, EegInputError> {
        let text =
            std::fs::read_to_string(&paths.channel_names).map_err(|source| EegInputError::Io {
                path: paths.channel_names.clone(),
                source,
            })?;
        let channel_names = parse_channel_names(&text, &paths.channel_names)?;
        let n_channels = channel_names.len();
        let (_, lf_cols, lead_field) = read_npy_matrix(
            &paths.lead_field,
            Some(n_channels),
            None,
            "lead field [n_channels, 3 * n_sources]",
        )?;
        if lf_cols % 3 != 0 {
            return Err(invalid(
                &paths.lead_field,
                format!("lead field has {lf_cols} columns, not a multiple of 3 (free orientation: x, y, z per source)"),
            ));
        }
        let n_sources = lf_cols / 3;
        let (_, _, source_positions_m) = read_npy_matrix(
            &paths.source_positions,
            Some(n_sources),
            Some(3),
            "source positions [n_sources, 3]",
        )?;
        let (_, _, noise_covariance) = read_npy_matrix(
            &paths.noise_covariance,
            Some(n_channels),
            Some(n_channels),
            "noise covariance [n_channels, n_channels]",
        )?;
        Self::from_parts(
            channel_names,
            lead_field,
            source_positions_m,
            noise_covariance,
            paths,
        )
    }

    /// Check inputs already in memory (`paths` labels errors).
    pub fn from_parts(
        channel_names: Vec<String>,
        lead_field: Vec<f64>,
        source_positions_m: Vec<f64>,
        noise_covariance: Vec<f64>,
        paths: &EegInputPaths,
    ) -> Result<Self, EegInputError> {
        let n_channels = channel_names.len();
        if n_channels < 2 {
            return Err(invalid(
                &paths.channel_names,
                "need at least 2 channels for an average reference",
            ));
        }
        if lead_field.is_empty() || lead_field.len() % (3 * n_channels) != 0 {
            return Err(EegInputError::Mismatch(format!(
                "lead field has {} values, not n_channels ({n_channels}) x 3 x n_sources",
                lead_field.len()
            )));
        }
        let n_sources = lead_field.len() / (3 * n_channels);
        if source_positions_m.len() != 3 * n_sources {
            return Err(EegInputError::Mismatch(format!(
                "{} source positions for {n_sources} sources in the lead field",
                source_positions_m.len() / 3
            )));
        }
        if noise_covariance.len() != n_channels * n_channels {
            return Err(EegInputError::Mismatch(format!(
                "noise covariance has {} values, expected {n_channels} x {n_channels}",
                noise_covariance.len()
            )));
        }
        check_finite(&paths.lead_field, &lead_field, 3 * n_sources)?;
        check_finite(&paths.source_positions, &source_positions_m, 3)?;
        check_finite(&paths.noise_covariance, &noise_covariance, n_channels)?;
        for s in 0..n_sources {
            let zero = (0..n_channels).all(|c| {
                lead_field[c * 3 * n_sources + 3 * s..][..3]
                    .iter()
                    .all(|&v| v == 0.0)
            });
            if zero {
                return Err(invalid(
                    &paths.lead_field,
                    format!("source {s} has an all-zero lead field (no channel sees it); remove it from the source space"),
                ));
            }
        }
        check_covariance(&noise_covariance, n_channels, &paths.noise_covariance)?;
        let mut hash = Fnv64::new();
        for name in &channel_names {
            hash.write(name.as_bytes());
            hash.write(&[0]);
        }
        for v in lead_field
            .iter()
            .chain(&source_positions_m)
            .chain(&noise_covariance)
        {
            hash.write(&v.to_le_bytes());
        }
        Ok(Self {
            channel_names,
            n_channels,
            n_sources,
            lead_field,
            source_positions_m,
            noise_covariance,
            content_hash: hash.finish(),
        })
    }

    /// For each configured channel (in order), its index among `data_labels` (e.g. the
    /// labels of an EDF file), matched by name after trimming whitespace. Extra data
    /// channels are ignored; missing ones are all listed in the error.
    pub fn match_channels<S: AsRef<str>>(
        &self,
        data_labels: &[S],
    ) -> Result<Vec<usize>, EegInputError> {
        match_channels(&self.channel_names, data_labels)
    }
}

/// See [`EegInputs::match_channels`].
pub fn match_channels<S: AsRef<str>>(
    configured: &[String],
    data_labels: &[S],
) -> Result<Vec<usize>, EegInputError> {
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, label) in data_labels.iter().enumerate() {
        let label = label.as_ref().trim();
        if let Some(first) = by_name.insert(label, i) {
            if configured.iter().any(|c| c == label) {
                return Err(EegInputError::DuplicateDataChannel {
                    label: label.to_string(),
                    first,
                    second: i,
                });
            }
        }
    }
    let mut missing = Vec::new();
    let mut picks = Vec::with_capacity(configured.len());
    for name in configured {
        match by_name.get(name.as_str()) {
            Some(&i) => picks.push(i),
            None => missing.push(name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(EegInputError::MissingChannels {
            missing,
            available: data_labels
                .iter()
                .map(|s| s.as_ref().trim().to_string())
                .collect(),
        });
    }
    Ok(picks)
}

/// Symmetric (relative tolerance) and positive semi-definite (eigenvalues via faer).
fn check_covariance(cov: &[f64], n: usize, path: &Path) -> Result<(), EegInputError> {
    let max_abs = cov.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if max_abs == 0.0 {
        return Err(invalid(path, "noise covariance is all zeros"));
    }
    for i in 0..n {
        for j in 0..i {
            let (a, b) = (cov[i * n + j], cov[j * n + i]);
            if (a - b).abs() > COVARIANCE_SYMMETRY_TOL * max_abs {
                return Err(invalid(
                    path,
                    format!("noise covariance is not symmetric: [{i}, {j}] = {a:e} but [{j}, {i}] = {b:e}"),
                ));
            }
        }
    }
    let m = MatRef::from_row_major_slice(cov, n, n);
    let eig = m
        .self_adjoint_eigenvalues(Side::Lower)
        .map_err(|e| invalid(path, format!("eigenvalues did not converge: {e:?}")))?;
    let (min, max) = (eig[0], eig[n - 1]);
    if max <= 0.0 || min < -COVARIANCE_PSD_TOL * max {
        return Err(invalid(
            path,
            format!("noise covariance is not positive semi-definite: eigenvalues from {min:e} to {max:e}"),
        ));
    }
    Ok(())
}

/// FNV-1a, 64 bit: a stable content hash (not for security).
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use npyz::WriterBuilder;
    use proptest::prelude::*;

    /// Inputs found by the `npy` fuzz target that made the header parser run for minutes
    /// (brackets nested dozens deep); they are refused before parsing now.
    #[test]
    fn deeply_nested_headers_are_refused_at_once() {
        let found: [&[u8]; 2] = [
            b"\x93NUMPY\x01\x00@\x00{[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['descr\x0d\x0d\
              \x0d\x0d\x0d\x22\x22\x22\x0d\x0d+\x0d\x00\x00\x07\x00\x00\x00\x00\x00\x00   * \
              \x1a\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00    \x00\x00\
              ,\x00\x00\x00\x00\x00\x01  \x0a\x98\x8fn1110\x01  \x0a\x98\x8fn\x01\x00\x00d1\
              \x98",
            b"\x93NUMPY\x01\x00v\x00\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\
              \x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\
              \x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09(\
              \x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09{\x09\x09\x09{{{\
              {{{{{{\x09\x09\x09\x09\x09\x09\x09{'descr':\x09\x09\x09\x09\x09\x09\x09\x09\x09\
              \x09\x09\x09\x09{'descr':\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\
              \x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09\x09(\x09\x09\x09\x09\x09\x09 Fa\
              lse,1'''1111111111112ran_ordG\x00\x00\x00 Fal<f8\xd9\xd3\xff\x9cr'e\x04\x00\x00\
              \x00\x00\x00\x00\x00? ('2: ,6), ?",
        ];
        for bytes in found {
            let started = std::time::Instant::now();
            let err = parse_npy(bytes, &p()).unwrap_err();
            assert!(err.to_string().contains("nests brackets"), "{err}");
            assert!(started.elapsed() < std::time::Duration::from_secs(5));
        }
    }

    fn npy_bytes(shape: &[u64], data: &[f64]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut w = npyz::WriteOptions::<f64>::new()
                .default_dtype()
                .shape(shape)
                .writer(&mut out)
                .begin_nd()
                .expect("header");
            w.extend(data.iter().copied()).expect("data");
            w.finish().expect("finish");
        }
        out
    }

    fn p() -> PathBuf {
        PathBuf::from("test.npy")
    }

    #[test]
    fn npy_round_trip_f64() {
        let bytes = npy_bytes(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let a = parse_npy(&bytes, &p()).expect("parse");
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(!a.was_f32);
    }

    #[test]
    fn npy_truncated_and_trailing_refused() {
        let bytes = npy_bytes(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let err = parse_npy(&bytes[..bytes.len() - 3], &p()).unwrap_err();
        assert!(err.to_string().contains("test.npy"), "{err}");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(parse_npy(&longer, &p()).is_err());
    }

    #[test]
    fn channel_names_refuse_duplicates_and_empties() {
        let path = PathBuf::from("ch.txt");
        assert_eq!(
            parse_channel_names("Fz\nCz\n", &path).expect("ok"),
            vec!["Fz", "Cz"]
        );
        let e = parse_channel_names("Fz\nCz\nFz\n", &path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ch.txt") && e.contains("Fz") && e.contains("lines 1 and 3"),
            "{e}"
        );
        let e = parse_channel_names("Fz\n\nCz\n", &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        assert!(parse_channel_names("\n", &path).is_err());
    }

    fn paths() -> EegInputPaths {
        EegInputPaths {
            lead_field: "lf.npy".into(),
            source_positions: "pos.npy".into(),
            noise_covariance: "cov.npy".into(),
            channel_names: "ch.txt".into(),
        }
    }

    fn small(cov: Vec<f64>) -> Result<EegInputs, EegInputError> {
        let names = vec!["A".to_string(), "B".to_string(), "C".to_string()];
        let lf: Vec<f64> = (0..9).map(|i| (i as f64 + 1.0).sin()).collect();
        EegInputs::from_parts(names, lf, vec![0.0, 0.0, 0.05], cov, &paths())
    }

    #[test]
    fn covariance_checks() {
        let good = vec![2.0, 0.5, 0.0, 0.5, 2.0, 0.1, 0.0, 0.1, 1.0];
        assert!(small(good).is_ok());
        let asym = vec![2.0, 0.5, 0.0, 0.4, 2.0, 0.1, 0.0, 0.1, 1.0];
        let e = small(asym).unwrap_err().to_string();
        assert!(e.contains("cov.npy") && e.contains("not symmetric"), "{e}");
        let indefinite = vec![1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        let e = small(indefinite).unwrap_err().to_string();
        assert!(e.contains("positive semi-definite"), "{e}");
        let mut nan = vec![2.0, 0.5, 0.0, 0.5, 2.0, 0.1, 0.0, 0.1, 1.0];
        nan[5] = f64::NAN;
        let e = small(nan).unwrap_err().to_string();
        assert!(e.contains("row 1, column 2"), "{e}");
    }

    #[test]
    fn channel_matching_lists_missing() {
        let configured = vec!["Fz".to_string(), "Cz".to_string(), "Pz".to_string()];
        let picks = match_channels(&configured, &["Pz ", "Status", "Fz", "Cz"]).expect("ok");
        assert_eq!(picks, vec![2, 3, 0]);
        let e = match_channels(&configured, &["Fz", "Oz"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"Cz\"") && e.contains("\"Pz\"") && e.contains("2 configured"),
            "{e}"
        );
        assert!(match_channels(&configured, &["Fz", "Cz", "Pz", "Cz"]).is_err());
    }

    proptest! {
        #[test]
        fn npy_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_npy(&bytes, &p());
        }

        #[test]
        fn npy_parser_survives_mutated_headers(
            idx in 0usize..200, byte in any::<u8>(), cut in 0usize..200
        ) {
            let mut bytes = npy_bytes(&[3, 4], &[0.5; 12]);
            let i = idx % bytes.len();
            bytes[i] = byte;
            bytes.truncate(bytes.len() - cut.min(bytes.len()));
            let _ = parse_npy(&bytes, &p());
        }
    }
}
