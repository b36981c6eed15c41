//! The operator's secret values (`--secrets-file`), shared by both
//! backends and by `sandhub egress-proxy`: a JSON object of tenants, each
//! an object of secret names to values. Loading checks the file is
//! private and every entry valid; errors never quote a value.

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::PermissionsExt,
    path::Path,
};

use anyhow::Context;
use sandhub_api::validate;

/// The operator's values, per tenant (`--secrets-file`).
#[derive(Default)]
pub struct OperatorSecrets(HashMap<String, BTreeMap<String, String>>);

impl std::fmt::Debug for OperatorSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSecrets")
            .field("tenants", &self.0.len())
            .finish()
    }
}

impl OperatorSecrets {
    /// Reads a `--secrets-file`: a JSON object of tenants, each an object
    /// of names to values (`{"default": {"OPENAI_API_KEY": "sk-..."}}`;
    /// `default` is the tenant of a hub without API keys). It must be
    /// readable by its owner only (0600 or stricter). Errors name the
    /// tenant and the secret, never a value.
    pub fn load(path: &Path) -> anyhow::Result<OperatorSecrets> {
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{}: mode {:o}; a secrets file must be readable by its owner only (chmod 600)",
                path.display(),
                mode & 0o777
            );
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let all: HashMap<String, BTreeMap<String, String>> = serde_json::from_str(&text)
            .map_err(|e| {
                // serde's message may quote the input: only its position.
                anyhow::anyhow!(
                    "{}: not a JSON object of tenants to {{name: value}} objects (line {}, column {})",
                    path.display(),
                    e.line(),
                    e.column()
                )
            })?;
        for (tenant, secrets) in &all {
            for (name, value) in secrets {
                validate::secret_name(name)
                    .and_then(|()| validate::secret_value(name, value))
                    .map_err(|e| {
                        anyhow::anyhow!("{} tenant {tenant:?}: {}", path.display(), e.message)
                    })?;
            }
        }
        Ok(OperatorSecrets(all))
    }

    pub fn get(&self, tenant: &str, name: &str) -> Option<&String> {
        self.0.get(tenant)?.get(name)
    }

    pub fn names(&self, tenant: &str) -> impl Iterator<Item = &String> {
        self.0.get(tenant).into_iter().flat_map(|m| m.keys())
    }
}

impl OperatorSecrets {
    /// The tenants and their values (for the egress proxy, which keys
    /// them by the tenant label its claims carry).
    pub fn tenants(&self) -> impl Iterator<Item = (&String, &BTreeMap<String, String>)> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secrets_file_is_private_checked_and_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secrets.json");
        std::fs::write(
            &p,
            r#"{"default": {"OPENAI_API_KEY": "sk-1-long-enough"}, "bob": {"K": "v-long-enough"}}"#,
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(OperatorSecrets::load(&p)
            .unwrap_err()
            .to_string()
            .contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = OperatorSecrets::load(&p).unwrap();
        assert_eq!(
            s.get("default", "OPENAI_API_KEY").unwrap(),
            "sk-1-long-enough"
        );
        assert!(s.get("bob", "OPENAI_API_KEY").is_none());
        assert!(!format!("{s:?}").contains("sk-1"));
        std::fs::write(&p, r#"{"default": {"K": "line\nbreak-sk-2-long"}}"#).unwrap();
        let e = OperatorSecrets::load(&p).unwrap_err().to_string();
        assert!(e.contains("\"K\"") && !e.contains("sk-2"), "{e}");
        std::fs::write(&p, r#"{"default": ["sk-3"]}"#).unwrap();
        let e = OperatorSecrets::load(&p).unwrap_err().to_string();
        assert!(!e.contains("sk-3"), "{e}");
    }
}
