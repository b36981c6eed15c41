"""fleet.make_vec_env: a Gymnasium vector env whose episodes run on the
fleet's sandboxes, against the real fleet and FakeFleet alike."""

from __future__ import annotations

from typing import Any, Iterator

import gymnasium as gym
import numpy as np
import pytest
import sandhub

from sandhub_rl import FleetConfig, SandboxFleet, Task
from sandhub_rl.testing import FakeFleet

TASKS = [Task(id=f"v{n}", template="default", data={"problem_statement": f"task {n}"}) for n in range(3)]


def reward(handle: Any) -> float:
    """1.0 when the episode left /workspace/ok behind."""
    return float(handle.exec("cat /workspace/ok").exit_code == 0)


@pytest.fixture(params=["fake", "real"])
def fleet(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fake":
        f: Any = FakeFleet(None, FleetConfig())
        f.fail_start("ghost")
    else:
        request.getfixturevalue("no_leftovers")
        f = SandboxFleet(request.getfixturevalue("hub"), FleetConfig())
    yield f
    assert f.teardown().clean


def test_episodes_step_reward_and_autoreset(fleet: Any) -> None:
    env = fleet.make_vec_env(TASKS, reward=reward, num_envs=2, max_episode_steps=3)
    assert isinstance(env, gym.vector.VectorEnv) and env.num_envs == 2
    obs, info = env.reset(seed=0)
    assert obs == ("task 0", "task 1") and list(info["task_id"]) == ["v0", "v1"]

    obs, rew, term, trunc, info = env.step(["echo yes > /workspace/ok", "echo hi"])
    assert obs == ("", "hi\n") and list(rew) == [0.0, 0.0] and not term.any() and not trunc.any()

    obs, rew, term, trunc, _ = env.step(["submit", "echo again"])
    assert list(term) == [True, False] and list(rew) == [1.0, 0.0]  # slot 0 left /workspace/ok
    assert env.handles[0] is None  # released at the episode's end

    obs, rew, term, trunc, info = env.step(["ignored: this step resets slot 0", "echo third"])
    assert obs[0] == "task 2" and info["task_id"][0] == "v2" and rew[0] == 0.0
    assert list(trunc) == [False, True] and rew[1] == 0.0  # slot 1 ran out of steps without ok

    obs, _, _, _, info = env.step(["echo x", "ignored"])
    assert obs[1] == "task 0" and info["task_id"][1] == "v0"  # the tasks are cycled
    live = [h.sandbox_id for h in env.handles if h is not None]
    assert len(live) == 2 and len(fleet.live_handles()) == 2
    env.close()
    assert fleet.live_handles() == [] and isinstance(rew, np.ndarray)


def test_lost_sandbox_truncates_and_a_task_that_cannot_start_is_skipped(fleet: Any) -> None:
    tasks = [Task(id="ghost", image="ghost/none:1"), *TASKS[:2]]
    env = fleet.make_vec_env(tasks, reward="test -e /workspace/ok", num_envs=1)
    obs, info = env.reset()
    assert obs == ("task 0",) and env.skipped == {"ghost": "image_not_found"}
    handle = env.handles[0]
    if isinstance(fleet, FakeFleet):
        fleet.lose(handle)
    else:
        sandhub.Hub(fleet.hub.url).get(handle.sandbox_id).delete()
    obs, rew, term, trunc, info = env.step(["echo hi"])
    assert list(trunc) == [True] and list(rew) == [0.0] and bool(info["sandbox_lost"][0])
    obs, _, _, _, info = env.step(["next episode"])
    assert obs == ("task 1",)
    env.close()
    with pytest.raises(TypeError):
        fleet.make_vec_env(tasks, reward=3)
    with pytest.raises(ValueError):
        fleet.make_vec_env([], reward=reward)
