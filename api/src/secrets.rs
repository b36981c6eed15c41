//! Brokered secrets (issue #27 part 3): what a template or a create
//! request names, and the bodies of `/v1/secrets`.
//!
//! A sandbox never holds a secret's value: its environment gets a
//! placeholder (`NAME=sandhub-secret-<random>`), and the egress gateway
//! puts the value in one header of requests to the secret's hosts, over
//! TLS it terminates itself (docs/security.md, "Brokered secrets").
//! The rules are checked in `validate::secrets`.

use serde::{Deserialize, Serialize};

/// Most secrets one template (or one create request) names.
pub const MAX_SECRETS: usize = 16;
/// Most hosts one secret names.
pub const MAX_SECRET_HOSTS: usize = 16;
/// Longest secret name (an environment variable's name).
pub const MAX_SECRET_NAME: usize = 128;
/// Longest `header` name.
pub const MAX_SECRET_HEADER: usize = 128;
/// Longest `format`.
pub const MAX_SECRET_FORMAT: usize = 256;
/// Largest value (`PUT /v1/secrets/{name}`, `--secrets-file`), in bytes.
pub const MAX_SECRET_VALUE: usize = 8192;
/// Smallest value: the gateway masks the value wherever an answer echoes
/// it, and a short one would mask ordinary text (no real key is shorter).
pub const MIN_SECRET_VALUE: usize = 8;
/// Most values one tenant stores through the API.
pub const MAX_TENANT_SECRETS: usize = 256;
/// What the environment variable holds instead of the value; the rest
/// is random per sandbox.
pub const PLACEHOLDER_PREFIX: &str = "sandhub-secret-";
/// The port a host entry without `:PORT` means.
pub const DEFAULT_PORT: u16 = 443;

/// One secret a sandbox uses: `{"name": "OPENAI_API_KEY", "hosts":
/// ["api.openai.com"], "header": "Authorization", "format": "Bearer {value}"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretRef {
    /// The environment variable that holds the placeholder, and the name
    /// the value is stored under: `[A-Za-z_][A-Za-z0-9_]*`.
    pub name: String,
    /// Where the value may go: names or `*.` wildcards, each with an
    /// optional `:PORT` (443 without one). TLS to these is terminated by
    /// the gateway.
    pub hosts: Vec<String>,
    /// The one request header the placeholder is replaced in (not `Host`
    /// nor a hop-by-hop header).
    pub header: String,
    /// The header's value with `{value}` where the secret goes (exactly
    /// once); `{value}` alone when unset.
    #[serde(default = "default_format", skip_serializing_if = "is_default_format")]
    pub format: String,
}

fn default_format() -> String {
    "{value}".into()
}

fn is_default_format(f: &str) -> bool {
    f == "{value}"
}

/// `PUT /v1/secrets/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PutSecret {
    /// At most [`MAX_SECRET_VALUE`] bytes; never readable back.
    pub value: String,
}

/// Where a value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SecretSource {
    /// `PUT /v1/secrets/{name}` (wins over the operator's).
    Tenant,
    /// The operator's `--secrets-file`.
    Operator,
}

/// One entry of `GET /v1/secrets`: never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretInfo {
    pub name: String,
    pub source: SecretSource,
    /// RFC 3339, UTC (tenant values only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}
