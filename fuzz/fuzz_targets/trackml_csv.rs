//! Fuzzes the TrackML-style CSV parsers (hits, truth, particles, submission).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trigd::tracking::trackml::fuzz_parsers(data);
});
