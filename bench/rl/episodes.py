"""Episodes per second through the fleet against the same loop written
directly on the ``sandhub`` SDK, in the same run (issue #18's benchmark:
target >= 0.95x). Each episode: acquire -> 3 x exec ``true`` -> release.

    python bench/rl/episodes.py --hub http://127.0.0.1:7070 \
        --episodes 200 --concurrency 16 [--warm N]

Prints one JSON line per variant and the ratio. Rounds alternate SDK and
fleet, so a machine that slows down during the run slows both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import sandhub

from sandhub_rl import FleetConfig, ResourceSpec, SandboxFleet, Task

TEMPLATE = "rl-bench"


def sdk_round(hub: sandhub.Hub, episodes: int, concurrency: int, pool: str | None) -> float:
    def episode(n: int) -> None:
        sb = hub.create(pool=pool) if pool else hub.create(TEMPLATE)
        for _ in range(3):
            sb.commands.run("true")
        sb.delete()

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(episode, range(episodes)))
    return episodes / (time.perf_counter() - started)


def fleet_round(hub: sandhub.Hub, episodes: int, concurrency: int, warm: int) -> float:
    fleet = SandboxFleet(hub, FleetConfig(warm_per_template=warm))
    task = Task(id="bench", template=TEMPLATE)
    if warm:
        fleet.release(fleet.acquire(task))  # makes the pool
        fleet.wait_pools_ready(60)

    def episode(n: int) -> None:
        h = fleet.acquire(task)
        for _ in range(3):
            h.exec("true")
        fleet.release(h)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(episode, range(episodes)))
    rate = episodes / (time.perf_counter() - started)
    assert fleet.teardown().clean
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=0, help="warm sandboxes per template (both variants)")
    args = parser.parse_args()
    hub = sandhub.Hub(args.hub)
    hub.templates.put(TEMPLATE, ResourceSpec(memory_limit=256).template_fields())
    pool = None
    if args.warm:
        pool = "rl-bench-sdk"
        hub.pools.put(pool, TEMPLATE, args.warm)
        hub.pools.wait_ready(pool)
    sdk, fleet = [], []
    try:
        for _ in range(args.rounds):
            sdk.append(sdk_round(hub, args.episodes, args.concurrency, pool))
            fleet.append(fleet_round(hub, args.episodes, args.concurrency, args.warm))
    finally:
        if pool:
            hub.pools.delete(pool)
    result = {
        "episodes": args.episodes, "concurrency": args.concurrency, "warm": args.warm,
        "sdk_eps": round(statistics.median(sdk), 2), "fleet_eps": round(statistics.median(fleet), 2),
        "ratio": round(statistics.median(fleet) / statistics.median(sdk), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
