"""How stable the study's answer is: a bootstrap that re-chooses every cell's lr inside each replicate.

The report's other intervals resample seeds at the lr chosen once on all the data, so the
choice's own noise is left out. Here one replicate redraws, for every (dataset, condition) cell,
the seeds with replacement -- a drawn seed brings its run at every lr of the cell, as rerunning
the grid with that seed would -- and, where datasets are resampled, the datasets (the same draw
for every condition); it then chooses each cell's lr again by the report's rule
(``analysis.stats.selection.best_lr``: the highest seed mean of the selection accuracy over finished runs,
ties to the smaller lr) and takes the test accuracy there. From the replicates: how often each
cell's lr is chosen again, each condition's probability of every rank and of the top-1 (ranked
by the mean over datasets, the accuracy table's average), selection-aware intervals of each
condition's mean, and, drawing n' seeds per cell instead of n, the projected probability that the
top-1 holds with more seeds.

The arrays are (K conditions, D datasets, L lrs, S seed slots), NaN where a run did not finish or
does not exist (``grid``). Draws, for reproducibility: ``numpy.random.default_rng(seed)`` draws
the datasets first (``integers(0, D, (R, D))``, only when resampled), then ``random((R, K, D, m))``
whose floor of u·n picks among the n seeds of the cell at that dataset position (in slot order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import AnalysisError
from analysis.stats import selection


@dataclass(frozen=True)
class Grid:
    """A study's runs as arrays: ``select`` and ``test`` accuracies (K, D, L, S); ``chosen``: each
    cell's lr index as the report chose it (K, D); the names along each axis."""

    select: np.ndarray
    test: np.ndarray
    chosen: np.ndarray
    conditions: list[str]
    datasets: list[str]
    lrs: list[float]
    seeds: list


def grid(runs: pd.DataFrame, conditions: Sequence[str], datasets: Sequence[str], select_on: str = "val") -> Grid:
    """The ``Grid`` of ``runs`` (the tidy runs table) over ``conditions`` × ``datasets``, with each
    cell's lr chosen by ``selection.choose_lrs`` on ``select_on`` (-1 where no lr can be chosen)."""
    runs = runs[runs["condition"].isin(conditions) & runs["dataset"].isin(datasets)]
    lrs = sorted(set(runs["lr"].dropna().astype(float)))
    seeds = sorted(runs["seed"].dropna().unique())
    ci, di = {c: i for i, c in enumerate(conditions)}, {d: i for i, d in enumerate(datasets)}
    li, si = {lr: i for i, lr in enumerate(lrs)}, {s: i for i, s in enumerate(seeds)}
    shape = (len(conditions), len(datasets), len(lrs), len(seeds))
    select, test = np.full(shape, np.nan), np.full(shape, np.nan)
    done = runs[(runs["status"] == "finished") & runs["lr"].notna()]
    at = (
        done["condition"].map(ci).to_numpy(int),
        done["dataset"].map(di).to_numpy(int),
        done["lr"].astype(float).map(li).to_numpy(int),
        done["seed"].map(si).to_numpy(int),
    )
    select[at] = done[f"{select_on}_acc"].to_numpy(float)
    test[at] = done["test_acc"].to_numpy(float)
    best = selection.choose_lrs(runs, select_on)
    chosen = np.full(shape[:2], -1)
    for c, d, lr in zip(best["condition"], best["dataset"], best["lr"]):
        if pd.notna(lr):
            chosen[ci[c], di[d]] = li[float(lr)]
    return Grid(select, test, chosen, list(conditions), list(datasets), lrs, seeds)


def seed_counts(g: Grid) -> np.ndarray:
    """(K, D): the seeds of each cell with a finished run at some lr (those a replicate draws)."""
    return (~np.isnan(g.select)).any(axis=2).sum(axis=-1)


def _seed_slots(g: Grid) -> np.ndarray:
    """(K, D, S): each cell's seed slots with a finished run first, in slot order."""
    has = (~np.isnan(g.select)).any(axis=2)
    return np.argsort(~has, axis=-1, kind="stable")


@dataclass(frozen=True)
class Replicates:
    """Bootstrap replicates: ``dsel`` (R, D) the dataset drawn at each position; ``chosen`` (R, K, D)
    the lr index chosen there (-1: none); ``test`` (R, K, D) the test accuracy at that lr;
    ``fixed`` (R, K, D) the test accuracy at the lr chosen on all the data."""

    dsel: np.ndarray
    chosen: np.ndarray
    test: np.ndarray
    fixed: np.ndarray


def replicates(g: Grid, reps: int = 2000, seed: int = 0, datasets: bool = True, draws: float = 1.0) -> Replicates:
    """``reps`` replicates of ``g``, each cell drawing round(``draws`` · n) of its n seeds with
    replacement (``draws`` 1: the bootstrap; above 1: n' > n seeds, a projection); datasets
    resampled where ``datasets`` and there are several. Deterministic for a given ``seed``."""
    K, D, _, S = g.select.shape
    n = seed_counts(g)
    if (n == 0).any():
        k, d = np.argwhere(n == 0)[0]
        raise AnalysisError(f"{g.conditions[k]} has no finished run on {g.datasets[d]}: nothing to resample")
    rng = np.random.default_rng(seed)
    dsel = rng.integers(0, D, size=(reps, D)) if datasets and D > 1 else np.broadcast_to(np.arange(D), (reps, D))
    count = np.maximum(np.rint(n * draws), 1).astype(int)  # (K, D)
    m = int(count.max())
    u = rng.random((reps, K, D, m))
    kk, pos = np.arange(K)[None, :, None], dsel[:, None, :]
    pick = np.floor(u * n[kk, pos][..., None]).astype(int)
    slots = _seed_slots(g)[kk[..., None], pos[..., None], pick]  # (R, K, D, m)
    drawn = _slot_counts(slots, np.arange(m) < count[kk, pos][..., None], S)
    sel = _draw_means(g.select[kk, pos], drawn)
    tst = _draw_means(g.test[kk, pos], drawn)
    chosen = _argmax(sel)
    at = np.maximum(chosen, 0)[..., None]
    test = np.where(chosen >= 0, np.take_along_axis(tst, at, axis=-1)[..., 0], np.nan)
    orig = g.chosen[kk, pos]
    fixed = np.where(orig >= 0, np.take_along_axis(tst, np.maximum(orig, 0)[..., None], axis=-1)[..., 0], np.nan)
    return Replicates(np.asarray(dsel), chosen, test, fixed)


def _slot_counts(slots: np.ndarray, used: np.ndarray, S: int) -> np.ndarray:
    """(R, K, D, S): how often each seed slot is drawn, of the (R, K, D, m) draws where ``used``."""
    R, K, D, _ = slots.shape
    flat = (np.arange(R * K * D).reshape(R, K, D, 1) * S + slots)[used]
    return np.bincount(flat, minlength=R * K * D * S).reshape(R, K, D, S).astype(float)


def _draw_means(values: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """(R, K, D, L): per lr, the mean over the drawn seeds that finished there (NaN if none).
    ``values`` (R, K, D, L, S) are the runs at each dataset position, ``drawn`` the slot counts."""
    w = drawn[..., None, :] * ~np.isnan(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.nan_to_num(values) * w).sum(axis=-1) / w.sum(axis=-1)


def _argmax(means: np.ndarray) -> np.ndarray:
    """The index of the highest value along the last axis, the first of ties (the smaller lr);
    -1 where all are NaN."""
    filled = np.where(np.isnan(means), -np.inf, means)
    idx = filled.argmax(axis=-1)
    return np.where(np.isnan(means).all(axis=-1), -1, idx)


def rechoice(g: Grid, boot: Replicates) -> np.ndarray:
    """(K, D): the share of a cell's appearances in the replicates where its lr is chosen again."""
    K, D = g.chosen.shape
    same = boot.chosen == g.chosen[:, boot.dsel].transpose(1, 0, 2)  # (R, K, D)
    where = boot.dsel.ravel()
    hits = np.stack([np.bincount(where, weights=same[:, k].ravel().astype(float), minlength=D) for k in range(K)])
    seen = np.bincount(where, minlength=D)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hits / seen[None, :]


def condition_means(values: np.ndarray) -> np.ndarray:
    """(R, K): each condition's mean over the dataset positions of (R, K, D) accuracies."""
    return values.mean(axis=-1)


def rank_probabilities(means: np.ndarray) -> np.ndarray:
    """(K, K): P(condition k has rank j + 1) over replicates of (R, K) means; tied values share
    the best of their ranks (``selection.ranks``' ``min``, the floats compared as they are)."""
    r = _replicate_ranks(means)
    K = means.shape[-1]
    return np.stack([(r == j + 1).mean(axis=0) for j in range(K)], axis=-1)


def _replicate_ranks(means: np.ndarray) -> np.ndarray:
    """Ranks of each replicate's conditions, highest = 1, ties sharing the best."""
    return selection.ranks(means, ties="min", decimal=False, partial=True)


def beats(means: np.ndarray, a: int) -> np.ndarray:
    """(K,): the share of replicates where condition ``a``'s mean is above each condition's."""
    return (means[:, [a]] > means).mean(axis=0)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the first axis."""
    q = 100 * (1 - level) / 2
    return np.percentile(values, q, axis=0), np.percentile(values, 100 - q, axis=0)


def seed_budgets(n: int, most: int = 10) -> list[int]:
    """The seed counts n' a projection tries: n, 2n, 3n, 5 and 10, those from n up to max(``most``, 3n)."""
    return sorted({c for c in (n, 2 * n, 3 * n, 5, most) if n <= c <= max(most, 3 * n)})


def projection(
    g: Grid, top: int, compared: Sequence[int], budgets: Sequence[int], reps: int, seed: int, datasets: bool
) -> pd.DataFrame:
    """Per seed count n' of ``budgets``: the share of replicates drawing n' seeds per cell (n' / n
    of each cell's seeds) whose top-1 among ``compared`` is ``top``, and the GPU-hour factor n' / n."""
    n = int(seed_counts(g).max())
    idx = list(compared)
    rows = []
    for b in budgets:
        boot = replicates(g, reps, seed, datasets, draws=b / n)
        means = condition_means(boot.test)[:, idx]
        p = float((_replicate_ranks(means)[:, idx.index(top)] == 1).mean())
        rows.append({"seeds": int(b), "gpu_hours": b / n, "p_top1": p})
    return pd.DataFrame(rows, columns=["seeds", "gpu_hours", "p_top1"])


__all__ = [
    "Grid",
    "Replicates",
    "grid",
    "seed_counts",
    "replicates",
    "rechoice",
    "condition_means",
    "rank_probabilities",
    "beats",
    "percentile_interval",
    "seed_budgets",
    "projection",
]
