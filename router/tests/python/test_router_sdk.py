"""The unmodified upstream SDK (`k8s-agent-sandbox`) in
`SandboxDirectConnectionConfig` mode, with `api_url` pointing at the real
sandhub-router, which routes by the headers the SDK adds (X-Sandbox-ID,
-Namespace, -Port, -Pod-IP) to a real sandboxd's legacy runtime port.

The SDK's Kubernetes look-ups are answered by a stub (no API server here):
the claim resolves to a Sandbox whose `status.podIPs` is `["127.0.0.1"]`,
which the router accepts because it runs with `--allow-loopback-pod-ip`.
"""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig

from sandhub_testing import LOOPBACK

SANDBOX = "sdk-sandbox"


class StubK8sLookup:
    """Answers the two look-ups `SandboxClient.get_sandbox()` makes; any other fails the test."""

    injected_api_client = None

    def __init__(self, pod_ips: list[str]) -> None:
        self.pod_ips = pod_ips

    def resolve_sandbox_name(self, claim_name: str, namespace: str, timeout: int, resource_version: str | None = None) -> str:
        return SANDBOX

    def get_sandbox(self, name: str, namespace: str) -> dict[str, Any] | None:
        return {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": name, "namespace": namespace, "annotations": {"agents.x-k8s.io/pod-name": name}},
            "status": {
                "podIPs": self.pod_ips,
                "selector": "agents.x-k8s.io/sandbox-name-hash=stub",
                "conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}],
            },
        }

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the SDK called K8sHelper.{name}, which this test does not stub")


@pytest.fixture
def sdk(sandboxd, router):
    seen: list[Any] = []
    config = SandboxDirectConnectionConfig(api_url=router.url, server_port=sandboxd.legacy_port)
    client = SandboxClient(connection_config=config, api_client=kubernetes.client.ApiClient())
    client.k8s_helper = StubK8sLookup([LOOPBACK])
    sandbox = client.get_sandbox("sdk-claim")
    sandbox.connector.session.hooks["response"].append(lambda r, *a, **k: seen.append(r))
    sandbox.seen = seen
    try:
        yield sandbox
    finally:
        sandbox.close_connection()


def test_sdk_through_router_commands(sdk, router):
    result = sdk.commands.run("echo hello via router")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello via router\n", "", 0)
    assert sdk.commands.run("sh -c 'echo oops 1>&2; exit 5'").exit_code == 5
    # The SDK really went through the router with its routing headers.
    req = sdk.seen[0].request
    assert req.url.startswith(router.url)
    assert req.headers["X-Sandbox-ID"] == SANDBOX
    assert req.headers["X-Sandbox-Pod-IP"] == LOOPBACK
    assert router.metric("sandbox_router_requests_total", method="POST", code="200", sandbox_namespace="default") >= 2


def test_sdk_through_router_files(sdk, sandboxd):
    payload = bytes(range(256)) * 40 + b"\x00\r\n"
    sdk.files.write("dir-a/blob.bin", payload)
    assert (sandboxd.root / "dir-a" / "blob.bin").read_bytes() == payload
    assert sdk.files.read("dir-a/blob.bin") == payload
    assert sdk.files.exists("dir-a/blob.bin") is True
    assert sdk.files.exists("dir-a/missing.bin") is False
    names = {e.name for e in sdk.files.list("dir-a")}
    assert names == {"blob.bin"}


def test_sdk_through_router_run_sees_uploaded_file(sdk):
    sdk.files.write("note.txt", b"from the sdk\n")
    assert sdk.commands.run("cat note.txt").stdout == "from the sdk\n"
