"""Every command block of README.md, run as printed against the built binaries.

The README's fenced ```sh and ```python blocks are read from the file itself, so a
block that changes is tested as it now reads. Each block is either run (`RUN`, keyed by
its first line) or listed with the reason it cannot run here (`NOT_RUN`, keyed by its
whole text, so a line added to a listed block is noticed); a block that is neither
fails `test_every_block_is_run_or_listed`.

A block runs in a fresh bash with `set -euo pipefail`, stdin from /dev/null, and the
environment of a user on a fresh machine: a clean `PATH` that finds the debug builds
as `sandhub` and `sandhub-controller` (and the test cluster's `kubectl`), a temporary
`HOME`, and nothing else of the test run's environment unless noted. Blocks of one
environment run in README order and share what they leave behind (the hub the quick
tour starts), but no shell variables: each block defines what it uses.

- `local`: a network namespace of its own with only `lo`, so the hub listens on the
  README's 127.0.0.1:7070 without meeting any other process's port; its only way out
  is a veth pair to a stand-in PyPI (`sandhub_testing.pypi`: `pypi.org` and
  `files.pythonhosted.org` answered by a DNS server and an HTTPS index in a namespace
  of the test's own), so the quick tour's `pip install requests` from a sandbox of
  the online `default` template works without the real internet. Each block runs in a
  private mount namespace whose `/etc/resolv.conf` names the stand-in's DNS server and
  whose system CA bundle trusts its test CA. Afterwards every
  pool and sandbox is deleted through the API, the hub is stopped, and any process
  still holding a mount of the test's directory is killed.
- `kubernetes`: the test cluster of scripts/test.sh (SANDHUB_TEST_KUBECONFIG, copied to
  `~/.kube/config`), namespace `default`, the cluster's pinned `kubectl`
  (dev/k8s/build-bins.sh). The block ends in a foreground `sandhub serve`: it counts as
  working once that hub answers /readyz and lists the README's warm pool. It listens
  where `SANDHUB_LISTEN` says (a free port; every flag has its environment variable),
  since this one must share the host's loopback with the cluster. Afterwards the
  namespaced objects and the manifest's non-CRD objects are deleted (the CRDs stay:
  later suites use them).
- `cluster`: the test-cluster block, with `/tmp` bound to a directory of the test's own
  (a private mount namespace), so its `/tmp/k8s` is nobody else's; it passes
  CARGO_TARGET_DIR and SANDHUB_CACHE through, as the README says.

Under CI=true a missing binary, tool or cluster fails these tests; otherwise they skip.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from sandhub_testing import LOOPBACK, binary, free_port, need
from sandhub_testing.k8s import cluster_kubeconfig
from sandhub_testing.pypi import StandInPyPI

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
# Generous bounds of waits, never timing assertions.
BLOCK_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 20.0
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# An error body of the hub or sandboxd: `{"code":"NOT_FOUND","message":...}`.
ERROR_BODY = r'"code"\s*:\s*"[A-Z_]+"'

# Fence languages that hold commands (a fence without one may, too); other fences (yaml,
# text) are not run.
COMMAND_LANGUAGES = {"", "sh", "bash", "shell", "console", "python"}


@dataclass(frozen=True)
class Run:
    """How one README block runs, and what its output must show."""

    id: str
    env: str  # "local", "kubernetes" or "cluster"
    expect: tuple[str, ...] = ()  # regexes the block's output must match
    forbid: tuple[str, ...] = ()  # regexes it must not


# Keyed by the block's first line.
RUN: dict[str, Run] = {
    "sandhub serve &": Run(
        "quick-tour", "local", expect=(r"(?m)^hi$", r"Successfully installed requests-0\.0\.1")
    ),
    "id=$(curl -s -XPOST localhost:7070/v1/sandboxes": Run(
        "rest",
        "local",
        # uname -a, then the uploaded main.py, each with exit code 0.
        expect=(r'"exit_code"\s*:\s*0.*"stdout"\s*:\s*"Linux ', r'"stdout"\s*:\s*"hello\\n"'),
        # Any error body, such as the old answer to a JSON body sent without
        # `Content-Type: application/json` (curl -d sends a form's).
        forbid=(ERROR_BODY, r"Content-Type"),
    ),
    "import sandhub": Run("python-sdk", "local", expect=(r"(?m)^hello from ", r"ProcessExitEvent\(exit_code=0")),
    "from sandhub_gymnasium import SandhubEnv": Run("rl-loop", "local"),
    "sandhub-controller crd | kubectl apply --server-side -f -": Run("kubernetes", "kubernetes"),
    "bash dev/k8s/cluster.sh up /tmp/k8s": Run("test-cluster", "cluster"),
}

# Keyed by the block's whole text.
NOT_RUN: dict[str, str] = {
    "apt-get update -qq && apt-get install -y -qq btrfs-progs && cargo run --release -p sandhub -- serve   # run: the hub on 127.0.0.1:7070, local backend (as root; btrfs-progs makes its disk-quota volume)\n"
    "bash scripts/test.sh                                    # install test deps (apt + a Python venv), then run every test\n":
        "a release build of the workspace (~40 minutes on 2 cores), and scripts/test.sh is what "
        "runs this test (it would recurse); the quick tour runs the same `serve` from the debug build",
    "cargo install --locked --path hub                        # `sandhub` (a release build, into ~/.cargo/bin)\n"
    "cargo install --locked --path controller                 # `sandhub-controller`, for Kubernetes only\n":
        "release builds into ~/.cargo/bin (~40 minutes); the tests put the debug builds of the "
        "same binaries on PATH instead",
}


# --------------------------------------------------------------------------- the README


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")


def readme_blocks() -> list[Block]:
    """The fenced blocks of README.md whose language holds commands, in order."""
    blocks: list[Block] = []
    lines = README.read_text().splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = re.match(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang in COMMAND_LANGUAGES:
            blocks.append(Block(lang, "".join(body), start + 1))
    return blocks


def run_entry(block: Block) -> Run | None:
    for first, run in RUN.items():
        if block.first_line.startswith(first):
            return run
    return None


def blocks_for(env: str) -> list[tuple[Run, Block]]:
    out = []
    for block in readme_blocks():
        run = run_entry(block)
        if run is not None and run.env == env and block.text not in NOT_RUN:
            out.append((run, block))
    return out


def test_every_block_is_run_or_listed() -> None:
    blocks = readme_blocks()
    assert blocks, f"no command blocks found in {README}"
    unaccounted = [
        f"README.md:{b.line}: {b.first_line!r}"
        for b in blocks
        if b.text not in NOT_RUN and run_entry(b) is None
    ]
    assert not unaccounted, (
        "README blocks that are neither run nor listed: add each to RUN in "
        f"{Path(__file__).name} (how it runs), or to NOT_RUN with the reason it cannot:\n"
        + "\n".join(unaccounted)
    )
    # Entries that match no block any more are stale: a renamed block would otherwise
    # silently lose its test.
    texts = {b.text for b in blocks}
    stale = [t.splitlines()[0] for t in NOT_RUN if t not in texts]
    stale += [first for first in RUN if not any(b.first_line.startswith(first) for b in blocks)]
    assert not stale, f"entries that match no README block: {stale}"
    ids = [r.id for r in RUN.values()]
    assert len(ids) == len(set(ids)), ids


# --------------------------------------------------------------------------- helpers


def bin_dir(tmp: Path, names: list[str]) -> Path:
    """A directory of symlinks that puts the debug builds on PATH under their names."""
    d = tmp / "bin"
    d.mkdir()
    for name in names:
        (d / name).symlink_to(binary(name))
    return d


def need_tools(*tools: str) -> None:
    for tool in tools:
        need(shutil.which(tool, path=SYSTEM_PATH) is not None,
             f"`{tool}` is not installed (bash scripts/test-deps.sh installs it)")


def need_root() -> None:
    need(os.geteuid() == 0, "the README's hub runs as root (namespaces, cgroups)")


def k8s_bin() -> Path:
    """The test cluster's binaries (K8S_BIN from scripts/test.sh, else build-bins.sh)."""
    explicit = os.environ.get("K8S_BIN")
    if explicit:
        return Path(explicit)
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "dev/k8s/build-bins.sh")], capture_output=True, text=True
    )
    found = re.findall(r"^K8S_BIN=(.*)$", out.stdout, re.M)
    need(out.returncode == 0 and bool(found), f"dev/k8s/build-bins.sh failed:\n{out.stderr[-3000:]}")
    return Path(found[-1])


@dataclass
class Result:
    block: Block
    returncode: int | None
    output: str
    log: Path


# Set in every block's environment to this test's directory: whatever a block leaves
# running inherits it, which is how the test finds (only) its own processes again. A
# process group would not do: once empty, its id may be reused by anyone.
MARKER = "SANDHUB_README_RUN"


@dataclass
class World:
    """Where one environment's blocks run: directories, environment, wrapper argv."""

    tmp: Path
    cwd: Path
    env: dict[str, str]
    wrap: list[str] = field(default_factory=list)  # argv prefix (nsenter, unshare)

    def start(self, block: Block, name: str) -> tuple[subprocess.Popen, Path]:
        log = self.tmp / f"{name}.log"
        if block.lang == "python":
            script = self.tmp / f"{name}.py"
            script.write_text(block.text)
            argv = [sys.executable, str(script)]
        else:
            argv = ["bash", "-c", "set -euo pipefail\n" + block.text]
        with open(log, "wb") as out:
            # A file, not a pipe: a background `sandhub serve &` keeps its stdout open
            # long after the block ends.
            proc = subprocess.Popen(
                self.wrap + argv, cwd=self.cwd, env={**self.env, MARKER: str(self.tmp)},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log

    def run(self, block: Block, name: str) -> Result:
        proc, log = self.start(block, name)
        try:
            rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        return Result(block, rc, log.read_text(errors="replace"), log)

    def stop_processes(self) -> None:
        """SIGTERM what the blocks left running (the hub), then SIGKILL what remains."""
        signal_all(self.processes(), signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (pids := self.processes()) and time.monotonic() < deadline:
            signal_all(pids, signal.SIGKILL)
            time.sleep(0.05)

    def processes(self) -> list[int]:
        """The blocks' processes and whatever they started, while it runs."""
        return pids_with_env(MARKER, str(self.tmp))


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has `name=value`."""
    needle = f"{name}={value}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def check(result: Result, run: Run) -> None:
    where = f"README.md:{result.block.line} ({run.id})"
    tail = result.output[-6000:]
    print(f"--- output of {where} ---\n{tail}")  # shown for failures (and with -s)
    assert result.returncode is not None, f"{where} did not finish in {BLOCK_TIMEOUT_S}s:\n{tail}"
    assert result.returncode == 0, f"{where} exited with {result.returncode}:\n{tail}"
    for pattern in run.expect:
        assert re.search(pattern, result.output, re.S), f"{where}: no match for {pattern!r} in:\n{tail}"
    for pattern in run.forbid:
        m = re.search(pattern, result.output)
        assert not m, f"{where}: {m.group(0)!r} in its output:\n{tail}"


def pids_with_mount(needle: str) -> list[int]:
    """Processes whose mount table names `needle`: every process of a local sandbox has
    its state dir mounted."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "mountinfo").read_text():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def kill_leftovers(needle: str, state_dir: Path) -> list[int]:
    """The last resort: SIGKILL what still runs of this test's sandboxes, and remove
    their cgroups (named after sandbox ids, the state dir's entries)."""
    found = pids_with_mount(needle)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (pids := pids_with_mount(needle)) and time.monotonic() < deadline:
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.05)
    sandboxes = state_dir / "sandboxes"
    ids = [p.name for p in sandboxes.iterdir()] if sandboxes.is_dir() else []
    roots = [Path("/sys/fs/cgroup")] + [p for p in Path("/sys/fs/cgroup").glob("*") if p.is_dir()]
    for sid in ids:
        for root in roots:
            cg = root / "sandhub" / sid
            if cg.is_dir():
                for child in sorted(cg.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if child.is_dir():
                        try:
                            child.rmdir()
                        except OSError:
                            pass
                try:
                    cg.rmdir()
                except OSError:
                    pass
    return found


def remove_tmp(tmp: Path) -> None:
    """rmtree, unless something is still mounted below (never delete through a mount)."""
    mounts = Path("/proc/self/mountinfo").read_text()
    if str(tmp) in mounts:
        print(f"keeping {tmp}: something is still mounted below it")
        return
    shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- local


# Deletes every pool, then every sandbox, of the hub on 127.0.0.1:7070 (run inside the
# blocks' network namespace).
CLEANUP_LOCAL = r"""
import json, sys, urllib.request

HUB = "http://127.0.0.1:7070"

def call(method, path):
    req = urllib.request.Request(HUB + path, method=method)
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()

def get(path):
    return json.loads(call("GET", path))

try:
    call("GET", "/healthz")
except OSError as e:
    print(f"no hub to clean up: {e}")
    sys.exit(0)
for p in get("/v1/pools")["pools"]:
    call("DELETE", "/v1/pools/" + p["name"])
for s in get("/v1/sandboxes")["sandboxes"]:
    call("DELETE", "/v1/sandboxes/" + s["id"])
left = get("/v1/sandboxes")["sandboxes"]
print("left:", [s["id"] for s in left])
sys.exit(1 if left else 0)
"""


@pytest.fixture(scope="module")
def local_results() -> Iterator[dict[str, Result]]:
    """Runs the local blocks in README order in one network namespace; cleans up after."""
    need_root()
    need_tools("unshare", "nsenter", "ip", "curl", "jq", "mount", "openssl")
    tmp = Path(tempfile.mkdtemp(prefix="sandhub-readme-"))
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    bins = bin_dir(tmp, ["sandhub"])
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
        stdout=subprocess.PIPE, text=True,
    )
    world = World(tmp, work, {})
    pypi: StandInPyPI | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up", (
            "could not make a network namespace (unshare --net)"
        )
        netns = f"/proc/{holder.pid}/ns/net"
        # The quick tour's `pip install requests` gets this stand-in's wheel.
        pypi = StandInPyPI(tmp, netns, {"requests": "0.0.1"}).__enter__()
        world.wrap = ["nsenter", f"--net={netns}", "--", *pypi.wrap()]
        world.env = {
            "PATH": f"{bins}:{SYSTEM_PATH}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            # Python blocks run with the test's own interpreter, the test venv,
            # where scripts/test-deps.sh did the README's
            # `pip install ./integrations/gymnasium`.
        }
        results = {run.id: world.run(block, run.id) for run, block in blocks_for("local")}
        yield results
    finally:
        # Everything is cleaned up whatever fails; what failed is reported after.
        problems = []
        try:
            if world.wrap:
                cleanup = subprocess.run(
                    world.wrap + [sys.executable, "-c", CLEANUP_LOCAL],
                    env=world.env, capture_output=True, text=True, timeout=300,
                )
                if cleanup.returncode != 0:
                    problems.append(f"deleting pools and sandboxes failed: {cleanup.stdout}{cleanup.stderr}")
                # Deleted sandboxes leave no process behind (the hub's own are not
                # sandboxes: they carry the marker).
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while (left := sandbox_processes(tmp, world)) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if left:
                    problems.append(f"processes of deleted sandboxes still run: {left}")
        finally:
            world.stop_processes()
            kill_leftovers(str(tmp), home / ".local/share/sandhub")
            if pypi is not None:
                pypi.__exit__(None, None, None)
            holder.kill()
            holder.wait()
            remove_tmp(tmp)
        assert not problems, "\n".join(problems)


def sandbox_processes(tmp: Path, world: World) -> list[int]:
    """Processes with this test's directory mounted, less the blocks' own and their
    children: the hub's spare `__sandbox-init`, which waits for its next launch with an
    empty environment (so no marker), is the hub's child, and a sandbox's processes
    never are (its first process exits once it has forked the sandbox's shim)."""
    own = set(world.processes())
    return sorted(p for p in set(pids_with_mount(str(tmp))) - own if parent(p) not in own)


def parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), None)


LOCAL_IDS = [run.id for run, _ in blocks_for("local")]


@pytest.mark.parametrize("block_id", LOCAL_IDS)
def test_local_block(block_id: str, local_results: dict[str, Result]) -> None:
    result = local_results[block_id]
    run = next(r for r, b in blocks_for("local") if r.id == block_id)
    check(result, run)
    if block_id == "quick-tour":
        # `sandhub cp "$id":a.txt ./a.txt` wrote here.
        assert (result.log.parent / "work" / "a.txt").read_text() == "hi\n"
        # pip's wheel came from the stand-in index, through the sandbox's gateway.
        seen = (result.log.parent / "pypi" / "requests.log").read_text()
        assert "pypi.org /simple/requests/" in seen and "/packages/requests-0.0.1" in seen, seen


def test_local_blocks_exist() -> None:
    assert {"quick-tour", "rest", "rl-loop"} <= set(LOCAL_IDS), LOCAL_IDS


# --------------------------------------------------------------------------- kubernetes


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["kubectl", *args], env=env, cwd=REPO_ROOT, input=input, capture_output=True, text=True,
        timeout=120,
    )


def manifest_without_crds(path: Path) -> str:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return yaml.safe_dump_all([d for d in docs if d.get("kind") != "CustomResourceDefinition"])


def test_kubernetes_block(tmp_path: Path) -> None:
    blocks = blocks_for("kubernetes")
    assert len(blocks) == 1, blocks
    run, block = blocks[0]
    kubeconfig = cluster_kubeconfig()
    need_tools("openssl")
    k8s = k8s_bin()
    need(os.access(k8s / "kubectl", os.X_OK), f"kubectl not found in {k8s} (bash dev/k8s/build-bins.sh)")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    shutil.copy(kubeconfig, home / ".kube" / "config")
    bins = bin_dir(tmp_path, ["sandhub", "sandhub-controller"])
    port = free_port()
    env = {
        "PATH": f"{bins}:{k8s}:{SYSTEM_PATH}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "SANDHUB_LISTEN": f"{LOOPBACK}:{port}",
    }
    examples = [REPO_ROOT / "docs/examples/kubernetes" / f for f in ("sandbox-warmpool.yaml", "sandbox-template.yaml")]
    cleanup_args = [a for f in examples for a in ("-f", str(f))]
    # A run that died before its cleanup may have left the Secret (create would refuse it).
    kubectl(env, "delete", "secret", "sandboxd-token-key", "-n", "agent-sandbox-system", "--ignore-not-found")
    world = World(tmp_path, REPO_ROOT, env)
    proc, log = world.start(block, run.id)
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        pools = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(
                    f"README.md:{block.line} ({run.id}) exited with {proc.returncode} instead of "
                    f"serving:\n{log.read_text(errors='replace')[-6000:]}", pytrace=False,
                )
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                    if r.status == 200:
                        with urllib.request.urlopen(f"{url}/v1/pools", timeout=30) as p:
                            pools = json.load(p)
                        break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        assert pools is not None, (
            f"the hub of README.md:{block.line} did not answer /readyz in {BLOCK_TIMEOUT_S}s:\n"
            + log.read_text(errors="replace")[-6000:]
        )
        # The README's template and warm pool, seen by the hub it started.
        assert [(p["name"], p["template"]) for p in pools["pools"]] == [("default", "default")], pools
        assert proc.poll() is None, "the hub stopped after answering"
        # The controller's Secret and the hub's file hold one key: each Pod's sandboxd
        # token derives from it on both sides.
        got = kubectl(env, "get", "secret", "sandboxd-token-key", "-n", "agent-sandbox-system", "-o", "json")
        assert got.returncode == 0, got.stderr
        key_file = home / ".config/sandhub/sandboxd-token.key"
        assert base64.b64decode(json.loads(got.stdout)["data"]["key"]) == key_file.read_bytes()
        assert key_file.stat().st_mode & 0o077 == 0, "the key file is readable by others"
        # Commands a comment offers instead (`# or: kubectl apply ...`) must work too.
        alternatives = re.findall(r"#\s*or:\s*(\S.*?)\s*$", block.text, re.M)
        for alt in alternatives:
            out = subprocess.run(["bash", "-c", "set -euo pipefail\n" + alt], cwd=REPO_ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, f"`{alt}` (README.md:{block.line}) failed:\n{out.stdout}{out.stderr}"
    finally:
        world.stop_processes()
        print(f"--- block output ---\n{log.read_text(errors='replace')[-6000:]}")
        for args in (
            ("delete", "--ignore-not-found", "--wait=false", *cleanup_args),
            ("delete", "secret", "sandboxd-token-key", "-n", "agent-sandbox-system", "--ignore-not-found"),
        ):
            kubectl(env, *args)
        kubectl(env, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                input=manifest_without_crds(REPO_ROOT / "deploy/sandbox-with-extensions.yaml"))


# --------------------------------------------------------------------------- test cluster


def test_test_cluster_block(tmp_path: Path) -> None:
    blocks = blocks_for("cluster")
    assert len(blocks) == 1, blocks
    run, block = blocks[0]
    need(os.environ.get("SANDHUB_TEST_CLUSTER", "1") != "0",
         "SANDHUB_TEST_CLUSTER=0: no test clusters (and maybe no Kubernetes binaries)")
    need_root()
    need_tools("unshare", "mount")
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo/bin/cargo")
    need(os.access(cargo, os.X_OK), "cargo not found")
    # Built by test-deps.sh already; returns at once then.
    k8s_bin()
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {
        "PATH": f"{Path(cargo).parent}:{SYSTEM_PATH}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    for name in ("CARGO_TARGET_DIR", "SANDHUB_CACHE", "CARGO_HOME", "RUSTUP_HOME", "CARGO_INCREMENTAL"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    world = World(tmp_path, REPO_ROOT, env)
    # /tmp of the block is private_tmp: its /tmp/k8s is this test's alone. A clone that
    # itself lies under /tmp (as CI's may) is bound back at its own path inside it, or
    # the block's `dev/k8s/cluster.sh` would vanish with the old /tmp.
    repo = REPO_ROOT.resolve()
    inside = str(repo.relative_to("/tmp")) if repo.is_relative_to("/tmp") else ""
    world.wrap = [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c",
        'set -e; if [ -n "$1" ]; then mkdir -p "$0/$1"; mount --bind "$2" "$0/$1"; fi; '
        'mount --rbind "$0" /tmp; shift 2; exec "$@"',
        str(private_tmp), inside, str(repo),
    ]
    try:
        check(world.run(block, run.id), run)
    finally:
        # The block's own `down` did not run if an earlier line failed; the cluster's
        # PID files name what to stop.
        if (private_tmp / "k8s").is_dir():
            subprocess.run(["bash", str(REPO_ROOT / "dev/k8s/cluster.sh"), "down", str(private_tmp / "k8s")],
                           env=dict(os.environ, **env), capture_output=True, timeout=120)
        world.stop_processes()
