"""The blocking client: :class:`Hub`, :class:`Sandbox` and their parts.

Every call releases the GIL while it waits (threads overlap) and wakes
often enough that Ctrl-C raises ``KeyboardInterrupt`` at once, aborting the
request and leaving the objects usable.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import IO, Any, Iterator, Mapping

from . import _common as c
from ._sandhub import NativeClient
from ._sync_services import Env, Gym, Images, Pools, Templates
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
    "Hub",
    "Sandbox",
    "Sandboxd",
    "Commands",
    "ProcessHandle",
    "Files",
    "Watcher",
    "Watch",
    "Ports",
]


class ProcessHandle:
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
        return f"<ProcessHandle pid={self.pid} sandbox={self._sid!r} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("a ProcessHandle is a live stream and cannot be pickled")

    def events(self) -> Iterator[ProcessOutputEvent | ProcessExitEvent]:
        """Output chunks in order, then one :class:`ProcessExitEvent`."""
        while True:
            raw = self._stream.next_event()
            if raw is None:
                return
            ev = c.event(raw)
            if isinstance(ev, ProcessExitEvent):
                self.exit = ev
                yield ev
                return
            if ev.data:
                yield ev

    def wait(self) -> CommandResult:
        """Waits for the exit; the output not yet read through :meth:`events`
        is in the result."""
        out, err = bytearray(), bytearray()
        for ev in self.events():
            if isinstance(ev, ProcessOutputEvent):
                (out if ev.stream == "stdout" else err).extend(ev.data)
        code = self.exit.exit_code if self.exit else -1
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def write_stdin(self, data: bytes | str) -> None:
        """Sends bytes (or UTF-8 text) to the process's stdin."""
        self._native.write_stdin(self._sid, self.pid, data.encode() if isinstance(data, str) else bytes(data))

    def close_stdin(self) -> None:
        """Closes stdin (on a terminal: sends end-of-file)."""
        self._native.write_stdin(self._sid, self.pid, None)

    def signal(self, sig: str | int = "SIGTERM") -> None:
        """Sends ``SIGINT``, ``SIGTERM`` or ``SIGKILL`` (a name or its number)."""
        self._native.signal(self._sid, self.pid, c.signal_name(sig))

    def kill(self) -> None:
        """``signal("SIGKILL")``."""
        self.signal("SIGKILL")

    def resize(self, rows: int, cols: int) -> None:
        """Resizes the process's terminal (``pty=True`` only)."""
        self._native.resize(self._sid, self.pid, rows, cols)


class Commands:
    """Runs commands in one sandbox (``sandbox.commands``)."""

    def __init__(self, native: NativeClient, sandbox_id: str, default_timeout: float | None = None) -> None:
        self._native, self._sid, self._timeout = native, sandbox_id, default_timeout

    def __repr__(self) -> str:
        return f"<Commands sandbox={self._sid!r}>"

    def run(
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
        return CommandResult._from(c.loads(self._native.exec(self._sid, body)))

    def start(
        self,
        cmd: c.Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> ProcessHandle:
        """Starts ``cmd`` and returns at once with a :class:`ProcessHandle`."""
        stream = self._native.start(self._sid, c.start_body(cmd, cwd, env, pty, rows, cols))
        return ProcessHandle(self._native, self._sid, stream)


class Files:
    """The sandbox's workspace files (``sandbox.files``); paths are
    relative to the workspace. Reads and writes stream in chunks, so a
    large file never sits in memory whole."""

    def __init__(self, native: NativeClient, sandbox_id: str, max_download_size: int | None = None) -> None:
        self._native, self._sid = native, sandbox_id
        self.max_download_size = max_download_size

    def __repr__(self) -> str:
        return f"<Files sandbox={self._sid!r}>"

    def read(self, path: str) -> bytes:
        """The whole file. Raises :class:`ResponseTooLargeError` past
        ``max_download_size`` without downloading the rest."""
        data: bytes = self._native.read(self._sid, path, self.max_download_size)
        return data

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The whole file decoded."""
        return self.read(path).decode(encoding)

    def read_to(self, path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Streams the file into a local path or binary file object; returns the byte count."""
        reader = self._native.open_read(self._sid, path, self.max_download_size)
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as f:
                return _drain(reader, f)
        return _drain(reader, dest)

    def write(self, path: str, data: c.Data, *, mode: int | None = None, append: bool = False) -> None:
        """Writes bytes, text or a binary file object's contents, in chunks.

        Without ``append`` the file is replaced only once the whole body
        arrived; ``mode`` sets the permission bits of a new file."""
        writer = self._native.open_write(self._sid, path, mode, append)
        try:
            for chunk in c.chunks_of(data):
                writer.send(chunk)
        except BaseException:
            writer.abort()
            try:
                writer.finish()
            except Exception:
                pass
            raise
        writer.finish()

    def list(self, path: str = ".") -> list[FileEntry]:
        """The entries of a directory."""
        listing = c.loads(self._native.list_files(self._sid, path))
        return [FileEntry._from(e) for e in listing["entries"]]

    def stat(self, path: str) -> FileEntry:
        """The entry at ``path``; :class:`NotFoundError` when there is none."""
        raw = self._native.stat(self._sid, path)
        if raw is None:
            raise NotFoundError(f"{path}: no such file or directory")
        return FileEntry._from(c.loads(raw))

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return self._native.stat(self._sid, path) is not None

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file or an empty directory (a full one needs ``recursive``)."""
        self._native.remove(self._sid, path, recursive)


def _drain(reader: Any, out: IO[bytes]) -> int:
    n = 0
    while (chunk := reader.next_chunk()) is not None:
        out.write(chunk)
        n += len(chunk)
    return n


class Watch:
    """A running watch: iterate for batches of :class:`WatchEvent`; ``close()`` stops it."""

    def __init__(self, stream: Any, path: str) -> None:
        self._stream, self.path = stream, path

    def __repr__(self) -> str:
        return f"<Watch path={self.path!r}>"

    def __iter__(self) -> Iterator[list[WatchEvent]]:
        while (raw := self._stream.next_batch()) is not None:
            yield [WatchEvent._from(e) for e in c.loads(raw)]

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Watcher:
    """Filesystem watches in one sandbox (``sandbox.watcher``)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<Watcher sandbox={self._sid!r}>"

    def watch(self, path: str = ".", *, recursive: bool = True) -> Watch:
        """Starts watching ``path``; returns once the watch is in place."""
        return Watch(self._native.watch(self._sid, path, recursive), path)


class Ports:
    """TCP servers inside the sandbox, reached through the hub
    (``/v1/sandboxes/{id}/ports/{port}/...``: HTTP, SSE, WebSocket; send the
    hub's API key as a bearer token)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<Ports sandbox={self._sid!r}>"

    def url(self, port: int) -> str:
        """The URL reaching ``port`` (ends in ``/``; append the server's path)."""
        return self._native.port_url(self._sid, port)

    def list(self) -> list[ListeningPort]:
        """What listens inside the sandbox, by port."""
        return [ListeningPort._from(p) for p in c.loads(self._native.list_ports(self._sid))]

    def wait(self, port: int, timeout: float = 30.0) -> str:
        """Waits until something listens on ``port``; returns its URL.
        Raises ``DeadlineExceededError`` after ``timeout`` seconds."""
        url: str = self._native.wait_port(self._sid, port, timeout)
        return url


class Sandbox:
    """One sandbox on a hub. ``with hub.create() as sb:`` deletes it on exit.

    Pickles to its id: send it to a worker and re-attach with ``hub.get(id)``."""

    def __init__(self, hub: Hub, info: SandboxInfo) -> None:
        self._hub = hub
        self.info = info
        self.id: str = info.id
        self.commands = Commands(hub._native, info.id, hub.timeout)
        self.files = Files(hub._native, info.id, hub.max_download_size)
        self.watcher = Watcher(hub._native, info.id)
        self.ports = Ports(hub._native, info.id)

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

    def __repr__(self) -> str:
        return f"<Sandbox id={self.id!r} state={self.state!r} template={self.template!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.id,))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.delete()
        except NotFoundError:
            pass

    def _set(self, raw: str) -> Sandbox:
        self.info = SandboxInfo._from(c.loads(raw))
        return self

    def refresh(self) -> Sandbox:
        """Fetches the sandbox's current state."""
        return self._set(self._hub._native.get(self.id))

    def delete(self) -> None:
        """Deletes the sandbox and everything in it."""
        self._hub._native.delete(self.id)

    terminate = delete

    def suspend(self) -> Sandbox:
        """Stops the sandbox's processes, keeping its workspace."""
        return self._set(self._hub._native.lifecycle(self.id, "suspend"))

    def resume(self) -> Sandbox:
        """Starts a suspended sandbox again."""
        return self._set(self._hub._native.lifecycle(self.id, "resume"))

    def reset(self) -> Sandbox:
        """Drops every change to the workspace and kills every process."""
        return self._set(self._hub._native.lifecycle(self.id, "reset"))

    def snapshot(self) -> Snapshot:
        """Keeps a copy of the workspace as it is now."""
        return Snapshot._from(c.loads(self._hub._native.snapshot(self.id)))

    def fork(self, *, snapshot: str | Snapshot | None = None, labels: Mapping[str, str] | None = None) -> Sandbox:
        """A new sandbox whose workspace starts as this one's (or a snapshot's)."""
        body: dict[str, Any] = {}
        if snapshot is not None:
            body["snapshot"] = snapshot if isinstance(snapshot, str) else snapshot.id
        if labels:
            body["labels"] = dict(labels)
        raw = self._hub._native.fork(self.id, c.dumps(body))
        return Sandbox(self._hub, SandboxInfo._from(c.loads(raw)))

    def health(self) -> dict[str, Any]:
        """sandboxd's health (only where the backend reaches sandboxd: see :class:`Sandboxd`)."""
        result: dict[str, Any] = c.loads(self._hub._native.sandboxd_health())
        return result

    def metadata(self) -> dict[str, Any]:
        """sandboxd's metadata (only where the backend reaches sandboxd: see :class:`Sandboxd`)."""
        result: dict[str, Any] = c.loads(self._hub._native.sandboxd_metadata())
        return result


class Hub:
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
        self._native = NativeClient.hub(self.url, c.api_key(api_key), False)
        self.gym = Gym(self._native)
        self.templates = Templates(self._native)
        self.pools = Pools(self._native)
        self.images = Images(self._native)

    def __repr__(self) -> str:
        return f"<Hub url={self.url!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.url,))

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases nothing the process must wait for: connections are
        pooled and closed when the last object using them goes."""

    def health(self) -> str:
        """The hub's liveness answer (``ok``)."""
        text: str = self._native.healthz()
        return text

    def create(
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
    ) -> Sandbox:
        """Creates a sandbox (claimed from ``pool`` when given); with ``wait``
        returns once it is Ready. Never retried (it is not idempotent)."""
        body: dict[str, Any] = {}
        for k, v in (("template", template), ("pool", pool), ("shutdown_after_seconds", shutdown_after_seconds),
                     ("idle_timeout_seconds", idle_timeout_seconds)):
            if v is not None:
                body[k] = v
        if labels:
            body["labels"] = dict(labels)
        if env:
            body["env"] = dict(env)
        sb = Sandbox(self, SandboxInfo._from(c.loads(self._native.create(c.dumps(body)))))
        deadline = time.monotonic() + wait_timeout
        while wait and sb.state == "Pending":
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(f"sandbox {sb.id} not Ready after {wait_timeout}s")
            time.sleep(0.05)
            sb.refresh()
        return sb

    def get(self, sandbox: str | Sandbox) -> Sandbox:
        """Attaches to an existing sandbox by id."""
        return Sandbox(self, SandboxInfo._from(c.loads(self._native.get(c.sandbox_id(sandbox)))))

    def list(self, labels: Mapping[str, str] | None = None) -> list[Sandbox]:
        """Sandboxes whose labels include every pair in ``labels``."""
        raw = self._native.list(c.dumps(dict(labels or {})))
        return [Sandbox(self, SandboxInfo._from(s)) for s in c.loads(raw)]


class Sandboxd:
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
        self._native = NativeClient.sandboxd(target, _grpc_default(target, grpc_url), auth_token, False)
        self.commands = Commands(self._native, "", timeout)
        self.files = Files(self._native, "", max_download_size)
        self.watcher = Watcher(self._native, "")

    def __repr__(self) -> str:
        return f"<Sandboxd target={self.target!r}>"

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.target,))

    def __enter__(self) -> Sandboxd:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def health(self) -> dict[str, Any]:
        """``GET /v1/health`` (answers without a token)."""
        result: dict[str, Any] = c.loads(self._native.sandboxd_health())
        return result

    def metadata(self) -> dict[str, Any]:
        """``GET /v1/metadata``: the sandbox's published environment."""
        result: dict[str, Any] = c.loads(self._native.sandboxd_metadata())
        return result


def _grpc_default(target: str, grpc_url: str | None) -> str | None:
    if grpc_url or not target.startswith(("http://", "https://")):
        return grpc_url
    from urllib.parse import urlsplit

    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.hostname}:9090"
