"""Sandhub sandboxes as LangChain Deep Agents backends.

``SandhubSandbox`` (blocking) and ``AsyncSandhubSandbox`` (asyncio) are
``deepagents.backends.sandbox.BaseSandbox`` implementations over the
``sandhub`` SDK: ``create_deep_agent(model=..., backend=SandhubSandbox.create(hub))``.
"""

from __future__ import annotations

from ._async import AsyncSandhubSandbox
from ._ops import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_SECONDS
from ._sync import SandhubSandbox

__all__ = ["AsyncSandhubSandbox", "DEFAULT_MAX_OUTPUT_CHARS", "DEFAULT_TIMEOUT_SECONDS", "SandhubSandbox"]
