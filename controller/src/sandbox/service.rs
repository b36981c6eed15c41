//! The headless Service of a Sandbox: same name, selector on the name hash, one port per
//! distinct (port, protocol) any container declares.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodSpec, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::Sandbox;

use crate::object::controller_ref;

/// Ports of all containers plus restartable (sidecar) init containers, deduplicated by
/// (port, protocol) keeping the first name seen, sorted, and named: a declared name is
/// kept, an unnamed port becomes `p-<port>-<protocol>` (`-2`, `-3`, ... on a clash).
pub fn service_ports(spec: &PodSpec) -> Vec<ServicePort> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let mut by_key: BTreeMap<(i32, String), Option<String>> = BTreeMap::new();
    for c in spec.containers.iter().chain(sidecars) {
        for p in c.ports.iter().flatten() {
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".to_string());
            let name = p.name.clone().filter(|n| !n.is_empty());
            by_key.entry((p.container_port, proto)).or_insert(name);
        }
    }
    let mut taken: BTreeSet<String> = by_key.values().flatten().cloned().collect();
    let mut seen_declared = BTreeSet::new();
    by_key
        .into_iter()
        .map(|((port, proto), declared)| {
            let name = match declared {
                // Two ports declaring the same name would make an invalid Service: the
                // later one is renamed like an unnamed port.
                Some(n) if seen_declared.insert(n.clone()) => n,
                _ => {
                    let base = format!("p-{port}-{}", proto.to_ascii_lowercase());
                    let mut candidate = base.clone();
                    let mut i = 2;
                    while taken.contains(&candidate) {
                        candidate = format!("{base}-{i}");
                        i += 1;
                    }
                    taken.insert(candidate.clone());
                    candidate
                }
            };
            ServicePort {
                name: Some(name),
                port,
                protocol: Some(proto),
                target_port: Some(IntOrString::Int(port)),
                ..Default::default()
            }
        })
        .collect()
}

pub fn desired(sb: &Sandbox, name_hash: &str) -> Service {
    let selector = BTreeMap::from([(names::SANDBOX_NAME_HASH.to_string(), name_hash.to_string())]);
    Service {
        metadata: ObjectMeta {
            name: Some(sb.name_any()),
            namespace: sb.namespace(),
            labels: Some(selector.clone()),
            owner_references: Some(vec![controller_ref(sb)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector),
            ports: Some(service_ports(&sb.spec.blueprint.pod_template.spec)),
            ..Default::default()
        }),
        status: None,
    }
}

/// Whether an existing Service's selector and ports differ from what we want.
pub fn drifted(have: &Service, want: &Service) -> bool {
    let (Some(h), Some(w)) = (&have.spec, &want.spec) else {
        return true;
    };
    type PortKey = (Option<String>, i32, Option<String>, Option<IntOrString>);
    let norm = |ports: &Option<Vec<ServicePort>>| -> Vec<PortKey> {
        ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.port,
                    p.protocol.clone(),
                    p.target_port.clone(),
                )
            })
            .collect()
    };
    h.selector != w.selector || norm(&h.ports) != norm(&w.ports)
}

/// `<service>.<namespace>.svc.<cluster-domain>`.
pub fn fqdn(service: &str, namespace: &str, cluster_domain: &str) -> String {
    format!("{service}.{namespace}.svc.{cluster_domain}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort};

    fn port(n: i32, proto: Option<&str>, name: Option<&str>) -> ContainerPort {
        ContainerPort {
            container_port: n,
            protocol: proto.map(String::from),
            name: name.map(String::from),
            ..Default::default()
        }
    }

    fn names_of(ports: &[ServicePort]) -> Vec<(String, i32, String)> {
        ports
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.port, p.protocol.clone().unwrap()))
            .collect()
    }

    #[test]
    fn ports_are_deduplicated_sorted_and_named() {
        let spec = PodSpec {
            containers: vec![
                Container {
                    name: "a".into(),
                    ports: Some(vec![
                        port(9090, None, None),
                        port(8080, Some("TCP"), Some("http")),
                        port(53, Some("UDP"), None),
                    ]),
                    ..Default::default()
                },
                Container {
                    name: "b".into(),
                    ports: Some(vec![port(8080, None, Some("dup")), port(53, None, None)]),
                    ..Default::default()
                },
            ],
            init_containers: Some(vec![
                Container {
                    name: "sidecar".into(),
                    restart_policy: Some("Always".into()),
                    ports: Some(vec![port(7000, None, None)]),
                    ..Default::default()
                },
                Container {
                    name: "init".into(),
                    ports: Some(vec![port(6000, None, None)]),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let ports = service_ports(&spec);
        assert_eq!(
            names_of(&ports),
            vec![
                ("p-53-tcp".into(), 53, "TCP".into()),
                ("p-53-udp".into(), 53, "UDP".into()),
                ("p-7000-tcp".into(), 7000, "TCP".into()),
                ("http".into(), 8080, "TCP".into()),
                ("p-9090-tcp".into(), 9090, "TCP".into()),
            ]
        );
        assert!(ports
            .iter()
            .all(|p| p.target_port == Some(IntOrString::Int(p.port))));
    }

    #[test]
    fn generated_names_avoid_declared_ones() {
        let spec = PodSpec {
            containers: vec![Container {
                name: "a".into(),
                ports: Some(vec![
                    port(80, None, Some("p-81-tcp")),
                    port(81, None, None),
                    port(82, None, Some("p-81-tcp")),
                ]),
                ..Default::default()
            }],
            ..Default::default()
        };
        let got: Vec<_> = names_of(&service_ports(&spec))
            .into_iter()
            .map(|(n, p, _)| (n, p))
            .collect();
        assert_eq!(
            got,
            vec![
                ("p-81-tcp".into(), 80),
                ("p-81-tcp-2".into(), 81),
                ("p-82-tcp".into(), 82)
            ]
        );
    }

    #[test]
    fn fqdn_uses_the_cluster_domain() {
        assert_eq!(fqdn("s", "ns", "cluster.local"), "s.ns.svc.cluster.local");
    }
}
