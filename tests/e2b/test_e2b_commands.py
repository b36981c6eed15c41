"""E2B commands through the real `e2b` SDK (envd's process.Process service on
the hub): run with stdout/stderr/exit code, cwd, per-command envs and user;
background handles (wait, streaming, kill, connect, stdin); list; timeouts.
"""

from __future__ import annotations

import time

import pytest
from e2b import CommandExitException, Sandbox, SandboxNotRunningException, TimeoutException
from sandhub_testing import wait_for
from sandhub_testing.e2b import WORKSPACE


def running_pids(sandbox: Sandbox) -> set[int]:
    return {p.pid for p in sandbox.commands.list()}


def test_run_stdout_stderr_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)


def test_nonzero_exit_raises_with_output(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as exc:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert exc.value.exit_code == 3
    assert exc.value.stdout == "partial\n"
    assert exc.value.stderr == "bad\n"


def test_sandbox_envs_and_per_command_envs(sandbox: Sandbox) -> None:
    """Create-time envs reach every command; a command's envs add to them and
    win over them, for that command only."""
    assert sandbox.commands.run("echo $GREETING").stdout == "hello\n"
    assert sandbox.commands.run('echo "$A|$GREETING"', envs={"A": "one"}).stdout == "one|hello\n"
    assert sandbox.commands.run("echo $GREETING", envs={"GREETING": "override"}).stdout == "override\n"
    assert sandbox.commands.run('echo "${A:-unset}|$GREETING"').stdout == "unset|hello\n"


def test_cwd(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir(f"{WORKSPACE}/e2b-cwd")
    assert sandbox.commands.run("pwd", cwd=f"{WORKSPACE}/e2b-cwd").stdout == f"{WORKSPACE}/e2b-cwd\n"


def test_run_as_root(sandbox: Sandbox) -> None:
    """`user=` goes as `Authorization: Basic base64("root:")` on the envd
    call: the hub must take it as envd's user, not as an API credential."""
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"


def test_large_output_arrives_whole(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("head -c 1000000 /dev/zero | tr '\\0' a")
    assert result.stdout == "a" * 1_000_000


def test_background_then_wait(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 0.3; echo done; echo warn >&2", background=True)
    assert handle.pid > 0
    seen: list[str] = []
    result = handle.wait(on_stdout=seen.append)
    assert (result.stdout, result.stderr, result.exit_code) == ("done\n", "warn\n", 0)
    assert "".join(seen) == "done\n"


def test_background_failure_raises_on_wait(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("exit 7", background=True)
    with pytest.raises(CommandExitException) as exc:
        handle.wait()
    assert exc.value.exit_code == 7


def test_output_streams_while_the_command_runs(sandbox: Sandbox) -> None:
    """Output is delivered as it is written, not when the command ends."""
    handle = sandbox.commands.run("echo first; sleep 30", background=True)
    started = time.monotonic()
    first = None
    for stdout, _stderr, _pty in handle:
        if stdout:
            first = stdout
            break
    elapsed = time.monotonic() - started
    assert first == "first\n"
    assert elapsed < 20, f"the first line took {elapsed:.1f}s: output held back until exit?"
    assert sandbox.commands.kill(handle.pid) is True
    handle.disconnect()


def test_list_then_kill_background_process(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    processes = {p.pid: p for p in sandbox.commands.list()}
    assert handle.pid in processes, processes
    assert processes[handle.pid].cmd == "/bin/bash"
    assert "sleep 30" in processes[handle.pid].args

    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as exc:
        handle.wait()
    assert exc.value.exit_code != 0
    wait_for("the killed process to leave the list", lambda: handle.pid not in running_pids(sandbox), timeout=20)
    # Gone: a second kill finds nothing.
    assert sandbox.commands.kill(handle.pid) is False


def test_send_stdin_to_head(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("head -n1", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "first line\nsecond line\n")
    assert handle.wait().stdout == "first line\n"


def test_send_stdin_then_close(sandbox: Sandbox) -> None:
    """str and bytes input arrive in order; closing stdin ends `cat`."""
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "abc")
    sandbox.commands.send_stdin(handle.pid, b"def\n")
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "abcdef\n"


def test_connect_to_running_command(sandbox: Sandbox) -> None:
    """A handle dropped with disconnect() leaves the command running;
    commands.connect(pid) picks its output up again."""
    handle = sandbox.commands.run("sleep 2; echo later", background=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    assert again.pid == handle.pid
    assert again.wait().stdout == "later\n"


def test_command_timeout_raises_promptly(sandbox: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"a 1 s command timeout took {elapsed:.1f}s"
    # The sandbox still serves commands.
    assert sandbox.commands.run("echo alive").stdout == "alive\n"


def test_envd_calls_on_a_killed_sandbox_say_not_running(sandbox: Sandbox) -> None:
    """After kill, envd calls fail as E2B's proxy answers for a sandbox that
    is gone (502 "... was not found"): SandboxNotRunningException."""
    assert sandbox.kill() is True
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("true")
    with pytest.raises(SandboxNotRunningException):
        sandbox.files.read("/etc/hostname")
