"""Sandbox ports through the SDK (issue #16 A, local backend): a
``python3 -m http.server`` inside a real sandbox, reached with
``sandbox.ports`` (sync and async) and with ``sandhub port-forward``."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request

import pytest
import sandhub
from sandhub_testing import binary
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)

PORT = 8000
SERVE = f"mkdir -p site && echo hello > site/hello.txt && cd site && exec python3 -m http.server {PORT} --bind 127.0.0.1"


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def test_ports_url_wait_and_list(hub_url: str) -> None:
    with sandhub.Hub(hub_url) as hub, hub.create() as sb:
        server = sb.commands.start(SERVE)
        try:
            url = sb.ports.wait(PORT, timeout=30)
            assert url == sb.ports.url(PORT) == f"{hub_url}/v1/sandboxes/{sb.id}/ports/{PORT}/"
            assert fetch(url + "hello.txt") == b"hello\n"
            assert sandhub.ListeningPort(PORT, "127.0.0.1") in sb.ports.list()
            with pytest.raises(sandhub.DeadlineExceededError):
                sb.ports.wait(PORT + 1, timeout=0.3)
            with pytest.raises(sandhub.InvalidArgumentError):
                sb.ports.wait(0, timeout=1)
        finally:
            server.kill()


def test_ports_async(hub_url: str) -> None:
    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as hub:
            async with await hub.create() as sb:
                server = await sb.commands.start(SERVE)
                url = await sb.ports.wait(PORT, timeout=30)
                assert url == sb.ports.url(PORT)
                body = await asyncio.to_thread(fetch, url + "hello.txt")
                assert body == b"hello\n"
                assert [p.port for p in await sb.ports.list()] == [PORT]
                await server.kill()

    asyncio.run(main())


def test_port_forward_cli(hub_url: str) -> None:
    with sandhub.Hub(hub_url) as hub, hub.create() as sb:
        server = sb.commands.start(SERVE)
        sb.ports.wait(PORT, timeout=30)
        cli = subprocess.Popen(
            [str(binary("sandhub")), "port-forward", "--hub", hub_url, sb.id, f"0:{PORT}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert cli.stdout is not None
            line = cli.stdout.readline()
            assert line.startswith("Forwarding from 127.0.0.1:") and line.rstrip().endswith(f"-> {sb.id}:{PORT}"), line
            local = line.split()[2].rsplit(":", 1)[1]
            # Two connections in turn: each is its own tunnel.
            for _ in range(2):
                assert fetch(f"http://127.0.0.1:{local}/hello.txt") == b"hello\n"
        finally:
            cli.terminate()
            cli.wait(timeout=30)
            server.kill()
        bad = subprocess.run(
            [str(binary("sandhub")), "port-forward", "--hub", hub_url, "sb-nope", "0:80"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1 and "NOT_FOUND" in bad.stderr, bad.stderr
