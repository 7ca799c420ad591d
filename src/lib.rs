//! trigd: a trigger daemon that decides, frame by frame and under a deadline, which
//! detector events or EEG blocks to keep.
//!
//! The module tree follows the data flow:
//! `sources` -> `ring` -> `pipeline` (batcher, deadline) -> `backend` (cpu | gpu, running
//! `tracking` or `eeg` reconstruction) -> `trigger` -> `decision` -> `sinks`, with
//! `metrics` watching every step and `config` / `cli` wiring it together.

pub mod backend;
pub mod cli;
pub mod eeg;
pub mod frame;
pub mod gpu;
pub mod tracking;
pub mod decision;
pub mod http;
pub mod metrics;
pub mod sinks;
