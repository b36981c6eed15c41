"""A real `sandhub serve` (with API keys, and `--allow-host-network` for the agent
run whose LLM listens on the hub's loopback) and the agent-server image in its
store, for the OpenHands adapter's tests (run in the openhands venv:
scripts/test-deps.sh makes it and builds the image, scripts/test.sh runs this
directory with it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

# Read by LiteLLM when first imported: never fetch the model price list (no network).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import pytest  # noqa: E402
import sandhub  # noqa: E402
from sandhub_testing import REPO_ROOT, running_hub  # noqa: E402
from sandhub_testing.fixtures import sandhub_bin  # noqa: E402,F401 - fixture

from sandhub_openhands import SandhubWorkspace, agent_server_template  # noqa: E402

HUB_KEY = "openhands-tests-key-0123456789"
TEMPLATE = "openhands-test"
HOST_NET_TEMPLATE = "openhands-test-hostnet"
LABEL = {"suite": "openhands"}


def _cache_dir() -> Path:
    return Path(os.environ.get("SANDHUB_CACHE") or Path.home() / ".cache/sandhub")


@pytest.fixture(scope="session")
def image_layout() -> Path:
    """The agent-server image: $SANDHUB_OPENHANDS_IMAGE (a layout directory) when set,
    else dev/openhands/build-image.py's (cached: scripts/test-deps.sh built it already,
    so this returns at once)."""
    given = os.environ.get("SANDHUB_OPENHANDS_IMAGE")
    if given:
        return Path(given)
    builder = REPO_ROOT / "dev/openhands/build-image.py"
    out = subprocess.run(
        # The Python copied into the image: this venv's own interpreter.
        [sys.executable, str(builder), "--cache", str(_cache_dir()), "--python", os.path.realpath(sys.executable)],
        check=True, capture_output=True, text=True, timeout=1800,
    )
    layout = Path(json.loads(out.stdout.strip().splitlines()[-1])["layout"])
    assert (layout / "index.json").is_file(), out.stderr
    return layout


@pytest.fixture(scope="session")
def hub_url(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with running_hub(
        sandhub_bin, tmp_path_factory.mktemp("openhands-hub"), "--allow-host-network",
        api_keys={HUB_KEY: "openhands"},
    ) as hub:
        yield hub.url


@pytest.fixture(scope="session")
def hub(hub_url: str, image_layout: Path) -> sandhub.Hub:
    """The hub, with the image imported and the two templates put."""
    h = sandhub.Hub(hub_url, HUB_KEY)
    image = h.images.import_(image_layout)
    ref = image.tags[0] if image.tags else image.id
    # Two cores: the agent server's start (importing openhands, litellm...) is CPU-bound.
    h.templates.put(TEMPLATE, agent_server_template(ref, cpu=2))
    h.templates.put(HOST_NET_TEMPLATE, agent_server_template(ref, network="host", cpu=2))
    return h


@pytest.fixture(scope="module", params=["proxy", "tunnel"])
def workspace(request: pytest.FixtureRequest, hub: sandhub.Hub, hub_url: str) -> Iterator[SandhubWorkspace]:
    """One agent server per connection mode for a module's workspace tests (it takes
    seconds to start): through the hub's port proxy, and through a loopback tunnel."""
    with SandhubWorkspace(
        hub_url=hub_url, hub_api_key=HUB_KEY, template=TEMPLATE, labels=LABEL, connection=request.param
    ) as ws:
        yield ws
