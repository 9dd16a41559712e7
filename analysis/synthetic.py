"""A made-up study in the runs-table layout, for tests, benchmarks and looking at the report.

Accuracies (fractions) follow the paper's headline ordering on average (MHA ≈ FC1 > FC2 > LN2 ≈
LN1, full a little below MHA, the linear probe well below), each dataset its own base accuracy
and its own condition offsets, a quadratic optimum in log-lr per condition, and seed noise; a
few runs at the largest lr diverge. Nothing about real models is claimed by these numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load import RUN_COLUMNS

CONDITION_EFFECT = {
    "MHA": 0.0,
    "FC1": -0.001,
    "FC2": -0.005,
    "LN2": -0.009,
    "LN1": -0.010,
    "full": -0.003,
    "linear_probe": -0.05,
    "lora": -0.002,
}


def fake_runs(
    n_datasets: int = 5,
    conditions=("LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe"),
    lrs=(0.001, 0.003, 0.01, 0.03),
    seeds=(0, 1, 2),
    seed: int = 0,
    model: str = "vit_demo",
    optimizer: str = "sgd",
    diverge: float = 0.02,
) -> pd.DataFrame:
    """One row per run (``analysis.load.RUN_COLUMNS``): datasets × conditions × lrs × seeds.

    ``diverge`` is the chance that a run at the largest lr diverges (NaN accuracies).
    """
    rng = np.random.default_rng(seed)
    datasets = [f"ds{i:02d}" for i in range(n_datasets)]
    base = rng.uniform(0.72, 0.97, n_datasets)
    log_lrs = np.log10(lrs)
    rows = []
    for di, d in enumerate(datasets):
        for c in conditions:
            effect = CONDITION_EFFECT.get(c, -0.004) + rng.normal(0, 0.004)
            best_log = log_lrs.mean() + rng.normal(0.3, 0.4)
            for lr, ll in zip(lrs, log_lrs):
                lr_cost = 0.01 * (ll - best_log) ** 2
                for s in seeds:
                    test = base[di] + effect - lr_cost + rng.normal(0, 0.003)
                    val = test + rng.normal(0.01, 0.003)
                    status = "finished"
                    if lr == max(lrs) and rng.random() < diverge:
                        status, val, test = "diverged", np.nan, np.nan
                    rows.append(
                        {
                            "run_id": f"r{len(rows)}",
                            "model": model,
                            "optimizer": optimizer,
                            "low_data": False,
                            "dataset": d,
                            "condition": c,
                            "lr": float(lr),
                            "seed": int(s),
                            "val_acc": min(val, 1.0),
                            "test_acc": min(test, 1.0),
                            "status": status,
                        }
                    )
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


__all__ = ["fake_runs", "CONDITION_EFFECT"]
