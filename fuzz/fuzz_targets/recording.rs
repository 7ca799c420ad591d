//! Fuzzes the recording reader (`Recording::from_bytes`, the same checks as
//! `Recording::open` without the file): never a panic, and every frame it hands out lies in
//! the input and has a valid frame header. The input is read twice: as a whole file, and
//! behind a valid file header so the fuzzer reaches the record, index and trailer parsing.
//! The body is `trigd::fuzz::recording`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::recording(data));
