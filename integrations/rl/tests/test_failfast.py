"""Fail-fast against a real hub: what the local backend reports for each
start failure, and how long ``acquire`` waits before SandboxStartError."""

from __future__ import annotations

import threading
import time

import pytest
import sandhub
from sandhub_testing import free_port

from sandhub_rl import FailFastPolicy, FleetConfig, LookaheadWarmer, SandboxFleet, SandboxStartError, Task
from sandhub_rl import naming


def _fleet(hub: sandhub.Hub | str, **policy: object) -> SandboxFleet:
    ready = policy.pop("ready_timeout_s", 60.0)
    return SandboxFleet(hub, FleetConfig(fail_fast=FailFastPolicy(**policy), ready_timeout_s=ready))  # type: ignore[arg-type]


def _acquire_fails(fleet: SandboxFleet, task: Task) -> tuple[SandboxStartError, float]:
    started = time.monotonic()
    with pytest.raises(SandboxStartError) as info:
        fleet.acquire(task)
    return info.value, time.monotonic() - started


def test_image_not_in_store_fails_at_once(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = _fleet(hub, grace_s=30)
    err, took = _acquire_fails(fleet, Task(id="ghost", image="swebench/sweb.eval.x86_64.ghost_1776_ghost-1:latest"))
    assert err.cause == "image_not_found" and not err.retryable and err.task_id == "ghost"
    assert "no image" in err.message and isinstance(err.__cause__, sandhub.NotFoundError)
    assert took < 5.0, took  # not the 30 s grace, not the 60 s ready timeout
    assert fleet.stats.start_failures == 1 and fleet.stats.start_retries == 0
    assert fleet.teardown().clean


def test_invalid_image_name_fails_at_once(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = _fleet(hub, grace_s=30)
    err, took = _acquire_fails(fleet, Task(id="bad", image="-leading-dash:1"))  # the hub refuses it
    assert err.cause == "invalid_image" and isinstance(err.__cause__, sandhub.InvalidArgumentError)
    assert took < 5.0


def test_missing_template_fails_at_once(hub: sandhub.Hub, no_leftovers: None) -> None:
    err, took = _acquire_fails(_fleet(hub, grace_s=30), Task(id="t", template="no-such-template"))
    assert err.cause == "template_not_found" and took < 5.0


def test_oom_at_start_fails_at_once(hub: sandhub.Hub, no_leftovers: None) -> None:
    """The hub reports the entrypoint OOM-killed (sandboxd's record of its
    child, and the cgroup's OOM counter that only the hub reads): acquire
    fails at once with oom_at_start, and the sandbox is deleted."""
    hog = "x = bytearray(400 << 20); import time; time.sleep(600)"
    hub.templates.put("rl-oom", {"memory_mb": 32, "entrypoint": ["python3", "-c", hog]})
    hub.templates.put("rl-oom-ok", {"memory_mb": 1024, "entrypoint": ["python3", "-c", hog]})
    fleet = _fleet(hub, grace_s=30)
    try:
        err, took = _acquire_fails(fleet, Task(id="oom", template="rl-oom"))
        assert err.cause == "oom_at_start" and not err.retryable, err
        assert err.sandbox_id is not None and took < 10.0, took
        with pytest.raises(sandhub.NotFoundError):
            hub.get(err.sandbox_id)
        # the same entrypoint with room to run starts, and keeps running
        with fleet.episode(Task(id="ok", template="rl-oom-ok")) as h:
            assert h.sandbox.refresh().entrypoint.state == "Running"
    finally:
        assert fleet.teardown().clean
        hub.templates.delete("rl-oom")
        hub.templates.delete("rl-oom-ok")


def test_exit_at_start_fails_once_settled_and_exit_0_does_not(hub: sandhub.Hub, no_leftovers: None) -> None:
    """An entrypoint that exits non-zero just after the sandbox is Ready is
    caught by settle_s; one that exits 0 (an image whose command is a shell)
    is normal; a command that cannot run fails with entrypoint_not_started."""
    hub.templates.put("rl-crash", {"entrypoint": ["/bin/sh", "-c", "sleep 0.15; exit 4"]})
    hub.templates.put("rl-shell", {"entrypoint": ["/bin/sh"]})
    hub.templates.put("rl-noexe", {"entrypoint": ["/no/such/server"]})
    fleet = _fleet(hub, grace_s=30, settle_s=1.0)
    try:
        err, took = _acquire_fails(fleet, Task(id="crash", template="rl-crash"))
        assert err.cause == "exited_at_start" and "exited 4" in err.message, err
        assert took < 10.0
        err, _ = _acquire_fails(fleet, Task(id="noexe", template="rl-noexe"))
        assert err.cause == "entrypoint_not_started" and "No such file" in err.message, err
        with fleet.episode(Task(id="shell", template="rl-shell")) as h:
            assert h.exec("echo ok").stdout == "ok\n"
        # with settle_s=0 a crash after Ready is not waited for
        quick = _fleet(hub, settle_s=0)
        h = quick.acquire(Task(id="crash2", template="rl-crash"))
        quick.release(h)
        assert quick.teardown().clean
    finally:
        assert fleet.teardown().clean
        for t in ("rl-crash", "rl-shell", "rl-noexe"):
            hub.templates.delete(t)


def test_a_failed_start_check_fails_at_once(hub: sandhub.Hub, no_leftovers: None) -> None:
    """start_check says what "started" means beyond a living entrypoint."""
    fleet = _fleet(hub, grace_s=30, start_check="test -S /run/app.sock")
    try:
        err, took = _acquire_fails(fleet, Task(id="nosock", template="default"))
        assert err.cause == "start_check_failed" and not err.retryable and took < 10.0, err
        with pytest.raises(sandhub.NotFoundError):
            hub.get(err.sandbox_id)
    finally:
        assert fleet.teardown().clean


def test_start_failure_is_a_config_error_retried_for_grace_s(hub: sandhub.Hub, swe_images: list[str], no_leftovers: None) -> None:
    """sandboxd refuses to start (the template's user is not in the image):
    the hub answers FAILED_PRECONDITION "failed to start" and keeps nothing;
    a config error, so it is retried for grace_s (it may be fixed meanwhile)."""
    hub.templates.put("rl-baduser", {"image": swe_images[0], "user": "nobody-here"})
    try:
        fleet = _fleet(hub, grace_s=1.0, unschedulable_grace_s=30)
        err, took = _acquire_fails(fleet, Task(id="baduser", template="rl-baduser"))
        assert err.cause == "start_failed" and err.retryable and "unknown user" in err.message
        assert 1.0 <= took < 10.0, took
        assert hub.list(fleet.labels) == []
        # fixed while an acquire waits: it succeeds within its grace
        fleet = _fleet(hub, grace_s=30)
        fixer = threading.Timer(0.5, lambda: hub.templates.put("rl-baduser", {"image": swe_images[0], "user": "app"}))
        fixer.start()
        with fleet.episode(Task(id="fixed", template="rl-baduser")) as h:
            assert h.exec("id -u").stdout == "1000\n"
        fixer.join()
        assert fleet.stats.start_retries >= 1 and fleet.teardown().clean
    finally:
        hub.templates.delete("rl-baduser")


@pytest.mark.parametrize("warming", ["fixed", "lookahead"])
def test_a_template_that_cannot_start_stops_its_warm_pool(
    hub: sandhub.Hub, swe_images: list[str], no_leftovers: None, warming: str
) -> None:
    """The hub refills a pool of a template that cannot start with no back-off;
    once an acquire gives up on such a template its pool goes to 0."""
    hub.templates.put("rl-baduser2", {"image": swe_images[0], "user": "nobody-here"})
    warm = {"warm_per_template": 2} if warming == "fixed" else {"warmer": LookaheadWarmer(lookahead=4)}
    fleet = SandboxFleet(hub, FleetConfig(fail_fast=FailFastPolicy(grace_s=0.3), **warm))  # type: ignore[arg-type]
    bad, good = Task(id="bad", template="rl-baduser2"), Task(id="good", template="default")
    try:
        if warming == "lookahead":
            fleet.add_tasks([bad, good, bad])
        with pytest.raises(SandboxStartError, match="start_failed"):
            fleet.acquire(bad)
        pools = {p.template: p.replicas for p in hub.pools.list() if naming.parse_pool_name(p.name)}
        assert pools["rl-baduser2"] == 0, pools
        if warming == "lookahead":
            assert pools["default"] == 1  # the good template keeps its warmth
        with fleet.episode(good) as h:
            assert h.exec("true").exit_code == 0
    finally:
        assert fleet.teardown().clean
        hub.templates.delete("rl-baduser2")


def test_unschedulable_waits_for_its_grace(hub: sandhub.Hub, no_leftovers: None) -> None:
    """A sandbox larger than the tenant's memory quota: RESOURCE_EXHAUSTED at
    every create, retried for unschedulable_grace_s, not grace_s."""
    hub.templates.put("rl-huge", {"memory_mb": 1 << 23})
    try:
        fleet = _fleet(hub, grace_s=0.2, unschedulable_grace_s=1.5)
        err, took = _acquire_fails(fleet, Task(id="huge", template="rl-huge"))
        assert err.cause == "unschedulable" and err.retryable
        assert 1.5 <= took < 10.0, took
        assert fleet.stats.start_retries >= 2
        assert isinstance(err.__cause__, sandhub.ResourceExhaustedError)
    finally:
        hub.templates.delete("rl-huge")


def test_retryable_cause_waits_for_grace_s() -> None:
    """No hub at all (connection refused: UNAVAILABLE) is retried for grace_s."""
    fleet = _fleet(f"http://127.0.0.1:{free_port()}", grace_s=1.0, unschedulable_grace_s=30)
    err, took = _acquire_fails(fleet, Task(id="nohub", template="default"))
    assert err.cause == "unavailable" and err.retryable
    assert 1.0 <= took < 10.0, took
    assert err.waited_s >= 1.0


def test_fail_fast_off_waits_until_the_ready_timeout(hub: sandhub.Hub, no_leftovers: None) -> None:
    fleet = _fleet(hub, enabled=False, ready_timeout_s=1.5)
    err, took = _acquire_fails(fleet, Task(id="ghost", image="ghost/none:1"))
    assert err.cause == "image_not_found"
    assert 1.5 <= took < 10.0, took
