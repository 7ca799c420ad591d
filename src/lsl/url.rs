//! `lsl://` addresses: which Lab Streaming Layer stream an input resolves, or which stream
//! an outlet (`trigd send`, the marker stream) publishes, plus trigd's own options.
//!
//! Two forms:
//! - `lsl://KEY=VALUE&KEY=VALUE...`: each stream field (`name`, `type`, `source_id`,
//!   `hostname`, ... any name of the stream's XML header) must equal its value; they
//!   become the XPath predicate `KEY='VALUE' and ...` that liblsl resolves. The keys
//!   [`OPTION_KEYS`] are trigd's options instead (`unit=uV`, `drop=EOG;Status`,
//!   `extra=drop`, `wait_s=30`).
//! - `lsl://` followed by text with a quote, a space or a parenthesis: a raw XPath 1.0
//!   predicate passed to liblsl as written (`lsl://name='BioSemi' and
//!   starts-with(type,'EEG')`); options then come from the `[[input]]` table only.

use std::fmt;

/// Keys of the simple form that are trigd's options, not stream fields.
pub const OPTION_KEYS: [&str; 4] = ["unit", "drop", "extra", "wait_s"];

/// Longest address accepted (a predicate is a short expression).
pub const MAX_URL_LEN: usize = 4096;

/// A parsed `lsl://` address.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LslUrl {
    /// The stream fields of the simple form, in order (empty for a raw predicate).
    pub fields: Vec<(String, String)>,
    /// The raw predicate, when given as one.
    pub raw: Option<String>,
    pub options: LslOptions,
}

/// What trigd does with a resolved stream's channels.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LslOptions {
    /// Unit of the samples, overriding the stream's metadata (`uV`, `V`, ...).
    pub unit: Option<String>,
    /// Stream channels to leave out by label (trigger, EOG, status channels).
    pub drop: Vec<String>,
    /// `true`: leave out every stream channel the lead field does not have.
    pub drop_extra: bool,
    /// How long to wait for the stream at start and after it is lost before logging again
    /// (seconds); trigd keeps waiting until stopped.
    pub wait_s: Option<f64>,
}

/// Why a string is not an `lsl://` address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSL address {input:?}: {why}; expected lsl://KEY=VALUE[&KEY=VALUE...] (e.g. lsl://type=EEG, lsl://name=BioSemi&unit=uV) or lsl://<XPath predicate> (e.g. lsl://name='BioSemi' and type='EEG')")]
pub struct LslUrlError {
    pub input: String,
    pub why: String,
}

/// True when `s` names an LSL stream (starts with `lsl://`, any case).
pub fn is_lsl(s: &str) -> bool {
    s.trim()
        .get(..6)
        .is_some_and(|p| p.eq_ignore_ascii_case("lsl://"))
}

fn is_field_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl std::str::FromStr for LslUrl {
    type Err = LslUrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| LslUrlError {
            input: s.chars().take(200).collect(),
            why: why.to_string(),
        };
        if s.len() > MAX_URL_LEN {
            return Err(err("longer than 4096 bytes"));
        }
        let t = s.trim();
        if !is_lsl(t) {
            return Err(err("no lsl:// scheme"));
        }
        let rest = &t[6..];
        if rest.is_empty() {
            return Err(err(
                "no stream named (an empty predicate matches every stream)",
            ));
        }
        if rest.chars().any(|c| c.is_control()) {
            return Err(err("control characters"));
        }
        if rest.contains(['\'', '"', ' ', '(', ')', '[', ']']) {
            return Ok(LslUrl {
                raw: Some(rest.to_string()),
                ..LslUrl::default()
            });
        }
        let mut url = LslUrl::default();
        for part in rest.split('&') {
            let Some((k, v)) = part.split_once('=') else {
                return Err(err(&format!("{part:?} is not KEY=VALUE")));
            };
            let (k, v) = (k.trim(), v.trim());
            if !is_field_name(k) {
                return Err(err(&format!("{k:?} is not a stream field name")));
            }
            if v.is_empty() {
                return Err(err(&format!("{k} has an empty value")));
            }
            match k {
                "unit" => url.options.unit = Some(v.to_string()),
                "drop" => url.options.drop.extend(
                    v.split(';')
                        .map(str::trim)
                        .filter(|x| !x.is_empty())
                        .map(String::from),
                ),
                "extra" => {
                    url.options.drop_extra = match v {
                        "drop" => true,
                        "error" => false,
                        _ => return Err(err(&format!("extra={v}: expected drop or error"))),
                    }
                }
                "wait_s" => match v.parse::<f64>() {
                    Ok(w) if w.is_finite() && w > 0.0 && w <= 86_400.0 => {
                        url.options.wait_s = Some(w)
                    }
                    _ => return Err(err(&format!("wait_s={v}: expected seconds in (0, 86400]"))),
                },
                _ => {
                    if url.fields.iter().any(|(f, _)| f == k) {
                        return Err(err(&format!("{k} given twice")));
                    }
                    url.fields.push((k.to_string(), v.to_string()));
                }
            }
        }
        if url.fields.is_empty() {
            return Err(err(
                "no stream field (name, type, source_id, ...) to resolve by",
            ));
        }
        Ok(url)
    }
}

impl LslUrl {
    /// The XPath predicate liblsl resolves.
    pub fn predicate(&self) -> String {
        if let Some(r) = &self.raw {
            return r.clone();
        }
        self.fields
            .iter()
            .map(|(k, v)| format!("{k}='{v}'"))
            .collect::<Vec<_>>()
            .join(" and ")
    }

    /// Value of a stream field of the simple form (`name`, `type`, `source_id`).
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl fmt::Display for LslUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lsl://{}", self.predicate())
    }
}

/// Volts per unit of a unit name as LSL metadata writes it (XDF's `microvolts`, `uV`,
/// `µV`, ...), case-insensitive for the spelled-out names.
pub fn volts_per_unit(unit: &str) -> Option<f64> {
    let u = unit.trim();
    let scale = match u {
        "V" | "v" => 1.0,
        "mV" => 1e-3,
        "uV" | "µV" | "μV" | "microV" => 1e-6,
        "nV" => 1e-9,
        _ => match u.to_ascii_lowercase().as_str() {
            "volt" | "volts" => 1.0,
            "millivolt" | "millivolts" => 1e-3,
            "microvolt" | "microvolts" => 1e-6,
            "nanovolt" | "nanovolts" => 1e-9,
            _ => return None,
        },
    };
    Some(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_form_becomes_a_predicate_and_options() {
        let u: LslUrl = "lsl://type=EEG".parse().unwrap();
        assert_eq!(u.predicate(), "type='EEG'");
        let u: LslUrl = "LSL://name=BioSemi&type=EEG&unit=uV&drop=EOG;Status&extra=drop&wait_s=2"
            .parse()
            .unwrap();
        assert_eq!(u.predicate(), "name='BioSemi' and type='EEG'");
        assert_eq!(u.field("name"), Some("BioSemi"));
        assert_eq!(u.options.unit.as_deref(), Some("uV"));
        assert_eq!(u.options.drop, vec!["EOG", "Status"]);
        assert!(u.options.drop_extra);
        assert_eq!(u.options.wait_s, Some(2.0));
        assert_eq!(u.to_string(), "lsl://name='BioSemi' and type='EEG'");
    }

    #[test]
    fn raw_predicates_pass_through() {
        let u: LslUrl = "lsl://name='X' and starts-with(type,'EEG')"
            .parse()
            .unwrap();
        assert_eq!(u.predicate(), "name='X' and starts-with(type,'EEG')");
        assert!(u.fields.is_empty());
    }

    #[test]
    fn bad_addresses_say_what_is_expected() {
        for bad in [
            "udp://1.2.3.4:5",
            "lsl://",
            "lsl://type",
            "lsl://type=",
            "lsl://unit=uV",
            "lsl://type=EEG&type=ECG",
            "lsl://1x=2",
            "lsl://type=EEG&extra=maybe",
            "lsl://type=EEG&wait_s=-1",
            "lsl://type=E\u{1}G",
        ] {
            let e = bad.parse::<LslUrl>().unwrap_err().to_string();
            assert!(e.contains("expected lsl://KEY=VALUE"), "{bad}: {e}");
        }
        assert!(is_lsl(" lsl://type=EEG"));
        assert!(!is_lsl("udp://x"));
    }

    #[test]
    fn units_scale_to_volts() {
        assert_eq!(volts_per_unit("microvolts"), Some(1e-6));
        assert_eq!(volts_per_unit("µV"), Some(1e-6));
        assert_eq!(volts_per_unit("uV"), Some(1e-6));
        assert_eq!(volts_per_unit("Volts"), Some(1.0));
        assert_eq!(volts_per_unit("mV"), Some(1e-3));
        assert_eq!(volts_per_unit("MV"), None);
        assert_eq!(volts_per_unit("degC"), None);
    }
}
