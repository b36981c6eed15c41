"""The fleet: :class:`AsyncSandboxFleet` and its :class:`AsyncSandboxHandle`.

``async_fleet.py`` is written by hand for asyncio; ``fleet.py``, the
blocking face, is generated from it by ``scripts/unasync.py``: the same
names, less the ``Async`` prefix (also of the SDK's classes it uses), and
the same behaviour. An asyncio fleet serves every episode task of an event loop;
a blocking one is thread-safe: a trainer runs its concurrent episodes in
threads (every SDK call releases the GIL), all through one fleet.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable, Mapping

import sandhub

from . import naming
from ._core import (
    BROKEN_TEMPLATE_CAUSES,
    FleetCore,
    StartFailure,
    exec_container,
    image_template_spec,
    lost_error,
    start_error,
    target_container,
)
from .config import FleetConfig
from .errors import FleetError, SandboxLostError, TaskSetupError
from .failfast import (
    StartVerdict,
    backoff,
    classify_entrypoint,
    classify_error,
    classify_state,
    should_retry,
    start_check_verdict,
)
from .report import FleetStats, TeardownReport
from .warming import PoolReadiness
from .tasks import Task

__all__ = ["AsyncSandboxFleet", "AsyncSandboxHandle"]

log = logging.getLogger("sandhub_rl")


class AsyncSandboxHandle:
    """One episode's sandbox, from ``fleet.acquire(task)`` until ``fleet.release``.

    ``sandbox`` is the SDK's ``sandhub.AsyncSandbox`` (files, processes, ports...);
    :meth:`exec` is the episode's command runner, which turns a vanished
    sandbox into :class:`~sandhub_rl.SandboxLostError`."""

    def __init__(self, fleet: AsyncSandboxFleet, sandbox: sandhub.AsyncSandbox, task: Task) -> None:
        self._fleet = fleet
        self.sandbox = sandbox
        self.task = task
        self.sandbox_id: str = sandbox.id
        #: Where :meth:`exec` runs when given no ``container``: the sandbox's own
        #: (None) or, for image tasks, the fleet's ``TemplateSpec.target_container``.
        self.target_container: str | None = target_container(fleet.config, task)
        self.launch: str = str(sandbox.info.launch or "")
        self._created_at = sandbox.info.created_at
        self._lost = False
        self.released = False

    def __repr__(self) -> str:
        state = "released" if self.released else ("lost" if self._lost else "live")
        return f"<AsyncSandboxHandle {self.sandbox_id} task={self.task.id!r} {state}>"

    async def is_alive(self) -> bool:
        """Whether the sandbox still exists, is Ready, and is the one this
        handle was given (not deleted, finished, expired or replaced). Asks the
        hub; a hub that cannot be reached raises its ``UnavailableError``."""
        if self.released or self._lost:
            return False
        try:
            info = (await self._fleet.hub.get(self.sandbox_id)).info
        except sandhub.NotFoundError:
            self._mark_lost()
            return False
        if info.state != "Ready" or info.created_at != self._created_at:
            self._mark_lost()
            return False
        return True

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            with self._fleet._lock:
                self._fleet.stats.lost += 1

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
        """Runs ``cmd`` (a string through ``/bin/sh -c``, a list as argv) to
        completion. Raises :class:`SandboxLostError` when the sandbox is gone
        (before or during the call); other hub errors pass through.
        ``container`` names a sidecar of the sandbox's Pod (Kubernetes);
        default: ``target_container``."""
        if self.released:
            raise FleetError(f"{self!r}: exec after release")
        if self._lost:
            raise lost_error(self.sandbox_id, self.task, "seen lost before")
        if timeout is None:
            timeout = self._fleet.config.exec_timeout_s
        try:
            return await self.sandbox.commands.run(
                cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin,
                container=exec_container(container, self.target_container),
            )
        except sandhub.NotFoundError as e:  # sandhub.SandboxLostError included
            self._mark_lost()
            raise lost_error(self.sandbox_id, self.task, e.message) from e
        except (sandhub.FailedPreconditionError, sandhub.UnavailableError, sandhub.InternalError) as e:
            if not await self._alive_or_unknown():
                raise lost_error(self.sandbox_id, self.task, e.message) from e
            raise

    async def _alive_or_unknown(self) -> bool:
        try:
            return await self.is_alive()
        except sandhub.SandhubError:
            return True  # the hub itself is in trouble: report its error, not a loss


class AsyncSandboxFleet:
    """Sandboxes for one training run on a hub.

    ``acquire(task)`` gives a ready sandbox of the task's image or template
    (warm from the run's pool when ``warm_per_template`` > 0) with the task's
    files and setup applied; ``release(handle)`` deletes it. Every sandbox
    carries the run's labels; ``teardown()`` removes whatever the run still
    has, and reports what is left."""

    def __init__(self, hub: sandhub.AsyncHub | str | None = None, config: FleetConfig | None = None) -> None:
        self.hub = hub if isinstance(hub, sandhub.AsyncHub) else sandhub.AsyncHub(hub)
        self._core: FleetCore[AsyncSandboxHandle] = FleetCore(config)
        self._pool_lock = asyncio.Lock()

    # ------------------------------------------------------------------ identity

    @property
    def config(self) -> FleetConfig:
        return self._core.config

    @property
    def run_id(self) -> str:
        return self._core.run_id

    @property
    def stats(self) -> FleetStats:
        """Counters of this fleet (acquired, warm, cold, lost, start failures...)."""
        return self._core.stats

    @property
    def _lock(self) -> threading.Lock:
        return self._core._lock

    @property
    def labels(self) -> dict[str, str]:
        """``hub.list(fleet.labels)`` lists the run's sandboxes."""
        return self._core.labels

    def __repr__(self) -> str:
        return f"<AsyncSandboxFleet run_id={self.run_id!r} live={len(self._core._live)}>"

    async def __aenter__(self) -> AsyncSandboxFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.teardown(verify=False)

    # ------------------------------------------------------------------ acquire / release

    async def acquire(self, task: Task) -> AsyncSandboxHandle:
        """A ready sandbox for ``task``, its files written and setup run.

        Raises :class:`SandboxStartError` when it cannot start (at once for
        causes that waiting cannot heal, after the policy's grace for the
        others; the sandbox, if one was made, is deleted) and
        :class:`TaskSetupError` when a setup command fails."""
        self._core._check_open()
        try:
            return await self._acquire(task)
        finally:
            if self.config.warmer is not None:
                self._core.take_from_plan(task)
                await self._rewarm()

    async def _acquire(self, task: Task) -> AsyncSandboxHandle:
        config = self.config
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                handle = await self._start(task)
                await self._setup(handle)
                return handle
            except SandboxLostError as e:  # gone during setup: a fresh sandbox may do
                failure = StartFailure(StartVerdict("lost_at_start", "retry", e.message), e.sandbox_id)
                failure.__cause__ = e
            except StartFailure as f:
                failure = f
            elapsed = time.monotonic() - started
            if should_retry(failure.verdict, config.fail_fast, elapsed, config.ready_timeout_s):
                with self._lock:
                    self.stats.start_retries += 1
                pause = backoff(config.fail_fast, attempt)
                await asyncio.sleep(max(0.0, min(pause, config.ready_timeout_s - elapsed)))
                continue
            with self._lock:
                self.stats.start_failures += 1
            if failure.template is not None and failure.verdict.cause in BROKEN_TEMPLATE_CAUSES:
                await self._retire_pool(failure.template)
            raise start_error(task, failure.verdict, elapsed, failure.sandbox_id) from failure.__cause__

    @asynccontextmanager
    async def episode(self, task: Task) -> AsyncIterator[AsyncSandboxHandle]:
        """``async with fleet.episode(task) as h:`` acquires, and releases at the end."""
        handle = await self.acquire(task)
        try:
            yield handle
        finally:
            await self.release(handle)

    async def release(self, handle: AsyncSandboxHandle) -> None:
        """Deletes the episode's sandbox (a lost one too). Twice is fine."""
        if handle.released:
            return
        handle.released = True
        self._core._untrack(handle.sandbox_id)
        try:
            await handle.sandbox.delete()
        except sandhub.NotFoundError:
            pass
        with self._lock:
            self.stats.released += 1

    # ------------------------------------------------------------------ one start attempt

    async def _template_for(self, task: Task) -> str:
        if task.template is not None:
            return task.template
        assert task.image is not None
        cached = self._core._templates.get(task.image)
        if cached is not None:
            return cached
        spec = image_template_spec(task.image, self.config)
        name = naming.image_template_name(spec)
        try:
            await self.hub.templates.put(name, spec)
        except sandhub.SandhubError as e:
            verdict = classify_error(e, "template")
            if verdict.kind == "fatal":
                self._core._bad_images.add(task.image)
            raise StartFailure(verdict) from e
        self._core._bad_images.discard(task.image)
        self._core._templates[task.image] = name
        return name

    async def _ensure_pool(self, template: str, task: Task) -> str | None:
        core = self._core
        if core._want_pool(template, task) is None:
            return core._pool_for(template, task) or None
        async with self._pool_lock:
            name = core._want_pool(template, task)
            if name is not None:
                try:
                    await self.hub.pools.put(name, template, self.config.warm_per_template)
                    core._pools[template] = name
                except sandhub.SandhubError as e:  # warmth is an optimisation: start cold
                    log.warning("sandhub-rl: no warm pool for template %s (%s); starting cold", template, e)
                    core._pools[template] = ""
        return core._pool_for(template, task) or None

    async def _start(self, task: Task) -> AsyncSandboxHandle:
        template = await self._template_for(task)
        try:
            handle = await self._start_from(task, template)
        except StartFailure as f:
            f.template = template
            raise
        self._core._bad_templates.discard(template)
        return handle

    async def _start_from(self, task: Task, template: str) -> AsyncSandboxHandle:
        pool = await self._ensure_pool(template, task) or self._core._claim_pools.get(template)
        kw = self._core._create_kwargs(task)
        try:
            sb = await (self.hub.create(pool=pool, **kw) if pool else self.hub.create(template, **kw))
        except sandhub.NotFoundError as e:
            if pool:  # our pool was removed from outside: forget it, start cold
                self._core._pools[template] = ""
                self._core._claim_pools.pop(template, None)
                raise StartFailure(StartVerdict("pool_gone", "retry", e.message)) from e
            claim_pool = self._core._claim_pool_needed(template, e)
            if claim_pool is not None:
                try:
                    await self.hub.pools.put(claim_pool, template, 0)
                except sandhub.SandhubError as put_error:
                    raise StartFailure(classify_error(put_error, "pool")) from put_error
                self._core._claim_pools[template] = claim_pool
                return await self._start_from(task, template)  # once: the pool is known now
            if task.image is not None and self._core._templates.pop(task.image, ""):
                # the image's template was removed from outside: put it again
                raise StartFailure(StartVerdict("template_gone", "retry", e.message)) from e
            raise StartFailure(classify_error(e, "create")) from e
        except sandhub.SandhubError as e:
            raise StartFailure(classify_error(e, "create")) from e
        try:
            await self._wait_ready(sb)
            await self._entrypoint_check(sb)
            await self._start_check(sb)
        except StartFailure as f:
            f.sandbox_id = sb.id
            await _delete_quietly(sb)
            raise
        except BaseException:  # interrupted or cancelled: do not leave the sandbox behind
            await asyncio.shield(_delete_quietly(sb))
            raise
        handle = AsyncSandboxHandle(self, sb, task)
        self._core._track(sb.id, handle)
        with self._lock:
            self.stats.acquired += 1
            if handle.launch == "warm":
                self.stats.warm += 1
            else:
                self.stats.cold += 1
        return handle

    async def _wait_ready(self, sb: sandhub.AsyncSandbox) -> None:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while True:
            verdict = classify_state(sb.state)
            if verdict is not None:
                raise StartFailure(verdict)
            if sb.state == "Ready":
                return
            if time.monotonic() >= deadline:
                raise StartFailure(StartVerdict("start_timeout", "retry", f"still {sb.state}"))
            await asyncio.sleep(0.05)
            try:
                await sb.refresh()
            except sandhub.SandhubError as e:
                raise StartFailure(classify_error(e, "wait")) from e

    async def _entrypoint_check(self, sb: sandhub.AsyncSandbox) -> None:
        # Bounded rounds: the age comes from the sandbox's own sandboxd.
        for _ in range(3):
            judged = classify_entrypoint(sb.entrypoint, self.config.fail_fast.settle_s)
            if isinstance(judged, StartVerdict):
                raise StartFailure(judged)
            if judged <= 0:
                return
            await asyncio.sleep(judged)
            try:
                await sb.refresh()
            except sandhub.SandhubError as e:
                raise StartFailure(classify_error(e, "wait")) from e

    async def _start_check(self, sb: sandhub.AsyncSandbox) -> None:
        check = self.config.fail_fast.start_check
        if not check:
            return
        try:
            result = await sb.commands.run(check, timeout=self.config.ready_timeout_s)
        except sandhub.SandhubError as e:
            raise StartFailure(classify_error(e, "wait")) from e
        if result.exit_code != 0:
            try:  # for the entrypoint's status
                await sb.refresh()
            except sandhub.SandhubError:
                pass
            raise StartFailure(start_check_verdict(check, result, sb.entrypoint))

    async def _setup(self, handle: AsyncSandboxHandle) -> None:
        task = handle.task
        try:
            for path, content in task.files.items():
                try:
                    await handle.sandbox.files.write(path, content)
                except sandhub.NotFoundError as e:
                    handle._mark_lost()
                    raise lost_error(handle.sandbox_id, task, e.message) from e
            for cmd in task.setup:
                result = await handle.exec(cmd, timeout=self.config.setup_timeout_s)
                if result.exit_code != 0:
                    with self._lock:
                        self.stats.setup_failures += 1
                    detail = (result.stderr or result.stdout).strip()[-500:]
                    raise TaskSetupError(f"exit {result.exit_code}: {detail}", task_id=task.id, command=cmd, result=result)
        except BaseException:
            await asyncio.shield(self.release(handle))
            raise

    async def _retire_pool(self, template: str) -> None:
        """Stops warming ``template`` (its sandboxes do not start): its pool
        goes to 0 until an acquire of it succeeds again (lookahead pools; a
        fixed-size pool stays at 0 for the rest of the run)."""
        core = self._core
        core._bad_templates.add(template)
        async with self._pool_lock:
            name = core._pools.get(template)
            if not name or core._pool_sizes.get(template) == 0:
                return
            try:
                await self.hub.pools.put(name, template, 0)
                core._pool_sizes[template] = 0
            except sandhub.SandhubError as e:
                log.warning("sandhub-rl: could not stop pool %s of failing template %s: %s", name, template, e)

    # ------------------------------------------------------------------ lookahead warming

    async def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Adds ``tasks`` to the plan of upcoming episodes (in order). With a
        ``warmer``, pools are resized at once for the new lookahead window;
        each acquire takes its task off the plan and resizes again."""
        batch = list(tasks)
        if not all(isinstance(t, Task) for t in batch):
            raise TypeError("add_tasks takes Task objects")
        self._core._check_open()
        self._core.add_to_plan(batch)
        await self._rewarm()

    def planned_tasks(self) -> list[Task]:
        """The tasks added with :meth:`add_tasks` and not yet acquired."""
        return self._core.planned()

    async def _rewarm(self) -> None:
        core = self._core
        if self.config.warmer is None or core._closed:
            return
        async with self._pool_lock:
            templates: list[str | None] = []
            for task in core.window():
                if task.env or (task.image is not None and task.image in core._bad_images):
                    templates.append(None)
                    continue
                try:
                    template = await self._template_for(task)
                except StartFailure:
                    templates.append(None)  # its acquire will say why
                    continue
                templates.append(None if template in core._bad_templates else template)
            for template, name, replicas in core.pool_changes(templates):
                try:
                    await self.hub.pools.put(name, template, replicas)
                except sandhub.SandhubError as e:
                    log.warning("sandhub-rl: could not size pool %s to %d: %s", name, replicas, e)
                    continue
                core._pools[template] = name
                core._pool_sizes[template] = replicas

    async def wait_pools_ready(self, timeout: float = 60.0) -> PoolReadiness:
        """Waits up to ``timeout`` seconds for the run's warm pools to be full;
        returns how ready they are (never raises: errors are in the result)."""
        started = time.monotonic()
        while True:
            readiness = PoolReadiness()
            try:
                for pool in await self.hub.pools.list():
                    if self._core._is_run_pool(pool.name):
                        readiness.pools[pool.name] = (pool.ready, pool.replicas)
                        readiness.ready += min(pool.ready, pool.replicas)
                        readiness.wanted += pool.replicas
            except sandhub.SandhubError as e:
                readiness.errors.append(str(e))
            readiness.waited_s = time.monotonic() - started
            if readiness.errors or readiness.ready >= readiness.wanted or readiness.waited_s >= timeout:
                return readiness
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------------ the end of a run

    async def teardown(self, verify: bool = True, wait_s: float = 60.0) -> TeardownReport:
        """Deletes the run's pools and every sandbox carrying its label (also
        ones this process never saw, e.g. from an earlier process of the same
        run), then, with ``verify``, lists again (until nothing is left, for
        up to ``wait_s``: a Kubernetes sandbox is listed until its Pod has
        terminated) and reports what is left. The fleet takes no acquires
        afterwards. An asyncio fleet deletes the sandboxes concurrently."""
        self._core._closed = True
        report = TeardownReport(run_id=self.run_id)
        for handle in self._core.live_handles():
            handle.released = True
            self._core._untrack(handle.sandbox_id)
        try:
            for pool in await self.hub.pools.list():
                if self._core._is_run_pool(pool.name) or pool.name in self._core._pools.values():
                    try:
                        await self.hub.pools.delete(pool.name)
                        report.deleted_pools.append(pool.name)
                    except sandhub.NotFoundError:
                        pass
        except sandhub.SandhubError as e:
            report.errors.append(f"pools: {e}")
        try:
            sandboxes = await self.hub.list(self.labels)

            async def delete(sb: sandhub.AsyncSandbox) -> None:
                try:
                    await sb.delete()
                    report.deleted_sandboxes.append(sb.id)
                except sandhub.NotFoundError:
                    pass
                except sandhub.SandhubError as e:
                    report.errors.append(f"{sb.id}: {e}")

            await asyncio.gather(*map(delete, sandboxes))
        except sandhub.SandhubError as e:
            report.errors.append(f"sandboxes: {e}")
        if verify:
            # A deleted sandbox stays listed until it is really gone (on
            # Kubernetes, until its Pod has terminated): list until nothing
            # is left, for up to ``wait_s``.
            deadline = time.monotonic() + wait_s
            left = await self.verify_teardown()
            while (left.left_sandboxes or left.left_pools) and not left.errors and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                left = await self.verify_teardown()
            report.left_sandboxes, report.left_pools = left.left_sandboxes, left.left_pools
            report.errors.extend(left.errors)
            report.verified = left.verified
        return report

    async def verify_teardown(self) -> TeardownReport:
        """Lists what the run still has on the hub, deleting nothing."""
        report = TeardownReport(run_id=self.run_id)
        try:
            report.left_sandboxes = [sb.id for sb in await self.hub.list(self.labels)]
            report.left_pools = [p.name for p in await self.hub.pools.list() if self._core._is_run_pool(p.name)]
            report.verified = True
        except sandhub.SandhubError as e:
            report.errors.append(f"verify: {e}")
        return report

    def make_vec_env(self, tasks: Iterable[Task], *, reward: Any, **kwargs: Any) -> Any:
        """A Gymnasium vector env whose episodes run on this fleet (see
        :mod:`sandhub_rl.vector`; needs ``gymnasium``). Blocking fleets only:
        Gymnasium's vector envs are blocking, and an asyncio fleet raises
        ``TypeError``."""
        from .vector import make_vec_env

        return make_vec_env(self, tasks, reward=reward, **kwargs)

    def live_handles(self) -> list[AsyncSandboxHandle]:
        """Handles acquired and not yet released."""
        return self._core.live_handles()


async def _delete_quietly(sb: sandhub.AsyncSandbox) -> None:
    try:
        await sb.delete()
    except sandhub.SandhubError as e:
        if not isinstance(e, sandhub.NotFoundError):
            log.warning("sandhub-rl: could not delete failed sandbox %s: %s", sb.id, e)
