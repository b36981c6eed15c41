"""HTTP behaviour of the real sandhub-router binary: routing headers and
their errors, header rewriting, dial retries, timeouts, body limits,
WebSocket pass-through, path routing with session cookies and Origin
checks, scoped-token authz, and the YAML config file."""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
import websocket

from router_harness import mint
from sandhub_testing import LOOPBACK


def detail(body: bytes) -> str:
    return json.loads(body)["detail"]


def to_echo(echo, **extra) -> dict[str, str]:
    return {"X-Sandbox-ID": "echo", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(echo.port), **extra}


# --------------------------------------------------------------------------- routing headers


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "X-Sandbox-ID header is required."),
        ({"X-Sandbox-ID": "UPPER"}, "Invalid sandbox ID format."),
        ({"X-Sandbox-ID": "a" * 64}, "Invalid sandbox ID format."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Namespace": "bad_ns"}, "Invalid namespace format."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Port": "0"}, "Invalid port format."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Port": "65536"}, "Invalid port format."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Port": "80a"}, "Invalid port format."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Pod-IP": "not-an-ip"}, "Invalid target IP address."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Pod-IP": "169.254.169.254"}, "Invalid target IP address."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Pod-IP": "224.0.0.1"}, "Invalid target IP address."),
        ({"X-Sandbox-ID": "ok", "X-Sandbox-Pod-IP": "0.0.0.0"}, "Invalid target IP address."),
    ],
)
def test_bad_routing_headers_are_400_with_upstream_messages(router, headers, message):
    status, h, body = router.request("GET", "/x", headers=headers)
    assert status == 400
    assert h["content-type"] == "application/json"
    assert json.loads(body) == {"detail": message}


def test_loopback_pod_ip_needs_the_flag(make_router, http_echo):
    strict = make_router()
    status, _, body = strict.request("GET", "/", headers=to_echo(http_echo))
    assert (status, detail(body)) == (400, "Invalid target IP address.")


def test_healthz_on_proxy_and_probe_ports(router):
    status, _, body = router.request("GET", "/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    import http.client
    for path, want in [("/healthz", 200), ("/readyz", 200), ("/nope", 404)]:
        c = http.client.HTTPConnection(LOOPBACK, router.health_port, timeout=5)
        c.request("GET", path)
        assert c.getresponse().status == want
        c.close()


def test_headers_rewritten_for_the_sandbox(router, http_echo):
    status, _, body = router.request(
        "POST", "/some/path?q=1%202", body=b"abc",
        headers=to_echo(http_echo, Authorization="Bearer secret-token", Host="router.example:8080",
                        Connection="keep-alive, X-Hop", **{"X-Hop": "1", "X-Forwarded-For": "203.0.113.9"}),
    )
    assert status == 200
    seen = json.loads(body)
    assert seen["method"] == "POST" and seen["path"] == "/some/path?q=1%202" and seen["body_len"] == 3
    h = seen["headers"]
    assert "authorization" not in h
    assert "x-hop" not in h
    assert h["host"] == f"{LOOPBACK}:{http_echo.port}"
    assert h["x-forwarded-host"] == "router.example:8080"
    assert h["x-forwarded-proto"] == "http"
    assert h["x-forwarded-for"] == f"203.0.113.9, {LOOPBACK}"
    assert h["x-sandbox-id"] == "echo"


def test_response_framings_pass_through(router, http_echo):
    want = b"".join(f"chunk-{i};".encode() * (i + 1) for i in range(50))
    # Several times over one client connection, so pooled upstream connections are reused.
    import http.client
    c = http.client.HTTPConnection(LOOPBACK, router.port, timeout=10)
    try:
        for _ in range(3):
            c.request("GET", "/chunked", headers=to_echo(http_echo))
            r = c.getresponse()
            assert (r.status, r.read()) == (200, want)
            assert r.getheader("keep-alive") is None
            c.request("GET", "/empty", headers=to_echo(http_echo))
            r = c.getresponse()
            assert (r.status, r.read()) == (204, b"")
            c.request("HEAD", "/", headers=to_echo(http_echo))
            r = c.getresponse()
            assert (r.status, r.getheader("content-length"), r.read()) == (200, "12345", b"")
            c.request("POST", "/echo", body=b"q" * 100_000, headers=to_echo(http_echo))
            r = c.getresponse()
            assert json.loads(r.read())["body_len"] == 100_000
            # A chunked request body is re-framed as chunked for the sandbox.
            c.request("POST", "/echo", body=iter([b"a" * 5000, b"b" * 7000]), headers=to_echo(http_echo),
                      encode_chunked=True)
            r = c.getresponse()
            seen = json.loads(r.read())
            assert seen["body_len"] == 12_000 and seen["headers"]["transfer-encoding"] == "chunked"
    finally:
        c.close()


# --------------------------------------------------------------------------- backend failures


def test_unknown_sandbox_is_502(make_router):
    r = make_router("--upstream-max-retries", "0", "--cluster-domain", "cluster.invalid")
    status, _, body = r.request("GET", "/", headers={"X-Sandbox-ID": "no-such-sandbox", "X-Sandbox-Namespace": "ns1"})
    assert (status, detail(body)) == (502, "Could not connect to the backend sandbox: no-such-sandbox")
    assert r.metric("sandbox_router_upstream_errors_total", sandbox_namespace="ns1", reason="dial") == 1


def test_dead_backend_is_retried_with_backoff_then_502(router, sandboxd):
    dead = sandboxd.legacy_port
    sandboxd.proc.terminate()
    sandboxd.proc.wait(timeout=10)
    started = time.monotonic()
    status, _, body = router.request("GET", "/", headers={"X-Sandbox-ID": "gone", "X-Sandbox-Pod-IP": LOOPBACK,
                                                           "X-Sandbox-Port": str(dead)})
    elapsed = time.monotonic() - started
    assert (status, detail(body)) == (502, "Could not connect to the backend sandbox: gone")
    assert router.metric("sandbox_router_upstream_retries_total") == 3
    # 200 ms + 400 ms + 800 ms of backoff happened (a lower bound, not a benchmark).
    assert elapsed >= 1.3


def test_silent_backend_times_out_with_504(make_router, silent_backend):
    r = make_router("--allow-loopback-pod-ip", "--proxy-timeout", "1s")
    headers = {"X-Sandbox-ID": "slow", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(silent_backend.port)}
    status, _, body = r.request("GET", "/", headers=headers)
    assert (status, detail(body)) == (504, "Timed out waiting for the backend sandbox: slow")
    assert r.metric("sandbox_router_upstream_errors_total", reason="timeout") == 1


def test_sdk_timeout_header_shortens_the_budget(router, silent_backend):
    headers = {"X-Sandbox-ID": "slow", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(silent_backend.port),
               "X-Sandbox-Timeout": "1"}
    started = time.monotonic()
    status, _, _ = router.request("GET", "/", headers=headers)
    assert status == 504
    assert time.monotonic() - started < 10


def test_request_body_limit(make_router, http_echo):
    r = make_router("--allow-loopback-pod-ip", "--max-request-body-bytes", "1000")
    assert r.request("POST", "/", body=b"x" * 1000, headers=to_echo(http_echo))[0] == 200
    status, _, body = r.request("POST", "/", body=b"x" * 1001, headers=to_echo(http_echo))
    assert (status, detail(body)) == (413, "Request body too large.")

    # A chunked body (no Content-Length) is cut off while it streams.
    def chunks():
        for _ in range(20):
            yield b"y" * 100
    import http.client
    c = http.client.HTTPConnection(LOOPBACK, r.port, timeout=10)
    c.request("POST", "/", body=chunks(), headers=to_echo(http_echo), encode_chunked=True)
    resp = c.getresponse()
    assert resp.status == 413
    c.close()


def test_request_body_limit_answers_a_client_still_sending(make_router, http_echo):
    """Past the limit the router reads (and drops) the rest of a bounded body
    before it answers, so a client still sending gets the 413, not a reset.
    The pauses make sure the client is mid-body when the limit is crossed."""
    import http.client
    import time

    r = make_router("--allow-loopback-pod-ip", "--max-request-body-bytes", "1000")

    def slow_chunks():
        for i in range(30):
            if i >= 10:
                time.sleep(0.02)
            yield b"z" * 200

    for _ in range(3):
        c = http.client.HTTPConnection(LOOPBACK, r.port, timeout=10)
        c.request("POST", "/", body=slow_chunks(), headers=to_echo(http_echo), encode_chunked=True)
        resp = c.getresponse()
        assert (resp.status, detail(resp.read())) == (413, "Request body too large.")
        c.close()


# --------------------------------------------------------------------------- WebSocket


def test_websocket_echo_through_header_routing(make_router, ws_echo):
    r = make_router("--allow-loopback-pod-ip", "--proxy-timeout", "1s")
    ws = websocket.create_connection(
        f"ws://{LOOPBACK}:{r.port}/ws/echo?x=1",
        header=[f"X-Sandbox-ID: ws", f"X-Sandbox-Pod-IP: {LOOPBACK}", f"X-Sandbox-Port: {ws_echo.port}",
                "Authorization: Bearer not-for-the-sandbox"],
        origin="https://some-origin.example",
        timeout=10,
    )
    try:
        ws.send("hello")
        assert ws.recv() == "hello"
        # The proxy timeout (1s) does not apply once the connection is upgraded.
        time.sleep(1.5)
        big = "z" * 70000
        ws.send(big)
        assert ws.recv() == big
    finally:
        ws.close()
    path, headers = ws_echo.handshakes[0]
    assert path == "/ws/echo?x=1"
    assert "origin" not in headers
    assert "authorization" not in headers
    assert headers["upgrade"].lower() == "websocket"
    assert headers["x-forwarded-for"] == LOOPBACK
    # Both directions counted: 5 + 70000 bytes of payload plus framing each way.
    assert r.metric("sandbox_router_upstream_rx_bytes_total") >= 70005
    assert r.metric("sandbox_router_upstream_tx_bytes_total") >= 70005


# --------------------------------------------------------------------------- scoped tokens


def test_scoped_token_denials_and_messages(make_router, secret_file):
    r = make_router("--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(secret_file),
                    "--upstream-max-retries", "0", "--cluster-domain", "cluster.invalid")
    base = {"X-Sandbox-ID": "box", "X-Sandbox-Namespace": "team-a"}
    good = f"Bearer {mint('team-a', 'box')}"
    cases = [
        (base, 401, "Missing bearer token."),
        ({**base, "Authorization": "Bearer v1.e30.AAAA"}, 401, "Invalid or expired token."),
        ({**base, "Authorization": f"Bearer {mint('team-a', 'box', ttl=-5)}"}, 401, "Invalid or expired token."),
        ({**base, "Authorization": f"Bearer {mint('team-a', 'box', secret=b'x' * 40)}"}, 401, "Invalid or expired token."),
        ({**base, "Authorization": f"Bearer {mint('team-b', 'box')}"}, 403, "Token is not valid for this sandbox."),
        ({**base, "Authorization": f"Bearer {mint('team-a', 'other')}"}, 403, "Token is not valid for this sandbox."),
        ({**base, "Authorization": good, "X-Sandbox-Pod-IP": "10.0.0.8"}, 403,
         "X-Sandbox-Pod-IP and X-Sandbox-UID are not allowed with scoped tokens."),
        ({**base, "Authorization": good, "X-Sandbox-UID": "abc"}, 403,
         "X-Sandbox-Pod-IP and X-Sandbox-UID are not allowed with scoped tokens."),
        # Allowed: the router goes on to dial the (unresolvable) cluster DNS name.
        ({**base, "Authorization": good}, 502, "Could not connect to the backend sandbox: box"),
    ]
    for headers, status, message in cases:
        got, _, body = r.request("GET", "/", headers=headers)
        assert (got, detail(body)) == (status, message), headers
    assert r.metric("sandbox_router_authz_decisions_total", sandbox_namespace="team-a", decision="deny") == 8
    assert r.metric("sandbox_router_authz_decisions_total", sandbox_namespace="team-a", decision="allow") == 1


def test_scoped_token_mode_needs_a_long_secret(router_bin, tmp_path):
    import subprocess
    short = tmp_path / "short"
    short.write_bytes(b"too-short")
    out = subprocess.run([str(router_bin), "--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(short),
                          "--http-bind-address", "127.0.0.1:0", "--metrics-bind-address", "0",
                          "--health-probe-bind-address", "0"], capture_output=True, timeout=20)
    assert out.returncode != 0
    assert b"at least 32" in out.stderr


def test_mint_token_subcommand_matches_the_format(router_bin, secret_file, make_router):
    import subprocess
    token = subprocess.run([str(router_bin), "mint-token", "--secret-file", str(secret_file), "--namespace", "ns",
                            "--name", "box", "--ttl", "1h"], capture_output=True, check=True, timeout=20).stdout.decode().strip()
    assert token.startswith("v1.")
    r = make_router("--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(secret_file),
                    "--upstream-max-retries", "0", "--cluster-domain", "cluster.invalid")
    status, _, _ = r.request("GET", "/", headers={"X-Sandbox-ID": "box", "X-Sandbox-Namespace": "ns",
                                                  "Authorization": f"Bearer {token}"})
    assert status == 502  # authorized, then no such host


# --------------------------------------------------------------------------- path routing


@pytest.fixture
def path_router(make_router, secret_file):
    return make_router(
        "--path-routing-prefix", "/sb/",
        "--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(secret_file),
        "--authz-cookie-allowed-origins", "https://ide.example",
        "--allow-loopback-pod-ip", "--upstream-max-retries", "0", "--cluster-domain", "cluster.invalid",
    )


def test_path_routing_bootstraps_a_session_cookie(path_router):
    token = mint("team-a", "box")
    q = urllib.parse.urlencode({"a": "1", "sandbox_token": token, "b": "2"})
    status, h, _ = path_router.request("GET", f"/sb/team-a/box/8080/app/index.html?{q}")
    assert status == 303
    assert h["location"] == "/sb/team-a/box/8080/app/index.html?a=1&b=2"
    cookie = h["set-cookie"]
    assert cookie.startswith(f"sandbox_router_session={token}; Path=/sb/team-a/box/8080; HttpOnly; SameSite=Lax")
    assert "Max-Age=" in cookie and "Secure" not in cookie
    # The cookie then authorizes requests for that sandbox (which then fail to resolve)...
    jar = {"Cookie": f"theme=dark; sandbox_router_session={token}"}
    status, _, body = path_router.request("GET", "/sb/team-a/box/8080/app/index.html", headers=jar)
    assert (status, detail(body)) == (502, "Could not connect to the backend sandbox: box")
    # ...and no other.
    status, _, body = path_router.request("GET", "/sb/team-a/other/8080/", headers=jar)
    assert (status, detail(body)) == (403, "Token is not valid for this sandbox.")
    status, _, body = path_router.request("GET", "/sb/team-a/box/8080/")
    assert (status, detail(body)) == (401, "Missing bearer token.")


def test_path_routing_bootstrap_rejects_bad_tokens(path_router):
    status, h, body = path_router.request("GET", "/sb/team-a/box/8080/?sandbox_token=v1.forged.sig")
    assert (status, detail(body)) == (401, "Invalid or expired token.")
    assert "set-cookie" not in h
    status, h, body = path_router.request("GET", f"/sb/team-a/box/8080/?sandbox_token={mint('team-a', 'x')}")
    assert status == 403 and "set-cookie" not in h


def test_path_routing_origin_checks(path_router):
    cookie = {"Cookie": f"sandbox_router_session={mint('team-a', 'box')}"}
    own = f"http://{LOOPBACK}:{path_router.port}"
    for origin, status in [("https://evil.example", 403), ("null", 403), (f"https://{LOOPBACK}:{path_router.port}", 403),
                           ("https://ide.example", 502), (own, 502)]:
        got, _, body = path_router.request("GET", "/sb/team-a/box/8080/ws", headers={**cookie, "Origin": origin})
        assert got == status, (origin, body)
        if status == 403:
            assert detail(body) == "Origin not allowed."


def test_cross_site_websocket_is_refused(path_router):
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(
            f"ws://{LOOPBACK}:{path_router.port}/sb/team-a/box/8080/ws",
            cookie=f"sandbox_router_session={mint('team-a', 'box')}",
            origin="https://evil.example", timeout=10)
    assert e.value.status_code == 403


def test_path_routing_bad_segments_and_fallback(path_router, http_echo):
    status, _, body = path_router.request("GET", "/sb/Team/box/8080/")
    assert (status, detail(body)) == (400, "Invalid namespace format.")
    status, _, body = path_router.request("GET", "/sb/team-a/box/http/")
    assert (status, detail(body)) == (400, "Invalid port format.")
    # Outside the prefix, header routing applies (with its own token check).
    status, _, body = path_router.request("GET", "/elsewhere", headers={"X-Sandbox-ID": "box"})
    assert (status, detail(body)) == (401, "Missing bearer token.")


def test_path_routing_forwarded_proto_marks_cookie_secure(make_router, secret_file):
    r = make_router("--path-routing-prefix", "/p", "--authz-mode", "scoped-token",
                    "--authz-scoped-token-secret-file", str(secret_file), "--authz-trust-forwarded-proto",
                    "--authz-cookie-samesite", "strict")
    token = mint("default", "box")
    status, h, _ = r.request("GET", f"/p/default/box/3000?sandbox_token={token}", headers={"X-Forwarded-Proto": "https"})
    assert status == 303
    assert h["set-cookie"].endswith("SameSite=Strict; Secure; Max-Age=" + h["set-cookie"].rsplit("Max-Age=", 1)[1])
    # Untrusted by default: the same header changes nothing.
    r2 = make_router("--path-routing-prefix", "/p", "--authz-mode", "scoped-token",
                     "--authz-scoped-token-secret-file", str(secret_file))
    status, h, _ = r2.request("GET", f"/p/default/box/3000?sandbox_token={token}", headers={"X-Forwarded-Proto": "https"})
    assert status == 303 and "Secure" not in h["set-cookie"]


# --------------------------------------------------------------------------- config file


def test_config_file_precedence(make_router, tmp_path, sandboxd):
    dead = sandboxd.legacy_port
    sandboxd.proc.terminate()
    sandboxd.proc.wait(timeout=10)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("allow-loopback-pod-ip: true\nupstream-max-retries: 1\nupstream-retry-initial-delay: 10ms\n")
    headers = {"X-Sandbox-ID": "gone", "X-Sandbox-Pod-IP": LOOPBACK, "X-Sandbox-Port": str(dead)}
    env = {"SANDBOX_ROUTER_UPSTREAM_MAX_RETRIES": "5"}
    # The file beats the environment...
    r = make_router("--config", str(cfg), env=env)
    assert r.request("GET", "/", headers=headers)[0] == 502
    assert r.metric("sandbox_router_upstream_retries_total") == 1
    # ...and a flag beats the file.
    r = make_router("--config", str(cfg), "--upstream-max-retries", "2", env=env)
    assert r.request("GET", "/", headers=headers)[0] == 502
    assert r.metric("sandbox_router_upstream_retries_total") == 2
    # The environment alone (via SANDBOX_ROUTER_CONFIG) also names the file.
    r = make_router(env={"SANDBOX_ROUTER_CONFIG": str(cfg)})
    assert r.request("GET", "/", headers=headers)[0] == 502
    assert r.metric("sandbox_router_upstream_retries_total") == 1


def test_metrics_have_upstream_names(router, http_echo):
    router.request("GET", "/", headers=to_echo(http_echo))
    text = router.metrics()
    # Labelled families (upstream errors, authz decisions, cert reloads) appear
    # with their first sample, as in Go's client; other tests check those.
    for name in ["sandbox_router_requests_total", "sandbox_router_request_duration_seconds",
                 "sandbox_router_inflight_requests", "sandbox_router_upstream_retries_total",
                 "sandbox_router_cache_invalidations_total", "sandbox_router_build_info",
                 "sandbox_router_upstream_rx_bytes_total", "sandbox_router_upstream_tx_bytes_total"]:
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    assert router.metric("sandbox_router_requests_total", method="GET", code="200", sandbox_namespace="default") == 1


@pytest.mark.parametrize("fast_path", ["true", "false"])
def test_sigterm_finishes_requests_in_flight_and_closes_idle_connections(make_router, http_echo, fast_path):
    import http.client
    import signal
    import socket
    import threading

    r = make_router("--allow-loopback-pod-ip", f"--http1-fast-path={fast_path}")
    idle = http.client.HTTPConnection(LOOPBACK, r.port, timeout=5)
    idle.request("GET", "/warm", headers=to_echo(http_echo))
    assert idle.getresponse().read() and idle.sock is not None
    slow: dict[str, object] = {}

    def in_flight() -> None:
        slow["status"], _, slow["body"] = r.request("GET", "/slow/800", headers=to_echo(http_echo), timeout=5)

    t = threading.Thread(target=in_flight)
    t.start()
    time.sleep(0.3)
    started = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    assert r.proc.wait(timeout=5) == 0
    took = time.monotonic() - started
    t.join(timeout=5)
    # The request in flight got its answer; the router did not wait for the idle
    # connection until --shutdown-timeout (2 s here) ran out.
    assert slow["status"] == 200, (slow, r.log_tail())
    assert json.loads(slow["body"])["path"] == "/slow/800"
    assert took < 1.8, (took, r.log_tail())
    idle.sock.settimeout(2)
    assert idle.sock.recv(1) == b"", "the idle connection was not closed"
    with pytest.raises(OSError):
        socket.create_connection((LOOPBACK, r.port), timeout=1).close()
