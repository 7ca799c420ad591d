//! The GPU backend: device discovery, NVRTC-compiled kernels, device memory and streams.
//!
//! Nothing here needs a GPU to build, and nothing panics without one: [`detect`] checks
//! that the CUDA libraries can be loaded before the first CUDA call (cudarc, which loads
//! them at run time, would otherwise panic), then counts devices. `--backend gpu` with no
//! usable GPU is an error that names what is missing; `--backend auto` logs it and the
//! pipeline runs on the CPU. One worker per visible GPU: [`detect`] returns every device.

pub mod eeg;
pub mod nvrtc;
pub mod runtime;
pub mod tracking;
pub mod tracking_ca;
pub mod tracking_clones;
pub mod tracking_fit;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext};

/// Which backend the user asked for (`--backend auto|gpu|cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Every visible GPU if there is one, otherwise the CPU.
    #[default]
    Auto,
    /// GPUs only: no usable GPU is an error.
    Gpu,
    /// The CPU only; the GPU is never touched.
    Cpu,
}

impl FromStr for BackendChoice {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "gpu" => Ok(Self::Gpu),
            "cpu" => Ok(Self::Cpu),
            _ => Err(GpuError::Config(format!(
                "unknown backend {s:?}: expected auto, gpu or cpu"
            ))),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Gpu => "gpu",
            Self::Cpu => "cpu",
        })
    }
}

/// Everything that can go wrong on the GPU path. A batch that fails with one of these is
/// failed over to the CPU by the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{library} could not be loaded ({hint}); use --backend cpu or --backend auto to run without a GPU")]
    MissingLibrary {
        library: &'static str,
        hint: &'static str,
    },
    #[error("the CUDA driver reports no GPU device; use --backend cpu or --backend auto to run without a GPU")]
    NoDevice,
    #[error("CUDA driver call {call} failed: {code}")]
    Driver { call: &'static str, code: String },
    #[error("cuBLAS call {call} failed: {code}")]
    Cublas { call: &'static str, code: String },
    #[error("NVRTC could not compile {kernel}: {log}")]
    Compile { kernel: String, log: String },
    #[error("invalid GPU engine input: {0}")]
    Config(String),
}

impl From<GpuError> for crate::backend::BackendError {
    fn from(e: GpuError) -> Self {
        crate::backend::BackendError::Device(e.to_string())
    }
}

/// Turns a driver result into a [`GpuError`] naming the call.
pub(crate) fn driver<T>(call: &'static str, r: Result<T, drv::DriverError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Driver {
        call,
        code: driver_error_text(&e),
    })
}

fn driver_error_text(e: &drv::DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{:?}", e.0),
    }
}

/// How this process's host threads wait for their GPU work, from the next
/// [`GpuDevice::open`] on (the daemon sets `daemon.gpu_wait` before it opens a device).
pub fn set_wait(wait: crate::config::GpuWait) {
    WAIT.store(wait as u8, Ordering::Relaxed);
}

/// The wait [`set_wait`] chose (`auto` unless set).
pub fn wait() -> crate::config::GpuWait {
    use crate::config::GpuWait;
    use clap::ValueEnum;
    let w = WAIT.load(Ordering::Relaxed);
    GpuWait::value_variants()
        .iter()
        .copied()
        .find(|&v| v as u8 == w)
        .unwrap_or(GpuWait::Auto)
}

static WAIT: AtomicU8 = AtomicU8::new(crate::config::GpuWait::Auto as u8);

/// The scheduling flag of a wait.
pub fn wait_flag(wait: crate::config::GpuWait) -> u32 {
    use crate::config::GpuWait;
    use cudarc::driver::sys::CUctx_flags as F;
    (match wait {
        GpuWait::Auto => F::CU_CTX_SCHED_AUTO,
        GpuWait::Spin => F::CU_CTX_SCHED_SPIN,
        GpuWait::Yield => F::CU_CTX_SCHED_YIELD,
        GpuWait::Block => F::CU_CTX_SCHED_BLOCKING_SYNC,
    }) as u32
}

/// The device's primary context's scheduling flag set to [`wait`]'s where it differs,
/// before the context is retained. A driver that refuses leaves its own choice, with a
/// warning: the wait is a matter of speed, not of results.
fn apply_wait(ordinal: usize) {
    let want = wait_flag(wait());
    if primary_wait_flag(ordinal).is_none_or(|f| f == want) {
        return;
    }
    let r = cudarc::driver::result::device::get(ordinal as i32).and_then(|dev| {
        // SAFETY: a device handle from the driver; the flag is one of the scheduling
        // flags.
        unsafe { cudarc::driver::sys::cuDevicePrimaryCtxSetFlags_v2(dev, want).result() }
    });
    if let Err(e) = r {
        tracing::warn!(
            "GPU {ordinal}: the host's wait ({:?}) not set: {}",
            wait(),
            driver_error_text(&e)
        );
    }
}

/// The primary context's scheduling flag now of a device [`detect`] found (so the
/// driver's library is loaded), or `None` where the driver does not say.
pub fn primary_wait_flag(ordinal: usize) -> Option<u32> {
    cudarc::driver::result::init().ok()?;
    let dev = cudarc::driver::result::device::get(ordinal as i32).ok()?;
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: a device handle from the driver and two out-pointers to locals.
    unsafe { cudarc::driver::sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
        .result()
        .ok()?;
    Some(flags & cudarc::driver::sys::CUctx_flags::CU_CTX_SCHED_MASK as u32)
}

/// One visible GPU, as found by [`detect`].
#[derive(Debug, Clone)]
pub struct GpuDevice {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
    pub multiprocessors: i32,
}

impl GpuDevice {
    /// Retains the device's primary context and makes it current on this thread.
    pub fn open(&self) -> Result<Arc<CudaContext>, GpuError> {
        apply_wait(self.ordinal);
        driver("cuDevicePrimaryCtxRetain", CudaContext::new(self.ordinal))
    }

    /// `sm_90` for compute capability 9.0.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

impl fmt::Display for GpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {} {} ({}, {} SMs, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.arch(),
            self.multiprocessors,
            self.memory_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// The CUDA libraries the GPU path loads at run time, with what each is for.
const LIBRARIES: [(&str, &str); 3] = [
    (
        "the CUDA driver library libcuda.so",
        "install the NVIDIA driver",
    ),
    (
        "the NVRTC library libnvrtc.so",
        "install the CUDA toolkit or add its lib64 to LD_LIBRARY_PATH",
    ),
    (
        "the cuBLAS library libcublas.so",
        "install the CUDA toolkit or add its lib64 to LD_LIBRARY_PATH",
    ),
];

/// A module of kernels as an engine compiles it ([`nvrtc::compile_for_arch`] checks it
/// without a GPU).
pub struct KernelModule {
    /// The name NVRTC gives the source (its errors' file name).
    pub name: &'static str,
    pub source: String,
    /// NVRTC options beyond the architecture and the language standard.
    pub options: &'static [&'static str],
    /// The engine's file (`file!()`), whose `function("...")` calls name the kernels it
    /// looks up.
    pub engine: &'static str,
}

impl KernelModule {
    /// Compiles the module for `arch` (or takes it from `cache`) and loads it into `ctx`.
    pub fn load(
        &self,
        ctx: &Arc<CudaContext>,
        arch: &str,
        cache: &nvrtc::KernelCache,
    ) -> Result<nvrtc::LoadedModule, GpuError> {
        nvrtc::load_module_with_options(ctx, self.name, &self.source, arch, self.options, cache)
    }
}

/// Every module the engines compile: EEG, the track finder, the Kalman fit alone and the
/// clone step.
pub fn kernel_modules() -> Vec<KernelModule> {
    vec![
        eeg::kernel_module(),
        tracking_ca::kernel_module(),
        tracking_fit::kernel_module(),
        tracking_clones::kernel_module(),
    ]
}

/// Checks that the driver, NVRTC and cuBLAS libraries load; the first missing one is the error.
pub fn check_libraries() -> Result<(), GpuError> {
    // SAFETY: these only try to dlopen the libraries; no CUDA call is made.
    let present = unsafe {
        [
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        ]
    };
    for ((library, hint), ok) in LIBRARIES.iter().zip(present) {
        if !ok {
            return Err(GpuError::MissingLibrary { library, hint });
        }
    }
    Ok(())
}

fn enumerate() -> Result<Vec<GpuDevice>, GpuError> {
    check_libraries()?;
    match drv::init() {
        Ok(()) => {}
        Err(e) if e.0 == drv_sys::CUresult::CUDA_ERROR_NO_DEVICE => return Err(GpuError::NoDevice),
        Err(e) => {
            return Err(GpuError::Driver {
                call: "cuInit",
                code: driver_error_text(&e),
            })
        }
    }
    let count = driver("cuDeviceGetCount", drv::device::get_count())?;
    if count <= 0 {
        return Err(GpuError::NoDevice);
    }
    let mut devices = Vec::with_capacity(count as usize);
    for ordinal in 0..count {
        let dev = driver("cuDeviceGet", drv::device::get(ordinal))?;
        let attr = |a| {
            driver("cuDeviceGetAttribute", unsafe {
                drv::device::get_attribute(dev, a)
            })
        };
        use drv_sys::CUdevice_attribute as A;
        devices.push(GpuDevice {
            ordinal: ordinal as usize,
            name: driver("cuDeviceGetName", drv::device::get_name(dev))?,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            memory_bytes: driver("cuDeviceTotalMem", unsafe { drv::device::total_mem(dev) })?,
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        });
    }
    Ok(devices)
}

/// Finds the GPUs to run on. `Cpu`: none, nothing is loaded. `Gpu`: every visible GPU, or
/// an error naming what is missing. `Auto`: every visible GPU, or none with a log line.
pub fn detect(choice: BackendChoice) -> Result<Vec<GpuDevice>, GpuError> {
    match choice {
        BackendChoice::Cpu => Ok(Vec::new()),
        BackendChoice::Gpu => {
            let devices = enumerate()?;
            for d in &devices {
                tracing::info!("backend gpu: {d}");
            }
            Ok(devices)
        }
        BackendChoice::Auto => match enumerate() {
            Ok(devices) => {
                for d in &devices {
                    tracing::info!("backend auto: using {d}");
                }
                Ok(devices)
            }
            Err(e) => {
                tracing::warn!("backend auto: no usable GPU ({e}); running on the CPU");
                Ok(Vec::new())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_wait_set_is_the_wait_read() {
        use crate::config::GpuWait;
        use clap::ValueEnum;
        for &w in GpuWait::value_variants() {
            set_wait(w);
            assert_eq!(wait(), w);
        }
        set_wait(GpuWait::Auto);
    }

    #[test]
    fn backend_choice_parses_the_three_names() {
        assert_eq!(
            "auto".parse::<BackendChoice>().unwrap(),
            BackendChoice::Auto
        );
        assert_eq!("GPU".parse::<BackendChoice>().unwrap(), BackendChoice::Gpu);
        assert_eq!(
            " cpu ".parse::<BackendChoice>().unwrap(),
            BackendChoice::Cpu
        );
        let err = "cuda".parse::<BackendChoice>().unwrap_err().to_string();
        assert!(err.contains("auto, gpu or cpu"), "{err}");
        for c in [BackendChoice::Auto, BackendChoice::Gpu, BackendChoice::Cpu] {
            assert_eq!(c.to_string().parse::<BackendChoice>().unwrap(), c);
        }
    }

    #[test]
    fn cpu_choice_never_touches_cuda() {
        assert!(detect(BackendChoice::Cpu).unwrap().is_empty());
    }

    /// Runs everywhere: with no GPU, `auto` gives none and `gpu` names what is missing;
    /// with one, both agree on the device list.
    #[test]
    fn detection_without_a_gpu_is_an_error_only_when_a_gpu_was_asked_for() {
        let auto = detect(BackendChoice::Auto).expect("auto never fails");
        match detect(BackendChoice::Gpu) {
            Ok(devices) => {
                assert!(!devices.is_empty());
                assert_eq!(devices.len(), auto.len());
            }
            Err(e) => {
                assert!(auto.is_empty());
                let msg = e.to_string();
                assert!(
                    matches!(
                        e,
                        GpuError::MissingLibrary { .. }
                            | GpuError::NoDevice
                            | GpuError::Driver { .. }
                    ),
                    "{msg}"
                );
                assert!(
                    msg.contains("lib") || msg.contains("device") || msg.contains("cu"),
                    "{msg}"
                );
                assert!(
                    msg.contains("--backend cpu") || matches!(e, GpuError::Driver { .. }),
                    "{msg}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn backend_choice_parser_never_panics(s in ".*") {
            let _ = s.parse::<BackendChoice>();
        }
    }
}
