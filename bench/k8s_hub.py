"""The hub on the kubernetes backend, on the real node: MCP create_sandbox
and REST create latency from a warm pool, and exec through the hub (REST and MCP) against a
direct gRPC Execute of the same process to the same Pod's sandboxd, in
alternating rounds of the same run.

    bash dev/k8s/cluster.sh up /tmp/c && bash dev/k8s/cluster.sh up-real-node /tmp/c
    cargo build --release -p sandhub -p sandhub-controller
    SANDHUB_TEST_KUBECONFIG=/tmp/c/kubeconfig SANDHUB_TEST_REAL_NODE=1 \\
      SANDHUB_BIN=$CARGO_TARGET_DIR/release/sandhub \\
      SANDHUB_CONTROLLER_BIN=$CARGO_TARGET_DIR/release/sandhub-controller \\
      $SANDHUB_CACHE/venv/bin/python bench/k8s_hub.py [--creates 8] [--execs 200] [--rounds 5] \\
      [--baseline-bin OTHER_SANDHUB]

With --baseline-bin, warm creates of both builds first, in alternating rounds (a fresh hub each
round, its first create untimed). Last, where an MCP create's time goes: MCP create_sandbox, a
REST create and a REST create of MCP's request in turn, each with the hub's own time read from
its create_warm histogram.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import time
import urllib.parse
from typing import Any

import anyio
from anyio import to_thread
import grpc
import requests
from k8s_agent_sandbox.commands._process_stubs import process_pb2, process_pb2_grpc
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sandhub_testing import hub_k8s as support
from sandhub_testing import stop_process, wait_for


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name: str, xs: list[float]) -> str:
    return f"| {name} | {len(xs)} | {pct(xs, 50):.2f} | {pct(xs, 90):.2f} | {pct(xs, 99):.2f} | {statistics.mean(xs):.2f} |"


#: What each exec row runs: argv `true`, and the same through a shell (`"command": "true"` in
#: REST and MCP is `/bin/sh -c true`), so each hub row has a direct row that runs the very same
#: process.
ARGV = ["true"]
SHELL = ["/bin/sh", "-c", "true"]


async def make(s: ClientSession, session: requests.Session, url: str, creates: int) -> tuple[
    list[float], list[float], list[str], list[str]
]:
    """`creates` MCP creates and as many REST creates, alternating, from the warm pool: the
    time of each, and the ids made (MCP's, then REST's)."""
    mcp_ms, rest_ms, mcp_names, rest_names = [], [], [], []
    for _ in range(creates):
        t = time.perf_counter()
        r = await s.call_tool("create_sandbox", {"warmpool": support.POOL})
        mcp_ms.append((time.perf_counter() - t) * 1000)
        assert not r.is_error, r.content
        mcp_names.append(r.structured_content["sandbox_claim_name"])
        t = time.perf_counter()
        made = session.post(f"{url}/v1/sandboxes", json={"pool": support.POOL}, timeout=60)
        rest_ms.append((time.perf_counter() - t) * 1000)
        assert made.status_code in (200, 201), made.text
        rest_names.append(made.json()["id"])
    return mcp_ms, rest_ms, mcp_names, rest_names


async def remove(s: ClientSession, session: requests.Session, url: str, mcp: list[str], rest: list[str]) -> None:
    for n in mcp:
        await s.call_tool("delete_sandbox", {"sandbox_claim_name": n})
    for n in rest:
        session.delete(f"{url}/v1/sandboxes/{n}", timeout=60)


async def create_round(url: str, creates: int) -> tuple[list[float], list[float]]:
    """One A/B round on a hub just started: one untimed create first (its first API and
    sandboxd connections; a serving hub has them), then the timed ones, then all deleted."""
    async with streamable_http_client(f"{url}/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            session = requests.Session()
            first = session.post(f"{url}/v1/sandboxes", json={"pool": support.POOL}, timeout=60)
            assert first.status_code in (200, 201), first.text
            mcp_ms, rest_ms, mcp_names, rest_names = await make(s, session, url, creates)
            await remove(s, session, url, mcp_names, rest_names + [first.json()["id"]])
    return mcp_ms, rest_ms


def served_seconds(session: requests.Session, url: str) -> float:
    """The hub's own time spent on warm creates so far: the sum of its
    `sandhub_operation_seconds{op="create_warm"}` histogram (every door, every outcome)."""
    text = session.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sandhub_operation_seconds_sum{") and 'op="create_warm"' in line)


#: What MCP's create_sandbox adds to the request it makes: its session's label and a lifetime.
MCP_SHAPE: dict[str, Any] = {"labels": {"sandhub.io/mcp-session": "bench"}, "shutdown_after_seconds": 300}


async def anatomy(s: ClientSession, session: requests.Session, url: str, per_kind: int) -> dict[
    str, tuple[list[float], list[float]]
]:
    """Where an MCP create's time goes: MCP create_sandbox, a REST create, and a REST create of
    the very request MCP makes, in turn (which kind goes first rotates). For each create, the
    client's time and the hub's own (its create_warm histogram read before and after), so
    what the door and the client add shows apart from what the backend does."""
    async def mcp() -> str:
        r = await s.call_tool("create_sandbox", {"warmpool": support.POOL})
        assert not r.is_error, r.content
        return str(r.structured_content["sandbox_claim_name"])

    def rest(body: dict[str, Any]) -> str:
        made = session.post(f"{url}/v1/sandboxes", json=body, timeout=60)
        assert made.status_code in (200, 201), made.text
        return str(made.json()["id"])

    async def rest_plain() -> str:
        return rest({"pool": support.POOL})

    async def rest_mcp_shape() -> str:
        return rest({"pool": support.POOL, **MCP_SHAPE})

    kinds = {"MCP create_sandbox": mcp, "REST create": rest_plain,
             "REST create, MCP's request (label, lifetime)": rest_mcp_shape}
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in kinds}
    made: list[str] = []
    order = list(kinds)
    for i in range(per_kind):
        for k in order[i % len(order):] + order[:i % len(order)]:
            before = served_seconds(session, url)
            t = time.perf_counter()
            made.append(await kinds[k]())
            out[k][0].append((time.perf_counter() - t) * 1000)
            out[k][1].append((served_seconds(session, url) - before) * 1000)
    for n in made:
        session.delete(f"{url}/v1/sandboxes/{n}", timeout=60)
    return out


def settle(c: support.Cluster, pool: int) -> None:
    """A full pool, and no Pod of the last round still going: a Pod's teardown takes CPU
    that the next round's creates would otherwise share."""
    support.wait_for_pool(c, pool, timeout=300)
    wait_for("the last round's Pods to be gone",
             lambda: len([p for p in c.pods() if p.metadata.deletion_timestamp is None]) == len(c.pods()) == pool,
             timeout=300)
    time.sleep(2)


def ab_creates(c: support.Cluster, new_bin: str, old_bin: str, creates: int, rounds: int) -> None:
    """Warm creates of two hub builds in alternating rounds on the same cluster, each round on
    a full pool: which build goes first alternates."""
    ms: dict[str, tuple[list[float], list[float]]] = {"new": ([], []), "old": ([], [])}
    builds = [("new", new_bin), ("old", old_bin)]
    for rnd in range(rounds):
        for label, path in builds[rnd % 2:] + builds[:rnd % 2]:
            settle(c, 2 * creates + 1)
            os.environ["SANDHUB_BIN"] = path
            hub, url = c.start_hub()
            try:
                mcp_ms, rest_ms = anyio.run(create_round, url, creates)
            finally:
                stop_process(hub)
            ms[label][0].extend(mcp_ms)
            ms[label][1].extend(rest_ms)
            print(f"round {rnd + 1} {label}: MCP p50 {pct(mcp_ms, 50):.2f} ms, REST p50 {pct(rest_ms, 50):.2f} ms",
                  flush=True)
    os.environ["SANDHUB_BIN"] = new_bin
    print("| build | create | n | p50 ms | p90 ms | p99 ms | mean ms |")
    print("|---|---|---|---|---|---|---|")
    for label in ("new", "old"):
        for kind, xs in zip(("MCP create_sandbox", "REST POST /v1/sandboxes"), ms[label]):
            print(f"| {label} {row(kind, xs)[2:]}")
    for i, kind in enumerate(("MCP create_sandbox", "REST POST /v1/sandboxes")):
        print(f"- {kind} p50 new / old: {pct(ms['new'][i], 50) / pct(ms['old'][i], 50):.2f}x "
              f"(new p50 {pct(ms['new'][i], 50):.2f} ms; issue #34 target: <= 50 ms)")
    print(f"{rounds} alternating rounds of {creates} creates per kind and build.\n", flush=True)


async def measure(c: support.Cluster, url: str, creates: int, execs: int, rounds: int) -> None:
    async with streamable_http_client(f"{url}/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            session = requests.Session()
            create_ms, rest_create_ms, names, rest_names = await make(s, session, url, creates)
            name = names[0]
            claim = c.claim(name)
            ip = claim["status"]["sandbox"]["podIPs"][0]
            token = c.sandboxd_token(claim["status"]["sandbox"]["name"])
            stub = process_pb2_grpc.ProcessServiceStub(grpc.insecure_channel(f"{ip}:9090"))
            md = [("authorization", f"Bearer {token}")]

            def rest(command: str | list[str]) -> None:
                r = session.post(f"{url}/v1/sandboxes/{name}/exec", json={"command": command}, timeout=30)
                assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

            # `requests` spends a few hundred microseconds of Python per call, which the direct
            # row's gRPC C core does not: this row sends the same request on one kept-alive
            # http.client connection, so the hub's own cost is compared.
            lean = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=30)
            argv_body = json.dumps({"command": ARGV})

            def rest_lean() -> None:
                lean.request("POST", f"/v1/sandboxes/{name}/exec", body=argv_body,
                             headers={"content-type": "application/json"})
                r = lean.getresponse()
                body = r.read()
                assert r.status == 200 and json.loads(body)["exit_code"] == 0, body

            def direct(argv: list[str]) -> None:
                req = process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=argv))
                assert stub.Execute(req, metadata=md).exit_code == 0

            async def mcp() -> None:
                r = await s.call_tool("execute_command", {"sandbox_claim_name": name, "command": "true"})
                assert not r.is_error

            kinds = {
                "REST exec argv `true` via hub": lambda: rest(ARGV),
                "REST exec argv `true` via hub, lean client": rest_lean,
                "gRPC Execute argv `true` direct to sandboxd": lambda: direct(ARGV),
                "REST exec `sh -c true` via hub": lambda: rest("true"),
                "MCP execute_command `sh -c true` via hub": None,
                "gRPC Execute `sh -c true` direct to sandboxd": lambda: direct(SHELL),
            }
            ms: dict[str, list[float]] = {k: [] for k in kinds}
            for k, f in kinds.items():  # one of each first: connections made, caches warm
                await mcp() if f is None else f()
            per_round = max(1, execs // rounds)
            order = list(kinds)
            for rnd in range(rounds):
                # Which kind goes first rotates round by round, so a slow spell of the machine
                # falls on each in turn.
                for k in order[rnd % len(order):] + order[:rnd % len(order)]:
                    f = kinds[k]
                    for _ in range(per_round):
                        t = time.perf_counter()
                        await mcp() if f is None else f()
                        ms[k].append((time.perf_counter() - t) * 1000)
            await remove(s, session, url, names, rest_names)
            # A third of the pool per kind, `rounds` times, on a full pool each time.
            per_kind = max(1, (2 * creates + 1) // 3)
            parts: dict[str, tuple[list[float], list[float]]] = {}
            for _ in range(rounds):
                await to_thread.run_sync(settle, c, 2 * creates + 1)
                for k, (client, served) in (await anatomy(s, session, url, per_kind)).items():
                    parts.setdefault(k, ([], []))
                    parts[k][0].extend(client)
                    parts[k][1].extend(served)
    print("| create, warm pool | n | client p50 ms | hub's own p50 ms | client - hub p50 ms |")
    print("|---|---|---|---|---|")
    for k, (client, served) in parts.items():
        gaps = [a - b for a, b in zip(client, served)]
        print(f"| {k} | {len(client)} | {pct(client, 50):.2f} | {pct(served, 50):.2f} | {pct(gaps, 50):.2f} |")
    print()
    print("| measurement | n | p50 ms | p90 ms | p99 ms | mean ms |")
    print("|---|---|---|---|---|---|")
    print(row("MCP create_sandbox (warm pool)", create_ms))
    print(row("REST POST /v1/sandboxes (warm pool)", rest_create_ms))
    for k, xs in ms.items():
        print(row(k, xs))

    def ratio(a: str, b: str) -> str:
        return f"{pct(ms[a], 50) / pct(ms[b], 50):.2f}x"

    print(f"\n{rounds} alternating rounds of {per_round} per kind. p50 ratios against the direct call "
          "running the same process:")
    print(f"- hub REST argv / direct argv: {ratio('REST exec argv `true` via hub', 'gRPC Execute argv `true` direct to sandboxd')} (issue #34 target: <= 1.3x)")
    print(f"- hub REST argv, lean client / direct argv: {ratio('REST exec argv `true` via hub, lean client', 'gRPC Execute argv `true` direct to sandboxd')}")
    print(f"- hub REST sh -c / direct sh -c: {ratio('REST exec `sh -c true` via hub', 'gRPC Execute `sh -c true` direct to sandboxd')}")
    print(f"- MCP sh -c / direct sh -c: {ratio('MCP execute_command `sh -c true` via hub', 'gRPC Execute `sh -c true` direct to sandboxd')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=8)
    ap.add_argument("--execs", type=int, default=200, help="per kind, over all rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-bin", help="another sandhub build: its warm creates and SANDHUB_BIN's "
                    "alternate, round by round, before the exec rows")
    args = ap.parse_args()
    with support.e2e_cluster() as c:
        # A warm pool as large as a round's creates, all Ready before timing starts.
        c.custom.patch_namespaced_custom_object(
            *support.EXT, c.ns, "sandboxwarmpools", support.POOL, {"spec": {"replicas": 2 * args.creates + 1}}
        )
        if args.baseline_bin:
            ab_creates(c, str(support.binary("sandhub")), args.baseline_bin, args.creates, args.rounds)
        settle(c, 2 * args.creates + 1)
        hub, url = c.start_hub()
        try:
            anyio.run(measure, c, url, args.creates, args.execs, args.rounds)
        finally:
            stop_process(hub)


if __name__ == "__main__":
    main()
