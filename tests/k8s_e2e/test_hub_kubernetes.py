"""An agent's MCP calls, a Gym episode and the REST API, through
`sandhub serve --backend kubernetes`, into Pods that our controller made
from a warm pool and that really run sandboxd."""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import requests
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sandhub_gymnasium import SandhubEnv
from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import EXT, POOL, Cluster, wait_for_pool

REQUEST_TIMEOUT_S = 120.0


def bounded(fn, *args) -> None:
    async def run():
        with anyio.fail_after(REQUEST_TIMEOUT_S * 2):
            await fn(*args)

    anyio.run(run)


async def call(session: ClientSession, tool: str, **arguments):
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}({arguments}) failed: {result.content}"
    return result.structured_content


async def mcp_round_trip(c: Cluster, hub_url: str) -> None:
    """create_sandbox on the warm pool, then drive the Pod it got."""
    async with streamable_http_client(f"{hub_url}/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            created = await call(session, "create_sandbox", warmpool=POOL)
            name = created["sandbox_claim_name"]
            pod = c.pod_of(name)
            ran = await call(session, "execute_command", sandbox_claim_name=name, command="hostname")
            assert ran["exit_code"] == 0, ran
            # The command ran in the Pod itself: its hostname is the Pod's name.
            assert ran["stdout"].strip() == pod
            payload = "from the agent " + secrets.token_hex(4) + "\n"
            await call(session, "upload_file", sandbox_claim_name=name, path="notes/a.txt", content=payload)
            got = await call(session, "download_file", sandbox_claim_name=name, path="notes/a.txt")
            assert got["content"] == payload
            ran = await call(session, "execute_command", sandbox_claim_name=name, command="cat notes/a.txt")
            assert ran["stdout"] == payload
            deleted = await call(session, "delete_sandbox", sandbox_claim_name=name)
            assert deleted
    wait_for(
        f"claim {name}, its Sandbox and Pod {pod} to be gone",
        lambda: not any(cl["metadata"]["name"] == name for cl in c.claims())
        and not any(p.metadata.name == pod for p in c.pods()),
        timeout=120,
    )


def test_mcp_agent_runs_in_a_real_pod_from_the_warm_pool(cluster: Cluster):
    hub, url = cluster.start_hub()
    try:
        bounded(mcp_round_trip, cluster, url)
        assert cluster.hub_leftovers() == []
    finally:
        stop_process(hub)
    # The pool refills what the claim took.
    wait_for_pool(cluster, 2)


def test_metrics_report_the_pools_from_the_cluster(cluster: Cluster):
    """`/metrics` on the kubernetes backend shows each warm pool against its
    target, read from the SandboxWarmPools; an operator's pool has no tenant."""
    wait_for_pool(cluster, 2)
    hub, url = cluster.start_hub()
    try:
        text = requests.get(f"{url}/metrics", timeout=30).text
        labels = f'{{tenant="",pool="{POOL}"}}'
        assert f"sandhub_pool_target{labels} 2" in text, text
        assert f"sandhub_pool_ready{labels} 2" in text, text
    finally:
        stop_process(hub)


def test_gym_episode_on_the_cluster(cluster: Cluster):
    hub, url = cluster.start_hub()
    try:
        env = SandhubEnv(
            url,
            pool=POOL,
            task={"files": {"counter": "0\n"}, "prompt": "count to 2"},
            reward=[{"kind": "regex", "pattern": "^2$", "stream": "stdout"}],
            termination=[{"kind": "file", "path": "counter", "equals": "2\n"}],
            max_episode_steps=5,
        )
        obs, info = env.reset(seed=3)
        assert obs == "count to 2"
        total, terminated, steps = 0.0, False, 0
        while not terminated:
            obs, reward, terminated, truncated, info = env.step(
                "n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n"
            )
            total += reward
            steps += 1
            assert not truncated
        assert (steps, total) == (2, 1.0)
        # Reset cannot drop a Pod's changes in place: the episode gets a
        # fresh sandbox from the pool, with the task's files again.
        obs, info = env.reset()
        obs, *_ = env.step("cat counter")
        assert obs == "0\n"
        env.close()
        wait_for("the gym's sandboxes to be deleted", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


def test_hub_killed_and_restarted_finds_its_sandbox_and_leaks_nothing(cluster: Cluster):
    hub, url = cluster.start_hub()
    created = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {"run": "restart"}}, timeout=200)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": "sh -c 'echo before > keep.txt'"}, timeout=60)
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    stop_process(hub, signal.SIGKILL)

    hub, url = cluster.start_hub()
    try:
        listed = requests.get(f"{url}/v1/sandboxes", params={"labels": "run=restart"}, timeout=30).json()["sandboxes"]
        assert [s["id"] for s in listed] == [sid]
        assert listed[0]["state"] == "Ready"
        r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": "cat keep.txt"}, timeout=60)
        assert r.json()["stdout"] == "before\n", r.text
        # Another tenant's view would not see it; with no keys file there is
        # one tenant, so check the unknown-id path instead.
        assert requests.get(f"{url}/v1/sandboxes/sb-doesnotexist", timeout=30).status_code == 404
        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


def test_mcp_through_the_router_with_scoped_tokens(cluster: Cluster, tmp_path: Path):
    router, router_url, hub, url = cluster.start_routed_hub("router", tmp_path)
    try:
        bounded(mcp_round_trip, cluster, url)
        # A request without the hub's token is refused by the router.
        r = requests.get(
            f"{router_url}/v1/health",
            headers={"X-Sandbox-ID": "anything", "X-Sandbox-Namespace": cluster.ns, "X-Sandbox-Port": "8080"},
            timeout=10,
        )
        assert r.status_code == 401, r.text
    finally:
        stop_process(hub)
        stop_process(router)
    wait_for_pool(cluster, 2)


def test_exec_follows_suspend_resume_and_delete_at_once(cluster: Cluster):
    """The hub reads claims from a watch for speed; right after its own
    suspend, resume or delete, an exec must still meet the claim's new state
    (not the Pod the watch last showed)."""
    hub, url = cluster.start_hub()
    try:
        created = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {"run": "states"}}, timeout=200)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]

        def exec_(command: str) -> requests.Response:
            return requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": command}, timeout=60)

        first = exec_("hostname")
        assert first.status_code == 200, first.text
        assert requests.post(f"{url}/v1/sandboxes/{sid}/suspend", timeout=200).status_code == 200
        r = exec_("true")
        assert r.status_code == 412 and r.json()["code"] == "FAILED_PRECONDITION", r.text

        assert requests.post(f"{url}/v1/sandboxes/{sid}/resume", timeout=200).status_code == 200
        r = exec_("hostname")
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        r = exec_("true")
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


ZOMBIES = "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"


def test_sandboxd_is_the_pods_init_and_reaps_orphans(cluster: Cluster) -> None:
    """In a Pod, sandboxd is the container's PID 1: orphans of its workloads
    land on it and are reaped (no zombies pile up against the pids limit),
    a workload's `kill -9 -1` passes it over, and execs whose children
    orphan meanwhile still get their own exit codes."""
    hub, url = cluster.start_hub()
    try:
        created = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {"run": "init"}}, timeout=200)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]

        def exec_(command: str) -> dict[str, Any]:
            r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": command}, timeout=60)
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

        assert exec_("cat /proc/1/comm")["stdout"] == "sandboxd\n"
        r = exec_("(sleep 0.3 &); (sh -c 'exit 3' &); sleep 0.1; grep '^PPid:' /proc/$(pidof sleep)/status")
        assert r["stdout"].split() == ["PPid:", "1"], r
        wait_for("the orphans to be reaped", lambda: exec_(ZOMBIES)["stdout"].strip() == "0", timeout=30)
        for code in range(20, 26):
            r = exec_(f"(true &); (sleep 0.01 &); exit {code}")
            assert r["exit_code"] == code, r
        r = exec_("sleep 1000 >/dev/null 2>&1 & kill -9 -1; echo survived")
        assert r["stdout"] == "survived\n", r
        assert exec_("echo alive")["stdout"] == "alive\n"
        wait_for("no zombie left", lambda: exec_(ZOMBIES)["stdout"].strip() == "0", timeout=30)
        # A workload's SIGTERM or SIGINT to PID 1 is dropped: only a kill from outside the
        # Pod's PID namespace (the runtime's, at delete) stops it.
        r = exec_("kill -TERM 1; kill -INT 1; sleep 0.3; echo survived")
        assert r["stdout"] == "survived\n", r
        assert exec_("cat /proc/1/comm")["stdout"] == "sandboxd\n"
        pod = cluster.core.read_namespaced_pod(cluster.pod_of(sid), cluster.ns)
        grace = pod.spec.termination_grace_period_seconds or 30
        t0 = time.monotonic()
        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204

        def pod_gone() -> bool:
            return not any(p.metadata.uid == pod.metadata.uid
                           for p in cluster.core.list_namespaced_pod(cluster.ns).items)

        wait_for("the Pod to go", pod_gone, timeout=grace + 60)
        took = time.monotonic() - t0
        # The runtime's SIGTERM drained sandboxd: no wait for the grace period's SIGKILL.
        assert grace < 10 or took < grace - 5, (took, grace)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


def test_usage_of_a_real_pod_comes_from_its_sandboxd(cluster: Cluster) -> None:
    """On Kubernetes a sandbox's usage is what its sandboxd reads of its own
    container's cgroup, clamped by the hub: memory the workload holds and CPU
    it burns show in `/metrics` (the series), in `GET` (the latest sample)
    and in E2B's `metrics` route."""
    hub, url = cluster.start_hub("--e2b")
    try:
        created = requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, "labels": {"run": "usage"}}, timeout=200)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]

        def exec_(command: str) -> None:
            r = requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": command}, timeout=120)
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        # 48 MiB held in tmpfs (shared memory counts against the container's
        # memory), then two seconds of a busy loop.
        exec_("head -c 50331648 /dev/zero > /dev/shm/hold")
        exec_("timeout 2 sh -c 'while :; do :; done' || true")

        def latest() -> dict[str, Any]:
            r = requests.get(f"{url}/v1/sandboxes/{sid}/metrics", timeout=60)
            assert r.status_code == 200, r.text
            samples = r.json()["samples"]
            return samples[-1] if samples else {}

        wait_for("a sample with the held memory",
                 lambda: latest().get("memory_bytes", 0) >= 48 << 20, timeout=60)
        series = requests.get(f"{url}/v1/sandboxes/{sid}/metrics", timeout=60).json()["samples"]
        assert any(s["cpu_cores"] > 0.2 for s in series), series
        assert all(s["pids"] >= 1 for s in series), series

        got = requests.get(f"{url}/v1/sandboxes/{sid}", timeout=60).json()
        assert got["usage"]["latest"]["memory_bytes"] >= 48 << 20, got

        e2b = requests.get(f"{url}/sandboxes/{sid}/metrics", headers={"x-api-key": "any"}, timeout=60)
        assert e2b.status_code == 200, e2b.text
        assert e2b.json() and e2b.json()[-1]["memUsed"] >= 48 << 20, e2b.json()

        assert requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)
    wait_for_pool(cluster, 2)


def test_reads_right_after_writes_see_them(cluster: Cluster) -> None:
    """A create reads pools and templates from the hub's watches (hub/src/kube/caches.rs), and
    so do the GETs. What this hub has just written is read back from the API server, and what
    it has not seen yet (made past it, with the Kubernetes API) is asked for there: no read
    lags a write, however far behind the watches are."""
    hub, url = cluster.start_hub()
    made = False

    def ok(r: requests.Response, status: int = 200) -> Any:
        assert r.status_code == status, r.text
        return r.json() if r.content else None

    try:
        # Each read follows its write at once, many times over: one stale read fails it.
        for memory in (256, 512, 384, 768, 320, 640) * 15:
            ok(requests.put(f"{url}/v1/templates/rw", json={"memory_mb": memory}, timeout=60))
            got = ok(requests.get(f"{url}/v1/templates/rw", timeout=60))
            assert got["memory_mb"] == memory, got
        for replicas in (0, 1) * 20:
            ok(requests.put(f"{url}/v1/pools/rw", json={"template": "rw", "replicas": replicas}, timeout=60))
            got = ok(requests.get(f"{url}/v1/pools/rw", timeout=60))
            assert (got["template"], got["replicas"]) == ("rw", replicas), got
        ok(requests.delete(f"{url}/v1/pools/rw", timeout=60), 204)
        assert requests.get(f"{url}/v1/pools/rw", timeout=60).status_code == 404
        ok(requests.delete(f"{url}/v1/templates/rw", timeout=60), 204)
        assert requests.get(f"{url}/v1/templates/rw", timeout=60).status_code == 404

        # A pool the operator makes with kubectl is claimable at once.
        made = True
        cluster.custom.create_namespaced_custom_object(*EXT, cluster.ns, "sandboxwarmpools", {
            "apiVersion": f"{EXT[0]}/{EXT[1]}", "kind": "SandboxWarmPool",
            "metadata": {"name": "made-past-the-hub"},
            "spec": {"replicas": 0, "sandboxTemplateRef": {"name": POOL}},
        })
        sb = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": "made-past-the-hub"}, timeout=REQUEST_TIMEOUT_S),
                201)
        assert (sb["pool"], sb["template"], sb["state"], sb["launch"]) == (
            "made-past-the-hub", POOL, "Ready", "cold"), sb
        warm = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": POOL}, timeout=REQUEST_TIMEOUT_S), 201)
        assert warm["launch"] == "warm", warm
        # A list tells each one's launch too (from the Sandbox watch, or one list of Sandboxes).
        listed = {s["id"]: s["launch"] for s in ok(requests.get(f"{url}/v1/sandboxes", timeout=60))["sandboxes"]}
        assert (listed.get(sb["id"]), listed.get(warm["id"])) == ("cold", "warm"), listed
        for made_now in (sb, warm):
            ok(requests.delete(f"{url}/v1/sandboxes/{made_now['id']}", timeout=60), 204)
    finally:
        stop_process(hub)
        if made:
            cluster.custom.delete_namespaced_custom_object(*EXT, cluster.ns, "sandboxwarmpools", "made-past-the-hub")
