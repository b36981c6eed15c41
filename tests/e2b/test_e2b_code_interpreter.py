"""E2B's code-interpreter SDK (`e2b_code_interpreter`, unmodified) against `sandhub serve --e2b`:
the `code-interpreter-v1` template set by dev/code-interpreter/build-image.py's `--install`, its
kernels run by the sandbox's sandboxd (issue #33) and spoken to on `E2b-Sandbox-Port: 49999`.

Needs the image's layout ($SANDHUB_CODE_INTERPRETER_IMAGE, which scripts/test.sh exports): a
missing one skips locally and fails under CI=true.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import struct
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest
from e2b_code_interpreter import Sandbox
from sandhub_testing import Hub
from sandhub_testing.e2b import ANY_KEY, Conn

REPO = Path(__file__).resolve().parents[2]


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_build_image", REPO / "dev/code-interpreter/build-image.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def installed(e2b_hub: Hub, conn: Conn) -> Hub:
    """The hub with the image imported and code-interpreter-v1 set, by the script's --install."""
    layout = os.environ.get("SANDHUB_CODE_INTERPRETER_IMAGE", "")
    if not (Path(layout) / "index.json").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs SANDHUB_CODE_INTERPRETER_IMAGE (scripts/test-deps.sh builds it)")
        pytest.skip("SANDHUB_CODE_INTERPRETER_IMAGE is not a built layout")
    env = {"SANDHUB_URL": e2b_hub.url, "SANDHUB_API_KEY": ANY_KEY}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _builder().install(Path(layout))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return e2b_hub


@pytest.fixture
def sbx(installed: Hub, conn: Conn) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(**conn)  # the SDK's default template: code-interpreter-v1
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_state_output_results_and_errors(sbx: Sandbox) -> None:
    sbx.run_code("x = 21")
    assert sbx.run_code("x * 2").text == "42"

    seen: list[str] = []
    execution = sbx.run_code("print('hello')", on_stdout=lambda m: seen.append(m.line))
    assert execution.logs.stdout == ["hello\n"] and seen == ["hello\n"]

    failed = sbx.run_code("1/0")
    assert failed.error is not None
    assert failed.error.name == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.error.traceback

    plot = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()"
    )
    png = base64.b64decode(next(r.png for r in plot.results if r.png))
    assert struct.unpack(">II", png[16:24]) == (300, 200)

    table = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert table.results[0].html and "<table" in table.results[0].html


def test_contexts_keep_their_own_variables(sbx: Sandbox) -> None:
    a = sbx.create_code_context()
    b = sbx.create_code_context()
    sbx.run_code("v = 'a'", context=a)
    sbx.run_code("v = 'b'", context=b)
    assert sbx.run_code("v", context=a).text == "'a'"
    assert sbx.run_code("v", context=b).text == "'b'"
    assert {c.id for c in sbx.list_code_contexts()} >= {a.id, b.id}
    sbx.restart_code_context(a)
    assert sbx.run_code("'v' in globals()", context=a).text == "False"
    sbx.remove_code_context(b)
    assert b.id not in {c.id for c in sbx.list_code_contexts()}
