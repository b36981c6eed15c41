"""Bad input on the E2B routes, sent raw (httpx), as no SDK would send it.

- The control plane answers an unknown sandbox with 404 in E2B's error shape
  `{"code": 404, "message": ...}`.
- envd answers a call without the sandbox's own access token (another
  sandbox's, a garbage one, none) with 401 `{"code": 401, ...}` and nothing
  of the sandbox's.
- A malformed Connect request is the caller's mistake, in Connect's words: a
  server-stream call (`process.Process/Start`, `application/connect+json`)
  answers 200 with one end-of-stream frame (flags 0x02) carrying
  `{"error": {"code": "invalid_argument", ...}}`; a unary call
  (`application/json`) answers 400 `{"code": "invalid_argument", ...}`; an
  unknown method `unimplemented`; a body over the 1 MiB message limit an
  error, at once.
- Afterwards the hub still serves (nothing crashed, nothing leaked).

The sandboxes (and their tokens) are real: `Sandbox.create` through the SDK.
"""

from __future__ import annotations

import json
import struct
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox
from sandhub_testing import Hub
from sandhub_testing.e2b import ANY_KEY, WORKSPACE, Conn, access_token, conn_for, envd_request

#: A sandbox id no hub has.
UNKNOWN_ID = "sb-nope"
#: The Connect envelope flags (connectrpc.com/docs/protocol: streaming requests and responses).
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
#: The largest request message envd calls take (hub/src/http/e2b/connect.rs MAX_MESSAGE).
MAX_MESSAGE = 1 << 20
#: What the victim sandbox holds, which no refused call may show.
SECRET_FILE = f"{WORKSPACE}/bad-input-secret.txt"
SECRET = "the victim's secret"
#: A refused or malformed call answers at once: well under this (seconds).
PROMPT_S = 20.0

STREAM_HEADERS = {"connect-protocol-version": "1", "connect-timeout-ms": "10000"}
STREAM_CT = "application/connect+json"


def envelope(payload: bytes, flags: int = 0, length: int | None = None) -> bytes:
    """One Connect envelope: flags byte, 4-byte big-endian length, payload."""
    return bytes([flags]) + struct.pack(">I", len(payload) if length is None else length) + payload


def frames(body: bytes) -> list[tuple[int, bytes]]:
    """A Connect stream's envelopes, (flags, payload); fails on a cut one."""
    out = []
    while body:
        assert len(body) >= 5, f"a cut envelope header: {body!r}"
        flags, length = body[0], struct.unpack(">I", body[1:5])[0]
        assert len(body) >= 5 + length, f"a cut envelope: {body!r}"
        out.append((flags, body[5 : 5 + length]))
        body = body[5 + length :]
    return out


def assert_e2b_error(response: httpx.Response, status: int) -> dict:
    """E2B's REST error: that HTTP status and `{"code": status, "message": str}`, nothing else."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"code", "message"}, body
    assert body["code"] == status, body
    assert isinstance(body["message"], str) and body["message"], body
    return body


def assert_unary_error(response: httpx.Response, status: int, code: str) -> dict:
    """A unary Connect error: that HTTP status and `{"code": code, "message": str}`."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert body.get("code") == code, body
    assert isinstance(body.get("message"), str) and body["message"], body
    assert set(body) <= {"code", "message", "details"}, body
    return body


def assert_stream_error(response: httpx.Response, code: str) -> dict:
    """A server stream that failed before its first message: HTTP 200 and a
    single end-of-stream frame whose JSON is `{"error": {"code": code, ...}}`."""
    assert response.status_code == 200, (response.status_code, response.content)
    assert response.headers["content-type"].startswith(STREAM_CT), response.headers
    got = frames(response.content)
    assert len(got) == 1, f"expected only the end-of-stream frame: {got}"
    flags, payload = got[0]
    assert flags == FLAG_END_STREAM, got
    trailer = json.loads(payload)
    error = trailer.get("error")
    assert isinstance(error, dict) and error.get("code") == code, trailer
    assert isinstance(error.get("message"), str) and error["message"], trailer
    return error


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def module_conn(e2b_hub: Hub) -> Conn:
    return conn_for(e2b_hub.url, ANY_KEY)


@pytest.fixture(scope="module")
def pair(module_conn: Conn) -> Iterator[tuple[Sandbox, Sandbox]]:
    """Two sandboxes of one tenant: the victim (holding SECRET_FILE and a
    running process) and another, whose token must not open the victim."""
    made: list[Sandbox] = []
    try:
        for _ in range(2):
            made.append(Sandbox.create(template="base", timeout=300, **module_conn))
        victim, other = made
        victim.files.write(SECRET_FILE, SECRET)
        victim.commands.run("sleep 300", background=True)
        yield victim, other
    finally:
        for sbx in made:
            try:
                Sandbox.kill(sbx.sandbox_id, **module_conn)
            except Exception as e:  # noqa: BLE001 - teardown must not mask the test's result
                print(f"teardown: killing {sbx.sandbox_id} failed: {e!r}")


@pytest.fixture(scope="module")
def victim(pair: tuple[Sandbox, Sandbox]) -> Sandbox:
    return pair[0]


@pytest.fixture(scope="module")
def token(victim: Sandbox) -> str:
    return access_token(victim)


def call(hub: Hub, sbx: Sandbox, token: str | None, method: str, path: str, **kwargs: object) -> httpx.Response:
    kwargs.setdefault("timeout", PROMPT_S)
    return envd_request(hub.url, sbx.sandbox_id, token, method, path, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- control plane


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", f"/sandboxes/{UNKNOWN_ID}", None),
        ("DELETE", f"/sandboxes/{UNKNOWN_ID}", None),
        ("POST", f"/sandboxes/{UNKNOWN_ID}/timeout", {"timeout": 60}),
        ("POST", f"/v2/sandboxes/{UNKNOWN_ID}/connect", {"timeout": 60}),
        ("POST", f"/sandboxes/{UNKNOWN_ID}/connect", {"timeout": 60}),
        ("POST", f"/sandboxes/{UNKNOWN_ID}/pause", {}),
        ("GET", f"/sandboxes/{UNKNOWN_ID}/metrics", None),
    ],
)
def test_an_unknown_sandbox_is_a_404_in_e2bs_shape(e2b_hub: Hub, method: str, path: str, body: object) -> None:
    response = httpx.request(
        method, f"{e2b_hub.url}{path}", headers={"x-api-key": ANY_KEY}, json=body, timeout=PROMPT_S
    )
    assert_e2b_error(response, 404)


# --------------------------------------------------------------------------- envd tokens


@pytest.mark.parametrize("whose", ["another sandbox's", "garbage", "empty", "none"])
def test_envd_without_the_sandboxes_own_token_is_a_401_and_no_data(
    e2b_hub: Hub, pair: tuple[Sandbox, Sandbox], token: str, whose: str
) -> None:
    victim, other = pair
    wrong = {
        "another sandbox's": access_token(other),
        "garbage": "garbage-" + token[::-1],
        "empty": "",
        "none": None,
    }[whose]
    assert wrong != token

    # The victim's own token opens each of these (so the refusals below are about the token).
    assert call(e2b_hub, victim, token, "GET", "/health").status_code == 204
    assert call(e2b_hub, victim, token, "GET", "/files", params={"path": SECRET_FILE}).text == SECRET
    assert call(e2b_hub, victim, token, "POST", "/process.Process/List", json_body={}).json()["processes"]
    stat = call(e2b_hub, victim, token, "POST", "/filesystem.Filesystem/Stat", json_body={"path": SECRET_FILE})
    assert stat.json()["entry"]["path"] == SECRET_FILE

    for method, path, kwargs in [
        ("POST", "/process.Process/List", {"json_body": {}}),
        ("POST", "/filesystem.Filesystem/Stat", {"json_body": {"path": SECRET_FILE}}),
        ("GET", "/files", {"params": {"path": SECRET_FILE}}),
        ("GET", "/files", {"params": {"path": "x"}}),
        ("GET", "/health", {}),
    ]:
        response = call(e2b_hub, victim, wrong, method, path, **kwargs)
        assert_e2b_error(response, 401)
        assert SECRET.encode() not in response.content
        assert b"bad-input-secret" not in response.content
        assert b"sleep" not in response.content


# --------------------------------------------------------------------------- malformed Connect


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\x00", id="too-short"),
        pytest.param(envelope(b"{}", length=100), id="length-past-the-body"),
        pytest.param(envelope(b"{}", flags=FLAG_COMPRESSED), id="compressed-flag"),
        pytest.param(envelope(b"not json"), id="not-json"),
        pytest.param(envelope(b'{"process": 5}'), id="wrong-shape"),
        pytest.param(envelope(b'{"process": {"cmd": ""}}'), id="empty-cmd"),
    ],
)
def test_a_malformed_stream_request_ends_the_stream_with_invalid_argument(
    e2b_hub: Hub, victim: Sandbox, token: str, body: bytes
) -> None:
    response = call(
        e2b_hub,
        victim,
        token,
        "POST",
        "/process.Process/Start",
        content=body,
        content_type=STREAM_CT,
        headers=STREAM_HEADERS,
    )
    assert_stream_error(response, "invalid_argument")


def test_a_well_formed_stream_request_runs(e2b_hub: Hub, victim: Sandbox, token: str) -> None:
    """The same raw call, well formed: the frames above are about the body."""
    start = json.dumps({"process": {"cmd": "/bin/echo", "args": ["raw-start"]}, "stdin": False}).encode()
    response = call(
        e2b_hub,
        victim,
        token,
        "POST",
        "/process.Process/Start",
        content=envelope(start),
        content_type=STREAM_CT,
        headers=STREAM_HEADERS,
    )
    assert response.status_code == 200, response.content
    got = frames(response.content)
    events = [json.loads(p) for f, p in got if f == 0]
    assert "start" in events[0]["event"], events
    assert events[-1]["event"]["end"]["exitCode"] == 0, events
    assert got[-1] == (FLAG_END_STREAM, b"{}"), got


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(b'{"path": ', id="cut-json"),
        pytest.param(b'{"path": 5}', id="path-a-number"),
        pytest.param(b'{"path": ["a"]}', id="path-a-list"),
        pytest.param(b'"/workspace"', id="a-string"),
        pytest.param(b"null", id="null"),
    ],
)
def test_a_malformed_unary_request_is_a_400_invalid_argument(
    e2b_hub: Hub, victim: Sandbox, token: str, body: bytes
) -> None:
    response = call(
        e2b_hub,
        victim,
        token,
        "POST",
        "/filesystem.Filesystem/Stat",
        content=body,
        content_type="application/json",
        headers={"connect-protocol-version": "1"},
    )
    assert_unary_error(response, 400, "invalid_argument")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/filesystem.Filesystem/NoSuchMethod", {"path": WORKSPACE}),
        ("/process.Process/NoSuchMethod", {"process": {"pid": 1}}),
        pytest.param(
            "/process.Process/NoSuchMethod",
            {},
            id="process-unknown-no-selector",
        ),
    ],
)
def test_an_unknown_method_is_unimplemented(
    e2b_hub: Hub, victim: Sandbox, token: str, path: str, body: object
) -> None:
    response = call(e2b_hub, victim, token, "POST", path, json_body=body)
    assert_unary_error(response, 501, "unimplemented")


def test_an_unknown_service_is_not_found(e2b_hub: Hub, victim: Sandbox, token: str) -> None:
    """No such route at all: 404 (which Connect clients read as unimplemented)."""
    response = call(e2b_hub, victim, token, "POST", "/nosuch.Service/Call", json_body={})
    assert_e2b_error(response, 404)


def _oversized_message() -> bytes:
    return json.dumps({"path": "a" * MAX_MESSAGE}).encode()


@pytest.mark.parametrize(
    ("path", "content_type", "body"),
    [
        pytest.param("/filesystem.Filesystem/Stat", "application/json", _oversized_message(), id="unary"),
        pytest.param("/process.Process/Start", STREAM_CT, envelope(_oversized_message()), id="stream"),
        pytest.param(
            "/process.Process/Start",
            STREAM_CT,
            lambda: iter([envelope(b"", length=2 * MAX_MESSAGE)[:5]] + [b"a" * 65536] * 32),
            id="stream-chunked",
        ),
    ],
)
def test_a_message_over_the_limit_is_refused_at_once(
    e2b_hub: Hub, victim: Sandbox, token: str, path: str, content_type: str, body: object
) -> None:
    """Over 1 MiB: an error, not a hang (the call's timeout is PROMPT_S) nor
    a started process. Sent with a content-length, or chunked without one."""
    content = body() if callable(body) else body
    response = call(
        e2b_hub, victim, token, "POST", path, content=content, content_type=content_type, headers=STREAM_HEADERS
    )
    # A Connect `resource_exhausted`: in Start's end-of-stream frame, as a
    # 413 for a unary call.
    if content_type == STREAM_CT:
        assert_stream_error(response, "resource_exhausted")
    else:
        assert_unary_error(response, 413, "resource_exhausted")
    assert b'"start"' not in response.content


def test_malformed_calls_started_nothing(e2b_hub: Hub, victim: Sandbox, token: str) -> None:
    """Of the Start calls above only the well-formed one ran (and exited): the
    victim's only process is still its `sleep 300`."""
    listing = call(e2b_hub, victim, token, "POST", "/process.Process/List", json_body={})
    assert listing.status_code == 200, listing.text
    commands = [" ".join([p["config"]["cmd"], *p["config"].get("args", [])]) for p in listing.json()["processes"]]
    assert len(commands) == 1 and "sleep 300" in commands[0], commands


# --------------------------------------------------------------------------- bad values


#: `ListDir`'s deepest level (hub/src/http/e2b/filesystem.rs MAX_LIST_DEPTH):
#: envd walks as deep as asked; deeper asks list this deep.
MAX_LIST_DEPTH = 2048


@pytest.mark.parametrize("path", [WORKSPACE, "/etc/ssl"], ids=["workspace", "beyond-the-workspace"])
@pytest.mark.parametrize("depth", [0, MAX_LIST_DEPTH + 1, 2**31, 2**32 - 1])
def test_listdir_takes_any_depth_as_envd_does(
    e2b_hub: Hub, victim: Sandbox, token: str, path: str, depth: int
) -> None:
    """envd reads depth 0 as 1 and walks as deep as asked; so does the hub,
    up to MAX_LIST_DEPTH. Never a 500 (`find -maxdepth` refuses numbers past
    2^31-1) nor a hang (a loop over 2^32 levels)."""
    response = call(
        e2b_hub, victim, token, "POST", "/filesystem.Filesystem/ListDir", json_body={"path": path, "depth": depth}
    )
    assert response.status_code == 200, response.text
    entries = response.json().get("entries", [])
    assert entries, response.text
    if depth == 0:
        # Depth 1: only the directory's own entries.
        assert all(e["path"].count("/") == path.count("/") + 1 for e in entries), entries


@pytest.mark.parametrize("depth", [-1, 2**32, "deep"])
def test_a_depth_that_is_no_uint32_is_invalid_argument(e2b_hub: Hub, victim: Sandbox, token: str, depth: object) -> None:
    response = call(
        e2b_hub, victim, token, "POST", "/filesystem.Filesystem/ListDir", json_body={"path": WORKSPACE, "depth": depth}
    )
    assert_unary_error(response, 400, "invalid_argument")


def test_a_file_that_stats_but_cannot_be_read_is_an_error_answer(e2b_hub: Hub, victim: Sandbox, token: str) -> None:
    """`/proc/1/environ` passes `stat` and fails `cat` (Permission denied): a
    403 in E2B's error shape, not a 200 whose connection breaks off."""
    response = call(e2b_hub, victim, token, "GET", "/files", params={"path": "/proc/1/environ"})
    body = assert_e2b_error(response, 403)
    assert "/proc/1/environ" in body["message"], body


# --------------------------------------------------------------------------- and then


def test_the_hub_still_serves_after_all_that(e2b_hub: Hub, module_conn: Conn, victim: Sandbox) -> None:
    """Last in this module: the victim still works, and so does a new sandbox's whole life."""
    assert e2b_hub.proc.poll() is None, e2b_hub.log_tail()
    assert victim.commands.run("echo victim-fine").stdout == "victim-fine\n"
    assert victim.files.read(SECRET_FILE) == SECRET

    sbx = Sandbox.create(template="base", timeout=120, **module_conn)
    try:
        result = sbx.commands.run("echo still-serving; exit 0")
        assert (result.exit_code, result.stdout) == (0, "still-serving\n")
    finally:
        assert Sandbox.kill(sbx.sandbox_id, **module_conn) is True
    assert e2b_hub.proc.poll() is None, e2b_hub.log_tail()
