"""An RL loop on 8 sandboxes at once: a Gymnasium vector env over the hub's Gym API.

Every `step` runs the 8 actions in 8 sandboxes in one `/gym/v1/step` round trip. The task
gives each sandbox a counter file; the reward (computed on the hub) is 1 when the command
exits 0. The "policy" picks from a few shell commands at random: a stand-in for a model.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/rl-gymnasium/train.py
"""

from __future__ import annotations

import os
import random

import gymnasium
import sandhub_gymnasium  # noqa: F401 - importing registers Sandhub/Shell-v0

ACTIONS = [
    "n=$(cat n); echo $((n + 1)) > n; cat n",  # makes progress
    "cat n",                                   # harmless
    "false",                                   # a failing command: reward 0
]
NUM_ENVS, STEPS = 8, 12


def main() -> None:
    envs = gymnasium.make_vec(
        "sandhub_gymnasium:Sandhub/Shell-v0",
        num_envs=NUM_ENVS,
        hub_url=os.environ.get("SANDHUB_URL", "http://127.0.0.1:7070"),
        task={"files": {"n": "0\n"}},
        reward=[{"kind": "exit_code"}],
        max_episode_steps=6,
    )
    rng = random.Random(7)
    try:
        obs, info = envs.reset(seed=7)
        total = 0.0
        for _ in range(STEPS):
            actions = tuple(rng.choice(ACTIONS) for _ in range(NUM_ENVS))
            obs, rewards, terminated, truncated, info = envs.step(actions)
            total += float(sum(rewards))
        episodes = NUM_ENVS * STEPS // 6
        print(f"{NUM_ENVS} sandboxes, {STEPS} steps each, ~{episodes} episodes, total reward {total:g}")
        assert 0 < total < NUM_ENVS * STEPS, total  # some commands failed, some succeeded
    finally:
        envs.close()


if __name__ == "__main__":
    main()
