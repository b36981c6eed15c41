"""The asyncio client: :class:`AsyncHub` and friends, the same names and
behaviour as the blocking ones with ``await``. All clients in a process
share one tokio runtime and work from any event loop; cancelling a task
drops its request."""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType
from typing import IO, Any, AsyncIterator, Mapping

from . import _common as c
from ._sandhub import NativeClient
from ._async_services import AsyncEnv, AsyncGym, AsyncImages, AsyncPools, AsyncTemplates
from ._sync import _grpc_default
from .errors import DeadlineExceededError, NotFoundError
from .types import (
    CommandResult,
    EntrypointStatus,
    FileEntry,
    ListeningPort,
    ProcessExitEvent,
    ProcessOutputEvent,
    SandboxInfo,
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
    """A started process (async): ``async for ev in handle.events()``."""

    def __init__(self, native: NativeClient, sandbox_id: str, stream: Any) -> None:
        self._native, self._sid, self._stream = native, sandbox_id, stream
        self.pid: int = stream.pid
        self.exit: ProcessExitEvent | None = None

    def __repr__(self) -> str:
        state = "running" if self.exit is None else f"exit_code={self.exit.exit_code}"
        return f"<AsyncProcessHandle pid={self.pid} sandbox={self._sid!r} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("a process handle is a live stream and cannot be pickled")

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
        """Waits for the exit, collecting the output not yet read."""
        out, err = bytearray(), bytearray()
        async for ev in self.events():
            if isinstance(ev, ProcessOutputEvent):
                (out if ev.stream == "stdout" else err).extend(ev.data)
        code = self.exit.exit_code if self.exit else -1
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def write_stdin(self, data: bytes | str) -> None:
        await self._native.write_stdin(self._sid, self.pid, data.encode() if isinstance(data, str) else bytes(data))

    async def close_stdin(self) -> None:
        await self._native.write_stdin(self._sid, self.pid, None)

    async def signal(self, sig: str | int = "SIGTERM") -> None:
        await self._native.signal(self._sid, self.pid, c.signal_name(sig))

    async def kill(self) -> None:
        await self.signal("SIGKILL")

    async def resize(self, rows: int, cols: int) -> None:
        await self._native.resize(self._sid, self.pid, rows, cols)


class AsyncCommands:
    """Runs commands in one sandbox (async)."""

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
        """Runs ``cmd`` to completion (never retried); ``container``: a sidecar of the
        sandbox's Pod (Kubernetes), see the blocking ``Commands.run``."""
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
        """Starts ``cmd``; returns once it runs."""
        stream = await self._native.start(self._sid, c.start_body(cmd, cwd, env, pty, rows, cols))
        return AsyncProcessHandle(self._native, self._sid, stream)


class AsyncFiles:
    """Workspace files (async), streamed in chunks."""

    def __init__(self, native: NativeClient, sandbox_id: str, max_download_size: int | None = None) -> None:
        self._native, self._sid = native, sandbox_id
        self.max_download_size = max_download_size

    def __repr__(self) -> str:
        return f"<AsyncFiles sandbox={self._sid!r}>"

    async def read(self, path: str) -> bytes:
        data: bytes = await self._native.read(self._sid, path, self.max_download_size)
        return data

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def read_to(self, path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        reader = await self._native.open_read(self._sid, path, self.max_download_size)
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as f:
                return await _drain(reader, f)
        return await _drain(reader, dest)

    async def write(self, path: str, data: c.Data, *, mode: int | None = None, append: bool = False) -> None:
        writer = self._native.open_write(self._sid, path, mode, append)
        try:
            for chunk in c.chunks_of(data):
                await writer.send(chunk)
        except BaseException:
            writer.abort()
            raise
        await writer.finish()

    async def list(self, path: str = ".") -> list[FileEntry]:
        listing = c.loads(await self._native.list_files(self._sid, path))
        return [FileEntry._from(e) for e in listing["entries"]]

    async def stat(self, path: str) -> FileEntry:
        raw = await self._native.stat(self._sid, path)
        if raw is None:
            raise NotFoundError(f"{path}: no such file or directory")
        return FileEntry._from(c.loads(raw))

    async def exists(self, path: str) -> bool:
        return (await self._native.stat(self._sid, path)) is not None

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._native.remove(self._sid, path, recursive)


async def _drain(reader: Any, out: IO[bytes]) -> int:
    n = 0
    while (chunk := await reader.next_chunk()) is not None:
        out.write(chunk)
        n += len(chunk)
    return n


class AsyncWatch:
    """A running watch: ``async for batch in watch``; ``close()`` stops it."""

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


class AsyncWatcher:
    """Filesystem watches in one sandbox (async)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<AsyncWatcher sandbox={self._sid!r}>"

    async def watch(self, path: str = ".", *, recursive: bool = True) -> AsyncWatch:
        return AsyncWatch(await self._native.watch(self._sid, path, recursive), path)


class AsyncPorts:
    """TCP servers inside the sandbox, reached through the hub (async)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<AsyncPorts sandbox={self._sid!r}>"

    def url(self, port: int) -> str:
        """The URL reaching ``port`` (ends in ``/``; no request is made)."""
        return self._native.port_url(self._sid, port)

    async def list(self) -> list[ListeningPort]:
        """What listens inside the sandbox, by port."""
        return [ListeningPort._from(p) for p in c.loads(await self._native.list_ports(self._sid))]

    async def wait(self, port: int, timeout: float = 30.0) -> str:
        """Waits until something listens on ``port``; returns its URL."""
        url: str = await self._native.wait_port(self._sid, port, timeout)
        return url


class AsyncSandbox:
    """One sandbox on a hub (async). ``async with`` deletes it on exit; pickles to its id."""

    def __init__(self, hub: AsyncHub, info: SandboxInfo) -> None:
        self._hub = hub
        self.info = info
        self.id: str = info.id
        self.commands = AsyncCommands(hub._native, info.id, hub.timeout)
        self.files = AsyncFiles(hub._native, info.id, hub.max_download_size)
        self.watcher = AsyncWatcher(hub._native, info.id)
        self.ports = AsyncPorts(hub._native, info.id)

    @property
    def state(self) -> str:
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
        return self._set(await self._hub._native.get(self.id))

    async def delete(self) -> None:
        await self._hub._native.delete(self.id)

    terminate = delete

    async def suspend(self) -> AsyncSandbox:
        return self._set(await self._hub._native.lifecycle(self.id, "suspend"))

    async def resume(self) -> AsyncSandbox:
        return self._set(await self._hub._native.lifecycle(self.id, "resume"))

    async def reset(self) -> AsyncSandbox:
        return self._set(await self._hub._native.lifecycle(self.id, "reset"))

    async def snapshot(self) -> Snapshot:
        return Snapshot._from(c.loads(await self._hub._native.snapshot(self.id)))

    async def fork(
        self, *, snapshot: str | Snapshot | None = None, labels: Mapping[str, str] | None = None
    ) -> AsyncSandbox:
        body: dict[str, Any] = {}
        if snapshot is not None:
            body["snapshot"] = snapshot if isinstance(snapshot, str) else snapshot.id
        if labels:
            body["labels"] = dict(labels)
        raw = await self._hub._native.fork(self.id, c.dumps(body))
        return AsyncSandbox(self._hub, SandboxInfo._from(c.loads(raw)))

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = c.loads(await self._hub._native.sandboxd_health())
        return result

    async def metadata(self) -> dict[str, Any]:
        result: dict[str, Any] = c.loads(await self._hub._native.sandboxd_metadata())
        return result


class AsyncHub:
    """A Sandhub hub, for asyncio; same arguments as :class:`Hub`."""

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
        self._native = NativeClient.hub(self.url, c.api_key(api_key), True)
        self.gym = AsyncGym(self._native)
        self.templates = AsyncTemplates(self._native)
        self.pools = AsyncPools(self._native)
        self.images = AsyncImages(self._native)

    def __repr__(self) -> str:
        return f"<AsyncHub url={self.url!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.url,))

    async def __aenter__(self) -> AsyncHub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Nothing to wait for: pooled connections close with the last user."""

    async def health(self) -> str:
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
        wait: bool = True,
        wait_timeout: float = 600.0,
    ) -> AsyncSandbox:
        """Creates a sandbox; with ``wait`` returns once it is Ready (never retried)."""
        body: dict[str, Any] = {}
        for k, v in (("template", template), ("pool", pool), ("shutdown_after_seconds", shutdown_after_seconds),
                     ("idle_timeout_seconds", idle_timeout_seconds)):
            if v is not None:
                body[k] = v
        if labels:
            body["labels"] = dict(labels)
        if env:
            body["env"] = dict(env)
        sb = AsyncSandbox(self, SandboxInfo._from(c.loads(await self._native.create(c.dumps(body)))))
        deadline = time.monotonic() + wait_timeout
        while wait and sb.state == "Pending":
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(f"sandbox {sb.id} not Ready after {wait_timeout}s")
            await asyncio.sleep(0.05)
            await sb.refresh()
        return sb

    async def get(self, sandbox: str | AsyncSandbox) -> AsyncSandbox:
        return AsyncSandbox(self, SandboxInfo._from(c.loads(await self._native.get(c.sandbox_id(sandbox)))))

    async def list(self, labels: Mapping[str, str] | None = None) -> list[AsyncSandbox]:
        raw = await self._native.list(c.dumps(dict(labels or {})))
        return [AsyncSandbox(self, SandboxInfo._from(s)) for s in c.loads(raw)]


class AsyncSandboxd:
    """One sandboxd without a hub (async); see :class:`sandhub.Sandboxd`."""

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
        self._native = NativeClient.sandboxd(target, _grpc_default(target, grpc_url), auth_token, True)
        self.commands = AsyncCommands(self._native, "", timeout)
        self.files = AsyncFiles(self._native, "", max_download_size)
        self.watcher = AsyncWatcher(self._native, "")

    def __repr__(self) -> str:
        return f"<AsyncSandboxd target={self.target!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.target,))

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = c.loads(await self._native.sandboxd_health())
        return result

    async def metadata(self) -> dict[str, Any]:
        result: dict[str, Any] = c.loads(await self._native.sandboxd_metadata())
        return result
