//! The streamable-HTTP service mounted the way the hub mounts it: nested in
//! an axum router behind a middleware that authenticates the request. The
//! provider must see what that middleware put on the request, which is how
//! the hub picks the tenant. No hub needed: the provider reports what it
//! saw as its error, and the tool call shows it.

use std::{sync::Arc, time::Duration};

use axum::{extract::Request, middleware::Next, response::Response};
use sandhub_client::{Error, Sandboxes};
use sandhub_mcp::{streamable_http_service, SandboxesProvider};
use serde_json::{json, Value};

#[derive(Clone)]
struct Tenant(String);

/// Fails every call, naming the tenant it was asked for.
struct Probe;

impl SandboxesProvider for Probe {
    fn sandboxes(&self, parts: Option<&http::request::Parts>) -> Result<Arc<dyn Sandboxes>, Error> {
        let tenant = parts
            .and_then(|p| p.extensions.get::<Tenant>())
            .map(|t| t.0.clone())
            .unwrap_or_else(|| "<none>".into());
        Err(Error::unavailable(format!("probe saw tenant={tenant}")))
    }
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Tenant("alice".into()));
    next.run(request).await
}

struct Client {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl Client {
    /// One JSON-RPC message; its answer when it has an id.
    async fn send(&mut self, message: Value) -> Option<Value> {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&message);
        if let Some(s) = &self.session {
            request = request.header("mcp-session-id", s);
        }
        let response = request.send().await.unwrap();
        assert!(
            response.status().is_success(),
            "{message}: HTTP {}",
            response.status()
        );
        if let Some(s) = response.headers().get("mcp-session-id") {
            self.session = Some(s.to_str().unwrap().to_string());
        }
        message.get("id")?;
        let body = response.text().await.unwrap();
        // An SSE stream (or a plain JSON body): the answer is the message
        // carrying our id.
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(std::iter::once(body.as_str()))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id") == message.get("id"))
    }
}

#[tokio::test]
async fn the_provider_sees_what_the_hubs_middleware_put_on_the_request() {
    let app = axum::Router::new()
        .nest_service("/mcp", streamable_http_service(Probe))
        .layer(axum::middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let scenario = async {
        let mut client = Client {
            http: reqwest::Client::new(),
            url: format!("http://{addr}/mcp"),
            session: None,
        };
        let init = client
            .send(json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}
                }
            }))
            .await
            .unwrap();
        assert_eq!(init["result"]["serverInfo"]["name"], "sandhub", "{init}");
        assert!(client.session.is_some(), "no Mcp-Session-Id");
        client
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;

        let listed = client
            .send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            .await
            .unwrap();
        assert!(listed["result"]["tools"].as_array().unwrap().len() >= 16);

        let called = client
            .send(json!({
                "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "list_sandboxes", "arguments": {}}
            }))
            .await
            .unwrap();
        let result = &called["result"];
        assert_eq!(result["isError"], true, "{called}");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("probe saw tenant=alice"), "{text}");

        // Arguments that do not deserialize are a tool error too, naming
        // what is required; the session goes on.
        let called = client
            .send(json!({
                "jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "execute_command", "arguments": {"sandbox_claim_name": "x"}}
            }))
            .await
            .unwrap();
        assert_eq!(called["result"]["isError"], true, "{called}");
        let text = called["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("missing field `command`"), "{text}");
        assert!(
            text.contains("Required arguments: sandbox_claim_name, command"),
            "{text}"
        );

        // Ending the session is 200, as upstream's server answers (not rmcp's
        // 202, which the official Python client logs as a failure); the
        // session is gone after.
        let session = client.session.clone().unwrap();
        let ended = client
            .http
            .delete(&client.url)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await
            .unwrap();
        assert_eq!(ended.status(), reqwest::StatusCode::OK);
        let after = client
            .http
            .post(&client.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
            .send()
            .await
            .unwrap();
        assert_eq!(after.status(), reqwest::StatusCode::NOT_FOUND);
    };
    tokio::time::timeout(Duration::from_secs(30), scenario)
        .await
        .expect("the scenario took longer than 30s");
    server.abort();
}
