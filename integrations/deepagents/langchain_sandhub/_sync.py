"""``SandhubSandbox``: deepagents' ``BaseSandbox`` over a blocking ``sandhub.Sandbox``."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import sandhub
from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from . import _ops as ops


class SandhubSandbox(BaseSandbox):
    """A deepagents sandbox backend on one Sandhub sandbox.

    Build it on a sandbox you already have (``SandhubSandbox(hub.create())``:
    you keep owning it) or with :meth:`create`, whose sandbox :meth:`close`
    deletes. ``execute`` runs through ``sh -c`` with stdout and stderr in
    the order written; past ``max_output_chars`` the output is cut and
    ``truncated`` set. deepagents' file tools run ``python3 -c`` scripts in
    the sandbox, so its template needs ``python3`` and a POSIX shell (the
    hub's default template has both: it is the host's ``/usr``, read-only).
    """

    def __init__(
        self,
        sandbox: sandhub.Sandbox,
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
    def create(
        cls,
        hub: sandhub.Hub,
        *,
        template: str | None = None,
        timeout: float = ops.DEFAULT_TIMEOUT_SECONDS,
        max_output_chars: int = ops.DEFAULT_MAX_OUTPUT_CHARS,
        **create_kwargs: Any,
    ) -> SandhubSandbox:
        """A new sandbox from ``template`` (the hub's default when None);
        ``create_kwargs`` go to ``hub.create`` (``labels``, ``env``, ``pool``...).
        :meth:`close` deletes it."""
        backend = cls(hub.create(template, **create_kwargs), timeout=timeout, max_output_chars=max_output_chars)
        backend._owned = True
        return backend

    @property
    def id(self) -> str:
        return self._sandbox.id

    @property
    def sandbox(self) -> sandhub.Sandbox:
        """The SDK sandbox underneath."""
        return self._sandbox

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        limit = self._timeout if timeout is None else timeout
        result = self._sandbox.commands.run(ops.execute_argv(command), timeout=limit)
        return ops.execute_response(result, limit, self._max_output_chars)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out: list[FileUploadResponse] = []
        for path, content in files:
            if (error := ops.path_error(path)) is not None:
                out.append(ops.refused_upload(path, error))
                continue
            try:
                result = self._upload(path, content)
            except sandhub.SandhubError as err:
                out.append(ops.refused_upload(path, ops.sdk_error(err)))
                continue
            out.append(ops.upload_response(path, result))
        return out

    def _upload(self, path: str, content: bytes) -> sandhub.CommandResult:
        if not ops.streams(content):
            return self._sandbox.commands.run(
                ops.upload_argv(path), stdin=ops.upload_stdin(content), timeout=self._timeout
            )
        proc = self._sandbox.commands.start(ops.upload_argv(path, raw=True))
        try:
            for chunk in ops.chunks(content):
                proc.write_stdin(chunk)
            proc.close_stdin()
        except (sandhub.NotFoundError, sandhub.FailedPreconditionError):
            # The script refused the path and stopped reading (gone, or its stdin closed)
            # before taking it all: its word is in its output.
            pass
        except BaseException:
            _kill_quietly(proc)
            raise
        return proc.wait()

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out: list[FileDownloadResponse] = []
        for path in paths:
            if (error := ops.path_error(path)) is not None:
                out.append(ops.refused_download(path, error))
                continue
            try:
                result = self._sandbox.commands.run(ops.download_argv(path), timeout=self._timeout)
            except sandhub.SandhubError as err:
                out.append(ops.refused_download(path, ops.sdk_error(err)))
                continue
            out.append(ops.download_response(path, result))
        return out

    def close(self) -> None:
        """Deletes the sandbox if :meth:`create` made it; otherwise leaves it."""
        if self._owned and not self._closed:
            self._closed = True
            try:
                self._sandbox.delete()
            except sandhub.NotFoundError:
                pass  # already gone: the goal of closing is reached

    def __enter__(self) -> SandhubSandbox:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _kill_quietly(proc: sandhub.ProcessHandle) -> None:
    """Stops a streamed upload that failed half-way (it may be gone already)."""
    try:
        proc.kill()
    except sandhub.SandhubError:
        pass
