"""Sandhub sandboxes for RL training loops.

A :class:`SandboxFleet` (or :class:`AsyncSandboxFleet`) hands one fresh
sandbox per episode to a trainer, built from the task's image or template,
and labels everything of a run with its ``run_id`` so that nothing outlives
it: ``teardown(verify=True)`` removes the run's sandboxes and pools and says
what is left, and :func:`reap_orphans` removes what crashed runs left.
Sandboxes that cannot start fail fast (:class:`SandboxStartError`), and a
sandbox lost mid-episode raises :class:`SandboxLostError` on ``exec``.
Tasks come from R2E-Gym and SWE-bench rows (:func:`load_tasks`), and
:mod:`sandhub_rl.testing` has an in-memory :class:`~sandhub_rl.testing.FakeFleet`
with the same API for unit tests of training loops::

    from sandhub_rl import FleetConfig, SandboxFleet, load_tasks
    tasks = load_tasks("swe.jsonl")
    with SandboxFleet("http://127.0.0.1:7070", FleetConfig()) as fleet:
        with fleet.episode(tasks[0]) as h:
            print(h.exec("git status").stdout)
"""

from __future__ import annotations

from .async_fleet import AsyncSandboxFleet, AsyncSandboxHandle
from .config import TASK_IMAGE, FailFastPolicy, FleetConfig, ResourceSpec, SidecarSpec, TemplateSpec, new_run_id
from .errors import FleetError, SandboxLostError, SandboxStartError, TaskSetupError, TaskSourceError
from .fleet import SandboxFleet, SandboxHandle
from .images import prepull, task_images
from .reap import ReapReport, reap_orphans
from .report import FleetStats, TeardownReport
from .warming import LookaheadWarmer, PoolReadiness
from .tasks import (
    ImageListSource,
    JsonlSource,
    Task,
    load_image_list,
    load_tasks,
    swebench_image,
    to_tasks,
)

__all__ = [
    "AsyncSandboxFleet",
    "AsyncSandboxHandle",
    "FailFastPolicy",
    "FleetConfig",
    "FleetError",
    "FleetStats",
    "ImageListSource",
    "JsonlSource",
    "LookaheadWarmer",
    "PoolReadiness",
    "ReapReport",
    "ResourceSpec",
    "SandboxFleet",
    "SandboxHandle",
    "SandboxLostError",
    "SandboxStartError",
    "SidecarSpec",
    "TASK_IMAGE",
    "Task",
    "TaskSetupError",
    "TaskSourceError",
    "TemplateSpec",
    "TeardownReport",
    "load_image_list",
    "load_tasks",
    "new_run_id",
    "prepull",
    "reap_orphans",
    "swebench_image",
    "task_images",
    "to_tasks",
]
