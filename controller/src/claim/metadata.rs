//! `spec.additionalPodMetadata` validation (§2.3): what a claim may add to its
//! Pod's labels and annotations. A violation sets Ready=False/InvalidMetadata.

use std::collections::BTreeMap;

/// Annotation domains (and their subdomains) that stay the platform's.
const FORBIDDEN_ANNOTATION_DOMAINS: [&str; 3] = ["kubernetes.io", "k8s.io", "agents.x-k8s.io"];
/// The one platform annotation a claim may set: it lets users pin a claimed Pod.
const ALLOWED_PLATFORM_ANNOTATION: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// Checks a claim's extra labels and annotations. `template_*` are the
/// template's pod-template metadata: a claim may repeat a key only with the
/// same value. Every problem is reported, joined by `; `.
pub fn validate(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    template_labels: &BTreeMap<String, String>,
    template_annotations: &BTreeMap<String, String>,
    allowed_label_domains: &[String],
) -> Result<(), String> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        if let Err(e) = qualified_name(k) {
            errs.push(format!("label key {k:?}: {e}"));
            continue;
        }
        match prefix(k) {
            Some(p) if allowed_label_domains.iter().any(|d| in_domain(p, d)) => {}
            Some(p) => errs.push(format!(
                "label key {k:?}: domain {p:?} is not in the allowed label domains [{}]",
                allowed_label_domains.join(", ")
            )),
            None => errs.push(format!(
                "label key {k:?}: labels need a domain prefix from the allowed label domains [{}]",
                allowed_label_domains.join(", ")
            )),
        }
        if k == "app" && v == "sandbox-router" {
            errs.push("label app=sandbox-router is reserved for the sandbox router".into());
        }
        if let Err(e) = label_value(v) {
            errs.push(format!("label {k:?} value {v:?}: {e}"));
        }
        if let Some(tv) = template_labels.get(k).filter(|tv| *tv != v) {
            errs.push(format!("label {k:?}: the template sets it to {tv:?}"));
        }
    }
    for (k, v) in annotations {
        if let Err(e) = qualified_name(k) {
            errs.push(format!("annotation key {k:?}: {e}"));
            continue;
        }
        if k != ALLOWED_PLATFORM_ANNOTATION {
            if let Some(d) = prefix(k).and_then(|p| {
                FORBIDDEN_ANNOTATION_DOMAINS
                    .iter()
                    .find(|d| in_domain(p, d))
            }) {
                errs.push(format!("annotation key {k:?}: domain {d:?} is reserved"));
            }
        }
        if let Some(tv) = template_annotations.get(k).filter(|tv| *tv != v) {
            errs.push(format!("annotation {k:?}: the template sets it to {tv:?}"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

fn prefix(key: &str) -> Option<&str> {
    key.split_once('/').map(|(p, _)| p)
}

fn in_domain(prefix: &str, domain: &str) -> bool {
    let p = prefix.to_ascii_lowercase();
    p == domain || p.ends_with(&format!(".{domain}"))
}

/// Kubernetes' qualified name: `[dns-subdomain/]name`, name ≤ 63 characters
/// of alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        dns_subdomain(p).map_err(|e| format!("prefix {e}"))?;
    }
    if name.is_empty() {
        return Err("name part must not be empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be at most 63 characters".into());
    }
    if !name_chars(name) {
        return Err(
            "name part must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
                .into(),
        );
    }
    Ok(())
}

/// Label values: empty, or a qualified name part of at most 63 characters.
pub fn label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    if !v.is_empty() && !name_chars(v) {
        return Err(
            "must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
                .into(),
        );
    }
    Ok(())
}

fn name_chars(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err(format!("{s:?} must be 1 to 253 characters"));
    }
    let ok = s.split('.').all(|l| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.first()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.last()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    });
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} must be a lowercase DNS subdomain"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn allow() -> Vec<String> {
        vec!["sandbox.users.io".into()]
    }

    fn check(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Result<(), String> {
        validate(
            &map(labels),
            &map(annotations),
            &map(&[]),
            &map(&[]),
            &allow(),
        )
    }

    #[test]
    fn allowlisted_label_domains_and_subdomains_pass() {
        check(
            &[
                ("sandbox.users.io/team", "a"),
                ("ml.sandbox.users.io/run", "r-1"),
            ],
            &[],
        )
        .unwrap();
        check(&[("sandbox.users.io/empty", "")], &[]).unwrap();
    }

    #[test]
    fn labels_without_an_allowlisted_domain_fail() {
        let e = check(&[("team", "a")], &[]).unwrap_err();
        assert!(e.contains("need a domain prefix"), "{e}");
        let e = check(&[("example.com/team", "a")], &[]).unwrap_err();
        assert!(e.contains("not in the allowed label domains"), "{e}");
        // A look-alike is not a subdomain.
        assert!(check(&[("evilsandbox.users.io/x", "a")], &[]).is_err());
    }

    #[test]
    fn the_router_label_is_forbidden() {
        let e = check(&[("app", "sandbox-router")], &[]).unwrap_err();
        assert!(e.contains("app=sandbox-router"), "{e}");
    }

    #[test]
    fn bad_keys_and_values_fail() {
        assert!(check(&[("sandbox.users.io/-x", "a")], &[]).is_err());
        assert!(check(&[("Sandbox.Users.IO/x", "a")], &[]).is_err());
        assert!(check(&[("sandbox.users.io/x", "a b")], &[]).is_err());
        assert!(check(&[("sandbox.users.io/x", &"v".repeat(64))], &[]).is_err());
        assert!(check(
            &[(&format!("sandbox.users.io/{}", "n".repeat(64)), "a")],
            &[]
        )
        .is_err());
        assert!(check(&[], &[("a/b/c", "x")]).is_err());
    }

    #[test]
    fn platform_annotation_domains_are_reserved_except_safe_to_evict() {
        for k in [
            "kubernetes.io/x",
            "foo.kubernetes.io/x",
            "k8s.io/x",
            "agents.x-k8s.io/claim-uid",
            "extensions.agents.x-k8s.io/x",
        ] {
            assert!(check(&[], &[(k, "v")]).is_err(), "{k} must be rejected");
        }
        check(
            &[],
            &[("cluster-autoscaler.kubernetes.io/safe-to-evict", "false")],
        )
        .unwrap();
        check(
            &[],
            &[
                ("x-k8s.io/ok", "v"),
                ("plain", "any value at all"),
                ("example.com/a", ""),
            ],
        )
        .unwrap();
    }

    #[test]
    fn claim_keys_may_not_contradict_the_template() {
        let tl = map(&[("sandbox.users.io/team", "a")]);
        let ta = map(&[("note", "x")]);
        let same = validate(&tl, &ta, &tl, &ta, &allow());
        assert!(same.is_ok());
        let e = validate(
            &map(&[("sandbox.users.io/team", "b")]),
            &map(&[("note", "y")]),
            &tl,
            &ta,
            &allow(),
        )
        .unwrap_err();
        assert!(
            e.contains("label \"sandbox.users.io/team\"") && e.contains("annotation \"note\""),
            "{e}"
        );
    }
}
