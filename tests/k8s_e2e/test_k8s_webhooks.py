"""Signed webhooks on the kubernetes backend (issue #30 §3), with two replicas.

Registrations live in a Secret per tenant, and one replica (the holder of a
`coordination.k8s.io` Lease) delivers from the events it derives, keeping a
cursor per webhook in a ConfigMap (hub/src/kube/webhooks/). The events here
are `template_changed`, from replacing a tenant's template: no Pod is needed,
so the apiserver alone (a fake node) serves this test.

A receiver on loopback checks every delivery as any Stripe-style verifier
does; the holder is killed with SIGKILL and the other replica takes over; the
receiver goes down and gets everything once it is back. The hubs run with
deploy/hub's Role only."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import yaml
from kubernetes import client as k8s
from kubernetes import utils
from kubernetes.client.exceptions import ApiException
from sandhub_testing import stop_process
from sandhub_testing.hub_k8s import Cluster, apiserver_cluster
from sandhub_testing.net import LOOPBACK, free_port

SECRET = "whsec_" + secrets.token_hex(16)
# Short waits: the Lease is taken over 3 s after its holder stops, retries
# start at 200 ms and never wait more than 1 s.
FLAGS = ("--webhook-allow-loopback", "--webhook-lease-duration", "3s", "--webhook-backoff", "200ms",
         "--webhook-max-backoff", "1s", "--webhook-timeout", "2s")


def stripe_verify(body: bytes, header: str, secret: str, tolerance: float = 300) -> bool:
    """What a standard Stripe-style verifier does with `t=..,v1=..`."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    t = int(parts["t"])
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return abs(time.time() - t) <= tolerance and hmac.compare_digest(expected, parts["v1"])


class Receiver:
    """A webhook receiver on loopback: records every POST (path, headers, body, verified),
    answers `self.status`; `down()` closes its port, `up()` opens it again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.got: list[dict[str, Any]] = []
        self.status = 200
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.up()

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.got.append({
                        "path": self.path,
                        "event_id": self.headers["Sandhub-Event-Id"],
                        "verified": stripe_verify(body, self.headers["Sandhub-Signature"], SECRET),
                        "event": json.loads(body),
                        "status": receiver.status,
                    })
                    status = receiver.status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def url(self, path: str) -> str:
        return f"http://{LOOPBACK}:{self.port}{path}"

    def delivered(self, path: str) -> list[dict[str, Any]]:
        """What was answered 2xx at `path`."""
        with self.lock:
            return [g for g in self.got if g["path"] == path and g["status"] < 300]

    def wait(self, path: str, pred: Any, what: str, timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.delivered(path)
            if any(pred(g["event"]) for g in got):
                return got
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout}s; got {self.got}")


ROLE = Path(__file__).resolve().parents[2] / "deploy" / "hub" / "rbac.yaml"


@pytest.fixture(scope="module")
def api_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The apiserver-only cluster, with hubs that run as deploy/hub's ServiceAccount: the
    Role shipped is all the webhooks get (the test reads objects as admin)."""
    with apiserver_cluster() as c:
        for doc in yaml.safe_load_all(ROLE.read_text()):
            if doc and doc["kind"] == "RoleBinding":
                doc["subjects"][0]["namespace"] = c.ns
            if doc:
                utils.create_from_dict(c.api, doc, namespace=c.ns)
        c.core.create_namespaced_service_account(c.ns, k8s.V1ServiceAccount(
            metadata=k8s.V1ObjectMeta(name="sandhub-hub")))
        token = c.core.create_namespaced_service_account_token(
            "sandhub-hub", c.ns, k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
        kubeconfig = yaml.safe_load(Path(c.kubeconfig).read_text())
        for user in kubeconfig["users"]:
            user["user"] = {"token": token}
        path = tmp_path_factory.mktemp("sa") / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        yield dataclasses.replace(c, kubeconfig=str(path))


def cursor(cluster: Cluster, state: str) -> int:
    """The cursor a webhook's state ConfigMap records (0 when none yet)."""
    try:
        cm = cluster.core.read_namespaced_config_map(state, cluster.ns)
    except ApiException:
        return 0
    progress = (cm.data or {}).get("delivery.json")
    return int(json.loads(progress)["cursor"]) if progress else 0


def holder(cluster: Cluster) -> str:
    """The POD_NAME of the replica holding the webhook Lease ('' when none does yet)."""
    try:
        lease = k8s.CoordinationV1Api(cluster.api).read_namespaced_lease("sandhub-hub-webhooks", cluster.ns)
    except ApiException:
        return ""
    return str(lease.spec.holder_identity or "").rsplit("_", 1)[0]


def test_webhooks_are_signed_survive_the_holders_kill9_and_a_receiver_down(api_cluster: Cluster,
                                                                            tmp_path: Path) -> None:
    c = api_cluster
    keys = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{k} {t}\n" for t, k in keys.items()))
    alice = {"Authorization": f"Bearer {keys['alice']}"}
    bob = {"Authorization": f"Bearer {keys['bob']}"}
    procs, urls = {}, {}
    for name in ("hub-a", "hub-b"):
        procs[name], urls[name] = c.start_hub("--api-keys-file", str(keys_file), *FLAGS, env={"POD_NAME": name})
    url_a = urls["hub-a"]
    rx = Receiver()
    tpl = f"wh-{secrets.token_hex(3)}"
    memory = iter(range(64, 1000))

    def change_template(url: str) -> None:
        r = requests.put(f"{url}/v1/templates/{tpl}", json={"memory_mb": next(memory)}, headers=alice, timeout=60)
        assert r.status_code == 200, r.text

    def is_change(e: dict[str, Any]) -> bool:
        return bool(e["type"] == "template_changed" and e["details"].get("template") == tpl)

    try:
        # What is refused, through A: its own port, the metadata address (by address, so
        # nothing is ever connected), and (on a replica without --webhook-allow-loopback) a
        # name that resolves to loopback. Fields are named.
        for target in (f"http://{LOOPBACK}:{url_a.rsplit(':', 1)[1]}/x", "http://169.254.169.254/latest"):
            r = requests.put(f"{url_a}/v1/webhooks/bad", json={"url": target, "secret": SECRET},
                             headers=alice, timeout=30)
            assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED", r.text
            assert "url" in r.json()["message"], r.text
        r = requests.put(f"{url_a}/v1/webhooks/bad", json={"url": rx.url("/"), "events": ["exploded"],
                                                           "secret": SECRET}, headers=alice, timeout=30)
        assert r.status_code == 400 and "events" in r.json()["message"], r.text
        r = requests.put(f"{url_a}/v1/webhooks/bad", json={"url": rx.url("/"), "secret": "short"},
                         headers=alice, timeout=30)
        assert r.status_code == 400 and "secret" in r.json()["message"], r.text
        strict, strict_url = c.start_hub("--api-keys-file", str(keys_file), env={"POD_NAME": "hub-c"})
        try:
            for target in (f"http://localhost:{rx.port}/x", rx.url("/x")):
                r = requests.put(f"{strict_url}/v1/webhooks/bad", json={"url": target, "secret": SECRET},
                                 headers=alice, timeout=30)
                assert r.status_code == 403, r.text
        finally:
            stop_process(strict)
        assert requests.get(f"{url_a}/v1/webhooks/bad", headers=alice, timeout=30).status_code == 404

        # The template exists before the webhooks: its first change is what they get.
        r = requests.put(f"{url_a}/v1/templates/{tpl}", json={"memory_mb": 32}, headers=alice, timeout=60)
        assert r.status_code == 200, r.text
        # Registered through A, seen through B, never with its secret.
        r = requests.put(f"{url_a}/v1/webhooks/main",
                         json={"url": rx.url("/alice"), "events": ["template_changed"], "secret": SECRET},
                         headers=alice, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["events"] == ["template_changed"] and SECRET not in r.text
        r = requests.put(f"{urls['hub-b']}/v1/webhooks/mine",
                         json={"url": rx.url("/bob"), "secret": SECRET}, headers=bob, timeout=30)
        assert r.status_code == 200, r.text
        for url in urls.values():
            listed = requests.get(f"{url}/v1/webhooks", headers=alice, timeout=30)
            assert [w["name"] for w in listed.json()["webhooks"]] == ["main"], listed.text
            one = requests.get(f"{url}/v1/webhooks/main", headers=alice, timeout=30)
            assert one.json()["url"] == rx.url("/alice"), one.text
            assert SECRET not in listed.text + one.text and "secret" not in one.json()
        # Bob sees only his own.
        listed = requests.get(f"{url_a}/v1/webhooks", headers=bob, timeout=30).json()
        assert [w["name"] for w in listed["webhooks"]] == ["mine"], listed
        assert requests.get(f"{url_a}/v1/webhooks/main", headers=bob, timeout=30).status_code == 404
        assert requests.get(f"{url_a}/v1/webhooks/main/deliveries", headers=bob, timeout=30).status_code == 404

        # 1. A change arrives, signed, naming alice, its id in Sandhub-Event-Id.
        change_template(urls["hub-b"])
        got = rx.wait("/alice", is_change, "the first template_changed")
        first = next(g for g in got if is_change(g["event"]))
        assert first["verified"], first
        assert first["event"]["tenant"] == "alice" and first["event_id"] == str(first["event"]["id"]), first

        # Its cursor is durable: the webhook's ConfigMap says it was delivered.
        state = f"sandhub-webhook-{hashlib.sha256(b'alice').hexdigest()[:40]}-main"
        deadline = time.monotonic() + 10
        while cursor(c, state) < first["event"]["id"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cursor(c, state) >= first["event"]["id"]

        # 2. The holder is killed; the other replica delivers what follows, from the cursor
        # (the first change is not sent again).
        deadline = time.monotonic() + 30
        while not (who := holder(c)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert who in procs, who
        procs[who].send_signal(signal.SIGKILL)
        procs[who].wait(timeout=30)
        survivor_name = next(n for n in urls if n != who)
        survivor = urls[survivor_name]
        change_template(survivor)
        rx.wait("/alice", lambda e: is_change(e) and e["id"] > first["event"]["id"], "a change after the kill",
                timeout=60)
        assert [g["event"]["id"] for g in rx.delivered("/alice")].count(first["event"]["id"]) == 1
        deadline = time.monotonic() + 30
        while holder(c) == who and time.monotonic() < deadline:
            time.sleep(0.2)
        assert holder(c) not in ("", who)

        # 3. The receiver fails (503), then is down (its port closed), while two changes happen;
        # once it is back it gets both, in order.
        before = {g["event"]["id"] for g in rx.delivered("/alice")}
        rx.status = 503
        change_template(survivor)
        deadline = time.monotonic() + 30
        while not any(g["status"] == 503 for g in rx.got) and time.monotonic() < deadline:
            time.sleep(0.1)
        rx.down()
        change_template(survivor)
        time.sleep(4)
        d = requests.get(f"{survivor}/v1/webhooks/main/deliveries", headers=alice, timeout=30).json()["deliveries"]
        assert any(a.get("status") == 503 for a in d), d
        assert any("status" not in a and a.get("error") for a in d), d
        rx.status = 200
        rx.up()
        deadline = time.monotonic() + 30
        new: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            new = [g["event"] for g in rx.delivered("/alice") if g["event"]["id"] not in before]
            if len({e["id"] for e in new if is_change(e)}) >= 2:
                break
            time.sleep(0.1)
        ids = [e["id"] for e in new if is_change(e)]
        assert len(set(ids)) == 2 and ids == sorted(ids), new

        # Every delivery verified; at least once: every change told, none of another type.
        alices = rx.delivered("/alice")
        assert all(g["verified"] for g in rx.got), rx.got
        assert all(is_change(g["event"]) and g["event"]["tenant"] == "alice" for g in alices)
        assert len({g["event"]["id"] for g in alices}) == 4, alices
        assert [g["event"]["id"] for g in alices] == sorted(g["event"]["id"] for g in alices), "in order"
        d = requests.get(f"{survivor}/v1/webhooks/main/deliveries", headers=alice, timeout=30).json()["deliveries"]
        assert {a["event_id"] for a in d if a.get("status") == 200} >= set(ids), d
        assert all(a1["time"] >= a2["time"] for a1, a2 in zip(d, d[1:])), "newest first"
        info = requests.get(f"{survivor}/v1/webhooks/main", headers=alice, timeout=30).json()
        assert info["pending"] == 0, info

        # Bob's webhook (every type) got nothing of alice's.
        assert all(g["event"]["tenant"] == "bob" and not is_change(g["event"]) for g in rx.got
                   if g["path"] == "/bob"), rx.got

        # Deleted: gone with its attempts, and nothing more is sent.
        assert requests.delete(f"{survivor}/v1/webhooks/main", headers=alice, timeout=30).status_code == 204
        assert requests.get(f"{survivor}/v1/webhooks/main", headers=alice, timeout=30).status_code == 404
        assert requests.get(f"{survivor}/v1/webhooks/main/deliveries", headers=alice,
                            timeout=30).status_code == 404
        count = len(rx.got)
        change_template(survivor)
        time.sleep(4)
        assert len(rx.got) == count, rx.got[count:]
        # A replica that stops (SIGTERM) frees the Lease on its way out, so another would
        # take it at its next look rather than after the Lease's duration.
        assert holder(c) == survivor_name
        assert stop_process(procs[survivor_name]) == 0
        assert holder(c) == ""
        # The secret never reached a log.
        assert SECRET not in (c.logs / "hub.log").read_text(errors="replace")
    finally:
        for p in procs.values():
            stop_process(p)
        if rx.server is not None:
            rx.down()
