"""Plasticity pooled over pairs and seeds: intervals that count distinct pairs, per-component
means, and their rank correlation with accuracy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import AnalysisError
from analysis.stats.selection import ranks
from analysis.stats.significance import spearman
from raystudy.measure import summary

# ---------------------------------------------------------------- plasticity

PLASTICITY_GROUP = ["model", "dataset", "mode", "layer", "component"]


def t_interval(df: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """``df`` (columns n, mean, std, one measurement per row) with ``ci_low`` and ``ci_high`` after
    ``n``: the Student-t interval of the mean, mean ± t_{n-1}(level) std / sqrt(n); NaN where n < 2
    or std is not finite. At the paper's 12,800 pairs this is the normal 1.96 interval; the t
    quantile keeps it honest for the small n of tests and quick runs."""
    from scipy import stats as st

    n = df["n"].to_numpy(float)
    mean, std = df["mean"].to_numpy(float), df["std"].to_numpy(float)
    ok = (n >= 2) & np.isfinite(std)
    df1 = np.where(ok, n - 1, 1.0)  # any valid degrees of freedom where the row has no interval
    half = np.where(ok, st.t.ppf(0.5 + level / 2, df1) * std / np.sqrt(df1 + 1), np.nan)
    out = df.drop(columns=["ci_low", "ci_high"], errors="ignore")
    at = list(out.columns).index("n") + 1
    out.insert(at, "ci_low", mean - half)
    out.insert(at + 1, "ci_high", mean + half)
    return out


def pair_sets(df: pd.DataFrame) -> pd.Series:
    """Which measurements of ``df`` saw the same image pairs: one label per row.

    Sequential pairing reads every split in loader order, so every run sees the same pairs;
    random pairing draws them with the run's seed, so runs of one seed share theirs. Rows with
    neither recorded are taken as distinct."""
    own = pd.Series([f"row {i}" for i in range(len(df))], index=df.index)
    if "pairing" not in df:
        return own
    pairing = df["pairing"].astype(str)
    seed = df["seed"].astype(str) if "seed" in df else pd.Series("", index=df.index)
    labels = own.where(pairing != "sequential", "sequential")
    return labels.where(~((pairing == "random") & (seed != "")), "random " + seed)


def pool_plasticity(df: pd.DataFrame, z: float = 1.959964) -> pd.DataFrame:
    """Pool plasticity measurements of the same (model, dataset, mode, layer, component).

    Several runs probe the same pretrained model (one per condition and seed). Runs that saw the
    same pairs (``pair_sets``) measured the same thing: they count once, or the interval would
    shrink with the number of runs, not of pairs. The distinct pair sets are pooled: mean
    weighted by n, variance from within- and between-set spread, and a normal 95% interval
    mean ± z·std/sqrt(n). A group with one pair set keeps its own interval.
    """
    if len(df):
        df = df.assign(_pairs=pair_sets(df)).drop_duplicates(PLASTICITY_GROUP + ["_pairs"])
    rows = []
    for key, g in df.groupby(PLASTICITY_GROUP, sort=True):
        n = g["n"].to_numpy(float)
        m = g["mean"].to_numpy(float)
        s = g["std"].to_numpy(float)
        row = dict(zip(PLASTICITY_GROUP, key))
        if len(g) == 1:
            row.update(
                mean=m[0], std=s[0], n=int(n[0]), ci_low=float(g["ci_low"].iloc[0]), ci_high=float(g["ci_high"].iloc[0])
            )
        else:
            total = n.sum()
            mean = float((n * m).sum() / total)
            var = float(((n - 1) * s**2 + n * (m - mean) ** 2).sum() / (total - 1))
            half = z * math.sqrt(var / total)
            row.update(mean=mean, std=math.sqrt(var), n=int(total), ci_low=mean - half, ci_high=mean + half)
        rows.append(row)
    return pd.DataFrame(rows, columns=PLASTICITY_GROUP + ["mean", "std", "n", "ci_low", "ci_high"])


def component_plasticity(pooled: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Datasets × components table of plasticity averaged over layers (``measure.summary.layer_means``),
    for one probe mode; datasets and components sorted."""
    sub = pooled[pooled["mode"] == mode]
    table = summary.layer_means(sub, ("dataset", "component")).sort_index().unstack("component")
    table.columns.name = None
    return table


def plasticity_vs_accuracy(plasticity: pd.DataFrame, accuracy: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Component ranking by plasticity next to the ranking by accuracy, and their correlation.

    ``plasticity`` and ``accuracy`` are datasets × components tables (accuracy: the conditions
    that train one component). Returns (ranking, correlation): ranking has per component the
    mean plasticity and its average rank, the mean accuracy and its average rank; correlation
    has per dataset the Spearman rho and p between plasticity and accuracy over components, and
    a last row ``all`` correlating the mean plasticity with the mean accuracy.
    """
    comps = [c for c in plasticity.columns if c in accuracy.columns]
    datasets = [d for d in plasticity.index if d in accuracy.index]
    if len(comps) < 2 or not datasets:
        raise AnalysisError(
            "plasticity and accuracy share no datasets or fewer than two "
            f"components (plasticity: {', '.join(map(str, plasticity.columns))}; "
            f"conditions: {', '.join(map(str, accuracy.columns))})"
        )
    p, a = plasticity.loc[datasets, comps], accuracy.loc[datasets, comps]
    ranking = pd.DataFrame(
        {
            "plasticity": p.mean(),
            "plasticity_rank": ranks(p).mean(),
            "accuracy": a.mean(),
            "accuracy_rank": ranks(a).mean(),
        }
    )
    rows = [{"dataset": d, **dict(zip(("rho", "p"), spearman(p.loc[d], a.loc[d])))} for d in datasets]
    rows.append({"dataset": "all", **dict(zip(("rho", "p"), spearman(p.mean(), a.mean())))})
    return ranking.sort_values("plasticity_rank"), pd.DataFrame(rows)
