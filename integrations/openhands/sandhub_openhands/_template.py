"""The template an agent-server sandbox is made from."""

from __future__ import annotations

from typing import Any, Literal, Mapping

#: The image `dev/openhands/build-image.py` builds (and `sandhub image import` loads):
#: CPython 3.12 in /usr/local with openhands-agent-server, -tools and -sdk 1.58.2, bash,
#: git and tmux. Any image whose `python3` imports `openhands.agent_server` does as well.
AGENT_SERVER_IMAGE = "sandhub/openhands-agent-server:1.58.2"

#: The template name `SandhubWorkspace` uses when given none.
DEFAULT_TEMPLATE = "openhands-agent-server"

# The agent server's LiteLLM fetches its model price list from the network at start
# unless told to use the bundled copy: a sandbox often has no network at all.
_SERVER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def agent_server_template(
    image: str | None = AGENT_SERVER_IMAGE,
    *,
    root_fs: str | None = None,
    env: Mapping[str, str] | None = None,
    network: Literal["none", "host"] = "none",
    cpu: float | None = None,
    memory_mb: int | None = None,
    pids: int | None = None,
    disk_mb: int | None = None,
) -> dict[str, Any]:
    """A template (for ``hub.templates.put(name, ...)``) for sandboxes that run the
    OpenHands agent server.

    ``image`` (default :data:`AGENT_SERVER_IMAGE`) or ``root_fs`` (a host directory,
    local backend) holds ``python3`` with ``openhands-agent-server``. The template
    starts nothing itself (``entrypoint: []``): `SandhubWorkspace` starts the server
    with a session key of its own. ``network="host"`` lets the agent reach an LLM on
    the hub's machine (or the internet); ``"none"`` keeps only loopback, and the
    server is reached through the hub's port proxy either way.
    """
    if (image is None) == (root_fs is None):
        raise ValueError("give exactly one of image and root_fs")
    if network not in ("none", "host"):
        raise ValueError(f"network must be 'none' or 'host', not {network!r}")
    spec: dict[str, Any] = {
        "entrypoint": [],
        "workdir": "/workspace",
        "env": {**_SERVER_ENV, **dict(env or {})},
        "network": network,
    }
    if image is not None:
        spec["image"] = image
    else:
        spec["root_fs"] = root_fs
    for key, value in (("cpu", cpu), ("memory_mb", memory_mb), ("pids", pids), ("disk_mb", disk_mb)):
        if value is not None:
            spec[key] = value
    return spec
