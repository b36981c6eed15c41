"""`sandbox.code` of the sandhub SDK (issue #33), blocking and asyncio, against a real hub whose
`code-interpreter-v1` template was set by dev/code-interpreter/build-image.py's install path: the
kernels run in the sandbox, driven by its sandboxd.

Needs the image's layout ($SANDHUB_CODE_INTERPRETER_IMAGE, which scripts/test.sh exports): a
missing one skips locally and fails under CI=true.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Iterator

import pytest
import sandhub
from sandhub_testing.code import install_code_interpreter
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def template(hub_url: str) -> str:  # noqa: F811
    return install_code_interpreter(hub_url)


@pytest.fixture(scope="module")
def sb(hub_url: str, template: str) -> Iterator[sandhub.Sandbox]:  # noqa: F811
    with sandhub.Hub(hub_url) as hub, hub.create(template=template) as sandbox:
        yield sandbox


def test_state_streams_rich_results_and_errors(sb: sandhub.Sandbox) -> None:
    sb.code.run("x = 21")
    answer = sb.code.run("x * 2")
    assert answer.text == "42" and answer.error is None and answer.execution_count >= 2

    printed: list[str] = []
    hello = sb.code.run("import sys\nprint('hello')\nprint('oops', file=sys.stderr)", on_stdout=printed.append)
    assert printed == ["hello\n"] and hello.logs.stdout == ["hello\n"] and hello.logs.stderr == ["oops\n"]
    assert hello.text is None and hello.results == []

    errors: list[sandhub.ExecutionError] = []
    failed = sb.code.run("1/0", on_error=errors.append)
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.error.traceback and errors == [failed.error]

    seen: list[sandhub.CodeResult] = []
    plot = sb.code.run(
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()",
        on_result=seen.append,
    )
    png = next(r.png for r in plot.results if r.png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (300, 200)
    assert seen == plot.results and "png" in seen[0].formats()

    table = sb.code.run("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert table.results[0].is_main_result and "<table" in (table.results[0].html or "")

    assert sb.code.run("import os\nos.environ.get('ONLY_NOW')", env={"ONLY_NOW": "yes"}).text == "'yes'"
    assert sb.code.run("'ONLY_NOW' in os.environ").text == "False"


def test_a_timeout_interrupts_the_cell_and_keeps_the_context(sb: sandhub.Sandbox) -> None:
    ctx = sb.code.contexts.create()
    sb.code.run("kept = 7", context=ctx)
    started = time.monotonic()
    spin = sb.code.run("while True: pass", context=ctx, timeout=1)
    assert spin.error is not None and spin.error.name == "TimeoutError"
    assert time.monotonic() - started < 30
    assert sb.code.run("kept", context=ctx).text == "7"


def test_contexts_keep_their_own_variables(sb: sandhub.Sandbox) -> None:
    a = sb.code.contexts.create(language="python")
    b = sb.code.contexts.create(env={"WHO": "b"})
    assert a.language == "python" and a.state == "idle" and a.id != b.id
    sb.code.run("v = 'a'", context=a)
    sb.code.run("v = 'b'", context=b.id)
    assert sb.code.run("v", context=a).text == "'a'"
    assert sb.code.run("v", context=b).text == "'b'"
    assert sb.code.run("import os\nos.environ['WHO']", context=b).text == "'b'"
    assert {c.id for c in sb.code.contexts.list()} >= {a.id, b.id}

    restarted = sb.code.contexts.restart(a)
    assert restarted.id == a.id
    assert sb.code.run("'v' in globals()", context=a).text == "False"
    sb.code.contexts.delete(b)
    assert b.id not in {c.id for c in sb.code.contexts.list()}
    with pytest.raises(sandhub.NotFoundError):
        sb.code.run("1", context=b)
    with pytest.raises(sandhub.InvalidArgumentError):
        sb.code.run("1", language="cobol")


def test_a_bash_kernel_keeps_its_shell(sb: sandhub.Sandbox) -> None:
    shell = sb.code.contexts.create(language="bash")
    assert shell.language == "bash"
    sb.code.run("cd /tmp && export GREETING=hi", context=shell)
    out = sb.code.run('echo "$GREETING from $(pwd)"', context=shell)
    assert out.error is None and "".join(out.logs.stdout) == "hi from /tmp\n", out
    # The default bash context is another kernel: none of the above is set there.
    assert "".join(sb.code.run('echo "[$GREETING]"', language="bash").logs.stdout) == "[]\n"
    failed = sb.code.run("false", context=shell)
    assert failed.error is not None, failed
    spin = sb.code.run("sleep 600", context=shell, timeout=1)
    assert spin.error is not None and spin.error.name == "TimeoutError"
    assert "".join(sb.code.run("echo still $GREETING", context=shell).logs.stdout) == "still hi\n"


def test_async_executions_in_two_contexts_run_in_parallel(hub_url: str, template: str) -> None:  # noqa: F811
    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as hub, await hub.create(template=template) as sb:
            a, b = await asyncio.gather(sb.code.contexts.create(), sb.code.contexts.create())
            await asyncio.gather(sb.code.run("import time", context=a), sb.code.run("import time", context=b))
            started = time.monotonic()
            both = await asyncio.gather(
                sb.code.run("time.sleep(2); 'a'", context=a), sb.code.run("time.sleep(2); 'b'", context=b)
            )
            elapsed = time.monotonic() - started
            assert [e.text for e in both] == ["'a'", "'b'"]
            # Serial would take 4 s or more; one context's kernel never waits for the other's.
            assert elapsed < 3.5, elapsed
            streamed: list[str] = []
            out = await sb.code.run("for i in range(3): print(i)", context=a, on_stdout=streamed.append)
            assert "".join(streamed) == "".join(out.logs.stdout) == "0\n1\n2\n"

    asyncio.run(main())
