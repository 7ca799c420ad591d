//! Fuzzes the kernel-cache entry parser: any bytes found in the cache directory must give
//! a value or an error, never a panic.
//! The body is `trigd::fuzz::kernel_cache_entry`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::kernel_cache_entry(data));
