"""A real OCI registry (CNCF distribution) on loopback, and the registry test images.

Both come from dev/registry/registry.sh: `build` (run by scripts/test-deps.sh) puts the
registry binary in $SANDHUB_CACHE/registry/bin, `build-test-image` the test images' OCI
layout in $SANDHUB_CACHE/registry/images (see dev/registry/README.md for what they hold).

    with Registry(tmp_path / "registry", auth=("alice", "s3cret")) as reg:
        reg.push(test_image_layout(), "sandhub/test:latest")
        status, headers, body = reg.get("/v2/sandhub/test/manifests/latest", accept=MEDIA_INDEX)

A missing registry binary skips the test locally and fails it under CI (`env.need`).
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from .env import REPO_ROOT, need
from .procs import tail

REGISTRY_SH = REPO_ROOT / "dev" / "registry" / "registry.sh"

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

TEST_IMAGE = "sandhub/test:latest"
"""The index (linux/amd64 python3 image + a tiny linux/arm64/v8 one) in the test layout."""
TEST_IMAGE_AMD64 = "sandhub/test:amd64"
"""The same linux/amd64 manifest, tagged directly (no index)."""
HOSTILE_IMAGES = ("hostile:dotdot", "hostile:abs", "hostile:symlink", "hostile:hardlink")
"""Single-layer images whose layer attacks the extractor (see dev/registry/README.md)."""

_UP_TIMEOUT_S = 90
_PUSH_TIMEOUT_S = 300
_BUILD_TIMEOUT_S = 1200


def sandhub_cache() -> Path:
    """$SANDHUB_CACHE, else ~/.cache/sandhub (as dev/registry/registry.sh)."""
    return Path(os.environ.get("SANDHUB_CACHE") or Path.home() / ".cache" / "sandhub")


def registry_binary() -> Path:
    """The registry binary; skips the test (fails it under CI) when it is not built."""
    path = sandhub_cache() / "registry" / "bin" / "registry"
    need(
        path.is_file() and os.access(path, os.X_OK),
        f"test registry not built at {path}: run `bash dev/registry/registry.sh build` "
        "(scripts/test-deps.sh does)",
    )
    return path


def _run(argv: list[str], timeout: float, what: str) -> str:
    """Runs registry.sh; its stdout, or the test fails with its stderr."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        pytest.fail(f"{what}: timed out after {timeout}s\n{stderr}", pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"{what} failed (exit {r.returncode}):\n{r.stderr}", pytrace=False)
    return r.stdout


class Registry:
    """One registry process on 127.0.0.1, with its state in `dir` (config.yml, data/,
    registry.log, pid, addr; made if missing). A context manager: started on enter, stopped on exit.
    Without `directory` it lives in a temporary directory removed by `stop()`."""

    def __init__(self, directory: Path | str | None = None, auth: tuple[str, str] | None = None) -> None:
        self._own_dir = directory is None
        self.dir: Path = Path(tempfile.mkdtemp(prefix="sandhub-registry-") if directory is None else directory)
        self.username: str | None = auth[0] if auth else None
        self.password: str | None = auth[1] if auth else None
        self.addr: str = ""  # 127.0.0.1:PORT once started

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Registry:
        """`registry.sh up`: returns once GET /v2/ answers (200, or 401 with auth)."""
        registry_binary()
        argv = ["bash", str(REGISTRY_SH), "up", str(self.dir)]
        if self.username is not None:
            argv += ["--auth", f"{self.username}:{self.password}"]
        out = _run(argv, _UP_TIMEOUT_S, f"registry.sh up {self.dir}")
        self.addr = (self.dir / "addr").read_text().strip()
        assert f"ADDR={self.addr}" in out, out
        return self

    def stop(self) -> None:
        """`registry.sh down` (idempotent); removes the directory if this object made it."""
        if self.dir.exists():
            subprocess.run(
                ["bash", str(REGISTRY_SH), "down", str(self.dir)],
                capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False,
            )
        self.addr = ""
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ use

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def host(self) -> str:
        return self.addr.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    @property
    def log_path(self) -> Path:
        return self.dir / "registry.log"

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def push(self, layout_dir: Path | str, target: str, ref: str | None = None) -> dict[str, Any]:
        """Pushes the image the layout's index.json names `ref` (default: `target`) to
        `target` (REPO:TAG), with this registry's credentials. Returns push.py's summary:
        {"ref", "digest", "mediaType", "size", "pushed_blobs", "skipped_blobs"}."""
        argv = ["bash", str(REGISTRY_SH), "push", str(self.dir), str(layout_dir), target]
        if ref:
            argv += ["--ref", ref]
        if self.username is not None:
            argv += ["--auth", f"{self.username}:{self.password}"]
        out = _run(argv, _PUSH_TIMEOUT_S, f"push {layout_dir} -> {self.addr}/{target}")
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return summary

    def push_test_images(self) -> dict[str, dict[str, Any]]:
        """Pushes every reference of the test layout under its own name; ref -> summary."""
        layout = test_image_layout()
        return {ref: self.push(layout, ref) for ref in test_image_summary()["refs"]}

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        auth: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """A raw HTTP request to the registry (with Basic auth when it has credentials
        and `auth`). Returns (status, lower-cased headers, body)."""
        hdrs = dict(headers or {})
        if auth and self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            hdrs["Authorization"] = f"Basic {token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def get(self, path: str, accept: str | None = None, auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        """GET `path` (e.g. /v2/<repo>/manifests/<tag>), optionally with an Accept header."""
        return self.request("GET", path, headers={"Accept": accept} if accept else None, auth=auth)


@functools.cache
def _build_test_image() -> dict[str, Any]:
    need(
        all(shutil.which(t) for t in ("apt-get", "apt-cache", "dpkg-deb")),
        "the registry test image is built from Debian packages: apt-get, apt-cache and dpkg-deb are needed",
    )
    out = _run(["bash", str(REGISTRY_SH), "build-test-image"], _BUILD_TIMEOUT_S, "registry.sh build-test-image")
    built: dict[str, Any] = json.loads(out)
    return built


def test_image_layout() -> Path:
    """The test images' OCI layout directory (built once, then cached in
    $SANDHUB_CACHE/registry/images; shared: do not modify it, copy it first)."""
    return Path(_build_test_image()["layout"])


def test_image_summary() -> dict[str, Any]:
    """The layout's summary: {"layout", "packages": {name: version}, "refs": {ref:
    {"mediaType", "digest", "size"}}, "manifests": {digest: {"platform", "config",
    "layers": [{"digest", "size", "diff_id"}]}}}."""
    return _build_test_image()


# Not tests, despite the names (a test module that imports them must not collect them).
test_image_layout.__test__ = False  # type: ignore[attr-defined]
test_image_summary.__test__ = False  # type: ignore[attr-defined]
