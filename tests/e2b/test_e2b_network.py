"""E2B's outbound network words through the real `e2b` SDK (issue #27):
`Sandbox.create(allow_internet_access=False)`, `network={"allow_out": ...,
"deny_out": ["0.0.0.0/0"]}` and `update_network` reach the hub's gateway
and read back in `get_info()`; what Sandhub cannot express is E2B's 400.

What the sandbox can resolve is asked of the gateway's own DNS responder,
which decides by the policy alone and asks nothing upstream for these
names: no packet leaves this machine. (The same words against real servers
in a test internet: `e2b_network_words_map_onto_the_gateway`,
hub/tests/egress_patch.rs.)"""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from e2b import Sandbox, SandboxException
from e2b_support import SandboxFactory
from sandhub_testing import Hub
from sandhub_testing.e2b import ANY_KEY, Conn


@pytest.fixture(scope="module")
def template(e2b_hub: Hub) -> str:
    """An egress template (Sandhub's API): E2B's words can only narrow it."""
    name = f"web-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"network": {"mode": "egress", "allow_out": ["pypi.test", "*.git.test"]}}).encode()
    req = urllib.request.Request(
        f"{e2b_hub.url}/v1/templates/{name}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {ANY_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    return name


def resolves(sbx: Sandbox, name: str) -> bool:
    out = sbx.commands.run(f"getent hosts {name} >/dev/null && echo yes || echo no").stdout.strip()
    assert out in ("yes", "no"), out
    return out == "yes"


def test_allow_internet_access_false_is_offline(make_sandbox: SandboxFactory, conn: Conn, template: str) -> None:
    sbx = make_sandbox(conn, template=template, allow_internet_access=False)
    assert not resolves(sbx, "pypi.test")
    info = sbx.get_info()
    assert info.allow_internet_access is False
    assert info.network is not None and info.network.get("deny_out") == ["0.0.0.0/0"]


def test_allow_out_with_deny_all_reaches_only_those(make_sandbox: SandboxFactory, conn: Conn, template: str) -> None:
    sbx = make_sandbox(conn, template=template, network={"allow_out": ["pypi.test"], "deny_out": ["0.0.0.0/0"]})
    assert resolves(sbx, "pypi.test") and not resolves(sbx, "a.git.test")
    info = sbx.get_info()
    assert info.network is not None and info.network.get("allow_out") == ["pypi.test"]
    # Live: replaced by another allow list, then cleared (the template's).
    sbx.update_network({"allow_out": ["a.git.test"], "deny_out": ["0.0.0.0/0"]})
    assert resolves(sbx, "a.git.test") and not resolves(sbx, "pypi.test")
    sbx.update_network({})
    assert resolves(sbx, "pypi.test") and resolves(sbx, "b.git.test")
    assert sbx.get_info().network is None


def test_what_sandhub_cannot_express_is_refused(conn: Conn, template: str) -> None:
    for network, needle in [
        ({"deny_out": ["198.18.5.0/24"], "allow_out": ["198.18.5.2"]}, "deny wins"),
        ({"deny_out": ["evil.test"]}, "denyOut[0]"),
        ({"mask_request_host": "x.test"}, "maskRequestHost"),
        ({"allow_out": ["other.example"], "deny_out": ["0.0.0.0/0"]}, "never widen"),
    ]:
        with pytest.raises(SandboxException) as exc:
            Sandbox.create(template=template, network=network, **conn)  # type: ignore[arg-type]
        assert needle in str(exc.value), (network, exc.value)
