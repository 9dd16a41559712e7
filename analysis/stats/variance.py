"""How the accuracy varies: its decomposition over seeds, lrs and cells, and curve bands."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.stats.selection import CELL

# ---------------------------------------------------------------- variance decomposition


def variance_decomposition(runs: pd.DataFrame, value: str = "test_acc") -> pd.DataFrame:
    """Per condition: how the spread of finished runs splits into dataset, lr and seed.

    The law of total variance over the nesting dataset > lr > seed, with every run weighted
    once (population variances, ddof 0), is exact:
    total = Var(dataset means) + E[Var of lr means within a dataset] + E[Var over seeds in a
    (dataset, lr) cell]. Returns the three parts, the total, and their shares of it.
    """
    df = runs[runs["status"] == "finished"].dropna(subset=[value])
    rows = []
    for condition, g in df.groupby("condition", sort=True):
        y = g[value].to_numpy(float)
        m_d = g.groupby("dataset")[value].transform("mean").to_numpy(float)
        m_dl = g.groupby(["dataset", "lr"])[value].transform("mean").to_numpy(float)
        parts = {
            "dataset": np.mean((m_d - y.mean()) ** 2),
            "lr": np.mean((m_dl - m_d) ** 2),
            "seed": np.mean((y - m_dl) ** 2),
        }
        total = float(np.mean((y - y.mean()) ** 2))
        row = {
            "condition": condition,
            "n_runs": len(y),
            **{f"var_{k}": float(v) for k, v in parts.items()},
            "var_total": total,
        }
        for k, v in parts.items():
            row[f"share_{k}"] = float(v / total) if total > 0 else math.nan
        rows.append(row)
    cols = [
        "condition",
        "n_runs",
        "var_dataset",
        "var_lr",
        "var_seed",
        "var_total",
        "share_dataset",
        "share_lr",
        "share_seed",
    ]
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------- curves


def curve_bands(curves: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per (dataset, condition, key, step) of step metrics.

    ``curves`` has columns run_id, key, step, value; ``runs`` maps run_id to dataset and
    condition.
    """
    df = curves.merge(runs[["run_id", "dataset", "condition"]], on="run_id")
    g = df.groupby(CELL + ["key", "step"])["value"]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "n": g.size()}).reset_index()
