"""Every example under examples/ runs, as its README prints it, against a real hub.

Each example is a script with its own README; the framework ones run in that framework's
venv (scripts/test-deps.sh makes them; scripts/test.sh exports their pythons as
SANDHUB_<NAME>_PYTHON). A folder under examples/ that this table does not run fails
`test_every_example_is_run`, so no example can rot unnoticed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from sandhub_testing import REPO_ROOT, binary_path, free_port, running_hub
from sandhub_testing.env import need
from sandhub_testing.k8s import cluster_kubeconfig
from sandhub_testing.registry import sandhub_cache

EXAMPLES = REPO_ROOT / "examples"
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Example:
    folder: str
    argv: tuple[str, ...]
    """The command, with `{python}` for the interpreter of `venv`."""
    venv: str | None = None
    """A framework venv's name (`SANDHUB_<NAME>_PYTHON`, else $SANDHUB_CACHE/venv-<name>); None: this one."""
    cluster: bool = False
    """Runs against the test cluster's real node (KUBECONFIG), not the local hub."""
    image: bool = False
    """Needs the OpenHands agent-server image (scripts/test-deps.sh: $SANDHUB_OPENHANDS_IMAGE)."""


TABLE = [
    Example("mcp-agent", ("{python}", "examples/mcp-agent/agent.py")),
    Example("rl-gymnasium", ("{python}", "examples/rl-gymnasium/train.py")),
    Example("rest-curl", ("bash", "examples/rest-curl/rest.sh")),
    Example("deepagents", ("{python}", "examples/deepagents/agent.py"), venv="deepagents"),
    Example("nemo-gym", ("{python}", "examples/nemo-gym/run.py"), venv="nemo-gym"),
    Example("deerflow", ("{python}", "examples/deerflow/run.py"), venv="deerflow"),
    # Its agent server reaches the scripted model on this machine: a host-network template
    # (the hub below allows it); the image layout comes in $SANDHUB_OPENHANDS_IMAGE.
    Example("openhands", ("{python}", "examples/openhands/run.py"), venv="openhands", image=True),
    Example("kubernetes", ("bash", "examples/kubernetes/install.sh"), cluster=True),
]


def python_of(venv: str | None) -> str:
    if venv is None:
        return sys.executable
    var = f"SANDHUB_{venv.upper().replace('-', '_')}_PYTHON"
    path = os.environ.get(var) or str(sandhub_cache() / f"venv-{venv}" / "bin" / "python")
    need(os.access(path, os.X_OK), f"{var} is not set and {path} does not exist (bash scripts/test-deps.sh)")
    return path


@pytest.fixture(scope="module")
def hub_url(sandhub_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # --allow-host-network: the OpenHands example's agent server calls a model on this machine.
    with running_hub(sandhub_bin, tmp_path_factory.mktemp("examples-hub"), "--allow-host-network") as hub:
        yield hub.url


def test_every_example_is_run() -> None:
    folders = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert folders == sorted(e.folder for e in TABLE), "every examples/ folder needs a row in TABLE"
    for example in TABLE:
        readme = (EXAMPLES / example.folder / "README.md").read_text()
        script = example.argv[-1]
        assert script in readme, f"{example.folder}/README.md does not show how to run {script}"
        assert (REPO_ROOT / script).is_file(), script


def cluster_env(tmp_path: Path) -> dict[str, str]:
    """PATH with the built `sandhub` and `sandhub-controller` and the cluster's kubectl,
    KUBECONFIG of the test cluster (its real node runs the Pods)."""
    kubeconfig = cluster_kubeconfig()
    need(os.environ.get("SANDHUB_TEST_REAL_NODE") == "1",
         "SANDHUB_TEST_REAL_NODE is not 1 (scripts/test.sh starts the real node as root)")
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("sandhub", "sandhub-controller"):
        path = binary_path(name)
        need(os.access(path, os.X_OK), f"{path} is not built")
        (bins / name).symlink_to(path)
    k8s_bin = os.environ.get("K8S_BIN", "")
    path = os.pathsep.join(p for p in (str(bins), k8s_bin, os.environ.get("PATH", "")) if p)
    return {"PATH": path, "KUBECONFIG": kubeconfig, "PYTHON": sys.executable,
            "SANDHUB_EXAMPLE_PORT": str(free_port())}


@pytest.mark.parametrize("example", TABLE, ids=[e.folder for e in TABLE])
def test_example_runs(example: Example, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    python = python_of(example.venv)
    argv = [python if a == "{python}" else a for a in example.argv]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("SANDHUB_API_KEY", None)
    if example.image:
        layout = os.environ.get("SANDHUB_OPENHANDS_IMAGE", "")
        need(os.path.isdir(layout), "SANDHUB_OPENHANDS_IMAGE names no image layout (bash scripts/test-deps.sh)")
    if example.cluster:
        env.update(cluster_env(tmp_path))
    else:
        env["SANDHUB_URL"] = request.getfixturevalue("hub_url")
    out = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    print(out.stdout, out.stderr, sep="\n")
    assert out.returncode == 0, f"{' '.join(example.argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    assert not re.search(r"Traceback \(most recent call last\)", out.stderr), out.stderr
    # The official MCP client's complaint about how a session ended (the hub answers as upstream).
    assert "Session termination failed" not in out.stdout + out.stderr
