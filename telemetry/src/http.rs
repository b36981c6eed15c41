//! The exporter's HTTP client: one blocking HTTP/1.1 POST per batch on the
//! batch processor's own thread (it runs exports there with a plain
//! `block_on`, so an async client would need a runtime of its own).
//!
//! Written here rather than taken from reqwest because reqwest's TLS
//! setup differs between our binaries (the hub's build needs a crypto
//! provider installed first) and a trace exporter must never be what
//! stops a process. Plain `http://` only: a collector reached over TLS
//! sits behind a local agent or sidecar (the usual OpenTelemetry layout).

use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// At most this much of a collector's answer is read (its body is an
/// `ExportTraceServiceResponse`: a few bytes unless it reports rejects).
const MAX_ANSWER: u64 = 64 * 1024;

#[derive(Debug, Clone)]
pub struct BlockingHttp {
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for BlockingHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        post(&request, self.timeout)
    }
}

fn post(request: &Request<Bytes>, timeout: Duration) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri();
    if uri.scheme_str() != Some("http") {
        return Err(format!("{uri}: only http:// collectors are supported").into());
    }
    let host = uri.host().ok_or("the endpoint has no host")?;
    let port = uri.port_u16().unwrap_or(80);
    let host_for_dns = host.trim_start_matches('[').trim_end_matches(']');
    let mut last = None;
    let mut stream = None;
    for addr in (host_for_dns, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = match (stream, last) {
        (Some(s), _) => s,
        (None, Some(e)) => return Err(e.into()),
        (None, None) => return Err(format!("{host} has no address").into()),
    };
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        uri.authority().map(|a| a.as_str()).unwrap_or(host),
        request.body().len()
    );
    for (name, value) in request.headers() {
        if name == http::header::CONTENT_LENGTH || name == http::header::HOST {
            continue;
        }
        if let Ok(v) = value.to_str() {
            head.push_str(&format!("{name}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(request.body())?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER).read_to_end(&mut answer)?;
    parse_answer(&answer)
}

/// The status and body of an HTTP/1.x answer read to its end (`Connection:
/// close`). A chunked body is passed on as it came: the exporter only
/// looks at the status unless the collector reports partial success.
fn parse_answer(answer: &[u8]) -> Result<Response<Bytes>, HttpError> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the collector's answer has no complete head")?;
    let head = std::str::from_utf8(&answer[..end])?;
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(format!("not an HTTP status line: {status_line:?}").into());
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 answer: {status_line:?}").into());
    }
    let code: u16 = code.parse()?;
    Ok(Response::builder()
        .status(code)
        .body(Bytes::copy_from_slice(&answer[end + 4..]))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_status_and_body() {
        let r = parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.body().as_ref(), b"hi");
        let r = parse_answer(b"HTTP/1.0 503 Busy\r\n\r\n").unwrap();
        assert_eq!(r.status(), 503);
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_answer(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 abc x\r\n\r\n").is_err());
    }

    #[test]
    fn a_refused_connection_is_an_error_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let request = Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1:{port}/v1/traces"))
            .body(Bytes::from_static(b"x"))
            .unwrap();
        assert!(post(&request, Duration::from_secs(2)).is_err());
    }
}
