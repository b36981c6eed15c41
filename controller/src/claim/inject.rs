//! What a claim may change in its template's blueprint: environment variables
//! (`spec.env`) and volume claim templates (`spec.volumeClaimTemplates`),
//! each under the template's injection policy. Either one forces a cold start:
//! a warm Pod already runs with the template's own.

use k8s_openapi::api::core::v1::{EnvVar, PodSpec};
use sandhub_api::k8s::common::PersistentVolumeClaimTemplate;
use sandhub_api::k8s::template::InjectionPolicy as Policy;
use sandhub_api::k8s::validate::validate_volume_claim_templates;

/// One `spec.env` entry of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvRequest<'a> {
    pub name: &'a str,
    pub value: &'a str,
    /// A container or init container; the first container when absent.
    pub container: Option<&'a str>,
}

/// Applies the claim's env to `spec`. The error is the claim's
/// EnvVarsInjectionRejected message.
pub fn inject_env(
    spec: &mut PodSpec,
    env: &[EnvRequest<'_>],
    policy: Policy,
) -> Result<(), String> {
    if env.is_empty() {
        return Ok(());
    }
    if policy == Policy::Disallowed {
        return Err("the template's envVarsInjectionPolicy is Disallowed".into());
    }
    for req in env {
        if req.name.is_empty() {
            return Err("an env entry has an empty name".into());
        }
        let first = spec.containers.first().map(|c| c.name.clone());
        let target_name = match req.container {
            Some(c) => c.to_string(),
            None => first.ok_or("the pod template has no containers")?,
        };
        let container = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
            .find(|c| c.name == target_name)
            .ok_or_else(|| format!("container {target_name:?} is not in the pod template"))?;
        let vars = container.env.get_or_insert_with(Vec::new);
        let existing = vars.iter().position(|v| v.name == req.name);
        if policy == Policy::Allowed {
            if existing.is_some() {
                return Err(format!(
                    "env var {:?} is set by the template in container {target_name:?} and the policy is Allowed, not Overrides",
                    req.name
                ));
            }
            // envFrom may define any name: the override check cannot be made.
            if container.env_from.as_ref().is_some_and(|f| !f.is_empty()) {
                return Err(format!(
                    "container {target_name:?} uses envFrom, so injected env could override it; the policy is Allowed, not Overrides"
                ));
            }
        }
        let var = EnvVar {
            name: req.name.to_string(),
            value: Some(req.value.to_string()),
            value_from: None,
        };
        let vars = container.env.get_or_insert_with(Vec::new);
        match existing {
            Some(i) => vars[i] = var,
            None => vars.push(var),
        }
    }
    Ok(())
}

/// Merges a claim's volume claim templates into the template's. The error is
/// the claim's VolumeClaimTemplatesError message. The v1.0.9 admission rules
/// are checked again here, for objects that got past an older CRD.
pub fn merge_vcts(
    template: &[PersistentVolumeClaimTemplate],
    claim: &[PersistentVolumeClaimTemplate],
    policy: Policy,
) -> Result<Vec<PersistentVolumeClaimTemplate>, String> {
    if claim.is_empty() {
        return Ok(template.to_vec());
    }
    validate_volume_claim_templates(claim).map_err(|e| e.to_string())?;
    let mut out = template.to_vec();
    match policy {
        Policy::Disallowed => {
            return Err("the template's volumeClaimTemplatesPolicy is Disallowed".into());
        }
        Policy::Allowed => {
            for c in claim {
                if template.iter().any(|t| t.metadata.name == c.metadata.name) {
                    return Err(format!(
                        "volumeClaimTemplates name {:?} is the template's and the policy is Allowed, not Overrides",
                        c.metadata.name
                    ));
                }
                out.push(c.clone());
            }
        }
        Policy::Overrides => {
            for c in claim {
                match out.iter().position(|t| t.metadata.name == c.metadata.name) {
                    Some(i) => out[i] = c.clone(),
                    None => out.push(c.clone()),
                }
            }
        }
    }
    validate_volume_claim_templates(&out).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMapEnvSource, Container, EnvFromSource};

    fn spec() -> PodSpec {
        PodSpec {
            containers: vec![
                Container {
                    name: "main".into(),
                    env: Some(vec![EnvVar {
                        name: "MODE".into(),
                        value: Some("t".into()),
                        value_from: None,
                    }]),
                    ..Default::default()
                },
                Container {
                    name: "side".into(),
                    ..Default::default()
                },
            ],
            init_containers: Some(vec![Container {
                name: "init".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn req<'a>(name: &'a str, value: &'a str, container: Option<&'a str>) -> EnvRequest<'a> {
        EnvRequest {
            name,
            value,
            container,
        }
    }

    fn env_of(s: &PodSpec, c: &str) -> Vec<(String, String)> {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|x| x.name == c)
            .and_then(|x| x.env.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.value.unwrap_or_default()))
            .collect()
    }

    #[test]
    fn disallowed_rejects_any_env() {
        let e = inject_env(&mut spec(), &[req("A", "1", None)], Policy::Disallowed).unwrap_err();
        assert!(e.contains("Disallowed"));
        inject_env(&mut spec(), &[], Policy::Disallowed).unwrap();
    }

    #[test]
    fn allowed_adds_to_the_first_container_or_a_named_one() {
        let mut s = spec();
        inject_env(
            &mut s,
            &[
                req("A", "1", None),
                req("B", "2", Some("side")),
                req("C", "3", Some("init")),
            ],
            Policy::Allowed,
        )
        .unwrap();
        assert_eq!(
            env_of(&s, "main"),
            [("MODE".into(), "t".into()), ("A".into(), "1".into())]
        );
        assert_eq!(env_of(&s, "side"), [("B".into(), "2".into())]);
        assert_eq!(env_of(&s, "init"), [("C".into(), "3".into())]);
    }

    #[test]
    fn allowed_refuses_overrides_and_env_from() {
        let e = inject_env(&mut spec(), &[req("MODE", "x", None)], Policy::Allowed).unwrap_err();
        assert!(e.contains("MODE"), "{e}");
        let mut s = spec();
        s.containers[1].env_from = Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: "cm".into(),
                optional: None,
            }),
            ..Default::default()
        }]);
        let e = inject_env(&mut s, &[req("X", "1", Some("side"))], Policy::Allowed).unwrap_err();
        assert!(e.contains("envFrom"), "{e}");
        // Overrides may do both.
        inject_env(
            &mut s,
            &[req("X", "1", Some("side")), req("MODE", "x", None)],
            Policy::Overrides,
        )
        .unwrap();
        assert_eq!(env_of(&s, "main"), [("MODE".into(), "x".into())]);
    }

    #[test]
    fn unknown_container_is_rejected() {
        let e = inject_env(
            &mut spec(),
            &[req("A", "1", Some("nope"))],
            Policy::Overrides,
        )
        .unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }

    fn vct(name: &str, size: &str) -> PersistentVolumeClaimTemplate {
        let mut v = PersistentVolumeClaimTemplate::default();
        v.metadata.name = name.into();
        v.spec.storage_class_name = Some(size.into());
        v
    }

    fn names(v: &[PersistentVolumeClaimTemplate]) -> Vec<(String, String)> {
        v.iter()
            .map(|x| {
                (
                    x.metadata.name.clone(),
                    x.spec.storage_class_name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn vct_policies() {
        let tpl = vec![vct("data", "t")];
        let claim = vec![vct("data", "c"), vct("cache", "c")];
        assert_eq!(merge_vcts(&tpl, &[], Policy::Disallowed).unwrap(), tpl);
        assert!(merge_vcts(&tpl, &claim, Policy::Disallowed)
            .unwrap_err()
            .contains("Disallowed"));
        assert!(merge_vcts(&tpl, &claim, Policy::Allowed)
            .unwrap_err()
            .contains("data"));
        let p = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            names(&merge_vcts(&tpl, &claim[1..], Policy::Allowed).unwrap()),
            [p("data", "t"), p("cache", "c")]
        );
        assert_eq!(
            names(&merge_vcts(&tpl, &claim, Policy::Overrides).unwrap()),
            [p("data", "c"), p("cache", "c")]
        );
    }

    #[test]
    fn invalid_claim_vcts_are_errors_whatever_the_policy() {
        let e = merge_vcts(&[], &[vct("", "c")], Policy::Overrides).unwrap_err();
        assert!(e.contains("metadata.name is required"), "{e}");
        let e = merge_vcts(&[], &[vct("a", "c"), vct("a", "c")], Policy::Allowed).unwrap_err();
        assert!(e.contains("unique"), "{e}");
    }
}
