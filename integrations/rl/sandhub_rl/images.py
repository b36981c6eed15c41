"""A run's images onto the hub before its episodes need them.

On the local backend a template's image must already be in the hub's store (a
sandbox never starts with a surprise download), so a run pulls its tasks' images
first; on Kubernetes the same call pulls them onto the nodes (the hub's pre-pull
DaemonSets). Either way a failed image is reported per reference, not raised, so a
trainer can drop the tasks that need it and go on.
"""

from __future__ import annotations

from typing import Iterable

import sandhub

from .tasks import Task


def task_images(items: Iterable[Task | str]) -> list[str]:
    """The distinct image references of ``items`` (tasks or references), in first-seen
    order; tasks that name a template instead of an image add nothing."""
    seen: dict[str, None] = {}
    for item in items:
        ref = item.image if isinstance(item, Task) else item
        if ref:
            seen.setdefault(ref, None)
    return list(seen)


def prepull(
    hub: sandhub.Hub, items: Iterable[Task | str], *, template: str | None = None
) -> sandhub.PrepullResult:
    """Pulls every image ``items`` name where the run's sandboxes will start (the hub's
    ``POST /v1/images/prepull``; ``template`` places the pulls on Kubernetes). An image
    whose pull failed is in the result with ``ok=False`` and its ``error``."""
    refs = task_images(items)
    if not refs:
        return sandhub.PrepullResult(ok=True)
    return hub.images.prepull(refs, template=template)
