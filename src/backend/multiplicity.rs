//! The hit-multiplicity trigger line: accept an event with at least `min_hits` hits on at
//! least `min_planes` distinct planes. Real, cheap, and always available for hit events; it
//! stays as a line next to the tracking lines.

use super::{Backend, BackendError, BackendKind, Detail, Verdict};
use crate::config::{Config, MultiplicityConfig};
use crate::frame::{FrameView, Hit, Payload};

/// Name of the line in decision records.
pub const LINE_NAME: &str = "multiplicity";

/// Counts hits and distinct planes (planes >= 64 are counted in one overflow bucket per
/// 64-plane group, which is exact for up to 64 * 64 planes).
pub fn count(hits: &[Hit]) -> (u32, u32) {
    let mut seen = [0u64; 64];
    for h in hits {
        let p = h.plane.get() as usize % 4096;
        seen[p / 64] |= 1u64 << (p % 64);
    }
    (hits.len() as u32, seen.iter().map(|w| w.count_ones()).sum())
}

/// Whether the line fires for these counts.
pub fn fires(cfg: &MultiplicityConfig, n_hits: u32, n_planes: u32) -> bool {
    n_hits >= cfg.min_hits && n_planes >= cfg.min_planes
}

/// CPU backend running the multiplicity line alone.
pub struct CpuMultiplicity {
    cfg: MultiplicityConfig,
    names: Vec<String>,
}

impl CpuMultiplicity {
    pub fn new(cfg: MultiplicityConfig) -> Self {
        Self {
            cfg,
            names: vec![LINE_NAME.to_string()],
        }
    }
}

impl Backend for CpuMultiplicity {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn line_names(&self) -> &[String] {
        &self.names
    }
    fn process(
        &mut self,
        batch: &[FrameView<'_>],
        out: &mut Vec<Verdict>,
    ) -> Result<(), BackendError> {
        for (index, f) in batch.iter().enumerate() {
            let Payload::Hits(hits) = f.payload else {
                return Err(BackendError::WrongKind {
                    index,
                    expected: "hit_event",
                });
            };
            let (n_hits, n_planes) = count(hits);
            let fired = fires(&self.cfg, n_hits, n_planes);
            out.push(Verdict {
                accept: fired,
                lines_fired: fired as u64,
                detail: Detail::Multiplicity { n_hits, n_planes },
                malformed: None,
            });
        }
        Ok(())
    }
    fn reload(&mut self, cfg: &Config) -> Result<(), String> {
        self.cfg = cfg.multiplicity.unwrap_or_default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_hit_event, parse, HitRecord, Stamp};

    fn event(planes: &[u16]) -> Vec<u8> {
        let hits: Vec<HitRecord> = planes
            .iter()
            .enumerate()
            .map(|(i, &p)| HitRecord {
                x_mm: 0.0,
                y_mm: 0.0,
                z_mm: p as f32,
                plane: p,
                hit_id: i as u32,
            })
            .collect();
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            Stamp {
                source_id: 0,
                sequence: 0,
                timestamp_ns: 0,
            },
            &hits,
        );
        b
    }

    #[test]
    fn fires_on_hits_and_distinct_planes() {
        let mut be = CpuMultiplicity::new(MultiplicityConfig {
            min_hits: 4,
            min_planes: 3,
        });
        let a = event(&[0, 1, 2, 2]); // 4 hits, 3 planes: fires
        let b = event(&[0, 0, 1, 1]); // 4 hits, 2 planes: no
        let c = event(&[0, 1, 2]); // 3 hits: no
        let views = [parse(&a).unwrap(), parse(&b).unwrap(), parse(&c).unwrap()];
        let mut out = Vec::new();
        be.process(&views, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|v| v.accept).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(
            out[0].detail,
            Detail::Multiplicity {
                n_hits: 4,
                n_planes: 3
            }
        );
        assert_eq!(out[0].lines_fired, 1);
    }

    #[test]
    fn counts_high_plane_numbers() {
        let planes: Vec<u16> = (0..200).collect();
        let b = event(&planes);
        let Payload::Hits(h) = parse(&b).unwrap().payload else {
            unreachable!()
        };
        assert_eq!(count(h), (200, 200));
    }
}
