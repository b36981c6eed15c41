"""The adapter's own promises beyond the standard suite: output order and
cap, timeouts, ownership on close, and the literal error words."""

from __future__ import annotations

import pytest
import sandhub
from langchain_sandhub import AsyncSandhubSandbox, SandhubSandbox


def test_execute_keeps_stdout_and_stderr_in_write_order(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub) as backend:
        result = backend.execute("echo one; echo two >&2; echo three; exit 7")
        assert result.output == "one\ntwo\nthree\n"
        assert result.exit_code == 7 and result.truncated is False


def test_default_template_has_python3_and_a_posix_shell(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub) as backend:
        result = backend.execute("command -v sh && python3 -c 'print(6 * 7)'")
        assert result.exit_code == 0, result.output
        assert result.output.endswith("42\n")


def test_output_past_the_cap_is_cut_and_flagged(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub, max_output_chars=100) as backend:
        result = backend.execute("head -c 1000 /dev/zero | tr '\\0' x")
        assert result.output == "x" * 100 and result.truncated is True


def test_timeout_kills_the_command_and_says_so(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub) as backend:
        result = backend.execute("echo started; sleep 30; echo never", timeout=1)
        assert result.output.startswith("started\n")
        assert "never" not in result.output and "timed out after 1 s" in result.output
        assert result.exit_code != 0


def test_file_errors_use_the_literal_words_and_never_raise(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub) as backend:
        backend.execute("mkdir -p /tmp/d && echo data > /tmp/f")
        uploads = backend.upload_files(
            [("/tmp/d", b"x"), ("relative.txt", b"x"), ("/tmp/f/child", b"x"), ("/tmp/bad\0name", b"x"),
             ("/tmp/new/dir/ok.bin", bytes(range(256)))]
        )
        assert [u.error for u in uploads] == ["is_directory", "invalid_path", "invalid_path", "invalid_path", None]
        downloads = backend.download_files(["/tmp/d", "/tmp/missing", "rel", "/tmp/new/dir/ok.bin"])
        assert [d.error for d in downloads] == ["is_directory", "file_not_found", "invalid_path", None]
        assert downloads[3].content == bytes(range(256))


def test_uploads_past_one_request_stream_and_keep_every_byte(hub: sandhub.Hub) -> None:
    # 3 MiB is past what one exec request may carry (the hub's 1 MiB body limit),
    # so these go to a started process's stdin in chunks; the error words hold there too.
    big = bytes(range(256)) * (3 * 4096) + b"tail"
    with SandhubSandbox.create(hub) as backend:
        backend.execute("mkdir -p /tmp/d && echo data > /tmp/f")
        uploads = backend.upload_files(
            [("/tmp/dir with space/big.bin", big), ("/tmp/d", big), ("/tmp/f/child", big)]
        )
        assert [u.error for u in uploads] == [None, "is_directory", "invalid_path"]
        [down] = backend.download_files(["/tmp/dir with space/big.bin"])
        assert down.error is None and down.content == big


def test_close_deletes_only_a_sandbox_the_adapter_created(hub: sandhub.Hub) -> None:
    created = SandhubSandbox.create(hub, labels={"test": "ownership"})
    created.close()
    with pytest.raises(sandhub.NotFoundError):
        hub.get(created.id)

    mine = hub.create()
    try:
        with SandhubSandbox(mine) as borrowed:
            assert borrowed.id == mine.id
            assert borrowed.execute("true").exit_code == 0
        assert hub.get(mine.id).id == mine.id  # still there
    finally:
        mine.delete()


async def test_async_twins_and_aclose_ownership(hub_url: str) -> None:
    async_hub = sandhub.AsyncHub(hub_url)
    backend = await AsyncSandhubSandbox.create(async_hub)
    try:
        result = await backend.aexecute("echo out; echo err >&2")
        assert (result.output, result.exit_code) == ("out\nerr\n", 0)
        [up] = await backend.aupload_files([("/tmp/a/b.txt", b"hello")])
        assert up.error is None
        [down] = await backend.adownload_files(["/tmp/a/b.txt"])
        assert down.content == b"hello"
        read = await backend.aread("/tmp/a/b.txt")
        assert read.error is None and "hello" in str(read.file_data)
    finally:
        await backend.aclose()
    with pytest.raises(sandhub.NotFoundError):
        await async_hub.get(backend.id)

    borrowed_sandbox = await async_hub.create()
    try:
        async with AsyncSandhubSandbox(borrowed_sandbox) as borrowed:
            assert (await borrowed.aexecute("true")).exit_code == 0
        assert (await async_hub.get(borrowed_sandbox.id)).id == borrowed_sandbox.id
    finally:
        await borrowed_sandbox.delete()
