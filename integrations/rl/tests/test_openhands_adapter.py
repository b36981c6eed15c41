"""`sandhub_rl.adapters.openhands` against a real hub and the real agent-server image
(dev/openhands/build-image.py's, $SANDHUB_OPENHANDS_IMAGE as scripts/test.sh exports
it): a warm pool of sandboxes whose entrypoint is the agent server; acquire passes the
start check once /health answers, and the server answers through the hub's port proxy.
A server that cannot start fails its acquire at once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import requests
import pytest
import sandhub
from sandhub_testing import need

from sandhub_rl import FailFastPolicy, FleetConfig, ResourceSpec, SandboxFleet, SandboxStartError, Task
from sandhub_rl.adapters.openhands import DEFAULT_PORT, agent_server_start_check, agent_server_template


@pytest.fixture(scope="module")
def image(hub: sandhub.Hub) -> str:
    layout = os.environ.get("SANDHUB_OPENHANDS_IMAGE", "")
    need(bool(layout) and (Path(layout) / "index.json").is_file(),
         "SANDHUB_OPENHANDS_IMAGE is not an OCI layout (scripts/test-deps.sh builds it)")
    imported = hub.images.import_(Path(layout))
    return imported.tags[0] if imported.tags else imported.id


def test_agent_server_pool_serves_health_through_the_port_proxy(hub: sandhub.Hub, image: str, no_leftovers: None) -> None:
    hub.templates.put("rl-openhands", agent_server_template(image, resources=ResourceSpec(cpu_limit=2)))
    fleet = SandboxFleet(hub, FleetConfig(
        warm_per_template=1, ready_timeout_s=180,
        fail_fast=FailFastPolicy(start_check=agent_server_start_check(timeout_s=120))))
    try:
        assert fleet.wait_pools_ready(timeout=0.1).wanted in (0, 1)
        t0 = time.monotonic()
        with fleet.episode(Task(id="oh-1", template="rl-openhands")) as h:
            print(f"agent server up in {time.monotonic() - t0:.1f}s ({h.launch})")
            ep = h.sandbox.refresh().entrypoint
            assert ep is not None and ep.state == "Running", ep
            url = h.sandbox.ports.url(DEFAULT_PORT)
            r = requests.get(f"{url}health", timeout=30)
            assert r.status_code == 200, r.text
            # the agent's working directory holds none of the server's state
            assert h.exec("ls -A /workspace").stdout == ""
        # the pool refilled: the next acquire is warm and its server already up
        fleet.wait_pools_ready(timeout=120)
        with fleet.episode(Task(id="oh-2", template="rl-openhands")) as h:
            assert h.launch == "warm"
            assert requests.get(h.sandbox.ports.url(DEFAULT_PORT) + "health", timeout=30).status_code == 200
    finally:
        assert fleet.teardown().clean
        hub.templates.delete("rl-openhands")


def test_an_agent_server_that_cannot_start_fails_the_acquire_at_once(
    hub: sandhub.Hub, image: str, no_leftovers: None
) -> None:
    """A server that cannot start (here: a module name with a typo) exits at once:
    the start check sees no server left and gives up, and the fleet names the
    entrypoint's exit as the cause (not the check's two-minute wait)."""
    spec = agent_server_template(image, resources=ResourceSpec(cpu_limit=2))
    script = spec["entrypoint"][-1].replace("openhands.agent_server", "openhands.agent_server_typo")
    spec["entrypoint"] = [*spec["entrypoint"][:-1], script]
    hub.templates.put("rl-openhands-bad", spec)
    fleet = SandboxFleet(hub, FleetConfig(fail_fast=FailFastPolicy(start_check=agent_server_start_check(timeout_s=120))))
    try:
        t0 = time.monotonic()
        with pytest.raises(SandboxStartError) as info:
            fleet.acquire(Task(id="oh-bad", template="rl-openhands-bad"))
        assert info.value.cause == "exited_at_start" and "exited 1" in info.value.message, info.value
        assert time.monotonic() - t0 < 60
    finally:
        assert fleet.teardown().clean
        hub.templates.delete("rl-openhands-bad")
