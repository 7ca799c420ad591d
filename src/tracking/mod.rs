//! Tracking for particle detectors with planar layers: detector and field description,
//! simulation with truth, cellular-automaton track finding, Kalman fitting, evaluation and
//! trigger lines. A library of its own: it does not depend on the runtime.

pub mod beam_spot;
pub mod ca;
pub mod cli;
pub mod eval;
pub mod field;
pub mod geometry;
pub mod kalman;
pub mod lines;
pub mod propagate;
pub mod reco;
pub mod simulate;
pub mod spectrum;
pub mod track;
pub mod trackml;
