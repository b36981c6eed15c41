"""Tenancy through the E2B facade, on a hub with a keys file (alice, bob).

The control plane takes the caller's Sandhub API key as E2B's `X-API-Key`: a
tenant sees only its own sandboxes (another's answer as unknown ones do), and
a key not in the file is refused. The envd data plane carries no API key,
only the sandbox's `X-Access-Token` from create/connect: a call with another
sandbox's token, a forged one or none is refused.
"""

from __future__ import annotations

import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from e2b_support import ALICE_KEY, BOB_KEY, SandboxFactory, ids
from sandhub_testing import Hub
from sandhub_testing.e2b import WORKSPACE, Conn, access_token, conn_for, envd_request

#: What a refused envd call may answer: unauthenticated, forbidden, or (hiding
#: that the sandbox exists) not found.
REFUSED = (401, 403, 404)


@pytest.fixture(scope="module")
def alice(tenant_hub: Hub) -> Conn:
    return conn_for(tenant_hub.url, ALICE_KEY)


@pytest.fixture(scope="module")
def bob(tenant_hub: Hub) -> Conn:
    return conn_for(tenant_hub.url, BOB_KEY)


def test_a_tenant_sees_only_its_own_sandboxes(
    make_sandbox: SandboxFactory, alice: Conn, bob: Conn, tag: str
) -> None:
    mine = make_sandbox(alice, metadata={"tag": tag})
    theirs = make_sandbox(bob, metadata={"tag": tag})

    query = SandboxQuery(metadata={"tag": tag})
    assert ids(Sandbox.list(query=query, **alice).next_items()) == {mine.sandbox_id}
    assert ids(Sandbox.list(query=query, **bob).next_items()) == {theirs.sandbox_id}

    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(mine.sandbox_id, **bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(mine.sandbox_id, **bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(mine.sandbox_id, 5, **bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(mine.sandbox_id, **bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(mine.sandbox_id, **bob)
    assert Sandbox.kill(mine.sandbox_id, **bob) is False

    # None of that touched alice's sandbox.
    info = Sandbox.get_info(mine.sandbox_id, **alice)
    assert info.state == SandboxState.RUNNING
    assert (info.end_at - info.started_at).total_seconds() > 60, "bob's set_timeout(5) moved alice's deadline"
    assert mine.is_running() is True
    assert mine.commands.run("echo still-here").stdout == "still-here\n"


def test_a_key_not_in_the_file_is_refused(tenant_hub: Hub, make_sandbox: SandboxFactory, alice: Conn) -> None:
    wrong = conn_for(tenant_hub.url, "not-a-key-in-the-file-0123")
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="base", **wrong)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**wrong).next_items()
    sbx = make_sandbox(alice)
    with pytest.raises(AuthenticationException):
        Sandbox.get_info(sbx.sandbox_id, **wrong)
    with pytest.raises(AuthenticationException):
        Sandbox.kill(sbx.sandbox_id, **wrong)
    assert sbx.is_running() is True


def test_envd_needs_the_sandboxes_own_access_token(
    tenant_hub: Hub, make_sandbox: SandboxFactory, alice: Conn, bob: Conn
) -> None:
    mine = make_sandbox(alice)
    theirs = make_sandbox(bob)
    mine_token, their_token = access_token(mine), access_token(theirs)
    assert mine_token != their_token

    def stat_root(token: str | None) -> int:
        response = envd_request(
            tenant_hub.url, mine.sandbox_id, token, "POST", "/filesystem.Filesystem/Stat", json_body={"path": "/"}
        )
        if response.status_code == 200:
            assert response.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", response.text
        return response.status_code

    # The sandbox's own token works (the same raw call, so the refusals below are about the token).
    assert stat_root(mine_token) == 200
    assert stat_root(their_token) in REFUSED
    assert stat_root("forged-" + mine_token[::-1]) in REFUSED
    assert stat_root(None) in REFUSED

    # Reading and writing files, listing and starting processes: the same.
    mine.files.write(f"{WORKSPACE}/e2b-secret.txt", "alice's secret")
    read = envd_request(
        tenant_hub.url, mine.sandbox_id, their_token, "GET", "/files", params={"path": f"{WORKSPACE}/e2b-secret.txt"}
    )
    assert read.status_code in REFUSED
    assert b"alice's secret" not in read.content
    write = envd_request(
        tenant_hub.url,
        mine.sandbox_id,
        their_token,
        "POST",
        "/files",
        params={"path": f"{WORKSPACE}/e2b-planted.txt"},
        content=b"planted by bob",
        content_type="application/octet-stream",
    )
    assert write.status_code in REFUSED
    assert mine.files.exists(f"{WORKSPACE}/e2b-planted.txt") is False
    listing = envd_request(
        tenant_hub.url, mine.sandbox_id, their_token, "POST", "/process.Process/List", json_body={}
    )
    assert listing.status_code in REFUSED


def test_envd_user_header_is_not_an_api_credential(make_sandbox: SandboxFactory, alice: Conn) -> None:
    """With a keys file, `user=` (sent as `Authorization: Basic ...` on envd
    calls) still works: envd calls are authorized by the access token."""
    sbx = make_sandbox(alice)
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    sbx.files.write(f"{WORKSPACE}/e2b-as-root.txt", "root wrote this", user="root")
    assert sbx.files.read(f"{WORKSPACE}/e2b-as-root.txt", user="root") == "root wrote this"
