"""Fixtures for the MCP tests: a real hub (`sandhub serve`) on loopback, and
MCP client sessions to it made with the official Python `mcp` package, over
three transports:

- `stdio`: the `sandhub-mcp` binary pointed at the hub, one process per session;
- `http`: `sandhub-mcp --listen`, streamable HTTP in front of the hub;
- `hub-http`: streamable HTTP at the hub's own `/mcp`.

Binaries: SANDHUB_BIN and SANDHUB_MCP_BIN, else `$CARGO_TARGET_DIR/debug/...`,
else `target/debug/...`. A missing binary skips the tests, except under
CI=true, where it fails them. Likewise a hub that does not serve `/mcp` skips
the `hub-http` variants locally and fails them in CI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

REPO_ROOT = Path(__file__).resolve().parents[3]
LOOPBACK = "127.0.0.1"
HUB_START_TIMEOUT_S = 30.0
HUB_STOP_TIMEOUT_S = 15.0
# Every MCP request the tests make is bounded by this (the tools bound
# their own waits well below it).
REQUEST_TIMEOUT_S = 120.0


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _binary(env: str, name: str) -> Path:
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    if not target.is_absolute():
        target = REPO_ROOT / target
    return target / "debug" / name


def _require(path: Path, what: str) -> Path:
    if not os.access(path, os.X_OK):
        message = f"{what} binary not found at {path} (build it with cargo build)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Hub:
    url: str
    log: Path
    mcp_bin: Path

    def serves_mcp(self) -> bool:
        """True once the hub mounts the MCP service at /mcp."""
        status, _ = _http("POST", f"{self.url}/mcp", b"{}")
        return status != 404

    def delete_all_sandboxes(self) -> None:
        status, body = _http("GET", f"{self.url}/v1/sandboxes")
        if status != 200:
            return
        for sandbox in json.loads(body).get("sandboxes", []):
            _http("DELETE", f"{self.url}/v1/sandboxes/{sandbox['id']}", timeout=60.0)


@pytest.fixture(scope="session")
def hub() -> Iterator[Hub]:
    sandhub = _require(_binary("SANDHUB_BIN", "sandhub"), "sandhub")
    mcp_bin = _require(_binary("SANDHUB_MCP_BIN", "sandhub-mcp"), "sandhub-mcp")
    with tempfile.TemporaryDirectory(prefix="sandhub-mcp-test-") as tmp:
        port = _free_port()
        url = f"http://{LOOPBACK}:{port}"
        log = Path(tmp) / "hub.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [str(sandhub), "serve", "--listen", f"{LOOPBACK}:{port}", "--state-dir", f"{tmp}/state"],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + HUB_START_TIMEOUT_S
            while True:
                if process.poll() is not None:
                    pytest.fail(f"sandhub serve exited with {process.returncode}:\n{log.read_text()}")
                try:
                    status, _ = _http("GET", f"{url}/v1/sandboxes", timeout=1.0)
                    if status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"sandhub serve did not answer within {HUB_START_TIMEOUT_S}s:\n{log.read_text()}")
                time.sleep(0.1)
            yield Hub(url=url, log=log, mcp_bin=mcp_bin)
        finally:
            # Sandboxes outlive a hub (a restart re-attaches them), so the
            # tests' leftovers are deleted before the hub goes.
            if process.poll() is None:
                try:
                    Hub(url=url, log=log, mcp_bin=mcp_bin).delete_all_sandboxes()
                except OSError:
                    pass
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=HUB_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=HUB_STOP_TIMEOUT_S)


@asynccontextmanager
async def stdio_session(hub: Hub) -> AsyncIterator[ClientSession]:
    """A new MCP session: a fresh `sandhub-mcp` process on stdio."""
    params = StdioServerParameters(
        command=str(hub.mcp_bin),
        args=["--hub", hub.url],
        env={"RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    with open(hub.log.with_name("sandhub-mcp.stderr"), "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT_S) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    """A new MCP session over streamable HTTP at `url`."""
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT_S) as session:
            await session.initialize()
            yield session


@pytest.fixture(scope="session")
def gateway(hub: Hub) -> Iterator[str]:
    """`sandhub-mcp --listen`: the MCP endpoint URL it serves."""
    port = _free_port()
    url = f"http://{LOOPBACK}:{port}/mcp"
    with open(hub.log.with_name("sandhub-mcp-http.log"), "wb") as log_file:
        process = subprocess.Popen(
            [str(hub.mcp_bin), "--hub", hub.url, "--listen", f"{LOOPBACK}:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + HUB_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"sandhub-mcp --listen exited with {process.returncode}")
            try:
                _http("POST", url, b"{}", timeout=1.0)
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"sandhub-mcp --listen did not answer within {HUB_START_TIMEOUT_S}s")
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=HUB_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=HUB_STOP_TIMEOUT_S)


@pytest.fixture(params=["stdio", "http", "hub-http"])
def connect(request: pytest.FixtureRequest, hub: Hub) -> Callable[[], AsyncIterator[ClientSession]]:
    """Opens a new MCP session to the hub, over each transport in turn."""
    if request.param == "stdio":
        return lambda: stdio_session(hub)
    if request.param == "http":
        url = request.getfixturevalue("gateway")
        return lambda: http_session(url)
    if not hub.serves_mcp():
        message = f"the hub at {hub.url} does not serve /mcp (POST /mcp answered 404)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return lambda: http_session(f"{hub.url}/mcp")
