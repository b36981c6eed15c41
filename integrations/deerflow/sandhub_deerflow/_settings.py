"""The provider's settings: the keys beside ``use:`` in DeerFlow's ``sandbox:`` block.

DeerFlow builds its provider with no arguments, so the settings come from
its app config (``SandboxConfig`` allows extra keys), and where no
``config.yaml`` exists (a test that installs the provider with
``set_sandbox_provider``) from ``$SANDHUB_URL`` / ``$SANDHUB_API_KEY`` and
the defaults::

    sandbox:
      use: sandhub_deerflow:SandhubSandboxProvider
      sandhub_url: http://127.0.0.1:7070   # default: $SANDHUB_URL, else the SDK's default
      api_key: $SANDHUB_API_KEY            # DeerFlow resolves $VARS in config values
      template: default                    # the hub's template for new sandboxes
      timeout: 600                         # seconds a command may run
      idle_timeout: 600                    # DeerFlow's key: the hub deletes a sandbox idle this long; 0: never
      environment: {LANG: C.UTF-8}         # DeerFlow's key: env of every new sandbox
      on_release: keep                     # keep | suspend | delete (see the provider)
      user_data_root: /workspace           # where /mnt/user-data lives in the sandbox
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._paths import DEFAULT_REAL_ROOT, PathMap
from ._sandbox import DEFAULT_TIMEOUT_SECONDS

ReleasePolicy = Literal["keep", "suspend", "delete"]
RELEASE_POLICIES: tuple[ReleasePolicy, ...] = ("keep", "suspend", "delete")
#: DeerFlow's default ``sandbox.idle_timeout``.
DEFAULT_IDLE_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class Settings:
    """What the provider needs; see the module docstring for each key."""

    sandhub_url: str | None = None
    api_key: str | None = None
    template: str | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    idle_timeout: int = DEFAULT_IDLE_TIMEOUT_SECONDS
    environment: dict[str, str] = field(default_factory=dict)
    on_release: ReleasePolicy = "keep"
    user_data_root: str = DEFAULT_REAL_ROOT

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
        """Checks every key (a wrong one fails with a message naming it);
        URL and key fall back to ``$SANDHUB_URL`` / ``$SANDHUB_API_KEY``."""
        env = os.environ if env is None else env
        url = _opt_str(raw, "sandhub_url") or env.get("SANDHUB_URL") or None
        api_key = _opt_str(raw, "api_key") or env.get("SANDHUB_API_KEY") or None
        timeout = _number(raw, "timeout", DEFAULT_TIMEOUT_SECONDS)
        if not (math.isfinite(timeout) and 0 < timeout <= 86400):
            raise ValueError(f"sandbox.timeout: {timeout!r} is not a number of seconds in (0, 86400]")
        idle = raw.get("idle_timeout")
        idle = DEFAULT_IDLE_TIMEOUT_SECONDS if idle is None else idle
        if isinstance(idle, bool) or not isinstance(idle, int) or not 0 <= idle <= 31536000:
            raise ValueError(f"sandbox.idle_timeout: {idle!r} is not a whole number of seconds (0: never)")
        environment = raw.get("environment") or {}
        if not isinstance(environment, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
        ):
            raise ValueError("sandbox.environment must map names to strings")
        on_release = raw.get("on_release") or "keep"
        if on_release not in RELEASE_POLICIES:
            raise ValueError(f"sandbox.on_release: {on_release!r} is not one of {', '.join(RELEASE_POLICIES)}")
        root = _opt_str(raw, "user_data_root") or DEFAULT_REAL_ROOT
        PathMap(real_root=root)  # refuses a relative or unnormalized root now, not at first use
        return cls(
            sandhub_url=url,
            api_key=api_key,
            template=_opt_str(raw, "template"),
            timeout=timeout,
            idle_timeout=idle,
            environment=dict(environment),
            on_release=on_release,
            user_data_root=root,
        )

    @classmethod
    def from_deerflow(cls) -> Settings:
        """The keys of DeerFlow's ``sandbox:`` block; the defaults without a config file."""
        from deerflow.config import get_app_config

        try:
            sandbox = get_app_config().sandbox
        except FileNotFoundError:
            return cls.from_mapping({})
        raw: dict[str, Any] = dict(getattr(sandbox, "model_extra", None) or {})
        for key in ("environment", "idle_timeout"):  # DeerFlow's own fields
            value = getattr(sandbox, key, None)
            if value is not None:
                raw.setdefault(key, value)
        return cls.from_mapping(raw)


def _opt_str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"sandbox.{key}: {value!r} is not a string")
    return value


def _number(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sandbox.{key}: {value!r} is not a number")
    return float(value)
