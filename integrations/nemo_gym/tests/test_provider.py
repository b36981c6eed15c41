"""NeMo Gym 0.7.0's own sandbox facades on a real hub through SandhubProvider,
found by its entry point and configured from the shipped configs/sandhub.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import sandhub
from nemo_gym.sandbox import (
    AsyncSandbox,
    ConnectableProvider,
    Sandbox,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxPauseResume,
    list_providers,
    resolve_provider_config,
)
from omegaconf import OmegaConf
from sandhub_nemo_gym import CONFIG_PATH, RUNTIME_RETURN_CODE, SandhubProvider


@pytest.fixture
def provider_config(hub_url: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The shipped config block, its ${oc.env:SANDHUB_URL} pointed at the test hub."""
    monkeypatch.setenv("SANDHUB_URL", hub_url)
    global_cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_PATH), resolve=True)
    return resolve_provider_config("sandbox", global_cfg)


def test_list_providers_finds_sandhub_by_its_entry_point() -> None:
    assert "sandhub" in list_providers()


def test_provider_offers_pause_resume_and_connect() -> None:
    provider = SandhubProvider(base_url="http://127.0.0.1:9")
    assert isinstance(provider, SupportsSandboxPauseResume)
    assert isinstance(provider, ConnectableProvider)


async def test_async_sandbox_runs_with_env_files_exit_code_and_timeout(provider_config: dict, tmp_path: Path) -> None:
    spec = SandboxSpec(env={"FOO": "bar"}, files={"hello.txt": "hi\n", "/tmp/abs/x.txt": "abs\n"}, workdir="/tmp/work")
    sb = AsyncSandbox(provider_config, spec)
    async with sb:
        await sb.start()
        assert await sb.status() == SandboxStatus.RUNNING
        r = await sb.exec("echo $FOO; cat hello.txt; pwd; echo err >&2; exit 3")
        assert r.stdout == "bar\nhi\n/tmp/work\n"
        assert (r.stderr, r.return_code, r.error_type) == ("err\n", 3, None)
        r = await sb.exec("cat /tmp/abs/x.txt", cwd="/")
        assert (r.stdout, r.return_code) == ("abs\n", 0)
        r = await sb.exec("echo $FOO-$BAZ", env={"BAZ": "qux"})
        assert r.stdout == "bar-qux\n"
        r = await sb.exec("echo started; sleep 30", timeout_s=0.5)
        assert (r.return_code, r.error_type) == (RUNTIME_RETURN_CODE, "timeout")
        # The files of the spec landed: relative under the workspace, absolute as named.
        await sb.download("hello.txt", tmp_path / "out" / "hello.txt")
        assert (tmp_path / "out" / "hello.txt").read_text() == "hi\n"
        (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
        await sb.upload(tmp_path / "blob.bin", "/tmp/deep/blob.bin")
        await sb.download("/tmp/deep/blob.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == bytes(range(256))
    assert await sb.status() == SandboxStatus.STOPPED


def test_sync_sandbox_facade_and_status_after_close(provider_config: dict) -> None:
    with Sandbox(provider_config, SandboxSpec(files={"a.txt": "from spec\n"})) as sb:
        sb.start()
        result = sb.exec("cat a.txt; echo sync")
        assert (result.stdout, result.return_code) == ("from spec\nsync\n", 0)
        assert sb.status() == SandboxStatus.RUNNING
        sb.stop()
        assert sb.status() == SandboxStatus.STOPPED


async def test_pause_resume_and_connect_from_a_descriptor(hub_url: str) -> None:
    provider = SandhubProvider(base_url=hub_url)
    handle = await provider.create(SandboxSpec())
    try:
        await provider.exec(handle, "echo kept > kept.txt")
        await provider.pause(handle)
        assert await provider.status(handle) == SandboxStatus.PAUSED
        await provider.resume(handle)
        assert await provider.status(handle) == SandboxStatus.RUNNING
        descriptor = await provider.serialize_handle(handle)
        other = SandhubProvider(base_url=hub_url)
        again = await other.connect(descriptor)
        assert again.sandbox_id == handle.sandbox_id
        assert (await other.exec(again, "cat kept.txt")).stdout == "kept\n"
        await other.aclose()
    finally:
        await provider.close(handle)
        await provider.close(handle)  # twice is fine
    assert await provider.status(handle) == SandboxStatus.STOPPED


async def test_resources_make_a_derived_template_and_gpus_are_refused(hub_url: str) -> None:
    from nemo_gym.sandbox.providers.base import SandboxCreateError

    provider = SandhubProvider(base_url=hub_url)
    handle = await provider.create(SandboxSpec(resources={"cpu": 0.5, "memory_mib": 256}))
    try:
        template = handle.raw["sandbox"].template
        assert template.startswith("nemo-")
        spec = sandhub.Hub(hub_url).templates.get(template).spec
        assert (spec["cpu"], spec["memory_mb"]) == (0.5, 256)
        # The limits themselves are the hub's to enforce (its own tests cover that);
        # a sandbox sees no cgroup files to check them by.
        assert (await provider.exec(handle, "true")).return_code == 0
    finally:
        await provider.close(handle)
    with pytest.raises(SandboxCreateError, match="GPU"):
        await provider.create(SandboxSpec(resources={"gpu": 1}))
    with pytest.raises(SandboxCreateError, match="NOT_FOUND"):
        await provider.create(SandboxSpec(image="no-such-template"))
