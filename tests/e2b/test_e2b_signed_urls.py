"""E2B's signed file URLs (`Sandbox.download_url` / `upload_url`): the SDK
signs `{path}:{read|write}:{user}:{access token}[:{expiry}]`; the URL then
opens that one file, for that one operation, with no header but the
sandbox's own host (`49983-{id}.<domain>` with `--sandbox-domain`, E2B's
`get_host()` shape) or its `E2b-Sandbox-Id`."""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox
from sandhub_testing import Hub, running_hub
from sandhub_testing.e2b import ANY_KEY, ENVD_PORT, Conn, conn_for

DOMAIN = "sandboxes.test"


@pytest.fixture(scope="module")
def domain_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A hub with the E2B facade and host routing under DOMAIN."""
    with running_hub(
        sandhub_bin, tmp_path_factory.mktemp("e2b-signed"), "--e2b", "--sandbox-domain", DOMAIN
    ) as hub:
        yield hub


@pytest.fixture
def signed_sandbox(domain_hub: Hub) -> Iterator[tuple[Sandbox, Conn]]:
    connection = conn_for(domain_hub.url, ANY_KEY)
    sbx = Sandbox.create(template="base", timeout=300, **connection)
    try:
        yield sbx, connection
    finally:
        Sandbox.kill(sbx.sandbox_id, **connection)


def query_of(url: str) -> str:
    """The query of a URL the SDK made (its base is E2B_SANDBOX_URL)."""
    return urllib.parse.urlsplit(url).query


def by_host(sbx: Sandbox) -> dict[str, str]:
    """What a browser sends for the sandbox's envd host."""
    return {"host": f"{ENVD_PORT}-{sbx.sandbox_id}.{DOMAIN}"}


def test_a_download_url_opens_its_file_without_a_token(domain_hub: Hub, signed_sandbox) -> None:
    sbx, _ = signed_sandbox
    sbx.files.write("/workspace/signed.txt", "signed content\n")
    url = sbx.download_url("/workspace/signed.txt")
    assert "signature=v1_" in url, url
    with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
        for headers in (by_host(sbx), {"e2b-sandbox-id": sbx.sandbox_id}):
            r = http.get(f"/files?{query_of(url)}", headers=headers)
            assert r.status_code == 200, (headers, r.text)
            assert r.text == "signed content\n"
        # With an expiry, until it passes.
        expiring = sbx.download_url("/workspace/signed.txt", use_signature_expiration=120)
        assert "signature_expiration=" in expiring
        r = http.get(f"/files?{query_of(expiring)}", headers=by_host(sbx))
        assert r.status_code == 200 and r.text == "signed content\n", r.text


def test_a_signature_opens_nothing_else(domain_hub: Hub, signed_sandbox) -> None:
    sbx, connection = signed_sandbox
    sbx.files.write("/workspace/a.txt", "a\n")
    sbx.files.write("/workspace/b.txt", "b\n")
    query = query_of(sbx.download_url("/workspace/a.txt"))
    other = Sandbox.create(template="base", timeout=300, **connection)
    try:
        with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
            # Another path with a's signature.
            swapped = query.replace("a.txt", "b.txt")
            r = http.get(f"/files?{swapped}", headers=by_host(sbx))
            assert r.status_code == 401, r.text
            # a's signature on another sandbox.
            r = http.get(f"/files?{query}", headers=by_host(other))
            assert r.status_code == 401, r.text
            # A read signature used to write.
            r = http.post(f"/files?{query}", headers=by_host(sbx), content=b"overwrite")
            assert r.status_code == 401, r.text
            assert sbx.files.read("/workspace/a.txt") == "a\n"
            # A tampered signature, and none.
            tampered = query.replace("signature=v1_", "signature=v1_x")
            r = http.get(f"/files?{tampered}", headers=by_host(sbx))
            assert r.status_code == 401, r.text
            r = http.get("/files?path=/workspace/a.txt", headers=by_host(sbx))
            assert r.status_code == 401, r.text
            # An expired one.
            expired = sbx.download_url("/workspace/a.txt", use_signature_expiration=-10)
            r = http.get(f"/files?{query_of(expired)}", headers=by_host(sbx))
            assert r.status_code == 401, r.text
    finally:
        Sandbox.kill(other.sandbox_id, **connection)


def test_an_upload_url_writes_its_file(domain_hub: Hub, signed_sandbox) -> None:
    sbx, _ = signed_sandbox
    url = sbx.upload_url("/workspace/up.txt")
    with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
        r = http.post(
            f"/files?{query_of(url)}",
            headers=by_host(sbx),
            files={"file": ("/workspace/up.txt", b"uploaded\n")},
        )
        assert r.status_code == 200, r.text
    assert sbx.files.read("/workspace/up.txt") == "uploaded\n"


def test_envd_answers_on_its_own_host(domain_hub: Hub, signed_sandbox) -> None:
    """E2B's host form of envd (`49983-{id}.<domain>`) with the access token."""
    sbx, _ = signed_sandbox
    token = sbx._envd_access_token  # noqa: SLF001 - what the SDK itself sends
    assert token
    with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
        r = http.get("/health", headers={**by_host(sbx), "x-access-token": token})
        assert r.status_code == 204, r.text
        r = http.get("/health", headers=by_host(sbx))
        assert r.status_code == 401, r.text


def test_other_ports_reach_the_sandbox_with_its_token(domain_hub: Hub, signed_sandbox) -> None:
    """Any `E2b-Sandbox-Port` but envd's is that port in the sandbox, by
    header or on E2B's host form (`Sandbox.get_host(port)`), with the
    sandbox's access token; without it, nothing."""
    sbx, _ = signed_sandbox
    sbx.files.write("/workspace/site/index.html", "served from the sandbox\n")
    sbx.commands.run("cd /workspace/site && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    token = sbx._envd_access_token  # noqa: SLF001 - what the SDK itself sends
    assert token
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.{DOMAIN}", host
    by_header = {"e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": "8000", "x-access-token": token}
    on_host = {"host": host, "e2b-traffic-access-token": token}
    with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
        deadline = time.monotonic() + 30
        while True:
            r = http.get("/index.html", headers=by_header)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "served from the sandbox\n", r.text
        r = http.get("/index.html", headers=on_host)
        assert r.status_code == 200 and r.text == "served from the sandbox\n", r.text
        # No token: the header route refuses, the host route wants a key or a link.
        r = http.get("/index.html", headers={"e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": "8000"})
        assert r.status_code == 401, r.text
        # Another sandbox's id with this token.
        r = http.get("/index.html", headers={**by_header, "e2b-sandbox-id": "sb-someoneelse"})
        assert r.status_code == 401, r.text


#: Answers every request with the Cookie header it got, and sets a cookie
#: that tries to reach every sibling host and take the hub's own name.
COOKIE_ECHO = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.headers.get("Cookie", "none").encode()
        self.send_response(200)
        self.send_header("Set-Cookie", "app=1; Domain=sandboxes.test; Path=/")
        self.send_header("Set-Cookie", "sandhub_port=forged; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", 8001), H).serve_forever()
"""


def test_the_hubs_port_cookie_never_reaches_a_port_on_any_route(domain_hub: Hub, signed_sandbox) -> None:
    """Issue #26 (7): with `X-Access-Token` on the host form the request
    takes E2B's route, which did not strip the hub's `sandhub_port` cookie,
    so the server saw a token for its own port. Every route strips it now,
    and no answer may set a cookie for sibling hosts or of the hub's name.
    On the hub's own host (the header route) the answer is sandboxed too."""
    sbx, _ = signed_sandbox
    sbx.files.write("/workspace/echo.py", COOKIE_ECHO)
    sbx.commands.run("cd /workspace && python3 echo.py", background=True)
    token = sbx._envd_access_token  # noqa: SLF001 - what the SDK itself sends
    assert token
    cookie = {"cookie": "a=1; sandhub_port=secret-token; b=2"}
    on_host = {"host": sbx.get_host(8001), "x-access-token": token, **cookie}
    by_header = {"e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": "8001", "x-access-token": token, **cookie}
    with httpx.Client(base_url=domain_hub.url, timeout=30) as http:
        deadline = time.monotonic() + 30
        while True:
            r = http.get("/", headers=on_host)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for headers, sandboxed in ((on_host, False), (by_header, True)):
            r = http.get("/", headers=headers)
            assert r.status_code == 200, r.text
            assert r.text == "a=1; b=2", r.text
            set_cookies = r.headers.get_list("set-cookie")
            assert all("domain" not in c.lower() and not c.startswith("sandhub_port") for c in set_cookies), set_cookies
            csp = r.headers.get("content-security-policy", "")
            assert csp.startswith("sandbox") == sandboxed, (headers, csp)
