//! Brokered secrets: the gateway puts a secret's value into requests the
//! sandbox makes, so the value never enters the sandbox.
//!
//! A sandbox's environment holds a placeholder per secret. A flow whose
//! *name* (from the fake-IP DNS) and port match one of a secret's hosts
//! is handed to [`Broker::relay`] instead of being carried byte for byte:
//!
//! 1. TLS toward the sandbox is terminated with a certificate for that
//!    name, signed by the hub's CA ([`ca`]); ALPN offers `http/1.1` only;
//! 2. real TLS is opened upstream, verified against the system roots and
//!    the operator's `--egress-ca-file`, for the same name;
//! 3. each request is parsed by hyper (bounded heads) and, in the
//!    secret's header only, a value holding that sandbox's placeholder
//!    becomes the secret's `format` with the value in it ([`rewrite`]);
//!    bodies stream through untouched;
//! 4. answers are relayed as they are, except that the value itself, if
//!    the server echoes it, is masked in headers and bodies ([`scrub`]),
//!    so "the answers the gateway relays" never hold it either.
//!
//! Flows to other names, or to a secret's name on another port (plain
//! HTTP included), are never intercepted: they carry the placeholder as
//! the workload wrote it.
//!
//! # Layout
//!
//! ```text
//! mod.rs     Secret, Broker (per hub), relay() (one flow)
//! ca.rs      the per-hub CA (a directory, or PEM the caller keeps) and the
//!            bounded leaf-certificate cache
//! rewrite.rs the request header rewrite (pure; unit-tested)
//! scrub.rs   masking the value in answers (headers, streamed bodies)
//! ```

pub mod ca;
mod rewrite;
mod scrub;

use std::{io, path::Path, sync::Arc, time::Duration};

use http::HeaderName;
use hyper::{body::Incoming, Request};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::{
    pki_types::{CertificateDer, ServerName},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
    ClientConfig, RootCertStore, ServerConfig,
};
use sandhub_api::network::Pattern;
use tokio::{net::TcpStream, sync::Mutex};
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub use rewrite::rewrite;

/// A request or answer head larger than this is refused (hyper's read
/// buffer), so a workload cannot grow the gateway's memory with headers.
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers in one request or answer.
pub const MAX_HEADERS: usize = 128;
/// The sandbox's and upstream's TLS handshakes, each.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head must arrive within this once a byte of it has.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// One secret of one sandbox, value included (it lives only in the hub).
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    /// What the sandbox's environment holds instead of the value.
    pub placeholder: String,
    pub value: String,
    /// Names or wildcards, each with its port (443 unless given).
    pub hosts: Vec<Pattern>,
    pub header: HeaderName,
    /// With `{value}` exactly once.
    pub format: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value, not even in a debug line.
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl Secret {
    /// Whether a flow to `name` on `port` carries this secret.
    pub fn applies(&self, name: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|p| p.matches_port(port) && p.matches_name(name))
    }

    /// The header value the placeholder's header becomes.
    pub fn formatted(&self) -> String {
        self.format.replacen("{value}", &self.value, 1)
    }
}

/// What every sandbox's gateway on one hub shares for brokering.
pub struct Broker {
    ca: ca::Authority,
    upstream: Arc<ClientConfig>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

/// Always the same certificate (one leaf per relayed flow).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Broker {
    /// The hub's broker: its CA in `ca_dir` (made there the first time),
    /// upstream trust from the system's roots plus `extra_roots` (PEM).
    pub fn new(ca_dir: &Path, extra_roots: Option<&Path>) -> io::Result<Broker> {
        Broker::with_authority(ca::Authority::load_or_create(ca_dir)?, extra_roots)
    }

    /// A broker over a CA its caller keeps (the egress proxy's Kubernetes
    /// Secret, shared by its replicas).
    pub fn with_authority(ca: ca::Authority, extra_roots: Option<&Path>) -> io::Result<Broker> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for c in native.certs {
            let _ = roots.add(c);
        }
        if let Some(p) = extra_roots {
            let pem = std::fs::read(p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            let mut n = 0;
            for c in pem_certs(&pem) {
                roots
                    .add(c)
                    .map_err(|e| io::Error::other(format!("{}: {e}", p.display())))?;
                n += 1;
            }
            if n == 0 {
                return Err(io::Error::other(format!(
                    "{}: no PEM certificate in it",
                    p.display()
                )));
            }
        }
        let mut upstream = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Broker {
            ca,
            upstream: Arc::new(upstream),
        })
    }

    /// The CA certificate sandboxes must trust, PEM.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Carries one flow: `sandbox` is the loop's end of the sandbox's
    /// connection, `upstream` the real one. Ends when either side does.
    pub async fn relay<S>(
        self: Arc<Self>,
        name: String,
        secrets: Arc<Vec<Secret>>,
        sandbox: S,
        upstream: TcpStream,
    ) -> Result<(), String>
    where
        // The TUN loop's in-memory pipe, or the proxy's client connection.
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let leaf = self.ca.leaf(&name).map_err(|e| e.to_string())?;
        let mut sc = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(leaf)));
        // HTTP/1.1 only: one request at a time, heads we parse and bound.
        sc.alpn_protocols = vec![b"http/1.1".to_vec()];
        let inside = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            TlsAcceptor::from(Arc::new(sc)).accept(sandbox),
        )
        .await
        .map_err(|_| "the sandbox's TLS handshake timed out".to_string())?
        .map_err(|e| format!("the sandbox's TLS handshake: {e}"))?;
        let outside = match self.connect_upstream(&name, upstream).await {
            Ok(s) => s,
            Err(why) => {
                // The sandbox's TLS is up: it hears why, as one HTTP answer,
                // instead of a connection that closes without a word.
                let _ = refuse(inside, &why).await;
                return Err(why);
            }
        };
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD.max(8192))
            .max_headers(MAX_HEADERS)
            .handshake::<_, scrub::Body<Incoming>>(TokioIo::new(outside))
            .await
            .map_err(|e| e.to_string())?;
        let send = Arc::new(Mutex::new(send));
        let values: Arc<Vec<String>> = Arc::new(secrets.iter().map(|s| s.value.clone()).collect());
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let (send, secrets, values) = (send.clone(), secrets.clone(), values.clone());
            async move {
                let _ = rewrite(req.headers_mut(), &secrets);
                // The request body streams through as the workload wrote
                // it (no value is ever put in a body).
                let req = req.map(|b| scrub::Body::new(b, Arc::new(Vec::new())));
                let mut send = send.lock().await;
                send.ready().await?;
                let mut resp = send.send_request(req).await?;
                drop(send);
                scrub::headers(resp.headers_mut(), &values);
                Ok::<_, hyper::Error>(resp.map(|b| scrub::Body::new(b, values)))
            }
        });
        let server = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD.max(8192))
            .max_headers(MAX_HEADERS)
            .serve_connection(TokioIo::new(inside), service);
        // The sandbox's side leads: when upstream closes first, the
        // server still writes out what it has, and its next request
        // fails; when the sandbox's side ends, so does the flow.
        let (mut server, mut conn) = (std::pin::pin!(server), std::pin::pin!(conn));
        let mut upstream_done = false;
        loop {
            tokio::select! {
                r = &mut server => return r.map_err(|e| e.to_string()),
                _ = &mut conn, if !upstream_done => upstream_done = true,
            }
        }
    }
}

impl Broker {
    /// TLS to the secret's host, verified for its name.
    async fn connect_upstream(
        &self,
        name: &str,
        upstream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
        tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            TlsConnector::from(self.upstream.clone()).connect(server_name, upstream),
        )
        .await
        .map_err(|_| format!("{name}: the TLS handshake timed out"))?
        .map_err(|e| format!("{name}: TLS: {e}"))
    }
}

/// Answers the sandbox's first request with `502` and `why`, then closes.
async fn refuse<S>(
    inside: tokio_rustls::server::TlsStream<S>,
    why: &str,
) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let body = format!("sandhub egress gateway: {why}\n");
    let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
        let body = body.clone();
        async move {
            let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
            *resp.status_mut() = http::StatusCode::BAD_GATEWAY;
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD.max(8192))
        .keep_alive(false)
        .serve_connection(TokioIo::new(inside), service)
        .await
}

/// The certificates of a PEM file.
fn pem_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}
