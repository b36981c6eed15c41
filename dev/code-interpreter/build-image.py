#!/usr/bin/env python3
"""Builds the code-interpreter image `sandhub/code-interpreter` as an OCI image layout (stdlib only).

    build-image.py --cache DIR [--python PYTHON3] [--out DIR] [--install]

What a sandbox of the image holds: the same recipe as dev/openhands/build-image.py, whose helpers
this script loads and reuses (CPython copied into /usr/local, bytecode `unchecked-hash`, the Debian
packages its libraries need with their closure, one uncompressed layer), with:
  - the pins below (ipykernel, numpy, pandas, matplotlib, bash_kernel and their dependencies)
    from the package index instead of the agent server: Python and bash kernels;
  - bash, dash and coreutils as the root packages;
  - /usr/bin/python3 -> /usr/local/bin/python3, so sandboxd's default `--code-python python3`
    finds it whatever PATH sandboxd itself was started with;
  - Env MPLBACKEND=Agg (headless plots for scripts; sandboxd starts kernels with matplotlib's
    inline backend, which renders through Agg into PNG results).
No Entrypoint or Cmd: sandboxd in the sandbox starts kernels on demand (`/code/contexts`).

Cached under DIR/code-interpreter/image-<key> (the key hashes this script, the OpenHands helpers,
the pins, the Python and the root packages' versions); a second run returns at once. The last line
of stdout is the JSON summary (layout, rootfs, ref, digest, size_mb, build_seconds).

--install imports the layout into the hub named by $SANDHUB_URL (with $SANDHUB_API_KEY) and puts
the `code-interpreter-v1` template (`{"image": REF, "entrypoint": []}`); by hand that is
`sandhub image import LAYOUT` and `PUT /v1/templates/code-interpreter-v1`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType

PINS = [
    "ipykernel==7.4.0", "numpy==2.5.5", "pandas==3.1.1", "matplotlib==3.11.2", "bash_kernel==0.10.0",
]
REF = "sandhub/code-interpreter:1"
TEMPLATE = "code-interpreter-v1"
ROOT_PACKAGES = ["bash", "dash", "coreutils", "libc6"]
HELPERS = Path(__file__).resolve().parents[1] / "openhands/build-image.py"


def log(msg: str) -> None:
    print(f"code-interpreter-image: {msg}", file=sys.stderr, flush=True)


def helpers() -> ModuleType:
    """dev/openhands/build-image.py as a module, set up for this image."""
    spec = importlib.util.spec_from_file_location("openhands_build_image", HELPERS)
    assert spec and spec.loader
    oh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oh)
    oh.REF = REF
    oh.ROOT_PACKAGES = ROOT_PACKAGES
    oh.ENV = [*oh.ENV, "MPLBACKEND=Agg"]
    oh.pip_install = pip_install
    return oh


def pip_install(root: Path, facts: dict[str, str]) -> None:
    """The pins into the image's Python, scripts pointed at /usr/local, bytecode compiled."""
    short = facts["short"]
    py = root / "usr/local/bin" / f"python{short}"
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/local/lib"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    log(f"pip install {' '.join(PINS)} into the image's Python")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                    "--only-binary", ":all:", "--no-warn-script-location", "--root-user-action=ignore", *PINS],
                   check=True, env=env, stdout=sys.stderr)
    for script in (root / "usr/local/bin").iterdir():
        if script.is_file() and not script.is_symlink():
            head = script.read_bytes()[:200]
            if head.startswith(b"#!") and str(root).encode() in head:
                data = script.read_bytes().replace(str(root / "usr/local").encode(), b"/usr/local", 1)
                script.write_bytes(data)
    log("compiling bytecode (unchecked-hash)")
    subprocess.run([str(py), "-m", "compileall", "-q", "-f", "-j0", "--invalidation-mode", "unchecked-hash",
                    "-s", str(root), "-p", "/", str(root / "usr/local/lib" / f"python{short}")],
                   check=False, env=env, stdout=subprocess.DEVNULL)
    check = "import ipykernel_launcher, numpy, pandas, matplotlib, matplotlib_inline, bash_kernel"
    subprocess.run([str(py), "-c", check], check=True, env=env, stdout=subprocess.DEVNULL)
    python3 = root / "usr/bin/python3"
    if not python3.exists():
        os.symlink(f"/usr/local/bin/python{short}", python3)


def cache_key(facts: dict[str, str], versions: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(HELPERS.read_bytes())
    h.update("\n".join(PINS).encode())
    h.update(f"{facts['prefix']}\n{facts['version']}\n".encode())
    for pkg in sorted(ROOT_PACKAGES):
        h.update(f"{pkg}={versions.get(pkg, '')}\n".encode())
    return h.hexdigest()[:16]


def build(oh: ModuleType, cache: Path, python: str) -> str:
    facts = oh.python_facts(python)
    versions, _ = oh.installed_packages()
    base = cache / "code-interpreter"
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"image-{cache_key(facts, versions)}"
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two checkouts sharing one cache build once
        summary_file = final / "summary.json"
        if not summary_file.is_file():
            started = time.monotonic()
            work = Path(tempfile.mkdtemp(prefix="build-", dir=base))
            try:
                root = work / "rootfs"
                root.mkdir()
                oh.build_rootfs(root, facts, [])
                summary = oh.write_layout(root, work / "layout")
                summary["build_seconds"] = round(time.monotonic() - started)
                summary["layout"] = str(final / "layout")
                summary["rootfs"] = str(final / "rootfs")
                (work / "summary.json").write_text(json.dumps(summary, sort_keys=True))
                work.rename(final)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
            for old in base.iterdir():
                if old != final and old.is_dir() and old.name.startswith(("image-", "build-")):
                    log(f"removing the old build {old.name}")
                    shutil.rmtree(old, ignore_errors=True)
            log(f"built {final} in {summary['build_seconds']} s")
        else:
            log(f"up to date: {final}")
        return summary_file.read_text()


def hub_call(method: str, path: str, body: bytes | Path, content_type: str) -> bytes:
    url = os.environ.get("SANDHUB_URL", "http://127.0.0.1:8080").rstrip("/") + path
    headers = {"Content-Type": content_type}
    key = os.environ.get("SANDHUB_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if isinstance(body, Path):
        headers["Content-Length"] = str(body.stat().st_size)
        with open(body, "rb") as f:
            req = urllib.request.Request(url, data=f, method=method, headers=headers)
            with urllib.request.urlopen(req, timeout=600) as r:
                return bytes(r.read())
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def install(layout: Path) -> None:
    """Imports the layout (tarred, as the hub takes it) and puts the template."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "layout.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in sorted(layout.iterdir()):
                tar.add(entry, arcname=entry.name)
        log(f"importing {REF} into {os.environ.get('SANDHUB_URL', 'http://127.0.0.1:8080')}")
        hub_call("POST", f"/v1/images/import?tag={REF}", archive, "application/x-tar")
    spec = {"image": REF, "entrypoint": [], "workdir": "/workspace"}
    hub_call("PUT", f"/v1/templates/{TEMPLATE}", json.dumps(spec).encode(), "application/json")
    log(f"template {TEMPLATE} set")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cache", default=os.environ.get("SANDHUB_CACHE", str(Path.home() / ".cache/sandhub")),
                    help="the cache directory ($SANDHUB_CACHE)")
    ap.add_argument("--python", default=os.environ.get("SANDHUB_CODE_INTERPRETER_PYTHON", ""),
                    help="the CPython (>= 3.12) copied into the image (default: dev/openhands's)")
    ap.add_argument("--out", help="also copy the layout here")
    ap.add_argument("--install", action="store_true",
                    help=f"import into $SANDHUB_URL and put the {TEMPLATE} template")
    args = ap.parse_args()
    oh = helpers()
    summary_text = build(oh, Path(args.cache), args.python or oh.DEFAULT_PYTHON)
    layout = Path(json.loads(summary_text)["layout"])
    if args.out:
        shutil.copytree(layout, args.out, dirs_exist_ok=True)
    if args.install:
        install(layout)
    print(summary_text)


if __name__ == "__main__":
    main()
