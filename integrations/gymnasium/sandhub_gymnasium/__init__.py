"""Gymnasium environments whose actions run in Sandhub sandboxes.

Each environment is one hub environment (``hub.gym.make``): actions are
shell commands, observations their output, and the reward and termination
rules run on the hub. :func:`step_many` and :class:`SandhubVectorEnv` step
many environments in one round trip. Everything goes through the
``sandhub`` SDK (the Rust client), never raw HTTP.

Importing this module registers ``Sandhub/Shell-v0``, so
``gymnasium.make("sandhub_gymnasium:Sandhub/Shell-v0", hub_url=..., ...)``
and ``gymnasium.make_vec(..., num_envs=N)`` work; keyword arguments beside
``hub_url`` and ``api_key`` are the environment's spec (``task``,
``reward``, ``termination``, ``template``, ...). ``make`` keeps its own
``max_episode_steps`` for gymnasium's ``TimeLimit`` wrapper; ``make_vec``
passes it on to the hub, which then also runs the end-of-episode rewards.
"""

from __future__ import annotations

import gymnasium as gym

from ._env import SandhubEnv, SandhubError, step_many
from ._vector import SandhubVectorEnv

__all__ = ["SHELL_ENV_ID", "SandhubEnv", "SandhubError", "SandhubVectorEnv", "step_many"]

SHELL_ENV_ID = "Sandhub/Shell-v0"

# Re-importing (e.g. a reload) must not re-register: gymnasium warns on that.
if SHELL_ENV_ID not in gym.registry:
    gym.register(
        id=SHELL_ENV_ID,
        entry_point="sandhub_gymnasium._env:SandhubEnv",
        vector_entry_point="sandhub_gymnasium._vector:SandhubVectorEnv",
    )
