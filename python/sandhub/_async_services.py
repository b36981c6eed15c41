"""The hub's services beside sandboxes: Gym environments, templates, warm
pools, images and named volumes (``hub.gym``, ``hub.templates``,
``hub.pools``, ``hub.images``, ``hub.volumes``). ``_async_services.py`` is written by hand for asyncio;
``_sync_services.py``, the blocking face, is generated from it by
``scripts/unasync.py``."""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from typing import IO, Any, Mapping, Sequence

from . import _common as c
from ._sandhub import NativeClient
from .errors import DeadlineExceededError, NotFoundError
from .types import FileEntry, Image, Pool, PrepullResult, PruneResult, StepResult, Template, Volume, VolumeSnapshot

__all__ = ["AsyncEnv", "AsyncGym", "AsyncTemplates", "AsyncPools", "AsyncImages", "AsyncVolumes", "AsyncVolumeFiles"]


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

    async def create(
        self,
        name: str,
        size_mb: int,
        labels: Mapping[str, str] | None = None,
        *,
        from_snapshot: str | None = None,
    ) -> Volume:
        """Creates an empty volume, or with ``from_snapshot="volume@snapshot"``
        a writable copy of one of your volume snapshots (independent of it
        from then on); ``ConflictError`` if the name is taken."""
        spec: dict[str, Any] = {"name": name, "size_mb": size_mb, "labels": dict(labels or {})}
        if from_snapshot is not None:
            spec["from_snapshot"] = from_snapshot
        return Volume._from(c.loads(await self._native.put_named("volume", name, c.dumps(spec))))

    async def get(self, name: str) -> Volume:
        return Volume._from(c.loads(await self._native.get_named("volume", name)))

    async def list(self) -> list[Volume]:
        return [Volume._from(v) for v in c.loads(await self._native.list_named("volume"))]

    async def delete(self, name: str) -> None:
        """Deletes the volume and every file in it (``ConflictError`` while
        it has snapshots)."""
        await self._native.delete_named("volume", name)

    def files(self, name: str, max_download_size: int | None = None) -> AsyncVolumeFiles:
        """The files of volume ``name``, read and written with no sandbox
        running (``hub.volumes.files("data").write("a.txt", b"...")``)."""
        return AsyncVolumeFiles(self._native, name, max_download_size)

    async def snapshot(self, name: str, snapshot: str) -> VolumeSnapshot:
        """Takes a read-only snapshot of the volume, at once whatever its size."""
        return VolumeSnapshot._from(c.loads(await self._native.volume_snapshot(name, snapshot)))

    async def snapshots(self, name: str) -> builtins.list[VolumeSnapshot]:
        """The volume's snapshots, by name."""
        listing = c.loads(await self._native.volume_snapshots(name))
        return [VolumeSnapshot._from(s) for s in listing]

    async def delete_snapshot(self, name: str, snapshot: str) -> None:
        """Deletes a snapshot; volumes cloned from it keep their files."""
        await self._native.volume_delete_snapshot(name, snapshot)


class AsyncVolumeFiles:
    """A named volume's files with no sandbox running
    (``hub.volumes.files(name)``), in the shapes of ``sandbox.files``.
    Paths are relative to the volume's root; a symbolic link anywhere on a
    path is refused (``PermissionDeniedError``), never followed."""

    def __init__(self, native: NativeClient, volume: str, max_download_size: int | None = None) -> None:
        self._native, self._volume = native, volume
        self.max_download_size = max_download_size

    def __repr__(self) -> str:
        return f"<AsyncVolumeFiles volume={self._volume!r}>"

    async def read(self, path: str) -> bytes:
        """The whole file. Raises :class:`ResponseTooLargeError` past
        ``max_download_size`` without downloading the rest."""
        data: bytes = await self._native.volume_read(self._volume, path, self.max_download_size)
        return data

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The whole file decoded."""
        return (await self.read(path)).decode(encoding)

    async def read_to(self, path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Streams the file into a local path or binary file object; returns the byte count."""
        reader = await self._native.volume_open_read(self._volume, path, self.max_download_size)
        return await _read_into(reader, dest)

    async def write(self, path: str, data: c.Data, *, mode: int | None = None) -> None:
        """Writes bytes, text or a binary file object's contents, in chunks,
        making the parents. The file is replaced only once the whole body
        arrived; a volume that fills up raises :class:`ResourceExhaustedError`
        (HTTP 507) and leaves nothing behind."""
        await _upload(self._native.volume_open_write(self._volume, path, mode), data)

    async def list(self, path: str = "") -> list[FileEntry]:
        """The regular files and directories in a directory (links are left out)."""
        listing = c.loads(await self._native.volume_list_files(self._volume, path))
        return [FileEntry._from(e) for e in listing["entries"]]

    async def stat(self, path: str) -> FileEntry:
        """The entry at ``path``; :class:`NotFoundError` when there is none."""
        raw = await self._native.volume_stat(self._volume, path)
        if raw is None:
            raise NotFoundError(f"{self._volume}:{path}: no such file or directory")
        return FileEntry._from(c.loads(raw))

    async def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return (await self._native.volume_stat(self._volume, path)) is not None

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file, a link (the link itself) or an empty directory (a
        full one needs ``recursive``)."""
        await self._native.volume_remove(self._volume, path, recursive)


async def _read_into(reader: Any, dest: str | os.PathLike[str] | IO[bytes]) -> int:
    """Streams a native reader into a local path or binary file object;
    the byte count (``files.read_to`` of sandboxes and volumes)."""
    if isinstance(dest, (str, os.PathLike)):
        with open(dest, "wb") as f:
            return await _read_into(reader, f)
    n = 0
    while (chunk := await reader.next_chunk()) is not None:
        dest.write(chunk)
        n += len(chunk)
    return n


async def _upload(writer: Any, data: c.Data) -> None:
    """Sends ``data`` in chunks through a native writer, then ends the
    upload (``files.write`` of sandboxes and volumes). When reading
    ``data`` fails (or the call is interrupted or cancelled), the body is
    failed first, then the request waited for: its answer (the abort's
    echo, or the hub's own error) yields to the caller's exception."""
    try:
        for chunk in c.chunks_of(data):
            await writer.send(chunk)
    except BaseException:
        writer.abort()
        try:
            await writer.finish()
        except Exception:
            pass
        raise
    await writer.finish()


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
