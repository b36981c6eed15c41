"""Where the tests run: CI or a developer's machine, and which checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def in_ci() -> bool:
    """CI=true (or 1, yes): nothing the suites need may be missing."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need(condition: bool, message: str) -> None:
    """Skip locally, fail under CI, when something a test needs is missing
    (a binary, a tool, the test cluster): CI must never pass by skipping."""
    if not condition:
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _find_repo_root() -> Path:
    # The package is installed editable from tests/support, so its own path
    # names the checkout; the working directory is the fallback for a copy
    # installed some other way (run the tests from inside the checkout then).
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for candidate in (start, *start.parents):
            if (candidate / "Cargo.toml").is_file() and (candidate / "tests" / "support").is_dir():
                return candidate
    return Path.cwd().resolve()


REPO_ROOT = _find_repo_root()
