//! MCP over streamable HTTP at `/mcp`: initialize, `create_sandbox`, then
//! `execute_command` of `true`, each a JSON-RPC POST whose answer may come
//! as plain JSON or as an SSE stream of `data:` lines.

use std::time::Instant;

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};

use super::{rest::Series, server::Hub};
use crate::report::Progress;

const PROTOCOL: &str = "2025-06-18";

pub(super) struct Session<'a> {
    http: &'a reqwest::Client,
    url: String,
    id: Option<String>,
    next: u64,
}

impl<'a> Session<'a> {
    /// A new MCP session on the hub at `url` (initialized).
    pub(super) async fn open(http: &'a reqwest::Client, url: &str) -> anyhow::Result<Session<'a>> {
        let mut s = Session {
            http,
            url: format!("{url}/mcp"),
            id: None,
            next: 0,
        };
        s.request(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "sandhub-bench", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
        ensure!(s.id.is_some(), "initialize: no mcp-session-id header");
        s.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(s)
    }
}

impl Session<'_> {
    async fn post(&mut self, body: Value) -> anyhow::Result<reqwest::Response> {
        let mut req = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL);
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        let resp = req.body(body.to_string()).send().await?;
        let status = resp.status();
        if !status.is_success() {
            bail!(
                "POST /mcp: {status}: {}",
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(resp)
    }

    /// One request; the JSON-RPC `result` (an `error` is an error).
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next += 1;
        let id = self.next;
        let resp = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        if self.id.is_none() {
            self.id = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
        }
        let text = resp.text().await?;
        let msg = response(&text, id).with_context(|| format!("{method}: {text}"))?;
        if let Some(e) = msg.get("error") {
            bail!("{method}: {e}");
        }
        Ok(msg["result"].clone())
    }

    pub(super) async fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
    ) -> anyhow::Result<Value> {
        let r = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        ensure!(r["isError"] != true, "{name}: {r}");
        // Structured output when the tool has it, else its JSON text.
        if r["structuredContent"].is_object() {
            return Ok(r["structuredContent"].clone());
        }
        let text = r["content"][0]["text"].as_str().unwrap_or("null");
        Ok(serde_json::from_str(text).unwrap_or(Value::String(text.into())))
    }
}

/// The JSON-RPC response with `id` in a body that is either one JSON
/// message or an SSE stream.
fn response(body: &str, id: u64) -> anyhow::Result<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return Ok(v);
    }
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
            if v["id"] == id {
                return Ok(v);
            }
        }
    }
    bail!("no JSON-RPC response with id {id}")
}

/// `execute_command` of `true`, `n` times after `warmup`, on a sandbox the
/// session creates, over one kept-alive connection as a real client does.
/// Then `n / 4` more calls (at least 1) each on a new TCP connection:
/// Linux ACKs at once early in a connection, so a gap between the two
/// series points at Nagle + delayed ACK on a multi-write (SSE) response.
/// Returns (kept-alive, new connection per call).
pub async fn execute(
    hub: &mut Hub,
    n: u32,
    warmup: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, Series)> {
    let http = hub.http.clone();
    let fresh_http = reqwest::Client::builder()
        .timeout(super::server::CALL_TIMEOUT)
        .pool_max_idle_per_host(0)
        .build()?;
    let mut s = Session::open(&http, &hub.url).await?;
    let created = s.call_tool("create_sandbox", json!({})).await?;
    let id = created["sandbox_claim_name"]
        .as_str()
        .with_context(|| format!("create_sandbox: {created}"))?
        .to_string();
    hub.track_sandbox(id.clone());
    let args = json!({"sandbox_claim_name": id, "command": "true"});
    for _ in 0..warmup {
        s.call_tool("execute_command", args.clone()).await?;
    }
    let mut out = Series {
        samples: Vec::with_capacity(n as usize),
        stopped_early: false,
    };
    let mut progress = Progress::new("mcp execute_command", n.into());
    for done in 1..=n {
        if Instant::now() >= deadline {
            eprintln!("mcp: phase deadline reached after {} samples", done - 1);
            out.stopped_early = true;
            break;
        }
        let t = Instant::now();
        let r = s.call_tool("execute_command", args.clone()).await?;
        out.samples.push(t.elapsed());
        if done == 1 {
            ensure!(
                r.get("exit_code").is_none_or(|c| c == 0),
                "execute_command true: {r}"
            );
        }
        progress.update(done.into());
    }
    s.http = &fresh_http;
    let mut fresh = Series {
        samples: Vec::new(),
        stopped_early: false,
    };
    for _ in 0..(n / 4).max(1) {
        if Instant::now() >= deadline {
            fresh.stopped_early = true;
            break;
        }
        let t = Instant::now();
        s.call_tool("execute_command", args.clone()).await?;
        fresh.samples.push(t.elapsed());
    }
    hub.delete(&id).await?;
    Ok((out, fresh))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_or_sse() {
        assert_eq!(response(r#"{"id":1}"#, 1).unwrap()["id"], 1);
        let sse = "event: message\ndata: {\"id\":0}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n";
        assert_eq!(response(sse, 2).unwrap()["id"], 2);
        assert!(response("data: nope\n", 2).is_err());
    }
}
