"""Orphan reaping: a real trainer process killed with SIGKILL leaves its
sandboxes and warm pool; reap_orphans (and ``python -m sandhub_rl reap``)
removes them only when its run is not alive, they are old enough, and it is
not a dry run. Runs on a hub of its own: a reap judges every fleet sandbox
on the hub, and the session hub's other tests must not be judged."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from sandhub_testing import running_hub

from sandhub_rl import FleetConfig, SandboxFleet, Task, new_run_id, reap_orphans
from sandhub_rl import naming

TRAINER = Path(__file__).with_name("trainer_proc.py")


@pytest.fixture(scope="module")
def reap_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sandhub.Hub]:
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("rl-reap-hub")) as proc:
        yield sandhub.Hub(proc.url)


def _killed_trainer(hub: sandhub.Hub, run_id: str, episodes: int = 3, warm: int = 1) -> list[str]:
    """Starts a trainer, waits for its sandboxes, SIGKILLs it; returns their ids."""
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        [sys.executable, str(TRAINER), hub.url, run_id, str(episodes), str(warm)],
        stdout=subprocess.PIPE, stderr=errors, text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # bounded: a stuck trainer fails the test
        line = proc.stdout.readline() if ready else ""
        if not line:
            errors.seek(0)
            pytest.fail(f"trainer said nothing in 60 s (exit {proc.poll()}):\n{errors.read()}")
        ids = json.loads(line)["sandboxes"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        errors.close()
    assert proc.returncode == -signal.SIGKILL
    return ids


def _exists(hub: sandhub.Hub, sandbox_id: str) -> bool:
    try:
        hub.get(sandbox_id)
        return True
    except sandhub.NotFoundError:
        return False


def _run_pools(hub: sandhub.Hub, run_id: str) -> list[str]:
    return [p.name for p in hub.pools.list() if (naming.parse_pool_name(p.name) or ("",))[0] == naming.run_hash(run_id)]


def test_reap_after_sigkill(reap_hub: sandhub.Hub) -> None:
    hub = reap_hub
    dead_run = new_run_id()
    ids = _killed_trainer(hub, dead_run)
    assert len(ids) == 3 and all(_exists(hub, i) for i in ids)
    [pool] = _run_pools(hub, dead_run)

    # A live run next to it, and a sandbox no fleet made.
    live = SandboxFleet(hub, FleetConfig())
    live_handle = live.acquire(Task(id="live", template="default"))
    foreign = hub.create(labels={"team": "not-rl"})
    try:
        dry = reap_orphans(hub, [live.run_id], min_age_s=0, dry_run=True)
        assert sorted(dry.deleted_sandboxes) == sorted(ids) and dry.deleted_pools == [pool]
        assert dry.orphan_runs == [dead_run] and live_handle.sandbox_id in dry.spared_alive
        assert all(_exists(hub, i) for i in ids) and _run_pools(hub, dead_run) == [pool]  # dry: nothing removed

        young = reap_orphans(hub, [live.run_id], min_age_s=3600)
        assert young.deleted_sandboxes == [] and young.deleted_pools == []
        assert set(ids) <= set(young.spared_young) and pool in young.spared_young
        assert all(_exists(hub, i) for i in ids)

        alive = reap_orphans(hub, [live.run_id, dead_run], min_age_s=0)
        assert alive.deleted_sandboxes == [] and set(ids) <= set(alive.spared_alive)

        reaped = reap_orphans(hub, [live.run_id], min_age_s=0)
        assert sorted(reaped.deleted_sandboxes) == sorted(ids) and reaped.deleted_pools == [pool]
        assert not any(_exists(hub, i) for i in ids) and _run_pools(hub, dead_run) == []
        assert live_handle.is_alive() and _exists(hub, foreign.id)
    finally:
        assert live.teardown().clean
        foreign.delete()


def test_reap_cli(reap_hub: sandhub.Hub) -> None:
    hub = reap_hub
    dead_run = new_run_id()
    ids = _killed_trainer(hub, dead_run, episodes=2, warm=0)
    base = [sys.executable, "-m", "sandhub_rl", "reap", "--hub", hub.url]

    out = subprocess.run([*base, "--alive-run-ids", "other-run,another", "--min-age-s", "0", "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["dry_run"] and sorted(report["deleted_sandboxes"]) == sorted(ids)
    assert all(_exists(hub, i) for i in ids)

    out = subprocess.run([*base, "--alive-run-ids", dead_run, "--min-age-s", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["deleted_sandboxes"] == []

    time.sleep(1.1)
    forgot = subprocess.run([*base, "--min-age-s", "1"], capture_output=True, text=True, timeout=60)
    assert forgot.returncode == 2 and "--alive-run-ids" in forgot.stderr  # never "reap everything" by omission
    assert all(_exists(hub, i) for i in ids)
    out = subprocess.run([*base, "--alive-run-ids", "--min-age-s", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(out.stdout)["deleted_sandboxes"]) == sorted(ids)
    assert not any(_exists(hub, i) for i in ids)

    bad = subprocess.run([*base, "--alive-run-ids", "--min-age-s", "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "min-age-s" in bad.stderr
    unreachable = subprocess.run([sys.executable, "-m", "sandhub_rl", "reap", "--hub", "http://127.0.0.1:1", "--alive-run-ids"],
                                 capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 2 and "reap failed" in unreachable.stderr


def test_reap_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="not one string"):
        reap_orphans("http://127.0.0.1:1", "run-1")
    with pytest.raises(ValueError, match="min_age_s"):
        reap_orphans("http://127.0.0.1:1", [], min_age_s=-5)
    with pytest.raises(TypeError, match="run id strings"):
        reap_orphans("http://127.0.0.1:1", [1, 2])  # type: ignore[list-item]
