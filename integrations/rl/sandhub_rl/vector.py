"""A Gymnasium vector env whose episodes run on a fleet's sandboxes
(``fleet.make_vec_env(tasks, reward=...)``; needs ``gymnasium``, the
``sandhub-rl[gym]`` extra).

Each of the ``num_envs`` slots runs one episode at a time: ``reset`` (and
gymnasium's ``NEXT_STEP`` autoreset) acquires a sandbox for the next task
(the tasks are cycled through), whose observation is the task's prompt; an
action is a shell command, run in the slot's sandbox (all slots at once, in
threads), whose observation is its output. An episode ends when the action
is ``submit_action`` (terminated) or after ``max_episode_steps`` (truncated);
then ``reward`` is computed in the episode's sandbox and the sandbox is
released. A task whose sandbox cannot start is skipped (``env.skipped``). ``reward`` is a callable ``(handle) -> float`` or a shell command
(1.0 when it exits 0, else 0.0). A sandbox lost mid-episode truncates the
episode with reward 0 and ``info["sandbox_lost"]``.
"""

from __future__ import annotations

import inspect
import string
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Protocol, Sequence

import gymnasium as gym
import numpy as np
import sandhub
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from .errors import SandboxLostError, SandboxStartError
from .tasks import Task

__all__ = ["FleetVectorEnv", "make_vec_env"]

#: Shell output is text: printable ASCII plus the whitespace a terminal emits.
CHARSET = frozenset(string.printable)


class _Fleet(Protocol):
    def acquire(self, task: Task) -> Any: ...

    def release(self, handle: Any) -> object: ...


Reward = Callable[[Any], float] | str


def _default_prompt(task: Task) -> str:
    value = task.data.get("problem_statement") or task.data.get("prompt") or ""
    return str(value)


class FleetVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` episodes at a time on a fleet (see the module docstring)."""

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        fleet: _Fleet,
        tasks: Iterable[Task],
        *,
        reward: Reward,
        num_envs: int = 1,
        max_episode_steps: int = 20,
        submit_action: str = "submit",
        prompt: Callable[[Task], str] = _default_prompt,
        max_observation_chars: int = 16384,
        step_timeout_s: float | None = 600.0,
    ) -> None:
        self._tasks = list(tasks)
        if not self._tasks:
            raise ValueError("make_vec_env needs at least one task")
        if num_envs < 1 or max_episode_steps < 1 or max_observation_chars < 1:
            raise ValueError("num_envs, max_episode_steps and max_observation_chars must be >= 1")
        if not (callable(reward) or (isinstance(reward, str) and reward)):
            raise TypeError("reward must be a callable (handle) -> float or a shell command")
        self.fleet = fleet
        self.num_envs = num_envs
        self.reward = reward
        self.max_episode_steps = max_episode_steps
        self.submit_action = submit_action
        self.prompt = prompt
        self.max_observation_chars = max_observation_chars
        self.step_timeout_s = step_timeout_s
        self.single_observation_space = gym.spaces.Text(max_length=max_observation_chars, min_length=0, charset=CHARSET)
        self.single_action_space = gym.spaces.Text(max_length=max_observation_chars, min_length=1, charset=CHARSET)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.handles: list[Any | None] = [None] * num_envs
        self._steps = [0] * num_envs
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)
        self._next_task = 0
        self._lock = threading.Lock()
        #: Tasks skipped because their sandbox could not start: id -> cause.
        self.skipped: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(num_envs, thread_name_prefix="sandhub-rl-vec")

    # ------------------------------------------------------------------ slots

    def _clip(self, text: str) -> str:
        text = "".join(c if c in CHARSET else "?" for c in text)
        return text[-self.max_observation_chars :]

    def _begin(self, i: int) -> tuple[str, dict[str, Any]]:
        """Starts slot ``i``'s next episode: releases the old sandbox, acquires one for the next task."""
        self._end(i)
        for _ in range(len(self._tasks)):
            with self._lock:
                task = self._tasks[self._next_task % len(self._tasks)]
                self._next_task += 1
            try:
                handle = self.fleet.acquire(task)
            except SandboxStartError as e:  # skip the task, as a trainer would
                with self._lock:
                    self.skipped[task.id] = e.cause
                continue
            self.handles[i] = handle
            self._steps[i] = 0
            return self._clip(self.prompt(task)), {"task_id": task.id}
        raise SandboxStartError(
            f"no task could start in {len(self._tasks)} tries: {self.skipped}", cause="no_task_starts", task_id="*"
        )

    def _end(self, i: int) -> None:
        handle = self.handles[i]
        if handle is not None:
            self.handles[i] = None
            self.fleet.release(handle)

    def _score(self, handle: Any) -> float:
        if callable(self.reward):
            return float(self.reward(handle))
        result = handle.exec(self.reward, timeout=self.step_timeout_s)
        return 1.0 if result.exit_code == 0 else 0.0

    def _step_one(self, i: int, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        handle = self.handles[i]
        assert handle is not None, "step before reset"
        self._steps[i] += 1
        info: dict[str, Any] = {"task_id": handle.task.id}
        try:
            if action.strip() == self.submit_action:
                reward = self._score(handle)
                self._end(i)
                return "", reward, True, False, info
            result = handle.exec(action, timeout=self.step_timeout_s)
            obs = self._clip(result.stdout + result.stderr)
            info["exit_code"] = result.exit_code
            if self._steps[i] >= self.max_episode_steps:
                reward = self._score(handle)
                self._end(i)
                return obs, reward, False, True, info
            return obs, 0.0, False, False, info
        except SandboxLostError as e:
            self._end(i)
            info["sandbox_lost"] = True
            return self._clip(str(e)), 0.0, False, True, info

    # ------------------------------------------------------------------ gymnasium

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Starts an episode in every slot (the tasks continue where they were)."""
        super().reset(seed=seed)
        observations = [""] * self.num_envs
        infos: dict[str, Any] = {}
        for i, (obs, info) in enumerate(self._pool.map(self._begin, range(self.num_envs))):
            observations[i] = obs
            infos = self._add_info(infos, info, i)
        self._autoreset[:] = False
        return tuple(observations), infos

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
        observations = [""] * self.num_envs
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}

        def run(i: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
            if self._autoreset[i]:  # NEXT_STEP: this step starts the slot's next episode
                obs, info = self._begin(i)
                return obs, 0.0, False, False, info
            return self._step_one(i, actions[i])

        for i, (obs, reward, term, trunc, info) in enumerate(self._pool.map(run, range(self.num_envs))):
            observations[i], rewards[i], terminations[i], truncations[i] = obs, reward, term, trunc
            infos = self._add_info(infos, info, i)
        self._autoreset = np.logical_or(terminations, truncations)
        return tuple(observations), rewards, terminations, truncations, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Releases the slots' sandboxes (the fleet itself stays open)."""
        for i in range(self.num_envs):
            try:
                self._end(i)
            except sandhub.SandhubError:
                pass
        self._pool.shutdown(wait=True)


def make_vec_env(fleet: _Fleet, tasks: Iterable[Task], *, reward: Reward, **kwargs: Any) -> FleetVectorEnv:
    """A :class:`FleetVectorEnv` over ``fleet`` (any blocking fleet with ``acquire``/``release``)."""
    if inspect.iscoroutinefunction(fleet.acquire):
        raise TypeError(f"make_vec_env needs a blocking fleet (SandboxFleet), not {type(fleet).__name__}")
    return FleetVectorEnv(fleet, tasks, reward=reward, **kwargs)
