"""An in-memory fleet for unit tests of training loops: :class:`FakeFleet`
and :class:`FakeHandle`, with the blocking fleet's API and no hub
(:class:`AsyncFakeFleet` and :class:`AsyncFakeHandle`: the asyncio fleet's).

Commands are answered by a ``responder(handle, command) -> CommandResult``;
the default one understands just enough shell for scripted episodes:
``echo ARGS``, ``cat FILE...``, ``true``, ``false``, ``exit N`` and one
``> FILE`` / ``>> FILE`` redirection of any of them, against the handle's
``files`` (seeded from ``task.files``). Anything else exits 0 with no output.

Failures are injected, not simulated: :meth:`FakeFleet.fail_start` makes
acquires of matching tasks raise :class:`SandboxStartError`;
:meth:`FakeFleet.lose` and :meth:`FakeFleet.lose_after` make a sandbox
vanish, so ``is_alive()`` turns False and ``exec`` raises
:class:`SandboxLostError`, as on a hub.
"""

from __future__ import annotations

import itertools
import shlex
import threading
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Mapping

import sandhub

from ._core import exec_container, lost_error, target_container
from .config import FleetConfig
from .errors import FleetError, SandboxStartError, TaskSetupError
from .report import FleetStats, TeardownReport
from .tasks import Task
from .warming import PoolReadiness

__all__ = [
    "AsyncFakeFleet",
    "AsyncFakeHandle",
    "FakeFleet",
    "FakeHandle",
    "FakeSandbox",
    "Responder",
    "shell_responder",
]

Responder = Callable[["FakeHandle", str], sandhub.CommandResult]


@dataclass
class FakeSandbox:
    """The fake's sandbox: an id, labels, and a workspace as a dict."""

    id: str
    labels: dict[str, str]
    files: dict[str, bytes] = field(default_factory=dict)
    state: str = "Ready"


def _ok(stdout: str = "", code: int = 0, stderr: str = "") -> sandhub.CommandResult:
    return sandhub.CommandResult(code, stdout, stderr)


def shell_responder(handle: FakeHandle, command: str) -> sandhub.CommandResult:
    """The default responder (see the module docstring)."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        return _ok(code=2, stderr=f"sh: {e}\n")
    target, append = None, False
    for op in (">>", ">"):
        if op in words:
            i = words.index(op)
            if i + 1 >= len(words):
                return _ok(code=2, stderr="sh: syntax error: no file after redirection\n")
            target, append = words[i + 1], op == ">>"
            words = words[:i] + words[i + 2 :]
            break
    files = handle.sandbox.files
    if not words:
        result = _ok()
    elif words[0] == "echo":
        result = _ok(" ".join(words[1:]) + "\n")
    elif words[0] == "cat":
        out, err, code = [], [], 0
        for name in words[1:]:
            if name in files:
                out.append(files[name].decode("utf-8", "replace"))
            else:
                err.append(f"cat: can't open '{name}': No such file or directory\n")
                code = 1
        result = _ok("".join(out), code, "".join(err))
    elif words[0] == "true":
        result = _ok()
    elif words[0] == "false":
        result = _ok(code=1)
    elif words[0] == "exit":
        result = _ok(code=int(words[1]) if len(words) > 1 and words[1].isdigit() else 0)
    else:
        result = _ok()
    if target is not None:
        data = result.stdout.encode()
        files[target] = (files.get(target, b"") + data) if append else data
        result = _ok(code=result.exit_code, stderr=result.stderr)
    return result


class FakeHandle:
    """A :class:`~sandhub_rl.SandboxHandle` look-alike over a :class:`FakeSandbox`."""

    def __init__(self, fleet: FakeFleet, sandbox: FakeSandbox, task: Task) -> None:
        self._fleet = fleet
        self.sandbox = sandbox
        self.task = task
        self.sandbox_id = sandbox.id
        self.target_container: str | None = target_container(fleet.config, task)
        self.launch = "warm" if fleet.config.warm_per_template > 0 else "cold"
        self.released = False
        self.execs: list[str] = []
        self._lose_after: int | None = None

    def __repr__(self) -> str:
        return f"<FakeHandle {self.sandbox_id} task={self.task.id!r}>"

    def is_alive(self) -> bool:
        return not self.released and self.sandbox.state == "Ready" and self.sandbox_id in self._fleet._sandboxes

    def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        container: str | None = None,
    ) -> sandhub.CommandResult:
        in_container = exec_container(container, self.target_container)
        names = {s.name for s in self._fleet.config.template_spec().sidecars} if self.task.image else set()
        if in_container is not None and in_container not in names:
            raise sandhub.InvalidArgumentError(f"sandbox {self.sandbox_id} has no sidecar {in_container}")
        if self.released:
            raise FleetError(f"{self!r}: exec after release")
        if not self.is_alive():
            raise lost_error(self.sandbox_id, self.task, "deleted")
        if self._lose_after is not None and len(self.execs) >= self._lose_after:
            self._fleet.lose(self)
            raise lost_error(self.sandbox_id, self.task, "deleted during the call")
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        self.execs.append(command if in_container is None else f"[{in_container}] {command}")
        return self._fleet.responder(self, command)


@dataclass
class _StartFault:
    matches: Callable[[Task], bool]
    cause: str
    retryable: bool
    times: int | None


class FakeFleet:
    """In-memory fleet with ``acquire``/``release``/``episode``/``teardown``/
    ``verify_teardown``/``stats``/``run_id``/``labels`` as :class:`~sandhub_rl.SandboxFleet`.

    ``hub`` is accepted and ignored, so a test can build either fleet with
    the same call."""

    def __init__(
        self, hub: object = None, config: FleetConfig | None = None, *, responder: Responder | None = None
    ) -> None:
        self.config = config or FleetConfig()
        self.run_id = self.config.run_id
        self.stats = FleetStats()
        self.responder: Responder = responder or shell_responder
        self._sandboxes: dict[str, FakeSandbox] = {}
        self._live: dict[str, FakeHandle] = {}
        self._faults: list[_StartFault] = []
        self._loss_plan: list[tuple[Callable[[Task], bool], int]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._plan: list[Task] = []

    @property
    def labels(self) -> dict[str, str]:
        return {"sandhub-rl/run": self.run_id}

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown(verify=False)

    # ------------------------------------------------------------------ injection

    @staticmethod
    def _matcher(task: str | Callable[[Task], bool] | None) -> Callable[[Task], bool]:
        if task is None:
            return lambda t: True
        if isinstance(task, str):
            return lambda t: t.id == task
        return task

    def fail_start(
        self,
        task: str | Callable[[Task], bool] | None = None,
        *,
        cause: str = "image_not_found",
        retryable: bool = False,
        times: int | None = None,
    ) -> None:
        """Acquires of matching tasks (an id, a predicate, or all) raise
        ``SandboxStartError(cause)``, the next ``times`` of them or forever."""
        self._faults.append(_StartFault(self._matcher(task), cause, retryable, times))

    def lose(self, handle: FakeHandle) -> None:
        """The handle's sandbox vanishes now (as if deleted from outside)."""
        with self._lock:
            if self._sandboxes.pop(handle.sandbox_id, None) is not None:
                self.stats.lost += 1
        handle.sandbox.state = "Finished"

    def lose_after(self, execs: int, task: str | Callable[[Task], bool] | None = None) -> None:
        """Sandboxes of matching tasks acquired from now on vanish during
        their exec number ``execs + 1``."""
        self._loss_plan.append((self._matcher(task), execs))

    # ------------------------------------------------------------------ the fleet API

    def acquire(self, task: Task) -> FakeHandle:
        if self._closed:
            raise FleetError(f"fleet of run {self.run_id} is torn down")
        with self._lock:
            for i, planned in enumerate(self._plan):
                if planned is task or planned.id == task.id:
                    del self._plan[i]
                    break
            for fault in self._faults:
                if fault.matches(task) and (fault.times is None or fault.times > 0):
                    if fault.times is not None:
                        fault.times -= 1
                    self.stats.start_failures += 1
                    raise SandboxStartError("injected", cause=fault.cause, task_id=task.id, retryable=fault.retryable)
            sid = f"fake-{next(self._ids)}"
            sandbox = FakeSandbox(
                sid,
                {"sandhub-rl/managed": "true", "sandhub-rl/run": self.run_id, **self.config.labels},
                {k: v.encode() if isinstance(v, str) else bytes(v) for k, v in task.files.items()},
            )
            self._sandboxes[sid] = sandbox
            handle = FakeHandle(self, sandbox, task)
            self._live[sid] = handle
            self.stats.acquired += 1
            if handle.launch == "warm":
                self.stats.warm += 1
            else:
                self.stats.cold += 1
        for cmd in task.setup:
            result = handle.exec(cmd)
            if result.exit_code != 0:
                self.stats.setup_failures += 1
                self.release(handle)
                raise TaskSetupError(f"exit {result.exit_code}", task_id=task.id, command=cmd, result=result)
        handle.execs.clear()
        for matches, execs in self._loss_plan:  # counted from the episode's first exec, after setup
            if matches(task):
                handle._lose_after = execs
        return handle

    @contextmanager
    def episode(self, task: Task) -> Iterator[FakeHandle]:
        handle = self.acquire(task)
        try:
            yield handle
        finally:
            self.release(handle)

    def release(self, handle: FakeHandle) -> None:
        if handle.released:
            return
        handle.released = True
        with self._lock:
            self._live.pop(handle.sandbox_id, None)
            self._sandboxes.pop(handle.sandbox_id, None)
            self.stats.released += 1

    def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Plans ``tasks`` (the fake keeps no pools: every sandbox is ready at once)."""
        with self._lock:
            self._plan.extend(tasks)

    def planned_tasks(self) -> list[Task]:
        with self._lock:
            return list(self._plan)

    def wait_pools_ready(self, timeout: float = 60.0) -> PoolReadiness:
        return PoolReadiness()

    def make_vec_env(self, tasks: Iterable[Task], *, reward: Any, **kwargs: Any) -> Any:
        """A Gymnasium vector env whose episodes run on this fleet (see
        :mod:`sandhub_rl.vector`; needs ``gymnasium``)."""
        from .vector import make_vec_env

        return make_vec_env(self, tasks, reward=reward, **kwargs)

    def live_handles(self) -> list[FakeHandle]:
        with self._lock:
            return list(self._live.values())

    def teardown(self, verify: bool = True, wait_s: float = 60.0) -> TeardownReport:
        self._closed = True
        report = TeardownReport(run_id=self.run_id)
        with self._lock:
            report.deleted_sandboxes = list(self._sandboxes)
            for handle in self._live.values():
                handle.released = True
            self._live.clear()
            self._sandboxes.clear()
        if verify:
            report.verified = True
        return report

    def verify_teardown(self) -> TeardownReport:
        with self._lock:
            return TeardownReport(run_id=self.run_id, left_sandboxes=list(self._sandboxes), verified=True)


class AsyncFakeHandle:
    """The async face of a :class:`FakeHandle` (``await handle.exec(...)``)."""

    def __init__(self, inner: FakeHandle) -> None:
        self._inner = inner
        self.sandbox = inner.sandbox
        self.task = inner.task
        self.sandbox_id = inner.sandbox_id
        self.target_container = inner.target_container
        self.launch = inner.launch

    def __repr__(self) -> str:
        return f"<AsyncFakeHandle {self.sandbox_id} task={self.task.id!r}>"

    @property
    def released(self) -> bool:
        return self._inner.released

    @property
    def execs(self) -> list[str]:
        return self._inner.execs

    async def is_alive(self) -> bool:
        return self._inner.is_alive()

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        container: str | None = None,
    ) -> sandhub.CommandResult:
        return self._inner.exec(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, container=container)


class AsyncFakeFleet:
    """:class:`FakeFleet` with :class:`~sandhub_rl.AsyncSandboxFleet`'s
    ``await``-ing API, for unit tests of asyncio training loops. The
    injection methods (``fail_start``, ``lose``, ``lose_after``) and
    ``responder`` are the sync fleet's (``fleet.sync``)."""

    def __init__(
        self, hub: object = None, config: FleetConfig | None = None, *, responder: Responder | None = None
    ) -> None:
        self.sync = FakeFleet(hub, config, responder=responder)
        self._handles: dict[str, AsyncFakeHandle] = {}

    def __getattr__(self, name: str) -> Any:
        # config, run_id, stats, labels, planned_tasks, fail_start, lose_after...
        return getattr(self.sync, name)

    def lose(self, handle: AsyncFakeHandle | FakeHandle) -> None:
        self.sync.lose(handle._inner if isinstance(handle, AsyncFakeHandle) else handle)

    async def __aenter__(self) -> AsyncFakeFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.teardown(verify=False)

    async def acquire(self, task: Task) -> AsyncFakeHandle:
        handle = AsyncFakeHandle(self.sync.acquire(task))
        self._handles[handle.sandbox_id] = handle
        return handle

    async def release(self, handle: AsyncFakeHandle) -> None:
        self._handles.pop(handle.sandbox_id, None)
        self.sync.release(handle._inner)

    @asynccontextmanager
    async def episode(self, task: Task) -> AsyncIterator[AsyncFakeHandle]:
        handle = await self.acquire(task)
        try:
            yield handle
        finally:
            await self.release(handle)

    def live_handles(self) -> list[AsyncFakeHandle]:
        live = {h.sandbox_id for h in self.sync.live_handles()}
        return [h for sid, h in self._handles.items() if sid in live]

    async def add_tasks(self, tasks: Iterable[Task]) -> None:
        self.sync.add_tasks(tasks)

    async def wait_pools_ready(self, timeout: float = 60.0) -> PoolReadiness:
        return self.sync.wait_pools_ready(timeout)

    async def teardown(self, verify: bool = True, wait_s: float = 60.0) -> TeardownReport:
        self._handles.clear()
        return self.sync.teardown(verify, wait_s)

    async def verify_teardown(self) -> TeardownReport:
        return self.sync.verify_teardown()
