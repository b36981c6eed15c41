"""E2B's code-interpreter SDK (`e2b_code_interpreter`, unmodified) against `sandhub serve --e2b`:
the `code-interpreter-v1` template set by dev/code-interpreter/build-image.py's `--install`, its
kernels run by the sandbox's sandboxd (issue #33) and spoken to on `E2b-Sandbox-Port: 49999`.

Needs the image's layout ($SANDHUB_CODE_INTERPRETER_IMAGE, which scripts/test.sh exports): a
missing one skips locally and fails under CI=true.
"""

from __future__ import annotations

import base64
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from e2b_code_interpreter import Sandbox, TimeoutException
from sandhub_testing import Hub
from sandhub_testing.e2b import Conn


@pytest.fixture
def sbx(code_hub: Hub, conn: Conn) -> Iterator[Sandbox]:
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

    # E2B's language names: bash runs in a bash kernel.
    assert sbx.run_code("echo $((6 * 7))", language="bash").logs.stdout == ["42\n"]


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


def test_a_client_timeout_interrupts_the_cell_and_the_context_goes_on(sbx: Sandbox) -> None:
    sbx.run_code("kept = 7")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("while True: pass", timeout=1)
    assert time.monotonic() - started < 30
    # The hub saw the client go and interrupted the kernel: the next cell runs at once.
    assert sbx.run_code("kept", timeout=20).text == "7"


def test_executions_in_two_contexts_run_in_parallel(sbx: Sandbox) -> None:
    a, b = sbx.create_code_context(), sbx.create_code_context()
    for ctx in (a, b):
        sbx.run_code("import time", context=ctx)
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda arg: sbx.run_code(f"time.sleep(2); {arg[1]!r}", context=arg[0]), [(a, "a"), (b, "b")]))
    elapsed = time.monotonic() - started
    assert [e.text for e in both] == ["'a'", "'b'"]
    # One after the other would take 4 s or more.
    assert elapsed < 3.5, elapsed
