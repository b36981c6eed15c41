"""The unmodified upstream Python SDK (`k8s-agent-sandbox`) attached to a
sandboxd on loopback. No API server runs, so the SDK's Kubernetes helper is
replaced by `StubK8sLookup`, which answers only the two look-ups a handle
needs (claim -> Sandbox name, and the Sandbox with `status.podIPs ==
["127.0.0.1"]`); everything below is the SDK's own code. Import this module
only where the upstream SDK is installed."""

from __future__ import annotations

import logging
from typing import Any

import kubernetes
from sandhub_testing.net import LOOPBACK
from k8s_agent_sandbox.sandbox_client import SandboxClient

wire_log = logging.getLogger("sdk.wire")


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


def attach_upstream_sdk(
    config: Any, claim: str = "stub-claim", sandbox_name: str = "stub-sandbox"
) -> tuple[SandboxClient[Any], StubK8sLookup, Any]:
    # An ApiClient is passed only so the SDK does not look for a kubeconfig;
    # its K8sHelper is then replaced by the stub before any lookup happens.
    client: SandboxClient[Any] = SandboxClient(connection_config=config, api_client=kubernetes.client.ApiClient())
    stub = StubK8sLookup(claim, sandbox_name)
    client.k8s_helper = stub  # type: ignore[assignment] # duck-typed: the two look-ups a handle needs
    sandbox = client.get_sandbox(claim)  # the SDK's own attach path
    sandbox.connector.session.hooks["response"].append(_log_response)
    return client, stub, sandbox
