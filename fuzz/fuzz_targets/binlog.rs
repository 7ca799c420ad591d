//! Fuzzes the binary decision log reader and the single-record decoder (UDP stream).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((names, decisions)) = trigd::sinks::binlog::parse_binlog(data) {
        // Whatever parses must re-encode to the same bytes.
        let mut out = trigd::sinks::binlog::encode_header(&names).expect("parsed names re-encode");
        for d in &decisions {
            let r = trigd::sinks::binlog::DecisionRecord::from_decision(d)
                .expect("parsed record re-encodes");
            out.extend_from_slice(zerocopy::IntoBytes::as_bytes(&r));
        }
        assert_eq!(out, data);
    }
    let _ = trigd::sinks::binlog::decode_record(data);
});
