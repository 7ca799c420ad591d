//! The inverse operator reduced to what each block needs: one matrix from channel data
//! (volts, as recorded; re-referencing projection and whitening folded in) to the three
//! orientation components of every source, and a per-source factor applied after the norm
//! over orientations (noise normalisation for dSPM and sLORETA, 1 otherwise).
//! This is the hot path on the CPU and the layout the GPU uploads.
//!
//! Applying: the product `K X` is done in tiles of `SOURCE_TILE` sources by `TIME_TILE`
//! samples with faer's matrix product into a stack buffer, then the norm over the three
//! orientations and the scale, so a call allocates nothing and the tile stays in cache.
//! Also a cache file so start-up need not rebuild the operator (see [`KernelCacheKey`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use super::inputs::EegInputs;
use super::inverse::{InverseError, Method};

/// Sources per tile of the product (3 rows each).
const SOURCE_TILE: usize = 64;
/// Samples per tile of the product.
const TIME_TILE: usize = 32;

/// An applied inverse kernel. `kernel` is row-major `[3 * n_sources, n_channels]`: rows
/// `3s, 3s+1, 3s+2` are the x, y, z components of source `s`.
#[derive(Debug, Clone, PartialEq)]
pub struct InverseKernel {
    pub n_channels: usize,
    pub n_sources: usize,
    pub kernel: Vec<f64>,
    /// Multiplies the orientation norm of each source (length `n_sources`).
    pub source_scale: Vec<f64>,
}

/// The same kernel in float32, for the float32 data path.
#[derive(Debug, Clone, PartialEq)]
pub struct InverseKernelF32 {
    pub n_channels: usize,
    pub n_sources: usize,
    pub kernel: Vec<f32>,
    pub source_scale: Vec<f32>,
}

/// A block whose slices do not fit the kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("EEG block does not fit the kernel: {what} has {got} values, expected {expected}")]
pub struct BlockShapeError {
    pub what: &'static str,
    pub got: usize,
    pub expected: usize,
}

fn check_block(
    n_channels: usize,
    n_sources: usize,
    data_len: usize,
    n_times: usize,
    out_len: usize,
) -> Result<(), BlockShapeError> {
    if data_len != n_channels * n_times {
        return Err(BlockShapeError {
            what: "data [n_channels, n_times]",
            got: data_len,
            expected: n_channels * n_times,
        });
    }
    if out_len != n_sources * n_times {
        return Err(BlockShapeError {
            what: "out [n_sources, n_times]",
            got: out_len,
            expected: n_sources * n_times,
        });
    }
    Ok(())
}

macro_rules! apply_tiled {
    ($t:ty, $kernel:expr, $scale:expr, $n_channels:expr, $n_sources:expr, $data:expr, $n_times:expr, $out:expr) => {{
        let c = $n_channels;
        let n_times = $n_times;
        let mut tile = [0.0 as $t; 3 * SOURCE_TILE * TIME_TILE];
        let mut t0 = 0;
        while t0 < n_times {
            let tt = TIME_TILE.min(n_times - t0);
            // data[:, t0..t0+tt], channel-major with row stride n_times.
            let x = MatRef::from_row_major_slice_with_stride(&$data[t0..], c, tt, n_times);
            let mut s0 = 0;
            while s0 < $n_sources {
                let ns = SOURCE_TILE.min($n_sources - s0);
                let rows = 3 * ns;
                let k = MatRef::from_row_major_slice(
                    &$kernel[3 * s0 * c..(3 * s0 + rows) * c],
                    rows,
                    c,
                );
                let y = MatMut::from_column_major_slice_mut(&mut tile[..rows * tt], rows, tt);
                matmul(y, Accum::Replace, k, x, 1.0 as $t, Par::Seq);
                for j in 0..tt {
                    let col = &tile[j * rows..(j + 1) * rows];
                    for s in 0..ns {
                        let (a, b, d) = (col[3 * s], col[3 * s + 1], col[3 * s + 2]);
                        $out[(s0 + s) * n_times + t0 + j] =
                            $scale[s0 + s] * (a * a + b * b + d * d).sqrt();
                    }
                }
                s0 += ns;
            }
            t0 += tt;
        }
    }};
}

impl InverseKernel {
    /// Source amplitudes for a block: `data` is channel-major `[n_channels, n_times]`,
    /// `out` is source-major `[n_sources, n_times]`: `out[s, t] = scale[s] * |K_s x_t|`.
    /// Allocates nothing.
    ///
    /// # Panics
    /// If the slice lengths do not fit (sizes are fixed at start-up); see
    /// [`Self::try_apply_f64`] for a checked call.
    pub fn apply_f64(&self, data: &[f64], n_times: usize, out: &mut [f64]) {
        if let Err(e) = self.try_apply_f64(data, n_times, out) {
            panic!("{e}");
        }
    }

    /// [`Self::apply_f64`], with a shape mismatch returned as an error.
    pub fn try_apply_f64(
        &self,
        data: &[f64],
        n_times: usize,
        out: &mut [f64],
    ) -> Result<(), BlockShapeError> {
        check_block(
            self.n_channels,
            self.n_sources,
            data.len(),
            n_times,
            out.len(),
        )?;
        if n_times == 0 {
            return Ok(());
        }
        apply_tiled!(
            f64,
            self.kernel,
            self.source_scale,
            self.n_channels,
            self.n_sources,
            data,
            n_times,
            out
        );
        Ok(())
    }

    /// Convert to float32 (kernel and scale rounded once).
    pub fn to_f32(&self) -> InverseKernelF32 {
        InverseKernelF32 {
            n_channels: self.n_channels,
            n_sources: self.n_sources,
            kernel: self.kernel.iter().map(|&v| v as f32).collect(),
            source_scale: self.source_scale.iter().map(|&v| v as f32).collect(),
        }
    }

    /// Rows of the kernel: three per source.
    pub fn n_rows(&self) -> usize {
        3 * self.n_sources
    }
}

impl InverseKernelF32 {
    /// As [`InverseKernel::apply_f64`], in float32. Allocates nothing.
    ///
    /// # Panics
    /// If the slice lengths do not fit; see [`Self::try_apply_f32`].
    pub fn apply_f32(&self, data: &[f32], n_times: usize, out: &mut [f32]) {
        if let Err(e) = self.try_apply_f32(data, n_times, out) {
            panic!("{e}");
        }
    }

    /// [`Self::apply_f32`], with a shape mismatch returned as an error.
    pub fn try_apply_f32(
        &self,
        data: &[f32],
        n_times: usize,
        out: &mut [f32],
    ) -> Result<(), BlockShapeError> {
        check_block(
            self.n_channels,
            self.n_sources,
            data.len(),
            n_times,
            out.len(),
        )?;
        if n_times == 0 {
            return Ok(());
        }
        apply_tiled!(
            f32,
            self.kernel,
            self.source_scale,
            self.n_channels,
            self.n_sources,
            data,
            n_times,
            out
        );
        Ok(())
    }
}

/// What a cached kernel was built from; a cache with another key is stale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelCacheKey {
    /// [`EegInputs::content_hash`] of the inputs.
    pub inputs_hash: u64,
    pub method: Method,
    pub lambda2: f64,
}

impl KernelCacheKey {
    pub fn new(inputs: &EegInputs, method: Method, lambda2: f64) -> Self {
        Self {
            inputs_hash: inputs.content_hash,
            method,
            lambda2,
        }
    }
}

/// Why a cache file was not used.
#[derive(Debug, thiserror::Error)]
pub enum KernelCacheError {
    #[error("{path}: cannot access kernel cache: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid kernel cache: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: kernel cache is stale: {reason}")]
    Stale { path: PathBuf, reason: String },
    #[error(transparent)]
    Build(#[from] InverseError),
}

/// Whether [`InverseKernel::load_or_build`] used the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    Loaded,
    /// Built; `reason` says why the cache was not used.
    Built {
        reason: String,
    },
}

const CACHE_MAGIC: &[u8; 8] = b"TRIGDINV";
const CACHE_VERSION: u32 = 1;
/// magic, version, method, 3 pad, lambda2, hash, n_channels, n_sources.
const CACHE_HEADER_BYTES: usize = 8 + 4 + 1 + 3 + 8 + 8 + 8 + 8;

impl InverseKernel {
    /// Write the kernel with its key: little-endian binary, header then kernel then scale
    /// then a CRC-32C of all before. Written to a temporary file and renamed, so a reader
    /// never sees half a file.
    pub fn save(&self, path: &Path, key: &KernelCacheKey) -> Result<(), KernelCacheError> {
        let io = |source| KernelCacheError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut buf =
            Vec::with_capacity(CACHE_HEADER_BYTES + 8 * (self.kernel.len() + self.n_sources) + 4);
        buf.extend_from_slice(CACHE_MAGIC);
        buf.extend_from_slice(&CACHE_VERSION.to_le_bytes());
        buf.push(key.method.code());
        buf.extend_from_slice(&[0, 0, 0]);
        buf.extend_from_slice(&key.lambda2.to_le_bytes());
        buf.extend_from_slice(&key.inputs_hash.to_le_bytes());
        buf.extend_from_slice(&(self.n_channels as u64).to_le_bytes());
        buf.extend_from_slice(&(self.n_sources as u64).to_le_bytes());
        for v in self.kernel.iter().chain(&self.source_scale) {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&buf).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read a cache file and check it against `key` (inputs hash, method, lambda2).
    pub fn load(path: &Path, key: &KernelCacheKey) -> Result<Self, KernelCacheError> {
        let bytes = std::fs::read(path).map_err(|source| KernelCacheError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (kernel, found) = Self::parse_cache(&bytes, path)?;
        let stale = |reason: String| KernelCacheError::Stale {
            path: path.to_path_buf(),
            reason,
        };
        if found.method != key.method {
            return Err(stale(format!(
                "built for {}, {} wanted",
                found.method, key.method
            )));
        }
        if found.lambda2.to_bits() != key.lambda2.to_bits() {
            return Err(stale(format!(
                "lambda2 {} in cache, {} wanted",
                found.lambda2, key.lambda2
            )));
        }
        if found.inputs_hash != key.inputs_hash {
            return Err(stale(format!(
                "inputs changed (hash {:016x} in cache, {:016x} now)",
                found.inputs_hash, key.inputs_hash
            )));
        }
        Ok(kernel)
    }

    /// Parse cache bytes (validated: magic, version, sizes, checksum, finite values).
    pub fn parse_cache(
        bytes: &[u8],
        path: &Path,
    ) -> Result<(Self, KernelCacheKey), KernelCacheError> {
        let corrupt = |reason: String| KernelCacheError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < CACHE_HEADER_BYTES + 4 || &bytes[..8] != CACHE_MAGIC {
            return Err(corrupt("no trigd kernel cache header".into()));
        }
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let mut v = [0u8; 4];
        v.copy_from_slice(&bytes[8..12]);
        let version = u32::from_le_bytes(v);
        if version != CACHE_VERSION {
            return Err(corrupt(format!(
                "version {version}, this build reads {CACHE_VERSION}"
            )));
        }
        let method = Method::from_code(bytes[12])
            .ok_or_else(|| corrupt(format!("unknown method code {}", bytes[12])))?;
        let lambda2 = f64::from_bits(u64_at(16));
        let inputs_hash = u64_at(24);
        let n_channels =
            usize::try_from(u64_at(32)).map_err(|_| corrupt("n_channels too large".into()))?;
        let n_sources =
            usize::try_from(u64_at(40)).map_err(|_| corrupt("n_sources too large".into()))?;
        let n_values = n_sources
            .checked_mul(3)
            .and_then(|r| r.checked_mul(n_channels))
            .and_then(|k| k.checked_add(n_sources))
            .ok_or_else(|| corrupt("sizes overflow".into()))?;
        let expected = n_values
            .checked_mul(8)
            .and_then(|b| b.checked_add(CACHE_HEADER_BYTES + 4))
            .ok_or_else(|| corrupt("sizes overflow".into()))?;
        if bytes.len() != expected {
            return Err(corrupt(format!(
                "{} bytes, header implies {expected}",
                bytes.len()
            )));
        }
        let body = &bytes[..bytes.len() - 4];
        v.copy_from_slice(&bytes[bytes.len() - 4..]);
        if crc32c::crc32c(body) != u32::from_le_bytes(v) {
            return Err(corrupt("checksum mismatch".into()));
        }
        let values: Vec<f64> = body[CACHE_HEADER_BYTES..]
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                f64::from_le_bytes(a)
            })
            .collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(corrupt(format!("non-finite value at index {i}")));
        }
        let n_kernel = 3 * n_sources * n_channels;
        let kernel = Self {
            n_channels,
            n_sources,
            kernel: values[..n_kernel].to_vec(),
            source_scale: values[n_kernel..].to_vec(),
        };
        Ok((
            kernel,
            KernelCacheKey {
                inputs_hash,
                method,
                lambda2,
            },
        ))
    }

    /// Load the kernel from `cache` if it was built from these inputs with this method and
    /// lambda2; otherwise build it and write the cache (a failed write is logged, not fatal).
    pub fn load_or_build(
        cache: &Path,
        inputs: &EegInputs,
        method: Method,
        lambda2: f64,
    ) -> Result<(Self, CacheOutcome), KernelCacheError> {
        let key = KernelCacheKey::new(inputs, method, lambda2);
        let reason = match Self::load(cache, &key) {
            Ok(k) if k.n_channels == inputs.n_channels && k.n_sources == inputs.n_sources => {
                return Ok((k, CacheOutcome::Loaded))
            }
            Ok(_) => "cache sizes differ from the inputs".to_string(),
            Err(e) => e.to_string(),
        };
        let kernel = Self::build(inputs, method, lambda2)?;
        if let Err(e) = kernel.save(cache, &key) {
            tracing::warn!(error = %e, "could not write the inverse kernel cache");
        }
        Ok((kernel, CacheOutcome::Built { reason }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_kernel(n_channels: usize, n_sources: usize, seed: u64) -> InverseKernel {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        InverseKernel {
            n_channels,
            n_sources,
            kernel: (0..3 * n_sources * n_channels)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
            source_scale: (0..n_sources).map(|_| rng.random_range(0.5..2.0)).collect(),
        }
    }

    /// The definition, written out plainly.
    fn naive(k: &InverseKernel, data: &[f64], n_times: usize) -> Vec<f64> {
        let c = k.n_channels;
        let mut out = vec![0.0; k.n_sources * n_times];
        for s in 0..k.n_sources {
            for t in 0..n_times {
                let mut sq = 0.0;
                for j in 0..3 {
                    let row = &k.kernel[(3 * s + j) * c..(3 * s + j + 1) * c];
                    let v: f64 = row
                        .iter()
                        .enumerate()
                        .map(|(ch, w)| w * data[ch * n_times + t])
                        .sum();
                    sq += v * v;
                }
                out[s * n_times + t] = k.source_scale[s] * sq.sqrt();
            }
        }
        out
    }

    #[test]
    fn tiled_apply_matches_definition_for_odd_sizes() {
        // Sizes that do not divide the tiles.
        for &(c, s, t) in &[(7, 1, 1), (13, 65, 33), (32, 130, 70), (5, 64, 32)] {
            let k = random_kernel(c, s, (c * 1000 + s) as u64);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let data: Vec<f64> = (0..c * t).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut out = vec![0.0; s * t];
            k.apply_f64(&data, t, &mut out);
            let want = naive(&k, &data, t);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
            }
            let k32 = k.to_f32();
            let d32: Vec<f32> = data.iter().map(|&v| v as f32).collect();
            let mut o32 = vec![0.0f32; s * t];
            k32.apply_f32(&d32, t, &mut o32);
            for (a, b) in o32.iter().zip(&want) {
                assert!(
                    (f64::from(*a) - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn wrong_block_sizes_are_errors() {
        let k = random_kernel(4, 3, 1);
        let mut out = vec![0.0; 3 * 2];
        let e = k.try_apply_f64(&[0.0; 7], 2, &mut out).unwrap_err();
        assert_eq!(e.expected, 8);
        assert!(k.try_apply_f64(&[0.0; 8], 2, &mut out[..5]).is_err());
    }

    #[test]
    fn cache_round_trip_and_staleness() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k.bin");
        let k = random_kernel(5, 4, 3);
        let key = KernelCacheKey {
            inputs_hash: 42,
            method: Method::SLoreta,
            lambda2: 1.0 / 9.0,
        };
        k.save(&path, &key).expect("save");
        assert_eq!(InverseKernel::load(&path, &key).expect("load"), k);
        let other = KernelCacheKey {
            method: Method::DSpm,
            ..key
        };
        assert!(matches!(
            InverseKernel::load(&path, &other),
            Err(KernelCacheError::Stale { .. })
        ));
        let other = KernelCacheKey {
            lambda2: 0.1,
            ..key
        };
        assert!(matches!(
            InverseKernel::load(&path, &other),
            Err(KernelCacheError::Stale { .. })
        ));
        let other = KernelCacheKey {
            inputs_hash: 43,
            ..key
        };
        assert!(matches!(
            InverseKernel::load(&path, &other),
            Err(KernelCacheError::Stale { .. })
        ));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[60] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(
            InverseKernel::load(&path, &key),
            Err(KernelCacheError::Corrupt { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn cache_parser_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = InverseKernel::parse_cache(&bytes, Path::new("x"));
        }
    }
}
