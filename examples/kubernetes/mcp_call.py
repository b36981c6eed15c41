"""One MCP session against a hub on the kubernetes backend: the sandbox is a Pod.

    SANDHUB_URL=http://127.0.0.1:7171 python examples/kubernetes/mcp_call.py
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise SystemExit(f"{tool} failed: {result.content}")
    return result.structured_content


async def main() -> None:
    url = os.environ.get("SANDHUB_URL", "http://127.0.0.1:7171").rstrip("/") + "/mcp"
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        name = (await call(session, "create_sandbox"))["sandbox_claim_name"]
        try:
            ran = await call(session, "execute_command", sandbox_claim_name=name, command="echo hello from $(hostname)")
        finally:
            await call(session, "delete_sandbox", sandbox_claim_name=name)
    print(f"sandbox {name}: {ran['stdout'].strip()}")
    assert ran["exit_code"] == 0 and ran["stdout"].startswith("hello from "), ran


if __name__ == "__main__":
    asyncio.run(main())
