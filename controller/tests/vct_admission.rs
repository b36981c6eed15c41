//! The v1.0.9 `volumeClaimTemplates` admission rules, enforced by the real apiserver from
//! our CRDs (schema + CEL) on Sandbox, SandboxTemplate and SandboxClaim: missing or empty
//! names, names over 63 characters, duplicates, more than 128 entries; and the Sandbox
//! rule that the list is immutable.

mod common;

use common::*;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use kube::Api;
use serde_json::{json, Value};

fn vct(name: Option<&str>) -> Value {
    let mut meta = json!({});
    if let Some(n) = name {
        meta["name"] = json!(n);
    }
    json!({"metadata": meta, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
}

fn pod_template() -> Value {
    json!({"spec": {"containers": [{"name": "main", "image": "busybox"}]}})
}

struct Kind {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
}

const KINDS: [Kind; 3] = [
    Kind {
        group: "agents.x-k8s.io",
        kind: "Sandbox",
        plural: "sandboxes",
    },
    Kind {
        group: "extensions.agents.x-k8s.io",
        kind: "SandboxTemplate",
        plural: "sandboxtemplates",
    },
    Kind {
        group: "extensions.agents.x-k8s.io",
        kind: "SandboxClaim",
        plural: "sandboxclaims",
    },
];

fn object(k: &Kind, name: &str, vcts: Vec<Value>) -> Value {
    let spec = if k.kind == "SandboxClaim" {
        json!({"warmPoolRef": {"name": "pool"}, "volumeClaimTemplates": vcts})
    } else {
        json!({"podTemplate": pod_template(), "volumeClaimTemplates": vcts})
    };
    json!({"apiVersion": format!("{}/v1beta1", k.group), "kind": k.kind, "metadata": {"name": name}, "spec": spec})
}

fn api(env: &Env, k: &Kind) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: k.group.into(),
        version: "v1beta1".into(),
        api_version: format!("{}/v1beta1", k.group),
        kind: k.kind.into(),
        plural: k.plural.into(),
    };
    Api::namespaced_with(env.client(), env.ns.name(), &ar)
}

async fn create(env: &Env, k: &Kind, obj: Value) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    match api(env, k).create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            Err(e.message)
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn invalid_volume_claim_templates_are_rejected_at_admission() {
    let Some(env) = Env::bare("vct-admission").await else {
        return;
    };
    let long = "v".repeat(64);
    let too_many: Vec<Value> = (0..129).map(|i| vct(Some(&format!("v{i}")))).collect();
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        ("missing-name", vec![vct(None)], "name: Required value"),
        (
            "empty-name",
            vec![vct(Some(""))],
            "should be at least 1 chars long",
        ),
        (
            "long-name",
            vec![vct(Some(&long))],
            "may not be more than 63",
        ),
        (
            "duplicates",
            vec![vct(Some("data")), vct(Some("data"))],
            "volumeClaimTemplates names must be unique",
        ),
        ("too-many", too_many, "must have at most 128 items"),
    ];
    for k in &KINDS {
        for (case, vcts, expect) in &cases {
            let name = format!("{}-{case}", k.kind.to_lowercase());
            let err = create(&env, k, object(k, &name, vcts.clone()))
                .await
                .expect_err(&format!("{} {case} was accepted", k.kind));
            assert!(err.contains(expect), "{} {case}: {err}", k.kind);
        }
        // The limits themselves are fine.
        let ok: Vec<Value> = (0..128)
            .map(|i| vct(Some(&format!("{}{i}", "v".repeat(60)))))
            .collect();
        let name = format!("{}-at-limits", k.kind.to_lowercase());
        create(&env, k, object(k, &name, ok))
            .await
            .unwrap_or_else(|e| panic!("{} at the limits: {e}", k.kind));
    }
}

#[tokio::test]
async fn sandbox_volume_claim_templates_are_immutable() {
    let Some(env) = Env::bare("vct-immutable").await else {
        return;
    };
    let k = &KINDS[0];
    create(&env, k, object(k, "fixed", vec![vct(Some("data"))]))
        .await
        .unwrap();
    let patch = json!({"spec": {"volumeClaimTemplates": [vct(Some("other"))]}});
    let err = api(&env, k)
        .patch("fixed", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("volumeClaimTemplates is immutable"),
        "{err}"
    );
    // Other spec edits still go through.
    let patch = json!({"spec": {"operatingMode": "Suspended"}});
    api(&env, k)
        .patch("fixed", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}
