"""Pure statistics over the tidy runs table and per-dataset accuracy tables.

Three shapes go in and out (see ``analysis.load`` for where they come from):

- *runs*: one row per run, columns ``dataset, condition, lr, seed, val_acc, test_acc, status``
  (``status`` ∈ finished, diverged, failed, stopped; accuracies are NaN unless finished: a
  trial an adaptive grid stopped lost the lr choice and is counted in ``n_runs`` only).
- *means*: one row per (dataset, condition, lr): ``n_runs, n, n_diverged, n_failed, val_mean,
  val_std, test_mean, test_std``, the seed statistics of finished runs (``seed_means``).
- *wide*: a datasets × conditions table of one number per cell (the accuracy at the best lr),
  the input of every test; rows are the paired observations.

Conventions. Higher accuracy is better: rank 1 is the best condition on a dataset, ties share the
average rank. Standard deviations over seeds use ``ddof=0`` by default, as the reference code
(``np.std``) does. Runs that are not finished are left out of means but counted; an lr at which
no run finished cannot be chosen. scipy does the statistics; Holm and the Nemenyi critical
difference are a few lines each and are tested on hand-worked examples. scipy is imported in
the functions that test, not at the top: every grid and search driver imports this module for
its console ranking, and importing scipy.stats is a large part of a driver's start-up
(benchmarks/bench_startup.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from analysis import AnalysisError
from analysis.stats.paired import tie_exact

CELL = ["dataset", "condition"]
SELECT_ON = ("val", "test")


# ---------------------------------------------------------------- accuracy at the best lr


def seed_means(runs: pd.DataFrame, ddof: int = 0) -> pd.DataFrame:
    """Per (dataset, condition, lr): counts by status and mean/std over finished seeds."""
    df = runs.copy()
    done = df["status"] == "finished"
    for col in ("val_acc", "test_acc"):
        df[col] = df[col].astype(float).where(done)
    df["_finished"] = done
    df["_diverged"] = df["status"] == "diverged"
    df["_failed"] = df["status"] == "failed"
    g = df.groupby(CELL + ["lr"], sort=True)
    out = pd.DataFrame(
        {
            "n_runs": g.size(),
            "n": g["_finished"].sum(),
            "n_diverged": g["_diverged"].sum(),
            "n_failed": g["_failed"].sum(),
            "val_mean": g["val_acc"].mean(),
            "val_std": g["val_acc"].std(ddof=ddof),
            "test_mean": g["test_acc"].mean(),
            "test_std": g["test_acc"].std(ddof=ddof),
        }
    ).reset_index()
    for col in ("n_runs", "n", "n_diverged", "n_failed"):
        out[col] = out[col].astype(int)
    return out


def best_lr(means: pd.DataFrame, select_on: str = "val") -> pd.DataFrame:
    """Per (dataset, condition): the lr with the highest seed-mean ``select_on`` accuracy.

    Returns the test accuracy (mean, std, ``n`` finished seeds) at that lr, the validation
    accuracy there, and the cell's diverged and failed runs over all lrs. Ties go to the smaller
    lr. A cell where no lr has a finished run keeps its row with NaN lr and accuracies.
    """
    if select_on not in SELECT_ON:
        raise AnalysisError(f"select_on must be one of {', '.join(SELECT_ON)}, got {select_on!r}")
    key = f"{select_on}_mean"
    rows = []
    for (dataset, condition), g in means.groupby(CELL, sort=False):
        g = g.sort_values("lr")
        usable = g[g[key].notna()]
        row = {
            "dataset": dataset,
            "condition": condition,
            "n_diverged": int(g["n_diverged"].sum()),
            "n_failed": int(g["n_failed"].sum()),
        }
        if usable.empty:
            row.update(lr=np.nan, test_mean=np.nan, test_std=np.nan, val_mean=np.nan, val_std=np.nan, n=0)
        else:
            best = usable.loc[usable[key].idxmax()]
            row.update(
                lr=float(best["lr"]),
                test_mean=best["test_mean"],
                test_std=best["test_std"],
                val_mean=best["val_mean"],
                val_std=best["val_std"],
                n=int(best["n"]),
            )
        rows.append(row)
    cols = ["dataset", "condition", "lr", "test_mean", "test_std", "val_mean", "val_std", "n", "n_diverged", "n_failed"]
    return pd.DataFrame(rows, columns=cols)


def choose_lrs(runs: pd.DataFrame, select_on: str = "val", ddof: int = 0) -> pd.DataFrame:
    """Per (dataset, condition) of the runs table: the lr chosen on ``select_on``, with the test
    accuracy there, as ``best_lr`` of ``seed_means`` (``ddof`` their seed std): the lr choice of
    every table, test, figure and export."""
    return best_lr(seed_means(runs, ddof), select_on)


def check_complete(best: pd.DataFrame, value: str = "test_mean") -> None:
    """Raise AnalysisError naming every condition that lacks a result on some dataset."""
    datasets = sorted(best["dataset"].unique())
    problems = []
    for condition in best["condition"].unique():
        sub = best[best["condition"] == condition].set_index("dataset")[value]
        absent = [d for d in datasets if d not in sub.index]
        empty = [d for d in datasets if d in sub.index and pd.isna(sub[d])]
        if absent:
            problems.append(
                f"condition {condition!r} has no runs on {len(absent)} of {len(datasets)} datasets: {', '.join(absent)}"
            )
        if empty:
            problems.append(f"condition {condition!r} has no usable finished run on {', '.join(empty)}")
    if problems:
        raise AnalysisError(
            "; ".join(problems) + " (restrict the analysis with --conditions or --datasets to a complete subset)"
        )


def wide(best: pd.DataFrame, value: str = "test_mean", conditions: Sequence[str] | None = None) -> pd.DataFrame:
    """Datasets × conditions table of ``value``; columns in ``conditions`` order if given."""
    table = best.pivot(index="dataset", columns="condition", values=value)
    table.columns.name = None
    if conditions is not None:
        table = table[[c for c in conditions if c in table.columns]]
    return table


def order_conditions(names: Iterable[str], order: Sequence[str] = ()) -> list[str]:
    """``names`` in the order of ``order`` first, the rest sorted after it."""
    names = list(dict.fromkeys(names))
    known = [c for c in order if c in names]
    return known + sorted(c for c in names if c not in known)


RANK_TIES = ("average", "min")


def ranks(values, ties: str = "average", decimal: bool = True, partial: bool = False):
    """Ranks along the last axis of ``values`` (a datasets × conditions table, or an array, such
    as replicates × conditions): highest value = 1; returns the same kind, float ranks.

    ``decimal``: values equal in decimal tie (``tie_exact``), as in every rank-based statistic
    here; False compares the floats as they are (the stability section's replicate ranks).
    ``ties``: ``average``, tied values share the mean of their ranks (scipy's ``rankdata``, what
    the rank tests assume); ``min``, they share the best of them (every value tied at the top
    is a top-1). ``partial``: a row with a missing value still ranks the values it has (the
    figures' order); by default it has no ranks, as scipy's ``rankdata``.
    """
    if ties not in RANK_TIES:
        raise ValueError(f"ties must be one of {', '.join(RANK_TIES)}, got {ties!r}")
    frame = isinstance(values, pd.DataFrame)
    v = values.to_numpy(dtype=float) if frame else np.asarray(values, dtype=float)
    v = tie_exact(v) if decimal else v
    above = (v[..., None, :] > v[..., :, None]).sum(axis=-1)  # the values above each (NaN: none)
    if ties == "min":
        r = 1.0 + above
    else:
        r = above + ((v[..., None, :] == v[..., :, None]).sum(axis=-1) + 1) / 2
    missing = np.isnan(v)
    r = np.where(missing if partial else missing.any(axis=-1, keepdims=True), np.nan, r)
    return pd.DataFrame(r, index=values.index, columns=values.columns) if frame else r


def lr_gaps(means: pd.DataFrame, value: str = "test_mean") -> pd.DataFrame:
    """Datasets × conditions table of max − min over lrs of the seed-mean ``value``.

    Only lrs with a finished run count; a cell with none is NaN.
    """
    g = means.dropna(subset=[value]).groupby(CELL)[value]
    gaps = (g.max() - g.min()).rename("gap").reset_index()
    table = gaps.pivot(index="dataset", columns="condition", values="gap")
    table.columns.name = None
    return table


def lr_robustness(means: pd.DataFrame, value: str = "test_mean") -> pd.Series:
    """Per condition: the mean over datasets of (max − min over lrs). Lower is more robust."""
    return lr_gaps(means, value).mean(axis=0).rename("lr_robustness")


# ---------------------------------------------------------------- the paper's other tables


def relative_gain(table: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Datasets × conditions: 100 · (x − x_ref) / x_ref, each condition's gain over ``reference``
    in percent of the reference's accuracy on that dataset (the reference's own column is 0)."""
    if reference not in table.columns:
        raise AnalysisError(
            f"gain reference {reference!r} is not among the conditions: {', '.join(map(str, table.columns))}"
        )
    ref = table[reference].astype(float)
    return table.astype(float).sub(ref, axis=0).div(ref, axis=0) * 100


SPREAD = " std"  # the suffix of a setting's spread column in ``setting_means``


def setting_means(
    bests: dict[str, pd.DataFrame], conditions: Sequence[str], value: str = "test_mean", spread: str | None = None
) -> pd.DataFrame:
    """Per condition: the mean over datasets of ``value`` at the chosen lr, one column per setting.

    ``bests`` maps a setting (an optimizer for the optimizer ablation, a model, ...) to its
    ``best_lr`` table. Each condition is averaged over the datasets every setting has a number
    on (``datasets``), so the columns compare like with like; with no such dataset, NaN.
    ``spread``: also the mean over the same datasets of that column, per setting, in a column
    named after the setting with ``SPREAD`` appended.
    """
    names = list(bests)
    rows = []
    for c in conditions:
        cells = {o: b[b["condition"] == c].dropna(subset=[value]).set_index("dataset") for o, b in bests.items()}
        common = sorted(set.intersection(*(set(v.index) for v in cells.values()))) if cells else []
        row = {"condition": c, "datasets": len(common)}
        for o in names:
            row[o] = float(cells[o].loc[common, value].mean()) if common else math.nan
            if spread is not None:
                row[o + SPREAD] = float(cells[o].loc[common, spread].mean()) if common else math.nan
        rows.append(row)
    spreads = [o + SPREAD for o in names] if spread is not None else []
    return pd.DataFrame(rows, columns=["condition", "datasets", *names, *spreads]).set_index("condition")


def paper_seed(runs: pd.DataFrame) -> int:
    """The seed the paper's ablation table reads: 0 (its code passes ``seeds=[0]``), or the
    smallest seed where the runs have no seed 0."""
    seeds = set(runs["seed"].astype(int))
    return 0 if 0 in seeds or not seeds else min(seeds)


def lr_averaged(runs: pd.DataFrame, ddof: int = 0, seed: int | None = None) -> pd.DataFrame:
    """Per (dataset, condition): test accuracy averaged over every lr and seed of the grid (of
    ``seed`` alone, where given), with its std over them: the paper's ablation table, which tunes
    no lr (an lr-sensitive condition pays for its bad lrs). Finished runs only; the columns of
    ``best_lr`` that ``setting_means`` reads (``test_mean``, ``test_std``, ``n`` the runs averaged)."""
    if seed is not None:
        runs = runs[runs["seed"] == seed]
    done = runs[runs["status"] == "finished"].assign(test_acc=lambda d: d["test_acc"].astype(float))
    g = done.groupby(CELL, sort=True)["test_acc"]
    out = pd.DataFrame({"test_mean": g.mean(), "test_std": g.std(ddof=ddof), "n": g.size()}).reset_index()
    return out.astype({"n": int})


def printed(table: pd.DataFrame, scale: float, digits: int = 2) -> pd.DataFrame:
    """``table`` as a paper prints it: rounded to ``digits`` places in display units (percent
    where ``scale`` is 100), back in the table's units. Values equal when printed become equal."""
    return (table.astype(float) * scale).round(digits) / scale


def trainable_params(runs: pd.DataFrame) -> pd.DataFrame:
    """Datasets × conditions: trainable parameter count (mean over the runs that logged one).

    The count depends on the condition and, through the classifier head, on the dataset's
    number of classes, never on lr or seed; every run that logged it counts, diverged ones too.
    Empty when no run has a count.
    """
    if "trainable_params" not in runs:
        return pd.DataFrame()
    df = runs.dropna(subset=["trainable_params"])
    if df.empty:
        return pd.DataFrame()
    table = df.groupby(CELL)["trainable_params"].mean().unstack("condition")
    table.columns.name = None
    return table


def parameter_efficiency(params: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """Per condition: mean trainable parameters and mean accuracy over the datasets both have.

    ``params`` and ``accuracy`` are datasets × conditions tables (``trainable_params``,
    ``wide``). Returns ``params``, ``accuracy``, ``datasets`` and ``share_of_full`` (the count
    over the ``full`` condition's, where ``full`` is present), sorted by count.
    """
    rows = []
    for c in accuracy.columns:
        if c not in params.columns:
            continue
        both = params[c].dropna().index.intersection(accuracy[c].dropna().index)
        if len(both) == 0:
            continue
        rows.append(
            {
                "condition": c,
                "params": float(params.loc[both, c].mean()),
                "accuracy": float(accuracy.loc[both, c].mean()),
                "datasets": len(both),
            }
        )
    out = pd.DataFrame(rows, columns=["condition", "params", "accuracy", "datasets"]).set_index("condition")
    full = out["params"].get("full", math.nan)
    out["share_of_full"] = out["params"] / full
    return out.sort_values("params", kind="stable")


def display_scale(values: Iterable[float]) -> float:
    """100 when accuracies look like fractions (all within [0, 1]), else 1."""
    v = np.asarray(list(values), dtype=float)
    v = v[~np.isnan(v)]
    return 100.0 if len(v) and v.min() >= 0 and v.max() <= 1 else 1.0
