"""The unmodified upstream Python SDK (k8s-agent-sandbox) against our controller.

A real test apiserver (SANDHUB_TEST_KUBECONFIG), the fake node, and the
sandhub-controller binary with --extensions restricted to a fresh namespace.
The SDK creates a claim on a warm pool and returns once our controller made
it Ready; terminate() deletes the claim, and with it the Sandbox and Pod.
Nothing here talks to the Pod itself: on the fake node no sandboxd runs.
"""

import subprocess
import uuid
from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config  # noqa: E402
from k8s_agent_sandbox import SandboxClient  # noqa: E402
from sandhub_testing import wait_for  # noqa: E402
from sandhub_testing.fixtures import controller_bin  # noqa: E402,F401 - a fixture
from sandhub_testing.k8s import cluster_kubeconfig, install_crds  # noqa: E402

GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"


@pytest.fixture()
def cluster(tmp_path: Path, controller_bin: Path):
    kubeconfig = cluster_kubeconfig()
    config.load_kube_config(config_file=kubeconfig)
    install_crds(client.ApiClient())
    ns = f"sdk-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api()
    core.create_namespace({"metadata": {"name": ns}})
    log = open(tmp_path / "controller.log", "wb")
    proc = subprocess.Popen(
        [str(controller_bin), "--extensions", "--leader-elect=false", "--watch-namespace", ns,
         "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
         "--kubeconfig", kubeconfig],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        yield ns
    finally:
        proc.kill()
        proc.wait()
        log.close()
        # Shown by pytest only when the test failed.
        print("controller log:\n" + (tmp_path / "controller.log").read_text(errors="replace")[-8000:])
        core.delete_namespace(ns)


def test_sdk_create_sandbox_from_warm_pool_and_terminate(cluster):
    ns = cluster
    objs = client.CustomObjectsApi()
    objs.create_namespaced_custom_object(GROUP, VERSION, ns, "sandboxtemplates", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxTemplate", "metadata": {"name": "tpl"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    })
    objs.create_namespaced_custom_object(GROUP, VERSION, ns, "sandboxwarmpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxWarmPool", "metadata": {"name": "pool"},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "tpl"}},
    })
    wait_for("a full warm pool", lambda: (objs.get_namespaced_custom_object(
        GROUP, VERSION, ns, "sandboxwarmpools", "pool").get("status") or {}).get("readyReplicas") == 2)

    # The SDK's own way to target a given cluster (its default reads the
    # kubeconfig path kubernetes fixed at import time).
    sdk = SandboxClient(api_client=config.new_client_from_config(config_file=cluster_kubeconfig()))
    sandbox = sdk.create_sandbox(warmpool="pool", namespace=ns, sandbox_ready_timeout=60)
    # What the SDK resolved is what our controller produced.
    claim = objs.get_namespaced_custom_object(GROUP, VERSION, ns, "sandboxclaims", sandbox.claim_name)
    assert claim["status"]["sandbox"]["name"] == sandbox.sandbox_id
    ready = [c for c in claim["status"]["conditions"] if c["type"] == "Ready"][0]
    assert ready["status"] == "True"
    sb = client.CustomObjectsApi().get_namespaced_custom_object(
        "agents.x-k8s.io", VERSION, ns, "sandboxes", sandbox.sandbox_id)
    assert sb["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"
    assert sb["metadata"]["labels"]["agents.x-k8s.io/claim-uid"] == claim["metadata"]["uid"]
    assert sandbox.get_pod_name() == sandbox.sandbox_id
    assert sandbox.get_pod_ip()
    assert sandbox.claim_name in sdk.list_all_sandboxes(namespace=ns)

    sandbox.terminate()
    core = client.CoreV1Api()

    def gone() -> bool:
        claims = objs.list_namespaced_custom_object(GROUP, VERSION, ns, "sandboxclaims")["items"]
        sandboxes = objs.list_namespaced_custom_object("agents.x-k8s.io", VERSION, ns, "sandboxes")["items"]
        pods = core.list_namespaced_pod(ns).items
        return (not any(c["metadata"]["name"] == sandbox.claim_name for c in claims)
                and not any(s["metadata"]["name"] == sandbox.sandbox_id for s in sandboxes)
                and not any(p.metadata.name == sandbox.sandbox_id for p in pods))

    wait_for("claim, Sandbox and Pod gone after terminate()", gone)
    assert sandbox.claim_name not in sdk.list_all_sandboxes(namespace=ns)
