//! Gym environments in the cluster (issue #28): one ConfigMap per env in the
//! hub's namespace, so that any replica can reset or step any env and a
//! replica's crash loses none.
//!
//! An env's configuration is written once, at creation; its episode state
//! and last use after every call (a merge patch of two keys). The tenant is
//! kept in full inside (the label holds only its digest, for listing), and a
//! read by another tenant finds nothing. Everything read back is checked:
//! a ConfigMap that does not parse is reported, never half-restored.
//!
//! Two replicas stepping one env at the same moment both succeed and the
//! later write wins: an env is one agent's sequential loop, so that is a
//! client's mistake, and it cannot reach another env or tenant.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api,
};
use sandhub_api::error::Code;
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};

use super::{model::tenant_label_value, tenant::kube_error, TENANT_LABEL};
use crate::backend::{EnvStore, Episode, GymEnvRow};

/// Every env's ConfigMap carries this label, so a list finds them all.
pub const ENV_LABEL: &str = "sandhub.io/gym-env";
const NAME_PREFIX: &str = "sandhub-gym-";
const SPEC: &str = "spec.json";
const META: &str = "meta.json";
const EPISODE: &str = "episode.json";
const LAST_USED: &str = "last-used-ms";
/// An env's record at most: far below a ConfigMap's 1 MiB, so one tenant's
/// envs cannot fill etcd with a few calls (the spec is what grows: tasks).
pub const MAX_ENV_BYTES: usize = 256 * 1024;

/// What never changes after creation, besides the spec.
#[derive(Serialize, Deserialize)]
struct Meta {
    id: String,
    tenant: String,
    idle_timeout_seconds: u64,
    created_at: i64,
}

/// The kubernetes backend's [`EnvStore`].
pub struct KubeEnvStore {
    api: Api<ConfigMap>,
}

impl KubeEnvStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeEnvStore {
            api: Api::namespaced(client, namespace),
        }
    }
}

/// The ConfigMap of env `id`, if `id` can be one of ours: ids come from
/// URLs, and only the hub's own shape (`env-` and lowercase alphanumerics)
/// is ever turned into an object name.
fn object_name(id: &str) -> Option<String> {
    let rest = id.strip_prefix("env-")?;
    let ok = !rest.is_empty()
        && rest.len() <= 40
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    ok.then(|| format!("{NAME_PREFIX}{id}"))
}

fn corrupt(id: &str, what: &str) -> Error {
    Error::internal(format!("stored gym environment {id} is unreadable: {what}"))
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serializes")
}

fn to_object(row: &GymEnvRow) -> Result<ConfigMap> {
    let name = object_name(&row.id).ok_or_else(|| corrupt(&row.id, "not an env id"))?;
    let meta = Meta {
        id: row.id.clone(),
        tenant: row.tenant.clone(),
        idle_timeout_seconds: row.idle_timeout_seconds,
        created_at: row.created_at,
    };
    let data = BTreeMap::from([
        (SPEC.to_string(), json(&row.spec)),
        (META.to_string(), json(&meta)),
        (EPISODE.to_string(), json(&row.episode)),
        (LAST_USED.to_string(), row.last_used.to_string()),
    ]);
    let size: usize = data.values().map(String::len).sum();
    if size > MAX_ENV_BYTES {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("the environment's configuration takes {size} bytes; at most {MAX_ENV_BYTES} are kept per env on the kubernetes backend"),
        ));
    }
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name);
    cm.metadata.labels = Some(BTreeMap::from([
        (ENV_LABEL.to_string(), "true".to_string()),
        (TENANT_LABEL.to_string(), tenant_label_value(&row.tenant)),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "sandhub-hub".to_string(),
        ),
    ]));
    cm.data = Some(data);
    Ok(cm)
}

fn field<'a>(cm: &'a ConfigMap, key: &str, id: &str) -> Result<&'a str> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(String::as_str)
        .ok_or_else(|| corrupt(id, &format!("no {key}")))
}

fn meta_of(cm: &ConfigMap, id: &str) -> Result<Meta> {
    serde_json::from_str(field(cm, META, id)?).map_err(|e| corrupt(id, &e.to_string()))
}

fn last_used_of(cm: &ConfigMap, id: &str) -> Result<i64> {
    field(cm, LAST_USED, id)?
        .parse()
        .map_err(|_| corrupt(id, LAST_USED))
}

fn from_object(cm: &ConfigMap, id: &str) -> Result<GymEnvRow> {
    let meta = meta_of(cm, id)?;
    if meta.id != id {
        return Err(corrupt(id, "it names another env"));
    }
    Ok(GymEnvRow {
        id: meta.id,
        tenant: meta.tenant,
        spec: serde_json::from_str(field(cm, SPEC, id)?)
            .map_err(|e| corrupt(id, &e.to_string()))?,
        episode: serde_json::from_str(field(cm, EPISODE, id)?)
            .map_err(|e| corrupt(id, &e.to_string()))?,
        idle_timeout_seconds: meta.idle_timeout_seconds,
        created_at: meta.created_at,
        last_used: last_used_of(cm, id)?,
    })
}

#[async_trait]
impl EnvStore for KubeEnvStore {
    async fn insert(&self, row: &GymEnvRow) -> Result<()> {
        self.api
            .create(&PostParams::default(), &to_object(row)?)
            .await
            .map(|_| ())
            .map_err(|e| kube_error("recording the gym environment", e))
    }

    async fn save(&self, id: &str, episode: &Episode, now: i64) -> Result<()> {
        let Some(name) = object_name(id) else {
            return Ok(());
        };
        let patch =
            serde_json::json!({"data": {EPISODE: json(episode), LAST_USED: now.to_string()}});
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            // Closed meanwhile (here or on another replica): it stays closed.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(kube_error("recording the gym episode", e)),
        }
    }

    async fn get(&self, tenant: &str, id: &str) -> Result<Option<GymEnvRow>> {
        let Some(name) = object_name(id) else {
            return Ok(None);
        };
        let Some(cm) = self
            .api
            .get_opt(&name)
            .await
            .map_err(|e| kube_error("reading the gym environment", e))?
        else {
            return Ok(None);
        };
        let row = from_object(&cm, id)?;
        Ok((row.tenant == tenant).then_some(row))
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let Some(name) = object_name(id) else {
            return Ok(());
        };
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(kube_error("deleting the gym environment", e)),
        }
    }

    async fn idle(&self, now: i64) -> Result<Vec<(String, String)>> {
        let list = self
            .api
            .list(&ListParams::default().labels(&format!("{ENV_LABEL}=true")))
            .await
            .map_err(|e| kube_error("listing gym environments", e))?;
        let mut idle = Vec::new();
        for cm in &list.items {
            let Some(id) = cm
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix(NAME_PREFIX))
            else {
                continue;
            };
            // One unreadable record must not stop the sweep of the others.
            let (Ok(meta), Ok(last_used)) = (meta_of(cm, id), last_used_of(cm, id)) else {
                tracing::warn!(env = %id, "skipping an unreadable gym environment record");
                continue;
            };
            if last_used + (meta.idle_timeout_seconds as i64).saturating_mul(1000) <= now {
                idle.push((meta.id, meta.tenant));
            }
        }
        Ok(idle)
    }

    fn shared(&self) -> bool {
        true
    }

    /// Claims have no idle timeout (a deadline only): the sweeper closes
    /// idle envs, with their sandboxes.
    fn sandbox_idle_timeouts(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use sandhub_api::gym::{CreateEnv, Matcher, Task};

    use super::*;

    fn row(id: &str, tenant: &str) -> GymEnvRow {
        GymEnvRow {
            id: id.into(),
            tenant: tenant.into(),
            spec: CreateEnv {
                task: Some(Task {
                    prompt: Some("say hi".into()),
                    ..Task::default()
                }),
                reward: vec![Matcher::ExitCode {
                    equals: 0,
                    weight: 1.0,
                }],
                ..CreateEnv::default()
            },
            episode: Episode {
                step: 3,
                episode: 2,
                ..Default::default()
            },
            idle_timeout_seconds: 60,
            created_at: 1_000,
            last_used: 2_000,
        }
    }

    #[test]
    fn an_env_round_trips_through_its_configmap() {
        let r = row("env-abc123", "team a");
        let cm = to_object(&r).unwrap();
        assert_eq!(cm.metadata.name.as_deref(), Some("sandhub-gym-env-abc123"));
        let labels = cm.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[TENANT_LABEL], tenant_label_value("team a"));
        assert!(
            !labels.values().any(|v| v.contains("team a")),
            "the label hides the tenant"
        );
        assert_eq!(from_object(&cm, "env-abc123").unwrap(), r);
        // A record under another env's name is refused, not served.
        assert_eq!(
            from_object(&cm, "env-other").unwrap_err().code,
            Code::Internal
        );
    }

    #[test]
    fn only_the_hubs_own_ids_become_object_names() {
        assert!(object_name("env-abc123").is_some());
        for bad in [
            "",
            "env-",
            "abc",
            "env-ABC",
            "env-a/b",
            "env-a.b",
            "env-../x",
            &format!("env-{}", "a".repeat(41)),
        ] {
            assert_eq!(object_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_oversized_env_is_refused_with_a_reason() {
        let mut r = row("env-big", "t");
        r.spec.task.as_mut().unwrap().prompt = Some("x".repeat(MAX_ENV_BYTES));
        let e = to_object(&r).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("at most"), "{}", e.message);
    }
}
