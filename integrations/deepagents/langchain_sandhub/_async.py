"""``AsyncSandhubSandbox``: deepagents' ``BaseSandbox`` over ``sandhub.AsyncSandbox``.

The ``a*`` twins await the SDK directly. ``BaseSandbox`` also needs the sync
members; they run the same coroutine on a fresh event loop in a worker
thread, so they work whether or not the caller is inside a running loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import TracebackType
from typing import Any, Awaitable, Callable, TypeVar

import sandhub
from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from . import _ops as ops

T = TypeVar("T")


def _blocking(make: Callable[[], Awaitable[T]]) -> T:
    async def run() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


class AsyncSandhubSandbox(BaseSandbox):
    """:class:`~langchain_sandhub.SandhubSandbox` for asyncio: same
    construction (an ``AsyncSandbox``, or :meth:`create` on an ``AsyncHub``),
    same semantics; :meth:`aclose` deletes only a sandbox it created."""

    def __init__(
        self,
        sandbox: sandhub.AsyncSandbox,
        *,
        timeout: float = ops.DEFAULT_TIMEOUT_SECONDS,
        max_output_chars: int = ops.DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        self._sandbox = sandbox
        self._timeout = timeout
        self._max_output_chars = max_output_chars
        self._owned = False
        self._closed = False

    @classmethod
    async def create(
        cls,
        hub: sandhub.AsyncHub,
        *,
        template: str | None = None,
        timeout: float = ops.DEFAULT_TIMEOUT_SECONDS,
        max_output_chars: int = ops.DEFAULT_MAX_OUTPUT_CHARS,
        **create_kwargs: Any,
    ) -> AsyncSandhubSandbox:
        """A new sandbox from ``template`` (the hub's default when None);
        :meth:`aclose` deletes it."""
        sandbox = await hub.create(template, **create_kwargs)
        backend = cls(sandbox, timeout=timeout, max_output_chars=max_output_chars)
        backend._owned = True
        return backend

    @property
    def id(self) -> str:
        return self._sandbox.id

    @property
    def sandbox(self) -> sandhub.AsyncSandbox:
        """The SDK sandbox underneath."""
        return self._sandbox

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        limit = self._timeout if timeout is None else timeout
        result = await self._sandbox.commands.run(ops.execute_argv(command), timeout=limit)
        return ops.execute_response(result, limit, self._max_output_chars)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out: list[FileUploadResponse] = []
        for path, content in files:
            if (error := ops.path_error(path)) is not None:
                out.append(ops.refused_upload(path, error))
                continue
            try:
                result = await self._upload(path, content)
            except sandhub.SandhubError as err:
                out.append(ops.refused_upload(path, ops.sdk_error(err)))
                continue
            out.append(ops.upload_response(path, result))
        return out

    async def _upload(self, path: str, content: bytes) -> sandhub.CommandResult:
        if not ops.streams(content):
            return await self._sandbox.commands.run(
                ops.upload_argv(path), stdin=ops.upload_stdin(content), timeout=self._timeout
            )
        proc = await self._sandbox.commands.start(ops.upload_argv(path, raw=True))
        try:
            for chunk in ops.chunks(content):
                await proc.write_stdin(chunk)
            await proc.close_stdin()
        except (sandhub.NotFoundError, sandhub.FailedPreconditionError):
            # The script refused the path and stopped reading (gone, or its stdin closed)
            # before taking it all: its word is in its output.
            pass
        except BaseException:
            try:
                await proc.kill()
            except sandhub.SandhubError:
                pass  # gone already: nothing left to stop
            raise
        return await proc.wait()

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out: list[FileDownloadResponse] = []
        for path in paths:
            if (error := ops.path_error(path)) is not None:
                out.append(ops.refused_download(path, error))
                continue
            try:
                result = await self._sandbox.commands.run(ops.download_argv(path), timeout=self._timeout)
            except sandhub.SandhubError as err:
                out.append(ops.refused_download(path, ops.sdk_error(err)))
                continue
            out.append(ops.download_response(path, result))
        return out

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return _blocking(lambda: self.aexecute(command, timeout=timeout))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return _blocking(lambda: self.aupload_files(files))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return _blocking(lambda: self.adownload_files(paths))

    async def aclose(self) -> None:
        """Deletes the sandbox if :meth:`create` made it; otherwise leaves it."""
        if self._owned and not self._closed:
            self._closed = True
            try:
                await self._sandbox.delete()
            except sandhub.NotFoundError:
                pass  # already gone: the goal of closing is reached

    def close(self) -> None:
        _blocking(self.aclose)

    async def __aenter__(self) -> AsyncSandhubSandbox:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
