"""A real `sandhub serve` and DeerFlow's real harness for the DeerFlow adapter's
tests (run in the deerflow venv: scripts/test-deps.sh makes it, scripts/test.sh
runs this directory with it).

- `hub_url`/`hub`: one hub for the session.
- `provider`: the provider as `sandbox.use:` loads it (DeerFlow's
  `resolve_class`, no arguments, no config.yaml so settings come from
  $SANDHUB_URL), installed as DeerFlow's provider; shut down afterwards, and
  the hub is then checked to hold none of its sandboxes.
- `runtime(thread)`: a fresh tool runtime, as DeerFlow's agent gives each tool call.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest
import sandhub
from deerflow.config.app_config import reset_app_config
from deerflow.reflection import resolve_class
from deerflow.sandbox import SandboxProvider
from deerflow.sandbox.sandbox_provider import reset_sandbox_provider, set_sandbox_provider
from sandhub_testing import running_hub
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture

from sandhub_deerflow import LABEL_APP, SandhubSandboxProvider

USE = "sandhub_deerflow:SandhubSandboxProvider"


@pytest.fixture(scope="session")
def hub_url(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("deerflow-hub")) as hub:
        yield hub.url


@pytest.fixture(scope="session")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


@pytest.fixture
def deerflow_env(hub_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No config.yaml anywhere DeerFlow looks (a fresh cwd, no
    DEER_FLOW_CONFIG_PATH) and the hub in $SANDHUB_URL; DeerFlow's config
    and provider singletons are cleared before and after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEER_FLOW_CONFIG_PATH", raising=False)
    monkeypatch.delenv("SANDHUB_API_KEY", raising=False)
    monkeypatch.setenv("SANDHUB_URL", hub_url)
    reset_app_config()
    reset_sandbox_provider()
    yield
    reset_sandbox_provider()
    reset_app_config()


@pytest.fixture
def make_provider(deerflow_env: None, hub: sandhub.Hub) -> Iterator[Callable[[], SandhubSandboxProvider]]:
    """Builds providers the way `sandbox.use:` does; every one is shut down
    afterwards, and then no sandbox of the adapter may be left on the hub."""
    made: list[SandhubSandboxProvider] = []

    def make() -> SandhubSandboxProvider:
        cls = resolve_class(USE, SandboxProvider)
        provider = cls()
        assert isinstance(provider, SandhubSandboxProvider)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.shutdown()
    left = [sb.id for sb in hub.list({LABEL_APP: "deerflow"})]
    assert left == [], f"sandboxes left on the hub after shutdown: {left}"


@pytest.fixture
def provider(make_provider: Callable[[], SandhubSandboxProvider]) -> SandhubSandboxProvider:
    """One provider, installed as DeerFlow's (`set_sandbox_provider`)."""
    p = make_provider()
    set_sandbox_provider(p)
    return p


@pytest.fixture
def runtime() -> Callable[..., SimpleNamespace]:
    def make(thread: str = "thread-1", user: str = "user-1") -> SimpleNamespace:
        return SimpleNamespace(state={}, context={"thread_id": thread, "user_id": user}, config={})

    return make
