//! TrackML-style CSV events: writing simulated events, reading event directories (hits,
//! optional truth and particles), and the submission format `event_id,hit_id,track_id`.
//!
//! Files per event in one directory, `NNNNNNNNN` the event id (nine digits):
//! - `eventNNNNNNNNN-hits.csv`: `hit_id,x,y,z,volume_id,layer_id,module_id` (mm;
//!   `layer_id` is the plane index from 0; `volume_id` and `module_id` are written as 0
//!   and ignored on reading; where the reader knows the detector's planes and `layer_id`
//!   numbers them otherwise, as TrackML's 2, 4, 6, .. or from 1, the hits' z tell their
//!   planes: [`assign_planes`]),
//! - `eventNNNNNNNNN-truth.csv`: `hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight` (true
//!   position in mm, momentum in GeV/c; particle 0 = noise),
//! - `eventNNNNNNNNN-particles.csv`: `particle_id,vx,vy,vz,px,py,pz,q,nhits`.
//!
//! Columns are found by name, so extra columns (as in the original TrackML files) are
//! allowed. Every error names the file and the line.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::frame::{self, HitRecord};

use super::simulate::{HitTruth, Particle, SimEvent};

/// Most hits one event may have: what fits into one native frame.
pub const MAX_HITS_PER_EVENT: usize =
    (frame::MAX_FRAME_LEN - frame::HEADER_LEN - 8) / frame::HIT_LEN;

/// Why reading or writing CSV events failed.
#[derive(Debug, thiserror::Error)]
pub enum TrackmlError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: line {line}: {reason}")]
    Row {
        origin: String,
        line: u64,
        reason: String,
    },
    #[error("{origin}: {reason}")]
    File { origin: String, reason: String },
}

/// One event read from a CSV directory. `truth` is aligned with `hits` (same index).
#[derive(Debug, Clone, PartialEq)]
pub struct TrackmlEvent {
    pub event_id: u64,
    pub hits: Vec<HitRecord>,
    pub truth: Option<Vec<HitTruth>>,
    /// Particles as the file gives them (`pdg` and `mass_gev` are 0: not in the format).
    pub particles: Option<Vec<Particle>>,
}

fn file_name(dir: &Path, event_id: u64, kind: &str) -> PathBuf {
    dir.join(format!("event{event_id:09}-{kind}.csv"))
}

fn write_file(path: &Path, text: &str) -> Result<(), TrackmlError> {
    let io = |source| TrackmlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    f.write_all(text.as_bytes()).map_err(io)?;
    f.flush().map_err(io)
}

/// Writes `event` as hits, truth and particles files into `dir` (which must exist).
/// Numbers are written in their shortest exact form, so reading gives the same values.
pub fn write_event(dir: &Path, event: &SimEvent) -> Result<(), TrackmlError> {
    use std::fmt::Write as _;
    let mut hits = String::from("hit_id,x,y,z,volume_id,layer_id,module_id\n");
    for h in &event.hits {
        let _ = writeln!(
            hits,
            "{},{},{},{},0,{},0",
            h.hit_id, h.x_mm, h.y_mm, h.z_mm, h.plane
        );
    }
    let mut truth = String::from("hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight\n");
    for (h, t) in event.hits.iter().zip(&event.truth) {
        let _ = writeln!(
            truth,
            "{},{},{},{},{},{},{},{},{}",
            h.hit_id,
            t.particle_id,
            t.pos_mm[0],
            t.pos_mm[1],
            t.pos_mm[2],
            t.momentum_gev[0],
            t.momentum_gev[1],
            t.momentum_gev[2],
            t.weight
        );
    }
    let mut particles = String::from("particle_id,vx,vy,vz,px,py,pz,q,nhits\n");
    for p in &event.particles {
        let _ = writeln!(
            particles,
            "{},{},{},{},{},{},{},{},{}",
            p.id,
            p.vertex_mm[0],
            p.vertex_mm[1],
            p.vertex_mm[2],
            p.momentum_gev[0],
            p.momentum_gev[1],
            p.momentum_gev[2],
            p.q,
            p.n_hits
        );
    }
    write_file(&file_name(dir, event.event_id, "hits"), &hits)?;
    write_file(&file_name(dir, event.event_id, "truth"), &truth)?;
    write_file(&file_name(dir, event.event_id, "particles"), &particles)
}

/// A CSV table with named columns, read row by row with errors naming file and line.
struct Table<'a> {
    origin: &'a str,
    reader: csv::Reader<&'a [u8]>,
    columns: Vec<usize>,
}

impl<'a> Table<'a> {
    fn new(bytes: &'a [u8], origin: &'a str, wanted: &[&str]) -> Result<Self, TrackmlError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .flexible(false)
            .from_reader(bytes);
        let header = reader
            .headers()
            .map_err(|e| TrackmlError::Row {
                origin: origin.into(),
                line: 1,
                reason: format!("bad header: {e}"),
            })?
            .clone();
        let mut columns = Vec::with_capacity(wanted.len());
        for w in wanted {
            let i = header
                .iter()
                .position(|h| h == *w)
                .ok_or_else(|| TrackmlError::File {
                    origin: origin.into(),
                    reason: format!(
                        "missing column \"{w}\" (header has: {})",
                        header.iter().collect::<Vec<_>>().join(",")
                    ),
                })?;
            columns.push(i);
        }
        Ok(Table {
            origin,
            reader,
            columns,
        })
    }

    /// Calls `row` with the wanted columns of each data row, in order.
    fn for_each(
        &mut self,
        mut row: impl FnMut(&Fields<'_>) -> Result<(), String>,
    ) -> Result<(), TrackmlError> {
        let mut record = csv::StringRecord::new();
        loop {
            let more = self
                .reader
                .read_record(&mut record)
                .map_err(|e| TrackmlError::Row {
                    origin: self.origin.into(),
                    line: e.position().map(|p| p.line()).unwrap_or(0),
                    reason: e.to_string(),
                })?;
            if !more {
                return Ok(());
            }
            let line = record.position().map(|p| p.line()).unwrap_or(0);
            let fields = Fields {
                record: &record,
                columns: &self.columns,
            };
            row(&fields).map_err(|reason| TrackmlError::Row {
                origin: self.origin.into(),
                line,
                reason,
            })?;
        }
    }
}

struct Fields<'a> {
    record: &'a csv::StringRecord,
    columns: &'a [usize],
}

impl Fields<'_> {
    fn get<T: std::str::FromStr>(&self, i: usize, name: &str) -> Result<T, String> {
        let text = self.record.get(self.columns[i]).unwrap_or("");
        text.parse::<T>().map_err(|_| {
            format!(
                "column {name}: \"{text}\" is not a valid {}",
                std::any::type_name::<T>()
            )
        })
    }
    fn finite(&self, i: usize, name: &str) -> Result<f64, String> {
        let v: f64 = self.get(i, name)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!("column {name}: {v} is not finite"))
        }
    }
}

/// Parses a hits file. Hit ids must be unique; coordinates finite; at most
/// [`MAX_HITS_PER_EVENT`] rows.
pub fn parse_hits_csv(bytes: &[u8], origin: &str) -> Result<Vec<HitRecord>, TrackmlError> {
    let mut table = Table::new(bytes, origin, &["hit_id", "x", "y", "z", "layer_id"])?;
    let mut hits = Vec::new();
    let mut seen = std::collections::HashSet::new();
    table.for_each(|f| {
        if hits.len() >= MAX_HITS_PER_EVENT {
            return Err(format!(
                "more than {MAX_HITS_PER_EVENT} hits: an event must fit into one frame"
            ));
        }
        let hit_id: u32 = f.get(0, "hit_id")?;
        if !seen.insert(hit_id) {
            return Err(format!("hit_id {hit_id} appears twice"));
        }
        let (x, y, z) = (f.finite(1, "x")?, f.finite(2, "y")?, f.finite(3, "z")?);
        let narrow = |v: f64, name: &str| {
            let n = v as f32;
            if n.is_finite() {
                Ok(n)
            } else {
                Err(format!("column {name}: {v} does not fit a 32-bit float"))
            }
        };
        hits.push(HitRecord {
            x_mm: narrow(x, "x")?,
            y_mm: narrow(y, "y")?,
            z_mm: narrow(z, "z")?,
            plane: f.get(4, "layer_id")?,
            hit_id,
        });
        Ok(())
    })?;
    Ok(hits)
}

/// Parses a truth file into `(hit_id, truth)` rows. The `weight` column is optional
/// (missing: weight 1 for particle hits, 0 for noise).
pub fn parse_truth_csv(bytes: &[u8], origin: &str) -> Result<Vec<(u32, HitTruth)>, TrackmlError> {
    let has_weight = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(bytes)
        .headers()
        .map(|h| h.iter().any(|c| c == "weight"))
        .unwrap_or(false);
    let mut wanted = vec![
        "hit_id",
        "particle_id",
        "tx",
        "ty",
        "tz",
        "tpx",
        "tpy",
        "tpz",
    ];
    if has_weight {
        wanted.push("weight");
    }
    let mut table = Table::new(bytes, origin, &wanted)?;
    let mut rows = Vec::new();
    table.for_each(|f| {
        if rows.len() >= MAX_HITS_PER_EVENT {
            return Err(format!("more than {MAX_HITS_PER_EVENT} rows"));
        }
        let hit_id: u32 = f.get(0, "hit_id")?;
        let particle_id: u64 = f.get(1, "particle_id")?;
        let pos_mm = [f.finite(2, "tx")?, f.finite(3, "ty")?, f.finite(4, "tz")?];
        let momentum_gev = [
            f.finite(5, "tpx")?,
            f.finite(6, "tpy")?,
            f.finite(7, "tpz")?,
        ];
        let weight = if has_weight {
            let w = f.finite(8, "weight")?;
            if w < 0.0 {
                return Err(format!("column weight: {w} is negative"));
            }
            w
        } else if particle_id == 0 {
            0.0
        } else {
            1.0
        };
        rows.push((
            hit_id,
            HitTruth {
                particle_id,
                pos_mm,
                momentum_gev,
                weight,
            },
        ));
        Ok(())
    })?;
    Ok(rows)
}

/// Parses a particles file.
pub fn parse_particles_csv(bytes: &[u8], origin: &str) -> Result<Vec<Particle>, TrackmlError> {
    let mut table = Table::new(
        bytes,
        origin,
        &[
            "particle_id",
            "vx",
            "vy",
            "vz",
            "px",
            "py",
            "pz",
            "q",
            "nhits",
        ],
    )?;
    let mut particles = Vec::new();
    let mut seen = std::collections::HashSet::new();
    table.for_each(|f| {
        let id: u64 = f.get(0, "particle_id")?;
        if id == 0 {
            return Err("particle_id 0 is reserved for noise".into());
        }
        if !seen.insert(id) {
            return Err(format!("particle_id {id} appears twice"));
        }
        // TrackML writes q as an integer; accept "1.0" too.
        let q = f.finite(7, "q")?;
        if q.fract() != 0.0 || q.abs() > 100.0 {
            return Err(format!("column q: {q} is not an integer charge"));
        }
        particles.push(Particle {
            id,
            pdg: 0,
            q: q as i32,
            mass_gev: 0.0,
            vertex_mm: [f.finite(1, "vx")?, f.finite(2, "vy")?, f.finite(3, "vz")?],
            momentum_gev: [f.finite(4, "px")?, f.finite(5, "py")?, f.finite(6, "pz")?],
            n_hits: f.get(8, "nhits")?,
        });
        Ok(())
    })?;
    Ok(particles)
}

/// Parses a submission file (`event_id,hit_id,track_id`) into rows.
pub fn parse_submission_csv(
    bytes: &[u8],
    origin: &str,
) -> Result<Vec<(u64, u32, u64)>, TrackmlError> {
    let mut table = Table::new(bytes, origin, &["event_id", "hit_id", "track_id"])?;
    let mut rows = Vec::new();
    table.for_each(|f| {
        rows.push((
            f.get(0, "event_id")?,
            f.get(1, "hit_id")?,
            f.get(2, "track_id")?,
        ));
        Ok(())
    })?;
    Ok(rows)
}

/// Writes the submission rows of one event: every hit once, `track_id` 0 when unassigned,
/// tracks numbered from 1 in the order given. `tracks` hold indices into `hits`.
pub fn write_submission_rows(
    out: &mut impl Write,
    event_id: u64,
    hits: &[HitRecord],
    tracks: &[Vec<u32>],
) -> std::io::Result<()> {
    let mut track_of = vec![0u64; hits.len()];
    for (t, members) in tracks.iter().enumerate() {
        for &i in members {
            if let Some(slot) = track_of.get_mut(i as usize) {
                if *slot == 0 {
                    *slot = t as u64 + 1;
                }
            }
        }
    }
    for (h, t) in hits.iter().zip(track_of) {
        writeln!(out, "{event_id},{},{t}", h.hit_id)?;
    }
    Ok(())
}

/// Pairs truth rows with hits by `hit_id`: every hit needs exactly one truth row.
pub fn align_truth(
    hits: &[HitRecord],
    rows: Vec<(u32, HitTruth)>,
    origin: &str,
) -> Result<Vec<HitTruth>, TrackmlError> {
    let mut by_id: HashMap<u32, HitTruth> = HashMap::with_capacity(rows.len());
    for (hit_id, t) in rows {
        if by_id.insert(hit_id, t).is_some() {
            return Err(TrackmlError::File {
                origin: origin.into(),
                reason: format!("hit_id {hit_id} has two truth rows"),
            });
        }
    }
    let mut truth = Vec::with_capacity(hits.len());
    for h in hits {
        let t = by_id.remove(&h.hit_id).ok_or_else(|| TrackmlError::File {
            origin: origin.into(),
            reason: format!("no truth row for hit_id {}", h.hit_id),
        })?;
        truth.push(t);
    }
    if let Some(extra) = by_id.keys().min() {
        return Err(TrackmlError::File {
            origin: origin.into(),
            reason: format!("truth row for hit_id {extra}, which is not in the hits file"),
        });
    }
    Ok(truth)
}

/// Where an event's hits got their planes from ([`assign_planes`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlaneSource {
    /// `layer_id`: every hit lies on the plane it names (or no plane list was given).
    LayerId,
    /// The hits' z: `layer_id` is not the plane index (`example`: a hit's `layer_id`, its
    /// z in mm and the plane at that z), and more hits lie on a plane than on the one their
    /// `layer_id` names. `off_planes` hits lie on no plane: their plane is set to
    /// [`NO_PLANE`], which the finder refuses and counts.
    Z {
        example: (u16, f32, u16),
        off_planes: usize,
    },
    /// `layer_id`, although `inconsistent` hits do not lie on the plane it names: their z
    /// say less (written as 0, say) than their `layer_id`.
    LayerIdUnconfirmed { inconsistent: usize },
}

/// The plane of a hit whose z lies on no plane of the detector.
pub const NO_PLANE: u16 = u16::MAX;

/// How far (mm) a hit's z may lie from its plane's: a quarter of the smallest gap between
/// neighbouring planes (a sensor's thickness or a module's offset, not the next plane),
/// 1 mm with one plane.
pub fn plane_z_tolerance(planes_z: &[f64]) -> f64 {
    let gap = planes_z
        .windows(2)
        .map(|w| (w[1] - w[0]).abs())
        .fold(f64::INFINITY, f64::min);
    if gap.is_finite() {
        0.25 * gap
    } else {
        1.0
    }
}

/// Checks that each hit's plane (`layer_id`) is the plane at its z (`planes_z`: the
/// detector's planes by increasing z) and, where it is not for some hits, takes the planes
/// from the hits' z when that places more hits on a plane than `layer_id` does: files whose
/// `layer_id` counts the planes otherwise (TrackML's 2, 4, 6, .., or from 1) would
/// otherwise put every hit on a wrong plane and find nothing. Hits on no plane then get
/// [`NO_PLANE`]. Where the hits' z place fewer hits (z written as 0, say), `layer_id` is
/// kept. An empty `planes_z` checks nothing.
pub fn assign_planes(hits: &mut [HitRecord], planes_z: &[f64]) -> PlaneSource {
    if planes_z.is_empty() {
        return PlaneSource::LayerId;
    }
    let tol = plane_z_tolerance(planes_z);
    // The plane within `tol` of `z`: the nearest of the two around it.
    let at = |z: f32| -> Option<u16> {
        let z = f64::from(z);
        let k = planes_z.partition_point(|&p| p < z);
        [k.checked_sub(1), (k < planes_z.len()).then_some(k)]
            .into_iter()
            .flatten()
            .map(|i| (i, (planes_z[i] - z).abs()))
            .filter(|&(_, d)| d <= tol)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i as u16)
    };
    let on_own = |h: &HitRecord| {
        planes_z
            .get(h.plane as usize)
            .is_some_and(|&p| (f64::from(h.z_mm) - p).abs() <= tol)
    };
    let consistent = hits.iter().filter(|h| on_own(h)).count();
    if consistent == hits.len() {
        return PlaneSource::LayerId;
    }
    let placed = hits.iter().filter(|h| at(h.z_mm).is_some()).count();
    if placed <= consistent {
        return PlaneSource::LayerIdUnconfirmed {
            inconsistent: hits.len() - consistent,
        };
    }
    let mut example = None;
    let mut off_planes = 0;
    for h in hits.iter_mut() {
        let plane = at(h.z_mm);
        if example.is_none() && plane != Some(h.plane) {
            if let Some(p) = plane {
                example = Some((h.plane, h.z_mm, p));
            }
        }
        off_planes += plane.is_none() as usize;
        h.plane = plane.unwrap_or(NO_PLANE);
    }
    PlaneSource::Z {
        // `placed > consistent`: some hit lies on a plane other than its own.
        example: example.unwrap_or((0, 0.0, 0)),
        off_planes,
    }
}

impl PlaneSource {
    /// What a log line says of an event whose planes did not come from `layer_id` alone;
    /// `None` for [`PlaneSource::LayerId`].
    pub fn describe(&self, origin: &str) -> Option<String> {
        match *self {
            PlaneSource::LayerId => None,
            PlaneSource::Z {
                example: (layer, z, plane),
                off_planes,
            } => Some(format!(
                "{origin}: layer_id is not the plane index of the detector description \
                 (a hit with layer_id {layer} lies at z = {z} mm, on plane {plane}): each hit's \
                 plane is taken from its z{}",
                if off_planes > 0 {
                    format!(", and {off_planes} hits on no plane are refused")
                } else {
                    String::new()
                }
            )),
            PlaneSource::LayerIdUnconfirmed { inconsistent } => Some(format!(
                "{origin}: {inconsistent} hits do not lie at the z of the plane their layer_id \
                 names, and their z place no more hits on a plane than layer_id does: \
                 layer_id kept"
            )),
        }
    }
}

/// The events of a CSV directory, in increasing event id, read one at a time.
#[derive(Debug)]
pub struct TrackmlDir {
    dir: PathBuf,
    event_ids: std::vec::IntoIter<u64>,
    /// The detector's planes' z ([`TrackmlDir::with_planes`]).
    planes_z: Vec<f64>,
    /// Events whose planes did not come from `layer_id` alone, and the first one's account.
    relabelled: u64,
    first_note: Option<String>,
}

impl TrackmlDir {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Checks each event's planes against the detector's (`planes_z`, by increasing z),
    /// taking them from the hits' z where `layer_id` numbers them otherwise
    /// ([`assign_planes`]).
    pub fn with_planes(mut self, planes_z: Vec<f64>) -> Self {
        self.planes_z = planes_z;
        self
    }
    /// Events read so far whose planes did not come from `layer_id` alone, and what the
    /// first of them said ([`PlaneSource::describe`]).
    pub fn relabelled(&self) -> (u64, Option<&str>) {
        (self.relabelled, self.first_note.as_deref())
    }
    pub fn len(&self) -> usize {
        self.event_ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.event_ids.len() == 0
    }
}

/// Lists the events in `dir` (files `eventNNN-hits.csv`); refuses a directory with none.
pub fn read_trackml_dir(dir: impl AsRef<Path>) -> Result<TrackmlDir, TrackmlError> {
    let dir = dir.as_ref().to_path_buf();
    let io = |source| TrackmlError::Io {
        path: dir.clone(),
        source,
    };
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(digits) = name
            .strip_prefix("event")
            .and_then(|r| r.strip_suffix("-hits.csv"))
        {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                let id = digits.parse::<u64>().map_err(|_| TrackmlError::File {
                    origin: dir.join(name).display().to_string(),
                    reason: "event number does not fit 64 bits".into(),
                })?;
                ids.push(id);
            }
        }
    }
    if ids.is_empty() {
        return Err(TrackmlError::File {
            origin: dir.display().to_string(),
            reason: "no eventNNNNNNNNN-hits.csv files: not a TrackML-style event directory".into(),
        });
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(TrackmlDir {
        dir,
        event_ids: ids.into_iter(),
        planes_z: Vec::new(),
        relabelled: 0,
        first_note: None,
    })
}

fn find_event_file(dir: &Path, event_id: u64, kind: &str) -> Option<PathBuf> {
    let standard = file_name(dir, event_id, kind);
    if standard.exists() {
        return Some(standard);
    }
    // Also accept ids written with other zero padding (e.g. event1-hits.csv).
    let plain = dir.join(format!("event{event_id}-{kind}.csv"));
    plain.exists().then_some(plain)
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, TrackmlError> {
    std::fs::read(path).map_err(|source| TrackmlError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads one event of `dir`.
pub fn read_event(dir: &Path, event_id: u64) -> Result<TrackmlEvent, TrackmlError> {
    let hits_path = find_event_file(dir, event_id, "hits").ok_or_else(|| TrackmlError::File {
        origin: file_name(dir, event_id, "hits").display().to_string(),
        reason: "no such file".into(),
    })?;
    let origin = hits_path.display().to_string();
    let hits = parse_hits_csv(&read_bytes(&hits_path)?, &origin)?;
    let truth = match find_event_file(dir, event_id, "truth") {
        Some(path) => {
            let origin = path.display().to_string();
            let rows = parse_truth_csv(&read_bytes(&path)?, &origin)?;
            Some(align_truth(&hits, rows, &origin)?)
        }
        None => None,
    };
    let particles = match find_event_file(dir, event_id, "particles") {
        Some(path) => Some(parse_particles_csv(
            &read_bytes(&path)?,
            &path.display().to_string(),
        )?),
        None => None,
    };
    Ok(TrackmlEvent {
        event_id,
        hits,
        truth,
        particles,
    })
}

impl Iterator for TrackmlDir {
    type Item = Result<TrackmlEvent, TrackmlError>;
    fn next(&mut self) -> Option<Self::Item> {
        let id = self.event_ids.next()?;
        let mut ev = read_event(&self.dir, id);
        if let Ok(ev) = &mut ev {
            let source = assign_planes(&mut ev.hits, &self.planes_z);
            if let Some(note) =
                source.describe(&file_name(&self.dir, id, "hits").display().to_string())
            {
                self.relabelled += 1;
                if self.first_note.is_none() {
                    self.first_note = Some(note);
                }
            }
        }
        Some(ev)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.event_ids.size_hint()
    }
}

/// Runs every parser of this module over `bytes` (the fuzz target's body).
pub fn fuzz_parsers(bytes: &[u8]) {
    if let Ok(mut hits) = parse_hits_csv(bytes, "fuzz") {
        let _ = assign_planes(&mut hits, &[100.0, 180.0, 250.5, 400.0]);
        let _ = assign_planes(&mut hits, &[0.0]);
    }
    let _ = parse_truth_csv(bytes, "fuzz");
    let _ = parse_particles_csv(bytes, "fuzz");
    let _ = parse_submission_csv(bytes, "fuzz");
}

#[cfg(test)]
mod tests {

    fn hit(id: u32, z: f32, plane: u16) -> HitRecord {
        HitRecord {
            x_mm: 1.0,
            y_mm: -2.0,
            z_mm: z,
            plane,
            hit_id: id,
        }
    }

    const PLANES: [f64; 4] = [250.0, 330.0, 420.0, 520.0];

    #[test]
    fn planes_numbered_from_zero_are_kept() {
        let mut hits: Vec<_> = (0..4)
            .map(|k| hit(k, PLANES[k as usize] as f32, k as u16))
            .collect();
        // A sensor's thickness off its plane's z still counts as on it.
        hits[2].z_mm += 3.0;
        let before = hits.clone();
        assert_eq!(assign_planes(&mut hits, &PLANES), PlaneSource::LayerId);
        assert_eq!(hits, before);
        assert_eq!(assign_planes(&mut hits, &[]), PlaneSource::LayerId);
    }

    #[test]
    fn planes_numbered_otherwise_are_taken_from_z() {
        for relabel in [|k: u16| 2 * k + 2, |k: u16| k + 1] {
            let mut hits: Vec<_> = (0..8u16)
                .map(|k| {
                    hit(
                        k as u32,
                        PLANES[(k % 4) as usize] as f32 - 1.5,
                        relabel(k % 4),
                    )
                })
                .collect();
            let source = assign_planes(&mut hits, &PLANES);
            let PlaneSource::Z {
                example: (layer, z, plane),
                off_planes: 0,
            } = source
            else {
                panic!("{source:?}");
            };
            assert_eq!(layer, relabel(plane));
            assert_eq!(z, PLANES[plane as usize] as f32 - 1.5);
            for (k, h) in hits.iter().enumerate() {
                assert_eq!(h.plane, (k % 4) as u16);
            }
            assert!(source
                .describe("e-hits.csv")
                .unwrap()
                .contains("layer_id is not the plane index"));
        }
    }

    #[test]
    fn a_hit_on_no_plane_is_refused_when_planes_come_from_z() {
        let mut hits = vec![
            hit(1, 250.0, 1),
            hit(2, 330.0, 2),
            hit(3, 420.0, 3),
            hit(4, 290.0, 4),
        ];
        let source = assign_planes(&mut hits, &PLANES);
        assert!(
            matches!(source, PlaneSource::Z { off_planes: 1, .. }),
            "{source:?}"
        );
        let planes: Vec<u16> = hits.iter().map(|h| h.plane).collect();
        assert_eq!(planes, vec![0, 1, 2, NO_PLANE]);
    }

    #[test]
    fn z_that_name_no_plane_leave_layer_id() {
        // z written as 0 (the plane known only by its number): kept, and said.
        let mut hits: Vec<_> = (0..4u16).map(|k| hit(k as u32, 0.0, k)).collect();
        let before = hits.clone();
        let source = assign_planes(&mut hits, &PLANES);
        assert_eq!(source, PlaneSource::LayerIdUnconfirmed { inconsistent: 4 });
        assert_eq!(hits, before);
        // Mostly right: one hit with a wrong number does not move the others.
        let mut hits: Vec<_> = (0..4u16)
            .map(|k| hit(k as u32, PLANES[k as usize] as f32, k))
            .collect();
        hits[3].plane = 2;
        let source = assign_planes(&mut hits, &PLANES);
        assert!(
            matches!(
                source,
                PlaneSource::Z {
                    example: (2, _, 3),
                    off_planes: 0
                }
            ),
            "{source:?}"
        );
        assert_eq!(hits[3].plane, 3);
        assert_eq!(hits[0].plane, 0);
    }

    #[test]
    fn the_tolerance_is_a_quarter_of_the_smallest_gap() {
        assert_eq!(plane_z_tolerance(&PLANES), 20.0);
        assert_eq!(plane_z_tolerance(&[100.0]), 1.0);
    }

    use super::*;
    use crate::tracking::geometry::Detector;
    use crate::tracking::simulate::{simulate_events, Preset, SimConfig};

    fn detector() -> Detector {
        Detector::from_toml_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/detector.toml"
        ))
        .unwrap()
    }

    #[test]
    fn simulated_events_round_trip_through_csv() {
        let det = detector();
        let events: Vec<SimEvent> =
            simulate_events(&det, &SimConfig::preset(Preset::Minbias), 11, 5, 3).collect();
        let dir = tempfile::tempdir().unwrap();
        for ev in &events {
            write_event(dir.path(), ev).unwrap();
        }
        let reader = read_trackml_dir(dir.path()).unwrap();
        assert_eq!(reader.len(), 3);
        for (read, ev) in reader.zip(&events) {
            let read = read.unwrap();
            assert_eq!(read.event_id, ev.event_id);
            assert_eq!(read.hits, ev.hits);
            assert_eq!(read.truth.as_ref().unwrap(), &ev.truth);
            let particles = read.particles.unwrap();
            assert_eq!(particles.len(), ev.particles.len());
            for (a, b) in particles.iter().zip(&ev.particles) {
                assert_eq!(
                    (a.id, a.q, a.vertex_mm, a.momentum_gev, a.n_hits),
                    (b.id, b.q, b.vertex_mm, b.momentum_gev, b.n_hits)
                );
            }
        }
    }

    #[test]
    fn hits_only_directory_reads_without_truth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("event000000001-hits.csv"), "hit_id,x,y,z,volume_id,layer_id,module_id,extra\n1,0.5,-1,300,0,0,0,7\n2,1.5,2,400,0,1,0,7\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not an event").unwrap();
        let events: Vec<_> = read_trackml_dir(dir.path()).unwrap().collect();
        assert_eq!(events.len(), 1);
        let ev = events.into_iter().next().unwrap().unwrap();
        assert_eq!(ev.event_id, 1);
        assert_eq!(
            ev.hits[1],
            HitRecord {
                x_mm: 1.5,
                y_mm: 2.0,
                z_mm: 400.0,
                plane: 1,
                hit_id: 2
            }
        );
        assert!(ev.truth.is_none() && ev.particles.is_none());
    }

    #[test]
    fn bad_csv_is_refused_with_file_and_line() {
        let err = parse_hits_csv(
            b"hit_id,x,y,z,layer_id\n1,0,0,300,0\n2,abc,0,300,0\n",
            "e-hits.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("e-hits.csv: line 3: column x"), "{err}");
        let err = parse_hits_csv(
            b"hit_id,x,y,z,layer_id\n1,0,0,300,0\n1,0,0,400,1\n",
            "e-hits.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 3") && err.contains("twice"), "{err}");
        let err = parse_hits_csv(b"hit_id,x,y,z,layer_id\n1,0,nan,300,0\n", "e-hits.csv")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("not finite"),
            "{err}"
        );
        let err = parse_hits_csv(b"hit_id,x,y,z,layer_id\n1,0,0,300,70000\n", "e-hits.csv")
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer_id"), "{err}");
        let err = parse_hits_csv(b"hit_id,x,y,layer_id\n1,0,0,0\n", "e-hits.csv")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing column \"z\""), "{err}");
        let err = parse_hits_csv(b"hit_id,x,y,z,layer_id\n1,0,0,300\n", "e-hits.csv")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let err = parse_particles_csv(
            b"particle_id,vx,vy,vz,px,py,pz,q,nhits\n1,0,0,0,0,0,1,0.5,3\n",
            "p.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 2") && err.contains("column q"), "{err}");
        let hits = parse_hits_csv(b"hit_id,x,y,z,layer_id\n1,0,0,300,0\n", "h.csv").unwrap();
        let rows = parse_truth_csv(
            b"hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz\n2,1,0,0,300,0,0,1\n",
            "t.csv",
        )
        .unwrap();
        let err = align_truth(&hits, rows, "t.csv").unwrap_err().to_string();
        assert!(err.contains("no truth row for hit_id 1"), "{err}");
    }

    #[test]
    fn submission_rows_round_trip() {
        let hits: Vec<HitRecord> = (0..5)
            .map(|i| HitRecord {
                x_mm: 0.0,
                y_mm: 0.0,
                z_mm: i as f32,
                plane: i,
                hit_id: 10 + i as u32,
            })
            .collect();
        let mut out = Vec::new();
        write_submission_rows(&mut out, 7, &hits, &[vec![0, 2], vec![3]]).unwrap();
        let text = format!(
            "event_id,hit_id,track_id\n{}",
            String::from_utf8(out).unwrap()
        );
        let rows = parse_submission_csv(text.as_bytes(), "s.csv").unwrap();
        assert_eq!(
            rows,
            vec![(7, 10, 1), (7, 11, 0), (7, 12, 1), (7, 13, 2), (7, 14, 0)]
        );
    }

    #[test]
    fn committed_events_read() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tracking/minbias");
        let mut n = 0;
        for ev in read_trackml_dir(dir).unwrap() {
            let ev = ev.unwrap();
            assert!(!ev.hits.is_empty() && ev.truth.is_some() && ev.particles.is_some());
            n += 1;
        }
        assert!(n >= 2);
    }

    proptest::proptest! {
        #[test]
        fn csv_parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            fuzz_parsers(&bytes);
        }
        #[test]
        fn csv_parsers_never_panic_on_near_valid_rows(rows in proptest::collection::vec("[0-9a-z.,e+-]{0,40}", 0..8)) {
            for header in ["hit_id,x,y,z,volume_id,layer_id,module_id", "hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight",
                           "particle_id,vx,vy,vz,px,py,pz,q,nhits", "event_id,hit_id,track_id"] {
                let text = format!("{header}\n{}", rows.join("\n"));
                fuzz_parsers(text.as_bytes());
            }
        }
    }
}
