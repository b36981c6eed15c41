//! What a bound Pod's status should become, as a JSON merge patch for the status subresource.
//!
//! Normal Pods become Running and Ready. The annotation [`FAIL_ANNOTATION`] asks for a
//! failure instead, so controllers' failure paths can be tested without a real kubelet.

use std::net::Ipv4Addr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

/// Pod annotation naming the failure the fake node should produce (see [`FailMode`]).
pub const FAIL_ANNOTATION: &str = "sandhub.dev/fake-node-fail";

/// The failures a test can request through [`FAIL_ANNOTATION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailMode {
    /// Pending, not Ready; every container waiting with reason `ImagePullBackOff`.
    ImagePullBackOff,
    /// Failed; every container terminated with reason `OOMKilled`, exit code 137.
    OomKilled,
    /// Failed with the kubelet's `Evicted` for local storage: the Pod's containers past
    /// their `ephemeral-storage` limits, in the kubelet's words, with its `DisruptionTarget`
    /// condition. (A kubelet needs container filesystem stats to do this itself; the test
    /// cluster's real node has none, see `dev/k8s/real-node.sh`.)
    Evicted,
    /// Never bound: produced by the real scheduler when the Pod also carries a nodeSelector
    /// that matches no node (PodScheduled=False, reason Unschedulable). If such a Pod is bound
    /// to the fake node anyway, the fake node leaves it Pending.
    Unschedulable,
}

impl FromStr for FailMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ImagePullBackOff" => Ok(FailMode::ImagePullBackOff),
            "OOMKilled" => Ok(FailMode::OomKilled),
            "Evicted" => Ok(FailMode::Evicted),
            "Unschedulable" => Ok(FailMode::Unschedulable),
            other => Err(format!(
                "unknown {FAIL_ANNOTATION} value {other:?} (ImagePullBackOff, OOMKilled, Evicted, Unschedulable)"
            )),
        }
    }
}

/// What the fake node does about one Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Want {
    /// Finish a deletion the way a kubelet does: delete with grace period 0.
    Delete,
    /// Running and Ready.
    Run,
    Fail(FailMode),
    /// Nothing to do (already in the wanted state, terminal, or held Pending).
    Nothing,
}

/// Decides what `pod` needs, given its current state.
pub fn want(pod: &Pod) -> Want {
    if pod.metadata.deletion_timestamp.is_some() {
        return Want::Delete;
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase == "Succeeded" || phase == "Failed" {
        return Want::Nothing; // terminal phases are final
    }
    let requested = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FAIL_ANNOTATION))
        .map(|v| v.parse::<FailMode>());
    let wanted = match requested {
        None => Want::Run,
        Some(Ok(FailMode::Unschedulable)) => return Want::Nothing,
        Some(Ok(mode)) => Want::Fail(mode),
        Some(Err(e)) => {
            tracing::warn!(pod = ?pod.metadata.name, "{e}; running the Pod normally");
            Want::Run
        }
    };
    if is_done(pod, wanted) {
        Want::Nothing
    } else {
        wanted
    }
}

/// Whether `pod` already shows the outcome `wanted` (our own earlier write, seen again).
fn is_done(pod: &Pod, wanted: Want) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    match wanted {
        Want::Run => {
            phase == "Running"
                && status.pod_ip.is_some()
                && status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        }
        Want::Fail(FailMode::ImagePullBackOff) => {
            phase == "Pending"
                && status.container_statuses.iter().flatten().any(|cs| {
                    cs.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("ImagePullBackOff")
                })
        }
        Want::Fail(FailMode::OomKilled | FailMode::Evicted) => phase == "Failed",
        Want::Fail(FailMode::Unschedulable) | Want::Delete | Want::Nothing => true,
    }
}

/// The status merge patch that makes `pod` show `wanted`, with pod IP `ip`.
pub fn status_patch(pod: &Pod, wanted: Want, ip: Ipv4Addr) -> Value {
    let now = now();
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let cond = |type_: &str, ok: bool, reason: Option<&str>| {
        let mut c = json!({"type": type_, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now, "lastProbeTime": null});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        c
    };
    let (phase, ready_reason, container_state): (&str, Option<&str>, ContainerState) = match wanted
    {
        Want::Fail(FailMode::ImagePullBackOff) => {
            ("Pending", Some("ContainersNotReady"), image_pull_back_off)
        }
        Want::Fail(FailMode::OomKilled) => ("Failed", Some("PodFailed"), oom_killed),
        Want::Fail(FailMode::Evicted) => ("Failed", Some("PodFailed"), killed),
        _ => ("Running", None, running),
    };
    let ready = ready_reason.is_none();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let mut s = container_state(c, &now);
            s["name"] = json!(c.name);
            s["image"] = json!(c.image.clone().unwrap_or_default());
            s["imageID"] = json!("");
            s["restartCount"] = json!(0);
            if ready || matches!(wanted, Want::Fail(FailMode::OomKilled | FailMode::Evicted)) {
                s["containerID"] = json!(format!("fake://{uid}/{}", c.name));
            }
            s
        })
        .collect();
    let init_containers: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            // A restartable init container is a sidecar: it keeps running.
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let mut s = if sidecar {
                running(c, &now)
            } else {
                json!({"ready": true, "started": false, "state": {"terminated": {
                    "exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}})
            };
            s["name"] = json!(c.name);
            s["image"] = json!(c.image.clone().unwrap_or_default());
            s["imageID"] = json!("");
            s["restartCount"] = json!(0);
            s["containerID"] = json!(format!("fake://{uid}/{}", c.name));
            s
        })
        .collect();
    let mut conditions = vec![
        cond("PodReadyToStartContainers", true, None),
        cond("Initialized", true, None),
        cond("Ready", ready, ready_reason),
        cond("ContainersReady", ready, ready_reason),
        cond("PodScheduled", true, None),
    ];
    let mut patch = json!({
        "status": {
            "phase": phase,
            "conditions": [],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
            "startTime": pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| json!(t)).unwrap_or(json!(now)),
            "containerStatuses": containers,
            "initContainerStatuses": init_containers,
        }
    });
    if wanted == Want::Fail(FailMode::Evicted) {
        patch["status"]["reason"] = json!("Evicted");
        patch["status"]["message"] = json!(format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            ephemeral_limit(&spec)
        ));
        conditions.push(cond("DisruptionTarget", true, Some("TerminationByKubelet")));
    }
    patch["status"]["conditions"] = json!(conditions);
    patch
}

/// The sum of the containers' `ephemeral-storage` limits, as the kubelet prints it
/// (`Mi` when every limit is in `Mi`, else the quantities joined with `+`).
fn ephemeral_limit(spec: &k8s_openapi::api::core::v1::PodSpec) -> String {
    let limits: Vec<String> = spec
        .containers
        .iter()
        .filter_map(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("ephemeral-storage")
                .map(|q| q.0.clone())
        })
        .collect();
    let mib: Option<u64> = limits
        .iter()
        .map(|l| l.strip_suffix("Mi").and_then(|n| n.parse::<u64>().ok()))
        .sum();
    match mib {
        Some(total) => format!("{total}Mi"),
        None => limits.join("+"),
    }
}

/// A container the kubelet killed (exit code 137, as SIGKILL leaves it).
fn killed(_: &Container, now: &str) -> Value {
    json!({"ready": false, "started": false, "state": {"terminated": {
        "exitCode": 137, "reason": "Error", "startedAt": now, "finishedAt": now}}})
}

/// A container's status (without name and image) at time `now`.
type ContainerState = fn(&Container, &str) -> Value;

fn running(_: &Container, now: &str) -> Value {
    json!({"ready": true, "started": true, "state": {"running": {"startedAt": now}}})
}

fn image_pull_back_off(c: &Container, _: &str) -> Value {
    let image = c.image.as_deref().unwrap_or_default();
    json!({"ready": false, "started": false, "state": {"waiting": {
        "reason": "ImagePullBackOff",
        "message": format!("Back-off pulling image \"{image}\""),
    }}})
}

fn oom_killed(_: &Container, now: &str) -> Value {
    json!({"ready": false, "started": false, "state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}})
}

/// Now, to the second, as the RFC 3339 string Kubernetes expects for `metav1.Time`.
pub fn now() -> String {
    Timestamp::from_second(Timestamp::now().as_second())
        .expect("the current time is a valid timestamp")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::api::ObjectMeta;

    fn pod(annotation: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some("u1".into()),
                annotations: annotation
                    .map(|a| [(FAIL_ANNOTATION.to_string(), a.to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("img:1".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    /// Acts on `pod` as the fake node would and stores the result as the pod's status.
    fn apply(pod: &mut Pod, ip: &str) {
        let patch = status_patch(pod, want(pod), ip.parse().unwrap());
        pod.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
    }

    #[test]
    fn runs_then_settles() {
        let mut p = pod(None);
        assert_eq!(want(&p), Want::Run);
        apply(&mut p, "10.244.0.2");
        assert_eq!(want(&p), Want::Nothing, "our own write is not redone");
        let s = p.status.as_ref().unwrap();
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.0.2"));
        assert!(s.container_statuses.as_ref().unwrap()[0].ready);
    }

    #[test]
    fn failure_modes() {
        let mut p = pod(Some("ImagePullBackOff"));
        assert_eq!(want(&p), Want::Fail(FailMode::ImagePullBackOff));
        apply(&mut p, "10.244.0.3");
        assert_eq!(want(&p), Want::Nothing);
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));

        let mut p = pod(Some("OOMKilled"));
        apply(&mut p, "10.244.0.4");
        let cs = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        let t = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("OOMKilled")));
        assert_eq!(want(&p), Want::Nothing, "Failed is terminal");

        // A running Pod asked to be evicted afterwards, in the kubelet's words.
        let mut p = pod(None);
        apply(&mut p, "10.244.0.5");
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(FAIL_ANNOTATION.into(), "Evicted".into());
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some(
                    [(
                        "ephemeral-storage".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("24Mi".into()),
                    )]
                    .into(),
                ),
                ..Default::default()
            });
        assert_eq!(want(&p), Want::Fail(FailMode::Evicted));
        apply(&mut p, "10.244.0.5");
        let s = p.status.as_ref().unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            s.message.as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 24Mi. ")
        );
        assert!(s
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True"));
        assert_eq!(want(&p), Want::Nothing, "Failed is terminal");

        assert_eq!(want(&pod(Some("Unschedulable"))), Want::Nothing);
        assert_eq!(want(&pod(Some("bogus"))), Want::Run);
    }

    #[test]
    fn deletion_wins() {
        let mut p = pod(None);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::now(),
        ));
        assert_eq!(want(&p), Want::Delete);
    }
}
