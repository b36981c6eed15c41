"""Gymnasium environments whose actions run in Sandhub sandboxes.

Each environment is one hub environment (``POST /gym/v1/envs``): actions
are shell commands, observations their output, and the reward and
termination rules run on the hub. ``VectorSandhubEnv`` steps many
environments in one round trip (``POST /gym/v1/step``).
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import requests

__all__ = ["SandhubEnv", "SandhubError", "step_many"]

# Shell output is text: printable ASCII plus the whitespace a terminal emits.
_CHARSET = frozenset(string.printable)


class SandhubError(RuntimeError):
    """A hub error: ``code`` is the upstream code word (``NOT_FOUND``, ...)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


def _call(session: requests.Session, method: str, url: str, **kw: Any) -> Any:
    resp = session.request(method, url, timeout=kw.pop("timeout", 600), **kw)
    if resp.status_code >= 400:
        try:
            body = resp.json()
            raise SandhubError(resp.status_code, body.get("code", "UNKNOWN"), body.get("message", ""))
        except ValueError:
            raise SandhubError(resp.status_code, "UNKNOWN", resp.text) from None
    return resp.json() if resp.content else None


class SandhubEnv(gym.Env):
    """One sandbox-backed environment.

    ``spec`` is the body of ``POST /gym/v1/envs``: ``template``, ``pool``,
    ``task``, ``reward``, ``termination``, ``max_episode_steps``, ...
    """

    metadata = {"render_modes": []}

    def __init__(self, hub_url: str = "http://127.0.0.1:7070", api_key: str | None = None, **spec: Any):
        super().__init__()
        self._base = hub_url.rstrip("/")
        self._session = requests.Session()
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"
        created = _call(self._session, "POST", f"{self._base}/gym/v1/envs", json=spec)
        self.env_id: str = created["env_id"]
        self.observation_space = gym.spaces.Text(
            max_length=created["observation_space"]["max_length"], min_length=0, charset=_CHARSET
        )
        self.action_space = gym.spaces.Text(
            max_length=created["action_space"]["max_length"], min_length=1, charset=_CHARSET
        )

    @property
    def base_url(self) -> str:
        return self._base

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        body = {"seed": seed} if seed is not None else {}
        if options is not None:
            body["options"] = options
        out = _call(self._session, "POST", f"{self._base}/gym/v1/envs/{self.env_id}/reset", json=body)
        return out["observation"], out["info"]

    def step(self, action: str):
        out = _call(
            self._session, "POST", f"{self._base}/gym/v1/envs/{self.env_id}/step", json={"action": action}
        )
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    def close(self):
        if getattr(self, "env_id", None):
            try:
                _call(self._session, "DELETE", f"{self._base}/gym/v1/envs/{self.env_id}")
            except SandhubError:
                pass
            self.env_id = None
        self._session.close()
        super().close()


def step_many(envs: list[SandhubEnv], actions: list[str]):
    """Steps every env once, concurrently on the hub, in one request.

    Returns a list of ``(obs, reward, terminated, truncated, info)`` tuples,
    or a ``SandhubError`` in place of an env whose step failed.
    """
    if not envs:
        return []
    base, session = envs[0].base_url, envs[0]._session
    body = {"steps": [{"env_id": e.env_id, "action": a} for e, a in zip(envs, actions, strict=True)]}
    out = _call(session, "POST", f"{base}/gym/v1/step", json=body)
    results = []
    for item in out["results"]:
        if item.get("error"):
            err = item["error"]
            results.append(SandhubError(200, err["code"], err["message"]))
        else:
            r = item["result"]
            results.append((r["observation"], r["reward"], r["terminated"], r["truncated"], r["info"]))
    return results
