"""A scripted OpenAI-compatible chat server on loopback, to drive a real OpenHands
agent loop without an LLM (tests, the example, CI).

With a `SandhubWorkspace` the agent runs inside the agent server, which calls the
model through LiteLLM itself: a fake model object in the client process cannot
stand in, a fake *endpoint* can. Point ``LLM(model="openai/<any>",
base_url=server.base_url, api_key=...)`` at it.

Each request that offers tools takes the next scripted tool call; a request
without tools (a title or a summary) gets a short text answer and takes nothing.
Past the end of the script every tool request gets ``finish``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

__all__ = ["ToolCall", "ScriptedLLMServer"]

#: Largest request body read (a conversation's whole history is sent each turn).
MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class ToolCall:
    """One scripted answer: call tool ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class ScriptedLLMServer:
    """``with ScriptedLLMServer([ToolCall(...), ...]) as llm:`` serves
    ``POST {llm.base_url}/chat/completions`` on 127.0.0.1 until the ``with`` ends.

    ``requests`` keeps every request body (parsed JSON), ``tool_requests`` the ones
    that offered tools, for assertions on what the agent sent.
    """

    def __init__(self, script: Iterable[ToolCall], host: str = "127.0.0.1", port: int = 0) -> None:
        self._script = list(script)
        self._lock = threading.Lock()
        self._next = 0
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-llm", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}/v1"

    @property
    def tool_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("tools")]

    @property
    def exhausted(self) -> bool:
        """Whether every scripted call has been handed out."""
        return self._next >= len(self._script)

    def __enter__(self) -> ScriptedLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ answers

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for one request body."""
        with self._lock:
            self.requests.append(request)
            if request.get("tools"):
                if self._next < len(self._script):
                    call = self._script[self._next]
                else:
                    call = ToolCall("finish", {"message": "done"})
                n = self._next
                self._next += 1
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }],
                }
                finish = "tool_calls"
            else:
                message, finish = {"role": "assistant", "content": "ok"}, "stop"
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(request.get("model", "scripted")),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self._send(400, {"error": {"message": "bad Content-Length"}})
                    return
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                if not isinstance(body, dict) or not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if body.get("stream"):
                    self._send(400, {"error": {"message": "streaming is not scripted"}})
                    return
                self._send(200, owner.answer(body))

        return Handler
