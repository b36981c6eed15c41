//! How the hub reaches a Pod's sandboxd: directly by Pod IP (the hub runs
//! in the cluster, or on a host that routes to Pod IPs), or through
//! `sandhub-router` with a scoped token per sandbox (out of the cluster).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use sandhub_api::scoped_token::{Scope, ScopedTokens};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

/// sandboxd's upstream ports.
pub const REST_PORT: u16 = 8080;
pub const GRPC_PORT: u16 = 9090;
/// Scoped tokens live this long; clients are rebuilt well before.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// sandboxd behind a router sees the router's `Authorization` stripped, so
/// the hub presents sandboxd's own token in this header there.
pub const SANDBOXD_TOKEN_HEADER: &str = sandboxd::rest::ROUTED_AUTH_HEADER;

pub enum Reach {
    Direct {
        sandboxd_token: Option<String>,
    },
    Router {
        url: String,
        tokens: Option<ScopedTokens>,
        sandboxd_token: Option<String>,
    },
}

/// The sandbox a client is for.
pub struct Target<'a> {
    pub namespace: &'a str,
    /// The Pod's name (the router's `X-Sandbox-ID`).
    pub pod: &'a str,
    pub pod_ip: Option<&'a str>,
}

fn header(value: &str) -> Result<HeaderValue> {
    let mut v = HeaderValue::from_str(value)
        .map_err(|_| Error::invalid(format!("{value:?} cannot be sent in a header")))?;
    v.set_sensitive(true);
    Ok(v)
}

impl Reach {
    pub fn client(&self, target: &Target<'_>) -> Result<SandboxdClient> {
        match self {
            Reach::Direct { sandboxd_token } => {
                let ip = target.pod_ip.ok_or_else(|| {
                    Error::unavailable(format!("sandbox Pod {} has no IP yet", target.pod))
                })?;
                let host = if ip.contains(':') {
                    format!("[{ip}]")
                } else {
                    ip.to_string()
                };
                let client = SandboxdClient::tcp(
                    format!("http://{host}:{REST_PORT}"),
                    format!("http://{host}:{GRPC_PORT}"),
                )?;
                match sandboxd_token {
                    Some(t) => client.with_token(t),
                    None => Ok(client),
                }
            }
            Reach::Router {
                url,
                tokens,
                sandboxd_token,
            } => {
                let client = SandboxdClient::tcp(url.clone(), url.clone())?;
                let mut rest = HeaderMap::new();
                rest.insert(HeaderName::from_static("x-sandbox-id"), header(target.pod)?);
                rest.insert(
                    HeaderName::from_static("x-sandbox-namespace"),
                    header(target.namespace)?,
                );
                if let Some(tokens) = tokens {
                    let exp = (SystemTime::now() + TOKEN_LIFETIME)
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let token = tokens.mint(&Scope {
                        namespace: target.namespace.into(),
                        name: target.pod.into(),
                        exp,
                    });
                    rest.insert(
                        http::header::AUTHORIZATION,
                        header(&format!("Bearer {token}"))?,
                    );
                }
                if let Some(t) = sandboxd_token {
                    rest.insert(
                        HeaderName::from_static(SANDBOXD_TOKEN_HEADER),
                        header(&format!("Bearer {t}"))?,
                    );
                }
                let mut grpc = rest.clone();
                rest.insert(
                    HeaderName::from_static("x-sandbox-port"),
                    HeaderValue::from(REST_PORT),
                );
                grpc.insert(
                    HeaderName::from_static("x-sandbox-port"),
                    HeaderValue::from(GRPC_PORT),
                );
                Ok(client.with_headers(rest, grpc))
            }
        }
    }
}
