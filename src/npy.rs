//! Bounds on an NPY file's header, checked before the header text is parsed.
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
