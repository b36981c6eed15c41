"""Named volumes on the kubernetes backend (issue #32 §1), end to end on the real node: each
volume a PersistentVolumeClaim of `--volume-storage-class`, mounted by the tenant's templates,
written by one sandbox and read by the next.

The test cluster has no dynamic provisioner, so the test makes the PersistentVolume a
provisioner would (a hostPath directory on the real node, which is this machine, of a class
only this test uses); the API server's own binder binds the hub's claim to it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator

import requests
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sandhub_testing.hub_k8s import EXT, POOL, Cluster


def ok(r: requests.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def run(url: str, sid: str, script: str) -> dict[str, Any]:
    out: dict[str, Any] = ok(requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": script}, timeout=120))
    return out


@contextmanager
def hostpath_pv(cluster: Cluster, prefix: str, mode: int, capacity: str = "64Mi") -> Iterator[tuple[str, str]]:
    """A PersistentVolume of a storage class only this test uses, on a new hostPath directory of
    the real node (this machine) with `mode`, as a provisioner would make it; yields (class,
    directory). At the end the claims of that class, the volume and the directory go."""
    tag = secrets.token_hex(3)
    storage_class = pv = f"{prefix}-{tag}"
    host_dir = tempfile.mkdtemp(prefix="sandhub-pv-")
    os.chmod(host_dir, mode)
    cluster.core.create_persistent_volume(k8s.V1PersistentVolume(
        metadata=k8s.V1ObjectMeta(name=pv),
        spec=k8s.V1PersistentVolumeSpec(
            capacity={"storage": capacity},
            access_modes=["ReadWriteOnce"],
            storage_class_name=storage_class,
            persistent_volume_reclaim_policy="Retain",
            host_path=k8s.V1HostPathVolumeSource(path=host_dir, type="Directory"),
        ),
    ))
    try:
        yield storage_class, host_dir
    finally:
        for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items:
            if c.spec.storage_class_name == storage_class:
                try:
                    cluster.core.delete_namespaced_persistent_volume_claim(c.metadata.name, cluster.ns)
                except ApiException:
                    pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                cluster.core.delete_persistent_volume(pv)
                break
            except ApiException as e:
                if e.status == 404:
                    break
                time.sleep(1)
        shutil.rmtree(host_dir, ignore_errors=True)


def test_a_volume_is_a_claim_written_by_one_sandbox_and_read_by_the_next(cluster: Cluster) -> None:
    with hostpath_pv(cluster, "sandhub-e2e", 0o777) as (storage_class, host_dir):
        _a_volume_written_and_read(cluster, storage_class, host_dir)


def _a_volume_written_and_read(cluster: Cluster, storage_class: str, host_dir: str) -> None:
    tag = secrets.token_hex(3)
    hub, url = cluster.start_hub("--base-template", POOL, "--volume-storage-class", storage_class)
    name = f"vol-{tag}"
    try:
        v = ok(requests.post(f"{url}/v1/volumes", json={"name": "data", "size_mb": 32, "labels": {"k": "v"}},
                             timeout=60), 201)
        assert (v["name"], v["size_mb"], v["labels"], v["access_mode"]) == ("data", 32, {"k": "v"}, "ReadWriteOnce")
        assert ok(requests.get(f"{url}/v1/volumes/data", timeout=60))["name"] == "data"
        assert [x["name"] for x in ok(requests.get(f"{url}/v1/volumes", timeout=60))["volumes"]] == ["data"]
        assert requests.post(f"{url}/v1/volumes", json={"name": "data", "size_mb": 1},
                             timeout=60).status_code == 409
        claims = [c for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items
                  if (c.metadata.labels or {}).get("sandhub.io/volume") == "data"]
        assert len(claims) == 1, claims
        claim = claims[0]
        assert claim.spec.storage_class_name == storage_class
        assert claim.spec.resources.requests["storage"] == "32Mi"
        assert "sandhub.io/tenant" in claim.metadata.labels

        # A template may mount only volumes that exist (its tenant's own).
        r = requests.put(f"{url}/v1/templates/{name}",
                         json={"volumes": [{"name": "nope", "path": "/workspace/x"}]}, timeout=60)
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND"), r.text
        t = ok(requests.put(f"{url}/v1/templates/{name}",
                            json={"volumes": [{"name": "data", "path": "/workspace/data"}]}, timeout=60))
        assert t["volumes"] == [{"name": "data", "path": "/workspace/data", "read_only": False}], t
        ok(requests.put(f"{url}/v1/pools/{name}", json={"template": name, "replicas": 0}, timeout=60))

        a = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": name}, timeout=200), 201)["id"]
        w = run(url, a, "echo kept > /workspace/data/f && cat /workspace/data/f")
        assert (w["exit_code"], w["stdout"]) == (0, "kept\n"), w
        ok(requests.delete(f"{url}/v1/sandboxes/{a}", timeout=120), 204)
        b = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": name}, timeout=200), 201)["id"]
        r2 = run(url, b, "cat /workspace/data/f")
        assert (r2["exit_code"], r2["stdout"]) == (0, "kept\n"), r2
        # The claim's storage is where the files went (the provisioner's side of it).
        with open(os.path.join(host_dir, "f")) as f:
            assert f.read() == "kept\n"

        # The files API with no sandbox of the caller's: through a helper Pod that mounts the
        # claim (made on the first call; later calls reuse it).
        files = f"{url}/v1/volumes/data/files"
        got = requests.get(f"{files}/f", timeout=200)
        assert (got.status_code, got.content) == (200, b"kept\n"), got.text
        assert requests.put(f"{files}/dir/g.txt", data=b"from the api", timeout=60).status_code == 204
        listing = ok(requests.get(f"{files}/dir", timeout=60))
        assert [e["name"] for e in listing["entries"]] == ["g.txt"], listing
        r3 = run(url, b, "cat /workspace/data/dir/g.txt")
        assert r3["stdout"] == "from the api", r3
        # A link planted in the volume that leads out of it is refused, not followed.
        run(url, b, "ln -s /etc/passwd /workspace/data/passwd && ln -s ../../../.. /workspace/data/up")
        for link in ("passwd", "up/etc/passwd"):
            r = requests.get(f"{files}/{link}", timeout=60)
            assert r.status_code in (403, 404), (link, r.status_code, r.text)
            assert b"root:" not in r.content
        assert requests.delete(f"{files}/dir/g.txt", timeout=60).status_code == 204
        assert requests.get(f"{files}/dir/g.txt", timeout=60).status_code == 404
        helpers = [p for p in cluster.core.list_namespaced_pod(cluster.ns).items
                   if "sandhub.io/volume-files" in (p.metadata.labels or {})]
        assert len(helpers) == 1 and helpers[0].spec.active_deadline_seconds == 600, helpers
        # Snapshots need the cluster's VolumeSnapshot CRDs, which this cluster has not.
        r = requests.post(f"{url}/v1/volumes/data/snapshots", json={"name": "s"}, timeout=60)
        assert (r.status_code, r.json()["code"]) == (501, "UNIMPLEMENTED"), r.text

        # Mounted by a template: not deleted under it.
        r = requests.delete(f"{url}/v1/volumes/data", timeout=60)
        assert (r.status_code, r.json()["code"]) == (409, "CONFLICT"), r.text

        ok(requests.delete(f"{url}/v1/sandboxes/{b}", timeout=120), 204)
        ok(requests.delete(f"{url}/v1/pools/{name}", timeout=60), 204)
        ok(requests.delete(f"{url}/v1/templates/{name}", timeout=60), 204)
        ok(requests.delete(f"{url}/v1/volumes/data", timeout=60), 204)
        assert requests.get(f"{url}/v1/volumes/data", timeout=60).status_code == 404
    finally:
        hub.terminate()


def test_volumes_on_a_create_request_get_a_pod_of_their_own(cluster: Cluster) -> None:
    with hostpath_pv(cluster, "sandhub-e2e-req", 0o777) as (storage_class, host_dir):
        _volumes_on_a_create_request(cluster, storage_class, host_dir)


def _volumes_on_a_create_request(cluster: Cluster, storage_class: str, host_dir: str) -> None:
    tag = secrets.token_hex(3)
    hub, url = cluster.start_hub("--base-template", POOL, "--volume-storage-class", storage_class)
    name = f"req-{tag}"
    sandboxes = f"{url}/v1/sandboxes"
    try:
        ok(requests.post(f"{url}/v1/volumes", json={"name": "work", "size_mb": 32}, timeout=60), 201)
        # A template with a warm member, which was made without the volume: the request's
        # sandbox gets a Pod of its own.
        ok(requests.put(f"{url}/v1/templates/{name}", json={}, timeout=60))
        ok(requests.put(f"{url}/v1/pools/{name}", json={"template": name, "replicas": 1}, timeout=60))
        for bad, want in (([{"name": "nope", "path": "/workspace/w"}], (404, "NOT_FOUND")),
                          ([{"name": "work", "path": "/workspace"}], (400, "INVALID_ARGUMENT")),
                          ([{"name": "work", "path": "/proc/w"}], (400, "INVALID_ARGUMENT"))):
            r = requests.post(sandboxes, json={"pool": name, "volumes": bad}, timeout=60)
            assert (r.status_code, r.json()["code"]) == want, (bad, r.text)

        mount = [{"name": "work", "path": "/workspace/work"}]
        a = ok(requests.post(sandboxes, json={"pool": name, "volumes": mount}, timeout=200), 201)
        assert a["launch"] == "cold", a
        w = run(url, a["id"], "echo from-a > /workspace/work/f && cat /workspace/work/f")
        assert (w["exit_code"], w["stdout"]) == (0, "from-a\n"), w
        with open(os.path.join(host_dir, "f")) as f:
            assert f.read() == "from-a\n"
        # Not deleted under the sandbox that mounts it.
        r = requests.delete(f"{url}/v1/volumes/work", timeout=60)
        assert (r.status_code, r.json()["code"]) == (409, "CONFLICT") and a["id"] in r.text, r.text

        # The claim names the volume's claim, signed by the hub for that claim. A claim written
        # by anyone else with the same list (another name, so the signature does not fit) gets
        # no Pod: the controller refuses it.
        obj = cluster.custom.get_namespaced_custom_object(*EXT, cluster.ns, "sandboxclaims", a["id"])
        notes = obj["metadata"]["annotations"]
        listed = json.loads(notes["sandhub.io/volume-mounts"])
        assert [(m["path"], m["read_only"]) for m in listed] == [("/workspace/work", False)], listed
        forged = f"forged-{tag}"
        cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxclaims", {
            "apiVersion": f"{EXT[0]}/{EXT[1]}", "kind": "SandboxClaim",
            "metadata": {"name": forged, "annotations": {
                k: v for k, v in notes.items() if k.startswith("sandhub.io/volume-mounts")}},
            "spec": {"warmPoolRef": obj["spec"]["warmPoolRef"]},
        })
        deadline = time.monotonic() + 60
        reason = None
        while time.monotonic() < deadline and reason != "InvalidMetadata":
            got = cluster.custom.get_namespaced_custom_object(*EXT, cluster.ns, "sandboxclaims", forged)
            ready = [c for c in (got.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
            reason = ready[0]["reason"] if ready else None
            time.sleep(0.5)
        assert reason == "InvalidMetadata", got
        assert "signature" in ready[0]["message"], ready
        cluster.custom.delete_namespaced_custom_object(*EXT, cluster.ns, "sandboxclaims", forged)

        ok(requests.delete(f"{sandboxes}/{a['id']}", timeout=120), 204)
        # The next sandbox reads it, read-only.
        ro = [{"name": "work", "path": "/srv/work", "read_only": True}]
        b = ok(requests.post(sandboxes, json={"pool": name, "volumes": ro}, timeout=200), 201)["id"]
        r2 = run(url, b, "cat /srv/work/f; echo x > /srv/work/g")
        assert r2["stdout"] == "from-a\n" and r2["exit_code"] != 0, r2
        assert not os.path.exists(os.path.join(host_dir, "g"))
        ok(requests.delete(f"{sandboxes}/{b}", timeout=120), 204)
        # Deleted once no claim names it (the claim goes with its sandbox).
        deadline = time.monotonic() + 60
        while (r := requests.delete(f"{url}/v1/volumes/work", timeout=60)).status_code == 409:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.status_code == 204, r.text
        ok(requests.delete(f"{url}/v1/pools/{name}", timeout=60), 204)
        ok(requests.delete(f"{url}/v1/templates/{name}", timeout=60), 204)
    finally:
        hub.terminate()


def test_e2b_volume_content_goes_through_the_helper_pod(cluster: Cluster) -> None:
    """E2B's volume content API on Kubernetes, in raw HTTP as the `e2b` SDK sends it (the SDK
    itself runs against the local backend in tests/e2b): served by the volume's helper Pod."""
    # E2B's create takes no size: such a volume asks for 1024 MiB.
    with hostpath_pv(cluster, "sandhub-e2e-e2b", 0o777, "1Gi") as (storage_class, host_dir):
        _e2b_volume_content(cluster, storage_class, host_dir)


def _e2b_volume_content(cluster: Cluster, storage_class: str, host_dir: str) -> None:
    hub, url = cluster.start_hub("--e2b", "--base-template", POOL, "--volume-storage-class", storage_class)
    key = {"x-api-key": "any-key-on-an-open-hub"}
    try:
        made = ok(requests.post(f"{url}/volumes", json={"name": "e2bdata"}, headers=key, timeout=60), 201)
        base = f"{url}/volumecontent/{made['volumeID']}"
        auth = {"Authorization": f"Bearer {made['token']}"}
        r = requests.get(f"{base}/dir", params={"path": "/"}, headers={"Authorization": "Bearer x"}, timeout=60)
        assert r.status_code == 401, r.text

        d = ok(requests.post(f"{base}/dir", params={"path": "/a/b", "force": "true", "mode": 0o750},
                             headers=auth, timeout=200), 201)
        assert (d["type"], d["path"], d["mode"]) == ("directory", "/a/b", 0o750), d
        # The ids as the Pods see them (the same as the storage's: no user namespace here).
        assert (d["uid"], d["gid"]) == (os.stat(os.path.join(host_dir, "a/b")).st_uid,
                                        os.stat(os.path.join(host_dir, "a/b")).st_gid), d
        r = requests.post(f"{base}/dir", params={"path": "/a/b"}, headers=auth, timeout=60)
        assert r.status_code == 409, r.text
        f = ok(requests.put(f"{base}/file", params={"path": "/a/b/f.txt", "mode": 0o640}, data=b"hello",
                            headers=auth, timeout=60), 201)
        assert (f["type"], f["size"], f["mode"], f["name"]) == ("file", 5, 0o640, "f.txt"), f
        got = requests.get(f"{base}/file", params={"path": "/a/b/f.txt"}, headers=auth, timeout=60)
        assert (got.status_code, got.content) == (200, b"hello"), got.text
        listed = ok(requests.get(f"{base}/dir", params={"path": "/a", "depth": 2}, headers=auth, timeout=60))
        assert [e["path"] for e in listed] == ["/a/b", "/a/b/f.txt"], listed
        assert all(e["mtime"].endswith("Z") and e["ctime"] and e["atime"] for e in listed), listed
        p = ok(requests.patch(f"{base}/path", params={"path": "/a/b/f.txt"}, json={"mode": 0o600},
                              headers=auth, timeout=60))
        assert p["mode"] == 0o600, p
        assert os.stat(os.path.join(host_dir, "a/b/f.txt")).st_mode & 0o7777 == 0o600
        # Links planted in the volume (here straight into its storage) are refused, never followed.
        os.symlink("/etc/passwd", os.path.join(host_dir, "passwd"))
        os.symlink("/etc", os.path.join(host_dir, "etc"))
        for op, params in (("file", {"path": "/passwd"}), ("path", {"path": "/passwd"}),
                           ("file", {"path": "/etc/passwd"})):
            r = requests.get(f"{base}/{op}", params=params, headers=auth, timeout=60)
            assert r.status_code in (403, 404) and b"root:" not in r.content, (op, params, r.text)
        r = requests.patch(f"{base}/path", params={"path": "/passwd"}, json={"mode": 0o777}, headers=auth,
                           timeout=60)
        assert r.status_code in (403, 404), r.text
        assert os.stat("/etc/passwd").st_mode & 0o7777 != 0o777
        assert [e["name"] for e in ok(requests.get(f"{base}/dir", params={"path": "/"}, headers=auth,
                                                   timeout=60))] == ["a"]
        assert requests.delete(f"{base}/path", params={"path": "/a"}, headers=auth, timeout=60).status_code == 204
        r = requests.get(f"{base}/path", params={"path": "/a"}, headers=auth, timeout=60)
        assert (r.status_code, r.json()["code"]) == (404, 404), r.text
        assert os.path.exists("/etc/passwd")
        assert requests.delete(f"{url}/volumes/{made['volumeID']}", headers=key, timeout=60).status_code == 204
    finally:
        hub.terminate()


#: The VolumeSnapshot CRD as the cluster's snapshot controller installs it, reduced to what the API
#: server needs to serve the resource (group, version, kind, scope); the test cluster has no CSI
#: driver or snapshot controller, so nothing acts on the objects: the test checks what the hub asks.
SNAPSHOT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    # A *.k8s.io group needs this annotation; "unapproved, ..." is what a stand-in may say.
    "metadata": {"name": "volumesnapshots.snapshot.storage.k8s.io",
                 "annotations": {"api-approved.kubernetes.io": "unapproved, a test stand-in for the CSI snapshotter's"}},
    "spec": {
        "group": "snapshot.storage.k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "VolumeSnapshot", "plural": "volumesnapshots", "singular": "volumesnapshot",
                  "listKind": "VolumeSnapshotList"},
        "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def _remove_snapshot_crd(ext: k8s.ApiextensionsV1Api) -> None:
    name = SNAPSHOT_CRD["metadata"]["name"]  # type: ignore[index]
    try:
        ext.delete_custom_resource_definition(name)
    except ApiException as e:
        assert e.status == 404, e
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ext.read_custom_resource_definition(name)
        except ApiException as e:
            if e.status == 404:
                return
        time.sleep(0.2)
    raise AssertionError(f"{name} was not deleted in 60 s")


def test_snapshots_are_volume_snapshots_where_the_cluster_has_the_crds(cluster: Cluster) -> None:
    ext = k8s.ApiextensionsV1Api(cluster.api)
    _remove_snapshot_crd(ext)
    hub, url = cluster.start_hub("--base-template", POOL, "--volume-snapshot-class", "e2e-snapclass")
    try:
        ok(requests.post(f"{url}/v1/volumes", json={"name": "snapsrc", "size_mb": 16}, timeout=60), 201)
        # Without the CRDs: UNIMPLEMENTED, naming them.
        r = requests.post(f"{url}/v1/volumes/snapsrc/snapshots", json={"name": "s1"}, timeout=60)
        assert (r.status_code, r.json()["code"]) == (501, "UNIMPLEMENTED") and "VolumeSnapshot" in r.text, r.text

        ext.create_custom_resource_definition(SNAPSHOT_CRD)
        deadline = time.monotonic() + 60
        while not any(c.type == "Established" and c.status == "True"
                      for c in (ext.read_custom_resource_definition(SNAPSHOT_CRD["metadata"]["name"])  # type: ignore[index]
                                .status.conditions or [])):
            assert time.monotonic() < deadline, "the VolumeSnapshot CRD was not established"
            time.sleep(0.2)

        snap = ok(requests.post(f"{url}/v1/volumes/snapsrc/snapshots", json={"name": "s1"}, timeout=60), 201)
        assert (snap["volume"], snap["name"]) == ("snapsrc", "s1") and snap["created_at"], snap
        (obj,) = cluster.custom.list_namespaced_custom_object(
            "snapshot.storage.k8s.io", "v1", cluster.ns, "volumesnapshots")["items"]
        (claim,) = [c for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items
                    if (c.metadata.labels or {}).get("sandhub.io/volume") == "snapsrc"]
        assert obj["spec"] == {"source": {"persistentVolumeClaimName": claim.metadata.name},
                               "volumeSnapshotClassName": "e2e-snapclass"}, obj
        assert obj["metadata"]["labels"]["sandhub.io/tenant"] == claim.metadata.labels["sandhub.io/tenant"]
        r = requests.post(f"{url}/v1/volumes/snapsrc/snapshots", json={"name": "s1"}, timeout=60)
        assert (r.status_code, r.json()["code"]) == (409, "CONFLICT"), r.text
        listed = ok(requests.get(f"{url}/v1/volumes/snapsrc/snapshots", timeout=60))["snapshots"]
        assert [s["name"] for s in listed] == ["s1"], listed

        # A clone is a claim whose dataSource is the VolumeSnapshot, at least the source's size.
        r = requests.post(f"{url}/v1/volumes", json={"name": "small", "size_mb": 8, "from_snapshot": "snapsrc@s1"},
                          timeout=60)
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_ARGUMENT"), r.text
        r = requests.post(f"{url}/v1/volumes", json={"name": "nope", "size_mb": 16, "from_snapshot": "snapsrc@s9"},
                          timeout=60)
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND"), r.text
        ok(requests.post(f"{url}/v1/volumes", json={"name": "snapcopy", "size_mb": 16,
                                                    "from_snapshot": {"volume": "snapsrc", "snapshot": "s1"}},
                         timeout=60), 201)
        (copy,) = [c for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items
                   if (c.metadata.labels or {}).get("sandhub.io/volume") == "snapcopy"]
        source = copy.spec.data_source
        assert (source.api_group, source.kind, source.name) == (
            "snapshot.storage.k8s.io", "VolumeSnapshot", obj["metadata"]["name"]), source

        ok(requests.delete(f"{url}/v1/volumes/snapsrc/snapshots/s1", timeout=60), 204)
        assert ok(requests.get(f"{url}/v1/volumes/snapsrc/snapshots", timeout=60))["snapshots"] == []
        r = requests.delete(f"{url}/v1/volumes/snapsrc/snapshots/s1", timeout=60)
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND"), r.text
        for v in ("snapcopy", "snapsrc"):
            ok(requests.delete(f"{url}/v1/volumes/{v}", timeout=60), 204)
    finally:
        hub.terminate()
        for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items:
            if (c.metadata.labels or {}).get("sandhub.io/volume") in ("snapsrc", "snapcopy"):
                try:
                    cluster.core.delete_namespaced_persistent_volume_claim(c.metadata.name, cluster.ns)
                except ApiException:
                    pass
        _remove_snapshot_crd(ext)


def test_a_shared_volume_is_mounted_read_only_by_another_tenant(cluster: Cluster) -> None:
    with hostpath_pv(cluster, "sandhub-e2e-shared", 0o755) as (storage_class, host_dir):
        with open(os.path.join(host_dir, "corpus.txt"), "w") as f:
            f.write("shared data\n")
        _a_shared_volume_read(cluster, storage_class, host_dir)


def _a_shared_volume_read(cluster: Cluster, storage_class: str, host_dir: str) -> None:
    tag = secrets.token_hex(3)
    keys = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
    keys_file = os.path.join(host_dir + "-keys")
    with open(keys_file, "w") as f:
        f.write("".join(f"{k} {t}\n" for t, k in keys.items()))
    os.chmod(keys_file, 0o600)
    alice, bob = ({"Authorization": f"Bearer {keys[t]}"} for t in ("alice", "bob"))
    hub, url = cluster.start_hub("--api-keys-file", keys_file, "--base-template", POOL,
                                 "--volume-storage-class", storage_class, "--shared-volume", "alice/dataset")
    name = f"reader-{tag}"
    try:
        ok(requests.post(f"{url}/v1/volumes", json={"name": "dataset", "size_mb": 32}, headers=alice, timeout=60), 201)
        # Bob has no volume of that name: he mounts alice's, read-only only.
        writable = {"volumes": [{"name": "dataset", "path": "/workspace/ds"}]}
        r = requests.put(f"{url}/v1/templates/{name}", json=writable, headers=bob, timeout=60)
        assert (r.status_code, r.json()["code"]) == (403, "PERMISSION_DENIED"), r.text
        # Bob does not see it as his: it is not listed, and its files are not his.
        assert ok(requests.get(f"{url}/v1/volumes", headers=bob, timeout=60))["volumes"] == []
        assert requests.get(f"{url}/v1/volumes/dataset", headers=bob, timeout=60).status_code == 404
        mount = {"volumes": [{"name": "dataset", "path": "/workspace/ds", "read_only": True}]}
        t = ok(requests.put(f"{url}/v1/templates/{name}", json=mount, headers=bob, timeout=60))
        assert t["volumes"] == mount["volumes"], t
        (obj,) = [x for x in cluster.custom.list_namespaced_custom_object(
            *EXT, cluster.ns, "sandboxtemplates")["items"]
            if x["metadata"]["name"].startswith(f"{name}-")]
        (claim,) = [c for c in cluster.core.list_namespaced_persistent_volume_claim(cluster.ns).items
                    if (c.metadata.labels or {}).get("sandhub.io/volume") == "dataset"]
        (vol,) = [v for v in obj["spec"]["podTemplate"]["spec"]["volumes"] if v["name"].startswith("sandhub-volume-")]
        assert vol["persistentVolumeClaim"] == {"claimName": claim.metadata.name, "readOnly": True}, vol

        ok(requests.put(f"{url}/v1/pools/{name}", json={"template": name, "replicas": 0}, headers=bob, timeout=60))
        sid = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": name}, headers=bob, timeout=200), 201)["id"]
        out = ok(requests.post(f"{url}/v1/sandboxes/{sid}/exec", headers=bob, timeout=120,
                               json={"command": "cat /workspace/ds/corpus.txt; echo x > /workspace/ds/y"}))
        assert out["stdout"] == "shared data\n" and out["exit_code"] != 0, out
        assert "Read-only" in out["stderr"] or "read-only" in out["stderr"], out
        assert not os.path.exists(os.path.join(host_dir, "y"))
        ok(requests.delete(f"{url}/v1/sandboxes/{sid}", headers=bob, timeout=120), 204)
        ok(requests.delete(f"{url}/v1/pools/{name}", headers=bob, timeout=60), 204)
        ok(requests.delete(f"{url}/v1/templates/{name}", headers=bob, timeout=60), 204)
    finally:
        hub.terminate()
        os.unlink(keys_file)
