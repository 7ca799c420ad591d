//! Fuzzes `frame::parse` (and `peek_header`, which framing on TCP relies on): never a
//! panic, and whatever parses must agree with its own header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trigd::frame;

fuzz_target!(|data: &[u8]| {
    let peeked = frame::peek_header(data).is_ok();
    if let Ok(view) = frame::parse(data) {
        assert!(peeked, "parse accepted what peek_header refused");
        assert_eq!(
            frame::HEADER_LEN + view.header.payload_len.get() as usize,
            data.len()
        );
    }
});
