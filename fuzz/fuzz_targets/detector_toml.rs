//! Fuzzes the detector description parser and the NPY field-map reader.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = trigd::tracking::geometry::Detector::from_toml_str(text, "fuzz.toml");
    }
    let _ = trigd::tracking::field::FieldMap::from_npy_bytes(data, [0.0; 3], [1.0; 3]);
});
