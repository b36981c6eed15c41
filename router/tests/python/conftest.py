"""The router suite's fixtures: real `sandboxd` daemons and the real
`sandhub-router` binary from sandhub_testing, and the suite's own small
backends and scoped-token secret from router_harness (a uniquely named
module, so test files can import its helpers without clashing with other
suites' conftest modules). Importing them here registers them with pytest.

Binaries: SANDBOXD_BIN / SANDHUB_ROUTER_BIN, else `$CARGO_TARGET_DIR/debug/...`,
else `target/debug/...`. A missing binary skips locally and fails under CI=true.
Cluster tests read SANDHUB_TEST_KUBECONFIG the same way.
"""

from router_harness import http_echo, secret_file, silent_backend, ws_echo  # noqa: F401 - fixtures
from sandhub_testing.fixtures import (  # noqa: F401 - fixtures
    make_router,
    router,
    router_bin,
    sandboxd,
    sandboxd_bin,
    sandboxd_env,
)
