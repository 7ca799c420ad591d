//! Build metadata for `trigd_build_info`: the git commit and the rustc version, passed to
//! the crate as `TRIGD_GIT_COMMIT` and `TRIGD_RUSTC_VERSION` ("unknown" when not available,
//! e.g. building from a source tarball).

use std::path::Path;
use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TRIGD_GIT_COMMIT");
    let commit = std::env::var("TRIGD_GIT_COMMIT")
        .ok()
        .or_else(|| output("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Rebuild when HEAD moves: watch HEAD and the branch ref it points to, if they exist
    // (watching a missing path would rerun this script on every build).
    for git_path in ["HEAD", "packed-refs"] {
        if let Some(p) = output("git", &["rev-parse", "--git-path", git_path]) {
            if Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    if let Some(head_ref) = output("git", &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = output("git", &["rev-parse", "--git-path", &head_ref]) {
            if Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version = output(&rustc, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TRIGD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=TRIGD_RUSTC_VERSION={rustc_version}");
}
