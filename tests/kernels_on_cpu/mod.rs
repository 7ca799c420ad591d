//! What the tests that run a GPU kernel's source on the CPU share
//! (`tests/clones_kernel_on_cpu.rs`, `tests/candidate_kernels_on_cpu.rs`,
//! `tests/fit_kernel_on_cpu.rs`, `tests/first_pass_kernels_on_cpu.rs`,
//! `tests/packed_steps_kernels_on_cpu.rs`): compiling a harness of this folder with the
//! C++ compiler (`g++`, installed by `./setup.sh`; `CXX` overrides) without contraction,
//! as NVRTC's
//! `--fmad=false`, and writing a kernel argument as the raw little-endian array the
//! harness reads (`args.h`), and reading its outputs back.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use zerocopy::{Immutable, IntoBytes};

/// The compiler.
fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".into())
}

/// Starts compiling the harness `source` (a file of this folder) into `name` under the
/// test's temporary directory, with the macro definitions `defines` (`-D` each); the
/// binary's path and the compiler's process, for [`finish`].
pub fn start(source: &str, name: &str, defines: &[String]) -> (PathBuf, Child) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let child = Command::new(cxx())
        .args(["-O2", "-std=c++20", "-ffp-contract=off", "-pthread"])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&out)
        .arg(root.join("tests/kernels_on_cpu").join(source))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): run ./setup.sh", cxx()));
    (out, child)
}

/// Waits for a compilation of [`start`]; the binary.
pub fn finish((out, mut child): (PathBuf, Child)) -> PathBuf {
    let status = child.wait().expect("the compiler");
    assert!(
        status.success(),
        "{} could not compile {}",
        cxx(),
        out.display()
    );
    out
}

/// The harness's output `name` in `dir`, as little-endian 32-bit words.
pub fn read_words(dir: &Path, name: &str) -> Vec<u32> {
    std::fs::read(dir.join(name))
        .unwrap_or_else(|e| panic!("the harness's {name}: {e}"))
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Writes `values` as the harness's argument `name` in `dir`.
pub fn write_arg<T: IntoBytes + Immutable>(dir: &Path, name: &str, values: &[T]) {
    std::fs::write(dir.join(name), values.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
}
