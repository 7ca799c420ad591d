//! Fuzz the `[finder]` overrides parser and the reconstruction on arbitrary hits: any
//! input gives a configuration or an error, and any hits give tracks, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trigd::frame::HitRecord;
use trigd::tracking::geometry::{Detector, Field, Plane};
use trigd::tracking::reco::{FinderConfig, FinderOverrides, Reconstructor};

fuzz_target!(|data: &[u8]| {
    let det = Detector {
        planes: (0..5)
            .map(|i| Plane {
                z_mm: 300.0 + 100.0 * i as f64,
                half_x_mm: 100.0,
                half_y_mm: 100.0,
                sigma_x_mm: 0.01,
                sigma_y_mm: 0.01,
                x0_fraction: 0.004,
                efficiency: 1.0,
            })
            .collect(),
        field: Field::Uniform {
            b_tesla: [0.0, 1.0, 0.0],
        },
    };
    let split = data
        .first()
        .map(|&b| b as usize)
        .unwrap_or(0)
        .min(data.len());
    let (text, rest) = data.split_at(split);
    let ov = std::str::from_utf8(text)
        .ok()
        .and_then(|t| FinderOverrides::from_toml_str(t).ok())
        .unwrap_or_default();
    let mut cfg = FinderConfig::from_detector_with(&det, 1.0, &ov);
    cfg.limits.max_doublets = cfg.limits.max_doublets.min(1 << 14);
    cfg.limits.max_triplets = cfg.limits.max_triplets.min(1 << 14);
    cfg.limits.max_neighbours = cfg.limits.max_neighbours.min(1 << 15);
    if cfg.validate(&det).is_err() {
        return;
    }
    let hits: Vec<HitRecord> = rest
        .chunks_exact(10)
        .map(|c| HitRecord {
            x_mm: f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            y_mm: f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            z_mm: 0.0,
            plane: u16::from_le_bytes([c[8], c[9]]) % 8,
            hit_id: 0,
        })
        .collect();
    let mut reco = Reconstructor::new(&det, cfg);
    let mut tracks = Vec::new();
    reco.reconstruct(&hits, &mut tracks);
    for t in &tracks {
        assert!(t.hits.iter().all(|&h| (h as usize) < hits.len()));
    }
});
