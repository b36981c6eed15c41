//! `network: egress` sandbox Pods on Kubernetes (issue #27): the label the
//! hub puts on their Pod template and the only egress their NetworkPolicy
//! admits, shared by the hub (which labels templates and ships the policy)
//! and sandhub-controller (whose managed per-template NetworkPolicy uses
//! these rules for labelled templates, instead of its internet default).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort},
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

/// Pod(-template) label of egress sandboxes, value [`EGRESS`].
pub const NETWORK_LABEL: &str = "sandhub.io/network";
pub const EGRESS: &str = "egress";
/// `app.kubernetes.io/name` of the proxy's Pods (`sandhub egress-proxy`).
pub const PROXY_APP: &str = "sandhub-egress";
/// The proxy's port: HTTP CONNECT and SOCKS5 on one port.
pub const PROXY_PORT: u16 = 3128;
/// The proxy's `/metrics`, `/healthz` and meter route port, and its name
/// on the Service (the hub finds each replica's through EndpointSlices).
pub const METRICS_PORT: u16 = 9464;
pub const METRICS_PORT_NAME: &str = "metrics";
/// `GET {METER_PATH}/{sandbox id}` on [`METRICS_PORT`]: one replica's
/// [`MeterReport`] of a sandbox, for the hub (bearer: the meter token,
/// `SandboxdTokens::meter_token`).
pub const METER_PATH: &str = "/internal/v1/egress";
/// Decisions one replica reports at most (its log's capacity).
pub const MAX_REPORTED_DECISIONS: usize = 256;

/// What one proxy replica counted for one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MeterReport {
    pub usage: crate::hub::EgressUsage,
    /// Oldest first.
    pub decisions: Vec<crate::hub::EgressDecision>,
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        match_expressions: None,
    }
}

/// Whether Pod labels mark an egress sandbox.
pub fn is_egress(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(NETWORK_LABEL))
        .is_some_and(|v| v == EGRESS)
}

/// The only destinations of an egress sandbox Pod: the cluster DNS and
/// the proxy's Pods in the Pod's own namespace. Nothing else, so traffic
/// that ignores the proxy goes nowhere (where the CNI enforces policy).
pub fn proxy_rules() -> Vec<NetworkPolicyEgressRule> {
    let port = |p: u16, proto: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(p as i32)),
        protocol: Some(proto.into()),
        end_port: None,
    };
    vec![
        NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(selector(&[(
                    "kubernetes.io/metadata.name",
                    "kube-system",
                )])),
                pod_selector: Some(selector(&[("k8s-app", "kube-dns")])),
                ip_block: None,
            }]),
            ports: Some(vec![port(53, "UDP"), port(53, "TCP")]),
        },
        NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(selector(&[("app.kubernetes.io/name", PROXY_APP)])),
                namespace_selector: None,
                ip_block: None,
            }]),
            ports: Some(vec![port(PROXY_PORT, "TCP")]),
        },
    ]
}

/// The selector of egress sandbox Pods.
pub fn pod_selector() -> LabelSelector {
    selector(&[(NETWORK_LABEL, EGRESS)])
}
