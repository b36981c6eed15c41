"""`SandhubWorkspace` against a real hub: the agent server runs in a sandbox of the
agent-server image and every call goes through the hub's port proxy."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import sandhub
from conftest import HUB_KEY, LABEL, TEMPLATE
from openhands.sdk.git.models import GitChangeStatus

from sandhub_openhands import AgentServerError, SandhubWorkspace, agent_server_template


def test_execute_command_reports_exit_code_stdout_and_stderr(workspace: SandhubWorkspace) -> None:
    result = workspace.execute_command("echo hello; echo oops >&2; exit 3", timeout=30)
    assert result.exit_code == 3
    assert result.stdout == "hello\n"
    assert result.stderr == "oops\n"
    assert not result.timeout_occurred


def test_execute_command_runs_in_the_sandbox_image(workspace: SandhubWorkspace) -> None:
    result = workspace.execute_command(
        "python3 -c 'import sys; print(sys.version_info[:2])'; pwd; echo made > made-here.txt", timeout=30
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["(3, 12)", "/workspace"]
    # The file is in the sandbox, as the sandhub SDK sees it (its paths are
    # relative to the sandbox's /workspace).
    assert workspace.sandbox.files.read_text("made-here.txt") == "made\n"
    assert workspace.execute_command("pwd", cwd="/tmp", timeout=30).stdout == "/tmp\n"


def test_execute_command_timeout(workspace: SandhubWorkspace) -> None:
    started = time.monotonic()
    result = workspace.execute_command("sleep 30", timeout=2)
    assert time.monotonic() - started < 15
    assert result.timeout_occurred
    assert result.exit_code == -1
    assert "timed out" in result.stderr


def test_file_upload_and_download(workspace: SandhubWorkspace, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 64
    src = tmp_path / "up.bin"
    src.write_bytes(payload)
    up = workspace.file_upload(src, "/workspace/files/up.bin")
    assert up.success, up.error
    assert up.file_size == len(payload)
    assert workspace.sandbox.files.read("files/up.bin") == payload

    workspace.sandbox.files.write("files/from-sdk.txt", b"written by the sandhub SDK\n")
    dest = tmp_path / "down.txt"
    down = workspace.file_download("/workspace/files/from-sdk.txt", dest)
    assert down.success, down.error
    assert dest.read_bytes() == b"written by the sandhub SDK\n"

    missing = workspace.file_download("/workspace/files/nope.txt", tmp_path / "nope.txt")
    assert not missing.success
    assert not (tmp_path / "nope.txt").exists()


def test_git_changes_and_diff(workspace: SandhubWorkspace, tmp_path: Path) -> None:
    setup = workspace.sandbox.commands.run(
        "set -e; rm -rf /workspace/repo; mkdir -p /workspace/repo; cd /workspace/repo; git init -q;"
        " git config user.email t@example.com; git config user.name t;"
        " printf 'one\\n' > kept.txt; printf 'old\\n' > gone.txt; git add .; git commit -qm init"
    )
    assert setup.exit_code == 0, setup.stderr
    changed = workspace.execute_command(
        "printf 'one\\ntwo\\n' > kept.txt && rm gone.txt", cwd="/workspace/repo", timeout=30
    )
    assert changed.exit_code == 0, changed.stderr
    new = tmp_path / "new.txt"
    new.write_text("brand new\n")
    assert workspace.file_upload(new, "/workspace/repo/new.txt").success

    changes = {str(c.path): c.status for c in workspace.git_changes("/workspace/repo")}
    assert changes == {
        "kept.txt": GitChangeStatus.UPDATED,
        "gone.txt": GitChangeStatus.DELETED,
        "new.txt": GitChangeStatus.ADDED,
    }
    diff = workspace.git_diff("/workspace/repo/kept.txt")
    # The server gives both sides without their last newline.
    assert (diff.original, diff.modified) == ("one", "one\ntwo")


def test_both_keys_reach_where_they_must(workspace: SandhubWorkspace) -> None:
    assert workspace.alive
    url = f"{workspace.host}/api/bash/bash_events/search"
    if workspace.route == "tunnel":
        # The tunnel carries the hub's key itself; the server still wants its own.
        assert workspace.host.startswith("http://127.0.0.1:")
        assert httpx.get(url, headers={"X-Session-API-Key": workspace.api_key or ""}).status_code == 200
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"X-Session-API-Key": "wrong"}).status_code == 401
        return
    assert workspace.host == f"{workspace.hub.url}/v1/sandboxes/{workspace.sandbox_id}/ports/8000"
    session = {"X-Session-API-Key": workspace.api_key or ""}
    hub_auth = {"Authorization": f"Bearer {HUB_KEY}"}
    # Both: the hub lets it through, the server accepts it.
    assert httpx.get(url, headers={**session, **hub_auth}).status_code == 200
    # No hub key: the hub refuses it before any sandbox sees it.
    refused = httpx.get(url, headers=session)
    assert refused.status_code == 401
    assert refused.json()["code"] == "UNAUTHENTICATED"
    # The hub's key alone: the server refuses it (the proxy never passes the hub key on).
    assert httpx.get(url, headers=hub_auth).status_code == 401
    assert httpx.get(url, headers={**hub_auth, "X-Session-API-Key": "wrong"}).status_code == 401


def test_a_wrong_session_key_runs_nothing(workspace: SandhubWorkspace, hub_url: str) -> None:
    """A workspace attached with the wrong session key reports the server's refusal
    as RemoteWorkspace does (exit code -1, 401 in stderr) and runs nothing; its
    cleanup leaves the sandbox, which it did not create."""
    intruder = SandhubWorkspace(
        hub_url=hub_url, hub_api_key=HUB_KEY, sandbox_id=workspace.sandbox_id, api_key="not-the-key",
        connection=workspace.connection,
    )
    result = intruder.execute_command("touch /workspace/intruder", timeout=20)
    assert result.exit_code == -1
    assert "401" in result.stderr
    assert not workspace.sandbox.files.exists("intruder")
    intruder.cleanup()
    assert workspace.sandbox.refresh().state == "Ready"


def test_attach_reuses_the_server_and_leaves_the_sandbox(workspace: SandhubWorkspace, hub_url: str) -> None:
    with SandhubWorkspace(hub_url=hub_url, hub_api_key=HUB_KEY, sandbox_id=workspace.sandbox_id) as attached:
        assert attached.api_key == workspace.api_key  # read back from the sandbox
        assert attached.execute_command("echo attached", timeout=30).stdout == "attached\n"
    assert workspace.sandbox.refresh().state == "Ready"
    assert workspace.execute_command("true", timeout=30).exit_code == 0


def test_keep_sandbox_then_attach_then_delete(hub: sandhub.Hub, hub_url: str) -> None:
    """`keep_sandbox` leaves a created sandbox (and its server) on exit; a later
    workspace attaches to the running server; deleting is then the caller's.
    (That a created sandbox is deleted on exit: test_conversation.py.)"""
    labels = {**LABEL, "case": "keep"}
    with SandhubWorkspace(
        hub_url=hub_url, hub_api_key=HUB_KEY, template=TEMPLATE, labels=labels, keep_sandbox=True
    ) as kept:
        assert kept.execute_command("echo from-the-first > first.txt", timeout=30).exit_code == 0
    sid = kept.sandbox_id or ""
    assert [s.id for s in hub.list(labels)] == [sid]
    with SandhubWorkspace(hub_url=hub_url, hub_api_key=HUB_KEY, sandbox_id=sid) as again:
        assert again.api_key == kept.api_key
        assert again.execute_command("cat first.txt", timeout=30).stdout == "from-the-first\n"
    hub.get(sid).delete()
    with pytest.raises(sandhub.NotFoundError):
        hub.get(sid)


def test_a_server_that_never_answers_fails_clearly_and_leaves_nothing(hub: sandhub.Hub, hub_url: str) -> None:
    labels = {**LABEL, "case": "broken"}
    with pytest.raises(AgentServerError, match="did not answer /health") as err:
        SandhubWorkspace(
            hub_url=hub_url, hub_api_key=HUB_KEY, template=TEMPLATE, labels=labels,
            server_command=["python3", "-c", "import sys; print('no server here'); sys.exit(1)", "--"],
            startup_timeout=3,
        )
    assert "no server here" in str(err.value)  # the server's log is in the message
    assert hub.list(labels) == []


def test_a_wrong_hub_key_is_refused_before_anything_is_made(hub_url: str) -> None:
    with pytest.raises(sandhub.UnauthenticatedError):
        SandhubWorkspace(hub_url=hub_url, hub_api_key="not-a-key-of-this-hub", template=TEMPLATE)


def test_agent_server_template() -> None:
    spec = agent_server_template("some/image:1", env={"A": "1"}, network="host", memory_mb=2048)
    assert spec == {
        "image": "some/image:1", "entrypoint": [], "workdir": "/workspace", "network": "host",
        "env": {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "A": "1"}, "memory_mb": 2048,
    }
    assert agent_server_template(None, root_fs="/srv/rootfs")["root_fs"] == "/srv/rootfs"
    with pytest.raises(ValueError):
        agent_server_template(None)
    with pytest.raises(ValueError):
        agent_server_template("x", root_fs="/y")
    with pytest.raises(ValueError):
        agent_server_template("x", network="bridge")  # type: ignore[arg-type]


def test_pause_and_resume(workspace: SandhubWorkspace, hub: sandhub.Hub) -> None:
    """Last in the module: it restarts the shared workspace's server."""
    assert workspace.execute_command("echo kept > /workspace/kept.txt", timeout=30).exit_code == 0
    key = workspace.api_key
    workspace.pause()
    assert hub.get(workspace.sandbox_id or "").state == "Suspended"
    assert not workspace.alive
    workspace.resume()
    assert hub.get(workspace.sandbox_id or "").state == "Ready"
    assert workspace.alive
    assert workspace.api_key == key
    result = workspace.execute_command("cat /workspace/kept.txt", timeout=30)
    assert (result.exit_code, result.stdout) == (0, "kept\n")
