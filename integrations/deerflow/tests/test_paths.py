"""The virtual-path translation on its own (no hub)."""

from __future__ import annotations

import pytest

from sandhub_deerflow import PathMap

M = PathMap()


@pytest.mark.parametrize(
    ("virtual", "real"),
    [
        ("/mnt/user-data", "/workspace"),
        ("/mnt/user-data/", "/workspace"),
        ("/mnt/user-data/workspace/a.py", "/workspace/workspace/a.py"),
        ("/mnt/user-data//outputs/./x", "/workspace/outputs/x"),
        ("/mnt/user-data2/x", "/mnt/user-data2/x"),
        ("/tmp/x", "/tmp/x"),
        ("//etc/passwd", "/etc/passwd"),
    ],
)
def test_to_real(virtual: str, real: str) -> None:
    assert M.to_real(virtual) == real


@pytest.mark.parametrize("bad", ["", "a.txt", "./a", "/mnt/user-data/a\0b", None, 3])
def test_to_real_refuses_what_is_no_absolute_path(bad: object) -> None:
    with pytest.raises(ValueError):
        M.to_real(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["/mnt/user-data/..", "/mnt/user-data/workspace/../../etc", "/a/../b"])
def test_to_real_refuses_traversal(bad: str) -> None:
    with pytest.raises(PermissionError, match="traversal"):
        M.to_real(bad)


def test_commands_and_output_translate_only_whole_paths() -> None:
    cmd = 'cd /mnt/user-data/workspace; cat "/mnt/user-data/uploads/a b" >/mnt/user-data/outputs/o;X=/mnt/user-data ls'
    assert M.in_command(cmd) == 'cd /workspace/workspace; cat "/workspace/uploads/a b" >/workspace/outputs/o;X=/workspace ls'
    for untouched in ["/x/mnt/user-data/y", "/mnt/user-data2", "/mnt/user-data.bak", "mnt/user-data"]:
        assert M.in_command(untouched) == untouched
    assert M.in_output("/workspace/outputs/r.txt:1: /workspace\n") == "/mnt/user-data/outputs/r.txt:1: /mnt/user-data\n"
    assert M.in_output("/workspaces /my/workspace /workspace-x") == "/workspaces /my/workspace /workspace-x"
    assert M.to_virtual("/workspace/uploads/f") == "/mnt/user-data/uploads/f"
    assert M.to_virtual("/tmp/f") == "/tmp/f"


def test_identity_when_the_sandbox_has_the_virtual_root() -> None:
    native = PathMap(real_root="/mnt/user-data")
    assert native.identity
    assert native.in_command("cd /mnt/user-data/workspace") == "cd /mnt/user-data/workspace"
    assert native.in_output("/workspace") == "/workspace"
    assert native.to_real("/mnt/user-data/x") == "/mnt/user-data/x"
