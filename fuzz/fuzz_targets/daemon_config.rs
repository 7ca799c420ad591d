//! Fuzzes the daemon's configuration file parser and its checks.
//! The body is `trigd::fuzz::daemon_config`, which the corpus replay test also calls.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trigd::fuzz::daemon_config(data));
