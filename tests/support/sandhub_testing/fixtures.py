"""The pytest fixtures the suites share. A suite's conftest.py imports the ones
it uses (importing a fixture into a conftest registers it with pytest):

    from sandhub_testing.fixtures import sandboxd, sandboxd_bin, sandboxd_env  # noqa: F401

`sandboxd` needs `sandboxd_bin` and `sandboxd_env` (imported, or defined in the
conftest: a conftest's own `sandboxd_env` gives its daemons an environment);
`router` needs `make_router` and `router_bin`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from .binaries import binary
from .procs import stop_process
from .router import Router, start_router
from .sandboxd import Sandboxd, start_sandboxd

# --------------------------------------------------------------------------- binaries


@pytest.fixture(scope="session")
def sandboxd_bin() -> Path:
    return binary("sandboxd")


@pytest.fixture(scope="session")
def sandhub_bin() -> Path:
    return binary("sandhub")


@pytest.fixture(scope="session")
def sandhub_mcp_bin() -> Path:
    return binary("sandhub-mcp")


@pytest.fixture(scope="session")
def router_bin() -> Path:
    return binary("sandhub-router")


@pytest.fixture(scope="session")
def controller_bin() -> Path:
    return binary("sandhub-controller")


# --------------------------------------------------------------------------- sandboxd


@pytest.fixture
def sandboxd_env() -> dict[str, str]:
    """The daemon's own environment over the test run's (commands inherit it)."""
    return {}


@pytest.fixture
def sandboxd(sandboxd_bin: Path, sandboxd_env: dict[str, str], tmp_path: Path) -> Iterator[Sandboxd]:
    """A fresh sandboxd with its own root dir and free ports; SIGTERM (then kill) after."""
    daemon = start_sandboxd(sandboxd_bin, tmp_path / "sandboxd", sandboxd_env)
    try:
        yield daemon
    finally:
        rc = stop_process(daemon.proc)
        # Shown by pytest only when the test failed.
        print(f"--- sandboxd exit code: {rc}; log tail ---\n{daemon.log_tail()}")


# --------------------------------------------------------------------------- the router


@pytest.fixture
def make_router(router_bin: Path, tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """Starts routers with extra flags; all are stopped (SIGTERM) at the end,
    and each must exit cleanly."""
    started: list[Router] = []

    def make(*args: str, env: dict[str, str] | None = None, https: bool = False) -> Router:
        r = start_router(router_bin, tmp_path / f"router{len(started)}", *args, env=env, https=https)
        started.append(r)
        return r

    yield make
    for r in started:
        rc = stop_process(r.proc)
        print(f"--- router exit {rc}; log ---\n{r.log_tail()}")
        assert rc == 0, f"router did not exit cleanly on SIGTERM (rc={rc})"


@pytest.fixture
def router(make_router: Callable[..., Router]) -> Router:
    """Header routing, loopback Pod IPs allowed, allow-all."""
    return make_router("--allow-loopback-pod-ip")
