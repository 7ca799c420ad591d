//! Fuzzes the kernel-cache entry parser: any bytes found in the cache directory must give
//! a value or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(image) = trigd::gpu::nvrtc::decode_cache_entry(data) {
        // Whatever parses must encode back to the same bytes.
        assert_eq!(trigd::gpu::nvrtc::encode_cache_entry(&image), data);
    }
});
