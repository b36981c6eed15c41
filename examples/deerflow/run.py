"""DeerFlow's own sandbox tools, unmodified, running in a Sandhub sandbox.

DeerFlow builds its sandbox provider from `sandbox.use` in config.yaml (here
examples/deerflow/config.yaml). Each tool call below is what a DeerFlow agent's
tool call does: it gets a runtime naming the thread, and the provider gives every
thread one sandbox, where `/mnt/user-data/...` exists.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/deerflow/run.py
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("DEER_FLOW_CONFIG_PATH", str(Path(__file__).with_name("config.yaml")))

from deerflow.sandbox.sandbox_provider import get_sandbox_provider, shutdown_sandbox_provider  # noqa: E402
from deerflow.sandbox.tools import bash_tool, grep_tool, ls_tool, read_file_tool, write_file_tool  # noqa: E402

OUT = "/mnt/user-data/outputs"
SCRIPT = f"""import json
squares = {{n: n * n for n in range(1, 6)}}
with open("{OUT}/squares.json", "w") as f:
    json.dump(squares, f)
print("wrote", len(squares), "squares")
"""


def tool(fn, **args) -> str:
    """One tool call of thread `demo`, with a fresh runtime as DeerFlow gives each call."""
    runtime = SimpleNamespace(state={}, context={"thread_id": "demo", "user_id": "me"}, config={})
    out = fn.func(runtime=runtime, description="example", **args)
    print(f"$ {fn.name} {args}\n{out}\n")
    return out


def main() -> None:
    try:
        assert tool(write_file_tool, path="/mnt/user-data/workspace/squares.py", content=SCRIPT) == "OK"
        assert tool(bash_tool, command="python3 squares.py") == "wrote 5 squares\n"
        assert tool(ls_tool, path=OUT) == f"{OUT}/squares.json"
        assert tool(read_file_tool, path=f"{OUT}/squares.json") == '{"1": 1, "2": 4, "3": 9, "4": 16, "5": 25}'
        assert tool(grep_tool, pattern="squares.json", path="/mnt/user-data/workspace").endswith(
            '/mnt/user-data/workspace/squares.py:3: with open("/mnt/user-data/outputs/squares.json", "w") as f:'
        )
        # The end of the agent's turn: DeerFlow releases the sandbox, and the next
        # turn of the same thread gets it back with its files.
        provider = get_sandbox_provider()
        sandbox_id = provider.acquire("demo", user_id="me")
        provider.release(sandbox_id)
        assert provider.acquire("demo", user_id="me") == sandbox_id
        print(f"thread demo keeps sandbox {sandbox_id} across turns")
    finally:
        shutdown_sandbox_provider()  # deletes the provider's sandboxes


if __name__ == "__main__":
    main()
