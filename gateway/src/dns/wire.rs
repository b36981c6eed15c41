//! The few DNS messages the gateway reads and writes (RFC 1035): a query's
//! question, an answer with A records or an error code, a query to the
//! upstream resolver and the addresses in its answer. Every read is
//! bounds-checked; a malformed message is an `Err`, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;

pub const NOERROR: u8 = 0;
pub const FORMERR: u8 = 1;
pub const SERVFAIL: u8 = 2;
pub const NXDOMAIN: u8 = 3;
pub const REFUSED: u8 = 5;

/// Longest message read or written (plain UDP DNS).
pub const MAX_MESSAGE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// The RD bit, echoed back.
    pub recursion_desired: bool,
    /// Lowercase, without a trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question as it came (echoed in the answer).
    question: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub &'static str);

fn u16_at(b: &[u8], at: usize) -> Result<u16, WireError> {
    b.get(at..at + 2)
        .map(|s| u16::from_be_bytes([s[0], s[1]]))
        .ok_or(WireError("truncated"))
}

/// Reads the name at `at`, following compression pointers (at most 32,
/// each pointing backwards); returns it and the offset just past it in the
/// original position.
fn read_name(b: &[u8], mut at: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *b.get(at).ok_or(WireError("truncated name"))? as usize;
        match len & 0xC0 {
            0x00 => {
                if len == 0 {
                    return Ok((name, end.unwrap_or(at + 1)));
                }
                let label = b
                    .get(at + 1..at + 1 + len)
                    .ok_or(WireError("truncated label"))?;
                if !name.is_empty() {
                    name.push('.');
                }
                for &c in label {
                    // Names we compare are ASCII; anything else is kept
                    // escaped so it can never match a pattern by accident.
                    if c.is_ascii_graphic() && c != b'.' && c != b'\\' {
                        name.push(c.to_ascii_lowercase() as char);
                    } else {
                        name.push_str(&format!("\\{c:03}"));
                    }
                }
                if name.len() > 1024 {
                    return Err(WireError("name too long"));
                }
                at += 1 + len;
            }
            0xC0 => {
                let ptr = (u16_at(b, at)? & 0x3FFF) as usize;
                if ptr >= at {
                    return Err(WireError("forward pointer"));
                }
                jumps += 1;
                if jumps > 32 {
                    return Err(WireError("pointer loop"));
                }
                end.get_or_insert(at + 2);
                at = ptr;
            }
            _ => return Err(WireError("bad label type")),
        }
    }
}

/// Parses a query: one question, QR clear, standard opcode.
pub fn parse_query(b: &[u8]) -> Result<Query, WireError> {
    if b.len() < 12 {
        return Err(WireError("short header"));
    }
    let id = u16_at(b, 0)?;
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 != 0 {
        return Err(WireError("not a query"));
    }
    if (flags >> 11) & 0xF != 0 {
        return Err(WireError("not a standard query"));
    }
    if u16_at(b, 4)? != 1 {
        return Err(WireError("not exactly one question"));
    }
    let (name, end) = read_name(b, 12)?;
    let qtype = u16_at(b, end)?;
    let qclass = u16_at(b, end + 2)?;
    Ok(Query {
        id,
        recursion_desired: flags & 0x0100 != 0,
        name,
        qtype,
        qclass,
        question: b[12..end + 4].to_vec(),
    })
}

/// The header id of a message, if it has one (to answer FORMERR).
pub fn message_id(b: &[u8]) -> Option<u16> {
    u16_at(b, 0).ok()
}

fn header(id: u16, rd: bool, rcode: u8, qd: u16, an: u16) -> Vec<u8> {
    let mut flags: u16 = 0x8000 | 0x0080 | (rcode as u16 & 0xF); // QR, RA
    if rd {
        flags |= 0x0100;
    }
    let mut out = Vec::with_capacity(512);
    for v in [id, flags, qd, an, 0, 0] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out
}

/// An answer to `q`: `rcode`, and one A record per address (owner: the
/// question's name, by pointer).
pub fn answer(q: &Query, rcode: u8, addrs: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let mut out = header(q.id, q.recursion_desired, rcode, 1, addrs.len() as u16);
    out.extend_from_slice(&q.question);
    for a in addrs {
        out.extend_from_slice(&[0xC0, 0x0C]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&a.octets());
    }
    out
}

/// A header-only error answer (FORMERR for what could not be parsed).
pub fn error_answer(id: u16, rcode: u8) -> Vec<u8> {
    header(id, false, rcode, 0, 0)
}

/// A recursive query for `name` (a valid DNS name).
pub fn build_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for v in [id, 0x0100, 1, 0, 0, 0] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len().min(63) as u8);
        out.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// The rcode and the A/AAAA addresses of an answer to query `id`.
pub fn parse_response(b: &[u8], id: u16) -> Result<(u8, Vec<IpAddr>), WireError> {
    parse_response_ttl(b, id).map(|(rcode, addrs, _)| (rcode, addrs))
}

/// [`parse_response`] and the smallest TTL of its answer records (0
/// when there are none): how long the answer may be kept.
pub fn parse_response_ttl(b: &[u8], id: u16) -> Result<(u8, Vec<IpAddr>, u32), WireError> {
    if b.len() < 12 || u16_at(b, 0)? != id {
        return Err(WireError("not our answer"));
    }
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 == 0 {
        return Err(WireError("not an answer"));
    }
    let rcode = (flags & 0xF) as u8;
    let qd = u16_at(b, 4)?;
    let an = u16_at(b, 6)?;
    let mut at = 12;
    for _ in 0..qd {
        at = read_name(b, at)?.1 + 4;
    }
    let mut addrs = Vec::new();
    let mut ttl: Option<u32> = None;
    for _ in 0..an {
        let (_, end) = read_name(b, at)?;
        let rtype = u16_at(b, end)?;
        let class = u16_at(b, end + 2)?;
        let rttl = (u32::from(u16_at(b, end + 4)?) << 16) | u32::from(u16_at(b, end + 6)?);
        let len = u16_at(b, end + 8)? as usize;
        let data = b
            .get(end + 10..end + 10 + len)
            .ok_or(WireError("truncated record"))?;
        if class == CLASS_IN {
            // RFC 2181: a TTL with the top bit set counts as 0.
            let rttl = if rttl > i32::MAX as u32 { 0 } else { rttl };
            ttl = Some(ttl.map_or(rttl, |t| t.min(rttl)));
            match (rtype, len) {
                (TYPE_A, 4) => addrs.push(IpAddr::V4(Ipv4Addr::new(
                    data[0], data[1], data[2], data[3],
                ))),
                (TYPE_AAAA, 16) => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(data);
                    addrs.push(IpAddr::V6(Ipv6Addr::from(o)));
                }
                _ => {}
            }
        }
        at = end + 10 + len;
    }
    Ok((rcode, addrs, ttl.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_round_trips_into_an_answer_we_can_read() {
        let q = build_query(0x1234, "PyPI.test", TYPE_A);
        let parsed = parse_query(&q).unwrap();
        assert_eq!(parsed.name, "pypi.test");
        assert_eq!(parsed.qtype, TYPE_A);
        assert_eq!(parsed.qclass, CLASS_IN);
        assert!(parsed.recursion_desired);
        let a = answer(&parsed, NOERROR, &[Ipv4Addr::new(100, 127, 128, 1)], 60);
        let (rcode, addrs) = parse_response(&a, 0x1234).unwrap();
        assert_eq!(rcode, NOERROR);
        assert_eq!(addrs, [IpAddr::V4(Ipv4Addr::new(100, 127, 128, 1))]);
        assert_eq!(parse_response_ttl(&a, 0x1234).unwrap().2, 60);
        let nx = answer(&parsed, NXDOMAIN, &[], 0);
        assert_eq!(parse_response(&nx, 0x1234).unwrap(), (NXDOMAIN, vec![]));
        assert!(parse_response(&nx, 0x9999).is_err());
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let q = build_query(7, "a.test", TYPE_A);
        for cut in 0..q.len() {
            let _ = parse_query(&q[..cut]);
            let _ = parse_response(&q[..cut], 7);
        }
        // A pointer to itself, a forward pointer, a reserved label type.
        let mut looped = q[..12].to_vec();
        looped.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]);
        assert!(parse_query(&looped).is_err());
        let mut fwd = q[..12].to_vec();
        fwd.extend_from_slice(&[0xC0, 40, 0, 1, 0, 1]);
        assert!(parse_query(&fwd).is_err());
        let mut bad = q[..12].to_vec();
        bad.extend_from_slice(&[0x80, 0, 0, 1, 0, 1]);
        assert!(parse_query(&bad).is_err());
        // Answers are not queries.
        let a = answer(&parse_query(&q).unwrap(), NOERROR, &[], 1);
        assert!(parse_query(&a).is_err());
        // Odd bytes in a label never read as a dot.
        let mut odd = q[..12].to_vec();
        odd.extend_from_slice(&[
            3, b'a', b'.', b'b', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1,
        ]);
        assert_eq!(parse_query(&odd).unwrap().name, "a\\046b.test");
    }

    #[test]
    fn answers_with_compressed_cnames_yield_their_addresses() {
        let q = build_query(9, "www.a.test", TYPE_A);
        let mut m = q.clone();
        m[2] |= 0x80; // QR
        m[7] = 2; // two answers
                  // www.a.test CNAME a.test (pointer into the question), then a.test A.
        m.extend_from_slice(&[0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 2, 0xC0, 16]);
        m.extend_from_slice(&[0xC0, 16, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 0, 2]);
        let (rcode, addrs) = parse_response(&m, 9).unwrap();
        assert_eq!(rcode, NOERROR);
        assert_eq!(addrs, [IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2))]);
    }
}
