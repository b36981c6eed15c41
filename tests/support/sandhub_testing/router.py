"""The real `sandhub-router` binary on loopback."""

from __future__ import annotations

import http.client
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .net import LOOPBACK, free_ports, port_open
from .procs import stop_process, tail

STARTUP_TIMEOUT_S = 20.0


@dataclass
class Router:
    proc: subprocess.Popen[Any]
    port: int
    metrics_port: int
    health_port: int
    log: Path
    https_port: int | None = None
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def metrics(self) -> str:
        conn = http.client.HTTPConnection(LOOPBACK, self.metrics_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, rest = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += float(value)
        return total

    def log_tail(self) -> str:
        return tail(self.log)


def start_router(binary: Path, base: Path, *args: str, env: dict[str, str] | None = None,
                 https: bool = False) -> Router:
    """Starts the router on free loopback ports (HTTP, metrics, health, and
    HTTPS when asked) with `args` after them; returns once they accept."""
    base.mkdir(parents=True, exist_ok=True)
    log = base / "router.log"
    for _ in range(3):  # a chosen port may be taken between pick and bind
        ports = free_ports(4)
        argv = [str(binary),
                "--http-bind-address", f"{LOOPBACK}:{ports[0]}",
                "--metrics-bind-address", f"{LOOPBACK}:{ports[1]}",
                "--health-probe-bind-address", f"{LOOPBACK}:{ports[2]}",
                "--shutdown-timeout", "2s",
                *(["--https-bind-address", f"{LOOPBACK}:{ports[3]}"] if https else []),
                *args]
        full_env = {**os.environ, "RUST_LOG": "info,sandhub_router=debug", "NO_COLOR": "1", **(env or {})}
        with open(log, "ab") as f:
            f.write(f"\n=== {' '.join(argv)}\n".encode())
            f.flush()
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if port_open(ports[0]) and port_open(ports[1]) and (not https or port_open(ports[3])):
                return Router(proc, ports[0], ports[1], ports[2], log, ports[3] if https else None, list(args))
            time.sleep(0.05)
        stop_process(proc)
        if "in use" not in tail(log, 20).lower():
            break
    pytest.fail(f"sandhub-router did not start\n{tail(log)}", pytrace=False)
