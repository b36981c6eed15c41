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
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::{Resource, ResourceExt};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::template::NetworkPolicyManagement;
use sandhub_api::k8s::SandboxTemplate;

use crate::context::{Context, SANDBOX_TEMPLATE_CONTROLLER};

/// Where the sandbox-router runs: the only ingress the default policy admits.
pub const ROUTER_NAMESPACE: &str = "agent-sandbox-system";

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

/// Ingress only from the router; egress to the internet but no private, link-local or
/// metadata ranges.
pub fn default_rules() -> (Vec<NetworkPolicyIngressRule>, Vec<NetworkPolicyEgressRule>) {
    let ingress = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: labels(&[("app", "sandbox-router")]),
                ..Default::default()
            }),
            namespace_selector: Some(LabelSelector {
                match_labels: labels(&[("kubernetes.io/metadata.name", ROUTER_NAMESPACE)]),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
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
    (vec![ingress], vec![egress])
}

pub fn desired_policy(t: &SandboxTemplate) -> NetworkPolicy {
    let hash = name_hash(&t.name_any());
    let (ingress, egress) = match &t.spec.network_policy {
        Some(custom) => (
            custom.ingress.clone().unwrap_or_default(),
            custom.egress.clone().unwrap_or_default(),
        ),
        None => default_rules(),
    };
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
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

fn error_policy(t: Arc<SandboxTemplate>, err: &kube::Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(template = %t.name_any(), error = %err, "template reconcile error");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(t: Arc<SandboxTemplate>, ctx: Arc<Context>) -> Result<Action, kube::Error> {
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
            let ours = existing.as_ref().and_then(|p| {
                p.owner_references()
                    .iter()
                    .find(|r| r.controller == Some(true))
                    .cloned()
            });
            if ours.is_some_and(|r| Some(r.uid) == t.uid()) {
                match policies.delete(&pname, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
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
