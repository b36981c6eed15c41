"""The TLS listener: HTTPS and gRPC over TLS (ALPN h2), client certificates
in each --mtls-mode, and certificate hot reload. Certificates are made with
the openssl CLI for each test."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from k8s_agent_sandbox.commands._process_stubs import process_pb2, process_pb2_grpc

from sandhub_testing import LOOPBACK, need


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Pki:
    def __init__(self, d: Path) -> None:
        import shutil
        need(shutil.which("openssl") is not None, "openssl CLI not installed")
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        self.ca("ca")
        self.ca("other-ca")
        self.leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")
        self.leaf("client", "ca", "extendedKeyUsage=clientAuth")
        self.leaf("stranger", "other-ca", "extendedKeyUsage=clientAuth")

    def ca(self, name: str) -> None:
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}", cwd=self.d)

    def leaf(self, name: str, ca: str, ext: str, cn: str | None = None) -> None:
        (self.d / f"{name}.ext").write_text(ext + "\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn or name}", cwd=self.d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=self.d)

    def p(self, name: str) -> str:
        return str(self.d / name)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def tls_router(make_router, pki: Pki, mode: str = "off", *extra: str):
    args = ["--tls-cert-file", pki.p("server.crt"), "--tls-key-file", pki.p("server.key"),
            "--allow-loopback-pod-ip", "--mtls-mode", mode, *extra]
    if mode != "off":
        args += ["--tls-client-ca-file", pki.p("ca.crt")]
    return make_router(*args, https=True)


def context(pki: Pki, client: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.p("ca.crt"))
    if client:
        ctx.load_cert_chain(pki.p(f"{client}.crt"), pki.p(f"{client}.key"))
    return ctx


def https_get(port: int, ctx: ssl.SSLContext, path: str = "/healthz", headers=None) -> tuple[int, bytes]:
    c = http.client.HTTPSConnection(LOOPBACK, port, context=ctx, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_https_and_forwarded_proto(make_router, pki, http_echo):
    r = tls_router(make_router, pki)
    status, body = https_get(r.https_port, context(pki))
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, body = https_get(r.https_port, context(pki), "/hello", {
        "X-Sandbox-ID": "echo", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(http_echo.port)})
    assert status == 200
    assert json.loads(body)["headers"]["x-forwarded-proto"] == "https"


def test_https_keep_alive_across_fast_path_and_hyper(make_router, pki, http_echo):
    """One HTTPS connection: routed requests (the router's HTTP/1.1 fast path), a
    probe that hands the connection to hyper, then more routed requests (hyper's)."""
    r = tls_router(make_router, pki)
    routing = {"X-Sandbox-ID": "echo", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(http_echo.port)}
    c = http.client.HTTPSConnection(LOOPBACK, r.https_port, context=context(pki), timeout=10)
    try:
        c.connect()
        sock = c.sock
        for i, path in enumerate(["/a", "/b", "/healthz", "/c", "/d"]):
            body = b"x" * (1000 * i)
            headers = {} if path == "/healthz" else {**routing, "Content-Length": str(len(body))}
            c.request("POST" if headers else "GET", path, body=body if headers else None, headers=headers)
            resp = c.getresponse()
            data = json.loads(resp.read())
            assert resp.status == 200, (path, data)
            if path != "/healthz":
                assert (data["path"], data["body_len"]) == (path, len(body))
                assert data["headers"]["x-forwarded-proto"] == "https"
                assert data["headers"]["host"] == f"{LOOPBACK}:{http_echo.port}"
        assert c.sock is sock, "the connection was not kept alive"
    finally:
        c.close()
    assert r.metric("sandbox_router_requests_total", method="POST", code="200") == 4


def test_grpc_over_tls(make_router, pki, sandboxd):
    r = tls_router(make_router, pki)
    creds = grpc.ssl_channel_credentials(root_certificates=Path(pki.p("ca.crt")).read_bytes())
    with grpc.secure_channel(f"{LOOPBACK}:{r.https_port}", creds) as ch:
        stub = process_pb2_grpc.ProcessServiceStub(ch)
        resp = stub.Execute(
            process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["echo", "over tls"])),
            metadata=[("x-sandbox-id", "sb"), ("x-sandbox-pod-ip", LOOPBACK), ("x-sandbox-port", str(sandboxd.grpc_port))],
            timeout=30)
    assert (resp.exit_code, resp.stdout) == (0, b"over tls\n")


def handshake_fails(port: int, ctx: ssl.SSLContext) -> bool:
    """TLS 1.3 reports a refused client certificate on the first read."""
    try:
        status, _ = https_get(port, ctx)
        return False
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, socket.timeout, OSError):
        return True


def test_mtls_required(make_router, pki):
    r = tls_router(make_router, pki, "required")
    assert handshake_fails(r.https_port, context(pki))
    assert handshake_fails(r.https_port, context(pki, "stranger"))
    assert https_get(r.https_port, context(pki, "client"))[0] == 200


def test_mtls_optional(make_router, pki):
    r = tls_router(make_router, pki, "optional")
    assert https_get(r.https_port, context(pki))[0] == 200
    assert https_get(r.https_port, context(pki, "client"))[0] == 200
    assert handshake_fails(r.https_port, context(pki, "stranger"))


def test_mtls_needs_a_ca_file(router_bin, pki):
    out = subprocess.run([str(router_bin), "--https-bind-address", "127.0.0.1:0", "--http-bind-address", "127.0.0.1:0",
                          "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
                          "--tls-cert-file", pki.p("server.crt"), "--tls-key-file", pki.p("server.key"),
                          "--mtls-mode", "required"], capture_output=True, timeout=20)
    assert out.returncode != 0
    assert b"--tls-client-ca-file" in out.stderr


def served_cn(port: int, pki: Pki) -> str:
    ctx = context(pki)
    with socket.create_connection((LOOPBACK, port), timeout=5) as s, ctx.wrap_socket(s, server_hostname=LOOPBACK) as t:
        subject = dict(x[0] for x in t.getpeercert()["subject"])
        return subject["commonName"]


def test_certificate_hot_reload(make_router, pki):
    r = tls_router(make_router, pki)
    assert served_cn(r.https_port, pki) == "server"
    # A broken write keeps the old certificate and counts a failed reload.
    good_crt = Path(pki.p("server.crt")).read_bytes()
    Path(pki.p("server.crt")).write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    deadline = time.monotonic() + 15
    while r.metric("sandbox_router_cert_reloads_total", outcome="failure") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.metric("sandbox_router_cert_reloads_total", outcome="failure") >= 1
    assert served_cn(r.https_port, pki) == "server"
    Path(pki.p("server.crt")).write_bytes(good_crt)
    # A new certificate and key (as a Secret update would write them) are picked up.
    pki.leaf("server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth", cn="server-rotated")
    deadline = time.monotonic() + 15
    while served_cn(r.https_port, pki) != "server-rotated" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served_cn(r.https_port, pki) == "server-rotated"
    assert r.metric("sandbox_router_cert_reloads_total", outcome="success") >= 1
