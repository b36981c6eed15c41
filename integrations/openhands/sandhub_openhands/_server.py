"""Starting the agent server inside a sandbox and waiting until it answers.

Everything here goes through the `sandhub` SDK (commands, files, port URLs); only the
agent server's own `/health` is asked over HTTP, through the hub's port proxy.
"""

from __future__ import annotations

import shlex
import time
from typing import Mapping, Sequence

import httpx
import sandhub

#: Where the server keeps its state (conversations, bash events, its log) inside the
#: sandbox: outside the agent's working directory, so `git_changes` never sees it.
STATE_DIR = "/tmp/sandhub-openhands"
#: The session key of the running server, for a later `SandhubWorkspace(sandbox_id=...)`.
#: Nothing is gained by hiding it from the sandbox: the agent runs there as the same
#: user and could read the server's environment.
KEY_FILE = f"{STATE_DIR}/session-key"
LOG_FILE = f"{STATE_DIR}/server.log"

DEFAULT_COMMAND: tuple[str, ...] = ("python3", "-m", "openhands.agent_server")


class AgentServerError(RuntimeError):
    """The agent server did not start, or stopped answering."""


def start(
    sandbox: sandhub.Sandbox,
    *,
    key: str,
    port: int,
    command: Sequence[str] = DEFAULT_COMMAND,
    env: Mapping[str, str] | None = None,
) -> None:
    """Starts the agent server in the background, detached from this call (it must
    outlive the request that started it), listening on all interfaces of the
    sandbox (a session key makes it bind beyond loopback, and requires the key)."""
    argv = [*command, "--host", "0.0.0.0", "--port", str(port)]
    script = (
        f"mkdir -p {STATE_DIR} && cd {STATE_DIR}"
        f" && (umask 077 && printf %s \"$OH_SESSION_API_KEYS_0\" > {KEY_FILE})"
        f" && {{ nohup {shlex.join(argv)} > {LOG_FILE} 2>&1 < /dev/null & }}"
    )
    result = sandbox.commands.run(
        ["sh", "-c", script], env={**dict(env or {}), "OH_SESSION_API_KEYS_0": key}, timeout=30
    )
    if result.exit_code != 0:
        raise AgentServerError(f"could not start the agent server in {sandbox.id}: {result.stderr.strip()}")


def running_key(sandbox: sandhub.Sandbox) -> str | None:
    """The session key a server started by `start` was given, if it left one. (Read
    with a command: the SDK's file calls reach only the sandbox's workspace.)"""
    result = sandbox.commands.run(["cat", KEY_FILE], timeout=30)
    return (result.stdout.strip() or None) if result.exit_code == 0 else None


def log_tail(sandbox: sandhub.Sandbox, lines: int = 40) -> str:
    """The end of the server's log, for error messages."""
    try:
        result = sandbox.commands.run(["tail", "-n", str(lines), LOG_FILE], timeout=30)
    except sandhub.SandhubError as e:
        return f"(no log: {e.message})"
    return result.stdout if result.exit_code == 0 else f"(no log: {result.stderr.strip()})"


def healthy(client: httpx.Client) -> bool:
    """Whether the server answers `GET /health` with a 2xx (through the hub)."""
    try:
        return bool(client.get("/health", timeout=5.0).is_success)
    except httpx.HTTPError:
        return False


def wait_healthy(sandbox: sandhub.Sandbox, client: httpx.Client, timeout: float) -> None:
    """Returns once `/health` answers; raises `AgentServerError` with the server's log
    when it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        if healthy(client):
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    raise AgentServerError(
        f"the agent server in sandbox {sandbox.id} did not answer /health within {timeout}s;"
        f" its log ends:\n{log_tail(sandbox)}"
    )


def check_key(sandbox: sandhub.Sandbox, client: httpx.Client) -> None:
    """Raises `AgentServerError` unless the server that answers takes the client's
    session key: on the host's network another sandbox's server may hold the port."""
    try:
        status = client.get("/api/bash/bash_events/search", params={"limit": 1}, timeout=30.0).status_code
    except httpx.HTTPError as e:
        raise AgentServerError(f"the agent server of sandbox {sandbox.id} stopped answering: {e}") from e
    if status in (401, 403):
        raise AgentServerError(
            f"the agent server answering for sandbox {sandbox.id} refuses this workspace's session key"
            " (on the host's network, another server may hold the port: pick another server_port)"
        )
