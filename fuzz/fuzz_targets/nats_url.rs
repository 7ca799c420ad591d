//! Fuzz the farm's `nats://HOST:PORT/STREAM` address parser and the subject and name
//! checks: any text gives an address or an error, never a panic; a parsed address prints
//! to one that parses back to the same value.
//! The body is `trigd::fuzz::nats_url`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::nats_url(data));
