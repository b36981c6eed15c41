"""Sandhub sandboxes as OpenHands workspaces.

`SandhubWorkspace` is an `openhands.sdk.workspace.RemoteWorkspace` whose agent
server runs inside a Sandhub sandbox, reached through the hub's port proxy;
`agent_server_template()` builds the template such a sandbox is made from.
"""

from ._server import AgentServerError
from ._template import AGENT_SERVER_IMAGE, DEFAULT_TEMPLATE, agent_server_template
from ._workspace import SandhubWorkspace

__all__ = [
    "AGENT_SERVER_IMAGE",
    "DEFAULT_TEMPLATE",
    "AgentServerError",
    "SandhubWorkspace",
    "agent_server_template",
]
