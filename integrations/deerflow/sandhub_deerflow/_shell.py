"""The shell scripts the sandbox runs for what the files API cannot do
(searching, and files outside ``/workspace``), and how their answers are read.
No I/O here.

Every user value (a path, a pattern) reaches a script as a positional
argument of ``sh -c SCRIPT sh ARGS...``, never spliced into the script text,
so no quoting can break out. A script reports a failure as an exit code
equal to the ``errno`` it stands for (2 ENOENT, 13 EACCES, 20 ENOTDIR,
21 EISDIR), which :func:`os_error` turns into the matching ``OSError``
subclass, the exceptions DeerFlow's tools catch.

``find -printf`` and ``grep -Z``/``-P`` are GNU's: the template needs a POSIX
shell with GNU findutils and grep (the hub's default template, the host's
``/usr``, has them).
"""

from __future__ import annotations

import errno
import os
import shlex

from deerflow.sandbox.search import IGNORE_PATTERNS

#: errno values a script may exit with.
SCRIPT_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.EISDIR, errno.EROFS})

#: Bytes of listing or grep output read at most; past it the result is "truncated".
OUTPUT_CAP_BYTES = 8 * 1024 * 1024

# `find` arguments that skip what DeerFlow's own searches skip
# (deerflow.sandbox.search.IGNORE_PATTERNS), subtrees included.
_PRUNE = "\\( " + " -o ".join(f"-name {shlex.quote(p)}" for p in IGNORE_PATTERNS) + " \\) -prune -o"

#: Creates the user-data directories ($@) and prints the path of bash, if any.
BOOTSTRAP = """mkdir -p -- "$@" || exit 13
command -v bash || true
"""

#: $1 a path outside the workspace: its content, base64 encoded.
READ = """p=$1
[ -d "$p" ] && exit 21
[ -e "$p" ] || exit 2
[ -r "$p" ] || exit 13
base64 < "$p" || exit 13
"""

#: $1 a path outside the workspace, $2 "1" to append; stdin the content in base64.
WRITE = """p=$1
[ -d "$p" ] && exit 21
d=$(dirname -- "$p")
if ! mkdir -p -- "$d" 2>/dev/null; then [ -e "$d" ] && exit 20; exit 13; fi
if [ "$2" = 1 ]; then base64 -d >> "$p" || exit 13; else base64 -d > "$p" || exit 13; fi
"""

_ROOT_IS_DIR = """r=$1
[ -e "$r" ] || exit 2
[ -d "$r" ] || exit 20
"""

#: $1 the root, $2 the depth: "d PATH" or "f PATH" per entry, NUL-terminated.
LIST = (
    _ROOT_IS_DIR
    + f"find \"$r\" -mindepth 1 -maxdepth \"$2\" {_PRUNE} -printf '%y %p\\0' 2>/dev/null | head -c {OUTPUT_CAP_BYTES}\n"
)

#: $1 the root, $2 "1" to list directories too: paths, NUL-terminated.
GLOB = (
    _ROOT_IS_DIR
    + f"""if [ "$2" = 1 ]; then t=''; else t='!'; fi
find "$r" -mindepth 1 {_PRUNE} $t -type d -printf '%p\\0' 2>/dev/null | head -c {OUTPUT_CAP_BYTES}
"""
)

#: $1 the root (a directory or one file), $2 the most bytes a searched file may
#: have, $3 "F" (literal) or "R" (regex), $4 "i" to ignore case, $5 the pattern:
#: "PATH\\0LINE:TEXT" per match. A regex goes to grep as PCRE (-P, the closest
#: to DeerFlow's Python regexes) where grep has it, else as ERE.
GREP = f"""r=$1; max=$2; kind=$3; icase=$4; pat=$5
[ -e "$r" ] || exit 2
if [ "$kind" = F ]; then m=-F; else m=-E; grep -P -e '' /dev/null 2>/dev/null; [ $? -le 1 ] && m=-P; fi
set -- -HnIZ "$m"
[ "$icase" = i ] && set -- "$@" -i
set -- "$@" -e "$pat"
if [ -d "$r" ]; then
  find "$r" -mindepth 1 {_PRUNE} -type f -size -"$((max + 1))"c -print0 2>/dev/null \\
    | xargs -0 -r grep "$@" -- 2>/dev/null | head -c {OUTPUT_CAP_BYTES}
else
  grep "$@" -- "$r" 2>/dev/null | head -c {OUTPUT_CAP_BYTES}
fi
exit 0
"""


def argv(script: str, *args: str) -> list[str]:
    """``sh -c script`` with ``args`` as ``$1``..."""
    return ["/bin/sh", "-c", script, "sh", *args]


def os_error(code: int, path: str, detail: str = "") -> OSError:
    """The ``OSError`` subclass for ``code`` (``FileNotFoundError`` for 2...),
    naming the path the caller gave, not the sandbox-internal one."""
    message = os.strerror(code) + (f" ({detail})" if detail else "")
    return OSError(code, message, path)


def nul_records(stdout: str) -> tuple[list[str], bool]:
    """NUL-terminated records, and whether the output was cut at the cap (its
    last, partial record is then dropped)."""
    capped = len(stdout.encode("utf-8", "surrogateescape")) >= OUTPUT_CAP_BYTES
    records = stdout.split("\0")
    # The text after the last NUL is empty, or a record the cap cut short.
    return [r for r in records[:-1] if r], capped
