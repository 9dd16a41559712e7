"""Effect sizes of a paired difference: Hodges-Lehmann shift with its interval, rank-biserial r."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis.stats.paired import signed_rank_null, wilcoxon

# ---------------------------------------------------------------- effect sizes


def walsh_averages(d: Sequence[float]) -> np.ndarray:
    """All (d_i + d_j) / 2 for i <= j, sorted (n(n+1)/2 values; NaN dropped first)."""
    d = np.asarray(d, dtype=float)
    d = d[~np.isnan(d)]
    i, j = np.triu_indices(len(d))
    return np.sort((d[i] + d[j]) / 2)


def hodges_lehmann(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of the paired shift a − b with its exact 1−alpha interval.

    The estimate is the median of the Walsh averages of d = a − b; the interval is Tukey's: the
    c+1-th smallest to the c+1-th largest Walsh average, c the largest W with P(W+ <= c) <=
    alpha/2 under the signed-rank null (the interval that inverts the Wilcoxon test). With too
    few pairs for any such c (n < 6 at 5%) the interval is NaN.
    """
    walsh = walsh_averages(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    if len(walsh) == 0:
        return math.nan, math.nan, math.nan
    n = int(round((math.sqrt(8 * len(walsh) + 1) - 1) / 2))
    est = float(np.median(walsh))
    values, prob = signed_rank_null(np.arange(1, n + 1))
    below = values[np.cumsum(prob) <= alpha / 2 + 1e-12]
    if len(below) == 0:
        return est, math.nan, math.nan
    c = int(below.max())
    return est, float(walsh[c]), float(walsh[len(walsh) - 1 - c])


def rank_biserial(a: Sequence[float], b: Sequence[float]) -> float:
    """Matched-pairs rank-biserial correlation (W+ − W−) / (W+ + W−) of a − b, in [−1, 1].

    The effect size of the Wilcoxon signed-rank test: 1 when every non-zero difference favours
    ``a``; zero differences are dropped as the test drops them. NaN when all are zero.
    """
    w, _, n = wilcoxon(a, b, "two-sided")
    return math.nan if n == 0 else 2 * w / (n * (n + 1) / 2) - 1


def effect_sizes(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, float]:
    """Hodges-Lehmann shift with its interval and the rank-biserial r of paired a − b."""
    hl, lo, hi = hodges_lehmann(a, b, alpha)
    return {"hl": hl, "hl_low": lo, "hl_high": hi, "rank_biserial": rank_biserial(a, b)}
