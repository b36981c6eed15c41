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

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api,
};
use sandhub_mcp::{SharedSession, SharedSessions};
use sha2::{Digest, Sha256};

use crate::backend::now_ms;

/// Every record carries this label, so the sweep finds them all.
pub const RECORD_LABEL: &str = "sandhub.io/mcp-session-record";
const PRINCIPAL: &str = "principal";
const INITIALIZE: &str = "initialize.json";
const TOUCHED: &str = "touched-ms";
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
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeMcpSessions {
            api: Api::namespaced(client, namespace),
            touched: Mutex::default(),
        }
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
        let data = data(record)?;
        let patch = serde_json::json!({ "data": data });
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("recording the MCP session: {e}")),
        }
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.clone());
        cm.metadata.labels = Some(BTreeMap::from([
            (RECORD_LABEL.to_string(), "true".to_string()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "sandhub-hub".to_string(),
            ),
        ]));
        cm.data = Some(data);
        match self.api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            // rmcp and the binding layer record one session at once: the
            // other made it first, so merge into theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => self
                .api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| format!("recording the MCP session: {e}")),
            Err(e) => Err(format!("recording the MCP session: {e}")),
        }
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
        let patch = serde_json::json!({"data": {TOUCHED: now_ms().to_string()}});
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

    #[test]
    fn a_huge_initialize_is_not_recorded() {
        let record = SharedSession {
            principal: None,
            initialize: Some(serde_json::json!({"x": "y".repeat(MAX_INITIALIZE_BYTES)})),
        };
        assert!(data(&record).unwrap_err().contains("at most"));
    }
}
