//! The proxy's CA on Kubernetes: one CA for every replica, kept in the
//! Secret `sandhub-egress-ca` (made by the first replica that finds none;
//! a replica that loses the create race reads the winner's), and its
//! public half in the ConfigMap `sandhub-egress-ca` that egress Pods
//! mount (kube/egress.rs): `ca.crt`. Each Pod's sandboxd appends it to the
//! image's own roots (`sandboxd::trust`), so the Pod keeps trusting what
//! its image trusts.
//!
//! The key never leaves the Secret and this process: the ConfigMap holds
//! certificates only.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    ByteString,
};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};
use sandhub_gateway::broker::ca::Authority;

use crate::kube::egress::{CA_CERT_KEY, CA_CONFIGMAP, CA_SECRET};

/// The Secret's key of the CA's private key.
pub const CA_KEY_KEY: &str = "ca.key";
fn labels() -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        "sandhub-egress".to_string(),
    )]))
}

/// (certificate, key) PEM of a CA Secret; `None` if it is not one.
fn read_secret(s: &Secret) -> Option<(String, String)> {
    let d = s.data.as_ref()?;
    let text = |k: &str| String::from_utf8(d.get(k)?.0.clone()).ok();
    Some((text(CA_CERT_KEY)?, text(CA_KEY_KEY)?))
}

/// The CA Secret as it is first made.
pub fn new_secret(namespace: &str, cert: &str, key: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: labels(),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                CA_CERT_KEY.to_string(),
                ByteString(cert.as_bytes().to_vec()),
            ),
            (CA_KEY_KEY.to_string(), ByteString(key.as_bytes().to_vec())),
        ])),
        ..Default::default()
    }
}

/// The ConfigMap's data: the certificate alone (never the key).
pub fn public_data(cert: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(CA_CERT_KEY.to_string(), cert.to_string())])
}

/// The CA every replica shares: read, or made and stored.
pub async fn load_or_create(client: &Client, namespace: &str) -> anyhow::Result<Authority> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = || format!("the CA Secret {namespace}/{CA_SECRET}");
    let (cert, key) = match api.get_opt(CA_SECRET).await.with_context(what)? {
        Some(s) => read_secret(&s)
            .with_context(|| format!("{}: no {CA_CERT_KEY} and {CA_KEY_KEY}", what()))?,
        None => {
            let (cert, key) = Authority::generate()?;
            match api
                .create(&PostParams::default(), &new_secret(namespace, &cert, &key))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = CA_SECRET, "egress proxy: made the brokering CA");
                    (cert, key)
                }
                // Another replica made it first: theirs is the one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let s = api.get(CA_SECRET).await.with_context(what)?;
                    read_secret(&s).with_context(what)?
                }
                Err(e) => return Err(e).with_context(what),
            }
        }
    };
    let ca = Authority::from_pem(cert.clone(), &key).with_context(what)?;
    publish(client, namespace, &cert).await?;
    Ok(ca)
}

/// Writes the ConfigMap when it is missing or says something else.
async fn publish(client: &Client, namespace: &str, cert: &str) -> anyhow::Result<()> {
    let data = public_data(cert);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let what = || format!("the CA ConfigMap {namespace}/{CA_CONFIGMAP}");
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CA_CONFIGMAP.into()),
            namespace: Some(namespace.into()),
            labels: labels(),
            ..Default::default()
        },
        data: Some(data.clone()),
        ..Default::default()
    };
    match api.get_opt(CA_CONFIGMAP).await.with_context(what)? {
        None => match api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e).with_context(what),
        },
        Some(old) if old.data.as_ref() == Some(&data) => Ok(()),
        Some(old) => {
            cm.metadata.resource_version = old.metadata.resource_version;
            match api.replace(CA_CONFIGMAP, &PostParams::default(), &cm).await {
                // Another replica rewrote it in between: same CA, fine.
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e).with_context(what),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_half_holds_the_certificate_only_and_the_secret_both() {
        let (cert, key) = Authority::generate().unwrap();
        let s = new_secret("ns", &cert, &key);
        assert_eq!(read_secret(&s), Some((cert.clone(), key.clone())));
        let data = public_data(&cert);
        assert_eq!(data[CA_CERT_KEY], cert);
        assert!(!data.values().any(|v| v.contains("PRIVATE KEY")));
    }
}
