"""The hub's services beside sandboxes: Gym environments, templates, warm
pools, images and named volumes (``hub.gym``, ``hub.templates``,
``hub.pools``, ``hub.images``, ``hub.volumes``). ``_async_services.py`` is written by hand for asyncio;
``_sync_services.py``, the blocking face, is generated from it by
``scripts/unasync.py``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Mapping, Sequence

from . import _common as c
from ._sandhub import NativeClient
from .errors import DeadlineExceededError
from .types import Image, Pool, PrepullResult, PruneResult, StepResult, Template, Volume

__all__ = ["AsyncEnv", "AsyncGym", "AsyncTemplates", "AsyncPools", "AsyncImages", "AsyncVolumes"]


class AsyncEnv:
    """A Gym environment on the hub (``hub.gym.make``)."""

    def __init__(self, native: NativeClient, created: dict[str, Any]) -> None:
        self._native = native
        self.env_id: str = created["env_id"]
        self.observation_space: dict[str, Any] = created["observation_space"]
        self.action_space: dict[str, Any] = created["action_space"]
        self.closed = False

    def __repr__(self) -> str:
        return f"<AsyncEnv id={self.env_id!r}{' closed' if self.closed else ''}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.env_id,))

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Starts an episode; returns ``(observation, info)``."""
        body: dict[str, Any] = {}
        if seed is not None:
            body["seed"] = seed
        if options is not None:
            body["options"] = options
        out = c.loads(await self._native.gym_reset(self.env_id, c.dumps(body)))
        return out["observation"], out["info"]

    async def step(self, action: str) -> StepResult:
        """Runs one action; ``.astuple()`` gives gymnasium's 5-tuple."""
        return StepResult._from(c.loads(await self._native.gym_step(self.env_id, action)))

    async def close(self) -> None:
        """Deletes the environment and its sandbox (twice is fine)."""
        if not self.closed:
            self.closed = True
            await self._native.gym_close(self.env_id)

    async def __aenter__(self) -> AsyncEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncGym:
    """The hub's Gym-style environments (``hub.gym``)."""

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    def __repr__(self) -> str:
        return "<AsyncGym>"

    async def make(self, spec: Mapping[str, Any] | None = None, **kwargs: Any) -> AsyncEnv:
        """Creates an environment: ``template``, ``pool``, ``task``, ``reward``,
        ``termination``, ``max_episode_steps``... as in ``POST /gym/v1/envs``."""
        body = {**(spec or {}), **kwargs}
        return AsyncEnv(self._native, c.loads(await self._native.gym_make(c.dumps(body))))

    async def step_many(self, steps: Sequence[tuple[AsyncEnv | str, str]]) -> list[StepResult | Exception]:
        """One step in each ``(env, action)``, concurrently, in one round trip;
        a failed step's place holds its exception."""
        if not steps:
            return []
        pairs = [(e if isinstance(e, str) else e.env_id, a) for e, a in steps]
        return c.batch_results(await self._native.gym_step_many(c.batch_body(pairs)))


class AsyncTemplates:
    """Named templates (``hub.templates``)."""

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    def __repr__(self) -> str:
        return "<AsyncTemplates>"

    async def put(self, name: str, spec: Mapping[str, Any]) -> Template:
        """Creates or replaces a template."""
        return Template._from(c.loads(await self._native.put_named("template", name, c.dumps(dict(spec)))))

    async def get(self, name: str) -> Template:
        return Template._from(c.loads(await self._native.get_named("template", name)))

    async def list(self) -> list[Template]:
        return [Template._from(t) for t in c.loads(await self._native.list_named("template"))]

    async def delete(self, name: str) -> None:
        await self._native.delete_named("template", name)


class AsyncPools:
    """Warm pools (``hub.pools``)."""

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    def __repr__(self) -> str:
        return "<AsyncPools>"

    async def put(self, name: str, template: str, replicas: int) -> Pool:
        """Creates or resizes a pool of ``replicas`` warm sandboxes of ``template``."""
        body = c.dumps({"template": template, "replicas": replicas})
        return Pool._from(c.loads(await self._native.put_named("pool", name, body)))

    async def get(self, name: str) -> Pool:
        return Pool._from(c.loads(await self._native.get_named("pool", name)))

    async def list(self) -> list[Pool]:
        return [Pool._from(p) for p in c.loads(await self._native.list_named("pool"))]

    async def delete(self, name: str) -> None:
        """Deletes the pool and stops its warm sandboxes."""
        await self._native.delete_named("pool", name)

    async def wait_ready(self, name: str, replicas: int | None = None, timeout: float = 120.0) -> Pool:
        """Waits until ``replicas`` (default: the pool's own count) are ready."""
        deadline = time.monotonic() + timeout
        while True:
            pool = await self.get(name)
            if pool.ready >= (pool.replicas if replicas is None else replicas):
                return pool
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(f"pool {name}: {pool.ready} of {replicas or pool.replicas} ready after {timeout}s")
            await asyncio.sleep(0.1)


class AsyncVolumes:
    """Named volumes (``hub.volumes``): a tenant's disks that outlive
    sandboxes, each limited to its ``size_mb`` (local backend; Kubernetes
    answers ``UnimplementedError``)."""

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    def __repr__(self) -> str:
        return "<AsyncVolumes>"

    async def create(self, name: str, size_mb: int, labels: Mapping[str, str] | None = None) -> Volume:
        """Creates an empty volume; ``ConflictError`` if the name is taken."""
        body = c.dumps({"name": name, "size_mb": size_mb, "labels": dict(labels or {})})
        return Volume._from(c.loads(await self._native.put_named("volume", name, body)))

    async def get(self, name: str) -> Volume:
        return Volume._from(c.loads(await self._native.get_named("volume", name)))

    async def list(self) -> list[Volume]:
        return [Volume._from(v) for v in c.loads(await self._native.list_named("volume"))]

    async def delete(self, name: str) -> None:
        """Deletes the volume and every file in it."""
        await self._native.delete_named("volume", name)


class AsyncImages:
    """The hub's image store (``hub.images``; local backend). Each tenant
    sees and names only the images it imported itself."""

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    def __repr__(self) -> str:
        return "<AsyncImages>"

    async def list(self) -> list[Image]:
        return [Image._from(i) for i in c.loads(await self._native.images_list())]

    async def import_(self, path: str | os.PathLike[str], *, tag: str | None = None, ref: str | None = None) -> Image:
        """Imports an OCI layout directory, an OCI layout tar or a ``docker
        save`` tar; ``ref`` picks one image of a layout that holds several."""
        return Image._from(c.loads(await self._native.images_import(os.fspath(path), tag, ref)))

    async def pull(
        self, reference: str, *, tag: str | None = None, username: str | None = None, password: str | None = None
    ) -> Image:
        """Pulls ``reference`` (``[registry/]repo[:tag|@digest]``) into the hub's store, named
        ``tag`` (default: the reference); credentials, when given, are for this pull only."""
        return Image._from(c.loads(await self._native.images_pull(reference, tag, username, password)))

    async def prepull(self, references: Sequence[str], *, template: str | None = None) -> PrepullResult:
        """Pulls each reference where this tenant's sandboxes run (local: into the store;
        Kubernetes: onto the nodes ``template``'s Pods reach, by DaemonSet). One result per
        reference: a failed image is reported, not raised."""
        return PrepullResult._from(c.loads(await self._native.images_prepull(list(references), template)))

    async def remove(self, reference: str) -> Image:
        """Removes a tag, or (by id or last tag) the image; one a template or
        sandbox uses is a ``ConflictError``."""
        return Image._from(c.loads(await self._native.images_remove(reference)))

    async def prune(self) -> PruneResult:
        """Removes untagged images nothing uses, and layers no image needs."""
        return PruneResult._from(c.loads(await self._native.images_prune()))
