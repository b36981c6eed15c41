#!/usr/bin/env python3
"""Two hub builds side by side: `sandhub-bench hub` against an old and a new
`sandhub` binary, in alternating rounds on the same machine, and the ratio
new / old of each measurement (median and range over the rounds).

    python3 bench/old_vs_new.py --old OLD/sandhub --new NEW/sandhub \\
        [--bench target/release/sandhub-bench] [--rounds 5] [--phases exec,ports,disk]

A row's number is the bench's "measured" column (the hub's side: exec p50
through the hub, requests/s through the port proxy, ...), and a row marked
"[÷ its baseline]" is the bench's ratio to the baseline it measured in the
same run (steadier on a loaded machine); details that are
durations lists (import times) are summarised by their median. Above 1 means
slower for a latency and faster for a throughput, as in the bench itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_bench(bench: Path, hub: Path, phases: str, extra: list[str]) -> dict[str, float]:
    """One `sandhub-bench --json hub` run: measurement name -> measured amount."""
    cmd = [str(bench), "--json", "hub", "--sandhub-bin", str(hub), "--phases", phases, *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.stdout)
    numbers = {row["measurement"]: float(row["measured"]["amount"]) for row in report["rows"]}
    # The bench's own ratio against its baseline, taken in the same run
    # (direct sandboxd, wrk from the sandbox's namespace): it cancels the
    # machine's load at that moment, which a side's absolute numbers do not.
    for row in report["rows"]:
        if row.get("ratio") is not None:
            numbers[f"{row['measurement']} [÷ its baseline]"] = float(row["ratio"])
    for detail in report.get("details", []):
        value = str(detail["value"])
        # "12.3 ms, 11.9 ms, ..." style lists of import times.
        parts = [p.strip().split()[0] for p in value.split(",") if p.strip()]
        try:
            amounts = [float(p) for p in parts]
        except ValueError:
            continue
        if amounts:
            numbers[f"{detail['name']} (median)"] = statistics.median(amounts)
    return numbers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", type=Path, required=True, help="the baseline sandhub binary")
    p.add_argument("--new", type=Path, required=True, help="the sandhub binary under test")
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    p.add_argument("--bench", type=Path, default=target / "release" / "sandhub-bench")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--phases", default="exec,ports,disk")
    p.add_argument("extra", nargs="*", help="more sandhub-bench hub arguments (after --)")
    args = p.parse_args()

    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        # Alternate which goes first, so a drift in the machine's load
        # lands on both sides.
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for side in order:
            binary = args.old if side == "old" else args.new
            print(f"round {r + 1}/{args.rounds}: {side} ({binary})", file=sys.stderr, flush=True)
            runs[side].append(run_bench(args.bench, binary, args.phases, args.extra))

    names = [n for n in runs["new"][0] if all(n in run for run in runs["old"] + runs["new"])]
    print(f"| measurement | old (median) | new (median) | new / old median | range over {args.rounds} rounds |")
    print("|---|---|---|---|---|")
    for name in names:
        old = [run[name] for run in runs["old"]]
        new = [run[name] for run in runs["new"]]
        ratios = [n / o for n, o in zip(new, old) if o]
        if not ratios:
            continue
        print(
            f"| {name} | {statistics.median(old):.4g} | {statistics.median(new):.4g} | "
            f"{statistics.median(ratios):.3f} | {min(ratios):.3f}–{max(ratios):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
