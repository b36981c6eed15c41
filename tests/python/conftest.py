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


import pytest
from k8s_agent_sandbox.models import (
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
)
from sandhub_testing import LOOPBACK, Sandboxd
from sandhub_testing.fixtures import sandboxd, sandboxd_bin, sandhub_bin  # noqa: F401 - fixtures
from sandhub_testing.upstream_sdk import attach_upstream_sdk

# The daemon's own environment: commands inherit it, and `env=` merges over it.
DAEMON_ENV = {"SANDHUB_TEST_DAEMON_VAR": "from-daemon", "SANDHUB_TEST_OVERRIDE": "daemon-value"}


@pytest.fixture
def sandboxd_env() -> dict[str, str]:
    """Every sandboxd of this suite runs with DAEMON_ENV."""
    return dict(DAEMON_ENV)


# --------------------------------------------------------------------------- SDK side


@pytest.fixture
def sandboxd_mode_sdk(sandboxd: Sandboxd):
    """SDK Sandbox in sandboxd mode: in-cluster-pod-ip, podIPs -> 127.0.0.1, our ports."""
    config = SandboxdInClusterConnectionConfig(
        mode="in-cluster-pod-ip", rest_port=sandboxd.rest_port, grpc_port=sandboxd.grpc_port
    )
    _client, stub, sandbox = attach_upstream_sdk(config)
    try:
        yield sandbox
    finally:
        sandbox.close_connection()


@pytest.fixture
def legacy_mode_sdk(sandboxd: Sandboxd):
    """SDK Sandbox in legacy mode: direct connection to the legacy runtime port."""
    config = SandboxDirectConnectionConfig(api_url=sandboxd.legacy_url, server_port=sandboxd.legacy_port)
    _client, stub, sandbox = attach_upstream_sdk(config)
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
