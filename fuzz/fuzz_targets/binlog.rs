//! Fuzzes the binary decision log reader and the single-record decoder (UDP stream).
#![no_main]

use libfuzzer_sys::fuzz_target;
use trigd::sinks::binlog::{decode_record, encode_header, encode_record, parse_binlog};

fuzz_target!(|data: &[u8]| {
    if let Ok((names, decisions)) = parse_binlog(data) {
        // Whatever parses must re-encode to the same bytes (one encoding per log).
        let mut out = encode_header(&names).expect("parsed names re-encode");
        for d in &decisions {
            out.extend_from_slice(&encode_record(d).expect("parsed record re-encodes"));
        }
        assert_eq!(out, data);
    }
    if let Ok(d) = decode_record(data) {
        assert_eq!(
            encode_record(&d).expect("decoded record re-encodes")[..],
            data[..]
        );
    }
});
