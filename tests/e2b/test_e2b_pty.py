"""E2B terminals through the real `e2b` SDK: `sandbox.pty.create` starts an
interactive login shell on a terminal; keystrokes go in with
`pty.send_stdin`, and what the terminal shows comes back as envd's `pty`
data (never as stdout), until the shell exits. The shell must not be sent
an EOF at start (a ^D typed into it), as a command without stdin is.
"""

from __future__ import annotations

import threading

from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize
from sandhub_testing import wait_for


def test_a_terminal_takes_keystrokes_and_shows_their_output(sandbox: Sandbox) -> None:
    shown: list[bytes] = []
    stdout: list[str] = []
    ended: list[int] = []
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)

    def read() -> None:
        try:
            ended.append(handle.wait(on_pty=shown.append, on_stdout=stdout.append).exit_code)
        except CommandExitException as e:
            ended.append(e.exit_code)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # `$((6*7))` is expanded by the shell: the echo of the keystrokes alone
    # would not show 42.
    sandbox.pty.send_stdin(handle.pid, b"echo pty-$((6*7))-$TERM\n")
    wait_for("the shell's answer on the terminal", lambda: b"pty-42-xterm-256color" in b"".join(shown), timeout=15)
    assert handle.pid in {p.pid for p in sandbox.commands.list()}, "the shell exited"

    sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=123))
    sandbox.pty.send_stdin(handle.pid, b"stty size\n")
    wait_for("the new size", lambda: b"40 123" in b"".join(shown), timeout=15)

    sandbox.pty.send_stdin(handle.pid, b"exit 3\n")
    reader.join(timeout=15)
    assert not reader.is_alive(), "the terminal's stream did not end after exit"
    assert ended == [3]
    assert stdout == [], "terminal output arrived as stdout"
