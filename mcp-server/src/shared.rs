//! Sessions any replica can serve (issue #28).
//!
//! Behind one Service, a client's next request may reach another replica of
//! the hub. A session is then rebuilt there from its record in a store all
//! replicas share (on Kubernetes, a ConfigMap):
//! - the principal that opened it, so the binding of [`crate::binding`]
//!   holds on every replica: another principal still gets 404;
//! - the client's `initialize` parameters, which rmcp replays to restore
//!   the protocol session without the client noticing ([`RmcpStore`]).
//!
//! What a session owns needs no record: its sandboxes carry a label
//! derived from the session id ([`crate::session`]), the same on every
//! replica. Background processes started through one replica are still
//! that replica's (their buffered output lives in its memory).

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::store::{
    SessionState, SessionStore, SessionStoreError,
};
use serde::{Deserialize, Serialize};

/// One session's record. A field left `None` in a [`SharedSessions::store`]
/// call keeps what is recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SharedSession {
    /// Who opened it ([`crate::SandboxesProvider::principal`]).
    pub principal: Option<String>,
    /// The client's `initialize` parameters, as rmcp hands them over.
    pub initialize: Option<serde_json::Value>,
}

/// A store of session records that every replica reads.
#[async_trait::async_trait]
pub trait SharedSessions: Send + Sync + 'static {
    async fn load(&self, session: &str) -> Result<Option<SharedSession>, String>;
    /// Records the fields of `record` that are set, keeping the others.
    async fn store(&self, session: &str, record: &SharedSession) -> Result<(), String>;
    async fn delete(&self, session: &str) -> Result<(), String>;
    /// The session was used now (records unused for long are swept).
    async fn touch(&self, _session: &str) {}
}

/// rmcp's view of the same records: only their `initialize` part.
pub(crate) struct RmcpStore(pub Arc<dyn SharedSessions>);

fn boxed(e: String) -> SessionStoreError {
    e.into()
}

#[async_trait::async_trait]
impl SessionStore for RmcpStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(record) = self.0.load(session_id).await.map_err(boxed)? else {
            return Ok(None);
        };
        match record.initialize {
            Some(init) => Ok(Some(SessionState::new(serde_json::from_value(init)?))),
            None => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let record = SharedSession {
            principal: None,
            initialize: Some(serde_json::to_value(&state.initialize_params)?),
        };
        self.0.store(session_id, &record).await.map_err(boxed)
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.0.delete(session_id).await.map_err(boxed)
    }
}
