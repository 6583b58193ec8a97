//! Lowercase hex encoding for digests.

/// Encodes bytes as lowercase hex.
///
/// ```
/// assert_eq!(idem_core::__private::hex::encode(&[0x0a, 0xff]), "0aff");
/// ```
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    out
}

/// Decodes hex (either case); `None` for anything else.
///
/// ```
/// assert_eq!(idem_core::__private::hex::decode("0aFF"), Some(vec![0x0a, 0xff]));
/// ```
pub fn decode(text: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_what_it_encodes() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(super::decode(&super::encode(&bytes)), Some(bytes.to_vec()));
        assert_eq!(super::decode("0A"), Some(vec![10]));
        assert_eq!(super::decode("abc"), None);
        assert_eq!(super::decode("zz"), None);
    }
}
