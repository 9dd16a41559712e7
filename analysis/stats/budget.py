"""The tuning budget: the expected best accuracy of n trials, and whether the best lr sits at
the grid's edge."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.stats.selection import CELL

# ---------------------------------------------------------------- tuning budget


def expected_max(values: Sequence[float], n: int, follow: Sequence[float] | None = None) -> float:
    """Expected maximum of ``n`` draws with replacement from ``values`` (Dodge et al., 2019).

    With v_(1) <= ... <= v_(N) sorted, E[max of n] = sum_i v_(i) [(i/N)^n − ((i−1)/N)^n].
    With ``follow`` (paired with ``values``), the expected ``follow`` of the draw whose value is
    the maximum: the test accuracy of the configuration chosen on validation. NaN values are
    dropped; ties keep their input order.
    """
    v = np.asarray(values, dtype=float)
    f = v if follow is None else np.asarray(follow, dtype=float)
    keep = ~np.isnan(v) & ~np.isnan(f)
    v, f = v[keep], f[keep]
    if len(v) == 0 or n < 1:
        return math.nan
    order = np.argsort(v, kind="stable")
    N = len(v)
    i = np.arange(1, N + 1)
    w = (i / N) ** n - ((i - 1) / N) ** n
    return float((w * f[order]).sum())


def tuning_budget(means: pd.DataFrame, max_trials: int | None = None) -> pd.DataFrame:
    """Expected best validation accuracy, and the test accuracy there, against lrs tried.

    ``means`` is ``seed_means``: each lr of a (dataset, condition) is one trial scored by its
    seed-mean accuracies; lrs without a finished run are left out. One row per (condition,
    n_lrs) for n_lrs = 1 .. the largest grid: the expected values averaged over datasets, with
    how many datasets have a grid that large (a smaller grid's value stays at its full size).
    """
    usable = means.dropna(subset=["val_mean", "test_mean"])
    if usable.empty:
        return pd.DataFrame(columns=["condition", "n_lrs", "expected_val", "expected_test", "datasets"])
    top = int(usable.groupby(CELL).size().max()) if max_trials is None else max_trials
    rows = []
    for (_dataset, condition), g in usable.groupby(CELL, sort=True):
        val, test = g["val_mean"].to_numpy(float), g["test_mean"].to_numpy(float)
        for n in range(1, top + 1):
            rows.append((condition, n, expected_max(val, n), expected_max(val, n, test), n <= len(g)))
    df = pd.DataFrame(rows, columns=["condition", "n_lrs", "expected_val", "expected_test", "full"])
    g = df.groupby(["condition", "n_lrs"], sort=True)
    return pd.DataFrame(
        {
            "expected_val": g["expected_val"].mean(),
            "expected_test": g["expected_test"].mean(),
            "datasets": g["full"].sum().astype(int),
        }
    ).reset_index()


def lr_edges(means: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """Where the chosen lr sits in its grid: one row per (dataset, condition).

    The grid is every lr the cell has runs at (finished or not); ``edge`` is ``low`` or
    ``high`` when the chosen lr is the smallest or largest of a grid of two or more, else
    ``inside``; NaN lr (nothing usable) gives ``none``.
    """
    grids = means.groupby(CELL)["lr"].agg(["min", "max", "size"]).reset_index()
    m = best[CELL + ["lr"]].merge(grids, on=CELL, how="left")
    edge = np.where(
        m["lr"].isna(),
        "none",
        np.where(
            (m["size"] >= 2) & (m["lr"] == m["max"]),
            "high",
            np.where((m["size"] >= 2) & (m["lr"] == m["min"]), "low", "inside"),
        ),
    )
    return pd.DataFrame(
        {
            "dataset": m["dataset"],
            "condition": m["condition"],
            "lr": m["lr"],
            "grid_min": m["min"],
            "grid_max": m["max"],
            "grid_size": m["size"],
            "edge": edge,
        }
    )
