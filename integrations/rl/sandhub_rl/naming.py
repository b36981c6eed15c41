"""Names and labels the fleet puts on the hub, and how the reaper reads them
back. Pure functions: the fleet, the async fleet and the reaper share them,
so what one writes the other always recognises.

- Every sandbox of a fleet carries ``sandhub-rl/managed=true`` and
  ``sandhub-rl/run=<run_id>`` (and ``sandhub-rl/task=<task id>`` when the id
  fits a label value).
- An image task's template is ``rl-img-<16 hex>``, named by the content of
  its spec (image + limits + extras), so runs with the same settings share it.
- A run's warm pool is ``rlp-<8 hex of run_id>-<8 hex of template>-<created,
  base 36 seconds>``: pools carry no labels and no creation time on the hub,
  so the name says whose it is and how old it is.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Mapping

__all__ = [
    "MANAGED_LABEL",
    "RUN_LABEL",
    "TASK_LABEL",
    "POOL_PREFIX",
    "image_template_name",
    "pool_name",
    "parse_pool_name",
    "run_hash",
    "sandbox_labels",
]

MANAGED_LABEL = "sandhub-rl/managed"
RUN_LABEL = "sandhub-rl/run"
TASK_LABEL = "sandhub-rl/task"
POOL_PREFIX = "rlp-"
IMAGE_TEMPLATE_PREFIX = "rl-img-"

_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
_POOL_RE = re.compile(r"^rlp-([0-9a-f]{8})-([0-9a-f]{8})-([0-9a-z]{1,12})$")
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def run_hash(run_id: str) -> str:
    """The 8 hex digits of ``run_id`` that its pools' names carry."""
    return _hex(run_id, 8)


def sandbox_labels(run_id: str, task_id: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels of a run's sandbox (the fleet's own keys win over ``extra``)."""
    labels = dict(extra or {})
    labels[MANAGED_LABEL] = "true"
    labels[RUN_LABEL] = run_id
    if _LABEL_VALUE_RE.match(task_id):
        labels[TASK_LABEL] = task_id
    else:
        labels.pop(TASK_LABEL, None)
    return labels


def image_template_name(spec: Mapping[str, Any]) -> str:
    """The template name for a spec: the same spec always gets the same name."""
    canonical = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"))
    return IMAGE_TEMPLATE_PREFIX + _hex(canonical, 16)


def _b36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _B36[r] + out
        if n == 0:
            return out


def pool_name(run_id: str, template: str, now: float | None = None) -> str:
    """A new pool name for ``run_id``'s warm sandboxes of ``template``."""
    created = int(time.time() if now is None else now)
    return f"{POOL_PREFIX}{run_hash(run_id)}-{_hex(template, 8)}-{_b36(created)}"


def parse_pool_name(name: str) -> tuple[str, float] | None:
    """``(run hash, created unix time)`` of a fleet pool's name; None for any other pool."""
    m = _POOL_RE.match(name)
    if m is None:
        return None
    return m.group(1), float(int(m.group(3), 36))
