//! Fuzz the `[finder]` overrides parser and the reconstruction on arbitrary hits: any
//! input gives a configuration or an error, and any hits give tracks, never a panic.
//! The body is `trigd::fuzz::finder_overrides`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::finder_overrides(data));
