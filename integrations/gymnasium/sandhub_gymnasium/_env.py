"""One sandbox-backed ``gymnasium.Env`` (:class:`SandhubEnv`) and
:func:`step_many`, which steps many of them in one round trip."""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import sandhub
from sandhub import SandhubError

__all__ = ["SandhubEnv", "SandhubError", "step_many", "CHARSET", "split_info"]

# Shell output is text: printable ASCII plus the whitespace a terminal emits.
CHARSET = frozenset(string.printable)

# What the hub reports that is no function of (state, action): which sandbox
# ran the episode and how long a call took. Gymnasium's determinism contract
# (check_env) compares `info`, so these stay on the env (`sandbox_id`,
# `last_elapsed_ms`) and out of it. A step's `info` also drops the episode
# number, which every reset advances; the reset's `info` keeps it.
_NOT_STATE = ("sandbox_id", "elapsed_ms")

#: What ``step`` returns: ``(observation, reward, terminated, truncated, info)``.
Step = tuple[str, float, bool, bool, dict[str, Any]]


def split_info(info: dict[str, Any], *, keep_episode: bool) -> tuple[dict[str, Any], str | None, int | None]:
    info = dict(info)
    sandbox_id = info.pop("sandbox_id", None)
    elapsed_ms = info.pop("elapsed_ms", None)
    if not keep_episode:
        info.pop("episode", None)
    return info, sandbox_id, elapsed_ms


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
        #: The sandbox of the current episode, and how long the last call took
        #: on the hub (kept out of ``info``; see ``_NOT_STATE``).
        self.sandbox_id: str | None = None
        self.last_elapsed_ms: int | None = None
        self.observation_space = gym.spaces.Text(
            max_length=self._env.observation_space["max_length"], min_length=0, charset=CHARSET
        )
        self.action_space = gym.spaces.Text(
            max_length=self._env.action_space["max_length"], min_length=1, charset=CHARSET
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

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self._live().reset(seed=seed, options=options)
        return obs, self._keep(info, keep_episode=True)

    def step(self, action: str) -> Step:
        obs, reward, terminated, truncated, info = self._live().step(action).astuple()
        return obs, reward, terminated, truncated, self._keep(info, keep_episode=False)

    def _keep(self, info: dict[str, Any], *, keep_episode: bool) -> dict[str, Any]:
        info, sandbox_id, elapsed_ms = split_info(info, keep_episode=keep_episode)
        if sandbox_id is not None:
            self.sandbox_id = sandbox_id
        self.last_elapsed_ms = elapsed_ms
        return info

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            except SandhubError:
                pass
            self._env = None
            self.env_id = None
        super().close()


def step_many(envs: list[SandhubEnv], actions: list[str]) -> list[Step | Exception]:
    """Steps every env once, concurrently on the hub, in one request.

    Returns a list of ``(obs, reward, terminated, truncated, info)`` tuples,
    or a ``SandhubError`` in place of an env whose step failed.
    """
    if not envs:
        return []
    pairs = [(e._live(), a) for e, a in zip(envs, actions, strict=True)]
    results = envs[0].hub.gym.step_many(pairs)
    out: list[Step | Exception] = []
    for env, r in zip(envs, results, strict=True):
        if isinstance(r, sandhub.StepResult):
            obs, reward, terminated, truncated, info = r.astuple()
            out.append((obs, reward, terminated, truncated, env._keep(info, keep_episode=False)))
        else:
            out.append(r)
    return out
