"""The sandhub SDK's `AsyncHub` against a real hub: the same calls as the
blocking client, plus what asyncio adds (several event loops in one
process, cancellation that reaches the sandbox)."""

from __future__ import annotations

import asyncio
import io
import pickle
import threading

import pytest
import sandhub
from sdk_fixtures import PROC_LIST, hub_url, running_hub, wait_gone  # noqa: F401 (fixtures)


def run(coro):
    return asyncio.run(coro)


def test_sandbox_lifecycle_and_commands(hub_url: str):
    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as hub:
            assert await hub.health() == "ok"
            async with await hub.create(labels={"suite": "sdk-async"}) as sb:
                assert sb.state == "Ready" and "AsyncSandbox" in repr(sb)
                assert pickle.loads(pickle.dumps(sb)) == sb.id
                assert (await hub.get(sb.id)).id == sb.id
                assert [s.id for s in await hub.list(labels={"suite": "sdk-async"})] == [sb.id]
                r = await sb.commands.run("echo $X; exit 2", env={"X": "y"})
                assert (r.exit_code, r.stdout) == (2, "y\n")
                assert (await sb.commands.run(["cat"], stdin="in")).stdout == "in"
                h = await sb.commands.start("echo a; echo b >&2")
                evs = [e async for e in h.events()]
                assert isinstance(evs[-1], sandhub.ProcessExitEvent) and evs[-1].exit_code == 0
                cat = await sb.commands.start(["cat"])
                await cat.write_stdin("x")
                await cat.close_stdin()
                assert (await cat.wait()).stdout == "x"
                sleeper = await sb.commands.start(["sleep", "300"])
                await sleeper.signal("SIGKILL")
                assert (await sleeper.wait()).exit_code != 0
                # The command waits for a line, so the resize reaches a live
                # process (a bare `stty size` may exit first: NOT_FOUND).
                pty = await sb.commands.start("read x; stty size", pty=True, rows=20, cols=60)
                await pty.resize(11, 33)
                await pty.write_stdin("\n")
                assert "11 33" in (await pty.wait()).stdout
                snap = await sb.snapshot()
                await sb.suspend()
                assert sb.state == "Suspended"
                await sb.resume()
                async with await sb.fork(snapshot=snap) as child:
                    assert child.id != sb.id
                await sb.reset()
                await sb.refresh()
                m = await sb.metrics(step=5)
                assert isinstance(m, sandhub.SandboxMetrics) and m.step_seconds == 5
                with pytest.raises(sandhub.UnimplementedError):
                    await sb.health()
            with pytest.raises(sandhub.NotFoundError):
                await hub.get(sb.id)

    run(main())


def test_files_watch_and_limits(hub_url: str, tmp_path):
    async def main() -> None:
        hub = sandhub.AsyncHub(hub_url, max_download_size=10)
        async with await hub.create() as sb:
            await sb.files.write("d/a", b"0123456789")
            await sb.files.write("d/a", "+", append=True)
            await sb.files.write("d/b", io.BytesIO(b"b" * 5), mode=0o640)
            with pytest.raises(sandhub.ResponseTooLargeError):
                await sb.files.read("d/a")
            assert await sb.files.read("d/b") == b"bbbbb"
            assert await sb.files.read_text("d/b") == "bbbbb"
            assert await sb.files.read_to("d/b", tmp_path / "b") == 5
            assert (await sb.files.stat("d/b")).mode == "0640"
            assert sorted(e.name for e in await sb.files.list("d")) == ["a", "b"]
            assert await sb.files.exists("d/a") and not await sb.files.exists("d/zz")
            await sb.files.remove("d", recursive=True)
            assert not await sb.files.exists("d")
            watch = await sb.watcher.watch(".")
            await sb.files.write("seen.txt", b"x")
            async for batch in watch:
                if any(e.path.endswith("seen.txt") for e in batch):
                    break
            watch.close()

    run(main())


def test_volumes(hub_url: str):
    async def main() -> None:
        hub = sandhub.AsyncHub(hub_url)
        v = await hub.volumes.create("sdk-async-v", 8)
        assert (v.name, v.size_mb, v.labels) == ("sdk-async-v", 8, {})
        assert await hub.volumes.get("sdk-async-v") == v
        assert "sdk-async-v" in [x.name for x in await hub.volumes.list()]
        files = hub.volumes.files("sdk-async-v")
        assert isinstance(files, sandhub.AsyncVolumeFiles)
        await files.write("d/x.txt", b"async")
        assert await files.read("d/x.txt") == b"async"
        assert [e.name for e in await files.list("d")] == ["x.txt"]
        assert (await files.stat("d/x.txt")).size == 5
        snap = await hub.volumes.snapshot("sdk-async-v", "s")
        assert [s.name for s in await hub.volumes.snapshots("sdk-async-v")] == [snap.name]
        await hub.volumes.create("sdk-async-c", 8, from_snapshot="sdk-async-v@s")
        assert await hub.volumes.files("sdk-async-c").read("d/x.txt") == b"async"
        await hub.volumes.delete_snapshot("sdk-async-v", "s")
        await files.remove("d", recursive=True)
        assert not await files.exists("d")
        await hub.volumes.delete("sdk-async-c")
        await hub.volumes.delete("sdk-async-v")
        with pytest.raises(sandhub.NotFoundError):
            await hub.volumes.get("sdk-async-v")

    run(main())


def test_templates_pools_gym_and_errors(hub_url: str):
    async def main() -> None:
        hub = sandhub.AsyncHub(hub_url)
        await hub.templates.put("sdk-async-t", {"env": {"T": "1"}})
        assert (await hub.templates.get("sdk-async-t")).spec["env"] == {"T": "1"}
        assert "sdk-async-t" in [t.name for t in await hub.templates.list()]
        await hub.pools.put("sdk-async-p", "sdk-async-t", 1)
        assert (await hub.pools.wait_ready("sdk-async-p", 1, timeout=60)).ready >= 1
        assert "sdk-async-p" in [p.name for p in await hub.pools.list()]
        await hub.pools.delete("sdk-async-p")
        await hub.templates.delete("sdk-async-t")
        with pytest.raises(sandhub.NotFoundError):
            await hub.pools.get("sdk-async-p")
        env = await hub.gym.make(reward=[{"kind": "exit_code"}])
        await env.reset(seed=1)
        assert (await env.step("echo $SANDHUB_SEED")).observation == "1\n"
        (res,) = await hub.gym.step_many([(env, "true")])
        assert isinstance(res, sandhub.StepResult)
        await env.close()
        with pytest.raises(sandhub.NotFoundError):
            await hub.get("no-such-sandbox")
        with pytest.raises(sandhub.UnavailableError) as err:
            await sandhub.AsyncHub("http://127.0.0.1:1").list()
        assert "127.0.0.1:1" in str(err.value)

    run(main())


def test_several_event_loops_share_one_runtime(hub_url: str):
    hub = sandhub.AsyncHub(hub_url)
    sid = run(hub.create()).id
    try:
        outs: list[str] = []

        async def one(i: int) -> None:
            sb = await hub.get(sid)
            outs.append((await sb.commands.run(f"echo {i}")).stdout)

        # Sequential loops, then loops on two threads at once.
        run(one(0))
        run(one(1))
        threads = [threading.Thread(target=lambda i=i: run(one(i))) for i in (2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outs) == [f"{i}\n" for i in range(4)]
    finally:
        sandhub.Hub(hub_url).get(sid).delete()


def test_uvloop_if_present(hub_url: str):
    uvloop = pytest.importorskip("uvloop")

    async def main() -> str:
        async with await sandhub.AsyncHub(hub_url).create() as sb:
            return (await sb.commands.run("echo uv")).stdout

    assert uvloop.run(main()) == "uv\n"


def test_cancelling_a_task_kills_the_command(hub_url: str):
    hub = sandhub.Hub(hub_url)
    with hub.create() as sb:

        async def main() -> None:
            ahub = sandhub.AsyncHub(hub_url)
            asb = await ahub.get(sb.id)
            task = asyncio.create_task(asb.commands.run("sleep 4321.5"))
            # Wait until the command is running in the sandbox, then cancel.
            while "sleep 4321.5" not in (await asb.commands.run(PROC_LIST)).stdout:
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The same handle keeps working.
            assert (await asb.commands.run("echo ok")).stdout == "ok\n"

        run(main())
        assert wait_gone(sb.commands.run, "4321.5") == []


def test_closing_an_async_watch_ends_a_waiting_read(hub_url: str):
    async def main() -> None:
        async with await sandhub.AsyncHub(hub_url).create() as sb:
            watch = await sb.watcher.watch(".")

            async def drain() -> int:
                return sum([len(b) async for b in watch])

            task = asyncio.create_task(drain())
            await asyncio.sleep(0)  # let the read start waiting
            watch.close()
            assert await asyncio.wait_for(task, 30) == 0

    run(main())


# A worker thread handing the last result to asyncio used to ask for the GIL back while the
# interpreter was finalizing; CPython ends such a thread with pthread_exit, which aborted
# the process through Rust frames (SIGABRT in about one exit of six). 30 fresh
# interpreters miss that rate with odds under 1 in 1000.
EXIT_SCRIPT = """
import asyncio, sys, sandhub
async def main():
    sb = await sandhub.AsyncHub(sys.argv[1]).create()
    assert (await sb.commands.run("echo ok")).stdout == "ok\\n"
    await sb.delete()
asyncio.run(main())
"""


def test_a_program_ending_right_after_its_last_await_exits_cleanly(hub_url: str):
    import subprocess
    import sys

    for attempt in range(30):
        out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, hub_url], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, f"run {attempt}: exit {out.returncode}\n{out.stderr}"
