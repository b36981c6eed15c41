"""Issue #19 on the real cluster: each sandbox's sandboxd opens with its own
token only; tenants own their pools (and never the operator's); the managed
NetworkPolicy admits the router and the hub only; extreme durations are 400.

The attacker is a workload: whatever it can read inside its own Pod (its
environment, sandboxd's, any file), and even its own Pod's real token, must
not open another sandbox -- claimed or still warm -- by Pod IP or through the
router, over REST or gRPC."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

import anyio
import grpc
import pytest
import requests
import yaml
from kubernetes import client as k8s
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import CORE, EXT, POOL, Cluster, template

REPO = Path(__file__).resolve().parents[2]
NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
TENANT_LABEL = "sandhub.io/tenant"


def tenant_digest(tenant: str) -> str:
    """The hub's tenant label value (hub/src/kube/model.rs): 40 hex digits of SHA-256."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:40]


def create(url: str, headers: dict | None = None, **body) -> dict:
    r = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, **body}, headers=headers, timeout=200)
    assert r.status_code == 201, r.text
    return r.json()


def bound_sandbox(c: Cluster, claim: str) -> tuple[str, str]:
    """(Sandbox name, Pod IP) of a hub sandbox."""
    status = c.claim(claim)["status"]["sandbox"]
    return status["name"], status["podIPs"][0]


def warm_members(c: Cluster) -> list[tuple[str, str]]:
    """(Sandbox name, Pod IP) of the pool's unclaimed members whose sandboxd is Ready."""
    owned = {
        sb["metadata"]["name"]
        for sb in c.sandboxes()
        if any(r.get("kind") == "SandboxWarmPool" and r.get("controller")
               for r in sb["metadata"].get("ownerReferences") or [])
    }
    return [(p.metadata.name, p.status.pod_ip) for p in c.pods()
            if p.metadata.name in owned and p.status.pod_ip and p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def grpc_code(target: str, token: str | None, header: str = "authorization") -> grpc.StatusCode:
    """A raw (empty) ProcessService/Execute call: what sandboxd answers before any command."""
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/process.v1.ProcessService/Execute",
                              request_serializer=None, response_deserializer=None)
        metadata = [(header, f"Bearer {token}")] if token is not None else []
        try:
            call(b"", metadata=metadata, timeout=20)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK


def test_nothing_a_workload_reads_opens_another_sandbox(cluster: Cluster):
    hub, url = cluster.start_hub()
    try:
        a, b = create(url)["id"], create(url)["id"]
        a_name, _ = bound_sandbox(cluster, a)
        b_name, b_ip = bound_sandbox(cluster, b)
        # The attacker gathers everything: sandboxd's environment (PID 1 is
        # sandboxd), its own, and a token file if a template mounted one.
        looked = requests.post(f"{url}/v1/sandboxes/{a}/exec", json={
            "command": "tr '\\0' '\\n' </proc/1/environ; env; cat /etc/sandboxd/token 2>/dev/null; true",
        }, timeout=60)
        assert looked.status_code == 200, looked.text
        seen = looked.json()["stdout"]
        own_token = cluster.sandboxd_token(a_name)
        # The Pod holds only the digest of its token, never the token.
        assert hashlib.sha256(own_token.encode()).hexdigest() in seen
        assert own_token not in seen
        candidates = {v for v in re.split(r"[\s=]+", seen) if len(v) >= 16}
        candidates.add(own_token)  # even if it got its own real token somehow

        # The pool refills what a and b took: unclaimed Pods to attack too.
        warm = wait_for("a warm member Ready", lambda: warm_members(cluster), timeout=120)
        victims = [(b_name, b_ip)] + warm[:1]
        for name, ip in victims:
            for cand in candidates:
                for header in ("Authorization", "X-Sandboxd-Authorization"):
                    h = {header: f"Bearer {cand}"}
                    got = requests.get(f"http://{ip}:8080/v1/files/planted.txt", headers=h, timeout=10)
                    assert got.status_code == 401, (name, header, got.status_code)
                    put = requests.put(f"http://{ip}:8080/v1/files/planted.txt", data=b"x", headers=h, timeout=10)
                    assert put.status_code == 401, (name, header, put.status_code)
            for cand in (own_token, hashlib.sha256(own_token.encode()).hexdigest()):
                assert grpc_code(f"{ip}:9090", cand) == grpc.StatusCode.UNAUTHENTICATED, name
            assert grpc_code(f"{ip}:9090", None) == grpc.StatusCode.UNAUTHENTICATED, name
            # Control: the victim's own token (the hub's, never in any Pod) opens it.
            mine = {"Authorization": f"Bearer {cluster.sandboxd_token(name)}"}
            assert requests.get(f"http://{ip}:8080/v1/files/planted.txt", headers=mine,
                                timeout=10).status_code == 404
            assert grpc_code(f"{ip}:9090", cluster.sandboxd_token(name)) != grpc.StatusCode.UNAUTHENTICATED
        # And the hub, presenting each Pod its own token, still drives both.
        for sid in (a, b):
            r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": "true"}, timeout=60)
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        for sid in (a, b):
            assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
    finally:
        stop_process(hub)


def test_through_an_open_router_a_stolen_token_still_opens_only_its_own_sandbox(cluster: Cluster):
    """The router at its weakest (allow-all, upstream's default): anyone who
    reaches it names any sandbox, so the sandboxd token is all that stands."""
    router, router_url = cluster.start_router("router-open", "--authz-mode", "allow-all")
    hub, url = cluster.start_hub("--connect", "router", "--router-url", router_url)
    try:
        a, b = create(url)["id"], create(url)["id"]
        a_name, _ = bound_sandbox(cluster, a)
        b_name, _ = bound_sandbox(cluster, b)
        # The hub reaches both through the router with each one's token.
        for sid in (a, b):
            # The router's Pod cache learns of a just-claimed Pod by a watch.
            wait_for(f"an exec in {sid} through the router", lambda sid=sid: requests.post(
                f"{url}/v1/sandboxes/{sid}/exec", json={"command": "hostname"}, timeout=60).status_code == 200,
                timeout=30)

        def via_router(sandbox: str, token: str) -> int:
            return requests.get(f"{router_url}/v1/files/x.txt", headers={
                "X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": cluster.ns, "X-Sandbox-Port": "8080",
                "X-Sandboxd-Authorization": f"Bearer {token}",
            }, timeout=30).status_code

        stolen = cluster.sandboxd_token(a_name)
        assert via_router(a_name, stolen) == 404  # its own: opens (no such file)
        assert via_router(b_name, stolen) == 401
        warm = wait_for("a warm member Ready", lambda: warm_members(cluster), timeout=120)
        # An unclaimed warm Pod: the router does not route to it by name at
        # all (502), and its sandboxd would refuse the token anyway (401);
        # never a 2xx or sandboxd's own 404.
        assert via_router(warm[0][0], stolen) in (401, 502)
        for sid in (a, b):
            assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
    finally:
        stop_process(hub)
        stop_process(router)


@pytest.fixture
def two_tenants(cluster: Cluster, tmp_path: Path):
    keys = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{k} {t}\n" for t, k in keys.items()))
    hub, url = cluster.start_hub("--api-keys-file", str(keys_file), "--tenant-max-pool-replicas", "3")
    yield url, {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    stop_process(hub)


def test_pools_belong_to_their_tenant_and_operator_pools_to_nobody(cluster: Cluster, two_tenants):
    url, auth = two_tenants
    alice, bob = auth["alice"], auth["bob"]

    def pools(who) -> dict:
        r = requests.get(f"{url}/v1/pools", headers=who, timeout=30)
        assert r.status_code == 200, r.text
        return {p["name"]: p for p in r.json()["pools"]}

    def cluster_pools() -> dict:
        return {p["metadata"]["name"]: p for p in
                cluster.custom.list_namespaced_custom_object(*EXT, cluster.ns, "sandboxwarmpools")["items"]}

    r = requests.put(f"{url}/v1/pools/mine", json={"template": POOL, "replicas": 0}, headers=alice, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "mine"
    # Labelled with alice's digest, under a name no other tenant's "mine" can take.
    objs = {n: p for n, p in cluster_pools().items()
            if (p["metadata"].get("labels") or {}).get(TENANT_LABEL) == tenant_digest("alice")}
    assert len(objs) == 1
    alice_obj = next(iter(objs))
    assert alice_obj != "mine" and alice_obj.startswith("mine-")

    # Alice sees her pool and the operator's; bob sees only the operator's.
    assert set(pools(alice)) == {"mine", POOL}
    assert set(pools(bob)) == {POOL}
    assert requests.get(f"{url}/v1/pools/mine", headers=bob, timeout=30).status_code == 404
    # Bob can neither delete nor resize it: his DELETE finds nothing, his PUT
    # makes a pool of his own.
    assert requests.delete(f"{url}/v1/pools/mine", headers=bob, timeout=30).status_code == 404
    r = requests.put(f"{url}/v1/pools/mine", json={"template": POOL, "replicas": 0}, headers=bob, timeout=30)
    assert r.status_code == 200, r.text
    assert cluster_pools()[alice_obj]["metadata"]["labels"][TENANT_LABEL] == tenant_digest("alice")
    assert len([n for n in cluster_pools() if n.startswith("mine-")]) == 2
    assert requests.delete(f"{url}/v1/pools/mine", headers=bob, timeout=30).status_code == 204
    assert alice_obj in cluster_pools()

    # The operator's pool: claimable, never changed or deleted through the hub.
    for who in (alice, bob):
        r = requests.put(f"{url}/v1/pools/{POOL}", json={"template": POOL, "replicas": 0}, headers=who, timeout=30)
        assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED", r.text
        r = requests.delete(f"{url}/v1/pools/{POOL}", headers=who, timeout=30)
        assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED", r.text
    assert cluster_pools()[POOL]["spec"]["replicas"] == 2

    # Replicas are capped per tenant (--tenant-max-pool-replicas 3), over all her pools.
    r = requests.put(f"{url}/v1/pools/big", json={"template": POOL, "replicas": 4}, headers=alice, timeout=30)
    assert r.status_code == 429 and r.json()["code"] == "RESOURCE_EXHAUSTED", r.text
    r = requests.put(f"{url}/v1/pools/mine", json={"template": POOL, "replicas": 10**6}, headers=alice, timeout=30)
    assert r.status_code == 429, r.text
    assert cluster_pools()[alice_obj]["spec"]["replicas"] == 0

    # A template labelled for another tenant is invisible: no pool can use it.
    other = template("bobs-template")
    other["metadata"]["labels"] = {TENANT_LABEL: tenant_digest("bob")}
    cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates", other)
    names = {t["name"] for t in requests.get(f"{url}/v1/templates", headers=alice, timeout=30).json()["templates"]}
    assert POOL in names and "bobs-template" not in names
    r = requests.put(f"{url}/v1/pools/sneaky", json={"template": "bobs-template", "replicas": 0},
                     headers=alice, timeout=30)
    assert r.status_code == 404, r.text

    assert requests.delete(f"{url}/v1/pools/mine", headers=alice, timeout=30).status_code == 204
    assert alice_obj not in cluster_pools()


def test_the_managed_network_policy_admits_exactly_the_router_and_the_hub(cluster: Cluster):
    name = "np-default"
    managed = template(name)
    del managed["spec"]["networkPolicyManagement"]  # Managed, the default
    cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates", managed)
    net = k8s.NetworkingV1Api(cluster.api)
    np = wait_for(f"NetworkPolicy {name}-network-policy",
                  lambda: net.read_namespaced_network_policy(f"{name}-network-policy", cluster.ns), timeout=60)
    spec = cluster.api.sanitize_for_serialization(np)["spec"]
    assert list(spec["podSelector"]["matchLabels"]) == ["agents.x-k8s.io/sandbox-template-ref-hash"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    peers = []
    for rule in spec["ingress"]:
        ports = sorted(p["port"] for p in rule.get("ports") or [])
        for peer in rule["from"]:
            assert "ipBlock" not in peer, "no address range: only labelled Pods"
            pods = peer["podSelector"]
            # Every sandbox Pod carries the name-hash label: none matches a peer.
            assert {"key": NAME_HASH, "operator": "DoesNotExist"} in pods["matchExpressions"], peer
            ns = (peer.get("namespaceSelector") or {}).get("matchLabels")
            peers.append((ns, pods["matchLabels"], ports))
    assert sorted(peers, key=str) == sorted([
        ({"kubernetes.io/metadata.name": "agent-sandbox-system"}, {"app": "sandbox-router"}, []),
        ({"kubernetes.io/metadata.name": "agent-sandbox-system"}, {"app.kubernetes.io/name": "sandbox-router"}, []),
        (None, {"app.kubernetes.io/name": "sandhub-hub"}, [8080, 9090]),
    ], key=str)
    # Sandbox Pods do carry the label the peers exclude.
    assert all(NAME_HASH in (p.metadata.labels or {}) for p in cluster.pods())
    # Upstream v1.0.9's router rule: egress to sandbox Pods by the name-hash label only.
    router_np = yaml.safe_load((REPO / "deploy/router/networkpolicy.yaml").read_text())
    sandbox_egress = router_np["spec"]["egress"][0]["to"]
    assert sandbox_egress == [{"namespaceSelector": {},
                               "podSelector": {"matchExpressions": [{"key": NAME_HASH, "operator": "Exists"}]}}]
    cluster.custom.delete_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates", name)


HUGE = [18446744073709551615, 2**63, 2**63 - 1, 10**12]


def test_extreme_durations_are_invalid_argument_on_every_front_door(cluster: Cluster):
    hub, url = cluster.start_hub()
    try:
        for field in ("shutdown_after_seconds", "idle_timeout_seconds"):
            for v in HUGE + [0]:
                r = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, field: v}, timeout=60)
                assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT", (field, v, r.text)
        # Beyond u64, negative, fractional, not a number: refused before any claim.
        for bad in ("18446744073709551616", "-1", "1e400", "1.5", '"soon"'):
            r = requests.post(f"{url}/v1/sandboxes", data=f'{{"shutdown_after_seconds": {bad}}}',
                              headers={"Content-Type": "application/json"}, timeout=60)
            assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT", (bad, r.text)
        # Reserved label prefixes are refused here as on the local backend.
        for key in ("agents.x-k8s.io/sandbox-name-hash", "extensions.agents.x-k8s.io/x", "kubernetes.io/x"):
            r = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {key: "x"}}, timeout=60)
            assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT", (key, r.text)
        # Gym environments' timeouts.
        for v in (-1, 0):
            r = requests.post(f"{url}/gym/v1/envs", json={"pool": POOL, "step_timeout_seconds": v}, timeout=60)
            assert r.status_code == 400, (v, r.text)
        # Per-command timeouts on a live sandbox.
        sid = create(url)["id"]
        # 1.8e19 fits a Duration but not `now + it`: it panicked the handler.
        for v in (-1, 0, 1e300, 1.8e19, 4e7):
            r = requests.post(f"{url}/v1/sandboxes/{sid}/exec",
                              json={"command": "true", "timeout_seconds": v}, timeout=60)
            assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT", (v, r.text)

        async def mcp():
            async with streamable_http_client(f"{url}/mcp") as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for v in HUGE:
                        res = await session.call_tool("create_sandbox", {"warmpool": POOL, "shutdown_after_seconds": v})
                        assert res.is_error, (v, res.content)
                        assert "shutdown_after_seconds" in str(res.content), res.content

        anyio.run(mcp)
        # The hub is alive and well after all of it.
        assert requests.get(f"{url}/readyz", timeout=10).status_code == 200
        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
