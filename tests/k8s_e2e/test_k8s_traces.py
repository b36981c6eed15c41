"""One trace from an MCP `execute_command` down to sandboxd's `Execute`
(issue #30 §5), on the real node: the hub, the controller and the sandboxd
in the Pod each export to one real OTLP/HTTP receiver (the test's, decoding
the real protobufs with `opentelemetry-proto`), and the spans link up:

    caller traceparent → hub POST /mcp → tools/call execute_command → exec
    → hub client /process.v1.ProcessService/* → sandboxd process.v1.ProcessService/*

The Pods reach the receiver on the real node's CNI bridge gateway (10.88.0.1,
an address of this machine: dev/k8s/real-node.sh), through the controller's
`--sandbox-otlp-endpoint`. The sandboxd image is a parameter
(SANDHUB_TEST_TRACES_SANDBOXD_IMAGE, default `sandhub/sandboxd:dev`) so a
branch can test its own build without replacing the shared tag.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sandhub_testing import binary
from sandhub_testing.env import need
from sandhub_testing.hub_k8s import EXT, POOL, Cluster, template, wait_for_pool
from sandhub_testing.k8s import cluster_kubeconfig, install_crds
from sandhub_testing.net import LOOPBACK
from sandhub_testing.procs import stop_process

IMAGE = os.environ.get("SANDHUB_TEST_TRACES_SANDBOXD_IMAGE", "sandhub/sandboxd:dev")
#: The real node's bridge gateway: the host's own address on the pod network.
GATEWAY = "10.88.0.1"


class Receiver:
    """OTLP/HTTP `POST /v1/traces` on `host`; keeps (service, span) pairs."""

    def __init__(self, host: str) -> None:
        self.spans: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                ok = self.path == "/v1/traces"
                if ok:
                    request = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        for rs in request.resource_spans:
                            service = next((a.value.string_value for a in rs.resource.attributes
                                            if a.key == "service.name"), "")
                            for ss in rs.scope_spans:
                                receiver.spans.extend((service, s) for s in ss.spans)
                self.send_response(200 if ok else 404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"

    def trace(self, trace_id: bytes) -> list[tuple[str, Any]]:
        with self.lock:
            return [(svc, s) for svc, s in self.spans if s.trace_id == trace_id]


class Mcp:
    """MCP over streamable HTTP by hand, with extra headers per request."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/mcp"
        self.session = ""
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        self.next_id += 1
        h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
             **(headers or {})}
        if self.session:
            h["mcp-session-id"] = self.session
            h["mcp-protocol-version"] = "2025-06-18"
        r = requests.post(self.url, json={"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                          "params": params}, headers=h, timeout=200)
        assert r.status_code == 200, (r.status_code, r.text)
        self.session = self.session or r.headers["mcp-session-id"]
        for line in r.text.splitlines() if "event-stream" in r.headers["content-type"] else [r.text]:
            body = line[len("data:"):].strip() if line.startswith("data:") else line
            if body.startswith("{"):
                msg = json.loads(body)
                if msg.get("id") == self.next_id:
                    assert "error" not in msg, msg
                    return msg["result"]
        raise AssertionError(f"no answer to {method}: {r.text!r}")

    def open(self) -> None:
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "traces-test", "version": "1"}})
        h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
             "mcp-session-id": self.session, "mcp-protocol-version": "2025-06-18"}
        r = requests.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                          headers=h, timeout=30)
        assert r.status_code == 202, r.text


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[Cluster, Receiver, str]]:
    """A namespace of its own: the pool template on IMAGE, the controller with
    `--sandbox-otlp-endpoint` (and its own `--otlp-endpoint`), and a hub with
    `--otlp-endpoint`, all to one receiver on the bridge gateway."""
    kubeconfig = cluster_kubeconfig()
    need(os.environ.get("SANDHUB_TEST_REAL_NODE") == "1",
         "SANDHUB_TEST_REAL_NODE is not 1 (scripts/test.sh starts the real node as root)")
    try:
        receiver = Receiver(GATEWAY)
    except OSError as e:  # no real node on this machine: no bridge, no address
        need(False, f"cannot listen on the real node's gateway {GATEWAY}: {e}")
        raise
    api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    ns = f"e2e-traces-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    logs = Path(tempfile.mkdtemp(prefix="sandhub-e2e-traces-"))
    key_file = logs / "sandboxd-token-key"
    key_file.write_text(secrets.token_urlsafe(48) + "\n")
    key_file.chmod(0o600)
    signing = logs / "signing-keys"
    signing.write_text(secrets.token_urlsafe(48) + "\n")
    signing.chmod(0o600)
    c = Cluster(kubeconfig=kubeconfig, ns=ns, token_key_file=key_file, signing_key_file=signing,
                logs=logs, api=api)
    before = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # the hub's and controller's batches
    try:
        install_crds(api)
        t = template()
        container = t["spec"]["podTemplate"]["spec"]["containers"][0]
        container["image"] = IMAGE
        container["env"] = [{"name": "OTEL_BSP_SCHEDULE_DELAY", "value": "100"}]
        c.custom.create_namespaced_custom_object(*EXT, ns, "sandboxtemplates", t)
        c.custom.create_namespaced_custom_object(*EXT, ns, "sandboxwarmpools", {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": POOL}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": POOL}},
        })
        c.spawn("controller", [
            str(binary("sandhub-controller")),
            "--extensions", "--leader-elect=false",
            "--watch-namespace", ns, "--kubeconfig", kubeconfig,
            "--metrics-bind-address", f"{LOOPBACK}:0",
            "--health-probe-bind-address", f"{LOOPBACK}:0",
            "--sandboxd-token-key-file", str(key_file),
            "--otlp-endpoint", receiver.endpoint,
            "--sandbox-otlp-endpoint", receiver.endpoint,
        ])
        wait_for_pool(c, 1)
        _, url = c.start_hub("--otlp-endpoint", receiver.endpoint)
        yield c, receiver, url
    finally:
        if before is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = before
        for p in reversed(c.procs):
            stop_process(p)
        receiver.server.shutdown()
        try:
            c.core.delete_namespace(ns)
        except ApiException:
            pass


def test_an_mcp_execute_command_is_one_trace_down_to_sandboxds_execute(
    traced: tuple[Cluster, Receiver, str],
) -> None:
    c, receiver, url = traced
    mcp = Mcp(url)
    mcp.open()
    created = mcp.request("tools/call", {"name": "create_sandbox", "arguments": {"warmpool": POOL}})
    assert not created.get("isError"), created
    name = created["structuredContent"]["sandbox_claim_name"]
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    result = mcp.request(
        "tools/call",
        {"name": "execute_command", "arguments": {"sandbox_claim_name": name, "command": "echo k8s-secret-word"}},
        headers={"traceparent": f"00-{trace_id}-{parent}-01"},
    )
    assert not result.get("isError"), result

    def named(spans: list[tuple[str, Any]], service: str, prefix: str) -> list[Any]:
        return [s for svc, s in spans if svc == service and s.name.startswith(prefix)]

    deadline = time.monotonic() + 60
    while True:
        spans = receiver.trace(bytes.fromhex(trace_id))
        server = named(spans, "sandhub", "POST /mcp")
        tool = named(spans, "sandhub", "tools/call execute_command")
        op = named(spans, "sandhub", "exec")
        calls = named(spans, "sandhub", "/process.v1.ProcessService/")
        daemon = named(spans, "sandboxd", "process.v1.ProcessService/")
        if server and tool and op and calls and daemon:
            break
        assert time.monotonic() < deadline, (
            f"trace incomplete: {[(svc, s.name) for svc, s in spans]}; logs in {c.logs}")
        time.sleep(0.2)
    # One trace, each span's parent the span above it, the caller's at the root.
    assert server[0].parent_span_id == bytes.fromhex(parent)
    assert tool[0].parent_span_id == server[0].span_id
    assert op[0].parent_span_id == tool[0].span_id
    assert all(call.parent_span_id == op[0].span_id for call in calls)
    client_ids = {call.span_id for call in calls}
    assert daemon and all(d.parent_span_id in client_ids for d in daemon)
    for _, s in spans:
        assert b"k8s-secret-word" not in s.SerializeToString(), s.name
    # The controller exported its reconciles too (each a trace of its own).
    with receiver.lock:
        assert any(svc == "sandhub-controller" and s.name.startswith("reconcile ")
                   for svc, s in receiver.spans)
