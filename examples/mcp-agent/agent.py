"""An LLM agent's tool loop over MCP, with the model replaced by a script.

The agent talks to the hub's MCP endpoint (streamable HTTP at `$SANDHUB_URL/mcp`) with
the official `mcp` client, exactly as an LLM host would: list the tools, then call them
one by one. `PLAN` stands in for the model's tool calls; a real agent would choose them.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/mcp-agent/agent.py
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

# What a model would ask for, in order; "{sandbox}" is filled with the sandbox it created.
PLAN: list[tuple[str, dict[str, Any]]] = [
    ("upload_file", {"path": "fib.py", "content": "a, b = 0, 1\nfor _ in range(10):\n    a, b = b, a + b\nprint(a)\n"}),
    ("execute_command", {"command": "python3 fib.py > answer.txt && cat answer.txt"}),
    ("download_file", {"path": "answer.txt"}),
]


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise SystemExit(f"{tool} failed: {result.content}")
    print(f"-> {tool}({', '.join(f'{k}=...' if k == 'content' else f'{k}={v!r}' for k, v in arguments.items())})")
    return result.structured_content


async def main() -> None:
    url = os.environ.get("SANDHUB_URL", "http://127.0.0.1:7070").rstrip("/") + "/mcp"
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = sorted(t.name for t in (await session.list_tools()).tools)
        print(f"{len(tools)} tools: {', '.join(tools)}")
        sandbox = (await call(session, "create_sandbox"))["sandbox_claim_name"]
        try:
            results = [await call(session, tool, sandbox_claim_name=sandbox, **args) for tool, args in PLAN]
        finally:
            await call(session, "delete_sandbox", sandbox_claim_name=sandbox)
    ran, downloaded = results[1], results[2]
    assert ran["exit_code"] == 0 and ran["stdout"] == "55\n", ran
    assert downloaded["content"] == "55\n", downloaded
    print("the agent's answer:", downloaded["content"].strip())


if __name__ == "__main__":
    asyncio.run(main())
