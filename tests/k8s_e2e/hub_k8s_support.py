"""Helpers and the cluster fixture for the end-to-end tests. End-to-end on the real test cluster: `sandhub serve --backend kubernetes`
against our controller, with Pods that really run sandboxd on the real node
(kubelet + containerd + runc, image `sandhub/sandboxd:dev`).

Needs SANDHUB_TEST_KUBECONFIG and SANDHUB_TEST_REAL_NODE=1 (scripts/test.sh
sets both); without them the tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
POOL = "python"
IMAGE = "sandhub/sandboxd:dev"
EXT = ("extensions.agents.x-k8s.io", "v1beta1")
CORE = ("agents.x-k8s.io", "v1beta1")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need(condition: bool, message: str) -> None:
    if not condition:
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


def binary(env: str, name: str) -> Path:
    explicit = os.environ.get(env)
    if explicit:
        path = Path(explicit)
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
        if not target.is_absolute():
            target = REPO_ROOT / target
        path = target / "debug" / name
    need(os.access(path, os.X_OK), f"{name} not found at {path} (cargo build --workspace)")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = 120.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # noqa: BLE001 - keep polling until the deadline
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Cluster:
    kubeconfig: str
    ns: str
    # The key the controller and the hub derive each Sandbox's own sandboxd
    # token from (--sandboxd-token-key-file); no Pod ever holds it.
    token_key_file: Path
    logs: Path
    api: k8s.ApiClient
    procs: list[subprocess.Popen] = field(default_factory=list)

    def sandboxd_token(self, sandbox: str) -> str:
        """Sandbox `sandbox`'s own token, derived as api/src/sandboxd_token.rs does."""
        key = self.token_key_file.read_bytes().rstrip()
        msg = b"".join(part + b"\0" for part in
                       (b"sandhub-sandboxd-token/v1", self.ns.encode(), sandbox.encode()))
        return hmac.new(key, msg, hashlib.sha256).hexdigest()

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def claims(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(*EXT, self.ns, "sandboxclaims")["items"]

    def sandboxes(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(*CORE, self.ns, "sandboxes")["items"]

    def pods(self) -> list:
        return self.core.list_namespaced_pod(self.ns).items

    def claim(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*EXT, self.ns, "sandboxclaims", name)

    def pod_of(self, claim_name: str) -> str:
        """The Pod backing a hub sandbox: the claim's Sandbox, through its pod-name annotation."""
        sandbox = self.claim(claim_name)["status"]["sandbox"]["name"]
        sb = self.custom.get_namespaced_custom_object(*CORE, self.ns, "sandboxes", sandbox)
        return (sb["metadata"].get("annotations") or {}).get("agents.x-k8s.io/pod-name", sandbox)

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.procs.append(proc)
        return proc

    def start_hub(self, *extra: str) -> tuple[subprocess.Popen, str]:
        port = free_port()
        proc = self.spawn(
            "hub",
            [
                str(binary("SANDHUB_BIN", "sandhub")),
                "serve",
                "--backend", "kubernetes",
                "--kubeconfig", self.kubeconfig,
                "--namespace", self.ns,
                "--sandboxd-token-key-file", str(self.token_key_file),
                "--listen", f"{LOOPBACK}:{port}",
                *extra,
            ],
        )
        url = f"http://{LOOPBACK}:{port}"

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"hub exited with {proc.returncode}; see {self.logs}/hub.log")
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                return r.status == 200

        wait_for("the hub to answer /readyz", ready, timeout=30)
        return proc, url

    def hub_leftovers(self) -> list[str]:
        """Claims, Sandboxes and Pods the hub made that are still there."""
        left = [f"claim/{c['metadata']['name']}" for c in self.claims()
                if (c["metadata"].get("labels") or {}).get("agents.x-k8s.io/created-by") == "sandhub"]
        pool_hash = None
        for sb in self.sandboxes():
            labels = sb["metadata"].get("labels") or {}
            if "agents.x-k8s.io/warm-pool-sandbox" not in labels:
                left.append(f"sandbox/{sb['metadata']['name']}")
            pool_hash = pool_hash or labels.get("agents.x-k8s.io/warm-pool-sandbox")
        for pod in self.pods():
            labels = pod.metadata.labels or {}
            if "agents.x-k8s.io/warm-pool-sandbox" not in labels and pod.metadata.deletion_timestamp is None:
                left.append(f"pod/{pod.metadata.name}")
        return left


def install_crds(api: k8s.ApiClient) -> None:
    out = subprocess.run(
        [str(binary("SANDHUB_CONTROLLER_BIN", "sandhub-controller")), "crd"],
        check=True, capture_output=True, text=True,
    ).stdout
    ext = k8s.ApiextensionsV1Api(api)
    for doc in yaml.safe_load_all(out):
        if not doc:
            continue
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as e:
            if e.status != 409:
                raise
            current = ext.read_custom_resource_definition(doc["metadata"]["name"])
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(doc["metadata"]["name"], doc)
    for doc in yaml.safe_load_all(out):
        if doc:
            wait_for(
                f"CRD {doc['metadata']['name']} Established",
                lambda n=doc["metadata"]["name"]: any(
                    c.type == "Established" and c.status == "True"
                    for c in (ext.read_custom_resource_definition(n).status.conditions or [])
                ),
                timeout=30,
            )


def template(name: str = POOL) -> dict:
    """sandboxd with no shared token: the controller gives each Pod the
    digest of its own (SANDBOXD_SANDBOX_TOKEN_SHA256)."""
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            # No NetworkPolicy controller runs in the test cluster.
            "networkPolicyManagement": "Unmanaged",
            "podTemplate": {
                "spec": {
                    "nodeSelector": {"sandhub.dev/real-node": "true"},
                    "tolerations": [{"key": "sandhub.dev/real-node", "operator": "Equal",
                                     "value": "true", "effect": "NoSchedule"}],
                    "containers": [{
                        "name": "sandboxd",
                        "image": IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["--listen-host", "0.0.0.0"],
                        "ports": [{"containerPort": 8080}, {"containerPort": 9090}],
                        "readinessProbe": {"httpGet": {"path": "/v1/health", "port": 8080},
                                           "periodSeconds": 1},
                    }],
                },
            },
        },
    }


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    kubeconfig = os.environ.get("SANDHUB_TEST_KUBECONFIG", "")
    need(bool(kubeconfig), "SANDHUB_TEST_KUBECONFIG is not set (scripts/test.sh starts the test cluster)")
    need(os.environ.get("SANDHUB_TEST_REAL_NODE") == "1",
         "SANDHUB_TEST_REAL_NODE is not 1 (scripts/test.sh starts the real node as root)")
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    ns = f"e2e-hub-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    logs = Path(tempfile.mkdtemp(prefix="sandhub-e2e-"))
    key_file = logs / "sandboxd-token-key"
    key_file.write_text(secrets.token_urlsafe(48) + "\n")
    key_file.chmod(0o600)
    c = Cluster(kubeconfig=kubeconfig, ns=ns, token_key_file=key_file, logs=logs, api=api)
    try:
        install_crds(api)
        c.custom.create_namespaced_custom_object(*EXT, ns, "sandboxtemplates", template())
        c.custom.create_namespaced_custom_object(*EXT, ns, "sandboxwarmpools", {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": POOL},
            "spec": {"replicas": 2, "sandboxTemplateRef": {"name": POOL}},
        })
        c.spawn("controller", [
            str(binary("SANDHUB_CONTROLLER_BIN", "sandhub-controller")),
            "--extensions", "--leader-elect=false",
            "--watch-namespace", ns, "--kubeconfig", kubeconfig,
            "--metrics-bind-address", f"{LOOPBACK}:0",
            "--health-probe-bind-address", f"{LOOPBACK}:0",
            "--sandboxd-token-key-file", str(key_file),
        ])
        wait_for_pool(c, 2)
        yield c
    finally:
        for p in reversed(c.procs):
            stop(p)
        try:
            c.core.delete_namespace(ns)
        except ApiException:
            pass


def wait_for_pool(c: Cluster, ready: int, timeout: float = 180.0) -> None:
    def pool_ready() -> bool:
        pool = c.custom.get_namespaced_custom_object(*EXT, c.ns, "sandboxwarmpools", POOL)
        return (pool.get("status") or {}).get("readyReplicas", 0) >= ready

    wait_for(f"{ready} warm sandboxes Ready in pool {POOL} (logs in {c.logs})", pool_ready, timeout=timeout)
