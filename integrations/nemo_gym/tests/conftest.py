"""A real `sandhub serve` for the NeMo Gym adapter's tests (run in the
nemo-gym venv: scripts/test-deps.sh makes it, scripts/test.sh runs this
directory with it).

- `hub_url`/`hub`: a plain hub, for SandhubProvider (the adapter).
- `e2b_hub`: a hub serving its E2B-compatible API too (`serve --e2b`), for
  NeMo Gym's own built-in E2B provider (test_e2b_provider.py). Started only
  when a test asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from sandhub_testing import Hub, running_hub
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture


@pytest.fixture(scope="session")
def hub_url(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("nemo-gym-hub")) as hub:
        yield hub.url


@pytest.fixture(scope="session")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


@pytest.fixture(scope="session")
def e2b_hub(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # noqa: F811
    """A hub with its E2B facade on its listener (`serve --e2b`), open (no
    keys file: any E2B API key is accepted); E2B's control plane and envd
    are both at its URL."""
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("nemo-gym-e2b-hub"), "--e2b") as hub:
        yield hub
