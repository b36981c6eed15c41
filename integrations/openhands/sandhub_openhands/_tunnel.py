"""A loopback listener that carries each connection to a sandbox port through the
hub's raw TCP tunnel (`GET /v1/sandboxes/{id}/port-forward/{port}`, upgraded to
`sandhub-tcp`), as `sandhub port-forward` does.

Why: OpenHands' `RemoteConversation` opens its event WebSocket with no headers of
its own, so on a hub that wants an API key it cannot pass the hub's proxy. Here the
tunnel request carries the key, and the agent server is reached at a plain
`http://127.0.0.1:<port>` for HTTP and WebSocket alike. The sandhub SDK has no
port-forward call yet, so this one upgrade request is spoken here.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

UPGRADE = "sandhub-tcp"
CONNECT_TIMEOUT = 10.0
MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024


class TunnelError(RuntimeError):
    """The hub refused or could not open the tunnel."""


class PortTunnel:
    """``127.0.0.1:<local_port>`` -> port ``port`` of sandbox ``sandbox_id``, until
    ``close()``. Each accepted connection is one tunnel request to the hub."""

    def __init__(self, hub_url: str, api_key: str | None, sandbox_id: str, port: int) -> None:
        parts = urlsplit(hub_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"hub URL must be http(s)://host[:port], not {hub_url!r}")
        self._tls = parts.scheme == "https"
        self._addr = (parts.hostname, parts.port or (443 if self._tls else 80))
        self._netloc = parts.netloc.rsplit("@", 1)[-1]
        self._path = f"{parts.path.rstrip('/')}/v1/sandboxes/{sandbox_id}/port-forward/{port}"
        self._key = api_key
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, name=f"sandhub-tunnel-{port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            live, self._open = self._open, set()
        for s in live:
            _close(s)

    # ------------------------------------------------------------------ internals

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed.is_set():
                return False
            self._open.update(socks)
            return True

    def _untrack(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.difference_update(socks)
        for s in socks:
            _close(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _dial(self) -> tuple[socket.socket, bytes]:
        """A connection to the hub, upgraded; returns it and any bytes read past the head."""
        raw = socket.create_connection(self._addr, timeout=CONNECT_TIMEOUT)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small requests: no Nagle stalls
        upstream: socket.socket = raw
        try:
            if self._tls:
                upstream = ssl.create_default_context().wrap_socket(raw, server_hostname=self._addr[0])
            head = (
                f"GET {self._path} HTTP/1.1\r\nHost: {self._netloc}\r\n"
                f"Connection: upgrade\r\nUpgrade: {UPGRADE}\r\n"
            )
            if self._key:
                head += f"Authorization: Bearer {self._key}\r\n"
            upstream.sendall((head + "\r\n").encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = upstream.recv(CHUNK)
                if not chunk or len(data) > MAX_HEAD:
                    raise TunnelError("the hub closed the tunnel request without an answer")
                data += chunk
            head_bytes, rest = data.split(b"\r\n\r\n", 1)
            status = head_bytes.split(b"\r\n", 1)[0].decode("latin-1")
            if status.split(" ")[1:2] != ["101"]:
                raise TunnelError(f"the hub refused the tunnel: {status} {rest[:512].decode('utf-8', 'replace')}")
            upstream.settimeout(None)
            return upstream, rest
        except BaseException:
            _close(upstream)
            raise

    def _serve(self, client: socket.socket) -> None:
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            upstream, rest = self._dial()
        except (OSError, TunnelError) as e:
            body = json.dumps({"code": "UNAVAILABLE", "message": f"sandhub tunnel: {e}"}).encode()
            try:
                client.sendall(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                )
            except OSError:
                pass
            _close(client)
            return
        if not self._track(client, upstream):
            _close(client, upstream)
            return
        try:
            if rest:
                client.sendall(rest)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
        except OSError:
            pass
        finally:
            self._untrack(client, upstream)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies until `src` ends, then ends `dst`'s sending side (the other way goes on)."""
    try:
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
