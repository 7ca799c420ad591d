//! Replays every committed fuzz corpus (`fuzz/corpus/TARGET/*`) through the fuzz targets'
//! own entry points (`trigd::fuzz`), with no fuzzer: each input found by a campaign keeps
//! being checked on every `cargo test`, so a parser change that panics on one of them, or
//! breaks a round trip the target asserts, fails here.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn names_in(dir: &Path, ext: Option<&str>) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn every_fuzz_target_calls_its_entry_point_and_has_a_corpus() {
    let registered: BTreeSet<String> = trigd::fuzz::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    let targets = names_in(&fuzz_dir().join("fuzz_targets"), Some("rs"));
    assert_eq!(
        targets, registered,
        "fuzz/fuzz_targets/ and trigd::fuzz::TARGETS differ"
    );
    let corpora = names_in(&fuzz_dir().join("corpus"), None);
    assert_eq!(
        corpora, registered,
        "fuzz/corpus/ and trigd::fuzz::TARGETS differ"
    );
    for name in &targets {
        let path = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let body = std::fs::read_to_string(&path).unwrap();
        assert!(
            body.contains(&format!("trigd::fuzz::{name}(data)")),
            "{} must call trigd::fuzz::{name}, the function the corpus replay calls",
            path.display()
        );
    }
}

#[test]
fn committed_corpora_replay_without_a_finding() {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut n_total = 0;
    for &(name, entry) in trigd::fuzz::TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: empty corpus", dir.display());
        for file in &files {
            let data = std::fs::read(file).unwrap();
            if catch_unwind(AssertUnwindSafe(|| entry(&data))).is_err() {
                failures.push(file.display().to_string());
            }
        }
        n_total += files.len();
    }
    eprintln!(
        "replayed {n_total} corpus inputs of {} targets in {:.2?}",
        trigd::fuzz::TARGETS.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "fuzz corpus inputs that fail their target (reproduce with \
         `cargo fuzz run TARGET FILE` in fuzz/):\n{}",
        failures.join("\n")
    );
}
