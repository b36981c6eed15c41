"""Issue #15 on the real cluster: a template with `image:` runs that image in a real Pod
(with sandboxd copied in), and pre-pull runs as DaemonSets that complete on the real
node and go away. Images are pre-loaded into the real node's containerd (there is no
registry), so every Pod pulls `IfNotPresent` from the node's own store."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import pytest
import requests

from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import (
    EXT,
    IMAGE,
    POOL,
    Cluster,
    import_layout_image,
)
from sandhub_testing.registry import TEST_IMAGE_AMD64, test_image_layout

TEST_IMAGE = "docker.io/sandhub/test:amd64"
SANDBOXD_IMAGE = "docker.io/" + IMAGE
TENANT_LABEL = "sandhub.io/tenant"
TIMEOUT = 240


@pytest.fixture(scope="module")
def url(cluster: Cluster):
    t0 = time.monotonic()
    import_layout_image(cluster, test_image_layout(), TEST_IMAGE_AMD64, TEST_IMAGE)
    print(f"imported {TEST_IMAGE} into the real node in {time.monotonic() - t0:.1f}s")
    # Tenants' templates start from the cluster's own template: its node selector and
    # toleration put their Pods on the real node.
    hub, url = cluster.start_hub("--base-template", POOL)
    try:
        yield url
    finally:
        stop_process(hub)


def ok(r: requests.Response, status: int = 200) -> dict:
    assert r.status_code == status, r.text
    return r.json() if r.content else {}


def test_a_template_with_an_image_runs_that_image_with_sandboxd(cluster: Cluster, url: str):
    t0 = time.monotonic()
    spec = {"image": TEST_IMAGE, "env": {"MARK": "k8s"}, "cpu": 1, "memory_mb": 512}
    put = ok(requests.put(f"{url}/v1/templates/pyimg", json=spec, timeout=60))
    assert put == {"name": "pyimg", "network": "none", **spec}, put
    assert ok(requests.get(f"{url}/v1/templates/pyimg", timeout=60)) == put
    listed = {t["name"]: t for t in ok(requests.get(f"{url}/v1/templates", timeout=60))["templates"]}
    assert listed["pyimg"]["image"] == TEST_IMAGE
    # The operator's template runs the sandboxd image itself: no `image` reported.
    assert "image" not in listed[POOL], listed[POOL]

    # On the cluster: the tenant's SandboxTemplate, built on the base's placement.
    (obj,) = [t for t in cluster.custom.list_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates")["items"]
              if t["metadata"]["name"].startswith("pyimg-")]
    assert TENANT_LABEL in obj["metadata"]["labels"]
    pod_spec = obj["spec"]["podTemplate"]["spec"]
    assert pod_spec["nodeSelector"] == {"sandhub.dev/real-node": "true"}
    (main,) = pod_spec["containers"]
    assert main["image"] == TEST_IMAGE and main["command"] == ["/.sandhub/sandboxd"]
    assert pod_spec["initContainers"][0]["image"] == IMAGE

    # Local-only fields are refused here.
    for bad in ({"root_fs": "/srv/x"}, {"seed_dir": "/srv/x"}):
        r = requests.put(f"{url}/v1/templates/bad", json=bad, timeout=60)
        assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT", r.text

    ok(requests.put(f"{url}/v1/pools/pyimg", json={"template": "pyimg", "replicas": 1}, timeout=60))
    sb = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": "pyimg"}, timeout=TIMEOUT), 201)
    assert sb["template"] == "pyimg" and sb["pool"] == "pyimg", sb
    sid = sb["id"]
    print(f"template, pool and a Ready sandbox of {TEST_IMAGE} in {time.monotonic() - t0:.1f}s")
    try:
        pod = cluster.core.read_namespaced_pod(cluster.pod_of(sid), cluster.ns)
        assert pod.spec.node_name == "localhost", pod.spec.node_name
        (status,) = pod.status.container_statuses
        assert status.image.endswith("sandhub/test:amd64"), status.image

        def run(command) -> dict:
            out = ok(requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": command}, timeout=60))
            assert out["exit_code"] == 0, out
            return out

        # The image's files, not the sandboxd image's busybox world.
        assert "app:x:1000:1000" in run("cat /etc/passwd")["stdout"]
        assert run(["/usr/bin/python3", "-c", "print(6*7)"])["stdout"] == "42\n"
        assert run("echo $MARK")["stdout"] == "k8s\n"
        # sandboxd still serves files, in /workspace.
        r = requests.put(f"{url}/v1/sandboxes/{sid}/files/notes/a.txt", data=b"from the hub\n", timeout=60)
        assert r.status_code in (200, 201, 204), r.text
        assert run("cat /workspace/notes/a.txt")["stdout"] == "from the hub\n"
        got = requests.get(f"{url}/v1/sandboxes/{sid}/files/notes/a.txt", timeout=60)
        assert got.status_code == 200 and got.content == b"from the hub\n", got.text
    finally:
        ok(requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=TIMEOUT), 204)
    # A template a pool uses stays; without the pool it goes.
    r = requests.delete(f"{url}/v1/templates/pyimg", timeout=60)
    assert r.status_code == 409 and r.json()["code"] == "CONFLICT", r.text
    ok(requests.delete(f"{url}/v1/pools/pyimg", timeout=60), 204)
    ok(requests.delete(f"{url}/v1/templates/pyimg", timeout=60), 204)
    assert requests.get(f"{url}/v1/templates/pyimg", timeout=60).status_code == 404
    # The operator's template is not the tenant's to change.
    r = requests.put(f"{url}/v1/templates/{POOL}", json={}, timeout=60)
    assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED", r.text


def test_prepull_runs_one_daemonset_per_image_and_deletes_them(cluster: Cluster, url: str):
    apps = cluster.apps
    images = [TEST_IMAGE, SANDBOXD_IMAGE]
    seen: set[str] = set()
    peak = 0
    t0 = time.monotonic()
    # Watch for the DaemonSets while the pre-pull runs (it answers when all are done).
    stop = threading.Event()

    def observe() -> None:
        nonlocal peak
        while not stop.is_set():
            items = apps.list_namespaced_daemon_set(cluster.ns, label_selector="sandhub.io/prepull").items
            seen.update(d.metadata.name for d in items)
            peak = max(peak, len(items))
            time.sleep(0.1)

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    try:
        r = requests.post(f"{url}/v1/images/prepull", json={
            "references": images, "template": POOL, "images_per_pod": 1, "max_parallel": 1,
        }, timeout=TIMEOUT)
    finally:
        stop.set()
        watcher.join()
    result = ok(r)
    print(f"pre-pull of {len(images)} images in {time.monotonic() - t0:.1f}s: {result}")
    assert result["ok"] is True, result
    assert [i["reference"] for i in result["images"]] == images
    assert all(i["ok"] for i in result["images"]), result
    sets = result["daemonsets"]
    assert len(sets) == 2 and [s["images"] for s in sets] == [[i] for i in images]
    for s in sets:
        assert s["completed"] and s["deleted"] and s["nodes"] == 1 and s["ready"] == 1, s
    # Each DaemonSet was there while it ran, one at a time (max_parallel 1).
    assert {s["name"] for s in sets} >= seen and seen, (seen, sets)
    assert peak == 1, peak
    wait_for("the pre-pull DaemonSets to be gone", lambda: not apps.list_namespaced_daemon_set(
        cluster.ns, label_selector="sandhub.io/prepull").items, timeout=60)


def test_prepull_refuses_bad_requests_and_other_tenants_templates(url: str):
    for body, code in [
        ({"references": []}, 400),
        ({"references": ["a b"]}, 400),
        ({"references": ["x:1"], "images_per_pod": 0}, 400),
        ({"references": ["x:1"], "max_parallel": 1000}, 400),
        ({"references": ["x:1"], "template": "no-such-template"}, 404),
    ]:
        r = requests.post(f"{url}/v1/images/prepull", json=body, timeout=60)
        assert r.status_code == code, (body, r.text)
    r = requests.get(f"{url}/v1/images", timeout=60)
    assert r.status_code == 501 and r.json()["code"] == "UNIMPLEMENTED", r.text


def test_templates_and_prepull_are_each_tenants_own(cluster: Cluster, tmp_path: Path):
    keys = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{k} {t}\n" for t, k in keys.items()))
    hub, url = cluster.start_hub("--api-keys-file", str(keys_file), "--base-template", POOL)
    alice, bob = ({"Authorization": f"Bearer {keys[t]}"} for t in ("alice", "bob"))
    try:
        ok(requests.put(f"{url}/v1/templates/mine", json={"image": TEST_IMAGE}, headers=alice, timeout=60))
        # Invisible to bob: not listed, not found, not usable for a pool or a pre-pull.
        assert requests.get(f"{url}/v1/templates/mine", headers=bob, timeout=60).status_code == 404
        names = {t["name"] for t in ok(requests.get(f"{url}/v1/templates", headers=bob, timeout=60))["templates"]}
        assert "mine" not in names and POOL in names
        r = requests.put(f"{url}/v1/pools/p", json={"template": "mine", "replicas": 0}, headers=bob, timeout=60)
        assert r.status_code == 404, r.text
        r = requests.post(f"{url}/v1/images/prepull", json={"references": [TEST_IMAGE], "template": "mine"},
                          headers=bob, timeout=60)
        assert r.status_code == 404, r.text
        assert requests.delete(f"{url}/v1/templates/mine", headers=bob, timeout=60).status_code == 404
        # Bob's own `mine` is another object; alice's stays as she wrote it.
        ok(requests.put(f"{url}/v1/templates/mine", json={"env": {"WHO": "bob"}}, headers=bob, timeout=60))
        assert ok(requests.get(f"{url}/v1/templates/mine", headers=alice, timeout=60))["image"] == TEST_IMAGE
        assert "image" not in ok(requests.get(f"{url}/v1/templates/mine", headers=bob, timeout=60))
        objects = [t["metadata"]["name"] for t in
                   cluster.custom.list_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates")["items"]
                   if t["metadata"]["name"].startswith("mine-")]
        assert len(objects) == 2, objects
        # A replaced template loses what it no longer says (server-side apply, one manager).
        ok(requests.put(f"{url}/v1/templates/mine", json={}, headers=alice, timeout=60))
        assert "image" not in ok(requests.get(f"{url}/v1/templates/mine", headers=alice, timeout=60))
        for who in (alice, bob):
            ok(requests.delete(f"{url}/v1/templates/mine", headers=who, timeout=60), 204)
    finally:
        stop_process(hub)
