//! Traces (issue #30 §5) on the local backend, into a real OTLP/HTTP
//! receiver (`common/otlp.rs` decodes the real protobufs): the hub's span
//! tree for a REST exec and an MCP `execute_command`, under the caller's
//! `traceparent`; a malformed `traceparent` starts a new trace; with no
//! `--otlp-endpoint` nothing connects to a collector at all.
//!
//! On the local backend each sandbox's sandboxd runs in the sandbox's own
//! namespaces and exports nothing, so these traces end at the hub's client
//! span of the sandboxd call; `tests/k8s_e2e/test_k8s_traces.py` follows
//! one into sandboxd's `Execute` on the real node.

mod common;
#[path = "common/otlp.rs"]
mod otlp;

use std::time::Duration;

use common::{mcp::McpClient, HubOptions, TestHub};
use otlp::{OtlpReceiver, Received};
use sandhub_api::hub::CreateSandbox;
use sandhub_client::Sandboxes;
use serde_json::json;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// Spans leave the hub's batch processor every 100 ms here (5 s by default).
/// `RUST_LOG=warn` quiets the logs only: the spans are exported still.
const FAST_EXPORT: &[(&str, &str)] = &[("OTEL_BSP_SCHEDULE_DELAY", "100"), ("RUST_LOG", "warn")];

async fn traced_hub(receiver: &OtlpReceiver) -> TestHub {
    let args: &'static [&'static str] = Box::leak(Box::new([
        "--otlp-endpoint",
        Box::leak(receiver.endpoint().into_boxed_str()),
    ]));
    TestHub::start(HubOptions {
        extra_args: args,
        extra_env: FAST_EXPORT,
        ..HubOptions::default()
    })
    .await
}

fn traceparent(trace_id: &str, parent: &str) -> String {
    format!("00-{trace_id}-{parent}-01")
}

fn hex_of(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn named<'a>(spans: &'a [Received], name: &str) -> Option<&'a Received> {
    spans.iter().find(|s| s.name() == name)
}

fn sandboxd_call(spans: &[Received]) -> Option<&Received> {
    spans
        .iter()
        .find(|s| s.name().starts_with("/process.v1.ProcessService/"))
}

/// No span of the trace names the secret in any attribute, event or name.
fn assert_never_mentions(spans: &[Received], secret: &str) {
    for s in spans {
        let dump = format!("{:?}", s.span);
        assert!(
            !dump.contains(secret),
            "span {} carries {secret:?}: {dump}",
            s.name()
        );
    }
}

#[tokio::test]
async fn a_rest_exec_is_one_span_tree_under_the_callers_traceparent() {
    let receiver = OtlpReceiver::start().await;
    let hub = traced_hub(&receiver).await;
    let client = hub.client(None);
    let sandbox = client.create(CreateSandbox::default()).await.unwrap();

    let answer = hub
        .http()
        .post(format!("{}/v1/sandboxes/{}/exec", hub.url(), sandbox.id))
        .header("traceparent", traceparent(TRACE_ID, PARENT_ID))
        .header("tracestate", "vendor=opaque")
        .json(&json!({"command": ["echo", "very-secret-argument"], "env": {"TOKEN": "env-secret-value"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());

    let spans = receiver
        .trace_where(&hex_of(TRACE_ID), |spans| {
            named(spans, "exec").is_some()
                && sandboxd_call(spans).is_some()
                && named(spans, "POST /v1/sandboxes/{id}/exec").is_some()
        })
        .await;
    let server = named(&spans, "POST /v1/sandboxes/{id}/exec").unwrap();
    let op = named(&spans, "exec").unwrap();
    let call = sandboxd_call(&spans).unwrap();
    // The caller's span is the root's parent; each span's parent is the one above.
    assert_eq!(server.span.parent_span_id, hex_of(PARENT_ID));
    assert_eq!(op.span.parent_span_id, server.span.span_id);
    assert_eq!(call.span.parent_span_id, op.span.span_id);
    assert_eq!(call.name(), "/process.v1.ProcessService/Execute");
    // The caller's tracestate travels with the context.
    assert_eq!(server.span.trace_state, "vendor=opaque");
    // Kinds: server at the front door, client toward sandboxd.
    assert_eq!(server.span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(call.span.kind, 3, "SPAN_KIND_CLIENT");
    assert_eq!(
        server.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(op.attr("sandhub.outcome").as_deref(), Some("ok"));
    assert_eq!(op.attr("sandhub.backend").as_deref(), Some("local"));
    for s in &spans {
        assert_eq!(s.service, "sandhub");
    }
    // Neither the command nor env values, nor the sandbox id, reach a span.
    assert_never_mentions(&spans, "very-secret-argument");
    assert_never_mentions(&spans, "env-secret-value");
    assert_never_mentions(&spans, &sandbox.id);
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_trace_of_its_own() {
    let receiver = OtlpReceiver::start().await;
    let hub = traced_hub(&receiver).await;
    let client = hub.client(None);
    let sandbox = client.create(CreateSandbox::default()).await.unwrap();
    let bad_trace = "4bf92f3577b34da6a3ce929d0e0e4737";
    for bad in [
        // uppercase hex, an all-zero parent, a stray suffix, version ff
        format!("00-{}-{PARENT_ID}-01", bad_trace.to_uppercase()),
        format!("00-{bad_trace}-0000000000000000-01"),
        format!("00-{bad_trace}-{PARENT_ID}-01-extra"),
        format!("ff-{bad_trace}-{PARENT_ID}-01"),
    ] {
        let answer = hub
            .http()
            .get(format!("{}/v1/sandboxes/{}", hub.url(), sandbox.id))
            .header("traceparent", &bad)
            .header("tracestate", "x=".repeat(400))
            .send()
            .await
            .unwrap();
        // Ignored, never refused.
        assert_eq!(answer.status(), 200, "{bad}");
    }
    let deadline = tokio::time::Instant::now() + common::WAIT;
    let roots = loop {
        let roots: Vec<Received> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.name() == "GET /v1/sandboxes/{id}")
            .collect();
        if roots.len() >= 4 {
            break roots;
        }
        assert!(tokio::time::Instant::now() < deadline, "got {roots:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for root in roots {
        assert!(root.span.parent_span_id.is_empty(), "{root:?}");
        assert_ne!(root.span.trace_id, hex_of(bad_trace));
        assert_eq!(root.span.trace_state, "");
    }
}

#[tokio::test]
async fn an_mcp_execute_command_is_one_trace_from_the_tool_call_to_the_sandboxd_call() {
    let receiver = OtlpReceiver::start().await;
    let hub = traced_hub(&receiver).await;
    let mut mcp = McpClient::connect(&hub.url(), None).await;
    let created = mcp.call_ok("create_sandbox", json!({})).await;
    let name = created["sandbox_claim_name"].as_str().unwrap().to_string();

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let parent = "b7ad6b7169203331";
    mcp.headers = vec![("traceparent", traceparent(trace_id, parent))];
    mcp.call_ok(
        "execute_command",
        json!({"sandbox_claim_name": name, "command": "echo mcp-secret-text"}),
    )
    .await;

    let spans = receiver
        .trace_where(&hex_of(trace_id), |spans| {
            named(spans, "POST /mcp").is_some()
                && named(spans, "tools/call execute_command").is_some()
                && named(spans, "exec").is_some()
                && sandboxd_call(spans).is_some()
        })
        .await;
    let server = named(&spans, "POST /mcp").unwrap();
    let tool = named(&spans, "tools/call execute_command").unwrap();
    let op = named(&spans, "exec").unwrap();
    let call = sandboxd_call(&spans).unwrap();
    assert_eq!(server.span.parent_span_id, hex_of(parent));
    assert_eq!(tool.span.parent_span_id, server.span.span_id);
    assert_eq!(op.span.parent_span_id, tool.span.span_id);
    assert_eq!(call.span.parent_span_id, op.span.span_id);
    assert_eq!(tool.attr("mcp.tool").as_deref(), Some("execute_command"));
    assert_never_mentions(&spans, "mcp-secret-text");
    assert_never_mentions(&spans, &name);
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_exported_or_even_connected() {
    let receiver = OtlpReceiver::start().await;
    // The standard variables point at the receiver; only the flag turns
    // export on, so these must change nothing.
    let env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            Box::leak(receiver.endpoint().into_boxed_str()),
        ),
    ]));
    let hub = TestHub::start(HubOptions {
        extra_env: env,
        ..HubOptions::default()
    })
    .await;
    let client = hub.client(None);
    let sandbox = client.create(CreateSandbox::default()).await.unwrap();
    let answer = hub
        .http()
        .post(format!("{}/v1/sandboxes/{}/exec", hub.url(), sandbox.id))
        .header("traceparent", traceparent(TRACE_ID, PARENT_ID))
        .json(&json!({"command": ["true"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // Ten export intervals.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(receiver.connections(), 0);
    assert!(receiver.spans().is_empty());
}
