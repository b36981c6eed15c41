"""Fixtures that run the real `sandboxd` binary on loopback and point the
unmodified upstream Python SDK (`k8s-agent-sandbox`) at it.

The SDK finds a sandbox through the Kubernetes API (SandboxClaim -> Sandbox ->
`status.podIPs`). No API server runs here, so the SDK's Kubernetes helper
object (`k8s_agent_sandbox.k8s_helper.K8sHelper`, held by
`SandboxClient.k8s_helper` and passed on to every `Sandbox`) is replaced by
`StubK8sLookup`, which answers only the two look-ups a handle needs:
`resolve_sandbox_name` (claim -> sandbox name) and `get_sandbox` (the Sandbox
object with `status.podIPs == ["127.0.0.1"]`). Every other helper method fails
the test loudly. Everything below that (SandboxClient.get_sandbox, Sandbox,
SandboxConnector and its connection strategies, CommandExecutor, Filesystem,
the gRPC stubs and the requests session) is the SDK's own code, unmodified.
"""

from __future__ import annotations

import logging
from typing import Any

import kubernetes
import pytest
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import (
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
)
from sandhub_testing import LOOPBACK, Sandboxd
from sandhub_testing.fixtures import sandboxd, sandboxd_bin, sandhub_bin  # noqa: F401 - fixtures

wire_log = logging.getLogger("sdk.wire")

# The daemon's own environment: commands inherit it, and `env=` merges over it.
DAEMON_ENV = {"SANDHUB_TEST_DAEMON_VAR": "from-daemon", "SANDHUB_TEST_OVERRIDE": "daemon-value"}


@pytest.fixture
def sandboxd_env() -> dict[str, str]:
    """Every sandboxd of this suite runs with DAEMON_ENV."""
    return dict(DAEMON_ENV)


# --------------------------------------------------------------------------- SDK side


class StubK8sLookup:
    """Stand-in for the SDK's `K8sHelper` (k8s_agent_sandbox/k8s_helper.py).

    Only answers what `SandboxClient.get_sandbox()` and `Sandbox` read from the
    Kubernetes API: the claim's `status.sandbox.name` (`resolve_sandbox_name`)
    and the Sandbox object (`get_sandbox`), whose `status.podIPs` is
    `["127.0.0.1"]`. Any other helper method fails the test.
    """

    # Read by the SDK's kubectl-based (port-forward) strategies only.
    injected_api_client = None

    def __init__(self, claim_name: str, sandbox_name: str, namespace: str = "default") -> None:
        self.claim_name = claim_name
        self.sandbox_name = sandbox_name
        self.namespace = namespace
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def resolve_sandbox_name(
        self, claim_name: str, namespace: str, timeout: int, resource_version: str | None = None
    ) -> str:
        self.calls.append(("resolve_sandbox_name", (claim_name, namespace)))
        assert (claim_name, namespace) == (self.claim_name, self.namespace)
        return self.sandbox_name

    def get_sandbox(self, name: str, namespace: str) -> dict[str, Any] | None:
        self.calls.append(("get_sandbox", (name, namespace)))
        if (name, namespace) != (self.sandbox_name, self.namespace):
            return None
        return {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {"agents.x-k8s.io/pod-name": name},
            },
            "status": {
                "podIPs": [LOOPBACK],
                "selector": "agents.x-k8s.io/sandbox-name-hash=stub",
                "conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}],
            },
        }

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"StubK8sLookup: the SDK called K8sHelper.{name}, which this test does not stub")


def _log_response(resp: Any, *args: Any, **kwargs: Any) -> None:
    """requests response hook: record each HTTP exchange the SDK makes."""
    req = resp.request
    body = req.body if isinstance(req.body, (bytes, str)) else "<stream>"
    if isinstance(body, bytes) and len(body) > 200:
        body = body[:200] + b"..."
    wire_log.info(
        "%s %s headers=%s body=%r -> %s %s",
        req.method, req.url, dict(req.headers), body, resp.status_code, resp.content[:300],
    )


def _sdk_sandbox(config: Any, claim: str = "stub-claim", sandbox_name: str = "stub-sandbox"):
    # An ApiClient is passed only so the SDK does not look for a kubeconfig;
    # its K8sHelper is then replaced by the stub before any lookup happens.
    client = SandboxClient(connection_config=config, api_client=kubernetes.client.ApiClient())
    stub = StubK8sLookup(claim, sandbox_name)
    client.k8s_helper = stub
    sandbox = client.get_sandbox(claim)  # the SDK's own attach path
    sandbox.connector.session.hooks["response"].append(_log_response)
    return client, stub, sandbox


@pytest.fixture
def sandboxd_mode_sdk(sandboxd: Sandboxd):
    """SDK Sandbox in sandboxd mode: in-cluster-pod-ip, podIPs -> 127.0.0.1, our ports."""
    config = SandboxdInClusterConnectionConfig(
        mode="in-cluster-pod-ip", rest_port=sandboxd.rest_port, grpc_port=sandboxd.grpc_port
    )
    _client, stub, sandbox = _sdk_sandbox(config)
    try:
        yield sandbox
    finally:
        sandbox.close_connection()


@pytest.fixture
def legacy_mode_sdk(sandboxd: Sandboxd):
    """SDK Sandbox in legacy mode: direct connection to the legacy runtime port."""
    config = SandboxDirectConnectionConfig(api_url=sandboxd.legacy_url, server_port=sandboxd.legacy_port)
    _client, stub, sandbox = _sdk_sandbox(config)
    try:
        yield sandbox
    finally:
        sandbox.close_connection()


MODES = ["sandboxd_in_cluster_pod_ip", "legacy_direct"]


@pytest.fixture(params=MODES)
def sdk(request: pytest.FixtureRequest):
    """The SDK Sandbox handle in each connection mode (the mode is the test id)."""
    fixture = "sandboxd_mode_sdk" if request.param == "sandboxd_in_cluster_pod_ip" else "legacy_mode_sdk"
    return request.getfixturevalue(fixture)
