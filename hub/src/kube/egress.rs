//! `network: egress` on the kubernetes backend (issue #27 part 5): what
//! the hub writes so that `sandhub egress-proxy` (the gateway in proxy
//! form, [`crate::egress_proxy`]) can judge a Pod's connections, and what
//! the Pod gets. Pure functions, tested without a cluster.
//!
//! - The tenant's SandboxTemplate carries the template's `network` and
//!   `egress_mb` (pod-template annotation [`NETWORK_ANNOTATION`]), and
//!   its Pods the label [`NETWORK_LABEL`]`=egress`, which the shipped
//!   NetworkPolicy (`deploy/egress/sandbox-networkpolicy.yaml`,
//!   [`sandbox_network_policy`]) selects: DNS and the proxy, nothing else.
//! - Each egress sandbox's SandboxClaim carries its recorded policy
//!   ([`POLICY_ANNOTATION`], a [`Recorded`]): the template's lists and the
//!   sandbox's own narrowing. `PATCH /v1/sandboxes/{id}/network` rewrites
//!   it; the proxy watches claims, so the next connection follows.
//!   Claims are written by the hub only: sandbox Pods run without a
//!   service account token, and no role lets a Pod write claims, so a
//!   workload cannot change its own policy.
//! - The claim's `env` gives the Pod `HTTP_PROXY`, `HTTPS_PROXY`,
//!   `ALL_PROXY` (and their lowercase forms) with the sandbox id and its
//!   proxy credential (derived from the sandboxd token key, another
//!   domain: [`SandboxdTokens::proxy_credential`]), and `NO_PROXY`.
//! - Brokered secrets: the template's `secrets` ride in its
//!   [`TemplateNetwork`]; a sandbox's [`Recorded`] policy lists its secrets
//!   (template's and request's) and the placeholder each got
//!   (`sandhub-secret-<random>`, not a secret: the proxy matches it). The
//!   Pod gets the placeholders and [`ca_env`]: the trust bundle sandboxd
//!   writes at start ([`BUNDLE_FILE`]: the image's roots and the CA of the
//!   ConfigMap [`CA_CONFIGMAP`], which every egress Pod mounts at
//!   [`CA_DIR`]; the proxy keeps the CA's key in the Secret [`CA_SECRET`]).
//!   Values live in the tenant's Secret (`kube/secrets.rs`) or the
//!   operator's `--secrets-file`, and only the proxy reads them.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{ConfigMapVolumeSource, Volume, VolumeMount},
    networking::v1::{NetworkPolicy, NetworkPolicySpec},
};
use kube::api::ObjectMeta;
use sandhub_api::{
    error::Code,
    hub::{Network, NetworkSpec, Template},
    sandboxd_token::SandboxdTokens,
    secrets::{SecretRef, PLACEHOLDER_PREFIX},
    validate,
};
use sandhub_client::{Error, Result};
use sandhub_gateway::SandboxPolicy;
use serde::{Deserialize, Serialize};

pub use sandhub_api::k8s::egress::{NETWORK_LABEL, PROXY_APP, PROXY_PORT};
/// Pod-template annotation: the template's [`TemplateNetwork`] (JSON).
pub const NETWORK_ANNOTATION: &str = "sandhub.io/network";
/// Claim annotation: the sandbox's [`Recorded`] policy (JSON).
pub const POLICY_ANNOTATION: &str = "sandhub.io/egress-policy";
/// The Secret (in the hub's namespace) holding the proxy's CA key and
/// certificate; made by the first proxy replica that finds none.
pub const CA_SECRET: &str = "sandhub-egress-ca";
/// The ConfigMap with the CA certificate ([`CA_CERT_KEY`]) that egress
/// Pods mount; kept by the proxy.
pub const CA_CONFIGMAP: &str = "sandhub-egress-ca";
pub const CA_CERT_KEY: &str = "ca.crt";
/// Where egress Pods mount [`CA_CONFIGMAP`].
pub const CA_DIR: &str = "/etc/sandhub/egress-ca";
/// The Pod volume of [`CA_CONFIGMAP`].
pub const CA_VOLUME: &str = "sandhub-egress-ca";
/// Where sandboxd writes the Pod's trust bundle at start (an emptyDir): the
/// image's own roots with the proxy's CA ([`BUNDLE_FILE`]).
pub const BUNDLE_DIR: &str = "/etc/sandhub/ca-bundle";
pub const BUNDLE_FILE: &str = "/etc/sandhub/ca-bundle/ca-bundle.crt";
pub const BUNDLE_VOLUME: &str = "sandhub-ca-bundle";
/// sandboxd's flags (as the variables it reads them from) that write it.
pub const SANDBOXD_EXTRA_CA_ENV: &str = "SANDBOXD_EXTRA_CA_FILE";
pub const SANDBOXD_BUNDLE_OUT_ENV: &str = "SANDBOXD_CA_BUNDLE_OUT";

/// What of a template the proxy needs, kept on its SandboxTemplate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateNetwork {
    pub network: NetworkSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mb: Option<u64>,
    /// The template's brokered secrets (names, hosts, headers: no value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
}

impl TemplateNetwork {
    pub fn of(t: &Template) -> TemplateNetwork {
        TemplateNetwork {
            network: t.network.clone(),
            egress_mb: t.egress_mb,
            secrets: t.secrets.clone(),
        }
    }
}

/// One egress sandbox's policy as its claim records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub template: NetworkSpec,
    /// The create request's (or a `PATCH`'s) narrowing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<NetworkSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mb: Option<u64>,
    /// Its brokered secrets: the template's, then the request's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
    /// Secret name → the placeholder its Pod holds instead of the value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub placeholders: BTreeMap<String, String>,
}

/// A fresh placeholder: the prefix and 128 random bits, so one sandbox's
/// placeholder is never guessed by another (the local backend's form).
pub fn placeholder() -> String {
    format!("{PLACEHOLDER_PREFIX}{:032x}", rand::random::<u128>())
}

impl Recorded {
    /// The record of a new sandbox of template `t` narrowed by `request`.
    /// The narrowing rule is the local backend's (`validate::narrow_network`);
    /// `default_allows_all` is taken as `true` here since the hub does not
    /// hold the proxy's `--egress-default`: the proxy enforces the
    /// template layer (with its default) and the sandbox layer both, so a
    /// narrowing the hub lets through can never reach more.
    /// `secrets`: the create request's, added to the template's (a name
    /// both name is refused); each gets its placeholder here, once.
    pub fn new(
        t: &TemplateNetwork,
        request: Option<NetworkSpec>,
        secrets: &[SecretRef],
    ) -> Result<Recorded> {
        let secrets = validate::merge_secrets(&t.secrets, secrets)?;
        let placeholders = secrets
            .iter()
            .map(|s| (s.name.clone(), placeholder()))
            .collect();
        let mut r = Recorded {
            template: t.network.clone(),
            sandbox: None,
            egress_mb: t.egress_mb,
            secrets,
            placeholders,
        };
        if let Some(req) = request {
            r = r.patched(req)?;
        }
        Ok(r)
    }

    /// After `PATCH .../network` with `request` (which replaces the
    /// previous narrowing).
    pub fn patched(&self, request: NetworkSpec) -> Result<Recorded> {
        validate::narrow_network(&self.template, &request, true)?;
        let mut next = self.clone();
        next.sandbox = (request.mode != Network::Egress || !request.is_plain()).then_some(request);
        Ok(next)
    }

    /// The parsed layers the proxy enforces.
    pub fn policy(&self) -> Result<SandboxPolicy> {
        Ok(SandboxPolicy::layered(
            &self.template,
            self.sandbox.as_ref(),
        )?)
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_annotation(s: &str) -> Option<Recorded> {
        serde_json::from_str(s).ok()
    }
}

/// A template whose `network` the kubernetes backend cannot run as asked:
/// secrets without `egress` (only the proxy can broker them).
pub fn refuse_unsupported(t: &Template) -> Result<()> {
    if t.network.mode != Network::Egress && !t.secrets.is_empty() {
        return Err(Error::invalid(
            "secrets need `network: egress`: only the egress proxy can broker them",
        ));
    }
    Ok(())
}

/// The environment of a sandbox with secrets beyond its proxy variables:
/// each secret's placeholder under its name, and the trust bundle (the
/// proxy's CA with public roots) wherever common tools look for one.
pub fn secret_env(r: &Recorded) -> Vec<(String, String)> {
    if r.placeholders.is_empty() {
        return Vec::new();
    }
    let mut env: Vec<(String, String)> = r
        .placeholders
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(ca_env());
    env
}

/// The trust variables (the local backend's set): the bundle sandboxd
/// wrote, and the CA alone for Node.
pub fn ca_env() -> impl Iterator<Item = (String, String)> {
    let bundle = BUNDLE_FILE.to_string();
    let ca = format!("{CA_DIR}/{CA_CERT_KEY}");
    [
        ("SSL_CERT_FILE", bundle.clone()),
        ("REQUESTS_CA_BUNDLE", bundle.clone()),
        ("CURL_CA_BUNDLE", bundle.clone()),
        ("GIT_SSL_CAINFO", bundle),
        // Node adds this file to its own bundled roots.
        ("NODE_EXTRA_CA_CERTS", ca),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
}

/// What an egress Pod's main (sandboxd's) container gets: the CA
/// ConfigMap, optional (a Pod starts before the first proxy replica has
/// written it; only brokered hosts need it) and read-only; the emptyDir
/// sandboxd writes the bundle into; and the sandboxd variables that say so.
pub fn ca_volumes() -> (Vec<Volume>, Vec<VolumeMount>, Vec<(&'static str, String)>) {
    let (cm, cm_mount) = ca_volume();
    let bundle = Volume {
        name: BUNDLE_VOLUME.into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    };
    let bundle_mount = VolumeMount {
        name: BUNDLE_VOLUME.into(),
        mount_path: BUNDLE_DIR.into(),
        ..Default::default()
    };
    let env = vec![
        (SANDBOXD_EXTRA_CA_ENV, format!("{CA_DIR}/{CA_CERT_KEY}")),
        (SANDBOXD_BUNDLE_OUT_ENV, BUNDLE_FILE.to_string()),
    ];
    (vec![cm, bundle], vec![cm_mount, bundle_mount], env)
}

fn ca_volume() -> (Volume, VolumeMount) {
    (
        Volume {
            name: CA_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: CA_CONFIGMAP.into(),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        },
        VolumeMount {
            name: CA_VOLUME.into(),
            mount_path: CA_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
    )
}

/// `PATCH .../network` on a sandbox that has no proxy policy: only the
/// mode it has, unchanged, is accepted.
pub fn refuse_patch(request: &NetworkSpec) -> Result<()> {
    validate::network(request)?;
    if request.mode == Network::None && request.is_plain() {
        return Ok(());
    }
    Err(Error::new(
        Code::FailedPrecondition,
        "network: the sandbox runs with network `none` and cannot change: create a sandbox \
         from an `egress` template instead",
    ))
}

/// The proxy environment of sandbox `id`: `proxy` is `host:port` of the
/// `sandhub-egress` Service.
pub fn proxy_env(
    tokens: &SandboxdTokens,
    namespace: &str,
    id: &str,
    proxy: &str,
) -> Vec<(String, String)> {
    let cred = tokens.proxy_credential(namespace, id);
    let http = format!("http://{id}:{cred}@{proxy}");
    let socks = format!("socks5h://{id}:{cred}@{proxy}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    // Both spellings: curl reads only the lowercase `http_proxy`, most
    // other tools the uppercase ones.
    [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &no_proxy),
    ]
    .into_iter()
    .flat_map(|(k, v)| [(k.to_string(), v.clone()), (k.to_lowercase(), v.clone())])
    .collect()
}

/// The NetworkPolicy every egress sandbox Pod in a namespace gets: out
/// only to the cluster DNS and the proxy's Pods. (Ingress is left alone:
/// the hub and the router reach sandboxd.) sandhub-controller's managed
/// per-template policy applies the same rules to labelled templates; this
/// one, shipped as `deploy/egress/sandbox-networkpolicy.yaml` (a test
/// holds the two equal), also covers templates whose policy is
/// `Unmanaged`. NetworkPolicies add up, so a template's own rules could
/// only widen it: the hub writes egress templates with the managed
/// default.
pub fn sandbox_network_policy() -> NetworkPolicy {
    use sandhub_api::k8s::egress;
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some("sandhub-egress-sandboxes".into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(egress::pod_selector()),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(egress::proxy_rules()),
            ingress: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec(v: serde_json::Value) -> NetworkSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_record_narrows_never_widens_and_round_trips_through_its_annotation() {
        let t = TemplateNetwork {
            network: spec(
                serde_json::json!({"mode": "egress", "allow_out": ["*.test"], "deny_out": ["bad.test"]}),
            ),
            egress_mb: Some(5),
            secrets: Vec::new(),
        };
        let r = Recorded::new(
            &t,
            Some(spec(
                serde_json::json!({"mode": "egress", "allow_out": ["pypi.test"]}),
            )),
            &[],
        )
        .unwrap();
        let back = Recorded::from_annotation(&r.to_annotation()).unwrap();
        assert_eq!(back, r);
        let p = back.policy().unwrap();
        assert_eq!((p.template_allow.len(), p.template_deny.len()), (1, 1));
        assert_eq!(p.sandbox_allow.len(), 1);
        assert!(!p.offline);
        // Widening is refused, naming the entry.
        let e = r
            .patched(spec(
                serde_json::json!({"mode": "egress", "allow_out": ["example.org"]}),
            ))
            .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        // `none` takes it offline; plain `egress` goes back to the template.
        let off = r.patched(Network::None.into()).unwrap();
        assert!(off.policy().unwrap().offline);
        let plain = off.patched(Network::Egress.into()).unwrap();
        assert_eq!(plain.sandbox, None);
        assert!(Recorded::from_annotation("{not json").is_none());
    }

    fn secret(name: &str) -> SecretRef {
        serde_json::from_value(serde_json::json!({
            "name": name, "hosts": ["api.test"], "header": "Authorization"}))
        .unwrap()
    }

    #[test]
    fn secrets_get_placeholders_once_and_the_record_and_env_hold_no_value() {
        let t = TemplateNetwork {
            network: Network::Egress.into(),
            egress_mb: None,
            secrets: vec![secret("A")],
        };
        let r = Recorded::new(&t, None, &[secret("B")]).unwrap();
        let names: Vec<&str> = r.secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["A", "B"]);
        assert!(r.placeholders["A"].starts_with(PLACEHOLDER_PREFIX));
        assert_ne!(r.placeholders["A"], r.placeholders["B"]);
        // Kept through a PATCH and the annotation (the proxy reads them there).
        let patched = r.patched(Network::None.into()).unwrap();
        assert_eq!(patched.placeholders, r.placeholders);
        let back = Recorded::from_annotation(&patched.to_annotation()).unwrap();
        assert_eq!(back.placeholders, r.placeholders);
        assert_eq!(back.secrets, r.secrets);
        let env: BTreeMap<_, _> = secret_env(&r).into_iter().collect();
        assert_eq!(env["A"], r.placeholders["A"]);
        assert_eq!(env["SSL_CERT_FILE"], BUNDLE_FILE);
        assert_eq!(
            env["NODE_EXTRA_CA_CERTS"],
            format!("{CA_DIR}/{CA_CERT_KEY}")
        );
        // No secrets: no placeholder, no trust variables.
        let plain = Recorded::new(&TemplateNetwork::default(), None, &[]).unwrap();
        assert!(secret_env(&plain).is_empty());
        assert!(!plain.to_annotation().contains("placeholders"));
        // The request naming the template's secret again is refused.
        assert!(Recorded::new(&t, None, &[secret("A")]).is_err());
        // Secrets without egress are refused on a template.
        let offline = Template {
            secrets: vec![secret("A")],
            ..Default::default()
        };
        assert_eq!(
            refuse_unsupported(&offline).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn the_pod_env_carries_the_sandbox_and_its_own_credential() {
        let tokens = SandboxdTokens::new(vec![b'k'; 32]).unwrap();
        let env: BTreeMap<_, _> = proxy_env(&tokens, "ns", "sb-1", "sandhub-egress:3128")
            .into_iter()
            .collect();
        let cred = tokens.proxy_credential("ns", "sb-1");
        assert_eq!(
            env["HTTP_PROXY"],
            format!("http://sb-1:{cred}@sandhub-egress:3128")
        );
        assert_eq!(env["https_proxy"], env["HTTP_PROXY"]);
        assert_eq!(
            env["ALL_PROXY"],
            format!("socks5h://sb-1:{cred}@sandhub-egress:3128")
        );
        assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert_eq!(env.len(), 8);
        assert!(!env
            .values()
            .any(|v| v.contains(&tokens.token("ns", "sb-1"))));
    }

    #[test]
    fn the_shipped_network_policy_is_the_generated_one() {
        let shipped: NetworkPolicy = serde_yaml::from_str(include_str!(
            "../../../deploy/egress/sandbox-networkpolicy.yaml"
        ))
        .unwrap();
        assert_eq!(shipped, sandbox_network_policy());
        let spec = shipped.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        // Two destinations, nothing else: DNS and the proxy.
        let rules = spec.egress.unwrap();
        assert_eq!(rules.len(), 2);
        assert!(rules
            .iter()
            .all(|r| r.to.as_ref().is_some_and(|t| !t.is_empty())));
    }
}
