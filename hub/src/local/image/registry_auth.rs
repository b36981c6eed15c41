//! Registry credentials from a Docker-style `config.json` (`--registry-config`):
//! `{"auths": {"<registry>": {"auth": base64("user:pass")}}}`, or
//! `username` / `password` in the entry. Pure: the file's bytes in, one
//! registry's credentials out. Credential helpers (`credsStore`,
//! `credHelpers`) and identity tokens are not read.

use std::collections::BTreeMap;

use base64::Engine;
use sandhub_api::error::{Code, ErrorBody};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl std::fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthEntry")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The names Docker Hub goes by, as one key.
const DOCKER_HUB: &str = "docker.io";

/// A registry name as a lookup key: no scheme, no path, Docker Hub's
/// aliases as one (`https://index.docker.io/v1/` is Docker's own key).
pub fn registry_key(name: &str) -> String {
    let name = name.trim();
    let name = name
        .strip_prefix("https://")
        .or_else(|| name.strip_prefix("http://"))
        .unwrap_or(name);
    let host = name.split('/').next().unwrap_or(name).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DOCKER_HUB.into(),
        _ => host,
    }
}

impl DockerConfig {
    pub fn parse(bytes: &[u8]) -> Result<Self, ErrorBody> {
        serde_json::from_slice(bytes).map_err(|e| {
            ErrorBody::new(
                Code::InvalidArgument,
                format!("the registry config is not a Docker config.json: {e}"),
            )
        })
    }

    /// The credentials for `registry` (a host[:port] as in a reference).
    pub fn credentials(&self, registry: &str) -> Result<Option<Credentials>, ErrorBody> {
        let want = registry_key(registry);
        let Some((name, entry)) = self
            .auths
            .iter()
            .find(|(name, _)| registry_key(name) == want)
        else {
            return Ok(None);
        };
        let bad = |why: &str| {
            ErrorBody::new(
                Code::InvalidArgument,
                format!("the registry config's entry for {name}: {why}"),
            )
        };
        if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| bad("`auth` is not base64"))?;
            let text = String::from_utf8(raw).map_err(|_| bad("`auth` is not UTF-8"))?;
            let (user, pass) = text
                .split_once(':')
                .ok_or_else(|| bad("`auth` is not base64 of user:password"))?;
            return Ok(Some(Credentials {
                username: user.into(),
                password: pass.into(),
            }));
        }
        match (&entry.username, &entry.password) {
            (Some(u), Some(p)) if !u.is_empty() => Ok(Some(Credentials {
                username: u.clone(),
                password: p.clone(),
            })),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_and_username_entries_and_docker_hub_aliases() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3:cr3t");
        let json = format!(
            r#"{{"auths": {{
                "127.0.0.1:5000": {{"auth": "{auth}"}},
                "https://index.docker.io/v1/": {{"username": "bob", "password": "pw"}},
                "empty.example": {{}}
            }}, "credsStore": "desktop"}}"#
        );
        let c = DockerConfig::parse(json.as_bytes()).unwrap();
        let a = c.credentials("127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("alice", "s3:cr3t")
        );
        let b = c.credentials("docker.io").unwrap().unwrap();
        assert_eq!(b.username, "bob");
        assert_eq!(c.credentials("registry-1.docker.io").unwrap().unwrap(), b);
        assert_eq!(c.credentials("127.0.0.1:5001").unwrap(), None);
        assert_eq!(c.credentials("empty.example").unwrap(), None);
        assert!(!format!("{a:?}").contains("s3:cr3t"));
    }

    #[test]
    fn a_broken_entry_is_an_error_naming_it() {
        let c = DockerConfig::parse(br#"{"auths": {"r.example": {"auth": "%%%"}}}"#).unwrap();
        let e = c.credentials("r.example").unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("r.example"), "{}", e.message);
        assert!(DockerConfig::parse(b"[1]").is_err());
    }
}
