//! Device memory, page-locked host memory, cuBLAS handles and CUDA graphs, as thin owners
//! over the driver API, plus the [`BatchSizer`] that picks how many frames go into one
//! launch. Everything here is allocated once at start-up; the hot path only copies into
//! and out of these buffers and enqueues work on streams.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaStream};

use super::{driver, GpuError};

/// A device allocation of `len` elements of `T`, freed on drop.
pub struct DeviceBuffer<T> {
    ptr: drv_sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
    _t: PhantomData<T>,
}

impl<T: Copy> DeviceBuffer<T> {
    /// Allocates (contents undefined). `len` 0 allocates one element so the pointer is valid.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        driver("cuCtxSetCurrent", ctx.bind_to_thread())?;
        let bytes = len
            .max(1)
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| {
                GpuError::Config(format!("device buffer of {len} elements overflows"))
            })?;
        // SAFETY: context is current; the pointer is owned by the returned value.
        let ptr = driver("cuMemAlloc", unsafe { drv::malloc_sync(bytes) })?;
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    /// Allocates and copies `data` in (synchronously; start-up only).
    pub fn from_host(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self, GpuError> {
        let buf = Self::new(ctx, data.len())?;
        if !data.is_empty() {
            // SAFETY: `buf` holds `data.len()` elements of T.
            driver("cuMemcpyHtoD", unsafe {
                drv::memcpy_htod_sync(buf.ptr, data)
            })?;
        }
        Ok(buf)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ptr(&self) -> drv_sys::CUdeviceptr {
        self.ptr
    }

    /// Device address of element `i` (may be one past the end).
    pub fn ptr_at(&self, i: usize) -> drv_sys::CUdeviceptr {
        debug_assert!(i <= self.len);
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }

    /// Fills every byte with `byte` on `stream` (test poisoning: 0xff makes NaN floats).
    pub fn fill_bytes(&self, byte: u8, stream: &CudaStream) -> Result<(), GpuError> {
        // SAFETY: the range is this allocation.
        driver("cuMemsetD8Async", unsafe {
            drv::memset_d8_async(
                self.ptr,
                byte,
                self.len * std::mem::size_of::<T>(),
                stream.cu_stream(),
            )
        })
    }

    /// Synchronous copy out (tests and start-up checks).
    pub fn to_host(&self) -> Result<Vec<T>, GpuError>
    where
        T: Default,
    {
        driver("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let mut out = vec![T::default(); self.len];
        // SAFETY: `out` holds exactly `len` elements.
        driver("cuMemcpyDtoH", unsafe {
            drv::memcpy_dtoh_sync(&mut out, self.ptr)
        })?;
        Ok(out)
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in `new`, freed once. Errors at teardown are
            // not actionable.
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory: the staging area for asynchronous copies.
pub struct PinnedBuffer<T> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through &/&mut.
unsafe impl<T: Send> Send for PinnedBuffer<T> {}

impl<T: Copy + Default> PinnedBuffer<T> {
    /// Allocates `len` elements (cached, not write-combined: the host reads results back).
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        driver("cuCtxSetCurrent", ctx.bind_to_thread())?;
        let n = len.max(1);
        let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            GpuError::Config(format!("pinned buffer of {len} elements overflows"))
        })?;
        // SAFETY: plain allocation; initialised right below.
        let ptr = driver("cuMemHostAlloc", unsafe { drv::malloc_host(bytes, 0) })? as *mut T;
        // SAFETY: `ptr` points to `n` elements; T is Copy so writing defaults is sound.
        unsafe { std::slice::from_raw_parts_mut(ptr, n).fill(T::default()) };
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: `len` initialised elements, exclusive borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { drv::free_host(self.ptr.cast()) };
        }
    }
}

/// Asynchronous host-to-device copy of `src` into `dst` at element `offset`.
pub fn copy_to_device<T: Copy>(
    src: &[T],
    dst: &DeviceBuffer<T>,
    offset: usize,
    stream: &CudaStream,
) -> Result<(), GpuError> {
    if offset + src.len() > dst.len() {
        return Err(GpuError::Config(format!(
            "copy of {} elements at {offset} exceeds a device buffer of {}",
            src.len(),
            dst.len()
        )));
    }
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: bounds checked above; the caller keeps `src` (pinned) alive until the stream
    // has passed this copy.
    driver("cuMemcpyHtoDAsync", unsafe {
        drv::memcpy_htod_async(dst.ptr_at(offset), src, stream.cu_stream())
    })
}

/// Asynchronous device-to-host copy of `len` elements from the start of `src` into the
/// start of `dst`. The host must not read `dst` before the stream has passed this copy.
pub fn copy_to_host<T: Copy>(
    src: &DeviceBuffer<T>,
    dst: &PinnedBuffer<T>,
    len: usize,
    stream: &CudaStream,
) -> Result<(), GpuError> {
    if len > src.len() || len > dst.len {
        return Err(GpuError::Config(format!(
            "copy of {len} elements exceeds a buffer (device {}, host {})",
            src.len(),
            dst.len
        )));
    }
    if len == 0 {
        return Ok(());
    }
    // SAFETY: bounds checked; the pinned buffer is written only by this copy and read by
    // the host after synchronising on the stream.
    driver("cuMemcpyDtoHAsync", unsafe {
        drv_sys::cuMemcpyDtoHAsync_v2(
            dst.ptr.cast(),
            src.ptr,
            len * std::mem::size_of::<T>(),
            stream.cu_stream(),
        )
        .result()
    })
}

pub(crate) fn cublas<T>(
    call: &'static str,
    r: Result<T, blas_result::CublasError>,
) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::Cublas {
        call,
        code: format!("{:?}", e.0),
    })
}

/// A cuBLAS handle bound to one stream, with its own workspace (so it can be captured in
/// a CUDA graph), in plain FP32 math (no TF32: results must agree with the CPU to 1e-4).
pub struct Blas {
    handle: blas_sys::cublasHandle_t,
    _workspace: DeviceBuffer<u8>,
}

// SAFETY: the handle is used by one engine at a time (through &mut).
unsafe impl Send for Blas {}

impl Blas {
    pub const WORKSPACE_BYTES: usize = 32 << 20;

    pub fn new(ctx: &Arc<CudaContext>, stream: &CudaStream) -> Result<Self, GpuError> {
        driver("cuCtxSetCurrent", ctx.bind_to_thread())?;
        let handle = cublas("cublasCreate", blas_result::create_handle())?;
        let workspace = DeviceBuffer::<u8>::new(ctx, Self::WORKSPACE_BYTES)?;
        let blas = Self {
            handle,
            _workspace: workspace,
        };
        // SAFETY: valid handle, stream and workspace owned alongside the handle.
        unsafe {
            cublas(
                "cublasSetStream",
                blas_result::set_stream(handle, stream.cu_stream() as _),
            )?;
            cublas(
                "cublasSetMathMode",
                blas_sys::cublasSetMathMode(handle, blas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH)
                    .result(),
            )?;
            cublas(
                "cublasSetWorkspace",
                blas_sys::cublasSetWorkspace_v2(
                    handle,
                    blas._workspace.ptr() as _,
                    Self::WORKSPACE_BYTES,
                )
                .result(),
            )?;
        }
        Ok(blas)
    }

    /// `C[m,n] = op(A) op(B)` in cuBLAS's column-major convention, FP32, beta = 0.
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        a: drv_sys::CUdeviceptr,
        lda: usize,
        b: drv_sys::CUdeviceptr,
        ldb: usize,
        c: drv_sys::CUdeviceptr,
        ldc: usize,
    ) -> Result<(), GpuError> {
        let dim = |x: usize| {
            i32::try_from(x).map_err(|_| {
                GpuError::Config(format!("matrix dimension {x} exceeds cuBLAS's int range"))
            })
        };
        let op = |t| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller passes device pointers of buffers sized for these dimensions.
        cublas("cublasSgemm", unsafe {
            blas_result::sgemm(
                self.handle,
                op(trans_a),
                op(trans_b),
                dim(m)?,
                dim(n)?,
                dim(k)?,
                &alpha,
                a as *const f32,
                dim(lda)?,
                b as *const f32,
                dim(ldb)?,
                &beta,
                c as *mut f32,
                dim(ldc)?,
            )
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { blas_result::destroy_handle(self.handle) };
    }
}

/// An instantiated CUDA graph: a recorded sequence of copies and launches replayed with
/// one call, which cuts per-frame launch overhead for one-sample frames.
pub struct Graph {
    graph: drv_sys::CUgraph,
    exec: drv_sys::CUgraphExec,
}

// SAFETY: used by one engine at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Records what `enqueue` puts on `stream` and instantiates it. On failure the stream
    /// is left out of capture mode.
    pub fn capture(
        stream: &CudaStream,
        enqueue: impl FnOnce() -> Result<(), GpuError>,
    ) -> Result<Self, GpuError> {
        let s = stream.cu_stream();
        // SAFETY: valid stream; capture is ended on every path below.
        unsafe {
            driver(
                "cuStreamBeginCapture",
                drv::stream::begin_capture(
                    s,
                    drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                ),
            )?;
            let recorded = enqueue();
            let ended = drv::stream::end_capture(s);
            let graph = match (recorded, ended) {
                (Ok(()), Ok(g)) => g,
                (Err(e), Ok(g)) => {
                    if !g.is_null() {
                        let _ = drv::graph::destroy(g);
                    }
                    return Err(e);
                }
                (Err(e), Err(_)) => return Err(e),
                (Ok(()), Err(e)) => return driver("cuStreamEndCapture", Err(e)),
            };
            match drv::graph::instantiate(graph, drv_sys::CUgraphInstantiate_flags(0)) {
                Ok(exec) => Ok(Self { graph, exec }),
                Err(e) => {
                    let _ = drv::graph::destroy(graph);
                    driver("cuGraphInstantiate", Err(e))
                }
            }
        }
    }

    pub fn launch(&self, stream: &CudaStream) -> Result<(), GpuError> {
        // SAFETY: valid exec and stream.
        driver("cuGraphLaunch", unsafe {
            drv::graph::launch(self.exec, stream.cu_stream())
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created in `capture`, destroyed once.
        unsafe {
            let _ = drv::graph::exec_destroy(self.exec);
            let _ = drv::graph::destroy(self.graph);
        }
    }
}

/// Picks how many frames go into one launch. It fits `time = fixed + per_frame * frames`
/// to recent measurements (exponentially weighted least squares) and proposes the
/// largest batch whose predicted time fits the budget. Until two distinct batch sizes
/// have been measured it probes: 1, then doubling while the budget allows.
#[derive(Debug, Clone)]
pub struct BatchSizer {
    budget_us: f64,
    max_frames: usize,
    /// Weight of older samples per new one (0..1).
    decay: f64,
    sw: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    sizes_seen: [usize; 2],
    calls: u64,
}

impl BatchSizer {
    pub fn new(budget_us: f64, max_frames: usize) -> Self {
        assert!(
            budget_us > 0.0 && max_frames >= 1,
            "budget and batch limit must be positive"
        );
        Self {
            budget_us,
            max_frames,
            decay: 0.95,
            sw: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
            sizes_seen: [0, 0],
            calls: 0,
        }
    }

    /// Records that a batch of `frames` took `elapsed_us`.
    pub fn record(&mut self, frames: usize, elapsed_us: f64) {
        if frames == 0 || !elapsed_us.is_finite() || elapsed_us < 0.0 {
            return;
        }
        let x = frames as f64;
        let d = self.decay;
        self.sw = self.sw * d + 1.0;
        self.sx = self.sx * d + x;
        self.sy = self.sy * d + elapsed_us;
        self.sxx = self.sxx * d + x * x;
        self.sxy = self.sxy * d + x * elapsed_us;
        if self.sizes_seen[0] == 0 {
            self.sizes_seen[0] = frames;
        } else if self.sizes_seen[0] != frames {
            self.sizes_seen[1] = frames;
        }
    }

    /// (fixed_us, per_frame_us) of the fitted model, once two batch sizes were seen.
    pub fn model(&self) -> Option<(f64, f64)> {
        if self.sizes_seen[1] == 0 {
            return None;
        }
        let det = self.sw * self.sxx - self.sx * self.sx;
        if det <= 1e-9 * self.sw * self.sxx {
            return None;
        }
        let per_frame = (self.sw * self.sxy - self.sx * self.sy) / det;
        let fixed = (self.sy - per_frame * self.sx) / self.sw;
        Some((fixed.max(0.0), per_frame.max(1e-3)))
    }

    /// Predicted time of a batch of `frames`, if the model is ready.
    pub fn predict_us(&self, frames: usize) -> Option<f64> {
        self.model().map(|(a, b)| a + b * frames as f64)
    }

    /// The batch size to use next (1..=max_frames). Every 16th proposal is halved so the
    /// fit keeps seeing two sizes and can follow a change in cost.
    pub fn next_batch(&mut self) -> usize {
        self.calls += 1;
        let clamp = |fit: f64| {
            if fit < 1.0 {
                1
            } else {
                (fit as usize).min(self.max_frames)
            }
        };
        if self.sw == 0.0 {
            1
        } else {
            match self.model() {
                Some((fixed, per_frame)) => {
                    let n = clamp(((self.budget_us - fixed) / per_frame).floor());
                    if self.calls % 16 == 0 && n > 1 {
                        n / 2
                    } else {
                        n
                    }
                }
                None => {
                    // One size seen: assume no fixed cost (an upper bound per frame) and
                    // step to a neighbouring size so the next fit has two points.
                    let n = clamp((self.budget_us / (self.sy / self.sx)).floor());
                    if n == self.sizes_seen[0] && n > 1 {
                        n - 1
                    } else {
                        n
                    }
                }
            }
        }
    }

    pub fn budget_us(&self) -> f64 {
        self.budget_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizer_learns_a_linear_cost_and_fills_the_budget() {
        // True cost: 40 us fixed + 30 us per frame; budget 1000 us -> 32 frames fit.
        let mut s = BatchSizer::new(1000.0, 64);
        for _ in 0..50 {
            let n = s.next_batch();
            s.record(n, 40.0 + 30.0 * n as f64);
        }
        let (fixed, per) = s.model().expect("model after probing");
        assert!(
            (fixed - 40.0).abs() < 1e-6 && (per - 30.0).abs() < 1e-6,
            "{fixed} {per}"
        );
        assert_eq!(s.next_batch(), 32);
        assert!(s.predict_us(32).unwrap() <= 1000.0);
        assert!(s.predict_us(33).unwrap() > 1000.0);
    }

    #[test]
    fn sizer_respects_limits() {
        let mut s = BatchSizer::new(100.0, 8);
        assert_eq!(s.next_batch(), 1);
        s.record(1, 1.0);
        s.record(2, 2.0);
        assert_eq!(s.next_batch(), 8, "cheap frames: capped at max_frames");
        let mut slow = BatchSizer::new(100.0, 8);
        slow.record(1, 500.0);
        assert_eq!(slow.next_batch(), 1, "over budget already: one frame");
        slow.record(2, 900.0);
        assert_eq!(slow.next_batch(), 1);
    }

    #[test]
    fn sizer_follows_a_change_in_cost() {
        let mut s = BatchSizer::new(1000.0, 64);
        for _ in 0..40 {
            let n = s.next_batch();
            s.record(n, 10.0 + 10.0 * n as f64);
        }
        let before = s.next_batch();
        for _ in 0..200 {
            let n = s.next_batch();
            s.record(n, 10.0 + 40.0 * n as f64);
        }
        let after = s.next_batch();
        assert!(after < before, "{before} -> {after}");
        assert!((after as f64) * 40.0 + 10.0 <= 1000.0 + 40.0, "{after}");
    }

    #[test]
    fn sizer_without_a_deadline_takes_the_largest_batch() {
        let mut s = BatchSizer::new(f64::INFINITY, 512);
        assert_eq!(s.next_batch(), 1);
        s.record(1, 7000.0);
        assert_eq!(s.next_batch(), 512);
        s.record(512, 30000.0);
        for _ in 0..40 {
            let n = s.next_batch();
            assert!(n == 512 || n == 256, "{n}");
            s.record(n, 6000.0 + 50.0 * n as f64);
        }
    }

    #[test]
    fn sizer_ignores_nonsense_measurements() {
        let mut s = BatchSizer::new(100.0, 4);
        s.record(0, 5.0);
        s.record(3, f64::NAN);
        s.record(3, -1.0);
        assert!(s.model().is_none());
        assert_eq!(s.next_batch(), 1);
    }
}
