//! Proxy credentials: `Proxy-Authorization: Basic ...` parsing and the
//! comparison (constant time, so response timing does not reveal how
//! much of a guessed credential was right).

use base64::Engine;

/// `user` and `password` of a `Basic` credential header value; `None`
/// for any other scheme or malformed input.
pub(crate) fn basic(value: &str) -> Option<(String, Vec<u8>)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let colon = raw.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some((user, raw[colon + 1..].to_vec()))
}

/// `a == b` in time that depends on their lengths only.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_parse_and_junk_does_not() {
        // base64("sb-1:s3cr:et")
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("sb-1:s3cr:et")
        );
        assert_eq!(basic(&v), Some(("sb-1".into(), b"s3cr:et".to_vec())));
        assert_eq!(basic(&v.replace("Basic", "bAsIc")).unwrap().0, "sb-1");
        for bad in ["", "Basic", "Bearer abc", "Basic !!!", "Basic c2ItMQ=="] {
            assert_eq!(basic(bad), None, "{bad:?}");
        }
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
