//! Fuzzes the binary decision log reader and the single-record decoder (UDP stream).
//! The body is `trigd::fuzz::binlog`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::binlog(data));
