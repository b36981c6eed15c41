"""What `process.Process/Connect` watchers can make the hub hold, sent raw.

The attack (security finding 3): background commands that print as fast as
they can (`yes`), whose `Start` call went away, each watched by a `Connect`
stream whose client never reads. The hub must not buffer their output
without bound: each watcher's queue is a byte budget, one that falls behind
is cut off with `resource_exhausted`, watchers are capped per process and per
tenant, and deleting the sandbox ends every pump and frees every queue, with
the stalled connections still open. The hub's own resident memory
(/proc/<pid>/status VmRSS) is measured before, during and after.

Every test here runs on a hub of its own (tenants alice and bob), so the
memory it measures is this module's alone.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from e2b import Sandbox
from e2b_support import ALICE_KEY, BOB_KEY, TENANT_KEYS
from sandhub_testing import Hub, running_hub
from sandhub_testing.e2b import ENVD_PORT, access_token, conn_for

#: The `yes` commands of the attack, each with one stalled watcher.
ATTACK_PROCESSES = 48
#: How long they print before the sandbox is deleted (seconds).
ATTACK_S = 6.0
#: The hub's RSS may grow by at most this while under attack (MiB). Before the
#: fix each stalled watcher pinned 1024 output messages (about 8 MiB): 48 of
#: them took the hub from 43 to 448 MiB. Now each holds at most 1 MiB (the
#: watcher budget) before it is cut off: about 48 MiB in all (measured: +44 to
#: +57 MiB).
ATTACK_GROWTH_MB = 128
#: ... and must be within this of where it started once the sandbox is
#: deleted, with the stalled connections still open (MiB). Before the fix:
#: +407 MiB. Now the queues are freed, but the allocator keeps much of what
#: it had at the peak (measured: +29 to +50 MiB).
AFTER_GROWTH_MB = 100
#: How long the hub has to give memory back after the deletion (seconds).
SETTLE_S = 10.0
#: The caps (hub/src/http/e2b/process.rs).
MAX_WATCHERS_PER_PROCESS = 8
MAX_WATCHERS_PER_TENANT = 64
#: A socket receive buffer small enough that the kernel absorbs little of a
#: stalled stream (bytes).
SMALL_RCVBUF = 4096

STREAM_CT = "application/connect+json"
FLAG_END_STREAM = 0x02


def envelope(message: object) -> bytes:
    payload = json.dumps(message).encode()
    return bytes([0]) + struct.pack(">I", len(payload)) + payload


def frames(body: bytes) -> list[tuple[int, dict]]:
    """A Connect stream's envelopes as (flags, JSON)."""
    out = []
    while len(body) >= 5:
        flags, length = body[0], struct.unpack(">I", body[1:5])[0]
        out.append((flags, json.loads(body[5 : 5 + length])))
        body = body[5 + length :]
    assert not body, f"a cut envelope: {body!r}"
    return out


def rss_mb(hub: Hub) -> float:
    """The hub's resident memory (VmRSS), MiB."""
    for line in Path(f"/proc/{hub.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def envd_headers(sbx: Sandbox) -> dict[str, str]:
    return {
        "e2b-sandbox-id": sbx.sandbox_id,
        "e2b-sandbox-port": str(ENVD_PORT),
        "x-access-token": access_token(sbx),
        "connect-protocol-version": "1",
        "content-type": STREAM_CT,
    }


def start_detached(hub: Hub, sbx: Sandbox, cmd: str, *args: str) -> int:
    """`Start`s a command, reads its `start` event and hangs up: the command
    runs on with no one reading its output (a background command whose call
    went away). Its pid."""
    body = envelope({"process": {"cmd": cmd, "args": list(args)}, "stdin": False})
    with httpx.stream(
        "POST", f"{hub.url}/process.Process/Start", headers=envd_headers(sbx), content=body, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        got = b""
        for chunk in response.iter_raw():
            got += chunk
            if len(got) >= 5 and len(got) >= 5 + struct.unpack(">I", got[1:5])[0]:
                break
        first = json.loads(got[5 : 5 + struct.unpack(">I", got[1:5])[0]])
        return int(first["event"]["start"]["pid"])


def stalled_connect(hub: Hub, sbx: Sandbox, pid: int) -> socket.socket:
    """A `Connect` to `pid` whose client never reads a byte of the answer."""
    target = urlsplit(hub.url)
    body = envelope({"process": {"pid": pid}})
    head = "".join(f"{k}: {v}\r\n" for k, v in envd_headers(sbx).items())
    request = (
        f"POST /process.Process/Connect HTTP/1.1\r\nhost: {target.netloc}\r\n{head}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    sock.connect((target.hostname, target.port))
    sock.sendall(request)
    return sock


def connect_call(hub: Hub, sbx: Sandbox, pid: int, timeout: float = 30) -> httpx.Response:
    """A whole `Connect` call, read to its end."""
    return httpx.post(
        f"{hub.url}/process.Process/Connect",
        headers=envd_headers(sbx),
        content=envelope({"process": {"pid": pid}}),
        timeout=timeout,
    )


def stream_error(response: httpx.Response) -> dict | None:
    """The error of a stream's end-of-stream frame (None: it ended cleanly)."""
    assert response.status_code == 200, response.content
    got = frames(response.content)
    flags, trailer = got[-1]
    assert flags == FLAG_END_STREAM, got
    return trailer.get("error")


def signal(hub: Hub, sbx: Sandbox, pid: int) -> None:
    headers = {**envd_headers(sbx), "content-type": "application/json"}
    response = httpx.post(
        f"{hub.url}/process.Process/SendSignal",
        headers=headers,
        json={"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
        timeout=30,
    )
    assert response.status_code == 200, response.text


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("e2b-watchers"), "--e2b", api_keys=TENANT_KEYS) as h:
        yield h


#: The sandboxes a test made, with the key that made each.
Made = dict[str, str]


@pytest.fixture
def sandboxes(hub: Hub) -> Iterator[Made]:
    """Sandboxes made by the test (see `make`), killed after it unless it did."""
    made: Made = {}
    yield made
    for sandbox_id, key in made.items():
        try:
            Sandbox.kill(sandbox_id, **conn_for(hub.url, key))
        except Exception as e:  # noqa: BLE001 - teardown must not mask the test's result
            print(f"teardown: killing {sandbox_id} failed: {e!r}")


def make(hub: Hub, key: str, made: Made) -> Sandbox:
    sbx = Sandbox.create(template="base", timeout=300, **conn_for(hub.url, key))
    made[sbx.sandbox_id] = key
    return sbx


def kill(hub: Hub, sbx: Sandbox, made: Made) -> None:
    assert Sandbox.kill(sbx.sandbox_id, **conn_for(hub.url, made.pop(sbx.sandbox_id))) is True


# --------------------------------------------------------------------------- the attack


def test_stalled_watchers_of_loud_background_commands_hold_bounded_memory(
    hub: Hub, sandboxes: Made
) -> None:
    sbx = make(hub, ALICE_KEY, sandboxes)
    # Warm the paths the attack uses, then the baseline.
    warm = start_detached(hub, sbx, "/bin/echo", "warm")
    assert warm > 0
    assert sbx.commands.run("echo warm").stdout == "warm\n"
    time.sleep(1)
    before = rss_mb(hub)

    pids = [start_detached(hub, sbx, "/usr/bin/yes") for _ in range(ATTACK_PROCESSES)]
    stalled = [stalled_connect(hub, sbx, pid) for pid in pids]
    try:
        peak = before
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            peak = max(peak, rss_mb(hub))
            time.sleep(0.2)
        kill(hub, sbx, sandboxes)
        after = rss_mb(hub)
        settle = time.monotonic() + SETTLE_S
        while time.monotonic() < settle and after - before > AFTER_GROWTH_MB:
            time.sleep(0.5)
            after = rss_mb(hub)
        print(f"hub RSS: before {before:.0f} MiB, peak under attack {peak:.0f} MiB, after deletion {after:.0f} MiB")
        assert peak - before < ATTACK_GROWTH_MB, (before, peak)
        assert after - before < AFTER_GROWTH_MB, (before, peak, after)
    finally:
        for sock in stalled:
            sock.close()
    assert hub.proc.poll() is None, hub.log_tail()


def test_a_watcher_that_falls_behind_ends_with_resource_exhausted(hub: Hub, sandboxes: Made) -> None:
    """Read late, the stream holds what it had (at most the budget), then an
    end-of-stream frame with `resource_exhausted`, not the output it missed."""
    sbx = make(hub, ALICE_KEY, sandboxes)
    pid = start_detached(hub, sbx, "/usr/bin/yes")
    sock = stalled_connect(hub, sbx, pid)
    try:
        time.sleep(3)
        sock.settimeout(30)
        raw = b""
        while b"\r\n0\r\n\r\n" not in raw[-16:]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            raw += chunk
    finally:
        sock.close()
        signal(hub, sbx, pid)
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    body = b""
    while chunked:
        size_line, _, rest = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        chunked = rest[size + 2 :]
    got = frames(body)
    assert "start" in got[0][1]["event"], got[0]
    flags, trailer = got[-1]
    assert flags == FLAG_END_STREAM, trailer
    assert trailer.get("error", {}).get("code") == "resource_exhausted", trailer


# --------------------------------------------------------------------------- caps


def test_watchers_are_capped_per_process(hub: Hub, sandboxes: Made) -> None:
    sbx = make(hub, ALICE_KEY, sandboxes)
    pid = start_detached(hub, sbx, "/bin/sleep", "600")
    held = [stalled_connect(hub, sbx, pid) for _ in range(MAX_WATCHERS_PER_PROCESS)]
    try:
        time.sleep(0.5)
        error = stream_error(connect_call(hub, sbx, pid))
        assert error and error["code"] == "resource_exhausted", error
        # Another process of the same sandbox has its own cap.
        other = start_detached(hub, sbx, "/bin/sh", "-c", "sleep 1; echo done")
        assert stream_error(connect_call(hub, sbx, other)) is None
    finally:
        for sock in held:
            sock.close()
        signal(hub, sbx, pid)


def test_watchers_are_capped_per_tenant_and_the_cap_is_the_tenants_own(hub: Hub, sandboxes: Made) -> None:
    sbx = make(hub, ALICE_KEY, sandboxes)
    per = MAX_WATCHERS_PER_PROCESS
    pids = [start_detached(hub, sbx, "/bin/sleep", "600") for _ in range(MAX_WATCHERS_PER_TENANT // per + 1)]
    held = [stalled_connect(hub, sbx, pid) for pid in pids[:-1] for _ in range(per)]
    try:
        time.sleep(1)
        error = stream_error(connect_call(hub, sbx, pids[-1]))
        assert error and error["code"] == "resource_exhausted", error
        assert "tenant" in error["message"], error
        # Bob's watchers are not alice's.
        bob = make(hub, BOB_KEY, sandboxes)
        done = start_detached(hub, bob, "/bin/sh", "-c", "sleep 1; echo done")
        assert stream_error(connect_call(hub, bob, done)) is None
    finally:
        for sock in held:
            sock.close()
        for pid in pids:
            signal(hub, sbx, pid)


# --------------------------------------------------------------------------- the same class


def test_connect_to_an_ended_process_or_another_sandboxes_pid_is_not_found(
    hub: Hub, sandboxes: Made
) -> None:
    sbx = make(hub, ALICE_KEY, sandboxes)
    other = make(hub, ALICE_KEY, sandboxes)
    ended = start_detached(hub, sbx, "/bin/true")
    running = start_detached(hub, sbx, "/bin/sleep", "600")
    try:
        time.sleep(1)
        error = stream_error(connect_call(hub, sbx, ended))
        assert error and error["code"] == "not_found", error
        # A pid of `sbx`, asked of `other` (with other's token): not found there.
        error = stream_error(connect_call(hub, other, running))
        assert error and error["code"] == "not_found", error
    finally:
        signal(hub, sbx, running)


def test_deleting_the_sandbox_ends_its_watchers(hub: Hub, sandboxes: Made) -> None:
    """A watcher of a quiet process hears of the deletion at once: its stream
    ends (with an error), it does not hang until a deadline."""
    sbx = make(hub, ALICE_KEY, sandboxes)
    pid = start_detached(hub, sbx, "/bin/sleep", "600")
    with httpx.stream(
        "POST",
        f"{hub.url}/process.Process/Connect",
        headers=envd_headers(sbx),
        content=envelope({"process": {"pid": pid}}),
        timeout=30,
    ) as response:
        assert response.status_code == 200
        time.sleep(0.5)
        kill(hub, sbx, sandboxes)
        started = time.monotonic()
        body = response.read()
        assert time.monotonic() - started < 10
    got = frames(body)
    assert got[-1][0] == FLAG_END_STREAM, got
    assert "error" in got[-1][1], got
