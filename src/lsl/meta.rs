//! A stream's description as liblsl hands it over (`lsl_get_xml`: the `<info>` document
//! with `name`, `type`, `channel_count`, `nominal_srate`, `channel_format`, `source_id` and
//! the free-form `<desc>`), read into [`StreamMeta`]; and the plan that maps its channels
//! onto the lead field's by label ([`ChannelPlan`]), following the usual
//! `desc/channels/channel/{label,unit,type}` metadata (XDF's meta-data conventions). A
//! channel is never matched by position: a missing, extra, duplicated or unlabelled
//! channel is an error that names it, unless the configuration drops it.

use std::collections::HashMap;

use super::url::{volts_per_unit, LslOptions};

/// Largest description accepted (bytes); a real header with a few hundred channels is
/// tens of kilobytes.
pub const MAX_XML_BYTES: usize = 4 << 20;

/// One channel of a stream's description.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChannelMeta {
    pub label: String,
    pub unit: Option<String>,
    pub kind: Option<String>,
}

/// What trigd needs of a stream's header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamMeta {
    pub name: String,
    pub kind: String,
    pub channel_count: usize,
    pub nominal_srate_hz: f64,
    pub channel_format: String,
    pub source_id: String,
    pub hostname: String,
    /// `desc/channels/channel`, in stream order; empty when the stream describes none.
    pub channels: Vec<ChannelMeta>,
}

/// Why a stream cannot be used as configured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetaError {
    #[error("stream description is not valid XML: {0}")]
    Xml(String),
    #[error("stream description: {0}")]
    Invalid(String),
    #[error("stream {stream:?} describes no channel labels (desc/channels/channel/label); trigd matches EEG channels to the lead field by name and will not guess them by position: publish the labels in the stream's metadata")]
    NoLabels { stream: String },
    #[error("stream {stream:?}: the lead field's channel(s) {missing:?} are missing from the stream (it has: {available:?})")]
    Missing {
        stream: String,
        missing: Vec<String>,
        available: Vec<String>,
    },
    #[error("stream {stream:?}: channel(s) {extra:?} are not in the lead field's channel list; drop them with drop=... (or extra=drop) in the lsl:// address or drop_channels / extra_channels in [[input]]")]
    Extra { stream: String, extra: Vec<String> },
    #[error("stream {stream:?}: channel label {label:?} appears more than once (channels {first} and {second})")]
    Duplicate {
        stream: String,
        label: String,
        first: usize,
        second: usize,
    },
    #[error("stream {stream:?}: channel {label:?} has no unit in its metadata; give the unit with unit=uV (or V, mV) in the lsl:// address or unit in [[input]]")]
    NoUnit { stream: String, label: String },
    #[error("stream {stream:?}: channel {label:?} has unit {unit:?}, which is not a voltage trigd knows (V, mV, uV/µV/microvolts, nV); set the unit in the configuration")]
    BadUnit {
        stream: String,
        label: String,
        unit: String,
    },
    #[error("configured unit {0:?} is not a voltage trigd knows (V, mV, uV/µV/microvolts, nV)")]
    BadConfiguredUnit(String),
    #[error("stream {stream:?} has an irregular or invalid nominal rate ({rate}); EEG blocks need a fixed sample rate")]
    Rate { stream: String, rate: f64 },
    #[error("stream {stream:?} has channel format {format:?}; EEG needs numeric samples (float32, double64, int32, int16, int8)")]
    Format { stream: String, format: String },
}

fn child_text<'a>(node: roxmltree::Node<'a, 'a>, name: &str) -> Option<&'a str> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
        .map(|c| c.text().unwrap_or("").trim())
}

/// Reads the `<info>` document liblsl returns for a stream.
pub fn parse_stream_xml(xml: &str) -> Result<StreamMeta, MetaError> {
    if xml.len() > MAX_XML_BYTES {
        return Err(MetaError::Invalid(format!(
            "{} bytes, more than the {MAX_XML_BYTES}-byte limit",
            xml.len()
        )));
    }
    let doc = roxmltree::Document::parse(xml).map_err(|e| MetaError::Xml(e.to_string()))?;
    let info = doc.root_element();
    if info.tag_name().name() != "info" {
        return Err(MetaError::Invalid(format!(
            "root element is <{}>, expected <info>",
            info.tag_name().name()
        )));
    }
    let text = |n: &str| child_text(info, n).unwrap_or("").to_string();
    let channel_count = match child_text(info, "channel_count") {
        Some(c) => c
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= crate::frame::MAX_EEG_CHANNELS * 4)
            .ok_or_else(|| MetaError::Invalid(format!("channel_count {c:?} is not a count")))?,
        None => return Err(MetaError::Invalid("no channel_count".into())),
    };
    let nominal_srate_hz = match child_text(info, "nominal_srate") {
        Some(r) => r
            .parse::<f64>()
            .map_err(|_| MetaError::Invalid(format!("nominal_srate {r:?} is not a number")))?,
        None => 0.0,
    };
    let mut channels = Vec::new();
    if let Some(chs) = info
        .children()
        .find(|c| c.is_element() && c.tag_name().name() == "desc")
        .and_then(|d| {
            d.children()
                .find(|c| c.is_element() && c.tag_name().name() == "channels")
        })
    {
        for ch in chs
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "channel")
        {
            if channels.len() >= channel_count.max(1) * 2 {
                break;
            }
            let opt = |n: &str| {
                child_text(ch, n)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
            };
            channels.push(ChannelMeta {
                label: child_text(ch, "label").unwrap_or("").to_string(),
                unit: opt("unit"),
                kind: opt("type"),
            });
        }
    }
    Ok(StreamMeta {
        name: text("name"),
        kind: text("type"),
        channel_count,
        nominal_srate_hz,
        channel_format: text("channel_format"),
        source_id: text("source_id"),
        hostname: text("hostname"),
        channels,
    })
}

/// How a stream's samples become a frame's channels, in the lead field's order.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelPlan {
    /// For each configured channel, its index in the stream's sample.
    pub stream_index: Vec<usize>,
    /// For each configured channel, volts per stream unit.
    pub volts_per_unit: Vec<f32>,
    /// Stream channels left out, by label.
    pub dropped: Vec<String>,
    pub sample_rate_hz: f64,
    pub stream_channels: usize,
}

/// Maps `meta`'s channels onto `configured` (the lead field's channel names) by label.
pub fn plan_channels(
    meta: &StreamMeta,
    configured: &[String],
    options: &LslOptions,
) -> Result<ChannelPlan, MetaError> {
    let stream = meta.name.clone();
    if !(meta.nominal_srate_hz.is_finite() && meta.nominal_srate_hz > 0.0) {
        return Err(MetaError::Rate {
            stream,
            rate: meta.nominal_srate_hz,
        });
    }
    if !matches!(
        meta.channel_format.as_str(),
        "float32" | "double64" | "int32" | "int16" | "int8"
    ) {
        return Err(MetaError::Format {
            stream,
            format: meta.channel_format.clone(),
        });
    }
    if meta.channels.is_empty() || meta.channels.iter().all(|c| c.label.is_empty()) {
        return Err(MetaError::NoLabels { stream });
    }
    if meta.channels.len() != meta.channel_count {
        return Err(MetaError::Invalid(format!(
            "stream {stream:?} has {} channels but describes {}",
            meta.channel_count,
            meta.channels.len()
        )));
    }
    let mut by_label: HashMap<&str, usize> = HashMap::new();
    for (i, c) in meta.channels.iter().enumerate() {
        if c.label.is_empty() {
            return Err(MetaError::Invalid(format!(
                "stream {stream:?}: channel {i} has an empty label"
            )));
        }
        if let Some(first) = by_label.insert(c.label.as_str(), i) {
            return Err(MetaError::Duplicate {
                stream,
                label: c.label.clone(),
                first,
                second: i,
            });
        }
    }
    let configured_unit = match &options.unit {
        Some(u) => Some(volts_per_unit(u).ok_or_else(|| MetaError::BadConfiguredUnit(u.clone()))?),
        None => None,
    };
    let mut missing = Vec::new();
    let mut stream_index = Vec::with_capacity(configured.len());
    let mut scales = Vec::with_capacity(configured.len());
    for name in configured {
        match by_label.get(name.as_str()) {
            Some(&i) if !options.drop.contains(name) => {
                let ch = &meta.channels[i];
                let scale = match (configured_unit, &ch.unit) {
                    (Some(s), _) => s,
                    (None, Some(u)) => volts_per_unit(u).ok_or_else(|| MetaError::BadUnit {
                        stream: stream.clone(),
                        label: ch.label.clone(),
                        unit: u.clone(),
                    })?,
                    (None, None) => {
                        return Err(MetaError::NoUnit {
                            stream,
                            label: ch.label.clone(),
                        })
                    }
                };
                stream_index.push(i);
                scales.push(scale as f32);
            }
            _ => missing.push(name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(MetaError::Missing {
            stream,
            missing,
            available: meta.channels.iter().map(|c| c.label.clone()).collect(),
        });
    }
    let mut dropped = Vec::new();
    let mut extra = Vec::new();
    for c in &meta.channels {
        if configured.contains(&c.label) {
            continue;
        }
        if options.drop_extra || options.drop.contains(&c.label) {
            dropped.push(c.label.clone());
        } else {
            extra.push(c.label.clone());
        }
    }
    if !extra.is_empty() {
        return Err(MetaError::Extra { stream, extra });
    }
    Ok(ChannelPlan {
        stream_index,
        volts_per_unit: scales,
        dropped,
        sample_rate_hz: meta.nominal_srate_hz,
        stream_channels: meta.channel_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xml(labels: &[(&str, Option<&str>)], rate: &str) -> String {
        let chans: String = labels
            .iter()
            .map(|(l, u)| {
                format!(
                    "<channel><label>{l}</label>{}<type>EEG</type></channel>",
                    u.map(|u| format!("<unit>{u}</unit>")).unwrap_or_default()
                )
            })
            .collect();
        format!(
            "<?xml version=\"1.0\"?>\n<info><name>amp</name><type>EEG</type><channel_count>{}</channel_count>\
             <channel_format>float32</channel_format><source_id>sn1</source_id><nominal_srate>{rate}</nominal_srate>\
             <hostname>h</hostname><desc><channels>{chans}</channels><manufacturer>X</manufacturer></desc></info>",
            labels.len()
        )
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn channels_are_matched_by_label_whatever_the_stream_order() {
        let m = parse_stream_xml(&xml(
            &[
                ("Cz", Some("microvolts")),
                ("Fp1", Some("microvolts")),
                ("Pz", Some("V")),
            ],
            "512",
        ))
        .unwrap();
        assert_eq!(m.name, "amp");
        assert_eq!(m.channel_count, 3);
        assert_eq!(m.nominal_srate_hz, 512.0);
        assert_eq!(m.source_id, "sn1");
        let p = plan_channels(&m, &names(&["Fp1", "Pz", "Cz"]), &LslOptions::default()).unwrap();
        assert_eq!(p.stream_index, vec![1, 2, 0]);
        assert_eq!(p.volts_per_unit, vec![1e-6, 1.0, 1e-6]);
        assert!(p.dropped.is_empty());
    }

    #[test]
    fn a_missing_channel_is_named() {
        let m = parse_stream_xml(&xml(&[("Cz", Some("uV")), ("Fp1", Some("uV"))], "256")).unwrap();
        let e =
            plan_channels(&m, &names(&["Fp1", "Oz", "Cz"]), &LslOptions::default()).unwrap_err();
        assert!(
            matches!(&e, MetaError::Missing { missing, .. } if missing == &["Oz"]),
            "{e}"
        );
        assert!(e.to_string().contains("\"Oz\""));
    }

    #[test]
    fn an_extra_channel_is_an_error_unless_dropped() {
        let m = parse_stream_xml(&xml(
            &[("Cz", Some("uV")), ("TRIG", None), ("Fp1", Some("uV"))],
            "256",
        ))
        .unwrap();
        let want = names(&["Fp1", "Cz"]);
        let e = plan_channels(&m, &want, &LslOptions::default()).unwrap_err();
        assert!(e.to_string().contains("\"TRIG\""), "{e}");
        let by_name = LslOptions {
            drop: vec!["TRIG".into()],
            ..LslOptions::default()
        };
        let p = plan_channels(&m, &want, &by_name).unwrap();
        assert_eq!(p.stream_index, vec![2, 0]);
        assert_eq!(p.dropped, vec!["TRIG"]);
        let all = LslOptions {
            drop_extra: true,
            ..LslOptions::default()
        };
        assert_eq!(
            plan_channels(&m, &want, &all).unwrap().stream_index,
            vec![2, 0]
        );
        // Dropping a channel the lead field needs makes it missing, never shifted.
        let wrong = LslOptions {
            drop: vec!["Cz".into(), "TRIG".into()],
            ..LslOptions::default()
        };
        assert!(matches!(
            plan_channels(&m, &want, &wrong),
            Err(MetaError::Missing { .. })
        ));
    }

    #[test]
    fn units_come_from_metadata_or_configuration() {
        let m = parse_stream_xml(&xml(&[("Cz", None), ("Fp1", Some("furlongs"))], "256")).unwrap();
        let want = names(&["Fp1", "Cz"]);
        let e = plan_channels(&m, &want, &LslOptions::default()).unwrap_err();
        assert!(matches!(e, MetaError::BadUnit { .. }), "{e}");
        let m2 = parse_stream_xml(&xml(&[("Cz", None), ("Fp1", Some("uV"))], "256")).unwrap();
        let e = plan_channels(&m2, &want, &LslOptions::default()).unwrap_err();
        assert!(e.to_string().contains("\"Cz\" has no unit"), "{e}");
        let uv = LslOptions {
            unit: Some("uV".into()),
            ..LslOptions::default()
        };
        assert_eq!(
            plan_channels(&m, &want, &uv).unwrap().volts_per_unit,
            vec![1e-6, 1e-6]
        );
    }

    #[test]
    fn streams_without_labels_rate_or_numbers_are_refused() {
        let bare = "<info><name>a</name><channel_count>2</channel_count><nominal_srate>100</nominal_srate><channel_format>float32</channel_format><desc/></info>";
        let m = parse_stream_xml(bare).unwrap();
        assert!(matches!(
            plan_channels(&m, &names(&["A", "B"]), &LslOptions::default()),
            Err(MetaError::NoLabels { .. })
        ));
        let m = parse_stream_xml(&xml(&[("A", Some("uV"))], "0")).unwrap();
        assert!(matches!(
            plan_channels(&m, &names(&["A"]), &LslOptions::default()),
            Err(MetaError::Rate { .. })
        ));
        let dup = parse_stream_xml(&xml(&[("A", Some("uV")), ("A", Some("uV"))], "10")).unwrap();
        assert!(matches!(
            plan_channels(&dup, &names(&["A"]), &LslOptions::default()),
            Err(MetaError::Duplicate { .. })
        ));
        assert!(parse_stream_xml("<info><name>").is_err());
        assert!(parse_stream_xml("<other/>").is_err());
        assert!(parse_stream_xml("<info><channel_count>-1</channel_count></info>").is_err());
    }

    proptest::proptest! {
        /// Mutated descriptions (a fragment of XML-ish text spliced in anywhere) give a
        /// description or an error, and any plan keeps every channel on its own label.
        #[test]
        fn mutated_descriptions_never_panic_or_shift(
            at in 0usize..600,
            cut in 0usize..40,
            junk in "[<>/a-z_0-9 '\"&;=!?-]{0,24}",
        ) {
            let x = xml(
                &[("Fp1", Some("uV")), ("Cz", None), ("Status", Some("V")), ("Pz", Some("µV"))],
                "512",
            );
            let mut at = at.min(x.len());
            while !x.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + cut).min(x.len());
            while !x.is_char_boundary(end) {
                end -= 1;
            }
            let mutated = format!("{}{junk}{}", &x[..at], &x[end..]);
            let mut bytes = vec![14u8];
            bytes.extend_from_slice(b"lsl://type=EEG");
            bytes.extend_from_slice(mutated.as_bytes());
            crate::fuzz::lsl_meta(&bytes);
        }
    }
}
