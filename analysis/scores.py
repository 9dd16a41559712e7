"""What the report's trust sections are computed from, which the study holds: the test accuracies
at the chosen lr as one array (``scores_of``) and the sections' options (``Options``).

Below the sections (``analysis.sections.trust`` computes them), so that ``analysis.study`` builds
a study without importing a section.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals

BOOTSTRAP_OVER = ("datasets+seeds", "seeds")
CD_CLIQUES = ("nemenyi", "wilcoxon")


@dataclass(frozen=True)
class Options:
    """The flags of the report's trust sections.

    ``rope``: half-width of the region of practical equivalence in accuracy points (percent);
    ``reps``/``seed``: bootstrap replicates and seed (the Bayesian tests use the same seed);
    ``over``: resample datasets and seeds, or seeds only (datasets fixed, rliable's default);
    ``hierarchical``: run the hierarchical Bayesian test; ``cd_cliques``: where the bars of the
    CD diagram come from.
    """

    rope: float = 0.5
    reps: int = 2000
    seed: int = 0
    over: str = "datasets+seeds"
    hierarchical: bool = True
    cd_cliques: str = "nemenyi"


def scores_of(runs: pd.DataFrame | None, best: pd.DataFrame, table: pd.DataFrame, order: list[str]) -> np.ndarray:
    """(K, D, S) test accuracies at the chosen lr; (K, D, 1) from a per-dataset summary."""
    if runs is None:
        return table[order].to_numpy(float).T[..., None]
    sel = runs.merge(best[["dataset", "condition", "lr"]], on=["dataset", "condition", "lr"])
    sel = sel[sel["status"] == "finished"]
    return intervals.score_array(sel, order, list(table.index))[0]
