"""DeerFlow's virtual paths and where they live inside a Sandhub sandbox.

DeerFlow's tools name files under ``/mnt/user-data/{workspace,uploads,outputs}``
and run every command after ``cd /mnt/user-data/workspace``. A Sandhub sandbox
on the local backend has a read-only root where only ``/workspace`` and ``/tmp``
are writable, and workloads may not mount, so ``/mnt/user-data`` cannot be made
to exist there. The adapter therefore keeps the user data under a real root
(``/workspace`` by default: ``/mnt/user-data/outputs`` is ``/workspace/outputs``)
and translates, the way DeerFlow's own local sandbox translates to host paths:

- path arguments of the file methods, virtual to real;
- commands, virtual to real, and their output, real back to virtual;
- text the agent writes with ``write_file``, virtual to real (so a script that
  opens ``/mnt/user-data/outputs/x.png`` works when run), and back to virtual
  when it is read again.

With ``real_root == virtual_root`` (a template whose image provides
``/mnt/user-data``) every translation is the identity. No I/O here.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

#: DeerFlow's virtual root (``deerflow.config.paths.VIRTUAL_PATH_PREFIX``).
VIRTUAL_ROOT = "/mnt/user-data"
#: The directories under it that every acquired sandbox has.
USER_DATA_DIRS = ("workspace", "uploads", "outputs")
#: Where the user data lives in the sandbox unless configured otherwise.
DEFAULT_REAL_ROOT = "/workspace"

# A path-name character: a root is replaced only where it stands as a whole
# path (not inside `/x/mnt/user-data` or `/mnt/user-data2`).
_NAME = r"[\w.\-]"


def _root_pattern(root: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w./\-]){re.escape(root)}(?!{_NAME})")


@dataclass(frozen=True)
class PathMap:
    """Translation between DeerFlow's virtual root and the sandbox's real one."""

    real_root: str = DEFAULT_REAL_ROOT
    virtual_root: str = VIRTUAL_ROOT
    _to_real: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _to_virtual: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for root in (self.real_root, self.virtual_root):
            if not root.startswith("/") or root != posixpath.normpath(root) or root == "/":
                raise ValueError(f"{root!r}: a user-data root must be an absolute, normalized path other than /")
        object.__setattr__(self, "_to_real", _root_pattern(self.virtual_root))
        object.__setattr__(self, "_to_virtual", _root_pattern(self.real_root))

    @property
    def identity(self) -> bool:
        return self.real_root == self.virtual_root

    def real_dirs(self) -> list[str]:
        """The real directories behind ``/mnt/user-data/{workspace,uploads,outputs}``."""
        return [f"{self.real_root}/{d}" for d in USER_DATA_DIRS]

    def to_real(self, path: str) -> str:
        """The sandbox path a tool's path argument names.

        Raises ``ValueError`` for what is no absolute path and
        ``PermissionError`` for a ``..`` segment (DeerFlow's remote sandboxes
        refuse traversal the same way, and a mapped prefix must not be escaped)."""
        clean = check_path(path)
        if clean == self.virtual_root:
            return self.real_root
        if clean.startswith(self.virtual_root + "/"):
            return self.real_root + clean[len(self.virtual_root) :]
        return clean

    def to_virtual(self, real: str) -> str:
        """The inverse of :meth:`to_real` for a path the sandbox reported."""
        if real == self.real_root:
            return self.virtual_root
        if real.startswith(self.real_root + "/"):
            return self.virtual_root + real[len(self.real_root) :]
        return real

    def in_command(self, text: str) -> str:
        """Virtual paths in a command (or agent-written text) made real."""
        return text if self.identity else self._to_real.sub(self.real_root, text)

    def in_output(self, text: str) -> str:
        """Real paths in output (or agent-written text read back) made virtual."""
        return text if self.identity else self._to_virtual.sub(self.virtual_root, text)


def check_path(path: object) -> str:
    """``path`` as a normalized absolute path, or a clear error."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty string, not {path!r}")
    if "\0" in path:
        raise ValueError(f"path {path!r} contains a NUL character")
    if not path.startswith("/"):
        raise ValueError(f"path {path!r} is not absolute: DeerFlow's tools name files by absolute paths")
    if ".." in path.split("/"):
        raise PermissionError(f"Access denied: path traversal detected in {path!r}")
    clean = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX allows it to mean something else).
    return "/" + clean.lstrip("/")
