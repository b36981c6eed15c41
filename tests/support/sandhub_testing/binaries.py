"""The binary finder: which build of each program the tests run."""

from __future__ import annotations

import os
from pathlib import Path

from .env import REPO_ROOT, need

# Program -> (the variable that names its path, the cargo package that builds it).
BINARIES = {
    "sandboxd": ("SANDBOXD_BIN", "sandboxd"),
    "sandhub": ("SANDHUB_BIN", "sandhub"),
    "sandhub-mcp": ("SANDHUB_MCP_BIN", "sandhub-mcp"),
    "sandhub-router": ("SANDHUB_ROUTER_BIN", "sandhub-router"),
    "sandhub-controller": ("SANDHUB_CONTROLLER_BIN", "sandhub-controller"),
}


def binary_path(name: str) -> Path:
    """$<NAME>_BIN, else $CARGO_TARGET_DIR/debug/<name>, else target/debug/<name>;
    a relative CARGO_TARGET_DIR is relative to the checkout, as cargo's is."""
    env, _ = BINARIES[name]
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    if not target.is_absolute():
        target = REPO_ROOT / target
    return target / "debug" / name


def binary(name: str) -> Path:
    """The program's path; skips the test (fails it under CI) when there is none."""
    path = binary_path(name)
    env, package = BINARIES[name]
    need(
        path.is_file() and os.access(path, os.X_OK),
        f"{name} binary not found at {path} (set {env} or build it with `cargo build -p {package}`)",
    )
    return path
