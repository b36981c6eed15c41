"""Fixtures for the router suite: real `sandboxd` daemons and the real
`sandhub-router` binary on loopback, plus small backends of the tests' own
(a WebSocket echo server, a server that never answers).

Binaries: SANDBOXD_BIN / SANDHUB_ROUTER_BIN, else `$CARGO_TARGET_DIR/debug/...`,
else `target/debug/...`. A missing binary skips locally and fails under CI=true.
Cluster tests read SANDHUB_TEST_KUBECONFIG the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 20.0


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need(condition: bool, msg: str) -> None:
    """Skip locally, fail in CI, when something the test needs is missing."""
    if not condition:
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def _binary(env: str, name: str) -> Path:
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    target = os.environ.get("CARGO_TARGET_DIR")
    base = Path(target) if target else REPO_ROOT / "target"
    if not base.is_absolute():
        base = REPO_ROOT / base
    return base / "debug" / name


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        return None


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


# --------------------------------------------------------------------------- sandboxd


@dataclass
class Sandboxd:
    proc: subprocess.Popen
    root: Path
    rest_port: int
    grpc_port: int
    legacy_port: int
    log: Path


@pytest.fixture(scope="session")
def sandboxd_bin() -> Path:
    b = _binary("SANDBOXD_BIN", "sandboxd")
    need(b.is_file() and os.access(b, os.X_OK), f"sandboxd binary not found at {b}")
    return b


def start_sandboxd(binary: Path, base: Path) -> Sandboxd:
    root = base / "root"
    root.mkdir(parents=True, exist_ok=True)
    log = base / "sandboxd.log"
    for _ in range(3):
        rest, grpc_port, legacy = free_ports(3)
        argv = [str(binary), "--listen-host", LOOPBACK, "--rest-port", str(rest), "--grpc-port", str(grpc_port),
                "--legacy-port", str(legacy), "--root-dir", str(root), "--shutdown-timeout", "2s"]
        with open(log, "ab") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=base)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if port_open(rest) and port_open(grpc_port) and port_open(legacy):
                return Sandboxd(proc, root, rest, grpc_port, legacy, log)
            time.sleep(0.05)
        stop_process(proc)
        if "in use" not in tail(log, 20).lower():
            break
    pytest.fail(f"sandboxd did not start\n{tail(log)}", pytrace=False)


@pytest.fixture
def sandboxd(sandboxd_bin: Path, tmp_path: Path) -> Iterator[Sandboxd]:
    d = start_sandboxd(sandboxd_bin, tmp_path / "sandboxd")
    try:
        yield d
    finally:
        stop_process(d.proc)
        print(f"--- sandboxd log ---\n{tail(d.log)}")


# --------------------------------------------------------------------------- the router


@dataclass
class Router:
    proc: subprocess.Popen
    port: int
    metrics_port: int
    health_port: int
    log: Path
    https_port: int | None = None
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def metrics(self) -> str:
        conn = http.client.HTTPConnection(LOOPBACK, self.metrics_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, rest = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += float(value)
        return total

    def log_tail(self) -> str:
        return tail(self.log)


@pytest.fixture(scope="session")
def router_bin() -> Path:
    b = _binary("SANDHUB_ROUTER_BIN", "sandhub-router")
    need(b.is_file() and os.access(b, os.X_OK),
         f"sandhub-router binary not found at {b} (cargo build -p sandhub-router)")
    return b


def start_router(binary: Path, base: Path, *args: str, env: dict[str, str] | None = None,
                 https: bool = False) -> Router:
    base.mkdir(parents=True, exist_ok=True)
    log = base / "router.log"
    for _ in range(3):
        ports = free_ports(4)
        argv = [str(binary),
                "--http-bind-address", f"{LOOPBACK}:{ports[0]}",
                "--metrics-bind-address", f"{LOOPBACK}:{ports[1]}",
                "--health-probe-bind-address", f"{LOOPBACK}:{ports[2]}",
                "--shutdown-timeout", "2s",
                *(["--https-bind-address", f"{LOOPBACK}:{ports[3]}"] if https else []),
                *args]
        full_env = {**os.environ, "RUST_LOG": "info,sandhub_router=debug", "NO_COLOR": "1", **(env or {})}
        with open(log, "ab") as f:
            f.write(f"\n=== {' '.join(argv)}\n".encode())
            f.flush()
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if port_open(ports[0]) and port_open(ports[1]) and (not https or port_open(ports[3])):
                return Router(proc, ports[0], ports[1], ports[2], log, ports[3] if https else None, list(args))
            time.sleep(0.05)
        stop_process(proc)
        if "in use" not in tail(log, 20).lower():
            break
    pytest.fail(f"sandhub-router did not start\n{tail(log)}", pytrace=False)


@pytest.fixture
def make_router(router_bin: Path, tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """Starts routers with extra flags; all are stopped (SIGTERM) at the end."""
    started: list[Router] = []

    def make(*args: str, env: dict[str, str] | None = None, https: bool = False) -> Router:
        r = start_router(router_bin, tmp_path / f"router{len(started)}", *args, env=env, https=https)
        started.append(r)
        return r

    yield make
    for r in started:
        rc = stop_process(r.proc)
        print(f"--- router exit {rc}; log ---\n{r.log_tail()}")
        assert rc == 0, f"router did not exit cleanly on SIGTERM (rc={rc})"


@pytest.fixture
def router(make_router) -> Router:
    """Header routing, loopback Pod IPs allowed, allow-all."""
    return make_router("--allow-loopback-pod-ip")


def sandbox_headers(d: Sandboxd, port: int, sandbox_id: str = "sb-1", **extra: str) -> dict[str, str]:
    return {"X-Sandbox-ID": sandbox_id, "X-Sandbox-Port": str(port), "X-Sandbox-Pod-IP": LOOPBACK, **extra}


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
