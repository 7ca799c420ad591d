//! Fuzzes the EDF/BDF reader: header validation, annotations (TALs) and block decoding
//! on arbitrary bytes must return errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = trigd::eeg::edf::EdfReader::from_bytes(data.to_vec()) {
        let _ = reader.annotations();
        let signals = reader.data_signals();
        for &s in &signals {
            let n = reader.header().n_samples(s).min(256);
            let mut out = vec![0.0; n];
            let _ = reader.read_signal(s, 0, &mut out);
        }
        if let Ok(mut blocks) = reader.blocks(&signals, 31) {
            let mut buf = Vec::new();
            let mut n_blocks = 0;
            while let Ok(Some(_)) = blocks.next_f32(&mut buf) {
                n_blocks += 1;
                if n_blocks > 64 {
                    break;
                }
            }
        }
    }
});
