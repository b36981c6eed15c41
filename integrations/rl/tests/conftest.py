"""A real `sandhub serve` (local backend) for sandhub-rl's tests, and the
three SWE-bench-named images the task tests run: the registry test image
(`sandhub_testing.test_image_layout`, Debian busybox + python3) imported
under three SWE-bench instance image names.

Run in the main venv: scripts/test.sh runs this directory with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from sandhub_testing import Hub, running_hub, test_image_layout
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture

from sandhub_rl import swebench_image

#: SWE-bench instance ids whose images the tests import (one image each).
INSTANCE_IDS = ("astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590")
#: The amd64 image of the registry's test layout (busybox, python3; workdir /srv/work).
LAYOUT_REF = "sandhub/test:amd64"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scale: the issue's full-size training run (200 rows, 16 concurrent)")


@pytest.fixture(scope="session")
def hub_proc(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # noqa: F811
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("rl-hub")) as hub:
        yield hub


@pytest.fixture(scope="session")
def hub_url(hub_proc: Hub) -> str:
    return hub_proc.url


@pytest.fixture(scope="session")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


@pytest.fixture(scope="session")
def swe_images(hub: sandhub.Hub) -> list[str]:
    """Three image references in the hub's store, named as SWE-bench's harness names them."""
    layout = test_image_layout()
    images = [swebench_image(i) for i in INSTANCE_IDS]
    for ref in images:
        hub.images.import_(layout, ref=LAYOUT_REF, tag=ref)
    return images


@pytest.fixture
def no_leftovers(hub: sandhub.Hub) -> Iterator[None]:
    """Fails the test when a fleet sandbox or pool it made is still on the hub after it."""
    before = {sb.id for sb in hub.list({"sandhub-rl/managed": "true"})}
    pools_before = {p.name for p in hub.pools.list()}
    yield
    left = [sb.id for sb in hub.list({"sandhub-rl/managed": "true"}) if sb.id not in before]
    pools = [p.name for p in hub.pools.list() if p.name not in pools_before]
    assert not left and not pools, f"left on the hub: sandboxes {left}, pools {pools}"
