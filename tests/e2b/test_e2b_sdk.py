"""The E2B control plane through the real `e2b` SDK: create (template,
timeout, metadata, envs), get_info, set_timeout, is_running, kill, list with
metadata/state filters and pagination, pause and connect, get_metrics; and the
SDK configured through E2B_API_KEY / E2B_API_URL / E2B_SANDBOX_URL.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from e2b import (
    Sandbox,
    SandboxException,
    SandboxMetrics,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from e2b_support import SandboxFactory, ids
from sandhub_testing import Hub, wait_for
from sandhub_testing.e2b import ANY_KEY, WORKSPACE, Conn, conn_for, unique_tag

#: Slack for comparing the hub's clock-derived times with ours (same machine).
CLOCK_SLACK = timedelta(seconds=15)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def assert_aware(moment: datetime, what: str) -> None:
    """E2B times are RFC 3339 with an offset: a naive datetime cannot be
    compared with the user's aware ones."""
    assert moment.tzinfo is not None, f"{what} has no time zone: {moment!r}"


# --------------------------------------------------------------------------- create


def test_create_applies_envs_and_metadata(sandbox: Sandbox, tag: str) -> None:
    """Sandbox-wide envs reach every command; metadata comes back in get_info."""
    assert sandbox.sandbox_id
    assert sandbox.commands.run("echo $GREETING").stdout == "hello\n"
    info = sandbox.get_info()
    assert info.metadata.items() >= {"suite": "e2b", "tag": tag}.items(), info.metadata


def test_create_without_template_uses_base(e2b_env: Hub, tag: str) -> None:
    """Configured only through E2B_API_KEY/E2B_API_URL/E2B_SANDBOX_URL (as
    users do), `Sandbox.create()` with no template (the SDK sends "base")
    gives a working sandbox that the env-configured class methods also reach."""
    with Sandbox.create(metadata={"tag": tag}) as sbx:
        assert sbx.commands.run("echo via-env").stdout == "via-env\n"
        assert Sandbox.get_info(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert ids(listed) == {sbx.sandbox_id}
        sandbox_id = sbx.sandbox_id
    # Leaving the `with` killed it.
    assert Sandbox.kill(sandbox_id) is False


def test_create_without_timeout_lives_e2b_default(e2b_env: Hub, tag: str) -> None:
    """No `timeout` in the request (the SDK omits it): E2B's default
    lifetime, 300 s (`SandboxBase.default_sandbox_timeout`)."""
    with Sandbox.create(metadata={"tag": tag}) as sbx:
        info = sbx.get_info()
        lifetime = info.end_at - info.started_at
        default = timedelta(seconds=Sandbox.default_sandbox_timeout)
        assert abs(lifetime - default) <= CLOCK_SLACK, (info.started_at, info.end_at)


def test_create_with_sandhub_template_name(make_sandbox: SandboxFactory, conn: Conn) -> None:
    """A Sandhub template name is a valid E2B templateID too ("base" is the
    facade's alias of Sandhub's "default")."""
    sbx = make_sandbox(conn, template="default")
    assert sbx.commands.run("echo ok").stdout == "ok\n"


def test_create_with_unknown_template_fails(conn: Conn, tag: str) -> None:
    with pytest.raises(SandboxException) as exc:
        Sandbox.create(template="no-such-template-e2b", metadata={"tag": tag}, **conn)
    assert exc.value.status_code in (400, 404), exc.value
    # Nothing was left behind under this tag.
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), **conn).next_items() == []


# --------------------------------------------------------------------------- info and timeout


def test_get_info_fields(make_sandbox: SandboxFactory, conn: Conn, tag: str) -> None:
    before = utcnow()
    sbx = make_sandbox(conn, timeout=120, metadata={"suite": "e2b", "tag": tag})
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert isinstance(info.template_id, str) and info.template_id
    assert info.metadata.items() >= {"suite": "e2b", "tag": tag}.items(), info.metadata
    assert info.state == SandboxState.RUNNING
    assert_aware(info.started_at, "started_at")
    assert_aware(info.end_at, "end_at")
    assert before - CLOCK_SLACK <= info.started_at <= utcnow() + CLOCK_SLACK
    assert abs((info.end_at - info.started_at) - timedelta(seconds=120)) <= CLOCK_SLACK
    # The class-method form answers the same.
    again = Sandbox.get_info(sbx.sandbox_id, **conn)
    assert (again.sandbox_id, again.template_id, again.started_at) == (
        info.sandbox_id,
        info.template_id,
        info.started_at,
    )


def test_set_timeout_moves_end_at_both_ways(sandbox: Sandbox) -> None:
    """set_timeout(n) makes the sandbox end n seconds from now: later or sooner
    than before (E2B allows both)."""
    first = sandbox.get_info().end_at
    sandbox.set_timeout(900)
    longer = sandbox.get_info().end_at
    assert longer > first
    assert abs(longer - (utcnow() + timedelta(seconds=900))) <= CLOCK_SLACK
    sandbox.set_timeout(60)
    shorter = sandbox.get_info().end_at
    assert shorter < longer
    assert abs(shorter - (utcnow() + timedelta(seconds=60))) <= CLOCK_SLACK
    assert sandbox.is_running() is True


def test_sandbox_past_its_timeout_is_gone(make_sandbox: SandboxFactory, conn: Conn) -> None:
    """A sandbox whose timeout runs out is killed: not running, not found."""
    sbx = make_sandbox(conn, timeout=2)
    wait_for("the sandbox to reach its timeout", lambda: sbx.is_running() is False, timeout=60)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **conn)
    assert Sandbox.kill(sbx.sandbox_id, **conn) is False


# --------------------------------------------------------------------------- kill


def test_is_running_then_kill(sandbox: Sandbox, conn: Conn) -> None:
    assert sandbox.is_running() is True
    assert sandbox.kill() is True
    assert sandbox.is_running() is False
    # Killed: not found any more, and a second kill says so.
    assert Sandbox.kill(sandbox.sandbox_id, **conn) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **conn)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **conn)


def test_kill_by_id(make_sandbox: SandboxFactory, conn: Conn) -> None:
    sbx = make_sandbox(conn)
    assert Sandbox.kill(sbx.sandbox_id, **conn) is True
    assert Sandbox.kill(sbx.sandbox_id, **conn) is False
    assert Sandbox.kill("no-such-sandbox", **conn) is False


# --------------------------------------------------------------------------- list


def test_list_filters_by_metadata_and_state(make_sandbox: SandboxFactory, conn: Conn) -> None:
    mine_tag, other_tag = unique_tag(), unique_tag()
    mine = make_sandbox(conn, metadata={"suite": "e2b", "tag": mine_tag})
    other = make_sandbox(conn, metadata={"suite": "e2b", "tag": other_tag})

    running = Sandbox.list(
        query=SandboxQuery(metadata={"tag": mine_tag}, state=[SandboxState.RUNNING]), limit=10, **conn
    ).next_items()
    assert ids(running) == {mine.sandbox_id}
    (listed,) = running
    assert listed.state == SandboxState.RUNNING
    assert listed.metadata.items() >= {"suite": "e2b", "tag": mine_tag}.items()
    assert_aware(listed.started_at, "started_at")

    # Every metadata pair must match: the other sandbox shares "suite" only.
    both_keys = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b", "tag": other_tag}), **conn).next_items()
    assert ids(both_keys) == {other.sandbox_id}

    # Neither is paused.
    paused = Sandbox.list(
        query=SandboxQuery(metadata={"tag": mine_tag}, state=[SandboxState.PAUSED]), **conn
    ).next_items()
    assert paused == []

    # Unfiltered, the listing holds both.
    everything: set[str] = set()
    pages = Sandbox.list(**conn)
    while pages.has_next:
        everything |= ids(pages.next_items())
    assert {mine.sandbox_id, other.sandbox_id} <= everything


def test_list_paginates(make_sandbox: SandboxFactory, conn: Conn, tag: str) -> None:
    """`limit` bounds a page; the next one comes through the x-next-token header."""
    made = {make_sandbox(conn, metadata={"tag": tag}).sandbox_id for _ in range(3)}
    pages = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2, **conn)
    first = pages.next_items()
    assert len(first) == 2
    assert pages.has_next
    second = pages.next_items()
    assert len(second) == 1
    assert not pages.has_next
    assert ids(first) | ids(second) == made


# --------------------------------------------------------------------------- pause and connect


def test_pause_then_connect_resumes_with_files(sandbox: Sandbox, conn: Conn, tag: str) -> None:
    path = f"{WORKSPACE}/e2b-pause/kept.txt"
    sandbox.files.write(path, "kept across pause\n")

    assert sandbox.pause() is True
    assert Sandbox.get_info(sandbox.sandbox_id, **conn).state == SandboxState.PAUSED
    assert sandbox.is_running() is False
    # Pausing what is paused answers "already paused".
    assert Sandbox.pause(sandbox.sandbox_id, **conn) is False
    paused = Sandbox.list(
        query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED]), **conn
    ).next_items()
    assert ids(paused) == {sandbox.sandbox_id}

    resumed = Sandbox.connect(sandbox.sandbox_id, **conn)
    assert resumed.sandbox_id == sandbox.sandbox_id
    assert resumed.is_running() is True
    assert Sandbox.get_info(sandbox.sandbox_id, **conn).state == SandboxState.RUNNING
    assert resumed.files.read(path) == "kept across pause\n"
    assert resumed.commands.run(f"cat {path}").stdout == "kept across pause\n"


def test_pause_then_connect_keeps_a_running_process(sandbox: Sandbox, conn: Conn) -> None:
    """E2B's pause keeps the processes (the hub freezes them in place): a
    background loop counting in its own memory is the same process after
    `connect`, did not count while paused, and counts on after."""
    count = "/tmp/e2b-pause-count"
    loop = sandbox.commands.run(
        f"i=0; while :; do i=$((i+1)); echo $i > {count}; sleep 0.05; done", background=True
    )

    def counted() -> int:
        return int(sandbox.commands.run(f"cat {count}").stdout.strip() or "0")

    wait_for("the loop to count", lambda: counted() >= 3, timeout=60)
    started = sandbox.commands.run(f"cut -d' ' -f22 /proc/{loop.pid}/stat").stdout
    before = counted()
    assert sandbox.pause() is True
    assert Sandbox.get_info(sandbox.sandbox_id, **conn).state == SandboxState.PAUSED
    # Unpaused, it would count 20 a second (30 in the pause).
    time.sleep(1.5)
    resumed = Sandbox.connect(sandbox.sandbox_id, **conn)
    after = int(resumed.commands.run(f"cat {count}").stdout.strip())
    assert before <= after <= before + 15, (before, after)
    assert resumed.commands.run(f"cut -d' ' -f22 /proc/{loop.pid}/stat").stdout == started
    wait_for("the loop to count again", lambda: counted() >= after + 5, timeout=60)
    resumed.commands.kill(loop.pid)


def test_an_auto_resume_sandbox_wakes_on_its_next_envd_call(e2b_hub: Hub, conn: Conn, tag: str) -> None:
    """A template with `auto_resume`: after `pause`, the next envd call (a
    command) resumes the sandbox, with no `connect`; `/health` alone does not."""
    status, body = e2b_hub.request("PUT", "/v1/templates/e2b-auto-resume", {"auto_resume": True}, api_key=ANY_KEY)
    assert status == 200, body
    sbx = Sandbox.create(template="e2b-auto-resume", metadata={"tag": tag}, **conn)
    try:
        sleeper = sbx.commands.run("sleep 600", background=True)
        assert sbx.pause() is True
        assert sbx.is_running() is False
        assert Sandbox.get_info(sbx.sandbox_id, **conn).state == SandboxState.PAUSED
        assert sbx.commands.run("echo up").stdout == "up\n"
        assert Sandbox.get_info(sbx.sandbox_id, **conn).state == SandboxState.RUNNING
        assert sbx.commands.run(f"kill -0 {sleeper.pid} && echo alive").stdout == "alive\n"
    finally:
        sbx.kill()


def test_connect_to_running_sandbox(sandbox: Sandbox, conn: Conn) -> None:
    """A second handle on a running sandbox (another process, say) sees the
    same files and may extend its timeout."""
    sandbox.files.write(f"{WORKSPACE}/e2b-connect.txt", "same sandbox")
    other = Sandbox.connect(sandbox.sandbox_id, timeout=600, **conn)
    assert other.sandbox_id == sandbox.sandbox_id
    assert other.files.read(f"{WORKSPACE}/e2b-connect.txt") == "same sandbox"
    end_at = other.get_info().end_at
    assert end_at >= utcnow() + timedelta(seconds=600) - CLOCK_SLACK


def test_connect_unknown_sandbox(conn: Conn) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("no-such-sandbox", **conn)


# --------------------------------------------------------------------------- metrics


def test_get_metrics_returns_the_samples_of_a_busy_sandbox(sandbox: Sandbox, conn: Conn) -> None:
    """The hub samples each sandbox every second: the SDK's get_metrics()
    parses them (E2B's SandboxMetric shape) and they show the workload."""
    started = utcnow()
    handle = sandbox.commands.run("timeout 6 sh -c 'while :; do :; done'", background=True)
    metrics: list[SandboxMetrics] = wait_for(
        "two samples of a busy sandbox",
        lambda: [m for m in sandbox.get_metrics() if m.cpu_used_pct > 5] or None,
        timeout=30,
    )
    handle.kill()
    m = metrics[-1]
    assert isinstance(m, SandboxMetrics)
    assert m.cpu_count >= 1
    assert 5 < m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert m.disk_used >= 0 and m.disk_total >= 0
    assert_aware(m.timestamp, "timestamp")
    assert started - CLOCK_SLACK <= m.timestamp <= utcnow() + CLOCK_SLACK
    # start/end select by time (Unix seconds on the wire).
    later = sandbox.get_metrics(start=utcnow() + timedelta(hours=1))
    assert later == []
    every = sandbox.get_metrics()
    assert [x.timestamp for x in every] == sorted(x.timestamp for x in every)
    through = sandbox.get_metrics(end=every[0].timestamp)
    assert [x.timestamp for x in through] == [every[0].timestamp]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("no-such-sandbox", **conn)


# --------------------------------------------------------------------------- the open hub


def test_open_hub_takes_any_key(e2b_hub: Hub, tag: str) -> None:
    """Without a keys file every key is the one tenant's: a sandbox made with
    one key is listed and killed with another."""
    first = conn_for(e2b_hub.url, "first-key")
    second = conn_for(e2b_hub.url, "second-key")
    sbx = Sandbox.create(template="base", metadata={"tag": tag}, **first)
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), **second).next_items()
        assert ids(listed) == {sbx.sandbox_id}
    finally:
        killed = Sandbox.kill(sbx.sandbox_id, **second)
    assert killed is True

