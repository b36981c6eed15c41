"""The Kubernetes test cluster (dev/k8s/cluster.sh; scripts/test.sh starts it
and exports SANDHUB_TEST_KUBECONFIG): finding it, and installing our CRDs."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .binaries import binary
from .env import need
from .procs import wait_for


def cluster_kubeconfig() -> str:
    """SANDHUB_TEST_KUBECONFIG; skips (fails under CI) when there is no test cluster."""
    path = os.environ.get("SANDHUB_TEST_KUBECONFIG", "")
    need(bool(path) and os.path.isfile(path),
         "SANDHUB_TEST_KUBECONFIG is not set (scripts/test.sh starts the test cluster; "
         "by hand: bash dev/k8s/cluster.sh up DIR)")
    return path


def _create_or_replace(ext: k8s.ApiextensionsV1Api, doc: Any) -> None:
    # `doc` is parsed YAML: the client takes a dict where its types say V1CustomResourceDefinition.
    # Suites on the same cluster may install the same CRDs at once: a replace
    # that lost the race (409 on a stale resourceVersion) reads and tries again.
    for attempt in range(5):
        try:
            if attempt == 0:
                ext.create_custom_resource_definition(doc)
            else:
                current = ext.read_custom_resource_definition(doc["metadata"]["name"])
                assert current.metadata is not None
                doc["metadata"]["resourceVersion"] = current.metadata.resource_version
                ext.replace_custom_resource_definition(doc["metadata"]["name"], doc)
            return
        except ApiException as e:
            if e.status != 409 or attempt == 4:
                raise


def install_crds(api: k8s.ApiClient) -> None:
    """Creates or replaces the CRDs `sandhub-controller crd` prints, and waits
    until each is Established."""
    out = subprocess.run(
        [str(binary("sandhub-controller")), "crd"], check=True, capture_output=True, text=True,
    ).stdout
    ext = k8s.ApiextensionsV1Api(api)
    docs: list[Any] = [doc for doc in yaml.safe_load_all(out) if doc]
    for doc in docs:
        _create_or_replace(ext, doc)
    for doc in docs:
        name: str = doc["metadata"]["name"]

        def established(name: str = name) -> bool:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status is not None else None) or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_for(f"CRD {name} Established", established, timeout=30)
