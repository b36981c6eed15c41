"""What the sync and async sandboxes share: the shell scripts they run and
how their answers turn into deepagents' responses. No I/O here.

File transfers go through a shell in the sandbox, not through the files
API: deepagents names files by absolute paths *as the sandbox's processes
see them* (``/tmp/x``), while the files API only reaches the workspace.
A small upload is one exec request whose stdin is the content in base64
(stdin is text there); a larger one would pass the hub's request-body
limit, so it goes to a started process's stdin as raw bytes, in chunks.
Downloads come back as base64 on stdout.

Why ``_sync.py`` is not generated from ``_async.py`` by ``scripts/unasync.py``
(as the SDK's and the RL fleet's blocking faces are): deepagents' protocol is
one class with both faces, not two classes with the same names. Its async
members are ``a``-prefixed twins (``aexecute``, ``aupload_files``,
``adownload_files``) of the sync ones on the same ``BaseSandbox``, and it is
the *sync* members that are abstract (deepagents 0.7: ``execute``,
``upload_files``, ``download_files``, ``id``; the ``a*`` ones default to
``asyncio.to_thread`` of them). So ``AsyncSandhubSandbox`` must carry sync
members too (it runs its coroutines on a worker thread's loop), and a text
rewrite of it would turn ``aexecute`` into a second ``execute`` beside the
sync shim. What the two faces share lives here instead, and each face stays a
short list of SDK calls.
"""

from __future__ import annotations

import base64
import binascii
from typing import Sequence

from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from sandhub import CommandResult

#: Seconds a command may run when the caller gives no ``timeout``.
DEFAULT_TIMEOUT_SECONDS = 30 * 60
#: Characters of combined output kept before ``truncated`` is set.
DEFAULT_MAX_OUTPUT_CHARS = 1_000_000

_ERROR_WORDS = {FILE_NOT_FOUND, PERMISSION_DENIED, IS_DIRECTORY, INVALID_PATH}

# `exec 2>&1` first: stderr then shares stdout's pipe, so the two arrive
# interleaved in the order the command wrote them (the hub keeps them apart).
_EXECUTE_PREFIX = "exec 2>&1\n"

#: Base64 characters sent as one exec request's stdin; above, the upload streams.
#: Well under the hub's 1 MiB JSON body limit, with room for the request around it.
MAX_INLINE_STDIN = 512 * 1024
#: Raw bytes per ``write_stdin`` of a streamed upload (base64 in JSON on the wire:
#: about 700 KiB per request, under the same limit).
STREAM_CHUNK_BYTES = 512 * 1024

# $1 is the path; $2 `raw` when stdin is the content itself, else stdin is
# the content in base64. The first stdout line is `ok` or one of deepagents'
# error words.
_UPLOAD = r"""p=$1
if [ -d "$p" ]; then echo is_directory; exit 0; fi
d=$(dirname -- "$p")
if ! err=$(mkdir -p -- "$d" 2>&1); then
  case $err in *"Not a directory"*|*"File exists"*) echo invalid_path;; *) echo permission_denied;; esac
  exit 0
fi
if [ "$2" = raw ]; then write() { cat > "$p"; }; else write() { base64 -d > "$p"; }; fi
if ! write 2>/dev/null; then
  if [ -e "$p" ] && [ ! -w "$p" ] || [ ! -w "$d" ]; then echo permission_denied; else echo invalid_path; fi
  exit 0
fi
echo ok
"""

# $1 is the path. The first stdout line is `ok` (then the content in
# base64) or one of deepagents' error words.
_DOWNLOAD = r"""p=$1
if [ -d "$p" ]; then echo is_directory; exit 0; fi
if [ ! -e "$p" ]; then echo file_not_found; exit 0; fi
if [ ! -r "$p" ]; then echo permission_denied; exit 0; fi
if ! out=$(base64 < "$p" 2>/dev/null); then echo permission_denied; exit 0; fi
echo ok
printf '%s\n' "$out"
"""


def execute_argv(command: str) -> list[str]:
    """``sh -c`` with stderr folded into stdout, in write order."""
    return ["/bin/sh", "-c", _EXECUTE_PREFIX + command]


def execute_response(result: CommandResult, timeout: float, max_output_chars: int) -> ExecuteResponse:
    output = result.stdout + result.stderr  # stderr is empty but for the hub's own notes
    truncated = len(output) > max_output_chars
    if truncated:
        output = output[:max_output_chars]
    if result.timed_out:
        output += f"\n[sandhub: the command timed out after {timeout:g} s and was killed]"
    return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=truncated)


def path_error(path: object) -> str | None:
    """deepagents' word for a path no sandbox could take, else None."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return str(INVALID_PATH)
    return None


def upload_argv(path: str, *, raw: bool = False) -> list[str]:
    """The upload script for ``path``; ``raw``: stdin is the content itself
    (a streamed upload), else its base64 (:func:`upload_stdin`)."""
    return ["/bin/sh", "-c", _UPLOAD, "sh", path, "raw" if raw else "base64"]


def streams(content: bytes) -> bool:
    """Whether ``content`` is too big for one exec request's stdin."""
    return (len(content) + 2) // 3 * 4 > MAX_INLINE_STDIN


def chunks(content: bytes) -> list[bytes]:
    """``content`` cut for a streamed upload's ``write_stdin`` calls."""
    view = memoryview(content)
    return [bytes(view[i : i + STREAM_CHUNK_BYTES]) for i in range(0, len(content), STREAM_CHUNK_BYTES)]


def upload_stdin(content: bytes) -> str:
    return base64.b64encode(content).decode("ascii")


def upload_response(path: str, result: CommandResult) -> FileUploadResponse:
    word = _first_line(result.stdout)
    if word == "ok" and result.exit_code == 0:
        return FileUploadResponse(path=path, error=None)
    return FileUploadResponse(path=path, error=word if word in _ERROR_WORDS else _unknown(result))


def download_argv(path: str) -> list[str]:
    return ["/bin/sh", "-c", _DOWNLOAD, "sh", path]


def download_response(path: str, result: CommandResult) -> FileDownloadResponse:
    word, _, rest = result.stdout.partition("\n")
    if word == "ok" and result.exit_code == 0:
        try:
            content = base64.b64decode(rest, validate=False)
        except (binascii.Error, ValueError):
            return FileDownloadResponse(path=path, content=None, error=_unknown(result))
        return FileDownloadResponse(path=path, content=content, error=None)
    return FileDownloadResponse(path=path, content=None, error=word if word in _ERROR_WORDS else _unknown(result))


def refused_upload(path: str, error: str) -> FileUploadResponse:
    return FileUploadResponse(path=path, error=error)


def refused_download(path: str, error: str) -> FileDownloadResponse:
    return FileDownloadResponse(path=path, content=None, error=error)


def sdk_error(err: Exception) -> str:
    """A failed SDK call as a backend-specific error string (deepagents
    allows those beside its four words); never raised to the agent."""
    code = getattr(err, "code", type(err).__name__)
    return f"sandhub {code}: {getattr(err, 'message', err)}"


def _first_line(text: str) -> str:
    return text.partition("\n")[0].strip()


def _unknown(result: CommandResult) -> str:
    detail = (result.stderr or result.stdout).strip().splitlines()
    return f"sandhub: exit {result.exit_code}: {detail[-1] if detail else 'no output'}"


__all__: Sequence[str] = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_TIMEOUT_SECONDS",
    "download_argv",
    "download_response",
    "execute_argv",
    "execute_response",
    "path_error",
    "refused_download",
    "refused_upload",
    "sdk_error",
    "chunks",
    "streams",
    "upload_argv",
    "upload_response",
    "upload_stdin",
]
