"""Sandhub's MCP tools driven by the official Python `mcp` client, over stdio
(`sandhub-mcp`) and streamable HTTP (the hub's `/mcp`), against a real hub.

Each test is a plain function running one async scenario under a hard
deadline (`run`), so a hung server fails the test instead of the suite.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from typing import Any, Awaitable, Callable

import anyio
import pytest
from mcp import ClientSession, Client, StdioServerParameters

SCENARIO_TIMEOUT_S = 180.0

UPSTREAM_TOOLS = {
    "create_sandbox",
    "delete_sandbox",
    "execute_command",
    "upload_file",
    "download_file",
    "list_files",
    "file_exists",
    "get_sandbox_status",
}
EXTRA_TOOLS = {
    "list_sandboxes",
    "start_process",
    "read_process_output",
    "send_process_input",
    "kill_process",
    "reset_sandbox",
    "snapshot_sandbox",
    "watch_directory",
    "expose_port",
    "get_sandbox_metrics",
    "list_volumes",
    "run_code",
}

Connect = Callable[[], Any]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with anyio.fail_after(SCENARIO_TIMEOUT_S):
            await scenario()

    anyio.run(bounded)


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """Calls a tool that must succeed; returns its structured result."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}({arguments}) failed: {text(result)}"
    assert isinstance(result.structured_content, dict), f"{tool}: no structured content"
    return result.structured_content


async def fails(session: ClientSession, tool: str, **arguments: Any) -> str:
    """Calls a tool that must fail as a tool result (not a protocol error);
    returns the error text the model would read."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) unexpectedly succeeded: {result.structured_content}"
    message = text(result)
    assert message, f"{tool}: an error without text"
    return message


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def new_sandbox(session: ClientSession) -> str:
    created = await call(session, "create_sandbox", shutdown_after_seconds=600)
    name = created["sandbox_claim_name"]
    assert name
    return name


# ------------------------------------------------------------------ listing


def test_tools_are_listed_with_schemas_and_annotations(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert UPSTREAM_TOOLS | EXTRA_TOOLS <= set(tools), sorted(tools)
            for name, tool in tools.items():
                assert tool.description and len(tool.description) > 40, name
                assert tool.input_schema.get("type") == "object", name
                assert tool.output_schema and tool.output_schema.get("type") == "object", name
                a = tool.annotations
                assert a is not None, name
                assert a.read_only_hint is not None, name
                assert a.destructive_hint is not None, name
                assert a.idempotent_hint is not None, name
                assert a.open_world_hint is False, name
                for param, schema in tool.input_schema.get("properties", {}).items():
                    assert schema.get("description"), f"{name}.{param} has no description"
            # Upstream's parameter and result names, so its prompts work unchanged.
            execute = tools["execute_command"]
            assert set(execute.input_schema["required"]) == {"sandbox_claim_name", "command"}
            assert {"namespace", "timeout"} <= set(execute.input_schema["properties"])
            assert {"exit_code", "stdout", "stderr"} <= set(execute.output_schema["properties"])
            create = tools["create_sandbox"]
            assert {
                "warmpool",
                "namespace",
                "sandbox_ready_timeout",
                "labels",
                "shutdown_after_seconds",
                "pod_labels",
                "pod_annotations",
            } <= set(create.input_schema["properties"])
            assert "sandbox_claim_name" in create.output_schema["properties"]
            listing = tools["list_files"]
            assert {"entries", "total_entries", "truncated"} <= set(listing.output_schema["properties"])
            assert tools["download_file"].annotations.read_only_hint is True
            assert tools["delete_sandbox"].annotations.destructive_hint is True

            templates = (await session.list_resource_templates()).resource_templates
            assert any(t.uri_template == "sandboxes://{namespace}" for t in templates)

    run(scenario)


# ------------------------------------------------------------------ the upstream flow


def test_create_execute_files_delete(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                status = await call(session, "get_sandbox_status", sandbox_claim_name=name, namespace="ignored")
                assert status["sandbox_claim_name"] == name
                assert status["ready"] is True and status["state"] == "Ready"
                assert status["template"] and status["created_at"]
                assert "sandhub.io/mcp-session" in status["labels"]

                ran = await call(session, "execute_command", sandbox_claim_name=name, command="echo hi; echo oops >&2; pwd; exit 3")
                assert ran["exit_code"] == 3
                assert ran["stdout"] == "hi\n/workspace\n"
                assert ran["stderr"] == "oops\n"
                assert ran["truncated"] is False

                # Text round trip, through a nested path both spellings name.
                wrote = await call(session, "upload_file", sandbox_claim_name=name, path="src/hello.txt", content="héllo\n")
                assert wrote["bytes_written"] == len("héllo\n".encode())
                got = await call(session, "download_file", sandbox_claim_name=name, path="/workspace/src/hello.txt")
                assert got == {"content": "héllo\n", "bytes_read": len("héllo\n".encode())}
                ran = await call(session, "execute_command", sandbox_claim_name=name, command="cat src/hello.txt")
                assert ran["stdout"] == "héllo\n"

                # Binary round trip.
                blob = bytes(range(256)) * 4
                wrote = await call(
                    session,
                    "upload_file",
                    sandbox_claim_name=name,
                    path="data/blob.bin",
                    content=base64.b64encode(blob).decode(),
                    binary=True,
                )
                assert wrote["bytes_written"] == len(blob)
                got = await call(session, "download_file", sandbox_claim_name=name, path="data/blob.bin", binary=True)
                assert base64.b64decode(got["content"]) == blob
                assert got["bytes_read"] == len(blob)
                message = await fails(session, "download_file", sandbox_claim_name=name, path="data/blob.bin")
                assert "binary=true" in message

                listing = await call(session, "list_files", sandbox_claim_name=name, path=".")
                by_name = {e["name"]: e for e in listing["entries"]}
                assert by_name["src"]["type"] == "directory"
                assert by_name["data"]["type"] == "directory"
                assert listing["total_entries"] == len(listing["entries"])
                assert listing["truncated"] is False
                listing = await call(session, "list_files", sandbox_claim_name=name, path="data")
                (entry,) = listing["entries"]
                assert entry["name"] == "blob.bin" and entry["type"] == "file"
                assert entry["size"] == len(blob)
                assert "T" in entry["mod_time"]  # RFC 3339
                limited = await call(session, "list_files", sandbox_claim_name=name, path="", max_entries=1)
                assert len(limited["entries"]) == 1 and limited["truncated"] is True
                assert limited["total_entries"] >= 2

                assert (await call(session, "file_exists", sandbox_claim_name=name, path="src/hello.txt"))["exists"] is True
                assert (await call(session, "file_exists", sandbox_claim_name=name, path="src"))["exists"] is True
                assert (await call(session, "file_exists", sandbox_claim_name=name, path="nope.txt"))["exists"] is False

                mine = await call(session, "list_sandboxes")
                assert [s["sandbox_claim_name"] for s in mine["sandboxes"]] == [name]
                resource = await session.read_resource("sandboxes://default")
                listed = json.loads(resource.contents[0].text)
                assert [s["sandbox_claim_name"] for s in listed["sandboxes"]] == [name]
            finally:
                deleted = await call(session, "delete_sandbox", sandbox_claim_name=name)
                assert deleted["deleted"] is True
            message = await fails(session, "get_sandbox_status", sandbox_claim_name=name)
            assert "not found" in message and "create_sandbox" in message
            assert (await call(session, "list_sandboxes"))["sandboxes"] == []

    run(scenario)


def test_long_output_is_truncated_and_says_so(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                ran = await call(
                    session,
                    "execute_command",
                    sandbox_claim_name=name,
                    command="head -c 300000 /dev/zero | tr '\\0' x; echo; echo THE-END",
                )
                assert ran["exit_code"] == 0
                assert ran["truncated"] is True
                assert len(ran["stdout"].encode()) <= 64 * 1024
                assert ran["stdout"].rstrip().endswith("THE-END")  # the tail is kept
                assert "stdout was" in ran["note"]
                assert "bytes omitted" in ran["stdout"]
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)


# ------------------------------------------------------------------ processes


async def read_until(session: ClientSession, name: str, pid: str, needle: str, stop_running: bool = False) -> dict[str, Any]:
    """Reads a process's output until `needle` shows up (and, when asked,
    the process has exited); bounded by the scenario's deadline."""
    seen = ""
    while True:
        out = await call(session, "read_process_output", sandbox_claim_name=name, process_id=pid, wait_seconds=5)
        seen += out["stdout"]
        if needle in seen and (not stop_running or not out["running"]):
            out["seen"] = seen
            return out
        if not out["running"] and needle not in seen:
            raise AssertionError(f"process exited without printing {needle!r}: {out}, seen {seen!r}")


def test_long_running_process(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                # An interactive loop: input in, output out, until stdin closes.
                echo = await call(
                    session,
                    "start_process",
                    sandbox_claim_name=name,
                    command='echo ready; while read line; do echo "got:$line"; done; echo bye; exit 7',
                )
                pid = echo["process_id"]
                assert echo["pid"] > 0
                await read_until(session, name, pid, "ready")
                sent = await call(session, "send_process_input", sandbox_claim_name=name, process_id=pid, input="hello\n")
                assert sent["bytes_written"] == 6
                await read_until(session, name, pid, "got:hello")
                await call(session, "send_process_input", sandbox_claim_name=name, process_id=pid, input="", eof=True)
                done = await read_until(session, name, pid, "bye", stop_running=True)
                assert done["exit_code"] == 7
                message = await fails(session, "send_process_input", sandbox_claim_name=name, process_id=pid, input="x")
                assert "exited" in message

                # A process that never ends on its own, killed.
                sleeper = await call(
                    session,
                    "start_process",
                    sandbox_claim_name=name,
                    command="echo sleeping; exec sleep 1000",
                    env={"GREETING": "x"},
                )
                spid = sleeper["process_id"]
                await read_until(session, name, spid, "sleeping")
                out = await call(session, "read_process_output", sandbox_claim_name=name, process_id=spid)
                assert out["running"] is True and "exit_code" not in out
                killed = await call(session, "kill_process", sandbox_claim_name=name, process_id=spid)
                assert killed["signal"] == "SIGTERM"
                assert killed["exited"] is True
                out = await call(session, "read_process_output", sandbox_claim_name=name, process_id=spid)
                assert out["running"] is False

                message = await fails(session, "read_process_output", sandbox_claim_name=name, process_id="p999")
                assert "start_process" in message
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)


# ------------------------------------------------------------------ isolation and errors


def test_a_second_session_cannot_reach_the_first_sessions_sandbox(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as first:
            name = await new_sandbox(first)
            try:
                async with connect() as second:
                    for tool, extra in [
                        ("get_sandbox_status", {}),
                        ("execute_command", {"command": "true"}),
                        ("download_file", {"path": "x"}),
                        ("delete_sandbox", {}),
                    ]:
                        message = await fails(second, tool, sandbox_claim_name=name, **extra)
                        assert f"{name} not found in this session" in message, message
                    assert (await call(second, "list_sandboxes"))["sandboxes"] == []
                # Still there for its owner.
                ran = await call(first, "execute_command", sandbox_claim_name=name, command="echo still-mine")
                assert ran["stdout"] == "still-mine\n"
            finally:
                await call(first, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)


def test_bad_arguments_are_tool_errors_and_the_session_survives(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                # A required argument missing.
                message = await fails(session, "execute_command", sandbox_claim_name=name)
                assert "command" in message and "execute_command" in message
                # The wrong type.
                message = await fails(session, "execute_command", sandbox_claim_name=name, command="true", timeout="soon")
                assert "timeout" in message
                # Out of range.
                message = await fails(session, "execute_command", sandbox_claim_name=name, command="true", timeout=-1)
                assert "timeout must be" in message
                # Out of the workspace.
                for tool in ("download_file", "file_exists", "list_files"):
                    message = await fails(session, tool, sandbox_claim_name=name, path="../../etc/passwd")
                    assert "escapes the workspace" in message and "relative to /workspace" in message
                message = await fails(session, "upload_file", sandbox_claim_name=name, path="/workspace/../x", content="x")
                assert "escapes the workspace" in message
                # Not base64.
                message = await fails(session, "upload_file", sandbox_claim_name=name, path="x", content="%%%", binary=True)
                assert "base64" in message
                # Unknown sandbox, unknown file, a directory read as a file.
                message = await fails(session, "execute_command", sandbox_claim_name="sb-does-not-exist", command="true")
                assert "not found in this session" in message and "create_sandbox" in message
                message = await fails(session, "download_file", sandbox_claim_name=name, path="missing.txt")
                assert "does not exist" in message
                await call(session, "execute_command", sandbox_claim_name=name, command="mkdir -p adir")
                message = await fails(session, "download_file", sandbox_claim_name=name, path="adir")
                assert "directory" in message
                # A template that does not exist.
                message = await fails(session, "create_sandbox", warmpool="no-such-template")
                assert "no-such-template" in message
                # A reserved label.
                message = await fails(session, "create_sandbox", labels={"sandhub.io/mcp-session": "x"})
                assert "reserved" in message

                # After all that, the session still works.
                ran = await call(session, "execute_command", sandbox_claim_name=name, command="echo alive")
                assert ran["stdout"] == "alive\n"
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)


def test_reset_snapshot_and_watch(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                await call(session, "upload_file", sandbox_claim_name=name, path="keep.txt", content="v1")
                snap = await call(session, "snapshot_sandbox", sandbox_claim_name=name)
                assert snap["snapshot_id"]

                # Nothing changes: the wait ends at its bound.
                quiet = await call(session, "watch_directory", sandbox_claim_name=name, path="", timeout_seconds=0.5)
                assert quiet == {"events": [], "timed_out": True}

                async def change_soon() -> None:
                    await anyio.sleep(1.0)
                    await call(session, "execute_command", sandbox_claim_name=name, command="echo x > new.txt")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(change_soon)
                    changed = await call(session, "watch_directory", sandbox_claim_name=name, path="", timeout_seconds=30)
                assert changed["timed_out"] is False
                assert any(e["path"].endswith("new.txt") for e in changed["events"]), changed

                reset = await call(session, "reset_sandbox", sandbox_claim_name=name)
                assert reset["sandbox_claim_name"] == name
                assert (await call(session, "file_exists", sandbox_claim_name=name, path="keep.txt"))["exists"] is False
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)


def test_volumes_are_listed_and_mounted_and_outlive_the_sandbox(connect: Connect, hub: Any) -> None:
    """An agent sees the volumes it was given and mounts them; its files outlive the sandbox.
    It cannot make one: there is no tool for it."""
    vol = f"mcp-{uuid.uuid4().hex[:8]}"
    req = urllib.request.Request(f"{hub.url}/v1/volumes", method="POST",
                                 data=json.dumps({"name": vol, "size_mb": 8}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201

    async def scenario() -> None:
        async with connect() as session:
            tools = {t.name for t in (await session.list_tools()).tools}
            assert not any("volume" in t and t != "list_volumes" for t in tools), tools
            listed = await call(session, "list_volumes")
            assert vol in [v["name"] for v in listed["volumes"]], listed
            mount = {"name": vol, "path": "/workspace/data"}
            a = (await call(session, "create_sandbox", volumes=[mount]))["sandbox_claim_name"]
            await call(session, "execute_command", sandbox_claim_name=a, command="echo kept > /workspace/data/f")
            await call(session, "delete_sandbox", sandbox_claim_name=a)
            b = (await call(session, "create_sandbox", volumes=[{**mount, "read_only": True}]))["sandbox_claim_name"]
            try:
                out = await call(session, "execute_command", sandbox_claim_name=b, command="cat /workspace/data/f")
                assert out["stdout"] == "kept\n", out
                denied = await call(session, "execute_command", sandbox_claim_name=b, command="touch /workspace/data/g")
                assert denied["exit_code"] != 0, denied
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=b)
            message = await fails(session, "create_sandbox", volumes=[{"name": vol, "path": "/proc/x"}])
            assert "/proc" in message, message

    run(scenario)
    urllib.request.urlopen(urllib.request.Request(f"{hub.url}/v1/volumes/{vol}", method="DELETE"), timeout=30)


# ------------------------------------------------------------------ negotiation


def test_a_client_that_probes_for_the_newest_protocol_gets_a_session(hub: Any) -> None:
    """mcp's `Client` first probes `server/discover` (2026-07-28, which has
    no sessions); the server declines, and the client falls back to the
    initialize handshake, which gives the session ownership relies on."""

    async def scenario() -> None:
        params = StdioServerParameters(command=str(hub.mcp_bin), args=["--hub", hub.url])
        async with Client(params, read_timeout_seconds=60) as client:
            assert client.protocol_version != "2026-07-28"
            result = await client.call_tool("list_sandboxes", {})
            assert not result.is_error
            assert result.structured_content == {"sandboxes": []}

    run(scenario)


def test_expose_port_returns_a_working_url(connect: Connect) -> None:
    async def scenario() -> None:
        async with connect() as session:
            name = await new_sandbox(session)
            try:
                await call(session, "upload_file", sandbox_claim_name=name, path="site/hi.txt", content="hi there")
                server = await call(
                    session,
                    "start_process",
                    sandbox_claim_name=name,
                    command="cd site && exec python3 -u -m http.server 8000 --bind 127.0.0.1",
                )
                await read_until(session, name, server["process_id"], "Serving HTTP")
                exposed = await call(session, "expose_port", sandbox_claim_name=name, port=8000)
                assert exposed["port"] == 8000
                assert exposed["url"].endswith(f"/v1/sandboxes/{name}/ports/8000/"), exposed
                body = await anyio.to_thread.run_sync(
                    lambda: urllib.request.urlopen(exposed["url"] + "hi.txt", timeout=30).read()
                )
                assert body == b"hi there"
                message = await fails(session, "expose_port", sandbox_claim_name=name, port=0)
                assert "INVALID_ARGUMENT" in message
            finally:
                await call(session, "delete_sandbox", sandbox_claim_name=name)

    run(scenario)
