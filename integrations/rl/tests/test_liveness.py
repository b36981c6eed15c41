"""Liveness against a real hub: a sandbox deleted or killed from outside
mid-episode is noticed (is_alive False, SandboxLostError on exec), and the
next acquire gets a fresh one."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import sandhub
from sandhub_testing.hub import pids_with_mount

from sandhub_rl import FleetConfig, SandboxFleet, SandboxLostError, Task

TASK = Task(id="live", template="default", setup=("echo ready > state",))


def _kill_from_host(sandbox_id: str) -> None:
    """SIGKILL to every host process of the sandbox (each has its directory mounted)."""
    pids = pids_with_mount(sandbox_id)
    assert pids, f"no host process of {sandbox_id}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_deleted_mid_exec_raises_lost_and_next_acquire_is_fresh(hub_url: str, no_leftovers: None) -> None:
    fleet = SandboxFleet(hub_url, FleetConfig())
    outside = sandhub.Hub(hub_url)  # another client: an operator, a reaper
    handle = fleet.acquire(TASK)
    assert handle.exec("cat state").stdout == "ready\n" and handle.is_alive()
    timer = threading.Timer(0.5, lambda: outside.get(handle.sandbox_id).delete())
    timer.start()
    started = time.monotonic()
    with pytest.raises(SandboxLostError) as info:
        handle.exec("sleep 30")
    timer.join()
    assert time.monotonic() - started < 10
    assert info.value.sandbox_id == handle.sandbox_id and info.value.task_id == "live"
    assert isinstance(info.value, sandhub.SandboxLostError)  # the SDK's class catches it too
    assert not handle.is_alive()
    with pytest.raises(SandboxLostError):
        handle.exec("true")
    fleet.release(handle)  # releasing a lost sandbox is fine
    fresh = fleet.acquire(TASK)
    assert fresh.sandbox_id != handle.sandbox_id and fresh.is_alive()
    assert fresh.exec("cat state").stdout == "ready\n"
    assert fleet.stats.lost == 1
    assert fleet.teardown().clean


def test_killed_from_host_is_noticed(hub_url: str, no_leftovers: None) -> None:
    fleet = SandboxFleet(hub_url, FleetConfig())
    handle = fleet.acquire(TASK)
    _kill_from_host(handle.sandbox_id)
    deadline = time.monotonic() + 15
    while handle.is_alive():  # the hub marks it Finished within about a second
        assert time.monotonic() < deadline, "a killed sandbox still looks alive"
        time.sleep(0.1)
    with pytest.raises(SandboxLostError, match="gone"):
        handle.exec("true")
    fresh = fleet.acquire(TASK)
    assert fresh.exec("cat state").stdout == "ready\n"
    report = fleet.teardown()  # the Finished sandbox still carries the run's label: deleted too
    assert handle.sandbox_id in report.deleted_sandboxes and report.clean


def test_exec_right_after_a_host_kill_raises_lost(hub_url: str, no_leftovers: None) -> None:
    """Before the hub has noticed (UNAVAILABLE from the dead sandboxd) or
    after (FAILED_PRECONDITION on a Finished sandbox): either way, lost."""
    fleet = SandboxFleet(hub_url, FleetConfig())
    handle = fleet.acquire(TASK)
    _kill_from_host(handle.sandbox_id)
    time.sleep(0.2)
    deadline = time.monotonic() + 15
    while True:
        try:
            handle.exec("true")
        except SandboxLostError:
            break
        except sandhub.UnavailableError:  # the hub has not marked it yet; is_alive said Ready
            assert time.monotonic() < deadline
            time.sleep(0.1)
            continue
        assert time.monotonic() < deadline, "exec kept succeeding in a killed sandbox"
        time.sleep(0.1)
    assert fleet.teardown().clean
