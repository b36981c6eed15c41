"""Sandhub sandboxes as DeerFlow's sandbox provider.

``config.yaml``::

    sandbox:
      use: sandhub_deerflow:SandhubSandboxProvider
      sandhub_url: http://127.0.0.1:7070

DeerFlow's tools then run in one Sandhub sandbox per thread; its virtual
paths (``/mnt/user-data/...``) live under ``/workspace`` there (see
:mod:`sandhub_deerflow._paths`). Importing this package needs DeerFlow's
harness (``deerflow-harness``, installed from its source).
"""

try:
    import deerflow.sandbox  # noqa: F401 - the framework this package plugs into
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sandhub_deerflow needs DeerFlow's harness (the `deerflow` package, dist deerflow-harness), "
        "which is not on the package index: install it from DeerFlow's source "
        "(backend/packages/harness and backend/packages/extension-api)"
    ) from err

from ._paths import DEFAULT_REAL_ROOT, USER_DATA_DIRS, VIRTUAL_ROOT, PathMap
from ._provider import LABEL_APP, LABEL_THREAD, LABEL_USER, SandhubSandboxProvider, label_value
from ._sandbox import DEFAULT_TIMEOUT_SECONDS, SandhubSandbox
from ._settings import Settings

__all__ = [
    "DEFAULT_REAL_ROOT",
    "DEFAULT_TIMEOUT_SECONDS",
    "LABEL_APP",
    "LABEL_THREAD",
    "LABEL_USER",
    "USER_DATA_DIRS",
    "VIRTUAL_ROOT",
    "PathMap",
    "SandhubSandbox",
    "SandhubSandboxProvider",
    "Settings",
    "label_value",
]
