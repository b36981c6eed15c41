#!/usr/bin/env python3
"""Builds the registry test images as one OCI image layout directory (stdlib only).

    test_image.py --cache DIR [--out DIR]

The layout (cached under DIR/images/<key>, rebuilt only when this file or the Debian
package versions change) holds these references (index.json annotation
`org.opencontainers.image.ref.name`, also `io.containerd.image.name`):

  sandhub/test:latest    an image INDEX: linux/amd64 (the python3 image below) and a tiny
                         linux/arm64/v8 image (one layer: /arch containing "arm64\\n")
  sandhub/test:amd64     the linux/amd64 manifest of that index, directly (no index)
  hostile:dotdot         one layer with `../escape`
  hostile:abs            one layer with `/abs-escape`
  hostile:symlink        one layer with `link -> /tmp`, then `link/pwned`
  hostile:hardlink       one layer with a hard link `passwd` to `/etc/passwd`

The amd64 image has three gzip layers, from Debian packages fetched with `apt-get
download` (merged-/usr: /bin, /sbin, /lib, /lib64 are symlinks into /usr):
  1 base   libc6 (+ its dependencies) and busybox-static, an applet symlink per command
           (/bin/sh -> busybox, ls, cat, id, stat, ...); /etc/passwd and /etc/group (root,
           app 1000:1000); /etc/hidden-by-upper ("lower\\n"); /opt/opaque/old ("old\\n");
           /tmp (1777), /root (0700), /home/app (1000:1000).
  2 python python3-minimal and its dependency closure (minus layer 1's packages).
  3 upper  whiteout etc/.wh.hidden-by-upper; opaque opt/opaque/.wh..wh..opq plus
           opt/opaque/new ("new\\n"); /root-owned (0:0, 0600, "root only\\n");
           /home/app/mine (1000:1000, 0644, "mine\\n"); /srv/work (directory).
Config: Env PATH=... and SANDHUB_IMAGE_MARK=from-image, WorkingDir /srv/work, Cmd
["/bin/sh"]; rootfs.diff_ids are the sha256 of each uncompressed layer.

Everything is reproducible: sorted entries, mtime 0, numeric owners, gzip mtime 0.
Prints a JSON summary (refs -> digests, manifests -> layers) on stdout; the same
summary is kept in the layout as summary.json.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
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
from dataclasses import dataclass
from pathlib import Path

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARK_ENV = "SANDHUB_IMAGE_MARK=from-image"
TEST_REPO = "sandhub/test"

BASE_ROOTS = ["libc6", "busybox-static"]
PYTHON_ROOTS = ["python3-minimal"]
# Dependencies that only serve package management (maintainer scripts), never python3 -c.
SKIP_PACKAGES = {"dpkg", "debconf", "tar", "perl-base", "install-info"}
# Not needed to run anything: kept out to keep the layers small.
SKIP_PREFIXES = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/")
USRMERGE = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

PASSWD = b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"
GROUP = b"root:x:0:\napp:x:1000:\n"


def log(msg: str) -> None:
    print(f"test-image: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- layer entries


@dataclass
class Entry:
    """One tar entry: kind is dir, file, symlink or hardlink."""

    kind: str
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    data: bytes = b""
    source: Path | None = None  # a file's content on disk (read when the tar is written)
    link: str = ""


Layer = dict[str, Entry]  # archive path (no leading "./") -> entry


def add(layer: Layer, path: str, entry: Entry) -> None:
    """Adds an entry and any missing parent directories (root-owned, 0755)."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        layer.setdefault(parent, Entry("dir"))
    layer[path] = entry


def write_tar(layer: Layer) -> bytes:
    """The layer as an uncompressed tar: entries sorted, mtime 0, numeric owners."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layer):
            e = layer[path]
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid, info.mtime = e.mode, e.uid, e.gid, 0
            info.uname = info.gname = ""
            if e.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            elif e.kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, e.link
                tar.addfile(info)
            else:
                data = e.source.read_bytes() if e.source is not None else e.data
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def raw_tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """A tar of hand-made entries written as given (order and names untouched)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.mtime, info.uname, info.gname = 0, "", ""
            info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buf.getvalue()


# --------------------------------------------------------------------------- Debian packages


def sudo() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo"]
    return []


_updated = False


def apt_update() -> None:
    global _updated
    if _updated:
        return
    _updated = True
    log("apt-get update (the package lists do not know a package we need)")
    subprocess.run([*sudo(), "apt-get", "update", "-qq"], check=True, stdout=sys.stderr)


def apt_show(name: str) -> dict[str, str]:
    """The candidate version's control fields (`apt-cache show --no-all-versions`)."""
    for attempt in range(2):
        r = subprocess.run(["apt-cache", "show", "--no-all-versions", name], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            fields: dict[str, str] = {}
            key = ""
            for line in r.stdout.split("\n\n", 1)[0].splitlines():
                if line.startswith((" ", "\t")) and key:
                    fields[key] += "\n" + line.strip()
                elif ":" in line:
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            return fields
        if attempt == 0:
            apt_update()
    raise SystemExit(f"test-image: apt-cache knows no package {name!r}: {r.stderr.strip()}")


def dep_names(fields: dict[str, str]) -> list[str]:
    """First alternative of each Depends / Pre-Depends, without versions or :arch."""
    names = []
    for key in ("Pre-Depends", "Depends"):
        for clause in fields.get(key, "").split(","):
            first = clause.split("|")[0].strip()
            if first:
                names.append(re.split(r"[\s(:]", first, maxsplit=1)[0])
    return names


def closure(roots: list[str], exclude: set[str]) -> dict[str, dict[str, str]]:
    """Package name -> control fields, for the roots and everything they depend on."""
    found: dict[str, dict[str, str]] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or name in exclude or name in SKIP_PACKAGES:
            continue
        fields = apt_show(name)
        found[name] = fields
        todo.extend(dep_names(fields))
    return found


def deb_file(debs: Path, name: str, fields: dict[str, str]) -> Path:
    """The package's .deb in the cache, fetched with `apt-get download` when missing."""
    version, arch = fields["Version"], fields["Architecture"]
    path = debs / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
    if path.is_file():
        return path
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        for attempt in range(2):
            r = subprocess.run(
                ["apt-get", "download", "-qq", f"{name}={version}"], cwd=tmp, capture_output=True, text=True
            )
            got = list(Path(tmp).glob("*.deb"))
            if r.returncode == 0 and got:
                os.replace(got[0], path)
                return path
            if attempt == 0:
                apt_update()
        raise SystemExit(f"test-image: apt-get download {name}={version} failed: {r.stderr.strip()}")


def deb_layer(layer: Layer, deb: Path, scratch: Path) -> None:
    """Adds a package's files (dpkg-deb -x), moving /bin, /lib... under /usr (merged-usr)."""
    root = scratch / deb.name
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    seen: dict[tuple[int, int], str] = {}
    for parent, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            full = Path(parent) / name
            rel = full.relative_to(root).as_posix()
            top, _, rest = rel.partition("/")
            if top in USRMERGE:
                rel = f"usr/{top}" + (f"/{rest}" if rest else "")
            if rel.startswith(SKIP_PREFIXES) or rel + "/" in SKIP_PREFIXES:
                continue
            st = full.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                add(layer, rel, Entry("dir", mode))
            elif stat.S_ISLNK(st.st_mode):
                add(layer, rel, Entry("symlink", 0o777, link=os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in seen:
                    add(layer, rel, Entry("hardlink", mode, link=seen[key]))
                else:
                    seen[key] = rel
                    add(layer, rel, Entry("file", mode, source=full))
            else:
                raise SystemExit(f"test-image: {deb.name}: unexpected file type at {rel}")


# --------------------------------------------------------------------------- layers


def base_layer(pkgs: dict[str, Path], scratch: Path) -> Layer:
    layer: Layer = {}
    for top in ("bin", "sbin", "lib", "lib64"):
        layer[top] = Entry("symlink", 0o777, link=f"usr/{top}")
        layer[f"usr/{top}"] = Entry("dir")
    for deb in pkgs.values():
        deb_layer(layer, deb, scratch)
    busybox = next((p for p in ("usr/bin/busybox", "usr/sbin/busybox") if p in layer), None)
    if busybox is None or layer[busybox].source is None:
        raise SystemExit("test-image: busybox-static did not provide /bin/busybox")
    applets = subprocess.run([str(layer[busybox].source), "--list"], check=True, capture_output=True, text=True)
    for applet in applets.stdout.split():
        path = f"usr/bin/{applet}"
        if path not in layer and f"usr/sbin/{applet}" not in layer:
            layer[path] = Entry("symlink", 0o777, link="busybox" if busybox == "usr/bin/busybox" else f"/{busybox}")
    for path in ("bin/sh", "bin/ls", "bin/cat", "bin/id", "bin/stat"):
        if f"usr/{path}" not in layer:
            raise SystemExit(f"test-image: busybox has no applet for /{path}")
    add(layer, "etc/passwd", Entry("file", 0o644, data=PASSWD))
    add(layer, "etc/group", Entry("file", 0o644, data=GROUP))
    add(layer, "etc/hidden-by-upper", Entry("file", 0o644, data=b"lower\n"))
    add(layer, "opt/opaque/old", Entry("file", 0o644, data=b"old\n"))
    add(layer, "tmp", Entry("dir", 0o1777))
    add(layer, "root", Entry("dir", 0o700))
    add(layer, "home/app", Entry("dir", 0o755, 1000, 1000))
    return layer


def python_layer(pkgs: dict[str, Path], scratch: Path) -> Layer:
    layer: Layer = {}
    for deb in pkgs.values():
        deb_layer(layer, deb, scratch)
    if "usr/bin/python3" not in layer:
        raise SystemExit("test-image: python3-minimal did not provide /usr/bin/python3")
    return layer


def upper_layer() -> Layer:
    layer: Layer = {}
    add(layer, "etc/.wh.hidden-by-upper", Entry("file", 0o644))
    add(layer, "opt/opaque/.wh..wh..opq", Entry("file", 0o644))
    add(layer, "opt/opaque/new", Entry("file", 0o644, data=b"new\n"))
    add(layer, "root-owned", Entry("file", 0o600, 0, 0, data=b"root only\n"))
    add(layer, "home/app", Entry("dir", 0o755, 1000, 1000))
    add(layer, "home/app/mine", Entry("file", 0o644, 1000, 1000, data=b"mine\n"))
    add(layer, "srv/work", Entry("dir", 0o755))
    return layer


def arm64_layer() -> Layer:
    layer: Layer = {}
    add(layer, "arch", Entry("file", 0o644, data=b"arm64\n"))
    return layer


def hostile_layers() -> dict[str, bytes]:
    """Tag -> an uncompressed single-layer tar carrying one attack (plus a harmless `ok`)."""

    def reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
        info = tarfile.TarInfo(name)
        info.mode = 0o644
        return info, data

    def special(name: str, kind: bytes, target: str, mode: int = 0o777) -> tuple[tarfile.TarInfo, bytes]:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = kind, target, mode
        return info, b""

    ok = reg("ok", b"harmless\n")
    return {
        "dotdot": raw_tar([ok, reg("../escape", b"escaped via ..\n")]),
        "abs": raw_tar([ok, reg("/abs-escape", b"escaped via an absolute path\n")]),
        "symlink": raw_tar([ok, special("link", tarfile.SYMTYPE, "/tmp"), reg("link/pwned", b"pwned\n")]),
        "hardlink": raw_tar([ok, special("passwd", tarfile.LNKTYPE, "/etc/passwd", 0o644)]),
    }


# --------------------------------------------------------------------------- OCI layout


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class LayoutWriter:
    """Writes blobs/sha256/<hex> and, at the end, oci-layout and index.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True)
        self.refs: list[dict] = []
        self.manifests: dict[str, dict] = {}

    def blob(self, data: bytes, media_type: str) -> dict:
        d = digest_of(data)
        (self.root / "blobs" / "sha256" / d.split(":", 1)[1]).write_bytes(data)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    def image(self, layers: list[tuple[bytes, str]], arch: str, variant: str | None = None) -> dict:
        """Layers (uncompressed tar, history text) -> the manifest's descriptor (with platform)."""
        layer_descs, diff_ids = [], []
        for tar, _ in layers:
            diff_ids.append(digest_of(tar))
            layer_descs.append(self.blob(gzip.compress(tar, compresslevel=6, mtime=0), MEDIA_LAYER_GZIP))
        platform = {"architecture": arch, "os": "linux"}
        if variant:
            platform["variant"] = variant
        config = {
            **platform,
            "created": "1970-01-01T00:00:00Z",
            "config": {"Env": [PATH_ENV, MARK_ENV], "Cmd": ["/bin/sh"], "WorkingDir": "/srv/work"},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": text} for _, text in layers],
        }
        config_desc = self.blob(canonical(config), MEDIA_CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config_desc,
            "layers": layer_descs,
        }
        desc = self.blob(canonical(manifest), MEDIA_MANIFEST)
        self.manifests[desc["digest"]] = {
            "platform": "/".join(filter(None, ["linux", arch, variant])),
            "config": config_desc["digest"],
            "layers": [
                {"digest": ld["digest"], "size": ld["size"], "diff_id": di} for ld, di in zip(layer_descs, diff_ids)
            ],
        }
        return {**desc, "platform": platform}

    def index(self, children: list[dict]) -> dict:
        index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": children}
        return self.blob(canonical(index), MEDIA_INDEX)

    def tag(self, ref: str, desc: dict) -> None:
        entry = {k: v for k, v in desc.items() if k != "platform"}
        entry["annotations"] = {REF_NAME: ref, CONTAINERD_NAME: ref}
        self.refs.append(entry)

    def finish(self, summary_extra: dict) -> dict:
        (self.root / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
        (self.root / "index.json").write_bytes(
            canonical({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": self.refs})
        )
        summary = {
            **summary_extra,
            "refs": {
                r["annotations"][REF_NAME]: {"mediaType": r["mediaType"], "digest": r["digest"], "size": r["size"]}
                for r in self.refs
            },
            "manifests": self.manifests,
        }
        (self.root / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return summary


def build(out: Path, base: dict[str, Path], python: dict[str, Path], versions: dict[str, str]) -> dict:
    w = LayoutWriter(out)
    with tempfile.TemporaryDirectory(prefix="sandhub-test-image-") as tmp:
        scratch = Path(tmp)
        log("layer 1: " + " ".join(sorted(base)))
        l1 = write_tar(base_layer(base, scratch))
        log("layer 2: " + " ".join(sorted(python)))
        l2 = write_tar(python_layer(python, scratch))
    l3 = write_tar(upper_layer())
    amd64 = w.image(
        [
            (l1, "base: " + " ".join(sorted(base)) + "; busybox applets, passwd/group, hidden-by-upper, opt/opaque/old"),
            (l2, "python: " + " ".join(sorted(python))),
            (l3, "upper: whiteout, opaque dir, root-owned, home/app/mine, srv/work"),
        ],
        "amd64",
    )
    arm64 = w.image([(write_tar(arm64_layer()), "arm64 marker: /arch")], "arm64", "v8")
    w.tag(f"{TEST_REPO}:latest", w.index([amd64, arm64]))
    w.tag(f"{TEST_REPO}:amd64", amd64)
    for name, tar in hostile_layers().items():
        w.tag(f"hostile:{name}", w.image([(tar, f"hostile layer: {name}")], "amd64"))
    return w.finish({"packages": versions})


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, type=Path, help="$SANDHUB_CACHE/registry")
    ap.add_argument("--out", type=Path, help="also copy the layout to this directory (replaced if a layout)")
    args = ap.parse_args()

    arch = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()
    if arch != "amd64":
        raise SystemExit(f"test-image: the test image is linux/amd64, built from this machine's packages ({arch})")

    base_fields = closure(BASE_ROOTS, set())
    python_fields = closure(PYTHON_ROOTS, set(base_fields))
    versions = {n: f["Version"] for n, f in sorted({**base_fields, **python_fields}.items())}
    key_src = Path(__file__).read_bytes() + canonical(versions) + zlib_version().encode()
    key = hashlib.sha256(key_src).hexdigest()[:16]

    images = args.cache / "images"
    images.mkdir(parents=True, exist_ok=True)
    layout = images / key
    with open(images / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (layout / "summary.json").is_file():
            log(f"up to date: {layout}")
        else:
            debs = args.cache / "debs"
            base = {n: deb_file(debs, n, f) for n, f in sorted(base_fields.items())}
            python = {n: deb_file(debs, n, f) for n, f in sorted(python_fields.items())}
            tmp = images / f"{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp, base, python, versions)
            os.replace(tmp, layout)
            log(f"built {layout}")
        (layout / "summary.json").touch()  # last used: builds unused for a week are removed
        for old in images.iterdir():
            summary_file = old / "summary.json"
            if old.name != key and old.is_dir() and (
                not summary_file.is_file() or time.time() - summary_file.stat().st_mtime > 7 * 86400
            ):
                shutil.rmtree(old, ignore_errors=True)
    summary = json.loads((layout / "summary.json").read_text())
    summary["layout"] = str(layout)

    if args.out:
        out = args.out.resolve()
        if out.exists() and any(out.iterdir()):
            if not (out / "oci-layout").is_file():
                raise SystemExit(f"test-image: {out} exists, is not empty and is not an OCI layout")
            shutil.rmtree(out)
        elif out.exists():
            out.rmdir()
        shutil.copytree(layout, out)
        summary["layout"] = str(out)
    print(json.dumps(summary, indent=2, sort_keys=True))


def zlib_version() -> str:
    import zlib

    return zlib.ZLIB_RUNTIME_VERSION


if __name__ == "__main__":
    main()
