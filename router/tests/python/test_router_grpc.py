"""Native gRPC through the router (h2c on the HTTP port) with Python grpcio:
process.v1 Execute and streaming Start, watcher.v1 WatchDir, and the
router's own errors as gRPC statuses."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
# The SDK's own generated process.v1 stubs.
from k8s_agent_sandbox.commands._process_stubs import process_pb2, process_pb2_grpc

from sandhub_testing import LOOPBACK


def md(sandboxd, port=None, sandbox_id="sb-grpc", **extra):
    pairs = [("x-sandbox-id", sandbox_id), ("x-sandbox-pod-ip", LOOPBACK)]
    if port is not False:
        pairs.append(("x-sandbox-port", str(port or sandboxd.grpc_port)))
    return pairs + list(extra.items())


@pytest.fixture
def channel(router):
    ch = grpc.insecure_channel(router.grpc_target)
    yield ch
    ch.close()


def test_grpc_execute_through_router(sandboxd, router, channel):
    stub = process_pb2_grpc.ProcessServiceStub(channel)
    req = process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["/bin/sh", "-c", "echo out; echo err >&2; exit 4"]))
    resp = stub.Execute(req, metadata=md(sandboxd), timeout=30)
    assert (resp.exit_code, resp.stdout, resp.stderr) == (4, b"out\n", b"err\n")
    assert router.metric("sandbox_router_requests_total", method="POST", code="200") >= 1


def test_grpc_streaming_start_through_router(sandboxd, channel):
    stub = process_pb2_grpc.ProcessServiceStub(channel)
    req = process_pb2.StartRequest(config=process_pb2.ProcessConfig(
        command=["/bin/sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 2"]))
    stdout, exit_code, got_init, stamps = b"", None, False, []
    for event in stub.Start(req, metadata=md(sandboxd), timeout=30):
        kind = event.WhichOneof("event")
        if kind == "init":
            got_init = True
        elif kind == "stdout":
            stdout += event.stdout
            stamps.append(time.monotonic())
        elif kind == "exit":
            exit_code = event.exit.exit_code
    assert got_init
    assert stdout == b"line1\nline2\nline3\n"
    assert exit_code == 2
    # Streamed, not buffered: the first line arrived well before the last.
    assert stamps[-1] - stamps[0] >= 0.2


def _watcher_classes():
    """watcher.v1 message classes built from a descriptor (no codegen step)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="router_test_watcher.proto", package="watcher.v1", syntax="proto3")
    req = fdp.message_type.add(name="WatchDirRequest")
    req.field.add(name="path", number=1, type=9, label=1)
    req.field.add(name="recursive", number=2, type=8, label=1)
    enum = fdp.enum_type.add(name="EventType")
    for i, n in enumerate(["UNSPECIFIED", "CREATE", "WRITE", "REMOVE", "RENAME", "CHMOD", "ERROR"]):
        enum.value.add(name=f"EVENT_TYPE_{n}", number=i)
    ev = fdp.message_type.add(name="FileEvent")
    ev.field.add(name="type", number=1, type=14, label=1, type_name=".watcher.v1.EventType")
    ev.field.add(name="path", number=2, type=9, label=1)
    ev.field.add(name="old_path", number=3, type=9, label=1)
    ev.field.add(name="is_dir", number=4, type=8, label=1)
    ev.field.add(name="message", number=5, type=9, label=1)
    ev.field.add(name="timestamp_ms", number=6, type=3, label=1)
    resp = fdp.message_type.add(name="WatchDirResponse")
    resp.field.add(name="events", number=1, type=11, label=3, type_name=".watcher.v1.FileEvent")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = lambda n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n))  # noqa: E731
    return get("watcher.v1.WatchDirRequest"), get("watcher.v1.WatchDirResponse")


def test_grpc_watchdir_streams_through_router(sandboxd, router, channel):
    Req, Resp = _watcher_classes()
    (sandboxd.root / "watched").mkdir()
    watch = channel.unary_stream(
        "/watcher.v1.FileWatcherService/WatchDir",
        request_serializer=Req.SerializeToString,
        response_deserializer=Resp.FromString,
    )
    call = watch(Req(path="watched", recursive=False), metadata=md(sandboxd), timeout=30)
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def read():
        try:
            for batch in call:
                for e in batch.events:
                    seen.append((e.type, e.path))
                if any(p.endswith("hello.txt") and t == 1 for t, p in seen):
                    done.set()
                    return
        except grpc.RpcError:
            pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    # Write through the router too (REST port), while the stream is open.
    deadline = time.monotonic() + 15
    while not done.is_set() and time.monotonic() < deadline:
        status, _, _ = router.request("PUT", "/v1/files/watched%2Fhello.txt", body=b"hi",
                                      headers={"X-Sandbox-ID": "sb-grpc", "X-Sandbox-Pod-IP": LOOPBACK,
                                               "X-Sandbox-Port": str(sandboxd.rest_port)})
        assert status in (200, 201, 204), status
        done.wait(1.0)
    call.cancel()
    assert done.is_set(), f"no CREATE event for hello.txt through the router; saw {seen}"


def test_grpc_requires_port_metadata(sandboxd, channel):
    stub = process_pb2_grpc.ProcessServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Execute(process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["true"])),
                     metadata=md(sandboxd, port=False), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-sandbox-port" in e.value.details()


def test_grpc_bad_id_is_invalid_argument(sandboxd, channel):
    stub = process_pb2_grpc.ProcessServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Execute(process_pb2.ExecuteRequest(), metadata=md(sandboxd, sandbox_id="Not_Valid"), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "Invalid sandbox ID format."


def test_grpc_dead_backend_is_unavailable(sandboxd, make_router):
    r = make_router("--allow-loopback-pod-ip", "--upstream-retry-initial-delay", "50ms")
    dead = sandboxd.grpc_port
    sandboxd.proc.terminate()
    sandboxd.proc.wait(timeout=10)
    with grpc.insecure_channel(r.grpc_target) as ch:
        stub = process_pb2_grpc.ProcessServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Execute(process_pb2.ExecuteRequest(), metadata=md(sandboxd, port=dead), timeout=20)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Could not connect to the backend sandbox: sb-grpc" in e.value.details()
    assert r.metric("sandbox_router_upstream_retries_total") == 3


def test_grpc_client_deadline_is_passed_on(sandboxd, channel):
    stub = process_pb2_grpc.ProcessServiceStub(channel)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.Execute(process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["sleep", "20"])),
                     metadata=md(sandboxd), timeout=1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 10


def test_grpc_proxy_timeout_caps_rpcs(sandboxd, make_router):
    r = make_router("--allow-loopback-pod-ip", "--grpc-proxy-timeout", "1s")
    with grpc.insecure_channel(r.grpc_target) as ch:
        stub = process_pb2_grpc.ProcessServiceStub(ch)
        # Unary: no client deadline at all, the router's cap ends it.
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            stub.Execute(process_pb2.ExecuteRequest(config=process_pb2.ProcessConfig(command=["sleep", "20"])),
                         metadata=md(sandboxd))
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 10
        # Streaming: output flows, then the cap ends the stream.
        events = stub.Start(process_pb2.StartRequest(config=process_pb2.ProcessConfig(
            command=["/bin/sh", "-c", "echo started; sleep 20"])), metadata=md(sandboxd))
        got = b""
        with pytest.raises(grpc.RpcError) as e:
            for ev in events:
                if ev.WhichOneof("event") == "stdout":
                    got += ev.stdout
        assert got == b"started\n"
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_grpc_scoped_token_denials(sandboxd, make_router, secret_file):
    from router_harness import mint
    r = make_router("--authz-mode", "scoped-token", "--authz-scoped-token-secret-file", str(secret_file),
                    "--upstream-max-retries", "0")
    with grpc.insecure_channel(r.grpc_target) as ch:
        stub = process_pb2_grpc.ProcessServiceStub(ch)
        base = [("x-sandbox-id", "sb-grpc"), ("x-sandbox-port", "9090")]
        cases = [
            (base, grpc.StatusCode.UNAUTHENTICATED),
            (base + [("authorization", "Bearer v1.bogus.sig")], grpc.StatusCode.UNAUTHENTICATED),
            (base + [("authorization", f"Bearer {mint('default', 'other')}")], grpc.StatusCode.PERMISSION_DENIED),
            (base + [("authorization", f"Bearer {mint('default', 'sb-grpc')}"), ("x-sandbox-pod-ip", "10.1.2.3")],
             grpc.StatusCode.PERMISSION_DENIED),
            # Authorized: the router then fails to resolve the (fake) cluster DNS name.
            (base + [("authorization", f"Bearer {mint('default', 'sb-grpc')}")], grpc.StatusCode.UNAVAILABLE),
        ]
        for metadata, code in cases:
            with pytest.raises(grpc.RpcError) as e:
                stub.Execute(process_pb2.ExecuteRequest(), metadata=metadata, timeout=20)
            assert e.value.code() == code, (metadata, e.value.details())
    assert r.metric("sandbox_router_authz_decisions_total", decision="deny") == 4
    assert r.metric("sandbox_router_authz_decisions_total", decision="allow") == 1
