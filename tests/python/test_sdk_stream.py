"""The sandhub SDK under load: streaming without buffering, parallel
calls from threads and tasks, and Ctrl-C in the middle of a call."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sandhub
from sdk_fixtures import PROC_LIST, hub_url, running_hub, wait_gone  # noqa: F401 (fixtures)

MiB = 1 << 20


@pytest.fixture(scope="module")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


def _default_sigint() -> None:
    # As at a terminal: a test run started as a background job (SIGINT
    # ignored, which exec keeps) would leave Python without its
    # KeyboardInterrupt handler, and the ctrl-c tests without a ctrl-c.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def test_200_mb_of_stdout_through_events(hub: sandhub.Hub):
    with hub.create() as sb:
        h = sb.commands.start("head -c 200000000 /dev/zero; echo done >&2")
        total, biggest, exit_ev = 0, 0, None
        for ev in h.events():
            if isinstance(ev, sandhub.ProcessOutputEvent) and ev.stream == "stdout":
                total += len(ev.data)
                biggest = max(biggest, len(ev.data))
            elif isinstance(ev, sandhub.ProcessExitEvent):
                exit_ev = ev
        assert total == 200_000_000
        assert exit_ev is not None and exit_ev.exit_code == 0
        # Chunks, not one buffered blob.
        assert biggest < 16 * MiB


# Measured in a fresh interpreter, so earlier tests' peaks do not hide growth.
GIB_ROUND_TRIP = """
    import resource, sys, sandhub

    class Zeros:
        def __init__(self, n): self.left = n
        def read(self, size=-1):
            size = self.left if size < 0 else min(size, self.left)
            self.left -= size
            return bytes(size)

    class Count:
        def __init__(self): self.n = 0
        def write(self, b): self.n += len(b)

    hub = sandhub.Hub(sys.argv[1])
    with hub.create() as sb:
        sb.commands.run("true")
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        sb.files.write("big.bin", Zeros(1 << 30))
        assert sb.files.stat("big.bin").size == 1 << 30
        sink = Count()
        sb.files.read_to("big.bin", sink)
        assert sink.n == 1 << 30, sink.n
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((peak - base) // 1024)
"""


def test_1_gib_write_and_read_in_bounded_memory(hub_url: str):
    child = _child(GIB_ROUND_TRIP, hub_url)
    out, err = child.communicate(timeout=900)
    assert child.returncode == 0, err
    growth_mib = int(out.strip().splitlines()[-1])
    assert growth_mib < 64, f"peak RSS grew by {growth_mib} MiB"


def test_8_threads_x_50_runs(hub: sandhub.Hub):
    with hub.create() as sb:
        results: dict[int, list[int]] = {}

        def worker(i: int) -> None:
            results[i] = [sb.commands.run("true").exit_code for _ in range(50)]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {i: [0] * 50 for i in range(8)}

        # Overlap: 8 threads each waiting 1 s in the sandbox finish far
        # sooner than 8 s, which only happens with the GIL released.
        start = time.monotonic()
        threads = [threading.Thread(target=sb.commands.run, args=("sleep 1",)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - start < 4.0


def test_64_concurrent_asyncio_tasks(hub_url: str):
    async def main() -> list[str]:
        ahub = sandhub.AsyncHub(hub_url)
        async with await ahub.create() as sb:
            outs = await asyncio.gather(*(sb.commands.run(f"echo {i}") for i in range(64)))
            start = time.monotonic()
            await asyncio.gather(*(sb.commands.run("sleep 1") for _ in range(16)))
            assert time.monotonic() - start < 8.0
            return [o.stdout for o in outs]

    assert asyncio.run(main()) == [f"{i}\n" for i in range(64)]


CTRL_C = """
    import sys, sandhub
    hub = sandhub.Hub(sys.argv[1])
    sb = hub.get(sys.argv[2])
    print("calling", flush=True)
    try:
        sb.commands.run("sleep 4242.5")
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(sb.commands.run("echo usable").stdout.strip(), flush=True)
"""


def test_ctrl_c_interrupts_and_leaves_no_process(hub: sandhub.Hub, hub_url: str):
    with hub.create() as sb:
        child = _child(CTRL_C, hub_url, sb.id)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "calling"
        deadline = time.monotonic() + 30
        while "sleep 4242.5" not in sb.commands.run(PROC_LIST).stdout:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        assert out.split() == ["interrupted", "usable"]
        assert wait_gone(sb.commands.run, "4242.5") == []


def test_ctrl_c_during_events_keeps_the_handle(hub: sandhub.Hub, hub_url: str):
    code = """
        import os, signal, sys, threading, sandhub
        sb = sandhub.Hub(sys.argv[1]).get(sys.argv[2])
        h = sb.commands.start("echo first; read x; echo second")
        events = h.events()
        print(next(events).data.decode().strip(), flush=True)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            next(events)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        h.write_stdin("go\\n")
        print([e.data.decode().strip() for e in h.events() if hasattr(e, "data")], flush=True)
    """
    with hub.create() as sb:
        child = _child(code, hub_url, sb.id)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.splitlines() == ["first", "interrupted", "['second']"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the hub runs as root")
def test_sandbox_deleted_under_a_running_call_is_lost(hub: sandhub.Hub):
    sb = hub.create()
    h = sb.commands.start(["sleep", "300"])
    hub.get(sb.id).delete()
    with pytest.raises(sandhub.SandboxLostError) as err:
        for _ in h.events():
            pass
    assert isinstance(err.value, sandhub.NotFoundError)


def test_a_forked_child_gets_a_clear_error_not_a_hang(hub: sandhub.Hub):
    with hub.create() as sb:
        sb.commands.run("true")  # the runtime is running in this process
        pid = os.fork()
        if pid == 0:  # the child: must raise at once, never wait on a dead thread
            code = 1
            try:
                sb.commands.run("true")
            except RuntimeError as e:
                code = 0 if "spawn" in str(e) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent is unaffected.
        assert sb.commands.run("echo still").stdout == "still\n"
