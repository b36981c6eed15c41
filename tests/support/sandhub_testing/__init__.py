"""Sandhub's Python test harness, shared by every suite of the repository.

Plain helpers are importable from here; the pytest fixtures live in
`sandhub_testing.fixtures` (a suite's conftest.py imports the ones it uses), and
the Kubernetes helpers in `sandhub_testing.k8s` and `sandhub_testing.hub_k8s`,
which import the `kubernetes` client.
"""

from .binaries import BINARIES, binary, binary_path
from .env import REPO_ROOT, in_ci, need
from .hub import Hub, running_hub, start_hub, stop_hub
from .net import LOOPBACK, free_port, free_ports, port_open
from .procs import stop_process, tail, wait_for
from .registry import Registry, test_image_layout, test_image_summary
from .router import Router, start_router
from .sandboxd import Sandboxd, start_sandboxd

__all__ = [
    "BINARIES",
    "LOOPBACK",
    "REPO_ROOT",
    "Hub",
    "Registry",
    "Router",
    "Sandboxd",
    "binary",
    "binary_path",
    "free_port",
    "free_ports",
    "in_ci",
    "need",
    "port_open",
    "running_hub",
    "start_hub",
    "start_router",
    "start_sandboxd",
    "stop_hub",
    "stop_process",
    "tail",
    "test_image_layout",
    "test_image_summary",
    "wait_for",
]
