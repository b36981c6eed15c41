"""The router's hand-written HTTP/1.1 fast path, checked differentially
against hyper's server (`--http1-fast-path=false`).

Every test starts two routers, the reference (fast path off) and the fast
one (the default), writes the same raw bytes to both over plain sockets, and
compares what the backend received (request line, headers, body) and what
the client got back (status line version and code, headers but `date`, the
decoded body, trailers; framing too where the backend's was kept). Each test
also asserts the concrete behaviour it expects, so both routers being wrong
in the same way does not pass.

Header lists are compared with the order of lines of one name kept and the
order across names ignored: the reference does not keep the latter (see
`canon`); FAST_PATH_STRICT_HEADER_ORDER=1 compares the full order.

Reference quirks are compared but not asserted (so the fast path matches them
unless both change): a request-target without a leading "/" is forwarded as
"/", and `Transfer-Encoding: gzip, chunked` reaches the backend as chunked.
Response headers the backend's Connection header names are dropped, a body
request over a pooled connection the backend closed goes over a fresh one,
two Hosts (or none) are a 400, CONNECT a 405 and a malformed chunked body a
400: all asserted.

The backend is a small raw-socket HTTP/1.1 server of this file's own: it
records each request and answers as the request's `X-Test-Reply` header says
(Content-Length, chunked with trailers, close-delimited, 204, 304, a 3 MiB
body, a body trickled in pieces, ...).

FAST_PATH_REF_ARGS (default "--http1-fast-path=false") holds the extra flags
of the reference router; FAST_PATH_REF_ARGS="" makes both routers the same
build (for checking this suite against a router without the flag). A binary
without the reference's flags skips the suite locally and fails it in CI.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from sandhub_testing import LOOPBACK, Router, free_ports, need

TIMEOUT = 5.0
REF_ARGS = shlex.split(os.environ.get("FAST_PATH_REF_ARGS", "--http1-fast-path=false"))
ROUTER_HOST = "router.test:8080"  # the Host the client names (same bytes for both routers)
SANDBOX_ID = "fast-path"
MAX_HEAD = 2 * 1024 * 1024


# --------------------------------------------------------------------------- HTTP/1.1 reading


class Closed(Exception):
    """The peer closed (or reset) the connection."""


class Stream:
    """Buffered reads from a socket: lines, heads, exact counts, until EOF.
    Every recv is bounded by the socket's timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def _fill(self) -> None:
        if self.eof:
            raise Closed("connection closed")
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError) as e:
            self.eof = True
            raise Closed(f"connection reset: {e}") from e
        if not data:
            self.eof = True
            raise Closed("connection closed")
        self.buf += data

    def read_until(self, sep: bytes, limit: int) -> bytes:
        """Up to and including `sep`."""
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            if len(self.buf) > limit:
                raise ValueError(f"no {sep!r} within {limit} bytes")
            start = max(0, len(self.buf) - len(sep) + 1)
            self._fill()

    def read_line(self, limit: int = 64 * 1024) -> bytes:
        """One CRLF-terminated line, without the CRLF."""
        return self.read_until(b"\r\n", limit)[:-2]

    def read_head(self, limit: int = MAX_HEAD) -> bytes | None:
        """A message head (without the blank line); None on a clean EOF before any byte."""
        if not self.buf:
            try:
                self._fill()
            except Closed:
                return None
        return self.read_until(b"\r\n\r\n", limit)[:-4]

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_to_eof(self) -> bytes:
        while True:
            try:
                self._fill()
            except Closed:
                break
        out = bytes(self.buf)
        self.buf.clear()
        return out


Headers = list[tuple[str, str]]


TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def parse_fields(lines: list[bytes]) -> Headers:
    """Field lines, strictly (what the router writes must be clean HTTP/1.1):
    a token, a colon, the value; no folding, no bare CR or LF."""
    out = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.fullmatch(name):
            raise ValueError(f"bad field line {line!r}")
        if b"\r" in value or b"\n" in value:
            raise ValueError(f"bad field value {line!r}")
        out.append((name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")))
    return out


def get(headers: Headers, name: str) -> str | None:
    for n, v in headers:
        if n == name:
            return v
    return None


def get_all(headers: Headers, name: str) -> list[str]:
    return [v for n, v in headers if n == name]


def is_chunked(headers: Headers) -> bool:
    codings = [c.strip().lower() for v in get_all(headers, "transfer-encoding") for c in v.split(",")]
    return bool(codings) and codings[-1] == "chunked"


def read_chunked(s: Stream) -> tuple[bytes, Headers]:
    """Decoded body and trailers."""
    body = bytearray()
    while True:
        line = s.read_line()
        size_hex = line.split(b";", 1)[0].strip()
        if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_hex):
            raise ValueError(f"bad chunk-size line {line!r}")
        size = int(size_hex, 16)
        if size == 0:
            break
        body += s.read_exact(size)
        if s.read_exact(2) != b"\r\n":
            raise ValueError("chunk data not followed by CRLF")
    trailers = []
    while True:
        line = s.read_line()
        if not line:
            break
        trailers.append(line)
    return bytes(body), parse_fields(trailers)


@dataclass
class Reply:
    version: str
    status: int
    reason: str
    headers: Headers
    body: bytes
    trailers: Headers
    framing: str  # "none", "length", "chunked", "close"
    interim: list[int] = field(default_factory=list)  # 1xx statuses skipped before this one

    def header(self, name: str) -> str | None:
        return get(self.headers, name)


def read_reply(s: Stream, method: str = "GET", interim_too: bool = False) -> Reply:
    """One response, as a careful HTTP/1.1 client reads it (RFC 9112 §6.3); interim
    (1xx but 101) answers are skipped, or with `interim_too` returned."""
    interim = []
    while True:
        head = s.read_head()
        if head is None:
            raise Closed("closed before a response")
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ValueError(f"bad status line {lines[0]!r}")
        status = int(code)
        headers = parse_fields(lines[1:])
        if 100 <= status < 200 and status != 101:
            if interim_too:
                return Reply(version, status, reason, headers, b"", [], "none")
            interim.append(status)
            continue
        break
    if method == "HEAD" or status in (101, 204, 304):
        return Reply(version, status, reason, headers, b"", [], "none", interim)
    if get(headers, "transfer-encoding") is not None:
        if is_chunked(headers):
            body, trailers = read_chunked(s)
            return Reply(version, status, reason, headers, body, trailers, "chunked", interim)
        return Reply(version, status, reason, headers, s.read_to_eof(), [], "close", interim)
    lengths = get_all(headers, "content-length")
    if lengths:
        if len(set(lengths)) != 1:
            raise ValueError(f"conflicting content-length {lengths}")
        return Reply(version, status, reason, headers, s.read_exact(int(lengths[0])), [], "length", interim)
    return Reply(version, status, reason, headers, s.read_to_eof(), [], "close", interim)


# --------------------------------------------------------------------------- the backend


def payload(tag: str, n: int) -> bytes:
    """n deterministic bytes (all byte values, CRLFs included) named by `tag`."""
    return random.Random(tag).randbytes(n)


BIG = 3 * 1024 * 1024
CHUNKS = [1, 10, 100, 1000, 4096, 5000]
REASONS = {200: "OK", 204: "No Content", 304: "Not Modified", 100: "Continue"}


@dataclass
class Seen:
    """One request as the backend received it."""

    line: str
    headers: Headers
    body: bytes
    trailers: Headers
    framing: str  # "none", "length", "chunked"

    @property
    def method(self) -> str:
        return self.line.split(" ")[0]

    @property
    def target(self) -> str:
        return self.line.split(" ")[1]

    def header(self, name: str) -> str | None:
        return get(self.headers, name)


class RawBackend:
    """A threaded HTTP/1.1 server on loopback that records every request and
    answers per its `X-Test-Reply` header (see `_reply`)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.cond = threading.Condition()
        self.seen: list[Seen] = []
        self.errors: list[str] = []
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def take(self, expect: int | None = None) -> list[Seen]:
        """The requests seen since the last take (waiting up to 5 s for `expect` of them)."""
        with self.cond:
            if expect is not None:
                self.cond.wait_for(lambda: len(self.seen) >= expect, timeout=TIMEOUT)
            out, self.seen = self.seen, []
            assert not self.errors, f"backend errors: {self.errors}"
            return out

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        s = Stream(conn)
        try:
            with conn:
                # The router's pooled connections wait here between requests: longer than
                # any test, so that no idle close of ours races the router's reuse (see
                # test_body_request_after_the_backend_closed_an_idle_connection).
                conn.settimeout(30)
                while True:
                    head = s.read_head()
                    if head is None:
                        return
                    lines = head.split(b"\r\n")
                    line = lines[0].decode("latin-1")
                    if not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ \S+ HTTP/1\.1", line):
                        raise ValueError(f"bad request line from the router: {line!r}")
                    headers = parse_fields(lines[1:])
                    lengths = get_all(headers, "content-length")
                    if (lengths and get(headers, "transfer-encoding") is not None) or len(lengths) > 1:
                        raise ValueError(f"ambiguous framing from the router: {headers}")
                    if (get(headers, "expect") or "").lower() == "100-continue":
                        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    trailers: Headers = []
                    if get(headers, "transfer-encoding") is not None:
                        if not is_chunked(headers):
                            raise ValueError(f"unframed request body from the router: {headers}")
                        body, trailers = read_chunked(s)
                        framing = "chunked"
                    elif get(headers, "content-length") is not None:
                        body = s.read_exact(int(get(headers, "content-length")))
                        framing = "length"
                    else:
                        body, framing = b"", "none"
                    seen = Seen(line, headers, body, trailers, framing)
                    with self.cond:
                        self.seen.append(seen)
                        self.cond.notify_all()
                    keep = self._reply(conn, seen)
                    if not keep or (get(headers, "connection") or "").lower() == "close":
                        return
        except (Closed, socket.timeout, OSError):
            return
        except Exception as e:  # a parse error: the test should hear of it
            with self.cond:
                self.errors.append(repr(e))
            return

    @staticmethod
    def _reply(conn: socket.socket, req: Seen) -> bool:
        """Answers; returns whether the connection stays open."""
        mode = req.header("x-test-reply") or "cl"
        head_only = req.method == "HEAD"
        tag = f"{mode} {req.target}"

        def start(status: int, *headers: str) -> bytes:
            lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Whatever')}", f"X-Reply-Mode: {mode}",
                     f"X-Reply-To: {req.method} {req.target}", *headers]
            return ("\r\n".join(lines) + "\r\n\r\n").encode()

        if mode in ("cl", "large", "empty", "103"):
            body = payload(tag, {"cl": 1000, "large": BIG, "empty": 0, "103": 1000}[mode])
            if mode == "103":  # an interim answer first
                conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
            conn.sendall(start(200, "Content-Type: application/octet-stream", "X-Resp-Multi: a",
                               "X-Resp-Multi: b", "Cache-Control: no-store", f"Content-Length: {len(body)}")
                         + (b"" if head_only else body))
            return True
        if mode == "hop":
            # Per-hop response headers, including one the Connection header names.
            body = payload(tag, 100)
            conn.sendall(start(200, "Connection: keep-alive, X-Resp-Hop", "X-Resp-Hop: 1", "Keep-Alive: timeout=5",
                               "Proxy-Connection: keep-alive", "X-Resp-Kept: 1", f"Content-Length: {len(body)}")
                         + (b"" if head_only else body))
            return True
        if mode in ("cl-close", "cl-drop"):
            # A complete response, then the backend closes: announced (Connection: close) or not.
            body = payload(tag, 1000)
            conn.sendall(start(200, *(["Connection: close"] if mode == "cl-close" else []),
                               f"Content-Length: {len(body)}") + (b"" if head_only else body))
            return False
        if mode in ("chunked", "slow-chunked"):
            h = start(200, "Content-Type: text/plain", "Transfer-Encoding: chunked", "Trailer: X-Checksum")
            if head_only:
                conn.sendall(h)
                return True
            body = payload(tag, sum(CHUNKS))
            pieces, at = [], 0
            for i, n in enumerate(CHUNKS):
                ext = ";name=value" if i == 2 else ""
                pieces.append(f"{n:x}{ext}\r\n".encode() + body[at:at + n] + b"\r\n")
                at += n
            pieces.append(f"0\r\nX-Checksum: {hashlib.sha256(body).hexdigest()}\r\n\r\n".encode())
            if mode == "chunked":
                conn.sendall(h + b"".join(pieces))
            else:
                conn.sendall(h)
                for p in pieces:
                    time.sleep(0.03)
                    conn.sendall(p)
            return True
        if mode == "close":
            # HTTP/1.1 with neither Content-Length nor chunked (nor Connection: close):
            # the body ends when the connection does.
            conn.sendall(start(200, "Content-Type: text/plain"))
            if not head_only:
                body = payload(tag, 70_000)
                conn.sendall(body[:30_000])
                time.sleep(0.02)
                conn.sendall(body[30_000:])
            conn.shutdown(socket.SHUT_WR)
            return False
        if mode == "slow":
            body = payload(tag, 64 * 1024)
            conn.sendall(start(200, "Content-Type: application/octet-stream", f"Content-Length: {len(body)}"))
            if not head_only:
                for i in range(0, len(body), 8192):
                    time.sleep(0.03)
                    conn.sendall(body[i:i + 8192])
            return True
        if mode == "conn-cl":
            # The Connection header names the framing header itself.
            body = payload(tag, 1000)
            conn.sendall(start(200, "Connection: content-length", f"Content-Length: {len(body)}")
                         + (b"" if head_only else body))
            return True
        if mode == "cl-and-chunked":
            # Both framings (RFC 9112 §6.3: chunked wins); the length is a lie.
            body = payload(tag, 1200)
            h = start(200, "Content-Length: 5", "Transfer-Encoding: chunked")
            conn.sendall(h + (b"" if head_only else f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"))
            return True
        if mode == "204":
            conn.sendall(start(204, "X-Empty: yes"))
            return True
        if mode == "304":
            conn.sendall(start(304, 'ETag: "v1"', "Cache-Control: max-age=60"))
            return True
        raise ValueError(f"unknown x-test-reply mode {mode!r}")


@pytest.fixture
def backend() -> Iterator[RawBackend]:
    b = RawBackend()
    yield b
    b.close()


# --------------------------------------------------------------------------- clients and requests


def request(method: str, target: str, headers: list[tuple[str, str]] = (), body: bytes = b"", *,
            port: int | None, reply: str | None = "cl", version: str = "HTTP/1.1",
            host: str | None = ROUTER_HOST) -> bytes:
    """Raw request bytes. `port`: route to that loopback port (None: no routing headers);
    `reply`: the backend's answer (X-Test-Reply); a body gets a Content-Length."""
    lines = [f"{method} {target} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    if port is not None:
        lines += [f"X-Sandbox-ID: {SANDBOX_ID}", f"X-Sandbox-Pod-IP: {LOOPBACK}", f"X-Sandbox-Port: {port}"]
    if reply is not None and port is not None:
        lines.append(f"X-Test-Reply: {reply}")
    lines += [f"{k}: {v}" for k, v in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Client:
    def __init__(self, router: Router) -> None:
        self.sock = socket.create_connection((LOOPBACK, router.port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stream = Stream(self.sock)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self, method: str = "GET") -> Reply:
        return read_reply(self.stream, method)

    def roundtrip(self, data: bytes, method: str | None = None) -> Reply:
        self.send(data)
        return self.reply(method or data.split(b" ", 1)[0].decode())

    def closed(self, wait: float = TIMEOUT) -> bool:
        """Whether the router closes the connection (EOF or reset) within `wait`, with
        no further bytes."""
        self.sock.settimeout(wait)
        try:
            extra = self.stream.read_to_eof()
        except socket.timeout:
            return False
        finally:
            self.sock.settimeout(TIMEOUT)
        assert extra == b"", f"unexpected bytes after the response: {extra[:200]!r}"
        return True


# --------------------------------------------------------------------------- comparing


def blob(b: bytes) -> Any:
    """Bodies as compared: short ones as-is, long ones by length and digest (readable diffs)."""
    return b if len(b) <= 256 else (len(b), hashlib.sha256(b).hexdigest())


FRAMING_HEADERS = {"content-length", "transfer-encoding"}
# Field order across different names carries no meaning (RFC 9110 §5.3), and the
# reference does not keep it (http::HeaderMap moves the last entry into the slot
# of each header it removes); the order of the lines of one name is kept and
# compared. FAST_PATH_STRICT_HEADER_ORDER=1 compares the full order instead.
STRICT_ORDER = os.environ.get("FAST_PATH_STRICT_HEADER_ORDER", "") == "1"


def canon(headers: Headers) -> Headers:
    return list(headers) if STRICT_ORDER else sorted(headers, key=lambda h: h[0])  # stable: per name kept


def client_view(r: Reply, reframe: bool = False, close_header: bool = True) -> dict[str, Any]:
    """What the client got, with `date`'s value blanked (its presence counts: a proxy
    adds one, RFC 9110 §6.6.1); with `reframe`, minus the framing headers (a chunked
    or close-delimited body may reach the client framed differently); without
    `close_header`, minus `Connection: close` (for tests that compare whether the
    connection is closed instead: announcing it is optional)."""
    drop = FRAMING_HEADERS if reframe else set()
    headers = [(n, "<date>" if n == "date" else v) for n, v in r.headers if n not in drop]
    if not close_header:
        headers = [(n, v) for n, v in headers if not (n == "connection" and v.lower() == "close")]
    return {
        "version": r.version,
        "status": r.status,
        "interim": r.interim,
        "headers": canon(headers),
        "body": blob(r.body),
        "trailers": r.trailers,
        **({} if reframe else {"framing": r.framing}),
    }


def backend_view(s: Seen) -> dict[str, Any]:
    return {"line": s.line, "headers": canon(s.headers), "body": blob(s.body), "trailers": s.trailers,
            "framing": s.framing}


@dataclass
class Pair:
    ref: Router
    fast: Router

    def both(self) -> list[tuple[str, Router]]:
        return [("ref", self.ref), ("fast", self.fast)]


@pytest.fixture(scope="session")
def ref_flags_supported(router_bin) -> None:
    """The router binary knows the reference's flags (it predates them otherwise)."""
    out = subprocess.run([str(router_bin), "--help"], capture_output=True, timeout=20, text=True).stdout
    missing = [a.split("=", 1)[0] for a in REF_ARGS if a.startswith("--") and a.split("=", 1)[0] not in out]
    need(not missing, f"{router_bin} has no {', '.join(missing)} (rebuild sandhub-router, or set "
                      f"FAST_PATH_REF_ARGS)")


@pytest.fixture
def make_pair(make_router, ref_flags_supported) -> Callable[..., Pair]:
    def make(*extra: str) -> Pair:
        ref = make_router("--allow-loopback-pod-ip", *REF_ARGS, *extra)
        fast = make_router("--allow-loopback-pod-ip", *extra)
        return Pair(ref, fast)

    return make


@pytest.fixture
def pair(make_pair) -> Pair:
    return make_pair()


def differential(pair: Pair, backend: RawBackend | None, scenario: Callable[[Router], Any],
                 expect_seen: int | None = None, what: str = "the client saw different answers"
                 ) -> tuple[Any, list[Seen]]:
    """Runs `scenario` against the reference, then the fast router; asserts that both
    produced the same view and that the backend saw the same requests. Returns the
    fast router's view and the backend's requests (for concrete assertions)."""
    views: dict[str, Any] = {}
    seens: dict[str, list[Seen]] = {}
    for name, router in pair.both():
        if backend is not None:
            backend.take()
        views[name] = scenario(router)
        seens[name] = backend.take(expect_seen) if backend is not None else []
    assert views["fast"] == views["ref"], f"{what} (fast vs reference)"
    assert [backend_view(s) for s in seens["fast"]] == [backend_view(s) for s in seens["ref"]], \
        "the backend saw different requests (fast vs reference)"
    return views["fast"], seens["fast"]


def follow_up(c: Client, port: int) -> Any:
    """A routed GET on a connection after something else: its status, or what became of it."""
    try:
        return c.roundtrip(request("GET", "/follow-up", port=port)).status
    except (Closed, BrokenPipeError, ConnectionResetError):
        return "closed"
    except socket.timeout:
        return "no answer"


def one_exchange(data: bytes, method: str | None = None, reframe: bool = False
                 ) -> Callable[[Router], dict[str, Any]]:
    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            return client_view(c.roundtrip(data, method), reframe)

    return run


def detail(view: dict[str, Any]) -> Any:
    body = view["body"]
    assert isinstance(body, bytes), "a JSON error body is short"
    return json.loads(body)


# --------------------------------------------------------------------------- 1, 2: request headers


def test_simple_get_headers_reach_the_backend_rewritten(pair, backend):
    data = request("GET", "/some/path?q=1%202&x=%2F", [
        ("X-Custom-A", "alpha"),
        ("Authorization", "Bearer secret-token"),
        ("X-Multi", "first"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "hop-value"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
        ("TE", "gzip"),
        ("X-Custom-B", "two  words, and;more"),
        ("X-Multi", "second"),
        ("Accept", "*/*"),
        ("X-Empty", ""),
    ], port=backend.port)
    view, seen = differential(pair, backend, one_exchange(data), expect_seen=1)
    assert view["status"] == 200
    assert view["body"] == blob(payload("cl /some/path?q=1%202&x=%2F", 1000))
    assert get(view["headers"], "date") == "<date>"  # the backend sent none; the router adds it
    [s] = seen
    assert s.line == "GET /some/path?q=1%202&x=%2F HTTP/1.1"
    names = [n for n, _ in s.headers]
    assert get_all(s.headers, "host") == [f"{LOOPBACK}:{backend.port}"]
    for gone in ["authorization", "connection", "x-hop", "keep-alive", "proxy-connection",
                 "proxy-authorization", "te", "transfer-encoding", "upgrade", "trailer"]:
        assert gone not in names, gone
    assert get_all(s.headers, "x-forwarded-for") == [LOOPBACK]
    assert get_all(s.headers, "x-forwarded-host") == [ROUTER_HOST]
    assert get_all(s.headers, "x-forwarded-proto") == ["http"]
    assert get(s.headers, "x-custom-a") == "alpha"
    assert get(s.headers, "x-custom-b") == "two  words, and;more"
    assert get(s.headers, "x-empty") == ""
    assert get_all(s.headers, "x-multi") == ["first", "second"]  # repeated lines: both, in order
    assert get(s.headers, "x-sandbox-id") == SANDBOX_ID
    assert get(s.headers, "x-test-reply") == "cl"
    assert s.body == b"" and s.framing == "none"
    # Nothing else was added or lost: the client's other headers, each once, plus X-Forwarded-*.
    assert sorted(names) == sorted(["host", "x-sandbox-id", "x-sandbox-pod-ip", "x-sandbox-port", "x-test-reply",
                                    "x-custom-a", "x-multi", "x-custom-b", "x-multi", "accept", "x-empty",
                                    "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"])


def test_prior_x_forwarded_for_is_appended_to(pair, backend):
    data = request("GET", "/xff", [("X-Forwarded-For", "1.2.3.4")], port=backend.port)
    _, [s] = differential(pair, backend, one_exchange(data), expect_seen=1)
    assert get_all(s.headers, "x-forwarded-for") == [f"1.2.3.4, {LOOPBACK}"]


# --------------------------------------------------------------------------- 3: response framings


@pytest.mark.parametrize("method, mode, status, size, reframe", [
    ("GET", "cl", 200, 1000, False),
    ("GET", "empty", 200, 0, False),
    ("GET", "chunked", 200, sum(CHUNKS), True),
    ("GET", "slow-chunked", 200, sum(CHUNKS), True),
    ("GET", "close", 200, 70_000, True),
    ("GET", "large", 200, BIG, False),
    ("GET", "slow", 200, 64 * 1024, False),
    ("GET", "204", 204, 0, False),
    ("GET", "304", 304, 0, False),
    ("GET", "103", 200, 1000, False),
    ("HEAD", "cl", 200, 0, False),
    ("HEAD", "large", 200, 0, False),
    ("HEAD", "chunked", 200, 0, True),
])
def test_response_framings_reach_the_client_intact(pair, backend, method, mode, status, size, reframe):
    target = f"/framing/{mode}"
    data = request(method, target, port=backend.port, reply=mode)
    view, [s] = differential(pair, backend, one_exchange(data, reframe=reframe), expect_seen=1)
    assert s.line == f"{method} {target} HTTP/1.1"
    assert view["status"] == status
    want = b"" if method == "HEAD" else payload(f"{mode} {target}", size)
    assert view["body"] == blob(want)
    headers = view["headers"]
    assert get(headers, "x-reply-mode") == mode
    assert get(headers, "x-reply-to") == f"{method} {target}"
    if mode in ("cl", "large", "empty", "103"):
        assert get_all(headers, "x-resp-multi") == ["a", "b"]
        n = {"cl": 1000, "large": BIG, "empty": 0, "103": 1000}[mode]
        assert get(headers, "content-length") == str(n)  # HEAD too: it describes the GET
    if status in (204, 304):
        assert get(headers, "content-length") is None and get(headers, "transfer-encoding") is None
    if status == 304:
        assert get(headers, "etag") == '"v1"'
    for hop in ("connection", "keep-alive", "trailer", "upgrade"):
        assert get(headers, hop) is None, hop


@pytest.mark.parametrize("mode", ["chunked", "close", "large", "204", "304", "slow", "cl-close", "cl-drop"])
def test_framings_back_to_back_on_one_connection(pair, backend, mode):
    """Each framing, followed by more requests on the same client connection: the
    first body must end exactly where it should, and a backend that closes after
    its answer (cl-close says so, cl-drop does not) costs the client nothing."""
    def run(router: Router) -> list[dict[str, Any]]:
        out = []
        with Client(router) as c:
            for i, m in enumerate([mode, "cl", "HEAD", mode, "cl"]):
                method, m = ("HEAD", "cl") if m == "HEAD" else ("GET", m)
                r = c.roundtrip(request(method, f"/b2b/{i}", port=backend.port, reply=m))
                out.append(client_view(r, reframe=True))
        return out

    views, seen = differential(pair, backend, run, expect_seen=5)
    assert [v["status"] for v in views] == [{"204": 204, "304": 304}.get(mode, 200), 200, 200,
                                            {"204": 204, "304": 304}.get(mode, 200), 200]
    assert [s.target for s in seen] == [f"/b2b/{i}" for i in range(5)]
    assert views[1]["body"] == blob(payload("cl /b2b/1", 1000))
    assert views[2]["body"] == b""
    assert views[4]["body"] == blob(payload("cl /b2b/4", 1000))
    assert all(get(v["headers"], "connection") is None for v in views)


def test_per_hop_response_headers_stay_on_the_backend_hop(pair, backend):
    data = request("GET", "/hop", port=backend.port, reply="hop")
    view, [s] = differential(pair, backend, one_exchange(data), expect_seen=1)
    assert view["status"] == 200 and view["body"] == blob(payload("hop /hop", 100))
    headers = dict(view["headers"])
    for hop in ("connection", "keep-alive", "proxy-connection"):
        assert hop not in headers, hop
    assert headers["x-resp-kept"] == "1"


@pytest.mark.parametrize("which", ["ref", "fast"])
def test_connection_named_response_headers_are_dropped(pair, backend, which):
    router = pair.ref if which == "ref" else pair.fast
    with Client(router) as c:
        r = c.roundtrip(request("GET", "/hop", port=backend.port, reply="hop"))
    assert r.status == 200
    assert r.header("x-resp-hop") is None, r.headers


# --------------------------------------------------------------------------- 4, 5: request bodies


@pytest.mark.parametrize("mode, size", [("conn-cl", 1000), ("cl-and-chunked", 1200)])
def test_the_client_gets_one_framing_whatever_the_backend_sends(pair, backend, mode, size):
    """A response whose Connection header names Content-Length, or that carries both
    framings, reaches the client with exactly one, matching the body; the connection
    then carries the next request."""
    for label, router in pair.both():
        backend.take()
        with Client(router) as c:
            r = c.roundtrip(request("GET", f"/{mode}", port=backend.port, reply=mode))
            assert r.status == 200, label
            assert r.body == payload(f"{mode} /{mode}", size), label
            length, te = r.header("content-length"), r.header("transfer-encoding")
            assert (length is None) != (te is None), (label, r.headers)
            if length is not None:
                assert length == str(size), label
            assert follow_up(c, backend.port) == 200, label
        backend.take(2)


def test_post_small_content_length_body(pair, backend):
    body = b"hello=world&x=\r\n\r\nnot-a-head"
    data = request("POST", "/post/small", [("Content-Type", "application/x-www-form-urlencoded")], body,
                   port=backend.port)
    view, [s] = differential(pair, backend, one_exchange(data), expect_seen=1)
    assert view["status"] == 200
    assert s.body == body and s.framing == "length"
    assert get_all(s.headers, "content-length") == [str(len(body))]
    assert get(s.headers, "transfer-encoding") is None


def test_connection_cannot_strip_a_bodys_framing(pair, backend):
    """`Connection: content-length` names the body's framing as per-hop. Whatever the router
    does with it, the body must reach the backend as this request's body, never as a
    request of its own on the pooled connection other clients share."""
    smuggled = f"GET /smuggled HTTP/1.1\r\nHost: x\r\nX-Test-Reply: cl\r\n\r\n".encode()
    data = request("POST", "/framed", [("Connection", "content-length")], smuggled, port=backend.port)

    # Compared by outcome, not byte for byte: hyper's path re-frames the body as chunked,
    # the fast path writes its own Content-Length; both are right.
    for label, router in pair.both():
        backend.take()
        with Client(router) as c:
            assert c.roundtrip(data).status == 200, label
            assert follow_up(c, backend.port) == 200, label
        seen = backend.take(2)
        assert [s.target for s in seen] == ["/framed", "/follow-up"], (label, [s.line for s in seen])
        assert seen[0].body == smuggled, label


def test_post_2mib_content_length_body_sent_in_pieces(pair, backend):
    body = payload("upload", 2 * 1024 * 1024)
    head = request("POST", "/post/big", [("Content-Length", str(len(body)))], port=backend.port)

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(head + body[:1000])
            for i in range(1000, len(body), 65536):
                c.send(body[i:i + 65536])
                time.sleep(0.002)
            return client_view(c.reply())

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["status"] == 200
    assert len(s.body) == len(body) and s.body == body
    assert get(s.headers, "content-length") == str(len(body))


def test_post_expect_100_continue(pair, backend):
    body = payload("expect", 50_000)
    head = request("POST", "/post/expect", [("Expect", "100-continue"), ("Content-Length", str(len(body)))],
                   port=backend.port)

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(head)
            interim = read_reply(c.stream, "POST", interim_too=True)  # the router's 100 Continue
            assert interim.status == 100 and interim.body == b""
            c.send(body)
            return {"interim": client_view(interim), "final": client_view(c.reply())}

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["final"]["status"] == 200
    assert s.body == body


def test_post_chunked_body_arrives_decoded(pair, backend):
    parts = [b"a", payload("c1", 16), payload("c2", 0x100), payload("c3", 5000), payload("c4", 70_000)]
    wire = []
    for i, p in enumerate(parts):
        ext = ";ext=1" if i == 1 else ""
        wire.append(f"{len(p):x}{ext}\r\n".encode() + p + b"\r\n")
    wire.append(b"0\r\n\r\n")
    head = request("POST", "/post/chunked", [("Transfer-Encoding", "chunked")], port=backend.port)

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(head + wire[0])
            for w in wire[1:]:
                time.sleep(0.01)
                c.send(w)
            return client_view(c.reply())

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["status"] == 200
    assert s.body == b"".join(parts)
    assert get(s.headers, "content-length") is None
    assert get_all(s.headers, "transfer-encoding") == ["chunked"]


def test_empty_post_and_zero_chunked_body(pair, backend):
    def run(router: Router) -> list[dict[str, Any]]:
        with Client(router) as c:
            a = c.roundtrip(request("POST", "/post/cl0", [("Content-Length", "0")], port=backend.port))
            b = c.roundtrip(request("POST", "/post/te0", [("Transfer-Encoding", "chunked")], port=backend.port)
                            + b"0\r\n\r\n")
            return [client_view(a), client_view(b)]

    views, seen = differential(pair, backend, run, expect_seen=2)
    assert [v["status"] for v in views] == [200, 200]
    assert [s.body for s in seen] == [b"", b""]


# --------------------------------------------------------------------------- 6, 7, 8: connections


def test_pipelined_requests_answered_in_order(pair, backend):
    data = b"".join([
        request("GET", "/pipe/1", port=backend.port, reply="cl"),
        request("GET", "/pipe/2", port=backend.port, reply="chunked"),
        request("POST", "/pipe/3", body=b"third", port=backend.port, reply="204"),
        request("POST", "/pipe/4", [("Transfer-Encoding", "chunked")], port=backend.port, reply="close")
        + b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        request("HEAD", "/pipe/5", port=backend.port, reply="large"),
        request("GET", "/healthz", port=None),
        request("GET", "/pipe/7", port=backend.port, reply="empty"),
    ])
    methods = ["GET", "GET", "POST", "POST", "HEAD", "GET", "GET"]

    def run(router: Router) -> list[dict[str, Any]]:
        with Client(router) as c:
            c.send(data)
            return [client_view(c.reply(m), reframe=True) for m in methods]

    views, seen = differential(pair, backend, run, expect_seen=6)
    assert [v["status"] for v in views] == [200, 200, 204, 200, 200, 200, 200]
    assert views[0]["body"] == blob(payload("cl /pipe/1", 1000))
    assert views[1]["body"] == blob(payload("chunked /pipe/2", sum(CHUNKS)))
    assert views[3]["body"] == blob(payload("close /pipe/4", 70_000))
    assert views[4]["body"] == b""
    assert detail(views[5]) == {"status": "ok"}
    assert [s.line for s in seen] == ["GET /pipe/1 HTTP/1.1", "GET /pipe/2 HTTP/1.1", "POST /pipe/3 HTTP/1.1",
                                      "POST /pipe/4 HTTP/1.1", "HEAD /pipe/5 HTTP/1.1", "GET /pipe/7 HTTP/1.1"]
    assert [s.body for s in seen] == [b"", b"", b"third", b"abcde", b"", b""]


def test_nothing_after_connection_close_is_served(pair, backend):
    data = (request("GET", "/closing", [("Connection", "close")], port=backend.port)
            + request("GET", "/never", port=backend.port))

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(data)
            return {"reply": client_view(c.reply()), "closed": c.closed()}

    view, seen = differential(pair, backend, run, expect_seen=1)
    assert view["reply"]["status"] == 200 and view["closed"] is True
    time.sleep(0.2)
    assert [s.target for s in seen + backend.take()] == ["/closing"]


def test_request_trickled_byte_by_byte(pair, backend):
    body = payload("trickle", 300)
    data = request("POST", "/trickle?x=1", [("X-Custom", "v" * 50), ("X-Multi", "1"), ("X-Multi", "2")], body,
                   port=backend.port)

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            for i in range(len(data)):
                c.send(data[i:i + 1])
                if i % 16 == 0:
                    time.sleep(0.001)
            return client_view(c.reply())

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["status"] == 200
    assert s.line == "POST /trickle?x=1 HTTP/1.1" and s.body == body
    assert get_all(s.headers, "x-multi") == ["1", "2"]


def test_expect_100_continue_with_the_body_sent_at_once(pair, backend):
    body = payload("expect-eager", 3000)
    data = request("POST", "/post/eager", [("Expect", "100-continue")], body, port=backend.port)
    view, [s] = differential(pair, backend, one_exchange(data), expect_seen=1)
    assert view["status"] == 200 and s.body == body


def test_client_gone_mid_response_then_served_again(pair, backend):
    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(request("GET", "/big-abandoned", port=backend.port, reply="large"))
            head = c.stream.read_head()
            assert head is not None and head.startswith(b"HTTP/1.1 200 ")
            c.stream.read_exact(100_000)
        with Client(router) as c:
            return client_view(c.roundtrip(request("GET", "/after-abandon", port=backend.port)))

    view, seen = differential(pair, backend, run, expect_seen=2)
    assert view["status"] == 200 and view["body"] == blob(payload("cl /after-abandon", 1000))
    assert [s.target for s in seen] == ["/big-abandoned", "/after-abandon"]


def test_fifty_requests_on_one_connection_then_connection_close(pair, backend):
    modes = ["cl", "chunked", "empty", "204"]

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            views = []
            for i in range(50):
                r = c.roundtrip(request("GET", f"/ka/{i}", port=backend.port, reply=modes[i % len(modes)]))
                views.append(client_view(r, reframe=True))
            last = c.roundtrip(request("GET", "/ka/last", [("Connection", "close")], port=backend.port))
            return {"views": views, "last": client_view(last), "closed": c.closed()}

    view, seen = differential(pair, backend, run, expect_seen=51)
    assert [v["status"] for v in view["views"]] == [204 if i % 4 == 3 else 200 for i in range(50)]
    assert view["views"][4]["body"] == blob(payload("cl /ka/4", 1000))
    assert view["last"]["status"] == 200 and view["last"]["body"] == blob(payload("cl /ka/last", 1000))
    assert get(view["last"]["headers"], "connection") == "close"
    assert view["closed"] is True
    assert [s.target for s in seen] == [f"/ka/{i}" for i in range(50)] + ["/ka/last"]
    assert get(seen[-1].headers, "connection") is None  # per-hop: the client's close stays on its hop


@pytest.mark.parametrize("which", ["ref", "fast"])
def test_body_request_after_the_backend_closed_an_idle_connection(pair, backend, which):
    router = pair.ref if which == "ref" else pair.fast
    with Client(router) as c:
        for i in range(3):
            # Legal for the backend: close a persistent connection after answering, unannounced.
            assert c.roundtrip(request("GET", f"/drop/{i}", port=backend.port, reply="cl-drop")).status == 200
            time.sleep(0.1)  # the backend's FIN has reached the router
            r = c.roundtrip(request("POST", f"/after-drop/{i}", body=b"abc", port=backend.port))
            assert r.status == 200, r.body


@pytest.mark.parametrize("mode", ["cl", "chunked", "close"])
def test_http10_request_then_close(pair, backend, mode):
    data = request("GET", "/old", port=backend.port, reply=mode, version="HTTP/1.0")

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            r = c.roundtrip(data)
            return {"reply": client_view(r, reframe=True), "framing": r.framing, "closed": c.closed()}

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["reply"]["status"] == 200
    assert view["reply"]["body"] == blob(payload(f"{mode} /old", {"cl": 1000, "chunked": sum(CHUNKS),
                                                                  "close": 70_000}[mode]))
    assert view["framing"] != "chunked"  # an HTTP/1.0 client cannot read chunked
    assert view["closed"] is True
    assert s.line == "GET /old HTTP/1.1"


def test_http10_keep_alive_request(pair, backend):
    data = request("GET", "/old-ka", [("Connection", "keep-alive")], port=backend.port, version="HTTP/1.0")

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            a = c.roundtrip(data)
            out = {"first": client_view(a)}
            if (a.header("connection") or "").lower() == "keep-alive":
                out["second"] = client_view(c.roundtrip(data))
            out["closed"] = c.closed(1.0) if "second" not in out else None
            return out

    view, seen = differential(pair, backend, run)
    assert view["first"]["status"] == 200
    assert view["first"]["body"] == blob(payload("cl /old-ka", 1000))
    # Either the keep-alive is honoured (and said so) or the connection closes.
    if "second" in view:
        assert get(view["first"]["headers"], "connection").lower() == "keep-alive"
        assert view["second"]["status"] == 200
    else:
        assert view["closed"] is True
    assert all(get(s.headers, "connection") is None for s in seen)


def test_mixed_requests_on_one_connection(pair, backend):
    def run(router: Router) -> list[dict[str, Any]]:
        with Client(router) as c:
            out = []
            out.append(client_view(c.roundtrip(request("GET", "/mix/1", port=backend.port))))
            out.append(client_view(c.roundtrip(request("GET", "/healthz", port=None))))
            out.append(client_view(c.roundtrip(request("GET", "/mix/2", port=backend.port, reply="chunked")),
                                   reframe=True))
            bad = request("GET", "/mix/bad", [("X-Sandbox-ID", SANDBOX_ID), ("X-Sandbox-Pod-IP", LOOPBACK),
                                              ("X-Sandbox-Port", "abc")], port=None)
            out.append(client_view(c.roundtrip(bad)))
            out.append(client_view(c.roundtrip(request("GET", "/mix/3", port=backend.port))))
            out.append(client_view(c.roundtrip(request("GET", "/mix/4", port=backend.port))))
            return out

    views, seen = differential(pair, backend, run, expect_seen=4)
    assert [v["status"] for v in views] == [200, 200, 200, 400, 200, 200]
    assert detail(views[1]) == {"status": "ok"}
    assert detail(views[3]) == {"detail": "Invalid port format."}
    assert get(views[3]["headers"], "content-type") == "application/json"
    assert views[4]["body"] == blob(payload("cl /mix/3", 1000))
    assert [s.target for s in seen] == ["/mix/1", "/mix/2", "/mix/3", "/mix/4"]


def test_websocket_upgrade_after_a_plain_request_on_one_connection(pair, backend, ws_echo):
    key = base64.b64encode(b"fast-path-key-16").decode()
    upgrade = (
        "GET /ws/echo?x=1 HTTP/1.1\r\n"
        f"Host: {ROUTER_HOST}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Origin: https://some-origin.example\r\n"
        f"X-Sandbox-ID: ws\r\nX-Sandbox-Pod-IP: {LOOPBACK}\r\nX-Sandbox-Port: {ws_echo.port}\r\n\r\n"
    ).encode()

    def frame(opcode: int, data: bytes) -> bytes:
        mask = b"\x01\x02\x03\x04"
        assert len(data) < 126
        return bytes([0x80 | opcode, 0x80 | len(data)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(data))

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            first = client_view(c.roundtrip(request("GET", "/before-ws", port=backend.port)))
            switched = client_view(c.roundtrip(upgrade))
            c.send(frame(0x1, b"hello through the router"))
            echoed = c.stream.read_exact(2 + len(b"hello through the router"))
            c.send(frame(0x8, b""))
            close = c.stream.read_exact(2)
            return {"first": first, "switched": switched, "echoed": echoed, "close": close}

    view, [s] = differential(pair, backend, run, expect_seen=1)
    assert view["first"]["status"] == 200 and s.target == "/before-ws"
    assert view["switched"]["status"] == 101
    accept = base64.b64encode(hashlib.sha1((key + ws_echo.GUID).encode()).digest()).decode()
    assert get(view["switched"]["headers"], "sec-websocket-accept") == accept
    assert view["echoed"] == bytes([0x81, len(b"hello through the router")]) + b"hello through the router"
    assert view["close"] == b"\x88\x00"
    assert len(ws_echo.handshakes) == 2
    for path, headers in ws_echo.handshakes:
        assert path == "/ws/echo?x=1"
        assert "origin" not in headers
        assert headers["upgrade"].lower() == "websocket"
        assert headers["x-forwarded-for"] == LOOPBACK
    assert ws_echo.handshakes[0][1] == ws_echo.handshakes[1][1]


# --------------------------------------------------------------------------- 10: the router's own errors


def test_router_errors_are_identical(make_pair, backend):
    pair = make_pair("--upstream-max-retries=0", "--max-request-body-bytes=1000")
    dead = free_ports(1)[0]
    routed = f"X-Sandbox-ID: {SANDBOX_ID}\r\nX-Sandbox-Pod-IP: {LOOPBACK}\r\n"
    cases = [
        (request("GET", "/", port=None), 400, "X-Sandbox-ID header is required."),
        (request("GET", "/", [("X-Sandbox-ID", "UPPER")], port=None), 400, "Invalid sandbox ID format."),
        (request("GET", "/", [("X-Sandbox-ID", "a" * 64)], port=None), 400, "Invalid sandbox ID format."),
        (request("GET", "/", [("X-Sandbox-ID", "ok"), ("X-Sandbox-Port", "80a")], port=None), 400,
         "Invalid port format."),
        (request("GET", "/", [("X-Sandbox-ID", "ok"), ("X-Sandbox-Pod-IP", "169.254.169.254")], port=None), 400,
         "Invalid target IP address."),
        (request("GET", "/", port=dead), 502, f"Could not connect to the backend sandbox: {SANDBOX_ID}"),
        (request("POST", "/", [("Content-Length", "1001")], port=backend.port), 413, "Request body too large."),
        (f"POST / HTTP/1.1\r\nHost: {ROUTER_HOST}\r\n{routed}X-Sandbox-Port: {backend.port}\r\n"
         "Content-Length: 5000000000\r\n\r\n".encode(), 413, "Request body too large."),
    ]
    for data, status, message in cases:
        # The 413s are answered before the body is sent (the router must not wait for it).
        def run(router: Router) -> dict[str, Any]:
            with Client(router) as c:
                return {"reply": client_view(c.roundtrip(data), close_header=False),
                        "after": follow_up(c, backend.port)}

        view, seen = differential(pair, backend, run)
        reply = view["reply"]
        assert (reply["status"], detail(reply)) == (status, {"detail": message}), data
        assert get(reply["headers"], "content-type") == "application/json"
        # The router's own errors keep the connection, but for an unread body.
        assert view["after"] == (200 if status != 413 else "closed"), data
        assert [s.target for s in seen] == (["/follow-up"] if view["after"] == 200 else [])
    # A body at the limit still goes through.
    ok = request("POST", "/at-limit", body=b"x" * 1000, port=backend.port)
    view, [s] = differential(pair, backend, one_exchange(ok), expect_seen=1)
    assert view["status"] == 200 and s.body == b"x" * 1000


@pytest.mark.parametrize("body_sent", [False, True])
def test_connection_after_a_413(make_pair, backend, body_sent):
    """A declared body over the limit: 413 at once; then the connection either goes
    on (the body the client did send is skipped) or is closed, like the reference."""
    pair = make_pair("--max-request-body-bytes=1000")
    data = request("POST", "/too-big", [("Content-Length", "1001")], port=backend.port)
    if body_sent:
        data += b"x" * 1001

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            started = time.monotonic()
            first = client_view(c.roundtrip(data), close_header=False)
            fast = time.monotonic() - started < 1.0
            return {"first": first, "at_once": fast, "after": follow_up(c, backend.port)}

    view, seen = differential(pair, backend, run)
    assert (view["first"]["status"], detail(view["first"])) == (413, {"detail": "Request body too large."})
    # Not held back waiting for a body the client may never send.
    assert view["at_once"] is True
    assert view["after"] in (200, "closed")
    assert [s.target for s in seen] == (["/follow-up"] if view["after"] == 200 else [])


def test_chunked_body_over_the_limit_is_413(make_pair, backend):
    pair = make_pair("--max-request-body-bytes=1000")
    head = request("POST", "/over", [("Transfer-Encoding", "chunked")], port=backend.port)
    chunks = b"".join(f"{100:x}\r\n".encode() + b"y" * 100 + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(head + chunks)
            r = c.reply()
            return {"status": r.status, "body": r.body}

    view, _ = differential(pair, None, run)
    assert (view["status"], json.loads(view["body"])) == (413, {"detail": "Request body too large."})
    backend.take()


# --------------------------------------------------------------------------- 11: malformed requests


BIG_HEADER = "a" * (100 * 1024)

MALFORMED = [
    ("garbage", b"HELLO\r\n\r\n"),
    ("no-colon", b"GET / HTTP/1.1\r\nHost: x\r\nThis line has no colon\r\n\r\n"),
    ("bad-version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"),
    ("space-in-name", b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n"),
    ("bad-content-length", b"POST / HTTP/1.1\r\nHost: x\r\n{R}Content-Length: 1x\r\n\r\n"),
    ("two-content-lengths", b"POST / HTTP/1.1\r\nHost: x\r\n{R}Content-Length: 1\r\n"
                            b"Content-Length: 2\r\n\r\nab"),
    ("head-over-100kib", f"GET / HTTP/1.1\r\nHost: x\r\nX-Big: {BIG_HEADER}\r\n\r\n".encode()),
    ("head-over-1mib", f"GET / HTTP/1.1\r\nHost: x\r\nX-Big: {BIG_HEADER * 11}\r\n\r\n".encode()),
    ("obs-fold", b"GET / HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n b\r\n\r\n"),
    ("space-before-colon", b"GET / HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n"),
    ("plus-content-length", b"POST / HTTP/1.1\r\nHost: x\r\n{R}Content-Length: +3\r\n\r\nabc"),
    ("list-content-length", b"POST / HTTP/1.1\r\nHost: x\r\n{R}Content-Length: 3, 3\r\n\r\nabc"),
    ("unknown-transfer-coding", b"POST / HTTP/1.1\r\nHost: x\r\n{R}Transfer-Encoding: gzip\r\n\r\nabc"),
    ("http10-chunked", b"POST / HTTP/1.0\r\nHost: x\r\n{R}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("nul-in-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    # Over hyper's limit of 100 header lines (431), routed: the fast path must not forward it.
    ("120-headers", b"GET /h120 HTTP/1.1\r\nHost: x\r\n{R}" + b"".join(b"X-H%d: %d\r\n" % (i, i) for i in range(120))
     + b"\r\n"),
]


@pytest.mark.parametrize("name, data", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_requests_are_refused_and_the_router_keeps_serving(pair, backend, name, data):
    """{R}: routing headers to the backend (where a head parses, the body may not)."""
    data = data.replace(b"{R}", (f"X-Sandbox-ID: {SANDBOX_ID}\r\nX-Sandbox-Pod-IP: {LOOPBACK}\r\n"
                                 f"X-Sandbox-Port: {backend.port}\r\n").encode())

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            try:
                c.send(data)
                r = c.reply()
                status = r.status
            except (Closed, BrokenPipeError, ConnectionResetError):
                status = None
        # A new connection is served as usual.
        with Client(router) as c:
            after = c.roundtrip(request("GET", "/after-malformed", port=backend.port))
        return {"status": status, "after": after.status}

    statuses = {}
    for label, router in pair.both():
        backend.take()
        got = run(router)
        assert got["after"] == 200, (label, got)
        seen = backend.take(1)
        assert [s.target for s in seen] == ["/after-malformed"], label
        assert got["status"] is None or 400 <= got["status"] < 500, (label, got)
        statuses[label] = got["status"]
    if None not in statuses.values():
        assert statuses["fast"] == statuses["ref"], statuses


def test_malformed_chunked_body_is_refused(pair, backend):
    """The head is fine, the body's chunk size is not: a 400, and no complete request
    reaches the backend."""
    head = request("POST", "/bad-chunk", [("Transfer-Encoding", "chunked")], port=backend.port)

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(head + b"zz\r\n")
            try:
                r = c.reply("POST")
            except Closed:
                return {"status": "closed"}
            return {"status": r.status, "body": r.body, "closed": c.closed()}

    view, seen = differential(pair, backend, run)
    # The client's fault: a 400 (or a plain close), never a 5xx blaming the sandbox.
    assert view["status"] == "closed" or view["status"] == 400, view
    assert seen == []


# --------------------------------------------------------------------------- 11b: unusual requests


# Raw requests hyper's server accepts. {R}: routing headers to the backend.
# `want`: the concrete expectations (None: compared with the reference only; these
# are reference quirks, pinned so that the fast path does not drift from them
# unnoticed: see the notes).
UNUSUAL = [
    ("bare-lf", "GET /lf HTTP/1.1\nHost: x\n{R_LF}\n",
     {"status": 200, "line": "GET /lf HTTP/1.1"}),
    ("leading-crlf", "\r\nGET /lead HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "GET /lead HTTP/1.1"}),
    ("absolute-form", "GET http://foo.example/abs?x=1 HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "GET /abs?x=1 HTTP/1.1", "headers": {"x-forwarded-host": ["x"]}}),
    ("options-star", "OPTIONS * HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "OPTIONS * HTTP/1.1"}),
    ("lowercase-method", "get /lower HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "get /lower HTTP/1.1"}),
    ("extension-method", "PURGE /purge HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "PURGE /purge HTTP/1.1"}),
    ("odd-path", "GET /a%2F..%2Fb/../c//d?x=%00&y=%zz&z=a?b/c HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "GET /a%2F..%2Fb/../c//d?x=%00&y=%zz&z=a?b/c HTTP/1.1"}),
    # Not a valid request-target (RFC 9112 §3.2); the reference drops the fragment.
    ("fragment", "GET /frag?x=1#part HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "GET /frag?x=1 HTTP/1.1"}),
    ("tabs-around-value", "GET /tab HTTP/1.1\r\nHost: x\r\n{R}X-A:\t v \t\r\n\r\n",
     {"status": 200, "headers": {"x-a": ["v"]}}),
    ("utf8-value", "GET /utf8 HTTP/1.1\r\nHost: x\r\n{R}X-A: caf\u00e9 \u2603\r\n\r\n",
     {"status": 200, "headers": {"x-a": ["caf\u00e9 \u2603".encode().decode("latin-1")]}}),
    ("mixed-case-names", "GET /case HTTP/1.1\r\nhOsT: x\r\n{R}x-MiXeD: 1\r\nAUTHORIZATION: Bearer t\r\n\r\n",
     {"status": 200, "headers": {"x-mixed": ["1"], "x-forwarded-host": ["x"]}, "absent": ["authorization"]}),
    ("same-content-length-twice", "POST /cl2 HTTP/1.1\r\nHost: x\r\n{R}Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
     {"status": 200, "body": b"abc", "headers": {"content-length": ["3"]}}),
    ("chunked-capitalised", "POST /te HTTP/1.1\r\nHost: x\r\n{R}Transfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     {"status": 200, "body": b"abc", "absent": ["content-length"]}),
    ("chunked-with-request-trailers",
     "POST /tr HTTP/1.1\r\nHost: x\r\n{R}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
     {"status": 200, "body": b"abc"}),
    ("gzip-then-chunked", "POST /gz HTTP/1.1\r\nHost: x\r\n{R}Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     None),
    # Request smuggling: Transfer-Encoding wins over Content-Length, and the connection
    # is closed after the answer (RFC 9112 §6.3), so the trailing bytes are never a request.
    ("content-length-and-chunked",
     "POST /smuggle HTTP/1.1\r\nHost: x\r\n{R}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
     "5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "POST /smuggle HTTP/1.1", "body": b"hello", "absent": ["content-length"],
      "follow": "closed"}),
    ("x-forwarded-for-twice", "GET /xff2 HTTP/1.1\r\nHost: x\r\n{R}X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\n\r\n",
     {"status": 200, "headers": {"x-forwarded-for": [f"1.1.1.1, 2.2.2.2, {LOOPBACK}"]}}),
    ("x-forwarded-for-empty", "GET /xff0 HTTP/1.1\r\nHost: x\r\n{R}X-Forwarded-For: \r\n\r\n",
     {"status": 200, "headers": {"x-forwarded-for": [LOOPBACK]}}),
    ("client-forwarded-headers", "GET /xfh HTTP/1.1\r\nHost: x\r\n{R}X-Forwarded-Host: evil\r\nX-Forwarded-Proto: https\r\n\r\n",
     {"status": 200, "headers": {"x-forwarded-host": ["x"], "x-forwarded-proto": ["http"]}}),
    # RFC 9112 §3.2: exactly one Host in HTTP/1.1.
    ("no-host", "GET /nohost HTTP/1.1\r\n{R}\r\n", {"status": 400, "refused": "Invalid Host header."}),
    ("two-hosts", "GET /hosts HTTP/1.1\r\nHost: x\r\nHost: y\r\n{R}\r\n",
     {"status": 400, "refused": "Invalid Host header."}),
    ("connect", "CONNECT 127.0.0.1:{P} HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 405, "refused": "CONNECT is not supported."}),
    # The first of repeated routing headers counts.
    ("repeated-routing-headers",
     "GET /dup HTTP/1.1\r\nHost: x\r\n{R}X-Sandbox-Port: abc\r\nX-Sandbox-ID: UPPER\r\n\r\n",
     {"status": 200, "headers": {"x-sandbox-port": ["{P}", "abc"]}}),
    # An Upgrade the backend declines: an ordinary answer, and the connection goes on.
    ("declined-upgrade",
     "GET /h2c HTTP/1.1\r\nHost: x\r\n{R}Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
     "HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
     {"status": 200, "headers": {"upgrade": ["h2c"]}, "absent": ["http2-settings"]}),
    ("long-target", "GET /" + "p" * 16000 + "?q=" + "v" * 4000 + " HTTP/1.1\r\nHost: x\r\n{R}\r\n",
     {"status": 200, "line": "GET /" + "p" * 16000 + "?q=" + "v" * 4000 + " HTTP/1.1"}),
    ("90-headers", "GET /h90 HTTP/1.1\r\nHost: x\r\n{R}" + "".join(f"X-H{i}: {i}\r\n" for i in range(90)) + "\r\n",
     {"status": 200, "headers": {f"x-h{i}": [str(i)] for i in range(90)}}),
    # Quirks of the reference (see the module's notes): compared, not asserted.
    ("target-without-slash", "GET w HTTP/1.1\r\nHost: x\r\n{R}\r\n", None),
]


@pytest.mark.parametrize("name, template, want", UNUSUAL, ids=[c[0] for c in UNUSUAL])
def test_unusual_requests_are_handled_like_the_reference(pair, backend, name, template, want):
    routing = f"X-Sandbox-ID: {SANDBOX_ID}\r\nX-Sandbox-Pod-IP: {LOOPBACK}\r\nX-Sandbox-Port: {backend.port}\r\n"
    data = template.replace("{R}", routing).replace("{R_LF}", routing.replace("\r\n", "\n"))
    data = data.replace("{P}", str(backend.port)).encode("utf-8")
    method = data.lstrip(b"\r\n").split(b" ", 1)[0].decode().upper()

    def run(router: Router) -> dict[str, Any]:
        with Client(router) as c:
            c.send(data)
            try:
                first: Any = client_view(c.reply(method), reframe=True)
            except Closed:
                return {"first": "closed", "follow": None}
            return {"first": first, "follow": follow_up(c, backend.port)}

    view, seen = differential(pair, backend, run)
    if want is None:
        return
    assert view["first"] != "closed", view
    assert view["first"]["status"] == want["status"]
    assert view["follow"] == want.get("follow", 200)
    requests = [s for s in seen if s.target != "/follow-up"]
    if want.get("refused"):
        # The router's own answer: nothing reaches the backend.
        assert requests == [], [s.line for s in requests]
        assert view["first"]["body"] == json.dumps({"detail": want["refused"]}, separators=(",", ":")).encode()
        return
    assert len(requests) == 1, [s.line for s in seen]
    [s] = requests
    if "line" in want:
        assert s.line == want["line"]
    assert s.body == want.get("body", b"")
    for n, values in want.get("headers", {}).items():
        assert get_all(s.headers, n) == [v.replace("{P}", str(backend.port)) for v in values], n
    for n in want.get("absent", []):
        assert get(s.headers, n) is None, n


# --------------------------------------------------------------------------- 12: h2c


def test_h2c_prior_knowledge_on_the_plain_port(pair):
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # empty SETTINGS on stream 0

    def run(router: Router) -> bytes:
        with Client(router) as c:
            c.send(preface + settings)
            head = c.stream.read_exact(9)
            return head[3:9]  # type, flags, stream id (the length depends on the settings sent)

    got, _ = differential(pair, None, run, what="the HTTP/2 answer differs")
    assert got[0] == 0x04, got  # SETTINGS
    assert got[1] & 0x01 == 0  # not an ACK: the server's own SETTINGS come first
    assert got[2:] == b"\x00\x00\x00\x00"  # stream 0


# --------------------------------------------------------------------------- 13: metrics


def samples(router: Router, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in router.metrics().splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric == name:
            out[labels.rstrip("}")] = float(value)
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def test_metrics_count_the_same(make_pair, backend):
    pair = make_pair("--max-request-body-bytes=1000")
    names = ["sandbox_router_requests_total", "sandbox_router_request_duration_seconds_count",
             "sandbox_router_inflight_requests", "sandbox_router_upstream_tx_bytes_total",
             "sandbox_router_upstream_rx_bytes_total", "sandbox_router_upstream_errors_total"]
    sequence = [
        request("GET", "/m/1", port=backend.port),
        request("GET", "/healthz", port=None),
        request("POST", "/m/2", body=b"z" * 500, port=backend.port, reply="chunked"),
        request("GET", "/m/3", [("X-Sandbox-ID", "Bad_ID")], port=None),
        request("POST", "/m/4", [("Content-Length", "5000")], port=backend.port),
    ]

    def run(router: Router) -> dict[str, Any]:
        before = {n: samples(router, n) for n in names}
        with Client(router) as c:
            for data in sequence[:4]:
                c.roundtrip(data)
        with Client(router) as c:
            c.roundtrip(sequence[4])
        deadline = time.monotonic() + TIMEOUT
        while True:  # counts land when a response is done; give them a moment
            after = {n: samples(router, n) for n in names}
            got = {n: delta(before[n], after[n]) for n in names}
            if sum(got["sandbox_router_requests_total"].values()) >= 5 or time.monotonic() > deadline:
                return got
            time.sleep(0.05)

    got, _ = differential(pair, backend, run, expect_seen=2, what="the metrics moved differently")
    reqs = got["sandbox_router_requests_total"]
    assert sum(reqs.values()) == 5, reqs
    by = {tuple(sorted(k.split(","))): v for k, v in reqs.items()}

    def count(method: str, code: int, ns: str) -> float:
        want = tuple(sorted([f'method="{method}"', f'code="{code}"', f'sandbox_namespace="{ns}"']))
        return by.get(want, 0.0)

    assert count("GET", 200, "default") == 1
    assert count("POST", 200, "default") == 1
    assert count("POST", 413, "default") == 1
    assert count("GET", 200, "") == 1  # /healthz
    assert count("GET", 400, "") == 1
    assert sum(got["sandbox_router_request_duration_seconds_count"].values()) == 5
    assert got["sandbox_router_inflight_requests"] == {}
    assert sum(got["sandbox_router_upstream_tx_bytes_total"].values()) >= 500
    assert sum(got["sandbox_router_upstream_rx_bytes_total"].values()) >= 1000 + sum(CHUNKS)
