//! HTTP proxying: `CONNECT host:port` (a tunnel; TLS usually) and
//! absolute-form requests (`GET http://host/path`, plain HTTP).
//!
//! The head is read by hand, bounded ([`MAX_HEAD`] bytes, [`MAX_HEADERS`]
//! lines): the proxy needs only the request line and two headers, and a
//! hand-read head leaves the bytes after it (a CONNECT client's TLS
//! ClientHello may follow at once) in the buffer for the tunnel.
//!
//! Absolute-form requests are forwarded as one request per connection:
//! the head is rewritten to origin form with `Connection: close`, the
//! proxy's own headers dropped, and the rest spliced. Whatever else the
//! client sends on that connection can only reach the host already
//! judged, never another.

use std::sync::Arc;

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::{auth, Client, Dest, Proxy, Refusal, MAX_HEAD, MAX_HEADERS};

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    pub version: String,
    /// (name, value) in order, as sent.
    pub headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one head; `None` on EOF, oversize, or anything malformed.
async fn read_head(conn: &mut BufReader<TcpStream>) -> Option<Head> {
    let mut budget = MAX_HEAD as u64;
    let mut lines = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = (&mut *conn)
            .take(budget)
            .read_until(b'\n', &mut line)
            .await
            .ok()?;
        if n == 0 || !line.ends_with(b"\n") {
            return None; // EOF, or the budget ran out mid-line
        }
        budget -= n as u64;
        let text = String::from_utf8(line).ok()?;
        let text = text.trim_end_matches(['\r', '\n']).to_string();
        // A bare CR inside a line is where two parsers disagree (the
        // forwarded head must mean to the upstream what it meant here).
        if text.contains('\r') {
            return None;
        }
        if text.is_empty() {
            break;
        }
        if lines.len() > MAX_HEADERS {
            return None;
        }
        lines.push(text);
    }
    parse_head(&lines)
}

/// The request line and headers of `lines` (no blank line).
pub(crate) fn parse_head(lines: &[String]) -> Option<Head> {
    let (first, rest) = lines.split_first()?;
    let mut parts = first.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !matches!(version, "HTTP/1.1" | "HTTP/1.0")
    {
        return None;
    }
    let mut headers = Vec::with_capacity(rest.len());
    for l in rest {
        let (n, v) = l.split_once(':')?;
        // No obsolete line folding, no whitespace in names: a head two
        // parsers could read differently is refused.
        if n.is_empty() || n.bytes().any(|b| !b.is_ascii_graphic()) {
            return None;
        }
        headers.push((n.to_string(), v.trim().to_string()));
    }
    Some(Head {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        headers,
    })
}

/// `host:port` (CONNECT's target, or an absolute URL's authority) with a
/// default port.
pub(crate) fn authority(a: &str, default_port: Option<u16>) -> Option<Dest> {
    if a.is_empty() || a.contains('@') {
        return None; // userinfo in a target: refused, not guessed at
    }
    let (host, port) = match a.rsplit_once(':') {
        // `[v6]` alone has colons inside its brackets.
        Some((h, p)) if !p.contains(']') => (h, p.parse::<u16>().ok()?),
        _ => (a, default_port?),
    };
    Dest::parse(host, port)
}

/// `http://authority/path` → (the destination, the origin-form path).
pub(crate) fn absolute(target: &str) -> Option<(Dest, String)> {
    let rest = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])?;
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Some((authority(auth, Some(80))?, path))
}

/// Writes a short answer and closes.
async fn answer(conn: &mut BufReader<TcpStream>, status: &str, extra: &str, why: &str) {
    let body = format!("sandhub egress proxy: {why}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.get_mut().write_all(msg.as_bytes()).await;
    let _ = conn.get_mut().shutdown().await;
}

async fn refused(conn: &mut BufReader<TcpStream>, r: Refusal) {
    match r {
        Refusal::Policy(why) => answer(conn, "403 Forbidden", "", &why).await,
        Refusal::Unreachable(why) => answer(conn, "502 Bad Gateway", "", &why).await,
    }
}

pub(crate) async fn serve(proxy: Arc<Proxy>, mut conn: BufReader<TcpStream>) {
    let deadline = proxy.limits.handshake_timeout;
    let Ok(Some(head)) = tokio::time::timeout(deadline, read_head(&mut conn)).await else {
        return answer(
            &mut conn,
            "400 Bad Request",
            "",
            "a bad or oversized request head",
        )
        .await;
    };
    let client = head
        .header("proxy-authorization")
        .and_then(auth::basic)
        .and_then(|(user, pass)| proxy.authenticate(&user, &pass));
    let Some(client) = client else {
        return answer(
            &mut conn,
            "407 Proxy Authentication Required",
            "Proxy-Authenticate: Basic realm=\"sandhub-egress\"\r\n",
            "the sandbox's proxy credential is missing or wrong",
        )
        .await;
    };
    if head.method == "CONNECT" {
        let Some(dest) = authority(&head.target, None) else {
            return answer(&mut conn, "400 Bad Request", "", "CONNECT wants host:port").await;
        };
        let opened = tokio::time::timeout(deadline, proxy.open(&client, &dest, true)).await;
        let dialed = match opened {
            Ok(Ok(d)) => d,
            Ok(Err(r)) => return refused(&mut conn, r).await,
            Err(_) => {
                return answer(&mut conn, "504 Gateway Timeout", "", "connecting timed out").await
            }
        };
        if conn
            .get_mut()
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        return proxy.carry(&client, &dest, conn, dialed).await;
    }
    forward(&proxy, client, head, conn).await
}

/// An absolute-form request: judged by its URL's host and port.
async fn forward(proxy: &Arc<Proxy>, client: Client, head: Head, mut conn: BufReader<TcpStream>) {
    let Some((dest, path)) = absolute(&head.target) else {
        return answer(
            &mut conn,
            "400 Bad Request",
            "",
            "a proxy request wants an absolute http:// URL (use CONNECT for TLS)",
        )
        .await;
    };
    let opened = tokio::time::timeout(
        proxy.limits.handshake_timeout,
        proxy.open(&client, &dest, false),
    );
    let mut dialed = match opened.await {
        Ok(Ok(d)) => d,
        Ok(Err(r)) => return refused(&mut conn, r).await,
        Err(_) => {
            return answer(&mut conn, "504 Gateway Timeout", "", "connecting timed out").await
        }
    };
    // Plain HTTP is never brokered (`open(.., false)`): a secret's
    // placeholder goes out as the workload wrote it.
    let mut out = format!("{} {} {}\r\n", head.method, path, head.version);
    let mut has_host = false;
    for (n, v) in &head.headers {
        let lower = n.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "proxy-authorization" | "proxy-connection" | "connection" | "keep-alive"
        ) {
            continue;
        }
        has_host |= lower == "host";
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    if !has_host {
        let host = match (&dest.name, dest.ip) {
            (Some(n), _) => n.clone(),
            (None, Some(std::net::IpAddr::V6(v6))) => format!("[{v6}]"),
            (None, Some(ip)) => ip.to_string(),
            (None, None) => String::new(),
        };
        out.push_str(&format!("Host: {host}:{}\r\n", dest.port));
    }
    out.push_str("Connection: close\r\n\r\n");
    if dialed.upstream.write_all(out.as_bytes()).await.is_err() {
        return answer(&mut conn, "502 Bad Gateway", "", "the upstream closed").await;
    }
    proxy.carry(&client, &dest, conn, dialed).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.split("\r\n").map(str::to_string).collect()
    }

    #[test]
    fn heads_targets_and_authorities_parse_strictly() {
        let h = parse_head(&lines(
            "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\nProxy-Authorization: Basic eA==",
        ))
        .unwrap();
        assert_eq!(h.method, "CONNECT");
        assert_eq!(h.header("PROXY-AUTHORIZATION"), Some("Basic eA=="));
        for bad in [
            "CONNECT api.test:443",
            "get / HTTP/1.1",
            "GET / HTTP/2",
            "GET /  HTTP/1.1",
            "GET / HTTP/1.1\r\n folded",
            "GET / HTTP/1.1\r\nBad Name: x",
        ] {
            assert!(parse_head(&lines(bad)).is_none(), "{bad:?}");
        }
        assert_eq!(authority("api.test:443", None).unwrap().port, 443);
        assert_eq!(authority("api.test", None), None);
        assert_eq!(authority("[::1]:22", None).unwrap().port, 22);
        assert_eq!(authority("[::1]", Some(80)).unwrap().port, 80);
        assert_eq!(authority("u@api.test:443", None), None);
        assert_eq!(authority("api.test:99999", None), None);
        let (d, p) = absolute("http://Pypi.test/simple/x/?a=1").unwrap();
        assert_eq!(
            (d.name.as_deref(), d.port, p.as_str()),
            (Some("pypi.test"), 80, "/simple/x/?a=1")
        );
        let (d, p) = absolute("HTTP://pypi.test:8080?q").unwrap();
        assert_eq!((d.port, p.as_str()), (8080, "/?q"));
        assert!(absolute("https://pypi.test/").is_none());
        assert!(absolute("/relative").is_none());
    }
}
