"""Sandhub's Python SDK: isolated sandboxes for AI agents and RL trainers.

Bindings of the Rust ``sandhub-client`` (the same client the CLI, MCP and
Gym front doors use), with a blocking :class:`Hub` and an asyncio
:class:`AsyncHub` of the same shape, and :class:`Sandboxd` to drive one
sandboxd directly::

    import sandhub

    with sandhub.Hub() as hub, hub.create() as sb:
        print(sb.commands.run("echo hi").stdout)
        sb.files.write("notes.txt", b"hello")
"""

from __future__ import annotations

from ._async import (
    AsyncCommands,
    AsyncEvents,
    AsyncFiles,
    AsyncHub,
    AsyncPorts,
    AsyncProcessHandle,
    AsyncSandbox,
    AsyncSandboxd,
    AsyncWatch,
    AsyncWatcher,
)
from ._async_code import AsyncCode, AsyncCodeContexts
from ._async_services import AsyncEnv, AsyncGym, AsyncImages, AsyncPools, AsyncTemplates, AsyncVolumeFiles, AsyncVolumes
from ._sandhub import __version__
from ._sync import (
    Commands,
    Events,
    Files,
    Hub,
    Ports,
    ProcessHandle,
    Sandbox,
    Sandboxd,
    Watch,
    Watcher,
)
from ._sync_code import Code, CodeContexts
from ._sync_services import Env, Gym, Images, Pools, Templates, VolumeFiles, Volumes
from .errors import (
    AlreadyExistsError,
    ConflictError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ResponseTooLargeError,
    SandboxLostError,
    SandhubError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    error_for,
)
from .types import (
    CodeContext,
    CodeResult,
    CommandResult,
    EntrypointStatus,
    Execution,
    ExecutionError,
    ExecutionLogs,
    FileEntry,
    Image,
    ListeningPort,
    NetworkPolicy,
    Pool,
    ProcessEvent,
    ProcessExitEvent,
    ProcessOutputEvent,
    PrepulledImage,
    PrepullResult,
    PruneResult,
    SandboxInfo,
    SandboxMetrics,
    SandboxUsage,
    Snapshot,
    StepResult,
    Template,
    UsageLimits,
    UsageSample,
    Volume,
    VolumeSnapshot,
    WatchEvent,
)
from .webhooks import verify_webhook

__all__ = [
    "__version__",
    "Hub", "Sandbox", "Sandboxd", "Commands", "ProcessHandle", "Files", "Watcher", "Watch", "Ports",
    "Gym", "Env", "Templates", "Pools", "Images", "Volumes", "VolumeFiles", "Code", "CodeContexts", "Events", "AsyncEvents", "verify_webhook",
    "AsyncHub", "AsyncSandbox", "AsyncSandboxd", "AsyncCommands", "AsyncProcessHandle", "AsyncFiles",
    "AsyncWatcher", "AsyncWatch", "AsyncPorts", "AsyncGym", "AsyncEnv", "AsyncTemplates", "AsyncPools", "AsyncImages", "AsyncVolumes", "AsyncVolumeFiles", "AsyncCode", "AsyncCodeContexts",
    "CommandResult", "EntrypointStatus", "FileEntry", "Image", "PrepullResult", "PrepulledImage", "PruneResult", "ListeningPort", "Pool", "Volume", "VolumeSnapshot", "ProcessEvent", "ProcessExitEvent", "ProcessOutputEvent",
    "CodeContext", "CodeResult", "Execution", "ExecutionError", "ExecutionLogs",
    "NetworkPolicy", "SandboxInfo", "SandboxMetrics", "SandboxUsage", "Snapshot", "StepResult", "Template",
    "UsageLimits", "UsageSample", "WatchEvent",
    "SandhubError", "InvalidArgumentError", "UnauthenticatedError", "PermissionDeniedError",
    "NotFoundError", "AlreadyExistsError", "ConflictError", "FailedPreconditionError",
    "ResourceExhaustedError", "PayloadTooLargeError", "UnavailableError", "UnimplementedError",
    "DeadlineExceededError", "InternalError", "ResponseTooLargeError", "SandboxLostError", "error_for",
]
