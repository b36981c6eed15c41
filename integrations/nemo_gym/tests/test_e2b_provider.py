"""NeMo Gym 0.7.0's own built-in E2B provider (`nemo_gym.sandbox.providers.e2b`,
unmodified) against a real `sandhub serve --e2b`: no Sandhub code on the
client side, only NeMo Gym, the `e2b` SDK it drives (pinned to 2.51.0, the
last it works with: see requirements.txt) and the hub's E2B-compatible API.

The provider is configured as its users do: NeMo Gym's shipped
`configs/e2b.yaml`, with `connection.api_key/api_url/sandbox_url` pointing at
the hub (E2B's control plane and envd share the hub's listener) and
`create.template: base`, resolved by `resolve_provider_config` and built by
`create_provider`. Both exec modes run: `exec.background: true` (the
default: start detached, then wait on the pid's stream) and `false` (one
blocking stream per command).

The provider sends the SDK's control-plane HTTP through NeMo Gym's
process-wide aiohttp client (`nemo_gym.server_utils`), which a Gym server
sets up when it starts; a bare process would instead build it from a Gym
global config parsed from the command line (here: pytest's). So each test
sets that client up as a Gym server does, on the test's own event loop.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any, AsyncIterator

import nemo_gym.sandbox.providers.e2b as nemo_e2b
import pytest
from aiohttp import ClientSession
from nemo_gym import server_utils
from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus, create_provider, resolve_provider_config
from nemo_gym.sandbox.providers.base import SandboxExecResult, SandboxHandle
from nemo_gym.sandbox.providers.e2b import E2BProvider
from omegaconf import OmegaConf
from sandhub_testing import Hub

#: NeMo Gym's shipped config for its E2B provider (top-level block `sandbox`).
SHIPPED_E2B_CONFIG = Path(nemo_e2b.__file__).parent / "configs" / "e2b.yaml"

#: The E2B template every sandbox here starts from (the SDK's own default name).
TEMPLATE = "base"

#: Any non-empty API key: the test hub has no keys file.
ANY_KEY = "nemo-gym-e2b-any-key"

#: The newest e2b whose async API NeMo Gym 0.7.0's transport patch still fits.
E2B_VERSION = "2.51.0"

#: What `nemo_gym.server_utils.set_global_aiohttp_client` sets (the process-wide client).
GYM_HTTP_CLIENT_GLOBALS = (
    "_GLOBAL_AIOHTTP_CLIENT",
    "_GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG",
    "_GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY",
)


@pytest.fixture(autouse=True)
def no_ambient_e2b_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No E2B_* variable of the caller's environment (E2B_DOMAIN, E2B_DEBUG,
    ...) may point the SDK elsewhere: the config below names everything."""
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)


@pytest.fixture
async def gym_http_client(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClientSession]:
    """NeMo Gym's process-wide aiohttp client, made as a Gym server makes it
    at startup (`set_global_aiohttp_client` with the default pool config), on
    this test's event loop; closed after the test. An aiohttp session is tied
    to the loop it was made on, so the next test gets a new one: the module
    globals `set_global_aiohttp_client` fills are put back to unset (Gym's own
    `global_aiohttp_client_exit` would `asyncio.run` the close, which cannot
    run inside this loop)."""
    for name in GYM_HTTP_CLIENT_GLOBALS:
        # Saved now, restored when monkeypatch undoes (after this fixture's teardown).
        monkeypatch.setattr(server_utils, name, getattr(server_utils, name))
    assert not server_utils.is_global_aiohttp_client_setup()
    client = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    try:
        yield client
    finally:
        await client.close()


def e2b_provider_config(hub_url: str, background: bool | None) -> dict[str, Any]:
    """The `{"e2b": kwargs}` block of NeMo Gym's shipped e2b.yaml with the
    connection pointed at `hub_url`, template `base`, and `exec.background`
    set when `background` is not None (else the shipped default stays)."""
    overrides: dict[str, Any] = {
        "connection": {"api_key": ANY_KEY, "api_url": hub_url, "sandbox_url": hub_url},
        "create": {"template": TEMPLATE},
    }
    if background is not None:
        overrides["exec"] = {"background": background}
    merged = OmegaConf.merge(OmegaConf.load(SHIPPED_E2B_CONFIG), {"sandbox": {"e2b": overrides}})
    global_cfg = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(global_cfg, dict)
    return resolve_provider_config("sandbox", global_cfg)


def hub_sandbox(hub: Hub, sandbox_id: str) -> tuple[int, dict[str, Any] | None]:
    """The hub's own REST view of a sandbox: (status, JSON body when 200)."""
    status, body = hub.request("GET", f"/v1/sandboxes/{sandbox_id}")
    return status, (json.loads(body) if status == 200 else None)


def hub_sandbox_ids(hub: Hub) -> set[str]:
    """The ids of every sandbox the hub lists."""
    status, body = hub.request("GET", "/v1/sandboxes")
    assert status == 200, body
    return {sandbox["id"] for sandbox in json.loads(body)["sandboxes"]}


@pytest.fixture(params=[None, False], ids=["background-default-true", "background-false"])
def e2b_config(request: pytest.FixtureRequest, e2b_hub: Hub, gym_http_client: ClientSession) -> dict[str, Any]:
    """The provider config for `e2b_hub` (see `e2b_provider_config`), once
    with the shipped `exec.background` (true) and once with false; NeMo Gym's
    HTTP client is set up for it."""
    background: bool | None = request.param
    config = e2b_provider_config(e2b_hub.url, background)
    expected = True if background is None else background
    assert config["e2b"]["exec"]["background"] is expected  # the shipped default is true
    return config


@pytest.fixture
def e2b_provider(e2b_config: dict[str, Any]) -> E2BProvider:
    """NeMo Gym's E2B provider, found by its built-in name `e2b`."""
    provider = create_provider(e2b_config)
    assert isinstance(provider, E2BProvider)
    return provider


def test_the_venv_has_the_e2b_nemo_gym_works_with() -> None:
    """Any later e2b passes `http_version=` to the transport factory NeMo Gym
    replaces, and every create then fails (see requirements.txt)."""
    assert version("e2b") == E2B_VERSION
    assert version("nemo-gym") == "0.7.0"


async def test_e2b_provider_create_exec_files_status_close(
    e2b_provider: E2BProvider, e2b_hub: Hub, tmp_path: Path
) -> None:
    """The provider protocol end to end on the hub: `create` makes a hub
    sandbox (same id) with the spec's env; `exec` returns stdout, stderr and
    a non-zero exit code as a result, and honours cwd and env; a binary file
    goes up and comes back byte for byte; `status` is running; `close`
    (twice) deletes the sandbox on the hub."""
    provider = e2b_provider
    spec = SandboxSpec(env={"GREETING": "hello"}, metadata={"suite": "nemo-gym-e2b"})
    handle: SandboxHandle = await provider.create(spec)
    try:
        assert handle.provider_name == "e2b"
        assert handle.sandbox_id
        # The E2B sandbox is the hub's own sandbox, under the same id.
        status, body = hub_sandbox(e2b_hub, handle.sandbox_id)
        assert status == 200, body
        assert body is not None and body["id"] == handle.sandbox_id
        assert await provider.status(handle) == SandboxStatus.RUNNING

        # A failing command is a result: its stdout, its stderr and its exit code.
        result = await provider.exec(handle, "echo $GREETING; echo oops >&2; exit 3")
        assert isinstance(result, SandboxExecResult)
        assert (result.stdout, result.stderr, result.return_code, result.error_type) == (
            "hello\n",
            "oops\n",
            3,
            None,
        )
        # A succeeding one, with a working directory and variables of its own.
        result = await provider.exec(handle, "pwd; echo $EXTRA-$GREETING", cwd="/tmp", env={"EXTRA": "more"})
        assert (result.stdout, result.stderr, result.return_code) == ("/tmp\nmore-hello\n", "", 0)

        # Upload a binary file (every byte value), see it inside, download it back.
        payload = bytes(range(256)) * 4
        (tmp_path / "blob.bin").write_bytes(payload)
        await provider.upload_file(handle, tmp_path / "blob.bin", "/tmp/nemo-e2b/blob.bin")
        result = await provider.exec(handle, "wc -c < /tmp/nemo-e2b/blob.bin")
        assert (result.stdout, result.return_code) == (f"{len(payload)}\n", 0)
        await provider.download_file(handle, "/tmp/nemo-e2b/blob.bin", tmp_path / "back" / "blob.bin")
        assert (tmp_path / "back" / "blob.bin").read_bytes() == payload
        # And a file a command wrote comes down as written.
        await provider.exec(handle, "printf 'made inside\\n' > /tmp/nemo-e2b/made.txt")
        await provider.download_file(handle, "/tmp/nemo-e2b/made.txt", tmp_path / "made.txt")
        assert (tmp_path / "made.txt").read_text() == "made inside\n"

        assert await provider.status(handle) == SandboxStatus.RUNNING
    finally:
        await provider.close(handle)
    assert handle.raw is None  # the provider let go of its SDK sandbox
    await provider.close(handle)  # closing again is fine
    await provider.aclose()

    # Gone on the hub: its REST API no longer knows the sandbox nor lists it.
    status, body = hub_sandbox(e2b_hub, handle.sandbox_id)
    assert status == 404, body
    assert handle.sandbox_id not in hub_sandbox_ids(e2b_hub)


async def test_async_sandbox_facade_on_the_e2b_provider(
    e2b_config: dict[str, Any], e2b_hub: Hub, tmp_path: Path
) -> None:
    """NeMo Gym's `AsyncSandbox` (what its agents and resources servers use)
    over the E2B provider: the spec's files are uploaded after create (a
    relative path lands in the directory commands start in, as on E2B), its
    env reaches commands, a command outliving its timeout raises the
    provider's TimeoutError, and leaving the `async with` deletes the sandbox."""
    spec = SandboxSpec(env={"FOO": "bar"}, files={"hello.txt": "hi\n", "/tmp/abs/x.txt": "abs\n"})
    sb = AsyncSandbox(e2b_config, spec)
    async with sb:
        await sb.start()
        assert await sb.status() == SandboxStatus.RUNNING
        result = await sb.exec("echo $FOO; cat hello.txt /tmp/abs/x.txt; echo err >&2; exit 5")
        assert (result.stdout, result.stderr, result.return_code) == ("bar\nhi\nabs\n", "err\n", 5)
        with pytest.raises(TimeoutError):
            await sb.exec("echo started; sleep 30", timeout_s=1)
        await sb.download("hello.txt", tmp_path / "hello.txt")
        assert (tmp_path / "hello.txt").read_text() == "hi\n"
        # Its descriptor (`serialize`, for another process to `connect` by) names the hub's sandbox.
        sandbox_id = (await sb.serialize())["sandbox_id"]
        assert hub_sandbox(e2b_hub, sandbox_id)[0] == 200
    assert await sb.status() == SandboxStatus.STOPPED
    assert hub_sandbox(e2b_hub, sandbox_id)[0] == 404
