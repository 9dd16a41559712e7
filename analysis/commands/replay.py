"""Replay a finished grid under an allocation policy, without training: what it would have cost
and whether the study would have concluded the same.

    python -m raystudy replay --experiment raystudy-demo_adaptive-vit_demo --policy race
    python -m raystudy replay --experiment NAME --policy all --out replay_out    # every policy
    python -m raystudy replay --recording benchmarks/recordings/s012.csv.gz --policy all   # from a file
    python -m raystudy replay --experiment NAME --save-recording s012.csv.gz --policy identity

From what MLflow holds of each trial (validation accuracy by step, the test accuracy of the
best-validation checkpoint, steps run and wall-clock seconds), the policy of
``raystudy.spaces.adaptive`` decides which trials stop when, exactly as the live grid's scheduler does
(``python -m raystudy.grid --adaptive POLICY``). A stopped trial keeps no accuracy: it lost the
lr choice. Reported: trials stopped, steps and device-hours spent (seconds per step as
measured), and against the full grid: the lr chosen per (dataset, condition), the ranking of the
conditions (Kendall tau of their mean test accuracies, identical top-1) and every significance
call at 5% of the report (Wilcoxon and t of the reference against each other condition,
Friedman, Holm-corrected pairwise Wilcoxon) that flips; and beside it, the floor: how far
reseeding the full grid alone moves the same statistics (``analysis.floor``), with the verdict
of its rule (conclusion-preserving or not). ``--reseeded`` names a second recording of the same
grid with other seeds: the direct comparison of the two, the floor's second measure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import AnalysisError, floor, recordings
from analysis.replaying import across_line, apply, recorded, replay, summary_line, write
from raystudy.spaces import adaptive
from raystudy.tracking import connect


def build_parser():
    """The command line of ``raystudy replay``."""
    from raystudy.commands import cli

    ap = cli.Parser("raystudy replay", __doc__)
    ap.add_argument("--experiment", help="MLflow experiment of a finished grid")
    ap.add_argument("--recording", help="a finished grid's file (analysis.recordings), instead of --experiment")
    ap.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db, as the grid)",
    )
    ap.add_argument("--policy", required=True, help=f"allocation policy: {', '.join(adaptive.POLICIES)}, or all")
    ap.add_argument("--reference", default="MHA", help="condition tested against the others (MHA)")
    ap.add_argument("--reps", type=int, default=200, help="reseedings the floor is measured on (200; 0: no floor)")
    ap.add_argument("--reseeded", help="a recording (file) of the same grid with other seeds: compared directly")
    ap.add_argument("--save-recording", help="write the grid read to this file (.csv.gz) for replays from a clone")
    ap.add_argument("--out", help="folder for replay.json and the decisions of each policy")
    return ap


def _grid(args) -> dict[str, Any]:
    """The recorded grid the arguments name; AnalysisError or ConfigError for bad input."""
    from raystudy.errors import ConfigError

    if (args.experiment is None) == (args.recording is None):
        raise ConfigError("give one of --experiment NAME (an MLflow store) or --recording FILE (analysis.recordings)")
    if args.reps < 0:
        raise ConfigError(f"--reps {args.reps}: must be 0 (no floor) or more")
    if args.reseeded is not None and not Path(args.reseeded).is_file():
        raise ConfigError(f"--reseeded {args.reseeded!r}: no such file (a recording: analysis.recordings)")
    if args.out:
        from raystudy.commands import cli

        cli.check_folder("--out", args.out)
    if args.recording is not None:
        return recordings.load(Path(args.recording))
    uri = args.tracking_uri or connect.default_uri()
    connect.check_uri(uri)
    return recorded(args.experiment, uri)


def _floor(full: pd.DataFrame, reference: str, reps: int) -> floor.Floor | None:
    """The full grid's floor, or None (``reps`` 0, or, in one line, why it cannot be measured)."""
    if not reps:
        return None
    try:
        return floor.floor(full, reference, reps)
    except AnalysisError as e:
        print(f"floor not measured, so no verdict: {e}")
        return None


def main(argv: list[str] | None = None) -> int:
    """Replay a recorded grid under ``--policy`` (or every policy) and print the floor and a
    summary line per policy; writes ``replay.json`` and the decisions with ``--out``. Returns the
    exit status: 0, or 2 with one ``error:`` line for bad input."""
    from raystudy.commands import cli
    from raystudy.errors import ConfigError

    args = build_parser().parse_args(argv)
    try:
        names = list(adaptive.POLICIES) if args.policy == "all" else [adaptive.policy(args.policy, "--policy").name]
        grid = _grid(args)
        other = recordings.load(Path(args.reseeded)) if args.reseeded else None
    except (AnalysisError, ConfigError) as e:
        return cli.fail(e)
    if args.save_recording:
        print(f"wrote {recordings.save(grid, Path(args.save_recording))}")
    full = apply(grid["runs"], {})
    against = _floor(full, args.reference, args.reps)
    results = [replay(grid, adaptive.policy(n), args.reference, against) for n in names]
    for r in results:
        print(summary_line(r))
        for change in r.get("lr_changed", []):
            print(f"  lr changed: {change}")
    if against is not None:  # the bars each verdict above was judged against
        print(floor.floor_line(against))
    if other is not None:
        print("another recording: " + across_line(floor.across(full, apply(other["runs"], {}), args.reference)))
    if args.out:
        files = write(Path(args.out), results)
        print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
