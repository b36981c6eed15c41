"""deploy/hub's manifests are valid for the real apiserver: a server-side
dry run creates every object (schema, RBAC shape, probes, security context)."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import utils

from hub_k8s_support import Cluster

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "hub"


def test_hub_manifests_pass_a_server_side_dry_run(cluster: Cluster):
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    kinds = []
    for name in listed:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                utils.create_from_dict(cluster.api, doc, namespace=cluster.ns, dry_run="All")
                kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    # A dry run stores nothing.
    apps = k8s.AppsV1Api(cluster.api)
    assert all(d.metadata.name != "sandhub-hub" for d in apps.list_namespaced_deployment(cluster.ns).items)


def test_hub_role_grants_only_what_the_backend_uses(cluster: Cluster):
    role = next(
        d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d and d["kind"] == "Role"
    )
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs[("", "secrets")] == {"get"}
    secret_rule = next(r for r in role["rules"] if r["resources"] == ["secrets"])
    assert secret_rule["resourceNames"] == ["sandboxd-token"], "the hub may read one Secret only"
    assert "update" not in set().union(*verbs.values()) and "*" not in set().union(*verbs.values())
