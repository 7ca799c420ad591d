//! Fuzzes the detector description parser and the NPY field-map reader.
//! The body is `trigd::fuzz::detector_toml`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::detector_toml(data));
