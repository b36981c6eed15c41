"""DeerFlow's own sandbox tools, unmodified, against a real hub through the
provider `sandbox.use:` loads. Each call gets its own runtime, as each tool
call of a DeerFlow agent does; they meet in the thread's one sandbox."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import sandhub
from deerflow.config.app_config import reset_app_config
from deerflow.sandbox.sandbox_provider import get_sandbox_provider, reset_sandbox_provider
from deerflow.sandbox.tools import (
    bash_tool,
    glob_tool,
    grep_tool,
    ls_tool,
    read_file_tool,
    str_replace_tool,
    write_file_tool,
)

from sandhub_deerflow import SandhubSandboxProvider

WS = "/mnt/user-data/workspace"
Runtime = Callable[..., SimpleNamespace]


def sandbox_of(rt: SimpleNamespace) -> str:
    return rt.state["sandbox"]["sandbox_id"]


def test_every_tool_on_one_thread_sandbox(provider: SandhubSandboxProvider, hub: sandhub.Hub, runtime: Runtime) -> None:
    rt = runtime()
    assert bash_tool.func(runtime=rt, description="d", command="pwd") == WS + "\n"
    sid = sandbox_of(rt)
    assert sid.startswith("sb-")

    calls = []

    def call(tool, **kwargs):
        r = runtime()
        out = tool.func(runtime=r, description="d", **kwargs)
        calls.append(sandbox_of(r))
        return out

    assert call(write_file_tool, path=f"{WS}/pkg/a.py", content="X = 1\nY = 'hello'\n") == "OK"
    assert call(write_file_tool, path=f"{WS}/pkg/a.py", content="Z = 3\n", append=True) == "OK"
    assert call(str_replace_tool, path=f"{WS}/pkg/a.py", old_str="X = 1", new_str="X = 2") == "OK"
    assert call(read_file_tool, path=f"{WS}/pkg/a.py") == "X = 2\nY = 'hello'\nZ = 3\n"
    assert call(read_file_tool, path=f"{WS}/pkg/a.py", start_line=2, end_line=3) == "Y = 'hello'\nZ = 3"
    assert call(write_file_tool, path=f"{WS}/notes.md", content="# notes\nhello again\n") == "OK"

    listing = call(ls_tool, path=WS).splitlines()
    assert listing == [f"{WS}/notes.md", f"{WS}/pkg/", f"{WS}/pkg/a.py"]

    found = call(glob_tool, pattern="**/*.py", path=WS)
    assert found == f"Found 1 paths under {WS}\n1. {WS}/pkg/a.py"

    hits = call(grep_tool, pattern="HELLO", path=WS)
    assert hits.splitlines() == [
        f"Found 2 matches under {WS}",
        f"{WS}/notes.md:2: hello again",
        f"{WS}/pkg/a.py:2: Y = 'hello'",
    ] or hits.splitlines() == [
        f"Found 2 matches under {WS}",
        f"{WS}/pkg/a.py:2: Y = 'hello'",
        f"{WS}/notes.md:2: hello again",
    ]
    assert call(grep_tool, pattern="HELLO", path=WS, case_sensitive=True) == f"No matches found under {WS}"
    assert call(grep_tool, pattern="hello", path=WS, glob="**/*.py") == f"Found 1 matches under {WS}\n{WS}/pkg/a.py:2: Y = 'hello'"

    # All in one sandbox, and the files are where the README says: /workspace/workspace/...
    assert set(calls) == {sid}
    sb = hub.get(sid)
    assert sb.files.read_text("workspace/pkg/a.py") == "X = 2\nY = 'hello'\nZ = 3\n"
    assert {e.name for e in sb.files.list(".")} >= {"workspace", "uploads", "outputs"}


def test_bash_sees_the_virtual_paths(provider: SandhubSandboxProvider, runtime: Runtime) -> None:
    rt = runtime()
    out = bash_tool.func(
        runtime=rt,
        description="d",
        command="ls -d /mnt/user-data/*; echo data > /mnt/user-data/uploads/in.txt; cat /mnt/user-data/uploads/in.txt; echo err >&2",
    )
    assert out == (
        "/mnt/user-data/outputs\n/mnt/user-data/uploads\n/mnt/user-data/workspace\ndata\n"
        "\nStd Error:\nerr\n"
    )
    assert bash_tool.func(runtime=rt, description="d", command="exit 3") == "Exit Code: 3"
    assert bash_tool.func(runtime=rt, description="d", command="true") == "(no output)"
    # DeerFlow's tool names it bash: bash syntax works.
    assert bash_tool.func(runtime=rt, description="d", command="[[ -n x ]] && echo {a,b}") == "a b\n"


def test_a_script_the_agent_wrote_with_virtual_paths_runs(
    provider: SandhubSandboxProvider, hub: sandhub.Hub, runtime: Runtime
) -> None:
    """DeerFlow tells models to save results to /mnt/user-data/outputs; a
    script written with that path must work when run, and read back as written."""
    script = "from pathlib import Path\nPath('/mnt/user-data/outputs/report.txt').write_text('42')\nprint('done')\n"
    rt = runtime()
    assert write_file_tool.func(runtime=rt, description="d", path=f"{WS}/make.py", content=script) == "OK"
    assert bash_tool.func(runtime=runtime(), description="d", command="python3 make.py") == "done\n"
    assert read_file_tool.func(runtime=runtime(), description="d", path=f"{WS}/make.py") == script
    assert grep_tool.func(runtime=runtime(), description="d", pattern="report", path=WS) == (
        f"Found 1 matches under {WS}\n{WS}/make.py:2: Path('/mnt/user-data/outputs/report.txt').write_text('42')"
    )
    sb = hub.get(sandbox_of(rt))
    assert sb.files.read_text("outputs/report.txt") == "42"
    assert "/workspace/outputs/report.txt" in sb.files.read_text("workspace/make.py")
    # What the gateway serves as an artifact comes back as the agent wrote it.
    sandbox = provider.get(sandbox_of(rt))
    assert sandbox is not None
    assert sandbox.download_file("/mnt/user-data/outputs/report.txt") == b"42"
    assert sandbox.download_file(f"{WS}/make.py") == script.encode()


def test_tool_errors_read_as_deerflow_words_them(provider: SandhubSandboxProvider, runtime: Runtime) -> None:
    rt = runtime()
    assert bash_tool.func(runtime=rt, description="d", command="mkdir -p d && echo x > f.txt") == "(no output)"
    assert read_file_tool.func(runtime=rt, description="d", path=f"{WS}/nope.txt") == f"Error: File not found: {WS}/nope.txt"
    assert read_file_tool.func(runtime=rt, description="d", path=f"{WS}/d") == f"Error: Path is a directory, not a file: {WS}/d"
    assert ls_tool.func(runtime=rt, description="d", path=f"{WS}/nope") == f"Error: Directory not found: {WS}/nope"
    assert ls_tool.func(runtime=rt, description="d", path=f"{WS}/d") == "(empty)"
    assert glob_tool.func(runtime=rt, description="d", pattern="*", path=f"{WS}/f.txt") == f"Error: Path is not a directory: {WS}/f.txt"
    assert grep_tool.func(runtime=rt, description="d", pattern="(", path=WS).startswith("Error: Invalid regex pattern")
    assert str_replace_tool.func(runtime=rt, description="d", path=f"{WS}/f.txt", old_str="zzz", new_str="y") == (
        f"Error: String to replace not found in file: {WS}/f.txt"
    )
    traversal = read_file_tool.func(runtime=rt, description="d", path=f"{WS}/../../../etc/passwd")
    assert traversal == f"Error: Permission denied reading file: {WS}/../../../etc/passwd"
    # A path outside the user data is the sandbox's own file: root's /etc is read-only there.
    assert write_file_tool.func(runtime=rt, description="d", path="/etc/x.conf", content="x") == (
        "Error: Permission denied writing to file: /etc/x.conf"
    )


def test_provider_settings_from_a_real_config_yaml(
    deerflow_env: None,
    hub: sandhub.Hub,
    hub_url: str,
    tmp_path: Path,
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeerFlow builds the provider itself from config.yaml's `sandbox.use`
    (get_sandbox_provider), and the keys beside `use:` configure it."""
    hub.templates.put("deerflow-test", {"env": {"FROM_TEMPLATE": "template"}})
    config = tmp_path / "conf" / "config.yaml"
    config.parent.mkdir()
    config.write_text(
        "config_version: 1\n"
        "sandbox:\n"
        "  use: sandhub_deerflow:SandhubSandboxProvider\n"
        f"  sandhub_url: {hub_url}\n"
        "  template: deerflow-test\n"
        "  timeout: 1.5\n"
        "  on_release: delete\n"
        "  environment:\n"
        "    FROM_CONFIG: config\n"
    )
    monkeypatch.setenv("DEER_FLOW_CONFIG_PATH", str(config))
    monkeypatch.setenv("SANDHUB_URL", "http://127.0.0.1:9")  # must not be used: the file names the hub
    try:
        reset_app_config()
        provider = get_sandbox_provider()
        assert isinstance(provider, SandhubSandboxProvider)
        assert provider.settings.sandhub_url == hub_url
        assert provider.settings.template == "deerflow-test"
        assert provider.settings.on_release == "delete"
        rt = runtime()
        out = bash_tool.func(runtime=rt, description="d", command="echo $FROM_TEMPLATE $FROM_CONFIG")
        assert out == "template config\n"
        sid = sandbox_of(rt)
        assert hub.get(sid).template == "deerflow-test"
        started = time.monotonic()
        out = bash_tool.func(runtime=rt, description="d", command="sleep 20")
        assert time.monotonic() - started < 10
        assert "timed out after 1.5 seconds" in out
        provider.release(sid)  # on_release: delete
        assert [s.id for s in hub.list() if s.id == sid] == []
    finally:
        get_sandbox_provider().shutdown()
        reset_sandbox_provider()
        reset_app_config()
        hub.templates.delete("deerflow-test")
