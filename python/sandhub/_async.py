"""The client: :class:`AsyncHub`, :class:`AsyncSandbox` and their parts.

The asyncio face (``_async.py``, written by hand) and the blocking face
(``_sync.py``, generated from it by ``scripts/unasync.py``) have the same
names, less the ``Async`` prefix, and the same behaviour. All clients in a
process share one tokio runtime. A blocking call releases the GIL while it
waits (threads overlap) and wakes often enough that Ctrl-C raises
``KeyboardInterrupt`` at once, aborting the request and leaving the objects
usable; an asyncio call works from any event loop, and cancelling its task
drops its request.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime
from types import TracebackType
from typing import IO, Any, AsyncIterator, Iterable, Literal, Mapping

from . import _common as c
from ._sandhub import NativeClient
from ._async_code import AsyncCode
from ._async_services import (
    AsyncEnv,
    AsyncGym,
    AsyncImages,
    AsyncPools,
    AsyncTemplates,
    AsyncVolumes,
    _read_into,
    _upload,
)
from .errors import DeadlineExceededError, NotFoundError
from .types import (
    CommandResult,
    EntrypointStatus,
    FileEntry,
    ListeningPort,
    ProcessExitEvent,
    ProcessOutputEvent,
    SandboxInfo,
    SandboxMetrics,
    SandboxUsage,
    Snapshot,
    WatchEvent,
)

__all__ = [
    "AsyncHub",
    "AsyncSandbox",
    "AsyncSandboxd",
    "AsyncCommands",
    "AsyncProcessHandle",
    "AsyncFiles",
    "AsyncWatcher",
    "AsyncWatch",
    "AsyncPorts",
]


class AsyncProcessHandle:
    """A started process. Iterate :meth:`events` for its output then its
    exit, or :meth:`wait` for all of it; :meth:`write_stdin`,
    :meth:`close_stdin`, :meth:`signal` and (with ``pty=True``) :meth:`resize`
    act on it while it runs."""

    def __init__(self, native: NativeClient, sandbox_id: str, stream: Any) -> None:
        self._native, self._sid, self._stream = native, sandbox_id, stream
        self.pid: int = stream.pid
        self.exit: ProcessExitEvent | None = None

    def __repr__(self) -> str:
        state = "running" if self.exit is None else f"exit_code={self.exit.exit_code}"
        return f"<AsyncProcessHandle pid={self.pid} sandbox={self._sid!r} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("a ProcessHandle is a live stream and cannot be pickled")

    async def events(self) -> AsyncIterator[ProcessOutputEvent | ProcessExitEvent]:
        """Output chunks in order, then one :class:`ProcessExitEvent`."""
        while True:
            raw = await self._stream.next_event()
            if raw is None:
                return
            ev = c.event(raw)
            if isinstance(ev, ProcessExitEvent):
                self.exit = ev
                yield ev
                return
            if ev.data:
                yield ev

    async def wait(self) -> CommandResult:
        """Waits for the exit; the output not yet read through :meth:`events`
        is in the result."""
        out, err = bytearray(), bytearray()
        async for ev in self.events():
            if isinstance(ev, ProcessOutputEvent):
                (out if ev.stream == "stdout" else err).extend(ev.data)
        code = self.exit.exit_code if self.exit else -1
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def write_stdin(self, data: bytes | str) -> None:
        """Sends bytes (or UTF-8 text) to the process's stdin."""
        await self._native.write_stdin(self._sid, self.pid, data.encode() if isinstance(data, str) else bytes(data))

    async def close_stdin(self) -> None:
        """Closes stdin (on a terminal: sends end-of-file)."""
        await self._native.write_stdin(self._sid, self.pid, None)

    async def signal(self, sig: str | int = "SIGTERM") -> None:
        """Sends ``SIGINT``, ``SIGTERM`` or ``SIGKILL`` (a name or its number)."""
        await self._native.signal(self._sid, self.pid, c.signal_name(sig))

    async def kill(self) -> None:
        """``signal("SIGKILL")``."""
        await self.signal("SIGKILL")

    async def resize(self, rows: int, cols: int) -> None:
        """Resizes the process's terminal (``pty=True`` only)."""
        await self._native.resize(self._sid, self.pid, rows, cols)


class AsyncCommands:
    """Runs commands in one sandbox (``sandbox.commands``)."""

    def __init__(self, native: NativeClient, sandbox_id: str, default_timeout: float | None = None) -> None:
        self._native, self._sid, self._timeout = native, sandbox_id, default_timeout

    def __repr__(self) -> str:
        return f"<AsyncCommands sandbox={self._sid!r}>"

    async def run(
        self,
        cmd: c.Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        container: str | None = None,
    ) -> CommandResult:
        """Runs ``cmd`` to completion: a ``str`` through ``/bin/sh -c``, a list as argv.

        ``container`` names one of the template's ``sidecars`` (Kubernetes): the
        command runs there, through the Pod's exec API (no ``cwd`` or ``env``).

        Never retried: a lost answer does not mean the command did not run."""
        body = c.exec_body(cmd, cwd, env, timeout if timeout is not None else self._timeout, stdin, container)
        return CommandResult._from(c.loads(await self._native.exec(self._sid, body)))

    async def start(
        self,
        cmd: c.Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> AsyncProcessHandle:
        """Starts ``cmd`` and returns at once with a :class:`AsyncProcessHandle`."""
        stream = await self._native.start(self._sid, c.start_body(cmd, cwd, env, pty, rows, cols))
        return AsyncProcessHandle(self._native, self._sid, stream)


class AsyncFiles:
    """The sandbox's workspace files (``sandbox.files``); paths are
    relative to the workspace. Reads and writes stream in chunks, so a
    large file never sits in memory whole."""

    def __init__(self, native: NativeClient, sandbox_id: str, max_download_size: int | None = None) -> None:
        self._native, self._sid = native, sandbox_id
        self.max_download_size = max_download_size

    def __repr__(self) -> str:
        return f"<AsyncFiles sandbox={self._sid!r}>"

    async def read(self, path: str) -> bytes:
        """The whole file. Raises :class:`ResponseTooLargeError` past
        ``max_download_size`` without downloading the rest."""
        data: bytes = await self._native.read(self._sid, path, self.max_download_size)
        return data

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The whole file decoded."""
        return (await self.read(path)).decode(encoding)

    async def read_to(self, path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Streams the file into a local path or binary file object; returns the byte count."""
        reader = await self._native.open_read(self._sid, path, self.max_download_size)
        return await _read_into(reader, dest)

    async def write(self, path: str, data: c.Data, *, mode: int | None = None, append: bool = False) -> None:
        """Writes bytes, text or a binary file object's contents, in chunks.

        Without ``append`` the file is replaced only once the whole body
        arrived; ``mode`` sets the permission bits of a new file. When
        reading ``data`` fails (or the call is interrupted or cancelled) the
        upload is aborted, and this raises once its request has ended: the
        file was not replaced."""
        await _upload(self._native.open_write(self._sid, path, mode, append), data)

    async def list(self, path: str = ".") -> list[FileEntry]:
        """The entries of a directory."""
        listing = c.loads(await self._native.list_files(self._sid, path))
        return [FileEntry._from(e) for e in listing["entries"]]

    async def stat(self, path: str) -> FileEntry:
        """The entry at ``path``; :class:`NotFoundError` when there is none."""
        raw = await self._native.stat(self._sid, path)
        if raw is None:
            raise NotFoundError(f"{path}: no such file or directory")
        return FileEntry._from(c.loads(raw))

    async def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return (await self._native.stat(self._sid, path)) is not None

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file or an empty directory (a full one needs ``recursive``)."""
        await self._native.remove(self._sid, path, recursive)


class AsyncWatch:
    """A running watch: iterate for batches of :class:`WatchEvent`; ``close()`` stops it."""

    def __init__(self, stream: Any, path: str) -> None:
        self._stream, self.path = stream, path

    def __repr__(self) -> str:
        return f"<AsyncWatch path={self.path!r}>"

    async def __aiter__(self) -> AsyncIterator[list[WatchEvent]]:
        while (raw := await self._stream.next_batch()) is not None:
            yield [WatchEvent._from(e) for e in c.loads(raw)]

    def close(self) -> None:
        self._stream.close()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncEvents:
    """The hub's lifecycle events for this API key's tenant (``GET /v1/events``):
    iterate for event dicts (``id``, ``type``, ``time``, ``sandbox_id``, ``pool``,
    ``labels``, ``details``); ``close()`` stops it. ``last_event_id`` is the id of
    the last event yielded: pass it to :meth:`AsyncHub.events` to resume."""

    def __init__(self, native: NativeClient, filter: dict[str, Any]) -> None:
        self._native, self._filter = native, filter
        self._stream: Any = None
        self.last_event_id: int | None = filter.get("last_event_id")

    def __repr__(self) -> str:
        return f"<AsyncEvents filter={self._filter!r}>"

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        self._stream = await self._native.events(c.dumps(self._filter))
        while (raw := await self._stream.next_event()) is not None:
            event: dict[str, Any] = c.loads(raw)
            self.last_event_id = event["id"]
            yield event

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    async def __aenter__(self) -> AsyncEvents:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncWatcher:
    """Filesystem watches in one sandbox (``sandbox.watcher``)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<AsyncWatcher sandbox={self._sid!r}>"

    async def watch(self, path: str = ".", *, recursive: bool = True) -> AsyncWatch:
        """Starts watching ``path``; returns once the watch is in place."""
        return AsyncWatch(await self._native.watch(self._sid, path, recursive), path)


class AsyncPorts:
    """TCP servers inside the sandbox, reached through the hub
    (``/v1/sandboxes/{id}/ports/{port}/...``: HTTP, SSE, WebSocket; send the
    hub's API key as a bearer token)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<AsyncPorts sandbox={self._sid!r}>"

    def url(self, port: int) -> str:
        """The URL reaching ``port`` (ends in ``/``; append the server's path;
        no request is made)."""
        return self._native.port_url(self._sid, port)

    async def list(self) -> list[ListeningPort]:
        """What listens inside the sandbox, by port."""
        return [ListeningPort._from(p) for p in c.loads(await self._native.list_ports(self._sid))]

    async def wait(self, port: int, timeout: float = 30.0) -> str:
        """Waits until something listens on ``port``; returns its URL.
        Raises ``DeadlineExceededError`` after ``timeout`` seconds."""
        url: str = await self._native.wait_port(self._sid, port, timeout)
        return url


class AsyncSandbox:
    """One sandbox on a hub. ``async with hub.create() as sb:`` deletes it on exit.

    Pickles to its id: send it to a worker and re-attach with ``hub.get(id)``."""

    def __init__(self, hub: AsyncHub, info: SandboxInfo) -> None:
        self._hub = hub
        self.info = info
        self.id: str = info.id
        self.commands = AsyncCommands(hub._native, info.id, hub.timeout)
        self.files = AsyncFiles(hub._native, info.id, hub.max_download_size)
        self.watcher = AsyncWatcher(hub._native, info.id)
        self.ports = AsyncPorts(hub._native, info.id)
        self.code = AsyncCode(hub._native, info.id)

    @property
    def state(self) -> str:
        """The state when last fetched (``refresh()`` updates it)."""
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return self.info.labels

    @property
    def template(self) -> str:
        return self.info.template

    @property
    def entrypoint(self) -> EntrypointStatus | None:
        """Its entrypoint's status when last fetched (see ``EntrypointStatus``)."""
        return self.info.entrypoint

    @property
    def usage(self) -> SandboxUsage | None:
        """Its latest usage sample and limits when last fetched (``refresh()``
        updates it); None while it is not running or not yet sampled."""
        return self.info.usage

    def __repr__(self) -> str:
        return f"<AsyncSandbox id={self.id!r} state={self.state!r} template={self.template!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.id,))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.delete()
        except NotFoundError:
            pass

    def _set(self, raw: str) -> AsyncSandbox:
        self.info = SandboxInfo._from(c.loads(raw))
        return self

    async def refresh(self) -> AsyncSandbox:
        """Fetches the sandbox's current state."""
        return self._set(await self._hub._native.get(self.id))

    async def delete(self) -> None:
        """Deletes the sandbox and everything in it."""
        await self._hub._native.delete(self.id)

    terminate = delete

    async def suspend(self) -> AsyncSandbox:
        """Stops the sandbox's processes, keeping its workspace."""
        return self._set(await self._hub._native.lifecycle(self.id, "suspend"))

    async def pause(self) -> AsyncSandbox:
        """Freezes the sandbox's processes in place (state ``Paused``): they
        keep their memory, open files and sockets and use no CPU until
        :meth:`resume`. Local backend only (Kubernetes answers UNIMPLEMENTED)."""
        return self._set(await self._hub._native.lifecycle(self.id, "pause"))

    async def resume(self) -> AsyncSandbox:
        """Starts a suspended sandbox again, or thaws a paused one."""
        return self._set(await self._hub._native.lifecycle(self.id, "resume"))

    async def reset(self) -> AsyncSandbox:
        """Drops every change to the workspace and kills every process."""
        return self._set(await self._hub._native.lifecycle(self.id, "reset"))

    async def metrics(self, *, since: datetime | float | None = None, step: int | None = None) -> SandboxMetrics:
        """The sandbox's CPU, memory, processes, disk and network over time
        (sampled each second; 15 minutes kept at 1 s, then an hour at 10 s),
        with the limits they are measured against. ``since``: a time or
        Unix seconds (default: all kept); ``step``: seconds per point, 1 to
        3600 (default 1)."""
        if isinstance(since, datetime):
            since = since.timestamp()
        start = None if since is None else max(0, int(since))
        raw = await self._hub._native.metrics(self.id, start, step)
        return SandboxMetrics._from(c.loads(raw))

    async def snapshot(self) -> Snapshot:
        """Keeps a copy of the workspace as it is now."""
        return Snapshot._from(c.loads(await self._hub._native.snapshot(self.id)))

    async def set_network(self, network: c.Network) -> AsyncSandbox:
        """Replaces the sandbox's own narrowing of its template's network
        (``PATCH /v1/sandboxes/{id}/network``): new connections and DNS
        queries follow it at once, open connections go on. It may narrow
        the template's policy, never widen it (:class:`InvalidArgumentError`
        naming the entry); ``"none"`` cuts the sandbox off, ``"egress"``
        goes back to the template's policy. A sandbox started without a
        gateway cannot be given one (:class:`FailedPreconditionError`)."""
        raw = await self._hub._native.set_network(self.id, c.dumps(c.network_json(network)))
        return self._set(raw)

    async def fork(
        self, *, snapshot: str | Snapshot | None = None, labels: Mapping[str, str] | None = None
    ) -> AsyncSandbox:
        """A new sandbox whose workspace starts as this one's (or a snapshot's)."""
        body: dict[str, Any] = {}
        if snapshot is not None:
            body["snapshot"] = snapshot if isinstance(snapshot, str) else snapshot.id
        if labels:
            body["labels"] = dict(labels)
        raw = await self._hub._native.fork(self.id, c.dumps(body))
        return AsyncSandbox(self._hub, SandboxInfo._from(c.loads(raw)))

    async def health(self) -> dict[str, Any]:
        """sandboxd's health (only where the backend reaches sandboxd: see :class:`AsyncSandboxd`)."""
        result: dict[str, Any] = c.loads(await self._hub._native.sandboxd_health())
        return result

    async def metadata(self) -> dict[str, Any]:
        """sandboxd's metadata (only where the backend reaches sandboxd: see :class:`AsyncSandboxd`)."""
        result: dict[str, Any] = c.loads(await self._hub._native.sandboxd_metadata())
        return result


class AsyncHub:
    """A Sandhub hub. ``url`` defaults to ``$SANDHUB_URL`` (else
    ``http://127.0.0.1:7070``), ``api_key`` to ``$SANDHUB_API_KEY``;
    ``timeout`` is the default for ``commands.run``; ``max_download_size``
    caps every ``files.read``."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        max_download_size: int | None = None,
    ) -> None:
        self.url = c.hub_url(url)
        self.timeout = timeout
        self.max_download_size = max_download_size
        self._native = NativeClient.hub(self.url, c.api_key(api_key), asynchronous=True)
        self.gym = AsyncGym(self._native)
        self.templates = AsyncTemplates(self._native)
        self.pools = AsyncPools(self._native)
        self.images = AsyncImages(self._native)
        self.volumes = AsyncVolumes(self._native)

    def __repr__(self) -> str:
        return f"<AsyncHub url={self.url!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.url,))

    async def __aenter__(self) -> AsyncHub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Releases nothing the process must wait for: connections are
        pooled and closed when the last object using them goes."""

    def events(
        self,
        *,
        sandbox: str | None = None,
        types: list[str] | None = None,
        labels: dict[str, str] | None = None,
        last_event_id: int | None = None,
    ) -> AsyncEvents:
        """Lifecycle events (see docs/events.md), filtered by sandbox id, event
        types and sandbox labels. ``last_event_id`` resumes after that id (``0``:
        everything the hub keeps); without it the stream starts at the newest
        event. Iterating opens the stream; it follows live events until closed."""
        f: dict[str, Any] = {"types": list(types or []), "labels": dict(labels or {})}
        if sandbox is not None:
            f["sandbox"] = sandbox
        if last_event_id is not None:
            f["last_event_id"] = last_event_id
        return AsyncEvents(self._native, f)

    async def health(self) -> str:
        """The hub's liveness answer (``ok``)."""
        text: str = await self._native.healthz()
        return text

    async def create(
        self,
        template: str | None = None,
        *,
        pool: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        shutdown_after_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
        idle_action: Literal["delete", "suspend", "pause"] | None = None,
        auto_resume: bool | None = None,
        network: c.Network | None = None,
        volumes: Iterable[Mapping[str, Any]] | None = None,
        wait: bool = True,
        wait_timeout: float = 600.0,
    ) -> AsyncSandbox:
        """Creates a sandbox (claimed from ``pool`` when given); with ``wait``
        returns once it is Ready. ``network`` narrows the template's (never
        widens it): ``"none"``, a :class:`NetworkPolicy` or the API's
        object, e.g. ``{"allow_out": ["pypi.org"]}``; it forces a cold
        start. ``idle_action`` is what ``idle_timeout_seconds`` does
        (``"delete"`` by default); with ``auto_resume`` a call that needs the
        sandbox running resumes it first when it is paused or suspended
        (local backend; both override the template's). ``volumes`` mounts
        named volumes besides the template's, each ``{"name": ..., "path":
        ..., "read_only": False}``; it forces a cold start. Never retried
        (it is not idempotent)."""
        body: dict[str, Any] = {}
        for k, v in (("template", template), ("pool", pool), ("shutdown_after_seconds", shutdown_after_seconds),
                     ("idle_timeout_seconds", idle_timeout_seconds), ("idle_action", idle_action),
                     ("auto_resume", auto_resume)):
            if v is not None:
                body[k] = v
        if labels:
            body["labels"] = dict(labels)
        if env:
            body["env"] = dict(env)
        if network is not None:
            body["network"] = c.network_json(network)
        if volumes:
            body["volumes"] = [dict(v) for v in volumes]
        sb = AsyncSandbox(self, SandboxInfo._from(c.loads(await self._native.create(c.dumps(body)))))
        deadline = time.monotonic() + wait_timeout
        while wait and sb.state == "Pending":
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(f"sandbox {sb.id} not Ready after {wait_timeout}s")
            await asyncio.sleep(0.05)
            await sb.refresh()
        return sb

    async def get(self, sandbox: str | AsyncSandbox) -> AsyncSandbox:
        """Attaches to an existing sandbox by id."""
        return AsyncSandbox(self, SandboxInfo._from(c.loads(await self._native.get(c.sandbox_id(sandbox)))))

    async def list(self, labels: Mapping[str, str] | None = None) -> list[AsyncSandbox]:
        """Sandboxes whose labels include every pair in ``labels``."""
        raw = await self._native.list(c.dumps(dict(labels or {})))
        return [AsyncSandbox(self, SandboxInfo._from(s)) for s in c.loads(raw)]


class AsyncSandboxd:
    """One sandboxd, without a hub (e.g. from inside a cluster).

    ``target`` is ``http://host:port`` (REST; ``grpc_url`` defaults to
    port 9090 of the same host) or a directory holding sandboxd's Unix
    sockets. Offers ``commands``, ``files``, ``watcher``, ``health()``
    and ``metadata()``."""

    def __init__(
        self,
        target: str,
        auth_token: str | None = None,
        *,
        grpc_url: str | None = None,
        max_download_size: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self.target = target
        self._native = NativeClient.sandboxd(
            target, c.grpc_default(target, grpc_url), auth_token, asynchronous=True
        )
        self.commands = AsyncCommands(self._native, "", timeout)
        self.files = AsyncFiles(self._native, "", max_download_size)
        self.watcher = AsyncWatcher(self._native, "")

    def __repr__(self) -> str:
        return f"<AsyncSandboxd target={self.target!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.target,))

    async def __aenter__(self) -> AsyncSandboxd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def health(self) -> dict[str, Any]:
        """``GET /v1/health`` (answers without a token)."""
        result: dict[str, Any] = c.loads(await self._native.sandboxd_health())
        return result

    async def metadata(self) -> dict[str, Any]:
        """``GET /v1/metadata``: the sandbox's published environment."""
        result: dict[str, Any] = c.loads(await self._native.sandboxd_metadata())
        return result
