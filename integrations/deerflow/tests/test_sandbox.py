"""The eight Sandbox methods, called directly, against a real sandbox."""

from __future__ import annotations

import re
import time
from typing import Iterator

import pytest
import sandhub

from sandhub_deerflow import PathMap, SandhubSandbox, SandhubSandboxProvider

WS = "/mnt/user-data/workspace"


@pytest.fixture
def sandbox(provider: SandhubSandboxProvider) -> SandhubSandbox:
    sb = provider.get(provider.acquire("t-methods"))
    assert sb is not None
    return sb


@pytest.fixture
def raw(hub: sandhub.Hub) -> Iterator[sandhub.Sandbox]:
    with hub.create() as sb:
        yield sb


# ---------------------------------------------------------------- execute_command


@pytest.mark.parametrize("name", ["A-B", "1A", "A B", "", "A=B", "$(id)", "A;rm"])
def test_env_names_are_checked_as_deerflow_does(sandbox: SandhubSandbox, name: str) -> None:
    with pytest.raises(ValueError, match="POSIX environment variable name"):
        sandbox.execute_command("true", env={name: "x"})


def test_env_values_reach_the_command_as_data(sandbox: SandhubSandbox) -> None:
    out = sandbox.execute_command('printf "%s|%s" "$TOKEN" "$_B2"', env={"TOKEN": "$(id) 'q' \"x\"", "_B2": "ok"})
    assert out == "$(id) 'q' \"x\"|ok"


def test_a_default_timeout_applies_when_deerflow_gives_none(raw: sandhub.Sandbox) -> None:
    short = SandhubSandbox(raw, timeout=1)
    started = time.monotonic()
    out = short.execute_command("echo before; sleep 30")
    assert time.monotonic() - started < 10
    assert out.startswith("before\n") and "timed out after 1 seconds" in out
    started = time.monotonic()
    assert "timed out after 0.5 seconds" in short.execute_command("sleep 30", timeout=0.5)
    assert short.execute_command("sleep 1.2; echo late", timeout=5) == "late\n"  # explicit beats the default


def test_a_transport_failure_is_an_error_text(hub: sandhub.Hub) -> None:
    sb = hub.create()
    gone = SandhubSandbox(sb)
    sb.delete()
    assert gone.execute_command("true").startswith("Error: ")


# ---------------------------------------------------------------- read / write


def test_write_append_and_line_ranges(sandbox: SandhubSandbox) -> None:
    path = f"{WS}/lines/t.txt"
    sandbox.write_file(path, "one\ntwo\n")
    sandbox.write_file(path, "three\r\nfour\n", append=True)
    assert sandbox.read_file(path) == "one\ntwo\nthree\r\nfour\n"
    assert sandbox.read_file(path, start_line=2) == "two\nthree\nfour"
    assert sandbox.read_file(path, end_line=2) == "one\ntwo"
    assert sandbox.read_file(path, start_line=2, end_line=3) == "two\nthree"
    assert sandbox.read_file(path, start_line=4, end_line=99) == "four"
    assert sandbox.read_file(path, start_line=9) == ""
    sandbox.write_file(path, "fresh")
    assert sandbox.read_file(path) == "fresh"


def test_update_file_and_download_are_byte_exact(sandbox: SandhubSandbox) -> None:
    blob = bytes(range(256)) * 4096 + b"/mnt/user-data/x"  # 1 MiB, not UTF-8
    sandbox.update_file("/mnt/user-data/uploads/blob.bin", blob)
    assert sandbox.download_file("/mnt/user-data/uploads/blob.bin") == blob
    with pytest.raises(UnicodeDecodeError):
        sandbox.read_file("/mnt/user-data/uploads/blob.bin")
    assert sandbox.execute_command("wc -c < /mnt/user-data/uploads/blob.bin") == f"{len(blob)}\n"


def test_missing_and_odd_paths_raise_what_deerflow_expects(sandbox: SandhubSandbox) -> None:
    with pytest.raises(FileNotFoundError):
        sandbox.read_file(f"{WS}/missing.txt")
    with pytest.raises(FileNotFoundError):
        sandbox.download_file(f"{WS}/missing.txt")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file(WS)
    with pytest.raises(IsADirectoryError):
        sandbox.write_file("/mnt/user-data", "x")
    with pytest.raises(PermissionError):
        sandbox.download_file("/etc/passwd")  # downloads only from /mnt/user-data
    with pytest.raises(PermissionError):
        sandbox.read_file(f"{WS}/../../../../etc/passwd")
    with pytest.raises(ValueError):
        sandbox.read_file("relative.txt")
    with pytest.raises(ValueError):
        sandbox.write_file(f"{WS}/nul\0.txt", "x")
    with pytest.raises(FileNotFoundError):
        sandbox.list_dir(f"{WS}/missing")
    with pytest.raises(FileNotFoundError):
        sandbox.grep(f"{WS}/missing", "x")


def test_files_outside_the_workspace_go_through_the_shell(sandbox: SandhubSandbox) -> None:
    sandbox.write_file("/tmp/deer/a.txt", "one\n")
    sandbox.write_file("/tmp/deer/a.txt", "two\n", append=True)
    assert sandbox.read_file("/tmp/deer/a.txt") == "one\ntwo\n"
    assert sandbox.read_file("/tmp/deer/a.txt", start_line=2, end_line=2) == "two"
    assert sandbox.execute_command("cat /tmp/deer/a.txt") == "one\ntwo\n"
    assert "root:" in sandbox.read_file("/etc/passwd")
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/tmp/deer/none")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("/tmp/deer")
    with pytest.raises(PermissionError):
        sandbox.write_file("/usr/deer.txt", "x")  # the read-only root


def test_a_user_data_root_outside_the_workspace(raw: sandhub.Sandbox) -> None:
    """`user_data_root` may name any writable place (here /tmp/ud): every method
    then works through the shell, and paths still read as virtual."""
    raw.commands.run("mkdir -p /tmp/ud/workspace /tmp/ud/uploads /tmp/ud/outputs")
    sb = SandhubSandbox(raw, paths=PathMap(real_root="/tmp/ud"))
    sb.write_file(f"{WS}/s.py", "import os; print(os.path.isfile('/mnt/user-data/workspace/s.py'))\n")
    assert sb.execute_command(f"cd {WS}; python3 s.py; pwd") == "True\n/mnt/user-data/workspace\n"
    assert raw.commands.run("cat /tmp/ud/workspace/s.py").stdout.count("/tmp/ud/workspace/s.py") == 1
    assert sb.read_file(f"{WS}/s.py").count("/mnt/user-data") == 1
    assert sb.list_dir("/mnt/user-data", max_depth=1) == [
        "/mnt/user-data/outputs/", "/mnt/user-data/uploads/", "/mnt/user-data/workspace/",
    ]
    assert sb.glob(WS, "*.py") == ([f"{WS}/s.py"], False)
    assert [m.path for m in sb.grep(WS, "isfile")[0]] == [f"{WS}/s.py"]


# ---------------------------------------------------------------- list / glob / grep


def make_tree(sb: SandhubSandbox) -> str:
    root = f"{WS}/tree"
    for rel, text in {
        "a.py": "alpha = 1\nABC = 'a.c'\n",
        "src/b.py": "beta = 2\nabc = 3\n",
        "src/deep/c.txt": "gamma a+c\n",
        "node_modules/skip.py": "alpha = 'ignored'\n",
        "-dash.txt": "--flag alpha\n",
    }.items():
        sb.write_file(f"{root}/{rel}", text)
    sb.update_file(f"{root}/bin.dat", b"\0alpha\0")
    return root


def test_list_dir_depth_ignores_and_dir_marks(sandbox: SandhubSandbox) -> None:
    root = make_tree(sandbox)
    assert sandbox.list_dir(root, max_depth=1) == sorted(
        [f"{root}/-dash.txt", f"{root}/a.py", f"{root}/bin.dat", f"{root}/src/"]
    )
    assert sandbox.list_dir(root) == sorted(
        [f"{root}/-dash.txt", f"{root}/a.py", f"{root}/bin.dat", f"{root}/src/", f"{root}/src/b.py", f"{root}/src/deep/"]
    )
    with pytest.raises(NotADirectoryError):
        sandbox.list_dir(f"{root}/a.py")


def test_glob_patterns_dirs_and_truncation(sandbox: SandhubSandbox) -> None:
    root = make_tree(sandbox)
    files, truncated = sandbox.glob(root, "**/*.py")
    assert sorted(files) == [f"{root}/a.py", f"{root}/src/b.py"] and not truncated
    assert sorted(sandbox.glob(root, "*.py")[0]) == [f"{root}/a.py", f"{root}/src/b.py"]  # DeerFlow's matching: from the right
    assert sandbox.glob(root, "src/*.py") == ([f"{root}/src/b.py"], False)
    dirs, _ = sandbox.glob(root, "src*", include_dirs=True)
    assert dirs == [f"{root}/src"]
    assert sandbox.glob(root, "src*") == ([], False)
    some, truncated = sandbox.glob(root, "**/*", max_results=2)
    assert len(some) == 2 and truncated


def test_grep_literal_regex_case_glob_and_limits(sandbox: SandhubSandbox) -> None:
    root = make_tree(sandbox)

    def found(pattern: str, **kw: object) -> list[tuple[str, int, str]]:
        matches, _ = sandbox.grep(root, pattern, **kw)  # type: ignore[arg-type]
        return sorted((m.path[len(root) + 1 :], m.line_number, m.line) for m in matches)

    assert found("a.c", literal=True) == [("a.py", 2, "ABC = 'a.c'")]
    assert found("A.C") == [("a.py", 2, "ABC = 'a.c'"), ("src/b.py", 2, "abc = 3"), ("src/deep/c.txt", 1, "gamma a+c")]
    assert found("A.C", case_sensitive=True) == [("a.py", 2, "ABC = 'a.c'")]
    assert found("a+c", literal=True) == [("src/deep/c.txt", 1, "gamma a+c")]
    assert found(r"\balpha\b") == [("-dash.txt", 1, "--flag alpha"), ("a.py", 1, "alpha = 1")]  # node_modules, binary skipped
    assert found("alpha", glob="*.py") == [("a.py", 1, "alpha = 1")]
    assert found("--flag") == [("-dash.txt", 1, "--flag alpha")]  # a pattern that looks like an option
    assert found("$(touch /tmp/pwned)") == []
    assert sandbox.execute_command("test -e /tmp/pwned || echo safe") == "safe\n"
    one, truncated = sandbox.grep(root, "a", max_results=1)
    assert len(one) == 1 and truncated
    single, _ = sandbox.grep(f"{root}/src/b.py", "beta")
    assert [(m.path, m.line_number) for m in single] == [(f"{root}/src/b.py", 1)]
    with pytest.raises(re.error):
        sandbox.grep(root, "(")
