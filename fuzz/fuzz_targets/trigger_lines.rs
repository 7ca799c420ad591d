//! Fuzz the trigger-line configuration parser: any text gives lines or an error, never a
//! panic; accepted lines evaluate on an empty event.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(lines) = trigd::tracking::lines::parse_lines(text) {
            assert!(lines.len() <= trigd::tracking::lines::MAX_LINES);
            let _ = trigd::tracking::lines::evaluate(&lines, &[]);
        }
    }
});
