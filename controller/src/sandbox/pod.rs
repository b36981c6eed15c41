//! The Sandbox's Pod: built from `spec.podTemplate`, one PVC volume per template entry.

use k8s_openapi::api::core::v1::{EnvVar, PersistentVolumeClaimVolumeSource, Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use sandhub_api::k8s::{names, Sandbox};
use sandhub_api::sandboxd_token::{SandboxdTokens, DIGEST_ENV};

use super::metadata::PodMeta;
use super::pvc::pvc_name;
use crate::object::controller_ref;

/// The Pod's name: the `pod-name` annotation if a Sandbox has one (older objects, or a
/// claim adoption), else the Sandbox's name.
pub fn pod_name(sb: &Sandbox) -> String {
    sb.annotations()
        .get(names::POD_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| sb.name_any())
}

/// What the controller tells every sandbox Pod's sandboxd, from its flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct SandboxdEnv<'a> {
    /// `--sandboxd-token-key-file`: each Pod gets its own token's digest.
    pub tokens: Option<&'a SandboxdTokens>,
    /// `--sandbox-otlp-endpoint`: where sandboxd exports its spans.
    pub otlp_endpoint: Option<&'a str>,
}

/// sandboxd's `--otlp-endpoint` as an environment variable.
pub const OTLP_ENV: &str = "SANDBOXD_OTLP_ENDPOINT";

/// The Pod `sb` wants. With `tokens`, every container is told the digest of
/// this Sandbox's own sandboxd token (sandboxd reads it; other containers
/// ignore it), replacing any value the template or a claim set, so no
/// workload can pick a token of its own choosing for another Pod. With an
/// OTLP endpoint, every container is told it the same way (the operator's
/// collector, not one a template or claim names).
pub fn desired(sb: &Sandbox, meta: &PodMeta, sandboxd: &SandboxdEnv<'_>) -> Pod {
    let mut spec = sb.spec.blueprint.pod_template.spec.clone();
    let sandbox = sb.name_any();
    if let Some(tokens) = sandboxd.tokens {
        let digest = tokens.digest(&sb.namespace().unwrap_or_default(), &sandbox);
        for c in &mut spec.containers {
            set_env(c, DIGEST_ENV, &digest);
        }
    }
    if let Some(endpoint) = sandboxd.otlp_endpoint {
        for c in &mut spec.containers {
            set_env(c, OTLP_ENV, endpoint);
        }
    }
    for vct in sb.spec.blueprint.volume_claim_templates.iter().flatten() {
        let volume = Volume {
            name: vct.metadata.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc_name(&vct.metadata.name, &sandbox),
                read_only: None,
            }),
            ..Default::default()
        };
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        match volumes.iter_mut().find(|v| v.name == volume.name) {
            Some(v) => *v = volume,
            None => volumes.push(volume),
        }
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(sb)),
            namespace: sb.namespace(),
            labels: Some(meta.labels.clone()),
            annotations: (!meta.annotations.is_empty()).then(|| meta.annotations.clone()),
            owner_references: Some(vec![controller_ref(sb)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Sets `name` in `c`'s environment, replacing every value it had.
fn set_env(c: &mut k8s_openapi::api::core::v1::Container, name: &str, value: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != name);
    env.push(EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;
    use sandhub_api::k8s::common::{EmbeddedObjectMetadata, PersistentVolumeClaimTemplate};
    use std::collections::BTreeMap;

    #[test]
    fn pvc_volumes_replace_same_named_ones_and_the_pod_is_owned() {
        let mut sb = Sandbox::new("sb", Default::default());
        sb.metadata.uid = Some("u1".into());
        sb.spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "c".into(),
            ..Default::default()
        }];
        sb.spec.blueprint.pod_template.spec.volumes = Some(vec![
            Volume {
                name: "data".into(),
                ..Default::default()
            },
            Volume {
                name: "keep".into(),
                ..Default::default()
            },
        ]);
        sb.spec.blueprint.volume_claim_templates = Some(vec![PersistentVolumeClaimTemplate {
            metadata: EmbeddedObjectMetadata {
                name: "data".into(),
                ..Default::default()
            },
            spec: Default::default(),
        }]);
        let pod = desired(
            &sb,
            &PodMeta {
                labels: BTreeMap::new(),
                ..Default::default()
            },
            &SandboxdEnv::default(),
        );
        let vols = pod.spec.unwrap().volumes.unwrap();
        assert_eq!(vols.len(), 2);
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-sb"
        );
        assert_eq!(pod.metadata.owner_references.unwrap()[0].uid, "u1");
        assert_eq!(pod.metadata.name.as_deref(), Some("sb"));

        sb.metadata.annotations = Some(BTreeMap::from([(
            names::POD_NAME_ANNOTATION.to_string(),
            "legacy".to_string(),
        )]));
        assert_eq!(pod_name(&sb), "legacy");
    }

    #[test]
    fn each_pod_gets_the_digest_of_its_own_sandboxes_token_only() {
        let tokens = SandboxdTokens::new(vec![b'k'; 32]).unwrap();
        let mut sb = Sandbox::new("pool-abcde", Default::default());
        sb.metadata.namespace = Some("ns".into());
        sb.spec.blueprint.pod_template.spec.containers = vec![
            Container {
                name: "sandboxd".into(),
                // A template (or a claim's env) naming a digest of its own
                // does not keep it.
                env: Some(vec![EnvVar {
                    name: DIGEST_ENV.into(),
                    value: Some("0".repeat(64)),
                    value_from: None,
                }]),
                ..Default::default()
            },
            Container {
                name: "sidecar".into(),
                ..Default::default()
            },
        ];
        let pod = desired(&sb, &PodMeta::default(), &with_tokens(&tokens));
        let digest = tokens.digest("ns", "pool-abcde");
        for c in pod.spec.unwrap().containers {
            let env = c.env.unwrap();
            let set: Vec<_> = env.iter().filter(|e| e.name == DIGEST_ENV).collect();
            assert_eq!(set.len(), 1, "{}", c.name);
            assert_eq!(set[0].value.as_deref(), Some(digest.as_str()));
            // The Pod holds the digest, never the token itself.
            assert!(!env
                .iter()
                .any(|e| e.value.as_deref() == Some(&tokens.token("ns", "pool-abcde"))));
        }
        let other = {
            let mut o = sb.clone();
            o.metadata.name = Some("pool-fghij".into());
            desired(&o, &PodMeta::default(), &with_tokens(&tokens))
        };
        let other_env = other.spec.unwrap().containers[0].env.clone().unwrap();
        assert_ne!(other_env[0].value.as_deref(), Some(digest.as_str()));
        // Without a key, the template's containers are left as they are.
        let plain = desired(&sb, &PodMeta::default(), &SandboxdEnv::default());
        assert_eq!(
            plain.spec.unwrap().containers[0].env.as_ref().unwrap()[0].value,
            Some("0".repeat(64))
        );
    }

    fn with_tokens(tokens: &SandboxdTokens) -> SandboxdEnv<'_> {
        SandboxdEnv {
            tokens: Some(tokens),
            ..Default::default()
        }
    }

    #[test]
    fn the_operators_otlp_endpoint_replaces_any_a_template_names() {
        let mut sb = Sandbox::new("sb", Default::default());
        sb.spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "sandboxd".into(),
            env: Some(vec![EnvVar {
                name: OTLP_ENV.into(),
                value: Some("http://elsewhere:4318".into()),
                value_from: None,
            }]),
            ..Default::default()
        }];
        let env = SandboxdEnv {
            otlp_endpoint: Some("http://collector:4318"),
            ..Default::default()
        };
        let pod = desired(&sb, &PodMeta::default(), &env);
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let set: Vec<_> = env.iter().filter(|e| e.name == OTLP_ENV).collect();
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].value.as_deref(), Some("http://collector:4318"));
        // Without the flag, the template's own value stands (an operator's
        // SandboxTemplate may name a collector itself).
        let plain = desired(&sb, &PodMeta::default(), &SandboxdEnv::default());
        let env = plain.spec.unwrap().containers[0].env.clone().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("http://elsewhere:4318"));
    }
}
