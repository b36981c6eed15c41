"""The router against the test API server (SANDHUB_TEST_KUBECONFIG): the Pod
cache (routing by name, by UID, warm-pool exclusion, readiness, namespace
scope, eviction of unreachable Pods), TokenReview authz, and path routing
with a browser session and WebSocket over cache-resolved Pods.

Each test works in a fresh namespace. Pods are never scheduled (their
schedulerName names no scheduler); the test writes their status itself,
with 127.0.0.1 as the Pod IP so the router reaches the test's own backends.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import websocket

from router_harness import mint
from sandhub_testing import LOOPBACK, wait_for
from sandhub_testing.k8s import cluster_kubeconfig

NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL = "agents.x-k8s.io/warm-pool-sandbox"


def name_hash(name: str) -> str:
    h = 0x811C9DC5
    for b in name.encode():
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


@pytest.fixture(scope="module")
def kubeconfig() -> str:
    return cluster_kubeconfig()


@pytest.fixture(scope="module")
def core(kubeconfig):
    import kubernetes
    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    yield kubernetes.client.CoreV1Api(api_client)
    api_client.close()


@pytest.fixture
def ns(core):
    name = f"router-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def make_pod(core, ns: str, name: str, ip: str = LOOPBACK, *, ready: bool = True, sandbox: str | None = None,
             warm: bool = False) -> str:
    labels = {NAME_HASH: name_hash(sandbox or name)}
    if warm:
        labels[WARM_POOL] = name_hash("pool")
    pod = core.create_namespaced_pod(ns, {
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulerName": "sandhub-router-test-no-scheduler",
                 "containers": [{"name": "main", "image": "sandboxd:test"}]},
    })
    core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }})
    return pod.metadata.uid


def cache_router(make_router, kubeconfig, *extra):
    r = make_router("--cache-enabled", "--kubeconfig", kubeconfig, "--cluster-domain", "cluster.invalid",
                    "--upstream-max-retries", "0", *extra)
    wait_for("router /readyz (Pod cache synced)", lambda: readyz(r) == 200)
    return r


def readyz(r) -> int:
    import http.client
    c = http.client.HTTPConnection(LOOPBACK, r.health_port, timeout=5)
    try:
        c.request("GET", "/readyz")
        return c.getresponse().status
    finally:
        c.close()


def execute(r, sandboxd, sandbox_id: str, ns: str, **extra) -> tuple[int, bytes]:
    status, _, body = r.request("POST", "/execute", body=json.dumps({"command": "echo routed"}).encode(), headers={
        "X-Sandbox-ID": sandbox_id, "X-Sandbox-Namespace": ns, "X-Sandbox-Port": str(sandboxd.legacy_port),
        "Content-Type": "application/json", **extra})
    return status, body


def routed(r, sandboxd, sandbox_id, ns, **extra) -> bool:
    status, body = execute(r, sandboxd, sandbox_id, ns, **extra)
    return status == 200 and json.loads(body)["stdout"] == "routed\n"


def test_pod_cache_routes_ready_pods_by_name_uid_and_hash(core, ns, make_router, kubeconfig, sandboxd):
    r = cache_router(make_router, kubeconfig, "--cache-namespace", ns)
    make_pod(core, ns, "box-a")
    wait_for("box-a routed through the cache", lambda: routed(r, sandboxd, "box-a", ns))
    # A Pod whose name differs from its sandbox's is found by the name hash.
    make_pod(core, ns, "pool-x7k2p", sandbox="my-sandbox")
    wait_for("my-sandbox routed by name hash", lambda: routed(r, sandboxd, "my-sandbox", ns))
    # Unclaimed warm-pool Pods are not reachable by name, only by UID.
    warm_uid = make_pod(core, ns, "warm-1", warm=True)
    wait_for("warm Pod by UID", lambda: routed(r, sandboxd, "warm-1", ns, **{"X-Sandbox-UID": warm_uid}))
    assert execute(r, sandboxd, "warm-1", ns)[0] == 502
    # Not Ready: not routed.
    make_pod(core, ns, "not-ready", ready=False)
    time.sleep(1.0)
    assert execute(r, sandboxd, "not-ready", ns)[0] == 502
    # Readiness lost: dropped.
    core.patch_namespaced_pod_status("box-a", ns, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    wait_for("box-a dropped when not Ready", lambda: execute(r, sandboxd, "box-a", ns)[0] == 502)
    # Deleted: dropped.
    core.delete_namespaced_pod("pool-x7k2p", ns, grace_period_seconds=0)
    wait_for("deleted Pod dropped", lambda: execute(r, sandboxd, "my-sandbox", ns)[0] == 502)


def test_pod_cache_namespace_scope(core, ns, make_router, kubeconfig, sandboxd):
    other = f"{ns}-other"
    core.create_namespace({"metadata": {"name": other}})
    try:
        r = cache_router(make_router, kubeconfig, "--cache-namespace", ns)
        make_pod(core, other, "outside")
        make_pod(core, ns, "inside")
        wait_for("inside routed", lambda: routed(r, sandboxd, "inside", ns))
        assert execute(r, sandboxd, "outside", other)[0] == 502
        # Without --cache-namespace every namespace is watched.
        r_all = cache_router(make_router, kubeconfig)
        wait_for("outside routed by a cluster-wide cache", lambda: routed(r_all, sandboxd, "outside", other))
    finally:
        core.delete_namespace(other)


def test_unreachable_pod_is_evicted_refused_is_not(core, ns, make_router, kubeconfig, sandboxd):
    r = cache_router(make_router, kubeconfig, "--cache-namespace", ns, "--upstream-dial-timeout", "300ms")
    # 192.0.2.0/24 (TEST-NET-1) is never routed: the dial times out or is unreachable.
    make_pod(core, ns, "lost", ip="192.0.2.10")
    make_pod(core, ns, "refusing")
    wait_for("refusing routed while sandboxd runs", lambda: routed(r, sandboxd, "refusing", ns))
    status, body = execute(r, sandboxd, "lost", ns)
    assert status == 502, body
    assert r.metric("sandbox_router_cache_invalidations_total") == 1
    sandboxd.proc.terminate()
    sandboxd.proc.wait(timeout=10)
    assert execute(r, sandboxd, "refusing", ns)[0] == 502
    assert execute(r, sandboxd, "refusing", ns)[0] == 502
    assert r.metric("sandbox_router_cache_invalidations_total") == 1


def test_scoped_token_end_to_end_through_the_cache(core, ns, make_router, kubeconfig, sandboxd, secret_file):
    r = cache_router(make_router, kubeconfig, "--cache-namespace", ns, "--authz-mode", "scoped-token",
                     "--authz-scoped-token-secret-file", str(secret_file))
    make_pod(core, ns, "mine")
    make_pod(core, ns, "theirs")
    auth = {"Authorization": f"Bearer {mint(ns, 'mine')}"}
    wait_for("mine routed with its token", lambda: routed(r, sandboxd, "mine", ns, **auth))
    status, body = execute(r, sandboxd, "theirs", ns, **auth)
    assert (status, json.loads(body)["detail"]) == (403, "Token is not valid for this sandbox.")


def test_path_routing_session_and_websocket_over_the_cache(core, ns, make_router, kubeconfig, secret_file,
                                                           ws_echo, http_echo):
    r = cache_router(make_router, kubeconfig, "--cache-namespace", ns, "--path-routing-prefix", "/sandboxes",
                     "--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(secret_file))
    make_pod(core, ns, "ide")
    token = mint(ns, "ide")
    base = f"/sandboxes/{ns}/ide/{http_echo.port}"
    status, h, _ = r.request("GET", f"{base}/app/?x=1&sandbox_token={token}")
    assert status == 303 and h["location"] == f"{base}/app/?x=1"
    cookie = h["set-cookie"].split(";", 1)[0]

    def echo_seen():
        status, _, body = r.request("GET", f"{base}/app/?x=1", headers={"Cookie": f"{cookie}; pref=1"})
        return json.loads(body) if status == 200 else None

    seen = wait_for("path-routed request reaches the backend", echo_seen)
    assert seen["path"] == "/app/?x=1"  # prefix, namespace, id and port stripped
    assert seen["headers"]["cookie"] == "pref=1"  # the session cookie stays with the router
    # A cookie's Path covers one port, so the WebSocket port gets its own session.
    ws_base = f"/sandboxes/{ns}/ide/{ws_echo.port}"
    status, h, _ = r.request("GET", f"{ws_base}/?sandbox_token={token}")
    assert status == 303
    ws_cookie = h["set-cookie"].split(";", 1)[0]
    ws = websocket.create_connection(f"ws://{LOOPBACK}:{r.port}{ws_base}/term", cookie=ws_cookie,
                                     origin=f"http://{LOOPBACK}:{r.port}", timeout=10)
    try:
        ws.send("ls -la")
        assert ws.recv() == "ls -la"
    finally:
        ws.close()
    path, headers = ws_echo.handshakes[-1]
    assert path == "/term"
    assert "origin" not in headers and "sandbox_router_session" not in headers.get("cookie", "")


def service_account_token(core, ns: str, audiences: list[str] | None = None) -> str:
    core.create_namespaced_service_account(ns, {"metadata": {"name": "client"}}) if not _sa_exists(core, ns) else None
    spec = {"expirationSeconds": 600}
    if audiences:
        spec["audiences"] = audiences
    tr = core.create_namespaced_service_account_token("client", ns, {"spec": spec})
    return tr.status.token


def _sa_exists(core, ns: str) -> bool:
    import kubernetes
    try:
        core.read_namespaced_service_account("client", ns)
        return True
    except kubernetes.client.exceptions.ApiException:
        return False


def test_tokenreview_authz(core, ns, make_router, kubeconfig, sandboxd):
    token = service_account_token(core, ns)
    pod_ip = {"X-Sandbox-Pod-IP": LOOPBACK}
    r = make_router("--authz-mode", "tokenreview", "--kubeconfig", kubeconfig, "--allow-loopback-pod-ip")
    assert routed(r, sandboxd, "any", ns, Authorization=f"Bearer {token}", **pod_ip)
    status, body = execute(r, sandboxd, "any", ns, Authorization="Bearer not-a-real-token", **pod_ip)
    assert (status, json.loads(body)["detail"]) == (401, "Invalid token.")
    # Without --authz-tokenreview-require-token a request without a token passes.
    assert routed(r, sandboxd, "any", ns, **pod_ip)
    assert r.metric("sandbox_router_authz_decisions_total", sandbox_namespace=ns, decision="deny") == 1

    strict = make_router("--authz-mode", "tokenreview", "--kubeconfig", kubeconfig, "--allow-loopback-pod-ip",
                         "--authz-tokenreview-require-token", "--authz-tokenreview-audiences", "sandbox-router")
    status, body = execute(strict, sandboxd, "any", ns, **pod_ip)
    assert (status, json.loads(body)["detail"]) == (401, "Missing bearer token.")
    # The default-audience token is not for this audience; a token requested for it is.
    status, _ = execute(strict, sandboxd, "any", ns, Authorization=f"Bearer {token}", **pod_ip)
    assert status == 401
    scoped = service_account_token(core, ns, ["sandbox-router"])
    assert routed(strict, sandboxd, "any", ns, Authorization=f"Bearer {scoped}", **pod_ip)
