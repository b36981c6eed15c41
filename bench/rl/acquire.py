"""Acquire latency through the fleet: from a warmed pool against a cold start, in the
same run (issue #18's second benchmark). Each sample is one ``fleet.acquire(task)``
(create, wait Ready, the fail-fast checks, no setup), released right after.

    python bench/rl/acquire.py --hub http://127.0.0.1:7070 --samples 100 [--template T]

Warm samples wait for the pool to be full again before each acquire, so every one is
served from the pool; cold samples use a fleet with no pool. The variants alternate in
blocks of 10 so a machine that slows down slows both. Prints one JSON line: p50/p99 in
milliseconds for each and the cold/warm ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import sandhub

from sandhub_rl import FleetConfig, ResourceSpec, SandboxFleet, Task

TEMPLATE = "rl-bench-acquire"
BLOCK = 10


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed_acquire(fleet: SandboxFleet, task: Task) -> tuple[float, str]:
    started = time.perf_counter()
    handle = fleet.acquire(task)
    took = time.perf_counter() - started
    fleet.release(handle)
    return took * 1000, handle.launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--samples", type=int, default=100, help="acquires per variant")
    parser.add_argument("--template", default=None, help="an existing template (default: a 256 MiB one)")
    args = parser.parse_args()
    hub = sandhub.Hub(args.hub)
    template = args.template or TEMPLATE
    if args.template is None:
        hub.templates.put(TEMPLATE, ResourceSpec(memory_limit=256).template_fields())
    task = Task(id="bench", template=template)
    cold_fleet = SandboxFleet(hub, FleetConfig())
    warm_fleet = SandboxFleet(hub, FleetConfig(warm_per_template=2))
    cold: list[float] = []
    warm: list[float] = []
    try:
        warm_fleet.release(warm_fleet.acquire(task))  # makes the pool
        while len(cold) < args.samples:
            for _ in range(BLOCK):
                ms, launch = timed_acquire(cold_fleet, task)
                assert launch == "cold", launch
                cold.append(ms)
            for _ in range(BLOCK):
                readiness = warm_fleet.wait_pools_ready(60)
                assert readiness.ready >= readiness.wanted, readiness
                ms, launch = timed_acquire(warm_fleet, task)
                assert launch == "warm", launch
                warm.append(ms)
    finally:
        for fleet in (cold_fleet, warm_fleet):
            assert fleet.teardown().clean
        if args.template is None:
            hub.templates.delete(TEMPLATE)
    result = {
        "samples": len(cold),
        "cold_p50_ms": round(statistics.median(cold), 1), "cold_p99_ms": round(percentile(cold, 0.99), 1),
        "warm_p50_ms": round(statistics.median(warm), 1), "warm_p99_ms": round(percentile(warm, 0.99), 1),
        "cold_over_warm_p50": round(statistics.median(cold) / statistics.median(warm), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
