"""prepull: a run's task images from a registry into the hub before the episodes,
each failed image reported, not raised; the fleet then starts them like any other."""

from __future__ import annotations

from pathlib import Path

import sandhub
from sandhub_testing import Registry, running_hub, test_image_layout
from conftest import LAYOUT_REF

from sandhub_rl import FleetConfig, SandboxFleet, Task, prepull, task_images


def test_task_images_are_distinct_in_order_and_skip_templates() -> None:
    tasks = [Task(id="a", image="r/x:1"), Task(id="b", template="default"), Task(id="c", image="r/x:1")]
    assert task_images([*tasks, "r/y:2"]) == ["r/x:1", "r/y:2"]


def test_prepull_then_episodes_on_the_pulled_image(sandhub_bin: Path, tmp_path: Path) -> None:
    with Registry(tmp_path / "registry") as reg:
        reg.push(test_image_layout(), "swe/task:1", ref=LAYOUT_REF)
        present, absent = f"{reg.addr}/swe/task:1", f"{reg.addr}/swe/absent:1"
        with running_hub(sandhub_bin, tmp_path / "hub", "--insecure-registry", reg.addr) as proc:
            hub = sandhub.Hub(proc.url)
            tasks = [Task(id=f"t{i}", image=present) for i in range(3)] + [Task(id="gone", image=absent)]
            result = prepull(hub, tasks)
            assert not result.ok
            assert [(i.reference, i.ok) for i in result.images] == [(present, True), (absent, False)]
            assert prepull(hub, [Task(id="tpl", template="default")]).ok  # nothing to pull

            fleet = SandboxFleet(hub, FleetConfig())
            try:
                with fleet.episode(tasks[0]) as handle:
                    assert handle.exec("python3 -c 'print(6 * 7)'").stdout == "42\n"
            finally:
                assert fleet.teardown().clean
