//! Fuzzes `frame::parse` (and `peek_header`, which framing on TCP relies on): never a
//! panic, and whatever parses must agree with its own header.
//! The body is `trigd::fuzz::frame`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::frame(data));
