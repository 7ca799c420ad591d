//! Run-time compilation of the CUDA kernels in `kernels/*.cu` with NVRTC, for the device's
//! own architecture (`-arch=sm_XX`), with an on-disk cache so a restart loads the compiled
//! image instead of compiling again.
//!
//! Cache: `$TRIGD_KERNEL_CACHE` (`off` disables it), else `$XDG_CACHE_HOME/trigd/kernels`,
//! else `~/.cache/trigd/kernels`. One file per (source, options, arch, NVRTC version),
//! named by a hash of all four; each file carries a header with a checksum, so a truncated
//! or corrupted entry is detected, compiled again and overwritten, never fatal.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys, Ptx};

use super::{driver, GpuError};

const MAGIC: &[u8; 8] = b"TRIGDKC1";
/// Image kinds stored in a cache entry.
const KIND_CUBIN: u8 = 1;
const KIND_PTX: u8 = 2;
const HEADER_LEN: usize = 8 + 1 + 8 + 4;

/// A compiled kernel image: device code for one architecture (CUBIN) or, when NVRTC does
/// not know the device's architecture, PTX that the driver compiles on load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelImage {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// Encodes an image as a cache entry: magic, kind, length, CRC-32C, payload.
pub fn encode_cache_entry(image: &KernelImage) -> Vec<u8> {
    let (kind, payload): (u8, &[u8]) = match image {
        KernelImage::Cubin(b) => (KIND_CUBIN, b),
        KernelImage::Ptx(s) => (KIND_PTX, s.as_bytes()),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Why a cache entry was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheEntryError {
    #[error("cache entry shorter than its header")]
    Truncated,
    #[error("cache entry has the wrong magic bytes")]
    BadMagic,
    #[error("cache entry has unknown image kind {0}")]
    BadKind(u8),
    #[error("cache entry length {declared} does not match the {actual} payload bytes")]
    BadLength { declared: u64, actual: usize },
    #[error("cache entry checksum mismatch")]
    BadChecksum,
    #[error("cached PTX is not UTF-8")]
    BadPtx,
}

/// Parses a cache entry written by [`encode_cache_entry`]; any damage is an error.
pub fn decode_cache_entry(bytes: &[u8]) -> Result<KernelImage, CacheEntryError> {
    if bytes.len() < HEADER_LEN {
        return Err(CacheEntryError::Truncated);
    }
    if &bytes[..8] != MAGIC {
        return Err(CacheEntryError::BadMagic);
    }
    let kind = bytes[8];
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[9..17]);
    let declared = u64::from_le_bytes(len);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[17..21]);
    let payload = &bytes[HEADER_LEN..];
    if declared != payload.len() as u64 {
        return Err(CacheEntryError::BadLength {
            declared,
            actual: payload.len(),
        });
    }
    if crc32c::crc32c(payload) != u32::from_le_bytes(crc) {
        return Err(CacheEntryError::BadChecksum);
    }
    match kind {
        KIND_CUBIN => Ok(KernelImage::Cubin(payload.to_vec())),
        KIND_PTX => String::from_utf8(payload.to_vec())
            .map(KernelImage::Ptx)
            .map_err(|_| CacheEntryError::BadPtx),
        k => Err(CacheEntryError::BadKind(k)),
    }
}

/// 64-bit FNV-1a, stable across builds and platforms (the cache key must not change
/// between runs of the same binary, nor collide between different inputs by accident).
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The cache file name for one compilation.
pub fn cache_key(
    source: &str,
    options: &[String],
    arch: &str,
    nvrtc_version: (i32, i32),
) -> String {
    let opts = options.join("\u{1f}");
    let ver = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let parts: [&[u8]; 4] = [
        source.as_bytes(),
        opts.as_bytes(),
        arch.as_bytes(),
        ver.as_bytes(),
    ];
    let crc = parts.iter().fold(0u32, |c, p| crc32c::crc32c_append(c, p));
    format!("{:016x}{:08x}-{arch}.bin", fnv1a64(&parts), crc)
}

/// Where compiled kernels are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    /// `None`: no cache, always compile.
    pub dir: Option<PathBuf>,
}

impl KernelCache {
    /// From the environment: `TRIGD_KERNEL_CACHE` (a directory, or `off`), then
    /// `XDG_CACHE_HOME/trigd/kernels`, then `HOME/.cache/trigd/kernels`.
    pub fn from_env() -> Self {
        let var = |k| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = match var("TRIGD_KERNEL_CACHE") {
            Some(v) if v == "off" => None,
            Some(v) => Some(PathBuf::from(v)),
            None => var("XDG_CACHE_HOME")
                .map(|x| PathBuf::from(x).join("trigd/kernels"))
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/trigd/kernels"))),
        };
        Self { dir }
    }

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    pub fn disabled() -> Self {
        Self { dir: None }
    }

    fn read(&self, key: &str) -> Option<KernelImage> {
        let path = self.dir.as_ref()?.join(key);
        let bytes = std::fs::read(&path).ok()?;
        match decode_cache_entry(&bytes) {
            Ok(img) => Some(img),
            Err(e) => {
                tracing::warn!(
                    "kernel cache entry {} is damaged ({e}); compiling again",
                    path.display()
                );
                None
            }
        }
    }

    /// Writes atomically (temporary file, then rename); a failure is logged, not fatal.
    fn write(&self, key: &str, image: &KernelImage) {
        let Some(dir) = &self.dir else { return };
        let result = (|| -> std::io::Result<PathBuf> {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(key);
            let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, encode_cache_entry(image))?;
            std::fs::rename(&tmp, &path)?;
            Ok(path)
        })();
        if let Err(e) = result {
            tracing::warn!("could not write kernel cache in {}: {e}", dir.display());
        }
    }

    /// The path of an entry (for tests and diagnostics).
    pub fn entry_path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(key))
    }
}

/// The NVRTC library version, part of the cache key.
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library was checked to be present by `detect`.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| GpuError::Compile {
            kernel: "nvrtcVersion".into(),
            log: format!("{e:?}"),
        })?;
    Ok((major, minor))
}

/// Compiles `source` with `options`; `cubin` asks for device code (needs a real `sm_XX`).
fn compile(
    name: &str,
    source: &str,
    options: &[String],
    cubin: bool,
) -> Result<KernelImage, GpuError> {
    let err = |log: String| GpuError::Compile {
        kernel: name.to_string(),
        log,
    };
    let src = CString::new(source).map_err(|_| err("source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| err("name contains a NUL byte".into()))?;
    let prog = nvrtc_result::create_program(&src, Some(cname.as_c_str()))
        .map_err(|e| err(format!("{e:?}")))?;
    // SAFETY: `prog` is valid until destroyed below; `src`/`cname` outlive it.
    let out = (|| unsafe {
        let compiled = nvrtc_result::compile_program(prog, options);
        let log = nvrtc_result::get_program_log(prog)
            .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
            .unwrap_or_default();
        match compiled {
            Err(e) => Err(err(format!("{e:?}: {log}"))),
            Ok(()) if cubin => {
                let mut size = 0usize;
                nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| err(format!("nvrtcGetCUBINSize: {e:?}")))?;
                let mut bytes = vec![0u8; size];
                nvrtc_sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast())
                    .result()
                    .map_err(|e| err(format!("nvrtcGetCUBIN: {e:?}")))?;
                Ok(KernelImage::Cubin(bytes))
            }
            Ok(()) => nvrtc_result::get_ptx(prog)
                .map(|p| {
                    KernelImage::Ptx(CStr::from_ptr(p.as_ptr()).to_string_lossy().into_owned())
                })
                .map_err(|e| err(format!("nvrtcGetPTX: {e:?}"))),
        }
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc_result::destroy_program(prog) };
    out
}

/// A loaded kernel module and how it was obtained.
pub struct LoadedModule {
    pub module: Arc<CudaModule>,
    /// True when the image came from the on-disk cache (no compilation).
    pub from_cache: bool,
    /// Wall time to obtain and load the image, milliseconds.
    pub load_ms: f64,
}

impl LoadedModule {
    pub fn function(&self, name: &'static str) -> Result<CudaFunction, GpuError> {
        driver("cuModuleGetFunction", self.module.load_function(name))
    }
}

fn load_image(ctx: &Arc<CudaContext>, image: &KernelImage) -> Result<Arc<CudaModule>, GpuError> {
    let ptx = match image {
        KernelImage::Cubin(b) => Ptx::from_binary(b.clone()),
        KernelImage::Ptx(s) => Ptx::from_src(s.clone()),
    };
    driver("cuModuleLoadData", ctx.load_module(ptx))
}

/// NVRTC options from `TRIGD_KERNEL_OPTIONS` (separated by white space), for profiling.
fn profiling_options() -> Vec<String> {
    std::env::var("TRIGD_KERNEL_OPTIONS")
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The NVRTC options of a module for `arch`: the architecture and the language standard,
/// the module's own (`extra_options`), then any from `TRIGD_KERNEL_OPTIONS`.
fn options_for(arch: &str, extra_options: &[&str]) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    options.extend(extra_options.iter().map(|o| o.to_string()));
    // Further options for profiling builds, such as `--generate-line-info` (source lines
    // for a profiler's per-line counters) or `-DCA_PHASE_CLOCKS` (the candidate step's
    // time per phase, printed by the kernel); part of the cache key as the others.
    options.extend(profiling_options());
    options
}

/// Compiles a module to device code for `arch` (`sm_XX`) with the options the engines load
/// it with ([`load_module_with_options`]), without a GPU or its driver: only NVRTC is
/// needed. Returns the cubin (an ELF image whose symbols name the module's kernels).
pub fn compile_for_arch(
    name: &str,
    source: &str,
    arch: &str,
    extra_options: &[&str],
) -> Result<Vec<u8>, GpuError> {
    // SAFETY: this only tries to dlopen the library; no NVRTC call is made.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        let (library, hint) = super::LIBRARIES[1];
        return Err(GpuError::MissingLibrary { library, hint });
    }
    match compile(name, source, &options_for(arch, extra_options), true)? {
        KernelImage::Cubin(bytes) => Ok(bytes),
        KernelImage::Ptx(_) => Err(GpuError::Compile {
            kernel: name.to_string(),
            log: "NVRTC gave PTX where device code was asked for".into(),
        }),
    }
}

/// Loads `source` for the device of `ctx` (`arch` such as `sm_90`): from the cache if a
/// sound entry exists and loads, otherwise compiled (CUBIN for `arch`, or PTX for the
/// matching `compute_XX` if NVRTC rejects the architecture) and written to the cache.
/// `extra_options` follow the architecture and language standard (such as `--fmad=false`
/// for kernels that must round as the CPU does); they are part of the cache key.
pub fn load_module_with_options(
    ctx: &Arc<CudaContext>,
    name: &str,
    source: &str,
    arch: &str,
    extra_options: &[&str],
    cache: &KernelCache,
) -> Result<LoadedModule, GpuError> {
    let start = Instant::now();
    let version = nvrtc_version()?;
    let options = options_for(arch, extra_options);
    let key = cache_key(source, &options, arch, version);
    if let Some(image) = cache.read(&key) {
        match load_image(ctx, &image) {
            Ok(module) => {
                return Ok(LoadedModule {
                    module,
                    from_cache: true,
                    load_ms: start.elapsed().as_secs_f64() * 1e3,
                })
            }
            Err(e) => tracing::warn!("cached kernel {key} did not load ({e}); compiling again"),
        }
    }
    let image = match compile(name, source, &options, true) {
        Ok(img) => img,
        Err(e) => {
            let virt = arch.replace("sm_", "compute_");
            tracing::warn!("NVRTC could not build {name} for {arch} ({e}); trying PTX for {virt}");
            let mut opts = vec![
                format!("--gpu-architecture={virt}"),
                "--std=c++17".to_string(),
            ];
            opts.extend(extra_options.iter().map(|o| o.to_string()));
            compile(name, source, &opts, false)?
        }
    };
    let module = load_image(ctx, &image)?;
    cache.write(&key, &image);
    tracing::info!(
        "compiled kernels {name} for {arch} in {:.0} ms (cache: {})",
        start.elapsed().as_secs_f64() * 1e3,
        cache
            .dir
            .as_deref()
            .map(Path::display)
            .map(|d| d.to_string())
            .unwrap_or_else(|| "off".into())
    );
    Ok(LoadedModule {
        module,
        from_cache: false,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cache_entry_round_trips_both_kinds() {
        for img in [
            KernelImage::Cubin(vec![0x7f, b'E', b'L', b'F', 0, 1, 2]),
            KernelImage::Ptx(".version 8.0\n".into()),
        ] {
            assert_eq!(decode_cache_entry(&encode_cache_entry(&img)).unwrap(), img);
        }
    }

    #[test]
    fn damaged_cache_entries_are_rejected() {
        let good = encode_cache_entry(&KernelImage::Cubin((0..200u8).collect()));
        assert_eq!(
            decode_cache_entry(&good[..10]),
            Err(CacheEntryError::Truncated)
        );
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 50] ^= 0x10;
        assert_eq!(
            decode_cache_entry(&flipped),
            Err(CacheEntryError::BadChecksum)
        );
        let mut short = good.clone();
        short.pop();
        assert!(matches!(
            decode_cache_entry(&short),
            Err(CacheEntryError::BadLength { .. })
        ));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(decode_cache_entry(&magic), Err(CacheEntryError::BadMagic));
        let mut kind = good;
        kind[8] = 9;
        assert_eq!(decode_cache_entry(&kind), Err(CacheEntryError::BadKind(9)));
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let base = cache_key("src", &o, "sm_90", (13, 0));
        assert_eq!(base, cache_key("src", &o, "sm_90", (13, 0)));
        assert_ne!(base, cache_key("src2", &o, "sm_90", (13, 0)));
        assert_ne!(base, cache_key("src", &[], "sm_90", (13, 0)));
        assert_ne!(base, cache_key("src", &o, "sm_80", (13, 0)));
        assert_ne!(base, cache_key("src", &o, "sm_90", (13, 1)));
    }

    #[test]
    fn cache_write_then_read_and_corruption_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path().join("k"));
        let img = KernelImage::Ptx("ptx text".into());
        assert_eq!(cache.read("a.bin"), None);
        cache.write("a.bin", &img);
        assert_eq!(cache.read("a.bin"), Some(img));
        std::fs::write(cache.entry_path("a.bin").unwrap(), b"TRIGDKC1 garbage").unwrap();
        assert_eq!(cache.read("a.bin"), None);
    }

    proptest! {
        #[test]
        fn cache_entry_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_cache_entry(&bytes);
        }

        #[test]
        fn cache_entry_parser_accepts_exactly_what_was_written(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let img = KernelImage::Cubin(payload);
            prop_assert_eq!(decode_cache_entry(&encode_cache_entry(&img)).unwrap(), img);
        }
    }
}
