//! LSL outputs: decisions as an LSL marker stream, so a stimulus program (PsychoPy, a TMS
//! controller, OpenViBE, NeuroPype) acts on them the way it acts on any LSL marker; and,
//! for EEG, the region-of-interest statistic as a one-channel stream for live plotting in
//! the usual viewers.
//!
//! - [`LslMarkerSink`]: stream type `Markers`, one `string` channel, irregular rate. Each
//!   marker is the decision record as JSON (the JSON lines log's format) or a short code
//!   (`accept roi`, `reject`, `timeout`, `dropped stream_gap`), stamped with the decision's
//!   frame time converted back to the LSL clock: for an LSL input that is the LSL time of the
//!   block's last sample, so the marker lines up with the EEG in any LSL recorder. By
//!   default only accepted blocks get a marker. Each push is timed from that sample's time
//!   stamp into `trigd_lsl_marker_latency_seconds`.
//! - [`LslStatisticSink`]: stream type `TriggerStatistic`, one `float32` channel, one value
//!   (the ROI window mean at the block's end) per EEG decision, same time stamps.
//!
//! Both are best effort (sink policy `drop`): a push never blocks the decision thread
//! (liblsl queues the sample for its consumers) and a failed one is counted.

use std::ffi::CStr;
use std::io;

use prometheus::Histogram;

use super::Sink;
use crate::backend::Detail;
use crate::decision::{Decision, Names};
use crate::lsl::ffi::{self, Api, Outlet, StreamInfo};
use crate::lsl::Clock;

/// What a marker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerFormat {
    /// The decision record as one JSON object.
    Json,
    /// `OUTCOME[ LINE...]` or `OUTCOME REASON`.
    Code,
}

impl MarkerFormat {
    pub fn parse(s: Option<&str>) -> io::Result<Self> {
        match s {
            None | Some("json") => Ok(Self::Json),
            Some("code") => Ok(Self::Code),
            Some(o) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("marker format {o:?}: expected json or code"),
            )),
        }
    }
}

/// Seconds of markers liblsl keeps for a consumer that connects late or lags.
const OUTLET_BUFFER_S: i32 = 60;

fn lsl_io(e: ffi::LslError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Source id of a stream trigd publishes: stable across restarts, so consumers reconnect.
pub fn source_id(kind: &str, name: &str) -> String {
    format!("trigd:{kind}:{name}")
}

/// Decisions as an LSL marker stream.
pub struct LslMarkerSink {
    api: &'static Api,
    outlet: Outlet,
    name: String,
    format: MarkerFormat,
    all: bool,
    clock: Clock,
    /// The marker's text, NUL-terminated; reused.
    text: Vec<u8>,
    latency: Option<Histogram>,
    pushed: u64,
}

impl LslMarkerSink {
    /// Publishes the marker stream `name` (`all`: every decision, else accepts only).
    pub fn open(name: &str, format: MarkerFormat, all: bool) -> io::Result<Self> {
        let api = ffi::api().map_err(lsl_io)?;
        let info = StreamInfo::new(
            api,
            name,
            "Markers",
            1,
            ffi::IRREGULAR_RATE,
            ffi::CF_STRING,
            &source_id("markers", name),
        )
        .map_err(lsl_io)?;
        info.describe(
            "trigd",
            match format {
                MarkerFormat::Json => "decision records as JSON",
                MarkerFormat::Code => "decision codes",
            },
        )
        .map_err(lsl_io)?;
        let outlet = Outlet::open(&info, 1, OUTLET_BUFFER_S).map_err(lsl_io)?;
        tracing::info!(stream = name, ?format, all, "publishing LSL markers");
        Ok(Self {
            api,
            outlet,
            name: name.to_string(),
            format,
            all,
            clock: Clock::get(api),
            text: Vec::with_capacity(1024),
            latency: None,
            pushed: 0,
        })
    }

    /// Times every push into `h` (`Metrics::lsl_marker_latency`).
    pub fn with_latency(mut self, h: Histogram) -> Self {
        self.latency = Some(h);
        self
    }

    /// Markers pushed.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }
}

/// Writes the marker text of `d` into `text` (cleared first), NUL-terminated.
pub fn format_marker(
    text: &mut Vec<u8>,
    format: MarkerFormat,
    d: &Decision,
    names: &Names,
) -> io::Result<()> {
    use std::io::Write;
    text.clear();
    match format {
        MarkerFormat::Json => {
            super::jsonl::write_decision(text, d, names)?;
            while text.last() == Some(&b'\n') {
                text.pop();
            }
        }
        MarkerFormat::Code => {
            text.extend_from_slice(d.outcome.as_str().as_bytes());
            if !d.reason.is_empty() {
                write!(text, " {}", d.reason)?;
            }
            for l in names.lines_of(d.lines_fired) {
                write!(text, " {l}")?;
            }
        }
    }
    // A NUL inside would cut the marker short: names are the operator's text.
    for b in text.iter_mut() {
        if *b == 0 {
            *b = b' ';
        }
    }
    text.push(0);
    Ok(())
}

impl Sink for LslMarkerSink {
    fn write(&mut self, d: &Decision, names: &Names) -> io::Result<()> {
        if !self.all && !d.accepted {
            return Ok(());
        }
        format_marker(&mut self.text, self.format, d, names)?;
        let ts = if d.timestamp_ns == 0 {
            ffi::local_clock(self.api)
        } else {
            self.clock.to_lsl_s(d.timestamp_ns)
        };
        let text = CStr::from_bytes_with_nul(&self.text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.outlet.push_marker(text, ts).map_err(lsl_io)?;
        self.pushed += 1;
        if let (Some(h), true) = (&self.latency, d.timestamp_ns != 0) {
            h.observe((ffi::local_clock(self.api) - ts).max(0.0));
        }
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "lsl_markers"
    }
    fn target(&self) -> String {
        format!("lsl://name={}", self.name)
    }
}

/// The EEG region-of-interest statistic as a one-channel LSL stream.
pub struct LslStatisticSink {
    outlet: Outlet,
    name: String,
    clock: Clock,
}

impl LslStatisticSink {
    pub fn open(name: &str) -> io::Result<Self> {
        let api = ffi::api().map_err(lsl_io)?;
        let info = StreamInfo::new(
            api,
            name,
            "TriggerStatistic",
            1,
            ffi::IRREGULAR_RATE,
            ffi::CF_FLOAT32,
            &source_id("statistic", name),
        )
        .map_err(lsl_io)?;
        info.describe_channels(&["roi".to_string()], "a.u.", "statistic")
            .map_err(lsl_io)?;
        let outlet = Outlet::open(&info, 1, OUTLET_BUFFER_S).map_err(lsl_io)?;
        tracing::info!(stream = name, "publishing the ROI statistic on LSL");
        Ok(Self {
            outlet,
            name: name.to_string(),
            clock: Clock::get(api),
        })
    }
}

impl Sink for LslStatisticSink {
    fn write(&mut self, d: &Decision, _names: &Names) -> io::Result<()> {
        let Detail::Eeg { statistic, .. } = d.detail else {
            return Ok(());
        };
        if d.timestamp_ns == 0 || !statistic.is_finite() {
            return Ok(());
        }
        self.outlet
            .push_f32(&[statistic as f32], self.clock.to_lsl_s(d.timestamp_ns))
            .map_err(lsl_io)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "lsl_statistic"
    }
    fn target(&self) -> String {
        format!("lsl://name={}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::testdata;

    #[test]
    fn markers_are_short_codes_or_the_json_record() {
        assert_eq!(MarkerFormat::parse(None).unwrap(), MarkerFormat::Json);
        assert_eq!(
            MarkerFormat::parse(Some("code")).unwrap(),
            MarkerFormat::Code
        );
        assert!(MarkerFormat::parse(Some("xml")).is_err());
        let names = testdata::names();
        let mut codes = Vec::new();
        let mut buf = Vec::new();
        for d in testdata::decisions() {
            format_marker(&mut buf, MarkerFormat::Code, &d, &names).unwrap();
            assert_eq!(buf.pop(), Some(0));
            codes.push(String::from_utf8(buf.clone()).unwrap());
            format_marker(&mut buf, MarkerFormat::Json, &d, &names).unwrap();
            assert_eq!(buf.pop(), Some(0));
            let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
            assert_eq!(v["seq"], d.seq);
            assert_eq!(v["outcome"], d.outcome.as_str());
        }
        assert_eq!(
            codes,
            [
                "accept two_tracks high_pt",
                "reject",
                "timeout deadline roi_power",
                "dropped ring_full",
                "malformed bad_crc"
            ]
        );
    }
}
