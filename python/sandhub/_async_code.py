"""The code interpreter (``sandbox.code``): stateful kernels in the sandbox,
with rich results.

Needs a template whose image has a kernel (``code-interpreter-v1``, built by
``dev/code-interpreter/build-image.py``). The blocking face (``_sync_code.py``)
is generated from this file by ``scripts/unasync.py``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from . import _common as c
from ._sandhub import NativeClient
from .errors import error_for
from .types import CodeContext, CodeResult, Execution, ExecutionError, ExecutionLogs

__all__ = ["AsyncCode", "AsyncCodeContexts"]


def _context_id(context: str | CodeContext) -> str:
    return context if isinstance(context, str) else context.id


class AsyncCodeContexts:
    """The sandbox's contexts (``sandbox.code.contexts``): each is one
    kernel. A default context per language is made on first use, so most
    callers never need these."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id

    def __repr__(self) -> str:
        return f"<AsyncCodeContexts sandbox={self._sid!r}>"

    async def create(
        self, *, language: str | None = None, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> CodeContext:
        """Starts a kernel (``language``: ``python``, the default) in ``cwd``
        (inside the workspace) with ``env`` on top of the sandbox's.
        :class:`ResourceExhaustedError` past the sandbox's context cap."""
        body: dict[str, Any] = {"language": language, "cwd": cwd, "env": dict(env or {})}
        raw = await self._native.code_create_context(self._sid, c.dumps(body))
        return CodeContext._from(c.loads(raw))

    async def list(self) -> list[CodeContext]:
        """Every context of the sandbox, with its state."""
        return [CodeContext._from(x) for x in c.loads(await self._native.code_list_contexts(self._sid))]

    async def restart(self, context: str | CodeContext) -> CodeContext:
        """Starts the context's kernel anew: its variables are gone, its id,
        language and cwd stay. Brings a ``dead`` context back."""
        raw = await self._native.code_restart_context(self._sid, _context_id(context))
        return CodeContext._from(c.loads(raw))

    async def delete(self, context: str | CodeContext) -> None:
        """Stops the context's kernel and forgets it."""
        await self._native.code_delete_context(self._sid, _context_id(context))


class AsyncCode:
    """Runs code in the sandbox's kernels (``sandbox.code``)."""

    def __init__(self, native: NativeClient, sandbox_id: str) -> None:
        self._native, self._sid = native, sandbox_id
        self.contexts = AsyncCodeContexts(native, sandbox_id)

    def __repr__(self) -> str:
        return f"<AsyncCode sandbox={self._sid!r}>"

    async def run(
        self,
        code: str,
        *,
        context: str | CodeContext | None = None,
        language: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        on_result: Callable[[CodeResult], object] | None = None,
        on_error: Callable[[ExecutionError], object] | None = None,
    ) -> Execution:
        """Runs ``code`` in ``context``, or in the default context of
        ``language`` (``python``), and returns once it finished.

        The callbacks see each piece as it arrives. ``timeout`` (seconds;
        the hub's default is 300) interrupts the cell and keeps the context:
        the execution then has an ``error`` named ``TimeoutError``. An
        exception the code raises is ``Execution.error``, not raised here;
        what is raised is the hub's refusal or a lost connection. ``env`` is
        set in ``os.environ`` for this execution only.

        Never retried: a lost answer does not mean the code did not run."""
        body: dict[str, Any] = {"code": code, "env": dict(env or {})}
        if context is not None:
            body["context"] = _context_id(context)
        if language is not None:
            body["language"] = language
        if timeout is not None:
            body["timeout_seconds"] = max(1, math.ceil(timeout))
        stream = await self._native.code_run(self._sid, c.dumps(body))
        results: list[CodeResult] = []
        logs = ExecutionLogs()
        error: ExecutionError | None = None
        try:
            while True:
                raw = await stream.next_event()
                if raw is None:
                    # The native stream fails (never ends quietly) without an
                    # `end`; reaching here means it was closed under us.
                    raise error_for("UNAVAILABLE", "the code stream ended before its end event")
                event = c.loads(raw)
                kind = event.get("type")
                if kind == "stdout":
                    logs.stdout.append(event["text"])
                    if on_stdout:
                        on_stdout(event["text"])
                elif kind == "stderr":
                    logs.stderr.append(event["text"])
                    if on_stderr:
                        on_stderr(event["text"])
                elif kind == "result":
                    result = CodeResult._from(event)
                    results.append(result)
                    if on_result:
                        on_result(result)
                elif kind == "error":
                    error = ExecutionError._from(event)
                    if on_error:
                        on_error(error)
                elif kind == "end":
                    return Execution(
                        results=results,
                        logs=logs,
                        error=error,
                        execution_count=int(event.get("execution_count", 0)),
                        duration=float(event.get("duration", 0.0)),
                        dropped=int(event.get("dropped", 0)),
                    )
        finally:
            stream.close()
