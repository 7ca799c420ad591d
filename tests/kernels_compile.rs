//! Every GPU kernel module compiles with NVRTC, with the options its engine loads it with,
//! for the architectures trigd runs on, and its device code holds every kernel the engine
//! looks up. This needs NVRTC but no GPU or driver, so it runs on every machine `setup.sh`
//! prepared (it installs NVRTC where there is none): a kernel that does not compile, or a
//! kernel renamed or left out, fails here rather than on the first GPU it meets.

use std::collections::BTreeSet;

use trigd::gpu::nvrtc::compile_for_arch;
use trigd::gpu::{kernel_modules, GpuError};

/// Ampere (A100) and Hopper (H100, H200): the oldest architecture the EEG kernels' fast
/// path takes and the one the benchmarks run on.
const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The kernels an engine's file looks up (`function("name")`).
fn kernels_looked_up(engine: &str) -> BTreeSet<String> {
    let path = format!("{}/{engine}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut names = BTreeSet::new();
    let pattern = "function(\"";
    let mut rest = text.as_str();
    while let Some(at) = rest.find(pattern) {
        rest = &rest[at + pattern.len()..];
        let end = rest.find('"').expect("a closing quote");
        names.insert(rest[..end].to_string());
        rest = &rest[end..];
    }
    names
}

/// Whether the cubin's symbols include `name` (a whole entry of its string table: after a
/// NUL or a section prefix's dot, before a NUL).
fn has_symbol(cubin: &[u8], name: &str) -> bool {
    let n = name.len();
    cubin
        .windows(n + 2)
        .any(|w| (w[0] == 0 || w[0] == b'.') && &w[1..=n] == name.as_bytes() && w[n + 1] == 0)
}

fn nvrtc_missing(e: &GpuError) -> String {
    format!("{e}: run ./setup.sh, which installs NVRTC where there is none")
}

#[test]
fn every_kernel_module_compiles_for_the_gpus_trigd_runs_on_and_holds_its_kernels() {
    let modules = kernel_modules();
    assert_eq!(modules.len(), 4);
    // The modules and architectures compile at once, one thread each (the finder's
    // module is most of the time).
    let jobs: Vec<(usize, &str)> = (0..modules.len())
        .flat_map(|m| ARCHS.iter().map(move |&a| (m, a)))
        .collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&(m, arch)| {
                let module = &modules[m];
                s.spawn(move || compile_for_arch(module.name, &module.source, arch, module.options))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(m, arch), result) in jobs.iter().zip(results) {
        let module = &modules[m];
        let cubin = match result {
            Ok(c) => c,
            Err(e @ GpuError::MissingLibrary { .. }) => panic!("{}", nvrtc_missing(&e)),
            Err(e) => panic!("{} for {arch}: {e}", module.name),
        };
        assert_eq!(
            &cubin[..4],
            b"\x7fELF",
            "{} for {arch}: not an ELF image",
            module.name
        );
        let kernels = kernels_looked_up(module.engine);
        assert!(
            !kernels.is_empty(),
            "{}: no kernel looked up",
            module.engine
        );
        let missing: Vec<_> = kernels.iter().filter(|k| !has_symbol(&cubin, k)).collect();
        assert!(
            missing.is_empty(),
            "{} for {arch} lacks kernels {} looks up: {missing:?}",
            module.name,
            module.engine
        );
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_that_names_its_line() {
    let source = "extern \"C\" __global__ void k(float* x) {\n    x[0] = not_declared;\n}\n";
    match compile_for_arch("broken.cu", source, "sm_90", &[]) {
        Err(GpuError::Compile { kernel, log }) => {
            assert_eq!(kernel, "broken.cu");
            assert!(log.contains("broken.cu(2)"), "{log}");
            assert!(log.contains("not_declared"), "{log}");
        }
        Err(e @ GpuError::MissingLibrary { .. }) => panic!("{}", nvrtc_missing(&e)),
        other => panic!("expected a compile error, got {:?}", other.map(|c| c.len())),
    }
    // A kernel the engine would look up under another name is not found in the image.
    let cubin = compile_for_arch(
        "renamed.cu",
        "extern \"C\" __global__ void ca_pairs_changed(float* x) { x[0] = 1.0f; }\n",
        "sm_90",
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(has_symbol(&cubin, "ca_pairs_changed"));
    assert!(!has_symbol(&cubin, "ca_pairs"));
    assert!(!has_symbol(&cubin, "pairs_changed"));
}
