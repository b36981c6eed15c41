//! MCP sessions any replica can serve (issue #28): each session's record
//! (who opened it, the client's `initialize`) is a ConfigMap in the hub's
//! namespace, read by the replica a request reaches when it does not know
//! the session ([`sandhub_mcp::SharedSessions`]).
//!
//! The object is named by a digest of the session id, never the id itself:
//! the id is what a client presents, and a name is visible to anyone who
//! may list ConfigMaps. A session's record is refreshed at most every
//! [`TOUCH_EVERY`] per replica, and [`KubeMcpSessions::sweep`] removes the
//! records of sessions unused for [`IDLE`] (clients that vanished without
//! a DELETE).
//!
//! Each record carries its tenant's label (a digest, as on claims), and a
//! tenant keeps at most `--mcp-sessions-per-tenant` of them: recording one
//! more deletes that tenant's least recently used records
//! ([`evictions`]). An evicted session still works on a replica that holds
//! it in memory; the others answer it as unknown. Why evict rather than
//! refuse: docs/security.md, "MCP sessions on Kubernetes".

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    Api,
};
use sandhub_mcp::{SharedSession, SharedSessions};
use sha2::{Digest, Sha256};

use super::model::{tenant_label_value, TENANT_LABEL};
use crate::backend::now_ms;

/// Every record carries this label, so the sweep finds them all.
pub const RECORD_LABEL: &str = "sandhub.io/mcp-session-record";
const PRINCIPAL: &str = "principal";
const INITIALIZE: &str = "initialize.json";
const TOUCHED: &str = "touched-ms";
/// The last use again, where a metadata-only list sees it: choosing whom
/// to evict then reads no `initialize` parameters (up to 64 KiB each).
const TOUCHED_ANNOTATION: &str = "sandhub.io/mcp-session-touched-ms";
/// `--mcp-sessions-per-tenant` unless told.
pub const DEFAULT_PER_TENANT: u32 = 256;
/// A record unused this long goes (rmcp ends idle sessions far sooner).
pub const IDLE: Duration = Duration::from_secs(24 * 3600);
/// How often one replica refreshes one session's record at most.
const TOUCH_EVERY: Duration = Duration::from_secs(600);
/// Sessions whose last touch this replica remembers (then it forgets all).
const MAX_TOUCHED: usize = 10_000;
/// Larger `initialize` parameters are not recorded (the session then works
/// only on its own replica): a client cannot fill etcd through them.
const MAX_INITIALIZE_BYTES: usize = 64 * 1024;

pub struct KubeMcpSessions {
    api: Api<ConfigMap>,
    touched: Mutex<HashMap<String, Instant>>,
    /// Records one tenant keeps at most (`--mcp-sessions-per-tenant`).
    per_tenant: usize,
}

fn object_name(session: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"sandhub-mcp-session-record/v1\0")
        .chain_update(session.as_bytes())
        .finalize();
    let hex: String = digest[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("sandhub-mcp-{hex}")
}

fn data(record: &SharedSession) -> Result<BTreeMap<String, String>, String> {
    let mut data = BTreeMap::from([(TOUCHED.to_string(), now_ms().to_string())]);
    if let Some(p) = &record.principal {
        data.insert(PRINCIPAL.into(), p.clone());
    }
    if let Some(init) = &record.initialize {
        let init = init.to_string();
        if init.len() > MAX_INITIALIZE_BYTES {
            return Err(format!(
                "the client's initialize parameters take {} bytes; at most {MAX_INITIALIZE_BYTES} are recorded",
                init.len()
            ));
        }
        data.insert(INITIALIZE.into(), init);
    }
    Ok(data)
}

/// The labels and annotation a record gets, or a merge patch adds: its
/// tenant's label only once the binding layer names the principal (rmcp's
/// half of the record does not know it).
fn metadata(record: &SharedSession, now: i64) -> ObjectMeta {
    let mut labels = BTreeMap::from([
        (RECORD_LABEL.to_string(), "true".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "sandhub-hub".to_string(),
        ),
    ]);
    if let Some(p) = &record.principal {
        labels.insert(TENANT_LABEL.into(), tenant_label_value(p));
    }
    ObjectMeta {
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            TOUCHED_ANNOTATION.to_string(),
            now.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// When a record (seen through a metadata-only list) was last used: its
/// annotation, else its creation, else never (it goes first).
fn last_use(meta: &ObjectMeta) -> i64 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(TOUCHED_ANNOTATION))
        .and_then(|t| t.parse::<i64>().ok())
        .or_else(|| Some(meta.creation_timestamp.as_ref()?.0.as_millisecond()))
        .unwrap_or(0)
}

/// The selector of `tenant`'s records, and only theirs.
fn tenant_selector(tenant: &str) -> String {
    format!(
        "{RECORD_LABEL}=true,{TENANT_LABEL}={}",
        tenant_label_value(tenant)
    )
}

/// Which of one tenant's records (name, last use) go so that at most `cap`
/// remain: the least recently used first (ties by name, so two replicas
/// deciding at once pick the same ones), never `keep`, the record just
/// made. A cap of 0 counts as 1: the new session itself is always kept.
pub(crate) fn evictions(mut records: Vec<(String, i64)>, keep: &str, cap: usize) -> Vec<String> {
    let excess = records.len().saturating_sub(cap.max(1));
    records.retain(|(name, _)| name != keep);
    records.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    records.into_iter().take(excess).map(|(n, _)| n).collect()
}

fn from_object(cm: &ConfigMap) -> SharedSession {
    let data = cm.data.clone().unwrap_or_default();
    SharedSession {
        principal: data.get(PRINCIPAL).cloned(),
        // An unreadable record restores nothing (the session is unknown).
        initialize: data
            .get(INITIALIZE)
            .and_then(|s| serde_json::from_str(s).ok()),
    }
}

impl KubeMcpSessions {
    pub fn new(client: kube::Client, namespace: &str, per_tenant: usize) -> Self {
        KubeMcpSessions {
            api: Api::namespaced(client, namespace),
            touched: Mutex::default(),
            per_tenant,
        }
    }

    /// Deletes `tenant`'s least recently used records past the cap, never
    /// `keep` (the one just recorded). Only that tenant's label is listed:
    /// no other tenant's record is ever counted or touched.
    async fn evict_past_cap(&self, tenant: &str, keep: &str) -> Result<usize, kube::Error> {
        let list = self
            .api
            .list_metadata(&ListParams::default().labels(&tenant_selector(tenant)))
            .await?;
        let records = list
            .items
            .iter()
            .filter_map(|m| Some((m.metadata.name.clone()?, last_use(&m.metadata))))
            .collect();
        let mut gone = 0;
        for name in evictions(records, keep, self.per_tenant) {
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => gone += 1,
                // Another replica evicted it at the same time.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(gone)
    }

    /// Deletes the records of sessions unused for [`IDLE`] at `now_ms`.
    pub async fn sweep(&self, now: i64) -> Result<usize, kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(&format!("{RECORD_LABEL}=true")))
            .await?;
        let mut gone = 0;
        for cm in list.items {
            let touched = cm
                .data
                .as_ref()
                .and_then(|d| d.get(TOUCHED))
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            if touched + IDLE.as_millis() as i64 > now {
                continue;
            }
            if let Some(name) = cm.metadata.name.as_deref() {
                match self.api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => gone += 1,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(gone)
    }
}

impl KubeMcpSessions {
    /// Merges `record` into the session's object, making it if need be.
    async fn write(&self, name: &str, record: &SharedSession) -> Result<(), String> {
        let data = data(record)?;
        let meta = metadata(record, now_ms());
        let patch = serde_json::json!({
            "metadata": {"labels": meta.labels, "annotations": meta.annotations},
            "data": data,
        });
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("recording the MCP session: {e}")),
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..meta
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        match self.api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            // rmcp and the binding layer record one session at once: the
            // other made it first, so merge into theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => self
                .api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| format!("recording the MCP session: {e}")),
            Err(e) => Err(format!("recording the MCP session: {e}")),
        }
    }
}

#[async_trait::async_trait]
impl SharedSessions for KubeMcpSessions {
    async fn load(&self, session: &str) -> Result<Option<SharedSession>, String> {
        self.api
            .get_opt(&object_name(session))
            .await
            .map(|cm| cm.as_ref().map(from_object))
            .map_err(|e| format!("reading the MCP session record: {e}"))
    }

    async fn store(&self, session: &str, record: &SharedSession) -> Result<(), String> {
        let name = object_name(session);
        self.write(&name, record).await?;
        // The binding layer names the principal once, when the session is
        // new: the moment its tenant may pass the cap.
        if let Some(tenant) = &record.principal {
            match self.evict_past_cap(tenant, &name).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    records = n,
                    cap = self.per_tenant,
                    "a tenant's new MCP session evicted its least recently used ones"
                ),
                // The new session is recorded; the cap holds again at the
                // tenant's next session.
                Err(e) => tracing::warn!(error = %e, "evicting MCP session records past the cap"),
            }
        }
        Ok(())
    }

    async fn delete(&self, session: &str) -> Result<(), String> {
        self.touched.lock().unwrap().remove(session);
        match self
            .api
            .delete(&object_name(session), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(format!("deleting the MCP session record: {e}")),
        }
    }

    async fn touch(&self, session: &str) {
        {
            let mut touched = self.touched.lock().unwrap();
            let now = Instant::now();
            match touched.get(session) {
                Some(at) if now.duration_since(*at) < TOUCH_EVERY => return,
                _ => {}
            }
            if touched.len() >= MAX_TOUCHED {
                touched.clear();
            }
            touched.insert(session.to_string(), now);
        }
        let now = now_ms().to_string();
        let patch = serde_json::json!({
            "metadata": {"annotations": {TOUCHED_ANNOTATION: &now}},
            "data": {TOUCHED: &now},
        });
        // A session without a record (too large to keep, or one the sweep
        // took) is not made one by a touch: 404 is fine.
        if let Err(e) = self
            .api
            .patch(
                &object_name(session),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                tracing::debug!(error = %e, "refreshing an MCP session record");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_named_by_a_digest_and_round_trip() {
        let name = object_name("0123-session-id");
        assert!(name.starts_with("sandhub-mcp-") && name.len() == "sandhub-mcp-".len() + 40);
        assert!(!name.contains("session-id"));
        assert_ne!(name, object_name("0123-session-iD"));
        let record = SharedSession {
            principal: Some("team a".into()),
            initialize: Some(serde_json::json!({"protocolVersion": "2025-06-18"})),
        };
        let mut cm = ConfigMap {
            data: Some(data(&record).unwrap()),
            ..ConfigMap::default()
        };
        assert_eq!(from_object(&cm), record);
        // Half a record (the binding layer's, before rmcp's) reads as half.
        cm.data = Some(
            data(&SharedSession {
                principal: Some("t".into()),
                initialize: None,
            })
            .unwrap(),
        );
        assert_eq!(from_object(&cm).initialize, None);
    }

    fn rec(name: &str, used: i64) -> (String, i64) {
        (name.to_string(), used)
    }

    #[test]
    fn past_the_cap_the_least_recently_used_records_go_never_the_new_one() {
        let records = vec![rec("c", 30), rec("a", 10), rec("new", 0), rec("b", 20)];
        // Under or at the cap: nothing goes.
        assert!(evictions(records.clone(), "new", 4).is_empty());
        assert!(evictions(records.clone(), "new", 256).is_empty());
        // One over: the oldest use goes, although "new" reads older still
        // (a record made before its annotation was merged in).
        assert_eq!(evictions(records.clone(), "new", 3), ["a"]);
        assert_eq!(evictions(records.clone(), "new", 2), ["a", "b"]);
        // A cap of 0 or 1 keeps the new session alone.
        assert_eq!(evictions(records.clone(), "new", 1), ["a", "b", "c"]);
        assert_eq!(evictions(records.clone(), "new", 0), ["a", "b", "c"]);
        // Ties go by name, so replicas deciding at once agree.
        let tied = vec![rec("y", 5), rec("x", 5), rec("z", 9)];
        assert_eq!(evictions(tied, "z", 2), ["x"]);
        // The new record not yet listed (the list raced its create): the
        // cap still counts what was listed.
        assert_eq!(evictions(vec![rec("a", 1), rec("b", 2)], "new", 1), ["a"]);
    }

    #[test]
    fn the_cap_counts_one_tenants_records_only() {
        let a = tenant_selector("team a");
        assert_eq!(
            a,
            format!(
                "{RECORD_LABEL}=true,{TENANT_LABEL}={}",
                tenant_label_value("team a")
            )
        );
        assert_ne!(a, tenant_selector("team b"));
        // The tenant's label a record gets is the one its selector names.
        let meta = metadata(
            &SharedSession {
                principal: Some("team a".into()),
                initialize: None,
            },
            1,
        );
        let labels = meta.labels.unwrap();
        for term in a.split(',') {
            let (k, v) = term.split_once('=').unwrap();
            assert_eq!(labels[k], v);
        }
    }

    #[test]
    fn a_records_last_use_is_its_annotation_else_its_creation() {
        let principal = SharedSession {
            principal: Some("team a".into()),
            initialize: None,
        };
        let meta = metadata(&principal, 1234);
        assert_eq!(last_use(&meta), 1234);
        let labels = meta.labels.unwrap();
        assert_eq!(labels[TENANT_LABEL], tenant_label_value("team a"));
        assert!(!labels.values().any(|v| v.contains("team")));
        // rmcp's half of a record names no tenant: it is not counted yet.
        let half = metadata(&SharedSession::default(), 1);
        assert!(!half.labels.unwrap().contains_key(TENANT_LABEL));
        let created = ObjectMeta {
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_millisecond(5000).unwrap(),
            )),
            ..ObjectMeta::default()
        };
        assert_eq!(last_use(&created), 5000);
        assert_eq!(last_use(&ObjectMeta::default()), 0);
    }

    #[test]
    fn a_huge_initialize_is_not_recorded() {
        let record = SharedSession {
            principal: None,
            initialize: Some(serde_json::json!({"x": "y".repeat(MAX_INITIALIZE_BYTES)})),
        };
        assert!(data(&record).unwrap_err().contains("at most"));
    }
}
