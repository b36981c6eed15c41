"""A Deep Agents agent whose tools run in a Sandhub sandbox.

`create_deep_agent(backend=SandhubSandbox(...))` gives the agent deepagents' own tools
(`execute`, `write_file`, `edit_file`, `read_file`, `grep`, `glob`, ...), all carried out
inside the sandbox. No LLM is called: a scripted chat model asks for the tool calls a model
would, so the example runs anywhere. Swap `ScriptedModel(...)` for any LangChain chat model
(`init_chat_model("openai:gpt-5")`, ...) to run it for real.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/deepagents/agent.py
"""

from __future__ import annotations

from typing import Any, Sequence

import sandhub
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_sandhub import SandhubSandbox


class ScriptedModel(GenericFakeChatModel):
    """Answers with the next scripted message; tools need no binding."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def tool_call(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{name}", "type": "tool_call"}])


SCRIPT = [
    tool_call("write_file", file_path="/workspace/greet.py", content="print('hello')\n"),
    tool_call("edit_file", file_path="/workspace/greet.py", old_string="'hello'", new_string="'hello from a sandbox'"),
    tool_call("execute", command="python3 /workspace/greet.py"),
    AIMessage(content="greet.py prints a greeting."),
]


def main() -> None:
    hub = sandhub.Hub()  # $SANDHUB_URL, $SANDHUB_API_KEY
    with SandhubSandbox.create(hub) as backend:  # deletes the sandbox on exit
        agent = create_deep_agent(model=ScriptedModel(messages=iter(SCRIPT)), backend=backend)
        state = agent.invoke({"messages": [{"role": "user", "content": "write a greeter and run it"}]})
        print("agent:", state["messages"][-1].content)
        ran = backend.execute("python3 /workspace/greet.py")
        print("sandbox:", ran.output.strip())
        assert ran.exit_code == 0 and ran.output == "hello from a sandbox\n", ran


if __name__ == "__main__":
    main()
