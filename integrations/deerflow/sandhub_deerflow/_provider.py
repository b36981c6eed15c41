"""``SandhubSandboxProvider``: DeerFlow's ``SandboxProvider`` on a Sandhub hub."""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import sandhub
from deerflow.sandbox.sandbox_provider import SandboxProvider

from . import _shell as sh
from ._paths import PathMap
from ._sandbox import MAX_DOWNLOAD_BYTES, SandhubSandbox
from ._settings import Settings

logger = logging.getLogger(__name__)

#: Labels every sandbox of this provider carries (values: see :func:`label_value`).
LABEL_APP = "app"
APP = "deerflow"
LABEL_THREAD = "deerflow.thread"
LABEL_USER = "deerflow.user"

_Key = tuple[str, str]  # (user, thread)


def label_value(text: str) -> str:
    """A thread or user id as a label value. Hub label values are short and
    plain (``[A-Za-z0-9._-]``, 63 at most) while DeerFlow's ids are any
    text, so every id is hashed: one form for all, and no raw id can be
    chosen to collide with another's label."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class SandhubSandboxProvider(SandboxProvider):
    """One Sandhub sandbox per DeerFlow thread.

    DeerFlow builds it with no arguments (``sandbox.use:
    sandhub_deerflow:SandhubSandboxProvider``); its settings are the keys
    beside ``use:`` (:class:`~sandhub_deerflow._settings.Settings`).

    - ``acquire(thread_id, user_id=...)`` gives the thread's sandbox: the one
      this provider holds, else one on the hub labelled for that thread and
      user (so a restarted gateway finds it again), else a new one. Without
      a thread it makes a new sandbox every call. Every sandbox it hands out
      has ``/mnt/user-data/{workspace,uploads,outputs}``.
    - ``get(id)`` reads memory only: DeerFlow calls it on its event loop.
    - ``release(id)``: DeerFlow releases at the end of every agent turn and
      then reads the thread's outputs, so a thread's sandbox stays by default
      (``on_release: keep``; the hub deletes it after ``idle_timeout`` idle
      seconds); ``suspend`` stops its processes until the next acquire,
      ``delete`` deletes it. A sandbox acquired without a thread is deleted.
    - ``shutdown()`` deletes every sandbox this provider holds.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_deerflow()
        self._hub = sandhub.Hub(
            self.settings.sandhub_url, self.settings.api_key, max_download_size=MAX_DOWNLOAD_BYTES
        )
        self._paths = PathMap(real_root=self.settings.user_data_root)
        self._lock = threading.Lock()
        self._held: dict[str, SandhubSandbox] = {}  # every sandbox this provider owns
        self._active: set[str] = set()  # the ones handed out and not released
        self._thread_of: dict[str, _Key] = {}
        self._by_thread: dict[_Key, str] = {}
        self._thread_locks: dict[_Key, threading.Lock] = {}

    @property
    def hub(self) -> sandhub.Hub:
        return self._hub

    # ---------------------------------------------------------------- DeerFlow's interface

    def acquire(self, thread_id: str | None = None, *, user_id: str | None = None) -> str:
        if thread_id is None:
            sandbox = self._create(None, user_id)
            self._register(sandbox, None)
            return str(sandbox.id)
        key: _Key = (user_id or "", thread_id)
        with self._lock:
            thread_lock = self._thread_locks.setdefault(key, threading.Lock())
        # One acquire per thread at a time (a second waits and reuses the
        # first's sandbox); other threads' acquires run alongside.
        with thread_lock:
            with self._lock:
                held = self._held.get(self._by_thread.get(key, ""))
            revived = self._revive(held) if held is not None else None
            sandbox = revived or self._adopt(key) or self._create(thread_id, user_id)
            self._register(sandbox, key)
            return str(sandbox.id)

    def get(self, sandbox_id: str) -> SandhubSandbox | None:
        with self._lock:
            return self._held.get(sandbox_id) if sandbox_id in self._active else None

    def release(self, sandbox_id: str) -> None:
        with self._lock:
            key = self._thread_of.get(sandbox_id)
            thread_lock = self._thread_locks.setdefault(key, threading.Lock()) if key else threading.Lock()
        # Under the thread's lock: an acquire of the same thread runs before or after, never amid.
        with thread_lock:
            with self._lock:
                sandbox = self._held.get(sandbox_id)
                self._active.discard(sandbox_id)
            if sandbox is None:
                return
            policy = self.settings.on_release if key is not None else "delete"
            if policy == "delete":
                self._forget(sandbox_id)
                _delete(sandbox)
            elif policy == "suspend":
                try:
                    sandbox.sandbox.suspend()
                except sandhub.SandhubError as err:
                    logger.warning("suspending sandbox %s on release failed: %s", sandbox_id, err)

    def shutdown(self) -> None:
        """Deletes every sandbox this provider holds (safe to call twice)."""
        with self._lock:
            sandboxes = list(self._held.values())
            self._held.clear()
            self._active.clear()
            self._thread_of.clear()
            self._by_thread.clear()
            self._thread_locks.clear()
        for sandbox in sandboxes:
            _delete(sandbox)

    # ---------------------------------------------------------------- internals

    def _labels(self, thread_id: str | None, user_id: str | None) -> dict[str, str]:
        labels = {LABEL_APP: APP, LABEL_USER: label_value(user_id or "")}
        if thread_id is not None:
            labels[LABEL_THREAD] = label_value(thread_id)
        return labels

    def _create(self, thread_id: str | None, user_id: str | None) -> SandhubSandbox:
        info: dict[str, Any] = {"labels": self._labels(thread_id, user_id)}
        if self.settings.environment:
            info["env"] = self.settings.environment
        if self.settings.idle_timeout:
            info["idle_timeout_seconds"] = self.settings.idle_timeout
        raw = self._hub.create(self.settings.template, **info)
        try:
            return self._bootstrap(raw)
        except BaseException:
            _delete_raw(raw)
            raise

    def _adopt(self, key: _Key) -> SandhubSandbox | None:
        """A sandbox on the hub labelled for this thread (made by an earlier
        provider, say before a restart), made ready; None when there is none."""
        user_id, thread_id = key
        for raw in self._hub.list(self._labels(thread_id, user_id)):
            if raw.state not in ("Ready", "Suspended", "Pending"):
                continue
            try:
                if raw.state == "Suspended":
                    raw.resume()
                return self._bootstrap(raw)
            except (sandhub.SandhubError, RuntimeError) as err:
                logger.warning("cannot adopt sandbox %s for thread %s: %s", raw.id, thread_id, err)
        return None

    def _revive(self, sandbox: SandhubSandbox) -> SandhubSandbox | None:
        """The held sandbox if it still runs (resumed when suspended); None,
        and forgotten, when the hub no longer has it (idle timeout, say)."""
        raw = sandbox.sandbox
        try:
            raw.refresh()
            if raw.state == "Suspended":
                raw.resume()
            if raw.state in ("Ready", "Suspended", "Pending"):
                self._make_dirs(raw)  # again: a reset of the sandbox drops them
                return sandbox
        except sandhub.NotFoundError:
            pass
        except (sandhub.SandhubError, RuntimeError) as err:
            logger.warning("sandbox %s cannot be reused: %s", raw.id, err)
        self._forget(raw.id)
        _delete(sandbox)
        return None

    def _bootstrap(self, raw: sandhub.Sandbox) -> SandhubSandbox:
        """The adapter's sandbox on ``raw``, once its user-data directories exist."""
        return SandhubSandbox(raw, paths=self._paths, timeout=self.settings.timeout, shell=self._make_dirs(raw))

    def _make_dirs(self, raw: sandhub.Sandbox) -> str:
        """Makes ``/mnt/user-data``'s directories and finds bash (its path,
        else ``/bin/sh``), in one round trip."""
        result = raw.commands.run(sh.argv(sh.BOOTSTRAP, *self._paths.real_dirs()), timeout=60)
        if result.exit_code != 0:
            raise RuntimeError(
                f"sandbox {raw.id}: cannot create {', '.join(self._paths.real_dirs())}: "
                f"{(result.stderr or result.stdout).strip()[-300:]}"
            )
        bash = result.stdout.strip().splitlines()
        return bash[-1] if bash and bash[-1].startswith("/") else "/bin/sh"

    def _register(self, sandbox: SandhubSandbox, key: _Key | None) -> None:
        with self._lock:
            self._held[sandbox.id] = sandbox
            self._active.add(sandbox.id)
            if key is not None:
                self._thread_of[sandbox.id] = key
                self._by_thread[key] = sandbox.id

    def _forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._held.pop(sandbox_id, None)
            self._active.discard(sandbox_id)
            key = self._thread_of.pop(sandbox_id, None)
            if key is not None and self._by_thread.get(key) == sandbox_id:
                del self._by_thread[key]


def _delete(sandbox: SandhubSandbox) -> None:
    _delete_raw(sandbox.sandbox)


def _delete_raw(raw: sandhub.Sandbox) -> None:
    try:
        raw.delete()
    except sandhub.NotFoundError:
        pass  # already gone: what deleting wanted
    except sandhub.SandhubError as err:
        logger.warning("deleting sandbox %s failed: %s", raw.id, err)
