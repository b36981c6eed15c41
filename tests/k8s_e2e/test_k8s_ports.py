"""Sandbox ports on the kubernetes backend (issue #16 A): a server in a real
Pod, reached through the hub's `/v1/sandboxes/{id}/ports/...` by Pod IP
(direct) and through `sandhub-router` with a scoped token, as on the local
backend; the listing reads the Pod's own TCP tables."""

from __future__ import annotations

import secrets
from pathlib import Path

import requests
from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import POOL, Cluster, wait_for_pool

PORT = 8000


def serve_and_fetch(url: str) -> str:
    """A busybox httpd in a pool sandbox, reached through the hub."""
    created = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {"run": "ports"}}, timeout=200)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    body = "hello from the pod " + secrets.token_hex(4) + "\n"
    script = f"printf '%s' '{body}' > /workspace/hello.txt && busybox httpd -p {PORT} -h /workspace"
    r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", script]}, timeout=60)
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

    def listening() -> bool:
        r = requests.get(f"{url}/v1/sandboxes/{sid}/ports", timeout=30)
        assert r.status_code == 200, r.text
        return any(p["port"] == PORT for p in r.json()["ports"])

    wait_for(f"port {PORT} to listen in the Pod", listening, timeout=60)
    r = requests.get(f"{url}/v1/sandboxes/{sid}/ports/{PORT}/hello.txt", timeout=30)
    assert r.status_code == 200, r.text
    assert r.text == body
    # A port nothing listens on is the server's absence, not a hub error.
    r = requests.get(f"{url}/v1/sandboxes/{sid}/ports/9/x", timeout=60)
    assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE", r.text
    # An unknown sandbox is NOT_FOUND.
    r = requests.get(f"{url}/v1/sandboxes/sb-nope/ports/{PORT}/hello.txt", timeout=30)
    assert r.status_code == 404, r.text
    return sid


def test_ports_by_pod_ip(cluster: Cluster):
    hub, url = cluster.start_hub()
    try:
        sid = serve_and_fetch(url)
        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


def test_ports_through_the_router_with_scoped_tokens(cluster: Cluster, tmp_path: Path):
    router, _, hub, url = cluster.start_routed_hub("router-ports", tmp_path)
    try:
        sid = serve_and_fetch(url)
        # Through the router a port carries HTTP, not raw TCP.
        r = requests.get(
            f"{url}/v1/sandboxes/{sid}/port-forward/{PORT}",
            headers={"Connection": "upgrade", "Upgrade": "sandhub-tcp"},
            timeout=30,
        )
        assert r.status_code == 412 and r.json()["code"] == "FAILED_PRECONDITION", r.text
        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
        stop_process(router)
    wait_for_pool(cluster, 2)
