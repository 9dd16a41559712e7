"""Tests over many conditions: the paper's paired tests per pair, Friedman, post-hoc Wilcoxon
and Nemenyi with their cliques, Spearman."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis import AnalysisError
from analysis.stats.effects import effect_sizes
from analysis.stats.paired import holm, paired_t, tie_exact, wilcoxon

# q_0.05 of the Studentized range divided by sqrt(2), for k = 2..10 conditions (Demšar 2006).
NEMENYI_Q05 = {2: 1.960, 3: 2.344, 4: 2.569, 5: 2.728, 6: 2.850, 7: 2.949, 8: 3.031, 9: 3.102, 10: 3.164}


T_ALTERNATIVES = ("two-sided", "greater")


def paired_tests(
    table: pd.DataFrame, reference: str, alternative: str = "greater", t_alternative: str = "two-sided"
) -> pd.DataFrame:
    """The paper's tests: ``reference`` against every other condition over the rows of ``table``.

    One row per other condition: n datasets, mean difference, Wilcoxon W+ and p (``alternative``;
    the paper's is one-sided, "greater": the reference better), paired t and p
    (``t_alternative``; the paper's, scipy's default, is two-sided), the two-sided t p always,
    each p's alternative by name (``wilcoxon_alternative``, ``t_alternative``), and the effect
    sizes of ``effect_sizes`` (Hodges-Lehmann shift with its 95% interval, rank-biserial r).
    """
    if reference not in table.columns:
        raise AnalysisError(
            f"reference condition {reference!r} is not among the conditions: {', '.join(map(str, table.columns))}"
        )
    rows = []
    for other in table.columns:
        if other == reference:
            continue
        a, b = table[reference].to_numpy(float), table[other].to_numpy(float)
        w, wp, _ = wilcoxon(a, b, alternative)
        t, tp = paired_t(a, b, t_alternative)
        _, tp2 = paired_t(a, b, "two-sided")
        rows.append(
            {
                "reference": reference,
                "other": other,
                "n": int(np.sum(~np.isnan(a - b))),
                "mean_diff": float(np.nanmean(a - b)),
                "wilcoxon_W": w,
                "wilcoxon_p": wp,
                "wilcoxon_alternative": alternative,
                "t": t,
                "t_p": tp,
                "t_alternative": t_alternative,
                "t_p_two_sided": tp2,
                **effect_sizes(a, b),
            }
        )
    return pd.DataFrame(rows)


def friedman_skip(table: pd.DataFrame) -> str | None:
    """Why the Friedman test cannot run on ``table`` (conditions as columns), or None if it can."""
    k, n = table.shape[1], table.shape[0]
    table = pd.DataFrame(tie_exact(table.to_numpy(dtype=float)), columns=table.columns)
    if k < 3:
        return f"needs at least 3 conditions (have {k})"
    if n < 2:
        return f"needs at least 2 datasets (have {n})"
    if (table.nunique(axis=1) <= 1).all():
        return (
            f"all {k} conditions have the same accuracy on every dataset "
            "(every dataset ties them): there is no order to test"
        )
    return None


def friedman(table: pd.DataFrame) -> dict[str, float]:
    """Friedman test over all conditions (columns), datasets as blocks (rows).

    Returns statistic, p, k conditions and n datasets; NaN statistic and p where
    ``friedman_skip`` gives a reason (scipy needs at least three conditions and some order).
    Values equal in decimal tie (``tie_exact``).
    """
    k, n = table.shape[1], table.shape[0]
    if friedman_skip(table) is not None:
        return {"statistic": math.nan, "p": math.nan, "k": k, "n": n}
    from scipy import stats as st

    res = st.friedmanchisquare(*[tie_exact(table[c].to_numpy(float)) for c in table.columns])
    return {"statistic": float(res.statistic), "p": float(res.pvalue), "k": k, "n": n}


def pairwise_wilcoxon(table: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Post-hoc: two-sided Wilcoxon for every pair of conditions, Holm-corrected over the pairs,
    with the effect sizes of each pair (``effect_sizes``)."""
    rows = []
    for a, b in itertools.combinations(table.columns, 2):
        w, p, n = wilcoxon(table[a], table[b], "two-sided")
        rows.append(
            {
                "a": a,
                "b": b,
                "n": n,
                "mean_diff": float(np.nanmean(table[a] - table[b])),
                "wilcoxon_W": w,
                "p": p,
                **effect_sizes(table[a], table[b]),
            }
        )
    out = pd.DataFrame(
        rows, columns=["a", "b", "n", "mean_diff", "wilcoxon_W", "p", "hl", "hl_low", "hl_high", "rank_biserial"]
    )
    out["p_holm"] = holm(out["p"].to_numpy()) if len(out) else []
    out["significant"] = out["p_holm"] <= alpha
    return out


def nemenyi_q(k: int, alpha: float = 0.05) -> float:
    """Critical value q_α of the Nemenyi test for k conditions (Studentized range / sqrt 2)."""
    if k < 2:
        raise AnalysisError(f"the Nemenyi test needs at least 2 conditions, got {k}")
    if alpha == 0.05 and k in NEMENYI_Q05:
        return NEMENYI_Q05[k]
    from scipy import stats as st

    return float(st.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def nemenyi_cd(k: int, n: int, alpha: float = 0.05) -> float:
    """Critical difference of average ranks: CD = q_α · sqrt(k(k+1) / (6N))."""
    return nemenyi_q(k, alpha) * math.sqrt(k * (k + 1) / (6 * n))


def cd_cliques(avg_ranks: pd.Series, cd: float) -> list[list[str]]:
    """Maximal groups of conditions whose average ranks all differ by less than ``cd``.

    These are the bars of a critical-difference diagram; groups of one are left out.
    """
    r = avg_ranks.sort_values()
    names, values = list(r.index), r.to_numpy(float)
    cliques, reach = [], -1
    for i in range(len(values)):
        j = i
        while j + 1 < len(values) and values[j + 1] - values[i] < cd:
            j += 1
        if j > i and j > reach:
            cliques.append(names[i : j + 1])
        reach = max(reach, j)
    return cliques


def rank_cliques(avg_ranks: pd.Series, differ) -> list[list[str]]:
    """Maximal runs of conditions, adjacent in average-rank order, where no pair ``differ(a, b)``.

    The bars of a critical-difference diagram drawn from any pairwise decision; groups of one
    are left out. ``cd_cliques`` is the Nemenyi case (``differ``: ranks apart by CD or more).
    """
    names = list(avg_ranks.sort_values().index)
    cliques, reach = [], -1
    for i in range(len(names)):
        j = i
        while j + 1 < len(names) and not any(differ(names[m], names[j + 1]) for m in range(i, j + 1)):
            j += 1
        if j > i and j > reach:
            cliques.append(names[i : j + 1])
        reach = max(reach, j)
    return cliques


def wilcoxon_cliques(avg_ranks: pd.Series, pairs: pd.DataFrame) -> list[list[str]]:
    """CD-diagram bars from the Holm-corrected pairwise Wilcoxon tests (``pairwise_wilcoxon``).

    Conditions adjacent in average rank are joined when no pair among them is significant, so
    the bars agree with the primary all-pairs result instead of the mean-rank test, whose
    verdict on two conditions depends on which others are in the comparison (Benavoli, Corani
    and Mangili, JMLR 2016).
    """
    sig = {frozenset((a, b)) for a, b, s in zip(pairs["a"], pairs["b"], pairs["significant"]) if s}
    return rank_cliques(avg_ranks, lambda a, b: frozenset((a, b)) in sig)


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman rank correlation (rho, two-sided p); NaN below three points or with no spread."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = tie_exact(x[keep]), tie_exact(y[keep])  # equal in decimal: tied ranks
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    from scipy import stats as st

    res = st.spearmanr(x, y)
    return float(res.statistic), float(res.pvalue)
