"""Fixtures for the end-to-end tests; the helpers live in hub_k8s_support
(a unique module name: several suites have a conftest.py of their own)."""

from hub_k8s_support import cluster  # noqa: F401 - a pytest fixture
