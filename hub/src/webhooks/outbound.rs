//! Webhook deliveries are connections the hub makes for a tenant, so they
//! obey the sandbox egress rules' closed ranges (`sandhub_gateway`'s
//! [`OperatorPolicy`]): no unspecified, loopback, link-local (the metadata
//! address 169.254.169.254), multicast or reserved address, none of the
//! host's own, no private range unless `--webhook-allow-private` opens it,
//! and never the hub's own listener. A name is resolved here, every
//! address it resolves to is checked, and the connection goes to a
//! checked address (no second resolution a DNS server could answer
//! differently). Each delivery is one POST under a timeout, its answer
//! read up to a cap, and a redirect is an answer like any other (never
//! followed).

use std::{
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use sandhub_gateway::policy::{canonical, Cidr, OperatorPolicy};
use tokio::io::{AsyncRead, AsyncWrite};

/// What a receiver's answer may take up; the rest is not read.
const MAX_ANSWER_BYTES: usize = 64 << 10;
/// Longest URL a webhook may have.
pub const MAX_URL_LEN: usize = 2048;
/// A name must resolve within this.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A webhook URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// `host[:port]` as the URL has it: the `Host` header.
    pub authority: String,
    pub path: String,
}

/// Parses an `http://` or `https://` URL without user info or fragment.
pub fn parse(url: &str) -> Result<Target, String> {
    if url.len() > MAX_URL_LEN {
        return Err(format!("longer than {MAX_URL_LEN} bytes"));
    }
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("must start with http:// or https://".into()),
    };
    let authority = uri.authority().ok_or("has no host")?;
    if authority.as_str().contains('@') {
        return Err("must not carry user info (user@host)".into());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err("has no host".into());
    }
    Ok(Target {
        https,
        port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        authority: authority.as_str().to_string(),
        path: uri
            .path_and_query()
            .map_or("/".into(), |p| p.as_str().to_string()),
        host,
    })
}

/// Why a URL cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Its address is closed to webhooks (checked before any connection).
    Refused(String),
    /// Resolving, connecting or sending failed.
    Failed(String),
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreachable::Refused(e) => write!(f, "refused: {e}"),
            Unreachable::Failed(e) => f.write_str(e),
        }
    }
}

/// Who the hub may POST to, and how.
pub struct Outbound {
    policy: OperatorPolicy,
    allow_loopback: bool,
    host_addrs: Vec<IpAddr>,
    /// The hub's own listeners: never a webhook's target.
    own: Mutex<Vec<SocketAddr>>,
    timeout: Duration,
}

impl Outbound {
    pub fn new(allow_private: Vec<Cidr>, allow_loopback: bool, timeout: Duration) -> Self {
        Outbound {
            policy: OperatorPolicy::new(allow_private, Vec::new(), true, &[]),
            allow_loopback,
            host_addrs: sandhub_gateway::host_addresses(),
            own: Mutex::new(Vec::new()),
            timeout,
        }
    }

    /// Adds the hub's listen address (checked whatever else is opened).
    pub fn add_own(&self, addr: SocketAddr) {
        self.own.lock().unwrap().push(addr);
    }

    /// Whether a delivery may connect to `addr`; the error says why not.
    pub fn check(&self, addr: SocketAddr) -> Result<(), String> {
        let ip = canonical(addr.ip());
        let local = ip.is_loopback() || self.host_addrs.iter().any(|h| canonical(*h) == ip);
        let own = self.own.lock().unwrap().iter().any(|o| {
            o.port() == addr.port()
                && (canonical(o.ip()) == ip
                    || (o.ip().is_unspecified() || o.ip().is_loopback()) && local)
        });
        if own {
            return Err(format!("{addr} is the hub's own listener"));
        }
        if self.allow_loopback && ip.is_loopback() {
            return Ok(());
        }
        self.policy
            .address_open(ip, &self.host_addrs)
            .map_err(|r| format!("{ip}: {r}"))
    }

    /// The address to connect to: a literal checked, or a name resolved
    /// and every address it has checked (one closed address refuses it).
    pub async fn resolve(&self, t: &Target) -> Result<SocketAddr, Unreachable> {
        if let Ok(ip) = t.host.parse::<IpAddr>() {
            let addr = SocketAddr::new(ip, t.port);
            self.check(addr).map_err(Unreachable::Refused)?;
            return Ok(addr);
        }
        let failed = Unreachable::Failed;
        let addrs: Vec<SocketAddr> = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((t.host.as_str(), t.port)),
        )
        .await
        .map_err(|_| failed(format!("resolving {} timed out", t.host)))?
        .map_err(|e| failed(format!("resolving {}: {e}", t.host)))?
        .collect();
        let first = *addrs
            .first()
            .ok_or_else(|| failed(format!("{} resolves to no address", t.host)))?;
        for a in &addrs {
            self.check(*a)
                .map_err(|e| Unreachable::Refused(format!("{} resolves to {e}", t.host)))?;
        }
        Ok(first)
    }

    /// POSTs `body` to `url` with `headers`; the receiver's status.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
    ) -> Result<u16, String> {
        let t = parse(url)?;
        let addr = self.resolve(&t).await.map_err(|e| e.to_string())?;
        tokio::time::timeout(self.timeout, async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            if t.https {
                let name = rustls_pki_types::ServerName::try_from(t.host.clone())
                    .map_err(|e| format!("TLS name {}: {e}", t.host))?;
                let tls = tokio_rustls::TlsConnector::from(tls_config())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", t.host))?;
                send(tls, &t, headers, body).await
            } else {
                send(tcp, &t, headers, body).await
            }
        })
        .await
        .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

async fn send<S>(
    io: S,
    t: &Target,
    headers: &[(&'static str, String)],
    body: Bytes,
) -> Result<u16, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let mut req = http::Request::post(t.path.as_str())
        .header(http::header::HOST, t.authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::USER_AGENT, "sandhub-webhooks");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("building the request: {e}"))?;
    let answer = sender
        .send_request(req)
        .await
        .map_err(|e| format!("sending: {e}"));
    let status = match answer {
        Ok(resp) => {
            let status = resp.status().as_u16();
            // Read (and drop) a bounded answer, so the receiver is not cut
            // off mid-write; what is past the cap is never read.
            let _ = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await;
            Ok(status)
        }
        Err(e) => Err(e),
    };
    conn.abort();
    status
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            Arc::new(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default protocol versions")
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            )
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_refuse_what_they_must() {
        let t = parse("https://example.com/hook?x=1").unwrap();
        assert!(t.https);
        assert_eq!((t.host.as_str(), t.port), ("example.com", 443));
        assert_eq!(t.path, "/hook?x=1");
        let t = parse("http://[::1]:8080").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 8080, "/")
        );
        for bad in ["ftp://x/", "http://u:p@x/", "/relative", "http:///nohost"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&format!("http://x/{}", "a".repeat(MAX_URL_LEN))).is_err());
    }

    #[test]
    fn closed_ranges_and_the_hub_itself_are_refused() {
        let out = Outbound::new(Vec::new(), false, Duration::from_secs(1));
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "10.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
        ] {
            let addr = SocketAddr::new(ip.parse().unwrap(), 80);
            assert!(out.check(addr).is_err(), "{ip}");
        }
        assert!(out.check("93.184.216.34:443".parse().unwrap()).is_ok());
        // Loopback opened by the operator: still never the hub's own port,
        // and never the metadata address.
        let out = Outbound::new(Vec::new(), true, Duration::from_secs(1));
        out.add_own("127.0.0.1:7070".parse().unwrap());
        assert!(out.check("127.0.0.1:9000".parse().unwrap()).is_ok());
        assert!(out.check("127.0.0.1:7070".parse().unwrap()).is_err());
        assert!(out.check("169.254.169.254:80".parse().unwrap()).is_err());
        let private = Outbound::new(
            vec![("10.0.0.0".parse().unwrap(), 8)],
            false,
            Duration::from_secs(1),
        );
        assert!(private.check("10.1.2.3:80".parse().unwrap()).is_ok());
    }
}
