"""The sandhub Python SDK against `sandhub serve --backend kubernetes`:
create (from the warm pool), run, files and delete, sync and async, in a
real Pod that runs sandboxd."""

from __future__ import annotations

import asyncio

import sandhub
from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import POOL, Cluster, wait_for_pool


def test_sdk_create_run_files_delete_in_a_pod(cluster: Cluster):
    hub_proc, url = cluster.start_hub()
    try:
        hub = sandhub.Hub(url)
        sb = hub.create(pool=POOL, labels={"run": "sdk"})
        pod = cluster.pod_of(sb.id)
        assert sb.commands.run("hostname").stdout.strip() == pod
        sb.files.write("sdk/a.txt", b"from python")
        assert sb.files.read("sdk/a.txt") == b"from python"
        assert [e.name for e in sb.files.list("sdk")] == ["a.txt"]
        h = sb.commands.start(["cat", "sdk/a.txt"])
        assert h.wait().stdout == "from python"

        async def via_async() -> str:
            asb = await sandhub.AsyncHub(url).get(sb.id)
            await asb.files.write("sdk/b.txt", "async")
            return (await asb.commands.run("cat sdk/b.txt")).stdout

        assert asyncio.run(via_async()) == "async"
        sb.delete()
        wait_for("the SDK's sandbox to be gone", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub_proc)
    wait_for_pool(cluster, 2)
