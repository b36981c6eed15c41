"""A real ``create_deep_agent`` loop on a Sandhub sandbox. The model is
scripted (no LLM): each turn asks for one tool call, and deepagents' own
tools carry it out through the adapter."""

from __future__ import annotations

from typing import Any, Sequence

import sandhub
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_sandhub import SandhubSandbox


class ScriptedModel(GenericFakeChatModel):
    """Answers with the next scripted message; tools need no binding."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def call(n: int, name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n}", "type": "tool_call"}])


APP = "/tmp/proj/app.py"

SCRIPT = [
    call(1, "execute", command="mkdir -p /tmp/proj && echo 'print(40 + 2)' > /tmp/proj/seed.py && python3 /tmp/proj/seed.py"),
    call(2, "write_file", file_path=APP, content="def greet():\n    return 'hello'\n"),
    call(3, "edit_file", file_path=APP, old_string="'hello'", new_string="'hello, sandhub'"),
    call(4, "read_file", file_path=APP),
    call(5, "grep", pattern="sandhub", path="/tmp/proj", output_mode="content"),
    call(6, "glob", pattern="*.py", path="/tmp/proj"),
    call(7, "execute", command="cd /tmp/proj && python3 -c 'import app; print(app.greet())'"),
    AIMessage(content="done"),
]


def test_deep_agent_drives_the_sandbox_through_its_own_tools(hub: sandhub.Hub) -> None:
    with SandhubSandbox.create(hub) as backend:
        agent = create_deep_agent(model=ScriptedModel(messages=iter(SCRIPT)), backend=backend)
        state = agent.invoke({"messages": [{"role": "user", "content": "make a greeter"}]})

        answers = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
        assert sorted(answers) == [f"call-{n}" for n in range(1, 8)]
        for message in answers.values():
            assert message.status != "error", message
        assert "42" in answers["call-1"].text
        assert "hello, sandhub" in answers["call-4"].text
        assert "app.py" in answers["call-5"].text and "hello, sandhub" in answers["call-5"].text
        assert "app.py" in answers["call-6"].text and "seed.py" in answers["call-6"].text
        assert "hello, sandhub" in answers["call-7"].text
        assert state["messages"][-1].content == "done"

        # What the agent did is in the sandbox itself, seen by a plain command.
        # `*.py`: the agent's `import app` left a __pycache__ beside them.
        files = backend.execute("cat /tmp/proj/app.py; cd /tmp/proj && ls *.py")
        assert files.output == "def greet():\n    return 'hello, sandhub'\napp.py\nseed.py\n"
        assert backend.sandbox.commands.run(["python3", "/tmp/proj/seed.py"]).stdout == "42\n"
