"""Sandhub sandboxes for NVIDIA NeMo Gym.

``SandhubProvider`` implements NeMo Gym's async ``SandboxProvider`` protocol
(plus ``SupportsSandboxPauseResume`` and ``ConnectableProvider``) over the
``sandhub`` SDK, and is registered under the entry-point group
``nemo_gym.sandbox_providers`` as ``sandhub``. ``CONFIG_PATH`` is the
shipped ``configs/sandhub.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from ._provider import RUNTIME_RETURN_CODE, SandhubProvider

CONFIG_PATH = Path(__file__).parent / "configs" / "sandhub.yaml"

__all__ = ["CONFIG_PATH", "RUNTIME_RETURN_CODE", "SandhubProvider"]
