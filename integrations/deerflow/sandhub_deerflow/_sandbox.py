"""``SandhubSandbox``: DeerFlow's ``Sandbox`` over one Sandhub sandbox."""

from __future__ import annotations

import base64
import binascii
import errno
import io
import logging
import re
import threading

import sandhub
from deerflow.sandbox.sandbox import Sandbox, _validate_extra_env
from deerflow.sandbox.search import (
    DEFAULT_LINE_SUMMARY_LENGTH,
    DEFAULT_MAX_FILE_SIZE_BYTES,
    GrepMatch,
    path_matches,
    should_ignore_path,
    truncate_line,
)

from . import _shell as sh
from ._paths import VIRTUAL_ROOT, PathMap, check_path

logger = logging.getLogger(__name__)

#: Seconds a command may run when DeerFlow gives none (it never does for a
#: remote sandbox); DeerFlow's own ``sandbox.bash_command_timeout`` default.
DEFAULT_TIMEOUT_SECONDS = 600.0
#: Largest file ``download_file`` returns (DeerFlow's cap for its sandboxes).
MAX_DOWNLOAD_BYTES = 100 * 1024 * 1024
#: The sandbox's workspace: the only tree the files API reaches.
SANDHUB_WORKSPACE = "/workspace"
# Longer lines are skipped by grep, as DeerFlow's own search does (ReDoS guard).
_MAX_GREP_LINE_CHARS = DEFAULT_LINE_SUMMARY_LENGTH * 10


class SandhubSandbox(Sandbox):
    """DeerFlow's eight sandbox methods on a ``sandhub.Sandbox``.

    Paths under ``/mnt/user-data`` are kept under ``paths.real_root``
    (``/workspace`` by default; see :mod:`sandhub_deerflow._paths` for why
    and how). Files inside ``/workspace`` move through the SDK's files API,
    which streams; others (``/tmp``, ``/etc``...) through a shell in the
    sandbox. Listings and searches run ``find``/``grep`` in the sandbox and
    are filtered here with DeerFlow's own helpers, so they skip what
    DeerFlow skips. Failures are the ``OSError`` subclasses DeerFlow's tools
    turn into their messages (``FileNotFoundError``, ``IsADirectoryError``,
    ``PermissionError``...), naming the path as the caller gave it.
    """

    def __init__(
        self,
        sandbox: sandhub.Sandbox,
        *,
        paths: PathMap | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        shell: str = "/bin/sh",
    ) -> None:
        super().__init__(sandbox.id)
        self._sandbox = sandbox
        self._paths = paths or PathMap()
        self._timeout = timeout
        self._shell = shell
        # Real paths written through write_file: their text had virtual paths
        # made real, and reads give them back virtual (agent-authored text
        # only; uploads and command output stay as they are).
        self._agent_written: set[str] = set()
        self._lock = threading.Lock()

    @property
    def sandbox(self) -> sandhub.Sandbox:
        """The SDK sandbox underneath."""
        return self._sandbox

    @property
    def paths(self) -> PathMap:
        return self._paths

    @property
    def shell(self) -> str:
        """What runs commands: the template's bash, else ``/bin/sh``."""
        return self._shell

    # ---------------------------------------------------------------- commands

    def execute_command(self, command: str, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
        """Runs ``command`` with bash (``sh`` where the template has none).

        The text follows DeerFlow's local sandbox: stdout, then stderr after
        ``Std Error:``, then ``Exit Code: N`` when it failed, or a timeout
        notice; ``(no output)`` when there is nothing. Raises ``ValueError``
        for an ``env`` name that is not a POSIX name, as DeerFlow requires."""
        _validate_extra_env(env)
        limit = self._timeout if timeout is None else timeout
        try:
            result = self._sandbox.commands.run(
                [self._shell, "-c", self._paths.in_command(command)], env=env or None, timeout=limit
            )
        except sandhub.SandhubError as err:
            logger.error("command in sandbox %s failed: %s", self.id, err)
            return f"Error: {err}"
        output = result.stdout
        if result.stderr:
            output += f"\nStd Error:\n{result.stderr}" if output else result.stderr
        if result.timed_out:
            notice = f"Command timed out after {limit:g} seconds and was killed."
            output += f"\n{notice}" if output else notice
        elif result.exit_code != 0:
            output += f"\nExit Code: {result.exit_code}" if output else f"Exit Code: {result.exit_code}"
        return self._paths.in_output(output) if output else "(no output)"

    # ---------------------------------------------------------------- files

    def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """The file as UTF-8 text (``UnicodeDecodeError`` when it is not);
        with a range, lines ``start_line`` to ``end_line`` (1-based, both
        included) joined by ``\\n``."""
        real = self._paths.to_real(path)
        content = self._read_bytes(real, path).decode("utf-8")
        if real in self._written():
            content = self._paths.in_output(content)
        if start_line is None and end_line is None:
            return content
        first = max(start_line or 1, 1)
        picked = []
        for number, line in enumerate(io.StringIO(content), start=1):
            if end_line is not None and number > end_line:
                break
            if number >= first:
                picked.append(line.rstrip("\r\n"))
        return "\n".join(picked)

    def download_file(self, path: str) -> bytes:
        """The file's bytes. Only under ``/mnt/user-data`` (else
        ``PermissionError``, as DeerFlow's sandboxes do); ``OSError`` when it
        cannot be read or passes :data:`MAX_DOWNLOAD_BYTES`."""
        clean = check_path(path)
        if clean != VIRTUAL_ROOT and not clean.startswith(VIRTUAL_ROOT + "/"):
            raise PermissionError(errno.EACCES, f"Access denied: path must be under {VIRTUAL_ROOT!r}", path)
        real = self._paths.to_real(clean)
        data = self._read_bytes(real, path)
        if real in self._written():
            try:
                data = self._paths.in_output(data.decode("utf-8")).encode("utf-8")
            except UnicodeDecodeError:
                pass
        return data

    def write_file(self, path: str, content: str, append: bool = False) -> None:
        """Creates (parents too), replaces or, with ``append``, extends the file.
        Virtual paths in ``content`` are made real, so what the agent writes
        (a script, say) works when run; reads give them back virtual."""
        real = self._paths.to_real(path)
        self._write_bytes(real, self._paths.in_command(content).encode("utf-8"), path, append=append)
        with self._lock:
            self._agent_written.add(real)

    def update_file(self, path: str, content: bytes) -> None:
        """Creates or replaces the file with ``content`` as given (uploads)."""
        real = self._paths.to_real(path)
        self._write_bytes(real, bytes(content), path, append=False)
        with self._lock:
            self._agent_written.discard(real)

    def list_dir(self, path: str, max_depth: int = 2) -> list[str]:
        """Paths under ``path`` down to ``max_depth`` levels, directories
        with a trailing ``/``, sorted; ``FileNotFoundError`` when it is missing."""
        real = self._paths.to_real(path)
        depth = max(int(max_depth), 1)
        out = self._script(sh.LIST, path, real, str(depth))
        records, _ = sh.nul_records(out)
        entries = []
        for record in records:
            kind, _, found = record.partition(" ")
            if should_ignore_path(found[len(real) :]):
                continue
            virtual = self._paths.to_virtual(found)
            entries.append(virtual + "/" if kind == "d" else virtual)
        return sorted(entries)

    def glob(
        self, path: str, pattern: str, *, include_dirs: bool = False, max_results: int = 200
    ) -> tuple[list[str], bool]:
        """Paths under ``path`` whose path relative to it matches ``pattern``
        (DeerFlow's matching: ``**/*.py`` also matches ``a.py``)."""
        real = self._paths.to_real(path)
        out = self._script(sh.GLOB, path, real, "1" if include_dirs else "0")
        records, capped = sh.nul_records(out)
        matches: list[str] = []
        for found in records:
            rel = found[len(real) :].lstrip("/")
            if not rel or should_ignore_path(rel) or not path_matches(pattern, rel):
                continue
            if len(matches) >= max_results:
                return matches, True
            matches.append(self._paths.to_virtual(found))
        return matches, capped

    def grep(
        self,
        path: str,
        pattern: str,
        *,
        glob: str | None = None,
        literal: bool = False,
        case_sensitive: bool = False,
        max_results: int = 100,
    ) -> tuple[list[GrepMatch], bool]:
        """Lines matching ``pattern`` in the file ``path`` or the text files
        under it (binary files and files over 1 MB skipped, as DeerFlow does).
        A bad regex raises ``re.error`` before anything runs."""
        if not literal:
            re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
        real = self._paths.to_real(path)
        out = self._script(
            sh.GREP,
            path,
            real,
            str(DEFAULT_MAX_FILE_SIZE_BYTES),
            "F" if literal else "R",
            "" if case_sensitive else "i",
            pattern,
        )
        capped = len(out.encode("utf-8", "surrogateescape")) >= sh.OUTPUT_CAP_BYTES
        lines = out.split("\n")
        if capped:
            lines = lines[:-1]
        written = self._written()
        matches: list[GrepMatch] = []
        for line in lines:
            found, nul, rest = line.partition("\0")
            number, colon, text = rest.partition(":")
            if not nul or not colon or not number.isdigit() or len(text) > _MAX_GREP_LINE_CHARS:
                continue
            rel = found[len(real) :].lstrip("/") or found.rsplit("/", 1)[-1]
            if should_ignore_path(found[len(real) :]):
                continue
            if glob is not None and not path_matches(glob, rel):
                continue
            if len(matches) >= max_results:
                return matches, True
            if found in written:  # agent-written text reads as written, as in read_file
                text = self._paths.in_output(text)
            virtual = self._paths.to_virtual(found)
            matches.append(GrepMatch(path=virtual, line_number=int(number), line=truncate_line(text)))
        return matches, capped

    # ---------------------------------------------------------------- transport

    def _written(self) -> set[str]:
        with self._lock:
            return set(self._agent_written)

    def _read_bytes(self, real: str, shown: str) -> bytes:
        rel = _workspace_relative(real)
        if rel is not None:
            try:
                return self._sandbox.files.read(rel)
            except sandhub.SandhubError as err:
                raise _file_error(err, shown) from None
        out = self._script(sh.READ, shown, real)
        try:
            return base64.b64decode(out, validate=False)
        except (binascii.Error, ValueError) as err:
            raise sh.os_error(errno.EIO, shown, f"undecodable answer: {err}") from None

    def _write_bytes(self, real: str, data: bytes, shown: str, *, append: bool) -> None:
        rel = _workspace_relative(real)
        if rel is not None:
            if rel == ".":
                raise sh.os_error(errno.EISDIR, shown)
            try:
                self._sandbox.files.write(rel, data, append=append)
            except sandhub.SandhubError as err:
                raise _file_error(err, shown) from None
            return
        encoded = base64.b64encode(data).decode("ascii")
        try:
            result = self._sandbox.commands.run(
                sh.argv(sh.WRITE, real, "1" if append else "0"), stdin=encoded, timeout=self._timeout
            )
        except sandhub.SandhubError as err:
            raise _file_error(err, shown) from None
        _check(result, shown)

    def _script(self, script: str, shown: str, *args: str) -> str:
        """Runs one of :mod:`._shell`'s scripts; its stdout, or the OSError it reports."""
        try:
            result = self._sandbox.commands.run(sh.argv(script, *args), timeout=self._timeout)
        except sandhub.SandhubError as err:
            raise _file_error(err, shown) from None
        _check(result, shown)
        return result.stdout


def _workspace_relative(real: str) -> str | None:
    """``real`` relative to the sandbox's workspace, or None outside it."""
    if real == SANDHUB_WORKSPACE:
        return "."
    if real.startswith(SANDHUB_WORKSPACE + "/"):
        return real[len(SANDHUB_WORKSPACE) + 1 :]
    return None


def _check(result: sandhub.CommandResult, shown: str) -> None:
    if result.exit_code == 0 and not result.timed_out:
        return
    if result.timed_out:
        raise sh.os_error(errno.ETIMEDOUT, shown)
    code = result.exit_code if result.exit_code in sh.SCRIPT_ERRNOS else errno.EIO
    raise sh.os_error(code, shown, result.stderr.strip()[-300:])


def _file_error(err: sandhub.SandhubError, shown: str) -> OSError:
    """A files-API failure as the ``OSError`` DeerFlow's tools expect."""
    message = getattr(err, "message", str(err))
    if isinstance(err, sandhub.ResponseTooLargeError):
        return sh.os_error(errno.EFBIG, shown, f"larger than {MAX_DOWNLOAD_BYTES} bytes")
    if isinstance(err, sandhub.NotFoundError) and not isinstance(err, sandhub.SandboxLostError):
        return sh.os_error(errno.ENOENT, shown)
    if isinstance(err, sandhub.PermissionDeniedError):
        return sh.os_error(errno.EACCES, shown, message)
    if isinstance(err, sandhub.ConflictError):
        lowered = message.lower()
        if "is a directory" in lowered:
            return sh.os_error(errno.EISDIR, shown)
        if "not a directory" in lowered:
            return sh.os_error(errno.ENOTDIR, shown)
        return sh.os_error(errno.EEXIST, shown, message)
    if isinstance(err, sandhub.InvalidArgumentError):
        return sh.os_error(errno.EINVAL, shown, message)
    return sh.os_error(errno.EIO, shown, str(err))
