"""NeMo Gym's own sandbox API on a Sandhub sandbox.

`AsyncSandbox(config, spec)` is NeMo Gym's facade; the config selects its `sandhub`
provider (found by its entry point once `sandhub-nemo-gym` is installed) and comes from the
adapter's shipped `configs/sandhub.yaml`, whose URL reads `$SANDHUB_URL`. The spec's files
and env land in the sandbox before the first command.

    SANDHUB_URL=http://127.0.0.1:7070 python examples/nemo-gym/run.py
"""

from __future__ import annotations

import asyncio

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, list_providers, resolve_provider_config
from omegaconf import OmegaConf
from sandhub_nemo_gym import CONFIG_PATH

TEST = "import solution\nassert solution.double(21) == 42\nprint('tests pass')\n"


async def main() -> None:
    assert "sandhub" in list_providers(), list_providers()
    config = resolve_provider_config("sandbox", OmegaConf.to_container(OmegaConf.load(CONFIG_PATH), resolve=True))
    spec = SandboxSpec(env={"TASK": "double"}, files={"test_solution.py": TEST})
    async with AsyncSandbox(config, spec) as sb:
        await sb.start()
        # What a policy would write, then the task's verifier: the reward is its exit code.
        await sb.exec("printf 'def double(x):\\n    return 2 * x\\n' > solution.py")
        result = await sb.exec("echo task=$TASK; python3 test_solution.py", timeout_s=30)
        print(result.stdout, end="")
        reward = 1.0 if result.return_code == 0 else 0.0
        print(f"reward {reward}")
        assert reward == 1.0 and result.stdout == "task=double\ntests pass\n", result


if __name__ == "__main__":
    asyncio.run(main())
