"""The sandhub SDK's blocking `Hub` against a real `sandhub serve` (local
backend, as root): every method, error mapping per code word, pickling and
reprs. Async twins live in test_sdk_async.py."""

from __future__ import annotations

import io
import pickle
import threading
import time

import pytest
import sandhub
from sdk_fixtures import hub_url, running_hub, start_hub, stop_hub  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


@pytest.fixture
def sb(hub: sandhub.Hub):
    with hub.create(labels={"suite": "sdk"}) as sandbox:
        yield sandbox


# ------------------------------------------------------------------ sandboxes


def test_create_get_list_refresh_delete(hub: sandhub.Hub):
    sb = hub.create(labels={"who": "create-test"}, env={"GREETING": "hi"}, idle_timeout_seconds=600)
    assert sb.state == "Ready"
    assert sb.labels == {"who": "create-test"}
    assert hub.get(sb.id).id == sb.id
    assert [s.id for s in hub.list(labels={"who": "create-test"})] == [sb.id]
    assert sb.commands.run("echo $GREETING").stdout == "hi\n"
    assert sb.refresh() is sb and sb.state == "Ready"
    sb.terminate()
    with pytest.raises(sandhub.NotFoundError):
        hub.get(sb.id)
    assert hub.list(labels={"who": "create-test"}) == []


def test_usage_and_metrics(hub: sandhub.Hub, sb: sandhub.Sandbox):
    """The hub samples each sandbox every second: the latest sample rides
    on the sandbox, the series comes from metrics(), both typed."""
    deadline = time.monotonic() + 20
    while sb.refresh().usage is None or len(sb.metrics().samples) < 2:
        assert time.monotonic() < deadline, "no samples within 20 s"
        time.sleep(0.2)
    usage = sb.usage
    assert isinstance(usage, sandhub.SandboxUsage)
    assert usage.latest.memory_bytes > 0 and usage.latest.pids >= 1
    assert usage.memory_peak_bytes >= usage.latest.memory_bytes
    assert isinstance(usage.limits, sandhub.UsageLimits) and usage.limits.memory_mb
    m = sb.metrics()
    assert isinstance(m, sandhub.SandboxMetrics) and m.step_seconds == 1
    assert all(isinstance(s, sandhub.UsageSample) for s in m.samples)
    assert [s.timestamp for s in m.samples] == sorted(s.timestamp for s in m.samples)
    assert sb.metrics(since=time.time() + 3600).samples == ()
    assert sb.metrics(step=60).step_seconds == 60
    with pytest.raises(sandhub.InvalidArgumentError, match="step"):
        sb.metrics(step=0)


def test_context_manager_deletes(hub: sandhub.Hub):
    with hub.create() as sb:
        sid = sb.id
    with pytest.raises(sandhub.NotFoundError):
        hub.get(sid)


def test_pickle_to_id_and_reattach(hub: sandhub.Hub, sb: sandhub.Sandbox):
    assert pickle.loads(pickle.dumps(sb)) == sb.id
    again = hub.get(pickle.loads(pickle.dumps(sb)))
    assert again.id == sb.id
    assert sb.id in repr(sb) and "Ready" in repr(sb)
    assert hub.url in repr(hub)
    err = pickle.loads(pickle.dumps(sandhub.NotFoundError("gone", "NOT_FOUND", 404)))
    assert isinstance(err, sandhub.NotFoundError) and err.code == "NOT_FOUND"


def test_lifecycle_suspend_resume_reset_snapshot_fork(hub: sandhub.Hub, sb: sandhub.Sandbox):
    sb.files.write("kept.txt", b"before")
    snap = sb.snapshot()
    assert isinstance(snap, sandhub.Snapshot) and snap.sandbox_id == sb.id
    assert sb.suspend().state == "Suspended"
    assert sb.resume().state == "Ready"
    assert sb.files.read("kept.txt") == b"before"
    with sb.fork(snapshot=snap, labels={"fork": "yes"}) as child:
        assert child.files.read("kept.txt") == b"before"
        assert child.labels.get("fork") == "yes"
    sb.reset()
    assert not sb.files.exists("kept.txt")


def test_pause_keeps_a_running_process(sb: sandhub.Sandbox):
    pid = sb.commands.run("sleep 600 >/dev/null 2>&1 </dev/null & echo $!").stdout.strip()
    started = sb.commands.run(f"cut -d' ' -f22 /proc/{pid}/stat").stdout
    assert sb.pause().state == "Paused"
    assert sb.refresh().state == "Paused"
    with pytest.raises(sandhub.FailedPreconditionError) as pre:
        sb.commands.run("true")
    assert "Paused" in str(pre.value)
    assert sb.resume().state == "Ready"
    # The same process, not a new one of the same pid.
    assert sb.commands.run(f"cut -d' ' -f22 /proc/{pid}/stat").stdout == started


def test_auto_resume_and_idle_action(hub: sandhub.Hub):
    with hub.create(auto_resume=True, idle_action="pause", idle_timeout_seconds=600) as sb:
        assert sb.info.auto_resume is True and sb.info.idle_action == "pause"
        sb.pause()
        # A call that needs it running resumes it first.
        assert sb.commands.run("echo up").stdout == "up\n"
        assert sb.refresh().state == "Ready"


# ------------------------------------------------------------------ commands


def test_run_shell_argv_cwd_env_stdin(sb: sandhub.Sandbox):
    r = sb.commands.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert sb.commands.run(["printf", "%s|", "a b", "c"]).stdout == "a b|c|"
    sb.commands.run("mkdir -p sub")
    assert sb.commands.run("pwd", cwd="sub").stdout.strip().endswith("/sub")
    assert sb.commands.run("echo $X", env={"X": "y"}).stdout == "y\n"
    assert sb.commands.run("cat", stdin="fed").stdout == "fed"
    r = sb.commands.run("sleep 5", timeout=0.5)
    assert r.timed_out


def test_start_events_stdin_wait(sb: sandhub.Sandbox):
    h = sb.commands.start("echo one; echo two >&2; exit 4")
    assert h.pid > 0 and "running" in repr(h)
    events = list(h.events())
    assert isinstance(events[-1], sandhub.ProcessExitEvent) and events[-1].exit_code == 4
    out = b"".join(e.data for e in events if isinstance(e, sandhub.ProcessOutputEvent) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, sandhub.ProcessOutputEvent) and e.stream == "stderr")
    assert (out, err) == (b"one\n", b"two\n")

    cat = sb.commands.start(["cat"])
    cat.write_stdin("hello ")
    cat.write_stdin(b"world")
    cat.close_stdin()
    r = cat.wait()
    assert (r.exit_code, r.stdout) == (0, "hello world")
    with pytest.raises(TypeError):
        pickle.dumps(cat)


def test_signal_names_and_numbers(sb: sandhub.Sandbox):
    for sig, num in (("SIGTERM", 15), ("SIGINT", 2), (9, 9)):
        h = sb.commands.start(["sleep", "300"])
        h.signal(sig)
        exit_ev = [e for e in h.events() if isinstance(e, sandhub.ProcessExitEvent)][0]
        assert exit_ev.signal == num or exit_ev.exit_code in (128 + num, -num), (sig, exit_ev)
    with pytest.raises(sandhub.InvalidArgumentError):
        sb.commands.start(["sleep", "300"]).signal("SIGWINCH")


def test_pty_and_resize(sb: sandhub.Sandbox):
    h = sb.commands.start("stty size; read x; stty size", pty=True, rows=20, cols=60)
    seen = b""
    events = h.events()
    for ev in events:
        if isinstance(ev, sandhub.ProcessOutputEvent):
            seen += ev.data
            if b"20 60" in seen:
                break
    h.resize(30, 100)
    h.write_stdin("go\n")
    rest = b"".join(e.data for e in events if isinstance(e, sandhub.ProcessOutputEvent))
    assert b"30 100" in rest


# ------------------------------------------------------------------ files


def test_files_round_trip(sb: sandhub.Sandbox, tmp_path):
    sb.files.write("dir/a.txt", b"hello")
    sb.files.write("dir/a.txt", "!", append=True)
    assert sb.files.read("dir/a.txt") == b"hello!"
    assert sb.files.read_text("dir/a.txt") == "hello!"
    sb.files.write("dir/b.bin", io.BytesIO(b"\x00\xff" * 1000), mode=0o600)
    st = sb.files.stat("dir/b.bin")
    assert (st.name, st.type, st.size, st.mode) == ("b.bin", "file", 2000, "0600")
    assert sorted(e.name for e in sb.files.list("dir")) == ["a.txt", "b.bin"]
    assert sb.files.stat("dir").is_dir
    assert sb.files.exists("dir/a.txt") and not sb.files.exists("nope")
    assert sb.files.read_to("dir/b.bin", tmp_path / "b") == 2000
    assert (tmp_path / "b").read_bytes() == b"\x00\xff" * 1000
    sink = io.BytesIO()
    sb.files.read_to("dir/a.txt", sink)
    assert sink.getvalue() == b"hello!"
    with pytest.raises(sandhub.ConflictError):
        sb.files.remove("dir")
    sb.files.remove("dir", recursive=True)
    assert not sb.files.exists("dir")
    with pytest.raises(sandhub.NotFoundError):
        sb.files.read("dir/a.txt")
    with pytest.raises(sandhub.NotFoundError):
        sb.files.stat("dir")


def test_max_download_size(hub_url: str):
    small = sandhub.Hub(hub_url, max_download_size=1000)
    with small.create() as sb:
        sb.files.write("ok", b"x" * 1000)
        assert len(sb.files.read("ok")) == 1000
        sb.commands.run("head -c 5000000 /dev/zero > big")
        with pytest.raises(sandhub.ResponseTooLargeError) as err:
            sb.files.read("big")
        assert isinstance(err.value, sandhub.SandhubError)
        with pytest.raises(sandhub.ResponseTooLargeError):
            sb.files.read_to("big", io.BytesIO())
        # The handle is still good after the refusal.
        assert sb.files.read("ok") == b"x" * 1000


def test_watch(sb: sandhub.Sandbox):
    sb.files.write("w/.keep", b"")
    with sb.watcher.watch("w") as watch:
        sb.files.write("w/new.txt", b"x")
        seen = []
        for batch in watch:
            seen += batch
            if any(e.path.endswith("new.txt") for e in batch):
                break
    assert any(e.path.endswith("new.txt") and e.type in ("CREATE", "WRITE") for e in seen)
    assert all(isinstance(e, sandhub.WatchEvent) for e in seen)


# ------------------------------------------------------------------ hub-level


def test_health_and_sandboxd_calls_on_the_hub(hub: sandhub.Hub, sb: sandhub.Sandbox):
    assert hub.health() == "ok"
    with pytest.raises(sandhub.UnimplementedError):
        sb.health()


def test_templates_and_pools(hub: sandhub.Hub):
    t = hub.templates.put("sdk-small", {"env": {"FROM_TEMPLATE": "1"}, "memory_mb": 256})
    assert t.name == "sdk-small" and t.spec["env"] == {"FROM_TEMPLATE": "1"}
    assert hub.templates.get("sdk-small").spec["memory_mb"] == 256
    assert "sdk-small" in [x.name for x in hub.templates.list()]
    pool = hub.pools.put("sdk-pool", "sdk-small", 1)
    assert (pool.name, pool.template, pool.replicas) == ("sdk-pool", "sdk-small", 1)
    ready = hub.pools.wait_ready("sdk-pool", 1, timeout=60)
    assert ready.ready >= 1
    assert "sdk-pool" in [p.name for p in hub.pools.list()]
    with hub.create(pool="sdk-pool") as sb:
        assert sb.commands.run("echo $FROM_TEMPLATE").stdout == "1\n"
    hub.pools.delete("sdk-pool")
    with pytest.raises(sandhub.NotFoundError):
        hub.pools.get("sdk-pool")
    hub.templates.delete("sdk-small")
    with pytest.raises(sandhub.NotFoundError):
        hub.templates.get("sdk-small")


def test_volumes(hub: sandhub.Hub):
    v = hub.volumes.create("sdk-vol", 16, labels={"suite": "sdk"})
    assert (v.name, v.size_mb, v.labels) == ("sdk-vol", 16, {"suite": "sdk"})
    assert v.created_at.endswith("Z")
    assert hub.volumes.get("sdk-vol") == v
    assert "sdk-vol" in [x.name for x in hub.volumes.list()]
    with pytest.raises(sandhub.ConflictError):
        hub.volumes.create("sdk-vol", 16)
    with pytest.raises(sandhub.InvalidArgumentError):
        hub.volumes.create("Not_A_Name", 16)

    # Mounted: written by one sandbox, read by the next; in use, it stays.
    mount = {"name": "sdk-vol", "path": "/workspace/vol"}
    with hub.create(volumes=[mount]) as writer:
        writer.commands.run("echo kept > /workspace/vol/f")
        with pytest.raises(sandhub.ConflictError):
            hub.volumes.delete("sdk-vol")
    with hub.create(volumes=[{**mount, "read_only": True}]) as reader:
        assert reader.commands.run("cat /workspace/vol/f").stdout == "kept\n"
        assert reader.commands.run("touch /workspace/vol/g").exit_code != 0
    with pytest.raises(sandhub.NotFoundError):
        hub.create(volumes=[{"name": "no-such-vol", "path": "/v"}])

    hub.volumes.delete("sdk-vol")
    with pytest.raises(sandhub.NotFoundError):
        hub.volumes.get("sdk-vol")
    with pytest.raises(sandhub.NotFoundError):
        hub.volumes.delete("sdk-vol")


def test_volume_files_and_snapshots(hub: sandhub.Hub, tmp_path):
    """A volume's files with no sandbox running, and a snapshot cloned
    into a new volume that is independent of its source."""
    hub.volumes.create("sdk-files", 16)
    files = hub.volumes.files("sdk-files")
    assert isinstance(files, sandhub.VolumeFiles)
    files.write("a/b/hello.txt", "hello")
    files.write("big.bin", io.BytesIO(b"x" * (3 << 20)))
    assert files.read_text("a/b/hello.txt") == "hello"
    assert len(files.read("big.bin")) == 3 << 20
    assert files.read_to("big.bin", tmp_path / "big.bin") == 3 << 20
    assert [(e.name, e.type) for e in files.list()] == [("a", "directory"), ("big.bin", "file")]
    entry = files.stat("a/b/hello.txt")
    assert isinstance(entry, sandhub.FileEntry) and entry.size == 5
    assert files.exists("a/b") and not files.exists("nope")
    with pytest.raises(sandhub.NotFoundError):
        files.stat("nope")
    with pytest.raises(sandhub.InvalidArgumentError):
        files.read("a/../../etc/passwd")
    with pytest.raises(sandhub.ConflictError):
        files.remove("a")
    # Past the volume's 16 MiB: 507, nothing left behind.
    with pytest.raises(sandhub.ResourceExhaustedError):
        files.write("huge.bin", b"\0" * (20 << 20))
    assert not files.exists("huge.bin")

    snap = hub.volumes.snapshot("sdk-files", "s1")
    assert isinstance(snap, sandhub.VolumeSnapshot) and (snap.volume, snap.name) == ("sdk-files", "s1")
    assert [s.name for s in hub.volumes.snapshots("sdk-files")] == ["s1"]
    files.write("a/b/hello.txt", "changed")
    hub.volumes.create("sdk-clone", 16, from_snapshot="sdk-files@s1")
    clone = hub.volumes.files("sdk-clone")
    assert clone.read_text("a/b/hello.txt") == "hello"
    clone.write("a/b/hello.txt", "clone's own")
    assert files.read_text("a/b/hello.txt") == "changed"
    with pytest.raises(sandhub.ConflictError):
        hub.volumes.delete("sdk-files")
    hub.volumes.delete_snapshot("sdk-files", "s1")
    files.remove("a", recursive=True)
    assert not files.exists("a")
    hub.volumes.delete("sdk-files")
    hub.volumes.delete("sdk-clone")


def test_gym(hub: sandhub.Hub):
    env = hub.gym.make(reward=[{"kind": "exit_code"}], max_episode_steps=5)
    assert env.observation_space["max_length"] > 0
    obs, info = env.reset(seed=3)
    step = env.step("echo $SANDHUB_SEED")
    assert step.observation == "3\n" and step.reward == 1.0
    assert step.astuple()[0] == "3\n"
    other = hub.gym.make(reward=[{"kind": "exit_code"}])
    other.reset()
    results = hub.gym.step_many([(env, "true"), (other, "false"), ("no-such-env", "true")])
    assert isinstance(results[0], sandhub.StepResult) and results[0].reward == 1.0
    assert isinstance(results[1], sandhub.StepResult) and results[1].reward == 0.0
    assert isinstance(results[2], sandhub.NotFoundError)
    env.close()
    env.close()
    other.close()
    with pytest.raises(sandhub.NotFoundError):
        env.reset()


# ------------------------------------------------------------------ errors


def test_error_words_map_to_classes(hub: sandhub.Hub, sb: sandhub.Sandbox):
    with pytest.raises(sandhub.NotFoundError) as err:
        hub.get("no-such-sandbox")
    assert (err.value.code, err.value.status) == ("NOT_FOUND", 404)
    with pytest.raises(sandhub.InvalidArgumentError) as bad:
        sb.commands.run("true", timeout=-1)
    assert bad.value.code == "INVALID_ARGUMENT" and bad.value.message
    with pytest.raises(sandhub.NotFoundError):
        hub.templates.get("no-such-template")
    sb.files.write("full/x", b"")
    with pytest.raises(sandhub.ConflictError):
        sb.files.remove("full")
    sb.suspend()
    with pytest.raises(sandhub.FailedPreconditionError) as pre:
        sb.commands.run("true")
    assert pre.value.status == 412
    sb.resume()
    # Every word has its class, and unknown words stay SandhubErrors.
    for word, cls in [
        ("INVALID_ARGUMENT", sandhub.InvalidArgumentError),
        ("UNAUTHENTICATED", sandhub.UnauthenticatedError),
        ("PERMISSION_DENIED", sandhub.PermissionDeniedError),
        ("NOT_FOUND", sandhub.NotFoundError),
        ("CONFLICT", sandhub.ConflictError),
        ("FAILED_PRECONDITION", sandhub.FailedPreconditionError),
        ("RESOURCE_EXHAUSTED", sandhub.ResourceExhaustedError),
        ("PAYLOAD_TOO_LARGE", sandhub.PayloadTooLargeError),
        ("UNAVAILABLE", sandhub.UnavailableError),
        ("UNIMPLEMENTED", sandhub.UnimplementedError),
        ("DEADLINE_EXCEEDED", sandhub.DeadlineExceededError),
        ("INTERNAL", sandhub.InternalError),
    ]:
        e = sandhub.error_for(word, "m")
        assert type(e) is cls and e.code == word
    assert type(sandhub.error_for("NEW_WORD", "m")) is sandhub.SandhubError


def test_hub_down_is_unavailable_with_the_url():
    dead = sandhub.Hub("http://127.0.0.1:1")
    with pytest.raises(sandhub.UnavailableError) as err:
        dead.get("x")
    assert "127.0.0.1:1" in str(err.value)
    assert isinstance(err.value, ConnectionError)
    with pytest.raises(sandhub.InvalidArgumentError):
        sandhub.Hub("not a url")


def test_keys_and_tenants():
    running = start_hub(keys={"alice-key-0123456789": "alice", "bob-key-0123456789ab": "bob"})
    try:
        with pytest.raises(sandhub.UnauthenticatedError):
            sandhub.Hub(running.url).list()
        with pytest.raises(sandhub.UnauthenticatedError):
            sandhub.Hub(running.url, "wrong-key-0123456789").list()
        alice = sandhub.Hub(running.url, "alice-key-0123456789")
        bob = sandhub.Hub(running.url, "bob-key-0123456789ab")
        with alice.create() as sb:
            with pytest.raises((sandhub.NotFoundError, sandhub.PermissionDeniedError)):
                bob.get(sb.id)
            with pytest.raises((sandhub.NotFoundError, sandhub.PermissionDeniedError)):
                bob.get(sb.id).commands.run("true")
    finally:
        stop_hub(running)


def test_env_vars_configure_the_hub(hub_url: str, monkeypatch):
    monkeypatch.setenv("SANDHUB_URL", hub_url)
    assert sandhub.Hub().url == hub_url
    assert sandhub.Hub().health() == "ok"


def test_blocking_calls_release_the_gil(sb: sandhub.Sandbox):
    # Two threads each sleeping 1 s in the sandbox: together well under 2 s
    # when the GIL is released while they wait.
    def run() -> None:
        sb.commands.run("sleep 1")

    threads = [threading.Thread(target=run) for _ in range(2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start < 1.8


def test_closing_a_watch_ends_a_waiting_read(sb: sandhub.Sandbox):
    watch = sb.watcher.watch(".")
    batches: list[list[sandhub.WatchEvent]] = []
    reader = threading.Thread(target=lambda: batches.extend(watch))
    reader.start()
    watch.close()
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert batches == []
    assert list(watch) == []  # closed stays closed
