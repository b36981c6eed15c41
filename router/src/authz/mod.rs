//! Who may reach which sandbox. Checked per request (per RPC for gRPC).

pub mod scoped;
pub mod tokenreview;

use std::time::SystemTime;

use http::HeaderMap;

use crate::{error::ProxyError, metrics::Metrics};
pub use scoped::{Scope, ScopedTokens};
pub use tokenreview::TokenReviewer;

pub enum Authorizer {
    AllowAll,
    Scoped(ScopedTokens),
    TokenReview {
        reviewer: Box<TokenReviewer>,
        require_token: bool,
    },
}

/// One access to check.
pub struct Access<'a> {
    pub token: Option<&'a str>,
    pub namespace: &'a str,
    pub id: &'a str,
    /// The client chose the Pod itself (X-Sandbox-Pod-IP or X-Sandbox-UID).
    pub pins_pod: bool,
}

const MISSING: &str = "Missing bearer token.";

/// `Authorization: Bearer <token>` (scheme case-insensitive).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    bearer_value(headers.get(http::header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of one `Authorization` value, if it is a Bearer one.
pub fn bearer_value(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authorizer {
    pub fn is_allow_all(&self) -> bool {
        matches!(self, Self::AllowAll)
    }

    /// `Ok(exp)`: allowed; `exp` is the token's expiry when it has one (for
    /// the session cookie's Max-Age).
    pub async fn check(
        &self,
        a: &Access<'_>,
        metrics: &Metrics,
    ) -> Result<Option<u64>, ProxyError> {
        let result = match self {
            Self::AllowAll => return Ok(None),
            Self::Scoped(tokens) => Self::check_scoped(tokens, a),
            Self::TokenReview {
                reviewer,
                require_token,
            } => match a.token {
                None if *require_token => Err(ProxyError::Unauthenticated(MISSING)),
                None => Ok(None),
                Some(token) => match reviewer.authenticated(token).await {
                    Ok(true) => Ok(None),
                    Ok(false) => Err(ProxyError::Unauthenticated("Invalid token.")),
                    Err(e) => {
                        tracing::warn!(error = %e, "TokenReview failed");
                        Err(ProxyError::Internal("Token review failed.".into()))
                    }
                },
            },
        };
        metrics.authz(a.namespace, if result.is_ok() { "allow" } else { "deny" });
        result
    }

    fn check_scoped(tokens: &ScopedTokens, a: &Access<'_>) -> Result<Option<u64>, ProxyError> {
        if a.pins_pod {
            return Err(ProxyError::Forbidden(
                "X-Sandbox-Pod-IP and X-Sandbox-UID are not allowed with scoped tokens.",
            ));
        }
        let token = a.token.ok_or(ProxyError::Unauthenticated(MISSING))?;
        let scope = tokens
            .verify(token, SystemTime::now())
            .map_err(|_| ProxyError::Unauthenticated("Invalid or expired token."))?;
        if scope.namespace != a.namespace || scope.name != a.id {
            return Err(ProxyError::Forbidden(
                "Token is not valid for this sandbox.",
            ));
        }
        Ok(Some(scope.exp))
    }
}
