"""The hub on the kubernetes backend, on the real node: MCP create_sandbox
latency from a warm pool, and execute_command through the hub against a
direct gRPC Execute to the same Pod's sandboxd, measured in the same run.

    bash dev/k8s/cluster.sh up /tmp/c && bash dev/k8s/cluster.sh up-real-node /tmp/c
    cargo build --release -p sandhub -p sandhub-controller
    SANDHUB_TEST_KUBECONFIG=/tmp/c/kubeconfig SANDHUB_TEST_REAL_NODE=1 \\
      SANDHUB_BIN=$CARGO_TARGET_DIR/release/sandhub \\
      SANDHUB_CONTROLLER_BIN=$CARGO_TARGET_DIR/release/sandhub-controller \\
      $SANDHUB_CACHE/venv/bin/python bench/k8s_hub.py [--creates 8] [--execs 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import grpc
import requests
from k8s_agent_sandbox.commands._process_stubs import process_pb2, process_pb2_grpc
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sandhub_testing import hub_k8s as support
from sandhub_testing import stop_process


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name: str, xs: list[float]) -> str:
    return f"| {name} | {len(xs)} | {pct(xs, 50):.2f} | {pct(xs, 90):.2f} | {pct(xs, 99):.2f} | {statistics.mean(xs):.2f} |"


async def measure(c: support.Cluster, url: str, creates: int, execs: int) -> None:
    async with streamable_http_client(f"{url}/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            create_ms, names = [], []
            for _ in range(creates):
                t = time.perf_counter()
                r = await s.call_tool("create_sandbox", {"warmpool": support.POOL})
                create_ms.append((time.perf_counter() - t) * 1000)
                assert not r.is_error, r.content
                names.append(r.structured_content["sandbox_claim_name"])
            name = names[0]
            await s.call_tool("execute_command", {"sandbox_claim_name": name, "command": "true"})
            mcp_ms = []
            for _ in range(execs):
                t = time.perf_counter()
                r = await s.call_tool("execute_command", {"sandbox_claim_name": name, "command": "true"})
                mcp_ms.append((time.perf_counter() - t) * 1000)
                assert not r.is_error
            rest_ms = []
            session = requests.Session()
            for _ in range(execs):
                t = time.perf_counter()
                r = session.post(f"{url}/v1/sandboxes/{name}/exec", json={"command": "true"}, timeout=30)
                rest_ms.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200
            # Direct: the same Pod's sandboxd over gRPC, with its token.
            claim = c.claim(name)
            ip = claim["status"]["sandbox"]["podIPs"][0]
            token = c.sandboxd_token(claim["status"]["sandbox"]["name"])
            channel = grpc.insecure_channel(f"{ip}:9090")
            stub = process_pb2_grpc.ProcessServiceStub(channel)
            md = [("authorization", f"Bearer {token}")]
            req = process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["true"]))
            stub.Execute(req, metadata=md)
            direct_ms = []
            for _ in range(execs):
                t = time.perf_counter()
                stub.Execute(req, metadata=md)
                direct_ms.append((time.perf_counter() - t) * 1000)
            for n in names:
                await s.call_tool("delete_sandbox", {"sandbox_claim_name": n})
    print("| measurement | n | p50 ms | p90 ms | p99 ms | mean ms |")
    print("|---|---|---|---|---|---|")
    print(row("MCP create_sandbox (warm pool)", create_ms))
    print(row("MCP execute_command `true` via hub", mcp_ms))
    print(row("REST exec `true` via hub", rest_ms))
    print(row("gRPC Execute `true` direct to sandboxd", direct_ms))
    print(f"\nhub REST / direct p50: {pct(rest_ms, 50) / pct(direct_ms, 50):.2f}x; "
          f"MCP / direct p50: {pct(mcp_ms, 50) / pct(direct_ms, 50):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=8)
    ap.add_argument("--execs", type=int, default=200)
    args = ap.parse_args()
    with support.e2e_cluster() as c:
        # A warm pool as large as the burst, all Ready before timing starts.
        c.custom.patch_namespaced_custom_object(
            *support.EXT, c.ns, "sandboxwarmpools", support.POOL, {"spec": {"replicas": args.creates}}
        )
        support.wait_for_pool(c, args.creates, timeout=300)
        hub, url = c.start_hub()
        try:
            anyio.run(measure, c, url, args.creates, args.execs)
        finally:
            stop_process(hub)


if __name__ == "__main__":
    main()
