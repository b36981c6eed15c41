#!/usr/bin/env python3
"""Builds the OpenHands agent-server image as an OCI image layout directory (stdlib only).

    build-image.py --cache DIR [--python PYTHON3.12] [--out DIR]

What a sandbox of the image holds (one uncompressed layer, merged /usr like Debian 12):
  - CPython (3.12 or later: `--python`, default /root/.pyenv/versions/3.12.1/bin/python3.12)
    copied into /usr/local, as the official `python` images have it, without its test suite,
    static library and bytecode; `libpython3.x.so` is linked into the multiarch lib directory,
    so the loader finds it without the build's RUNPATH (which names the build machine's prefix);
  - openhands-agent-server, -tools and -sdk at the pins below, installed into that Python,
    all bytecode compiled `unchecked-hash` (the root is read-only: bytecode that had to be
    checked against source mtimes would be recompiled in memory at every start);
  - this machine's Debian packages that the agent server needs: bash, coreutils, git, tmux,
    procps, grep, sed, findutils, diffutils, plus every package owning a shared library that
    an ELF file of the Python tree links (found with `ldd`), each with its `Depends` closure,
    copied from the installed files (`dpkg -L`), without docs, manuals and locales;
  - /etc/passwd and /etc/group (root), the CA bundle, /tmp (1777), /root, /workspace.
Config: Env PATH, LANG=C.UTF-8, HOME=/root; WorkingDir /workspace; no Entrypoint or Cmd (the
adapter, `sandhub_openhands.SandhubWorkspace`, starts the server with a session key).

The layout is cached under DIR/openhands/image-<key>, the key being a hash of this file, the
pins, the Python's version and prefix, and the Debian package versions: a second run with the
same inputs prints the cached summary at once. Older builds are removed. The root filesystem it
was made from stays beside it as `rootfs/` (usable as a template's `root_fs`).
Prints a JSON summary on stdout's last line: {"layout", "rootfs", "ref", "digest", "size_mb"}.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Iterable

# cryptography 51 accepts only URL-safe base64 Fernet keys, and openhands-sdk 1.58.2 derives
# its key with standard base64 (`+` and `/` in about 3 keys of 4): every such server answers
# 500 on creating a conversation. 50.0.2 is the last release that takes both.
PINS = ["openhands-agent-server==1.58.2", "openhands-tools==1.58.2", "openhands-sdk==1.58.2",
        "cryptography==50.0.2"]
REF = "sandhub/openhands-agent-server:1.58.2"
DEFAULT_PYTHON = "/root/.pyenv/versions/3.12.1/bin/python3.12"
ROOT_PACKAGES = ["bash", "dash", "coreutils", "git", "tmux", "procps", "grep", "sed", "findutils",
                 "diffutils", "gzip", "tar", "libc6"]
# Package management, documentation and perl (git's porcelain scripts only): not needed to run
# the agent server, its terminal or `git status`/`git diff`.
SKIP_PACKAGES = {"dpkg", "debconf", "install-info", "git-man", "perl", "perl-modules-5.36",
                 "libperl5.36", "liberror-perl", "libc-bin", "libc-l10n", "locales"}
SKIP_PREFIXES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/lintian/",
                 "/usr/share/locale/", "/usr/share/bug/")
# Parts of a CPython prefix that nothing imports at run time.
PY_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
       "HOME=/root"]
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


def log(msg: str) -> None:
    print(f"openhands-image: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str]) -> str:
    out: str = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return out


# --------------------------------------------------------------------------- Debian packages


def installed_packages() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Installed package -> version, and virtual name -> the installed packages providing it."""
    versions: dict[str, str] = {}
    provides: dict[str, list[str]] = {}
    out = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Status}\t${Provides}\n"])
    for line in out.splitlines():
        name, version, status, prov = (line.split("\t") + ["", "", ""])[:4]
        if not status.endswith("installed") or "not-installed" in status:
            continue
        versions[name] = version
        for p in prov.split(","):
            p = p.strip().split(" ")[0]
            if p:
                provides.setdefault(p, []).append(name)
    return versions, provides


def depends_of(pkg: str) -> list[list[str]]:
    """The package's Pre-Depends and Depends, each an alternative group of bare names."""
    out = run(["dpkg-query", "-W", "-f", "${Pre-Depends}, ${Depends}", pkg])
    groups = []
    for group in out.split(","):
        names = [re.sub(r"\(.*?\)", "", alt).strip().split(":")[0] for alt in group.split("|")]
        names = [n for n in names if n]
        if names:
            groups.append(names)
    return groups


def closure(roots: Iterable[str], versions: dict[str, str], provides: dict[str, list[str]]) -> list[str]:
    """Every installed package `roots` need, through the first installed alternative of each group."""
    def resolve(name: str) -> str | None:
        if name in versions:
            return name
        return next(iter(provides.get(name, [])), None)

    seen: set[str] = set()
    todo = []
    for r in roots:
        real = resolve(r)
        if real is None:
            raise SystemExit(f"openhands-image: Debian package {r} is not installed (apt-get install {r})")
        todo.append(real)
    while todo:
        pkg = todo.pop()
        if pkg in seen or pkg in SKIP_PACKAGES:
            continue
        seen.add(pkg)
        for group in depends_of(pkg):
            chosen = next((p for p in map(resolve, group) if p), None)
            if chosen is not None and chosen not in seen:
                todo.append(chosen)
    return sorted(seen)


def canonical(path: str) -> str:
    """The path with its directory resolved on the host (merged /usr: /bin/x is /usr/bin/x)."""
    parent, name = os.path.split(path)
    return os.path.join(os.path.realpath(parent), name)


def copy_packages(packages: list[str], root: Path) -> int:
    """Copies the installed files of `packages` into `root`; returns how many files."""
    count = 0
    for pkg in packages:
        for path in run(["dpkg-query", "-L", pkg]).splitlines():
            if not path.startswith("/") or path == "/." or path.startswith(SKIP_PREFIXES):
                continue
            if not os.path.lexists(path):
                continue  # left out by dpkg's path-exclude
            dest = root / canonical(path).lstrip("/")
            if os.path.isdir(path) and not os.path.islink(path):
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(dest):
                continue
            if os.path.islink(path):
                target = os.readlink(path)
                if target.startswith("/etc/alternatives/"):
                    target = os.path.realpath(path)  # the alternatives system is not copied
                os.symlink(target, dest)
            else:
                shutil.copy2(path, dest)
            count += 1
    return count


def add_alternatives(root: Path) -> int:
    """The Debian alternatives (`awk`, `which`, `pager`...) whose chosen file was copied:
    maintainer scripts make those links, so `dpkg -L` does not list them."""
    count = 0
    db = Path("/var/lib/dpkg/alternatives")
    for entry in sorted(db.iterdir()) if db.is_dir() else []:
        lines = entry.read_text(errors="replace").splitlines()
        if len(lines) < 2 or not lines[1].startswith("/"):
            continue
        link = lines[1]
        target = os.path.realpath(link)
        dest = root / canonical(link).lstrip("/")
        if os.path.lexists(dest) or not (root / target.lstrip("/")).exists() or not dest.parent.is_dir():
            continue
        os.symlink(target, dest)
        count += 1
    return count


def packages_of_libs(libs: Iterable[str]) -> set[str]:
    """The installed packages owning these host library paths."""
    owners: set[str] = set()
    for lib in sorted(set(libs)):
        candidates = {lib, os.path.realpath(lib)}
        candidates |= {c.replace("/usr/lib/", "/lib/", 1) for c in list(candidates) if c.startswith("/usr/lib/")}
        candidates |= {"/usr" + c for c in list(candidates) if c.startswith("/lib")}
        for cand in sorted(candidates):
            r = subprocess.run(["dpkg-query", "-S", cand], capture_output=True, text=True)
            if r.returncode == 0:
                owners.add(r.stdout.split(":", 1)[0].split(",")[0].strip())
                break
        else:
            log(f"no package owns {lib}; skipped")
    return owners


def elf_files(top: Path) -> list[Path]:
    out = []
    for parent, _dirs, files in os.walk(top):
        for f in files:
            p = Path(parent, f)
            if p.is_symlink() or not p.is_file():
                continue
            with open(p, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def linked_libs(files: list[Path], inside: Path, env: dict[str, str]) -> set[str]:
    """Host libraries the ELF files link (ldd), outside `inside` (bundled ones are there already)."""
    libs: set[str] = set()
    for i in range(0, len(files), 200):
        r = subprocess.run(["ldd", *map(str, files[i:i + 200])], capture_output=True, text=True, env=env)
        for line in r.stdout.splitlines():
            m = re.match(r"\s*\S+ => (/\S+) \(", line) or re.match(r"\s*(/\S+) \(", line)
            if m and not m.group(1).startswith(str(inside)):
                libs.add(m.group(1))
    return libs


# --------------------------------------------------------------------------- Python


def python_facts(python: str) -> dict[str, str]:
    code = ("import sys, sysconfig; print(sys.prefix); print('%d.%d' % sys.version_info[:2]); "
            "print(sys.version); print(sysconfig.get_config_var('LDLIBRARY') or '')")
    prefix, short, version, ldlibrary = run([python, "-c", code]).splitlines()
    if tuple(map(int, short.split("."))) < (3, 12):
        raise SystemExit(f"openhands-image: {python} is Python {short}; the agent server needs >= 3.12")
    return {"prefix": prefix, "short": short, "version": version, "ldlibrary": ldlibrary}


def copy_python(facts: dict[str, str], dest: Path) -> None:
    """The Python prefix into `dest` (/usr/local of the image), without what is never imported."""
    src = Path(facts["prefix"])
    stdlib = f"python{facts['short']}"

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).relative_to(src)
        skip = {n for n in names if n == "__pycache__" or n.endswith(".a")}
        if rel == Path("lib") / stdlib:
            skip |= {n for n in names if n in PY_SKIP or n.startswith("config-")}
        if rel == Path("lib") / stdlib / "lib-dynload":
            skip |= {n for n in names if n.startswith("_tkinter")}  # would pull in Tk and X11
        if rel == Path("bin"):
            skip |= {n for n in names if not n.startswith("python")}
        if rel == Path("."):
            skip |= {n for n in names if n in {"share", "include"}}
        return skip

    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def pip_install(root: Path, facts: dict[str, str]) -> None:
    short = facts["short"]
    py = root / "usr/local/bin" / f"python{short}"
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/local/lib"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    log(f"pip install {' '.join(PINS)} into the image's Python")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                    "--prefer-binary", "--no-warn-script-location", "--root-user-action=ignore", *PINS], check=True, env=env,
                   stdout=sys.stderr)
    # pip's own and the installed console scripts name the build path: point them at /usr/local.
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
    check = "import openhands.agent_server, openhands.tools.terminal, openhands.sdk"
    quiet = {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}
    subprocess.run([str(py), "-c", check], check=True, env=quiet, stdout=subprocess.DEVNULL)


# --------------------------------------------------------------------------- the root filesystem


def build_rootfs(root: Path, facts: dict[str, str], packages: list[str]) -> None:
    for top in ("bin", "sbin", "lib", "lib64"):
        host = Path("/", top)
        if host.is_symlink():
            os.symlink(os.readlink(host), root / top)
        else:
            (root / top).mkdir()
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "usr/local"):
        (root / d).mkdir(parents=True, exist_ok=True)
    log(f"copying Python {facts['short']} from {facts['prefix']}")
    copy_python(facts, root / "usr/local")
    multiarch = run(["gcc", "-print-multiarch"]).strip() if shutil.which("gcc") else "x86_64-linux-gnu"
    libdir = root / "usr/lib" / multiarch
    libdir.mkdir(parents=True, exist_ok=True)
    ld = facts["ldlibrary"]
    if ld.endswith(".so") or ".so." in ld:
        for so in (root / "usr/local/lib").glob(f"libpython{facts['short']}*.so*"):
            os.symlink(f"/usr/local/lib/{so.name}", libdir / so.name)
    pip_install(root, facts)
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/local/lib")}
    libs = linked_libs(elf_files(root / "usr/local"), root, env)
    versions, provides = installed_packages()
    roots = sorted(set(ROOT_PACKAGES) | packages_of_libs(libs))
    wanted = closure(roots, versions, provides)
    log(f"copying {len(wanted)} Debian packages: {' '.join(wanted)}")
    copy_packages(wanted, root)
    log(f"linked {add_alternatives(root)} alternatives")
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file():
        (etc / "ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copy2(bundle, etc / "ssl/certs/ca-certificates.crt")
    for d, mode in (("tmp", 0o1777), ("root", 0o700), ("workspace", 0o755), ("proc", 0o555),
                    ("dev", 0o755), ("sys", 0o555)):
        (root / d).mkdir(exist_ok=True)
        os.chmod(root / d, mode)


# --------------------------------------------------------------------------- the OCI layout


class Hashing:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def write_layer(root: Path, out: Path) -> tuple[str, int]:
    """The root filesystem as one uncompressed tar (sorted, numeric root owners, mtime kept)."""
    with open(out, "wb") as raw:
        h = Hashing(raw)
        with tarfile.open(fileobj=h, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for parent, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(dirs + files):
                    path = os.path.join(parent, name)
                    info = tar.gettarinfo(path, arcname=os.path.relpath(path, root))
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if info.isreg():
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
    return "sha256:" + h.sha.hexdigest(), h.size


def put_blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(data)
    return "sha256:" + digest, len(data)


def write_layout(root: Path, layout: Path) -> dict[str, object]:
    blobs = layout / "blobs/sha256"
    blobs.mkdir(parents=True)
    tmp_layer = blobs / "layer.tmp"
    log("writing the layer")
    layer_digest, layer_size = write_layer(root, tmp_layer)
    tmp_layer.rename(blobs / layer_digest.split(":", 1)[1])
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ENV, "WorkingDir": "/workspace"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }, sort_keys=True).encode()
    config_digest, config_size = put_blob(layout, config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size}],
    }, sort_keys=True).encode()
    manifest_digest, manifest_size = put_blob(layout, manifest)
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": manifest_size,
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": REF, "io.containerd.image.name": REF},
    }]}
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"ref": REF, "digest": manifest_digest, "size_mb": round(layer_size / 2**20)}


# --------------------------------------------------------------------------- main


def cache_key(facts: dict[str, str], versions: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update("\n".join(PINS).encode())
    h.update(f"{facts['prefix']}\n{facts['version']}\n".encode())
    for pkg in sorted(set(ROOT_PACKAGES)):
        h.update(f"{pkg}={versions.get(pkg, '')}\n".encode())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, help="the cache directory ($SANDHUB_CACHE)")
    ap.add_argument("--python", default=os.environ.get("SANDHUB_OPENHANDS_PYTHON", DEFAULT_PYTHON))
    ap.add_argument("--out", help="also copy the layout here")
    args = ap.parse_args()

    facts = python_facts(args.python)
    versions, _ = installed_packages()
    base = Path(args.cache) / "openhands"
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
                build_rootfs(root, facts, [])
                summary = write_layout(root, work / "layout")
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
        summary_text = summary_file.read_text()
    if args.out:
        shutil.copytree(final / "layout", args.out, dirs_exist_ok=True)
    print(summary_text)


if __name__ == "__main__":
    main()
