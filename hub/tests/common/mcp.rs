//! A minimal MCP client over the hub's real streamable-HTTP endpoint
//! (`/mcp`): JSON-RPC over POST, answers read from the SSE stream.

use serde_json::{json, Value};

use super::WAIT;

pub const PROTOCOL_VERSION: &str = "2025-11-25";

pub struct McpClient {
    http: reqwest::Client,
    url: String,
    /// Bearer key sent with every request.
    pub key: Option<String>,
    /// The `Mcp-Session-Id` the hub gave (sent with every later request).
    pub session: Option<String>,
    /// More headers for every later request (a `traceparent`, say).
    pub headers: Vec<(&'static str, String)>,
    next_id: u64,
}

/// One HTTP exchange: status and body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The JSON-RPC message carrying `id`, from an SSE stream or a JSON body.
    pub fn message(&self, id: u64) -> Option<Value> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(std::iter::once(self.body.as_str()))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id") == Some(&json!(id)))
    }
}

impl McpClient {
    /// A new session: `initialize`, then `notifications/initialized`.
    pub async fn connect(hub_url: &str, key: Option<&str>) -> McpClient {
        let mut c = McpClient {
            http: reqwest::Client::builder().timeout(WAIT).build().unwrap(),
            url: format!("{hub_url}/mcp"),
            key: key.map(str::to_string),
            session: None,
            headers: Vec::new(),
            next_id: 1,
        };
        let init = c
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "hub-test", "version": "0"}
                }),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "sandhub", "{init}");
        assert!(c.session.is_some(), "no Mcp-Session-Id");
        let a = c
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!((200..300).contains(&a.status), "initialized: {}", a.body);
        c
    }

    /// POSTs one JSON-RPC message as given.
    pub async fn post(&mut self, message: &Value) -> Answer {
        self.post_raw(message.to_string()).await
    }

    /// POSTs a body exactly as given (it need not be valid JSON).
    pub async fn post_raw(&mut self, body: String) -> Answer {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(body);
        if let Some(k) = &self.key {
            request = request.bearer_auth(k);
        }
        if let Some(s) = &self.session {
            request = request.header("mcp-session-id", s);
        }
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.expect("the MCP request got no answer");
        if self.session.is_none() {
            if let Some(s) = response.headers().get("mcp-session-id") {
                self.session = Some(s.to_str().unwrap().to_string());
            }
        }
        Answer {
            status: response.status().as_u16(),
            body: response.text().await.unwrap(),
        }
    }

    /// A JSON-RPC request whose HTTP exchange must succeed; its answer.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let a = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert!(
            (200..300).contains(&a.status),
            "{method}: HTTP {}: {}",
            a.status,
            a.body
        );
        a.message(id)
            .unwrap_or_else(|| panic!("{method}: no answer in {}", a.body))
    }

    /// `tools/call`; the tool's result (`isError` set on failure).
    pub async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        answer
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{tool}: not a result: {answer}"))
    }

    /// A tool call that must succeed; its structured result.
    pub async fn call_ok(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments.clone()).await;
        assert_ne!(
            result["isError"], true,
            "{tool}({arguments}) failed: {result}"
        );
        result["structuredContent"].clone()
    }
}

/// The text a tool result shows the model.
pub fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
