"""The real `gymnasium` package over Sandhub's /gym/v1 API, through the
sandhub_gymnasium adapter, against the real hub binary."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "integrations" / "gymnasium"))

import gymnasium  # noqa: E402
from sandhub_gymnasium import SandhubEnv, SandhubError, step_many  # noqa: E402


def _hub_bin() -> str:
    path = os.environ.get("SANDHUB_BIN") or str(
        pathlib.Path(os.environ.get("CARGO_TARGET_DIR", "target")).resolve() / "debug" / "sandhub"
    )
    if not os.access(path, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"sandhub binary not found at {path}")
        pytest.skip(f"sandhub binary not found at {path}")
    return path


@pytest.fixture(scope="module")
def hub():
    exe = _hub_bin()
    state = tempfile.mkdtemp(prefix="sandhub-gym-py-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(state, "hub.log"), "wb")
    proc = subprocess.Popen(
        [exe, "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", os.path.join(state, "state")],
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            if requests.get(f"{url}/healthz", timeout=1).ok:
                break
        except requests.RequestException:
            pass
        assert proc.poll() is None, open(os.path.join(state, "hub.log")).read()
        assert time.time() < deadline, "hub did not become healthy"
        time.sleep(0.05)
    yield url
    for sb in requests.get(f"{url}/v1/sandboxes", timeout=30).json()["sandboxes"]:
        requests.delete(f"{url}/v1/sandboxes/{sb['id']}", timeout=60)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_episode_loop_with_reward_and_termination(hub):
    env = SandhubEnv(
        hub,
        task={"files": {"counter": "0\n"}, "prompt": "count to 3"},
        reward=[
            {"kind": "exit_code", "weight": 0.1},
            {"kind": "regex", "pattern": "^3$", "stream": "stdout"},
        ],
        termination=[{"kind": "file", "path": "counter", "equals": "3\n"}],
        max_episode_steps=10,
    )
    assert isinstance(env.observation_space, gymnasium.spaces.Text)
    obs, info = env.reset(seed=7)
    assert obs == "count to 3"
    assert info["episode"] == 1
    total, steps, terminated, truncated = 0.0, 0, False, False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(
            "n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n"
        )
        total += reward
        steps += 1
    assert steps == 3
    assert terminated and not truncated
    assert obs == "3\n"
    assert total == pytest.approx(0.1 * 3 + 1.0)
    # A new episode starts from the task's files again.
    obs, info = env.reset()
    obs, *_ = env.step("cat counter")
    assert obs == "0\n"
    env.close()


def test_truncation_and_command_reward_at_end(hub):
    env = SandhubEnv(
        hub,
        reward=[{"kind": "command", "command": "test -f marker", "when": "end", "weight": 5}],
        max_episode_steps=2,
    )
    env.reset()
    _, r1, _, tr1, _ = env.step("touch marker")
    _, r2, te2, tr2, _ = env.step("true")
    assert (r1, tr1) == (0.0, False)
    assert (r2, te2, tr2) == (5.0, False, True)
    with pytest.raises(SandhubError) as err:
        env.step("true")
    assert err.value.code == "FAILED_PRECONDITION"
    env.close()


def test_batch_step_across_eight_envs(hub):
    envs = [SandhubEnv(hub, reward=[{"kind": "exit_code"}]) for _ in range(8)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    results = step_many(envs, ["echo $SANDHUB_SEED"] * 8)
    assert [r[0] for r in results] == [f"{i}\n" for i in range(8)]
    assert all(r[1] == 1.0 for r in results)
    for e in envs:
        e.close()


def test_unknown_template_is_a_clear_error(hub):
    with pytest.raises(SandhubError) as err:
        SandhubEnv(hub, template="no-such-template")
    assert err.value.code == "NOT_FOUND"
    assert err.value.status == 404
