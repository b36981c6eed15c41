"""Sibling modules never import each other in a circle (docs/architecture.md):
scripts/import_circles.py over every crate that promises it. A planted
circle is caught, so the check cannot pass vacuously."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sandhub_testing import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "import_circles.py"
CRATES = ["hub", "router", "http1", "sandboxd", "mcp-server", "client", "api", "common", "controller", "gateway", "python"]


def circles(src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("crate", CRATES)
def test_no_import_circles(crate: str) -> None:
    out = circles(REPO_ROOT / crate / "src")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ", 0 circles" in out.stdout, out.stdout


def test_a_planted_circle_is_found(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.rs").write_text("mod a;\nmod b;\n")
    (src / "a.rs").write_text("use crate::b::B;\npub struct A;\n")
    (src / "b.rs").write_text("use crate::a::A;\npub struct B;\n")
    out = circles(src)
    assert out.returncode == 1, out.stdout
    assert "circle: a <-> b" in out.stdout, out.stdout


def test_a_circle_after_a_mid_file_test_module_is_found(tmp_path: Path) -> None:
    """A test module in the middle of a file hides nothing after it, and a
    test module in a file of its own draws no arrow."""
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod b;\nmod c;\n")
    (src / "a.rs").write_text(
        "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n}\nuse crate::b::B;\n"
    )
    (src / "b.rs").write_text("#[cfg(test)]\nmod tests;\nuse crate::a::A;\npub struct B;\n")
    (src / "b" / "tests.rs").write_text("use crate::c::C;\n")
    (src / "c.rs").write_text("use crate::b::B;\npub struct C;\n")
    out = circles(src)
    assert out.returncode == 1, out.stdout
    assert "circle: a <-> b" in out.stdout, out.stdout
    assert "c" not in out.stdout.replace("circle", "").replace("circles", ""), out.stdout
