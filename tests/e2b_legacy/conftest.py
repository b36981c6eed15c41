"""Fixtures of the legacy E2B suite: an `e2b` SDK from before 2.51.0 (pinned
in requirements.txt), which creates and connects through E2B's pre-v2 routes
(`POST /sandboxes`, `POST /sandboxes/{id}/connect`), against a real
`sandhub serve --e2b` on loopback (local backend, as root).

Run in its own venv (scripts/test-deps.sh makes $SANDHUB_CACHE/venv-e2b-legacy;
scripts/test.sh runs this directory with it). Shares the harness
(`sandhub_testing`, `sandhub_testing.e2b`) with tests/e2b, never that suite's
own modules: the two run different SDKs in different venvs.

- `legacy_hub`: one open hub (no keys file: any API key is accepted) for the session.
- `recorder`: a `ControlPlaneRecorder` in front of that hub for one test: the
  method and path of every control-plane request the SDK sent.
- `e2b_env`: the SDK configured as users do, through the environment:
  `E2B_API_KEY`, `E2B_API_URL` (the recorder) and `E2B_SANDBOX_URL` (the hub).
- `made`: sandbox ids a test registers; killed at its end, whatever happened.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from e2b import Sandbox
from sandhub_testing import Hub, running_hub
from sandhub_testing.e2b import ANY_KEY, ControlPlaneRecorder, conn_for
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture


@pytest.fixture(autouse=True)
def no_ambient_e2b_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No E2B_* variable of the caller's environment may point the SDK elsewhere."""
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def legacy_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # noqa: F811
    """An open hub serving the E2B facade."""
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("e2b-legacy-hub"), "--e2b") as hub:
        yield hub


@pytest.fixture
def recorder(legacy_hub: Hub) -> Iterator[ControlPlaneRecorder]:
    """A recording forwarder in front of the hub, for this test only."""
    with ControlPlaneRecorder(legacy_hub.url) as rec:
        yield rec


@pytest.fixture
def e2b_env(monkeypatch: pytest.MonkeyPatch, legacy_hub: Hub, recorder: ControlPlaneRecorder) -> Hub:
    """E2B_API_KEY, E2B_API_URL (through the recorder) and E2B_SANDBOX_URL
    (envd: the hub itself) in the environment, for this test only."""
    monkeypatch.setenv("E2B_API_KEY", ANY_KEY)
    monkeypatch.setenv("E2B_API_URL", recorder.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", legacy_hub.url)
    return legacy_hub


@pytest.fixture
def made(legacy_hub: Hub) -> Iterator[list[str]]:
    """Ids of the sandboxes a test made: killed at its end straight on the hub
    (not through the recorder). A failure is printed, not raised."""
    ids: list[str] = []
    yield ids
    for sandbox_id in ids:
        try:
            Sandbox.kill(sandbox_id, **conn_for(legacy_hub.url, ANY_KEY))
        except Exception as e:  # noqa: BLE001 - teardown must not mask the test's result
            print(f"teardown: killing {sandbox_id} failed: {e!r}")
