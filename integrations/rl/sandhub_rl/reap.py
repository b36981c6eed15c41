"""Orphan reaping: removing what crashed training runs left on a hub.

A trainer killed with SIGKILL never reaches ``teardown``; its sandboxes
(labelled ``sandhub-rl/run=<run_id>``) and warm pools (named
``rlp-<run hash>-...``) stay. :func:`reap_orphans`, run by a scheduler or a
supervisor that knows which runs are alive, deletes those of every other
run. ``min_age_s`` spares anything younger, so a run that just started and
is not yet in the alive list keeps its sandboxes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable

import sandhub

from . import naming

__all__ = ["ReapReport", "reap_orphans"]


@dataclass
class ReapReport:
    """What one reap found. With ``dry_run`` nothing was deleted and
    ``deleted_*`` lists what would have been."""

    dry_run: bool
    deleted_sandboxes: list[str] = field(default_factory=list)
    deleted_pools: list[str] = field(default_factory=list)
    spared_young: list[str] = field(default_factory=list)
    spared_alive: list[str] = field(default_factory=list)
    orphan_runs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "deleted_sandboxes": self.deleted_sandboxes,
            "deleted_pools": self.deleted_pools,
            "spared_young": self.spared_young,
            "spared_alive": self.spared_alive,
            "orphan_runs": self.orphan_runs,
            "errors": self.errors,
        }


def _age_s(created_at: str, now: float) -> float | None:
    """Seconds since an RFC 3339 time; None when it cannot be read (then the
    sandbox is spared: never delete what cannot be judged)."""
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    return now - created.timestamp()


def reap_orphans(
    hub: sandhub.Hub | str | None,
    alive_run_ids: Iterable[str],
    min_age_s: float = 300,
    dry_run: bool = False,
) -> ReapReport:
    """Deletes the fleet sandboxes and pools of runs not in ``alive_run_ids``
    that are at least ``min_age_s`` old. Sandboxes without the fleet's
    ``sandhub-rl/managed`` label, and pools not named by a fleet, are never
    touched. Per-item failures are collected in ``errors``, not raised."""
    if isinstance(min_age_s, bool) or not isinstance(min_age_s, (int, float)) or min_age_s < 0:
        raise ValueError(f"min_age_s must be a number >= 0, not {min_age_s!r}")
    if isinstance(alive_run_ids, str):
        raise TypeError("alive_run_ids must be an iterable of run ids, not one string")
    alive = set(alive_run_ids)
    if not all(isinstance(r, str) for r in alive):
        raise TypeError("alive_run_ids must hold run id strings")
    client = hub if isinstance(hub, sandhub.Hub) else sandhub.Hub(hub)
    alive_hashes = {naming.run_hash(r) for r in alive}
    report = ReapReport(dry_run=dry_run)
    now = time.time()
    orphan_runs: dict[str, None] = {}

    for sb in client.list({naming.MANAGED_LABEL: "true"}):
        run = sb.labels.get(naming.RUN_LABEL, "")
        if run in alive:
            report.spared_alive.append(sb.id)
            continue
        age = _age_s(sb.info.created_at, now)
        if age is None or age < min_age_s:
            report.spared_young.append(sb.id)
            continue
        orphan_runs[run] = None
        if not dry_run:
            try:
                sb.delete()
            except sandhub.NotFoundError:
                continue
            except sandhub.SandhubError as e:
                report.errors.append(f"{sb.id}: {e}")
                continue
        report.deleted_sandboxes.append(sb.id)

    for pool in client.pools.list():
        parsed = naming.parse_pool_name(pool.name)
        if parsed is None:
            continue
        run_h, created = parsed
        if run_h in alive_hashes:
            report.spared_alive.append(pool.name)
            continue
        if now - created < min_age_s:
            report.spared_young.append(pool.name)
            continue
        if not dry_run:
            try:
                client.pools.delete(pool.name)
            except sandhub.NotFoundError:
                continue
            except sandhub.SandhubError as e:
                report.errors.append(f"pool {pool.name}: {e}")
                continue
        report.deleted_pools.append(pool.name)
    report.orphan_runs = list(orphan_runs)
    return report
