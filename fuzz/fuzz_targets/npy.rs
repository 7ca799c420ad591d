//! Fuzz the NPY reader used for the lead field, source positions and noise covariance,
//! and the inverse-kernel cache parser: any bytes must give a value or an error.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = trigd::eeg::inputs::parse_npy(data, Path::new("fuzz.npy"));
    let _ = trigd::eeg::kernel::InverseKernel::parse_cache(data, Path::new("fuzz.bin"));
});
