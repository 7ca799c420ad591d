//! (placeholder, replaced by the sinks module)
use crate::decision::{Decision, Names};
pub trait Sink: Send {
    fn write(&mut self, d: &Decision, names: &Names) -> std::io::Result<()>;
    fn flush(&mut self) -> std::io::Result<()>;
}
