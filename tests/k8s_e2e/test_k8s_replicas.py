"""Hub replicas on the kubernetes backend (issue #28): what one replica signs
opens on every other, and survives the replica that signed it.

Two `sandhub serve --backend kubernetes --e2b --sandbox-domain` processes
share one `--signing-key-file`, as the replicas of deploy/hub share the
mounted Secret, and a client alternates between them the way a Service
would. A replica with another key refuses to start; one in the middle of a
key rotation starts."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import signal
import struct
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from sandhub_testing import stop_process, wait_for
from sandhub_testing.binaries import binary
from sandhub_testing.hub_k8s import POOL, Cluster, wait_for_pool
from sandhub_testing.net import LOOPBACK, free_port

HEADERS = {"x-api-key": "any-key-on-an-open-hub"}
DOMAIN = "sandboxes.test"
PORT = 8000


def envd(url: str, sid: str, token: str, rpc: str, body: dict[str, Any]) -> requests.Response:
    """One envd Connect call, unary JSON, through the hub at `url`."""
    return requests.post(
        f"{url}/{rpc}",
        json=body,
        headers={
            "e2b-sandbox-id": sid,
            "e2b-sandbox-port": "49983",
            "x-access-token": token,
            "content-type": "application/json",
        },
        timeout=60,
    )


def open_link(url: str, link: str) -> requests.Response:
    """A minted port link, visited at hub `url` (whatever replica minted it):
    its token is traded for a cookie, which then opens the port."""
    parts = urlsplit(link)
    token = parse_qs(parts.query)["sandhub_token"][0]
    host = {"Host": parts.netloc}
    r = requests.get(f"{url}/?sandhub_token={token}", headers=host, allow_redirects=False, timeout=30)
    assert r.status_code == 303, r.text
    return requests.get(f"{url}/hello.txt", headers={**host, "cookie": f"sandhub_port={token}"}, timeout=30)


def start(cluster: Cluster, *extra: str) -> tuple[subprocess.Popen[Any], str]:
    return cluster.start_hub("--e2b", "--sandbox-domain", DOMAIN, *extra)


def e2b_sandbox(url: str) -> tuple[str, str]:
    """An E2B sandbox from the warm pool, made through the hub at `url`: its
    id and envd access token."""
    r = requests.post(f"{url}/v2/sandboxes", json={"templateID": POOL, "timeout": 600},
                      headers=HEADERS, timeout=200)
    assert r.status_code == 201, r.text
    return r.json()["sandboxID"], r.json()["envdAccessToken"]


def test_tokens_and_links_of_one_replica_open_on_every_other(cluster: Cluster, tmp_path: Path):
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    c: subprocess.Popen[Any] | None = None
    try:
        # An E2B sandbox made through A...
        sid, token = e2b_sandbox(url_a)
        # ...is used through B with the token A signed.
        dirname = f"/workspace/made-through-b-{secrets.token_hex(3)}"
        r = envd(url_b, sid, token, "filesystem.Filesystem/MakeDir", {"path": dirname})
        assert r.status_code == 200, r.text
        r = envd(url_a, sid, token, "filesystem.Filesystem/Stat", {"path": dirname})
        assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", r.text
        # A forged token opens nothing on either.
        for url in (url_a, url_b):
            r = envd(url, sid, token[:-4] + "AAAA", "filesystem.Filesystem/Stat", {"path": dirname})
            assert r.status_code == 401, r.text

        # A port link minted on A opens on B.
        body = "served in the pod " + secrets.token_hex(4)
        script = f"printf '%s' '{body}' > /workspace/hello.txt && busybox httpd -p {PORT} -h /workspace"
        r = requests.post(f"{url_a}/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", script]}, timeout=60)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        r = requests.post(f"{url_a}/v1/sandboxes/{sid}/port-urls/{PORT}?ttl_seconds=600", timeout=30)
        assert r.status_code == 200, r.text
        link = r.json()["url"]
        assert urlsplit(link).netloc.startswith(f"{PORT}-{sid}."), link
        opened = wait_for("the port link minted on A to open on B",
                          lambda: (lambda r: r if r.status_code == 200 else None)(open_link(url_b, link)),
                          timeout=60)
        assert opened.text == body

        # kill -9 of A: B and a replica started after it still open both.
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        c, url_c = start(cluster)
        for url in (url_b, url_c):
            r = envd(url, sid, token, "filesystem.Filesystem/Stat", {"path": dirname})
            assert r.status_code == 200, (url, r.text)
            assert open_link(url, link).text == body
            info = requests.get(f"{url}/sandboxes/{sid}", headers=HEADERS, timeout=30)
            assert info.status_code == 200 and info.json()["state"] == "running", info.text

        r = requests.delete(f"{url_c}/sandboxes/{sid}", headers=HEADERS, timeout=60)
        assert r.status_code == 204, r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        for p in (a, b, c):
            if p is not None:
                stop_process(p)
    wait_for_pool(cluster, 2)


def step(url: str, env: str, action: str) -> dict[str, Any]:
    r = requests.post(f"{url}/gym/v1/envs/{env}/step", json={"action": action}, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_gym_env_made_on_one_replica_is_stepped_on_any_and_outlives_it(cluster: Cluster):
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    c: subprocess.Popen[Any] | None = None
    try:
        r = requests.post(f"{url_a}/gym/v1/envs", json={
            "pool": POOL,
            "reward": [{"kind": "exit_code", "equals": 0, "weight": 1.0}],
            "max_episode_steps": 10,
        }, timeout=200)
        assert r.status_code == 201, r.text
        env = r.json()["env_id"]
        # Recorded in the cluster, under the tenant's digest only.
        cm = cluster.core.read_namespaced_config_map(f"sandhub-gym-{env}", cluster.ns)
        assert cm.metadata.labels["sandhub.io/gym-env"] == "true"

        r = requests.post(f"{url_b}/gym/v1/envs/{env}/reset", json={"seed": 7}, timeout=200)
        assert r.status_code == 200, r.text
        first = step(url_b, env, "echo one > /workspace/a && cat /workspace/a")
        assert first["observation"].startswith("one") and first["reward"] == 1.0, first
        assert first["info"]["step"] == 1, first
        # A steps it next and sees B's step count, workspace and sandbox.
        second = step(url_a, env, "cat /workspace/a")
        assert second["info"]["step"] == 2 and second["observation"].startswith("one"), second
        assert second["info"]["sandbox_id"] == first["info"]["sandbox_id"]

        # kill -9 of the replica that made it: B and a new replica go on.
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        c, url_c = start(cluster)
        third = step(url_c, env, "echo $SANDHUB_SEED")
        assert third["info"]["step"] == 3 and third["observation"].startswith("7"), third
        fourth = step(url_b, env, "false")
        assert fourth["info"]["step"] == 4 and fourth["reward"] == 0.0, fourth

        # Closed through one replica, gone on every other.
        assert requests.delete(f"{url_c}/gym/v1/envs/{env}", timeout=60).status_code == 204
        r = requests.post(f"{url_b}/gym/v1/envs/{env}/step", json={"action": "true"}, timeout=60)
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
        # Another id shape is simply not found, never turned into an object name.
        r = requests.post(f"{url_b}/gym/v1/envs/..%2Fkube-root-ca.crt/step", json={"action": "true"}, timeout=60)
        assert r.status_code == 404, r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        for p in (a, b, c):
            if p is not None:
                stop_process(p)
    wait_for_pool(cluster, 2)


def test_a_rest_process_started_on_one_replica_takes_input_and_signals_on_another(cluster: Cluster):
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    try:
        r = requests.post(f"{url_a}/v1/sandboxes", json={"pool": POOL}, timeout=200)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        with requests.post(f"{url_a}/v1/sandboxes/{sid}/processes",
                           json={"command": ["sh", "-c", "read line; echo got $line; sleep 600"]},
                           stream=True, timeout=120) as stream:
            assert stream.status_code == 200, stream.text
            lines = stream.iter_lines()
            started = json.loads(next(lines))
            assert started["type"] == "started", started
            pid = started["pid"]
            # The pid names sandboxd's process: another replica reaches it.
            r = requests.post(f"{url_b}/v1/sandboxes/{sid}/processes/{pid}/stdin", data=b"hello\n", timeout=30)
            assert r.status_code == 204, r.text
            out = json.loads(next(lines))
            assert out["type"] == "stdout" and base64.b64decode(out["data"]) == b"got hello\n", out
            r = requests.post(f"{url_b}/v1/sandboxes/{sid}/processes/{pid}/signal",
                              json={"signal": "SIGKILL"}, timeout=30)
            assert r.status_code == 204, r.text
            ended = json.loads(next(lines))
            assert ended == {"type": "exited", "exit_code": 137}, ended
        assert requests.delete(f"{url_b}/v1/sandboxes/{sid}", timeout=60).status_code == 204
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(a)
        stop_process(b)
    wait_for_pool(cluster, 2)


def envelope(message: dict[str, Any]) -> bytes:
    """One Connect-protocol stream envelope (flags 0, big-endian length)."""
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def next_message(raw: Any) -> dict[str, Any]:
    """The next envelope of a Connect stream, as JSON."""
    _flags, size = struct.unpack(">BI", raw.read(5))
    message: dict[str, Any] = json.loads(raw.read(size))
    return message


def test_an_e2b_process_started_on_one_replica_takes_input_and_signals_on_another(cluster: Cluster):
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    try:
        sid, token = e2b_sandbox(url_a)
        headers = {"e2b-sandbox-id": sid, "e2b-sandbox-port": "49983", "x-access-token": token,
                   "content-type": "application/connect+json"}
        command = {"cmd": "/bin/sh", "args": ["-c", "read line; echo got $line; sleep 600"]}
        with requests.post(f"{url_a}/process.Process/Start", headers=headers, stream=True, timeout=120,
                           data=envelope({"process": command, "stdin": True})) as stream:
            assert stream.status_code == 200, stream.text
            pid = next_message(stream.raw)["event"]["start"]["pid"]
            # The pid names sandboxd's process: B reaches it without A.
            r = envd(url_b, sid, token, "process.Process/SendInput",
                     {"process": {"pid": pid}, "input": {"stdin": base64.b64encode(b"hi\n").decode()}})
            assert r.status_code == 200, r.text
            data = next_message(stream.raw)["event"]["data"]
            assert base64.b64decode(data["stdout"]) == b"got hi\n", data
            r = envd(url_b, sid, token, "process.Process/SendSignal",
                     {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
            assert r.status_code == 200, r.text
            end = next_message(stream.raw)["event"]["end"]
            assert end["exitCode"] == 137 and end["exited"], end
        r = requests.delete(f"{url_b}/sandboxes/{sid}", headers=HEADERS, timeout=60)
        assert r.status_code == 204, r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(a)
        stop_process(b)
    wait_for_pool(cluster, 2)


def connect_stream(url: str, headers: dict[str, str], rpc: str, body: dict[str, Any]) -> requests.Response:
    """A server-streaming envd call (Start, Connect) through the hub at `url`."""
    return requests.post(f"{url}/process.Process/{rpc}", headers=headers, stream=True, timeout=120,
                         data=envelope(body))


def test_an_e2b_background_process_outlives_the_replica_that_started_it(cluster: Cluster):
    """sandboxd keeps E2B's processes past their Start stream: kill -9 of the
    replica that started one leaves it running, and any other replica lists
    it (tag included), connects to it (its retained output first), writes to
    it and kills it."""
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    c: subprocess.Popen[Any] | None = None
    try:
        sid, token = e2b_sandbox(url_a)
        headers = {"e2b-sandbox-id": sid, "e2b-sandbox-port": "49983", "x-access-token": token,
                   "content-type": "application/connect+json"}
        command = {"cmd": "/bin/sh", "args": ["-c", "echo ready; read line; echo got $line; sleep 600"]}
        stream = connect_stream(url_a, headers, "Start", {"process": command, "tag": "srv", "stdin": True})
        assert stream.status_code == 200, stream.text
        pid = next_message(stream.raw)["event"]["start"]["pid"]
        data = next_message(stream.raw)["event"]["data"]
        assert base64.b64decode(data["stdout"]) == b"ready\n", data

        # kill -9 of A, whose call started it; a replica started after A knows nothing either.
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        stream.close()
        c, url_c = start(cluster)
        listed = envd(url_b, sid, token, "process.Process/List", {})
        assert listed.status_code == 200, listed.text
        mine = [p for p in listed.json()["processes"] if p["pid"] == pid]
        assert len(mine) == 1 and mine[0]["tag"] == "srv", listed.json()
        assert mine[0]["config"]["cmd"] == "/bin/sh" and mine[0]["config"]["args"] == command["args"], mine

        with connect_stream(url_c, headers, "Connect", {"process": {"tag": "srv"}}) as watch:
            assert watch.status_code == 200, watch.text
            assert next_message(watch.raw)["event"]["start"]["pid"] == pid
            # Its retained output first, then what it prints from now on.
            data = next_message(watch.raw)["event"]["data"]
            assert base64.b64decode(data["stdout"]) == b"ready\n", data
            r = envd(url_b, sid, token, "process.Process/SendInput",
                     {"process": {"tag": "srv"}, "input": {"stdin": base64.b64encode(b"hi\n").decode()}})
            assert r.status_code == 200, r.text
            data = next_message(watch.raw)["event"]["data"]
            assert base64.b64decode(data["stdout"]) == b"got hi\n", data
            r = envd(url_b, sid, token, "process.Process/SendSignal",
                     {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
            assert r.status_code == 200, r.text
            end = next_message(watch.raw)["event"]["end"]
            assert end["exitCode"] == 137 and end["exited"], end
        listed = envd(url_c, sid, token, "process.Process/List", {})
        assert all(p["pid"] != pid for p in listed.json()["processes"]), listed.json()
        r = requests.delete(f"{url_b}/sandboxes/{sid}", headers=HEADERS, timeout=60)
        assert r.status_code == 204, r.text
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        for p in (a, b, c):
            if p is not None:
                stop_process(p)
    wait_for_pool(cluster, 2)


class Mcp:
    """MCP over streamable HTTP, spoken by hand so that each request can go
    to the replica the test picks (a client library keeps one connection)."""

    def __init__(self) -> None:
        self.session = ""
        self.next_id = 0

    def post(self, url: str, message: dict[str, Any]) -> requests.Response:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        if self.session:
            headers["mcp-session-id"] = self.session
            headers["mcp-protocol-version"] = "2025-06-18"
        return requests.post(f"{url}/mcp", json=message, headers=headers, timeout=200)

    def request(self, url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        r = self.post(url, {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        assert r.status_code == 200, (url, r.status_code, r.text)
        if not self.session:
            self.session = r.headers["mcp-session-id"]
        # A JSON answer, or an SSE stream whose data lines carry it.
        bodies = [r.text] if r.headers["content-type"].startswith("application/json") else [
            line[len("data:"):].strip() for line in r.text.splitlines() if line.startswith("data:")]
        for body in bodies:
            if body:
                msg: dict[str, Any] = json.loads(body)
                if msg.get("id") == self.next_id:
                    assert "error" not in msg, msg
                    result: dict[str, Any] = msg["result"]
                    return result
        raise AssertionError(f"no answer to {method} in {r.text!r}")

    def open(self, url: str) -> None:
        self.request(url, "initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "replica-test", "version": "1"}})
        r = self.post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text

    def tool(self, url: str, name: str, **arguments: Any) -> dict[str, Any]:
        result = self.request(url, "tools/call", {"name": name, "arguments": arguments})
        assert not result.get("isError"), (name, result)
        out: dict[str, Any] = result["structuredContent"]
        return out


def test_an_mcp_session_opened_on_one_replica_is_served_by_any(cluster: Cluster):
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    c: subprocess.Popen[Any] | None = None
    try:
        mcp = Mcp()
        mcp.open(url_a)
        # B has never seen the session: it rebuilds it from the cluster.
        name = mcp.tool(url_b, "create_sandbox", warmpool=POOL)["sandbox_claim_name"]
        ran = mcp.tool(url_a, "execute_command", sandbox_claim_name=name, command="echo hi > f && cat f")
        assert ran["exit_code"] == 0 and ran["stdout"] == "hi\n", ran
        listed = mcp.tool(url_b, "list_sandboxes")
        assert name in json.dumps(listed), listed
        # The session's records name neither the session id nor the tenant's key.
        records = [cm for cm in cluster.core.list_namespaced_config_map(cluster.ns).items
                   if (cm.metadata.labels or {}).get("sandhub.io/mcp-session-record") == "true"]
        assert records and all(mcp.session not in cm.metadata.name for cm in records)

        # kill -9 of the replica that opened it; B and a new replica go on.
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        c, url_c = start(cluster)
        ran = mcp.tool(url_c, "execute_command", sandbox_claim_name=name, command="cat f")
        assert ran["stdout"] == "hi\n", ran
        # Another session never sees this one's sandbox, on any replica.
        other = Mcp()
        other.open(url_b)
        r = other.request(url_c, "tools/call", {"name": "execute_command",
                                                "arguments": {"sandbox_claim_name": name, "command": "true"}})
        assert r.get("isError"), r
        # A session id nobody opened is unknown everywhere.
        stranger = Mcp()
        stranger.session = "0" * 32
        r2 = stranger.post(url_b, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        assert r2.status_code == 404, r2.text

        assert mcp.tool(url_b, "delete_sandbox", sandbox_claim_name=name)
        # Ending the session on C removes its record for every replica.
        r2 = requests.delete(f"{url_c}/mcp", headers={"mcp-session-id": mcp.session,
                                                      "mcp-protocol-version": "2025-06-18"}, timeout=60)
        assert r2.status_code == 200, r2.text
        d, url_d = start(cluster)
        try:
            r2 = mcp.post(url_d, {"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}})
            assert r2.status_code == 404, r2.text
        finally:
            stop_process(d)
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        for p in (a, b, c):
            if p is not None:
                stop_process(p)
    wait_for_pool(cluster, 2)


def test_an_mcp_process_outlives_the_replica_that_started_it(cluster: Cluster):
    """A session's background process is kept in its sandbox under the
    session's label: after kill -9 of the replica that started it, another
    replica reads its output (what the sandbox retained), writes to it and
    kills it; another session cannot reach it."""
    a, url_a = start(cluster)
    b, url_b = start(cluster)
    try:
        mcp = Mcp()
        mcp.open(url_a)
        name = mcp.tool(url_a, "create_sandbox", warmpool=POOL)["sandbox_claim_name"]
        started = mcp.tool(url_a, "start_process", sandbox_claim_name=name,
                           command="echo ready; read line; echo got $line; sleep 600")
        proc = {"sandbox_claim_name": name, "process_id": started["process_id"]}
        out = mcp.tool(url_a, "read_process_output", wait_seconds=30, **proc)
        assert out["stdout"] == "ready\n" and out["running"], out

        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        out = mcp.tool(url_b, "read_process_output", wait_seconds=10, **proc)
        assert out["stdout"] == "ready\n" and out["running"], out
        mcp.tool(url_b, "send_process_input", input="hi\n", **proc)
        out = mcp.tool(url_b, "read_process_output", wait_seconds=30, **proc)
        assert out["stdout"] == "got hi\n", out
        # Another session of the same tenant knows no such process.
        other = Mcp()
        other.open(url_b)
        r = other.request(url_b, "tools/call", {"name": "read_process_output", "arguments": proc})
        assert r.get("isError"), r
        killed = mcp.tool(url_b, "kill_process", signal="SIGKILL", **proc)
        assert killed["exited"] and killed["exit_code"] == 137, killed
        assert mcp.tool(url_b, "delete_sandbox", sandbox_claim_name=name)
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(a)
        stop_process(b)
    wait_for_pool(cluster, 2)


def test_a_replica_with_another_key_refuses_to_start_and_a_rotation_starts(cluster: Cluster, tmp_path: Path):
    first, _ = start(cluster)  # records the shared key's fingerprint, if no test did yet
    stop_process(first)
    old = cluster.signing_key_file.read_text().strip()

    stranger = tmp_path / "another-key"
    stranger.write_text(secrets.token_urlsafe(48) + "\n")
    log = cluster.logs / "hub.log"
    seen = log.stat().st_size
    proc = cluster.spawn("hub", [
        *start_argv(cluster), "--signing-key-file", str(stranger),
    ])
    assert proc.wait(timeout=60) != 0, "a replica with a key the others do not share must not serve"
    said = log.read_bytes()[seen:].decode(errors="replace")
    assert "does not agree with the other replicas" in said, said[-2000:]
    assert old not in said and stranger.read_text().strip() not in said, "keys are never logged"

    # The new key first, the shared one second: tokens pass both ways, it serves.
    rotated = tmp_path / "rotated"
    rotated.write_text(secrets.token_urlsafe(48) + "\n" + old + "\n")
    hub, url = start(cluster, "--signing-key-file", str(rotated))
    try:
        assert requests.get(f"{url}/readyz", timeout=10).status_code == 200
    finally:
        stop_process(hub)
    # Back to the shared key alone (the record now names the rotated file's
    # keys, which accept it): the session's other tests keep working.
    again, _ = start(cluster)
    stop_process(again)


def start_argv(cluster: Cluster) -> list[str]:
    """The argv `Cluster.start_hub` runs, minus its signing key, on a free port."""
    return [
        str(binary("sandhub")), "serve",
        "--backend", "kubernetes",
        "--kubeconfig", cluster.kubeconfig,
        "--namespace", cluster.ns,
        "--sandboxd-token-key-file", str(cluster.token_key_file),
        "--listen", f"{LOOPBACK}:{free_port()}",
        "--e2b", "--sandbox-domain", DOMAIN,
    ]


def record_name(session: str) -> str:
    """The ConfigMap of an MCP session's record (kube/mcp_sessions.rs)."""
    digest = hashlib.sha256(b"sandhub-mcp-session-record/v1\0" + session.encode()).hexdigest()
    return f"sandhub-mcp-{digest[:40]}"


def test_a_tenant_keeps_at_most_its_cap_of_mcp_session_records(cluster: Cluster):
    a, url_a = start(cluster, "--mcp-sessions-per-tenant", "2")
    b, url_b = start(cluster)
    sessions: list[Mcp] = []
    try:
        for _ in range(3):
            mcp = Mcp()
            mcp.open(url_a)
            sessions.append(mcp)
        names = {record_name(m.session) for m in sessions}
        records = [cm for cm in cluster.core.list_namespaced_config_map(cluster.ns).items
                   if (cm.metadata.labels or {}).get("sandhub.io/mcp-session-record") == "true"]
        mine = {cm.metadata.name: cm for cm in records if cm.metadata.name in names}
        tenant = mine[record_name(sessions[2].session)].metadata.labels["sandhub.io/tenant"]
        # The tenant's label is its digest, and the tenant holds two records
        # (older ones of other tests' sessions went first): the newest two.
        assert len(tenant) == 40 and all(c in "0123456789abcdef" for c in tenant), tenant
        held = sorted(cm.metadata.name for cm in records
                      if (cm.metadata.labels or {}).get("sandhub.io/tenant") == tenant)
        assert held == sorted(record_name(m.session) for m in sessions[1:]), held

        # The evicted session is unknown to B, yet still served by A, which
        # holds it; the two kept are served by both.
        r = sessions[0].post(url_b, {"jsonrpc": "2.0", "id": 50, "method": "tools/list", "params": {}})
        assert r.status_code == 404, r.text
        assert "tools" in sessions[0].request(url_a, "tools/list", {})
        for mcp in sessions[1:]:
            assert "tools" in mcp.request(url_b, "tools/list", {})
    finally:
        for mcp in sessions:
            requests.delete(f"{url_a}/mcp", headers={"mcp-session-id": mcp.session,
                                                     "mcp-protocol-version": "2025-06-18"}, timeout=60)
        stop_process(a)
        stop_process(b)
