//! Fuzzes the TrackML-style CSV parsers (hits, truth, particles, submission).
//! The body is `trigd::fuzz::trackml_csv`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::trackml_csv(data));
