"""A real `sandhub serve` (local backend, as root) for the SDK tests.

Imported by the tests/python/test_sdk_*.py modules (pytest picks fixtures up
from a test module's namespace). Only the standard library talks to the hub
here: the fixture must not depend on the SDK it tests.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import sandhub_binary, in_ci

STARTUP_TIMEOUT_S = 30.0


@dataclass
class RunningHub:
    url: str
    port: int
    state: Path
    proc: subprocess.Popen[bytes]
    keys: dict[str, str]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join((self.state / "hub.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start_hub(keys: dict[str, str] | None = None) -> RunningHub:
    binary = sandhub_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        msg = f"sandhub binary not found at {binary} (set SANDHUB_BIN)"
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    state = Path(tempfile.mkdtemp(prefix="sandhub-sdk-"))
    port = _free_port()
    argv = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state / "state")]
    if keys:
        keys_file = state / "keys"
        keys_file.write_text("".join(f"{k} {t}\n" for k, t in keys.items()))
        keys_file.chmod(0o600)
        argv += ["--api-keys-file", str(keys_file)]
    log = open(state / "hub.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    hub = RunningHub(f"http://127.0.0.1:{port}", port, state, proc, keys or {})
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _healthy(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_hub(hub)
            pytest.fail(f"sandhub serve did not become healthy:\n{hub.log_tail()}", pytrace=False)
        time.sleep(0.05)
    return hub


def stop_hub(hub: RunningHub) -> None:
    if hub.proc.poll() is None:
        hub.proc.send_signal(signal.SIGTERM)
        try:
            hub.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            hub.proc.kill()
            hub.proc.wait()


@pytest.fixture(scope="module")
def running_hub() -> Iterator[RunningHub]:
    hub = start_hub()
    try:
        yield hub
    finally:
        stop_hub(hub)
        print(f"--- hub log tail ---\n{hub.log_tail()}")


@pytest.fixture(scope="module")
def hub_url(running_hub: RunningHub) -> str:
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
