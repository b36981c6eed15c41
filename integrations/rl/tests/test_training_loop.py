"""A simulated training run: SWE-bench-shaped JSONL rows over three images,
concurrent episodes of acquire -> setup -> 3 execs -> reward -> release, and
nothing left after teardown(verify=True). The same loop runs against the
real fleet (a real hub) and against sandhub_rl.testing.FakeFleet; its
asyncio twin against AsyncSandboxFleet and AsyncFakeFleet."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import sandhub

from sandhub_rl import (
    AsyncSandboxFleet,
    FleetConfig,
    JsonlSource,
    ResourceSpec,
    SandboxFleet,
    SandboxLostError,
    SandboxStartError,
    Task,
)
from sandhub_rl.testing import AsyncFakeFleet, FakeFleet

Fleet = Any  # SandboxFleet | FakeFleet: the loop uses only their shared API
SETUP = ("echo ready > /workspace/ready",)


@dataclass
class RunResult:
    rewards: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    retried: list[str] = field(default_factory=list)
    seconds: float = 0.0


def training_run(
    fleet: Fleet,
    tasks: list[Task],
    concurrency: int,
    on_step: Callable[[Any, int, int], None] = lambda handle, step, attempt: None,
) -> RunResult:
    """The trainer's side: one episode per task, ``concurrency`` at a time.
    A task whose sandbox cannot start is skipped; an episode whose sandbox is
    lost is run again on a fresh one (at most twice)."""
    result = RunResult()
    lock = threading.Lock()

    def episode(task: Task) -> None:
        for attempt in (1, 2):
            try:
                handle = fleet.acquire(task)
            except SandboxStartError as e:
                with lock:
                    result.skipped[task.id] = e.cause
                return
            try:
                handle.exec(f"echo {task.id} > /workspace/answer")
                on_step(handle, 1, attempt)
                out = handle.exec("cat /workspace/ready /workspace/answer")
                on_step(handle, 2, attempt)
                done = handle.exec("echo done")
                reward = float(out.stdout == f"ready\n{task.id}\n" and done.stdout == "done\n")
                with lock:
                    result.rewards[task.id] = reward
                return
            except SandboxLostError:
                assert not handle.is_alive()
                with lock:
                    result.retried.append(task.id)
            finally:
                fleet.release(handle)

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(episode, tasks))
    result.seconds = time.monotonic() - started
    return result


def write_rows(path: Path, n: int, images: list[str], missing: int = 0) -> Path:
    """``n`` SWE-bench-shaped rows over ``images`` (their instance ids are the
    images' own, so the SWE-bench convention picks them); ``missing`` rows
    more whose image is not in the store."""
    lines = []
    for i in range(n):
        image = images[i % len(images)]
        key = image.split("sweb.eval.x86_64.")[1].split(":")[0]
        repo = key.split("_1776_")[0]
        lines.append({
            "instance_id": f"{repo}__{key.split('_1776_')[1]}",
            "repo": f"{repo}/{repo}",
            "base_commit": f"{i:040x}",
            "problem_statement": f"episode {i}",
            "docker_image": image,  # the image of this row (several rows share one)
        })
        lines[-1]["instance_id"] += f"-ep{i}"
    for j in range(missing):
        lines.append({"instance_id": f"ghost__ghost-{j}", "repo": "ghost/ghost", "base_commit": "0" * 40,
                      "problem_statement": "its image is nowhere"})
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    return path


@pytest.fixture(params=["fake", "real", "real-warm"])
def make_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Fleet]:
    """Fleets of one kind: in-memory, real (cold starts), real with a warm pool per image."""
    made: list[Fleet] = []

    def make(**config: Any) -> Fleet:
        warm = 4 if request.param == "real-warm" else 0
        cfg = FleetConfig(resources=ResourceSpec(memory_limit=256), warm_per_template=warm, **config)
        if request.param == "fake":
            fleet: Fleet = FakeFleet(None, cfg)
            fleet.fail_start(lambda t: t.image is not None and "ghost" in t.image, cause="image_not_found")
        else:
            hub = request.getfixturevalue("hub")
            request.getfixturevalue("no_leftovers")
            fleet = SandboxFleet(hub, cfg)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.teardown(verify=False)


@pytest.fixture
def images(request: pytest.FixtureRequest, make_fleet: Callable[..., Fleet]) -> list[str]:
    if request.node.callspec.params["make_fleet"] != "fake":
        return request.getfixturevalue("swe_images")
    from conftest import INSTANCE_IDS

    from sandhub_rl import swebench_image

    return [swebench_image(i) for i in INSTANCE_IDS]


@pytest.mark.parametrize(
    ("make_fleet", "rows", "concurrency"),
    [("fake", 40, 8), ("real", 40, 8), ("real-warm", 40, 8),
     # the scale once, on the real fleet with warm pools (15-20 s on 2 busy cores);
     # marked `scale`, so `-m "not scale"` leaves it out of a quick run
     ("fake", 200, 16), pytest.param("real-warm", 200, 16, marks=pytest.mark.scale)],
    indirect=["make_fleet"],
)
def test_training_run_completes_and_leaves_nothing(
    make_fleet: Callable[..., Fleet], images: list[str], tmp_path: Path, rows: int, concurrency: int
) -> None:
    tasks = JsonlSource(write_rows(tmp_path / "swe.jsonl", rows, images), setup=SETUP).tasks()
    assert len({t.image for t in tasks}) == 3
    fleet = make_fleet()
    result = training_run(fleet, tasks, concurrency=concurrency)
    assert result.skipped == {} and result.retried == []
    assert result.rewards == {t.id: 1.0 for t in tasks}
    assert fleet.stats.acquired == fleet.stats.released == rows
    report = fleet.teardown(verify=True)
    assert report.clean and report.deleted_sandboxes == [], report
    print(f"\n{rows} episodes, {concurrency} concurrent: {result.seconds:.2f}s, "
          f"{rows / result.seconds:.1f} episodes/s, {fleet.stats.warm} warm / {fleet.stats.cold} cold")


def test_training_run_survives_a_missing_image_and_a_lost_sandbox(
    make_fleet: Callable[..., Fleet], images: list[str], tmp_path: Path
) -> None:
    tasks = JsonlSource(write_rows(tmp_path / "swe.jsonl", 12, images, missing=1), setup=SETUP).tasks()
    fleet = make_fleet()
    victim = tasks[5].id
    lost_ids: list[str] = []

    def on_step(handle: Any, step: int, attempt: int) -> None:
        if handle.task.id == victim and step == 1 and attempt == 1:  # lost mid-episode, once
            lost_ids.append(handle.sandbox_id)
            if isinstance(fleet, FakeFleet):
                fleet.lose(handle)
            else:
                sandhub.Hub(fleet.hub.url).get(handle.sandbox_id).delete()

    result = training_run(fleet, tasks, concurrency=4, on_step=on_step)
    assert result.skipped == {"ghost__ghost-0": "image_not_found"}
    assert result.retried == [victim] and len(lost_ids) == 1
    assert result.rewards == {t.id: 1.0 for t in tasks if not t.id.startswith("ghost")}
    assert fleet.stats.lost == 1 and fleet.stats.start_failures == 1
    assert fleet.teardown(verify=True).clean


def test_fake_fleet_injection_and_api() -> None:
    fleet = FakeFleet(None, FleetConfig())
    task = Task(id="t", template="default", files={"a": "x"}, setup=("cat a > b",))
    fleet.fail_start("t", cause="unschedulable", retryable=True, times=1)
    with pytest.raises(SandboxStartError) as info:
        fleet.acquire(task)
    assert info.value.cause == "unschedulable" and info.value.retryable
    handle = fleet.acquire(task)  # the fault was for one acquire only
    assert handle.exec("cat b").stdout == "x" and handle.exec("false").exit_code == 1
    assert handle.exec("echo a b >> b").exit_code == 0 and handle.exec("cat b").stdout == "xa b\n"
    assert handle.exec("exit 4").exit_code == 4 and handle.exec("cat nope").exit_code == 1
    with pytest.raises(sandhub.InvalidArgumentError, match="no sidecar grader"):
        handle.exec("true", container="grader")
    fleet.lose_after(1)
    doomed = fleet.acquire(task)
    doomed.exec("true")
    with pytest.raises(SandboxLostError):
        doomed.exec("true")
    assert not doomed.is_alive() and handle.is_alive()
    assert fleet.verify_teardown().left_sandboxes == [handle.sandbox_id]
    report = fleet.teardown()
    assert report.clean and report.deleted_sandboxes == [handle.sandbox_id]
    assert fleet.verify_teardown().left_sandboxes == []


async def async_training_run(fleet: Any, tasks: list[Task], concurrency: int) -> RunResult:
    """The asyncio trainer's side of ``training_run`` (same episode, same rules)."""
    result = RunResult()
    gate = asyncio.Semaphore(concurrency)

    async def episode(task: Task) -> None:
        async with gate:
            for _ in (1, 2):
                try:
                    handle = await fleet.acquire(task)
                except SandboxStartError as e:
                    result.skipped[task.id] = e.cause
                    return
                try:
                    await handle.exec(f"echo {task.id} > /workspace/answer")
                    out = await handle.exec("cat /workspace/ready /workspace/answer")
                    done = await handle.exec("echo done")
                    result.rewards[task.id] = float(out.stdout == f"ready\n{task.id}\n" and done.stdout == "done\n")
                    return
                except SandboxLostError:
                    assert not await handle.is_alive()
                    result.retried.append(task.id)
                finally:
                    await fleet.release(handle)

    started = time.monotonic()
    await asyncio.gather(*(episode(t) for t in tasks))
    result.seconds = time.monotonic() - started
    return result


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_async_training_run(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if kind == "real":
        request.getfixturevalue("no_leftovers")
        images = request.getfixturevalue("swe_images")
        fleet: Any = AsyncSandboxFleet(request.getfixturevalue("hub_url"), FleetConfig(resources=ResourceSpec(memory_limit=256)))
    else:
        from conftest import INSTANCE_IDS

        from sandhub_rl import swebench_image

        images = [swebench_image(i) for i in INSTANCE_IDS]
        fleet = AsyncFakeFleet(None, FleetConfig())
        fleet.fail_start(lambda t: t.image is not None and "ghost" in t.image)
    tasks = JsonlSource(write_rows(tmp_path / "swe.jsonl", 24, images, missing=1), setup=SETUP).tasks()

    async def main() -> RunResult:
        try:
            return await async_training_run(fleet, tasks, concurrency=6)
        finally:
            report = await fleet.teardown(verify=True)
            assert report.clean, report

    result = asyncio.run(main())
    assert result.skipped == {"ghost__ghost-0": "image_not_found"} and result.retried == []
    assert result.rewards == {t.id: 1.0 for t in tasks if not t.id.startswith("ghost")}
    assert fleet.stats.acquired == fleet.stats.released == 24


def test_async_fake_fleet_injection() -> None:
    async def main() -> None:
        fleet = AsyncFakeFleet(None, FleetConfig())
        task = Task(id="t", template="default", setup=("echo hi > a",))
        async with fleet.episode(task) as h:
            assert (await h.exec("cat a")).stdout == "hi\n" and await h.is_alive()
            fleet.lose(h)
            assert not await h.is_alive()
            with pytest.raises(SandboxLostError):
                await h.exec("true")
        fleet.fail_start("t", cause="exited_at_start", times=1)
        with pytest.raises(SandboxStartError, match="exited_at_start"):
            await fleet.acquire(task)
        kept = await fleet.acquire(task)
        assert fleet.live_handles() == [kept] and fleet.stats.lost == 1
        report = await fleet.teardown()
        assert report.deleted_sandboxes == [kept.sandbox_id] and (await fleet.verify_teardown()).clean

    asyncio.run(main())
