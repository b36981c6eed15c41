//! The install manifests in `deploy/`, generated (like the CRDs) so they never drift from
//! the code: `sandbox.yaml` (core), `extensions.yaml`, `sandbox-with-extensions.yaml`, and
//! the Helm chart's CRDs. Least privilege: the core role covers Sandboxes and their
//! children only; the extensions role adds templates, claims, pools and NetworkPolicies.

use serde_json::{json, Value};

pub const NAMESPACE: &str = "agent-sandbox-system";
pub const NAME: &str = "agent-sandbox-controller";
pub const IMAGE: &str = "sandhub/controller:dev";
/// The Secret (in [`NAMESPACE`], entry `key`) holding the key that derives each Sandbox's
/// own sandboxd token; the hub is given the same key (`--sandboxd-token-key-file`).
pub const TOKEN_KEY_SECRET: &str = "sandboxd-token-key";
const TOKEN_KEY_DIR: &str = "/etc/sandhub/sandboxd-token-key";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

const RW: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const STATUS: [&str; 3] = ["get", "update", "patch"];

fn namespace() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
}

fn service_account() -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}})
}

fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
}

fn binding(kind: &str, name: &str, namespace: Option<&str>) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": format!("{kind}Binding"),
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
    })
}

/// Sandboxes and the children they own, plus events.
pub fn core_rules() -> Vec<Value> {
    vec![
        rule(&["agents.x-k8s.io"], &["sandboxes"], &RW),
        rule(&["agents.x-k8s.io"], &["sandboxes/status"], &STATUS),
        rule(&[""], &["pods", "services"], &RW),
        rule(
            &[""],
            &["persistentvolumeclaims"],
            &["get", "list", "watch", "create", "patch"],
        ),
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        // The template controller runs in every install; it is idle without the CRD.
        rule(
            &["extensions.agents.x-k8s.io"],
            &["sandboxtemplates"],
            &["get", "list", "watch", "patch"],
        ),
        rule(&["networking.k8s.io"], &["networkpolicies"], &RW),
    ]
}

pub fn extension_rules() -> Vec<Value> {
    vec![
        rule(
            &["extensions.agents.x-k8s.io"],
            &["sandboxclaims", "sandboxwarmpools"],
            &RW,
        ),
        rule(
            &["extensions.agents.x-k8s.io"],
            &["sandboxclaims/status", "sandboxwarmpools/status"],
            &STATUS,
        ),
    ]
}

/// Leader Lease and (extensions) the `agent-sandbox-config` ConfigMap, in its own namespace.
fn role(extensions: bool) -> Value {
    let mut rules = vec![rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "list", "watch", "create", "update", "patch"],
    )];
    if extensions {
        rules.push(json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["agent-sandbox-config"],
                          "verbs": ["get", "list", "watch"]}));
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": NAME, "namespace": NAMESPACE}, "rules": rules})
}

pub fn deployment(extensions: bool) -> Value {
    let mut args = vec![
        "--leader-elect=true",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:8081",
    ];
    // Secure by default: every Pod gets its own sandboxd token. The Secret is required
    // (no `optional`), so a controller that would hand out no tokens never starts.
    let key_flag = format!("--sandboxd-token-key-file={TOKEN_KEY_DIR}/key");
    args.push(&key_flag);
    if extensions {
        args.insert(0, "--extensions");
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": NAME}},
            "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller",
                        "image": IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "args": args,
                        "env": [
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                        "ports": [{"name": "metrics", "containerPort": 8080}, {"name": "probes", "containerPort": 8081}],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "probes"}, "periodSeconds": 10},
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "probes"}, "periodSeconds": 5},
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "sandboxd-token-key", "mountPath": TOKEN_KEY_DIR, "readOnly": true}],
                    }],
                    "volumes": [{"name": "sandboxd-token-key", "secret": {"secretName": TOKEN_KEY_SECRET}}],
                },
            },
        },
    })
}

fn crds(core: bool, extensions: bool) -> Vec<Value> {
    sandhub_api::k8s::all_crds()
        .into_iter()
        .filter(|c| {
            if c.spec.group == sandhub_api::k8s::CORE_GROUP {
                core
            } else {
                extensions
            }
        })
        .map(|c| serde_json::to_value(c).expect("CRD serialises"))
        .collect()
}

fn core_objects(extensions: bool) -> Vec<Value> {
    let mut v = vec![namespace()];
    v.extend(crds(true, false));
    v.extend([
        service_account(),
        cluster_role(NAME, core_rules()),
        binding("ClusterRole", NAME, None),
        role(extensions),
        binding("Role", NAME, Some(NAMESPACE)),
    ]);
    v
}

fn extension_objects() -> Vec<Value> {
    let ext = format!("{NAME}-extensions");
    let mut v = crds(false, true);
    v.extend([
        cluster_role(&ext, extension_rules()),
        binding("ClusterRole", &ext, None),
    ]);
    v
}

fn yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| {
            format!(
                "---\n{}",
                serde_yaml::to_string(o).expect("manifest serialises")
            )
        })
        .collect()
}

/// `(path under deploy/, contents)` for every generated install file.
pub fn files() -> Vec<(String, String)> {
    let mut core = core_objects(false);
    core.push(deployment(false));
    let mut ext = extension_objects();
    // Applied over sandbox.yaml: the Role gains the ConfigMap, the Deployment --extensions.
    ext.extend([role(true), deployment(true)]);
    let mut all = core_objects(true);
    all.extend(extension_objects());
    all.push(deployment(true));
    let mut out = vec![
        ("sandbox.yaml".to_string(), yaml(&core)),
        ("extensions.yaml".to_string(), yaml(&ext)),
        ("sandbox-with-extensions.yaml".to_string(), yaml(&all)),
    ];
    for (name, body) in crate::crdgen::crd_files() {
        out.push((format!("helm/sandhub-controller/crds/{name}"), body));
    }
    out
}
