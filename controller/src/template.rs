//! The SandboxTemplate controller (spec §2.2): stamps the template-ref-hash label and keeps
//! the template's NetworkPolicy (`<template>-network-policy`) as `networkPolicyManagement`
//! says: Managed with the user's rules, Managed with the default secure policy when the
//! template has none, or Unmanaged (an owned policy is deleted).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::{Resource, ResourceExt};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::template::NetworkPolicyManagement;
use sandhub_api::k8s::SandboxTemplate;

use crate::context::{Context, SANDBOX_TEMPLATE_CONTROLLER};
use crate::error::Error;
use crate::object::controller_of;

/// Where the sandbox-router runs.
pub const ROUTER_NAMESPACE: &str = "agent-sandbox-system";
/// The router's Pod labels: upstream's, and deploy/router's.
pub const ROUTER_POD_LABELS: [(&str, &str); 2] = [
    ("app", "sandbox-router"),
    ("app.kubernetes.io/name", "sandbox-router"),
];
/// The hub's Pod label (deploy/hub); the hub runs in the sandboxes' namespace.
pub const HUB_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "sandhub-hub");
/// sandboxd's REST and gRPC ports: all the hub talks to.
pub const SANDBOXD_PORTS: [i32; 2] = [8080, 9090];

pub fn policy_name(template: &str) -> String {
    format!("{template}-network-policy")
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn block(cidr: &str, except: &[&str]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.into(),
            except: Some(except.iter().map(|s| s.to_string()).collect()),
        }),
        ..Default::default()
    }
}

/// Pods labelled `key=value` that are not sandbox Pods: every sandbox Pod
/// carries the name-hash label (a reserved key no tenant can drop), so a
/// sandbox that labels itself like the router or the hub still matches no
/// peer.
fn not_a_sandbox(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: labels(&[(key, value)]),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: names::SANDBOX_NAME_HASH.into(),
            operator: "DoesNotExist".into(),
            values: None,
        }]),
    }
}

/// Ingress only from the router (any port: it proxies to any of the Pod's ports) and
/// from the hub (sandboxd's ports), never from another sandbox Pod; egress to the
/// internet but no private, link-local or metadata ranges.
pub fn default_rules() -> (Vec<NetworkPolicyIngressRule>, Vec<NetworkPolicyEgressRule>) {
    let router = NetworkPolicyIngressRule {
        from: Some(
            ROUTER_POD_LABELS
                .iter()
                .map(|(k, v)| NetworkPolicyPeer {
                    pod_selector: Some(not_a_sandbox(k, v)),
                    namespace_selector: Some(LabelSelector {
                        match_labels: labels(&[("kubernetes.io/metadata.name", ROUTER_NAMESPACE)]),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    };
    // No namespace selector: the hub's Pods in the policy's own namespace.
    let hub = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(not_a_sandbox(HUB_POD_LABEL.0, HUB_POD_LABEL.1)),
            ..Default::default()
        }]),
        ports: Some(
            SANDBOXD_PORTS
                .iter()
                .map(|p| NetworkPolicyPort {
                    protocol: Some("TCP".into()),
                    port: Some(IntOrString::Int(*p)),
                    end_port: None,
                })
                .collect(),
        ),
    };
    let egress = NetworkPolicyEgressRule {
        to: Some(vec![
            block(
                "0.0.0.0/0",
                &[
                    "10.0.0.0/8",
                    "172.16.0.0/12",
                    "192.168.0.0/16",
                    "169.254.0.0/16",
                ],
            ),
            block("::/0", &["fc00::/7", "fe80::/10"]),
        ]),
        ..Default::default()
    };
    (vec![router, hub], vec![egress])
}

pub fn desired_policy(t: &SandboxTemplate) -> NetworkPolicy {
    let hash = name_hash(&t.name_any());
    let (ingress, mut egress) = match &t.spec.network_policy {
        Some(custom) => (
            custom.ingress.clone().unwrap_or_default(),
            custom.egress.clone().unwrap_or_default(),
        ),
        None => default_rules(),
    };
    // A `network: egress` template's Pods (the hub labels them) reach DNS
    // and the sandhub-egress proxy only: their way out is the proxy, which
    // judges every connection (issue #27). Whatever else the template
    // says would widen that, so it is replaced.
    let pod_labels = t
        .spec
        .blueprint
        .pod_template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref());
    if sandhub_api::k8s::egress::is_egress(pod_labels) {
        egress = sandhub_api::k8s::egress::proxy_rules();
    }
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(&t.name_any())),
            namespace: t.namespace(),
            owner_references: Some(vec![OwnerReference {
                api_version: SandboxTemplate::api_version(&()).into_owned(),
                kind: SandboxTemplate::kind(&()).into_owned(),
                name: t.name_any(),
                uid: t.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: labels(&[(names::SANDBOX_TEMPLATE_REF_HASH, &hash)]),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }
}

pub async fn run(ctx: Arc<Context>) -> anyhow::Result<()> {
    Controller::new(ctx.watch_api::<SandboxTemplate>(), ctx.watcher_config())
        .owns(ctx.watch_api::<NetworkPolicy>(), ctx.watcher_config())
        .with_config(Config::default().concurrency(ctx.flags.sandbox_template_concurrent_workers))
        .run(
            |o, c| crate::trace::reconciled("SandboxTemplate", &*o.clone(), reconcile(o, c)),
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

fn error_policy(t: Arc<SandboxTemplate>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .inc_reconcile_error("sandboxtemplate", err.metric_label());
    tracing::warn!(template = %t.name_any(), error = %err, "template reconcile error");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(t: Arc<SandboxTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    if t.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    let hash = name_hash(&name);
    if t.labels().get(names::SANDBOX_TEMPLATE_REF_HASH) != Some(&hash) {
        let patch =
            serde_json::json!({"metadata": {"labels": {names::SANDBOX_TEMPLATE_REF_HASH: hash}}});
        ctx.api_in::<SandboxTemplate>(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let policies = ctx.api_in::<NetworkPolicy>(&ns);
    let pname = policy_name(&name);
    match t.spec.network_policy_management {
        NetworkPolicyManagement::Unmanaged => {
            let existing = policies.get_opt(&pname).await?;
            let ours = existing
                .as_ref()
                .and_then(|p| controller_of(&p.metadata).cloned());
            if ours.is_some_and(|r| Some(r.uid) == t.uid()) {
                match policies.delete(&pname, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        NetworkPolicyManagement::Managed => {
            let mut want = desired_policy(&t);
            want.metadata.managed_fields = None;
            let body = serde_json::json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": want.metadata,
                "spec": want.spec,
            });
            // Server-side apply: a no-op when nothing changed, and it owns exactly the
            // fields we set.
            let pp = PatchParams::apply(SANDBOX_TEMPLATE_CONTROLLER).force();
            policies.patch(&pname, &pp, &Patch::Apply(&body)).await?;
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::k8s::template::NetworkPolicySpec as UserRules;

    #[test]
    fn default_policy_selects_the_template_pods_and_blocks_private_ranges() {
        let t = SandboxTemplate::new("tpl", Default::default());
        let np = desired_policy(&t);
        assert_eq!(np.metadata.name.as_deref(), Some("tpl-network-policy"));
        let spec = np.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap()[names::SANDBOX_TEMPLATE_REF_HASH],
            name_hash("tpl")
        );
        assert_eq!(spec.policy_types.unwrap(), vec!["Ingress", "Egress"]);
        let egress = serde_json::to_value(spec.egress.unwrap()).unwrap();
        assert_eq!(egress[0]["to"][0]["ipBlock"]["except"][3], "169.254.0.0/16");
        assert_eq!(egress[0]["to"][1]["ipBlock"]["cidr"], "::/0");
        let ingress = serde_json::to_value(spec.ingress.unwrap()).unwrap();
        assert_eq!(
            ingress[0]["from"][0]["podSelector"]["matchLabels"]["app"],
            "sandbox-router"
        );
    }

    /// What a peer admits, in short: (namespace selector, pod selector labels,
    /// whether sandbox Pods are excluded).
    type Peer = (Option<String>, Vec<(String, String)>, bool);

    fn peers(rule: &NetworkPolicyIngressRule) -> Vec<Peer> {
        rule.from
            .iter()
            .flatten()
            .map(|p| {
                let pods = p.pod_selector.clone().expect("every peer selects Pods");
                let excludes_sandboxes = pods
                    .match_expressions
                    .iter()
                    .flatten()
                    .any(|e| e.key == names::SANDBOX_NAME_HASH && e.operator == "DoesNotExist");
                (
                    p.namespace_selector
                        .as_ref()
                        .and_then(|n| n.match_labels.as_ref())
                        .and_then(|l| l.get("kubernetes.io/metadata.name").cloned()),
                    pods.match_labels.unwrap_or_default().into_iter().collect(),
                    excludes_sandboxes,
                )
            })
            .collect()
    }

    #[test]
    fn default_ingress_admits_exactly_the_router_and_the_hub_never_a_sandbox_pod() {
        let (ingress, _) = default_rules();
        assert_eq!(ingress.len(), 2);
        let kv = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        // The router (upstream's label and ours), in its namespace, any port.
        assert_eq!(
            peers(&ingress[0]),
            vec![
                (
                    Some(ROUTER_NAMESPACE.into()),
                    kv("app", "sandbox-router"),
                    true
                ),
                (
                    Some(ROUTER_NAMESPACE.into()),
                    kv("app.kubernetes.io/name", "sandbox-router"),
                    true
                ),
            ]
        );
        assert!(ingress[0].ports.is_none());
        // The hub, in the sandboxes' namespace, sandboxd's ports only.
        assert_eq!(
            peers(&ingress[1]),
            vec![(None, kv("app.kubernetes.io/name", "sandhub-hub"), true)]
        );
        let ports: Vec<_> = ingress[1]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.clone().unwrap(), p.port.clone().unwrap()))
            .collect();
        assert_eq!(
            ports,
            vec![
                ("TCP".to_string(), IntOrString::Int(8080)),
                ("TCP".to_string(), IntOrString::Int(9090)),
            ]
        );
        // No peer is empty (an empty peer would admit every Pod).
        for rule in &ingress {
            assert!(rule.from.as_ref().is_some_and(|f| !f.is_empty()));
            for p in rule.from.iter().flatten() {
                assert!(p.ip_block.is_none());
            }
        }
    }

    #[test]
    fn an_egress_template_reaches_only_dns_and_the_proxy_whatever_its_rules() {
        use sandhub_api::k8s::common::PodMetadata;
        use sandhub_api::k8s::egress;
        let mut t = SandboxTemplate::new("web", Default::default());
        t.spec.blueprint.pod_template.metadata = Some(PodMetadata {
            labels: Some(BTreeMap::from([(
                egress::NETWORK_LABEL.to_string(),
                egress::EGRESS.to_string(),
            )])),
            annotations: None,
        });
        t.spec.network_policy = Some(UserRules {
            ingress: None,
            egress: Some(vec![NetworkPolicyEgressRule::default()]),
        });
        let spec = desired_policy(&t).spec.unwrap();
        assert_eq!(spec.egress.unwrap(), egress::proxy_rules());
        // Without the label: the template's own rules, as before.
        t.spec.blueprint.pod_template.metadata = None;
        assert_eq!(desired_policy(&t).spec.unwrap().egress.unwrap().len(), 1);
        // The default keeps its ingress for a labelled template.
        t.spec.network_policy = None;
        t.spec.blueprint.pod_template.metadata = Some(PodMetadata {
            labels: Some(BTreeMap::from([(
                egress::NETWORK_LABEL.to_string(),
                egress::EGRESS.to_string(),
            )])),
            annotations: None,
        });
        let spec = desired_policy(&t).spec.unwrap();
        assert_eq!(spec.ingress.unwrap(), default_rules().0);
        assert_eq!(spec.egress.unwrap(), egress::proxy_rules());
    }

    #[test]
    fn custom_rules_replace_the_default() {
        let mut t = SandboxTemplate::new("tpl", Default::default());
        t.spec.network_policy = Some(UserRules {
            ingress: None,
            egress: Some(vec![NetworkPolicyEgressRule::default()]),
        });
        let spec = desired_policy(&t).spec.unwrap();
        assert_eq!(spec.ingress.unwrap().len(), 0);
        assert_eq!(spec.egress.unwrap().len(), 1);
    }
}
