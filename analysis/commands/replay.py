"""Replay a finished grid under an allocation policy, without training: what it would have cost
and whether the study would have concluded the same.

    python -m analysis.replay --experiment raystudy-demo_adaptive-vit_demo --policy race
    python -m analysis.replay --experiment NAME --policy all --out replay_out    # every policy
    python -m analysis.replay --recording benchmarks/recordings/s012.csv.gz --policy all   # from a file
    python -m analysis.replay --experiment NAME --save-recording s012.csv.gz --policy identity

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

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import AnalysisError, floor, load, recordings
from analysis.agreement import compare, conclusions
from raystudy.spaces import adaptive
from raystudy.tracking import connect, query, views

# ---------------------------------------------------------------- the recorded grid


def recorded(experiment: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """A finished grid from MLflow: ``runs`` (the runs table, one row per trial key, with
    ``steps_done`` and ``wall_s``), ``trials`` and ``seen`` (the policy's view of it)."""
    cl = load.client(tracking_uri)
    exp_id = load.experiment_id(experiment, tracking_uri)
    found = query.find_runs(cl, exp_id, raystudy__role="trial")
    if not found:
        raise AnalysisError(f"experiment {experiment!r} has no trial runs to replay")
    table = pd.DataFrame(query.rows(found), columns=load.RUN_COLUMNS + load.EXTRA_COLUMNS)
    runs, _ = load.dedupe(table)
    by_id = {r.info.run_id: r for r in found}
    trials, seen, steps_done, wall = [], {}, [], []
    for row in runs.itertuples():
        run = by_id[row.run_id]
        trials.append(adaptive.trial_of(row.key, query.run_config(run.data.params)))
        seen[row.key] = views.policy_view(cl, run)
        steps_done.append(run.data.metrics.get("steps_done", math.nan))
        wall.append(run.data.metrics.get("wall_s", math.nan))
    runs = runs.assign(steps_done=steps_done, wall_s=wall).reset_index(drop=True)
    load.check_runs(runs, f"experiment {experiment!r}")
    runs.attrs.update(source=f"MLflow experiment {experiment!r}", experiment=experiment)
    return {"runs": runs, "trials": trials, "seen": seen}


# ---------------------------------------------------------------- replay


def apply(runs: pd.DataFrame, decisions: dict[str, adaptive.Stop]) -> pd.DataFrame:
    """The runs table as the policy leaves it: a stopped trial is ``stopped`` with no accuracy
    (unless it ended, diverged or failed, before the step it would be stopped at), and
    ``spent_steps`` / ``spent_s`` are what each trial runs (seconds per step as recorded)."""
    out = runs.copy()
    done = out["steps_done"].astype(float).fillna(0.0)
    spent = done.copy()
    status = out["status"].copy()
    for i, key in enumerate(out["key"]):
        stop = decisions.get(key)
        if stop is None:
            continue
        ended_before = status[i] in ("diverged", "failed") and done[i] <= stop.step
        if not ended_before:
            status[i] = "stopped"
            spent[i] = min(done[i], stop.step) if done[i] else 0.0
    out["status"] = status
    for col in ("val_acc", "test_acc"):
        out[col] = out[col].where(out["status"] == "finished")
    wall = out["wall_s"].astype(float).fillna(0.0)
    per_step = wall / done.where(done > 0)
    # a trial without steps (the linear probe) costs its seconds if it runs at all
    out["spent_steps"] = spent
    out["spent_s"] = np.where(done > 0, spent * per_step.fillna(0.0), np.where(out["status"] == "stopped", 0.0, wall))
    out["stop_rule"] = [
        decisions[k].rule if k in decisions and s == "stopped" else "" for k, s in zip(out["key"], out["status"])
    ]
    return out


def replay(
    grid: dict[str, Any], policy: adaptive.Policy, reference: str = "MHA", against: floor.Floor | None = None
) -> dict[str, Any]:
    """``policy`` over a recorded ``grid`` (``recorded``): its decisions, the runs it leaves,
    what it spends against the full grid, how its conclusions compare and, given the floor
    ``against``, the verdict of ``floor.verdict``."""
    decisions = adaptive.decide(policy, grid["trials"], grid["seen"])
    full = apply(grid["runs"], {})
    runs = apply(grid["runs"], decisions)
    try:
        agreement = compare(conclusions(full, reference), conclusions(runs, reference))
    except AnalysisError as e:
        agreement = {"error": str(e)}
    if against is not None and "error" not in agreement:
        agreement["verdict"] = floor.verdict(agreement, against)
    steps, full_steps = float(runs["spent_steps"].sum()), float(full["spent_steps"].sum())
    secs, full_secs = float(runs["spent_s"].sum()), float(full["spent_s"].sum())
    return {
        "policy": policy.name,
        "decisions": decisions,
        "runs": runs,
        "stopped": int((runs["status"] == "stopped").sum()),
        "trials": len(runs),
        "steps": steps,
        "full_steps": full_steps,
        "step_fraction": steps / full_steps if full_steps else math.nan,
        "hours": secs / 3600,
        "full_hours": full_secs / 3600,
        **agreement,
    }


def summary_line(r: dict[str, Any]) -> str:
    """One line of a ``replay`` result: trials stopped, steps and device-hours spent against the
    full grid, and how its conclusions compare (lr choice, ranking, significance calls), with the
    floor's verdict when it was measured."""
    if "error" in r:
        return f"{r['policy']}: {r['stopped']} of {r['trials']} trials stopped; no conclusions: {r['error']}"
    return (
        f"{r['policy']}: {r['stopped']} of {r['trials']} trials stopped; steps "
        f"{r['steps']:,.0f} of {r['full_steps']:,.0f} ({100 * r['step_fraction']:.1f}%); "
        f"device-hours {r['hours']:.3f} of {r['full_hours']:.3f}; same lr in {r['same_lr']} of "
        f"{r['cells']} cells (worst change costs {r['lr_regret_max']:.2f} val-acc points); "
        f"Kendall tau {r['kendall_tau']:.3f}; top-1 {r['top1']} -> "
        f"{r['top1_replay']}; {len(r['flips'])} of {r['calls']} significance calls flip"
        + (f" ({', '.join(r['flips'])})" if r["flips"] else "")
        + (f"; {floor.verdict_text(r['verdict'])}" if "verdict" in r else "")
    )


def write(out: Path, results: list[dict[str, Any]]) -> list[Path]:
    """``replay.json`` (every number, no tables) and ``decisions_<policy>.csv`` per policy."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for r in results:
        path = out / f"decisions_{r['policy']}.csv"
        cols = [
            "key",
            "dataset",
            "condition",
            "optimizer",
            "lr",
            "seed",
            "status",
            "stop_rule",
            "spent_steps",
            "steps_done",
            "spent_s",
        ]
        r["runs"][cols].to_csv(path, index=False)
        files.append(path)
    doc = [{k: v for k, v in r.items() if k not in ("decisions", "runs")} for r in results]
    (out / "replay.json").write_text(json.dumps(doc, indent=2, default=str))
    return files + [out / "replay.json"]


def _parser():
    """The command line's arguments."""
    from raystudy import cli

    ap = cli.Parser("python -m analysis.replay", __doc__)
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
        from raystudy import cli

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
    from raystudy import cli
    from raystudy.errors import ConfigError

    args = _parser().parse_args(argv)
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


def across_line(c: dict[str, Any]) -> str:
    """One line of ``floor.across``: the two recordings' agreement, the statistics of a replay."""
    return (
        f"same lr in {c['same_lr']} of {c['cells']} cells; Kendall tau {c['kendall_tau']:.3f}; "
        f"top-1 {c['top1']} -> {c['top1_replay']}; {len(c['flips'])} of {c['calls']} significance calls flip"
        + (f" ({', '.join(c['flips'])})" if c["flips"] else "")
    )


if __name__ == "__main__":
    sys.exit(main())
