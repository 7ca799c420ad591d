//! EEG source estimation: inputs (lead field, source positions, noise covariance, channel
//! names), the inverse operator as MNE-Python builds it, EDF/BDF input, online filtering,
//! and the region-of-interest trigger. A library of its own: it does not depend on the
//! runtime.

pub mod cli;
pub mod cpu_apply;
pub mod edf;
pub mod eloreta;
pub mod filter;
pub mod inputs;
pub mod inverse;
pub mod kernel;
pub mod roi;
pub mod simulate;
pub mod workers;
