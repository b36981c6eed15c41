"""Issue #13 on the real cluster: the kubernetes backend refuses what the local
backend refuses, with the same {code, message}, before any claim or pool is
written. The rules live in api/src/validate/; the messages asserted here are
its wording, which the local backend returns for the same requests. One test
per rule."""

from __future__ import annotations

import pytest
import requests

from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import POOL, Cluster

LABEL_SYNTAX = "keys are [A-Za-z0-9-_./] (≤253), values [A-Za-z0-9-_.] (≤63)"
ENV_SYNTAX = "names must be non-empty without `=` or NUL, values without NUL"


@pytest.fixture(scope="module")
def url(cluster: Cluster):
    # A quota above the 1000-replica cap, so the cap is what answers.
    hub, url = cluster.start_hub("--tenant-max-pool-replicas", "100000")
    try:
        yield url
        # Nothing refused left anything on the cluster.
        wait_for("nothing left behind", lambda: cluster.hub_leftovers() == [], timeout=120)
    finally:
        stop_process(hub)


def refused(r: requests.Response, message_start: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "INVALID_ARGUMENT", body
    assert body["message"].startswith(message_start), body


def create(url: str, **body) -> requests.Response:
    return requests.post(f"{url}/v1/sandboxes", json={"pool": POOL, **body}, timeout=60)


@pytest.mark.parametrize("field", ["shutdown_after_seconds", "idle_timeout_seconds"])
def test_a_zero_lifetime_is_refused(url: str, field: str):
    refused(create(url, **{field: 0}), f"{field} must be between 1 and 31536000 seconds, not 0")


@pytest.mark.parametrize("labels", [
    {"a b": "x"},
    {"": "x"},
    {"app": "has space"},
    {"app": "v" * 64},
    {"k" * 254: "x"},
])
def test_labels_outside_the_syntax_are_refused(url: str, labels: dict):
    (key, value), = labels.items()
    refused(create(url, labels=labels), f"label {key}={value}: {LABEL_SYNTAX}")


def test_more_than_64_labels_are_refused(url: str):
    refused(create(url, labels={f"k{i}": "v" for i in range(65)}), "at most 64 labels")


@pytest.mark.parametrize("key", ["agents.x-k8s.io/sandbox-name-hash", "kubernetes.io/x", "sub.k8s.io/y"])
def test_reserved_label_prefixes_are_refused_in_the_shared_words(url: str, key: str):
    refused(create(url, labels={key: "x"}), f"label {key}: the prefixes agents.x-k8s.io, kubernetes.io, k8s.io are reserved")


@pytest.mark.parametrize("env", [{"": "x"}, {"A=B": "x"}, {"A\u0000": "x"}, {"A": "x\u0000"}])
def test_unsettable_env_is_refused(url: str, env: dict):
    r = create(url, env=env)
    refused(r, "env ")
    assert ENV_SYNTAX in r.json()["message"], r.text


@pytest.mark.parametrize("template, message", [
    ({"cpu": 0.001}, "cpu must be 0.05 to 1024 cores"),
    ({"cpu": 2000}, "cpu must be 0.05 to 1024 cores"),
    ({"memory_mb": 8}, "memory_mb must be 32 to 16777216"),
    ({"memory_mb": 2**40}, "memory_mb must be 32 to 16777216"),
    ({"pids": 3}, "pids must be 16 to 4194304"),
    ({"disk_mb": 1}, "disk_mb must be 16 to 16777216"),
    ({"env": {"": "x"}}, "env "),
])
def test_templates_out_of_range_are_refused_and_valid_ones_applied(url: str, template: dict, message: str):
    refused(requests.put(f"{url}/v1/templates/bad-values", json=template, timeout=60), message)
    # A valid one becomes the tenant's SandboxTemplate.
    r = requests.put(f"{url}/v1/templates/good-values", json={"cpu": 1}, timeout=60)
    assert r.status_code == 200 and r.json() == {"name": "good-values", "cpu": 1.0, "network": "none"}, r.text
    assert requests.delete(f"{url}/v1/templates/good-values", timeout=60).status_code == 204


@pytest.mark.parametrize("kind", ["pools", "templates"])
def test_names_that_are_not_dns_labels_are_refused(url: str, kind: str):
    body = {"template": POOL, "replicas": 0} if kind == "pools" else {}
    r = requests.put(f"{url}/v1/{kind}/Bad_Name", json=body, timeout=60)
    refused(r, f"{kind[:-1]} name `Bad_Name` must be a DNS-1123 label")


def test_more_than_1000_replicas_are_refused(url: str, cluster: Cluster):
    r = requests.put(f"{url}/v1/pools/huge", json={"template": POOL, "replicas": 1001}, timeout=60)
    refused(r, "replicas must be at most 1000")
    pools = cluster.custom.list_namespaced_custom_object(
        "extensions.agents.x-k8s.io", "v1beta1", cluster.ns, "sandboxwarmpools")["items"]
    assert not [p["metadata"]["name"] for p in pools if p["metadata"]["name"].startswith("huge")]


def test_a_fork_with_reserved_labels_is_refused_as_locally(url: str):
    r = requests.post(f"{url}/v1/sandboxes/sb-nonexistent/fork",
                      json={"labels": {"kubernetes.io/x": "y"}}, timeout=60)
    refused(r, "label kubernetes.io/x: the prefixes")
