"""Interval estimates by stratified bootstrap, in the manner of rliable (Agarwal et al., 2021).

The input is a *scores* array of shape (K conditions, D datasets, S seeds): the test accuracy
of each finished run at the lr chosen for its (dataset, condition), NaN where a seed has no
finished run (``score_array`` builds it from the runs table). A seed slot is the same seed for
every condition, so the array also pairs runs by seed where that matters (``analysis.bayes``).

One bootstrap replicate resamples the datasets with replacement (the same draw for every
condition, so comparisons stay paired over datasets) and, within each drawn dataset, the
finished seeds of each condition with replacement, independently per condition (rliable's
stratified bootstrap; ``datasets=False`` keeps the datasets fixed, rliable's default). Every
statistic below is computed on all replicates at once (arrays of shape (R, ...)), and the
intervals are percentile intervals. The point estimates are those of the data as it is.

Aggregates: the mean over datasets of the mean over seeds (the average of the accuracy table)
and the interquartile mean of all runs (``scipy.stats.trim_mean`` at 25%, as rliable computes
it). Comparisons: differences of the aggregates for every pair, and the probability of
improvement P(X > Y): per dataset the chance that a run of X beats a run of Y (ties count 1/2,
the Mann-Whitney U over the seeds divided by the pairs), averaged over datasets. Cliff's delta
over seeds is 2 P(X > Y) − 1.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as st

from analysis import AnalysisError


def score_array(
    selected: pd.DataFrame, conditions: Sequence[str], datasets: Sequence[str], value: str = "test_acc"
) -> tuple[np.ndarray, list]:
    """(K, D, S) scores of ``selected`` (the finished runs at each cell's chosen lr), seeds.

    Seeds are the sorted distinct seeds of ``selected``; slot s of every condition and dataset
    holds the run with that seed, NaN where there is none.
    """
    seeds = sorted(selected["seed"].unique())
    out = np.full((len(conditions), len(datasets), len(seeds)), np.nan)
    ci = {c: i for i, c in enumerate(conditions)}
    di = {d: i for i, d in enumerate(datasets)}
    si = {s: i for i, s in enumerate(seeds)}
    for c, d, s, v in zip(selected["condition"], selected["dataset"], selected["seed"], selected[value]):
        if c in ci and d in di:
            out[ci[c], di[d], si[s]] = v
    return out, seeds


def _compact(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finished seeds moved to the front of each (condition, dataset) row; their counts."""
    return np.sort(scores, axis=-1), (~np.isnan(scores)).sum(axis=-1)


def resample(
    scores: np.ndarray, reps: int = 2000, seed: int = 0, datasets: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of ``scores``: values (R, K, D, S) and their validity mask.

    Row (r, k, d) holds n seeds drawn with replacement among the finished seeds of condition k
    on the dataset drawn at position d, n being how many finished there; the other slots are
    NaN and masked out. Deterministic for a given ``seed``.
    """
    if scores.ndim != 3:
        raise AnalysisError(f"scores must have shape (conditions, datasets, seeds), got {scores.shape}")
    K, D, S = scores.shape
    rng = np.random.default_rng(seed)
    compact, n = _compact(scores)
    if (n == 0).any():
        k, d = np.argwhere(n == 0)[0]
        raise AnalysisError(f"condition {k} has no finished seed on dataset {d}: nothing to resample")
    dsel = rng.integers(0, D, size=(reps, D)) if datasets else np.broadcast_to(np.arange(D), (reps, D))
    count = n[:, dsel].transpose(1, 0, 2)  # (R, K, D)
    pick = np.floor(rng.random((reps, K, D, S)) * count[..., None]).astype(int)
    kk = np.arange(K)[None, :, None, None]
    values = compact[kk, dsel[:, None, :, None], pick]
    valid = np.arange(S) < count[..., None]
    return np.where(valid, values, np.nan), valid


def mean_score(values: np.ndarray) -> np.ndarray:
    """Mean over datasets (axis −2) of the mean over finished seeds (axis −1)."""
    return np.nanmean(np.nanmean(values, axis=-1), axis=-1)


def iqm(values: np.ndarray) -> np.ndarray:
    """Interquartile mean over the last two axes (datasets × seeds), NaN ignored.

    As ``scipy.stats.trim_mean(x, 0.25)`` on the finished runs: int(0.25 m) of the m values are
    cut from each end, the rest averaged. Vectorised over leading axes with differing m.
    """
    flat = np.sort(values.reshape(values.shape[:-2] + (-1,)), axis=-1)  # NaN last
    m = (~np.isnan(flat)).sum(axis=-1)
    lo = (0.25 * m).astype(int)
    hi = m - lo
    csum = np.concatenate([np.zeros(flat.shape[:-1] + (1,)), np.cumsum(np.nan_to_num(flat), axis=-1)], axis=-1)
    take = lambda i: np.take_along_axis(csum, i[..., None], axis=-1)[..., 0]  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore"):
        return (take(hi) - take(lo)) / (hi - lo)


def improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y): per dataset the fraction of seed pairs where x beats y (ties 1/2), averaged.

    ``x`` and ``y`` have shape (..., D, S) with NaN for absent seeds. Counted as Mann-Whitney's U
    from the ranks of x among both (ties at their mean rank): a sort of 2S values per dataset
    instead of S² comparisons, the same counts exactly (a grid of 200 seeds has 40,000 pairs).
    """
    fx, fy = ~np.isnan(x), ~np.isnan(y)
    if np.isinf(x[fx]).any() or np.isinf(y[fy]).any():
        return _improvement_by_pairs(x, y)  # an infinite score would tie with the absent seeds below
    n_x, n_y = fx.sum(axis=-1), fy.sum(axis=-1)
    both = np.concatenate([np.where(fx, x, np.inf), np.where(fy, y, np.inf)], axis=-1)  # absent last
    order = np.argsort(both, axis=-1, kind="stable")
    ordered = np.take_along_axis(both, order, axis=-1)
    of_x = (order < x.shape[-1]) & np.isfinite(ordered)
    wins = np.where(of_x, _mean_ranks(ordered), 0.0).sum(axis=-1) - n_x * (n_x + 1) / 2
    return _mean_over_datasets(wins, n_x * n_y)


def _mean_ranks(ordered: np.ndarray) -> np.ndarray:
    """The 1-based ranks of each row of ``ordered`` (sorted along the last axis), equal values
    sharing the mean of their ranks."""
    L = ordered.shape[-1]
    at = np.broadcast_to(np.arange(L), ordered.shape)
    first = np.ones(ordered.shape, dtype=bool)
    first[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    last = np.ones(ordered.shape, dtype=bool)
    last[..., :-1] = first[..., 1:]
    start = np.maximum.accumulate(np.where(first, at, 0), axis=-1)
    end = np.flip(np.minimum.accumulate(np.flip(np.where(last, at, L), axis=-1), axis=-1), axis=-1)
    return (start + end) / 2 + 1


def _improvement_by_pairs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``improvement`` by comparing every pair of seeds."""
    a, b = x[..., :, None], y[..., None, :]
    both = ~np.isnan(a) & ~np.isnan(b)
    wins = np.where(both, (a > b) + 0.5 * (a == b), 0.0).sum(axis=(-1, -2))
    return _mean_over_datasets(wins, both.sum(axis=(-1, -2)))


def _mean_over_datasets(wins: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no finished pair anywhere: NaN
        return np.nanmean(wins / pairs, axis=-1)


def _interval(boot: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    q = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN bounds
        return np.nanpercentile(boot, q, axis=0), np.nanpercentile(boot, 100 - q, axis=0)


def aggregate_intervals(
    scores: np.ndarray,
    conditions: Sequence[str],
    reps: int = 2000,
    seed: int = 0,
    datasets: bool = True,
    level: float = 0.95,
    boot: tuple[np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Per condition: mean and IQM with their bootstrap intervals. ``boot``: ``resample``'s
    output, to share replicates with ``pairwise_intervals``."""
    values, _ = boot if boot is not None else resample(scores, reps, seed, datasets)
    rows = []
    for name, point, b in (("mean", mean_score(scores), mean_score(values)), ("iqm", iqm(scores), iqm(values))):
        lo, hi = _interval(b, level)
        rows.append(
            pd.DataFrame({"condition": list(conditions), "statistic": name, "estimate": point, "low": lo, "high": hi})
        )
    return pd.concat(rows, ignore_index=True)


def pairwise_intervals(
    scores: np.ndarray,
    conditions: Sequence[str],
    reps: int = 2000,
    seed: int = 0,
    datasets: bool = True,
    level: float = 0.95,
    boot: tuple[np.ndarray, np.ndarray] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
) -> pd.DataFrame:
    """For every pair (a, b) (default: all, in ``conditions`` order): the differences a − b of
    the mean and of the IQM, P(a > b) and Cliff's delta over seeds, each with its bootstrap
    interval."""
    values, _ = boot if boot is not None else resample(scores, reps, seed, datasets)
    m_pt, m_bt = mean_score(scores), mean_score(values)
    q_pt, q_bt = iqm(scores), iqm(values)
    index = {c: i for i, c in enumerate(conditions)}
    if pairs is None:
        pairs = list(itertools.combinations(conditions, 2))
    rows = []
    for a, b in pairs:
        i, j = index[a], index[b]
        row = {"a": a, "b": b}
        poi_pt = float(improvement(scores[i], scores[j]))
        poi_bt = improvement(values[:, i], values[:, j])
        for name, point, b in (
            ("mean_diff", m_pt[i] - m_pt[j], m_bt[:, i] - m_bt[:, j]),
            ("iqm_diff", q_pt[i] - q_pt[j], q_bt[:, i] - q_bt[:, j]),
            ("p_improve", poi_pt, poi_bt),
            ("cliffs_delta", 2 * poi_pt - 1, 2 * poi_bt - 1),
        ):
            lo, hi = _interval(b, level)
            row.update({name: float(point), f"{name}_low": float(lo), f"{name}_high": float(hi)})
        rows.append(row)
    return pd.DataFrame(rows)


def rank_correlation_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rho along the last axis of x and y (broadcast), ties averaged; NaN without
    spread or below three points."""
    x, y = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float))
    if x.shape[-1] < 3:
        return np.full(x.shape[:-1], np.nan)
    rx, ry = st.rankdata(x, axis=-1), st.rankdata(y, axis=-1)
    rx, ry = rx - rx.mean(axis=-1, keepdims=True), ry - ry.mean(axis=-1, keepdims=True)
    den = np.sqrt((rx**2).sum(axis=-1) * (ry**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(axis=-1) / den, np.nan)


def correlation_intervals(
    measure: pd.DataFrame,
    scores: np.ndarray,
    conditions: Sequence[str],
    datasets: Sequence[str],
    reps: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Spearman rho between a per-component measure and accuracy, with bootstrap intervals.

    ``measure`` is a datasets × components table (plasticity, gradient norm) taken as fixed;
    accuracy is the seed mean of ``scores`` (K, D, S), its rows named by ``conditions``. Per
    dataset, rho across the shared components with an interval from resampling seeds; the last
    row, ``mean``, is the mean rho over datasets with an interval from resampling datasets and
    seeds.
    """
    comps = [c for c in measure.columns if c in conditions]
    ds = [d for d in datasets if d in measure.index]
    if len(comps) < 3 or not ds:
        raise AnalysisError(
            "need at least three components measured and trained alone on a "
            f"common dataset (have {', '.join(map(str, comps)) or 'none'})"
        )
    ki = [list(conditions).index(c) for c in comps]
    di = [list(datasets).index(d) for d in ds]
    sub = scores[np.ix_(ki, di)]  # (C, D', S)
    m = measure.loc[ds, comps].to_numpy(float).T  # (C, D')
    point = rank_correlation_rows(m.T, np.nanmean(sub, axis=-1).T)  # (D',)
    rows = []
    fixed, _ = resample(sub, reps, seed, datasets=False)
    rho = rank_correlation_rows(m.T[None], np.nanmean(fixed, axis=-1).transpose(0, 2, 1))  # (R, D')
    lo, hi = _interval(rho, level)
    for j, d in enumerate(ds):
        rows.append({"dataset": d, "rho": point[j], "low": lo[j], "high": hi[j]})
    rng = np.random.default_rng(seed + 1)
    dsel = rng.integers(0, len(ds), size=(reps, len(ds)))
    both, _ = resample(sub, reps, seed + 2, datasets=False)
    # the dataset draw applies to the measure and the accuracy alike: gather both
    acc = np.nanmean(both, axis=-1).transpose(0, 2, 1)  # (R, D', C)
    acc = np.take_along_axis(acc, dsel[..., None], axis=1)
    meas = m.T[dsel]  # (R, D', C)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no spread on any drawn dataset: NaN
        mean_rho = np.nanmean(rank_correlation_rows(meas, acc), axis=-1)
        mean_point = float(np.nanmean(point))
    lo, hi = _interval(mean_rho, level)
    rows.append({"dataset": "mean", "rho": mean_point, "low": float(lo), "high": float(hi)})
    return pd.DataFrame(rows, columns=["dataset", "rho", "low", "high"])


__all__ = [
    "score_array",
    "resample",
    "mean_score",
    "iqm",
    "improvement",
    "aggregate_intervals",
    "pairwise_intervals",
    "rank_correlation_rows",
    "correlation_intervals",
]
