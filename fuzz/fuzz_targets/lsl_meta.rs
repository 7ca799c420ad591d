//! Fuzzes the `lsl://` address parser and the LSL stream description reader with its
//! channel plan: errors, never panics, and a plan never shifts a channel.
//! The body is `trigd::fuzz::lsl_meta`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::lsl_meta(data));
