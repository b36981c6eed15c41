"""Gymnasium environments whose actions run in Sandhub sandboxes.

Each environment is one hub environment (``hub.gym.make``): actions are
shell commands, observations their output, and the reward and termination
rules run on the hub. :func:`step_many` steps many environments in one
round trip. Everything goes through the ``sandhub`` SDK (the Rust client),
never raw HTTP.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import sandhub
from sandhub import SandhubError

__all__ = ["SandhubEnv", "SandhubError", "step_many"]

# Shell output is text: printable ASCII plus the whitespace a terminal emits.
_CHARSET = frozenset(string.printable)


class SandhubEnv(gym.Env):
    """One sandbox-backed environment.

    ``spec`` is the environment's definition: ``template``, ``pool``,
    ``task``, ``reward``, ``termination``, ``max_episode_steps``, ...
    """

    metadata = {"render_modes": []}

    def __init__(self, hub_url: str = "http://127.0.0.1:7070", api_key: str | None = None, **spec: Any):
        super().__init__()
        self._hub = sandhub.Hub(hub_url, api_key)
        self._env: sandhub.Env | None = self._hub.gym.make(spec)
        self.env_id: str | None = self._env.env_id
        self.observation_space = gym.spaces.Text(
            max_length=self._env.observation_space["max_length"], min_length=0, charset=_CHARSET
        )
        self.action_space = gym.spaces.Text(
            max_length=self._env.action_space["max_length"], min_length=1, charset=_CHARSET
        )

    @property
    def base_url(self) -> str:
        return self._hub.url

    @property
    def hub(self) -> sandhub.Hub:
        return self._hub

    def _live(self) -> sandhub.Env:
        if self._env is None:
            raise sandhub.FailedPreconditionError("the environment is closed")
        return self._env

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._live().reset(seed=seed, options=options)

    def step(self, action: str):
        return self._live().step(action).astuple()

    def close(self):
        if self._env is not None:
            try:
                self._env.close()
            except SandhubError:
                pass
            self._env = None
            self.env_id = None
        super().close()


def step_many(envs: list[SandhubEnv], actions: list[str]):
    """Steps every env once, concurrently on the hub, in one request.

    Returns a list of ``(obs, reward, terminated, truncated, info)`` tuples,
    or a ``SandhubError`` in place of an env whose step failed.
    """
    if not envs:
        return []
    pairs = [(e._live(), a) for e, a in zip(envs, actions, strict=True)]
    results = envs[0].hub.gym.step_many(pairs)
    return [r.astuple() if isinstance(r, sandhub.StepResult) else r for r in results]
