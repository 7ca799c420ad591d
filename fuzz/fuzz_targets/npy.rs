//! Fuzz the NPY reader used for the lead field, source positions and noise covariance,
//! and the inverse-kernel cache parser: any bytes must give a value or an error.
//! The body is `trigd::fuzz::npy`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::npy(data));
