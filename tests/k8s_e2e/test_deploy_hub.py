"""deploy/hub's manifests are valid for the real apiserver: a server-side
dry run creates every object (schema, RBAC shape, probes, security context)."""

from __future__ import annotations

from pathlib import Path

import requests
import yaml
from kubernetes import client as k8s
from kubernetes import utils
from sandhub_testing import stop_process
from sandhub_testing.hub_k8s import Cluster

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "hub"


def test_hub_manifests_pass_a_server_side_dry_run(cluster: Cluster):
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    kinds = []
    for name in listed:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                utils.create_from_dict(cluster.api, doc, namespace=cluster.ns, dry_run="All")
                kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service",
                             "ServiceAccount"]
    # A dry run stores nothing.
    apps = k8s.AppsV1Api(cluster.api)
    assert all(d.metadata.name != "sandhub-hub" for d in apps.list_namespaced_deployment(cluster.ns).items)


def test_hub_role_grants_only_what_the_backend_uses(cluster: Cluster):
    role = next(
        d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d and d["kind"] == "Role"
    )
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # The sandboxd token key is mounted; the only Secrets the hub touches are the tenants'
    # secret values (one per tenant, merge-patched): never listed, watched or deleted.
    assert verbs.get(("", "secrets")) == {"get", "create", "patch"}, verbs
    # Finds the egress proxy's replicas (for a sandbox's counters): list, nothing else.
    assert verbs.get(("discovery.k8s.io", "endpointslices")) == {"list"}, verbs
    # Picks the replica that delivers webhooks: one Lease, merge-patched at the version read.
    assert verbs.get(("coordination.k8s.io", "leases")) == {"get", "create", "patch"}, verbs
    # The Helm chart's Role grants the same (it is kept by hand).
    chart = (DEPLOY.parent / "helm" / "sandhub-hub" / "templates" / "all.yaml").read_text()
    assert 'resources: ["leases"]\n    verbs: ["get", "create", "patch"]' in chart
    # Pods: read (why a sandbox cannot start), and a volume's helper Pod made and deleted.
    assert verbs.get(("", "pods")) == {"get", "create", "delete"}, verbs
    # Named volumes are claims the hub makes and deletes, never changes or watches.
    assert verbs.get(("", "persistentvolumeclaims")) == {"get", "list", "create", "delete"}, verbs
    assert 'resources: ["persistentvolumeclaims"]\n    verbs: ["get", "list", "create", "delete"]' in chart
    # Their snapshots likewise (where the cluster has the VolumeSnapshot CRDs).
    assert verbs.get(("snapshot.storage.k8s.io", "volumesnapshots")) == {"get", "list", "create", "delete"}, verbs
    assert 'resources: ["volumesnapshots"]\n    verbs: ["get", "list", "create", "delete"]' in chart
    assert "update" not in set().union(*verbs.values()) and "*" not in set().union(*verbs.values())


def test_hub_mounts_the_sandboxd_token_key_it_is_given():
    """deploy/hub's flag names a file inside the mounted key Secret, the one the
    controller mounts too (deploy/sandbox-with-extensions.yaml)."""
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    hub = pod["containers"][0]
    flag = next(a for a in hub["args"] if a.startswith("--sandboxd-token-key-file="))
    path = Path(flag.split("=", 1)[1])
    assert not any(a.startswith("--sandboxd-token-secret") for a in hub["args"]), hub["args"]
    mount = next(m for m in hub["volumeMounts"] if path.parent == Path(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    controller = next(
        d for d in yaml.safe_load_all((DEPLOY.parent / "sandbox-with-extensions.yaml").read_text())
        if d and d["kind"] == "Deployment"
    )
    (controller_volume,) = controller["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == controller_volume["secret"]["secretName"] == "sandboxd-token-key"


def test_every_replica_mounts_one_signing_key_and_records_only_its_fingerprint():
    """Issue #28: the replicas sign E2B tokens and port links with one mounted
    key (a Secret); the Role's ConfigMap rights (Gym envs, the fingerprint
    record) stop short of watch, update and deletecollection."""
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    hub = pod["containers"][0]
    flag = next(a for a in hub["args"] if a.startswith("--signing-key-file="))
    path = Path(flag.split("=", 1)[1])
    mount = next(m for m in hub["volumeMounts"] if path.parent == Path(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "sandhub-signing-key"

    role = next(d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d and d["kind"] == "Role")
    cm_rules = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert cm_rules, role["rules"]
    # Gym envs and the key record: no watch, no update, no collection delete.
    assert set().union(*(set(r["verbs"]) for r in cm_rules)) <= {"get", "list", "create", "patch", "delete"}


def test_replicas_drain_before_they_stop_and_one_always_serves():
    """Issue #28: a stopping replica fails readiness and finishes its requests
    within the grace period; a disruption never takes the last replica."""
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    hub = pod["containers"][0]
    flags = dict(a.split("=", 1) for a in hub["args"] if a.startswith("--drain-"))
    seconds = {k: int(v.rstrip("s")) for k, v in flags.items()}
    assert seconds["--drain-delay"] >= hub["readinessProbe"]["periodSeconds"], seconds
    assert pod["terminationGracePeriodSeconds"] > seconds["--drain-delay"] + seconds["--drain-timeout"]
    pdb = yaml.safe_load((DEPLOY / "pdb.yaml").read_text())
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert 1 <= pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]


def test_the_hpa_example_scales_the_hub_deployment_on_its_own_series(cluster: Cluster):
    """deploy/hub/hpa-example.yaml is valid for the real apiserver, targets the
    hub's Deployment, stays above the PodDisruptionBudget, and names a series
    the hub exports."""
    hpa = yaml.safe_load((DEPLOY / "hpa-example.yaml").read_text())
    utils.create_from_dict(cluster.api, hpa, namespace=cluster.ns, dry_run="All")
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    pdb = yaml.safe_load((DEPLOY / "pdb.yaml").read_text())
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    hub, url = cluster.start_hub()
    try:
        exported = requests.get(f"{url}/metrics", timeout=30).text
    finally:
        stop_process(hub)
    assert any(line.startswith(name) for line in exported.splitlines()), exported
