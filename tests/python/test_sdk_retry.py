"""Retry policy, against a scripted HTTP server standing in for a hub that
misbehaves in ways a real one cannot be made to on demand (a reset
connection, a 503 after the command may have run):

- reads that change nothing are retried when the connection is reset;
- calls that change something (exec, start, create) are never retried on a
  5xx: a lost answer does not mean the command did not run.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
import sandhub

SANDBOX = {
    "id": "sb-1",
    "template": "default",
    "state": "Ready",
    "labels": {},
    "launch": "cold",
    "created_at": "2026-01-01T00:00:00Z",
}


class Script(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[str] = []
    resets_left = 0

    def log_message(self, *args: object) -> None:
        pass

    def _reset(self) -> None:
        # SO_LINGER 0: close() sends RST, the client sees a reset connection.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        Script.seen.append(f"GET {self.path}")
        if Script.resets_left > 0:
            Script.resets_left -= 1
            self._reset()
            return
        self._answer(200, SANDBOX)

    def do_POST(self) -> None:
        Script.seen.append(f"POST {self.path}")
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        self._answer(503, {"code": "UNAVAILABLE", "message": "backend hiccup"})


@pytest.fixture
def scripted() -> Iterator[str]:
    Script.seen = []
    Script.resets_left = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_reads_are_retried_on_a_reset_connection(scripted: str):
    Script.resets_left = 1
    sb = sandhub.Hub(scripted).get("sb-1")
    assert sb.id == "sb-1"
    assert Script.seen == ["GET /v1/sandboxes/sb-1"] * 2


def test_exec_and_create_are_never_retried_on_5xx(scripted: str):
    hub = sandhub.Hub(scripted)
    sb = hub.get("sb-1")
    Script.seen = []
    with pytest.raises(sandhub.UnavailableError):
        sb.commands.run("touch once")
    with pytest.raises(sandhub.UnavailableError):
        sb.commands.start("touch once")
    with pytest.raises(sandhub.UnavailableError):
        hub.create()
    assert Script.seen == [
        "POST /v1/sandboxes/sb-1/exec",
        "GET /v1/sandboxes/sb-1",  # asking whether the sandbox is gone; not a retry
        "POST /v1/sandboxes/sb-1/processes",
        "POST /v1/sandboxes",
    ]
