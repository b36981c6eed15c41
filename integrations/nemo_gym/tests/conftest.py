"""A real `sandhub serve` for the NeMo Gym adapter's tests (run in the
nemo-gym venv: scripts/test-deps.sh makes it, scripts/test.sh runs this
directory with it)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from sandhub_testing import running_hub
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture


@pytest.fixture(scope="session")
def hub_url(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("nemo-gym-hub")) as hub:
        yield hub.url


@pytest.fixture(scope="session")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)

