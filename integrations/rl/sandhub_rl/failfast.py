"""Fail-fast decisions: which start failures end ``acquire`` at once, which
are worth waiting for, and for how long. Pure functions over the SDK's
exception classes, shared by the sync and async fleets and unit-tested
without a hub.

What the hub reports on the local backend (measured; see the README):

- an image that is not in the store: ``NOT_FOUND`` when the image's template
  is put (``no image `x` in the store``), so before any sandbox exists;
- an invalid image name: ``INVALID_ARGUMENT`` at the same point;
- a template that does not exist: ``NOT_FOUND`` at create;
- a sandbox whose start fails (e.g. the template's ``user`` is not in the
  image's ``/etc/passwd``): ``FAILED_PRECONDITION`` "sandbox X failed to
  start: sandboxd: ..." at create, nothing left behind (a config error:
  retried for ``grace_s``, as the issue asks of config errors); "failed to
  start: the sandbox exited before it was ready" comes as ``UNAVAILABLE``
  (exit at start: fatal);
- the tenant's quota full: ``RESOURCE_EXHAUSTED`` at create (it frees when
  other sandboxes go: unschedulable, not fatal);
- a sandbox whose processes die: state ``Finished`` (exec answers
  ``FAILED_PRECONDITION``), after a short window of ``UNAVAILABLE``.

- a sandbox whose entrypoint (its template's, else its image's command)
  ended: the create/GET answer's ``entrypoint`` says how, from sandboxd's
  record of its child and the cgroup's OOM counter (``OOMKilled``, ``Error``
  for a non-zero exit or a signal, ``StartError``, or ``Completed`` for exit
  0, which is normal for an image whose command is a shell).

What the kubernetes hub adds, from the starting sandbox's Pod status: a
fatal reason (``ErrImageNeverPull``, ``InvalidImageName``, ``OOMKilled``, a
container that exited at start) fails the create at once with
``FAILED_PRECONDITION`` "failed to start: <Reason>: ..."; any other
(``ImagePullBackOff``, ``CreateContainerConfigError``, ``CrashLoopBackOff``,
``Unschedulable``) is named in the ``UNAVAILABLE`` "not Ready within Ns:
<Reason>: ..." of its ready timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import sandhub

from .config import FailFastPolicy

__all__ = [
    "StartVerdict", "Stage", "classify_entrypoint", "classify_error", "classify_state", "should_retry",
    "start_check_verdict",
]

Kind = Literal["fatal", "retry", "unschedulable"]
Stage = Literal["template", "pool", "create", "wait", "setup"]


@dataclass(frozen=True)
class StartVerdict:
    """One start failure, judged: ``cause`` (a word for ``SandboxStartError``)
    and ``kind`` (``fatal``: fail now; ``retry``: wait up to ``grace_s``;
    ``unschedulable``: wait up to ``unschedulable_grace_s``)."""

    cause: str
    kind: Kind
    message: str = ""


#: Kubernetes' words in the kubernetes hub's create errors ("failed to
#: start: ErrImageNeverPull: ..." at once, or "not Ready within 180s:
#: ImagePullBackOff: ..." at its ready timeout), with the fleet's verdict.
_POD_REASONS: dict[str, tuple[str, Kind]] = {
    "ErrImageNeverPull": ("image_not_found", "fatal"),
    "InvalidImageName": ("invalid_image", "fatal"),
    "OOMKilled": ("oom_at_start", "fatal"),
    "ExitedAtStart": ("exited_at_start", "fatal"),
    "ErrImagePull": ("image_pull_failed", "retry"),
    "ImagePullBackOff": ("image_pull_backoff", "retry"),
    "CreateContainerConfigError": ("config_error", "retry"),
    "CreateContainerError": ("config_error", "retry"),
    "RunContainerError": ("config_error", "retry"),
    "CrashLoopBackOff": ("crash_loop", "retry"),
    "Unschedulable": ("unschedulable", "unschedulable"),
}
_POD_REASON_RE = re.compile(r"(?:failed to start|not Ready within \d+s): (\w+): ")


def classify_error(exc: BaseException, stage: Stage) -> StartVerdict:
    """The verdict for a hub error raised while starting a task's sandbox."""
    msg = getattr(exc, "message", None) or str(exc)
    pod_reason = _POD_REASON_RE.search(msg) if stage in ("create", "pool") else None
    if pod_reason and pod_reason.group(1) in _POD_REASONS:
        cause, kind = _POD_REASONS[pod_reason.group(1)]
        return StartVerdict(cause, kind, msg)
    if stage in ("create", "pool") and "failed to start" in msg:
        # The local hub's own launch failed; the wire word is all it says, so
        # the message tells the two apart (a reason field would be better).
        if "exited before it was ready" in msg:
            return StartVerdict("exited_at_start", "fatal", msg)
        if isinstance(exc, sandhub.FailedPreconditionError):  # sandboxd refused the template's config
            return StartVerdict("start_failed", "retry", msg)
    if isinstance(exc, sandhub.ResourceExhaustedError):
        return StartVerdict("unschedulable", "unschedulable", msg)
    if isinstance(exc, (sandhub.UnavailableError, sandhub.InternalError, sandhub.DeadlineExceededError)):
        return StartVerdict("unavailable", "retry", msg)
    if isinstance(exc, (sandhub.UnauthenticatedError, sandhub.PermissionDeniedError)):
        return StartVerdict("permission_denied", "fatal", msg)
    if stage == "template":
        if isinstance(exc, sandhub.NotFoundError):
            return StartVerdict("image_not_found", "fatal", msg)
        if isinstance(exc, sandhub.InvalidArgumentError):
            cause = "invalid_image" if "image" in msg.lower() else "invalid_template"
            return StartVerdict(cause, "fatal", msg)
        if isinstance(exc, sandhub.ConflictError):  # a concurrent writer of the same template
            return StartVerdict("template_conflict", "retry", msg)
    if stage in ("create", "pool"):
        if isinstance(exc, sandhub.NotFoundError):
            return StartVerdict("template_not_found", "fatal", msg)
        if isinstance(exc, sandhub.InvalidArgumentError):
            return StartVerdict("invalid_request", "fatal", msg)
        if isinstance(exc, (sandhub.ConflictError, sandhub.FailedPreconditionError)):
            return StartVerdict("start_refused", "retry", msg)
    if stage in ("wait", "setup"):
        if isinstance(exc, sandhub.NotFoundError):  # deleted from outside while starting
            return StartVerdict("lost_at_start", "retry", msg)
        if isinstance(exc, sandhub.FailedPreconditionError):
            return StartVerdict("exited_at_start", "fatal", msg)
    if isinstance(exc, sandhub.UnimplementedError):
        return StartVerdict("unimplemented", "fatal", msg)
    if isinstance(exc, sandhub.SandhubError):
        return StartVerdict(exc.code.lower(), "fatal", msg)
    return StartVerdict("client_error", "fatal", f"{type(exc).__name__}: {msg}")


def classify_state(state: str) -> StartVerdict | None:
    """The verdict for a sandbox seen in ``state`` while waiting for Ready;
    None while it may still become Ready."""
    if state in ("Finished", "Expired"):
        return StartVerdict("exited_at_start", "fatal", f"the sandbox became {state} before it was Ready")
    if state == "Suspended":
        return StartVerdict("suspended_at_start", "fatal", "the sandbox was suspended before it was Ready")
    return None


def classify_entrypoint(entrypoint: sandhub.EntrypointStatus | None, settle_s: float) -> StartVerdict | float:
    """Judges a Ready sandbox's entrypoint: a fatal verdict if it died in a
    way that means the sandbox will not serve; else how many more seconds it
    must run before it counts as started (0.0: it does, or there is none)."""
    if entrypoint is None or entrypoint.state == "Completed":
        return 0.0
    if entrypoint.state == "OOMKilled":
        return StartVerdict("oom_at_start", "fatal", "the entrypoint was OOM-killed at start")
    if entrypoint.state == "StartError":
        return StartVerdict("entrypoint_not_started", "fatal", f"the entrypoint did not start: {entrypoint.message}")
    if entrypoint.state == "Error":
        how = f"was killed by signal {entrypoint.signal}" if entrypoint.signal else f"exited {entrypoint.exit_code}"
        return StartVerdict("exited_at_start", "fatal", f"the entrypoint {how} at start")
    return max(0.0, settle_s - entrypoint.running_seconds)


def start_check_verdict(
    check: str, result: sandhub.CommandResult, entrypoint: sandhub.EntrypointStatus | None
) -> StartVerdict:
    """The verdict for a start check that exited non-zero: the entrypoint's
    death when that is why (the better cause), else ``start_check_failed``."""
    judged = classify_entrypoint(entrypoint, 0.0)
    if isinstance(judged, StartVerdict):
        return judged
    detail = (result.stderr or result.stdout).strip()[-500:]
    return StartVerdict("start_check_failed", "fatal", f"`{check}` exited {result.exit_code}: {detail}")


def should_retry(verdict: StartVerdict, policy: FailFastPolicy, elapsed_s: float, ready_timeout_s: float) -> bool:
    """Whether ``acquire`` tries again after ``elapsed_s`` seconds (counted
    from the start of the acquire) with ``verdict`` as the latest failure."""
    if elapsed_s >= ready_timeout_s:
        return False
    if not policy.enabled:
        return True
    if verdict.kind == "fatal":
        return False
    limit = policy.unschedulable_grace_s if verdict.kind == "unschedulable" else policy.grace_s
    return elapsed_s < limit


def backoff(policy: FailFastPolicy, attempt: int) -> float:
    """The wait before retry number ``attempt`` (1-based): doubling, capped."""
    return float(min(policy.max_backoff_s, policy.backoff_s * (2 ** max(0, attempt - 1))))
