//! The tool list as a client sees it: names, schemas and annotations,
//! checked without a hub (listing never reaches one).

use std::sync::Arc;

use sandhub_client::{Error, Sandboxes};
use sandhub_mcp::{SandboxesProvider, SandhubMcp};

/// A provider that is never asked: listing tools needs no sandboxes.
struct Unreachable;

impl SandboxesProvider for Unreachable {
    fn sandboxes(
        &self,
        _parts: Option<&http::request::Parts>,
    ) -> Result<Arc<dyn Sandboxes>, Error> {
        Err(Error::unavailable("no hub in this test"))
    }
}

const UPSTREAM: &[&str] = &[
    "create_sandbox",
    "delete_sandbox",
    "execute_command",
    "upload_file",
    "download_file",
    "list_files",
    "file_exists",
    "get_sandbox_status",
];

const OURS: &[&str] = &[
    "list_sandboxes",
    "start_process",
    "read_process_output",
    "send_process_input",
    "kill_process",
    "reset_sandbox",
    "snapshot_sandbox",
    "watch_directory",
    "expose_port",
    "get_sandbox_metrics",
    "list_volumes",
    "run_code",
];

#[test]
fn every_tool_is_listed_once() {
    let tools = SandhubMcp::new(Unreachable).tools();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    let mut expected: Vec<&str> = UPSTREAM.iter().chain(OURS).copied().collect();
    expected.sort();
    assert_eq!(names, expected);
}

#[test]
fn every_tool_documents_itself_for_a_model() {
    for tool in SandhubMcp::new(Unreachable).tools() {
        let name = tool.name.as_ref();
        let description = tool.description.as_deref().unwrap_or_default();
        assert!(description.len() > 40, "{name}: description too thin");
        let output = tool.output_schema.as_ref().expect(name);
        assert_eq!(
            output.get("type").and_then(|t| t.as_str()),
            Some("object"),
            "{name}"
        );
        let a = tool.annotations.as_ref().expect(name);
        assert!(a.read_only_hint.is_some(), "{name}: readOnlyHint");
        assert!(a.destructive_hint.is_some(), "{name}: destructiveHint");
        assert!(a.idempotent_hint.is_some(), "{name}: idempotentHint");
        assert_eq!(a.open_world_hint, Some(false), "{name}: openWorldHint");
        let props = tool
            .input_schema
            .get("properties")
            .and_then(|p| p.as_object());
        for (param, schema) in props.into_iter().flatten() {
            let described = schema.get("description").and_then(|d| d.as_str());
            assert!(
                described.is_some_and(|d| !d.is_empty() && !d.contains('\n')),
                "{name}.{param} has no one-line description: {schema}"
            );
        }
    }
}

/// `create_sandbox` takes the REST API's `network` (docs/networking.md):
/// the mode alone or the object with its two lists, nothing else.
#[test]
fn create_sandbox_takes_the_network_field_of_the_rest_api() {
    let tools = SandhubMcp::new(Unreachable).tools();
    let tool = tools.iter().find(|t| t.name == "create_sandbox").unwrap();
    let network = &tool.input_schema["properties"]["network"];
    let one_of = network["oneOf"].as_array().expect("network: oneOf");
    assert_eq!(
        one_of[0]["enum"],
        serde_json::json!(["none", "egress", "host"])
    );
    let object = &one_of[1];
    assert_eq!(object["additionalProperties"], false);
    for key in ["mode", "allow_out", "deny_out"] {
        assert!(object["properties"][key].is_object(), "{key}: {network}");
    }
    assert_eq!(object["properties"]["allow_out"]["maxItems"], 256);
    let required = tool.input_schema.get("required").and_then(|r| r.as_array());
    assert!(
        !required.into_iter().flatten().any(|r| r == "network"),
        "network is optional"
    );
}

#[test]
fn upstream_parameter_names_are_kept() {
    let tools = SandhubMcp::new(Unreachable).tools();
    let params = |name: &str| -> Vec<String> {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        tool.input_schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let expect = [
        (
            "create_sandbox",
            &[
                "warmpool",
                "namespace",
                "sandbox_ready_timeout",
                "labels",
                "shutdown_after_seconds",
                "pod_labels",
                "pod_annotations",
            ][..],
        ),
        ("delete_sandbox", &["sandbox_claim_name", "namespace"]),
        (
            "execute_command",
            &["sandbox_claim_name", "namespace", "command", "timeout"],
        ),
        (
            "upload_file",
            &[
                "sandbox_claim_name",
                "namespace",
                "path",
                "content",
                "binary",
                "timeout",
            ],
        ),
        (
            "download_file",
            &[
                "sandbox_claim_name",
                "namespace",
                "path",
                "binary",
                "timeout",
            ],
        ),
        (
            "list_files",
            &[
                "sandbox_claim_name",
                "namespace",
                "path",
                "timeout",
                "max_entries",
            ],
        ),
        (
            "file_exists",
            &["sandbox_claim_name", "namespace", "path", "timeout"],
        ),
        ("get_sandbox_status", &["sandbox_claim_name", "namespace"]),
    ];
    for (tool, names) in expect {
        let have = params(tool);
        for n in names {
            assert!(have.iter().any(|h| h == n), "{tool} lacks {n}: {have:?}");
        }
    }
}

#[test]
fn sessions_differ() {
    let a = SandhubMcp::new(Unreachable);
    let b = SandhubMcp::new(Unreachable);
    assert_ne!(a.session_id(), b.session_id());
}
