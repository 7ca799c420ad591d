//! `trigd send RECORDING --to lsl://name=...`: plays EEG as an LSL amplifier would, so a lab
//! can rehearse a closed loop without hardware. An EDF/BDF file or a native recording of
//! EEG blocks becomes an LSL outlet (type `EEG` unless the address says otherwise,
//! `float32` samples in microvolts, the channel labels and units in
//! `desc/channels/channel`), its samples pushed at the recorded rate on an absolute
//! schedule (sample `i` at `t0 + i / rate`, stamped with that time on the LSL clock).
//! It waits for a consumer before the first sample, so nothing is played to nobody.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use super::ffi::{self, Outlet, StreamInfo};
use super::url::LslUrl;
use crate::frame::{self, Payload};

/// What a play did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlaySummary {
    pub samples: u64,
    pub channels: usize,
    pub rate_hz: f64,
    pub seconds: f64,
}

/// EEG to play: channel labels, the rate, and the samples in channel-major blocks.
trait Samples {
    /// Next block: fills `out` channel-major `[n_channels, n]` in volts and returns `n`;
    /// 0 at the end.
    fn next_block(&mut self, out: &mut Vec<f32>) -> anyhow::Result<usize>;
}

struct EdfSamples {
    blocks: crate::sources::replay::EdfFeed,
    frame: Vec<u8>,
}

impl Samples for EdfSamples {
    fn next_block(&mut self, out: &mut Vec<f32>) -> anyhow::Result<usize> {
        use crate::pipeline::FrameFeed;
        match self.blocks.next_frame(&mut self.frame) {
            None => Ok(0),
            Some(Err(e)) => anyhow::bail!("{} ({})", e.detail, e.reason),
            Some(Ok(())) => block_of(&self.frame, out),
        }
    }
}

struct RecordingSamples {
    rec: crate::recording::Recording,
    next: usize,
}

impl Samples for RecordingSamples {
    fn next_block(&mut self, out: &mut Vec<f32>) -> anyhow::Result<usize> {
        match self.rec.get(self.next) {
            None => Ok(0),
            Some(f) => {
                self.next += 1;
                block_of(f, out)
            }
        }
    }
}

fn block_of(bytes: &[u8], out: &mut Vec<f32>) -> anyhow::Result<usize> {
    let v = frame::parse(bytes).map_err(|e| anyhow::anyhow!("frame: {e}"))?;
    let Payload::Eeg(b) = v.payload else {
        anyhow::bail!("the recording holds hit events, not EEG blocks");
    };
    out.clear();
    out.extend(b.samples.iter().map(|s| s.get()));
    Ok(b.n_samples())
}

/// The first EEG block's channel count and rate of a native recording.
fn recording_shape(rec: &crate::recording::Recording) -> anyhow::Result<(usize, f64)> {
    let f = rec.get(0).context("the recording is empty")?;
    let v = frame::parse(f).map_err(|e| anyhow::anyhow!("first frame: {e}"))?;
    let Payload::Eeg(b) = v.payload else {
        anyhow::bail!("the recording holds hit events, not EEG blocks");
    };
    Ok((b.n_channels(), b.header.sample_rate_hz.get()))
}

/// How long the outlet stays open after the last sample, for liblsl to send what it holds.
const LINGER_S: f64 = 0.5;

/// Plays `path` (EDF/BDF, or a native recording of EEG blocks with `channels` naming its
/// channels) as the LSL stream `url` until the end or `stop`.
pub fn play(
    path: &Path,
    url: &LslUrl,
    channels: Option<&[String]>,
    stop: &AtomicBool,
) -> anyhow::Result<PlaySummary> {
    anyhow::ensure!(
        url.raw.is_none(),
        "{url}: an outlet is named with lsl://name=...&type=...&source_id=..., not a predicate"
    );
    let is_edf = matches!(
        crate::sources::replay::InputFormat::of(path),
        crate::sources::replay::InputFormat::Edf
    );
    let (labels, rate_hz, mut samples): (Vec<String>, f64, Box<dyn Samples>) = if is_edf {
        let reader = crate::eeg::edf::EdfReader::open(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let all: Vec<String> = reader
            .data_signals()
            .iter()
            .map(|&s| reader.header().signals[s].label.trim().to_string())
            .collect();
        let labels = channels.map(<[String]>::to_vec).unwrap_or(all);
        let feed = crate::sources::replay::EdfFeed::open(path, &labels, 64)?;
        let rate = {
            let sig = reader
                .find_signals(&labels)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            reader.header().sample_rate_hz(sig[0])
        };
        (
            labels,
            rate,
            Box::new(EdfSamples {
                blocks: feed,
                frame: Vec::new(),
            }),
        )
    } else {
        let rec = crate::recording::Recording::open(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let (n, rate) = recording_shape(&rec)?;
        let labels = channels
            .map(<[String]>::to_vec)
            .context("a native recording carries no channel names: give --channels FILE (one per line, in the frames' order)")?;
        anyhow::ensure!(
            labels.len() == n,
            "--channels names {} channels; the recording's blocks have {n}",
            labels.len()
        );
        (labels, rate, Box::new(RecordingSamples { rec, next: 0 }))
    };
    let api = ffi::api()?;
    let name = url.field("name").map(String::from).unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trigd".into())
    });
    let source_id = url
        .field("source_id")
        .map(String::from)
        .unwrap_or_else(|| format!("trigd-send:{name}"));
    let info = StreamInfo::new(
        api,
        &name,
        url.field("type").unwrap_or("EEG"),
        labels.len(),
        rate_hz,
        ffi::CF_FLOAT32,
        &source_id,
    )?;
    info.describe_channels(&labels, "microvolts", "EEG")?;
    info.describe("source_file", &path.display().to_string())?;
    let outlet = Outlet::open(&info, labels.len(), 30)?;
    tracing::info!(stream = %name, channels = labels.len(), rate_hz, "LSL outlet open; waiting for a consumer");
    while !outlet.wait_for_consumers(0.2) {
        if stop.load(Ordering::Relaxed) {
            return Ok(PlaySummary {
                samples: 0,
                channels: labels.len(),
                rate_hz,
                seconds: 0.0,
            });
        }
    }
    let n_ch = labels.len();
    let t0 = ffi::local_clock(api) + 0.01;
    let mut block = Vec::new();
    let mut sample = vec![0f32; n_ch];
    let mut i = 0u64;
    'blocks: loop {
        let n = samples.next_block(&mut block)?;
        if n == 0 {
            break;
        }
        for t in 0..n {
            let ts = t0 + i as f64 / rate_hz;
            loop {
                let left = ts - ffi::local_clock(api);
                if left <= 0.0 {
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    break 'blocks;
                }
                if left > 300e-6 {
                    std::thread::sleep(Duration::from_secs_f64((left - 200e-6).min(0.05)));
                } else {
                    std::hint::spin_loop();
                }
            }
            for (c, v) in sample.iter_mut().enumerate() {
                *v = block[c * n + t] * 1e6;
            }
            outlet.push_f32(&sample, ts)?;
            i += 1;
        }
    }
    // liblsl sends pushed samples from its own threads: an outlet destroyed at once can take
    // the last ones with it. Linger while a consumer is connected, at most half a second.
    let seconds = ffi::local_clock(api) - t0;
    let linger_until = ffi::local_clock(api) + LINGER_S;
    while ffi::local_clock(api) < linger_until
        && outlet.have_consumers()
        && !stop.load(Ordering::Relaxed)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(PlaySummary {
        samples: i,
        channels: n_ch,
        rate_hz,
        seconds,
    })
}
