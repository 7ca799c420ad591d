//! Frame format v1: the unit that travels from acquisition hardware (or a recording) to a
//! decision. A frame is a fixed 40-byte little-endian header followed by a payload whose
//! kind the header names. Everything here is validated before anything downstream looks at
//! it; a frame that fails gets the outcome `malformed` with the [`FrameError`] as reason.
//!
//! The layout is documented for producers in `docs/FORMAT.md`; keep the two in step.

use zerocopy::little_endian::{F32, F64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `b"TRGF"`: marks the start of every frame.
pub const MAGIC: [u8; 4] = *b"TRGF";
/// The only version this build reads and writes.
pub const VERSION: u16 = 1;
/// Size of [`FrameHeader`] in bytes.
pub const HEADER_LEN: usize = 40;
/// Upper bound on a whole frame (header + payload). A frame larger than this is refused
/// before any buffer is sized from it; rings preallocate slots of at most this size.
pub const MAX_FRAME_LEN: usize = 16 << 20;
/// Upper bound on EEG channels in one block.
pub const MAX_EEG_CHANNELS: usize = 4096;

/// What a frame's payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FrameKind {
    /// A detector event: a list of [`Hit`]s.
    HitEvent = 1,
    /// A block of multichannel EEG samples.
    EegBlock = 2,
}

impl FrameKind {
    pub fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::HitEvent),
            2 => Some(Self::EegBlock),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HitEvent => "hit_event",
            Self::EegBlock => "eeg_block",
        }
    }
}

/// The fixed frame header (40 bytes, little-endian, no padding, any alignment).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FrameHeader {
    pub magic: [u8; 4],
    pub version: U16,
    pub kind: U16,
    /// Identifies the producer (a detector readout board, an amplifier).
    pub source_id: U32,
    /// Length of the payload that follows, in bytes.
    pub payload_len: U32,
    /// Per-source sequence number; gaps and repeats are counted.
    pub sequence: U64,
    /// Acquisition time, nanoseconds since the Unix epoch (the producer's clock).
    pub timestamp_ns: U64,
    /// CRC-32C (Castagnoli) of the payload bytes.
    pub payload_crc32c: U32,
    /// Must be zero in v1.
    pub reserved: U32,
}

const _: () = assert!(std::mem::size_of::<FrameHeader>() == HEADER_LEN);

/// One hit as it travels (20 bytes): position in millimetres, plane index, hit id.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Hit {
    pub x_mm: F32,
    pub y_mm: F32,
    pub z_mm: F32,
    /// Producer's identifier of the hit, unique within the event (TrackML `hit_id`).
    pub hit_id: U32,
    /// Detector plane index, 0 = most upstream.
    pub plane: U16,
    /// Must be zero in v1.
    pub reserved: U16,
}

pub const HIT_LEN: usize = 20;
const _: () = assert!(std::mem::size_of::<Hit>() == HIT_LEN);

/// Payload prefix of a hit event (8 bytes), followed by `n_hits` [`Hit`]s.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct HitEventHeader {
    pub n_hits: U32,
    pub reserved: U32,
}

/// Payload prefix of an EEG block (24 bytes), followed by `n_channels * n_samples`
/// little-endian f32 values in volts, channel-major (all samples of channel 0, then
/// channel 1, ...), in the order of the configured channel list.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct EegBlockHeader {
    pub n_channels: U16,
    pub reserved: U16,
    pub n_samples: U32,
    pub sample_rate_hz: F64,
    /// Index of the block's first sample since the start of acquisition.
    pub first_sample: U64,
}

pub const EEG_HEADER_LEN: usize = 24;
const _: () = assert!(std::mem::size_of::<EegBlockHeader>() == EEG_HEADER_LEN);

/// Why a frame was refused. The `reason()` string is the metric label and the decision's
/// `reason` field, so it is short and stable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("frame is {0} bytes, shorter than the 40-byte header")]
    TooShort(usize),
    #[error("bad magic {0:02x?}, expected \"TRGF\"")]
    BadMagic([u8; 4]),
    #[error("unsupported frame version {0}, this build reads version 1")]
    BadVersion(u16),
    #[error("unknown frame kind {0}")]
    BadKind(u16),
    #[error("reserved header field is {0:#x}, must be 0")]
    Reserved(u32),
    #[error("payload length {declared} does not match the {actual} bytes after the header")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    TooLarge(usize),
    #[error("payload CRC-32C {actual:#010x} does not match the header's {declared:#010x}")]
    BadCrc { declared: u32, actual: u32 },
    #[error("payload: {0}")]
    Payload(String),
    #[error("non-finite value at {0}")]
    NonFinite(String),
}

impl FrameError {
    /// Short, stable label for metrics and decision records.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooShort(_) => "too_short",
            Self::BadMagic(_) => "bad_magic",
            Self::BadVersion(_) => "bad_version",
            Self::BadKind(_) => "bad_kind",
            Self::Reserved(_) => "reserved_nonzero",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::TooLarge(_) => "too_large",
            Self::BadCrc { .. } => "bad_crc",
            Self::Payload(_) => "bad_payload",
            Self::NonFinite(_) => "non_finite",
        }
    }
}

/// A validated view of one frame's bytes. Borrowing, never copying: the bytes may live in a
/// ring slot or in a memory-mapped recording.
#[derive(Debug, Clone, Copy)]
pub struct FrameView<'a> {
    pub header: &'a FrameHeader,
    pub payload: Payload<'a>,
}

/// The typed payload of a validated frame.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    Hits(&'a [Hit]),
    Eeg(EegBlockView<'a>),
}

/// A validated EEG block: `samples` holds `n_channels * n_samples` values, channel-major.
#[derive(Debug, Clone, Copy)]
pub struct EegBlockView<'a> {
    pub header: &'a EegBlockHeader,
    pub samples: &'a [F32],
}

impl EegBlockView<'_> {
    pub fn n_channels(&self) -> usize {
        self.header.n_channels.get() as usize
    }
    pub fn n_samples(&self) -> usize {
        self.header.n_samples.get() as usize
    }
    /// Value of channel `c` at sample `t` of the block.
    #[inline]
    pub fn at(&self, c: usize, t: usize) -> f32 {
        self.samples[c * self.n_samples() + t].get()
    }
}

impl<'a> FrameView<'a> {
    pub fn kind(&self) -> FrameKind {
        match self.payload {
            Payload::Hits(_) => FrameKind::HitEvent,
            Payload::Eeg(_) => FrameKind::EegBlock,
        }
    }
    pub fn sequence(&self) -> u64 {
        self.header.sequence.get()
    }
    pub fn source_id(&self) -> u32 {
        self.header.source_id.get()
    }
    pub fn timestamp_ns(&self) -> u64 {
        self.header.timestamp_ns.get()
    }
}

/// Reads just the header of `bytes` (for framing a stream): checks magic, version, the
/// reserved word and the size bound, not the payload.
pub fn peek_header(bytes: &[u8]) -> Result<&FrameHeader, FrameError> {
    let (header, _) =
        FrameHeader::ref_from_prefix(bytes).map_err(|_| FrameError::TooShort(bytes.len()))?;
    if header.magic != MAGIC {
        return Err(FrameError::BadMagic(header.magic));
    }
    if header.version.get() != VERSION {
        return Err(FrameError::BadVersion(header.version.get()));
    }
    if header.reserved.get() != 0 {
        return Err(FrameError::Reserved(header.reserved.get()));
    }
    let total = HEADER_LEN + header.payload_len.get() as usize;
    if total > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge(total));
    }
    Ok(header)
}

/// Validates a whole frame: header, length, CRC, and every payload field.
pub fn parse(bytes: &[u8]) -> Result<FrameView<'_>, FrameError> {
    parse_with(bytes, true)
}

/// [`parse`] without the CRC pass, for bytes that already passed [`parse`] and have not
/// been written since (a slot between its input and its worker): the header, the length
/// and every payload field are still checked, so a view is always well formed; only a
/// changed payload byte would go unnoticed. Saves one read of the whole frame.
pub fn parse_validated(bytes: &[u8]) -> Result<FrameView<'_>, FrameError> {
    parse_with(bytes, false)
}

fn parse_with(bytes: &[u8], check_crc: bool) -> Result<FrameView<'_>, FrameError> {
    let header = peek_header(bytes)?;
    let declared = header.payload_len.get() as usize;
    let payload = &bytes[HEADER_LEN..];
    if payload.len() != declared {
        return Err(FrameError::LengthMismatch {
            declared,
            actual: payload.len(),
        });
    }
    if check_crc {
        let crc = crc32c::crc32c(payload);
        if crc != header.payload_crc32c.get() {
            return Err(FrameError::BadCrc {
                declared: header.payload_crc32c.get(),
                actual: crc,
            });
        }
    }
    let kind =
        FrameKind::from_u16(header.kind.get()).ok_or(FrameError::BadKind(header.kind.get()))?;
    let payload = match kind {
        FrameKind::HitEvent => Payload::Hits(parse_hits(payload)?),
        FrameKind::EegBlock => Payload::Eeg(parse_eeg(payload)?),
    };
    Ok(FrameView { header, payload })
}

fn parse_hits(payload: &[u8]) -> Result<&[Hit], FrameError> {
    let (eh, rest) = HitEventHeader::ref_from_prefix(payload).map_err(|_| {
        FrameError::Payload(format!(
            "hit event payload of {} bytes has no 8-byte count",
            payload.len()
        ))
    })?;
    if eh.reserved.get() != 0 {
        return Err(FrameError::Reserved(eh.reserved.get()));
    }
    let n = eh.n_hits.get() as usize;
    if rest.len() != n * HIT_LEN {
        return Err(FrameError::Payload(format!(
            "hit event declares {n} hits ({} bytes) but carries {} bytes",
            n * HIT_LEN,
            rest.len()
        )));
    }
    let hits = <[Hit]>::ref_from_bytes(rest)
        .map_err(|_| FrameError::Payload("hit array is not a whole number of hits".into()))?;
    for (i, h) in hits.iter().enumerate() {
        if !(h.x_mm.get().is_finite() && h.y_mm.get().is_finite() && h.z_mm.get().is_finite()) {
            return Err(FrameError::NonFinite(format!(
                "hit {i} (hit_id {})",
                h.hit_id.get()
            )));
        }
        if h.reserved.get() != 0 {
            return Err(FrameError::Payload(format!(
                "hit {i}: reserved field is not zero"
            )));
        }
    }
    Ok(hits)
}

fn parse_eeg(payload: &[u8]) -> Result<EegBlockView<'_>, FrameError> {
    let (eh, rest) = EegBlockHeader::ref_from_prefix(payload).map_err(|_| {
        FrameError::Payload(format!(
            "EEG payload of {} bytes has no 24-byte block header",
            payload.len()
        ))
    })?;
    if eh.reserved.get() != 0 {
        return Err(FrameError::Reserved(eh.reserved.get() as u32));
    }
    let c = eh.n_channels.get() as usize;
    let t = eh.n_samples.get() as usize;
    if c == 0 || c > MAX_EEG_CHANNELS {
        return Err(FrameError::Payload(format!(
            "EEG block has {c} channels, expected 1..={MAX_EEG_CHANNELS}"
        )));
    }
    if t == 0 {
        return Err(FrameError::Payload("EEG block has 0 samples".into()));
    }
    let fs = eh.sample_rate_hz.get();
    if !(fs.is_finite() && fs > 0.0) {
        return Err(FrameError::Payload(format!(
            "EEG sample rate {fs} Hz is not positive"
        )));
    }
    let want = c.checked_mul(t).and_then(|n| n.checked_mul(4));
    if want != Some(rest.len()) {
        return Err(FrameError::Payload(format!(
            "EEG block declares {c} channels x {t} samples but carries {} bytes",
            rest.len()
        )));
    }
    let samples = <[F32]>::ref_from_bytes(rest)
        .map_err(|_| FrameError::Payload("sample array is not a whole number of f32".into()))?;
    if let Some(i) = samples.iter().position(|v| !v.get().is_finite()) {
        return Err(FrameError::NonFinite(format!(
            "channel {} sample {}",
            i / t,
            i % t
        )));
    }
    Ok(EegBlockView {
        header: eh,
        samples,
    })
}

/// Identity of a frame as a producer stamps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub source_id: u32,
    pub sequence: u64,
    pub timestamp_ns: u64,
}

/// Appends a complete frame (header + payload) to `out`. `payload` must already be encoded.
pub fn encode_frame(out: &mut Vec<u8>, kind: FrameKind, stamp: Stamp, payload: &[u8]) {
    let header = FrameHeader {
        magic: MAGIC,
        version: VERSION.into(),
        kind: (kind as u16).into(),
        source_id: stamp.source_id.into(),
        payload_len: (payload.len() as u32).into(),
        sequence: stamp.sequence.into(),
        timestamp_ns: stamp.timestamp_ns.into(),
        payload_crc32c: crc32c::crc32c(payload).into(),
        reserved: 0.into(),
    };
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
}

/// A hit as producers build it, before encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HitRecord {
    pub x_mm: f32,
    pub y_mm: f32,
    pub z_mm: f32,
    pub plane: u16,
    pub hit_id: u32,
}

/// Encodes a hit event frame into `out` (appending).
pub fn encode_hit_event(out: &mut Vec<u8>, stamp: Stamp, hits: &[HitRecord]) {
    let mut payload = Vec::with_capacity(8 + hits.len() * HIT_LEN);
    payload.extend_from_slice(
        HitEventHeader {
            n_hits: (hits.len() as u32).into(),
            reserved: 0.into(),
        }
        .as_bytes(),
    );
    for h in hits {
        payload.extend_from_slice(
            Hit {
                x_mm: h.x_mm.into(),
                y_mm: h.y_mm.into(),
                z_mm: h.z_mm.into(),
                hit_id: h.hit_id.into(),
                plane: h.plane.into(),
                reserved: 0.into(),
            }
            .as_bytes(),
        );
    }
    encode_frame(out, FrameKind::HitEvent, stamp, &payload);
}

/// The payload header of an EEG block.
fn eeg_header(
    n_channels: usize,
    n_samples: usize,
    sample_rate_hz: f64,
    first_sample: u64,
) -> EegBlockHeader {
    EegBlockHeader {
        n_channels: (n_channels as u16).into(),
        reserved: 0.into(),
        n_samples: (n_samples as u32).into(),
        sample_rate_hz: sample_rate_hz.into(),
        first_sample: first_sample.into(),
    }
}

/// Encodes an EEG block frame into `out` (appending). `samples` is channel-major,
/// `n_channels * n_samples` long.
pub fn encode_eeg_block(
    out: &mut Vec<u8>,
    stamp: Stamp,
    n_channels: usize,
    sample_rate_hz: f64,
    first_sample: u64,
    samples: &[f32],
) {
    assert!(
        n_channels > 0 && samples.len() % n_channels == 0,
        "samples must be channel-major"
    );
    let n_samples = samples.len() / n_channels;
    let mut payload = Vec::with_capacity(EEG_HEADER_LEN + samples.len() * 4);
    payload.extend_from_slice(
        eeg_header(n_channels, n_samples, sample_rate_hz, first_sample).as_bytes(),
    );
    for v in samples {
        payload.extend_from_slice(&v.to_le_bytes());
    }
    encode_frame(out, FrameKind::EegBlock, stamp, &payload);
}

/// [`encode_eeg_block`] replacing `out`'s contents, with no buffer besides `out`: once `out`
/// has the capacity, encoding a block allocates nothing (live EEG inputs, per block).
pub fn encode_eeg_block_in_place(
    out: &mut Vec<u8>,
    stamp: Stamp,
    n_channels: usize,
    sample_rate_hz: f64,
    first_sample: u64,
    samples: &[f32],
) {
    assert!(
        n_channels > 0 && samples.len() % n_channels == 0,
        "samples must be channel-major"
    );
    let n_samples = samples.len() / n_channels;
    out.clear();
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(
        eeg_header(n_channels, n_samples, sample_rate_hz, first_sample).as_bytes(),
    );
    for v in samples {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let payload = &out[HEADER_LEN..];
    let header = FrameHeader {
        magic: MAGIC,
        version: VERSION.into(),
        kind: (FrameKind::EegBlock as u16).into(),
        source_id: stamp.source_id.into(),
        payload_len: (payload.len() as u32).into(),
        sequence: stamp.sequence.into(),
        timestamp_ns: stamp.timestamp_ns.into(),
        payload_crc32c: crc32c::crc32c(payload).into(),
        reserved: 0.into(),
    };
    out[..HEADER_LEN].copy_from_slice(header.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            source_id: 7,
            sequence: 42,
            timestamp_ns: 1_700_000_000_000_000_000,
        }
    }

    #[test]
    fn hit_event_round_trips() {
        let hits = [
            HitRecord {
                x_mm: 1.5,
                y_mm: -2.0,
                z_mm: 300.0,
                plane: 0,
                hit_id: 1,
            },
            HitRecord {
                x_mm: 3.0,
                y_mm: 4.0,
                z_mm: 400.0,
                plane: 1,
                hit_id: 2,
            },
        ];
        let mut buf = Vec::new();
        encode_hit_event(&mut buf, stamp(), &hits);
        assert_eq!(buf.len(), HEADER_LEN + 8 + 2 * HIT_LEN);
        let f = parse(&buf).unwrap();
        assert_eq!(f.sequence(), 42);
        assert_eq!(f.source_id(), 7);
        let Payload::Hits(h) = f.payload else {
            panic!("not hits")
        };
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].z_mm.get(), 400.0);
        assert_eq!(h[1].plane.get(), 1);
        assert_eq!(h[0].hit_id.get(), 1);
    }

    #[test]
    fn eeg_block_in_place_equals_the_appending_encoder() {
        let samples: Vec<f32> = (0..12).map(|i| i as f32 * 1e-6).collect();
        let mut a = Vec::new();
        encode_eeg_block(&mut a, stamp(), 3, 512.0, 77, &samples);
        let mut b = vec![9u8; 5];
        encode_eeg_block_in_place(&mut b, stamp(), 3, 512.0, 77, &samples);
        assert_eq!(a, b);
    }

    #[test]
    fn eeg_block_round_trips() {
        let samples: Vec<f32> = (0..12).map(|i| i as f32 * 1e-6).collect();
        let mut buf = Vec::new();
        encode_eeg_block(&mut buf, stamp(), 3, 512.0, 1024, &samples);
        let f = parse(&buf).unwrap();
        let Payload::Eeg(b) = f.payload else {
            panic!("not eeg")
        };
        assert_eq!((b.n_channels(), b.n_samples()), (3, 4));
        assert_eq!(b.at(2, 1), samples[9]);
        assert_eq!(b.header.first_sample.get(), 1024);
    }

    #[test]
    fn every_corruption_is_refused_with_its_reason() {
        let mut good = Vec::new();
        encode_hit_event(
            &mut good,
            stamp(),
            &[HitRecord {
                x_mm: 0.0,
                y_mm: 0.0,
                z_mm: 1.0,
                plane: 0,
                hit_id: 9,
            }],
        );
        type Corruption = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Corruption, &str)> = vec![
            (Box::new(|b| b.truncate(10)), "too_short"),
            (Box::new(|b| b[0] = b'X'), "bad_magic"),
            (Box::new(|b| b[4] = 2), "bad_version"),
            (Box::new(|b| b[6] = 9), "bad_crc"), // kind is not covered by the CRC but checked after it
            (Box::new(|b| b[36] = 1), "reserved_nonzero"),
            (Box::new(|b| b.push(0)), "length_mismatch"),
            (
                Box::new(|b| {
                    let n = b.len();
                    b[n - 1] ^= 1
                }),
                "bad_crc",
            ),
        ];
        for (corrupt, reason) in cases {
            let mut b = good.clone();
            corrupt(&mut b);
            let err = parse(&b).unwrap_err();
            if reason == "bad_crc" && b[6] == 9 {
                assert_eq!(err.reason(), "bad_kind");
            } else {
                assert_eq!(err.reason(), reason, "{err}");
            }
        }
    }

    /// `parse_validated` gives `parse`'s view of a valid frame, skips only the CRC, and
    /// still refuses a frame whose structure is wrong.
    #[test]
    fn parse_validated_skips_only_the_crc() {
        let hits: Vec<HitRecord> = (0..5)
            .map(|i| HitRecord {
                x_mm: i as f32,
                y_mm: 1.0,
                z_mm: 100.0 * (i + 1) as f32,
                plane: i as u16,
                hit_id: i as u32,
            })
            .collect();
        let mut good = Vec::new();
        encode_hit_event(&mut good, stamp(), &hits);
        let (a, b) = (parse(&good).unwrap(), parse_validated(&good).unwrap());
        assert_eq!(a.header.as_bytes(), b.header.as_bytes());
        let (Payload::Hits(ha), Payload::Hits(hb)) = (a.payload, b.payload) else {
            panic!("not hits")
        };
        assert_eq!(ha.as_bytes(), hb.as_bytes());
        // The lowest mantissa bit of the first hit's x: still a valid hit.
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 8] ^= 1;
        assert_eq!(parse(&flipped).unwrap_err().reason(), "bad_crc");
        assert!(parse_validated(&flipped).is_ok(), "no CRC pass");
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(
            parse_validated(&longer).unwrap_err().reason(),
            "length_mismatch"
        );
        let mut bad_kind = good;
        bad_kind[6] = 9;
        assert_eq!(parse_validated(&bad_kind).unwrap_err().reason(), "bad_kind");
    }

    #[test]
    fn non_finite_hit_is_refused() {
        let mut b = Vec::new();
        encode_hit_event(
            &mut b,
            stamp(),
            &[HitRecord {
                x_mm: f32::NAN,
                y_mm: 0.0,
                z_mm: 1.0,
                plane: 0,
                hit_id: 9,
            }],
        );
        assert_eq!(parse(&b).unwrap_err().reason(), "non_finite");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = parse(&bytes);
        }
    }
}
