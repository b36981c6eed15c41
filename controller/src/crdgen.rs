//! The CRDs as multi-document YAML, generated from `sandhub-api`'s types so the YAML in
//! `deploy/crds/` is never edited by hand (a test fails when the two drift apart).

/// All four CRDs, `---`-separated, in a stable order.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in sandhub_api::k8s::all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD always serialises"));
    }
    out
}

/// Each CRD as `(file name, YAML)`, the layout of `deploy/crds/`.
pub fn crd_files() -> Vec<(String, String)> {
    sandhub_api::k8s::all_crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            (
                format!("{name}.yaml"),
                serde_yaml::to_string(&crd).expect("a CRD always serialises"),
            )
        })
        .collect()
}
