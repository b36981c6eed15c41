"""Raw HTTP checks of sandboxd's wire details that SDKs depend on.

Requests go out through http.client, so the path is sent byte for byte as
written here (no client-side re-quoting).
"""

from __future__ import annotations

import json

from sandhub_testing import Sandboxd


def _error(body: bytes) -> dict:
    doc = json.loads(body)
    assert set(doc) == {"code", "message"}, doc
    assert isinstance(doc["message"], str) and doc["message"], doc
    return doc


def test_rest_put_with_percent_2f_single_segment_path(sandboxd: Sandboxd):
    # The Python SDK sends the whole relative path as one segment: a%2Fb%2Fc.txt
    status, _, body = sandboxd.rest(
        "PUT", "/v1/files/raw%2Fnested%2Fc.txt", b"one segment",
        {"Content-Type": "application/octet-stream"},
    )
    assert status == 204, body
    assert (sandboxd.root / "raw" / "nested" / "c.txt").read_bytes() == b"one segment"
    assert not list(sandboxd.root.glob("*%2F*")), "the %2F form must not create a literal file name"

    # Both spellings read it back: %2F and literal "/" separators (curl, Go SDK).
    for path in ("/v1/files/raw%2Fnested%2Fc.txt", "/v1/files/raw/nested/c.txt", "/v1/files/raw/nested%2Fc.txt"):
        status, headers, body = sandboxd.rest("GET", path)
        assert (status, body) == (200, b"one segment"), path
        assert headers["content-type"] == "application/octet-stream", path


def test_rest_percent_encoded_space_and_percent(sandboxd: Sandboxd):
    status, _, _ = sandboxd.rest("PUT", "/v1/files/sp%20ace%2F100%25.txt", b"x")
    assert status == 204
    assert (sandboxd.root / "sp ace" / "100%.txt").read_bytes() == b"x"


def test_rest_error_body_shape_not_found(sandboxd: Sandboxd):
    status, headers, body = sandboxd.rest("GET", "/v1/files/does%2Fnot%2Fexist.txt")
    assert status == 404
    assert headers["content-type"].startswith("application/json")
    assert _error(body)["code"] == "NOT_FOUND"


def test_rest_error_body_shape_traversal_is_permission_denied(sandboxd: Sandboxd):
    (sandboxd.outside / "secret.txt").write_bytes(b"outside")
    for method, path in (
        ("GET", "/v1/files/..%2Fsecret.txt"),
        ("PUT", "/v1/files/..%2Fescape.txt"),
        ("DELETE", "/v1/files/..%2Fsecret.txt"),
    ):
        status, _, body = sandboxd.rest(method, path, b"nope" if method == "PUT" else None)
        assert status == 403, (method, path, status, body)
        assert _error(body)["code"] == "PERMISSION_DENIED", (method, path)
    assert not (sandboxd.outside / "escape.txt").exists()
    assert (sandboxd.outside / "secret.txt").read_bytes() == b"outside"


def test_rest_error_body_shape_invalid_mode(sandboxd: Sandboxd):
    status, _, body = sandboxd.rest("PUT", "/v1/files/m.txt?mode=999", b"x")
    assert status == 400
    assert _error(body)["code"] == "INVALID_ARGUMENT"
    assert not (sandboxd.root / "m.txt").exists()


def test_rest_error_body_shape_conflict_on_non_empty_dir(sandboxd: Sandboxd):
    (sandboxd.root / "full").mkdir()
    (sandboxd.root / "full" / "f").write_bytes(b"1")
    status, _, body = sandboxd.rest("DELETE", "/v1/files/full")
    assert status == 409
    assert _error(body)["code"] == "CONFLICT"
    assert (sandboxd.root / "full" / "f").exists()


def test_rest_head_404_and_200(sandboxd: Sandboxd):
    status, _, body = sandboxd.rest("HEAD", "/v1/files/nope%2Fmissing.txt")
    assert (status, body) == (404, b"")

    (sandboxd.root / "h.bin").write_bytes(b"12345")
    status, headers, body = sandboxd.rest("HEAD", "/v1/files/h.bin")
    assert (status, body) == (200, b"")
    assert headers["content-length"] == "5"


def test_rest_directory_listing_shape(sandboxd: Sandboxd):
    (sandboxd.root / "ls" / "sub").mkdir(parents=True)
    (sandboxd.root / "ls" / "f.txt").write_bytes(b"abc")
    status, headers, body = sandboxd.rest("GET", "/v1/files/ls")
    assert status == 200
    assert headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["path"] == "/ls"
    entries = {e["name"]: e for e in doc["entries"]}
    assert set(entries) == {"f.txt", "sub"}
    assert set(entries["f.txt"]) == {"name", "size", "type", "modified_at", "mode"}
    assert (entries["f.txt"]["type"], entries["f.txt"]["size"]) == ("file", 3)
    assert entries["sub"]["type"] == "directory"
    assert entries["f.txt"]["modified_at"].endswith("Z")


def test_rest_health(sandboxd: Sandboxd):
    status, headers, body = sandboxd.rest("GET", "/v1/health")
    assert status == 200
    doc = json.loads(body)
    assert doc["status"] == "ok"
    assert isinstance(doc["uptime_seconds"], int) and doc["uptime_seconds"] >= 0


def test_legacy_root_status(sandboxd: Sandboxd):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", sandboxd.legacy_port, timeout=10)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.status == 200
        assert json.loads(resp.read()) == {"status": "ok", "message": "Sandbox Runtime is active."}
    finally:
        conn.close()
