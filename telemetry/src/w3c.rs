//! W3C Trace Context (`traceparent`, `tracestate`), parsed strictly.
//!
//! Both headers come from whoever sent the request, an attacker as often as
//! not, so they are taken as nothing more than a parent id: anything that
//! is not exactly the W3C grammar is dropped without a word (a malformed
//! `traceparent` means "no parent"; a malformed or oversized `tracestate`
//! is dropped while its `traceparent` is kept, as the W3C text says).
//! Pure functions, no I/O: unit-tested here.

/// At most this many bytes of `tracestate` are kept (W3C lets a vendor cut
/// at 512; past it we drop the header rather than guess which members).
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// At most this many `tracestate` members (the W3C limit).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A parsed `traceparent`: the caller's trace and span, and its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// `00-<32 hex>-<16 hex>-<2 hex>`. Version `ff` is invalid; a higher
    /// version than `00` is read by its first four fields if what follows
    /// them starts with `-` (W3C's rule for future versions). Hex must be
    /// lowercase; all-zero ids are invalid.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        if value.len() < 55 {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        match (version, value.len()) {
            (0, 55) => {}
            (0, _) => return None,
            (_, 55) => {}
            (_, _) if value[55] == b'-' => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The header value, always version `00`.
    pub fn format(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// The `tracestate` to keep from the header values received (several
/// fields combine with `,`), or `None` when there is none or it breaks a
/// rule: over [`MAX_TRACESTATE_BYTES`] or [`MAX_TRACESTATE_MEMBERS`], a
/// member that is not `key=value` in W3C's grammar, or a key twice.
pub fn tracestate<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let mut joined = String::new();
    for value in values {
        let value = std::str::from_utf8(value).ok()?;
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(value);
        if joined.len() > MAX_TRACESTATE_BYTES {
            return None;
        }
    }
    let mut keys: Vec<&str> = Vec::new();
    let mut members = Vec::new();
    for member in joined.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            // Empty list members are allowed and ignored.
            continue;
        }
        let (key, value) = member.split_once('=')?;
        if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
            return None;
        }
        keys.push(key);
        members.push(member);
        if members.len() > MAX_TRACESTATE_MEMBERS {
            return None;
        }
    }
    (!members.is_empty()).then(|| members.join(","))
}

/// `simple-key` (`lcalpha 0*255(lcalpha / DIGIT / "_" / "-"/ "*" / "/")`)
/// or `multi-tenant-key` (`tenant-id "@" system-id`).
fn valid_key(key: &str) -> bool {
    fn tail(c: u8) -> bool {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'*' | b'/')
    }
    let b = key.as_bytes();
    match key.split_once('@') {
        None => {
            !b.is_empty()
                && b.len() <= 256
                && b[0].is_ascii_lowercase()
                && b.iter().all(|&c| tail(c))
        }
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            !t.is_empty()
                && t.len() <= 241
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t.iter().all(|&c| tail(c))
                && !s.is_empty()
                && s.len() <= 14
                && s[0].is_ascii_lowercase()
                && s.iter().all(|&c| tail(c))
        }
    }
}

/// `0*255(chr) nblk-chr`: printable ASCII without `,` and `=`, not ending
/// in a space.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    Some(nibble(two[0])? << 4 | nibble(two[1])?)
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_example_parses_and_formats_back() {
        let p = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert!(p.sampled());
        assert_eq!(p.format(), GOOD);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            // uppercase hex
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // all-zero trace id, all-zero span id
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // version ff, and version 00 with trailing data
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            // wrong separators, non-hex
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // a future version followed by junk without a dash
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_future_version_is_read_by_its_first_fields() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever";
        let p = TraceParent::parse(v.as_bytes()).unwrap();
        assert_eq!(p.format(), GOOD);
    }

    #[test]
    fn tracestate_keeps_valid_members_and_joins_fields() {
        assert_eq!(
            tracestate([
                b"rojo=00f067aa0ba902b7".as_slice(),
                b" congo=t61rcWkgMzE".as_slice()
            ]),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into())
        );
        assert_eq!(
            tracestate([b"t@vendor=x, ,a=b".as_slice()]),
            Some("t@vendor=x,a=b".into())
        );
        assert_eq!(tracestate([b"".as_slice()]), None);
        assert_eq!(tracestate(std::iter::empty()), None);
    }

    #[test]
    fn tracestate_over_a_limit_or_malformed_is_dropped() {
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert_eq!(tracestate([many.join(",").as_bytes()]), None);
        let ok: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        assert!(tracestate([ok.join(",").as_bytes()]).is_some());
        let long = format!("a={}", "x".repeat(MAX_TRACESTATE_BYTES));
        assert_eq!(tracestate([long.as_bytes()]), None);
        for bad in [
            "Upper=1", "a=1,a=2", "a", "a=", "a=b=c", "=b", "a=\u{7f}", "@v=1", "t@=1",
        ] {
            assert_eq!(tracestate([bad.as_bytes()]), None, "{bad:?}");
        }
        assert_eq!(tracestate([&[0xff, b'=', b'1'][..]]), None);
    }
}
