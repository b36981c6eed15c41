"""Direct mode: `sandhub.Sandboxd` vs the upstream `k8s-agent-sandbox` SDK
(1.0.8, sandboxd mode: REST + gRPC by Pod IP) against the same sandboxd,
in alternating rounds of one run: `commands.run("true")` p50 and a large
write + read.

    SANDBOXD_BIN=$CARGO_TARGET_DIR/release/sandboxd python bench/sdk_direct.py --rounds 7

Needs the test venv (the upstream SDK, kubernetes, pytest) with `sandhub`
installed; measure a release wheel (`pip wheel python/`, no `--profile`), as
the dev profile leaves the client unoptimised. The upstream SDK is attached
as the tests attach it (sandhub_testing.upstream_sdk): its Kubernetes look-up
is stubbed to answer podIPs=[127.0.0.1].

Each round times `--calls` runs of one SDK, then of the other (which goes
first alternates), so a machine that slows down mid-run slows both sides of
a round alike. The ratio of each round's p50s is printed with the median and
range of those ratios, as issue #34 asks.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import sandhub
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig
from sandhub_testing import binary_path, start_sandboxd, stop_process
from sandhub_testing.upstream_sdk import attach_upstream_sdk

WARMUP = 20


class Side(NamedTuple):
    """One SDK's calls: a run of `true`, and a write and read of one file."""

    run: Callable[[], object]
    write: Callable[[str, bytes], object]
    read: Callable[[str], bytes]


def run_p50(side: Side, calls: int) -> float:
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        side.run()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def round_trip(side: Side, name: str, payload: bytes) -> float:
    t = time.perf_counter()
    side.write(name, payload)
    got = side.read(name)
    took = time.perf_counter() - t
    assert len(got) == len(payload), f"{name}: read {len(got)} of {len(payload)} bytes"
    return took


def alternate(rounds: int, measure: Callable[[str, int], float]) -> tuple[list[float], list[float]]:
    """`measure(side, round)` for both sides in every round, the first
    side alternating; answers each side's values in round order."""
    values: dict[str, list[float]] = {"upstream": [], "sandhub": []}
    for i in range(rounds):
        order = ("upstream", "sandhub") if i % 2 == 0 else ("sandhub", "upstream")
        for side in order:
            values[side].append(measure(side, i))
    return values["upstream"], values["sandhub"]


def summary(label: str, unit: str, upstream: list[float], ours: list[float], scale: float) -> str:
    ratios = [o / u for u, o in zip(upstream, ours)]
    return (
        f"| {label} | {statistics.median(upstream) * scale:.0f} {unit} "
        f"({min(upstream) * scale:.0f}–{max(upstream) * scale:.0f}) "
        f"| {statistics.median(ours) * scale:.0f} {unit} ({min(ours) * scale:.0f}–{max(ours) * scale:.0f}) "
        f"| **{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of runs (at least 5 for a ratio)")
    parser.add_argument("--calls", type=int, default=100, help="timed run('true') calls per SDK per round")
    parser.add_argument("--big-rounds", type=int, default=3, help="alternating rounds of the large write + read")
    parser.add_argument("--big-mib", type=int, default=256, help="size of the large file, MiB")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="sandhub-bench-direct-"))
    daemon = start_sandboxd(binary_path("sandboxd"), base)
    try:
        ours = sandhub.Sandboxd(daemon.rest_url, grpc_url=f"http://127.0.0.1:{daemon.grpc_port}")
        config = SandboxdInClusterConnectionConfig(
            mode="in-cluster-pod-ip", rest_port=daemon.rest_port, grpc_port=daemon.grpc_port
        )
        _client, _stub, upstream = attach_upstream_sdk(config)
        sides = {
            "upstream": Side(lambda: upstream.commands.run("true"), upstream.files.write, upstream.files.read),
            "sandhub": Side(lambda: ours.commands.run("true"), ours.files.write, ours.files.read),
        }
        for side in sides.values():
            for _ in range(WARMUP):
                side.run()
        assert ours.commands.run("true").exit_code == 0
        assert upstream.commands.run("true").exit_code == 0

        up_run, our_run = alternate(args.rounds, lambda side, _i: run_p50(sides[side], args.calls))
        payload = bytes(args.big_mib << 20)
        up_big, our_big = alternate(
            args.big_rounds, lambda side, i: round_trip(sides[side], f"big-{side}-{i}.bin", payload)
        )
        upstream.close_connection()
    finally:
        stop_process(daemon.proc)
        shutil.rmtree(base, ignore_errors=True)

    print(f"sandboxd: {binary_path('sandboxd')}; sandhub SDK: {Path(sandhub.__file__).parent}")
    print(
        f"| {args.rounds} alternating rounds ({args.calls} calls each) | upstream k8s-agent-sandbox "
        "| sandhub.Sandboxd | sandhub ÷ upstream, median (range) |"
    )
    print("| --- | --- | --- | --- |")
    print(summary('run("true") p50', "µs", up_run, our_run, 1e6))
    print(summary(f"{args.big_mib} MiB write + read ({args.big_rounds} rounds)", "ms", up_big, our_big, 1e3))
    print("per round, run p50 upstream | sandhub (µs): " + ", ".join(
        f"{u * 1e6:.0f} | {o * 1e6:.0f}" for u, o in zip(up_run, our_run)
    ))


if __name__ == "__main__":
    main()
