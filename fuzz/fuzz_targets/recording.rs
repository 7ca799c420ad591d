//! Fuzzes the recording reader (`Recording::from_bytes`, the same checks as
//! `Recording::open` without the file): never a panic, and every frame it hands out lies in
//! the input and has a valid frame header. The input is read twice: as a whole file, and
//! behind a valid file header so the fuzzer reaches the record, index and trailer parsing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trigd::{frame, recording};

fn check(bytes: Vec<u8>) {
    if let Ok(rec) = recording::Recording::from_bytes(bytes) {
        for (i, f) in rec.iter().enumerate() {
            assert!(frame::peek_header(f).is_ok());
            assert_eq!(rec.entry(i).len_bytes as usize, f.len());
        }
        if let Some(t) = rec.torn_tail() {
            assert!(t.usable_len_bytes <= t.file_len_bytes);
        }
        let _ = rec.index_at_or_after_timestamp(u64::MAX / 2);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data.to_vec());
    let mut with_header = recording::encode_file_header(0, 0).to_vec();
    with_header.extend_from_slice(data);
    check(with_header);
});
