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


def test_make_registers_the_shell_env_and_check_env_passes(hub):
    """`gymnasium.make` finds the env through the module prefix (importing
    sandhub_gymnasium registers it), and gymnasium's checker passes on the
    wrapped env that `make` returns."""
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(
        "sandhub_gymnasium:Sandhub/Shell-v0",
        hub_url=hub,
        task={"files": {"n": "41\n"}, "prompt": "add one"},
        reward=[{"kind": "exit_code"}],
    )
    try:
        assert env.spec is not None and env.spec.id == "Sandhub/Shell-v0"
        assert isinstance(env.unwrapped, SandhubEnv)
        env.action_space.seed(0)
        check_env(env, skip_render_check=True)
        obs, info = env.reset(seed=1)
        assert obs == "add one"
        obs, reward, terminated, truncated, info = env.step("echo $(( $(cat n) + 1 ))")
        assert (obs, reward, terminated, truncated) == ("42\n", 1.0, False, False)
        assert "sandbox_id" not in info and "elapsed_ms" not in info
    finally:
        env.close()


def test_make_vec_steps_eight_sandboxes_in_one_call_and_autoresets(hub):
    """`gymnasium.make_vec` builds the Sandhub vector env (its registered
    vector entry point); one `step` steps all eight, each in its own sandbox,
    and an episode the hub ended restarts on the next step."""
    from sandhub_gymnasium import SandhubVectorEnv

    envs = gymnasium.make_vec(
        "sandhub_gymnasium:Sandhub/Shell-v0",
        num_envs=8,
        hub_url=hub,
        task={"files": {"steps": ""}, "prompt": "go"},
        reward=[{"kind": "exit_code"}],
        max_episode_steps=2,
    )
    try:
        assert isinstance(envs, SandhubVectorEnv) and envs.num_envs == 8
        assert isinstance(envs.single_action_space, gymnasium.spaces.Text)
        obs, infos = envs.reset(seed=10)
        assert obs == ("go",) * 8
        assert list(infos["episode"]) == [1] * 8
        actions = ["echo x >> steps; echo $SANDHUB_SEED"] * 7 + ["exit 3"]
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        assert obs[:7] == tuple(f"{10 + i}\n" for i in range(7))
        assert list(rewards) == [1.0] * 7 + [0.0]
        assert not terminations.any() and not truncations.any()
        assert list(infos["exit_code"]) == [0] * 7 + [3]
        for key in ("sandbox_id", "elapsed_ms"):
            assert key not in infos
        # Eight distinct sandboxes: each appended to its own file.
        assert len(set(envs.sandbox_ids)) == 8 and None not in envs.sandbox_ids
        # The second step reaches the hub's limit: every episode is truncated.
        # The first step appended one line in seven sandboxes, none in the eighth.
        obs, rewards, terminations, truncations, infos = envs.step(["wc -l < steps"] * 8)
        assert obs == ("1\n",) * 7 + ("0\n",)
        assert truncations.all() and not terminations.any()
        # NEXT_STEP autoreset: this step's actions are ignored, every env starts over.
        obs, rewards, terminations, truncations, infos = envs.step(["touch ignored"] * 8)
        assert obs == ("go",) * 8 and not rewards.any()
        assert list(infos["episode"]) == [2] * 8
        obs, *_ = envs.step(["echo x >> steps; test -e ignored && echo leaked; wc -l < steps"] * 8)
        assert obs == ("1\n",) * 8
    finally:
        envs.close()


def test_vector_env_close_deletes_every_environment(hub):
    import sandhub
    from sandhub_gymnasium import SandhubVectorEnv

    envs = SandhubVectorEnv(num_envs=3, hub_url=hub)
    envs.reset()
    env_ids = envs.env_ids
    envs.close()
    with sandhub.Hub(hub) as client:
        results = client.gym.step_many([(env_id, "true") for env_id in env_ids])
    assert [getattr(r, "code", r) for r in results] == ["NOT_FOUND"] * 3
