"""The unmodified upstream SDK (`k8s-agent-sandbox`) against our sandboxd.

Two connection modes, both through `SandboxClient.get_sandbox()` with the SDK's
Kubernetes helper replaced by `StubK8sLookup` (sandhub_testing.upstream_sdk):

- sandboxd mode: `SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")`:
  commands over gRPC `process.v1.ProcessService/Execute`, files over REST `/v1/files/...`;
- legacy mode: `SandboxDirectConnectionConfig(api_url=legacy port)`:
  `POST /execute`, `POST /upload`, `GET /download|list|exists/...`, with the
  router headers (`X-Sandbox-ID`, ...) the SDK adds, which sandboxd ignores.

Tests parametrized with the `sdk` fixture run in both modes; the mode is the
test id (`[sandboxd_in_cluster_pod_ip]` / `[legacy_direct]`).
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from k8s_agent_sandbox.exceptions import SandboxRequestError

BINARY = bytes(range(256)) * 64 + b"\x00\r\n\x1a\xff"  # every byte value, NUL, CR/LF, ^Z


def _sh(sdk, script: str) -> str:
    """A shell snippet that runs the same in both modes.

    sandboxd mode: the SDK itself wraps the string in `/bin/sh -c`. Legacy mode:
    the runtime splits the string with shlex and runs it without a shell, so
    shell syntax needs an explicit `sh -c '...'` (also fine under sandboxd)."""
    assert "'" not in script
    return f"sh -c '{script}'"


def _realpath(p: Path) -> str:
    return os.path.realpath(p)


# =========================================================================== commands, both modes


def test_sdk_with_stub_k8s_lookup_run_echo(sdk):
    result = sdk.commands.run("echo hello sandhub")
    assert result.stdout == "hello sandhub\n"
    assert result.stderr == ""
    assert result.exit_code == 0
    assert result.timed_out is False


def test_sdk_with_stub_k8s_lookup_run_exit_codes(sdk):
    assert sdk.commands.run(_sh(sdk, "exit 3")).exit_code == 3
    assert sdk.commands.run(_sh(sdk, "exit 0")).exit_code == 0
    assert sdk.commands.run("false").exit_code == 1
    assert sdk.commands.run("true").exit_code == 0


def test_sdk_with_stub_k8s_lookup_run_stderr_and_stdout_separately(sdk):
    result = sdk.commands.run(_sh(sdk, "echo to-out; echo to-err 1>&2; exit 7"))
    assert result.stdout == "to-out\n"
    assert result.stderr == "to-err\n"
    assert result.exit_code == 7
    assert result.timed_out is False


def test_sdk_with_stub_k8s_lookup_run_default_cwd_is_root_dir(sdk, sandboxd):
    result = sdk.commands.run("pwd")
    assert result.exit_code == 0, result
    assert result.stdout == _realpath(sandboxd.root) + "\n"


def test_sdk_with_stub_k8s_lookup_run_sees_files_written_through_sdk(sdk):
    sdk.files.write("from-sdk.txt", b"written via files.write\n")
    result = sdk.commands.run("cat from-sdk.txt")
    assert (result.exit_code, result.stdout) == (0, "written via files.write\n")


def test_sdk_with_stub_k8s_lookup_run_utf8_output(sdk):
    result = sdk.commands.run("printf 'h\u00e9llo \u2603'")
    assert result.exit_code == 0, result
    assert result.stdout == "h\u00e9llo \u2603"


def test_sdk_with_stub_k8s_lookup_command_timeout_sleep_30(sdk):
    started = time.monotonic()
    result = sdk.commands.run("sleep 30", command_timeout=1)
    elapsed = time.monotonic() - started
    assert result.exit_code == 124, result
    assert result.timed_out is True
    # Functional bound, not a benchmark: the command must not run to its end.
    assert elapsed < 15, f"run() returned after {elapsed:.1f}s"


def test_sdk_with_stub_k8s_lookup_command_timeout_kills_the_process_group(sdk):
    """After a timeout nothing the command started may live on (shell and sleep)."""
    marker = f"SANDHUB_TIMEOUT_MARKER={uuid.uuid4().hex}"
    # `env` sets the marker in the environment of sh and of its child sleep.
    result = sdk.commands.run(f"env {marker} sh -c 'sleep 30; echo done'", command_timeout=1)
    assert (result.exit_code, result.timed_out) == (124, True), result
    deadline = time.monotonic() + 5
    while True:
        alive = _pids_with_environ(marker.encode())
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert alive == [], f"processes of the timed-out command still running: {alive}"


def _pids_with_environ(needle: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        cmdline = c.read().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{pid}: {cmdline}")
        except OSError:
            continue
    return found


def test_sdk_with_stub_k8s_lookup_command_timeout_not_hit(sdk):
    result = sdk.commands.run("echo quick", command_timeout=20)
    assert (result.stdout, result.exit_code, result.timed_out) == ("quick\n", 0, False)


# =========================================================================== commands, per mode


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_run_is_a_shell_string(sandboxd_mode_sdk):
    # The SDK sends argv ["/bin/sh", "-c", <command>] over gRPC Execute.
    result = sandboxd_mode_sdk.commands.run("echo a | tr a b; echo $((6 * 7)) >&2; exit 5")
    assert (result.stdout, result.stderr, result.exit_code) == ("b\n", "42\n", 5)


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_run_env(sandboxd_mode_sdk):
    result = sandboxd_mode_sdk.commands.run(
        'echo "$SANDHUB_TEST_NEW|$SANDHUB_TEST_OVERRIDE|$SANDHUB_TEST_DAEMON_VAR"',
        env={"SANDHUB_TEST_NEW": "new value", "SANDHUB_TEST_OVERRIDE": "from-request"},
    )
    assert result.exit_code == 0, result
    # env merges over the daemon's environment: new, overridden, inherited.
    assert result.stdout == "new value|from-request|from-daemon\n"


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_run_cwd(sandboxd_mode_sdk, sandboxd):
    (sandboxd.root / "work" / "dir").mkdir(parents=True)
    result = sandboxd_mode_sdk.commands.run("pwd; ls", cwd="work")
    assert result.exit_code == 0, result
    assert result.stdout == _realpath(sandboxd.root / "work") + "\ndir\n"


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_run_cwd_escape_is_refused(sandboxd_mode_sdk):
    with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
        sandboxd_mode_sdk.commands.run("pwd", cwd="../..")


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_run_cwd_absolute_is_root_relative(sandboxd_mode_sdk, sandboxd):
    # Upstream joins the cwd onto the root (filepath.Join(root, cwd)), so an
    # absolute cwd names a directory under the root, never the host's.
    (sandboxd.root / "abs").mkdir()
    result = sandboxd_mode_sdk.commands.run("pwd", cwd="/abs")
    assert (result.exit_code, result.stdout) == (0, _realpath(sandboxd.root / "abs") + "\n")
    # root/etc does not exist: an error (upstream: INTERNAL from chdir), not the host's /etc.
    with pytest.raises(RuntimeError, match="sandboxd process service failed"):
        sandboxd_mode_sdk.commands.run("pwd", cwd="/etc")


def test_sdk_legacy_mode_with_stub_k8s_lookup_env_and_cwd_raise_not_implemented(legacy_mode_sdk):
    # The SDK's legacy run() has no env/cwd: it refuses them before any request.
    with pytest.raises(NotImplementedError):
        legacy_mode_sdk.commands.run("pwd", env={"A": "1"})
    with pytest.raises(NotImplementedError):
        legacy_mode_sdk.commands.run("pwd", cwd="sub")


def test_sdk_legacy_mode_with_stub_k8s_lookup_run_is_not_a_shell(legacy_mode_sdk):
    # Legacy /execute splits with shlex and runs without a shell.
    result = legacy_mode_sdk.commands.run("echo $HOME 'a  b' > x")
    assert result.exit_code == 0, result
    assert result.stdout == "$HOME a  b > x\n"


# =========================================================================== files, both modes


def test_sdk_with_stub_k8s_lookup_files_write_read_nested(sdk, sandboxd):
    sdk.files.write("a/b/c.txt", "hello nested\n")
    assert (sandboxd.root / "a" / "b" / "c.txt").read_bytes() == b"hello nested\n"
    assert sdk.files.read("a/b/c.txt") == b"hello nested\n"
    # Overwrite replaces the whole content.
    sdk.files.write("a/b/c.txt", b"v2")
    assert sdk.files.read("a/b/c.txt") == b"v2"
    assert (sandboxd.root / "a" / "b" / "c.txt").read_bytes() == b"v2"


def test_sdk_with_stub_k8s_lookup_files_binary_roundtrip(sdk, sandboxd):
    sdk.files.write("bin/data.bin", BINARY)
    assert (sandboxd.root / "bin" / "data.bin").read_bytes() == BINARY
    assert sdk.files.read("bin/data.bin") == BINARY


def test_sdk_with_stub_k8s_lookup_files_read_file_written_on_disk(sdk, sandboxd):
    (sandboxd.root / "disk").mkdir()
    (sandboxd.root / "disk" / "x.bin").write_bytes(b"\x00\x01on disk")
    assert sdk.files.read("disk/x.bin") == b"\x00\x01on disk"
    assert sdk.files.read("/disk/x.bin") == b"\x00\x01on disk"  # leading "/" is root-relative


def test_sdk_with_stub_k8s_lookup_files_empty_file(sdk, sandboxd):
    sdk.files.write("empty.txt", b"")
    assert (sandboxd.root / "empty.txt").read_bytes() == b""
    assert sdk.files.read("empty.txt") == b""


def test_sdk_with_stub_k8s_lookup_files_names_needing_escapes(sdk, sandboxd):
    name = "dir with space/\u00fcn\u00efc\u00f6de #1 %41 +&=.txt"
    sdk.files.write(name, b"escaped")
    assert (sandboxd.root / name).read_bytes() == b"escaped"
    assert sdk.files.read(name) == b"escaped"
    assert sdk.files.exists(name) is True
    assert [e.name for e in sdk.files.list("dir with space")] == ["\u00fcn\u00efc\u00f6de #1 %41 +&=.txt"]


def test_sdk_with_stub_k8s_lookup_files_list(sdk, sandboxd):
    sdk.files.write("d/x.txt", b"abc")
    sdk.files.write("d/sub/y.bin", BINARY)
    entries = {e.name: e for e in sdk.files.list("d")}
    assert set(entries) == {"x.txt", "sub"}

    x, sub = entries["x.txt"], entries["sub"]
    assert (x.type, x.size) == ("file", 3)
    assert sub.type == "directory"
    st = (sandboxd.root / "d" / "x.txt").stat()
    assert x.modified.tzinfo is not None
    assert abs(x.modified.timestamp() - st.st_mtime) < 2
    assert abs(x.modified - datetime.now(timezone.utc)).total_seconds() < 300

    nested = sdk.files.list("d/sub")
    assert [(e.name, e.type, e.size) for e in nested] == [("y.bin", "file", len(BINARY))]

    if sdk.connector.is_sandboxd():
        assert x.mode == "0644"  # PUT's default mode
        assert sub.mode == "0755"  # parents are created 0755
    else:
        assert x.mode is None  # the legacy listing has no mode


def test_sdk_with_stub_k8s_lookup_files_list_root(sdk):
    sdk.files.write("top.txt", b"1")
    sdk.files.write("topdir/inner.txt", b"22")
    for root_path in ("", "/"):
        entries = {e.name: (e.type, e.size) for e in sdk.files.list(root_path)}
        assert entries.get("top.txt") == ("file", 1), (root_path, entries)
        assert entries.get("topdir", (None,))[0] == "directory", (root_path, entries)
        assert "inner.txt" not in entries


def test_sdk_with_stub_k8s_lookup_files_list_empty_dir(sdk, sandboxd):
    (sandboxd.root / "nothing-here").mkdir()
    assert sdk.files.list("nothing-here") == []


def test_sdk_with_stub_k8s_lookup_files_exists(sdk, sandboxd):
    sdk.files.write("e/here.txt", b"x")
    assert sdk.files.exists("e/here.txt") is True
    assert sdk.files.exists("e") is True
    assert sdk.files.exists("e/missing.txt") is False
    assert sdk.files.exists("no/such/dir/file") is False


def test_sdk_with_stub_k8s_lookup_files_read_missing_is_404(sdk):
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.read("missing/file.txt")
    assert err.value.status_code == 404


def test_sdk_with_stub_k8s_lookup_files_list_missing_is_404(sdk):
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.list("missing-dir")
    assert err.value.status_code == 404


# --------------------------------------------------------------------------- traversal


def test_sdk_with_stub_k8s_lookup_traversal_write_refused_by_sdk(sdk, sandboxd):
    # The SDK normalizes and rejects ".." itself before sending anything.
    with pytest.raises(ValueError, match="escapes the sandbox root"):
        sdk.files.write("../escape.txt", b"nope")
    with pytest.raises(ValueError, match="escapes the sandbox root"):
        sdk.files.read("../escape.txt")
    assert not (sandboxd.outside / "escape.txt").exists()


def test_sdk_with_stub_k8s_lookup_traversal_write_refused_by_server(sdk, sandboxd):
    # With the SDK's check turned off, the server must refuse it.
    for path in ("../escape.txt", "a/../../escape.txt"):
        with pytest.raises(SandboxRequestError) as err:
            sdk.files.write(path, b"nope", allow_unsafe_paths=True)
        assert err.value.status_code == 403, (path, err.value.status_code)
    assert not (sandboxd.outside / "escape.txt").exists()
    assert sorted(p.name for p in sandboxd.outside.iterdir()) == ["root"]
    assert not (sandboxd.root / "escape.txt").exists()


def test_sdk_with_stub_k8s_lookup_traversal_read_refused_by_server(sdk, sandboxd):
    (sandboxd.outside / "secret.txt").write_bytes(b"outside the root")
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.read("../secret.txt", allow_unsafe_paths=True)
    assert err.value.status_code == 403


def test_sdk_with_stub_k8s_lookup_traversal_list_and_exists_refused_by_server(sdk, sandboxd):
    # list() and exists() send the path as given (no SDK-side check). Note: a
    # bare ".." is no test of the server in legacy mode: the SDK builds
    # `list/..` and urllib3 removes the dot segment, so `GET /` goes out.
    (sandboxd.outside / "secret.txt").write_bytes(b"outside the root")
    for path in ("../", "a/../../"):
        with pytest.raises(SandboxRequestError) as err:
            sdk.files.list(path)
        assert err.value.status_code == 403, path
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.exists("../secret.txt")
    assert err.value.status_code == 403


def test_sdk_with_stub_k8s_lookup_symlink_escape_refused(sdk, sandboxd):
    (sandboxd.outside / "secret.txt").write_bytes(b"outside the root")
    (sandboxd.root / "link").symlink_to(sandboxd.outside / "secret.txt")
    (sandboxd.root / "linkdir").symlink_to(sandboxd.outside)
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.read("link")
    assert err.value.status_code == 403
    with pytest.raises(SandboxRequestError) as err:
        sdk.files.write("linkdir/planted.txt", b"nope")
    assert err.value.status_code == 403
    assert not (sandboxd.outside / "planted.txt").exists()
    assert (sandboxd.outside / "secret.txt").read_bytes() == b"outside the root"


# =========================================================================== files, per mode


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_files_delete(sandboxd_mode_sdk, sandboxd):
    sdk = sandboxd_mode_sdk
    sdk.files.write("del/one.txt", b"1")
    sdk.files.write("del/tree/two.txt", b"2")

    sdk.files.delete("del/one.txt")
    assert not (sandboxd.root / "del" / "one.txt").exists()
    assert sdk.files.exists("del/one.txt") is False

    with pytest.raises(SandboxRequestError) as err:
        sdk.files.delete("del/tree")  # non-empty directory without recursive
    assert err.value.status_code == 409
    assert (sandboxd.root / "del" / "tree" / "two.txt").read_bytes() == b"2"

    sdk.files.delete("del/tree", recursive=True)
    assert not (sandboxd.root / "del" / "tree").exists()
    assert sdk.files.list("del") == []

    sdk.files.delete("del")  # now empty: no recursive needed
    assert not (sandboxd.root / "del").exists()

    with pytest.raises(SandboxRequestError) as err:
        sdk.files.delete("del/never-existed.txt")
    assert err.value.status_code == 404


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_delete_traversal_refused(sandboxd_mode_sdk, sandboxd):
    victim = sandboxd.outside / "victim.txt"
    victim.write_bytes(b"keep me")
    with pytest.raises(SandboxRequestError) as err:
        sandboxd_mode_sdk.files.delete("../victim.txt")
    assert err.value.status_code == 403
    with pytest.raises(SandboxRequestError) as err:
        sandboxd_mode_sdk.files.delete("..", recursive=True)
    assert err.value.status_code == 403
    assert victim.read_bytes() == b"keep me"


def test_sdk_legacy_mode_with_stub_k8s_lookup_delete_raises_not_implemented(legacy_mode_sdk, sandboxd):
    legacy_mode_sdk.files.write("keep.txt", b"k")
    with pytest.raises(NotImplementedError):
        legacy_mode_sdk.files.delete("keep.txt")
    assert (sandboxd.root / "keep.txt").read_bytes() == b"k"


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_write_over_directory_is_400(sandboxd_mode_sdk, sandboxd):
    (sandboxd.root / "adir").mkdir()
    with pytest.raises(SandboxRequestError) as err:
        sandboxd_mode_sdk.files.write("adir", b"x")
    assert err.value.status_code == 400
    assert (sandboxd.root / "adir").is_dir()


def test_sdk_sandboxd_mode_with_stub_k8s_lookup_streamed_write(sandboxd_mode_sdk, sandboxd):
    # A binary file object is sent as a chunked PUT (the SDK's no-retry session).
    import io

    payload = BINARY * 20  # > the SDK's 64 KiB chunk size
    sandboxd_mode_sdk.files.write("stream/big.bin", io.BytesIO(payload))
    assert (sandboxd.root / "stream" / "big.bin").read_bytes() == payload
    assert sandboxd_mode_sdk.files.read("stream/big.bin") == payload


def test_sdk_legacy_mode_with_stub_k8s_lookup_streamed_write(legacy_mode_sdk, sandboxd):
    # A binary file object is sent as a chunked multipart POST /upload.
    import io

    payload = BINARY * 20
    legacy_mode_sdk.files.write("stream/big.bin", io.BytesIO(payload))
    assert (sandboxd.root / "stream" / "big.bin").read_bytes() == payload


def test_sdk_with_stub_k8s_lookup_read_to(sdk):
    import io

    sdk.files.write("r/to.bin", BINARY)
    out = io.BytesIO()
    assert sdk.files.read_to("r/to.bin", out) == len(BINARY)
    assert out.getvalue() == BINARY


def test_sdk_with_stub_k8s_lookup_stub_was_the_only_k8s_access(sdk):
    """The handle was attached through the stub: claim resolved, Sandbox read."""
    stub = sdk.k8s_helper
    assert type(stub).__name__ == "StubK8sLookup"
    sdk.commands.run("true")
    names = [name for name, _ in stub.calls]
    assert names[0] == "resolve_sandbox_name"
    assert "get_sandbox" in names
    assert set(names) <= {"resolve_sandbox_name", "get_sandbox"}
