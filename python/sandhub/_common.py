"""Helpers the sync and async faces share: request bodies, decoding, chunking."""

from __future__ import annotations

import json
import os
from typing import IO, Any, Iterator, Mapping, Sequence, Union

from .types import NetworkPolicy, ProcessExitEvent, ProcessOutputEvent, StepResult

DEFAULT_URL = "http://127.0.0.1:7070"
#: Upload chunk size: large enough that the per-chunk cost vanishes, small
#: enough that a few queued chunks are all the memory a 1 GiB upload holds.
CHUNK = 1 << 20

Command = Union[str, Sequence[str]]
Data = Union[bytes, bytearray, memoryview, str, IO[bytes]]
#: A ``network`` argument: the mode alone (``"none"``, ``"egress"``), a
#: :class:`NetworkPolicy`, or the API's object as a mapping
#: (``{"allow_out": [...], "deny_out": [...]}``).
Network = Union[str, NetworkPolicy, Mapping[str, Any]]


def hub_url(url: str | None) -> str:
    return url or os.environ.get("SANDHUB_URL") or DEFAULT_URL


def api_key(key: str | None) -> str | None:
    return key if key is not None else os.environ.get("SANDHUB_API_KEY") or None


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def loads(text: str) -> Any:
    return json.loads(text)


def network_json(network: Network) -> dict[str, Any]:
    """A ``network`` argument as the API's object (``{"mode": ...}`` for a
    bare mode: request bodies are objects). The hub validates it."""
    if isinstance(network, NetworkPolicy):
        return network._json()
    if isinstance(network, str):
        return {"mode": network}
    if isinstance(network, Mapping):
        return dict(network)
    raise TypeError(f"network: a mode, a NetworkPolicy or a mapping, not {type(network).__name__}")


def exec_body(
    cmd: Command,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout: float | None,
    stdin: str | bytes | None,
    container: str | None = None,
) -> str:
    body: dict[str, Any] = {"command": cmd if isinstance(cmd, str) else list(cmd)}
    if container is not None:
        body["container"] = container
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if timeout is not None:
        body["timeout_seconds"] = float(timeout)
    if stdin is not None:
        body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    return dumps(body)


def start_body(
    cmd: Command,
    cwd: str | None,
    env: Mapping[str, str] | None,
    pty: bool,
    rows: int,
    cols: int,
) -> str:
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    body: dict[str, Any] = {"command": argv}
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if pty:
        body["pty"] = {"rows": rows, "cols": cols}
    return dumps(body)


def event(raw: tuple[str, Any]) -> ProcessOutputEvent | ProcessExitEvent:
    kind, value = raw
    if kind == "exit":
        code = int(value)
        signal = -code if code < 0 else (code - 128 if 128 < code <= 128 + 64 else None)
        return ProcessExitEvent(exit_code=code, signal=signal)
    return ProcessOutputEvent(stream=kind, data=value)  # type: ignore[arg-type]


def signal_name(sig: str | int) -> str:
    if isinstance(sig, int):
        return str(int(sig))
    return sig


def chunks_of(data: Data) -> Iterator[bytes]:
    """The upload body in chunks; a file object is read as it goes."""
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        if len(view) == 0:
            return
        for start in range(0, len(view), CHUNK):
            yield bytes(view[start : start + CHUNK])
        return
    read = getattr(data, "read", None)
    if read is None:
        raise TypeError(f"files.write takes bytes, str or a binary file object, not {type(data).__name__}")
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)


def sandbox_id(sandbox: Any) -> str:
    return sandbox if isinstance(sandbox, str) else str(sandbox.id)


def grpc_default(target: str, grpc_url: str | None) -> str | None:
    """sandboxd's gRPC URL: ``grpc_url``, else port 9090 of an HTTP target's host."""
    if grpc_url or not target.startswith(("http://", "https://")):
        return grpc_url
    from urllib.parse import urlsplit

    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.hostname}:9090"


def batch_body(steps: Sequence[tuple[str, str]]) -> str:
    """``POST /gym/v1/step`` (batch) for ``(env_id, action)`` pairs."""
    return dumps({"steps": [{"env_id": e, "action": a} for e, a in steps]})


def batch_results(raw: str) -> list[StepResult | Exception]:
    """A batch step's answer: a result, or the failed step's exception, per step."""
    from .errors import error_for

    out: list[StepResult | Exception] = []
    for item in loads(raw)["results"]:
        if item.get("error"):
            out.append(error_for(item["error"]["code"], item["error"]["message"]))
        else:
            out.append(StepResult._from(item["result"]))
    return out
