"""State and decisions the sync and async fleets share; no I/O here, so the
two front ends differ only in ``await``."""

from __future__ import annotations

import threading
import time
from typing import Any, Generic, TypeVar

import sandhub

from . import naming
from .config import FleetConfig
from .errors import FleetError, SandboxLostError, SandboxStartError
from .failfast import StartVerdict
from .report import FleetStats
from .tasks import Task

H = TypeVar("H")

#: The sandbox's own container (the one sandboxd runs in); a sidecar is
#: named (``SandboxHandle.target_container``, ``exec(container=...)``).
DEFAULT_CONTAINER: str | None = None


def image_template_spec(image: str, config: FleetConfig) -> dict[str, Any]:
    """The hub template an image task's sandboxes are made from."""
    return config.template_spec().template_fields(image)


def target_container(config: FleetConfig, task: Task) -> str | None:
    """Where a handle's ``exec`` runs by default: for an image task, the
    fleet's ``TemplateSpec.target_container``; else the sandbox's own."""
    return config.template_spec().target_container if task.image is not None else DEFAULT_CONTAINER


def exec_container(container: str | None, target: str | None) -> str | None:
    """The container an exec runs in: the one asked for, else the handle's
    target; None (the sandbox's own) where neither names one."""
    return container if container is not None else target


def lost_error(sandbox_id: str, task: Task, why: str) -> SandboxLostError:
    return SandboxLostError(f"sandbox {sandbox_id} of task {task.id} is gone ({why})", sandbox_id=sandbox_id, task_id=task.id)


def start_error(task: Task, verdict: StartVerdict, elapsed_s: float, sandbox_id: str | None) -> SandboxStartError:
    """The error ``acquire`` raises: the last failure's cause, and how long it waited."""
    message = verdict.message
    if verdict.kind != "fatal" or elapsed_s >= 1.0:
        message = f"{message} (gave up after {elapsed_s:.1f}s)"
    err = SandboxStartError(
        message, cause=verdict.cause, task_id=task.id, retryable=verdict.kind != "fatal", sandbox_id=sandbox_id
    )
    err.waited_s = elapsed_s
    return err


class StartFailure(Exception):
    """One failed start attempt, judged; the acquire loop decides what next."""

    def __init__(self, verdict: StartVerdict, sandbox_id: str | None = None) -> None:
        super().__init__(verdict.cause)
        self.verdict, self.sandbox_id = verdict, sandbox_id
        #: The template the failed start used, once known.
        self.template: str | None = None


#: Start failures that say the template itself cannot start: its warm pool
#: is shrunk to 0 when an acquire gives up on one (the local hub refills a
#: pool of such a template with no back-off, many failed starts a second).
BROKEN_TEMPLATE_CAUSES = frozenset({"start_failed", "exited_at_start", "start_check_failed", "template_not_found"})


class FleetCore(Generic[H]):
    """Config, run identity, caches and counters of one fleet."""

    def __init__(self, config: FleetConfig | None) -> None:
        self.config = config or FleetConfig()
        self.run_id = self.config.run_id
        self.stats = FleetStats()
        self._lock = threading.Lock()
        self._live: dict[str, H] = {}
        self._templates: dict[str, str] = {}  # image -> template name put this run
        self._pools: dict[str, str] = {}  # template -> this run's pool name
        # template -> this run's 0-replica pool: the kubernetes hub starts a
        # sandbox only through a pool of its template (a claim), cold or not.
        self._claim_pools: dict[str, str] = {}
        self._pool_sizes: dict[str, int] = {}  # template -> replicas last asked of its pool
        self._plan: list[Task] = []  # tasks announced with add_tasks, not yet acquired
        self._bad_images: set[str] = set()  # images whose template could not be put
        self._bad_templates: set[str] = set()  # templates whose sandboxes could not start
        self._closed = False

    @property
    def labels(self) -> dict[str, str]:
        """The labels every sandbox of the run carries (list by them)."""
        return {naming.RUN_LABEL: self.run_id}

    def live_handles(self) -> list[H]:
        """Handles acquired and not yet released."""
        with self._lock:
            return list(self._live.values())

    def _check_open(self) -> None:
        if self._closed:
            raise FleetError(f"fleet of run {self.run_id} is torn down")

    def _track(self, sandbox_id: str, handle: H) -> None:
        with self._lock:
            self._live[sandbox_id] = handle

    def _untrack(self, sandbox_id: str) -> bool:
        with self._lock:
            return self._live.pop(sandbox_id, None) is not None

    def _sandbox_labels(self, task: Task) -> dict[str, str]:
        return naming.sandbox_labels(self.run_id, task.id, self.config.labels)

    def _create_kwargs(self, task: Task) -> dict[str, Any]:
        kw: dict[str, Any] = {"labels": self._sandbox_labels(task), "wait": False}
        if task.env:
            kw["env"] = dict(task.env)
        if self.config.shutdown_after_s is not None:
            kw["shutdown_after_seconds"] = self.config.shutdown_after_s
        return kw

    def _pool_for(self, template: str, task: Task) -> str | None:
        """This run's pool of ``template`` when warm sandboxes can serve the
        task (a task with its own env needs a cold start)."""
        if (self.config.warm_per_template <= 0 and self.config.warmer is None) or task.env:
            return None
        return self._pools.get(template)

    def _claim_pool_needed(self, template: str, error: sandhub.NotFoundError) -> str | None:
        """A name for a 0-replica pool of ``template`` when ``error`` says the
        hub creates sandboxes only from pools (the kubernetes backend: "pool
        X not found" for a create by template) and the run has none yet."""
        if not error.message.startswith("pool ") or template in self._claim_pools:
            return None
        return naming.pool_name(self.run_id, template, time.time())

    def _want_pool(self, template: str, task: Task) -> str | None:
        """A name for a fixed-size pool to create for ``template`` at acquire,
        or None (lookahead pools are made by the warmer, not by acquire)."""
        if self.config.warm_per_template <= 0 or task.env or template in self._pools or template in self._bad_templates:
            return None
        return naming.pool_name(self.run_id, template, time.time())

    # ------------------------------------------------------------------ the plan (lookahead warming)

    def add_to_plan(self, tasks: list[Task]) -> None:
        with self._lock:
            self._plan.extend(tasks)

    def take_from_plan(self, task: Task) -> None:
        """Removes ``task`` (or the first planned task with its id) from the plan."""
        with self._lock:
            for i, planned in enumerate(self._plan):
                if planned is task or planned.id == task.id:
                    del self._plan[i]
                    return

    def planned(self) -> list[Task]:
        with self._lock:
            return list(self._plan)

    def window(self) -> list[Task]:
        """The planned tasks the warmer sizes pools for."""
        warmer = self.config.warmer
        if warmer is None:
            return []
        with self._lock:
            return self._plan[: warmer.lookahead]

    def pool_changes(self, templates: list[str | None]) -> list[tuple[str, str, int]]:
        """``(template, pool name, replicas)`` for every pool whose size must
        change so the pools match the warmer's plan for ``templates`` (the
        window's templates, None for tasks no warm sandbox serves)."""
        warmer = self.config.warmer
        if warmer is None:
            return []
        wanted = warmer.plan(templates)
        changes = []
        for template in list(dict.fromkeys([*wanted, *self._pool_sizes])):
            replicas = wanted.get(template, 0)
            if self._pool_sizes.get(template, 0) == replicas and (replicas == 0 or self._pools.get(template)):
                continue
            name = self._pools.get(template) or naming.pool_name(self.run_id, template, time.time())
            changes.append((template, name, replicas))
        return changes

    def _is_run_pool(self, name: str) -> bool:
        parsed = naming.parse_pool_name(name)
        return parsed is not None and parsed[0] == naming.run_hash(self.run_id)
