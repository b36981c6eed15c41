"""The SDK carries the caller's OpenTelemetry context (issue #30 §5): with
``opentelemetry-api`` installed (the ``sandhub[otel]`` extra), a call made
while a span is current sends its ``traceparent`` and ``tracestate``, and
the hub's server span for that call is its child. The hub exports to a real
OTLP/HTTP receiver here, decoding the real protobufs (``opentelemetry-proto``).
Sync and asyncio faces, and no context outside a span."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from sandhub_testing import Hub, binary
from sandhub_testing import start_hub as _start_hub
from sandhub_testing import stop_hub as _stop_hub


class Receiver:
    """``POST /v1/traces`` on loopback: every span, decoded."""

    def __init__(self) -> None:
        self.spans: list = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
                if ok:
                    request = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        for rs in request.resource_spans:
                            for ss in rs.scope_spans:
                                receiver.spans.extend(ss.spans)
                self.send_response(200 if ok else 400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def span_of(self, trace_id: int, name: str, timeout: float = 30.0):
        want = trace_id.to_bytes(16, "big")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for s in self.spans:
                    if s.trace_id == want and s.name == name:
                        return s
            time.sleep(0.05)
        with self.lock:
            names = [(s.name, s.trace_id.hex()) for s in self.spans]
        pytest.fail(f"no span {name!r} in trace {want.hex()}; got {names}")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def traced_hub(receiver: Receiver) -> Iterator[Hub]:
    base = Path(tempfile.mkdtemp(prefix="sandhub-sdk-traces-"))
    before = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # export every 100 ms, not 5 s
    try:
        hub = _start_hub(binary("sandhub"), base, "--otlp-endpoint", receiver.endpoint)
    finally:
        if before is None:
            del os.environ["OTEL_BSP_SCHEDULE_DELAY"]
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = before
    try:
        yield hub
    finally:
        _stop_hub(hub)
        print(f"--- hub log tail ---\n{hub.log_tail()}")
        shutil.rmtree(base, ignore_errors=True)


def caller_span(trace_id: int, span_id: int) -> NonRecordingSpan:
    """A current span made with opentelemetry-api alone (no SDK installed)."""
    return NonRecordingSpan(
        SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
            trace_state=TraceState([("vendor", "sdk-test")]),
        )
    )


EXEC = "POST /v1/sandboxes/{id}/exec"


def test_a_sync_call_inside_a_span_is_the_parent_of_the_hubs_span(traced_hub: Hub, receiver: Receiver) -> None:
    trace_id, span_id = 0x5B8EFFF798038103D269B633813FC60C, 0xEEE19B7EC3C1B174
    with sandhub.Hub(traced_hub.url) as hub, hub.create() as sb:
        with trace.use_span(caller_span(trace_id, span_id)):
            assert sb.commands.run("true").exit_code == 0
        server = receiver.span_of(trace_id, EXEC)
        assert server.parent_span_id == span_id.to_bytes(8, "big")
        assert server.trace_state == "vendor=sdk-test"
        # The operation and the sandboxd call hang under it.
        op = receiver.span_of(trace_id, "exec")
        assert op.parent_span_id == server.span_id
        # Outside the span, a call starts a trace of its own.
        sb.commands.run("true")
        time.sleep(0.5)
        with receiver.lock:
            mine = [s for s in receiver.spans if s.name == EXEC and s.trace_id == trace_id.to_bytes(16, "big")]
        assert len(mine) == 1


def test_an_async_call_carries_its_own_tasks_context(traced_hub: Hub, receiver: Receiver) -> None:
    ids = [(0x0AF7651916CD43DD8448EB211C80319C + i, 0xB7AD6B7169203331 + i) for i in range(2)]

    async def one(sb: sandhub.AsyncSandbox, trace_id: int, span_id: int) -> None:
        with trace.use_span(caller_span(trace_id, span_id)):
            await asyncio.sleep(0.01)  # the other task runs meanwhile
            assert (await sb.commands.run("true")).exit_code == 0

    async def main() -> None:
        async with sandhub.AsyncHub(traced_hub.url) as hub:
            async with await hub.create() as sb:
                await asyncio.gather(*(one(sb, t, s) for t, s in ids))

    asyncio.run(main())
    for trace_id, span_id in ids:
        server = receiver.span_of(trace_id, EXEC)
        assert server.parent_span_id == span_id.to_bytes(8, "big")
