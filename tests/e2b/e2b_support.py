"""Plain helpers of the E2B facade suite (the fixtures are in conftest.py).

The suite drives the real `e2b` SDK (2.63.0) against `sandhub serve --e2b`,
whose E2B control plane and envd data plane share the hub's listener: the
SDK's `api_url` and `sandbox_url` are both the hub's URL, and envd calls are
routed by their `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers.
"""

from __future__ import annotations

import uuid
from typing import Callable, Iterable, TypedDict

import httpx
from e2b import Sandbox, SandboxInfo

#: The API key of the open hub (no keys file): any non-empty key is accepted.
ANY_KEY = "e2b-tests-any-key"
#: Keys of the tenancy hub's keys file (`<key> <tenant>`; keys are >= 16 characters).
ALICE_KEY = "alice-e2b-key-0123456789"
BOB_KEY = "bob-e2b-key-0123456789ab"
TENANT_KEYS = {ALICE_KEY: "alice", BOB_KEY: "bob"}

#: The port E2B's envd listens on, named in `E2b-Sandbox-Port` on every envd call.
ENVD_PORT = 49983

#: Where a sandbox's own files live and survive pause/resume (Sandhub's workspace).
WORKSPACE = "/workspace"


class Conn(TypedDict):
    """The connection settings every SDK call takes as keyword arguments
    (`Sandbox.create(..., **conn)`, `Sandbox.kill(id, **conn)`, ...)."""

    api_key: str
    api_url: str
    sandbox_url: str


#: The `make_sandbox` fixture: `make_sandbox(connection, **Sandbox.create kwargs)`.
SandboxFactory = Callable[..., Sandbox]


def conn_for(hub_url: str, api_key: str) -> Conn:
    """Connection settings for `hub_url` with `api_key` (control plane and envd on one URL)."""
    return Conn(api_key=api_key, api_url=hub_url, sandbox_url=hub_url)


def unique_tag() -> str:
    """A metadata value no other test uses, to find exactly one test's sandboxes in a listing."""
    return f"t-{uuid.uuid4().hex[:12]}"


def ids(infos: Iterable[SandboxInfo]) -> set[str]:
    """The sandbox ids of a listing page."""
    return {info.sandbox_id for info in infos}


def envd_request(
    hub_url: str,
    sandbox_id: str,
    access_token: str | None,
    method: str,
    path: str,
    *,
    json_body: object | None = None,
    params: dict[str, str] | None = None,
    content: bytes | None = None,
    content_type: str | None = None,
) -> httpx.Response:
    """One raw envd call through the hub, with the headers the SDK sends:
    `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and (when given) the sandbox's
    `X-Access-Token`. A JSON body goes as a unary Connect call
    (`content-type: application/json`, `connect-protocol-version: 1`)."""
    headers = {"e2b-sandbox-id": sandbox_id, "e2b-sandbox-port": str(ENVD_PORT)}
    if access_token is not None:
        headers["x-access-token"] = access_token
    if json_body is not None:
        headers["connect-protocol-version"] = "1"
    if content_type is not None:
        headers["content-type"] = content_type
    return httpx.request(
        method,
        f"{hub_url}{path}",
        headers=headers,
        json=json_body,
        params=params,
        content=content,
        timeout=30.0,
    )
