"""Fixtures for the end-to-end tests: the cluster (sandhub_testing.hub_k8s)."""

from sandhub_testing.hub_k8s import cluster  # noqa: F401 - a pytest fixture
