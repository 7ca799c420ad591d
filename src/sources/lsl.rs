//! LSL source: an EEG stream on the Lab Streaming Layer, resolved by predicate
//! (`lsl://type=EEG`), its samples gathered into EEG block frames of the configured length
//! in the lead field's channel order (matched by label, see [`crate::lsl::meta`]) and in
//! volts. Each frame's time stamp is the LSL time of the block's last sample (the one that
//! completed it), with LSL's clock correction applied so it is a time on this machine's
//! clock, mapped to Unix nanoseconds by [`Clock`]; its `first_sample` counts samples on
//! the stream's time line and its sequence number counts blocks.
//!
//! The loop waits for one sample (at most [`POLL_INTERVAL`], then looks at the stop flag)
//! and takes whatever else is already waiting, so a block is handed over as soon as its
//! last sample arrives. A stream that goes away (its outlet stopped, the network went) and
//! comes back is found two ways: liblsl reconnects a stream with a `source_id` by itself
//! (the inlet asks for recovery), and trigd sees the jump in the time stamps (more than
//! [`GAP_MIN_S`]); a stream liblsl cannot recover reports itself lost, and trigd resolves
//! it again. Either way the samples already in hand go out as a short block, the samples
//! missing in between (from the time stamps) are handed over as one [`Received::Lost`]
//! (`dropped`, reason [`REASON_STREAM_GAP`]), the sample and block counters skip them, and
//! blocks go on. A stream that comes back with other channels or another rate is refused
//! and waited for again.
//!
//! Buffers (one sample, one chunk, one block, one frame) are allocated once per
//! connection; the per-sample path does not allocate.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::{Received, POLL_INTERVAL};
use crate::frame::{self, Stamp};
use crate::lsl::ffi::{self, Inlet, LslError};
use crate::lsl::meta::{self, ChannelPlan, MetaError};
use crate::lsl::url::LslUrl;
use crate::lsl::Clock;

/// Reason of the decision record that stands for samples a stream never delivered.
pub const REASON_STREAM_GAP: &str = "stream_gap";

/// Seconds of samples liblsl keeps for trigd while it is busy (then drops the oldest).
pub const INLET_BUFFER_S: i32 = 30;

/// Shortest jump in a stream's time stamps counted as a gap (and never less than two
/// blocks): timing jitter of an outlet that stamps at push time stays well below it.
pub const GAP_MIN_S: f64 = 0.25;

/// Samples taken from the inlet at once after the first one.
const CHUNK_SAMPLES: usize = 256;

/// Why the LSL source could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum LslSourceError {
    #[error(transparent)]
    Lsl(#[from] LslError),
    #[error("{url}: {source}")]
    Channels {
        url: String,
        #[source]
        source: MetaError,
    },
}

/// An `lsl://` input, ready to run on its own thread.
#[derive(Debug, Clone)]
pub struct LslInput {
    pub url: LslUrl,
    /// The lead field's channel names: the order of every frame's channels.
    pub channels: Vec<String>,
    pub block_samples: usize,
    /// The frames' `source_id` (the EEG stream they belong to).
    pub source_id: u32,
}

/// Counters the source returns when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LslStats {
    pub samples: u64,
    pub frames: u64,
    /// Times the stream was lost.
    pub losses: u64,
    /// Gaps handed over and the samples they stand for.
    pub gaps: u64,
    pub gap_samples: u64,
}

struct Connected {
    inlet: Inlet,
    plan: ChannelPlan,
    stream: String,
}

impl LslInput {
    /// Checks that liblsl can be loaded (so a missing library stops the daemon at start,
    /// with the way to install it).
    pub fn check_library() -> Result<(), LslError> {
        ffi::api().map(|_| ())
    }

    fn wait_s(&self) -> f64 {
        self.url.options.wait_s.unwrap_or(10.0)
    }

    /// Resolves and opens the stream; `None` when stopped first. A stream whose channels do
    /// not fit is an error the first time (`strict`), and waited past afterwards.
    fn connect(
        &self,
        stop: &AtomicBool,
        strict: bool,
        rate_hz: Option<f64>,
    ) -> Result<Option<Connected>, LslSourceError> {
        let api = ffi::api()?;
        let predicate = self.url.predicate();
        let mut since = Instant::now();
        let mut announced = false;
        while !stop.load(Ordering::Relaxed) {
            let Some(info) = ffi::resolve_one(api, &predicate, POLL_INTERVAL.as_secs_f64() * 4.0)?
            else {
                if !announced || since.elapsed().as_secs_f64() >= self.wait_s() {
                    tracing::info!(predicate = %predicate, "waiting for LSL stream");
                    announced = true;
                    since = Instant::now();
                }
                continue;
            };
            let opened = Inlet::open(&info, INLET_BUFFER_S, 5.0).and_then(|inlet| {
                let xml = inlet.full_info(5.0)?.xml()?;
                Ok((inlet, xml))
            });
            let (inlet, xml) = match opened {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(predicate = %predicate, "LSL stream found but not opened: {e}");
                    std::thread::sleep(POLL_INTERVAL);
                    continue;
                }
            };
            let planned = meta::parse_stream_xml(&xml).and_then(|m| {
                let plan = meta::plan_channels(&m, &self.channels, &self.url.options)?;
                Ok((m, plan))
            });
            let (m, plan) = match planned {
                Ok(p) => p,
                Err(source) if strict => {
                    return Err(LslSourceError::Channels {
                        url: self.url.to_string(),
                        source,
                    })
                }
                Err(e) => {
                    tracing::error!(predicate = %predicate, "LSL stream came back but cannot be used: {e}; waiting for another");
                    std::thread::sleep(POLL_INTERVAL * 10);
                    continue;
                }
            };
            if let Some(r) = rate_hz.filter(|&r| r != plan.sample_rate_hz) {
                tracing::error!(
                    predicate = %predicate,
                    "LSL stream came back at {} Hz instead of {r} Hz; waiting for another",
                    plan.sample_rate_hz
                );
                std::thread::sleep(POLL_INTERVAL * 10);
                continue;
            }
            // Warm the clock offset estimate so the first block's stamps are corrected.
            let offset = inlet.time_correction(2.0).unwrap_or(0.0);
            tracing::info!(
                stream = %m.name,
                kind = %m.kind,
                source_id = %m.source_id,
                host = %m.hostname,
                channels = plan.stream_index.len(),
                dropped = ?plan.dropped,
                rate_hz = plan.sample_rate_hz,
                clock_offset_s = offset,
                "LSL stream connected"
            );
            return Ok(Some(Connected {
                inlet,
                plan,
                stream: m.name,
            }));
        }
        Ok(None)
    }

    /// Runs until `stop` is set or `on` breaks. Every block becomes a
    /// [`Received::Frame`]; samples lost while the stream was away a [`Received::Lost`].
    pub fn run(
        &self,
        stop: &AtomicBool,
        mut on: impl FnMut(Received<'_>, Instant) -> ControlFlow<()>,
    ) -> Result<LslStats, LslSourceError> {
        let api = ffi::api()?;
        let clock = Clock::get(api);
        let mut stats = LslStats::default();
        let Some(mut conn) = self.connect(stop, true, None)? else {
            return Ok(stats);
        };
        let n_out = self.channels.len();
        let rate_hz = conn.plan.sample_rate_hz;
        let mut blocks = BlockBuilder::new(n_out, self.block_samples, rate_hz, self.source_id);
        let mut last_ts: Option<f64> = None;
        let mut resumed = false;
        // A jump in the time stamps this large is a gap (liblsl recovered the stream, or
        // dropped samples trigd was too slow to take); less is jitter of the stamps.
        let gap_s = GAP_MIN_S.max(2.0 * self.block_samples as f64 / rate_hz);
        loop {
            let n_in = conn.plan.stream_channels;
            let mut sample = vec![0f32; n_in];
            let mut chunk = vec![0f32; n_in * CHUNK_SAMPLES];
            let mut stamps = vec![0f64; CHUNK_SAMPLES];
            let lost = 'pull: loop {
                if stop.load(Ordering::Relaxed) {
                    break 'pull None;
                }
                let ts = match conn
                    .inlet
                    .pull_sample(&mut sample, POLL_INTERVAL.as_secs_f64())
                {
                    Ok(Some(ts)) => ts,
                    Ok(None) => continue,
                    Err(e) => break 'pull Some(e),
                };
                let mut flow = ControlFlow::Continue(());
                let mut take = |s: &[f32], ts: f64, flow: &mut ControlFlow<()>| {
                    let jump = last_ts.is_some_and(|l| ts - l > gap_s);
                    if resumed || jump {
                        resumed = false;
                        if blocks.filled > 0 {
                            stats.frames += 1;
                            if on(Received::Frame(blocks.frame(&clock)), Instant::now()).is_break()
                            {
                                *flow = ControlFlow::Break(());
                            }
                        }
                        if let Some(r) = blocks.gap(last_ts, ts, &clock) {
                            stats.gaps += 1;
                            stats.gap_samples += r.samples;
                            tracing::warn!(
                                stream = %conn.stream,
                                missing_samples = r.samples,
                                "LSL stream is back after a gap"
                            );
                            if on(r.received(), Instant::now()).is_break() {
                                *flow = ControlFlow::Break(());
                            }
                        }
                    }
                    last_ts = Some(ts);
                    stats.samples += 1;
                    if blocks.push(s, ts, &conn.plan) {
                        stats.frames += 1;
                        let f = blocks.frame(&clock);
                        if on(Received::Frame(f), Instant::now()).is_break() {
                            *flow = ControlFlow::Break(());
                        }
                    }
                };
                take(&sample, ts, &mut flow);
                match conn.inlet.pull_chunk(&mut chunk, &mut stamps) {
                    Ok(n) => {
                        for k in 0..n {
                            take(&chunk[k * n_in..(k + 1) * n_in], stamps[k], &mut flow);
                        }
                    }
                    Err(e) => break 'pull Some(e),
                }
                if flow.is_break() {
                    return Ok(stats);
                }
            };
            let Some(e) = lost else {
                // Stopped: hand over the samples in hand.
                if blocks.filled > 0 {
                    stats.frames += 1;
                    let _ = on(Received::Frame(blocks.frame(&clock)), Instant::now());
                }
                return Ok(stats);
            };
            stats.losses += 1;
            tracing::warn!(stream = %conn.stream, losses = stats.losses, "LSL stream lost ({e}); resolving it again");
            if blocks.filled > 0 {
                stats.frames += 1;
                if on(Received::Frame(blocks.frame(&clock)), Instant::now()).is_break() {
                    return Ok(stats);
                }
            }
            drop(conn);
            conn = match self.connect(stop, false, Some(rate_hz))? {
                Some(c) => c,
                None => return Ok(stats),
            };
            resumed = true;
        }
    }
}

/// A gap found when a stream came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GapRecord {
    source_id: u32,
    sequence: u64,
    timestamp_ns: u64,
    samples: u64,
    frames: u64,
}

impl GapRecord {
    fn received(&self) -> Received<'static> {
        Received::Lost {
            reason: REASON_STREAM_GAP,
            source_id: self.source_id,
            sequence: self.sequence,
            timestamp_ns: self.timestamp_ns,
            samples: self.samples,
            frames: self.frames,
        }
    }
}

/// Gathers samples into channel-major blocks in the lead field's order, in volts, and
/// encodes each full block as a frame. Pure: no liblsl, so it is tested on its own.
struct BlockBuilder {
    n_channels: usize,
    block_samples: usize,
    rate_hz: f64,
    source_id: u32,
    /// `[n_channels, block_samples]`, channel-major.
    block: Vec<f32>,
    /// Compacted copy of a short block.
    short: Vec<f32>,
    filled: usize,
    /// Stream time line index of the block's first sample.
    first_sample: u64,
    /// LSL time of the last sample taken.
    last_ts: f64,
    seq: u64,
    frame: Vec<u8>,
}

impl BlockBuilder {
    fn new(n_channels: usize, block_samples: usize, rate_hz: f64, source_id: u32) -> Self {
        let block_samples = block_samples.max(1);
        Self {
            n_channels,
            block_samples,
            rate_hz,
            source_id,
            block: vec![0.0; n_channels * block_samples],
            short: Vec::with_capacity(n_channels * block_samples),
            filled: 0,
            first_sample: 0,
            last_ts: 0.0,
            seq: 0,
            frame: Vec::with_capacity(
                frame::HEADER_LEN + frame::EEG_HEADER_LEN + 4 * n_channels * block_samples,
            ),
        }
    }

    /// Takes one stream sample; true when the block is full (call [`Self::frame`]).
    #[inline]
    fn push(&mut self, sample: &[f32], ts: f64, plan: &ChannelPlan) -> bool {
        let t = self.filled;
        for (c, (&i, &scale)) in plan
            .stream_index
            .iter()
            .zip(&plan.volts_per_unit)
            .enumerate()
        {
            self.block[c * self.block_samples + t] = sample[i] * scale;
        }
        self.filled += 1;
        self.last_ts = ts;
        self.filled == self.block_samples
    }

    /// Encodes the block in hand (full, or short when the stream was lost or stopped) and
    /// starts the next one.
    fn frame(&mut self, clock: &Clock) -> &[u8] {
        let n = self.filled;
        debug_assert!(n > 0);
        let samples: &[f32] = if n == self.block_samples {
            &self.block
        } else {
            self.short.clear();
            for c in 0..self.n_channels {
                let row = &self.block[c * self.block_samples..];
                self.short.extend_from_slice(&row[..n]);
            }
            &self.short
        };
        let stamp = Stamp {
            source_id: self.source_id,
            sequence: self.seq,
            timestamp_ns: clock.to_unix_ns(self.last_ts),
        };
        frame::encode_eeg_block_in_place(
            &mut self.frame,
            stamp,
            self.n_channels,
            self.rate_hz,
            self.first_sample,
            samples,
        );
        self.first_sample += n as u64;
        self.seq += 1;
        self.filled = 0;
        &self.frame
    }

    /// The stream came back with a sample stamped `ts` after the last one at `last`:
    /// skips the missing samples on the time line and the blocks they span, and returns
    /// the record that stands for them.
    fn gap(&mut self, last: Option<f64>, ts: f64, clock: &Clock) -> Option<GapRecord> {
        debug_assert_eq!(self.filled, 0, "a lost stream's samples went out first");
        let missing = match last {
            Some(l) if ts > l => (((ts - l) * self.rate_hz).round() as u64).saturating_sub(1),
            _ => 0,
        };
        let frames = missing.div_ceil(self.block_samples as u64).max(1);
        let r = GapRecord {
            source_id: self.source_id,
            sequence: self.seq,
            timestamp_ns: clock.to_unix_ns(ts),
            samples: missing,
            frames,
        };
        self.seq += frames;
        self.first_sample += missing;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Payload;

    fn plan() -> ChannelPlan {
        // Stream order: C, A, B (microvolts); lead field order: A, B, C.
        ChannelPlan {
            stream_index: vec![1, 2, 0],
            volts_per_unit: vec![1e-6; 3],
            dropped: vec![],
            sample_rate_hz: 100.0,
            stream_channels: 3,
        }
    }

    #[test]
    fn samples_become_blocks_in_lead_field_order_and_volts() {
        let clock = Clock::with_origin(1_000_000_000_000, 50.0);
        let mut b = BlockBuilder::new(3, 2, 100.0, 7);
        assert!(!b.push(&[3.0, 1.0, 2.0], 50.00, &plan()));
        assert!(b.push(&[30.0, 10.0, 20.0], 50.01, &plan()));
        let f = b.frame(&clock).to_vec();
        let v = frame::parse(&f).unwrap();
        assert_eq!(v.source_id(), 7);
        assert_eq!(v.sequence(), 0);
        assert_eq!(v.header.timestamp_ns.get(), 1_000_010_000_000);
        let Payload::Eeg(e) = v.payload else { panic!() };
        assert_eq!((e.n_channels(), e.n_samples()), (3, 2));
        assert_eq!(e.header.first_sample.get(), 0);
        assert_eq!(e.at(0, 0), 1.0e-6);
        assert_eq!(e.at(0, 1), 10.0e-6);
        assert_eq!(e.at(2, 1), 30.0e-6);
        // A short block (the stream was lost) keeps the layout channel-major.
        assert!(!b.push(&[4.0, 5.0, 6.0], 50.02, &plan()));
        let f = b.frame(&clock).to_vec();
        let Payload::Eeg(e) = frame::parse(&f).unwrap().payload else {
            panic!()
        };
        assert_eq!((e.n_samples(), e.header.first_sample.get()), (1, 2));
        assert_eq!(
            (e.at(0, 0), e.at(1, 0), e.at(2, 0)),
            (5.0e-6, 6.0e-6, 4.0e-6)
        );
    }

    #[test]
    fn a_gap_skips_the_missing_samples_and_blocks() {
        let clock = Clock::with_origin(0, 0.0);
        let mut b = BlockBuilder::new(3, 4, 100.0, 1);
        for k in 0..4 {
            b.push(&[0.0; 3], 10.0 + k as f64 * 0.01, &plan());
        }
        let _ = b.frame(&clock);
        // Last sample at 10.03; back at 10.13: samples 4..=12 (9) are missing.
        let g = b.gap(Some(10.03), 10.13, &clock).unwrap();
        assert_eq!((g.sequence, g.samples, g.frames), (1, 9, 3));
        assert_eq!(b.first_sample, 13);
        assert_eq!(b.seq, 4);
        // Back without a measurable gap (a restarted clock): still one record.
        let g = b.gap(Some(10.13), 10.0, &clock).unwrap();
        assert_eq!((g.samples, g.frames), (0, 1));
    }
}
