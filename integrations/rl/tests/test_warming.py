"""Lookahead warming: the pure planner, and pools on a real hub that follow
the planned tasks (sized up by add_tasks, down as acquires consume the plan)."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
import sandhub

from sandhub_rl import (
    AsyncSandboxFleet,
    FleetConfig,
    LookaheadWarmer,
    ResourceSpec,
    SandboxFleet,
    Task,
)
from sandhub_rl import naming
from sandhub_rl.testing import FakeFleet

SMALL = ResourceSpec(memory_limit=256)


def test_planner_sizes_the_window() -> None:
    w = LookaheadWarmer(lookahead=5, max_per_template=2, max_total=3)
    assert w.plan(["a", "a", "a", "b", "c", "c", "c"]) == {"a": 2, "b": 1}  # total cap: earliest first
    assert LookaheadWarmer(lookahead=3).plan(["a", None, "b", "b"]) == {"a": 1, "b": 1}
    assert w.plan([]) == {}
    for bad in ({"lookahead": 0}, {"max_per_template": -1}, {"max_total": True}):
        with pytest.raises(ValueError):
            LookaheadWarmer(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        FleetConfig(warm_per_template=2, warmer=LookaheadWarmer())


def _run_pool_sizes(hub: sandhub.Hub, fleet: SandboxFleet) -> dict[str, int]:
    """Replicas per template of the run's pools, zero-sized ones left out."""
    return {p.template: p.replicas for p in hub.pools.list()
            if (naming.parse_pool_name(p.name) or ("",))[0] == naming.run_hash(fleet.run_id) and p.replicas}


def test_pools_follow_the_plan(hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig(resources=SMALL, warmer=LookaheadWarmer(lookahead=4, max_per_template=3)))
    a, b = swe_images[0], swe_images[1]
    tasks = [Task(id=f"w{n}", image=img) for n, img in enumerate([a, a, b, a, b, b, a])]
    try:
        assert fleet.wait_pools_ready(1).complete  # nothing planned: nothing wanted
        fleet.add_tasks(tasks)
        ta, tb = (fleet._core._templates[i] for i in (a, b))
        assert _run_pool_sizes(hub, fleet) == {ta: 3, tb: 1}  # window a a b a
        ready = fleet.wait_pools_ready(30)
        assert ready.complete and ready.fraction == 1.0 and ready.wanted == 4
        launches = []
        for n, task in enumerate(tasks):
            h = fleet.acquire(task)
            launches.append(h.launch)
            fleet.release(h)
            if n == 0:
                assert _run_pool_sizes(hub, fleet) == {ta: 2, tb: 2}  # window a b a b
            fleet.wait_pools_ready(30)
        assert launches.count("warm") >= 5, launches
        assert _run_pool_sizes(hub, fleet) == {} and fleet.planned_tasks() == []  # all shrunk to 0
        with pytest.raises(TypeError):
            fleet.add_tasks(["not a task"])  # type: ignore[list-item]
    finally:
        report = fleet.teardown()
    assert report.clean and len(report.deleted_pools) == 2


def test_acquire_latency_with_and_without_the_warmer(hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    """Measured in the same run (printed, not asserted: timings belong in bench/).
    What is asserted: with the warmer the acquires are served warm."""
    tasks = [Task(id=f"lat{n}", image=swe_images[n % 3]) for n in range(12)]

    def run(config: FleetConfig) -> tuple[list[float], SandboxFleet]:
        fleet = SandboxFleet(hub, config)
        fleet.add_tasks(tasks)
        fleet.wait_pools_ready(30)
        times = []
        for task in tasks:
            t0 = time.perf_counter()
            h = fleet.acquire(task)
            times.append(time.perf_counter() - t0)
            fleet.release(h)
            fleet.wait_pools_ready(30)  # a trainer's step time lets the pools refill
        assert fleet.teardown().clean
        return times, fleet

    cold, cold_fleet = run(FleetConfig(resources=SMALL))
    warm, warm_fleet = run(FleetConfig(resources=SMALL, warmer=LookaheadWarmer(lookahead=6)))
    assert cold_fleet.stats.warm == 0 and warm_fleet.stats.warm >= 10
    print(f"\nacquire p50: cold {statistics.median(cold) * 1000:.1f} ms, "
          f"lookahead-warmed {statistics.median(warm) * 1000:.1f} ms")


def test_async_warmer_and_fake_parity(hub_url: str, swe_images: list[str], no_leftovers: None) -> None:
    tasks = [Task(id=f"aw{n}", image=swe_images[2]) for n in range(3)]

    async def main() -> None:
        fleet = AsyncSandboxFleet(hub_url, FleetConfig(resources=SMALL, warmer=LookaheadWarmer(lookahead=2)))
        try:
            await fleet.add_tasks(tasks)
            ready = await fleet.wait_pools_ready(30)
            assert ready.complete and ready.wanted == 2
            for task in tasks:
                async with fleet.episode(task) as h:
                    assert (await h.exec("echo hi")).stdout == "hi\n"
            assert fleet.planned_tasks() == [] and fleet.stats.warm >= 2
        finally:
            report = await fleet.teardown()
        assert report.clean

    asyncio.run(main())
    fake = FakeFleet(None, FleetConfig())
    fake.add_tasks(tasks)
    assert fake.planned_tasks() == tasks and fake.wait_pools_ready(1).complete
    fake.release(fake.acquire(tasks[1]))
    assert fake.planned_tasks() == [tasks[0], tasks[2]]
