"""langchain_tests' standard sandbox suite on both adapters, against a real hub.

Run with ``-o asyncio_mode=auto`` (the suite's async tests carry no marker).
The tests that lag deepagents' own semantics are deselected in conftest.py.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest
import sandhub
from langchain_sandhub import AsyncSandhubSandbox, SandhubSandbox
from langchain_tests.integration_tests import SandboxIntegrationTests

# The suite runs `python`; the default root (this host's /usr, Debian) has only
# `python3`, as an image without `python-is-python3` would. The template puts a
# directory first on PATH where the fixture links one to the other.
TEMPLATE = "deepagents-standard"
PYTHON_DIR = "/tmp/bin"
PATH = f"{PYTHON_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINK_PYTHON = f"mkdir -p {PYTHON_DIR} && ln -sf /usr/bin/python3 {PYTHON_DIR}/python && python -V"


@pytest.fixture(scope="module")
def template(hub: sandhub.Hub) -> str:
    hub.templates.put(TEMPLATE, {"env": {"PATH": PATH}})
    return TEMPLATE


def _linked(result: sandhub.CommandResult) -> None:
    assert result.exit_code == 0, f"could not provide `python`: {result}"


class TestSandhubSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self, hub: sandhub.Hub, template: str) -> Iterator[SandhubSandbox]:
        with SandhubSandbox.create(hub, template=template) as backend:
            _linked(backend.sandbox.commands.run(LINK_PYTHON))
            yield backend


class TestAsyncSandhubSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self, hub_url: str, template: str) -> Iterator[AsyncSandhubSandbox]:
        async def make() -> AsyncSandhubSandbox:
            backend = await AsyncSandhubSandbox.create(sandhub.AsyncHub(hub_url), template=template)
            _linked(await backend.sandbox.commands.run(LINK_PYTHON))
            return backend

        backend = asyncio.run(make())
        try:
            yield backend
        finally:
            backend.close()
