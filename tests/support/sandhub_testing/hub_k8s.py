"""The hub on the kubernetes backend, end to end on the real test cluster:
`sandhub serve --backend kubernetes` against our controller, with Pods that
really run sandboxd on the real node (kubelet + containerd + runc, image
`sandhub/sandboxd:dev`). Used by tests/k8s_e2e and bench/k8s_hub.py.

Needs SANDHUB_TEST_KUBECONFIG and SANDHUB_TEST_REAL_NODE=1 (scripts/test.sh
sets both); without them the tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import secrets
import subprocess
import tarfile
import tempfile
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from .binaries import binary
from .env import need
from .k8s import cluster_kubeconfig, install_crds
from .net import LOOPBACK, free_port
from .procs import stop_process, wait_for

POOL = "python"
IMAGE = "sandhub/sandboxd:dev"
EXT = ("extensions.agents.x-k8s.io", "v1beta1")
CORE = ("agents.x-k8s.io", "v1beta1")


@dataclass
class Cluster:
    kubeconfig: str
    ns: str
    # The key the controller and the hub derive each Sandbox's own sandboxd
    # token from (--sandboxd-token-key-file); no Pod ever holds it.
    token_key_file: Path
    # The keys every hub replica signs E2B tokens and port links with
    # (--signing-key-file): one file shared by all, as a mounted Secret is.
    signing_key_file: Path
    logs: Path
    api: k8s.ApiClient
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

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
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    # The custom-objects API answers JSON as `object`: these read it as Any.
    def claims(self, label_selector: str = "") -> list[dict[str, Any]]:
        """The namespace's SandboxClaims, those matching `label_selector` if given."""
        listed: Any = self.custom.list_namespaced_custom_object(
            *EXT, self.ns, "sandboxclaims", label_selector=label_selector)
        claims: list[dict[str, Any]] = listed["items"]
        return claims

    def sandboxes(self) -> list[dict[str, Any]]:
        listed: Any = self.custom.list_namespaced_custom_object(*CORE, self.ns, "sandboxes")
        sandboxes: list[dict[str, Any]] = listed["items"]
        return sandboxes

    def pods(self) -> list[Any]:
        return self.core.list_namespaced_pod(self.ns).items

    def claim(self, name: str) -> dict[str, Any]:
        claim: Any = self.custom.get_namespaced_custom_object(*EXT, self.ns, "sandboxclaims", name)
        return dict(claim)

    def pod_of(self, claim_name: str) -> str:
        """The Pod backing a hub sandbox: the claim's Sandbox, through its pod-name annotation."""
        sandbox = self.claim(claim_name)["status"]["sandbox"]["name"]
        sb: Any = self.custom.get_namespaced_custom_object(*CORE, self.ns, "sandboxes", sandbox)
        return str((sb["metadata"].get("annotations") or {}).get("agents.x-k8s.io/pod-name", sandbox))

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        log = open(self.logs / f"{name}.log", "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"), **(env or {}))
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.procs.append(proc)
        return proc

    def start_hub(self, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[Any], str]:
        port = free_port()
        keys = ([] if any(a.startswith("--signing-key-file") for a in extra)
                else ["--signing-key-file", str(self.signing_key_file)])
        proc = self.spawn(
            "hub",
            [
                str(binary("sandhub")),
                "serve",
                "--backend", "kubernetes",
                "--kubeconfig", self.kubeconfig,
                "--namespace", self.ns,
                "--sandboxd-token-key-file", str(self.token_key_file),
                "--listen", f"{LOOPBACK}:{port}",
                *keys,
                *extra,
            ],
            env=env,
        )
        url = f"http://{LOOPBACK}:{port}"

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"hub exited with {proc.returncode}; see {self.logs}/hub.log")
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                return bool(r.status == 200)

        wait_for("the hub to answer /readyz", ready, timeout=30)
        return proc, url

    def start_router(self, name: str, *extra: str) -> tuple[subprocess.Popen[Any], str]:
        """`sandhub-router` with its Pod cache on this namespace, plus `extra`
        flags; returns once it answers /healthz, with its URL."""
        port = free_port()
        proc = self.spawn(name, [
            str(binary("sandhub-router")),
            "--http-bind-address", f"{LOOPBACK}:{port}",
            "--metrics-bind-address", f"{LOOPBACK}:{free_port()}",
            "--health-probe-bind-address", f"{LOOPBACK}:{free_port()}",
            *extra,
            "--cache-enabled", "--cache-namespace", self.ns,
            "--kubeconfig", self.kubeconfig,
        ])
        url = f"http://{LOOPBACK}:{port}"

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"router exited with {proc.returncode}; see {self.logs}/{name}.log")
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                return bool(r.status == 200)

        wait_for("the router", healthy, timeout=30)
        return proc, url

    def start_routed_hub(
        self, name: str, secret_dir: Path
    ) -> tuple[subprocess.Popen[Any], str, subprocess.Popen[Any], str]:
        """A router in scoped-token mode (a fresh secret under `secret_dir`)
        and a hub that reaches Pods through it: (router, its URL, hub, its URL)."""
        secret = secret_dir / f"{name}-scoped-secret"
        secret.write_bytes(base64.b64encode(secrets.token_bytes(32)))
        router, router_url = self.start_router(
            name,
            "--authz-mode", "scoped-token",
            "--authz-scoped-token-secret-file", str(secret),
        )
        hub, url = self.start_hub(
            "--connect", "router",
            "--router-url", router_url,
            "--router-scoped-token-secret-file", str(secret),
        )
        return router, router_url, hub, url

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


def real_node_ctr(c: Cluster) -> list[str]:
    """`ctr` against the real node's containerd (namespace k8s.io): dev/k8s/cluster.sh
    keeps its socket next to the kubeconfig."""
    sock = Path(c.kubeconfig).parent / "containerd" / "containerd.sock"
    need(sock.exists(), f"the real node's containerd socket {sock} is missing")
    return ["ctr", "--address", str(sock), "-n", "k8s.io"]


def import_layout_image(c: Cluster, layout: Path, ref: str, name: str) -> None:
    """Imports the image `ref` of OCI layout `layout` into the real node's containerd
    as `name` (e.g. docker.io/sandhub/test:amd64): a tar of a layout whose index.json
    holds only that entry, renamed, and the blobs it reaches."""
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [m for m in index["manifests"]
                if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == ref]
    entry = dict(entry, annotations={"io.containerd.image.name": name,
                                     "org.opencontainers.image.ref.name": name})

    def blob(digest: str) -> Path:
        algo, hex_ = digest.split(":", 1)
        return layout / "blobs" / algo / hex_

    digests = [entry["digest"]]
    manifest = json.loads(blob(entry["digest"]).read_text())
    digests += [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", (layout / "oci-layout").read_bytes())
        add("index.json", json.dumps(dict(index, manifests=[entry])).encode())
        for d in digests:
            add("blobs/" + d.replace(":", "/"), blob(d).read_bytes())
    subprocess.run([*real_node_ctr(c), "images", "import", "-"], input=buf.getvalue(),
                   check=True, capture_output=True, timeout=300)


def template(name: str = POOL) -> dict[str, Any]:
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


@contextmanager
def apiserver_cluster() -> Iterator[Cluster]:
    """A fresh namespace with our CRDs, and no controller, pool or node: for what the hub does
    with API objects alone (templates, webhooks, Leases). Needs only the apiserver (`cluster.sh
    up`, a fake node is enough). Hubs started on it are stopped, the namespace deleted, after."""
    kubeconfig = cluster_kubeconfig()
    api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    ns = f"e2e-api-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    logs = Path(tempfile.mkdtemp(prefix="sandhub-e2e-"))
    key_file = logs / "sandboxd-token-key"
    key_file.write_text(secrets.token_urlsafe(48) + "\n")
    key_file.chmod(0o600)
    signing_key_file = logs / "signing-keys"
    signing_key_file.write_text(secrets.token_urlsafe(48) + "\n")
    signing_key_file.chmod(0o600)
    c = Cluster(kubeconfig=kubeconfig, ns=ns, token_key_file=key_file,
                signing_key_file=signing_key_file, logs=logs, api=api)
    try:
        install_crds(api)
        yield c
    finally:
        for p in reversed(c.procs):
            stop_process(p)
        try:
            c.core.delete_namespace(ns)
        except ApiException:
            pass


@contextmanager
def e2e_cluster() -> Iterator[Cluster]:
    """A fresh namespace with our CRDs, the pool template, a warm pool of 2 and
    the controller, with 2 warm sandboxes Ready; all gone afterwards."""
    kubeconfig = cluster_kubeconfig()
    need(os.environ.get("SANDHUB_TEST_REAL_NODE") == "1",
         "SANDHUB_TEST_REAL_NODE is not 1 (scripts/test.sh starts the real node as root)")
    api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    ns = f"e2e-hub-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    logs = Path(tempfile.mkdtemp(prefix="sandhub-e2e-"))
    key_file = logs / "sandboxd-token-key"
    key_file.write_text(secrets.token_urlsafe(48) + "\n")
    key_file.chmod(0o600)
    signing_key_file = logs / "signing-keys"
    signing_key_file.write_text(secrets.token_urlsafe(48) + "\n")
    signing_key_file.chmod(0o600)
    c = Cluster(kubeconfig=kubeconfig, ns=ns, token_key_file=key_file,
                signing_key_file=signing_key_file, logs=logs, api=api)
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
            str(binary("sandhub-controller")),
            "--extensions", "--leader-elect=false",
            "--watch-namespace", ns, "--kubeconfig", kubeconfig,
            "--metrics-bind-address", f"{LOOPBACK}:0",
            "--health-probe-bind-address", f"{LOOPBACK}:0",
            "--sandboxd-token-key-file", str(key_file),
            # Images here are imported, so a member is Ready in seconds: one still not Ready
            # after a minute failed (test_k8s_events' `pool_start_failed` waits for that).
            "--sandbox-warm-pool-readiness-grace-period", "60s",
        ])
        wait_for_pool(c, 2)
        yield c
    finally:
        for p in reversed(c.procs):
            stop_process(p)
        try:
            c.core.delete_namespace(ns)
        except ApiException:
            pass


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The e2e cluster, once per session (see e2e_cluster)."""
    with e2e_cluster() as c:
        yield c


def wait_for_pool(c: Cluster, ready: int, timeout: float = 180.0) -> None:
    def pool_ready() -> bool:
        pool: Any = c.custom.get_namespaced_custom_object(*EXT, c.ns, "sandboxwarmpools", POOL)
        return bool((pool.get("status") or {}).get("readyReplicas", 0) >= ready)

    wait_for(f"{ready} warm sandboxes Ready in pool {POOL} (logs in {c.logs})", pool_ready, timeout=timeout)
