"""The asyncio SDK (`AsyncSandbox`) against the facade: create, commands,
files, list, kill; concurrent calls on one event loop; env-var configuration.

Async tests carry the asyncio mark themselves, so they run under pytest-asyncio's
strict mode as well as the `-o asyncio_mode=auto` scripts/test.sh passes.
"""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, FileNotFoundException, SandboxQuery, SandboxState
from e2b_support import ids
from sandhub_testing import Hub
from sandhub_testing.e2b import WORKSPACE, Conn

pytestmark = pytest.mark.asyncio


async def test_async_create_run_files_kill(conn: Conn, tag: str) -> None:
    sbx = await AsyncSandbox.create(
        template="base", timeout=120, metadata={"tag": tag}, envs={"GREETING": "hello"}, **conn
    )
    try:
        result = await sbx.commands.run("echo $GREETING; echo err >&2")
        assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "err\n", 0)
        with pytest.raises(CommandExitException) as exc:
            await sbx.commands.run("exit 5")
        assert exc.value.exit_code == 5

        path = f"{WORKSPACE}/e2b-async/a.txt"
        info = await sbx.files.write(path, "from asyncio\n")
        assert info.path == path
        assert await sbx.files.read(path) == "from asyncio\n"
        await sbx.files.write(f"{WORKSPACE}/e2b-async/b.bin", b"\x00\x01\x02")
        assert bytes(await sbx.files.read(f"{WORKSPACE}/e2b-async/b.bin", format="bytes")) == b"\x00\x01\x02"
        assert await sbx.files.exists(path) is True
        with pytest.raises(FileNotFoundException):
            await sbx.files.read(f"{WORKSPACE}/e2b-async/missing.txt")

        details = await sbx.get_info()
        assert details.sandbox_id == sbx.sandbox_id
        assert details.metadata.items() >= {"tag": tag}.items()
        listed = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING]), **conn
        ).next_items()
        assert ids(listed) == {sbx.sandbox_id}
        assert await sbx.is_running() is True
    finally:
        killed = await sbx.kill()
    assert killed is True
    assert await sbx.is_running() is False
    assert await AsyncSandbox.kill(sbx.sandbox_id, **conn) is False


async def test_async_background_and_kill(conn: Conn) -> None:
    sbx = await AsyncSandbox.create(template="base", **conn)
    try:
        done = await sbx.commands.run("sleep 0.3; echo done", background=True)
        sleeper = await sbx.commands.run("sleep 30", background=True)
        assert sleeper.pid in {p.pid for p in await sbx.commands.list()}
        assert await sbx.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException):
            await sleeper.wait()
        assert (await done.wait()).stdout == "done\n"
    finally:
        await sbx.kill()


async def test_async_concurrent_calls(conn: Conn) -> None:
    """Several sandboxes created at once, and several commands in flight at
    once in one sandbox, each with its own answer."""
    sandboxes = await asyncio.gather(*(AsyncSandbox.create(template="base", **conn) for _ in range(3)))
    try:
        assert len({s.sandbox_id for s in sandboxes}) == 3
        first = sandboxes[0]
        results = await asyncio.gather(*(first.commands.run(f"sleep 0.2; echo {n}") for n in range(5)))
        assert [r.stdout for r in results] == [f"{n}\n" for n in range(5)]
        writes = [s.files.write(f"{WORKSPACE}/who.txt", s.sandbox_id) for s in sandboxes]
        await asyncio.gather(*writes)
        reads = await asyncio.gather(*(s.files.read(f"{WORKSPACE}/who.txt") for s in sandboxes))
        assert reads == [s.sandbox_id for s in sandboxes]
    finally:
        await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)


async def test_async_env_vars_route(e2b_env: Hub, tag: str) -> None:
    """AsyncSandbox configured only through E2B_API_KEY/E2B_API_URL/E2B_SANDBOX_URL."""
    sbx = await AsyncSandbox.create(metadata={"tag": tag})
    try:
        assert (await sbx.commands.run("echo via-env")).stdout == "via-env\n"
    finally:
        killed = await AsyncSandbox.kill(sbx.sandbox_id)
    assert killed is True
