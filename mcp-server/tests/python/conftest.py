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

import os
import signal
import subprocess
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sandhub_testing import LOOPBACK, free_port, need, running_hub, stop_process, wait_for
from sandhub_testing.fixtures import sandhub_bin, sandhub_mcp_bin  # noqa: F401 - fixtures

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
# Every MCP request the tests make is bounded by this (the tools bound
# their own waits well below it).
REQUEST_TIMEOUT_S = 120.0


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
    """The suite's hub, and the `sandhub-mcp` binary that fronts it."""

    url: str
    log: Path
    mcp_bin: Path

    def serves_mcp(self) -> bool:
        """True once the hub mounts the MCP service at /mcp."""
        status, _ = _http("POST", f"{self.url}/mcp", b"{}")
        return status != 404


@pytest.fixture(scope="session")
def hub(
    sandhub_bin: Path, sandhub_mcp_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    # Sandboxes outlive a hub (a restart re-attaches them), so the tests'
    # leftovers are deleted before the hub goes (sandhub_testing.stop_hub).
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("mcp")) as hub:
        yield Hub(url=hub.url, log=hub.log_path, mcp_bin=sandhub_mcp_bin)


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
    port = free_port()
    url = f"http://{LOOPBACK}:{port}/mcp"
    with open(hub.log.with_name("sandhub-mcp-http.log"), "wb") as log_file:
        process = subprocess.Popen(
            [str(hub.mcp_bin), "--hub", hub.url, "--listen", f"{LOOPBACK}:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"sandhub-mcp --listen exited with {process.returncode}")
        _http("POST", url, b"{}", timeout=1.0)
        return True

    try:
        wait_for("sandhub-mcp --listen to answer", answers, timeout=START_TIMEOUT_S)
        yield url
    finally:
        stop_process(process, signal.SIGINT, timeout=STOP_TIMEOUT_S)


@pytest.fixture(params=["stdio", "http", "hub-http"])
def connect(request: pytest.FixtureRequest, hub: Hub) -> Callable[[], AsyncIterator[ClientSession]]:
    """Opens a new MCP session to the hub, over each transport in turn."""
    if request.param == "stdio":
        return lambda: stdio_session(hub)
    if request.param == "http":
        url = request.getfixturevalue("gateway")
        return lambda: http_session(url)
    need(hub.serves_mcp(), f"the hub at {hub.url} does not serve /mcp (POST /mcp answered 404)")
    return lambda: http_session(f"{hub.url}/mcp")
