//! How a hub template maps onto a SandboxTemplate. Pure functions, tested
//! without a cluster.
//!
//! A tenant's template starts from a **base**: the operator's SandboxTemplate
//! named by `--base-template` (its scheduling, runtime class, security
//! context and sandboxd container), else a built-in one that runs
//! `--sandboxd-image`. The template's `env`, `cpu`, `memory_mb` and
//! `disk_mb` go to the sandboxd container. With `image: X` that container
//! runs image X: X need not hold sandboxd, so an init container from the
//! sandboxd image first copies its static sandboxd into an emptyDir at
//! [`BIN_DIR`], and the container runs that copy with the base's
//! arguments, ports and probes. `/workspace` is an emptyDir there, as the
//! sandboxd image's own (empty) `/workspace` is.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
        PersistentVolumeClaimVolumeSource, PodSpec, Probe, ResourceRequirements, Volume,
        VolumeMount,
    },
    apimachinery::pkg::{api::resource::Quantity, util::intstr::IntOrString},
};
use sandhub_api::{
    hub::{Network, Sidecar, Template},
    k8s::{common::PodTemplate, SandboxTemplate, SandboxTemplateSpec},
};
use sandhub_client::Error;

use super::{owner, PullPolicy};

/// The name of the container that runs sandboxd in a Pod template, when
/// there are several (else the first container is): the same rule the
/// controller mounts a claim's volumes by ([`main_container`]).
pub use sandhub_api::k8s::volumes::{main_container, MAIN_CONTAINER as SANDBOXD_CONTAINER};
/// The init container that copies sandboxd out of the sandboxd image.
pub const COPY_INIT: &str = "sandhub-sandboxd";
/// Where the copied sandboxd (and busybox) live in a Pod that runs another image.
pub const BIN_DIR: &str = "/.sandhub";
pub const BIN_VOLUME: &str = "sandhub-bin";
pub const WORKSPACE_VOLUME: &str = "sandhub-workspace";
/// sandboxd and busybox in the sandboxd image (dev/k8s/build-image.sh).
pub const SANDBOXD_IN_IMAGE: &str = "/usr/local/bin/sandboxd";
pub const BUSYBOX_IN_IMAGE: &str = "/bin/busybox";

/// The Pod template sandboxd runs in when the operator gave no base: the
/// same as docs/examples/kubernetes/sandbox-template.yaml.
pub fn builtin_base(sandboxd_image: &str) -> SandboxTemplateSpec {
    let container = Container {
        name: SANDBOXD_CONTAINER.into(),
        image: Some(sandboxd_image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["--listen-host".into(), "0.0.0.0".into()]),
        ports: Some(
            [8080, 9090]
                .into_iter()
                .map(|p| ContainerPort {
                    container_port: p,
                    ..Default::default()
                })
                .collect(),
        ),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/v1/health".into()),
                port: IntOrString::Int(8080),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut spec = SandboxTemplateSpec::default();
    spec.blueprint.pod_template = PodTemplate {
        spec: PodSpec {
            containers: vec![container],
            // A workload has no business with the Kubernetes API.
            automount_service_account_token: Some(false),
            ..Default::default()
        },
        metadata: None,
    };
    spec
}

/// The init container that copies sandboxd and busybox into [`BIN_DIR`].
pub fn copy_sandboxd_init(sandboxd_image: &str) -> Container {
    Container {
        name: COPY_INIT.into(),
        image: Some(sandboxd_image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![
            BUSYBOX_IN_IMAGE.into(),
            "cp".into(),
            SANDBOXD_IN_IMAGE.into(),
            BUSYBOX_IN_IMAGE.into(),
            format!("{BIN_DIR}/"),
        ]),
        volume_mounts: Some(vec![bin_mount(false)]),
        ..Default::default()
    }
}

pub fn bin_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: BIN_VOLUME.into(),
        mount_path: BIN_DIR.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

pub fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// What a template asks for that a Pod cannot be: host directories, a
/// per-sandbox process limit, the host's network.
pub fn refuse_local_only(t: &Template) -> Result<(), Error> {
    let no = |what: &str, why: &str| {
        Err(Error::invalid(format!(
            "{what} is not available on the kubernetes backend: {why}"
        )))
    };
    if t.root_fs.is_some() {
        return no(
            "root_fs",
            "a Pod's root filesystem is its image; use `image`",
        );
    }
    if t.seed_dir.is_some() {
        return no(
            "seed_dir",
            "the hub has no host directory to seed a Pod's /workspace from",
        );
    }
    if t.auto_resume {
        return no(
            "auto_resume",
            "a Pod cannot be paused, and a suspended claim is resumed with `resume`",
        );
    }
    if t.idle_action
        .is_some_and(|a| a != sandhub_api::hub::IdleAction::Delete)
    {
        return no(
            "idle_action",
            "idle timeouts are not available here; use shutdown_after_seconds",
        );
    }
    if t.pids.is_some() {
        return no(
            "pids",
            "the kubelet's podPidsLimit bounds a Pod's processes",
        );
    }
    if t.network.mode == Network::Host {
        return no(
            "network: host",
            "a sandbox Pod never joins its node's network",
        );
    }
    // `network: egress` runs through `sandhub egress-proxy` (kube/egress.rs).
    super::egress::refuse_unsupported(t)
}

/// sandboxd's `--default-cwd`, `--user` and `--entrypoint` as the
/// environment variables it reads them from.
const DEFAULT_CWD_ENV: &str = "SANDBOXD_DEFAULT_CWD";
const USER_ENV: &str = "SANDBOXD_USER";
const ENTRYPOINT_ENV: &str = "SANDBOXD_ENTRYPOINT";

/// `tenant`'s SandboxTemplate `name`: `base` with `t` applied.
pub fn tenant_template(
    tenant: &str,
    name: &str,
    mut base: SandboxTemplateSpec,
    t: &Template,
    sandboxd_image: &str,
    pull_policy: PullPolicy,
) -> Result<SandboxTemplate, Error> {
    refuse_local_only(t)?;
    let pod = &mut base.blueprint.pod_template.spec;
    let main = main_container(pod)
        .ok_or_else(|| Error::internal("the base SandboxTemplate has no container"))?;
    if let Some(image) = &t.image {
        let c = &mut pod.containers[main];
        // The base's command (if it names one) is sandboxd with arguments:
        // the copy runs with those arguments, then the base's own.
        let mut args: Vec<String> = c.command.take().into_iter().flatten().skip(1).collect();
        args.extend(c.args.take().into_iter().flatten());
        c.image = Some(image.clone());
        // Pre-pulled (or pre-loaded) images run as they are.
        c.image_pull_policy = Some(pull_policy.as_str().into());
        c.command = Some(vec![format!("{BIN_DIR}/sandboxd")]);
        c.args = Some(args);
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        mounts.retain(|m| m.mount_path != BIN_DIR && m.mount_path != "/workspace");
        mounts.push(bin_mount(true));
        mounts.push(VolumeMount {
            name: WORKSPACE_VOLUME.into(),
            mount_path: "/workspace".into(),
            ..Default::default()
        });
        let inits = pod.init_containers.get_or_insert_with(Vec::new);
        inits.retain(|c| c.name != COPY_INIT);
        inits.insert(0, copy_sandboxd_init(sandboxd_image));
        let volumes = pod.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| v.name != BIN_VOLUME && v.name != WORKSPACE_VOLUME);
        volumes.push(empty_dir(BIN_VOLUME));
        volumes.push(empty_dir(WORKSPACE_VOLUME));
    }
    let c = &mut pod.containers[main];
    // The template's env, and its workdir as sandboxd's default cwd (its
    // env var: sandboxd reads it like its flag). A tenant's env never sets
    // sandboxd's own variables.
    let mut vars: Vec<(&str, &str)> = t
        .env
        .iter()
        .filter(|(k, _)| !k.starts_with("SANDBOXD_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some(dir) = &t.workdir {
        vars.push((DEFAULT_CWD_ENV, dir));
    }
    if let Some(user) = &t.user {
        vars.push((USER_ENV, user));
    }
    let entrypoint = t
        .entrypoint
        .as_ref()
        .filter(|a| !a.is_empty())
        .map(|a| serde_json::to_string(a).unwrap_or_default());
    if let Some(argv) = &entrypoint {
        vars.push((ENTRYPOINT_ENV, argv));
    }
    if !vars.is_empty() {
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| !vars.iter().any(|(k, _)| *k == e.name));
        env.extend(vars.iter().map(|(k, v)| EnvVar {
            name: k.to_string(),
            value: Some(v.to_string()),
            value_from: None,
        }));
    }
    let mut limits = cpu_memory_limits(t.cpu, t.memory_mb);
    if let Some(mb) = t.disk_mb {
        limits.insert("ephemeral-storage".to_string(), Quantity(format!("{mb}Mi")));
    }
    if !limits.is_empty() {
        let r = c
            .resources
            .get_or_insert_with(ResourceRequirements::default);
        // The request equals the limit: a base request above the tenant's
        // limit would make the Pod invalid.
        let requests = r.requests.get_or_insert_with(BTreeMap::new);
        for (k, v) in &limits {
            requests.insert(k.clone(), v.clone());
        }
        r.limits.get_or_insert_with(BTreeMap::new).extend(limits);
    }
    if t.network.mode == Network::Egress {
        // The proxy's CA and the bundle sandboxd writes with it, for
        // brokered secrets: public, so every egress Pod has them (a create
        // request may add secrets to a template that has none); only a
        // sandbox with secrets gets the variables that point at the bundle
        // (kube/egress.rs).
        let (new_volumes, new_mounts, vars) = super::egress::ca_volumes();
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        mounts.retain(|m| {
            !new_mounts
                .iter()
                .any(|n| n.name == m.name || n.mount_path == m.mount_path)
        });
        mounts.extend(new_mounts);
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| !vars.iter().any(|(k, _)| *k == e.name));
        env.extend(vars.into_iter().map(|(k, v)| EnvVar {
            name: k.to_string(),
            value: Some(v),
            value_from: None,
        }));
        let volumes = pod.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| !new_volumes.iter().any(|n| n.name == v.name));
        volumes.extend(new_volumes);
    }
    add_volumes(
        tenant,
        &mut base.blueprint.pod_template.spec,
        main,
        &t.volumes,
    );
    add_sidecars(&mut base.blueprint.pod_template, main, &t.sidecars)?;
    mark_network(&mut base.blueprint.pod_template, t);
    if t.network.mode == Network::Egress {
        // Each egress sandbox's claim brings its own proxy environment
        // (kube/egress.rs), replacing any same-named template variable.
        base.env_vars_injection_policy = sandhub_api::k8s::template::InjectionPolicy::Overrides;
    }
    let mut out = SandboxTemplate::new(&owner::object_name(tenant, name), base);
    out.metadata = owner::tenant_metadata(tenant, name);
    Ok(out)
}

/// Pod volumes of a template's named volumes are called this, then an
/// index: what [`template_of`] reads back.
const NAMED_VOLUME_PREFIX: &str = "sandhub-volume-";

/// Each named volume as a Pod volume of the tenant's claim of that name
/// (`owner::object_name`: never another tenant's), mounted in the main
/// container at its path, read-only when asked (the claim too). A base's
/// own volumes of those names are replaced.
fn add_volumes(
    tenant: &str,
    pod: &mut PodSpec,
    main: usize,
    mounts: &[sandhub_api::volumes::VolumeMount],
) {
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| !v.name.starts_with(NAMED_VOLUME_PREFIX));
    let c = &mut pod.containers[main];
    let container_mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    container_mounts.retain(|m| !m.name.starts_with(NAMED_VOLUME_PREFIX));
    for (i, m) in mounts.iter().enumerate() {
        let (v, at) = sandhub_api::k8s::volumes::claim_volume(
            format!("{NAMED_VOLUME_PREFIX}{i}"),
            &owner::object_name(tenant, &m.name),
            &m.path,
            m.read_only,
        );
        volumes.push(v);
        container_mounts.push(at);
    }
}

/// Points the template's `index`th named volume at `claim`: a volume the
/// operator shares (`--shared-volume`), another tenant's claim, which the
/// caller checked and which is mounted read-only.
pub fn use_shared_claim(t: &mut SandboxTemplate, index: usize, claim: String) {
    let name = format!("{NAMED_VOLUME_PREFIX}{index}");
    let volumes = t
        .spec
        .blueprint
        .pod_template
        .spec
        .volumes
        .iter_mut()
        .flatten();
    for v in volumes.filter(|v| v.name == name) {
        v.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.clone(),
            read_only: Some(true),
        });
    }
}

/// The named volumes [`add_volumes`] put on a Pod spec.
fn volumes_of(pod: &PodSpec, main: usize) -> Vec<sandhub_api::volumes::VolumeMount> {
    let mounts = pod.containers[main].volume_mounts.iter().flatten();
    mounts
        .filter(|m| m.name.starts_with(NAMED_VOLUME_PREFIX))
        .filter_map(|m| {
            let v = pod.volumes.iter().flatten().find(|v| v.name == m.name)?;
            let claim = &v.persistent_volume_claim.as_ref()?.claim_name;
            // `<name>-<tenant suffix>`: the suffix has no `-`.
            let (name, _) = claim.rsplit_once('-')?;
            Some(sandhub_api::volumes::VolumeMount {
                name: name.to_string(),
                path: m.mount_path.clone(),
                read_only: m.read_only.unwrap_or(false),
            })
        })
        .collect()
}

/// Records the template's `network` on its Pod template, and labels
/// egress Pods for the NetworkPolicy that admits only DNS and the proxy
/// (a base's own label or annotation of those names is replaced).
fn mark_network(pod_template: &mut PodTemplate, t: &Template) {
    use super::egress::{TemplateNetwork, NETWORK_ANNOTATION, NETWORK_LABEL};
    if let Some(meta) = pod_template.metadata.as_mut() {
        meta.labels.iter_mut().for_each(|l| {
            l.remove(NETWORK_LABEL);
        });
        meta.annotations.iter_mut().for_each(|a| {
            a.remove(NETWORK_ANNOTATION);
        });
    }
    if t.network.mode != Network::Egress {
        return;
    }
    let meta = pod_template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(NETWORK_LABEL.into(), "egress".into());
    meta.annotations.get_or_insert_with(BTreeMap::new).insert(
        NETWORK_ANNOTATION.into(),
        serde_json::to_string(&TemplateNetwork::of(t)).unwrap_or_default(),
    );
}

/// The network a SandboxTemplate records (`none` when it records none).
pub fn network_of(spec: &SandboxTemplateSpec) -> super::egress::TemplateNetwork {
    spec.blueprint
        .pod_template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(super::egress::NETWORK_ANNOTATION))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// The Pod template annotation that names the containers a tenant's
/// `sidecars` became (the base may hold containers of its own).
pub const SIDECARS_ANNOTATION: &str = "sandhub.io/sidecars";

/// Appends the template's sidecars to the Pod: the main container's
/// security context (the base's hardening holds for them too), its own
/// limits, and the workspace when the Pod has one. A sidecar never replaces
/// a container of the operator's base: a name they share is refused.
fn add_sidecars(
    pod_template: &mut PodTemplate,
    main: usize,
    sidecars: &[Sidecar],
) -> Result<(), Error> {
    if sidecars.is_empty() {
        return Ok(());
    }
    let pod = &mut pod_template.spec;
    let mut taken = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten());
    if let Some(c) = taken.find(|c| sidecars.iter().any(|s| s.name == c.name)) {
        return Err(Error::invalid(format!(
            "sidecar {}: the base template already has a container of that name",
            c.name
        )));
    }
    let security = pod.containers[main].security_context.clone();
    let has_workspace = pod
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == WORKSPACE_VOLUME);
    for s in sidecars {
        let limits = cpu_memory_limits(s.cpu, s.memory_mb);
        pod.containers.push(Container {
            name: s.name.clone(),
            image: Some(s.image.clone()),
            image_pull_policy: pod.containers[main].image_pull_policy.clone(),
            command: s.command.clone(),
            env: (!s.env.is_empty()).then(|| {
                s.env
                    .iter()
                    .map(|(k, v)| EnvVar {
                        name: k.clone(),
                        value: Some(v.clone()),
                        value_from: None,
                    })
                    .collect()
            }),
            resources: (!limits.is_empty()).then(|| ResourceRequirements {
                requests: Some(limits.clone()),
                limits: Some(limits),
                ..Default::default()
            }),
            security_context: security.clone(),
            volume_mounts: has_workspace.then(|| {
                vec![VolumeMount {
                    name: WORKSPACE_VOLUME.into(),
                    mount_path: "/workspace".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
    }
    let names: Vec<&str> = sidecars.iter().map(|s| s.name.as_str()).collect();
    pod_template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SIDECARS_ANNOTATION.into(), names.join(","));
    Ok(())
}

/// The sidecars a Pod template holds, by [`SIDECARS_ANNOTATION`].
pub fn sidecar_names(pod_template: &PodTemplate) -> Vec<String> {
    sidecar_names_in(
        pod_template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref()),
    )
}

/// The sidecars [`SIDECARS_ANNOTATION`] names among `annotations` (a Pod
/// template's, or a Pod's, which inherits them).
pub fn sidecar_names_in(annotations: Option<&BTreeMap<String, String>>) -> Vec<String> {
    annotations
        .and_then(|a| a.get(SIDECARS_ANNOTATION))
        .map(|n| {
            n.split(',')
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// A container's env vars with literal values (not from a Secret or field).
fn literal_env(c: &Container) -> impl Iterator<Item = &EnvVar> {
    c.env.iter().flatten().filter(|e| e.value_from.is_none())
}

fn sidecars_of(pod_template: &PodTemplate) -> Vec<Sidecar> {
    let pod = &pod_template.spec;
    sidecar_names(pod_template)
        .iter()
        .filter_map(|name| pod.containers.iter().find(|c| &c.name == name))
        .map(|c| {
            let limit = |k: &str| limit_of(c, k);
            Sidecar {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                command: c.command.clone(),
                env: literal_env(c)
                    .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                    .collect(),
                cpu: limit("cpu").and_then(parse_cpu),
                memory_mb: limit("memory").and_then(parse_mib),
            }
        })
        .collect()
}

/// The hub's view of a SandboxTemplate, whoever made it: the sandboxd
/// container's image (when it is not the sandboxd image), literal env and
/// resource limits.
pub fn template_of(spec: &SandboxTemplateSpec, sandboxd_image: &str) -> Template {
    let pod = &spec.blueprint.pod_template.spec;
    let Some(c) = main_container(pod).map(|i| &pod.containers[i]) else {
        return Template::default();
    };
    let image = c
        .image
        .as_deref()
        .filter(|i| normalize(i) != normalize(sandboxd_image))
        .map(str::to_string);
    let literal = || literal_env(c);
    let env = literal()
        .filter(|e| !e.name.starts_with("SANDBOXD_"))
        .filter(|e| e.name != sandhub_api::sandboxd_token::DIGEST_ENV)
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let var = |name: &str| {
        literal()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let workdir = var(DEFAULT_CWD_ENV);
    let user = var(USER_ENV);
    let entrypoint = var(ENTRYPOINT_ENV).and_then(|j| serde_json::from_str(&j).ok());
    let limit = |k: &str| limit_of(c, k);
    Template {
        image,
        env,
        workdir,
        user,
        entrypoint,
        cpu: limit("cpu").and_then(parse_cpu),
        memory_mb: limit("memory").and_then(parse_mib),
        disk_mb: limit("ephemeral-storage").and_then(parse_mib),
        sidecars: sidecars_of(&spec.blueprint.pod_template),
        volumes: main_container(pod)
            .map(|i| volumes_of(pod, i))
            .unwrap_or_default(),
        network: network_of(spec).network,
        egress_mb: network_of(spec).egress_mb,
        secrets: network_of(spec).secrets,
        ..Template::default()
    }
}

/// `cpu` and `memory` limits in Kubernetes quantities (millicores, MiB).
fn cpu_memory_limits(cpu: Option<f64>, memory_mb: Option<u64>) -> BTreeMap<String, Quantity> {
    let mut limits = BTreeMap::new();
    if let Some(cpu) = cpu {
        limits.insert("cpu".to_string(), Quantity(format!("{}m", millicores(cpu))));
    }
    if let Some(mb) = memory_mb {
        limits.insert("memory".to_string(), Quantity(format!("{mb}Mi")));
    }
    limits
}

/// Container `c`'s limit on resource `k`, as written.
fn limit_of<'a>(c: &'a Container, k: &str) -> Option<&'a str> {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(k))
        .map(|q| q.0.as_str())
}

fn millicores(cpu: f64) -> u64 {
    (cpu * 1000.0).round().max(1.0) as u64
}

/// `docker.io/library/x` and `x` name one image, as the CRI reads them.
fn normalize(image: &str) -> String {
    let mut s = image;
    for prefix in ["docker.io/", "index.docker.io/"] {
        if let Some(rest) = s.strip_prefix(prefix) {
            s = rest;
        }
    }
    let s = s.strip_prefix("library/").unwrap_or(s);
    sandhub_api::validate::normalize_image_reference(s)
}

/// A CPU quantity in cores: `500m`, `2`, `1.5`.
fn parse_cpu(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok().map(|m| m / 1000.0),
        None => q.parse::<f64>().ok(),
    }
}

/// A byte quantity in whole MiB: `512Mi`, `2Gi`, `1000M`, bytes.
fn parse_mib(q: &str) -> Option<u64> {
    const MI: f64 = 1024.0 * 1024.0;
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", MI),
        ("Gi", MI * 1024.0),
        ("Ti", MI * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| q.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((q, 1.0));
    let bytes = num.parse::<f64>().ok()? * mult;
    Some((bytes / MI).round() as u64)
}

#[cfg(test)]
mod tests;
