"""A full OpenHands agent loop in a Sandhub sandbox: `Conversation(agent=...,
workspace=SandhubWorkspace(...))` (a RemoteConversation: the agent runs inside the
agent server in the sandbox) to FINISHED, its model a scripted OpenAI-compatible
server on the hub's loopback (the sandbox's template has `network: host`)."""

from __future__ import annotations

import json

import pytest
import sandhub
from conftest import HOST_NET_TEMPLATE, HUB_KEY, LABEL
from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.sdk.conversation.impl.remote_conversation import RemoteConversation
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr
from sandhub_testing import free_port

from sandhub_openhands import AgentServerError, SandhubWorkspace
from sandhub_openhands.testing import ScriptedLLMServer, ToolCall

COMMAND = "echo agent-was-here > /workspace/agent.txt && cat /workspace/agent.txt"


def test_agent_runs_a_terminal_call_then_finishes(hub: sandhub.Hub, hub_url: str) -> None:
    script = [
        ToolCall(TerminalTool.name, {"command": COMMAND, "summary": "write the marker file"}),
        ToolCall("finish", {"message": "done", "summary": "finished"}),
    ]
    labels = {**LABEL, "case": "conversation"}
    clash = {**LABEL, "case": "port-clash"}
    with ScriptedLLMServer(script) as llm_server, SandhubWorkspace(
        hub_url=hub_url, hub_api_key=HUB_KEY, template=HOST_NET_TEMPLATE, labels=labels,
        # The host's network: the server's port must be free on the host too.
        server_port=free_port(),
    ) as workspace:
        assert workspace.route == "direct"  # the hub does not proxy a host-network sandbox's ports
        llm = LLM(model="openai/scripted", base_url=llm_server.base_url, api_key=SecretStr("x"), usage_id="agent")
        agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name)])
        conversation = Conversation(agent=agent, workspace=workspace)
        assert isinstance(conversation, RemoteConversation)
        try:
            conversation.send_message("Write agent-was-here into /workspace/agent.txt, then finish.")
            conversation.run()
            assert conversation.state.execution_status.name == "FINISHED"
        finally:
            conversation.close()

        # The agent's command ran inside the sandbox: the sandhub SDK reads its file
        # (its file calls are relative to the sandbox's /workspace.)
        assert workspace.sandbox.files.read_text("agent.txt") == "agent-was-here\n"
        # Both scripted calls were taken, and the model saw the terminal's output.
        assert llm_server.exhausted
        second = llm_server.tool_requests[1]
        tool_results = [m for m in second["messages"] if m.get("role") == "tool"]
        assert tool_results, second["messages"]
        assert "agent-was-here" in json.dumps(tool_results[0].get("content"))
        sid = workspace.sandbox_id or ""

        # On the host's network a second workspace told to use the same port meets the
        # first one's server: it must refuse to use it (its key is not taken), and leave nothing.
        with pytest.raises(AgentServerError, match="refuses this workspace's session key"):
            SandhubWorkspace(
                hub_url=hub_url, hub_api_key=HUB_KEY, template=HOST_NET_TEMPLATE, labels=clash,
                server_port=workspace.server_port,
            )
        assert hub.list(clash) == []
    # Leaving the `with` deleted the sandbox the workspace created.
    assert hub.list(labels) == []
    with pytest.raises(sandhub.NotFoundError):
        hub.get(sid)
