"""Gymnasium vector-env throughput: `SandhubVectorEnv.step` (N actions in one
`/gym/v1/step` round trip) against the same loop over N single `SandhubEnv.step` calls,
in one run, for each N.

    SANDHUB_URL=http://127.0.0.1:7070 python bench/adapters/vector.py --envs 8,64

Prints, per N: `N envs: vector <x> steps/s, single-step loop <y> steps/s, ratio <x/y>`
(a step = one action in one env); --json: one JSON object per N.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import sandhub
import sandhub_gymnasium  # noqa: F401 - registers Sandhub/Shell-v0

ENV_ID = "sandhub_gymnasium:Sandhub/Shell-v0"
#: 64 sandboxes at the default memory limit would pass a tenant's default memory quota.
TEMPLATE = "bench-vector"


def vector_steps_per_s(url: str, n: int, rounds: int) -> float:
    envs = gym.make_vec(ENV_ID, num_envs=n, hub_url=url, template=TEMPLATE)
    try:
        envs.reset(seed=0)
        actions = ("true",) * n
        envs.step(actions)  # warm: every sandbox has run once
        t = time.perf_counter()
        for _ in range(rounds):
            envs.step(actions)
        return n * rounds / (time.perf_counter() - t)
    finally:
        envs.close()


def single_steps_per_s(url: str, n: int, rounds: int) -> float:
    envs = [gym.make(ENV_ID, hub_url=url, template=TEMPLATE, disable_env_checker=True) for _ in range(n)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
            env.step("true")
        t = time.perf_counter()
        for _ in range(rounds):
            for env in envs:
                env.step("true")
        return n * rounds / (time.perf_counter() - t)
    finally:
        for env in envs:
            env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="8,64", help="comma-separated env counts")
    parser.add_argument("--rounds", type=int, default=30, help="vector steps timed per count")
    parser.add_argument("--memory-mb", type=int, default=256, help="each sandbox's memory limit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    url = os.environ.get("SANDHUB_URL", "http://127.0.0.1:7070")
    sandhub.Hub(url).templates.put(TEMPLATE, {"memory_mb": args.memory_mb})
    for n in (int(x) for x in args.envs.split(",")):
        vector = vector_steps_per_s(url, n, args.rounds)
        single = single_steps_per_s(url, n, args.rounds)
        if args.json:
            print(json.dumps({"envs": n, "vector_steps_per_s": vector, "single_steps_per_s": single,
                              "ratio": vector / single}))
        else:
            print(f"{n} envs: vector {vector:.0f} steps/s, single-step loop {single:.0f} steps/s, "
                  f"ratio {vector / single:.2f}x")


if __name__ == "__main__":
    main()
