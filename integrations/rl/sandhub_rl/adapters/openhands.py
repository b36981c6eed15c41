"""OpenHands agent-server pools: a hub template whose sandboxes start the agent
server at boot (as their entrypoint), so a warm pool holds servers that are already
up, and a start check that holds ``acquire`` until ``/health`` answers.

Nothing here imports OpenHands: the template names an image that holds it (the one
``dev/openhands/build-image.py`` builds, or any whose ``python3`` imports
``openhands.agent_server``)::

    hub.templates.put("oh", agent_server_template(resources=ResourceSpec(cpu_limit=2)))
    fleet = SandboxFleet(hub, FleetConfig(
        warm_per_template=4, fail_fast=FailFastPolicy(start_check=agent_server_start_check())))
    with fleet.episode(Task(id="t1", template="oh")) as h:
        url = h.sandbox.ports.url(DEFAULT_PORT)   # ends in /: the server, through the hub's port proxy

An agent server that dies at start (an import error, a port in use) is the hub's
entrypoint status ``Error``: the fleet's fail-fast ends that acquire at once.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal, Mapping

from ..config import ResourceSpec

__all__ = [
    "AGENT_SERVER_IMAGE",
    "DEFAULT_PORT",
    "STATE_DIR",
    "agent_server_start_check",
    "agent_server_template",
]

#: The image ``dev/openhands/build-image.py`` builds (``sandhub image import`` loads
#: it): CPython 3.12 with openhands-agent-server, -tools and -sdk 1.58.2.
AGENT_SERVER_IMAGE = "sandhub/openhands-agent-server:1.58.2"
DEFAULT_PORT = 8000
#: The server's own state (conversations, events): outside the agent's working
#: directory, so the agent's diff never holds it.
STATE_DIR = "/tmp/sandhub-openhands"
#: The server reads its session keys from these variables.
_SESSION_KEY_ENV = "OH_SESSION_API_KEYS_0"
# LiteLLM fetches its model price list at start unless told to use its own copy,
# and a sandbox often has no network.
_SERVER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}


def agent_server_template(
    image: str = AGENT_SERVER_IMAGE,
    *,
    port: int = DEFAULT_PORT,
    session_api_key: str | None = None,
    resources: ResourceSpec | None = None,
    env: Mapping[str, str] | None = None,
    network: Literal["none", "host"] = "none",
) -> dict[str, Any]:
    """A hub template (for ``hub.templates.put``) whose sandboxes run the OpenHands
    agent server from the start, on ``port``.

    Without ``session_api_key`` the server listens on the sandbox's loopback only,
    which the local hub's port proxy reaches (it connects inside the sandbox's
    network namespace) and nothing else does. With one, it listens on all
    interfaces (as on Kubernetes, where the Pod IP is the way in) and requires the
    key; the key is then part of the template, which only its tenant reads."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be 1 to 65535, not {port!r}")
    if network not in ("none", "host"):
        raise ValueError(f"network must be 'none' or 'host', not {network!r}")
    host = "0.0.0.0" if session_api_key else "127.0.0.1"
    serve = shlex.join(["python3", "-m", "openhands.agent_server", "--host", host, "--port", str(port)])
    spec: dict[str, Any] = {
        "image": image,
        "entrypoint": ["/bin/sh", "-c", f"mkdir -p {STATE_DIR} && cd {STATE_DIR} && exec {serve}"],
        "workdir": "/workspace",
        "env": {**_SERVER_ENV, **dict(env or {})},
        "network": network,
    }
    if session_api_key:
        spec["env"][_SESSION_KEY_ENV] = session_api_key
    if resources is not None:
        spec.update(resources.template_fields())
    return spec


def agent_server_start_check(port: int = DEFAULT_PORT, timeout_s: float = 120.0) -> str:
    """A ``FailFastPolicy.start_check`` that waits (inside the sandbox, up to
    ``timeout_s``) until the agent server answers ``GET /health``. It gives up at
    once when no agent server process is left (it died at start: the fleet then
    reports the entrypoint's exit), and exits 1 at ``timeout_s``."""
    script = (
        "import os, sys, time, urllib.request\n"
        "def serving():\n"
        "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "        try:\n"
        "            if b'openhands.agent_server' in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
        "                return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
        f"end = time.monotonic() + {float(timeout_s)!r}\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        f"        urllib.request.urlopen('http://127.0.0.1:{int(port)}/health', timeout=2)\n"
        "        sys.exit(0)\n"
        "    except Exception:\n"
        "        if not serving():\n"
        "            sys.exit('no agent server is running')\n"
        "        time.sleep(0.2)\n"
        "sys.exit('the agent server did not answer /health in time')\n"
    )
    return shlex.join(["python3", "-c", script])
