"""A real `sandhub serve` (local backend, as root) for the SDK tests.

Imported by the tests/python/test_sdk_*.py modules (pytest picks fixtures up
from a test module's namespace). Only the standard library talks to the hub
here: the fixture must not depend on the SDK it tests.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from sandhub_testing import Hub, binary
from sandhub_testing import start_hub as _start_hub
from sandhub_testing import stop_hub as _stop_hub


def start_hub(keys: dict[str, str] | None = None) -> Hub:
    """A hub on the local backend; `keys` (API key -> tenant) turns auth on."""
    base = Path(tempfile.mkdtemp(prefix="sandhub-sdk-"))
    args: list[str] = []
    if keys:
        keys_file = base / "keys"
        keys_file.write_text("".join(f"{k} {t}\n" for k, t in keys.items()))
        keys_file.chmod(0o600)
        args += ["--api-keys-file", str(keys_file)]
    return _start_hub(binary("sandhub"), base, *args)


def stop_hub(hub: Hub) -> None:
    """Stops the hub, then removes its directory: the streaming tests write
    gigabytes there, and a temp dir left per run fills the disk."""
    _stop_hub(hub)
    shutil.rmtree(hub.base.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def running_hub() -> Iterator[Hub]:
    hub = start_hub()
    try:
        yield hub
    finally:
        stop_hub(hub)
        print(f"--- hub log tail ---\n{hub.log_tail()}")


@pytest.fixture(scope="module")
def hub_url(running_hub: Hub) -> str:
    return running_hub.url


#: Every command line in the sandbox, one per line (no `ps` needed).
PROC_LIST = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def wait_gone(run, marker: str, timeout: float = 20.0) -> list[str]:
    """Polls the sandbox's process table (through ``run``, a
    ``commands.run``) until no command line holds ``marker``; returns the
    lines still holding it at the deadline (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while True:
        out = run(PROC_LIST).stdout
        left = [line for line in out.splitlines() if marker in line and "/proc/" not in line]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
