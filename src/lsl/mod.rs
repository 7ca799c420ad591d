//! Lab Streaming Layer: how EEG labs move samples and markers between programs. trigd takes
//! EEG from an LSL stream (`--listen lsl://type=EEG`, [`crate::sources::lsl`]), publishes
//! its decisions as an LSL marker stream ([`crate::sinks::lsl`]) and plays recordings as
//! an LSL outlet (`trigd send --to lsl://...`).
//!
//! - [`ffi`]: liblsl's C API, loaded at run time (the binary needs no liblsl until an
//!   `lsl://` address is used).
//! - [`url`]: `lsl://` addresses (stream predicate and trigd's options).
//! - [`meta`]: a stream's description and the channel plan (by label, never by position).
//! - [`play`]: `trigd send --to lsl://...`, a recording played as an LSL amplifier.
//!
//! Time: LSL stamps samples in seconds of liblsl's monotonic clock; trigd's frames carry
//! nanoseconds since the Unix epoch. [`Clock`] maps one onto the other with one offset
//! taken once per process, so a time stamp goes from LSL to a frame and back to a marker
//! exactly (to the nanosecond).

pub mod ffi;
pub mod meta;
pub mod play;
pub mod url;

use std::sync::OnceLock;

pub use ffi::LslError;

/// The fixed offset between liblsl's clock and the Unix epoch, taken once.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    unix0_ns: u64,
    lsl0_s: f64,
}

impl Clock {
    /// The process's clock map (taken on first use).
    pub fn get(api: &ffi::Api) -> Clock {
        static CLOCK: OnceLock<Clock> = OnceLock::new();
        *CLOCK.get_or_init(|| {
            let lsl0_s = ffi::local_clock(api);
            let unix0_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            Clock { unix0_ns, lsl0_s }
        })
    }

    /// A clock map with explicit origins (tests).
    pub fn with_origin(unix0_ns: u64, lsl0_s: f64) -> Clock {
        Clock { unix0_ns, lsl0_s }
    }

    /// LSL seconds to Unix nanoseconds (0 for times before the epoch).
    pub fn to_unix_ns(&self, lsl_s: f64) -> u64 {
        let d_ns = ((lsl_s - self.lsl0_s) * 1e9).round();
        if !d_ns.is_finite() {
            return 0;
        }
        (self.unix0_ns as i128 + d_ns as i128).clamp(0, u64::MAX as i128) as u64
    }

    /// Unix nanoseconds to LSL seconds.
    pub fn to_lsl_s(&self, unix_ns: u64) -> f64 {
        self.lsl0_s + (unix_ns as i128 - self.unix0_ns as i128) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_go_to_frames_and_back_to_the_nanosecond() {
        let c = Clock::with_origin(1_795_000_000_123_456_789, 81_234.5);
        for lsl in [81_234.5, 81_300.000_000_5, 90_000.123_456_789, 81_000.0] {
            let ns = c.to_unix_ns(lsl);
            assert!((c.to_lsl_s(ns) - lsl).abs() < 1e-9, "{lsl}");
        }
        assert_eq!(c.to_unix_ns(81_235.5), 1_795_000_001_123_456_789);
    }
}
