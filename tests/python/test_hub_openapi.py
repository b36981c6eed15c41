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

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
from sandhub_testing import Hub, running_hub

# The whole schemathesis run; the test adds a margin for start and teardown.
FUZZ_BUDGET_S = int(os.environ.get("SANDHUB_FUZZ_SECONDS", "120"))

EXCLUDED_PATHS = [
    "/v1/sandboxes/{id}/pty",  # WebSocket
    "/v1/sandboxes/{id}/watch",  # Server-Sent Events, endless
    "/v1/events",  # Server-Sent Events, endless (hub/tests/events.rs)
    # A generated URL names some host on the internet, which the hub would
    # resolve (hub/tests/events.rs checks its fields and addresses).
    "/v1/webhooks/{name}",
    "/v1/sandboxes/{id}/processes",  # NDJSON stream
    # A proxy: its answers are the sandbox server's, and nothing listening
    # is UNAVAILABLE (503) by contract (hub/tests/ports.rs checks both).
    "/v1/sandboxes/{id}/ports/{port}/{path}",
    "/v1/sandboxes/{id}/port-forward/{port}",  # Upgrade to raw TCP
    # Registry pulls: a generated reference names some registry on the
    # internet (hub/tests/image_pull.rs runs them against a real one).
    "/v1/images/pull",
    "/v1/images/prepull",
    # A tar body (application/x-tar), which schemathesis cannot generate;
    # hub/tests/images.rs imports real and hostile archives.
    "/v1/images/import",
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


@pytest.fixture(scope="module")
def hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A real `sandhub serve` (no API keys) with its own state dir.

    Sandboxes outlive their hub by design: teardown deletes them through the
    API, stops the hub, then kills whatever still has this hub's directory
    mounted (sandhub_testing.stop_hub).
    """
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("openapi"), "--reap-interval", "500ms") as hub:
        yield hub


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
        "/v1/volumes": {"get", "post"},
        "/v1/volumes/{name}": {"get", "delete"},
        "/v1/volumes/{name}/files/{path}": {"get", "head", "put", "delete"},
        "/v1/volumes/{name}/snapshots": {"get", "post"},
        "/v1/volumes/{name}/snapshots/{snapshot}": {"delete"},
        "/v1/sandboxes/{id}/suspend": {"post"},
        "/v1/sandboxes/{id}/pause": {"post"},
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
