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
use std::sync::OnceLock;

use trigd::gpu::tracking_clones::{check_batch, pack_batch, BatchArrays, CloneLimits, CloneTrack};
use trigd::gpu::tracking_fit::FitTables;
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
        .args(["-O2", "-std=c++20", "-ffp-contract=off"])
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

/// The harness `source` compiled into `name` once per test run (`cell`: the caller's).
pub fn compiled(cell: &'static OnceLock<PathBuf>, source: &str, name: &str) -> &'static Path {
    compiled_with(cell, source, name, &[])
}

/// The same, with the macro definitions `defines` (`-D` each), such as a smaller limit
/// that sends more events down a kernel's rarer path.
pub fn compiled_with(
    cell: &'static OnceLock<PathBuf>,
    source: &str,
    name: &str,
    defines: &[&str],
) -> &'static Path {
    cell.get_or_init(|| {
        let defines: Vec<String> = defines.iter().map(|d| d.to_string()).collect();
        finish(start(source, name, &defines))
    })
}

/// Writes the fit's tables as the harnesses read them (`read_fit_tables` in `args.h`).
pub fn write_fit_tables(dir: &Path, t: &FitTables) {
    write_arg(dir, "rows32", &t.rows32);
    write_arg(dir, "rows64", &t.rows64);
    write_arg(dir, "gap_steps", &t.gap_steps);
    write_arg(dir, "gap_kind", &t.gap_kind);
    write_arg(dir, "gap_slice", &t.gap_slice);
    write_arg(dir, "slices", &t.slices);
    write_arg(dir, "floats", &t.floats);
    write_arg(dir, "doubles", &t.doubles);
    write_arg(dir, "ints", &t.ints);
    write_arg(dir, "nodes", &t.nodes);
}

/// Writes the settings of the tracks' own fit (`read_track_fit` in `args.h`): those of
/// `track` where there is one, else the candidates' `t`.
pub fn write_track_fit(dir: &Path, t: &FitTables, track: Option<&FitTables>) {
    let t = track.unwrap_or(t);
    write_arg(dir, "track_floats", &t.floats);
    write_arg(dir, "track_doubles", &t.doubles);
    write_arg(dir, "track_ints", &t.ints);
}

/// Runs the harness `binary` on the arguments in `dir`; panics with its error output where
/// it fails (a crash, a mismatch of the arguments it read, an output it could not write).
pub fn run(binary: &Path, dir: &Path) {
    let out = Command::new(binary)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): {}",
        binary.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The events' input hits as the engine uploads them (each event's from its first), and
/// each sorted hit's input index from the same first (a sorted hit is one of the event's
/// inputs, so the events' sorted ranges fit in their input ranges).
#[derive(Default)]
pub struct InputHits {
    pub hit_start: Vec<u32>,
    pub in_x: Vec<f32>,
    pub in_y: Vec<f32>,
    pub in_plane: Vec<u32>,
    pub sinput: Vec<u32>,
}

impl InputHits {
    /// Appends an event's hits and its sorted hits' input indices; the event's first.
    pub fn push(&mut self, hits: &[trigd::frame::HitRecord], sorted_input: &[u32]) -> usize {
        let start = self.in_x.len();
        self.hit_start.push(start as u32);
        self.in_x.extend(hits.iter().map(|h| h.x_mm));
        self.in_y.extend(hits.iter().map(|h| h.y_mm));
        self.in_plane.extend(hits.iter().map(|h| h.plane as u32));
        assert!(sorted_input.len() <= hits.len());
        self.sinput.extend_from_slice(sorted_input);
        self.sinput.resize(start + hits.len(), u32::MAX);
        start
    }

    /// Writes them as the harnesses read them: `hit_start` (with the end after the last
    /// event where `closed`), `in_x`, `in_y`, `in_plane`, `sinput`.
    pub fn write(&self, dir: &Path, closed: bool) {
        let mut hit_start = self.hit_start.clone();
        if closed {
            hit_start.push(self.in_x.len() as u32);
        }
        write_arg(dir, "hit_start", &hit_start);
        write_arg(dir, "in_x", &self.in_x);
        write_arg(dir, "in_y", &self.in_y);
        write_arg(dir, "in_plane", &self.in_plane);
        write_arg(dir, "sinput", &self.sinput);
    }
}

/// The clone step's input arrays as its host packer (`pack_batch`) lays out a batch.
pub struct CloneBatch {
    pub event_start: Vec<u32>,
    pub track_hit_start: Vec<u32>,
    pub hit_plane: Vec<u32>,
    pub hit_x: Vec<f32>,
    pub hit_y: Vec<f32>,
    pub fits: Vec<f64>,
}

/// `batch` packed by the clone step's host packer, for a detector of `n_planes` (at most
/// 16,384 tracks an event, 64 hits a track).
pub fn clone_batch(batch: &[&[CloneTrack]], n_planes: usize) -> CloneBatch {
    let limits = CloneLimits {
        max_events: batch.len().max(1),
        max_tracks_per_event: 1 << 14,
        max_hits_per_track: 64,
    };
    let shape = check_batch(&limits, n_planes, batch).expect("batch within limits");
    let mut b = CloneBatch {
        event_start: vec![0; shape.n_events + 1],
        track_hit_start: vec![0; shape.n_tracks + 1],
        hit_plane: vec![0; shape.n_hits],
        hit_x: vec![0.0; shape.n_hits],
        hit_y: vec![0.0; shape.n_hits],
        fits: vec![0.0; shape.n_tracks * trigd::gpu::tracking_clones::FIT_WORDS],
    };
    pack_batch(
        batch,
        shape,
        BatchArrays {
            event_start: &mut b.event_start,
            track_hit_start: &mut b.track_hit_start,
            hit_plane: &mut b.hit_plane,
            hit_x: &mut b.hit_x,
            hit_y: &mut b.hit_y,
            fits: &mut b.fits,
        },
    );
    b
}
