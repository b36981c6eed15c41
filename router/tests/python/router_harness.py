"""The router suite's own helpers: scoped tokens, and small backends of the
tests' own (a WebSocket echo server, an HTTP echo server, a server that never
answers). The real `sandboxd` and `sandhub-router` processes come from
sandhub_testing (see conftest.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from sandhub_testing import LOOPBACK


# --------------------------------------------------------------------------- scoped tokens


SECRET = b"router-test-secret-0123456789abcdef-xyz"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(namespace: str, name: str, ttl: float = 600, secret: bytes = SECRET) -> str:
    """An independent implementation of the documented scoped-token format."""
    payload = b64url(json.dumps({"namespace": namespace, "name": name, "exp": int(time.time() + ttl)}).encode())
    sig = hmac.new(secret, f"v1.{payload}".encode(), hashlib.sha256).digest()
    return f"v1.{payload}.{b64url(sig)}"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "scoped-secret"
    p.write_bytes(SECRET + b"\n")
    return p


# --------------------------------------------------------------------------- small backends


class EchoWebSocketServer:
    """A minimal RFC 6455 server: answers the handshake, then echoes every
    text/binary frame back. Records each handshake's request headers."""

    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.handshakes: list[tuple[str, dict[str, str]]] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_exact(conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0].decode()
            lines = head.split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            self.handshakes.append((lines[0].split(" ")[1], headers))
            accept = base64.b64encode(
                hashlib.sha1((headers["sec-websocket-key"] + self.GUID).encode()).digest()).decode()
            conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
            try:
                while True:
                    b1, b2 = self._read_exact(conn, 2)
                    opcode, n = b1 & 0x0F, b2 & 0x7F
                    if n == 126:
                        n = int.from_bytes(self._read_exact(conn, 2), "big")
                    elif n == 127:
                        n = int.from_bytes(self._read_exact(conn, 8), "big")
                    mask = self._read_exact(conn, 4) if b2 & 0x80 else b"\0\0\0\0"
                    payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self._read_exact(conn, n)))
                    if opcode == 0x8:  # close: answer and stop
                        conn.sendall(b"\x88\x00")
                        return
                    if opcode in (0x1, 0x2):
                        if len(payload) < 126:
                            hdr = bytes([0x80 | opcode, len(payload)])
                        elif len(payload) < 65536:
                            hdr = bytes([0x80 | opcode, 126]) + len(payload).to_bytes(2, "big")
                        else:
                            hdr = bytes([0x80 | opcode, 127]) + len(payload).to_bytes(8, "big")
                        conn.sendall(hdr + payload)
            except (ConnectionError, OSError):
                return


@pytest.fixture
def ws_echo() -> Iterator[EchoWebSocketServer]:
    s = EchoWebSocketServer()
    yield s
    s.close()


class SilentServer:
    """Accepts connections and reads, but never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent_backend() -> Iterator[SilentServer]:
    s = SilentServer()
    yield s
    s.close()


class EchoHttpServer:
    """Answers every request with JSON: method, raw path, headers, body length
    (`/slow/<ms>...`: after that many milliseconds)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _chunked(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Keep-Alive", "timeout=5")
                self.end_headers()
                for i in range(50):
                    piece = f"chunk-{i};".encode() * (i + 1)
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

            def _answer(self) -> None:
                if self.path.startswith("/slow/"):
                    time.sleep(int(self.path.split("/")[2]) / 1000)
                if self.path.startswith("/chunked"):
                    return self._chunked()
                if self.path.startswith("/empty"):
                    self.send_response(204)
                    self.end_headers()
                    return
                n = 0
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while True:
                        size = int(self.rfile.readline().strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        n += len(self.rfile.read(size))
                        self.rfile.readline()
                else:
                    n = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                body = json.dumps({
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body_len": n,
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "12345")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                pass  # a client the router cut off (body-limit tests) is expected

        self.server = Server((LOOPBACK, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def http_echo() -> Iterator[EchoHttpServer]:
    s = EchoHttpServer()
    yield s
    s.close()
