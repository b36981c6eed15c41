"""An `e2b` SDK from before 2.51.0 on Sandhub: it creates with `POST /sandboxes`
and connects with `POST /sandboxes/{id}/connect` (2.51.0 moved both to
`/v2/...`, which tests/e2b's SDK uses). The hub serves both; which one the SDK
really used is read off the wire, through the `recorder` in front of the hub's
control plane, so these tests fail if the pinned SDK ever speaks v2.

(This SDK lists sandboxes with `GET /v2/sandboxes` already; no test here lists.)
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox
from sandhub_testing import Hub
from sandhub_testing.e2b import ControlPlaneRecorder

#: The first e2b release on the v2 create/connect routes.
FIRST_V2_RELEASE = (2, 51)


def sdk_version() -> tuple[int, ...]:
    return tuple(int(part) for part in version("e2b").split(".")[:2])


def assert_legacy_routes(recorder: ControlPlaneRecorder, sandbox_id: str) -> None:
    """The SDK created, connected and killed through the pre-v2 routes, and
    never touched a /v2 one."""
    seen = recorder.requests
    assert ("POST", "/sandboxes") in seen, seen
    assert ("POST", f"/sandboxes/{sandbox_id}/connect") in seen, seen
    assert ("DELETE", f"/sandboxes/{sandbox_id}") in seen, seen
    assert not [r for r in seen if r[1].startswith("/v2/")], seen
    # envd traffic went to E2B_SANDBOX_URL (the hub), not through the control plane.
    assert not [r for r in seen if "process.Process" in r[1] or r[1] in ("/files", "/health")], seen


def test_the_pinned_sdk_predates_the_v2_routes() -> None:
    assert sdk_version() < FIRST_V2_RELEASE, f"e2b {version('e2b')} is not a pre-2.51 release: fix requirements.txt"


def test_create_run_connect_kill_on_the_legacy_routes(
    e2b_env: Hub, recorder: ControlPlaneRecorder, made: list[str]
) -> None:
    sbx = Sandbox.create(template="base", timeout=120, metadata={"suite": "e2b-legacy"}, envs={"GREETING": "hello"})
    made.append(sbx.sandbox_id)
    assert recorder.requests[0] == ("POST", "/sandboxes"), recorder.requests

    result = sbx.commands.run('echo "$GREETING from $(basename "$PWD")"; echo to-stderr >&2')
    assert result.exit_code == 0
    assert result.stdout == "hello from workspace\n"
    assert result.stderr == "to-stderr\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"

    again = Sandbox.connect(sbx.sandbox_id, timeout=120)
    assert again.sandbox_id == sbx.sandbox_id
    assert again.commands.run("echo connected").stdout == "connected\n"
    assert again.is_running() is True

    assert Sandbox.kill(sbx.sandbox_id) is True
    assert sbx.is_running() is False
    assert Sandbox.kill(sbx.sandbox_id) is False, "a killed sandbox was killed again"
    assert_legacy_routes(recorder, sbx.sandbox_id)


async def test_the_async_sdk_uses_the_legacy_routes_too(
    e2b_env: Hub, recorder: ControlPlaneRecorder, made: list[str]
) -> None:
    sbx = await AsyncSandbox.create(template="base", timeout=120)
    made.append(sbx.sandbox_id)
    assert (await sbx.commands.run("echo async; exit 0")).stdout == "async\n"

    again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=120)
    result = await again.commands.run("printf %s connected")
    assert (result.exit_code, result.stdout) == (0, "connected")

    assert await AsyncSandbox.kill(sbx.sandbox_id) is True
    assert_legacy_routes(recorder, sbx.sandbox_id)
