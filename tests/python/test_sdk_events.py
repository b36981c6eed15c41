"""The SDK's lifecycle events against a real hub: ``hub.events(...)`` as an
async iterator and its generated blocking twin (filters, resume by id,
tenants apart), and ``verify_webhook`` against signatures computed here with
the standard library (and the hub's own scheme, checked by the Rust tests)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
import time
from typing import Iterator

import pytest
import sandhub
from sdk_fixtures import start_hub, stop_hub
from sandhub_testing import Hub

KEYS = {"alice-key-0123456789abcdef": "alice", "bob-key-0123456789abcdef0": "bob"}
ALICE, BOB = list(KEYS)


@pytest.fixture(scope="module")
def keyed_hub() -> Iterator[Hub]:
    hub = start_hub(KEYS)
    try:
        yield hub
    finally:
        stop_hub(hub)


def test_async_events_follow_filter_and_resume(keyed_hub: Hub) -> None:
    async def main() -> None:
        async with sandhub.AsyncHub(keyed_hub.url, api_key=ALICE) as hub:
            seen: list[dict] = []
            stream = hub.events(types=["template_changed"], last_event_id=0)

            async def consume() -> None:
                async for event in stream:
                    seen.append(event)
                    if len(seen) == 2:
                        return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.3)
            await hub.templates.put("ev-a", {})
            async with await hub.create(labels={"suite": "events"}):
                pass
            await hub.templates.put("ev-b", {})
            await asyncio.wait_for(task, 60)
            stream.close()
            assert [e["details"]["template"] for e in seen] == ["ev-a", "ev-b"]
            assert all(e["type"] == "template_changed" and e["tenant"] == "alice" for e in seen)
            assert stream.last_event_id == seen[-1]["id"]

            # Resume after the first: exactly the second, then nothing more.
            again = hub.events(types=["template_changed"], last_event_id=seen[0]["id"])
            it = again.__aiter__()
            assert (await asyncio.wait_for(it.__anext__(), 30))["id"] == seen[1]["id"]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(it.__anext__(), 0.7)
            again.close()

            # Labels pick the sandbox's own events.
            labelled = hub.events(labels={"suite": "events"}, last_event_id=0)
            got = []
            async for event in labelled:
                got.append(event["type"])
                if event["type"] == "deleted":
                    break
            assert got == ["created", "ready", "deleted"]

            with pytest.raises(sandhub.InvalidArgumentError, match="type"):
                async for _ in hub.events(types=["exploded"]):
                    pass

    asyncio.run(main())


def test_blocking_events_and_tenants_apart(keyed_hub: Hub) -> None:
    with sandhub.Hub(keyed_hub.url, api_key=BOB) as bob, sandhub.Hub(keyed_hub.url, api_key=ALICE) as alice:
        bob.templates.put("bobs", {})
        stream = bob.events(last_event_id=0)
        first = next(iter(stream))
        stream.close()
        assert (first["type"], first["tenant"], first["details"]["template"]) == ("template_changed", "bob", "bobs")
        # Alice's whole log has none of bob's events.
        mine = alice.events(last_event_id=0)
        got: list[dict] = []

        def read() -> None:
            for event in mine:
                got.append(event)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        time.sleep(1.0)
        mine.close()
        assert got and all(e["tenant"] == "alice" for e in got), got


def _sign(secret: str, t: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def test_verify_webhook() -> None:
    body = b'{"id":1,"type":"created"}'
    now = int(time.time())
    header = _sign("whsec_test_secret", now, body)
    assert sandhub.verify_webhook(body, header, "whsec_test_secret")
    assert sandhub.verify_webhook(body.decode(), header, b"whsec_test_secret")
    assert not sandhub.verify_webhook(body + b" ", header, "whsec_test_secret")
    assert not sandhub.verify_webhook(body, header, "another-secret")
    # Stale, and within a wider tolerance.
    old = _sign("s", now - 600, body)
    assert not sandhub.verify_webhook(body, old, "s")
    assert sandhub.verify_webhook(body, old, "s", tolerance_s=900)
    # Several v1 (a secret being rotated): any one may match.
    rotated = f"t={now},v1={'0' * 64},{_sign('s', now, body).split(',')[1]}"
    assert sandhub.verify_webhook(body, rotated, "s")
    for bad in ["", "t=,v1=", f"t={now}", "v1=abc", f"t=x{now},v1=00"]:
        assert not sandhub.verify_webhook(body, bad, "s"), bad
    # The vector the hub's own signer is tested against (hub/src/webhooks/sign.rs).
    assert sandhub.verify_webhook(
        b'{"a":1}',
        "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789",
        "whsec_test",
        now=1_700_000_100,
    )
