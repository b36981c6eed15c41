"""A ``gymnasium.vector.VectorEnv`` over N hub environments.

Every :meth:`SandhubVectorEnv.step` is one ``/gym/v1/step`` round trip
(``hub.gym.step_many``) that runs the N actions concurrently on the hub,
instead of N sequential requests. ``gymnasium.make_vec`` builds it through
the ``vector_entry_point`` registered in ``__init__``.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import sandhub
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from sandhub import SandhubError

from ._env import CHARSET, split_info

__all__ = ["SandhubVectorEnv"]


class SandhubVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` sandbox-backed environments of one ``spec``, stepped together.

    Observations are a tuple of strings (the batch of a ``Text`` space). An
    env whose episode ended is reset by the next :meth:`step` (gymnasium's
    ``NEXT_STEP`` autoreset): its slot then holds the reset observation,
    reward 0 and neither flag. ``sandbox_ids`` and ``last_elapsed_ms`` keep
    what is no function of the state out of ``infos``, as on ``SandhubEnv``.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        hub_url: str = "http://127.0.0.1:7070",
        api_key: str | None = None,
        **spec: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = num_envs
        self._hub = sandhub.Hub(hub_url, api_key)
        self._envs: list[sandhub.Env] = []
        try:
            for _ in range(num_envs):
                self._envs.append(self._hub.gym.make(spec))
        except BaseException:
            self._close_envs()
            raise
        first = self._envs[0]
        self.single_observation_space = gym.spaces.Text(
            max_length=first.observation_space["max_length"], min_length=0, charset=CHARSET
        )
        self.single_action_space = gym.spaces.Text(
            max_length=first.action_space["max_length"], min_length=1, charset=CHARSET
        )
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)
        self.sandbox_ids: list[str | None] = [None] * num_envs
        self.last_elapsed_ms: list[int | None] = [None] * num_envs
        self.closed = False

    @property
    def hub(self) -> sandhub.Hub:
        return self._hub

    @property
    def env_ids(self) -> list[str]:
        return [e.env_id for e in self._envs]

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Resets every env; an int ``seed`` seeds env ``i`` with ``seed + i``."""
        super().reset(seed=seed if isinstance(seed, int) or seed is None else None)
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds for {self.num_envs} environments")
        observations: list[str] = []
        infos: dict[str, Any] = {}
        for i, (env, s) in enumerate(zip(self._envs, seeds, strict=True)):
            obs, info = self._reset_one(i, env, s, options)
            observations.append(obs)
            infos = self._add_info(infos, info, i)
        self._autoreset[:] = False
        return tuple(observations), infos

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
        observations: list[str] = [""] * self.num_envs
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        stepping = [i for i in range(self.num_envs) if not self._autoreset[i]]
        # The envs whose episode ended last step start a new one instead (NEXT_STEP).
        for i in range(self.num_envs):
            if self._autoreset[i]:
                observations[i], info = self._reset_one(i, self._envs[i], None, None)
                infos = self._add_info(infos, info, i)
        results = self._hub.gym.step_many([(self._envs[i], actions[i]) for i in stepping])
        for i, result in zip(stepping, results, strict=True):
            if isinstance(result, Exception):
                raise result
            info, sandbox_id, elapsed_ms = split_info(result.info, keep_episode=False)
            self._note(i, sandbox_id, elapsed_ms)
            observations[i] = result.observation
            rewards[i] = result.reward
            terminations[i] = result.terminated
            truncations[i] = result.truncated
            infos = self._add_info(infos, info, i)
        self._autoreset = np.logical_or(terminations, truncations)
        return tuple(observations), rewards, terminations, truncations, infos

    def _reset_one(
        self, i: int, env: sandhub.Env, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        obs, raw = env.reset(seed=seed, options=options)
        info, sandbox_id, elapsed_ms = split_info(raw, keep_episode=True)
        self._note(i, sandbox_id, elapsed_ms)
        return obs, info

    def _note(self, i: int, sandbox_id: str | None, elapsed_ms: int | None) -> None:
        if sandbox_id is not None:
            self.sandbox_ids[i] = sandbox_id
        self.last_elapsed_ms[i] = elapsed_ms

    def _close_envs(self) -> None:
        for env in self._envs:
            try:
                env.close()
            except SandhubError:
                pass  # already gone on the hub: closing is best effort, twice is fine

    def close_extras(self, **kwargs: Any) -> None:
        self._close_envs()
        self._hub.close()
