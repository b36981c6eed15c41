"""Direct mode: `sandhub.Sandboxd` vs the upstream `k8s-agent-sandbox` SDK
(1.0.8, sandboxd mode: REST + gRPC by Pod IP) against the same sandboxd,
in the same run: `commands.run("true")` p50 and a 256 MiB write + read.

    SANDBOXD_BIN=$CARGO_TARGET_DIR/debug/sandboxd python bench/sdk_direct.py

Needs the test venv (the upstream SDK, kubernetes, pytest) with `sandhub`
installed. The upstream SDK is attached as the tests attach it
(sandhub_testing.upstream_sdk): its Kubernetes look-up is stubbed to answer podIPs=[127.0.0.1].
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import sandhub
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig
from sandhub_testing import binary_path, start_sandboxd, stop_process
from sandhub_testing.upstream_sdk import attach_upstream_sdk

RUNS = 300
WARMUP = 20
BIG = 256 << 20
BIG_ROUNDS = 3


def p50(call: Callable[[], object], n: int = RUNS) -> float:
    for _ in range(WARMUP):
        call()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def round_trip(write: Callable[[str, bytes], object], read: Callable[[str], bytes], payload: bytes) -> float:
    times = []
    for i in range(BIG_ROUNDS):
        t = time.perf_counter()
        write(f"big{i}.bin", payload)
        got = read(f"big{i}.bin")
        times.append(time.perf_counter() - t)
        assert len(got) == len(payload)
    return statistics.median(times)


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="sandhub-bench-direct-"))
    daemon = start_sandboxd(binary_path("sandboxd"), base)
    try:
        ours = sandhub.Sandboxd(daemon.rest_url, grpc_url=f"http://127.0.0.1:{daemon.grpc_port}")
        config = SandboxdInClusterConnectionConfig(
            mode="in-cluster-pod-ip", rest_port=daemon.rest_port, grpc_port=daemon.grpc_port
        )
        _client, _stub, upstream = attach_upstream_sdk(config)
        assert ours.commands.run("true").exit_code == 0
        assert upstream.commands.run("true").exit_code == 0
        up_run = p50(lambda: upstream.commands.run("true"))
        our_run = p50(lambda: ours.commands.run("true"))
        payload = bytes(BIG)
        up_big = round_trip(upstream.files.write, upstream.files.read, payload)
        our_big = round_trip(ours.files.write, ours.files.read, payload)
        upstream.close_connection()
    finally:
        stop_process(daemon.proc)
        shutil.rmtree(base, ignore_errors=True)
    print("| measurement | upstream k8s-agent-sandbox | sandhub.Sandboxd | ratio (target < 1.0) |")
    print("| --- | --- | --- | --- |")
    print(f"| run(\"true\") p50 | {up_run * 1e6:.0f} µs | {our_run * 1e6:.0f} µs | {our_run / up_run:.2f}× |")
    print(
        f"| 256 MiB write + read, median of {BIG_ROUNDS} | {up_big * 1e3:.0f} ms | {our_big * 1e3:.0f} ms "
        f"| {our_big / up_big:.2f}× |"
    )


if __name__ == "__main__":
    main()
