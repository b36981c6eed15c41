"""Helpers of the suites that drive `sandhub serve --e2b` with the real `e2b`
SDK (tests/e2b: the current SDK; tests/e2b_legacy: one from before 2.51, on
the pre-v2 routes). Each suite runs in a venv of its own with its own `e2b`
pin, so nothing here imports the SDK: a sandbox is taken as the SDK's object,
whatever its version.

The hub serves E2B's control plane and envd on one listener: the SDK's
`api_url` and `sandbox_url` are both the hub's URL, and envd calls are routed
by their `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers.

`envd_request` needs `httpx` (a dependency of every `e2b` release, and pinned
by both suites); `ControlPlaneRecorder` is the standard library only.
"""

from __future__ import annotations

import http.client
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import urlsplit

from .net import LOOPBACK

if TYPE_CHECKING:
    import httpx

#: The API key of an open hub (no keys file): any non-empty key is accepted.
ANY_KEY = "e2b-tests-any-key"

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


def conn_for(hub_url: str, api_key: str) -> Conn:
    """Connection settings for `hub_url` with `api_key` (control plane and envd on one URL)."""
    return Conn(api_key=api_key, api_url=hub_url, sandbox_url=hub_url)


def unique_tag() -> str:
    """A metadata value no other test uses, to find exactly one test's sandboxes in a listing."""
    return f"t-{uuid.uuid4().hex[:12]}"


def access_token(sbx: Any) -> str:
    """The sandbox's envd access token, as the SDK got it from create/connect
    (the `envdAccessToken` of the answer; every SDK since 1.x keeps it as
    `_envd_access_token`)."""
    token = sbx._envd_access_token  # noqa: SLF001 - the SDK keeps it private; the test needs the raw value
    assert isinstance(token, str) and token, "create answered without an envdAccessToken"
    return token


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
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> httpx.Response:
    """One raw envd call through the hub, with the headers the SDK sends:
    `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and (when given) the
    sandbox's `X-Access-Token`. A JSON body goes as a unary Connect call
    (`content-type: application/json`, `connect-protocol-version: 1`).
    `headers` are added last."""
    import httpx  # imported here: the recorder and the constants need only the standard library

    sent = {"e2b-sandbox-id": sandbox_id, "e2b-sandbox-port": str(ENVD_PORT)}
    if access_token is not None:
        sent["x-access-token"] = access_token
    if json_body is not None:
        sent["connect-protocol-version"] = "1"
    if content_type is not None:
        sent["content-type"] = content_type
    sent.update(headers or {})
    return httpx.request(
        method,
        f"{hub_url}{path}",
        headers=sent,
        json=json_body,
        params=params,
        content=content,
        timeout=timeout,
    )


class ControlPlaneRecorder:
    """A loopback HTTP forwarder in front of a hub that writes down the
    method and path of every request it passes on, so a test can say which
    routes an SDK really used (the hub serves both E2B's v2 and its older
    routes, so only the wire tells them apart).

    For the control plane only: each request is read whole and answered
    whole (small JSON both ways), which a Connect stream is not; point the
    SDK's `api_url` here and its `sandbox_url` at the hub itself.

        with ControlPlaneRecorder(hub.url) as recorder:
            Sandbox.create(api_url=recorder.url, sandbox_url=hub.url, ...)
            assert ("POST", "/sandboxes") in recorder.requests
    """

    _HOP_BY_HOP = frozenset(
        {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host"}
    )

    def __init__(self, upstream_url: str, timeout: float = 120.0):
        target = urlsplit(upstream_url)
        assert target.scheme == "http" and target.hostname and target.port, upstream_url
        self._upstream = (target.hostname, target.port)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer((LOOPBACK, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="e2b-recorder", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path without the query) of every request so far, in order."""
        with self._lock:
            return list(self._requests)

    def __enter__(self) -> "ControlPlaneRecorder":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        with self._lock:
            self._requests.append((handler.command, urlsplit(path).path))
        body = self._read_body(handler)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in self._HOP_BY_HOP}
        conn = http.client.HTTPConnection(*self._upstream, timeout=self._timeout)
        try:
            conn.request(handler.command, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            handler.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in self._HOP_BY_HOP and k.lower() != "content-length":
                    handler.send_header(k, v)
            handler.send_header("content-length", str(len(data)))
            handler.send_header("connection", "close")
            handler.end_headers()
            handler.wfile.write(data)
        except (OSError, http.client.HTTPException) as e:
            message = f"recorder: the hub did not answer: {e!r}".encode()
            handler.send_response(502)
            handler.send_header("content-type", "text/plain")
            handler.send_header("content-length", str(len(message)))
            handler.send_header("connection", "close")
            handler.end_headers()
            handler.wfile.write(message)
        finally:
            conn.close()

    @staticmethod
    def _read_body(handler: BaseHTTPRequestHandler) -> bytes | None:
        if "chunked" in handler.headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(handler.rfile.read(size))
                handler.rfile.readline()
        length = int(handler.headers.get("content-length") or 0)
        return handler.rfile.read(length) if length else None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                recorder._forward(self)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

        return Handler
