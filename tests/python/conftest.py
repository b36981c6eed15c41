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

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import kubernetes
import pytest
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import (
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

wire_log = logging.getLogger("sdk.wire")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def sandboxd_binary() -> Path:
    """SANDBOXD_BIN, else $CARGO_TARGET_DIR/debug/sandboxd, else target/debug/sandboxd."""
    explicit = os.environ.get("SANDBOXD_BIN")
    if explicit:
        return Path(explicit)
    target_dir = os.environ.get("CARGO_TARGET_DIR")
    if target_dir:
        candidate = Path(target_dir)
        if not candidate.is_absolute():
            candidate = REPO_ROOT / candidate
        return candidate / "debug" / "sandboxd"
    return REPO_ROOT / "target" / "debug" / "sandboxd"


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class Sandboxd:
    """One running sandboxd process."""

    proc: subprocess.Popen[bytes]
    root: Path  # the --root-dir (inside `outside`)
    outside: Path  # the root dir's parent: traversal targets land here if confinement fails
    rest_port: int
    grpc_port: int
    legacy_port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def rest_url(self) -> str:
        return f"http://{LOOPBACK}:{self.rest_port}"

    @property
    def legacy_url(self) -> str:
        return f"http://{LOOPBACK}:{self.legacy_port}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    def rest(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """A raw HTTP/1.1 request; `path` goes on the wire exactly as given."""
        conn = http.client.HTTPConnection(LOOPBACK, self.rest_port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()


def _health_ok(port: int) -> bool:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=1)
    try:
        conn.request("GET", "/v1/health")
        resp = conn.getresponse()
        body = resp.read()
        return resp.status == 200 and json.loads(body).get("status") == "ok"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        return None


def _start(binary: Path, base: Path, extra_env: dict[str, str]) -> Sandboxd:
    outside = base / "outside"
    root = outside / "root"
    root.mkdir(parents=True)
    log_path = base / "sandboxd.log"
    last_error = ""
    for attempt in range(3):  # a chosen port may be taken between pick and bind
        rest_port, grpc_port, legacy_port = free_ports(3)
        argv = [
            str(binary),
            "--listen-host", LOOPBACK,
            "--rest-port", str(rest_port),
            "--grpc-port", str(grpc_port),
            "--legacy-port", str(legacy_port),
            "--root-dir", str(root),
            "--shutdown-timeout", "2s",
        ]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.setdefault("NO_COLOR", "1")
        env.update(extra_env)
        with open(log_path, "ab") as log:
            log.write(f"\n=== attempt {attempt}: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=base,
            )
        daemon = Sandboxd(proc, root, outside, rest_port, grpc_port, legacy_port, log_path, extra_env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _health_ok(rest_port) and _port_open(grpc_port) and _port_open(legacy_port):
                return daemon
            time.sleep(0.05)
        rc = proc.poll()
        if rc is None:
            _stop(proc)
            last_error = f"not healthy within {STARTUP_TIMEOUT_S}s"
            break  # running but not serving: retrying with new ports won't help
        last_error = f"exited with code {rc} during startup"
        if "in use" not in daemon.log_tail(20).lower():
            break
    pytest.fail(
        f"sandboxd {last_error}: {binary}\n--- sandboxd log ---\n{daemon.log_tail()}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def sandboxd_bin() -> Path:
    binary = sandboxd_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        msg = (
            f"sandboxd binary not found at {binary} (set SANDBOXD_BIN or build it with "
            "`cargo build -p sandboxd --bin sandboxd`)"
        )
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return binary


# The daemon's own environment: commands inherit it, and `env=` merges over it.
DAEMON_ENV = {"SANDHUB_TEST_DAEMON_VAR": "from-daemon", "SANDHUB_TEST_OVERRIDE": "daemon-value"}


@pytest.fixture
def sandboxd(sandboxd_bin: Path, tmp_path: Path) -> Iterator[Sandboxd]:
    """A fresh sandboxd with its own root dir and free ports; SIGTERM (then kill) after."""
    daemon = _start(sandboxd_bin, tmp_path, DAEMON_ENV)
    try:
        yield daemon
    finally:
        rc = _stop(daemon.proc)
        # Shown by pytest only when the test failed.
        print(f"--- sandboxd exit code: {rc}; log tail ---\n{daemon.log_tail()}")


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


# --------------------------------------------------------------------------- the hub


def sandhub_binary() -> Path:
    """SANDHUB_BIN, else $CARGO_TARGET_DIR/debug/sandhub, else target/debug/sandhub."""
    explicit = os.environ.get("SANDHUB_BIN")
    if explicit:
        return Path(explicit)
    target_dir = os.environ.get("CARGO_TARGET_DIR")
    if target_dir:
        candidate = Path(target_dir)
        if not candidate.is_absolute():
            candidate = REPO_ROOT / candidate
        return candidate / "debug" / "sandhub"
    return REPO_ROOT / "target" / "debug" / "sandhub"


@pytest.fixture(scope="session")
def sandhub_bin() -> Path:
    binary = sandhub_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        msg = (
            f"sandhub binary not found at {binary} (set SANDHUB_BIN or build it with "
            "`cargo build -p sandhub --bin sandhub`)"
        )
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return binary
