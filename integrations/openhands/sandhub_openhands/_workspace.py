"""`SandhubWorkspace`: an OpenHands `RemoteWorkspace` whose agent server runs in a
Sandhub sandbox and is reached through the hub's port proxy."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import urlsplit

import sandhub
from openhands.sdk.workspace import CommandResult, RemoteWorkspace
from pydantic import Field, PrivateAttr, SecretStr, field_validator

from . import _server
from ._template import DEFAULT_TEMPLATE
from ._tunnel import PortTunnel


class SandhubWorkspace(RemoteWorkspace):
    """A sandbox on a Sandhub hub running ``openhands-agent-server``, as a workspace
    for ``Conversation(agent=..., workspace=...)`` (which then runs remotely).

    On construction it creates a sandbox from ``template`` (or attaches to
    ``sandbox_id``), starts the agent server inside with a fresh session key
    (``OH_SESSION_API_KEYS_0``), and waits until ``/health`` answers through
    the hub. Leaving the ``with`` (or ``cleanup()``) deletes the sandbox only when
    this workspace created it (and ``keep_sandbox`` is false).

    How the server is reached (``connection``):

    - ``"proxy"``: ``{hub}/v1/sandboxes/{id}/ports/{server_port}/``, the hub's HTTP
      port proxy. Each request carries both keys: the hub's as ``Authorization:
      Bearer`` (the proxy takes it off before forwarding) and the session key as
      ``X-Session-API-Key`` (for the server). A conversation's event WebSocket is
      opened by OpenHands without headers, so this suits an open hub (no API key).
    - ``"tunnel"``: a listener on this machine's loopback whose every connection
      is a raw TCP tunnel through the hub (``port-forward``, opened with the hub's
      key); HTTP and WebSocket alike reach the server, which sees only the session
      key. Local backend only (through ``sandhub-router`` a port carries HTTP only).
    - ``"auto"`` (default): ``"tunnel"`` when a hub key is in use, else ``"proxy"``.
    """

    if TYPE_CHECKING:  # RemoteWorkspace's field, named for mypy where openhands is not installed
        api_key: str | None

    host: str = Field(default="undefined", description="Set from the sandbox's port URL; not an input.")
    working_dir: str = Field(default="/workspace", description="Where the agent works, inside the sandbox.")
    hub_url: str | None = Field(default=None, description="The hub; default $SANDHUB_URL, else http://127.0.0.1:7070.")
    hub_api_key: SecretStr | str | None = Field(
        default=None, description="The hub's API key; default $SANDHUB_API_KEY (none for an open hub)."
    )
    template: str | None = Field(
        default=DEFAULT_TEMPLATE, description="Template of a new sandbox (see agent_server_template())."
    )
    sandbox_id: str | None = Field(default=None, description="Attach to this sandbox instead of creating one.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of a new sandbox.")
    server_port: int = Field(default=8000, ge=1, le=65535, description="The agent server's port in the sandbox.")
    server_command: list[str] = Field(
        default_factory=lambda: list(_server.DEFAULT_COMMAND),
        description="How the server starts (`--host` and `--port` are appended).",
    )
    server_env: dict[str, str] = Field(default_factory=dict, description="Extra environment of the server.")
    startup_timeout: float = Field(default=180.0, gt=0, description="Seconds to wait for /health.")
    keep_sandbox: bool = Field(default=False, description="Keep a sandbox this workspace created on exit.")
    connection: Literal["auto", "proxy", "tunnel", "direct"] = Field(
        default="auto", description="How the server is reached: the hub's port proxy, a loopback tunnel, or directly."
    )

    _hub: sandhub.Hub | None = PrivateAttr(default=None)
    _sandbox: sandhub.Sandbox | None = PrivateAttr(default=None)
    _owned: bool = PrivateAttr(default=False)
    _tunnel: PortTunnel | None = PrivateAttr(default=None)
    _route: Literal["proxy", "tunnel", "direct"] = PrivateAttr(default="proxy")

    @field_validator("hub_api_key", mode="after")
    @classmethod
    def _secret(cls, value: SecretStr | str | None) -> SecretStr | None:
        """Kept as a SecretStr, so it never shows in a repr or a dump."""
        return SecretStr(value) if isinstance(value, str) else value

    # ------------------------------------------------------------------ setup

    def model_post_init(self, context: Any) -> None:
        hub = sandhub.Hub(self.hub_url, self._hub_key())
        self._hub = hub
        if self.sandbox_id is not None:
            sandbox = hub.get(self.sandbox_id)
            if sandbox.state == "Suspended":
                sandbox.resume()
        else:
            sandbox = hub.create(self.template, labels=self.labels or None)
            self.sandbox_id = sandbox.id
            self._owned = True
        self._sandbox = sandbox
        try:
            self._route = self._pick_route(hub, sandbox)
            if self._route == "tunnel":
                self._tunnel = PortTunnel(hub.url, self._hub_key(), sandbox.id, self.server_port)
                self.host = self._tunnel.url
            elif self._route == "direct":
                if "server_port" not in self.model_fields_set:
                    # The host's ports are shared by every such sandbox: not 8000 for all.
                    self.server_port = 20000 + secrets.randbelow(30000)
                name = urlsplit(hub.url).hostname or "127.0.0.1"
                self.host = f"http://{f'[{name}]' if ':' in name else name}:{self.server_port}"
            else:
                self.host = sandbox.ports.url(self.server_port).rstrip("/")
            self._start_server(attach=not self._owned)
        except BaseException:
            self.cleanup()
            raise
        super().model_post_init(context)

    def _hub_key(self) -> str | None:
        key = self.hub_api_key
        if key is not None:
            return key.get_secret_value() if isinstance(key, SecretStr) else key
        return os.environ.get("SANDHUB_API_KEY") or None

    def _pick_route(self, hub: sandhub.Hub, sandbox: sandhub.Sandbox) -> Literal["proxy", "tunnel", "direct"]:
        if self.connection != "auto":
            return self.connection
        try:
            network = hub.templates.get(sandbox.template).spec.get("network") if sandbox.template else None
        except sandhub.NotFoundError:
            network = None
        if network == "host":
            return "direct"
        return "tunnel" if self._hub_key() else "proxy"

    @property
    def route(self) -> str:
        """How the server is reached: ``proxy``, ``tunnel`` or ``direct``."""
        return self._route

    def _start_server(self, *, attach: bool) -> None:
        """Starts the server unless one answers already (attaching to a sandbox a
        workspace set up before: its key is read back from the sandbox)."""
        sandbox = self.sandbox
        self.reset_client()
        if attach and _server.healthy(self.client):
            self.api_key = self.api_key or _server.running_key(sandbox)
            self.reset_client()
            return  # (a wrong key given on purpose shows on the first call, as upstream)
        self.api_key = self.api_key or secrets.token_urlsafe(32)
        self.reset_client()
        _server.start(
            sandbox, key=self.api_key, port=self.server_port, command=self.server_command, env=self.server_env
        )
        _server.wait_healthy(sandbox, self.client, self.startup_timeout)
        _server.check_key(sandbox, self.client)

    # ------------------------------------------------------------------ commands

    def execute_command(self, command: str, cwd: str | Path | None = None, timeout: float = 30.0) -> CommandResult:
        """Runs ``command`` through the agent server; ``cwd`` defaults to
        ``working_dir`` (the server itself runs in its state directory)."""
        return super().execute_command(command, self.working_dir if cwd is None else cwd, timeout)

    # ------------------------------------------------------------------ the two keys

    @property
    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = dict(super()._headers)
        key = self._hub_key()
        # Only the hub's proxy takes it off: through the tunnel, or directly, every
        # header reaches the server, and the hub's key must not.
        if key and self._route == "proxy":
            headers["Authorization"] = f"Bearer {key}"
        return headers

    # ------------------------------------------------------------------ accessors

    @property
    def sandbox(self) -> sandhub.Sandbox:
        """The sandbox the server runs in (a `sandhub.Sandbox`)."""
        if self._sandbox is None:
            raise RuntimeError("this SandhubWorkspace has been cleaned up")
        return self._sandbox

    @property
    def hub(self) -> sandhub.Hub:
        if self._hub is None:
            raise RuntimeError("this SandhubWorkspace was not set up")
        return self._hub

    @property
    def alive(self) -> bool:
        """Whether the agent server answers `/health` (through the hub, with its key)."""
        return self._sandbox is not None and _server.healthy(self.client)

    # ------------------------------------------------------------------ lifecycle

    def pause(self) -> None:
        """Suspends the sandbox: its processes stop (the agent server too), its
        workspace stays."""
        self.reset_client()
        self.sandbox.suspend()

    def resume(self) -> None:
        """Resumes the sandbox and starts the agent server again, with the same key."""
        sandbox = self.sandbox
        if sandbox.refresh().state == "Suspended":
            sandbox.resume()
        self._start_server(attach=True)

    def cleanup(self) -> None:
        """Deletes the sandbox if this workspace created it (unless `keep_sandbox`)."""
        self.reset_client()
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            tunnel.close()
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None and self._owned and not self.keep_sandbox:
            try:
                sandbox.delete()
            except sandhub.NotFoundError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type | None, exc_val: BaseException | None, exc_tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            self.cleanup()
