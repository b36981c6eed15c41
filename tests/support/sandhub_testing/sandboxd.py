"""The real `sandboxd` binary on loopback: REST, gRPC and the legacy runtime
port, each on a free port, with a root dir of its own."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .net import LOOPBACK, free_ports, port_open
from .procs import stop_process, tail

STARTUP_TIMEOUT_S = 20.0


@dataclass
class Sandboxd:
    """One running sandboxd process."""

    proc: subprocess.Popen[bytes]
    root: Path  # the --root-dir (inside `outside`)
    outside: Path  # the root dir's parent: traversal targets land here if confinement fails
    rest_port: int
    grpc_port: int
    legacy_port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def rest_url(self) -> str:
        return f"http://{LOOPBACK}:{self.rest_port}"

    @property
    def legacy_url(self) -> str:
        return f"http://{LOOPBACK}:{self.legacy_port}"

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def rest(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """A raw HTTP/1.1 request; `path` goes on the wire exactly as given."""
        conn = http.client.HTTPConnection(LOOPBACK, self.rest_port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()


def _health_ok(port: int) -> bool:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=1)
    try:
        conn.request("GET", "/v1/health")
        resp = conn.getresponse()
        body = resp.read()
        return resp.status == 200 and json.loads(body).get("status") == "ok"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start_sandboxd(binary: Path, base: Path, env: dict[str, str] | None = None) -> Sandboxd:
    """Starts sandboxd with its root dir at base/outside/root and its log at
    base/sandboxd.log, and returns once all three ports serve. `env` merges over
    the test run's environment: the daemon's own, which commands inherit."""
    extra_env = dict(env or {})
    outside = base / "outside"
    root = outside / "root"
    root.mkdir(parents=True)
    log_path = base / "sandboxd.log"
    last_error = ""
    for attempt in range(3):  # a chosen port may be taken between pick and bind
        rest_port, grpc_port, legacy_port = free_ports(3)
        argv = [
            str(binary),
            "--listen-host", LOOPBACK,
            "--rest-port", str(rest_port),
            "--grpc-port", str(grpc_port),
            "--legacy-port", str(legacy_port),
            "--root-dir", str(root),
            "--shutdown-timeout", "2s",
        ]
        full_env = dict(os.environ)
        full_env.setdefault("RUST_LOG", "info")
        full_env.setdefault("NO_COLOR", "1")
        full_env.update(extra_env)
        with open(log_path, "ab") as log:
            log.write(f"\n=== attempt {attempt}: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                cwd=base,
            )
        daemon = Sandboxd(proc, root, outside, rest_port, grpc_port, legacy_port, log_path, extra_env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _health_ok(rest_port) and port_open(grpc_port) and port_open(legacy_port):
                return daemon
            time.sleep(0.05)
        rc = proc.poll()
        if rc is None:
            stop_process(proc)
            last_error = f"not healthy within {STARTUP_TIMEOUT_S}s"
            break  # running but not serving: retrying with new ports won't help
        last_error = f"exited with code {rc} during startup"
        if "in use" not in daemon.log_tail(20).lower():
            break
    pytest.fail(
        f"sandboxd {last_error}: {binary}\n--- sandboxd log ---\n{tail(log_path)}",
        pytrace=False,
    )
