//! Bounded waits: every wait has a timeout and says what it waited for when it expires.

use std::fmt::Debug;
use std::time::Duration;

use anyhow::{anyhow, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::wait::{await_condition, Condition};
use kube::{Api, Resource};
use serde_json::Value;

/// Waits until `cond` holds for the object `name` (which may not exist yet), and returns it.
pub async fn until<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&K) -> bool,
) -> Result<K>
where
    K: Resource + Clone + Debug + Send + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    let found = tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, |obj: Option<&K>| obj.is_some_and(&cond)),
    )
    .await;
    match found {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => Err(anyhow!("{name}: gone while waiting for {what}")),
        Ok(Err(e)) => Err(anyhow!(
            "{name}: watch failed while waiting for {what}: {e}"
        )),
        Err(_) => Err(anyhow!(
            "{name}: not {what} after {timeout:?}; last seen: {}",
            last_seen(api, name).await
        )),
    }
}

/// Waits until the object `name` with `uid` no longer exists.
pub async fn deleted<K>(api: &Api<K>, name: &str, uid: &str, timeout: Duration) -> Result<()>
where
    K: Resource + Clone + Debug + Send + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    let cond = kube::runtime::wait::conditions::is_deleted::<K>(uid);
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(anyhow!(
            "{name}: watch failed while waiting for deletion: {e}"
        )),
        Err(_) => Err(anyhow!(
            "{name}: still present {timeout:?} after deletion: {}",
            last_seen(api, name).await
        )),
    }
}

/// The object's metadata.deletionTimestamp and status as JSON, for timeout messages (the
/// whole object, managed fields included, would bury them).
async fn last_seen<K>(api: &Api<K>, name: &str) -> String
where
    K: Resource + Clone + Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    match api.get_opt(name).await {
        Ok(Some(obj)) => {
            let v = serde_json::to_value(&obj).unwrap_or_default();
            let brief = serde_json::json!({
                "deletionTimestamp": v.pointer("/metadata/deletionTimestamp"),
                "finalizers": v.pointer("/metadata/finalizers"),
                "status": v.get("status"),
            });
            serde_json::to_string_pretty(&brief).unwrap_or_default()
        }
        Ok(None) => "gone".to_string(),
        Err(e) => format!("(get failed: {e})"),
    }
}

/// The Pod's condition `type_` (e.g. "Ready") as (status, reason).
pub fn pod_condition(pod: &Pod, type_: &str) -> Option<(String, Option<String>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Whether the Pod is Running with condition Ready=True.
pub fn pod_is_ready(pod: &Pod) -> bool {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    running && pod_condition(pod, "Ready").is_some_and(|(status, _)| status == "True")
}

/// A [`Condition`] for [`await_condition`] users: the Pod is Running and Ready.
pub fn is_pod_ready() -> impl Condition<Pod> {
    |pod: Option<&Pod>| pod.is_some_and(pod_is_ready)
}

/// `value` at the JSON pointer `ptr` as a string, for asserting on status fields of any object.
pub fn json_str<T: serde::Serialize>(obj: &T, ptr: &str) -> Option<String> {
    let v = serde_json::to_value(obj).ok()?;
    match v.pointer(ptr)? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Polls `f` every 100 ms until it returns `Some`; panics (naming `what`)
/// after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
