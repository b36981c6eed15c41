"""The console's committed bundle (`console/dist/`, embedded in the hub) is
exactly what its source builds to with the pinned lockfile, and its first
load stays within the JavaScript budget (issue #31).

Like the CRD drift test: `cargo build` never needs Node, and this proves the
committed files are the source's. `node_modules` is installed once per
lockfile (`npm ci`) under `$SANDHUB_CACHE/console-node_modules-<hash>`, so a
run after the first costs one Vite build (about a second). Under CI=true a
missing node/npm fails the test.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from sandhub_testing.node import installed_modules, node_and_npm

REPO = Path(__file__).resolve().parents[2]
CONSOLE = REPO / "console"
#: What the build reads; everything else in console/ is output or docs.
SOURCES = ("package.json", "package-lock.json", "index.html", "vite.config.ts", "tsconfig.json", "src")
#: Gzipped JavaScript a first visit loads (issue #31).
FIRST_LOAD_BUDGET = 250 * 1024
#: Vite 8 needs Node 20.19 or newer.
MIN_NODE = (20, 19)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def first_load_js(dist: Path) -> list[Path]:
    """The scripts index.html loads (entry and module preloads); the views
    imported lazily (terminal, plots) are not part of a first load."""
    html = (dist / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="/(assets/[^"]+\.js)"', html)
    return [dist / r for r in refs]


def test_the_committed_console_is_the_sources_build() -> None:
    node, npm = node_and_npm(MIN_NODE)
    modules = installed_modules(npm, CONSOLE, "console")
    with tempfile.TemporaryDirectory(prefix="sandhub-console-") as tmp:
        work = Path(tmp)
        for name in SOURCES:
            src = CONSOLE / name
            if src.is_dir():
                shutil.copytree(src, work / name)
            else:
                shutil.copy(src, work / name)
        (work / "node_modules").symlink_to(modules)
        subprocess.run(
            [node, "node_modules/typescript/bin/tsc", "--noEmit", "-p", "."],
            cwd=work,
            check=True,
            timeout=300,
        )
        subprocess.run(
            [node, "node_modules/vite/bin/vite.js", "build", "--logLevel", "warn"],
            cwd=work,
            check=True,
            timeout=300,
        )
        built, committed = files(work / "dist"), files(CONSOLE / "dist")
    assert sorted(built) == sorted(committed), (
        "console/dist/ is not the source's build: run `npm ci && npm run build` in console/ and commit dist/"
    )
    for name, data in built.items():
        assert data == committed[name], f"console/dist/{name} differs from the source's build"


def test_first_load_javascript_is_within_budget() -> None:
    dist = CONSOLE / "dist"
    scripts = first_load_js(dist)
    assert scripts, "index.html loads no script"
    sizes = {p.name: len(gzip.compress(p.read_bytes(), compresslevel=9)) for p in scripts}
    lazy = {
        p.name: len(gzip.compress(p.read_bytes(), compresslevel=9))
        for p in (dist / "assets").glob("*.js")
        if p not in scripts
    }
    total = sum(sizes.values())
    print(f"console first load: {total} bytes of gzipped JavaScript {sizes}; loaded later: {lazy}")
    assert total <= FIRST_LOAD_BUDGET, sizes
