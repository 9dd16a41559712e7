"""Every adaptive policy on every recorded grid, against each recording's reseeding floor; runs from a clone.

    python benchmarks/bench_adaptive.py                    # the table of docs/adaptive.md
    python benchmarks/bench_adaptive.py --candidates       # and the policies tried for a third of the steps
    python benchmarks/bench_adaptive.py --recordings benchmarks/recordings/s012.csv.gz --reps 50

Reads the recordings under ``benchmarks/recordings/`` (``analysis.recordings``: each a finished
grid's curves, results and costs, exported with ``python -m raystudy replay --save-recording``),
measures each one's floor (``analysis.floor``: the full grid against its reseedings) and replays
each policy on it (``analysis.replaying``). Prints one markdown row per policy and recording: steps
spent, same lr of the cells, Kendall τ, calls flipped (each beside the floor's 5% quantile and
median), the verdict; then, for recordings of the same grid with other seed sets (``--pairs``),
their direct agreement.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE / "recordings"
# the settings tried for about a third of the steps (docs/adaptive.md's history), none kept as a policy
CANDIDATES = {
    "race gap 0.05": {"gap": 0.05},
    "race gap 0.03": {"gap": 0.03},
}
PAIRS = (("s012", "s345"),)  # recordings of one grid with different seed sets


def rows(name: str, grid: dict, policies: dict, reps: int) -> tuple[list[str], str]:
    """The markdown rows of ``policies`` replayed on one recording ``grid`` against its floor, and
    the floor's line."""
    from analysis import floor, replaying

    f = floor.floor(replaying.apply(grid["runs"], {}), reps=reps)
    med = {s: f.quantile(s, 0.5) for s in ("same_lr", "tau", "flips")}
    out = []
    for label, p in policies.items():
        r = replaying.replay(grid, p, against=f)
        v = r["verdict"]
        out.append(
            f"| {name} | `{label}` | {100 * r['step_fraction']:.1f}% | {r['same_lr']} of {r['cells']} "
            f"({f.bar('same_lr'):g} / {med['same_lr']:g}) | {r['kendall_tau']:.3f} ({f.bar('tau'):.3f} / "
            f"{med['tau']:.3f}) | {len(r['flips'])} of {r['calls']} (median {med['flips']:g}) | "
            + ("preserving" if v["preserving"] else "**not**: " + "; ".join(v["why"]))
            + " |"
        )
    return out, f"{name}: {floor.floor_line(f)}"


def main(argv: list[str] | None = None) -> int:
    """Print the table; 2 with one ``error:`` line when a recording is missing."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recordings", nargs="*", help="recording files (default: every one under benchmarks/recordings)")
    ap.add_argument("--reps", type=int, default=200, help="reseedings per floor (200)")
    ap.add_argument("--candidates", action="store_true", help="also the settings tried for a third of the steps")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from analysis import floor, recordings, replaying
    from raystudy.spaces import adaptive

    files = [Path(p) for p in args.recordings] if args.recordings else sorted(RECORDINGS.glob("*.csv.gz"))
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files or args.reps < 1:
        print(
            f"error: --recordings: {', '.join(missing) or 'none found'}"
            if missing or not files
            else "error: --reps must be >= 1",
            file=sys.stderr,
        )
        return 2
    policies = dict(adaptive.POLICIES)
    if args.candidates:
        policies.update({k: dataclasses.replace(adaptive.POLICIES["race"], name=k, **v) for k, v in CANDIDATES.items()})
    grids = {p.name.split(".")[0]: recordings.load(p) for p in files}
    print(
        "| recording | policy | steps | same lr (floor 5% / median) | Kendall τ (floor 5% / median) "
        "| calls flipped | verdict |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    floors = []
    for name, grid in grids.items():
        table, line = rows(name, grid, policies, args.reps)
        print("\n".join(table), flush=True)
        floors.append(line)
    print("\n" + "\n".join(floors))
    for a, b in PAIRS:
        if a in grids and b in grids:
            c = floor.across(replaying.apply(grids[a]["runs"], {}), replaying.apply(grids[b]["runs"], {}))
            print(f"\n{a} against {b}: {replaying.across_line(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
