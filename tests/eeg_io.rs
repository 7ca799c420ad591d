//! EEG input against other software: EDF/BDF files written by pyEDFlib's and MNE-Python's
//! writers, read back and compared value by value with what pyEDFlib and MNE read
//! (references made by `fixtures/edf/make_refs.py`); filter coefficients and block-wise
//! filtering against SciPy (`fixtures/filter/make_refs.py`); `trigd simulate eeg` end to end.

// Index loops mirror the layouts of the reference arrays they compare against.
#![allow(clippy::needless_range_loop)]

use std::path::{Path, PathBuf};

use npyz::WriterBuilder;
use rand::{Rng, SeedableRng};
use trigd::eeg::edf::{EdfFormat, EdfReader};
use trigd::eeg::filter::{butter, iirnotch, Band, BlockFilter, Section};
use trigd::eeg::simulate::read_npy_f64;

fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(sub)
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn edf_stems() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(fixtures("edf"))
        .expect("fixtures/edf")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("edf" | "bdf")))
        .map(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .expect("stem")
                .to_string()
        })
        .collect();
    stems.sort();
    assert!(
        stems.len() >= 4,
        "expected the committed EDF/BDF fixtures, found {stems:?}"
    );
    stems
}

fn open(stem: &str) -> (EdfReader, serde_json::Value) {
    let meta = json(&fixtures("edf").join(format!("{stem}.json")));
    let file = fixtures("edf").join(meta["file"].as_str().expect("file"));
    (
        EdfReader::open(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
        meta,
    )
}

#[test]
fn edf_headers_match_pyedflib() {
    for stem in edf_stems() {
        let (r, meta) = open(&stem);
        let data = r.data_signals();
        let labels: Vec<&str> = data
            .iter()
            .map(|&i| r.header().signals[i].label.as_str())
            .collect();
        let want: Vec<&str> = meta["labels"]
            .as_array()
            .expect("labels")
            .iter()
            .map(|v| v.as_str().expect("str"))
            .collect();
        assert_eq!(labels, want, "{stem}");
        let rates = f64s(&meta["sample_rates_hz"]);
        let n = f64s(&meta["n_samples"]);
        for (k, &i) in data.iter().enumerate() {
            assert_eq!(r.header().sample_rate_hz(i), rates[k], "{stem} signal {k}");
            assert_eq!(r.header().n_samples(i) as f64, n[k], "{stem} signal {k}");
            assert_eq!(
                r.header().signals[i].physical_dimension,
                meta["dimensions"][k].as_str().expect("dim")
            );
        }
        let expect_format = if stem.contains("bdf") || r.header().format == EdfFormat::Bdf {
            EdfFormat::Bdf
        } else {
            EdfFormat::Edf
        };
        assert_eq!(r.header().format, expect_format);
    }
}

fn slices_of(meta: &serde_json::Value) -> Vec<(usize, usize)> {
    meta["ranges"]
        .as_array()
        .expect("ranges")
        .iter()
        .map(|r| {
            (
                r[0].as_u64().expect("a") as usize,
                r[1].as_u64().expect("b") as usize,
            )
        })
        .collect()
}

/// pyEDFlib scales as `bitvalue * (offset + digital)` with `offset = phys_max / bitvalue -
/// dig_max`, which loses a few digits to cancellation: agree to 1e-12 of the physical
/// range (a digital step of a BDF file is 6e-8 of it).
fn pyedflib_tolerance(r: &EdfReader, s: usize) -> f64 {
    let h = &r.header().signals[s];
    1e-12 * h.physical_min.abs().max(h.physical_max.abs()) * h.unit_scale
}

#[test]
fn edf_values_equal_mne_exactly_and_pyedflib_to_rounding() {
    for stem in edf_stems() {
        let (r, meta) = open(&stem);
        let names: Vec<String> = meta["mne_channels"]
            .as_array()
            .expect("mne_channels")
            .iter()
            .map(|v| v.as_str().expect("str").to_string())
            .collect();
        let sigs = r.find_signals(&names).expect("channels by label");
        let mne = read_npy_f64(&fixtures("edf").join(format!("{stem}.mne.npy"))).expect("mne ref");
        let pyedf = read_npy_f64(&fixtures("edf").join(format!("{stem}.pyedflib.npy")))
            .expect("pyedflib ref");
        let width = mne.shape[1];
        assert_eq!(mne.shape, vec![sigs.len(), width]);
        assert_eq!(pyedf.shape, mne.shape);
        // Read the slices through the block reader with an awkward block size.
        let mut blocks = r.blocks(&sigs, 37).expect("blocks");
        let total = blocks.n_samples();
        let mut all = vec![Vec::with_capacity(total); sigs.len()];
        let mut buf = Vec::new();
        while let Some(info) = blocks.next_f64(&mut buf).expect("block") {
            for (c, row) in all.iter_mut().enumerate() {
                row.extend_from_slice(&buf[c * info.n_samples..(c + 1) * info.n_samples]);
            }
        }
        let mut col = 0;
        for (a, b) in slices_of(&meta) {
            for t in a..b {
                for c in 0..sigs.len() {
                    let ours = all[c][t];
                    let m = mne.data[c * width + col];
                    assert_eq!(
                        ours.to_bits(),
                        m.to_bits(),
                        "{stem} ch {c} sample {t}: {ours:e} vs MNE {m:e}"
                    );
                    let p = pyedf.data[c * width + col];
                    let tol = pyedflib_tolerance(&r, sigs[c]);
                    assert!(
                        (ours - p).abs() <= tol,
                        "{stem} ch {c} sample {t}: {ours:e} vs pyedflib {p:e}"
                    );
                }
                col += 1;
            }
        }
        // f32 blocks are the f64 values rounded.
        let mut blocks = r.blocks(&sigs, 1000).expect("blocks");
        let mut b32 = Vec::new();
        let info = blocks
            .next_f32(&mut b32)
            .expect("f32 block")
            .expect("one block");
        for c in 0..sigs.len() {
            assert_eq!(b32[c * info.n_samples + 5], all[c][5] as f32);
        }
    }
}

#[test]
fn every_signal_at_its_own_rate_matches_pyedflib() {
    for stem in edf_stems() {
        let (r, _) = open(&stem);
        let head = read_npy_f64(&fixtures("edf").join(format!("{stem}.pyedflib_head.npy")))
            .expect("head ref");
        let data = r.data_signals();
        assert_eq!(head.shape, vec![data.len(), 200]);
        for (k, &s) in data.iter().enumerate() {
            let mut v = vec![0.0; 200];
            r.read_signal(s, 0, &mut v).expect("read");
            let tol = pyedflib_tolerance(&r, s);
            for t in 0..200 {
                assert!(
                    (v[t] - head.data[k * 200 + t]).abs() <= tol,
                    "{stem} signal {k} sample {t}"
                );
            }
        }
        if data.len() > 1
            && r.header().signals[data[0]].samples_per_record
                != r.header().signals[data[1]].samples_per_record
        {
            let e = r
                .blocks(&data, 10)
                .expect_err("mixed rates refused")
                .to_string();
            assert!(e.contains(&r.header().signals[data[1]].label), "{e}");
        }
    }
}

#[test]
fn edf_annotations_match_mne() {
    for stem in edf_stems() {
        let (r, meta) = open(&stem);
        let ann = r.annotations().expect("annotations");
        let want = &meta["annotations"];
        let onsets = f64s(&want["onset_s"]);
        let durations = f64s(&want["duration_s"]);
        let texts: Vec<&str> = want["text"]
            .as_array()
            .expect("text")
            .iter()
            .map(|v| v.as_str().expect("s"))
            .collect();
        assert_eq!(ann.len(), onsets.len(), "{stem}: {ann:?}");
        for (k, a) in ann.iter().enumerate() {
            assert!(
                (a.onset_s - onsets[k]).abs() < 1e-6,
                "{stem} annotation {k}: {a:?} vs {}",
                onsets[k]
            );
            assert!(
                (a.duration_s.unwrap_or(0.0) - durations[k]).abs() < 1e-9,
                "{stem} annotation {k}"
            );
            assert_eq!(a.text, texts[k], "{stem} annotation {k}");
        }
    }
}

fn sections_from(arr: &trigd::eeg::simulate::NpyArray) -> Vec<Section> {
    assert_eq!(arr.shape.len(), 2);
    assert_eq!(arr.shape[1], 6);
    arr.data
        .chunks_exact(6)
        .map(|c| [c[0], c[1], c[2], c[3], c[4], c[5]])
        .collect()
}

#[test]
fn filter_coefficients_match_scipy() {
    let meta = json(&fixtures("filter").join("cases.json"));
    let cases = meta["cases"].as_array().expect("cases");
    assert!(cases.len() > 100);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let fs = case["fs_hz"].as_f64().expect("fs");
        let order = case["order"].as_u64().expect("order") as usize;
        let edges = f64s(&case["edges_hz"]);
        let want = sections_from(
            &read_npy_f64(&fixtures("filter").join(case["file"].as_str().expect("file")))
                .expect("npy"),
        );
        let got: Vec<Section> = match case["kind"].as_str().expect("kind") {
            "bandpass" => butter(
                order,
                Band::Bandpass {
                    lo_hz: edges[0],
                    hi_hz: edges[1],
                },
                fs,
            )
            .expect(name),
            "lowpass" => butter(
                order,
                Band::Lowpass {
                    cutoff_hz: edges[0],
                },
                fs,
            )
            .expect(name),
            "highpass" => butter(
                order,
                Band::Highpass {
                    cutoff_hz: edges[0],
                },
                fs,
            )
            .expect(name),
            "notch" => vec![iirnotch(edges[0], edges[1], fs).expect(name)],
            k => panic!("unknown kind {k}"),
        };
        assert_eq!(got.len(), want.len(), "{name}: sections");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            for j in 0..6 {
                let tol = 1e-12 * w[j].abs().max(1e-3);
                assert!(
                    (g[j] - w[j]).abs() <= tol,
                    "{name} section {i} coef {j}: {:e} vs scipy {:e}",
                    g[j],
                    w[j]
                );
            }
        }
    }
}

#[test]
fn blockwise_filtering_equals_scipy_sosfilt_on_the_whole_signal() {
    let x = read_npy_f64(&fixtures("filter").join("signal.npy")).expect("signal");
    let want = read_npy_f64(&fixtures("filter").join("signal_filtered.npy")).expect("filtered");
    let sos =
        sections_from(&read_npy_f64(&fixtures("filter").join("signal_sos.npy")).expect("sos"));
    // Our own design of the same cascade agrees with the one SciPy used.
    let cfg = trigd::eeg::filter::FilterConfig {
        bandpass_hz: Some([8.0, 30.0]),
        order: 4,
        notch_hz: Some(50.0),
        notch_q: 30.0,
        ..Default::default()
    };
    let ours = cfg.sections(250.0).expect("design");
    for (a, b) in ours.iter().zip(&sos) {
        for j in 0..6 {
            assert!((a[j] - b[j]).abs() <= 1e-12 * b[j].abs().max(1e-3));
        }
    }
    let (n_ch, n) = (x.shape[0], x.shape[1]);
    let peak = want.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for trial in 0..4 {
        let mut f = BlockFilter::new(
            if trial % 2 == 0 {
                sos.clone()
            } else {
                ours.clone()
            },
            n_ch,
        );
        let mut out = vec![0.0; n_ch * n];
        let mut t = 0;
        while t < n {
            let len = rng.random_range(1..=200).min(n - t);
            let mut block: Vec<f64> = (0..n_ch)
                .flat_map(|c| x.data[c * n + t..c * n + t + len].to_vec())
                .collect();
            f.process_f64(&mut block, len);
            for c in 0..n_ch {
                out[c * n + t..c * n + t + len].copy_from_slice(&block[c * len..(c + 1) * len]);
            }
            t += len;
        }
        for (i, (a, b)) in out.iter().zip(&want.data).enumerate() {
            assert!(
                (a - b).abs() <= 1e-10 * peak,
                "trial {trial} index {i}: {a:e} vs scipy {b:e}"
            );
        }
    }
}

#[test]
fn simulate_eeg_writes_a_file_that_reads_back_with_the_injected_signal() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A small synthetic lead field: 6 channels, 20 sources on a line.
    let (n_ch, n_src) = (6usize, 20usize);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    let lf: Vec<f64> = (0..n_ch * 3 * n_src)
        .map(|_| rng.random_range(-1.0..1.0) * 1e5)
        .collect();
    let pos: Vec<f64> = (0..n_src)
        .flat_map(|i| [i as f64 * 0.005 - 0.05, 0.01, 0.06])
        .collect();
    let write = |name: &str, shape: &[u64], data: &[f64]| {
        let path = dir.path().join(name);
        let mut w = npyz::WriteOptions::<f64>::new()
            .default_dtype()
            .shape(shape)
            .writer(std::fs::File::create(&path).expect("create"))
            .begin_nd()
            .expect("npy");
        w.extend(data.iter().copied()).expect("write");
        w.finish().expect("finish");
        path
    };
    let lf_path = write("lf.npy", &[n_ch as u64, 3 * n_src as u64], &lf);
    let pos_path = write("pos.npy", &[n_src as u64, 3], &pos);
    let names: Vec<String> = (0..n_ch).map(|i| format!("E{i}")).collect();
    let ch_path = dir.path().join("ch.txt");
    std::fs::write(&ch_path, names.join("\n")).expect("names");
    for (fmt, ext) in [("edf", "edf"), ("bdf", "bdf")] {
        let out = dir.path().join(format!("sim.{ext}"));
        let truth = dir.path().join(format!("truth_{ext}.npy"));
        let args = trigd::eeg::cli::SimulateEegArgs {
            lead_field: lf_path.clone(),
            source_positions: pos_path.clone(),
            channels: ch_path.clone(),
            dipole_mm: vec![1.0, 10.0, 60.0],
            orientation: Some(vec![0.0, 0.6, 0.8]),
            amplitude_nam: 40.0,
            burst_hz: 10.0,
            burst_sigma_ms: 100.0,
            onsets_s: vec![0.5, 1.5],
            noise_uv: 0.0,
            noise_cov: None,
            sample_rate_hz: 200.0,
            duration_s: 2.0,
            seed: 9,
            format: Some(fmt.into()),
            out: out.clone(),
            truth_out: Some(truth.clone()),
        };
        trigd::eeg::cli::run_simulate(&args).expect("simulate");
        // The dipole sits on the source nearest to (1, 10, 60) mm: x = 0 mm is source 10.
        let s = 10;
        let r = EdfReader::open(&out).expect("read back");
        assert_eq!(
            r.header().format,
            if fmt == "bdf" {
                EdfFormat::Bdf
            } else {
                EdfFormat::Edf
            }
        );
        let sigs = r.find_signals(&names).expect("labels");
        let n = 400;
        let mut blocks = r.blocks(&sigs, n).expect("blocks");
        let mut data = Vec::new();
        let info = blocks.next_f64(&mut data).expect("block").expect("data");
        assert_eq!(info.n_samples, n);
        let truth_arr = read_npy_f64(&truth).expect("truth");
        assert_eq!(truth_arr.shape, vec![n_ch, n]);
        let orient = [0.0, 0.6, 0.8];
        for c in 0..n_ch {
            let g: f64 = (0..3)
                .map(|j| lf[c * 3 * n_src + 3 * s + j] * orient[j])
                .sum();
            let step = r.header().signals[sigs[c]].cal * 1e-6;
            for t in 0..n {
                let tt = t as f64 / 200.0;
                let q: f64 = [0.5, 1.5]
                    .iter()
                    .map(|on: &f64| {
                        let u = tt - on;
                        (-(u * u) / (2.0 * 0.1 * 0.1)).exp()
                            * (2.0 * std::f64::consts::PI * 10.0 * u).cos()
                    })
                    .sum::<f64>()
                    * 40e-9;
                let want = g * q;
                assert!((truth_arr.data[c * n + t] - want).abs() <= 1e-12 * want.abs().max(1e-9));
                assert!(
                    (data[c * n + t] - want).abs() <= 0.5 * step * (1.0 + 1e-9),
                    "{fmt} ch {c} t {t}"
                );
            }
        }
        let ann = r.annotations().expect("annotations");
        assert_eq!(
            ann.iter().map(|a| a.onset_s).collect::<Vec<_>>(),
            vec![0.5, 1.5]
        );
    }
}
