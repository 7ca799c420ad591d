//! Decision log files: a buffered file that can be reopened (SIGHUP after an outside tool
//! moved it) and rotated by size (`path` -> `path.1` -> ... -> `path.N`, the oldest
//! removed), so a months-long service does not fill its disk. Every new file starts with
//! the log's header (the binary log's names table; nothing for JSON lines).
//!
//! Rotation happens only between records ([`LogOut::after_record`]), so no record is split
//! across two files.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Size-based rotation of a decision log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate once the current file holds at least this many bytes; `None`: never.
    pub max_bytes: Option<u64>,
    /// Rotated files kept (`path.1` .. `path.keep`).
    pub keep: usize,
}

/// The writer under a decision log sink: a plain `Write`, plus what files can do.
pub trait LogOut: Write + Send {
    /// Called after each whole record; a file rotates here when it is over its size.
    fn after_record(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Closes and opens the path again (appending; a new file gets the header).
    fn reopen(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Where the bytes go, for log messages.
    fn target(&self) -> String {
        "memory".into()
    }
}

impl<W: Write + Send> LogOut for BufWriter<W> {}
impl LogOut for Vec<u8> {}

/// A buffered decision log file with reopen and size rotation.
pub struct LogFile {
    path: PathBuf,
    header: Vec<u8>,
    out: BufWriter<File>,
    /// Bytes in the current file (header included).
    bytes: u64,
    rotation: Rotation,
    buffer_bytes: usize,
}

impl LogFile {
    /// Creates (truncates) `path` and writes `header`.
    pub fn create(
        path: &Path,
        header: Vec<u8>,
        rotation: Rotation,
        buffer_bytes: usize,
    ) -> io::Result<Self> {
        let file = File::create(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating decision log {}: {e}", path.display()),
            )
        })?;
        let mut out = BufWriter::with_capacity(buffer_bytes, file);
        out.write_all(&header)?;
        Ok(Self {
            path: path.to_owned(),
            bytes: header.len() as u64,
            header,
            out,
            rotation,
            buffer_bytes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `path` for appending; writes the header if the file is new or empty.
    fn open_append(&mut self) -> io::Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut out = BufWriter::with_capacity(self.buffer_bytes, file);
        self.bytes = len;
        if len == 0 {
            out.write_all(&self.header)?;
            self.bytes = self.header.len() as u64;
        }
        self.out = out;
        Ok(())
    }

    fn rotated(&self, k: usize) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{k}"));
        PathBuf::from(s)
    }

    /// Flushes, shifts `path.k` to `path.k+1` (dropping the oldest), moves `path` to
    /// `path.1` and starts a new file.
    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let keep = self.rotation.keep.max(1);
        let oldest = self.rotated(keep);
        if oldest.exists() {
            std::fs::remove_file(&oldest)?;
        }
        for k in (1..keep).rev() {
            let from = self.rotated(k);
            if from.exists() {
                std::fs::rename(&from, self.rotated(k + 1))?;
            }
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        self.open_append()?;
        tracing::info!(file = %self.path.display(), "decision log rotated");
        Ok(())
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        // BufWriter takes a record shorter than its buffer whole or not at all.
        self.out.write_all(buf)?;
        self.bytes += buf.len() as u64;
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl LogOut for LogFile {
    fn after_record(&mut self) -> io::Result<()> {
        match self.rotation.max_bytes {
            Some(max) if self.bytes >= max => self.rotate(),
            _ => Ok(()),
        }
    }
    fn reopen(&mut self) -> io::Result<()> {
        self.out.flush()?;
        self.open_append()?;
        tracing::info!(file = %self.path.display(), "decision log reopened");
        Ok(())
    }
    fn target(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        let rot = Rotation {
            max_bytes: Some(100),
            keep: 2,
        };
        let mut f = LogFile::create(&path, b"HDR\n".to_vec(), rot, 4096).unwrap();
        for i in 0..40 {
            f.write_all(format!("record {i:03}\n").as_bytes()).unwrap();
            f.after_record().unwrap();
        }
        f.flush().unwrap();
        let cur = std::fs::read_to_string(&path).unwrap();
        let one = std::fs::read_to_string(dir.path().join("d.log.1")).unwrap();
        let two = std::fs::read_to_string(dir.path().join("d.log.2")).unwrap();
        assert!(!dir.path().join("d.log.3").exists(), "only 2 kept");
        for text in [&cur, &one, &two] {
            assert!(text.starts_with("HDR\n"), "{text}");
            assert!(text.len() <= 100 + 11, "{}", text.len());
        }
        // Records are whole and in order across the files: .2, .1, current.
        let all: Vec<&str> = [&two, &one, &cur]
            .iter()
            .flat_map(|t| t.lines().filter(|l| *l != "HDR"))
            .collect();
        let last = all.last().unwrap();
        assert_eq!(*last, "record 039");
        for w in all.windows(2) {
            let a: u32 = w[0][7..].parse().unwrap();
            let b: u32 = w[1][7..].parse().unwrap();
            assert_eq!(b, a + 1);
        }
    }

    #[test]
    fn reopen_after_a_move_starts_a_new_file_with_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        let mut f = LogFile::create(&path, b"HDR\n".to_vec(), Rotation::default(), 4096).unwrap();
        f.write_all(b"a\n").unwrap();
        f.flush().unwrap();
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        f.write_all(b"b\n").unwrap();
        f.reopen().unwrap();
        f.write_all(b"c\n").unwrap();
        f.flush().unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("moved")).unwrap(),
            "HDR\na\nb\n"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "HDR\nc\n");
    }
}
