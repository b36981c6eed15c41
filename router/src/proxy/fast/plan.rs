//! Deciding from a request head alone whether the fast path serves it,
//! and writing the head the sandbox gets.

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};
use http::Method;

use crate::{
    authz::bearer_value,
    http1::{
        inbound::{request_head, Parsed, MAX_HEADERS},
        wire::put_header,
    },
    proxy::{Conn, Proxy, Resolved},
    routing::{parse_headers, parse_path, visible_ascii, HeaderRules, HeaderSource, Target},
};

/// Request headers that never reach the sandbox as the client sent them:
/// per-hop ones (RFC 9110 §7.6.1), credentials meant for the router, and the
/// ones it sets itself. Content-Length is written anew from the length the
/// body is relayed by: a `Connection: content-length` must not strip the
/// framing off a body that still goes out (the sandbox would read it as a
/// second request on a pooled connection other clients share).
const DROPPED: [&str; 15] = [
    "host",
    "content-length",
    "authorization",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "trailer",
    "transfer-encoding",
    "te",
    "upgrade",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// One request the fast path will serve, decided from its head alone.
pub struct Plan {
    pub head_len: usize,
    pub method: Method,
    /// The method and path, when the access log is on.
    pub logged: Option<(Method, String)>,
    pub target: Target,
    pub addr: SocketAddr,
    pub cached_uid: Option<String>,
    /// The Bearer token, read only when authorization needs it.
    pub token: Option<String>,
    pub content_length: u64,
    pub keep_alive: bool,
}

/// Decides, from the bytes so far, whether the next request is served here
/// (and if so writes its head for the sandbox into `up_head`).
pub(super) fn plan(buf: &[u8], up_head: &mut BytesMut, conn: &Conn, proxy: &Proxy) -> Parsed<Plan> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let req = match request_head(buf, &mut headers) {
        Ok(req) => req,
        Err(parsed) => return parsed,
    };
    let (method, path, head_len) = (req.method, req.target, req.len);
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Fallback;
    };
    // The fragment is the client's own business (hyper's URI drops it too).
    let path = path.split_once('#').map_or(path, |(p, _)| p);
    if method == Method::CONNECT
        || !path.starts_with('/')
        || !path.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Parsed::Fallback;
    }
    let s = &proxy.settings;
    if let Some(prefix) = &s.path_prefix {
        let bare = path.split_once('?').map_or(path, |(p, _)| p);
        if parse_path(prefix, bare).is_some() {
            return Parsed::Fallback;
        }
    }
    let headers: &[httparse::Header] = req.headers;
    let Some(fields) = Fields::read(headers) else {
        return Parsed::Fallback;
    };
    let rules = HeaderRules {
        grpc: false,
        allow_loopback: s.allow_loopback_pod_ip,
    };
    // A bad routing header gets hyper's path and its 400, word for word.
    let Ok(target) = parse_headers(headers, rules) else {
        return Parsed::Fallback;
    };
    let Ok(Resolved {
        authority,
        addr: Some(addr),
        cached_uid,
    }) = proxy.resolve(&target)
    else {
        return Parsed::Fallback;
    };
    let token = if proxy.authz.is_allow_all() {
        None
    } else {
        HeaderSource::first(headers, "authorization")
            .and_then(visible_ascii)
            .and_then(bearer_value)
            .map(str::to_owned)
    };

    up_head.clear();
    up_head.put_slice(method.as_str().as_bytes());
    up_head.put_u8(b' ');
    up_head.put_slice(path.as_bytes());
    up_head.put_slice(b" HTTP/1.1\r\nhost: ");
    up_head.put_slice(authority.as_str().as_bytes());
    up_head.put_slice(b"\r\n");
    if fields.has_length {
        use std::fmt::Write;
        let _ = write!(up_head, "content-length: {}\r\n", fields.content_length);
    }
    for h in headers {
        let name = h.name;
        if DROPPED.iter().any(|d| name.eq_ignore_ascii_case(d)) || fields.connection_names(name) {
            continue;
        }
        put_header(up_head, name.as_bytes(), h.value);
    }
    up_head.put_slice(b"x-forwarded-for: ");
    // Every earlier hop, from however many lines the client sent.
    for h in headers {
        if h.name.eq_ignore_ascii_case("x-forwarded-for")
            && !h.value.is_empty()
            && visible_ascii(h.value).is_some()
        {
            up_head.put_slice(h.value);
            up_head.put_slice(b", ");
        }
    }
    up_head.put_slice(conn.client_ip.as_bytes());
    up_head.put_slice(b"\r\nx-forwarded-host: ");
    up_head.put_slice(fields.host);
    up_head.put_slice(b"\r\nx-forwarded-proto: ");
    let https = s.trust_forwarded_proto && fields.forwarded_https;
    up_head.put_slice(if conn.tls || https { b"https" } else { b"http" });
    up_head.put_slice(b"\r\n\r\n");

    let logged = s.access_log.then(|| {
        let bare = path.split_once('?').map_or(path, |(p, _)| p);
        (method.clone(), bare.to_owned())
    });
    Parsed::Serve(Box::new(Plan {
        head_len,
        method,
        logged,
        target,
        addr,
        cached_uid,
        token,
        content_length: fields.content_length,
        keep_alive: fields.keep_alive,
    }))
}

/// What the fast path needs from a request's headers, read in one pass;
/// `None` when the request is one for hyper.
struct Fields<'a> {
    host: &'a [u8],
    /// Whether the client sent a Content-Length (the value is `content_length`).
    has_length: bool,
    content_length: u64,
    keep_alive: bool,
    forwarded_https: bool,
    /// The Connection header's tokens (headers it names stay on this hop).
    connection: [&'a [u8]; 8],
    connection_len: usize,
}

impl<'a> Fields<'a> {
    fn read(headers: &'a [httparse::Header<'a>]) -> Option<Self> {
        let mut f = Fields {
            host: b"",
            has_length: false,
            content_length: 0,
            keep_alive: true,
            forwarded_https: false,
            connection: [b""; 8],
            connection_len: 0,
        };
        let (mut host, mut id, mut xfp) = (false, false, false);
        for h in headers {
            let name = h.name;
            let is = |n: &str| name.eq_ignore_ascii_case(n);
            if is("host") {
                // Two Hosts: hyper's path refuses the request.
                if host {
                    return None;
                }
                f.host = h.value;
                host = true;
            } else if is("content-length") {
                // Two lengths, or one that is not plain digits: hyper's to judge.
                if f.has_length || h.value.is_empty() || !h.value.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                f.content_length = std::str::from_utf8(h.value).ok()?.parse().ok()?;
                f.has_length = true;
            } else if is("transfer-encoding") || is("upgrade") || is("expect") {
                return None;
            } else if is("connection") {
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        f.keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return None;
                    }
                    if !token.is_empty() {
                        *f.connection.get_mut(f.connection_len)? = token;
                        f.connection_len += 1;
                    }
                }
            } else if is("x-sandbox-id") {
                id = true;
            } else if is("x-forwarded-proto") && !xfp {
                xfp = true;
                f.forwarded_https = h.value.trim_ascii().eq_ignore_ascii_case(b"https");
            }
        }
        // The Host is forwarded as X-Forwarded-Host; values it could not be are hyper's.
        (host && id && visible_ascii(f.host).is_some()).then_some(f)
    }

    fn connection_names(&self, name: &str) -> bool {
        self.connection[..self.connection_len]
            .iter()
            .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;

    use super::*;
    use crate::{
        authz::Authorizer,
        config,
        http1::outbound::{DialPolicy, Dialer, Upstreams},
        metrics::Metrics,
        proxy::{headers::rewrite_request, Settings},
    };

    fn proxy(args: &[&str]) -> Proxy {
        let mut argv = vec!["sandhub-router".into()];
        argv.extend(args.iter().map(|a| (*a).into()));
        let args = config::load_from(argv).unwrap();
        let metrics = Arc::new(Metrics::new());
        let policy = DialPolicy {
            max_retries: 0,
            initial_delay: std::time::Duration::ZERO,
            max_delay: std::time::Duration::ZERO,
            attempt_timeout: std::time::Duration::from_secs(1),
        };
        Proxy {
            settings: Settings::from_args(&args),
            upstreams: Upstreams::new(Dialer::new(policy, metrics.clone())),
            authz: Arc::new(Authorizer::AllowAll),
            cache: None,
            metrics,
        }
    }

    fn conn() -> Conn {
        Conn::new("192.0.2.9:4000".parse().unwrap(), false)
    }

    const ROUTING: &str =
        "Host: router:8080\r\nX-Sandbox-ID: sb-1\r\nX-Sandbox-Pod-IP: 10.0.0.7\r\nX-Sandbox-Port: 8888\r\n";

    fn run(p: &Proxy, raw: &str) -> (Parsed<Plan>, BytesMut) {
        let mut up = BytesMut::new();
        (plan(raw.as_bytes(), &mut up, &conn(), p), up)
    }

    /// The head the sandbox would get, as sorted (lowercase name, value) pairs.
    fn sorted_pairs(head: &[u8]) -> (String, Vec<(String, Vec<u8>)>) {
        let mut hs = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut hs);
        assert!(req.parse(head).unwrap().is_complete(), "incomplete head");
        let line = format!("{} {}", req.method.unwrap(), req.path.unwrap());
        let mut pairs: Vec<_> = req
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        pairs.sort();
        (line, pairs)
    }

    /// What hyper's path sends for the same request: the client's headers
    /// through `rewrite_request`, plus the Host it writes.
    fn reference(raw: &str, authority: &str) -> Vec<(String, Vec<u8>)> {
        let mut hs = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut hs);
        req.parse(raw.as_bytes()).unwrap();
        let mut map = HeaderMap::new();
        for h in req.headers.iter() {
            map.append(
                HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(h.value).unwrap(),
            );
        }
        let host = map.get("host").cloned();
        rewrite_request(&mut map, false, false, &conn().client_ip, host, "http");
        let mut pairs: Vec<_> = map
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        pairs.push(("host".into(), authority.as_bytes().to_vec()));
        pairs.sort();
        pairs
    }

    #[test]
    fn a_simple_request_is_planned_with_its_rewritten_head() {
        let p = proxy(&[]);
        let raw = format!(
            "POST /v1/files?x=1 HTTP/1.1\r\n{ROUTING}Authorization: Bearer t\r\nContent-Length: 3\r\n\r\nabc"
        );
        let (Parsed::Serve(plan), up) = run(&p, &raw) else {
            panic!("not planned")
        };
        assert_eq!(plan.head_len, raw.len() - 3);
        assert_eq!(plan.content_length, 3);
        assert!(plan.keep_alive);
        assert_eq!(plan.addr, "10.0.0.7:8888".parse().unwrap());
        let (line, pairs) = sorted_pairs(&up);
        assert_eq!(line, "POST /v1/files?x=1");
        let names: Vec<_> = pairs.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"authorization"));
        assert_eq!(pairs, reference(&raw[..raw.len() - 3], "10.0.0.7:8888"));
    }

    #[test]
    fn the_body_keeps_its_framing_whatever_connection_names() {
        let p = proxy(&[]);
        let raw = format!(
            "POST / HTTP/1.1\r\n{ROUTING}Connection: content-length, keep-alive\r\nContent-Length: 3\r\n\r\n"
        );
        let (Parsed::Serve(plan), up) = run(&p, &raw) else {
            panic!("not planned")
        };
        assert_eq!(plan.content_length, 3);
        let (_, pairs) = sorted_pairs(&up);
        let lengths: Vec<_> = pairs
            .iter()
            .filter(|(n, _)| n == "content-length")
            .collect();
        assert_eq!(lengths, [&("content-length".to_owned(), b"3".to_vec())]);
    }

    #[test]
    fn requests_for_hyper_are_handed_over() {
        let p = proxy(&["--path-routing-prefix", "/r"]);
        for raw in [
            format!("GET / HTTP/1.0\r\n{ROUTING}\r\n"),
            format!("POST / HTTP/1.1\r\n{ROUTING}Transfer-Encoding: chunked\r\n\r\n"),
            format!("GET / HTTP/1.1\r\n{ROUTING}Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
            format!(
                "POST / HTTP/1.1\r\n{ROUTING}Expect: 100-continue\r\nContent-Length: 1\r\n\r\n"
            ),
            format!("POST / HTTP/1.1\r\n{ROUTING}Content-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            format!("POST / HTTP/1.1\r\n{ROUTING}Content-Length: +1\r\n\r\n"),
            format!("GET /r/default/sb-1/8888/x HTTP/1.1\r\n{ROUTING}\r\n"),
            format!("GET http://a/ HTTP/1.1\r\n{ROUTING}\r\n"),
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n".into(),
            "GET / HTTP/1.1\r\nX-Sandbox-ID: sb-1\r\nX-Sandbox-Pod-IP: 10.0.0.7\r\n\r\n".into(),
            format!("GET / HTTP/1.1\r\n{ROUTING}X-Sandbox-Port: x\r\nX-Sandbox-ID: Bad\r\n\r\n")
                .replacen("X-Sandbox-ID: sb-1", "X-Sandbox-ID: BAD", 1),
            // A DNS-named target: hyper's client resolves it.
            "GET / HTTP/1.1\r\nHost: a\r\nX-Sandbox-ID: sb-1\r\n\r\n".into(),
            "HELLO\r\n\r\n".into(),
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".into(),
        ] {
            assert!(matches!(run(&p, &raw).0, Parsed::Fallback), "{raw:?}");
        }
        assert!(matches!(
            run(&p, "GET / HTTP/1.1\r\nHost").0,
            Parsed::Partial
        ));
    }

    #[test]
    fn loopback_and_link_local_targets_follow_the_same_rules() {
        let raw = "GET / HTTP/1.1\r\nHost: a\r\nX-Sandbox-ID: sb-1\r\nX-Sandbox-Pod-IP: 127.0.0.1\r\n\r\n";
        assert!(matches!(run(&proxy(&[]), raw).0, Parsed::Fallback));
        assert!(matches!(
            run(&proxy(&["--allow-loopback-pod-ip"]), raw).0,
            Parsed::Serve(_)
        ));
        let metadata = raw.replace("127.0.0.1", "169.254.169.254");
        assert!(matches!(
            run(&proxy(&["--allow-loopback-pod-ip"]), &metadata).0,
            Parsed::Fallback
        ));
    }

    fn header() -> impl Strategy<Value = (String, String)> {
        let names = prop::sample::select(vec![
            "X-Custom",
            "accept",
            "Connection",
            "connection",
            "Keep-Alive",
            "TE",
            "te",
            "Trailer",
            "Proxy-Authorization",
            "Proxy-Connection",
            "Authorization",
            "X-Forwarded-For",
            "x-forwarded-host",
            "X-Forwarded-Proto",
            "Cookie",
            "X-Secret",
            "x-secret",
            "Content-Type",
            "X-Multi",
            "Close",
            "Host",
        ]);
        let token = prop::sample::select(vec![
            "keep-alive",
            "x-secret",
            "X-Multi",
            "close",
            "cookie",
            "te",
            "a=b",
            "",
        ]);
        let tokens = prop::collection::vec(token, 1..4).prop_map(|t| t.join(", "));
        (names, "[ -~]{0,16}", tokens).prop_map(|(n, v, t)| {
            let v = if n.eq_ignore_ascii_case("connection") {
                t
            } else {
                v
            };
            (n.to_owned(), v)
        })
    }

    proptest! {
        /// Whatever the client's headers, the fast path sends the sandbox the
        /// same header set as hyper's path: nothing per-hop, no credentials,
        /// nothing the Connection header names, X-Forwarded-* set once.
        #[test]
        fn the_sandbox_gets_what_the_hyper_path_sends(headers in prop::collection::vec(header(), 0..10)) {
            let p = proxy(&[]);
            let mut raw = format!("GET /a/b?c=d HTTP/1.1\r\n{ROUTING}");
            for (n, v) in &headers {
                raw.push_str(&format!("{n}: {v}\r\n"));
            }
            raw.push_str("\r\n");
            let (parsed, up) = run(&p, &raw);
            let Parsed::Serve(plan) = parsed else {
                // Only a second Host or an over-long Connection header is handed over here.
                let tokens = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
                    .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|t| !t.is_empty()).collect::<Vec<_>>())
                    .count();
                let hosts = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).count();
                prop_assert!(tokens > 8 || hosts > 0, "handed over: {raw:?}");
                return Ok(());
            };
            prop_assert_eq!(plan.head_len, raw.len());
            let (line, pairs) = sorted_pairs(&up);
            prop_assert_eq!(line, "GET /a/b?c=d");
            prop_assert_eq!(pairs, reference(&raw, "10.0.0.7:8888"));
        }
    }
}
