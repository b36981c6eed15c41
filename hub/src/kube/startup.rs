//! Why a starting sandbox's Pod is not coming up, read from its status: the
//! words kubelet and the scheduler use, judged fatal (waiting cannot heal
//! it, so create fails now) or not (create keeps waiting, and says why if
//! it times out). Pure, so every reason is tested without a cluster.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Waiting reasons no retry heals: the image is not on the node and may
/// not be pulled, or its name cannot be parsed.
const FATAL_WAITING: &[&str] = &["ErrImageNeverPull", "InvalidImageName"];
/// Waiting reasons worth reporting while the wait goes on: kubelet retries
/// them, and they may heal (a registry back, a ConfigMap created).
const RETRYABLE_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// One reason a Pod is not starting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartProblem {
    /// Kubernetes' word: `ErrImageNeverPull`, `OOMKilled`, `Unschedulable`...
    pub reason: String,
    pub message: String,
    /// Waiting cannot heal it: fail the create now.
    pub fatal: bool,
}

impl std::fmt::Display for StartProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// The most telling problem of a Pod that is not Ready yet; fatal ones
/// first. None while it looks like it is merely on its way.
pub fn problem(pod: &Pod) -> Option<StartProblem> {
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    let mut found: Vec<StartProblem> = containers.filter_map(container_problem).collect();
    if let Some(c) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    }) {
        found.push(StartProblem {
            reason: "Unschedulable".into(),
            message: c.message.clone().unwrap_or_default(),
            fatal: false,
        });
    }
    found.sort_by_key(|p| !p.fatal);
    found.into_iter().next()
}

fn container_problem(c: &ContainerStatus) -> Option<StartProblem> {
    let state = c.state.as_ref();
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.as_deref().unwrap_or_default();
        let message = format!(
            "container {}: {}",
            c.name,
            w.message.as_deref().unwrap_or(reason)
        );
        if FATAL_WAITING.contains(&reason) {
            return Some(StartProblem {
                reason: reason.into(),
                message,
                fatal: true,
            });
        }
        // A crash loop says more through how the last run ended.
        if reason == "CrashLoopBackOff" {
            if let Some(p) = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| ended(&c.name, t))
            {
                return Some(p);
            }
        }
        if RETRYABLE_WAITING.contains(&reason) {
            return Some(StartProblem {
                reason: reason.into(),
                message,
                fatal: false,
            });
        }
    }
    let terminated = state
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
    ended(&c.name, terminated)
}

/// A container of a not-yet-Ready Pod that ended: OOM-killed or exited
/// non-zero at start is fatal (it will do the same again); an init
/// container that completed is normal.
fn ended(
    name: &str,
    t: &k8s_openapi::api::core::v1::ContainerStateTerminated,
) -> Option<StartProblem> {
    let reason = t.reason.as_deref().unwrap_or("Error");
    if t.exit_code == 0 && reason != "OOMKilled" {
        return None;
    }
    let detail = t
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    Some(StartProblem {
        reason: if reason == "OOMKilled" {
            "OOMKilled".into()
        } else {
            "ExitedAtStart".into()
        },
        message: format!(
            "container {name} {reason}, exit code {}{detail}",
            t.exit_code
        ),
        fatal: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    fn waiting(reason: &str) -> serde_json::Value {
        json!({"containerStatuses": [{"name": "sandboxd", "image": "x", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": reason, "message": format!("{reason} detail")}}}]})
    }

    #[test]
    fn never_pull_and_invalid_names_are_fatal() {
        for reason in ["ErrImageNeverPull", "InvalidImageName"] {
            let p = problem(&pod(waiting(reason))).unwrap();
            assert_eq!((p.reason.as_str(), p.fatal), (reason, true));
            assert!(p.message.contains("container sandboxd"), "{p}");
        }
    }

    #[test]
    fn pull_back_off_and_config_errors_are_reported_not_fatal() {
        for reason in [
            "ImagePullBackOff",
            "ErrImagePull",
            "CreateContainerConfigError",
        ] {
            let p = problem(&pod(waiting(reason))).unwrap();
            assert_eq!((p.reason.as_str(), p.fatal), (reason, false));
        }
        assert_eq!(problem(&pod(waiting("ContainerCreating"))), None);
    }

    #[test]
    fn oom_and_exit_at_start_are_fatal_through_a_crash_loop() {
        let status = json!({"containerStatuses": [{"name": "sandboxd", "image": "x", "imageID": "",
            "ready": false, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]});
        let p = problem(&pod(status)).unwrap();
        assert_eq!((p.reason.as_str(), p.fatal), ("OOMKilled", true));
        let status = json!({"containerStatuses": [{"name": "sandboxd", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"reason": "Error", "exitCode": 2, "message": "bad flag"}}}]});
        let p = problem(&pod(status)).unwrap();
        assert_eq!((p.reason.as_str(), p.fatal), ("ExitedAtStart", true));
        assert!(p.message.contains("exit code 2: bad flag"), "{p}");
    }

    #[test]
    fn a_completed_init_container_is_normal_and_fatal_wins() {
        let status = json!({
            "initContainerStatuses": [{"name": "copy", "image": "x", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}],
            "containerStatuses": [{"name": "sandboxd", "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}}]});
        assert_eq!(problem(&pod(status)), None);
        let status = json!({
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes are available"}],
            "initContainerStatuses": [{"name": "copy", "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ErrImageNeverPull"}}}]});
        let p = problem(&pod(status)).unwrap();
        assert_eq!(p.reason, "ErrImageNeverPull");
        let unsched = json!({"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available"}]});
        let p = problem(&pod(unsched)).unwrap();
        assert_eq!((p.reason.as_str(), p.fatal), ("Unschedulable", false));
    }
}
