"""Plain helpers of the E2B facade suite (the fixtures are in conftest.py).

The suite drives the real `e2b` SDK (2.63.0) against `sandhub serve --e2b`,
whose E2B control plane and envd data plane share the hub's listener: the
SDK's `api_url` and `sandbox_url` are both the hub's URL, and envd calls are
routed by their `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers.

What tests/e2b_legacy (an older SDK, in a venv of its own) needs too lives
in the shared harness, `sandhub_testing.e2b` (ANY_KEY, ENVD_PORT, WORKSPACE,
Conn, conn_for, unique_tag, access_token, envd_request, ControlPlaneRecorder);
this module keeps what only this suite uses.
"""

from __future__ import annotations

from typing import Callable, Iterable

from e2b import Sandbox, SandboxInfo

#: Keys of the tenancy hub's keys file (`<key> <tenant>`; keys are >= 16 characters).
ALICE_KEY = "alice-e2b-key-0123456789"
BOB_KEY = "bob-e2b-key-0123456789ab"
TENANT_KEYS = {ALICE_KEY: "alice", BOB_KEY: "bob"}

#: The `make_sandbox` fixture: `make_sandbox(connection, **Sandbox.create kwargs)`.
SandboxFactory = Callable[..., Sandbox]


def ids(infos: Iterable[SandboxInfo]) -> set[str]:
    """The sandbox ids of a listing page."""
    return {info.sandbox_id for info in infos}
