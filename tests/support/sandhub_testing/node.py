"""Node.js for the suites that run JavaScript: the web console's build and E2B's JS SDKs.

Each Node project in the repository pins its packages in a lockfile; ``installed_modules``
runs ``npm ci`` for it once, under ``$SANDHUB_CACHE/<name>-node_modules-<hash>`` (the
hash of package.json and package-lock.json), and later runs reuse that copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .env import need

LOCK_FILES = ("package.json", "package-lock.json")


def cache_dir() -> Path:
    return Path(os.environ.get("SANDHUB_CACHE") or Path.home() / ".cache" / "sandhub")


def node_and_npm(min_version: tuple[int, int] = (20, 0)) -> tuple[str, str]:
    """The ``node`` and ``npm`` on PATH, of at least ``min_version``; missing
    or too old skips locally and fails under CI=true."""
    node, npm = shutil.which("node"), shutil.which("npm")
    need(node is not None and npm is not None, "node and npm are needed (scripts/test-deps.sh installs them)")
    assert node and npm
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    m = re.match(r"v(\d+)\.(\d+)", version)
    need(
        m is not None and (int(m[1]), int(m[2])) >= min_version,
        f"node {version.strip()} is older than {min_version[0]}.{min_version[1]}",
    )
    return node, npm


def installed_modules(npm: str, project: Path, name: str) -> Path:
    """``node_modules`` for ``project``'s pinned lockfile, installed once and kept."""
    digest = hashlib.sha256()
    for lock in LOCK_FILES:
        digest.update((project / lock).read_bytes())
    home = cache_dir() / f"{name}-node_modules-{digest.hexdigest()[:16]}"
    if (home / ".complete").exists():
        return home / "node_modules"
    home.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    try:
        for lock in LOCK_FILES:
            shutil.copy(project / lock, work / lock)
        # --ignore-scripts: no package runs code at install time.
        subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=work,
            check=True,
            timeout=600,
        )
        (work / ".complete").touch()
        try:
            work.rename(home)
        except OSError:  # another run finished first: use its copy
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return home / "node_modules"
