//! How the hub reaches a Pod's sandboxd: directly by Pod IP (the hub runs
//! in the cluster, or on a host that routes to Pod IPs), or through
//! `sandhub-router` with a scoped token per sandbox (out of the cluster).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use sandhub_api::sandboxd_token::SandboxdTokens;
use sandhub_api::scoped_token::{Scope, ScopedTokens};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

/// sandboxd's upstream ports.
pub const REST_PORT: u16 = 8080;
pub const GRPC_PORT: u16 = 9090;
/// Scoped tokens live this long; clients are rebuilt well before.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// sandboxd behind a router sees the router's `Authorization` stripped, so
/// the hub presents sandboxd's own token in this header there.
pub const SANDBOXD_TOKEN_HEADER: &str = sandhub_api::sandboxd::ROUTED_AUTH_HEADER;

/// What the hub presents to a sandboxd.
pub enum SandboxdAuth {
    /// The Pods' sandboxd ask for no token.
    None,
    /// One token every Pod accepts (`--sandboxd-token-secret`): the
    /// upstream SDK's `auth_token`, for operators who want it. Any workload
    /// that reads it opens every Pod that mounts it.
    Shared(String),
    /// Each Sandbox's own token (`--sandboxd-token-key-file`, the key
    /// sandhub-controller also holds): it opens that Pod and no other.
    PerSandbox(SandboxdTokens),
}

impl SandboxdAuth {
    fn token(&self, target: &Target<'_>) -> Option<String> {
        match self {
            SandboxdAuth::None => None,
            SandboxdAuth::Shared(t) => Some(t.clone()),
            SandboxdAuth::PerSandbox(keys) => Some(keys.token(target.namespace, target.sandbox)),
        }
    }
}

pub enum Reach {
    Direct {
        auth: SandboxdAuth,
    },
    Router {
        url: String,
        tokens: Option<ScopedTokens>,
        auth: SandboxdAuth,
    },
}

/// The sandbox a client is for.
pub struct Target<'a> {
    pub namespace: &'a str,
    /// The Sandbox's name (the router's `X-Sandbox-ID`, the Pod's name).
    pub sandbox: &'a str,
    pub pod_ip: Option<&'a str>,
}

impl Target<'_> {
    /// The Pod's IP as a URL host (`[...]` for IPv6).
    fn pod_host(&self) -> Result<String> {
        let ip = self.pod_ip.ok_or_else(|| {
            Error::unavailable(format!("sandbox Pod {} has no IP yet", self.sandbox))
        })?;
        Ok(if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        })
    }
}

fn header(value: &str) -> Result<HeaderValue> {
    let mut v = HeaderValue::from_str(value)
        .map_err(|_| Error::invalid(format!("{value:?} cannot be sent in a header")))?;
    v.set_sensitive(true);
    Ok(v)
}

impl Reach {
    /// Where to connect for `port` of the target's Pod, and the headers an
    /// HTTP request there must carry (through the router: the sandbox, the
    /// port and a scoped token).
    pub fn port(&self, target: &Target<'_>, port: u16) -> Result<(String, HeaderMap)> {
        match self {
            Reach::Direct { .. } => {
                let host = target.pod_host()?;
                Ok((format!("{host}:{port}"), HeaderMap::new()))
            }
            Reach::Router { url, tokens, .. } => {
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| Error::invalid(format!("router URL {url}: {e}")))?;
                let authority = uri
                    .authority()
                    .ok_or_else(|| Error::invalid(format!("router URL {url} has no host")))?;
                let addr = match authority.port_u16() {
                    Some(_) => authority.to_string(),
                    None => format!("{}:80", authority.host()),
                };
                let mut headers = self.routed_headers(target, tokens.as_ref())?;
                headers.insert(
                    HeaderName::from_static("x-sandbox-port"),
                    HeaderValue::from(port),
                );
                Ok((addr, headers))
            }
        }
    }

    /// Which sandbox, for the router, and the scoped token that opens it.
    fn routed_headers(
        &self,
        target: &Target<'_>,
        tokens: Option<&ScopedTokens>,
    ) -> Result<HeaderMap> {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_static("x-sandbox-id"),
            header(target.sandbox)?,
        );
        h.insert(
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
                name: target.sandbox.into(),
                exp,
            });
            h.insert(
                http::header::AUTHORIZATION,
                header(&format!("Bearer {token}"))?,
            );
        }
        Ok(h)
    }

    pub fn client(&self, target: &Target<'_>) -> Result<SandboxdClient> {
        match self {
            Reach::Direct { auth } => {
                let host = target.pod_host()?;
                let client = SandboxdClient::tcp(
                    format!("http://{host}:{REST_PORT}"),
                    format!("http://{host}:{GRPC_PORT}"),
                )?;
                match auth.token(target) {
                    Some(t) => client.with_token(&t),
                    None => Ok(client),
                }
            }
            Reach::Router { url, tokens, auth } => {
                let client = SandboxdClient::tcp(url.clone(), url.clone())?;
                let mut rest = self.routed_headers(target, tokens.as_ref())?;
                if let Some(t) = auth.token(target) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target<'a>(sandbox: &'a str) -> Target<'a> {
        Target {
            namespace: "ns",
            sandbox,
            pod_ip: Some("10.0.0.1"),
        }
    }

    #[tokio::test]
    async fn per_sandbox_auth_presents_each_sandbox_its_own_token() {
        let keys = SandboxdTokens::new(vec![3; 32]).unwrap();
        let auth = SandboxdAuth::PerSandbox(keys.clone());
        let a = auth.token(&target("pool-aaaaa")).unwrap();
        let b = auth.token(&target("pool-bbbbb")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, keys.token("ns", "pool-aaaaa"));
        // The shared token is the same everywhere; none is none.
        let shared = SandboxdAuth::Shared("s".into());
        assert_eq!(shared.token(&target("x")), shared.token(&target("y")));
        assert_eq!(SandboxdAuth::None.token(&target("x")), None);
        // Both ways build a client.
        for reach in [
            Reach::Direct { auth },
            Reach::Router {
                url: "http://127.0.0.1:1".into(),
                tokens: None,
                auth: SandboxdAuth::PerSandbox(keys),
            },
        ] {
            assert!(reach.client(&target("pool-aaaaa")).is_ok());
        }
    }
}
