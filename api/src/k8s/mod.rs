//! The Kubernetes side of the contract: label and annotation names, condition types and
//! reasons (always available, plain strings), and, behind the `k8s` feature, the four
//! upstream-compatible CRD types with their schemas and the pure validation rules the
//! apiserver (through CEL) and the controller both enforce.

pub mod conditions;
pub mod names;

#[cfg(feature = "k8s")]
pub mod claim;
#[cfg(feature = "k8s")]
pub mod common;
#[cfg(feature = "k8s")]
pub mod egress;
#[cfg(feature = "k8s")]
pub mod sandbox;
#[cfg(feature = "k8s")]
pub mod template;
#[cfg(feature = "k8s")]
pub mod validate;
#[cfg(feature = "k8s")]
pub mod volumes;
#[cfg(feature = "k8s")]
pub mod warmpool;

#[cfg(feature = "k8s")]
pub use claim::{SandboxClaim, SandboxClaimSpec, SandboxClaimStatus};
#[cfg(feature = "k8s")]
pub use sandbox::{Sandbox, SandboxSpec, SandboxStatus};
#[cfg(feature = "k8s")]
pub use template::{SandboxTemplate, SandboxTemplateSpec};
#[cfg(feature = "k8s")]
pub use warmpool::{SandboxWarmPool, SandboxWarmPoolSpec, SandboxWarmPoolStatus};

/// API group of the core Sandbox kind.
pub const CORE_GROUP: &str = "agents.x-k8s.io";
/// API group of SandboxTemplate, SandboxClaim and SandboxWarmPool.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The only served (and the storage) version since upstream v1.0.0.
pub const VERSION: &str = "v1beta1";

/// Every CRD this project serves, in the order `sandhub-controller crd` prints them.
#[cfg(feature = "k8s")]
pub fn all_crds(
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Sandbox::crd(),
        SandboxClaim::crd(),
        SandboxTemplate::crd(),
        SandboxWarmPool::crd(),
    ]
}

#[cfg(all(test, feature = "k8s"))]
mod crd_tests {
    use serde_json::{json, Value};

    fn crd(name: &str) -> Value {
        let all = super::all_crds();
        let crd = all
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .expect(name);
        serde_json::to_value(crd).unwrap()
    }

    fn schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    }

    #[test]
    fn names_scopes_and_subresources_match_upstream() {
        let sb = crd("sandboxes.agents.x-k8s.io");
        assert_eq!(sb["spec"]["names"]["shortNames"], json!(["sandbox"]));
        assert_eq!(sb["spec"]["scope"], "Namespaced");
        assert_eq!(sb["spec"]["versions"][0]["name"], "v1beta1");
        assert_eq!(sb["spec"]["versions"].as_array().unwrap().len(), 1);
        assert_eq!(
            sb["spec"]["versions"][0]["subresources"]["status"],
            json!({})
        );
        let cols: Vec<_> = sb["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(cols, ["Ready", "Reason", "Age"]);

        let swp = crd("sandboxwarmpools.extensions.agents.x-k8s.io");
        assert_eq!(swp["spec"]["names"]["shortNames"], json!(["swp"]));
        assert_eq!(
            swp["spec"]["versions"][0]["subresources"]["scale"],
            json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                   "labelSelectorPath": ".status.selector"})
        );
        assert_eq!(
            schema(&swp)["properties"]["spec"]["properties"]["replicas"]["default"],
            1
        );
        assert_eq!(
            schema(&swp)["properties"]["spec"]["properties"]["replicas"]["minimum"],
            0.0
        );

        let tpl = crd("sandboxtemplates.extensions.agents.x-k8s.io");
        assert_eq!(
            tpl["spec"]["names"]["shortNames"],
            json!(["sandboxtemplate"])
        );
        assert!(tpl["spec"]["versions"][0]["subresources"].is_null());
        let claim = crd("sandboxclaims.extensions.agents.x-k8s.io");
        assert_eq!(
            claim["spec"]["names"]["shortNames"],
            json!(["sandboxclaim"])
        );
        assert_eq!(
            schema(&claim)["properties"]["spec"]["required"],
            json!(["warmPoolRef"])
        );
    }

    #[test]
    fn defaults_and_enums_match_upstream() {
        let sb = crd("sandboxes.agents.x-k8s.io");
        let spec = &schema(&sb)["properties"]["spec"];
        assert_eq!(spec["properties"]["operatingMode"]["default"], "Running");
        assert_eq!(
            spec["properties"]["operatingMode"]["enum"],
            json!(["Running", "Suspended"])
        );
        assert_eq!(spec["properties"]["shutdownPolicy"]["default"], "Retain");
        assert_eq!(spec["properties"]["shutdownTime"]["format"], "date-time");
        assert_eq!(spec["required"], json!(["podTemplate"]));
        let tpl = crd("sandboxtemplates.extensions.agents.x-k8s.io");
        let spec = &schema(&tpl)["properties"]["spec"]["properties"];
        assert_eq!(spec["networkPolicyManagement"]["default"], "Managed");
        assert_eq!(spec["envVarsInjectionPolicy"]["default"], "Disallowed");
        assert_eq!(
            spec["volumeClaimTemplatesPolicy"]["enum"],
            json!(["Disallowed", "Allowed", "Overrides"])
        );
        let claim = crd("sandboxclaims.extensions.agents.x-k8s.io");
        let lc = &schema(&claim)["properties"]["spec"]["properties"]["lifecycle"]["properties"];
        assert_eq!(
            lc["shutdownPolicy"]["enum"],
            json!(["Delete", "DeleteForeground", "Retain"])
        );
        assert_eq!(lc["ttlSecondsAfterFinished"]["minimum"], 0.0);
    }

    #[test]
    fn volume_claim_templates_carry_the_v1_0_9_admission_rules() {
        for (name, path) in [
            ("sandboxes.agents.x-k8s.io", "spec"),
            ("sandboxtemplates.extensions.agents.x-k8s.io", "spec"),
            ("sandboxclaims.extensions.agents.x-k8s.io", "spec"),
        ] {
            let c = crd(name);
            let vct = &schema(&c)["properties"][path]["properties"]["volumeClaimTemplates"];
            assert_eq!(vct["maxItems"], 128, "{name}");
            assert_eq!(vct["x-kubernetes-list-type"], "atomic", "{name}");
            assert_eq!(
                vct["x-kubernetes-validations"][0]["rule"],
                super::common::VCT_UNIQUE_NAMES_RULE,
                "{name}"
            );
            let item = &vct["items"];
            assert_eq!(item["required"], json!(["metadata", "spec"]), "{name}");
            let meta = &item["properties"]["metadata"];
            assert_eq!(meta["required"], json!(["name"]), "{name}");
            assert_eq!(meta["properties"]["name"]["minLength"], 1, "{name}");
            assert_eq!(meta["properties"]["name"]["maxLength"], 63, "{name}");
        }
        let sb = crd("sandboxes.agents.x-k8s.io");
        assert_eq!(
            schema(&sb)["properties"]["spec"]["x-kubernetes-validations"][0],
            json!({"rule": super::sandbox::VCT_IMMUTABLE_RULE, "message": "volumeClaimTemplates is immutable"})
        );
    }
}
