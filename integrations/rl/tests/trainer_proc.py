"""A stand-in trainer for the orphan tests, run as its own process:

    python trainer_proc.py HUB_URL RUN_ID EPISODES WARM

acquires EPISODES sandboxes of the default template through a fleet of run
RUN_ID (with a warm pool of WARM per template), prints one JSON line
``{"sandboxes": [...]}`` and then waits to be killed, mid-run, never
reaching teardown.
"""

from __future__ import annotations

import json
import sys
import time

from sandhub_rl import FleetConfig, SandboxFleet, Task


def main() -> None:
    url, run_id, episodes, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fleet = SandboxFleet(url, FleetConfig(run_id=run_id, warm_per_template=warm))
    handles = [fleet.acquire(Task(id=f"ep-{n}", template="default")) for n in range(episodes)]
    print(json.dumps({"sandboxes": [h.sandbox_id for h in handles]}), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
