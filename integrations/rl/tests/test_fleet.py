"""SandboxFleet against a real hub (local backend): acquire/setup/release,
image tasks mapped to templates, labels, warm pools, teardown."""

from __future__ import annotations

import threading
import time

import pytest
import sandhub

from sandhub_rl import (
    TASK_IMAGE,
    FleetConfig,
    FleetError,
    ResourceSpec,
    SandboxFleet,
    SandboxStartError,
    SidecarSpec,
    Task,
    TaskSetupError,
    TemplateSpec,
)
from sandhub_rl import naming

SMALL = ResourceSpec(memory_limit="256Mi")


@pytest.fixture
def fleet(hub: sandhub.Hub, no_leftovers: None) -> SandboxFleet:
    f = SandboxFleet(hub, FleetConfig(resources=SMALL))
    yield f
    report = f.teardown()
    assert report.clean, report


def test_template_task_files_setup_and_labels(fleet: SandboxFleet, hub: sandhub.Hub) -> None:
    task = Task(id="t-1", template="default", files={"in/a.txt": "alpha"}, setup=("cat in/a.txt > b.txt",))
    handle = fleet.acquire(task)
    assert handle.task is task and handle.sandbox.id == handle.sandbox_id and handle.target_container is None
    assert handle.exec("cat b.txt").stdout == "alpha"
    info = hub.get(handle.sandbox_id).info
    assert info.labels[naming.RUN_LABEL] == fleet.run_id
    assert info.labels[naming.MANAGED_LABEL] == "true" and info.labels[naming.TASK_LABEL] == "t-1"
    assert [sb.id for sb in hub.list(fleet.labels)] == [handle.sandbox_id]
    assert handle.is_alive()
    fleet.release(handle)
    fleet.release(handle)  # twice is fine
    with pytest.raises(sandhub.NotFoundError):
        hub.get(handle.sandbox_id)
    assert not handle.is_alive()
    with pytest.raises(FleetError, match="exec after release"):
        handle.exec("true")
    assert (fleet.stats.acquired, fleet.stats.released) == (1, 1)


def test_image_task_gets_a_template_of_its_image(fleet: SandboxFleet, hub: sandhub.Hub, swe_images: list[str]) -> None:
    with fleet.episode(Task(id="img", image=swe_images[0])) as h:
        out = h.exec("pwd; echo $SANDHUB_IMAGE_MARK; python3 -c 'print(6*7)'")
        assert out.stdout == "/srv/work\nfrom-image\n42\n", out  # the image's workdir, env and python
        template = hub.templates.get(h.sandbox.template)
        assert template.name.startswith("rl-img-")
        assert template.spec["image"] == swe_images[0] and template.spec["memory_mb"] == 256
    # the same image and limits give the same template: nothing new is put
    with fleet.episode(Task(id="img-2", image=swe_images[0])) as h2:
        assert h2.sandbox.template == template.name


def test_env_and_extra_labels(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig(labels={"team": "rl", naming.RUN_LABEL: "spoof"}, shutdown_after_s=600))
    try:
        with fleet.episode(Task(id="env", template="default", env={"TASK_MODE": "eval"})) as h:
            assert h.exec("echo $TASK_MODE").stdout == "eval\n"
            info = hub.get(h.sandbox_id).info
            assert info.labels["team"] == "rl" and info.labels[naming.RUN_LABEL] == fleet.run_id
            assert info.shutdown_at is not None
    finally:
        assert fleet.teardown().clean


def test_setup_failure_releases_the_sandbox(fleet: SandboxFleet, hub: sandhub.Hub) -> None:
    task = Task(id="bad-setup", template="default", setup=("true", "echo oops >&2; exit 3"))
    with pytest.raises(TaskSetupError, match="exit 3: oops") as info:
        fleet.acquire(task)
    assert info.value.result.exit_code == 3 and info.value.command == "echo oops >&2; exit 3"
    assert hub.list(fleet.labels) == []
    assert fleet.stats.setup_failures == 1


def test_the_local_hub_refuses_other_containers_and_sidecars(fleet: SandboxFleet, hub: sandhub.Hub) -> None:
    """A local sandbox is one container: exec(container=...) and a template with
    sidecars are the caller's INVALID_ARGUMENT (sidecars run on Kubernetes)."""
    with fleet.episode(Task(id="c", template="default")) as h:
        assert h.exec("echo ok", container=None).stdout == "ok\n"
        with pytest.raises(sandhub.InvalidArgumentError, match="one container"):
            h.exec("true", container="grader")
        assert h.is_alive()
    spec = TemplateSpec(sidecars=(SidecarSpec("grader", TASK_IMAGE, command=("sleep", "infinity")),))
    sidecar_fleet = SandboxFleet(hub, FleetConfig(template=spec))
    with pytest.raises(SandboxStartError) as info:
        sidecar_fleet.acquire(Task(id="s", image="sandhub/any:1"))
    assert info.value.cause == "invalid_template" and "sidecars" in info.value.message, info.value
    assert sidecar_fleet.teardown().clean


def test_warm_pool_serves_acquires_and_goes_at_teardown(hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig(resources=SMALL, warm_per_template=2))
    task = Task(id="warm", image=swe_images[1])
    first = fleet.acquire(task)  # makes the pool; this one may start cold
    [pool] = [p for p in hub.pools.list() if naming.parse_pool_name(p.name)]
    assert pool.template == first.sandbox.template and pool.replicas == 2
    hub.pools.wait_ready(pool.name, timeout=30)
    second = fleet.acquire(task)
    assert second.launch == "warm" and second.exec("python3 -c 'print(1)'").stdout == "1\n"
    assert hub.get(second.sandbox_id).labels[naming.RUN_LABEL] == fleet.run_id
    assert fleet.stats.warm >= 1
    left = fleet.verify_teardown()
    assert sorted(left.left_sandboxes) == sorted([first.sandbox_id, second.sandbox_id]) and left.left_pools == [pool.name]
    report = fleet.teardown(verify=True)
    assert report.clean and sorted(report.deleted_sandboxes) == sorted(left.left_sandboxes)
    assert report.deleted_pools == [pool.name]
    with pytest.raises(FleetError, match="torn down"):
        fleet.acquire(task)


def test_teardown_finds_sandboxes_this_process_never_saw(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig())
    h = fleet.acquire(Task(id="a", template="default"))
    stray = hub.create(labels={naming.RUN_LABEL: fleet.run_id, naming.MANAGED_LABEL: "true"})
    other = hub.create(labels={naming.RUN_LABEL: "another-run", naming.MANAGED_LABEL: "true"})
    try:
        report = fleet.teardown(verify=True)
        assert sorted(report.deleted_sandboxes) == sorted([h.sandbox_id, stray.id]) and report.clean
        assert hub.get(other.id).state == "Ready"  # another run's sandbox is not touched
        assert not fleet.live_handles()
    finally:
        other.delete()


def test_pool_or_template_removed_from_outside_is_recovered(hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig(resources=SMALL, warm_per_template=1))
    task = Task(id="recover", image=swe_images[2])
    try:
        fleet.release(fleet.acquire(task))
        [pool] = fleet.verify_teardown().left_pools
        hub.pools.delete(pool)  # an operator cleans up
        h = fleet.acquire(task)  # the pool is gone: a cold start instead
        assert h.launch == "cold" and h.exec("true").exit_code == 0
        template = h.sandbox.template
        fleet.release(h)
        hub.templates.delete(template)  # the image's template too
        h2 = fleet.acquire(task)  # put again under the same name
        assert h2.sandbox.template == template and hub.templates.get(template).spec["image"] == swe_images[2]
        assert fleet.stats.start_retries >= 2 and fleet.stats.start_failures == 0
    finally:
        assert fleet.teardown().clean


def test_sandbox_lost_during_setup_is_replaced(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = SandboxFleet(hub, FleetConfig())
    task = Task(id="slow-setup", template="default", setup=("sleep 1",))
    deleted: list[str] = []

    def delete_the_first() -> None:
        deadline = time.monotonic() + 10
        while not deleted and time.monotonic() < deadline:
            # Only once it is Ready, i.e. during the task's setup: a sandbox deleted
            # while still starting is a start that failed, not a lost sandbox.
            for sb in hub.list(fleet.labels):
                if sb.state == "Ready":
                    sb.delete()
                    deleted.append(sb.id)
            time.sleep(0.05)

    killer = threading.Thread(target=delete_the_first)
    killer.start()
    try:
        handle = fleet.acquire(task)
        killer.join()
        assert deleted and handle.sandbox_id not in deleted
        assert fleet.stats.start_retries >= 1 and handle.is_alive()
    finally:
        killer.join()
        assert fleet.teardown().clean
