"""Two paired conditions: Holm's correction, the exact Wilcoxon signed-rank test, the paired t test."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# ---------------------------------------------------------------- significance


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input order (NaN stays NaN).

    Sorted ascending, the i-th smallest (i from 0) of m p-values becomes (m − i)·p, made
    non-decreasing by a running maximum and capped at 1. Reject where adjusted p ≤ α.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q, kind="stable")
    adj = np.minimum(np.maximum.accumulate((m - np.arange(m)) * q[order]), 1.0)
    res = np.empty(m)
    res[order] = adj
    out[ok] = res
    return out


def signed_rank_null(ranks: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Exact null distribution of W+ for the given |d| ranks (ties allowed): values, probabilities.

    Under the null each difference is positive or negative with probability 1/2, independently;
    the 2^n sign patterns are counted by dynamic programming over doubled ranks (integers, since
    tied ranks are multiples of 1/2).
    """
    twice = np.rint(2 * np.asarray(ranks, dtype=float)).astype(int)
    counts = np.zeros(int(twice.sum()) + 1)
    counts[0] = 1.0
    for v in twice:
        counts[v:] = counts[v:] + counts[: len(counts) - v].copy()
    return np.arange(len(counts)) / 2, counts / counts.sum()


def _signed_rank_p(w: float, null: tuple[np.ndarray, np.ndarray], alternative: str) -> float:
    values, prob = null
    greater = prob[values >= w - 1e-9].sum()
    less = prob[values <= w + 1e-9].sum()
    p = {"greater": greater, "less": less, "two-sided": 2 * min(greater, less)}[alternative]
    return float(min(p, 1.0))


# Differences of accuracies are equal in decimal but not in binary (99.09 - 98.91 vs 97.24 - 97.06
# differ in the 15th digit); rounding far below any accuracy's precision makes such ties ties.
TIE_DECIMALS = 9


def tie_exact(d: np.ndarray) -> np.ndarray:
    """``d`` rounded to ``TIE_DECIMALS`` places, so that differences equal in decimal rank as ties."""
    return np.round(d, TIE_DECIMALS)


def wilcoxon(a: Sequence[float], b: Sequence[float], alternative: str = "greater") -> tuple[float, float, int]:
    """Wilcoxon signed-rank test of paired ``a`` vs ``b``: (W+, p, n non-zero differences).

    W+ is the sum of the ranks of |a − b| where a > b; zero differences are dropped (Wilcoxon's
    convention, scipy's default). Differences are compared after ``tie_exact``: equal in decimal
    means tied, whatever the floating-point noise of the subtraction. All differences zero: W+ = 0,
    p = 1 (no evidence either way).
    The p-value is scipy's; with tied |d| and n ≤ 13, where scipy enumerates the 2^n sign
    patterns by a slow permutation test, the same exact p comes from
    ``signed_rank_null``.
    """
    d = tie_exact(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    d = d[~np.isnan(d)]
    nz = d[d != 0]
    if len(nz) == 0:
        return 0.0, 1.0, 0
    from scipy import stats as st

    r = st.rankdata(np.abs(nz))
    w = float(r[nz > 0].sum())
    if len(np.unique(r)) < len(r) and len(nz) <= 13:
        return w, _signed_rank_p(w, signed_rank_null(r), alternative), len(nz)
    return w, float(st.wilcoxon(nz, alternative=alternative).pvalue), len(nz)


def paired_t(a: Sequence[float], b: Sequence[float], alternative: str = "greater") -> tuple[float, float]:
    """Paired t-test of ``a`` vs ``b``: (t, p). NaN when the differences have no spread
    (all equal, up to rounding: t would be infinite or noise)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    d = d[~np.isnan(d)]
    if len(d) < 2 or np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())):
        return math.nan, math.nan
    from scipy import stats as st

    res = st.ttest_rel(d, np.zeros_like(d), alternative=alternative)
    return float(res.statistic), float(res.pvalue)
