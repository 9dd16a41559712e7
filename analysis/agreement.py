"""What a study concludes, and whether two sets of runs conclude the same.

The conclusions are the report's: the lr chosen per (dataset, condition) on validation, the
ranking of the conditions by mean test accuracy at it, and every significance call at 5%
(Wilcoxon and t of the reference against each other condition, Friedman, Holm-corrected pairwise
Wilcoxon). ``compare`` counts where a second set of runs (a policy's replay, a reseeding, another
recording of the same grid) agrees with the first.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pandas as pd
from scipy import stats as st

from analysis.stats import paired, selection, significance

ALPHA = 0.05


def calls_of(table: pd.DataFrame, reference: str = "MHA", alpha: float = ALPHA) -> dict[str, bool]:
    """Every significance call at ``alpha`` on a datasets × conditions ``table`` of test
    accuracies (conditions with a missing dataset left out): name -> significant. The p-values are
    those of ``significance.paired_tests`` (its default alternatives), ``significance.friedman`` and
    ``significance.pairwise_wilcoxon``, computed without their effect sizes: a floor calls this per replicate."""
    calls: dict[str, bool] = {}
    complete = table.dropna(axis=1, how="any")
    if complete.shape[0] < 2 or complete.shape[1] < 2:
        return calls
    cols = {c: complete[c].to_numpy(float) for c in complete.columns}
    if reference in cols:
        for other, b in cols.items():
            if other != reference:
                calls[f"wilcoxon {reference} > {other}"] = bool(
                    paired.wilcoxon(cols[reference], b, "greater")[1] <= alpha
                )
                calls[f"t {reference} vs {other}"] = bool(paired.paired_t(cols[reference], b, "two-sided")[1] <= alpha)
    fr = significance.friedman(complete)
    if not math.isnan(fr["p"]):
        calls["friedman"] = bool(fr["p"] <= alpha)
    pairs = list(itertools.combinations(complete.columns, 2))
    p = [paired.wilcoxon(cols[a], cols[b], "two-sided")[1] for a, b in pairs]
    for (a, b), q in zip(pairs, paired.holm(p)):
        calls[f"holm {a} vs {b}"] = bool(q <= alpha)
    return calls


def conclusions(runs: pd.DataFrame, reference: str = "MHA", alpha: float = ALPHA) -> dict[str, Any]:
    """What the report concludes from ``runs``: the lr chosen per cell (on validation), the mean
    test accuracy of each condition at it, and every significance call at ``alpha``."""
    means = selection.seed_means(runs)
    best = selection.choose_lrs(runs, "val")
    table = selection.wide(best)
    chosen = {(r.dataset, r.condition): r.lr for r in best.itertuples()}
    complete = table.dropna(axis=1, how="any")
    val = {(r.dataset, r.condition, r.lr): r.val_mean for r in means.itertuples()}
    return {
        "chosen_lr": chosen,
        "val_mean": val,
        "mean": table.mean(axis=0).sort_values(ascending=False),
        "calls": calls_of(table, reference, alpha),
        "missing": [c for c in table.columns if c not in complete.columns],
    }


def compare(full: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Does ``other`` conclude what ``full`` does? Lr per cell, ranking, significance calls."""
    cells = sorted(full["chosen_lr"])
    same = [c for c in cells if same_lr(full["chosen_lr"][c], other["chosen_lr"].get(c))]
    conds = [c for c in full["mean"].index if c in other["mean"].index and not math.isnan(other["mean"][c])]
    tau = float(st.kendalltau(full["mean"][conds], other["mean"][conds]).statistic) if len(conds) >= 2 else math.nan
    top = (full["mean"].index[0], other["mean"].dropna().index[0] if other["mean"].notna().any() else None)
    flips = [name for name, v in full["calls"].items() if other["calls"].get(name) != v]
    # what a changed lr costs, on the full grid's own validation means (accuracy points x 100)
    regret = (
        [
            full["val_mean"][(d, c, full["chosen_lr"][(d, c)])]
            - full["val_mean"].get((d, c, other["chosen_lr"].get((d, c))), math.nan)
            for d, c in cells
            if (d, c) not in same
        ]
        if "val_mean" in full
        else []
    )
    return {
        "cells": len(cells),
        "same_lr": len(same),
        "lr_changed": [
            f"{d}/{c}: {full['chosen_lr'][(d, c)]:g} -> {other['chosen_lr'].get((d, c), math.nan):g}"
            for d, c in cells
            if (d, c) not in same
        ],
        "lr_regret_max": 100 * max(regret, default=0.0),
        "kendall_tau": tau,
        "top1": top[0],
        "top1_replay": top[1],
        "same_top1": top[0] == top[1],
        "calls": len(full["calls"]),
        "flips": flips,
    }


def same_lr(a: float, b: float | None) -> bool:
    """Whether two chosen lrs are the same (both NaN: no lr chosen either way)."""
    return b is not None and (a == b or (math.isnan(a) and math.isnan(b)))
