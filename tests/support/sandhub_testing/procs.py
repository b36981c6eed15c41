"""Waiting for things, stopping processes, reading their logs."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 120.0, every: float = 0.1) -> T:
    """Polls `check` until it returns something truthy, and returns that.

    An exception from `check` counts as "not yet" (a server that is still
    starting refuses connections); the last one is reported if time runs out.
    The timeout bounds the wait and is never a timing assertion.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # noqa: BLE001 - keep polling until the deadline
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
    """Sends `sig` (SIGTERM), waits up to `timeout`, then kills. Returns the exit
    code, or None when the process had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        return None


def tail(path: Path, lines: int = 60) -> str:
    """The last lines of a log file (shown by pytest for failing tests)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"
