//! trigd: a trigger daemon that decides, frame by frame and under a deadline, which
//! detector events or EEG blocks to keep.
//!
//! The module tree follows the data flow:
//! `sources` -> `ring` -> `pipeline` (batcher, deadline) -> `backend` (cpu | gpu, running
//! `tracking` or `eeg` reconstruction) -> `trigger` -> `decision` -> `sinks`, with
//! `metrics` watching every step and `config` / `cli` wiring it together.

pub mod backend;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod decision;
pub mod eeg;
pub mod farm;
pub mod frame;
pub mod fuzz;
pub mod gpu;
pub mod http;
pub mod lsl;
pub mod metrics;
pub mod notify;
pub mod npy;
pub mod pipeline;
pub mod record;
pub mod recording;
pub mod report;
pub mod ring;
pub mod send;
pub mod sinks;
pub mod sources;
pub mod top;
pub mod tracking;
pub mod workload;
