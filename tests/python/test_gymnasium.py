"""The real `gymnasium` package over Sandhub's /gym/v1 API, through the
sandhub_gymnasium adapter, against the real hub binary."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import gymnasium
import pytest
from sandhub_gymnasium import SandhubEnv, SandhubError, step_many
from sandhub_testing import running_hub


@pytest.fixture(scope="module")
def hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a real `sandhub serve` with its own state dir."""
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("gym")) as hub:
        yield hub.url


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


def test_check_env_passes_and_info_holds_only_state(hub):
    """gymnasium's own checker (spaces, seeding, step determinism, data reuse)
    passes on the raw env; which sandbox ran and how long it took stay on the
    env, out of `info`."""
    from gymnasium.utils.env_checker import check_env

    env = SandhubEnv(hub, reward=[{"kind": "exit_code"}], max_episode_steps=5)
    try:
        # check_env runs actions sampled from the Text space (random shell
        # text): a seeded space makes them the same on every run.
        env.action_space.seed(0)
        check_env(env, skip_render_check=True)
        _, info = env.reset(seed=3)
        _, _, _, _, step_info = env.step("echo hi")
        for key in ("sandbox_id", "elapsed_ms"):
            assert key not in info and key not in step_info, (info, step_info)
        assert "episode" not in step_info and info["episode"] >= 1
        assert step_info["stdout"] == "hi\n" and step_info["exit_code"] == 0
        assert env.sandbox_id and env.last_elapsed_ms is not None and env.last_elapsed_ms >= 0
    finally:
        env.close()
