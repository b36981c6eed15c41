#!/usr/bin/env python3
"""Write a single-layer OCI image layout archive from a root filesystem directory.

    oci_image.py --rootfs DIR --name REF --out FILE.tar [--entrypoint ARG ...] [--env K=V ...]

The archive is reproducible (sorted entries, mtime 0, owner root) and is what
`ctr images import` reads: oci-layout, index.json (with the image name annotation),
blobs/sha256/<layer, config, manifest>.
"""
import argparse
import hashlib
import io
import json
import os
import stat
import tarfile

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


def layer_tar(rootfs: str) -> bytes:
    """The rootfs as an uncompressed tar with stable ordering and metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for parent, dirs, files in os.walk(rootfs):
            dirs.sort()
            for entry in sorted(dirs + files):
                path = os.path.join(parent, entry)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def blob(data: bytes):
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = stat.S_IFREG | 0o644
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--name", required=True, help="image reference, e.g. sandhub/sandboxd:dev")
    ap.add_argument("--out", required=True)
    ap.add_argument("--entrypoint", nargs="+", default=[])
    ap.add_argument("--env", action="append", default=["PATH=/usr/local/bin:/usr/bin:/bin"])
    args = ap.parse_args()

    layer = layer_tar(args.rootfs)
    layer_digest, layer_size = blob(layer)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": args.entrypoint, "Env": args.env, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        },
        sort_keys=True,
    ).encode()
    config_digest, config_size = blob(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size}],
        },
        sort_keys=True,
    ).encode()
    manifest_digest, manifest_size = blob(manifest)
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": args.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()

    tmp = args.out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        add_file(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        for digest, data in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest)):
            add_file(tar, "blobs/sha256/" + digest.split(":", 1)[1], data)
        add_file(tar, "index.json", index)
    os.replace(tmp, args.out)
    print(f"{args.out} {args.name} {manifest_digest}")


if __name__ == "__main__":
    main()
