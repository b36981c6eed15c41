"""The hub's OpenAPI document, checked against the real `sandhub serve`.

The document must be valid OpenAPI 3.1 (`openapi-spec-validator`), and
`schemathesis` runs against the live hub with it: generated requests, in
every phase (examples, coverage, fuzzing, stateful), must never get a 5xx,
and every answer must match what the document promises (status codes,
content types, headers, bodies).

Left out of the fuzzing: the streams that do not fit a request/response
fuzzer (the PTY WebSocket, the SSE watch, the NDJSON process stream), and
`PUT /v1/pools/{name}`, which would start up to 1000 warm sandboxes per
generated request. A hook keeps generated templates off real host
directories: `seed_dir: "/"` would copy the host into the state dir.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

# Not imported from conftest: test.sh runs several suites in one pytest, and
# `import conftest` then names whichever suite's conftest came last.
LOOPBACK = "127.0.0.1"
STARTUP_TIMEOUT_S = 30.0
# The whole schemathesis run; the test adds a margin for start and teardown.
FUZZ_BUDGET_S = int(os.environ.get("SANDHUB_FUZZ_SECONDS", "120"))

EXCLUDED_PATHS = [
    "/v1/sandboxes/{id}/pty",  # WebSocket
    "/v1/sandboxes/{id}/watch",  # Server-Sent Events, endless
    "/v1/sandboxes/{id}/processes",  # NDJSON stream
]

# Loaded by schemathesis (SCHEMATHESIS_HOOKS): a generated template that
# names an existing host directory gets a small seed instead (and no root_fs),
# so the fuzzer never seeds a workspace with, say, a copy of `/`.
HOOKS = '''
import os

import schemathesis

SAFE_SEED = os.environ["SANDHUB_FUZZ_SEED_DIR"]


def _is_host_dir(value):
    try:
        return isinstance(value, str) and os.path.isabs(value) and os.path.isdir(value)
    except (ValueError, OSError):
        return False


@schemathesis.hook
def map_case(context, case):
    body = case.body
    if isinstance(body, dict):
        if _is_host_dir(body.get("root_fs")):
            del body["root_fs"]
        if _is_host_dir(body.get("seed_dir")):
            body["seed_dir"] = SAFE_SEED
    return case
'''

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
]


class Hub:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, base: Path, log_path: Path):
        self.proc = proc
        self.port = port
        self.base = base
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=60)
        try:
            headers = {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])


def _healthy(port: int) -> bool:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=1)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _pids_with_mount(needle: str) -> list[int]:
    """Host processes whose mount table names `needle` (every process of a
    local sandbox has its state dir mounted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "mountinfo").read_text(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _delete_everything(hub: Hub) -> None:
    try:
        status, body = hub.request("GET", "/v1/pools")
        if status == 200:
            for pool in json.loads(body)["pools"]:
                hub.request("DELETE", f"/v1/pools/{pool['name']}")
        status, body = hub.request("GET", "/v1/sandboxes")
        if status == 200:
            for sandbox in json.loads(body)["sandboxes"]:
                hub.request("DELETE", f"/v1/sandboxes/{sandbox['id']}")
    except (OSError, http.client.HTTPException, ValueError) as e:
        print(f"cleanup through the API failed: {e}")


@pytest.fixture(scope="module")
def hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A real `sandhub serve` (no API keys) with its own state dir.

    Sandboxes outlive their hub by design: teardown deletes them through the
    API, stops the hub, then kills whatever still has this hub's directory
    mounted.
    """
    # A unique directory name marks every process of this hub.
    base = tmp_path_factory.mktemp(f"sandhub-openapi-{uuid.uuid4().hex[:8]}")
    log_path = base / "hub.log"
    proc = None
    for _ in range(3):  # the chosen port may be taken between pick and bind
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        argv = [
            str(sandhub_bin), "serve",
            "--listen", f"{LOOPBACK}:{port}",
            "--state-dir", str(base / "state"),
            "--reap-interval", "500ms",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHUB_")}
        env.setdefault("NO_COLOR", "1")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=base
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None and not _healthy(port):
            time.sleep(0.05)
        if proc.poll() is None and _healthy(port):
            break
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc = None
    if proc is None:
        pytest.fail(f"sandhub serve did not start:\n{log_path.read_text(errors='replace')}", pytrace=False)
    hub = Hub(proc, port, base, log_path)
    try:
        yield hub
    finally:
        _delete_everything(hub)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 20
        while (left := _pids_with_mount(base.name)) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        print(f"--- sandhub serve log tail ---\n{hub.log_tail()}")


@pytest.fixture(scope="module")
def openapi_doc(hub: Hub) -> dict:
    status, body = hub.request("GET", "/openapi.json")
    assert status == 200, body
    return json.loads(body)


def test_openapi_document_is_valid_openapi_3_1(openapi_doc: dict) -> None:
    assert openapi_doc["openapi"].startswith("3.1."), openapi_doc["openapi"]
    try:
        validate(openapi_doc)  # picks the 3.1 validator from the `openapi` field
    except OpenAPIValidationError as e:
        pytest.fail(f"/openapi.json is not valid OpenAPI 3.1: {e}", pytrace=False)


def test_openapi_document_names_the_pinned_routes(openapi_doc: dict) -> None:
    paths = openapi_doc["paths"]
    for path, methods in {
        "/v1/sandboxes": {"get", "post"},
        "/v1/sandboxes/{id}": {"get", "delete"},
        "/v1/sandboxes/{id}/exec": {"post"},
        "/v1/sandboxes/{id}/files/{path}": {"get", "head", "put", "delete"},
        "/v1/templates/{name}": {"get", "put", "delete"},
        "/v1/pools/{name}": {"get", "put", "delete"},
        "/v1/sandboxes/{id}/suspend": {"post"},
        "/v1/sandboxes/{id}/resume": {"post"},
        "/v1/sandboxes/{id}/snapshots": {"post"},
        "/v1/sandboxes/{id}/reset": {"post"},
        "/v1/sandboxes/{id}/fork": {"post"},
        "/healthz": {"get"},
        "/readyz": {"get"},
        "/metrics": {"get"},
    }.items():
        assert path in paths, f"{path} missing from /openapi.json"
        assert methods <= set(paths[path]), f"{path}: {sorted(paths[path])}, want {sorted(methods)}"


def test_schemathesis_finds_no_server_errors_and_no_schema_violations(hub: Hub, tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{hub.url}/openapi.json",
        "--checks", ",".join(CHECKS),
        "--max-examples", os.environ.get("SANDHUB_FUZZ_EXAMPLES", "20"),
        "--max-time", str(FUZZ_BUDGET_S),
        "--request-timeout", "60",
        "--workers", "1",
        "--generation-database", "none",
        "--no-color",
        "--report", "junit",
        "--report-junit-path", str(tmp_path / "schemathesis-junit.xml"),
    ]
    for path in EXCLUDED_PATHS:
        argv += ["--exclude-path", path]
    # PUT only: GET and DELETE of pools stay in.
    argv += ["--exclude-operation-id", "put_pool"]
    if seed := os.environ.get("SANDHUB_FUZZ_SEED"):
        argv += ["--seed", seed]
    hooks = tmp_path / "sandhub_fuzz_hooks.py"
    hooks.write_text(HOOKS)
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "seed.txt").write_text("fuzz seed\n")
    env = dict(os.environ, SCHEMATHESIS_HOOKS=str(hooks), SANDHUB_FUZZ_SEED_DIR=str(seed))
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FUZZ_BUDGET_S + 120
    )
    output = result.stdout + result.stderr
    print(output)  # shown by pytest for a failing test
    assert result.returncode == 0, (
        f"schemathesis found problems (exit {result.returncode}):\n{output[-20000:]}\n"
        f"--- sandhub serve log tail ---\n{hub.log_tail()}"
    )
    # The hub is still healthy after the run.
    status, _ = hub.request("GET", "/healthz")
    assert status == 200
