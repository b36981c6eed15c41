"""Lookahead warming: warm pools sized for the episodes a trainer will start
next, and shrunk once those have started.

A trainer that knows its upcoming batches tells the fleet
(``fleet.add_tasks(batch)``); with ``FleetConfig(warmer=LookaheadWarmer(...))``
the fleet keeps, per template, as many warm sandboxes as tasks of that
template among the next ``lookahead`` planned ones (each acquire takes its
task off the plan), within ``max_per_template`` and ``max_total`` (the hub's
``--tenant-max-pool-replicas`` defaults to 32). The planner is pure; the
fleets apply its answer with pool resizes (about a millisecond each on the
local backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["LookaheadWarmer", "PoolReadiness"]


@dataclass(frozen=True)
class LookaheadWarmer:
    """How many warm sandboxes to keep for the tasks planned next."""

    lookahead: int = 16
    max_per_template: int = 8
    max_total: int = 32

    def __post_init__(self) -> None:
        for name in ("lookahead", "max_per_template", "max_total"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LookaheadWarmer.{name} must be a positive int, not {value!r}")

    def plan(self, upcoming: Sequence[str | None]) -> dict[str, int]:
        """Replicas per template for ``upcoming``: the templates of the
        planned tasks in order (None for a task no warm sandbox can serve,
        e.g. one with its own env). Earlier tasks are served first when a cap
        binds; templates not in the window are absent (meaning 0)."""
        wanted: dict[str, int] = {}
        total = 0
        for template in upcoming[: self.lookahead]:
            if template is None or total >= self.max_total:
                continue
            if wanted.get(template, 0) < self.max_per_template:
                wanted[template] = wanted.get(template, 0) + 1
                total += 1
        return wanted


@dataclass
class PoolReadiness:
    """How ready a run's warm pools are (``fleet.wait_pools_ready``): ``ready``
    of ``wanted`` warm sandboxes over all of them, per pool ``(ready,
    replicas)``, and the errors met while asking (it never raises)."""

    ready: int = 0
    wanted: int = 0
    pools: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    waited_s: float = 0.0

    @property
    def fraction(self) -> float:
        """``ready / wanted`` (1.0 when nothing is wanted)."""
        return 1.0 if self.wanted == 0 else min(1.0, self.ready / self.wanted)

    @property
    def complete(self) -> bool:
        return not self.errors and self.ready >= self.wanted
