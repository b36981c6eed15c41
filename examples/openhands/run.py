"""An OpenHands agent whose agent server runs in a Sandhub sandbox.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/openhands/run.py [IMAGE_LAYOUT]

The model is a scripted OpenAI-compatible server on this machine's loopback (no
LLM needed): it asks for one `terminal` call, then `finish`. The sandbox's
template has `network: host` so the agent server can reach it (start the hub with
`--allow-host-network`). IMAGE_LAYOUT (or $SANDHUB_OPENHANDS_IMAGE) is the
agent-server image's OCI layout, imported when the hub lacks the image
(`python3 dev/openhands/build-image.py --cache DIR` builds it and prints its path).
Exits non-zero when anything fails.
"""

from __future__ import annotations

import os
import socket
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list fetch (offline)
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import sandhub  # noqa: E402
from openhands.sdk import LLM, Agent, Conversation, Tool  # noqa: E402
from openhands.tools.terminal import TerminalTool  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from sandhub_openhands import AGENT_SERVER_IMAGE, SandhubWorkspace, agent_server_template  # noqa: E402
from sandhub_openhands.testing import ScriptedLLMServer, ToolCall  # noqa: E402

TEMPLATE = "openhands-example"


def free_port() -> int:
    """The agent server shares the host's network: it needs a port free on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    hub = sandhub.Hub()
    if not any(AGENT_SERVER_IMAGE in image.tags for image in hub.images.list()):
        layout = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SANDHUB_OPENHANDS_IMAGE")
        if not layout:
            print(f"the hub has no {AGENT_SERVER_IMAGE}: pass its OCI layout", file=sys.stderr)
            return 2
        hub.images.import_(layout)
    hub.templates.put(TEMPLATE, agent_server_template(network="host"))

    script = [
        ToolCall("terminal", {"command": "echo hello from the agent > /workspace/hello.txt", "summary": "write"}),
        ToolCall("finish", {"message": "wrote hello.txt", "summary": "done"}),
    ]
    with ScriptedLLMServer(script) as llm_server, SandhubWorkspace(template=TEMPLATE, server_port=free_port()) as ws:
        llm = LLM(model="openai/scripted", base_url=llm_server.base_url, api_key=SecretStr("x"), usage_id="agent")
        conversation = Conversation(agent=Agent(llm=llm, tools=[Tool(name=TerminalTool.name)]), workspace=ws)
        try:
            conversation.send_message("Write 'hello from the agent' into hello.txt, then finish.")
            conversation.run()
            status = conversation.state.execution_status.name
        finally:
            conversation.close()
        written = ws.sandbox.files.read_text("hello.txt")  # relative to /workspace
        print(f"sandbox {ws.sandbox_id}: conversation {status}; hello.txt = {written!r}")
        if status != "FINISHED" or written != "hello from the agent\n":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
