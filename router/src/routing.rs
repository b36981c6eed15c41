//! Which sandbox a request is for: the `X-Sandbox-*` headers (or gRPC
//! metadata, which arrives as the same headers) and the path-routing URL form
//! `<prefix>/<namespace>/<id>/<port>/<rest…>`. Pure parsing, no I/O, so the
//! property tests can hammer it.

use std::{net::IpAddr, time::Duration};

use http::HeaderMap;

pub const HEADER_ID: &str = "x-sandbox-id";
pub const HEADER_NAMESPACE: &str = "x-sandbox-namespace";
pub const HEADER_PORT: &str = "x-sandbox-port";
pub const HEADER_POD_IP: &str = "x-sandbox-pod-ip";
pub const HEADER_UID: &str = "x-sandbox-uid";
pub const HEADER_TIMEOUT: &str = "x-sandbox-timeout";

pub const DEFAULT_NAMESPACE: &str = "default";
/// The legacy runtime's port; gRPC has no default (sandboxd serves it on 9090).
pub const DEFAULT_PORT: u16 = 8888;

/// The addressed sandbox, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Sandbox (Pod) name: a DNS-1123 label.
    pub id: String,
    pub namespace: String,
    pub port: u16,
    /// `X-Sandbox-Pod-IP`: skips every lookup.
    pub pod_ip: Option<IpAddr>,
    /// `X-Sandbox-UID`: a Pod-cache key.
    pub uid: Option<String>,
    /// `X-Sandbox-Timeout`: the client's own request timeout, capped later.
    pub timeout: Option<Duration>,
}

/// A bad routing header or path segment; the messages are upstream's, verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("X-Sandbox-ID header is required.")]
    MissingId,
    #[error("Invalid sandbox ID format.")]
    BadId,
    #[error("Invalid namespace format.")]
    BadNamespace,
    #[error("Invalid port format.")]
    BadPort,
    #[error("Invalid target IP address.")]
    BadIp,
    #[error("x-sandbox-port metadata is required for gRPC.")]
    MissingGrpcPort,
}

/// What the header parser needs to know beyond the headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeaderRules {
    /// gRPC: `x-sandbox-port` is required, there is no 8888 default.
    pub grpc: bool,
    /// `--allow-loopback-pod-ip` (tests only).
    pub allow_loopback: bool,
}

/// Lowercase alphanumerics and '-', starting and ending alphanumeric, 1..=63 bytes.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    alnum(b[0]) && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// Decimal 1..=65535 in at most 5 digits (no sign, no spaces; `000001` is
/// refused rather than parsed: no port needs more digits).
pub fn parse_port(s: &str) -> Result<u16, RouteError> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(RouteError::BadPort);
    }
    match s.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(RouteError::BadPort),
    }
}

/// A Pod IP a client may aim at: never the router's own host (unless allowed
/// for tests), a link-local address (cloud metadata lives there), multicast or
/// the unspecified address.
pub fn parse_pod_ip(s: &str, allow_loopback: bool) -> Result<IpAddr, RouteError> {
    let ip: IpAddr = s.parse().map_err(|_| RouteError::BadIp)?;
    let ip = ip.to_canonical();
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if (ip.is_loopback() && !allow_loopback)
        || link_local
        || ip.is_multicast()
        || ip.is_unspecified()
        || broadcast
    {
        return Err(RouteError::BadIp);
    }
    Ok(ip)
}

/// Where routing headers are read from: hyper's `HeaderMap`, or the raw
/// header lines of the HTTP/1.1 fast path. Either way the first header of a
/// name counts, and a value must be visible ASCII (`HeaderValue::to_str`'s rule).
pub trait HeaderSource {
    /// The first value of `name` (lowercase), as raw bytes.
    fn first(&self, name: &str) -> Option<&[u8]>;
}

impl HeaderSource for HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(|v| v.as_bytes())
    }
}

impl HeaderSource for [httparse::Header<'_>] {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }
}

/// A header value as text, under `HeaderValue::to_str`'s rule (tab or visible ASCII).
pub fn visible_ascii(v: &[u8]) -> Option<&str> {
    v.iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then(|| std::str::from_utf8(v).ok())
        .flatten()
}

fn header<'a, H: HeaderSource + ?Sized>(headers: &'a H, name: &str) -> Result<Option<&'a str>, ()> {
    match headers.first(name) {
        None => Ok(None),
        Some(v) => visible_ascii(v).map(|s| Some(s.trim())).ok_or(()),
    }
}

/// The target named by the `X-Sandbox-*` headers.
pub fn parse_headers<H: HeaderSource + ?Sized>(
    headers: &H,
    rules: HeaderRules,
) -> Result<Target, RouteError> {
    let id = match header(headers, HEADER_ID).map_err(|_| RouteError::BadId)? {
        None | Some("") => return Err(RouteError::MissingId),
        Some(id) => id,
    };
    if !is_dns1123_label(id) {
        return Err(RouteError::BadId);
    }
    let namespace = match header(headers, HEADER_NAMESPACE).map_err(|_| RouteError::BadNamespace)? {
        None | Some("") => DEFAULT_NAMESPACE,
        Some(ns) if is_dns1123_label(ns) => ns,
        Some(_) => return Err(RouteError::BadNamespace),
    };
    let port = match header(headers, HEADER_PORT).map_err(|_| RouteError::BadPort)? {
        None | Some("") if rules.grpc => return Err(RouteError::MissingGrpcPort),
        None | Some("") => DEFAULT_PORT,
        Some(p) => parse_port(p)?,
    };
    let pod_ip = match header(headers, HEADER_POD_IP).map_err(|_| RouteError::BadIp)? {
        None | Some("") => None,
        Some(ip) => Some(parse_pod_ip(ip, rules.allow_loopback)?),
    };
    let uid = match header(headers, HEADER_UID) {
        Ok(Some(u)) if !u.is_empty() => Some(u.to_owned()),
        _ => None,
    };
    Ok(Target {
        id: id.to_owned(),
        namespace: namespace.to_owned(),
        port,
        pod_ip,
        uid,
        timeout: parse_timeout(headers),
    })
}

/// `X-Sandbox-Timeout`: seconds (the SDK sends an int or float). Anything
/// unparsable, non-positive or absurd is ignored rather than rejected: it
/// only ever shortens the router's own budget.
fn parse_timeout<H: HeaderSource + ?Sized>(headers: &H) -> Option<Duration> {
    let s = header(headers, HEADER_TIMEOUT).ok()??;
    let secs: f64 = s.parse().ok()?;
    (secs.is_finite() && secs > 0.0 && secs < 1e9).then(|| Duration::from_secs_f64(secs))
}

/// A request addressed by URL: `<prefix>/<namespace>/<id>/<port>[/<rest…>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRoute<'a> {
    pub namespace: &'a str,
    pub id: &'a str,
    pub port: u16,
    /// The path to forward: `/<rest…>` (at least `/`), still escaped.
    pub rest: &'a str,
    /// `<prefix>/<namespace>/<id>/<port>/`: the session cookie's Path.
    pub base: &'a str,
}

/// Normalises a `--path-routing-prefix`: a leading '/', no trailing '/'.
pub fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim().trim_matches('/');
    format!("/{trimmed}")
}

/// Parses the escaped `path` against `prefix` (as from [`normalize_prefix`]).
/// `None`: not a path-routed URL (fall back to header routing);
/// `Some(Err)`: it is one, but a segment is invalid.
pub fn parse_path<'a>(prefix: &str, path: &'a str) -> Option<Result<PathRoute<'a>, RouteError>> {
    let after = if prefix == "/" {
        path.strip_prefix('/')?
    } else {
        path.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let mut parts = after.splitn(4, '/');
    let namespace = parts.next()?;
    let id = parts.next()?;
    let port = parts.next()?;
    let rest_start = path.len() - parts.next().map_or(0, |r| r.len() + 1);
    let rest = if rest_start == path.len() {
        "/"
    } else {
        &path[rest_start..]
    };
    // The cookie path ends just after the port segment's '/', when there is one.
    let base_end = (rest_start + 1).min(path.len());
    let route = (|| {
        if !is_dns1123_label(namespace) {
            return Err(RouteError::BadNamespace);
        }
        if !is_dns1123_label(id) {
            return Err(RouteError::BadId);
        }
        let port = parse_port(port)?;
        Ok(PathRoute {
            namespace,
            id,
            port,
            rest,
            base: &path[..base_end],
        })
    })();
    Some(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn defaults_apply_for_http_but_grpc_needs_a_port() {
        let t = parse_headers(&hm(&[("X-Sandbox-ID", "sb-1")]), HeaderRules::default()).unwrap();
        assert_eq!((t.namespace.as_str(), t.port), ("default", 8888));
        let grpc = HeaderRules {
            grpc: true,
            ..Default::default()
        };
        assert_eq!(
            parse_headers(&hm(&[("X-Sandbox-ID", "sb-1")]), grpc),
            Err(RouteError::MissingGrpcPort)
        );
    }

    #[test]
    fn upstream_error_messages() {
        let r = HeaderRules::default();
        let err = |p: &[(&str, &str)]| parse_headers(&hm(p), r).unwrap_err().to_string();
        assert_eq!(err(&[]), "X-Sandbox-ID header is required.");
        assert_eq!(
            err(&[("x-sandbox-id", "Bad_ID")]),
            "Invalid sandbox ID format."
        );
        assert_eq!(
            err(&[("x-sandbox-id", "a"), ("x-sandbox-namespace", "-x")]),
            "Invalid namespace format."
        );
        assert_eq!(
            err(&[("x-sandbox-id", "a"), ("x-sandbox-port", "0")]),
            "Invalid port format."
        );
        assert_eq!(
            err(&[
                ("x-sandbox-id", "a"),
                ("x-sandbox-pod-ip", "169.254.169.254")
            ]),
            "Invalid target IP address."
        );
    }

    #[test]
    fn pod_ip_rules() {
        assert!(parse_pod_ip("127.0.0.1", false).is_err());
        assert!(parse_pod_ip("::ffff:127.0.0.1", false).is_err());
        assert!(parse_pod_ip("127.0.0.1", true).is_ok());
        assert!(parse_pod_ip("fe80::1", false).is_err());
        assert!(parse_pod_ip("224.0.0.1", false).is_err());
        assert!(parse_pod_ip("0.0.0.0", false).is_err());
        assert!(parse_pod_ip("::", false).is_err());
        assert!(parse_pod_ip("10.244.1.7", false).is_ok());
        assert!(parse_pod_ip("fd00::7", false).is_ok());
    }

    #[test]
    fn path_routes() {
        let r = parse_path("/sb", "/sb/default/my-box/8080/a/b%2Fc")
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.namespace, r.id, r.port, r.rest),
            ("default", "my-box", 8080, "/a/b%2Fc")
        );
        assert_eq!(r.base, "/sb/default/my-box/8080/");
        let r = parse_path("/sb", "/sb/default/my-box/8080")
            .unwrap()
            .unwrap();
        assert_eq!((r.rest, r.base), ("/", "/sb/default/my-box/8080"));
        let r = parse_path("/sb", "/sb/default/my-box/8080/")
            .unwrap()
            .unwrap();
        assert_eq!((r.rest, r.base), ("/", "/sb/default/my-box/8080/"));
        assert!(parse_path("/sb", "/sbx/default/my-box/8080/").is_none());
        assert!(parse_path("/sb", "/sb/default/my-box").is_none());
        assert_eq!(
            parse_path("/sb", "/sb/Default/x/1/"),
            Some(Err(RouteError::BadNamespace))
        );
        assert_eq!(
            parse_path("/sb", "/sb/d/x/99999/"),
            Some(Err(RouteError::BadPort))
        );
    }
}
