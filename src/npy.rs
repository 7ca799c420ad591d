//! NPY files: bounds on the header, checked before the header text is parsed, and the
//! reader of float arrays ([`parse`]) the EEG inputs and the tracking field map share.
//!
//! The header is a Python dict literal that `npyz` parses with a backtracking grammar: its
//! time grows exponentially with the nesting of brackets (a header of twenty `[` takes
//! minutes), so a damaged or hostile lead field, noise covariance or field map would hang
//! start-up. A NumPy array of plain numbers has a header nested two deep
//! (`{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }`), so anything deeper
//! than [`MAX_HEADER_DEPTH`] or longer than [`MAX_HEADER_LEN`] (NumPy's own default limit,
//! `max_header_size`) is refused before the parser sees it.

/// NPY magic: `\x93NUMPY`.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Deepest bracket nesting (`(`, `[`, `{`) accepted in a header.
pub const MAX_HEADER_DEPTH: usize = 6;

/// Longest header text accepted, in bytes (NumPy refuses longer ones by default too).
pub const MAX_HEADER_LEN: usize = 10_000;

/// Why a header was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("NPY header is {len} bytes long (at most {MAX_HEADER_LEN})")]
    TooLong { len: usize },
    #[error("NPY header nests brackets {depth} deep (at most {MAX_HEADER_DEPTH})")]
    TooDeep { depth: usize },
}

/// Checks the header's length and bracket nesting. Bytes that do not start like an NPY
/// file pass: the parser refuses them with its own message.
pub fn check_header(bytes: &[u8]) -> Result<(), HeaderError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Ok(());
    }
    let (declared, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        _ if bytes.len() >= 12 => {
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (usize::try_from(len).unwrap_or(usize::MAX), 12)
        }
        _ => return Ok(()),
    };
    if declared > MAX_HEADER_LEN {
        return Err(HeaderError::TooLong { len: declared });
    }
    let end = start.saturating_add(declared).min(bytes.len());
    let mut depth = 0usize;
    for &b in &bytes[start..end] {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_HEADER_DEPTH {
                    return Err(HeaderError::TooDeep { depth });
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// A dense array read from an NPY file, converted to f64, in C (row-major) order.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
    /// True when the file held float32 values.
    pub was_f32: bool,
}

/// Parse an NPY file's bytes (float32 or float64, any byte order, C or Fortran order), the
/// header checked first ([`check_header`]). Refuses truncated data, trailing bytes and
/// shapes whose element count does not fit the bytes present (so a hostile header cannot
/// make it allocate more than the file holds). The error is the reason, for the caller to
/// name the file.
pub fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    check_header(bytes).map_err(|e| e.to_string())?;
    let mut rest: &[u8] = bytes;
    let header = npyz::NpyHeader::from_reader(&mut rest).map_err(|e| e.to_string())?;
    let shape: Vec<usize> = header
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} too large")))
        .collect::<Result<_, _>>()?;
    let len = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let order = header.order();
    let file = npyz::NpyFile::with_header(header, rest);
    let (data, was_f32) = match file.try_data::<f64>() {
        Ok(reader) => (read_exact_elements(reader, len, 8, rest.len())?, false),
        Err(file) => match file.try_data::<f32>() {
            Ok(reader) => {
                let v = read_exact_elements(reader, len, 4, rest.len())?;
                (v.into_iter().map(f64::from).collect(), true)
            }
            Err(file) => {
                return Err(format!(
                    "dtype {} is not float32 or float64",
                    file.header().dtype().descr()
                ))
            }
        },
    };
    let data = if order == npyz::Order::Fortran && shape.len() > 1 {
        fortran_to_c(&data, &shape)
    } else {
        data
    };
    Ok(NpyArray {
        shape,
        data,
        was_f32,
    })
}

fn read_exact_elements<T: npyz::Deserialize>(
    reader: npyz::NpyReader<T, &[u8]>,
    len: usize,
    item_bytes: usize,
    available_bytes: usize,
) -> Result<Vec<T>, String> {
    let needed = len
        .checked_mul(item_bytes)
        .ok_or_else(|| "element count overflows".to_string())?;
    if needed != available_bytes {
        return Err(format!(
            "header promises {len} elements ({needed} bytes) but {available_bytes} data bytes follow"
        ));
    }
    let mut out = Vec::with_capacity(len);
    for item in reader {
        out.push(item.map_err(|e| e.to_string())?);
    }
    if out.len() != len {
        return Err(format!("read {} of {len} elements", out.len()));
    }
    Ok(out)
}

/// Reorder Fortran-order (first index fastest) data to C order.
fn fortran_to_c(data: &[f64], shape: &[usize]) -> Vec<f64> {
    let n = data.len();
    let mut out = vec![0.0; n];
    let mut idx = vec![0usize; shape.len()];
    for &v in data {
        // idx is the multi-index of f_pos in Fortran order.
        let mut c_pos = 0usize;
        for (d, &i) in idx.iter().enumerate() {
            c_pos = c_pos * shape[d] + i;
        }
        out[c_pos] = v;
        for (d, i) in idx.iter_mut().enumerate() {
            *i += 1;
            if *i < shape[d] {
                break;
            }
            *i = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_v1(header: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out
    }

    #[test]
    fn fortran_order_is_transposed() {
        // shape [2, 3] in Fortran order: columns stored first.
        let f = fortran_to_c(&[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], &[2, 3]);
        assert_eq!(f, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn numpy_headers_pass() {
        let plain = npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }\n");
        assert_eq!(check_header(&plain), Ok(()));
        let structured =
            npy_v1("{'descr': [('x', '<f4', (3,))], 'fortran_order': False, 'shape': (2,), }\n");
        assert_eq!(check_header(&structured), Ok(()));
        assert_eq!(check_header(b"not an npy file"), Ok(()));
    }

    #[test]
    fn deep_nesting_is_refused_even_when_unbalanced() {
        let deep = format!("{{'shape': {}2{}, }}", "(".repeat(6), ")".repeat(6));
        assert_eq!(
            check_header(&npy_v1(&deep)),
            Err(HeaderError::TooDeep { depth: 7 })
        );
        let unclosed = format!("{{'descr': {}", "[".repeat(40));
        assert_eq!(
            check_header(&npy_v1(&unclosed)),
            Err(HeaderError::TooDeep { depth: 7 })
        );
        // Closing brackets do not buy depth back below zero.
        let closers = format!("{}{}", "]".repeat(10), "[".repeat(7));
        assert_eq!(
            check_header(&npy_v1(&closers)),
            Err(HeaderError::TooDeep { depth: 7 })
        );
    }

    #[test]
    fn long_headers_are_refused_in_every_version() {
        let mut v2 = MAGIC.to_vec();
        v2.extend_from_slice(&[2, 0]);
        v2.extend_from_slice(&(u32::MAX).to_le_bytes());
        assert_eq!(
            check_header(&v2),
            Err(HeaderError::TooLong {
                len: u32::MAX as usize
            })
        );
        let long = " ".repeat(MAX_HEADER_LEN + 1);
        assert!(matches!(
            check_header(&npy_v1(&long)),
            Err(HeaderError::TooLong { .. })
        ));
        assert_eq!(check_header(&npy_v1(&" ".repeat(MAX_HEADER_LEN))), Ok(()));
    }
}
