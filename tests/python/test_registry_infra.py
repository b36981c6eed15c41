"""The registry test infrastructure itself (dev/registry, sandhub_testing.registry): a real
CNCF distribution registry on loopback takes the test images and serves them back intact,
its htpasswd auth works, and the amd64 test image's layers, applied in order with their
whiteouts, make a root filesystem whose python3 runs.

Needs the registry binary (`bash dev/registry/registry.sh build`; scripts/test-deps.sh
builds it): skipped without it, failed under CI.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from sandhub_testing import Registry, test_image_layout, test_image_summary
from sandhub_testing.registry import (
    HOSTILE_IMAGES,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST,
    REGISTRY_SH,
    TEST_IMAGE,
    TEST_IMAGE_AMD64,
    registry_binary,
)

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry without auth holding every reference of the test layout."""
    registry_binary()
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        results = reg.push_test_images()
        assert set(results) == {TEST_IMAGE, TEST_IMAGE_AMD64, *HOSTILE_IMAGES}
        yield reg


def get_ok(reg: Registry, path: str, accept: str | None = None) -> tuple[dict[str, str], bytes]:
    status, headers, body = reg.get(path, accept=accept)
    assert status == 200, f"GET {path}: {status} {body[:300]!r}\n{reg.log_tail()}"
    return headers, body


def manifest(reg: Registry, repo: str, reference: str, accept: str) -> tuple[str, dict]:
    headers, body = get_ok(reg, f"/v2/{repo}/manifests/{reference}", accept)
    assert headers["docker-content-digest"] == sha256(body)
    return sha256(body), json.loads(body)


def blob(reg: Registry, repo: str, digest: str) -> bytes:
    _, body = get_ok(reg, f"/v2/{repo}/blobs/{digest}")
    assert sha256(body) == digest
    return body


# --------------------------------------------------------------------------- push and pull back


def test_index_and_manifests_come_back_with_their_digests(pushed: Registry) -> None:
    summary = test_image_summary()
    digest, index = manifest(pushed, "sandhub/test", "latest", MEDIA_INDEX)
    assert digest == summary["refs"][TEST_IMAGE]["digest"]
    assert index["mediaType"] == MEDIA_INDEX
    platforms = {
        "/".join(filter(None, [m["platform"]["os"], m["platform"]["architecture"], m["platform"].get("variant")])): m
        for m in index["manifests"]
    }
    assert set(platforms) == {"linux/amd64", "linux/arm64/v8"}

    amd64 = platforms["linux/amd64"]
    digest, doc = manifest(pushed, "sandhub/test", amd64["digest"], MEDIA_MANIFEST)
    assert digest == amd64["digest"] == summary["refs"][TEST_IMAGE_AMD64]["digest"]
    assert doc["mediaType"] == MEDIA_MANIFEST and doc["config"]["mediaType"] == MEDIA_CONFIG
    assert len(doc["layers"]) == 3
    assert {layer["mediaType"] for layer in doc["layers"]} == {MEDIA_LAYER_GZIP}

    config = json.loads(blob(pushed, "sandhub/test", doc["config"]["digest"]))
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert PATH_ENV in config["config"]["Env"]
    assert "SANDHUB_IMAGE_MARK=from-image" in config["config"]["Env"]
    assert config["config"]["WorkingDir"] == "/srv/work"
    assert config["config"]["Cmd"] == ["/bin/sh"]
    diff_ids = [sha256(gzip.decompress(blob(pushed, "sandhub/test", layer["digest"]))) for layer in doc["layers"]]
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    assert [layer["diff_id"] for layer in summary["manifests"][digest]["layers"]] == diff_ids

    # The tag of the bare amd64 manifest serves the same bytes.
    assert manifest(pushed, "sandhub/test", "amd64", MEDIA_MANIFEST)[0] == digest

    arm64 = platforms["linux/arm64/v8"]
    _, doc = manifest(pushed, "sandhub/test", arm64["digest"], MEDIA_MANIFEST)
    assert len(doc["layers"]) == 1
    config = json.loads(blob(pushed, "sandhub/test", doc["config"]["digest"]))
    assert (config["architecture"], config.get("variant")) == ("arm64", "v8")
    layer = tarfile.open(fileobj=io.BytesIO(blob(pushed, "sandhub/test", doc["layers"][0]["digest"])))
    assert layer.getnames() == ["arch"]
    assert layer.extractfile("arch").read() == b"arm64\n"  # type: ignore[union-attr]


def test_second_push_uploads_nothing(pushed: Registry) -> None:
    again = pushed.push(test_image_layout(), TEST_IMAGE)
    assert again["pushed_blobs"] == 0 and again["skipped_blobs"] > 0
    assert again["digest"] == test_image_summary()["refs"][TEST_IMAGE]["digest"]


@pytest.mark.parametrize(
    "ref, attack",
    [
        ("hostile:dotdot", {"../escape": tarfile.REGTYPE}),
        ("hostile:abs", {"/abs-escape": tarfile.REGTYPE}),
        ("hostile:symlink", {"link": tarfile.SYMTYPE, "link/pwned": tarfile.REGTYPE}),
        ("hostile:hardlink", {"passwd": tarfile.LNKTYPE}),
    ],
)
def test_hostile_images_carry_their_attack(pushed: Registry, ref: str, attack: dict[str, bytes]) -> None:
    repo, tag = ref.split(":")
    _, doc = manifest(pushed, repo, tag, MEDIA_MANIFEST)
    assert len(doc["layers"]) == 1
    members = {
        m.name: m for m in tarfile.open(fileobj=io.BytesIO(blob(pushed, repo, doc["layers"][0]["digest"]))).getmembers()
    }
    for name, kind in attack.items():
        assert name in members, f"{ref}: no {name!r} in {sorted(members)}"
        assert members[name].type == kind
    if "link" in attack:
        assert members["link"].linkname == "/tmp"
    if "passwd" in attack:
        assert members["passwd"].linkname == "/etc/passwd"


# --------------------------------------------------------------------------- auth


def test_htpasswd_auth(tmp_path: Path) -> None:
    with Registry(tmp_path / "registry", auth=("alice", "s3cret pass")) as reg:
        status, headers, _ = reg.get("/v2/", auth=False)
        assert status == 401
        assert headers["www-authenticate"].lower().startswith("basic")
        assert reg.get("/v2/")[0] == 200
        wrong = Registry(reg.dir, auth=("alice", "wrong"))
        wrong.addr = reg.addr
        assert wrong.get("/v2/")[0] == 401

        result = reg.push(test_image_layout(), "auth/only:v1", ref=TEST_IMAGE_AMD64)
        assert result["digest"] == test_image_summary()["refs"][TEST_IMAGE_AMD64]["digest"]
        assert reg.get("/v2/auth/only/manifests/v1", accept=MEDIA_MANIFEST, auth=False)[0] == 401
        status, headers, _ = reg.get("/v2/auth/only/manifests/v1", accept=MEDIA_MANIFEST)
        assert status == 200 and headers["docker-content-digest"] == result["digest"]


def test_up_is_idempotent_and_down_stops(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "registry").start()
    try:
        again = subprocess.run(
            ["bash", str(REGISTRY_SH), "up", str(reg.dir)], capture_output=True, text=True, check=True
        )
        assert f"ADDR={reg.addr}" in again.stdout
        pid = int((reg.dir / "pid").read_text())
    finally:
        reg.stop()
    assert not (reg.dir / "pid").exists() and not (reg.dir / "addr").exists()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert (reg.dir / "data").is_dir() and (reg.dir / "registry.log").is_file()


# --------------------------------------------------------------------------- the image's root filesystem


def apply_layer(root: Path, layer: tarfile.TarFile) -> None:
    """Applies one (trusted) layer: its whiteouts and opaque markers remove what the
    lower layers put there, then its other entries are extracted over the tree."""
    members = layer.getmembers()
    for m in members:
        path = PurePosixPath(m.name)
        if path.name == ".wh..wh..opq":
            target = root / path.parent
            for child in target.iterdir() if target.is_dir() else []:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif path.name.startswith(".wh."):
            target = root / path.parent / path.name[len(".wh."):]
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    keep = [m for m in members if not PurePosixPath(m.name).name.startswith(".wh.")]
    if hasattr(tarfile, "fully_trusted_filter"):  # 3.11.4+: say so, or 3.14 applies "data"
        layer.extractall(root, members=keep, numeric_owner=True, filter="fully_trusted")
    else:
        layer.extractall(root, members=keep, numeric_owner=True)


def resolve_in(root: Path, path: str) -> Path:
    """`path` resolved inside `root` as the image sees it (absolute links stay in root)."""
    parts = list(PurePosixPath(path).parts[1:])
    current = root
    hops = 0
    while parts:
        part = parts.pop(0)
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            assert hops < 40, f"symlink loop resolving {path}"
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                current = root
                parts = list(target.parts[1:]) + parts
            else:
                parts = list(target.parts) + parts
        elif part == "..":
            current = current.parent if current != root else root
        else:
            current = candidate
    return current


def elf_interpreter(path: Path) -> str:
    """PT_INTERP of a 64-bit little-endian ELF executable."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is no ELF64 LE"
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    raise AssertionError(f"{path} has no PT_INTERP")


@pytest.fixture(scope="module")
def rootfs(pushed: Registry, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The amd64 image as pulled from the registry, its layers applied in order."""
    root = tmp_path_factory.mktemp("rootfs")
    _, doc = manifest(pushed, "sandhub/test", "amd64", MEDIA_MANIFEST)
    for layer in doc["layers"]:
        with tarfile.open(fileobj=io.BytesIO(blob(pushed, "sandhub/test", layer["digest"])), mode="r:gz") as tar:
            apply_layer(root, tar)
    return root


def test_layers_merge_with_whiteouts_and_owners(rootfs: Path) -> None:
    assert (rootfs / "etc" / "passwd").read_text().startswith("root:x:0:0:")
    assert "app:x:1000:1000:" in (rootfs / "etc" / "passwd").read_text()
    assert not (rootfs / "etc" / "hidden-by-upper").exists()
    assert sorted(p.name for p in (rootfs / "opt" / "opaque").iterdir()) == ["new"]
    assert (rootfs / "opt" / "opaque" / "new").read_text() == "new\n"
    assert (rootfs / "srv" / "work").is_dir()
    assert os.readlink(rootfs / "usr" / "bin" / "sh") == "busybox"
    for applet in ("sh", "ls", "cat", "id", "stat"):
        assert resolve_in(rootfs, f"/bin/{applet}") == rootfs / "usr" / "bin" / "busybox"
    root_owned, mine = (rootfs / "root-owned").lstat(), (rootfs / "home" / "app" / "mine").lstat()
    assert root_owned.st_mode & 0o777 == 0o600
    if os.geteuid() == 0:  # extraction keeps owners only as root
        assert (root_owned.st_uid, root_owned.st_gid) == (0, 0)
        assert (mine.st_uid, mine.st_gid) == (1000, 1000)


def test_python3_runs_in_the_merged_tree(rootfs: Path) -> None:
    python = resolve_in(rootfs, "/usr/bin/python3")
    assert python.is_file(), f"/usr/bin/python3 resolves to {python}, which is no file"
    interpreter = elf_interpreter(python)
    assert resolve_in(rootfs, interpreter).is_file(), f"the ELF interpreter {interpreter} is not in the image"

    argv = ["/usr/bin/python3", "-c", "import os, sys; print(1, sys.version_info[0], os.environ['M'])"]
    env = {"PATH": PATH_ENV.split("=", 1)[1], "M": "from-image"}
    if os.geteuid() == 0:
        cmd = ["chroot", str(rootfs), *argv]
    else:
        cmd = ["unshare", "-r", f"--root={rootfs}", *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stderr}"
    assert r.stdout.strip() == "1 3 from-image"

    sh = subprocess.run(
        [*cmd[: cmd.index("/usr/bin/python3")], "/bin/sh", "-c", "id -u app; cat /etc/group; ls /opt/opaque"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert sh.returncode == 0, sh.stderr
    assert sh.stdout.split() == ["1000", "root:x:0:", "app:x:1000:", "new"]
