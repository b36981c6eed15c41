"""E2B's volumes through the real `e2b` SDK, on the tenant's named volumes.

The control plane (`Volume.create/list/get_info/connect/destroy`) takes the
API key; the content API (`read_file`, `write_file`, `list`, `get_info`,
`make_dir`, `update_metadata`, `remove`) takes only the volume's token, and
is reached through `E2B_VOLUME_API_URL` = the hub's URL. `Sandbox.create(
volume_mounts=...)` mounts the same volume in a sandbox.
"""

from __future__ import annotations

import stat
import uuid
from typing import Iterator

import httpx
import pytest
from e2b import (
    AsyncVolume,
    AuthenticationException,
    NotFoundException,
    Sandbox,
    Volume,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)
from e2b_support import ALICE_KEY, BOB_KEY, SandboxFactory
from sandhub_testing import Hub
from sandhub_testing.e2b import Conn

#: Where the tests mount a volume in a sandbox.
MOUNT = "/mnt/data"


def volume_name() -> str:
    """A volume name no other test uses (a DNS label, as Sandhub's volumes take)."""
    return f"e2b-vol-{uuid.uuid4().hex[:10]}"


def api(hub: Hub, key: str) -> dict[str, str]:
    """The control-plane kwargs of `Volume`'s class methods."""
    return {"api_key": key, "api_url": hub.url}


@pytest.fixture(autouse=True)
def volume_api_url(monkeypatch: pytest.MonkeyPatch, e2b_hub: Hub) -> None:
    """The content API is on the hub's listener, as users point it there."""
    monkeypatch.setenv("E2B_VOLUME_API_URL", e2b_hub.url)


@pytest.fixture
def volume(conn: Conn, e2b_hub: Hub) -> Iterator[Volume]:
    """A fresh volume on the open hub, destroyed at the end of the test."""
    vol = Volume.create(volume_name(), api_key=conn["api_key"], api_url=e2b_hub.url)
    yield vol
    Volume.destroy(vol.volume_id, api_key=conn["api_key"], api_url=e2b_hub.url)


def test_volume_files_round_trip(volume: Volume) -> None:
    """Write, read (text and bytes), stat, list with depth, make_dir with
    and without parents, chmod, remove; a missing path is
    VolumePathNotFoundException (404), as the SDK expects."""
    written = volume.write_file("/docs/hello.txt", "hello volume\n")
    assert written.name == "hello.txt"
    assert written.path == "/docs/hello.txt"
    assert written.type.value == "file"
    assert written.size == len("hello volume\n")
    assert written.mode == 0o644
    assert (written.uid, written.gid) == (0, 0)
    assert written.mtime.tzinfo is not None

    assert volume.read_file("/docs/hello.txt") == "hello volume\n"
    assert volume.read_file("/docs/hello.txt", format="bytes") == b"hello volume\n"
    assert b"".join(volume.read_file("/docs/hello.txt", format="stream")) == b"hello volume\n"

    info = volume.get_info("/docs")
    assert info.type.value == "directory" and info.path == "/docs"
    assert volume.exists("/docs/hello.txt")
    assert not volume.exists("/docs/nope.txt")

    made = volume.make_dir("/deep/er/dir", force=True, mode=0o750)
    assert made.type.value == "directory" and made.mode == 0o750
    with pytest.raises(VolumePathNotFoundException):
        volume.make_dir("/missing/parent/dir")
    with pytest.raises(VolumeException):
        volume.make_dir("/deep")  # exists
    assert volume.make_dir("/deep", force=True).type.value == "directory"  # as `mkdir -p`
    with pytest.raises(VolumeException):
        volume.make_dir("/docs/hello.txt", force=True)  # a file is there

    top = {e.path for e in volume.list("/")}
    assert top == {"/docs", "/deep"}
    deep = {e.path for e in volume.list("/", depth=3)}
    assert {"/docs/hello.txt", "/deep/er", "/deep/er/dir"} <= deep

    changed = volume.update_metadata("/docs/hello.txt", mode=0o600)
    assert changed.mode == 0o600
    with pytest.raises(VolumeException):
        volume.update_metadata("/docs/hello.txt", uid=1000)

    volume.remove("/deep")
    assert not volume.exists("/deep/er/dir")
    with pytest.raises(VolumePathNotFoundException):
        volume.read_file("/deep/er/x")
    with pytest.raises(VolumePathNotFoundException):
        volume.remove("/deep")
    with pytest.raises(VolumePathNotFoundException):
        volume.list("/nowhere")


def test_volume_list_get_info_connect_destroy(conn: Conn, e2b_hub: Hub) -> None:
    """The control plane: create answers an id, name and token; the volume is
    listed, found by id (with a token that opens it), and destroyed once."""
    params = api(e2b_hub, conn["api_key"])
    name = volume_name()
    vol = Volume.create(name, **params)
    assert vol.name == name and vol.volume_id and vol.token
    assert (vol.volume_id, name) in {(v.volume_id, v.name) for v in Volume.list(**params)}
    info = Volume.get_info(vol.volume_id, **params)
    assert (info.volume_id, info.name) == (vol.volume_id, name)
    again = Volume.connect(vol.volume_id, **params)
    again.write_file("a.txt", "via connect")
    assert vol.read_file("a.txt") == "via connect"
    assert Volume.destroy(vol.volume_id, **params) is True
    assert Volume.destroy(vol.volume_id, **params) is False
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id, **params)
    # Its token died with it, even for a volume made again under its name.
    remade = Volume.create(name, **params)
    try:
        with pytest.raises(AuthenticationException):
            vol.read_file("a.txt")
        assert remade.list("/") == []
    finally:
        Volume.destroy(remade.volume_id, **params)


def test_volume_mounted_in_a_sandbox(volume: Volume, make_sandbox: SandboxFactory, conn: Conn) -> None:
    """`Sandbox.create(volume_mounts={path: volume})` mounts it read-write: the
    sandbox reads what the content API wrote, and the API reads what it wrote."""
    volume.write_file("/hello.txt", "from the api")
    sbx = make_sandbox(conn, volume_mounts={MOUNT: volume})
    assert sbx.commands.run(f"cat {MOUNT}/hello.txt").stdout == "from the api"
    sbx.commands.run(f"echo from the sandbox > {MOUNT}/back.txt")
    assert volume.read_file("/back.txt") == "from the sandbox\n"
    # By name too.
    by_name = make_sandbox(conn, volume_mounts={MOUNT: volume.name})
    assert by_name.commands.run(f"cat {MOUNT}/back.txt").stdout == "from the sandbox\n"


def test_links_in_a_volume_are_refused(volume: Volume, make_sandbox: SandboxFactory, conn: Conn) -> None:
    """A link a sandbox planted is neither followed nor listed."""
    sbx = make_sandbox(conn, volume_mounts={MOUNT: volume})
    sbx.commands.run(f"ln -s /etc/passwd {MOUNT}/passwd && mkdir {MOUNT}/d && ln -s /etc {MOUNT}/d/etc")
    with pytest.raises(VolumeException) as refused:
        volume.read_file("/passwd")
    assert not isinstance(refused.value, NotFoundException), "a link is refused, not missing"
    with pytest.raises(VolumeException):
        volume.read_file("/d/etc/passwd")
    with pytest.raises(VolumeException):
        volume.update_metadata("/passwd", mode=0o777)
    assert {e.name for e in volume.list("/")} == {"d"}
    # Removing the link removes the link only.
    volume.remove("/passwd")
    assert sbx.commands.run("test -f /etc/passwd && echo kept").stdout == "kept\n"


def test_another_volumes_token_is_refused(conn: Conn, e2b_hub: Hub) -> None:
    """A token opens its own volume only: with another volume's, or a forged
    or missing one, every content call is refused."""
    params = api(e2b_hub, conn["api_key"])
    a = Volume.create(volume_name(), **params)
    b = Volume.create(volume_name(), **params)
    try:
        b.write_file("secret.txt", "b's")
        wrong = Volume(b.volume_id, b.name, token=a.token)
        tenant, mac = a.token.split(".", 1)
        forged = Volume(b.volume_id, b.name, token=f"{tenant}.{mac[::-1]}")
        nameless = Volume(b.volume_id, b.name, token=None)
        for intruder in (wrong, forged, nameless):
            with pytest.raises(AuthenticationException):
                intruder.read_file("secret.txt")
            with pytest.raises(AuthenticationException):
                intruder.write_file("x.txt", "no")
            with pytest.raises(AuthenticationException):
                intruder.list("/")
            with pytest.raises(AuthenticationException):
                intruder.remove("secret.txt")
        assert {e.name for e in b.list("/")} == {"secret.txt"}
    finally:
        Volume.destroy(a.volume_id, **params)
        Volume.destroy(b.volume_id, **params)


def test_volumes_are_per_tenant(tenant_hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a hub with keys, alice's volume is unknown to bob, and her token
    opens nothing of his even when his volume has the same name."""
    monkeypatch.setenv("E2B_VOLUME_API_URL", tenant_hub.url)
    alice, bob = api(tenant_hub, ALICE_KEY), api(tenant_hub, BOB_KEY)
    name = volume_name()
    mine = Volume.create(name, **alice)
    theirs = Volume.create(name, **bob)
    try:
        mine.write_file("who.txt", "alice")
        theirs.write_file("who.txt", "bob")
        assert name in {v.name for v in Volume.list(**bob)}
        # The same name in both: each token reads its own tenant's.
        assert mine.read_file("who.txt") == "alice"
        assert theirs.read_file("who.txt") == "bob"
        assert Volume.destroy(mine.volume_id, **bob) is True  # bob's own one
        assert mine.read_file("who.txt") == "alice"
    finally:
        Volume.destroy(mine.volume_id, **alice)
        Volume.destroy(name, **bob)


async def test_async_volume_round_trip(conn: Conn, e2b_hub: Hub) -> None:
    """The asyncio SDK: create, write, read, stat, list, remove, destroy."""
    params = api(e2b_hub, conn["api_key"])
    vol = await AsyncVolume.create(volume_name(), **params)
    try:
        await vol.write_file("/n/a.bin", b"\x00\x01\x02")
        assert await vol.read_file("/n/a.bin", format="bytes") == b"\x00\x01\x02"
        info = await vol.get_info("/n/a.bin")
        assert info.size == 3 and stat.S_IMODE(info.mode) == 0o644
        assert [e.name for e in await vol.list("/n")] == ["a.bin"]
        await vol.remove("/n/a.bin")
        assert await vol.list("/n") == []
    finally:
        assert await AsyncVolume.destroy(vol.volume_id, **params) is True


def test_bad_volume_requests_get_json_errors(volume: Volume, conn: Conn, e2b_hub: Hub) -> None:
    """Bad input on either API is a JSON `{code, message}` answer, never a crash."""
    base = f"{e2b_hub.url}/volumecontent/{volume.volume_id}"
    auth = {"Authorization": f"Bearer {volume.token}"}
    cases = [
        ("GET", f"{base}/dir?path=/&depth=abc", 400),
        ("GET", f"{base}/dir?path=/&depth=0", 400),
        ("GET", f"{base}/path?path=/a/../b", 400),
        ("GET", f"{base}/file", 400),  # the root is no file
        ("POST", f"{base}/file?path=a", 405),
        ("GET", f"{base}/nothing?path=a", 404),
        ("PUT", f"{base}/file?path=a&mode=99999", 400),
        ("PUT", f"{base}/file?path=a&uid=1000", 400),
    ]
    with httpx.Client() as http:
        for method, url, status in cases:
            r = http.request(method, url, headers=auth, content=b"x")
            assert r.status_code == status, (method, url, r.text)
            assert r.json()["code"] == status and r.json()["message"], r.text
        r = http.patch(f"{base}/path?path=/", headers=auth, content=b"{not json")
        assert r.status_code == 400 and r.json()["code"] == 400
        r = http.get(f"{base}/dir?path=/")
        assert r.status_code == 401 and r.json()["code"] == 401
        r = http.post(f"{e2b_hub.url}/volumes", headers={"X-API-Key": conn["api_key"]}, content=b"[]")
        assert r.status_code == 400 and r.json()["code"] == 400
        r = http.post(f"{e2b_hub.url}/volumes", headers={"X-API-Key": conn["api_key"]}, json={"name": "Not_A_Name"})
        assert r.status_code == 400 and r.json()["code"] == 400
    with pytest.raises(VolumeException):
        Volume.create("Not_A_Name", api_key=conn["api_key"], api_url=e2b_hub.url)
