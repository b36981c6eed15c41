"""Moving one file between the trainer's disk and a sandbox.

NeMo Gym names sandbox files by paths as the sandbox's processes see them:
relative ones under the spec's workdir (else the workspace), absolute ones
anywhere. The workspace is the files API's root, so paths under it stream
through that API; any other path (``/tmp/x``) goes through a shell in the
sandbox, as base64 because a command's stdin and stdout are text.
"""

from __future__ import annotations

import base64
import posixpath
from pathlib import Path

import sandhub

# $1: the target path; stdin: the content in base64.
_WRITE = 'mkdir -p -- "$(dirname -- "$1")" && base64 -d > "$1"'
# $1: the source path; stdout: the content in base64.
_READ = 'base64 < "$1"'


def workspace_relative(path: str, workdir: str, workspace: str) -> tuple[str, str | None]:
    """``path`` made absolute (against ``workdir``), and its files-API path
    (None when it lies outside ``workspace``)."""
    absolute = posixpath.normpath(posixpath.join(workdir, path))
    rel = posixpath.relpath(absolute, workspace)
    return absolute, (None if rel == ".." or rel.startswith("../") else rel)


async def upload(sandbox: sandhub.AsyncSandbox, workdir: str, workspace: str, source: Path, target: str) -> None:
    target, rel = workspace_relative(target, workdir, workspace)
    if rel is not None:
        with open(source, "rb") as f:
            await sandbox.files.write(rel, f)
        return
    data = base64.b64encode(source.read_bytes()).decode("ascii")
    result = await sandbox.commands.run(["/bin/sh", "-c", _WRITE, "sh", target], stdin=data)
    if result.exit_code != 0:
        raise OSError(f"upload to {target} failed (exit {result.exit_code}): {result.stderr.strip()}")


async def download(sandbox: sandhub.AsyncSandbox, workdir: str, workspace: str, source: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    source, rel = workspace_relative(source, workdir, workspace)
    if rel is not None:
        await sandbox.files.read_to(rel, target)
        return
    result = await sandbox.commands.run(["/bin/sh", "-c", _READ, "sh", source])
    if result.exit_code != 0:
        raise FileNotFoundError(f"download of {source} failed (exit {result.exit_code}): {result.stderr.strip()}")
    target.write_bytes(base64.b64decode(result.stdout))
