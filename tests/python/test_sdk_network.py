"""The sandhub SDK's ``network`` (issue #27) against a real `sandhub serve`
(local backend, as root): ``create(network=...)`` and ``set_network(...)``
reach the hub in the API's words and come back on ``info.network``; the
gateway inside the sandbox follows them (its DNS answers, decided by the
hub, never asked upstream: no packet leaves this machine); a widening is
:class:`sandhub.InvalidArgumentError` naming the entry."""

from __future__ import annotations

import asyncio

import pytest
import sandhub
from sandhub import NetworkPolicy
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)

TEMPLATE = "sdk-egress"
OFFLINE = "sdk-offline"
POLICY = {"mode": "egress", "allow_out": ["pypi.test", "*.git.test"]}
#: Whether the sandbox's resolver (the gateway's) gives the name an address.
RESOLVES = "/usr/bin/python3 -c 'import socket,sys\ntry: socket.gethostbyname(sys.argv[1]); print(\"yes\")\nexcept OSError: print(\"no\")' "


@pytest.fixture(scope="module")
def hub(hub_url: str) -> sandhub.Hub:
    h = sandhub.Hub(hub_url)
    h.templates.put(TEMPLATE, {"network": POLICY})
    # The built-in `default` is online (egress); an offline one of our own.
    h.templates.put(OFFLINE, {"network": "none"})
    return h


def resolves(sb: sandhub.Sandbox, name: str) -> bool:
    out = sb.commands.run(RESOLVES + name).stdout.strip()
    assert out in ("yes", "no"), out
    return out == "yes"


def test_create_narrows_with_a_mapping_or_a_policy_and_refuses_a_widening(hub: sandhub.Hub):
    with hub.create(TEMPLATE, network={"allow_out": ["pypi.test"]}) as sb:
        assert sb.info.network == NetworkPolicy(allow_out=("pypi.test",))
        assert hub.get(sb.id).info.network == NetworkPolicy("egress", ("pypi.test",))
        assert resolves(sb, "pypi.test") and not resolves(sb, "a.git.test")
    with hub.create(TEMPLATE, network=NetworkPolicy(deny_out=("bad.git.test",))) as sb:
        assert sb.info.network == NetworkPolicy(deny_out=("bad.git.test",))
        assert resolves(sb, "a.git.test") and not resolves(sb, "bad.git.test")
    with hub.create(TEMPLATE, network="none") as sb:
        assert sb.info.network == NetworkPolicy("none")
    with pytest.raises(sandhub.InvalidArgumentError) as e:
        hub.create(TEMPLATE, network={"allow_out": ["pypi.test", "other.example"]})
    assert 'allow_out[1] "other.example"' in str(e.value) and e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(sandhub.InvalidArgumentError, match=r"allow_out\[0\]"):
        hub.create(TEMPLATE, network={"allow_out": ["a.*.test"]})
    with pytest.raises(TypeError):
        hub.create(TEMPLATE, network=42)  # type: ignore[arg-type]


def test_set_network_applies_at_once_and_never_widens(hub: sandhub.Hub):
    with hub.create(TEMPLATE) as sb:
        assert sb.info.network is None
        assert resolves(sb, "a.git.test")
        assert sb.set_network({"allow_out": ["pypi.test"]}) is sb
        assert sb.info.network == NetworkPolicy(allow_out=("pypi.test",))
        assert not resolves(sb, "a.git.test") and resolves(sb, "pypi.test")
        with pytest.raises(sandhub.InvalidArgumentError, match=r'allow_out\[0\] "pypi.org"'):
            sb.set_network(NetworkPolicy(allow_out=("pypi.org",)))
        sb.set_network("none")
        assert sb.info.network == NetworkPolicy("none")
        assert not resolves(sb, "pypi.test")
        sb.set_network("egress")
        assert sb.info.network is None and resolves(sb, "a.git.test")
    # A sandbox started offline has no gateway to narrow.
    with hub.create(OFFLINE) as offline:
        with pytest.raises(sandhub.FailedPreconditionError, match="egress"):
            offline.set_network({"allow_out": ["pypi.test"]})


def test_the_async_face_is_the_same(hub_url: str, hub: sandhub.Hub):
    async def main() -> None:
        async with sandhub.AsyncHub(hub_url) as ah:
            async with await ah.create(TEMPLATE, network=NetworkPolicy(allow_out=("pypi.test",))) as sb:
                assert sb.info.network == NetworkPolicy(allow_out=("pypi.test",))
                await sb.set_network({"mode": "egress", "deny_out": ["pypi.test"]})
                assert sb.info.network == NetworkPolicy(deny_out=("pypi.test",))
                with pytest.raises(sandhub.InvalidArgumentError):
                    await sb.set_network({"allow_out": ["x.example"]})

    asyncio.run(main())
