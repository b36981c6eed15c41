"""E2B's JavaScript code-interpreter SDK (`@e2b/code-interpreter`, unmodified, pinned in
tests/e2b_js/package-lock.json) against `sandhub serve --e2b` on the machine's Node 20: the
same list as the Python SDK's (tests/e2b_js/code-interpreter.test.mjs), run by `node --test`.

Needs node and npm (scripts/test-deps.sh installs them) and the code-interpreter image's layout:
missing either skips locally and fails under CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sandhub_testing import REPO_ROOT, Hub
from sandhub_testing.e2b import ANY_KEY
from sandhub_testing.node import installed_modules, node_and_npm

PROJECT = REPO_ROOT / "tests" / "e2b_js"


def test_the_js_code_interpreter_sdk_runs_unmodified(code_hub: Hub, tmp_path: Path) -> None:
    node, npm = node_and_npm((20, 0))
    modules = installed_modules(npm, PROJECT, "e2b-js")
    # ESM resolves packages from the importing file's directories only (no NODE_PATH): the
    # test runs from a directory that holds it beside the cached node_modules.
    shutil.copy(PROJECT / "package.json", tmp_path / "package.json")
    shutil.copy(PROJECT / "code-interpreter.test.mjs", tmp_path / "code-interpreter.test.mjs")
    (tmp_path / "node_modules").symlink_to(modules)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(SANDHUB_E2B_URL=code_hub.url, SANDHUB_E2B_KEY=ANY_KEY)
    run = subprocess.run(
        [node, "--test", "--test-reporter=tap", "code-interpreter.test.mjs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(run.stdout[-20000:], run.stderr[-5000:])
    assert run.returncode == 0, f"node --test failed:\n{run.stdout[-8000:]}\n{run.stderr[-4000:]}"
    assert "# fail 0" in run.stdout and "# pass 4" in run.stdout, run.stdout[-2000:]
