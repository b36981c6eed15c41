"""The fleet's configuration: plain frozen dataclasses, checked when made,
so a typo'd value fails at the top of a training script rather than an hour
into the run."""

from __future__ import annotations

import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .warming import LookaheadWarmer

__all__ = ["FailFastPolicy", "FleetConfig", "ResourceSpec", "new_run_id", "check_run_id"]

# Label values on the hub: 1-63 of [A-Za-z0-9-_.] (both backends).
_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


def new_run_id() -> str:
    """``rl-<UTC yyyymmdd-hhmmss>-<8 hex>``: sortable by start time and unique."""
    return f"rl-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def check_run_id(run_id: str) -> str:
    """``run_id`` if it can be a hub label value, else ``ValueError``."""
    if not isinstance(run_id, str) or not _LABEL_VALUE_RE.match(run_id):
        raise ValueError(f"run_id must be 1-63 of [A-Za-z0-9._-] (a label value), not {run_id!r}")
    return run_id


@dataclass(frozen=True)
class FailFastPolicy:
    """How long ``acquire`` keeps trying when a sandbox does not start.

    With ``enabled`` (the default), causes that cannot heal by waiting (the
    image is not in the store, an invalid image name, a missing template, a
    sandbox that finished before it was ready, a failed ``start_check``) fail
    ``acquire`` at once with ``SandboxStartError``. Retryable causes (hub
    unavailable or failing, a start deadline) are retried for ``grace_s``;
    unschedulable ones (the hub's quota is full, ``RESOURCE_EXHAUSTED``: it
    frees as other episodes release) for ``unschedulable_grace_s``.

    With ``enabled=False`` every cause is retried until the fleet's
    ``ready_timeout_s``, as a fleet without fail-fast would wait.

    A sandbox whose entrypoint was OOM-killed, exited non-zero or could not
    be started (the hub's ``entrypoint`` status) fails at once too
    (``oom_at_start``, ``exited_at_start``, ``entrypoint_not_started``). An
    entrypoint still younger than ``settle_s`` when its sandbox is Ready is
    looked at again once it is that old, so a crash in its first moments is
    caught; a warm sandbox's entrypoint is older and costs no wait, nor does a
    sandbox without one.

    ``start_check`` is a command run once the sandbox is ready; a non-zero
    exit is a non-retryable start failure (``start_check_failed``). This is
    how a task image says what "started" means beyond a living entrypoint,
    e.g. ``"test -S /run/app.sock"``.
    """

    enabled: bool = True
    grace_s: float = 30.0
    unschedulable_grace_s: float = 120.0
    start_check: str | None = None
    settle_s: float = 0.5
    #: First wait between retries; doubles up to ``max_backoff_s``.
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("grace_s", "unschedulable_grace_s", "settle_s", "backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"FailFastPolicy.{name} must be a finite number >= 0, not {value!r}")


_CPU_RE = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|k)?$")
_MEM_SCALE = {
    None: 1 / (1 << 20), "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1 << 20,
    "k": 1000 / (1 << 20), "K": 1000 / (1 << 20), "M": 1e6 / (1 << 20), "G": 1e9 / (1 << 20), "T": 1e12 / (1 << 20),
}


def _cpu_cores(value: float | int | str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        cores = float(value)
    elif isinstance(value, str) and (m := _CPU_RE.match(value.strip())):
        cores = float(m.group(1)) / (1000 if m.group(2) else 1)
    else:
        raise ValueError(f"cpu_limit must be cores (0.5) or a Kubernetes quantity ('500m'), not {value!r}")
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"cpu_limit must be positive, not {value!r}")
    return cores


def _memory_mb(value: int | str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        mb = float(value)
    elif isinstance(value, str) and (m := _MEM_RE.match(value.strip())):
        mb = float(m.group(1)) * _MEM_SCALE[m.group(2)]
    else:
        raise ValueError(f"memory_limit must be MiB (512) or a Kubernetes quantity ('512Mi', '2Gi'), not {value!r}")
    if not math.isfinite(mb) or mb < 1:
        raise ValueError(f"memory_limit must be at least 1 MiB, not {value!r}")
    return math.ceil(mb)


@dataclass(frozen=True)
class ResourceSpec:
    """Limits for the sandboxes of image tasks. ``cpu_limit`` in cores or a
    Kubernetes quantity (``"500m"``); ``memory_limit`` in MiB or a quantity
    (``"512Mi"``, ``"2Gi"``); ``disk_mb`` and ``pids`` as the hub's template
    fields. The hub checks the ranges (``INVALID_ARGUMENT`` otherwise)."""

    cpu_limit: float | int | str | None = None
    memory_limit: int | str | None = None
    disk_mb: int | None = None
    pids: int | None = None

    def __post_init__(self) -> None:
        self.template_fields()  # validates

    def template_fields(self) -> dict[str, Any]:
        """The hub template fields these limits set."""
        out: dict[str, Any] = {}
        if self.cpu_limit is not None:
            out["cpu"] = _cpu_cores(self.cpu_limit)
        if self.memory_limit is not None:
            out["memory_mb"] = _memory_mb(self.memory_limit)
        for name in ("disk_mb", "pids"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"ResourceSpec.{name} must be a positive int, not {value!r}")
                out[name] = value
        return out


#: In a sidecar's ``image`` (and ``command``), replaced by the task's image.
TASK_IMAGE = "{task_image}"


@dataclass(frozen=True)
class SidecarSpec:
    """A container beside the sandbox's own in its Pod (Kubernetes; the local
    backend refuses sidecars). ``image`` may be ``"{task_image}"`` (or contain
    it): each image task's template then runs its own image there too, e.g. a
    grader that sees the task's tests and the agent's ``/workspace``.
    ``command`` (argv) defaults to the image's; a sidecar that should wait for
    ``exec`` calls needs a long-running one that also ends on SIGTERM (as PID 1
    ``sleep`` does not, holding the Pod's deletion for its grace period), e.g.
    ``("sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait")``."""

    name: str
    image: str
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    resources: ResourceSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
            raise ValueError(f"a sidecar name must be a DNS label, not {self.name!r}")
        if self.name == "sandboxd" or self.name.startswith("sandhub-"):
            raise ValueError(f"sidecar name {self.name!r} is the hub's own")
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"sidecar {self.name}: image must be a non-empty string")
        if self.command is not None:
            object.__setattr__(self, "command", tuple(self.command))

    def template_fields(self, task_image: str | None) -> dict[str, Any]:
        """The hub's ``sidecars`` entry, ``{task_image}`` replaced."""

        def fill(text: str) -> str:
            if TASK_IMAGE in text and task_image is None:
                raise ValueError(f"sidecar {self.name} uses {TASK_IMAGE} but the task names a template, not an image")
            return text.replace(TASK_IMAGE, task_image or "")

        out: dict[str, Any] = {"name": self.name, "image": fill(self.image)}
        if self.command is not None:
            out["command"] = [fill(a) for a in self.command]
        if self.env:
            out["env"] = dict(self.env)
        if self.resources is not None:
            limits = self.resources.template_fields()
            out.update({k: v for k, v in limits.items() if k in ("cpu", "memory_mb")})
        return out


@dataclass(frozen=True)
class TemplateSpec:
    """How the fleet shapes the hub template of each image task:

    - ``resources``: the sandbox's limits;
    - ``extra_template_spec``: any other hub template fields (``network``,
      ``entrypoint``, ``env``, ``workdir``...), not ``image``;
    - ``sidecars``: :class:`SidecarSpec` containers of the Pod (Kubernetes);
    - ``target_container``: where ``handle.exec`` runs when given no
      ``container`` (None: the sandbox's own container).
    """

    resources: ResourceSpec | None = None
    extra_template_spec: Mapping[str, Any] = field(default_factory=dict)
    sidecars: tuple[SidecarSpec, ...] = ()
    target_container: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sidecars", tuple(self.sidecars))
        for k in ("image", "root_fs", "sidecars"):
            if k in self.extra_template_spec:
                raise ValueError(f"extra_template_spec may not set {k!r}: the task names the image")
        names = [s.name for s in self.sidecars]
        if len(set(names)) != len(names):
            raise ValueError(f"sidecar names must be unique: {names}")
        if self.target_container is not None and self.target_container not in names:
            raise ValueError(f"target_container {self.target_container!r} is none of the sidecars {names}")

    def template_fields(self, image: str) -> dict[str, Any]:
        """The hub template an image task's sandboxes are made from."""
        spec: dict[str, Any] = dict(self.extra_template_spec)
        if self.resources is not None:
            spec.update(self.resources.template_fields())
        spec["image"] = image
        if self.sidecars:
            spec["sidecars"] = [s.template_fields(image) for s in self.sidecars]
        return spec


@dataclass(frozen=True)
class FleetConfig:
    """What a fleet does for one training run.

    - ``run_id`` labels every sandbox of the run (``sandhub-rl/run``), so a
      crashed run's sandboxes can be found and reaped; default: a new one.
    - ``template`` (a :class:`TemplateSpec`) shapes the template made for
      each image task: limits, other template fields, sidecars. ``resources``
      and ``extra_template_spec`` are its two most used fields, given here
      directly (not together with ``template``). Tasks naming a template use
      it as is.
    - ``warm_per_template`` > 0 keeps that many warm sandboxes per template
      in a pool of the run's own (deleted at teardown); acquire claims from
      it, and starts cold when it is empty.
    - ``warmer`` (a :class:`~sandhub_rl.LookaheadWarmer`) instead sizes those
      pools for the tasks planned next (``fleet.add_tasks``).
    - ``shutdown_after_s``: every sandbox's absolute deadline on the hub, a
      backstop when both the trainer and the reaper are gone.
    - ``ready_timeout_s`` bounds one acquire; ``setup_timeout_s`` each setup
      command; ``exec_timeout_s`` is the default for ``handle.exec``.
    - ``labels`` are added to every sandbox (the fleet's own win).
    """

    run_id: str = field(default_factory=new_run_id)
    resources: ResourceSpec | None = None
    extra_template_spec: Mapping[str, Any] = field(default_factory=dict)
    template: TemplateSpec | None = None
    warm_per_template: int = 0
    warmer: LookaheadWarmer | None = None
    fail_fast: FailFastPolicy = field(default_factory=FailFastPolicy)
    ready_timeout_s: float = 300.0
    setup_timeout_s: float = 600.0
    exec_timeout_s: float | None = None
    shutdown_after_s: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: ``template``, or the one the two shorthand fields make (made once).
    _template_spec: TemplateSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if not isinstance(self.warm_per_template, int) or self.warm_per_template < 0:
            raise ValueError(f"warm_per_template must be an int >= 0, not {self.warm_per_template!r}")
        if self.warmer is not None and self.warm_per_template:
            raise ValueError("set warm_per_template (fixed pools) or warmer (lookahead pools), not both")
        for name in ("ready_timeout_s", "setup_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"FleetConfig.{name} must be a positive number, not {value!r}")
        if self.shutdown_after_s is not None and (not isinstance(self.shutdown_after_s, int) or self.shutdown_after_s < 1):
            raise ValueError(f"shutdown_after_s must be a positive int, not {self.shutdown_after_s!r}")
        if self.template is not None and (self.resources is not None or self.extra_template_spec):
            raise ValueError("give resources and extra_template_spec in template=TemplateSpec(...), or directly, not both")
        spec = self.template or TemplateSpec(resources=self.resources, extra_template_spec=self.extra_template_spec)
        object.__setattr__(self, "_template_spec", spec)

    def template_spec(self) -> TemplateSpec:
        """``template``, or the one ``resources`` and ``extra_template_spec`` make."""
        return self._template_spec
