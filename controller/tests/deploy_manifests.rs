//! `deploy/` holds exactly what the code generates, and the install manifests apply to the
//! real apiserver (server-side dry run: nothing is installed).
//! Regenerate with `SANDHUB_UPDATE_CRDS=1 cargo test -p sandhub-controller --test deploy_manifests`.

mod common;

use std::path::PathBuf;

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use kube::{Api, ResourceExt};
use serde::Deserialize;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn deploy_files_match_the_generated_manifests() {
    for (path, body) in sandhub_controller::manifests::files() {
        let full = deploy_dir().join(&path);
        if std::env::var_os("SANDHUB_UPDATE_CRDS").is_some() {
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, &body).unwrap();
        }
        let on_disk = std::fs::read_to_string(&full).unwrap_or_default();
        assert!(
            on_disk == body,
            "deploy/{path} drifted; regenerate with SANDHUB_UPDATE_CRDS=1"
        );
    }
}

fn documents(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn manifests_hold_the_expected_objects() {
    let kinds = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        documents(&text)
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let core = kinds("sandbox.yaml");
    assert!(core.contains(&"Namespace/agent-sandbox-system".to_string()));
    assert!(core.contains(&"CustomResourceDefinition/sandboxes.agents.x-k8s.io".to_string()));
    assert!(!core.iter().any(|k| k.contains("sandboxclaims")));
    assert!(core.contains(&"Deployment/agent-sandbox-controller".to_string()));
    let all = kinds("sandbox-with-extensions.yaml");
    assert_eq!(
        all.iter()
            .filter(|k| k.starts_with("CustomResourceDefinition/"))
            .count(),
        4
    );
    assert_eq!(
        all.iter().filter(|k| k.starts_with("Deployment/")).count(),
        1
    );
    let text = std::fs::read_to_string(deploy_dir().join("sandbox-with-extensions.yaml")).unwrap();
    let dep = documents(&text)
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "sandhub/controller:dev");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["args"][0], "--extensions");
    // Secure by default: the controller derives each Pod's own sandboxd token from a
    // required Secret, so no shared token exists to set up or leak.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.contains(&"--sandboxd-token-key-file=/etc/sandhub/sandboxd-token-key/key"),
        "{args:?}"
    );
    let volumes = &dep["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["secretName"], "sandboxd-token-key");
    assert!(volumes[0]["secret"].get("optional").is_none());
    assert_eq!(
        c["volumeMounts"][0]["mountPath"],
        "/etc/sandhub/sandboxd-token-key"
    );
    let chart =
        std::fs::read_to_string(deploy_dir().join("helm/sandhub-controller/Chart.yaml")).unwrap();
    assert_eq!(documents(&chart)[0]["name"], "sandhub-controller");
}

#[tokio::test]
async fn install_manifests_pass_a_server_side_dry_run() {
    let Some(cluster) = sandhub_testkit::TestCluster::from_env().await else {
        return;
    };
    let client = cluster.client();
    // Namespaced objects need their namespace to exist even in a dry run.
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "agent-sandbox-system"}}))
            .unwrap();
    let _ = nss.create(&PostParams::default(), &ns).await;
    common::install_crds(&client).await.unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for file in [
        "sandbox.yaml",
        "extensions.yaml",
        "sandbox-with-extensions.yaml",
    ] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        for doc in documents(&text) {
            let obj: DynamicObject = serde_json::from_value(doc).unwrap();
            let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
            let (ar, caps) = discovery
                .resolve_gvk(&gvk)
                .unwrap_or_else(|| panic!("{file}: unknown kind {gvk:?}"));
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => {
                    Api::namespaced_with(client.clone(), obj.namespace().as_deref().unwrap(), &ar)
                }
                Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            let mut pp = PatchParams::apply("sandhub-deploy-test").force();
            pp.dry_run = true;
            api.patch(&obj.name_any(), &pp, &Patch::Apply(&obj))
                .await
                .unwrap_or_else(|e| {
                    panic!("{file}: {} {} rejected: {e}", gvk.kind, obj.name_any())
                });
        }
    }
}
