#!/usr/bin/env python3
"""Builds the image store benchmarks' OCI image layouts (stdlib only, reproducible).

    bench_image.py --cache DIR pull   [--layers 4] [--layer-mb 50]
    bench_image.py --cache DIR shared [--count 10] [--base-mb 30]

`pull`: one image, `bench/pull:1`, of LAYERS gzip layers of about LAYER_MB megabytes
(10^6 bytes) of gzip each: many files of varied sizes (70% of 1-64 KiB, 25% of
64 KiB-1 MiB, 5% of 1-8 MiB) in nested directories, plus a few symlinks. A file is
a mix of pseudo-random bytes (from a fixed seed; they do not compress) and slices of
a generated text corpus (they compress about 3x), so a layer's gzip is about 3/4 of
its tar: the layers neither compress to nothing nor are pure noise.

`shared`: COUNT layouts (`img-0` ... `img-<COUNT-1>`), image `bench/shared-<i>:1` in
each: the same base layer (about BASE_MB megabytes of gzip, built like a `pull`
layer) under a small top layer of its own (`/etc/bench-image` holding `<i>` and a
few small files). The base blob is one file hard-linked into every layout.

Layouts are cached under DIR/bench/<kind>-<key> (the key covers this file, the
arguments and zlib's version) and rebuilt only when that changes. Every byte is
reproducible: seeded content, sorted entries, mtime 0, owners 0:0, gzip mtime 0
and no file name. Prints a JSON summary on stdout (also summary.json in the
layout directory): {"layout"|"layouts", "ref"|"refs", "layers": [{"digest",
"size", "diff_id", "tar_size", "files"}], ...}.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tarfile
import zlib
from pathlib import Path

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"

MB = 1_000_000
KIB = 1024
MIB = 1024 * 1024
# A file's content comes in chunks of this size range; each is random bytes with
# this probability, else text.
CHUNK_MIN, CHUNK_MAX = 4 * KIB, 64 * KIB
RANDOM_SHARE = 0.6
FILES_PER_DIR = 24


def log(msg: str) -> None:
    print(f"bench-image: {msg}", file=sys.stderr, flush=True)


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- content


def corpus(rng: random.Random) -> bytes:
    """About 512 KiB of text lines made of a vocabulary of pseudo-words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(3000)]
    lines, size = [], 0
    while size < 512 * KIB:
        n = rng.randint(4, 14)
        line = " ".join(rng.choices(words, k=n)).capitalize() + ".\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def file_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.70:
        return rng.randint(1 * KIB, 64 * KIB)
    if r < 0.95:
        return rng.randint(64 * KIB, 1 * MIB)
    return rng.randint(1 * MIB, 8 * MIB)


def file_content(rng: random.Random, text: bytes, size: int) -> bytes:
    parts, left = [], size
    while left > 0:
        n = min(left, rng.randint(CHUNK_MIN, CHUNK_MAX))
        if rng.random() < RANDOM_SHARE:
            parts.append(rng.randbytes(n))
        else:
            start = rng.randrange(0, len(text) - n) if len(text) > n else 0
            parts.append(text[start : start + n])
        left -= n
    return b"".join(parts)


class HashingWriter:
    """A write-only file object: sha256 (the layer's diff_id) and size of the
    uncompressed tar, passed on to the gzip stream."""

    def __init__(self, out: gzip.GzipFile) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.uid, ti.gid, ti.mtime = kind, mode, 0, 0, 0
    ti.uname = ti.gname = ""
    return ti


def write_layer(blobs: Path, seed: str, target_gzip: int, extra: dict[str, bytes] | None = None) -> dict:
    """A layer of seeded files under /bench/<seed>/, added until its gzip reaches
    target_gzip bytes (plus `extra` files, path -> content, first); its descriptor
    and stats. The blob is written into blobs/ (sha256/<hex>)."""
    rng = random.Random(f"sandhub-bench-image/{seed}")
    text = corpus(rng)
    tmp = blobs / f".{seed.replace('/', '-')}.tmp"
    files = 0
    with tmp.open("wb") as raw:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
        hw = HashingWriter(gz)
        with tarfile.open(fileobj=hw, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            made: set[str] = set()

            def mkdirs(path: str) -> None:
                parts = path.split("/")
                for i in range(1, len(parts)):
                    d = "/".join(parts[:i])
                    if d not in made:
                        made.add(d)
                        tar.addfile(info(d, tarfile.DIRTYPE, 0o755))

            for path, data in sorted((extra or {}).items()):
                mkdirs(path)
                ti = info(path, tarfile.REGTYPE, 0o644)
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
                files += 1
            root = f"bench/{seed.replace('/', '-')}"
            n = 0
            while target_gzip > 0 and raw.tell() < target_gzip:
                d = f"{root}/d{n // (FILES_PER_DIR * 8):02d}/s{(n // FILES_PER_DIR) % 8}"
                size = file_size(rng)
                kind = "bin" if rng.random() < 0.5 else "txt"
                path = f"{d}/f{n:05d}.{kind}"
                mkdirs(path)
                ti = info(path, tarfile.REGTYPE, 0o755 if rng.random() < 0.1 else 0o644)
                data = file_content(rng, text, size)
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
                if n % 50 == 49:
                    link = info(f"{d}/link{n:05d}", tarfile.SYMTYPE, 0o777)
                    link.linkname = f"f{n:05d}.{kind}"
                    tar.addfile(link)
                n += 1
                files += 1
        gz.close()
    hex_digest = sha256_file(tmp)
    size = tmp.stat().st_size
    os.replace(tmp, blobs / hex_digest)
    return {
        "mediaType": MEDIA_LAYER_GZIP,
        "digest": f"sha256:{hex_digest}",
        "size": size,
        "diff_id": f"sha256:{hw.hash.hexdigest()}",
        "tar_size": hw.size,
        "files": files,
    }


# --------------------------------------------------------------------------- layouts


def blob(blobs: Path, data: bytes, media_type: str) -> dict:
    hex_digest = hashlib.sha256(data).hexdigest()
    (blobs / hex_digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{hex_digest}", "size": len(data)}


def finish_layout(root: Path, ref: str, layers: list[dict], note: str) -> dict:
    """config, manifest, index.json and oci-layout for one image of `layers`."""
    blobs = root / "blobs" / "sha256"
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"{note}: layer {i}"} for i in range(len(layers))],
    }
    config_desc = blob(blobs, canonical(config), MEDIA_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": [{k: layer[k] for k in ("mediaType", "digest", "size")} for layer in layers],
    }
    manifest_desc = blob(blobs, canonical(manifest), MEDIA_MANIFEST)
    entry = {**manifest_desc, "annotations": {REF_NAME: ref, CONTAINERD_NAME: ref}}
    (root / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    (root / "index.json").write_bytes(canonical({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [entry]}))
    return {"ref": ref, "manifest": manifest_desc["digest"], "config": config_desc["digest"], "layers": layers}


def build_pull(out: Path, layers: int, layer_mb: float) -> dict:
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    descs = []
    for i in range(layers):
        log(f"pull: layer {i + 1}/{layers} (~{layer_mb} MB of gzip)")
        descs.append(write_layer(blobs, f"pull/{i}", int(layer_mb * MB)))
    summary = finish_layout(out, "bench/pull:1", descs, "bench pull image")
    summary["layout"] = str(out)
    summary["compressed_bytes"] = sum(d["size"] for d in descs)
    summary["tar_bytes"] = sum(d["tar_size"] for d in descs)
    return summary


def build_shared(out: Path, count: int, base_mb: float) -> dict:
    out.mkdir(parents=True)
    base_dir = out / "base"
    base_dir.mkdir()
    log(f"shared: base layer (~{base_mb} MB of gzip)")
    base = write_layer(base_dir, "shared/base", int(base_mb * MB))
    base_hex = base["digest"].split(":", 1)[1]
    images = []
    for i in range(count):
        root = out / f"img-{i}"
        blobs = root / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        os.link(base_dir / base_hex, blobs / base_hex)
        rng = random.Random(f"sandhub-bench-image/shared/top/{i}")
        extra = {"etc/bench-image": f"{i}\n".encode()}
        for j in range(8):
            extra[f"srv/top-{i}/file{j}.txt"] = (f"image {i} file {j}\n".encode()) * rng.randint(16, 256)
        top = write_layer(blobs, f"shared/top/{i}", 0, extra)
        summary = finish_layout(root, f"bench/shared-{i}:1", [base, top], f"bench shared image {i}")
        summary["layout"] = str(root)
        images.append(summary)
    return {"base": base, "images": images, "layouts": [im["layout"] for im in images]}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, type=Path, help="$SANDHUB_CACHE/registry")
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("pull", help="one large multi-layer image")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--layer-mb", type=float, default=50.0)
    s = sub.add_parser("shared", help="COUNT images sharing a base layer")
    s.add_argument("--count", type=int, default=10)
    s.add_argument("--base-mb", type=float, default=30.0)
    args = ap.parse_args()

    params = (
        {"layers": args.layers, "layer_mb": args.layer_mb}
        if args.kind == "pull"
        else {"count": args.count, "base_mb": args.base_mb}
    )
    key_src = Path(__file__).read_bytes() + canonical(params) + zlib.ZLIB_RUNTIME_VERSION.encode()
    key = hashlib.sha256(key_src).hexdigest()[:16]
    bench = args.cache / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    out = bench / f"{args.kind}-{key}"
    with open(bench / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "summary.json").is_file():
            log(f"up to date: {out}")
        else:
            tmp = bench / f"{args.kind}-{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            if args.kind == "pull":
                summary = build_pull(tmp, args.layers, args.layer_mb)
            else:
                summary = build_shared(tmp, args.count, args.base_mb)
            text = json.dumps(summary, indent=2, sort_keys=True).replace(str(tmp), str(out))
            (tmp / "summary.json").write_text(text + "\n")
            os.replace(tmp, out)
            log(f"built {out}")
        # Older builds of the same kind (another key) are replaced, not kept.
        for old in bench.iterdir():
            if old.is_dir() and old.name.startswith(f"{args.kind}-") and old.name != out.name:
                shutil.rmtree(old, ignore_errors=True)
    print((out / "summary.json").read_text(), end="")


if __name__ == "__main__":
    main()
