"""E2B files through the real `e2b` SDK: envd's `/files` upload (multipart
for str/bytes, octet-stream for file-like data) and download (text, bytes),
and the filesystem.Filesystem service (Stat, ListDir, MakeDir, Move, Remove).
"""

from __future__ import annotations

import io
import os

import pytest
from e2b import FileNotFoundException, FileType, NotFoundException, Sandbox
from sandhub_testing.e2b import WORKSPACE

BASE = f"{WORKSPACE}/e2b-files"


def test_write_str_then_read_text(sandbox: Sandbox) -> None:
    """A str is uploaded (multipart) into a directory that does not exist
    yet; commands see the same file."""
    path = f"{BASE}/nested/deeper/hello.txt"
    info = sandbox.files.write(path, "héllo wörld\n")
    assert (info.path, info.name, info.type) == (path, "hello.txt", FileType.FILE)
    assert sandbox.files.read(path) == "héllo wörld\n"
    assert sandbox.commands.run(f"cat {path}").stdout == "héllo wörld\n"


def test_write_bytes_then_read_bytes(sandbox: Sandbox) -> None:
    path = f"{BASE}/blob.bin"
    data = os.urandom(2 * 1024 * 1024) + b"\x00\xff"
    sandbox.files.write(path, data)
    got = sandbox.files.read(path, format="bytes")
    assert isinstance(got, bytearray)
    assert bytes(got) == data
    assert sandbox.commands.run(f"stat -c %s {path}").stdout == f"{len(data)}\n"


def test_write_file_like_uses_octet_stream(sandbox: Sandbox) -> None:
    """A file-like object is streamed as application/octet-stream (envd >= 0.5.7)."""
    path = f"{BASE}/streamed.bin"
    data = b"streamed \x00\x01\x02 " * 50_000
    info = sandbox.files.write(path, io.BytesIO(data))
    assert info.path == path
    assert bytes(sandbox.files.read(path, format="bytes")) == data


def test_write_overwrites(sandbox: Sandbox) -> None:
    path = f"{BASE}/over.txt"
    sandbox.files.write(path, "a much longer first version\n")
    sandbox.files.write(path, "short\n")
    assert sandbox.files.read(path) == "short\n"


def test_read_missing_file_raises_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundException) as exc:
        sandbox.files.read(f"{BASE}/missing.txt")
    # The deprecated base class older callers catch.
    assert isinstance(exc.value, NotFoundException)


def test_exists(sandbox: Sandbox) -> None:
    sandbox.files.write(f"{BASE}/here.txt", "x")
    assert sandbox.files.exists(f"{BASE}/here.txt") is True
    assert sandbox.files.exists(BASE) is True
    assert sandbox.files.exists(f"{BASE}/not-here.txt") is False


def test_make_dir_and_list(sandbox: Sandbox) -> None:
    root = f"{BASE}/listing"
    assert sandbox.files.make_dir(f"{root}/sub/inner") is True
    # Already there: False, not an error.
    assert sandbox.files.make_dir(f"{root}/sub") is False
    sandbox.files.write(f"{root}/top.txt", "top")
    sandbox.files.write(f"{root}/sub/deep.txt", "deep")

    entries = {e.name: e for e in sandbox.files.list(root)}
    assert set(entries) == {"sub", "top.txt"}
    assert (entries["sub"].type, entries["sub"].path) == (FileType.DIR, f"{root}/sub")
    assert (entries["top.txt"].type, entries["top.txt"].path) == (FileType.FILE, f"{root}/top.txt")
    assert entries["top.txt"].size == 3

    deeper = {e.path for e in sandbox.files.list(root, depth=2)}
    assert deeper == {f"{root}/sub", f"{root}/top.txt", f"{root}/sub/inner", f"{root}/sub/deep.txt"}


def test_list_missing_dir_raises_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(f"{BASE}/no-such-dir")


def test_get_info(sandbox: Sandbox) -> None:
    sandbox.files.write(f"{BASE}/info/data.txt", "12345")
    info = sandbox.files.get_info(f"{BASE}/info/data.txt")
    assert (info.name, info.type, info.path, info.size) == ("data.txt", FileType.FILE, f"{BASE}/info/data.txt", 5)
    directory = sandbox.files.get_info(f"{BASE}/info")
    assert (directory.name, directory.type) == ("info", FileType.DIR)
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{BASE}/info/missing.txt")


def test_rename(sandbox: Sandbox) -> None:
    sandbox.files.write(f"{BASE}/old.txt", "moving")
    moved = sandbox.files.rename(f"{BASE}/old.txt", f"{BASE}/moved/new.txt")
    assert (moved.path, moved.name, moved.type) == (f"{BASE}/moved/new.txt", "new.txt", FileType.FILE)
    assert sandbox.files.exists(f"{BASE}/old.txt") is False
    assert sandbox.files.read(f"{BASE}/moved/new.txt") == "moving"
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{BASE}/old.txt", f"{BASE}/again.txt")


def test_remove_file_and_directory(sandbox: Sandbox) -> None:
    sandbox.files.write(f"{BASE}/gone.txt", "x")
    sandbox.files.remove(f"{BASE}/gone.txt")
    assert sandbox.files.exists(f"{BASE}/gone.txt") is False
    # A directory goes with what it holds.
    sandbox.files.write(f"{BASE}/tree/a/b.txt", "x")
    sandbox.files.remove(f"{BASE}/tree")
    assert sandbox.files.exists(f"{BASE}/tree") is False
    assert sandbox.commands.run(f"test -e {BASE}/tree || echo absent").stdout == "absent\n"


def test_relative_paths_resolve_where_commands_run(sandbox: Sandbox) -> None:
    """A relative path names the same file for the files API and for a command
    run without cwd (E2B resolves both against the user's working directory)."""
    sandbox.files.write("e2b-relative.txt", "relative\n")
    assert sandbox.commands.run("cat e2b-relative.txt").stdout == "relative\n"
    cwd = sandbox.commands.run("pwd").stdout.strip()
    assert sandbox.files.get_info("e2b-relative.txt").path == f"{cwd.rstrip('/')}/e2b-relative.txt"
