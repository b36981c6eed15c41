"""The real hub (`sandhub serve`, local backend) on loopback."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from .net import LOOPBACK, free_port
from .procs import tail

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class Hub:
    """One running `sandhub serve` with a state dir of its own.

    `api_keys` (key -> tenant) is the keys file it was started with, if any
    (see `start_hub`); empty when it runs open (every request is one tenant's).
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        port: int,
        base: Path,
        log_path: Path,
        api_keys: Mapping[str, str] | None = None,
    ):
        self.proc = proc
        self.port = port
        self.base = base  # a uniquely named directory: its name marks this hub's sandboxes
        self.log_path = log_path
        self.api_keys: dict[str, str] = dict(api_keys or {})

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_path

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        timeout: float = 60.0,
        api_key: str | None = None,
    ) -> tuple[int, bytes]:
        """One HTTP request; a `body` is sent as JSON, an `api_key` as the bearer key."""
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)
        try:
            headers = {}
            if api_key is not None:
                headers["Authorization"] = f"Bearer {api_key}"
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def log_tail(self, lines: int = 80) -> str:
        return tail(self.log_path, lines)

    def delete_everything(self) -> None:
        """Every pool, then every sandbox, through the API: sandboxes outlive
        their hub by design (a restart re-attaches them). With a keys file,
        each tenant's (through one key of each)."""
        keys_by_tenant = {tenant: key for key, tenant in self.api_keys.items()}
        for key in keys_by_tenant.values() if keys_by_tenant else [None]:
            try:
                status, body = self.request("GET", "/v1/pools", api_key=key)
                if status == 200:
                    for pool in json.loads(body)["pools"]:
                        self.request("DELETE", f"/v1/pools/{pool['name']}", api_key=key)
                status, body = self.request("GET", "/v1/sandboxes", api_key=key)
                if status == 200:
                    for sandbox in json.loads(body)["sandboxes"]:
                        self.request("DELETE", f"/v1/sandboxes/{sandbox['id']}", api_key=key)
            except (OSError, http.client.HTTPException, ValueError) as e:
                print(f"cleanup through the API failed: {e}")


def _ready(port: int) -> bool:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=1)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def pids_with_mount(needle: str) -> list[int]:
    """Host processes whose mount table names `needle` (every process of a
    local sandbox has its state dir mounted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "mountinfo").read_text(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def start_hub(binary: Path, base: Path, *args: str, api_keys: Mapping[str, str] | None = None) -> Hub:
    """Starts `sandhub serve` on a free port with its state in a new, uniquely
    named directory under `base`, and returns once it answers /readyz. `args`
    are extra `serve` flags (e.g. `--e2b`).

    `api_keys` (key -> tenant; keys of 16 characters or more) turns tenancy
    on: they are written to a keys file in the hub's directory (mode 0600)
    and passed as `--api-keys-file`; the returned Hub keeps them, so its
    cleanup reaches every tenant's sandboxes.

    The hub gets the test run's environment without SANDHUB_* variables: every
    flag of the hub reads one, and the run's own (SANDHUB_BIN, a developer's
    SANDHUB_API_KEYS_FILE) must not configure it.
    """
    home = base / f"sandhub-{uuid.uuid4().hex[:12]}"
    home.mkdir(parents=True)
    log_path = home / "hub.log"
    if api_keys:
        keys_file = home / "api-keys"
        keys_file.touch(mode=0o600)
        keys_file.write_text("".join(f"{key} {tenant}\n" for key, tenant in api_keys.items()))
        args = (*args, "--api-keys-file", str(keys_file))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHUB_")}
    env.setdefault("NO_COLOR", "1")
    for _ in range(3):  # the chosen port may be taken between pick and bind
        port = free_port()
        argv = [str(binary), "serve", "--listen", f"{LOOPBACK}:{port}", "--state-dir", str(home / "state"), *args]
        with open(log_path, "ab") as log:
            log.write(f"\n=== {' '.join(argv)}\n".encode())
            log.flush()
            # A session of its own: a terminal's Ctrl-C reaches pytest, whose
            # teardown then deletes the sandboxes before it stops the hub.
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None and not _ready(port):
            time.sleep(0.05)
        if proc.poll() is None and _ready(port):
            return Hub(proc, port, home, log_path, api_keys)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if "in use" not in tail(log_path, 20).lower():
            break
    pytest.fail(f"sandhub serve did not start:\n{tail(log_path, 200)}", pytrace=False)


def stop_hub(hub: Hub) -> None:
    """Deletes what the hub holds, stops it (SIGTERM, then SIGKILL), then kills
    whatever still has this hub's directory mounted."""
    if hub.proc.poll() is None:
        hub.delete_everything()
        hub.proc.send_signal(signal.SIGTERM)
        try:
            hub.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(hub.proc.pid, signal.SIGKILL)
            hub.proc.wait(timeout=STOP_TIMEOUT_S)
    deadline = time.monotonic() + 20
    while (left := pids_with_mount(hub.base.name)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


@contextmanager
def running_hub(binary: Path, base: Path, *args: str, api_keys: Mapping[str, str] | None = None) -> Iterator[Hub]:
    """A hub for the length of the `with`; see start_hub and stop_hub."""
    hub = start_hub(binary, base, *args, api_keys=api_keys)
    try:
        yield hub
    finally:
        stop_hub(hub)
        # Shown by pytest only when a test failed.
        print(f"--- sandhub serve log tail ---\n{hub.log_tail()}")
