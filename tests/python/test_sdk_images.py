"""The image store through the SDK (issue #15, local backend): the test
registry's Debian python3 image imported from its OCI layout with
``hub.images.import_`` (sync and async), run as a template's root, and
refused removal while a template uses it."""

from __future__ import annotations

import asyncio

import pytest
import sandhub
from sandhub_testing import test_image_layout
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)

AMD64 = "sandhub/test:amd64"


def test_images_import_run_list_remove(hub_url: str) -> None:
    layout = test_image_layout()
    with sandhub.Hub(hub_url) as hub:
        with pytest.raises(sandhub.InvalidArgumentError, match=AMD64):
            hub.images.import_(layout)  # several images: which one?
        image = hub.images.import_(layout, ref=AMD64, tag="sdk/py:1")
        assert image.tags == ["sdk/py:1"]
        assert len(image.layers) == 3
        assert image.config["workdir"] == "/srv/work"
        assert "SANDHUB_IMAGE_MARK=from-image" in image.config["env"]
        assert image in hub.images.list()

        hub.templates.put("sdk-py", {"image": "sdk/py:1"})
        try:
            with hub.create(template="sdk-py") as sb:
                out = sb.commands.run("python3 -c 'print(6*7)'; echo $SANDHUB_IMAGE_MARK")
                assert out.stdout == "42\nfrom-image\n", out
            with pytest.raises(sandhub.ConflictError):
                hub.images.remove("sdk/py:1")
        finally:
            hub.templates.delete("sdk-py")
        removed = hub.images.remove("sdk/py:1")
        assert removed.id == image.id
        assert all(i.id != image.id for i in hub.images.list())
        with pytest.raises(sandhub.NotFoundError):
            hub.images.remove("sdk/py:1")
        assert isinstance(hub.images.prune(), sandhub.PruneResult)


def test_images_async(hub_url: str) -> None:
    layout = test_image_layout()

    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as hub:
            image = await hub.images.import_(layout, ref=AMD64, tag="sdk/async:1")
            assert [i.tags for i in await hub.images.list() if i.id == image.id] == [["sdk/async:1"]]
            assert (await hub.images.remove("sdk/async:1")).id == image.id
            pruned = await hub.images.prune()
            assert pruned.layers >= 0

    asyncio.run(main())


def test_images_pull_and_prepull_from_a_registry(sandhub_bin, tmp_path) -> None:
    from sandhub_testing import Registry, running_hub as start

    with Registry(tmp_path / "registry") as reg:
        reg.push(test_image_layout(), "sdk/pulled:1", ref=AMD64)
        with start(sandhub_bin, tmp_path / "hub", "--insecure-registry", reg.addr) as hub_proc:
            hub = sandhub.Hub(hub_proc.url)
            image = hub.images.pull(f"{reg.addr}/sdk/pulled:1", tag="sdk/pulled:local")
            assert image.tags == ["sdk/pulled:local"] and len(image.layers) == 3
            hub.templates.put("pulled", {"image": "sdk/pulled:local"})
            with hub.create(template="pulled") as sb:
                assert sb.commands.run("echo $SANDHUB_IMAGE_MARK").stdout == "from-image\n"
            with pytest.raises(sandhub.NotFoundError):
                hub.images.pull(f"{reg.addr}/sdk/absent:1")

            async def prepull() -> sandhub.PrepullResult:
                async with sandhub.AsyncHub(hub_proc.url) as ahub:
                    return await ahub.images.prepull([f"{reg.addr}/sdk/pulled:1", f"{reg.addr}/sdk/absent:1"])

            result = asyncio.run(prepull())
            assert result.ok is False  # one of the two is missing: reported, not raised
            found, missing = result.images
            assert (found.ok, found.id) == (True, image.id)
            assert missing.ok is False and missing.error
