//! Fuzz the trigger-line configuration parser: any text gives lines or an error, never a
//! panic; accepted lines evaluate on an empty event.
//! The body is `trigd::fuzz::trigger_lines`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::trigger_lines(data));
