"""Replay a finished grid under an allocation policy, without training: what it would have cost
and whether the study would have concluded the same (``raystudy replay`` is its command line).

``recorded`` reads a finished grid from MLflow (``analysis.recordings`` from a file); ``replay``
runs the policy of ``raystudy.spaces.adaptive`` over it, exactly as the live grid's scheduler
does, and compares its conclusions with the full grid's (``analysis.agreement``) and, given the
floor, judges them (``analysis.floor``); ``summary_line`` and ``across_line`` say it in a line,
``write`` puts it on disk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import AnalysisError, floor, load
from analysis.agreement import compare, conclusions
from raystudy.spaces import adaptive
from raystudy.tracking import query, views

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


def across_line(c: dict[str, Any]) -> str:
    """One line of ``floor.across``: the two recordings' agreement, the statistics of a replay."""
    return (
        f"same lr in {c['same_lr']} of {c['cells']} cells; Kendall tau {c['kendall_tau']:.3f}; "
        f"top-1 {c['top1']} -> {c['top1_replay']}; {len(c['flips'])} of {c['calls']} significance calls flip"
        + (f" ({', '.join(c['flips'])})" if c["flips"] else "")
    )
