#!/usr/bin/env python3
"""Push one image (manifest or image index) of an OCI image layout to a registry (stdlib only).

    push.py --addr HOST:PORT --layout DIR --target REPO:TAG [--ref NAME] [--auth USER:PASS]

The layout's index.json entry pushed is the one whose `org.opencontainers.image.ref.name`
annotation is NAME (default: REPO:TAG, then TAG; a layout with a single entry needs none).
Uses the registry v2 HTTP API over plain http: blobs are uploaded monolithically (POST then
PUT ?digest=) unless a HEAD finds them, the children of an index are PUT by digest before
the index, and the top manifest is PUT under the tag with its own media type as
Content-Type. A 401 with a Basic challenge is answered with --auth (no bearer tokens).
Prints {"ref", "digest", "mediaType", "size", "pushed_blobs", "skipped_blobs"} as JSON.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import sys
import urllib.parse
from pathlib import Path
from typing import BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (MEDIA_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (MEDIA_MANIFEST, DOCKER_MANIFEST)
REF_NAME = "org.opencontainers.image.ref.name"


class PushError(Exception):
    pass


class Registry:
    """A v2 API client for one repository on http://HOST:PORT."""

    def __init__(self, addr: str, repo: str, auth: str | None) -> None:
        self.addr, self.repo = addr, repo
        self.basic = "Basic " + base64.b64encode(auth.encode()).decode() if auth else None
        self.send_auth = False  # set after the first 401 with a Basic challenge
        self.pushed: list[str] = []
        self.skipped: list[str] = []

    def request(
        self, method: str, path: str, body: bytes | BinaryIO | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        for _ in range(2):
            hdrs = dict(headers or {})
            if self.send_auth and self.basic:
                hdrs["Authorization"] = self.basic
            if body is not None:
                hdrs.setdefault("Content-Type", "application/octet-stream")
            if hasattr(body, "seek"):
                body.seek(0)  # type: ignore[union-attr]
            conn = http.client.HTTPConnection(self.addr, timeout=120)
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                status, rh = resp.status, {k.lower(): v for k, v in resp.getheaders()}
            finally:
                conn.close()
            if status == 401 and self.send_auth:
                raise PushError(f"{method} {path}: 401: the registry rejected the credentials ({data[:200]!r})")
            if status == 401:
                challenge = rh.get("www-authenticate", "")
                if not self.basic:
                    raise PushError(f"{method} {path}: 401 ({challenge}) and no --auth given")
                if not challenge.lower().startswith("basic"):
                    raise PushError(f"{method} {path}: 401 with a non-Basic challenge ({challenge}): unsupported")
                self.send_auth = True
                continue
            return status, rh, data
        raise AssertionError("unreachable: the second attempt returns or raises")

    def blob(self, layout: Path, desc: dict) -> None:
        digest = desc["digest"]
        path = blob_path(layout, digest)
        status, _, _ = self.request("HEAD", f"/v2/{self.repo}/blobs/{digest}")
        if status == 200:
            self.skipped.append(digest)
            return
        status, headers, data = self.request("POST", f"/v2/{self.repo}/blobs/uploads/")
        if status != 202 or "location" not in headers:
            raise PushError(f"starting the upload of {digest}: {status} {data[:300]!r}")
        loc = urllib.parse.urlsplit(headers["location"])
        query = (loc.query + "&" if loc.query else "") + urllib.parse.urlencode({"digest": digest})
        target = urllib.parse.urlunsplit(("", "", loc.path, query, ""))
        size = path.stat().st_size
        if size != desc["size"]:
            raise PushError(f"{path}: {size} bytes, the descriptor says {desc['size']}")
        with path.open("rb") as f:
            status, _, data = self.request("PUT", target, body=f, headers={"Content-Length": str(size)})
        if status != 201:
            raise PushError(f"uploading {digest}: {status} {data[:300]!r}")
        self.pushed.append(digest)

    def manifest(self, reference: str, media_type: str, data: bytes) -> str:
        status, headers, body = self.request(
            "PUT", f"/v2/{self.repo}/manifests/{reference}", body=data, headers={"Content-Type": media_type}
        )
        if status != 201:
            raise PushError(f"PUT manifest {self.repo}:{reference}: {status} {body[:500]!r}")
        return headers.get("docker-content-digest", "")


def blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexpart = digest.partition(":")
    return layout / "blobs" / algo / hexpart


def read_verified(layout: Path, desc: dict) -> bytes:
    data = blob_path(layout, desc["digest"]).read_bytes()
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != desc["digest"]:
        raise PushError(f"blob {desc['digest']} in {layout} has digest {actual}")
    return data


def push_manifest(reg: Registry, layout: Path, desc: dict, reference: str) -> str:
    """Pushes a manifest (its blobs first) or an index (its manifests first, by digest)."""
    data = read_verified(layout, desc)
    doc = json.loads(data)
    media_type = doc.get("mediaType") or desc["mediaType"]
    if media_type in INDEX_TYPES:
        for child in doc["manifests"]:
            push_manifest(reg, layout, child, child["digest"])
    elif media_type in MANIFEST_TYPES:
        for blob in [doc["config"], *doc["layers"]]:
            reg.blob(layout, blob)
    else:
        raise PushError(f"{desc['digest']}: unsupported media type {media_type}")
    got = reg.manifest(reference, media_type, data)
    if got and got != desc["digest"]:
        raise PushError(f"the registry computed {got} for {desc['digest']}")
    return media_type


def select(layout: Path, target: str, ref: str | None) -> dict:
    index = json.loads((layout / "index.json").read_text())
    entries = index.get("manifests", [])
    names = [ref] if ref else [target, target.rsplit(":", 1)[-1]]
    for name in names:
        for entry in entries:
            if entry.get("annotations", {}).get(REF_NAME) == name:
                return entry
    if not ref and len(entries) == 1:
        return entries[0]
    known = [e.get("annotations", {}).get(REF_NAME) for e in entries]
    raise PushError(f"{layout}/index.json has no entry named {' or '.join(names)} (it has {known})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", required=True, help="HOST:PORT of the registry (plain http)")
    ap.add_argument("--layout", required=True, type=Path)
    ap.add_argument("--target", required=True, help="REPO:TAG to push to")
    ap.add_argument("--ref", help="the layout's ref.name to push (default: the target)")
    ap.add_argument("--auth", help="USER:PASS for Basic auth")
    args = ap.parse_args()

    repo, sep, tag = args.target.rpartition(":")
    if not sep or not repo or "/" in tag:
        raise SystemExit(f"push: target must be REPO:TAG, not {args.target!r}")
    try:
        desc = select(args.layout, args.target, args.ref)
        reg = Registry(args.addr, repo, args.auth)
        media_type = push_manifest(reg, args.layout, desc, tag)
    except (PushError, OSError, KeyError, ValueError) as e:
        print(f"push: {e}", file=sys.stderr)
        sys.exit(1)
    print(
        json.dumps(
            {
                "ref": args.target,
                "digest": desc["digest"],
                "mediaType": media_type,
                "size": desc["size"],
                "pushed_blobs": len(reg.pushed),
                "skipped_blobs": len(reg.skipped),
            }
        )
    )


if __name__ == "__main__":
    main()
