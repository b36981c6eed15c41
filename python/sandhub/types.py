"""Typed values the SDK hands back. All are frozen dataclasses built from
the hub's JSON; unknown fields are ignored so a newer hub never breaks an
older SDK."""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CommandResult",
    "ProcessOutputEvent",
    "ProcessExitEvent",
    "ProcessEvent",
    "FileEntry",
    "WatchEvent",
    "Snapshot",
    "ListeningPort",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxUsage",
    "UsageLimits",
    "UsageSample",
    "NetworkPolicy",
    "Template",
    "Pool",
    "Image",
    "PruneResult",
    "StepResult",
    "CodeContext",
    "CodeResult",
    "ExecutionError",
    "ExecutionLogs",
    "Execution",
]


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class CommandResult:
    """A finished command: its exit code and all of its output."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @classmethod
    def _from(cls, data: dict[str, Any]) -> CommandResult:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ProcessOutputEvent:
    """A chunk of a running process's output; ``stream`` is ``stdout`` or ``stderr``."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        """The chunk decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ProcessExitEvent:
    """The last event of a process. ``signal`` is set when a signal killed it
    (the shell convention: exit code 128 + n)."""

    exit_code: int
    signal: int | None = None


ProcessEvent = ProcessOutputEvent | ProcessExitEvent


@dataclass(frozen=True)
class FileEntry:
    """One directory entry (``type`` is ``file`` or ``directory``)."""

    name: str
    type: Literal["file", "directory"]
    size: int
    mode: str = ""
    modified_at: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @classmethod
    def _from(cls, data: dict[str, Any]) -> FileEntry:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched path (``type``: CREATE, WRITE, REMOVE, RENAME, CHMOD, ERROR)."""

    type: str
    path: str
    is_dir: bool = False
    old_path: str = ""
    message: str = ""
    timestamp_ms: int = 0

    @classmethod
    def _from(cls, data: dict[str, Any]) -> WatchEvent:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a sandbox's workspace (fork from it with ``fork(snapshot=...)``)."""

    id: str
    sandbox_id: str
    created_at: str = ""
    size_bytes: int | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Snapshot:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ListeningPort:
    """A TCP port something listens on inside a sandbox (``sandbox.ports.list()``)."""

    port: int
    address: str = ""

    @classmethod
    def _from(cls, data: dict[str, Any]) -> ListeningPort:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class EntrypointStatus:
    """A sandbox's entrypoint (its template's, else its image's command):
    ``state`` is ``Running`` or how it ended, in Kubernetes' words:
    ``Completed`` (exit 0, normal for an image whose command is a shell),
    ``Error`` (a non-zero exit or a signal), ``OOMKilled``, or ``StartError``
    (it could not be started; ``message`` says why). ``running_seconds`` is
    how long it has run, or ran."""

    state: str
    started_at: str = ""
    running_seconds: float = 0.0
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None

    @property
    def failed(self) -> bool:
        """Whether it ended in a way that means the sandbox will not serve."""
        return self.state in ("Error", "OOMKilled", "StartError")

    @classmethod
    def _from(cls, data: dict[str, Any]) -> EntrypointStatus:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's ``network`` (docs/networking.md): ``mode`` (``none``,
    ``egress`` or ``host``) and, for ``egress``, where it may connect
    (``allow_out``) and may never connect (``deny_out``; deny wins).
    Patterns: a name (``pypi.org``), a wildcard below a name
    (``*.github.com``), a CIDR (``203.0.113.0/24``), each with an optional
    TCP ``:PORT``; ``udp:HOST:PORT`` opens a UDP port. On a sandbox it may
    only narrow its template's policy."""

    mode: Literal["none", "egress", "host"] = "egress"
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    def _json(self) -> dict[str, Any]:
        """The request body's form (always an object)."""
        body: dict[str, Any] = {"mode": self.mode}
        if self.allow_out:
            body["allow_out"] = list(self.allow_out)
        if self.deny_out:
            body["deny_out"] = list(self.deny_out)
        return body

    @classmethod
    def _from(cls, data: str | dict[str, Any]) -> NetworkPolicy:
        if isinstance(data, str):
            return cls(mode=data)  # type: ignore[arg-type]
        known = _known(cls, data)
        for k in ("allow_out", "deny_out"):
            if k in known:
                known[k] = tuple(known[k])
        # An object with lists but no mode means egress (the API's rule).
        return cls(**known)


@dataclass(frozen=True)
class UsageLimits:
    """What a sandbox's usage is measured against; None: no such limit.
    ``cpu`` is in cores."""

    memory_mb: int | None = None
    disk_mb: int | None = None
    cpu: float | None = None
    pids: int | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> UsageLimits:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class UsageSample:
    """One point of a sandbox's usage, over the step ending at ``timestamp``
    (RFC 3339): ``cpu_cores`` used on average, the most ``memory_bytes`` and
    ``pids``, ``disk_bytes`` at the end (None without a disk quota), and the
    network payload bytes of an ``egress`` sandbox (None without one)."""

    timestamp: str
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    pids: int = 0
    disk_bytes: int | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> UsageSample:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SandboxUsage:
    """A running sandbox's latest sample (``sandbox.usage``, from its last
    fetch), its memory high-water mark, the processes the kernel OOM-killed
    in it, and its limits."""

    latest: UsageSample
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    limits: UsageLimits = field(default_factory=UsageLimits)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> SandboxUsage:
        known = _known(cls, data)
        known["latest"] = UsageSample._from(known.get("latest") or {"timestamp": ""})
        known["limits"] = UsageLimits._from(known.get("limits") or {})
        return cls(**known)


@dataclass(frozen=True)
class SandboxMetrics:
    """``sandbox.metrics()``: the samples (oldest first, ``step_seconds``
    apart; older ones may be 10 s apart) and the limits they are measured
    against. Empty while the sandbox is not running."""

    step_seconds: int = 1
    limits: UsageLimits = field(default_factory=UsageLimits)
    samples: tuple[UsageSample, ...] = ()

    @classmethod
    def _from(cls, data: dict[str, Any]) -> SandboxMetrics:
        known = _known(cls, data)
        known["limits"] = UsageLimits._from(known.get("limits") or {})
        known["samples"] = tuple(UsageSample._from(s) for s in known.get("samples") or ())
        return cls(**known)


@dataclass(frozen=True)
class SandboxInfo:
    """What the hub knows about a sandbox at the time of the call."""

    id: str
    template: str = ""
    state: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    shutdown_at: str | None = None
    idle_timeout_seconds: int | None = None
    #: What the idle timeout does when not ``"delete"``: ``"suspend"`` or ``"pause"``.
    idle_action: str | None = None
    #: Whether calls that need it running resume it first (paused or suspended).
    auto_resume: bool = False
    pool: str | None = None
    forked_from: str | None = None
    launch: Any = None
    #: Set on one sandbox's create/get answer while it is Ready and has an
    #: entrypoint (the local backend); None otherwise.
    entrypoint: EntrypointStatus | None = None
    #: Its own narrowing of its template's network (from ``create`` or
    #: ``set_network``); None when it runs with the template's.
    network: NetworkPolicy | None = None
    #: Its latest usage sample and limits while it runs (the backend
    #: samples each second); None otherwise.
    usage: SandboxUsage | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> SandboxInfo:
        known = _known(cls, data)
        if isinstance(known.get("usage"), dict):
            known["usage"] = SandboxUsage._from(known["usage"])
        if isinstance(known.get("entrypoint"), dict):
            known["entrypoint"] = EntrypointStatus._from(known["entrypoint"])
        if isinstance(known.get("network"), (str, dict)):
            known["network"] = NetworkPolicy._from(known["network"])
        return cls(**known)


@dataclass(frozen=True)
class Template:
    """A named template: ``spec`` is its JSON body (image, command, env, resources...)."""

    name: str
    spec: dict[str, Any]

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Template:
        spec = dict(data)
        name = spec.pop("name")
        return cls(name=name, spec=spec)


@dataclass(frozen=True)
class Pool:
    """A warm pool: ``ready`` of ``replicas`` sandboxes of ``template`` are waiting.
    ``last_error`` says why warm starts keep failing (they are retried with
    back-off); None once one succeeds."""

    name: str
    template: str
    replicas: int
    ready: int = 0
    total: int = 0
    last_error: str | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Pool:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Volume:
    """A named volume: at most ``size_mb`` MiB of files that outlive
    sandboxes. ``created_at`` is RFC 3339, UTC."""

    name: str
    size_mb: int
    created_at: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Volume:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class VolumeSnapshot:
    """A read-only snapshot of a volume (``volume@name``), which
    ``hub.volumes.create(..., from_snapshot=...)`` copies into a new
    volume. ``created_at`` is RFC 3339, UTC."""

    volume: str
    name: str
    created_at: str = ""

    @classmethod
    def _from(cls, data: dict[str, Any]) -> VolumeSnapshot:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Image:
    """An image in the hub's store, as this tenant sees it: ``id`` is the
    config digest, ``tags`` this tenant's names for it, ``layers`` the diff
    ids bottom first, ``config`` the image's Env/workdir/user/entrypoint/cmd."""

    id: str
    tags: list[str] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    size_bytes: int = 0
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Image:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class PruneResult:
    """What ``images.prune()`` removed: image ids, and counts of layers and blobs."""

    images: list[str] = field(default_factory=list)
    layers: int = 0
    blobs: int = 0

    @classmethod
    def _from(cls, data: dict[str, Any]) -> PruneResult:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class PrepulledImage:
    """One reference of ``images.prepull()``: ``ok`` with the image's ``id`` in the
    store (local backend) or the ``daemonset`` that pulled it (Kubernetes), else ``error``."""

    reference: str
    ok: bool = False
    id: str | None = None
    daemonset: str | None = None
    error: str | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> PrepulledImage:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class PrepullResult:
    """What ``images.prepull()`` did: ``ok`` when every image was pulled everywhere
    it was meant to be; one :class:`PrepulledImage` per reference; on Kubernetes
    also the DaemonSets that pulled them (as the hub reports them)."""

    ok: bool
    images: list[PrepulledImage] = field(default_factory=list)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> PrepullResult:
        known = _known(cls, data)
        known["images"] = [PrepulledImage._from(i) for i in known.get("images", [])]
        return cls(**known)


@dataclass(frozen=True)
class StepResult:
    """One Gym step: ``(observation, reward, terminated, truncated, info)`` by name."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    def astuple(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The gymnasium ``step`` tuple."""
        return (self.observation, self.reward, self.terminated, self.truncated, self.info)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> StepResult:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class CodeContext:
    """A code-interpreter context: one kernel, whose variables, imports and
    working directory persist between executions. ``state`` is ``idle``,
    ``busy`` or ``dead`` (its kernel exited, ``exit`` says why:
    ``sandbox.code.contexts.restart`` brings it back, empty)."""

    id: str
    language: str
    cwd: str
    state: str
    exit: str | None = None

    @classmethod
    def _from(cls, data: dict[str, Any]) -> CodeContext:
        return cls(**_known(cls, data))


#: The MIME types of a kernel's result bundle, by the attribute that holds each.
_MIME = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "svg": "image/svg+xml",
    "json": "application/json",
}


@dataclass(frozen=True)
class CodeResult:
    """One rich result of an execution: the cell's value
    (``is_main_result``) or something it displayed. Each format the kernel
    gave is set: ``png`` and ``jpeg`` as decoded bytes, ``json`` as the
    parsed value, the rest as text. ``truncated`` means the hub dropped or
    cut formats to keep the bundle within its bound."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    png: bytes | None = None
    jpeg: bytes | None = None
    svg: str | None = None
    json: Any = None
    is_main_result: bool = False
    truncated: bool = False

    def formats(self) -> list[str]:
        """The names of the formats it has (``text``, ``html``, ``png``, ...)."""
        return [name for name in _MIME if getattr(self, name) is not None]

    @classmethod
    def _from(cls, data: dict[str, Any]) -> CodeResult:
        values: dict[str, Any] = {name: data.get(mime) for name, mime in _MIME.items()}
        for image in ("png", "jpeg"):
            if isinstance(values[image], str):
                values[image] = base64.b64decode(values[image])
        return cls(
            **values,
            is_main_result=bool(data.get("is_main_result", False)),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True)
class ExecutionError:
    """The exception an execution raised: ``name`` (``ZeroDivisionError``;
    ``TimeoutError`` when its timeout interrupted it; ``KernelDied`` when
    the kernel exited under it), ``value`` (its message) and ``traceback``
    (the kernel's lines, joined)."""

    name: str
    value: str
    traceback: str = ""

    @classmethod
    def _from(cls, data: dict[str, Any]) -> ExecutionError:
        lines = data.get("traceback") or []
        return cls(str(data.get("name", "")), str(data.get("value", "")), "\n".join(map(str, lines)))


@dataclass(frozen=True)
class ExecutionLogs:
    """What an execution printed, in the chunks the kernel sent."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Execution:
    """A finished execution: its ``results`` (the cell's value and each
    display), ``logs``, and ``error`` when it raised. ``execution_count``
    is the kernel's ``In [n]``; ``duration`` is in seconds; ``dropped``
    counts output messages lost to a flood."""

    results: list[CodeResult] = field(default_factory=list)
    logs: ExecutionLogs = field(default_factory=ExecutionLogs)
    error: ExecutionError | None = None
    execution_count: int = 0
    duration: float = 0.0
    dropped: int = 0

    @property
    def text(self) -> str | None:
        """The cell's value as text (``x * 2`` gives ``"42"``), if it had one."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None
