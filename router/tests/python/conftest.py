"""The router suite's fixtures live in router_harness.py (a uniquely named
module, so test files can import its helpers without clashing with other
suites' conftest modules); importing them here registers them with pytest."""

from router_harness import *  # noqa: F401,F403
from router_harness import (  # noqa: F401  (fixtures, named for readers)
    http_echo,
    make_router,
    router,
    router_bin,
    sandboxd,
    sandboxd_bin,
    secret_file,
    silent_backend,
    ws_echo,
)
