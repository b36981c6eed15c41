"""AsyncSandboxFleet against a real hub: the same behaviour as the blocking
fleet with ``await`` (each test runs its own event loop with asyncio.run)."""

from __future__ import annotations

import asyncio
import time

import pytest
import sandhub

from sandhub_rl import (
    AsyncSandboxFleet,
    FailFastPolicy,
    FleetConfig,
    ResourceSpec,
    SandboxLostError,
    SandboxStartError,
    Task,
    TaskSetupError,
)
from sandhub_rl import naming


def test_concurrent_episodes_with_warm_pool(hub_url: str, hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    tasks = [Task(id=f"a-{n}", image=swe_images[n % 2], setup=(f"echo {n} > /workspace/n",)) for n in range(6)]

    async def main() -> None:
        fleet = AsyncSandboxFleet(hub_url, FleetConfig(resources=ResourceSpec(memory_limit=256), warm_per_template=2))

        async def episode(task: Task) -> str:
            async with fleet.episode(task) as h:
                assert await h.is_alive()
                return (await h.exec("cat /workspace/n; python3 -c 'print(2+2)'")).stdout

        try:
            outs = await asyncio.gather(*(episode(t) for t in tasks))
            assert outs == [f"{n}\n4\n" for n in range(6)]
            assert fleet.stats.acquired == fleet.stats.released == 6
            assert len([p for p in await fleet.hub.pools.list() if naming.parse_pool_name(p.name)]) == 2
        finally:
            report = await fleet.teardown()
        assert report.clean and len(report.deleted_pools) == 2

    asyncio.run(main())


def test_start_failures_and_setup_failures(hub_url: str, no_leftovers: None) -> None:
    async def main() -> None:
        fleet = AsyncSandboxFleet(hub_url, FleetConfig(fail_fast=FailFastPolicy(grace_s=30)))
        started = time.monotonic()
        with pytest.raises(SandboxStartError) as info:
            await fleet.acquire(Task(id="ghost", image="ghost/none:1"))
        assert info.value.cause == "image_not_found" and time.monotonic() - started < 5.0
        with pytest.raises(SandboxStartError, match="template_not_found"):
            await fleet.acquire(Task(id="t", template="no-such-template"))
        with pytest.raises(TaskSetupError):
            await fleet.acquire(Task(id="s", template="default", setup=("exit 7",)))
        assert await fleet.hub.list(fleet.labels) == []
        assert (await fleet.teardown()).clean

    asyncio.run(main())


def test_lost_sandbox(hub_url: str, no_leftovers: None) -> None:
    async def main() -> None:
        fleet = AsyncSandboxFleet(hub_url, FleetConfig())
        handle = await fleet.acquire(Task(id="l", template="default"))

        async def delete_soon() -> None:
            await asyncio.sleep(0.5)
            await (await fleet.hub.get(handle.sandbox_id)).delete()

        deleter = asyncio.create_task(delete_soon())
        with pytest.raises(SandboxLostError):
            await handle.exec("sleep 30")
        await deleter
        assert not await handle.is_alive()
        with pytest.raises(SandboxLostError):
            await handle.exec("true")
        fresh = await fleet.acquire(Task(id="l", template="default"))
        assert fresh.sandbox_id != handle.sandbox_id and (await fresh.exec("echo ok")).stdout == "ok\n"
        await fleet.release(handle)
        assert (await fleet.teardown()).clean

    asyncio.run(main())


def test_cancelled_acquire_leaves_nothing(hub_url: str, no_leftovers: None) -> None:
    """A trainer cancelling an episode task mid-setup: the sandbox is released."""

    async def main() -> None:
        fleet = AsyncSandboxFleet(hub_url, FleetConfig())
        task = asyncio.create_task(fleet.acquire(Task(id="c", template="default", setup=("sleep 30",))))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        assert await fleet.hub.list(fleet.labels) == []
        assert (await fleet.teardown()).clean

    asyncio.run(main())
