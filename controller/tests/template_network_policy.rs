//! The SandboxTemplate controller: template-ref-hash label and the NetworkPolicy in its
//! three modes (Managed default-secure, Managed custom, Unmanaged).

mod common;

use common::*;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::PostParams;
use kube::ResourceExt;
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::{SandboxTemplate, SandboxTemplateSpec};
use serde_json::json;

async fn policy(env: &Env, name: &str, cond: impl Fn(&NetworkPolicy) -> bool) -> NetworkPolicy {
    match sandhub_testkit::wait::until(&env.api::<NetworkPolicy>(), name, WAIT, "policy", cond)
        .await
    {
        Ok(p) => p,
        Err(e) => panic!("{e:#}\n{}", env.logs()),
    }
}

#[tokio::test]
async fn templates_get_their_label_and_network_policy_in_every_mode() {
    let Some(env) = Env::start("tpl-np").await else {
        return;
    };
    let mut spec = SandboxTemplateSpec::default();
    spec.blueprint.pod_template.spec.containers = vec![k8s_openapi::api::core::v1::Container {
        name: "main".into(),
        image: Some("busybox".into()),
        ..Default::default()
    }];
    let t = SandboxTemplate::new("tpl", spec);
    env.api::<SandboxTemplate>()
        .create(&PostParams::default(), &t)
        .await
        .unwrap();

    let np = policy(&env, "tpl-network-policy", |_| true).await;
    let spec = serde_json::to_value(np.spec.clone().unwrap()).unwrap();
    assert_eq!(
        spec["podSelector"]["matchLabels"][names::SANDBOX_TEMPLATE_REF_HASH],
        name_hash("tpl")
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        spec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
            ["kubernetes.io/metadata.name"],
        "agent-sandbox-system"
    );
    assert_eq!(
        spec["egress"][0]["to"][0]["ipBlock"],
        json!({"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]})
    );
    assert_eq!(
        spec["egress"][0]["to"][1]["ipBlock"],
        json!({"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]})
    );
    let t = env.api::<SandboxTemplate>().get("tpl").await.unwrap();
    assert_eq!(
        t.labels()[names::SANDBOX_TEMPLATE_REF_HASH],
        name_hash("tpl")
    );
    assert_eq!(np.owner_references()[0].uid, t.uid().unwrap());

    // Custom rules replace the default ones.
    env.patch::<SandboxTemplate>(
        "tpl",
        json!({"spec": {"networkPolicy": {"egress": [{"ports": [{"port": 443, "protocol": "TCP"}]}]}}}),
    )
    .await;
    let np = policy(&env, "tpl-network-policy", |np| {
        let s = serde_json::to_value(np.spec.clone().unwrap()).unwrap();
        s["egress"][0]["ports"][0]["port"] == 443
    })
    .await;
    let s = serde_json::to_value(np.spec.unwrap()).unwrap();
    assert!(s["ingress"].as_array().is_none_or(|a| a.is_empty()), "{s}");

    // Unmanaged: the owned policy goes away.
    env.patch::<SandboxTemplate>(
        "tpl",
        json!({"spec": {"networkPolicyManagement": "Unmanaged"}}),
    )
    .await;
    eventually(WAIT, "policy deleted", || async {
        env.api::<NetworkPolicy>()
            .get_opt("tpl-network-policy")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}
