"""The fleet's exceptions.

A trainer needs to tell three things apart, because each calls for a
different reaction: the task's sandbox could not start (skip or re-queue the
task: :class:`SandboxStartError`), the sandbox went away mid-episode (abort
the episode, acquire again: :class:`SandboxLostError`), and the task itself
is malformed (fix the data: :class:`TaskSourceError`).
"""

from __future__ import annotations

from typing import Any

import sandhub

__all__ = [
    "FleetError",
    "SandboxStartError",
    "SandboxLostError",
    "TaskSetupError",
    "TaskSourceError",
]


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException:
    """Unpickles an error whose constructor takes keywords (trainers send
    errors between worker processes)."""
    return cls(*args, **kwargs)


class FleetError(Exception):
    """Base of the fleet's own failures (hub errors stay ``sandhub.SandhubError``)."""


class SandboxStartError(FleetError):
    """A task's sandbox could not start.

    ``cause`` is a short word a trainer can switch on (``image_not_found``,
    ``invalid_image``, ``template_not_found``, ``invalid_template``,
    ``exited_at_start``, ``start_check_failed``, ``unschedulable``,
    ``unavailable``, ``timeout``, ...); ``retryable`` says whether the same
    task may start later (the fleet already waited its grace for those);
    ``task_id`` names the task; ``sandbox_id`` the sandbox that was made and
    deleted again, if any; ``__cause__`` is the hub's error, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        cause: str,
        task_id: str,
        retryable: bool = False,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(f"task {task_id}: {cause}: {message}")
        self.message = message
        self.cause = cause
        self.task_id = task_id
        self.retryable = retryable
        self.sandbox_id = sandbox_id
        #: How long ``acquire`` tried before giving up (0 for an at-once failure).
        self.waited_s = 0.0

    def __reduce__(self) -> Any:
        kw = {"cause": self.cause, "task_id": self.task_id, "retryable": self.retryable, "sandbox_id": self.sandbox_id}
        return (_rebuild, (type(self), (self.message,), kw))


class SandboxLostError(sandhub.SandboxLostError, FleetError):
    """The episode's sandbox is gone (deleted, finished, or replaced).

    A subclass of the SDK's ``sandhub.SandboxLostError`` (itself a
    ``NotFoundError``), so either ``except`` catches it. The fleet hands out
    a fresh sandbox on the next ``acquire``."""

    def __init__(self, message: str, *, sandbox_id: str, task_id: str = "") -> None:
        super().__init__(message, "NOT_FOUND", 404)
        self.sandbox_id = sandbox_id
        self.task_id = task_id

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), (self.message,), {"sandbox_id": self.sandbox_id, "task_id": self.task_id}))


class TaskSetupError(FleetError):
    """A setup command of the task failed (non-zero exit) in a sandbox that
    started fine; the sandbox was released. ``result`` is the command's
    ``sandhub.CommandResult``."""

    def __init__(self, message: str, *, task_id: str, command: str, result: sandhub.CommandResult) -> None:
        super().__init__(f"task {task_id}: setup command {command!r} failed: {message}")
        self.task_id = task_id
        self.command = command
        self.result = result
        self.message = message

    def __reduce__(self) -> Any:
        kw = {"task_id": self.task_id, "command": self.command, "result": self.result}
        return (_rebuild, (type(self), (self.message,), kw))


class TaskSourceError(FleetError, ValueError):
    """A task row or manifest line could not be read (``where`` says which)."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), (self.message, self.where), {}))
