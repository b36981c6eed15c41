"""`sandhub.Sandboxd` / `AsyncSandboxd`: the SDK driving one real sandboxd
directly (no hub), over TCP with and without a bearer token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sandhub
from sandhub_testing import start_sandboxd, stop_process

TOKEN = "direct-mode-token-0123456789"


@pytest.fixture
def guarded(sandboxd_bin: Path, tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    daemon = start_sandboxd(
        sandboxd_bin,
        tmp_path / "sandboxd",
        {"SANDBOXD_AUTH_TOKEN_FILE": str(token_file), "SANDBOX_META_SDK": "yes"},
    )
    try:
        yield daemon
    finally:
        stop_process(daemon.proc)


def _client(daemon, token: str | None = TOKEN, **kw) -> sandhub.Sandboxd:
    return sandhub.Sandboxd(
        daemon.rest_url, token, grpc_url=f"http://127.0.0.1:{daemon.grpc_port}", **kw
    )


def test_direct_commands_files_health_metadata(guarded):
    d = _client(guarded)
    assert "Sandboxd" in repr(d)
    assert d.health()["status"] == "ok"
    assert d.metadata()["env"].get("SANDBOX_META_SDK") == "yes"
    r = d.commands.run("echo hi; exit 5")
    assert (r.exit_code, r.stdout) == (5, "hi\n")
    h = d.commands.start(["cat"])
    h.write_stdin("piped")
    h.close_stdin()
    assert h.wait().stdout == "piped"
    d.files.write("a/b.txt", b"direct")
    assert d.files.read("a/b.txt") == b"direct"
    assert [e.name for e in d.files.list("a")] == ["b.txt"]
    assert d.files.exists("a/b.txt")
    d.files.remove("a", recursive=True)
    assert not d.files.exists("a")


def test_direct_token_is_required(guarded):
    with pytest.raises(sandhub.UnauthenticatedError):
        _client(guarded, token=None).commands.run("true")
    with pytest.raises(sandhub.UnauthenticatedError):
        _client(guarded, token="wrong").files.read("x")


def test_direct_limits_and_async(guarded):
    d = _client(guarded, max_download_size=4)
    d.files.write("five", b"12345")
    with pytest.raises(sandhub.ResponseTooLargeError):
        d.files.read("five")

    async def main() -> str:
        ad = sandhub.AsyncSandboxd(
            guarded.rest_url, TOKEN, grpc_url=f"http://127.0.0.1:{guarded.grpc_port}"
        )
        assert (await ad.health())["status"] == "ok"
        await ad.files.write("async.txt", "from asyncio")
        return (await ad.commands.run("cat async.txt")).stdout

    assert asyncio.run(main()) == "from asyncio"


def test_direct_down_is_unavailable():
    with pytest.raises(sandhub.UnavailableError):
        sandhub.Sandboxd("http://127.0.0.1:1", grpc_url="http://127.0.0.1:2").commands.run("true")
