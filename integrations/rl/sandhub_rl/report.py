"""What teardown and the reaper report: plain data a trainer can log or assert on."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TeardownReport", "FleetStats"]


@dataclass
class TeardownReport:
    """The end of a run on the hub.

    ``deleted_*`` is what this teardown removed; ``left_*`` what a listing
    after it still found carrying the run's label or pool name (empty when
    ``verify`` was off: nothing was checked, see ``verified``); ``errors``
    the failures met on the way (one line each)."""

    run_id: str
    deleted_sandboxes: list[str] = field(default_factory=list)
    deleted_pools: list[str] = field(default_factory=list)
    left_sandboxes: list[str] = field(default_factory=list)
    left_pools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verified: bool = False

    @property
    def clean(self) -> bool:
        """Verified, and nothing of the run is left."""
        return self.verified and not self.left_sandboxes and not self.left_pools


@dataclass
class FleetStats:
    """Counters of one fleet (read them for logs and benchmarks)."""

    acquired: int = 0
    released: int = 0
    warm: int = 0
    cold: int = 0
    lost: int = 0
    start_failures: int = 0
    start_retries: int = 0
    setup_failures: int = 0
