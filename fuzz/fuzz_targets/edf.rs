//! Fuzzes the EDF/BDF reader: header validation, annotations (TALs) and block decoding
//! on arbitrary bytes must return errors, never panic.
//! The body is `trigd::fuzz::edf`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::edf(data));
