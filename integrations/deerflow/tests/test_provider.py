"""The provider's lifecycle against a real hub: one sandbox per thread,
found again by its labels, released as configured, all deleted on shutdown."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest
import sandhub

from sandhub_deerflow import LABEL_APP, LABEL_THREAD, LABEL_USER, SandhubSandboxProvider, Settings, label_value

MakeProvider = Callable[[], SandhubSandboxProvider]


def on_hub(hub: sandhub.Hub) -> dict[str, str]:
    """The adapter's sandboxes on the hub, id -> state."""
    return {sb.id: sb.state for sb in hub.list({LABEL_APP: "deerflow"})}


def test_one_sandbox_per_thread_and_user(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    a = provider.acquire("t-1", user_id="alice")
    assert provider.acquire("t-1", user_id="alice") == a
    b = provider.acquire("t-2", user_id="alice")
    c = provider.acquire("t-1", user_id="bob")
    assert len({a, b, c}) == 3
    labels = hub.get(a).labels
    assert labels[LABEL_THREAD] == label_value("t-1") and labels[LABEL_USER] == label_value("alice")
    assert set(on_hub(hub)) == {a, b, c}
    sandbox = provider.get(a)
    assert sandbox is not None and sandbox.id == a
    assert provider.get("sb-unknown") is None


def test_concurrent_acquires_of_one_thread_make_one_sandbox(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def acquire() -> None:
        try:
            go.wait()
            ids.append(provider.acquire("busy-thread", user_id="u"))
        except BaseException as err:  # reported below
            errors.append(err)

    workers = [threading.Thread(target=acquire) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert errors == []
    assert len(ids) == 8 and len(set(ids)) == 1
    assert list(on_hub(hub)) == [ids[0]]


def test_get_is_memory_only(provider: SandhubSandboxProvider) -> None:
    sid = provider.acquire("t-fast")
    started = time.perf_counter()
    for _ in range(1000):
        assert provider.get(sid) is not None
    assert time.perf_counter() - started < 0.5  # no request per call


def test_release_keeps_the_threads_sandbox_for_its_next_turn(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    """DeerFlow releases after every agent turn, then reads the outputs; the
    next turn of the same thread gets the same sandbox and files."""
    sid = provider.acquire("t-turns", user_id="u")
    sandbox = provider.get(sid)
    assert sandbox is not None
    sandbox.write_file("/mnt/user-data/outputs/r.txt", "turn 1")
    provider.release(sid)
    assert provider.get(sid) is None  # released: not handed out until acquired again
    assert on_hub(hub) == {sid: "Ready"}
    assert provider.acquire("t-turns", user_id="u") == sid
    again = provider.get(sid)
    assert again is not None and again.read_file("/mnt/user-data/outputs/r.txt") == "turn 1"
    # A reset of the sandbox drops the workspace; the next acquire makes the directories again.
    provider.release(sid)
    hub.get(sid).reset()
    assert provider.acquire("t-turns", user_id="u") == sid
    assert again.execute_command("cd /mnt/user-data/workspace && ls /mnt/user-data") == "outputs\nuploads\nworkspace\n"
    provider.release("sb-never-acquired")  # unknown: nothing happens


def test_release_policies_suspend_and_delete(make_provider: MakeProvider, hub: sandhub.Hub) -> None:
    suspending = make_provider()
    suspending.settings = Settings.from_mapping({"on_release": "suspend"})
    sid = suspending.acquire("t-suspend")
    suspending.release(sid)
    assert on_hub(hub) == {sid: "Suspended"}
    assert suspending.acquire("t-suspend") == sid  # resumed
    assert on_hub(hub) == {sid: "Ready"}
    sandbox = suspending.get(sid)
    assert sandbox is not None and sandbox.execute_command("echo up") == "up\n"

    deleting = make_provider()
    deleting.settings = Settings.from_mapping({"on_release": "delete"})
    gone = deleting.acquire("t-delete")
    deleting.release(gone)
    assert gone not in on_hub(hub)
    fresh = deleting.acquire("t-delete")
    assert fresh != gone


def test_a_sandbox_without_a_thread_is_new_each_time_and_deleted_on_release(
    provider: SandhubSandboxProvider, hub: sandhub.Hub
) -> None:
    a, b = provider.acquire(), provider.acquire()
    assert a != b
    provider.release(a)
    provider.release(b)
    assert on_hub(hub) == {}


def test_a_new_provider_finds_the_threads_sandbox_by_its_labels(make_provider: MakeProvider, hub: sandhub.Hub) -> None:
    """A restarted gateway builds a new provider: the thread keeps its files."""
    first = make_provider()
    sid = first.acquire("t-restart", user_id="u")
    sandbox = first.get(sid)
    assert sandbox is not None
    sandbox.write_file("/mnt/user-data/workspace/keep.txt", "kept")
    first.release(sid)

    second = make_provider()
    assert second.acquire("t-restart", user_id="u") == sid
    adopted = second.get(sid)
    assert adopted is not None and adopted.read_file("/mnt/user-data/workspace/keep.txt") == "kept"
    assert second.acquire("t-restart", user_id="someone-else") != sid


def test_a_sandbox_the_hub_deleted_is_replaced(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    sid = provider.acquire("t-vanish")
    hub.get(sid).delete()  # as the hub's idle timeout would
    provider.release(sid)
    fresh = provider.acquire("t-vanish")
    assert fresh != sid
    sandbox = provider.get(fresh)
    assert sandbox is not None and sandbox.execute_command("ls /mnt/user-data") == "outputs\nuploads\nworkspace\n"


def test_shutdown_deletes_everything_it_holds(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    threads = [provider.acquire(f"t-{i}") for i in range(3)]
    ids = {*threads, provider.acquire()}
    provider.release(threads[0])  # released but kept (on_release: keep): still the provider's
    assert set(on_hub(hub)) == ids
    provider.shutdown()
    assert on_hub(hub) == {}
    assert all(provider.get(i) is None for i in ids)
    provider.shutdown()  # twice is fine


def test_new_sandboxes_get_the_idle_timeout(provider: SandhubSandboxProvider, hub: sandhub.Hub) -> None:
    sid = provider.acquire("t-idle")
    assert hub.get(sid).info.idle_timeout_seconds == 600  # DeerFlow's idle_timeout default


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"timeout": 0}, "sandbox.timeout"),
        ({"timeout": "10"}, "sandbox.timeout"),
        ({"timeout": float("nan")}, "sandbox.timeout"),
        ({"idle_timeout": -1}, "sandbox.idle_timeout"),
        ({"on_release": "forget"}, "sandbox.on_release"),
        ({"user_data_root": "workspace"}, "absolute"),
        ({"user_data_root": "/"}, "absolute"),
        ({"sandhub_url": 7070}, "sandbox.sandhub_url"),
        ({"environment": {"A": 1}}, "sandbox.environment"),
    ],
)
def test_bad_settings_fail_with_the_key_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_mapping(raw, env={})


def test_settings_defaults_and_env_fallback() -> None:
    s = Settings.from_mapping({}, env={"SANDHUB_URL": "http://hub:1", "SANDHUB_API_KEY": "k" * 20})
    assert (s.sandhub_url, s.api_key, s.template, s.timeout, s.idle_timeout, s.on_release, s.user_data_root) == (
        "http://hub:1", "k" * 20, None, 600.0, 600, "keep", "/workspace",
    )
    explicit = Settings.from_mapping({"sandhub_url": "http://other:2", "timeout": 5}, env={"SANDHUB_URL": "http://hub:1"})
    assert (explicit.sandhub_url, explicit.timeout) == ("http://other:2", 5.0)
