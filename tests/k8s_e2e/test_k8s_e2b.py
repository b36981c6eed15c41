"""The E2B-compatible API (`sandhub serve --e2b`) on the kubernetes backend:
a pool sandbox created through E2B's control plane, its envd reached with
its access token, and `set_timeout` moving the claim's deadline so the
controller deletes it then (raw HTTP, as the SDK sends it; the SDK itself is
exercised against the local backend in tests/e2b)."""

from __future__ import annotations

import requests
from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import POOL, Cluster, wait_for_pool

HEADERS = {"x-api-key": "any-key-on-an-open-hub"}


def test_e2b_control_plane_and_deadline_on_the_cluster(cluster: Cluster):
    hub, url = cluster.start_hub("--e2b")
    try:
        r = requests.post(
            f"{url}/v2/sandboxes",
            json={"templateID": POOL, "timeout": 600, "metadata": {"run": "e2b-k8s"}},
            headers=HEADERS,
            timeout=200,
        )
        assert r.status_code == 201, r.text
        created = r.json()
        sid, token = created["sandboxID"], created["envdAccessToken"]
        assert created["envdVersion"] and token

        envd = {"e2b-sandbox-id": sid, "e2b-sandbox-port": "49983", "x-access-token": token}
        r = requests.get(f"{url}/health", headers=envd, timeout=30)
        assert r.status_code == 204, r.text
        r = requests.post(
            f"{url}/filesystem.Filesystem/Stat",
            json={"path": "/workspace"},
            headers={**envd, "content-type": "application/json"},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", r.text

        info = requests.get(f"{url}/sandboxes/{sid}", headers=HEADERS, timeout=30)
        assert info.status_code == 200 and info.json()["state"] == "running", info.text
        assert info.json()["metadata"]["run"] == "e2b-k8s"

        r = requests.post(f"{url}/sandboxes/{sid}/timeout", json={"timeout": 3}, headers=HEADERS, timeout=30)
        assert r.status_code == 204, r.text
        moved = requests.get(f"{url}/sandboxes/{sid}", headers=HEADERS, timeout=30).json()
        assert moved["endAt"] < info.json()["endAt"], (moved, info.json())
        wait_for(
            "the controller to delete the sandbox at its new deadline",
            lambda: requests.get(f"{url}/sandboxes/{sid}", headers=HEADERS, timeout=30).status_code == 404,
            timeout=120,
        )
        r = requests.get(f"{url}/health", headers=envd, timeout=30)
        assert r.status_code == 502 and "was not found" in r.json()["message"], r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)
