"""`files.write` when reading its data fails half-way: one abort path for
both faces. The upload is aborted, `write` waits for its request to end and
raises the caller's error, and the file is left as it was.

(Before scripts/unasync.py generated the blocking face, the blocking `write`
waited for the aborted request and the asyncio one did not.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sandhub
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)

MiB = 1 << 20


class Broken(Exception):
    pass


class FailingReader:
    """``chunks`` chunks of 1 MiB, then the read fails."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks

    def read(self, size: int = -1) -> bytes:
        if self.left == 0:
            raise Broken("the data source failed")
        self.left -= 1
        return b"x" * MiB


# ------------------------------------------------------------------ the call sequence, without a hub


class FakeWriter:
    def __init__(self, calls: list[str], asynchronous: bool) -> None:
        self.calls, self.asynchronous = calls, asynchronous

    def _answer(self, name: str, fails: bool = False) -> Any:
        self.calls.append(name)

        async def answer() -> None:
            if fails:
                raise sandhub.InternalError("the upload was aborted by the caller")

        if self.asynchronous:
            return answer()
        if fails:
            raise sandhub.InternalError("the upload was aborted by the caller")
        return None

    def send(self, chunk: bytes) -> Any:
        return self._answer("send")

    def finish(self) -> Any:
        return self._answer("finish", fails="abort" in self.calls)

    def abort(self) -> None:
        self.calls.append("abort")


class FakeNative:
    def __init__(self, asynchronous: bool) -> None:
        self.calls: list[str] = []
        self.asynchronous = asynchronous

    def open_write(self, sid: str, path: str, mode: int | None, append: bool) -> FakeWriter:
        return FakeWriter(self.calls, self.asynchronous)


def test_both_faces_abort_then_wait_for_the_request() -> None:
    blocking = FakeNative(asynchronous=False)
    with pytest.raises(Broken):
        sandhub.Files(blocking, "sb").write("f", FailingReader(2))

    asyncio_ = FakeNative(asynchronous=True)
    with pytest.raises(Broken):
        asyncio.run(sandhub.AsyncFiles(asyncio_, "sb").write("f", FailingReader(2)))

    assert blocking.calls == ["send", "send", "abort", "finish"]
    assert asyncio_.calls == blocking.calls


# ------------------------------------------------------------------ against a real hub


@pytest.mark.parametrize("chunks", [0, 1, 32])
def test_blocking_write_that_fails_leaves_the_file_as_it_was(hub_url: str, chunks: int) -> None:
    with sandhub.Hub(hub_url) as hub, hub.create() as sb:
        sb.files.write("kept.txt", "old")
        with pytest.raises(Broken):
            sb.files.write("kept.txt", FailingReader(chunks))
        with pytest.raises(Broken):
            sb.files.write("new.bin", FailingReader(chunks))
        assert sb.files.read_text("kept.txt") == "old"
        assert not sb.files.exists("new.bin")
        sb.files.write("kept.txt", "new")  # the objects stay usable
        assert sb.files.read_text("kept.txt") == "new"


@pytest.mark.parametrize("chunks", [0, 1, 32])
def test_asyncio_write_that_fails_leaves_the_file_as_it_was(hub_url: str, chunks: int) -> None:
    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as hub, await hub.create() as sb:
            await sb.files.write("kept.txt", "old")
            with pytest.raises(Broken):
                await sb.files.write("kept.txt", FailingReader(chunks))
            with pytest.raises(Broken):
                await sb.files.write("new.bin", FailingReader(chunks))
            assert await sb.files.read_text("kept.txt") == "old"
            assert not await sb.files.exists("new.bin")
            await sb.files.write("kept.txt", "new")
            assert await sb.files.read_text("kept.txt") == "new"

    asyncio.run(main())
