//! liblsl's C API (`lsl_c.h`, 1.14 and later), loaded at run time with `dlopen`, so the
//! trigd binary builds and runs on machines without liblsl and only `lsl://` needs it.
//!
//! Where the library is looked for, in order:
//! 1. `$TRIGD_LIBLSL` (a path to `liblsl.so*`), then `$PYLSL_LIB` (pylsl's own variable);
//! 2. `liblsl.so.2`, `liblsl.so` on the loader's path (a system or source install);
//! 3. the copy the `pylsl` wheel bundles (`pylsl/lib/liblsl.so.2`), found by asking
//!    `python3` (or `$TRIGD_PYTHON`) where pylsl lives. `./setup.sh` installs pylsl.
//!
//! Only the functions trigd calls are bound. The wrappers own their handles and free them
//! on drop; every call that can fail returns an [`LslError`].

use std::ffi::{c_char, c_double, c_int, c_ulong, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

type Info = *mut c_void;
type InletH = *mut c_void;
type OutletH = *mut c_void;
type Xml = *mut c_void;

/// `lsl_channel_format_t`.
pub const CF_FLOAT32: c_int = 1;
pub const CF_STRING: c_int = 3;
/// `lsl_processing_options_t::proc_clocksync`: liblsl adds the estimated clock offset to
/// every time stamp, so samples carry times on this machine's LSL clock.
pub const PROC_CLOCKSYNC: u32 = 1;
/// `lsl_error_code_t`.
pub const LSL_TIMEOUT_ERROR: i32 = -1;
pub const LSL_LOST_ERROR: i32 = -2;
/// `LSL_IRREGULAR_RATE`.
pub const IRREGULAR_RATE: f64 = 0.0;

/// Why an LSL call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LslError {
    #[error("liblsl not found ({tried}); it is needed for lsl:// inputs and outputs. Run ./setup.sh (it installs the pylsl wheel, which bundles liblsl), or `python3 -m pip install pylsl`, or point TRIGD_LIBLSL at liblsl.so")]
    NotFound { tried: String },
    #[error("{path}: not a usable liblsl: missing symbol {symbol}")]
    Symbol { path: String, symbol: String },
    #[error("the LSL stream was lost")]
    Lost,
    #[error("LSL call timed out")]
    Timeout,
    #[error("liblsl: {call} failed (error code {code})")]
    Code { call: &'static str, code: i32 },
    #[error("liblsl: {0}")]
    Other(String),
}

fn check(call: &'static str, ec: i32) -> Result<(), LslError> {
    match ec {
        0 => Ok(()),
        LSL_TIMEOUT_ERROR => Err(LslError::Timeout),
        LSL_LOST_ERROR => Err(LslError::Lost),
        code => Err(LslError::Code { call, code }),
    }
}

macro_rules! api {
    ($($name:ident : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The bound functions of a loaded liblsl.
        #[allow(non_snake_case)]
        pub struct Api {
            _lib: libloading::Library,
            /// The file the library was loaded from.
            pub path: String,
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Api {
            fn bind(lib: libloading::Library, path: String) -> Result<Api, LslError> {
                // SAFETY: each symbol is looked up with the C signature lsl_c.h declares.
                unsafe {
                    $(
                        let $name = *lib
                            .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|_| LslError::Symbol {
                                path: path.clone(),
                                symbol: stringify!($name).into(),
                            })?;
                    )*
                    Ok(Api { _lib: lib, path, $($name,)* })
                }
            }
        }
    };
}

api! {
    lsl_library_version: fn() -> i32;
    lsl_local_clock: fn() -> c_double;
    lsl_destroy_string: fn(*mut c_char);
    lsl_resolve_bypred: fn(*mut Info, u32, *const c_char, i32, c_double) -> i32;
    lsl_create_streaminfo: fn(*const c_char, *const c_char, i32, c_double, c_int, *const c_char) -> Info;
    lsl_destroy_streaminfo: fn(Info);
    lsl_get_xml: fn(Info) -> *mut c_char;
    lsl_get_desc: fn(Info) -> Xml;
    lsl_append_child: fn(Xml, *const c_char) -> Xml;
    lsl_append_child_value: fn(Xml, *const c_char, *const c_char) -> Xml;
    lsl_create_outlet: fn(Info, i32, i32) -> OutletH;
    lsl_destroy_outlet: fn(OutletH);
    lsl_push_sample_ftp: fn(OutletH, *const f32, c_double, i32) -> i32;
    lsl_push_sample_strtp: fn(OutletH, *const *const c_char, c_double, i32) -> i32;
    lsl_have_consumers: fn(OutletH) -> i32;
    lsl_wait_for_consumers: fn(OutletH, c_double) -> i32;
    lsl_create_inlet: fn(Info, i32, i32, i32) -> InletH;
    lsl_destroy_inlet: fn(InletH);
    lsl_get_fullinfo: fn(InletH, c_double, *mut i32) -> Info;
    lsl_open_stream: fn(InletH, c_double, *mut i32);
    lsl_set_postprocessing: fn(InletH, u32) -> i32;
    lsl_time_correction: fn(InletH, c_double, *mut i32) -> c_double;
    lsl_pull_sample_f: fn(InletH, *mut f32, i32, c_double, *mut i32) -> c_double;
    lsl_pull_chunk_f: fn(InletH, *mut f32, *mut c_double, c_ulong, c_ulong, c_double, *mut i32) -> c_ulong;
}

// SAFETY: liblsl's functions are thread-safe for distinct handles; the table itself is
// immutable after loading.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

fn candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for var in ["TRIGD_LIBLSL", "PYLSL_LIB"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            v.push(PathBuf::from(p));
        }
    }
    v.push("liblsl.so.2".into());
    v.push("liblsl.so".into());
    if let Some(dir) = pylsl_dir() {
        v.push(dir.join("lib").join("liblsl.so.2"));
        v.push(dir.join("lib").join("liblsl.so"));
    }
    v
}

/// Where the pylsl package is installed, asked of Python (without importing pylsl, which
/// would itself load liblsl).
fn pylsl_dir() -> Option<PathBuf> {
    let python = std::env::var("TRIGD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import importlib.util as u; s = u.find_spec('pylsl'); print(s.submodule_search_locations[0] if s else '')",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let dir = dir.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

fn load() -> Result<Api, LslError> {
    let mut tried = Vec::new();
    for c in candidates() {
        // SAFETY: loading liblsl runs its static initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(&c) } {
            Ok(lib) => {
                let api = Api::bind(lib, c.display().to_string())?;
                tracing::info!(path = %api.path, version = unsafe { (api.lsl_library_version)() }, "liblsl loaded");
                return Ok(api);
            }
            Err(_) => tried.push(c.display().to_string()),
        }
    }
    Err(LslError::NotFound {
        tried: format!("tried {}", tried.join(", ")),
    })
}

/// The loaded library (loaded on first use; the outcome is kept).
pub fn api() -> Result<&'static Api, LslError> {
    static API: OnceLock<Result<Api, LslError>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// liblsl's clock (seconds, monotonic): the time base of every LSL time stamp.
pub fn local_clock(api: &Api) -> f64 {
    // SAFETY: no arguments.
    unsafe { (api.lsl_local_clock)() }
}

fn cstring(s: &str) -> Result<CString, LslError> {
    CString::new(s).map_err(|_| LslError::Other(format!("{s:?} contains a NUL byte")))
}

/// A stream description owned by trigd.
pub struct StreamInfo {
    api: &'static Api,
    h: Info,
}

// SAFETY: a streaminfo handle is a heap object liblsl does not share between threads.
unsafe impl Send for StreamInfo {}

impl StreamInfo {
    /// A new description for an outlet.
    pub fn new(
        api: &'static Api,
        name: &str,
        kind: &str,
        channels: usize,
        rate_hz: f64,
        format: c_int,
        source_id: &str,
    ) -> Result<Self, LslError> {
        let (n, t, s) = (cstring(name)?, cstring(kind)?, cstring(source_id)?);
        let channels =
            i32::try_from(channels).map_err(|_| LslError::Other(format!("{channels} channels")))?;
        // SAFETY: the strings live across the call; liblsl copies them.
        let h = unsafe {
            (api.lsl_create_streaminfo)(
                n.as_ptr(),
                t.as_ptr(),
                channels,
                rate_hz,
                format,
                s.as_ptr(),
            )
        };
        if h.is_null() {
            return Err(LslError::Other(format!(
                "cannot describe stream {name:?} ({channels} channels at {rate_hz} Hz)"
            )));
        }
        Ok(Self { api, h })
    }

    /// The description as liblsl writes it (`<info>...</info>`).
    pub fn xml(&self) -> Result<String, LslError> {
        // SAFETY: valid handle; the returned string is freed with lsl_destroy_string.
        unsafe {
            let p = (self.api.lsl_get_xml)(self.h);
            if p.is_null() {
                return Err(LslError::Other("lsl_get_xml returned nothing".into()));
            }
            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
            (self.api.lsl_destroy_string)(p);
            Ok(s)
        }
    }

    /// Adds `desc/channels/channel/{label,unit,type}` for each label.
    pub fn describe_channels(
        &self,
        labels: &[String],
        unit: &str,
        kind: &str,
    ) -> Result<(), LslError> {
        let (c_channels, c_channel, c_label, c_unit, c_type) = (
            cstring("channels")?,
            cstring("channel")?,
            cstring("label")?,
            cstring("unit")?,
            cstring("type")?,
        );
        let (unit, kind) = (cstring(unit)?, cstring(kind)?);
        // SAFETY: the XML handles belong to this streaminfo, alive for the calls.
        unsafe {
            let desc = (self.api.lsl_get_desc)(self.h);
            let chans = (self.api.lsl_append_child)(desc, c_channels.as_ptr());
            for l in labels {
                let l = cstring(l)?;
                let ch = (self.api.lsl_append_child)(chans, c_channel.as_ptr());
                (self.api.lsl_append_child_value)(ch, c_label.as_ptr(), l.as_ptr());
                (self.api.lsl_append_child_value)(ch, c_unit.as_ptr(), unit.as_ptr());
                (self.api.lsl_append_child_value)(ch, c_type.as_ptr(), kind.as_ptr());
            }
        }
        Ok(())
    }

    /// Adds `desc/NAME` with a text value.
    pub fn describe(&self, name: &str, value: &str) -> Result<(), LslError> {
        let (n, v) = (cstring(name)?, cstring(value)?);
        // SAFETY: as in describe_channels.
        unsafe {
            let desc = (self.api.lsl_get_desc)(self.h);
            (self.api.lsl_append_child_value)(desc, n.as_ptr(), v.as_ptr());
        }
        Ok(())
    }
}

impl Drop for StreamInfo {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once.
        unsafe { (self.api.lsl_destroy_streaminfo)(self.h) }
    }
}

/// Resolves at most one stream matching the XPath `predicate`, waiting up to `timeout_s`.
pub fn resolve_one(
    api: &'static Api,
    predicate: &str,
    timeout_s: f64,
) -> Result<Option<StreamInfo>, LslError> {
    let pred = cstring(predicate)?;
    let mut buf: [Info; 1] = [std::ptr::null_mut()];
    // SAFETY: buf has room for the one element passed as its size.
    let n = unsafe { (api.lsl_resolve_bypred)(buf.as_mut_ptr(), 1, pred.as_ptr(), 1, timeout_s) };
    if n < 0 {
        return Err(LslError::Code {
            call: "lsl_resolve_bypred",
            code: n,
        });
    }
    Ok((n > 0 && !buf[0].is_null()).then(|| StreamInfo { api, h: buf[0] }))
}

/// A connection to one stream.
pub struct Inlet {
    api: &'static Api,
    h: InletH,
}

// SAFETY: an inlet is used from one thread at a time (the source thread that owns it).
unsafe impl Send for Inlet {}

impl Inlet {
    /// Opens an inlet on `info` buffering up to `max_buffer_s` seconds, with liblsl's
    /// recovery (a stream with a source id reconnects by itself, keeping the samples
    /// already received; others report [`LslError::Lost`]) and LSL's clock
    /// synchronisation applied to every time stamp.
    pub fn open(info: &StreamInfo, max_buffer_s: i32, timeout_s: f64) -> Result<Self, LslError> {
        let api = info.api;
        // SAFETY: valid streaminfo; liblsl copies it.
        let h = unsafe { (api.lsl_create_inlet)(info.h, max_buffer_s, 0, 1) };
        if h.is_null() {
            return Err(LslError::Other("lsl_create_inlet failed".into()));
        }
        let inlet = Self { api, h };
        let mut ec = 0i32;
        // SAFETY: valid inlet handle and error out-pointer.
        unsafe { (api.lsl_open_stream)(h, timeout_s, &mut ec) };
        check("lsl_open_stream", ec)?;
        // SAFETY: as above.
        let r = unsafe { (api.lsl_set_postprocessing)(h, PROC_CLOCKSYNC) };
        check("lsl_set_postprocessing", r.min(0))?;
        Ok(inlet)
    }

    /// The stream's full description (with `desc`).
    pub fn full_info(&self, timeout_s: f64) -> Result<StreamInfo, LslError> {
        let mut ec = 0i32;
        // SAFETY: valid handle; the returned info is owned by the caller.
        let h = unsafe { (self.api.lsl_get_fullinfo)(self.h, timeout_s, &mut ec) };
        check("lsl_get_fullinfo", ec)?;
        if h.is_null() {
            return Err(LslError::Other("lsl_get_fullinfo returned nothing".into()));
        }
        Ok(StreamInfo { api: self.api, h })
    }

    /// The current clock offset estimate of the stream (seconds to add to its stamps).
    pub fn time_correction(&self, timeout_s: f64) -> Result<f64, LslError> {
        let mut ec = 0i32;
        // SAFETY: valid handle.
        let t = unsafe { (self.api.lsl_time_correction)(self.h, timeout_s, &mut ec) };
        check("lsl_time_correction", ec)?;
        Ok(t)
    }

    /// Waits up to `timeout_s` for one sample into `sample` (the stream's channel count);
    /// returns its time stamp, or `None` on timeout.
    pub fn pull_sample(&self, sample: &mut [f32], timeout_s: f64) -> Result<Option<f64>, LslError> {
        let mut ec = 0i32;
        // SAFETY: the buffer holds sample.len() floats.
        let ts = unsafe {
            (self.api.lsl_pull_sample_f)(
                self.h,
                sample.as_mut_ptr(),
                sample.len() as i32,
                timeout_s,
                &mut ec,
            )
        };
        check("lsl_pull_sample_f", ec)?;
        Ok((ts != 0.0).then_some(ts))
    }

    /// Takes the samples already waiting, up to the buffers' room, without waiting:
    /// `data` multiplexed (sample by sample), one stamp each. Returns the samples taken.
    pub fn pull_chunk(&self, data: &mut [f32], stamps: &mut [f64]) -> Result<usize, LslError> {
        let mut ec = 0i32;
        // SAFETY: the lengths passed are the buffers' lengths.
        let n = unsafe {
            (self.api.lsl_pull_chunk_f)(
                self.h,
                data.as_mut_ptr(),
                stamps.as_mut_ptr(),
                data.len() as c_ulong,
                stamps.len() as c_ulong,
                0.0,
                &mut ec,
            )
        };
        check("lsl_pull_chunk_f", ec)?;
        let per = data.len() / stamps.len().max(1);
        Ok(n as usize / per.max(1))
    }
}

impl Drop for Inlet {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once.
        unsafe { (self.api.lsl_destroy_inlet)(self.h) }
    }
}

/// A stream trigd publishes.
pub struct Outlet {
    api: &'static Api,
    h: OutletH,
    channels: usize,
}

// SAFETY: an outlet is pushed to from one thread at a time (its owner).
unsafe impl Send for Outlet {}

impl Outlet {
    /// Publishes `info` (chunks as pushed; up to `max_buffer_s` seconds kept for slow
    /// consumers).
    pub fn open(info: &StreamInfo, channels: usize, max_buffer_s: i32) -> Result<Self, LslError> {
        // SAFETY: valid info; liblsl copies it.
        let h = unsafe { (info.api.lsl_create_outlet)(info.h, 0, max_buffer_s) };
        if h.is_null() {
            return Err(LslError::Other("lsl_create_outlet failed".into()));
        }
        Ok(Self {
            api: info.api,
            h,
            channels,
        })
    }

    /// Pushes one numeric sample stamped `ts` (LSL clock), sent at once.
    pub fn push_f32(&self, sample: &[f32], ts: f64) -> Result<(), LslError> {
        if sample.len() != self.channels {
            return Err(LslError::Other(format!(
                "sample of {} values for a {}-channel outlet",
                sample.len(),
                self.channels
            )));
        }
        // SAFETY: the sample holds `channels` floats, as the outlet was declared.
        let r = unsafe { (self.api.lsl_push_sample_ftp)(self.h, sample.as_ptr(), ts, 1) };
        check("lsl_push_sample_ftp", r)
    }

    /// Pushes one string marker (one-channel string outlet), NUL-terminated in `text`.
    pub fn push_marker(&self, text: &CStr, ts: f64) -> Result<(), LslError> {
        let ptrs = [text.as_ptr()];
        // SAFETY: one valid C string for a one-channel string outlet.
        let r = unsafe { (self.api.lsl_push_sample_strtp)(self.h, ptrs.as_ptr(), ts, 1) };
        check("lsl_push_sample_strtp", r)
    }

    pub fn have_consumers(&self) -> bool {
        // SAFETY: valid handle.
        unsafe { (self.api.lsl_have_consumers)(self.h) > 0 }
    }

    /// Waits up to `timeout_s` for a consumer; true when one is connected.
    pub fn wait_for_consumers(&self, timeout_s: f64) -> bool {
        // SAFETY: valid handle.
        unsafe { (self.api.lsl_wait_for_consumers)(self.h, timeout_s) > 0 }
    }
}

impl Drop for Outlet {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once.
        unsafe { (self.api.lsl_destroy_outlet)(self.h) }
    }
}
