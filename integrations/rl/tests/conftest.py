"""A real `sandhub serve` (local backend) for sandhub-rl's tests, and the
three SWE-bench-named images the task tests run: the registry test image
(`sandhub_testing.test_image_layout`, Debian busybox + python3) pushed to a
loopback registry (the images issue's, `sandhub_testing.Registry`) under three
SWE-bench instance image names, and pulled into the hub by the fleet's own
`prepull`.

Run in the main venv: scripts/test.sh runs this directory with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import sandhub
from sandhub_testing import Hub, Registry, running_hub, test_image_layout
from sandhub_testing.fixtures import sandhub_bin  # noqa: F401 - fixture

from sandhub_rl import prepull, swebench_image

#: SWE-bench instance ids whose images the tests import (one image each).
INSTANCE_IDS = ("astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590")
#: The amd64 image of the registry's test layout (busybox, python3; workdir /srv/work).
LAYOUT_REF = "sandhub/test:amd64"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scale: the issue's full-size training run (200 rows, 16 concurrent)")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The loopback registry, holding the test image under the three SWE-bench names."""
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        layout = test_image_layout()
        for instance in INSTANCE_IDS:
            reg.push(layout, swebench_image(instance), ref=LAYOUT_REF)
        yield reg


@pytest.fixture(scope="session")
def hub_proc(
    sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory, registry: Registry  # noqa: F811
) -> Iterator[Hub]:
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("rl-hub"), "--insecure-registry", registry.addr) as hub:
        yield hub


@pytest.fixture(scope="session")
def hub_url(hub_proc: Hub) -> str:
    return hub_proc.url


@pytest.fixture(scope="session")
def hub(hub_url: str) -> sandhub.Hub:
    return sandhub.Hub(hub_url)


@pytest.fixture(scope="session")
def swe_images(hub: sandhub.Hub, registry: Registry) -> list[str]:
    """Three image references in the hub's store, named as SWE-bench's harness names
    them (behind the loopback registry's address), pulled by the fleet's `prepull`."""
    images = [f"{registry.addr}/{swebench_image(i)}" for i in INSTANCE_IDS]
    result = prepull(hub, images)
    assert result.ok and [i.reference for i in result.images] == images, result
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
