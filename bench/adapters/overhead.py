"""What a framework adapter costs on `true`: the framework's own call against a bare
`sandhub` SDK call on the same hub, interleaved in one run, so both see the same machine.

    SANDHUB_URL=http://127.0.0.1:7070 <framework venv>/bin/python bench/adapters/overhead.py deepagents

Frameworks: deepagents, nemo-gym, gymnasium, deerflow, openhands (each in its own venv;
the framework is imported only when named). Prints one line:
`<framework> adapter p50 <a> ms, sdk p50 <b> ms, ratio <a/b>` and, with --json, one JSON object.
`bash bench/adapters/run.sh` starts a hub and runs every framework.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any, Callable

import sandhub

RUNS, WARMUP = 300, 30


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def series(adapter: Callable[[], Any], sdk: Callable[[], Any], runs: int) -> tuple[list[float], list[float]]:
    """Alternates the two calls, `runs` times each, after a warm-up of both."""
    for _ in range(WARMUP):
        adapter()
        sdk()
    a, b = [], []
    for _ in range(runs):
        a.append(timed(adapter))
        b.append(timed(sdk))
    return a, b


def deepagents(hub: sandhub.Hub, runs: int) -> tuple[list[float], list[float]]:
    from langchain_sandhub import SandhubSandbox

    with SandhubSandbox.create(hub) as backend:
        sb = backend.sandbox

        def adapter() -> None:
            assert backend.execute("true").exit_code == 0

        def sdk() -> None:
            assert sb.commands.run("true").exit_code == 0

        return series(adapter, sdk, runs)


def nemo_gym(hub: sandhub.Hub, runs: int) -> tuple[list[float], list[float]]:
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

    async def main() -> tuple[list[float], list[float]]:
        async with AsyncSandbox({"sandhub": {"base_url": hub.url}}, SandboxSpec()) as sb:
            await sb.start()
            raw = await sandhub.AsyncHub(hub.url).create()
            try:
                a, b = [], []
                for i in range(WARMUP + runs):
                    t = time.perf_counter()
                    r = await sb.exec("true")
                    ta = time.perf_counter() - t
                    assert r.return_code == 0, r
                    t = time.perf_counter()
                    assert (await raw.commands.run("true")).exit_code == 0
                    tb = time.perf_counter() - t
                    if i >= WARMUP:
                        a.append(ta)
                        b.append(tb)
                return a, b
            finally:
                await raw.delete()

    return asyncio.run(main())


def gymnasium(hub: sandhub.Hub, runs: int) -> tuple[list[float], list[float]]:
    """`gymnasium` env.step against the SDK's own `Env.step` (the same hub call, no adapter)."""
    import gymnasium as gym
    import sandhub_gymnasium  # noqa: F401 - registers Sandhub/Shell-v0

    env = gym.make("sandhub_gymnasium:Sandhub/Shell-v0", hub_url=hub.url, disable_env_checker=True)
    raw = hub.gym.make({})
    try:
        env.reset(seed=1)
        raw.reset(seed=1)
        return series(lambda: env.step("true"), lambda: raw.step("true"), runs)
    finally:
        env.close()
        raw.close()


def deerflow(hub: sandhub.Hub, runs: int) -> tuple[list[float], list[float]]:
    """DeerFlow's own `bash_tool` through the provider `sandbox.use:` loads (settings from
    $SANDHUB_URL: no config.yaml), against the SDK on the thread's sandbox."""
    from types import SimpleNamespace

    from deerflow.reflection import resolve_class
    from deerflow.sandbox import SandboxProvider
    from deerflow.sandbox.sandbox_provider import set_sandbox_provider
    from deerflow.sandbox.tools import bash_tool

    provider = resolve_class("sandhub_deerflow:SandhubSandboxProvider", SandboxProvider)()
    set_sandbox_provider(provider)
    try:
        runtime = SimpleNamespace(state={}, context={"thread_id": "bench", "user_id": "bench"}, config={})

        def adapter() -> None:
            assert bash_tool.func(runtime=runtime, description="bench", command="true") == "(no output)"

        adapter()  # acquires the thread's sandbox
        sb = hub.get(runtime.state["sandbox"]["sandbox_id"])

        def sdk() -> None:
            assert sb.commands.run("true").exit_code == 0

        return series(adapter, sdk, runs)
    finally:
        provider.shutdown()


FRAMEWORKS: dict[str, Callable[[sandhub.Hub, int], tuple[list[float], list[float]]]] = {
    "deepagents": deepagents,
    "nemo-gym": nemo_gym,
    "gymnasium": gymnasium,
    "deerflow": deerflow,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=sorted(FRAMEWORKS))
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    hub = sandhub.Hub(os.environ.get("SANDHUB_URL", "http://127.0.0.1:7070"))
    a, b = FRAMEWORKS[args.framework](hub, args.runs)
    pa, pb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    if args.json:
        print(json.dumps({"framework": args.framework, "adapter_p50_ms": pa, "sdk_p50_ms": pb, "ratio": pa / pb}))
    else:
        print(f"{args.framework}: adapter p50 {pa:.2f} ms, sdk p50 {pb:.2f} ms, ratio {pa / pb:.2f}x")


if __name__ == "__main__":
    main()
