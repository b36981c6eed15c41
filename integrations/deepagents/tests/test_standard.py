"""langchain_tests' standard sandbox suite on both adapters, against a real hub.

Run with ``-o asyncio_mode=auto`` (the suite's async tests carry no marker).
"""

from __future__ import annotations

from typing import Iterator

import pytest
import sandhub
from langchain_sandhub import AsyncSandhubSandbox, SandhubSandbox
from langchain_tests.integration_tests import SandboxIntegrationTests


class TestSandhubSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self, hub: sandhub.Hub) -> Iterator[SandhubSandbox]:
        with SandhubSandbox.create(hub) as backend:
            yield backend


class TestAsyncSandhubSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self, hub_url: str) -> Iterator[AsyncSandhubSandbox]:
        import asyncio

        backend = asyncio.run(AsyncSandhubSandbox.create(sandhub.AsyncHub(hub_url)))
        try:
            yield backend
        finally:
            backend.close()
