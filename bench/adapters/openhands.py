"""The adapter's overhead on `true`: `SandhubWorkspace.execute_command("true")` (the
OpenHands framework call through the agent server in the sandbox) against a bare
`sandbox.commands.run("true")` through the sandhub SDK, in the same sandbox of the
same hub. Prints p50/p90 of each and the p50 ratio.

    python bench/adapters/openhands.py [--hub URL] [--api-key KEY]
        [--template NAME] [--calls 100] [--connection auto|proxy|tunnel]

Without --hub it starts its own `sandhub serve` (SANDHUB_BIN, as the tests do) and
imports the agent-server image (dev/openhands/build-image.py, cached) into it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import sandhub  # noqa: E402

from sandhub_openhands import SandhubWorkspace, agent_server_template  # noqa: E402


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1000)
    return out


def pct(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1] if len(samples) > 1 else samples[0]


def own_hub(stack: ExitStack) -> tuple[str, str]:
    from sandhub_testing import REPO_ROOT, binary, running_hub

    key = "bench-openhands-key-0123456789"
    hub = stack.enter_context(running_hub(binary("sandhub"), Path(tempfile.mkdtemp()), api_keys={key: "bench"}))
    cache = os.environ.get("SANDHUB_CACHE") or str(Path.home() / ".cache/sandhub")
    builder = str(REPO_ROOT / "dev/openhands/build-image.py")
    out = subprocess.run([sys.executable, builder, "--cache", cache, "--python", os.path.realpath(sys.executable)],
                         check=True, capture_output=True, text=True)
    layout = json.loads(out.stdout.strip().splitlines()[-1])["layout"]
    image = sandhub.Hub(hub.url, key).images.import_(layout)
    sandhub.Hub(hub.url, key).templates.put("bench-openhands", agent_server_template(image.tags[0]))
    return hub.url, key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hub")
    ap.add_argument("--api-key")
    ap.add_argument("--template", default="bench-openhands")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--connection", default="auto", choices=["auto", "proxy", "tunnel"])
    args = ap.parse_args()
    with ExitStack() as stack:
        url, key = (args.hub, args.api_key) if args.hub else own_hub(stack)
        ws = stack.enter_context(SandhubWorkspace(
            hub_url=url, hub_api_key=key, template=args.template, connection=args.connection))
        sandbox = ws.sandbox
        for _ in range(5):  # warm both paths (connections, the server's first command)
            assert ws.execute_command("true").exit_code == 0
            assert sandbox.commands.run("true").exit_code == 0
        bare = timed(lambda: sandbox.commands.run("true"), args.calls)
        framework = timed(lambda: ws.execute_command("true"), args.calls)
        mode = ws.route
    b50, f50 = statistics.median(bare), statistics.median(framework)
    print(f"sandbox.commands.run('true')           p50 {b50:7.2f} ms  p90 {pct(bare, 90):7.2f} ms  (n={len(bare)})")
    print(f"SandhubWorkspace.execute_command('true') p50 {f50:7.2f} ms  p90 {pct(framework, 90):7.2f} ms"
          f"  (n={len(framework)}, connection={mode})")
    print(f"overhead ratio (p50): {f50 / b50:.2f}x")


if __name__ == "__main__":
    main()
