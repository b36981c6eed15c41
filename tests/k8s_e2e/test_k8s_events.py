"""Lifecycle events on the kubernetes backend (issue #30 §2), on the real node.

Two `sandhub serve --backend kubernetes` replicas derive the events from
their own watches (hub/src/kube/events.rs). The same event has the same id
on both, so a `Last-Event-ID` from one resumes on the other with nothing
missed or repeated, even after the first is killed. Each tenant sees only
its own sandboxes' events; the reasons of `deleted` tell a caller's delete
from a deadline."""

from __future__ import annotations

import json
import queue
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from sandhub_testing import stop_process
from sandhub_testing.hub_k8s import EXT, POOL, Cluster, template, wait_for_pool


class Stream:
    """One `GET /v1/events` read in a thread: its events queue up here."""

    def __init__(self, url: str, headers: dict[str, str], params: dict[str, str] | None = None,
                 last_id: int | None = None) -> None:
        h = dict(headers)
        if last_id is not None:
            h["Last-Event-ID"] = str(last_id)
        self.resp = requests.get(f"{url}/v1/events", headers=h, params=params or {}, stream=True, timeout=(10, 300))
        assert self.resp.status_code == 200, self.resp.text
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        data: list[str] = []
        kind = "message"
        try:
            for line in self.resp.iter_lines(decode_unicode=True):
                if line == "":
                    if data:
                        event = json.loads("\n".join(data))
                        event["_sse"] = kind
                        self.events.put(event)
                    data, kind = [], "message"
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line.startswith("event:"):
                    kind = line[6:].strip()
        except Exception:  # noqa: BLE001 - the stream closed under us
            pass

    def until(self, pred: Any, what: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Events read until one matches `pred` (included)."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {timeout}s; got {got}")
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            got.append(e)
            if pred(e):
                return got

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """What arrives within `seconds`."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(self.events.get(timeout=left))
            except queue.Empty:
                break
        return got

    def close(self) -> None:
        self.resp.close()


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[list[Any], list[str], dict[str, dict[str, str]]]]:
    keys = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{k} {t}\n" for t, k in keys.items()))
    procs, urls = [], []
    for _ in range(2):
        # Tenants' templates start from the pool's (its sandboxd image).
        p, u = cluster.start_hub("--api-keys-file", str(keys_file), "--base-template", POOL)
        procs.append(p)
        urls.append(u)
    try:
        yield procs, urls, {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    finally:
        for p in procs:
            stop_process(p)


def of(sid: str) -> Any:
    return lambda e: e.get("sandbox_id") == sid or e.get("details", {}).get("sandbox_id") == sid


def test_replicas_tell_the_same_events_with_the_same_ids(cluster: Cluster, replicas) -> None:
    (proc_a, _), (url_a, url_b), auth = replicas
    alice, bob = auth["alice"], auth["bob"]
    wait_for_pool(cluster, 1)
    on_a, on_b = Stream(url_a, alice), Stream(url_b, alice)
    bobs = Stream(url_b, bob)
    deletes_only = Stream(url_a, alice, {"type": "deleted"})
    run = secrets.token_hex(4)
    streams = [on_a, on_b, bobs, deletes_only]
    try:
        # A warm sandbox, made through A and deleted through B.
        r = requests.post(f"{url_a}/v1/sandboxes", json={"pool": POOL, "labels": {"run": run}},
                          headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert requests.delete(f"{url_b}/v1/sandboxes/{sid}", headers=alice, timeout=120).status_code == 204

        def gone(e: dict[str, Any]) -> bool:
            return bool(e["type"] == "deleted" and e.get("sandbox_id") == sid)

        seen_a = [e for e in on_a.until(gone, f"deleted of {sid} on A") if of(sid)(e)]
        seen_b = [e for e in on_b.until(gone, f"deleted of {sid} on B") if of(sid)(e)]
        types = [e["type"] for e in seen_a]
        assert types in (["created", "claimed", "ready", "deleted"],
                         ["created", "pool_starved", "ready", "deleted"]), seen_a
        # One story, one set of ids, on both replicas.
        assert [(e["id"], e["type"]) for e in seen_a] == [(e["id"], e["type"]) for e in seen_b]
        ids = [e["id"] for e in seen_a]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        for e in seen_a:
            assert e["tenant"] == "alice", e
            if e["type"] != "pool_starved":
                assert e["labels"] == {"run": run}, e
        assert seen_a[-1]["details"]["reason"] == "by_caller"
        ready = next(e for e in seen_a if e["type"] == "ready")
        assert ready["details"]["launch"] in ("warm", "cold")
        # The type filter.
        got = deletes_only.until(gone, "the filtered stream's deleted")
        assert {e["type"] for e in got} == {"deleted"}, got

        # A reconnect to B with the id A sent last-but-one resumes there:
        # exactly what came after, nothing again.
        resumed = Stream(url_b, alice, last_id=seen_a[-2]["id"])
        streams.append(resumed)
        after = [e for e in resumed.until(gone, "the resumed deleted", timeout=30) if of(sid)(e)]
        assert [e["id"] for e in after] == [seen_a[-1]["id"]], after

        # A deadline: the controller deletes the claim at its shutdownTime.
        r = requests.post(f"{url_b}/v1/sandboxes",
                          json={"pool": POOL, "labels": {"run": run}, "shutdown_after_seconds": 5},
                          headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid2 = r.json()["id"]
        last_a = on_a.until(lambda e: e["type"] == "ready" and e.get("sandbox_id") == sid2, "ready of sid2")[-1]
        # A is killed; its client reconnects to B with the last id A sent.
        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(timeout=30)
        moved = Stream(url_b, alice, last_id=last_a["id"])
        streams.append(moved)
        got = moved.until(lambda e: e["type"] == "deleted" and e.get("sandbox_id") == sid2,
                          "deleted at the deadline", timeout=120)
        assert all(e["id"] > last_a["id"] for e in got), got
        assert [e["type"] for e in got if e.get("sandbox_id") == sid2] == ["deleted"], got
        assert got[-1]["details"]["reason"] == "deadline", got[-1]

        # Bob saw none of alice's sandboxes.
        for e in bobs.quiet(2):
            assert e.get("sandbox_id") not in (sid, sid2), e
            assert e["tenant"] == "bob", e
    finally:
        for s in streams:
            s.close()


def test_bad_filters_ids_and_webhook_fields_are_named(replicas) -> None:
    _, (url, _), auth = replicas
    alice = auth["alice"]
    r = requests.get(f"{url}/v1/events", params={"type": "exploded"}, headers=alice, timeout=30)
    assert r.status_code == 400 and "type" in r.json()["message"], r.text
    r = requests.get(f"{url}/v1/events", headers={**alice, "Last-Event-ID": "x"}, timeout=30)
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["message"], r.text
    # Webhooks work here too (test_k8s_webhooks.py); their fields are checked as locally.
    r = requests.put(f"{url}/v1/webhooks/w", json={"url": "https://example.test/h", "events": ["exploded"],
                                                   "secret": "s" * 32}, headers=alice, timeout=30)
    assert r.status_code == 400 and "events" in r.json()["message"], r.text


def test_an_entrypoints_exit_is_told_once_by_every_replica(cluster: Cluster, replicas) -> None:
    """sandboxd's record of its entrypoint's exit, seen by the replicas' asking and recorded on
    the claim, becomes one `entrypoint_exited` with the same id on every replica; asked again
    and again, it is not told twice."""
    _, (url_a, url_b), auth = replicas
    alice = auth["alice"]
    name = f"ep-{secrets.token_hex(3)}"
    argv = ["/bin/busybox", "sh", "-c", "sleep 1; exit 3"]
    r = requests.put(f"{url_a}/v1/templates/{name}", json={"entrypoint": argv}, headers=alice, timeout=60)
    assert r.status_code == 200, r.text
    r = requests.put(f"{url_a}/v1/pools/{name}", json={"template": name, "replicas": 0}, headers=alice, timeout=60)
    assert r.status_code == 200, r.text
    on_a = Stream(url_a, alice, {"type": "entrypoint_exited"})
    on_b = Stream(url_b, alice, {"type": "entrypoint_exited"})
    try:
        r = requests.post(f"{url_b}/v1/sandboxes", json={"pool": name}, headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        ea = on_a.until(of(sid), "entrypoint_exited on A", timeout=90)[-1]
        eb = on_b.until(of(sid), "entrypoint_exited on B", timeout=30)[-1]
        assert (ea["id"], ea["details"]) == (eb["id"], eb["details"]), (ea, eb)
        assert ea["details"]["exit_code"] == 3 and ea["details"]["state"] == "Error", ea
        assert ea["tenant"] == "alice"
        # Both replicas keep asking (every 5 s): nothing more.
        assert on_a.quiet(12) == [] and on_b.quiet(1) == []
        assert requests.delete(f"{url_a}/v1/sandboxes/{sid}", headers=alice, timeout=120).status_code == 204
    finally:
        on_a.close()
        on_b.close()
        requests.delete(f"{url_a}/v1/pools/{name}", headers=alice, timeout=60)
        requests.delete(f"{url_a}/v1/templates/{name}", headers=alice, timeout=60)


def test_an_oom_kill_in_a_pod_is_told_once_by_every_replica(cluster: Cluster, replicas) -> None:
    """The kernel's OOM kill of a process in a 64 MiB sandbox, counted by its sandboxd and
    recorded on the claim by the first replica to ask, is one `oom_killed` with the same id on
    every replica; asked again and again, it is not told twice."""
    _, (url_a, url_b), auth = replicas
    alice = auth["alice"]
    name = f"oom-{secrets.token_hex(3)}"
    r = requests.put(f"{url_a}/v1/templates/{name}", json={"memory_mb": 64}, headers=alice, timeout=60)
    assert r.status_code == 200, r.text
    r = requests.put(f"{url_a}/v1/pools/{name}", json={"template": name, "replicas": 0}, headers=alice, timeout=60)
    assert r.status_code == 200, r.text
    on_a = Stream(url_a, alice, {"type": "oom_killed"})
    on_b = Stream(url_b, alice, {"type": "oom_killed"})
    try:
        r = requests.post(f"{url_b}/v1/sandboxes", json={"pool": name}, headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        # `tail` keeps every byte of a file with no newline: it grows until the kernel kills it.
        r = requests.post(f"{url_a}/v1/sandboxes/{sid}/exec",
                          json={"command": "/bin/busybox tail /dev/zero", "timeout_seconds": 60},
                          headers=alice, timeout=120)
        assert r.status_code == 200 and r.json()["exit_code"] != 0, r.text
        ea = on_a.until(of(sid), "oom_killed on A", timeout=60)[-1]
        eb = on_b.until(of(sid), "oom_killed on B", timeout=30)[-1]
        assert (ea["id"], ea["details"]) == (eb["id"], eb["details"]), (ea, eb)
        assert ea["details"]["oom_kills"] >= 1 and ea["details"]["new_kills"] >= 1, ea
        assert ea["tenant"] == "alice"
        # The sandbox lives on (only the greedy process died), and both replicas keep asking
        # every 5 s: nothing more.
        r = requests.post(f"{url_b}/v1/sandboxes/{sid}/exec", json={"command": "true"}, headers=alice, timeout=60)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        assert on_a.quiet(12) == [] and on_b.quiet(1) == []
        assert requests.delete(f"{url_a}/v1/sandboxes/{sid}", headers=alice, timeout=120).status_code == 204
    finally:
        on_a.close()
        on_b.close()
        requests.delete(f"{url_a}/v1/pools/{name}", headers=alice, timeout=60)
        requests.delete(f"{url_a}/v1/templates/{name}", headers=alice, timeout=60)


def test_the_rest_of_the_vocabulary_happens_on_the_real_node(cluster: Cluster, replicas) -> None:
    """Each remaining type from a real action on the real node, told alike by both replicas:
    `template_changed` (a tenant's template replaced), `suspended` and `resumed` (the claim's
    Ready going to SandboxSuspended and back), `finished` and `disk_quota_exceeded` (a Pod the
    kubelet evicted past its `ephemeral-storage` limit: written by the fake node, see below), and
    `pool_start_failed` (a pool whose members cannot pull their image are replaced after the
    controller's readiness grace, 60 s in this cluster)."""
    _, (url_a, url_b), auth = replicas
    alice = auth["alice"]
    run = secrets.token_hex(3)
    name, broken, evict = f"disk-{run}", f"nopull-{run}", f"evict-{run}"
    on_a, on_b = Stream(url_a, alice), Stream(url_b, alice)

    def both(pred: Any, what: str, timeout: float = 120.0) -> dict[str, Any]:
        ea = on_a.until(pred, f"{what} on A", timeout=timeout)[-1]
        eb = on_b.until(pred, f"{what} on B", timeout=30)[-1]
        assert (ea["id"], ea["type"], ea["details"]) == (eb["id"], eb["type"], eb["details"]), (ea, eb)
        assert ea["tenant"] == "alice", ea
        return ea

    try:
        r = requests.put(f"{url_a}/v1/templates/{name}", json={"memory_mb": 256}, headers=alice, timeout=60)
        assert r.status_code == 200, r.text
        r = requests.put(f"{url_a}/v1/templates/{name}", json={"memory_mb": 128}, headers=alice, timeout=60)
        assert r.status_code == 200, r.text
        e = both(lambda e: e["type"] == "template_changed" and e["details"].get("template") == name,
                 "template_changed")
        r = requests.put(f"{url_a}/v1/pools/{name}", json={"template": name, "replicas": 0}, headers=alice,
                         timeout=60)
        assert r.status_code == 200, r.text

        r = requests.post(f"{url_b}/v1/sandboxes", json={"pool": name}, headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert requests.post(f"{url_a}/v1/sandboxes/{sid}/suspend", headers=alice, timeout=200).status_code == 200
        both(lambda e: e["type"] == "suspended" and of(sid)(e), "suspended")
        assert requests.post(f"{url_b}/v1/sandboxes/{sid}/resume", headers=alice, timeout=200).status_code == 200
        both(lambda e: e["type"] == "resumed" and of(sid)(e), "resumed")

        assert requests.delete(f"{url_a}/v1/sandboxes/{sid}", headers=alice, timeout=120).status_code == 204

        # The kubelet's eviction of a Pod past its `ephemeral-storage` limit. This cluster's real
        # kubelet has no container filesystem stats (its cAdvisor sees no containerd containers),
        # so it cannot evict; the fake node writes the kubelet's exact status instead, on an
        # operator's template (made with the API, as kubectl would) whose Pods land there.
        tpl = template(evict)
        spec = tpl["spec"]["podTemplate"]["spec"]
        del spec["nodeSelector"], spec["tolerations"]
        spec["containers"][0]["resources"] = {"limits": {"ephemeral-storage": "24Mi"}}
        cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates", tpl)
        cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxwarmpools", {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": evict}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": evict}}})
        r = requests.post(f"{url_b}/v1/sandboxes", json={"pool": evict}, headers=alice, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        # A cold start: the Sandbox, and so its Pod, is named after the claim.
        pods = [p for p in cluster.core.list_namespaced_pod(cluster.ns).items if p.metadata.name == sid]
        assert len(pods) == 1, [p.metadata.name for p in pods]
        cluster.core.patch_namespaced_pod(pods[0].metadata.name, cluster.ns, {
            "metadata": {"annotations": {"sandhub.dev/fake-node-fail": "Evicted"}}})
        both(lambda e: e["type"] == "finished" and of(sid)(e), "finished")
        e = both(lambda e: e["type"] == "disk_quota_exceeded" and of(sid)(e), "disk_quota_exceeded")
        assert e["details"] == {
            "evicted": True, "pod": pods[0].metadata.name,
            "message": "Pod ephemeral local storage usage exceeds the total limit of containers 24Mi.",
        }, e
        got = requests.get(f"{url_b}/v1/sandboxes/{sid}", headers=alice, timeout=60).json()
        assert got["state"] == "Finished", got
        # Both replicas looked, one wrote: told once.
        assert [x for x in on_a.quiet(7) if x["type"] == "disk_quota_exceeded"] == []
        assert requests.delete(f"{url_a}/v1/sandboxes/{sid}", headers=alice, timeout=120).status_code == 204

        # Members whose image cannot be pulled (a registry address nothing listens on, on
        # loopback): replaced after the grace, each replacement counted.
        r = requests.put(f"{url_a}/v1/templates/{broken}", json={"image": "127.0.0.1:9/nothing/here:1"},
                         headers=alice, timeout=60)
        assert r.status_code == 200, r.text
        r = requests.put(f"{url_a}/v1/pools/{broken}", json={"template": broken, "replicas": 1},
                         headers=alice, timeout=60)
        assert r.status_code == 200, r.text
        e = both(lambda e: e["type"] == "pool_start_failed" and e.get("pool") == broken,
                 "pool_start_failed", timeout=240)
        assert e["details"]["failures"] >= 1 and e["details"]["last_error"], e
    finally:
        on_a.close()
        on_b.close()
        for n in (name, broken):
            requests.delete(f"{url_a}/v1/pools/{n}", headers=alice, timeout=60)
            requests.delete(f"{url_a}/v1/templates/{n}", headers=alice, timeout=60)
        for kind in ("sandboxwarmpools", "sandboxtemplates"):
            try:
                cluster.custom.delete_namespaced_custom_object(*EXT, cluster.ns, kind, evict)
            except Exception:  # noqa: BLE001 - never made, or gone with the namespace
                pass
