//! Each streamable-HTTP session belongs to whoever opened it.
//!
//! A session is one [`SandhubMcp`](crate::SandhubMcp): its sandboxes, its
//! background processes and their buffered output. rmcp finds it by the
//! `Mcp-Session-Id` header alone, so without this layer anyone who learns a
//! session id (a log line, a proxy) could read that session's process
//! output with their own credentials. Here each session is bound, when it
//! is created, to the principal the provider names for the request (the
//! hub's tenant); a request that carries the id with another principal's
//! credentials gets the very answer an unknown session gets (404), and
//! reaches no tool.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use axum::{
    body::Body,
    http::{Method, Request, StatusCode},
    response::{IntoResponse, Response},
};
use futures::future::BoxFuture;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpService,
};
use tower::ServiceExt;

use crate::{
    provider::SandboxesProvider,
    shared::{SharedSession, SharedSessions},
    SandhubMcp,
};

const SESSION_HEADER: &str = "mcp-session-id";
/// Sessions bound before the first sweep of ended ones.
const FIRST_SWEEP: usize = 64;

/// The tower service the hub nests at `/mcp`: rmcp's streamable HTTP
/// service, with every session bound to the principal that opened it.
pub struct McpService<P> {
    inner: StreamableHttpService<SandhubMcp<P>, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    provider: Arc<P>,
    owners: Arc<Owners>,
    /// Where other replicas find this one's sessions, and it theirs.
    shared: Option<Arc<dyn SharedSessions>>,
}

impl<P> Clone for McpService<P> {
    fn clone(&self) -> Self {
        McpService {
            inner: self.inner.clone(),
            sessions: self.sessions.clone(),
            provider: self.provider.clone(),
            owners: self.owners.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P> McpService<P> {
    pub(crate) fn new(
        inner: StreamableHttpService<SandhubMcp<P>, LocalSessionManager>,
        sessions: Arc<LocalSessionManager>,
        provider: Arc<P>,
        shared: Option<Arc<dyn SharedSessions>>,
    ) -> Self {
        McpService {
            inner,
            sessions,
            provider,
            owners: Arc::default(),
            shared,
        }
    }
}

/// Session id → principal.
struct Owners {
    map: Mutex<HashMap<String, String>>,
    /// Sweep ended sessions once the map reaches this size (doubling, so
    /// sweeps cost O(1) per bind).
    sweep_at: Mutex<usize>,
}

impl Default for Owners {
    fn default() -> Self {
        Owners {
            map: Mutex::default(),
            sweep_at: Mutex::new(FIRST_SWEEP),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain inserts and removes: a panic elsewhere leaves nothing torn.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Owners {
    fn owned_by(&self, session: &str, principal: &str) -> bool {
        lock(&self.map).get(session).map(String::as_str) == Some(principal)
    }

    async fn bind(&self, session: String, principal: String, live: &LocalSessionManager) {
        let len = {
            let mut map = lock(&self.map);
            map.insert(session, principal);
            map.len()
        };
        if len < *lock(&self.sweep_at) {
            return;
        }
        // Sessions rmcp has ended (closed, idle past its keep-alive) go.
        let live: std::collections::HashSet<String> = live
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut map = lock(&self.map);
        map.retain(|id, _| live.contains(id));
        *lock(&self.sweep_at) = (map.len() * 2).max(FIRST_SWEEP);
    }

    fn unbind(&self, session: &str) {
        lock(&self.map).remove(session);
    }
}

/// True when the shared records say `principal` opened session `id`. A
/// store that cannot be read answers no: the session is unknown here.
async fn opened_elsewhere_by(
    shared: Option<&dyn SharedSessions>,
    id: &str,
    principal: &str,
) -> bool {
    let Some(shared) = shared else {
        return false;
    };
    match shared.load(id).await {
        Ok(Some(record)) => record.principal.as_deref() == Some(principal),
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "reading an MCP session's record");
            false
        }
    }
}

/// Exactly what rmcp answers for a session it does not know, so that a
/// foreign session and a missing one cannot be told apart.
fn session_not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// A session ended with DELETE is 200, as upstream's server (FastMCP) answers
/// it; rmcp says 202, which the official Python client reports as a failed
/// termination ("Session termination failed: 202").
fn as_upstream(deleting: bool, mut response: Response) -> Response {
    if deleting && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

impl<P: SandboxesProvider> tower::Service<Request<Body>> for McpService<P> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let principal = self.provider.principal(&parts);
        let session = parts
            .headers
            .get(SESSION_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let deleting = parts.method == Method::DELETE;
        let request = Request::from_parts(parts, body);
        let inner = self.inner.clone();
        let owners = self.owners.clone();
        let sessions = self.sessions.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let Some(principal) = principal else {
                // The provider binds nothing (one fixed client for all).
                let response = inner.oneshot(request).await?;
                return Ok(as_upstream(deleting, response.map(Body::new)));
            };
            if let Some(id) = &session {
                if !owners.owned_by(id, &principal) {
                    // Opened through another replica (or before a restart)?
                    if !opened_elsewhere_by(shared.as_deref(), id, &principal).await {
                        return Ok(session_not_found());
                    }
                    owners.bind(id.clone(), principal.clone(), &sessions).await;
                }
                if let Some(shared) = &shared {
                    shared.touch(id).await;
                }
            }
            let response = inner.oneshot(request).await?;
            match &session {
                // A new session: its answer names it.
                None => {
                    if let Some(id) = response.headers().get(SESSION_HEADER) {
                        let id = String::from_utf8_lossy(id.as_bytes()).into_owned();
                        if let Some(shared) = &shared {
                            let record = SharedSession {
                                principal: Some(principal.clone()),
                                initialize: None,
                            };
                            if let Err(e) = shared.store(&id, &record).await {
                                // The session still works here; other
                                // replicas answer it as unknown.
                                tracing::warn!(error = %e, "recording an MCP session for other replicas");
                            }
                        }
                        owners.bind(id, principal, &sessions).await;
                    }
                }
                Some(id) if deleting && response.status().is_success() => {
                    owners.unbind(id);
                    if let Some(shared) = &shared {
                        if let Err(e) = shared.delete(id).await {
                            tracing::warn!(error = %e, "deleting an ended MCP session's record");
                        }
                    }
                }
                Some(_) => {}
            }
            Ok(as_upstream(deleting, response.map(Body::new)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_belong_to_their_principal_until_unbound() {
        let owners = Owners::default();
        let live = LocalSessionManager::default();
        owners.bind("s1".into(), "alice".into(), &live).await;
        assert!(owners.owned_by("s1", "alice"));
        assert!(!owners.owned_by("s1", "bob"));
        assert!(!owners.owned_by("s2", "alice"));
        owners.unbind("s1");
        assert!(!owners.owned_by("s1", "alice"));
    }

    /// A store in this process's memory: the logic under test is the
    /// binding's, not the store's (the hub's is tested on a real cluster).
    #[derive(Default)]
    struct InMemory(Mutex<HashMap<String, SharedSession>>);

    #[async_trait::async_trait]
    impl SharedSessions for InMemory {
        async fn load(&self, s: &str) -> Result<Option<SharedSession>, String> {
            Ok(lock(&self.0).get(s).cloned())
        }
        async fn store(&self, s: &str, r: &SharedSession) -> Result<(), String> {
            lock(&self.0).insert(s.into(), r.clone());
            Ok(())
        }
        async fn delete(&self, s: &str) -> Result<(), String> {
            lock(&self.0).remove(s);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_session_opened_elsewhere_is_served_only_to_its_principal() {
        let store = InMemory::default();
        store
            .store(
                "s1",
                &SharedSession {
                    principal: Some("alice".into()),
                    initialize: None,
                },
            )
            .await
            .unwrap();
        assert!(opened_elsewhere_by(Some(&store), "s1", "alice").await);
        assert!(!opened_elsewhere_by(Some(&store), "s1", "bob").await);
        assert!(!opened_elsewhere_by(Some(&store), "s2", "alice").await);
        assert!(!opened_elsewhere_by(None, "s1", "alice").await);
        // A record without its principal (half written) opens nothing.
        store.store("s3", &SharedSession::default()).await.unwrap();
        assert!(!opened_elsewhere_by(Some(&store), "s3", "").await);
    }

    #[tokio::test]
    async fn ended_sessions_are_swept_as_the_map_grows() {
        let owners = Owners::default();
        // No session is live in this manager: every sweep empties the map.
        let live = LocalSessionManager::default();
        for i in 0..FIRST_SWEEP - 1 {
            owners.bind(format!("s{i}"), "alice".into(), &live).await;
        }
        assert_eq!(lock(&owners.map).len(), FIRST_SWEEP - 1);
        owners.bind("last".into(), "alice".into(), &live).await;
        assert_eq!(lock(&owners.map).len(), 0);
    }
}
