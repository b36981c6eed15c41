"""``SandhubProvider``: NeMo Gym's async ``SandboxProvider`` over ``sandhub.AsyncHub``."""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any, Mapping

import sandhub
from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)

from . import _transfer

#: ``return_code`` of a command the sandbox could not finish (NeMo Gym's
#: ``local`` provider uses the same sentinel); ``error_type`` says why.
RUNTIME_RETURN_CODE = 125

_STATUS = {
    "Pending": SandboxStatus.STARTING,
    "Ready": SandboxStatus.RUNNING,
    "Suspended": SandboxStatus.PAUSED,
    "Finished": SandboxStatus.STOPPED,
    "Expired": SandboxStatus.STOPPED,
}


class SandhubProvider:
    """Sandboxes on a Sandhub hub for NeMo Gym.

    Config (beside ``sandhub:`` in a ``sandbox:`` block, see
    ``configs/sandhub.yaml``): ``base_url`` and ``token`` (default
    ``$SANDHUB_URL`` / ``$SANDHUB_API_KEY``), ``template`` (when the spec
    names no image), ``images`` (image name -> template name; an unmapped
    image is taken as a template name), ``default_timeout_s``.

    ``SandboxSpec.resources`` (cpu, memory, disk) become a template derived
    from the chosen one, named after its content so equal specs share it;
    a GPU request is refused. ``ttl_s`` is the sandbox's shutdown deadline.
    """

    name = "sandhub"

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        template: str | None = None,
        images: Mapping[str, str] | None = None,
        default_timeout_s: float = 180.0,
    ) -> None:
        self._hub = sandhub.AsyncHub(base_url, token)
        self._template = template
        self._images = dict(images or {})
        self._default_timeout_s = default_timeout_s

    # ------------------------------------------------------------------ lifecycle

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        try:
            template = await self._template_for(spec)
            sandbox = await self._hub.create(
                template,
                env=dict(spec.env) or None,
                labels={"nemo-gym": "true"},
                shutdown_after_seconds=max(1, int(spec.ttl_s)) if spec.ttl_s else None,
                wait_timeout=float(spec.ready_timeout_s or 600.0),
            )
        except sandhub.SandhubError as err:
            raise SandboxCreateError(f"sandhub: creating a sandbox failed: {err}") from err
        # Ready means commands and files work; check both before answering,
        # and learn where the workspace is (relative paths resolve there).
        try:
            probe = await sandbox.commands.run(["/bin/sh", "-c", "pwd"])
            workspace = probe.stdout.strip()
            if probe.exit_code != 0 or not workspace.startswith("/"):
                raise SandboxCreateVerificationError(f"sandhub: sandbox {sandbox.id} did not run `pwd`: {probe}")
            await sandbox.files.exists(".")
            workdir = posixpath.join(workspace, spec.workdir) if spec.workdir else workspace
            if spec.workdir:
                made = await sandbox.commands.run(["mkdir", "-p", "--", workdir])
                if made.exit_code != 0:
                    raise SandboxCreateVerificationError(f"sandhub: workdir {spec.workdir}: {made.stderr.strip()}")
        except BaseException:
            await _delete_quietly(sandbox)
            raise
        return _handle(sandbox, workspace, workdir)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            sandbox = await _sandbox(handle).refresh()
        except sandhub.NotFoundError:
            return SandboxStatus.STOPPED
        except sandhub.SandhubError:
            return SandboxStatus.UNKNOWN
        return _STATUS.get(sandbox.state, SandboxStatus.UNKNOWN)

    async def close(self, handle: SandboxHandle) -> None:
        await _delete_quietly(_sandbox(handle))

    async def aclose(self) -> None:
        await self._hub.close()

    # ------------------------------------------------------------------ work

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        if user is not None:
            raise ValueError("the sandhub provider runs every command as the sandbox's own user")
        timeout = timeout_s if timeout_s is not None else self._default_timeout_s
        try:
            result = await _sandbox(handle).commands.run(_argv(command, cwd), env=env, timeout=timeout)
        except sandhub.SandhubError as err:
            return SandboxExecResult(stdout=None, stderr=str(err), return_code=RUNTIME_RETURN_CODE, error_type=err.code.lower())
        if result.timed_out:
            return SandboxExecResult(
                stdout=result.stdout,
                stderr=f"{result.stderr}sandhub: command timed out after {timeout:g}s",
                return_code=RUNTIME_RETURN_CODE,
                error_type="timeout",
            )
        return SandboxExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        raw = handle.raw
        await _transfer.upload(raw["sandbox"], raw["workdir"], raw["workspace"], Path(source_path), target_path)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        raw = handle.raw
        await _transfer.download(raw["sandbox"], raw["workdir"], raw["workspace"], source_path, Path(target_path))

    # ------------------------------------------------------------------ capabilities

    async def pause(self, handle: SandboxHandle) -> None:
        """SupportsSandboxPauseResume: the sandbox is suspended (workspace kept)."""
        await _sandbox(handle).suspend()

    async def resume(self, handle: SandboxHandle) -> None:
        await _sandbox(handle).resume()

    async def serialize_handle(self, handle: SandboxHandle, *, scope: str | None = None) -> dict[str, Any]:
        """ConnectableProvider: a sandbox is reachable by its id from any process."""
        return {"sandbox_id": handle.sandbox_id, "workspace": handle.raw["workspace"], "workdir": handle.raw["workdir"]}

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        sandbox = await self._hub.get(str(descriptor["sandbox_id"]))
        workspace = descriptor.get("workspace")
        if not isinstance(workspace, str):
            workspace = (await sandbox.commands.run(["/bin/sh", "-c", "pwd"])).stdout.strip()
        workdir = descriptor.get("workdir")
        return _handle(sandbox, workspace, workdir if isinstance(workdir, str) else workspace)

    # ------------------------------------------------------------------ templates

    async def _template_for(self, spec: SandboxSpec) -> str | None:
        base = self._images.get(spec.image, spec.image) if spec.image else self._template
        resources = spec.resources if isinstance(spec.resources, SandboxResources) else SandboxResources.from_mapping(spec.resources)
        if resources.gpu:
            raise SandboxCreateError("sandhub: GPUs are not offered by the sandhub provider")
        limits = {
            k: v
            for k, v in (
                ("cpu", resources.cpu),
                ("memory_mb", resources.memory_mib),
                ("disk_mb", resources.disk_gib * 1024 if resources.disk_gib else None),
            )
            if v is not None
        }
        if not limits:
            return base
        try:
            body = dict((await self._hub.templates.get(base or "default")).spec)
        except sandhub.NotFoundError:
            if base is not None:
                raise
            body = {}  # the hub's built-in default: the host's /usr, no limits
        body.update(limits)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
        name = f"nemo-{digest}"
        await self._hub.templates.put(name, body)
        return name


# The hub takes an absolute `cwd` as relative to the workspace; NeMo Gym means
# the directory the sandbox's processes see, so the shell changes into it.
_IN_CWD = 'cd -- "$1" || exit 125; exec /bin/sh -c "$2"'


def _argv(command: str, cwd: str | None) -> list[str]:
    if cwd is None:
        return ["/bin/sh", "-c", command]
    return ["/bin/sh", "-c", _IN_CWD, "sh", cwd, command]


def _handle(sandbox: sandhub.AsyncSandbox, workspace: str, workdir: str) -> SandboxHandle:
    # `workspace`: the files API's root as the sandbox sees it; `workdir`: what
    # relative paths are relative to.
    raw = {"sandbox": sandbox, "workspace": workspace, "workdir": workdir}
    return SandboxHandle(sandbox_id=sandbox.id, provider_name="sandhub", raw=raw)


def _sandbox(handle: SandboxHandle) -> sandhub.AsyncSandbox:
    sandbox: sandhub.AsyncSandbox = handle.raw["sandbox"]
    return sandbox


async def _delete_quietly(sandbox: sandhub.AsyncSandbox) -> None:
    try:
        await sandbox.delete()
    except sandhub.NotFoundError:
        pass  # already gone: closing twice is fine
