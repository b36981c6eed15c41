"""Fixtures of the E2B facade suite: real `sandhub serve --e2b` hubs on
loopback (local backend, as root), driven by the unmodified `e2b` SDK.

Run in the e2b venv (scripts/test-deps.sh makes $SANDHUB_CACHE/venv-e2b,
scripts/test.sh runs this directory with it). The hub binary is found like
every suite's (`SANDHUB_BIN`, else `$CARGO_TARGET_DIR/debug/sandhub`, else
`target/debug/sandhub`); a missing one skips locally and fails under CI=true.

- `e2b_hub`: one open hub (no keys file: any API key is one tenant's) for the session.
- `code_hub`: `e2b_hub` with the `code-interpreter-v1` template installed.
- `tenant_hub`: one hub with a keys file (alice and bob), for the tenancy tests.
- `conn`: per-call connection kwargs for `e2b_hub`; `e2b_env` sets the
  `E2B_API_KEY`/`E2B_API_URL`/`E2B_SANDBOX_URL` variables instead, as users do.
- `make_sandbox`/`sandbox`: sandboxes killed at the end of the test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from e2b import Sandbox
from e2b_support import TENANT_KEYS, SandboxFactory
from sandhub_testing import Hub, running_hub
from sandhub_testing.code import install_code_interpreter
from sandhub_testing.e2b import ANY_KEY, Conn, conn_for, unique_tag
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture

#: `sandhub serve` flags of every hub of this suite: the E2B facade on the hub's listener.
E2B_SERVE_ARGS = ("--e2b",)

#: The `sandbox` fixture's sandbox-wide environment (its commands see GREETING=hello).
SANDBOX_ENVS = {"GREETING": "hello"}


@pytest.fixture(autouse=True)
def no_ambient_e2b_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No E2B_* variable of the caller's environment (E2B_DOMAIN, E2B_DEBUG,
    E2B_API_KEY, ...) may point the SDK elsewhere: each test sets what it uses."""
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def e2b_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # noqa: F811
    """An open hub serving the E2B facade (any API key is accepted)."""
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("e2b-hub"), *E2B_SERVE_ARGS) as hub:
        yield hub


@pytest.fixture(scope="session")
def tenant_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # noqa: F811
    """A hub serving the E2B facade with a keys file: tenants alice and bob."""
    with running_hub(
        sandhub_bin, tmp_path_factory.mktemp("e2b-tenant-hub"), *E2B_SERVE_ARGS, api_keys=TENANT_KEYS
    ) as hub:
        yield hub


@pytest.fixture(scope="session")
def code_hub(e2b_hub: Hub) -> Hub:
    """`e2b_hub` with the code-interpreter image imported and `code-interpreter-v1` set, by
    dev/code-interpreter/build-image.py's install path (the template E2B's code-interpreter
    SDKs create by default)."""
    install_code_interpreter(e2b_hub.url, ANY_KEY)
    return e2b_hub


@pytest.fixture(scope="session")
def conn(e2b_hub: Hub) -> Conn:
    """Per-call connection settings for the open hub."""
    return conn_for(e2b_hub.url, ANY_KEY)


@pytest.fixture
def e2b_env(monkeypatch: pytest.MonkeyPatch, e2b_hub: Hub) -> Hub:
    """The SDK configured the way users do it: E2B_API_KEY, E2B_API_URL and
    E2B_SANDBOX_URL in the environment (set for this test only)."""
    monkeypatch.setenv("E2B_API_KEY", ANY_KEY)
    monkeypatch.setenv("E2B_API_URL", e2b_hub.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", e2b_hub.url)
    return e2b_hub


@pytest.fixture
def tag() -> str:
    """This test's own metadata value (`metadata={"tag": tag}`)."""
    return unique_tag()


def _kill_quietly(sandbox_id: str, connection: Conn) -> None:
    """Teardown: kill a sandbox a test made, whatever state it is in. A
    failure is printed, not raised: the hub's own cleanup deletes leftovers."""
    try:
        Sandbox.kill(sandbox_id, **connection)
    except Exception as e:  # noqa: BLE001 - teardown must not mask the test's result
        print(f"teardown: killing {sandbox_id} failed: {e!r}")


@pytest.fixture
def make_sandbox() -> Iterator[SandboxFactory]:
    """`make_sandbox(connection, **create_kwargs)`: `Sandbox.create` with
    template "base" and a 300 s timeout unless given; every sandbox made is
    killed at the end of the test."""
    made: list[tuple[str, Conn]] = []

    def make(connection: Conn, **kwargs: object) -> Sandbox:
        kwargs.setdefault("template", "base")
        kwargs.setdefault("timeout", 300)
        sbx = Sandbox.create(**kwargs, **connection)  # type: ignore[arg-type]
        made.append((sbx.sandbox_id, connection))
        return sbx

    yield make
    for sandbox_id, connection in made:
        _kill_quietly(sandbox_id, connection)


@pytest.fixture
def sandbox(make_sandbox: SandboxFactory, conn: Conn, tag: str) -> Sandbox:
    """A sandbox on the open hub: template "base", metadata
    `{"suite": "e2b", "tag": tag}`, envs SANDBOX_ENVS (GREETING=hello)."""
    return make_sandbox(conn, metadata={"suite": "e2b", "tag": tag}, envs=dict(SANDBOX_ENVS))
