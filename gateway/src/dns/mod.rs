//! DNS on both sides of the gateway.
//!
//! - Inside: the responder at [`crate::policy::internal::GATEWAY`]:53 answers
//!   an allowed name's `A` query with a fake IP ([`fakeip`]), any other
//!   type of an allowed name with no records, and a denied name with
//!   NXDOMAIN. It asks nobody: what the name really is, is settled when
//!   the workload connects.
//! - Outside: [`resolve`] asks the operator's resolver (`--egress-dns`)
//!   for a name's `A` records when a connection to it is opened;
//!   [`resolve_cached`] keeps the answer in the sandbox's [`cache`] for
//!   its TTL.

pub mod cache;
pub mod fakeip;
pub mod wire;

use std::{
    io,
    net::{IpAddr, SocketAddr},
    sync::Mutex,
    time::{Duration, Instant},
};

use sandhub_api::network::is_dns_name;

use crate::policy::{OperatorPolicy, SandboxPolicy};
use fakeip::FakePool;
use wire::{Query, CLASS_IN, FORMERR, NOERROR, NXDOMAIN, REFUSED, TYPE_A};

/// TTL of a fake answer: short, so a name the pool recycled is asked
/// again soon.
const FAKE_TTL: u32 = 30;

/// The answer to one query the workload sent (None: not even a header to
/// answer).
pub fn respond(
    op: &OperatorPolicy,
    sb: &SandboxPolicy,
    pool: &mut FakePool,
    msg: &[u8],
) -> Option<Vec<u8>> {
    let q: Query = match wire::parse_query(msg) {
        Ok(q) => q,
        Err(_) => return wire::message_id(msg).map(|id| wire::error_answer(id, FORMERR)),
    };
    if q.qclass != CLASS_IN {
        return Some(wire::answer(&q, REFUSED, &[], 0));
    }
    if !is_dns_name(&q.name) {
        return Some(wire::answer(&q, NXDOMAIN, &[], 0));
    }
    if let Err(why) = sb.name_answered(op, &q.name) {
        tracing::debug!(name = %q.name, %why, "egress: name refused");
        return Some(wire::answer(&q, NXDOMAIN, &[], 0));
    }
    if q.qtype == TYPE_A {
        let ip = pool.assign(&q.name);
        return Some(wire::answer(&q, NOERROR, &[ip], FAKE_TTL));
    }
    // AAAA and the rest: the name exists, with nothing of that type, so
    // clients fall back to A (the sandbox has no IPv6 route).
    Some(wire::answer(&q, NOERROR, &[], FAKE_TTL))
}

/// The IPv4 addresses of `name` according to `upstream`: two tries of
/// `per_try` each. `NotFound` for NXDOMAIN or an empty answer.
pub async fn resolve(
    upstream: SocketAddr,
    name: &str,
    per_try: Duration,
) -> io::Result<Vec<IpAddr>> {
    resolve_ttl(upstream, name, per_try).await.map(|(a, _)| a)
}

/// [`resolve`] through `cache`: a fresh answer is used as it is, a new one
/// is kept for its TTL. Only addresses are cached; the caller judges each
/// one it dials, cached or not.
pub async fn resolve_cached(
    upstream: SocketAddr,
    name: &str,
    per_try: Duration,
    cache: &Mutex<cache::DnsCache>,
) -> io::Result<Vec<IpAddr>> {
    let hit = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name, Instant::now());
    if let Some(addrs) = hit {
        return Ok(addrs);
    }
    let (addrs, ttl) = resolve_ttl(upstream, name, per_try).await?;
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .put(name, &addrs, ttl, Instant::now());
    Ok(addrs)
}

/// [`resolve`] and the answer's TTL.
async fn resolve_ttl(
    upstream: SocketAddr,
    name: &str,
    per_try: Duration,
) -> io::Result<(Vec<IpAddr>, u32)> {
    let bind: SocketAddr = if upstream.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = tokio::net::UdpSocket::bind(bind).await?;
    sock.connect(upstream).await?;
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    for _ in 0..2 {
        let id: u16 = rand::random();
        sock.send(&wire::build_query(id, name, TYPE_A)).await?;
        let deadline = tokio::time::Instant::now() + per_try;
        loop {
            let n = match tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
                Ok(r) => r?,
                Err(_) => break,
            };
            let Ok((rcode, addrs, ttl)) = wire::parse_response_ttl(&buf[..n], id) else {
                continue;
            };
            let v4: Vec<IpAddr> = addrs.into_iter().filter(IpAddr::is_ipv4).collect();
            return match rcode {
                NOERROR if !v4.is_empty() => Ok((v4, ttl)),
                NOERROR | NXDOMAIN => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{name} has no address"),
                )),
                r => Err(io::Error::other(format!(
                    "resolver answered rcode {r} for {name}"
                ))),
            };
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the resolver {upstream} did not answer for {name}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn allowed_names_get_fake_ips_and_denied_ones_nxdomain() {
        let op = OperatorPolicy::new(vec![], vec![], false, &[]);
        let sb = SandboxPolicy {
            template_allow: vec!["*.test".parse().unwrap()],
            template_deny: vec!["bad.test".parse().unwrap()],
            ..Default::default()
        };
        let mut pool = FakePool::new(Ipv4Addr::new(100, 127, 128, 0), 16);
        let ask = |pool: &mut FakePool, name: &str, t: u16| {
            let a = respond(&op, &sb, pool, &wire::build_query(1, name, t)).unwrap();
            wire::parse_response(&a, 1).unwrap()
        };
        assert_eq!(
            ask(&mut pool, "pypi.test", TYPE_A),
            (NOERROR, vec![IpAddr::V4(Ipv4Addr::new(100, 127, 128, 1))])
        );
        assert_eq!(
            ask(&mut pool, "pypi.test", wire::TYPE_AAAA),
            (NOERROR, vec![])
        );
        assert_eq!(ask(&mut pool, "bad.test", TYPE_A), (NXDOMAIN, vec![]));
        assert_eq!(ask(&mut pool, "example.org", TYPE_A), (NXDOMAIN, vec![]));
        assert_eq!(pool.len(), 1);
        // Garbage with a header gets FORMERR; without one, nothing.
        let a = respond(&op, &sb, &mut pool, &[0, 5, 0, 0, 0, 9]).unwrap();
        assert_eq!(a[3] & 0xF, FORMERR);
        assert!(respond(&op, &sb, &mut pool, &[1]).is_none());
    }
}
