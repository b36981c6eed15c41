"""The code-interpreter image (issue #33) in a test's hub: the layout that
scripts/test-deps.sh builds ($SANDHUB_CODE_INTERPRETER_IMAGE), installed by
dev/code-interpreter/build-image.py's own ``install()``, so the tests run the
steps the docs give users."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from .env import REPO_ROOT, need

#: The template the script sets, which the E2B code-interpreter SDKs create by default.
TEMPLATE = "code-interpreter-v1"


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_build_image", REPO_ROOT / "dev/code-interpreter/build-image.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_interpreter_layout() -> Path:
    """The built layout; a missing one skips locally and fails under CI=true."""
    layout = Path(os.environ.get("SANDHUB_CODE_INTERPRETER_IMAGE", "/nonexistent"))
    need(
        (layout / "index.json").is_file(),
        "SANDHUB_CODE_INTERPRETER_IMAGE is not a built layout (scripts/test-deps.sh builds it)",
    )
    return layout


def install_code_interpreter(hub_url: str, api_key: str | None = None) -> str:
    """Imports the image into the hub at ``hub_url`` and puts the template,
    through the script's ``--install`` path; returns the template's name."""
    layout = code_interpreter_layout()
    env = {"SANDHUB_URL": hub_url, "SANDHUB_API_KEY": api_key or ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _builder().install(layout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return TEMPLATE
