"""``python -m sandhub_rl``: the fleet's command line.

    python -m sandhub_rl reap --alive-run-ids [RUN ...] [--min-age-s 300] [--dry-run]

prints a JSON report on stdout (what was, or with ``--dry-run`` would be,
deleted) and exits 0, or 1 when some deletions failed, 2 on bad usage or an
unreachable hub. The hub is ``--hub`` (default ``$SANDHUB_URL``) with
``--api-key`` (default ``$SANDHUB_API_KEY``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import sandhub

from .reap import reap_orphans


def _run_ids(values: list[str]) -> list[str]:
    """Run ids given as separate words, comma lists, or both."""
    return [r for v in values for r in v.split(",") if r]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandhub_rl", description="Sandhub RL fleet tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    reap = sub.add_parser(
        "reap",
        help="delete the sandboxes and pools of training runs that are not alive",
        description="Delete the fleet sandboxes and warm pools of every run not named in --alive-run-ids "
        "that is older than --min-age-s.",
    )
    reap.add_argument(
        "--alive-run-ids", nargs="*", required=True, metavar="RUN_ID",
        help="run ids whose sandboxes must stay (space- or comma-separated); required, so that a "
        "forgotten flag never reaps every run: give it with no ids to treat every run as an orphan",
    )
    reap.add_argument("--min-age-s", type=float, default=300.0, help="spare anything younger (default 300)")
    reap.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    reap.add_argument("--hub", default=None, help="the hub's URL (default $SANDHUB_URL or http://127.0.0.1:7070)")
    reap.add_argument("--api-key", default=None, help="the hub's API key (default $SANDHUB_API_KEY)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "reap":
        if args.min_age_s < 0:
            print("--min-age-s must be >= 0", file=sys.stderr)
            return 2
        try:
            report = reap_orphans(
                sandhub.Hub(args.hub, args.api_key), _run_ids(args.alive_run_ids), args.min_age_s, args.dry_run
            )
        except sandhub.SandhubError as e:
            print(f"reap failed: {e}", file=sys.stderr)
            return 2
        print(json.dumps(report.as_dict(), indent=2))
        return 1 if report.errors else 0
    return 2  # pragma: no cover - argparse refuses unknown commands


if __name__ == "__main__":
    sys.exit(main())
