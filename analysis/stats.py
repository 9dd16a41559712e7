"""Pure statistics over the tidy runs table and per-dataset accuracy tables.

Three shapes go in and out (see ``analysis.load`` for where they come from):

- *runs*: one row per run, columns ``dataset, condition, lr, seed, val_acc, test_acc, status``
  (``status`` ∈ finished, diverged, failed, stopped; accuracies are NaN unless finished: a
  trial an adaptive grid stopped lost the lr choice and is counted in ``n_runs`` only).
- *means*: one row per (dataset, condition, lr): ``n_runs, n, n_diverged, n_failed, val_mean,
  val_std, test_mean, test_std``, the seed statistics of finished runs (``seed_means``).
- *wide*: a datasets × conditions table of one number per cell (the accuracy at the best lr),
  the input of every test; rows are the paired observations.

Conventions. Higher accuracy is better: rank 1 is the best condition on a dataset, ties share the
average rank. Standard deviations over seeds use ``ddof=0`` by default, as the reference code
(``np.std``) does. Runs that are not finished are left out of means but counted; an lr at which
no run finished cannot be chosen. scipy does the statistics; Holm and the Nemenyi critical
difference are a few lines each and are tested on hand-worked examples. scipy is imported in
the functions that test, not at the top: every grid and search driver imports this module for
its console ranking, and importing scipy.stats is a large part of a driver's start-up
(benchmarks/bench_startup.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from analysis import AnalysisError

CELL = ["dataset", "condition"]
SELECT_ON = ("val", "test")

# q_0.05 of the Studentized range divided by sqrt(2), for k = 2..10 conditions (Demšar 2006).
NEMENYI_Q05 = {2: 1.960, 3: 2.344, 4: 2.569, 5: 2.728, 6: 2.850, 7: 2.949, 8: 3.031, 9: 3.102, 10: 3.164}


# ---------------------------------------------------------------- accuracy at the best lr


def seed_means(runs: pd.DataFrame, ddof: int = 0) -> pd.DataFrame:
    """Per (dataset, condition, lr): counts by status and mean/std over finished seeds."""
    df = runs.copy()
    done = df["status"] == "finished"
    for col in ("val_acc", "test_acc"):
        df[col] = df[col].astype(float).where(done)
    df["_finished"] = done
    df["_diverged"] = df["status"] == "diverged"
    df["_failed"] = df["status"] == "failed"
    g = df.groupby(CELL + ["lr"], sort=True)
    out = pd.DataFrame(
        {
            "n_runs": g.size(),
            "n": g["_finished"].sum(),
            "n_diverged": g["_diverged"].sum(),
            "n_failed": g["_failed"].sum(),
            "val_mean": g["val_acc"].mean(),
            "val_std": g["val_acc"].std(ddof=ddof),
            "test_mean": g["test_acc"].mean(),
            "test_std": g["test_acc"].std(ddof=ddof),
        }
    ).reset_index()
    for col in ("n_runs", "n", "n_diverged", "n_failed"):
        out[col] = out[col].astype(int)
    return out


def best_lr(means: pd.DataFrame, select_on: str = "val") -> pd.DataFrame:
    """Per (dataset, condition): the lr with the highest seed-mean ``select_on`` accuracy.

    Returns the test accuracy (mean, std, ``n`` finished seeds) at that lr, the validation
    accuracy there, and the cell's diverged and failed runs over all lrs. Ties go to the smaller
    lr. A cell where no lr has a finished run keeps its row with NaN lr and accuracies.
    """
    if select_on not in SELECT_ON:
        raise AnalysisError(f"select_on must be one of {', '.join(SELECT_ON)}, got {select_on!r}")
    key = f"{select_on}_mean"
    rows = []
    for (dataset, condition), g in means.groupby(CELL, sort=False):
        g = g.sort_values("lr")
        usable = g[g[key].notna()]
        row = {
            "dataset": dataset,
            "condition": condition,
            "n_diverged": int(g["n_diverged"].sum()),
            "n_failed": int(g["n_failed"].sum()),
        }
        if usable.empty:
            row.update(lr=np.nan, test_mean=np.nan, test_std=np.nan, val_mean=np.nan, val_std=np.nan, n=0)
        else:
            best = usable.loc[usable[key].idxmax()]
            row.update(
                lr=float(best["lr"]),
                test_mean=best["test_mean"],
                test_std=best["test_std"],
                val_mean=best["val_mean"],
                val_std=best["val_std"],
                n=int(best["n"]),
            )
        rows.append(row)
    cols = ["dataset", "condition", "lr", "test_mean", "test_std", "val_mean", "val_std", "n", "n_diverged", "n_failed"]
    return pd.DataFrame(rows, columns=cols)


def check_complete(best: pd.DataFrame, value: str = "test_mean") -> None:
    """Raise AnalysisError naming every condition that lacks a result on some dataset."""
    datasets = sorted(best["dataset"].unique())
    problems = []
    for condition in best["condition"].unique():
        sub = best[best["condition"] == condition].set_index("dataset")[value]
        absent = [d for d in datasets if d not in sub.index]
        empty = [d for d in datasets if d in sub.index and pd.isna(sub[d])]
        if absent:
            problems.append(
                f"condition {condition!r} has no runs on {len(absent)} of {len(datasets)} datasets: {', '.join(absent)}"
            )
        if empty:
            problems.append(f"condition {condition!r} has no usable finished run on {', '.join(empty)}")
    if problems:
        raise AnalysisError(
            "; ".join(problems) + " (restrict the analysis with --conditions or --datasets to a complete subset)"
        )


def wide(best: pd.DataFrame, value: str = "test_mean", conditions: Sequence[str] | None = None) -> pd.DataFrame:
    """Datasets × conditions table of ``value``; columns in ``conditions`` order if given."""
    table = best.pivot(index="dataset", columns="condition", values=value)
    table.columns.name = None
    if conditions is not None:
        table = table[[c for c in conditions if c in table.columns]]
    return table


def order_conditions(names: Iterable[str], order: Sequence[str] = ()) -> list[str]:
    """``names`` in the order of ``order`` first, the rest sorted after it."""
    names = list(dict.fromkeys(names))
    known = [c for c in order if c in names]
    return known + sorted(c for c in names if c not in known)


def ranks(table: pd.DataFrame) -> pd.DataFrame:
    """Per-row ranks of a datasets × conditions table: highest value = 1, ties averaged; values
    equal in decimal tie (``tie_exact``), as in every rank-based statistic here."""
    values = pd.DataFrame(tie_exact(table.to_numpy(dtype=float)), index=table.index, columns=table.columns)
    r = values.rank(axis=1, ascending=False, method="average")
    # as scipy's rankdata: a row with a missing value has no ranks (pandas alone ranks the rest)
    return r.mask(values.isna().any(axis=1), np.nan)


def lr_gaps(means: pd.DataFrame, value: str = "test_mean") -> pd.DataFrame:
    """Datasets × conditions table of max − min over lrs of the seed-mean ``value``.

    Only lrs with a finished run count; a cell with none is NaN.
    """
    g = means.dropna(subset=[value]).groupby(CELL)[value]
    gaps = (g.max() - g.min()).rename("gap").reset_index()
    table = gaps.pivot(index="dataset", columns="condition", values="gap")
    table.columns.name = None
    return table


def lr_robustness(means: pd.DataFrame, value: str = "test_mean") -> pd.Series:
    """Per condition: the mean over datasets of (max − min over lrs). Lower is more robust."""
    return lr_gaps(means, value).mean(axis=0).rename("lr_robustness")


# ---------------------------------------------------------------- the paper's other tables


def relative_gain(table: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Datasets × conditions: 100 · (x − x_ref) / x_ref, each condition's gain over ``reference``
    in percent of the reference's accuracy on that dataset (the reference's own column is 0)."""
    if reference not in table.columns:
        raise AnalysisError(
            f"gain reference {reference!r} is not among the conditions: {', '.join(map(str, table.columns))}"
        )
    ref = table[reference].astype(float)
    return table.astype(float).sub(ref, axis=0).div(ref, axis=0) * 100


def setting_means(bests: dict[str, pd.DataFrame], conditions: Sequence[str], value: str = "test_mean") -> pd.DataFrame:
    """Per condition: the mean over datasets of ``value`` at the chosen lr, one column per setting.

    ``bests`` maps a setting (an optimizer for the optimizer ablation, a model, ...) to its
    ``best_lr`` table. Each condition is averaged over the datasets every setting has a number
    on (``datasets``), so the columns compare like with like; with no such dataset, NaN.
    """
    names = list(bests)
    rows = []
    for c in conditions:
        per = {o: b[b["condition"] == c].dropna(subset=[value]).set_index("dataset")[value] for o, b in bests.items()}
        common = sorted(set.intersection(*(set(v.index) for v in per.values()))) if per else []
        row = {"condition": c, "datasets": len(common)}
        for o in names:
            row[o] = float(per[o].loc[common].mean()) if common else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["condition", "datasets", *names]).set_index("condition")


def lr_averaged(runs: pd.DataFrame, ddof: int = 0) -> pd.DataFrame:
    """Per (dataset, condition): test accuracy averaged over every lr and seed of the grid, with
    its std over them: the paper's ablation table, which tunes no lr (an lr-sensitive condition
    pays for its bad lrs). Finished runs only; the columns of ``best_lr`` that ``setting_means``
    reads (``test_mean``, ``test_std``, ``n`` the runs averaged)."""
    done = runs[runs["status"] == "finished"].assign(test_acc=lambda d: d["test_acc"].astype(float))
    g = done.groupby(CELL, sort=True)["test_acc"]
    out = pd.DataFrame({"test_mean": g.mean(), "test_std": g.std(ddof=ddof), "n": g.size()}).reset_index()
    return out.astype({"n": int})


def printed(table: pd.DataFrame, scale: float, digits: int = 2) -> pd.DataFrame:
    """``table`` as a paper prints it: rounded to ``digits`` places in display units (percent
    where ``scale`` is 100), back in the table's units. Values equal when printed become equal."""
    return (table.astype(float) * scale).round(digits) / scale


def trainable_params(runs: pd.DataFrame) -> pd.DataFrame:
    """Datasets × conditions: trainable parameter count (mean over the runs that logged one).

    The count depends on the condition and, through the classifier head, on the dataset's
    number of classes, never on lr or seed; every run that logged it counts, diverged ones too.
    Empty when no run has a count.
    """
    if "trainable_params" not in runs:
        return pd.DataFrame()
    df = runs.dropna(subset=["trainable_params"])
    if df.empty:
        return pd.DataFrame()
    table = df.groupby(CELL)["trainable_params"].mean().unstack("condition")
    table.columns.name = None
    return table


def parameter_efficiency(params: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """Per condition: mean trainable parameters and mean accuracy over the datasets both have.

    ``params`` and ``accuracy`` are datasets × conditions tables (``trainable_params``,
    ``wide``). Returns ``params``, ``accuracy``, ``datasets`` and ``share_of_full`` (the count
    over the ``full`` condition's, where ``full`` is present), sorted by count.
    """
    rows = []
    for c in accuracy.columns:
        if c not in params.columns:
            continue
        both = params[c].dropna().index.intersection(accuracy[c].dropna().index)
        if len(both) == 0:
            continue
        rows.append(
            {
                "condition": c,
                "params": float(params.loc[both, c].mean()),
                "accuracy": float(accuracy.loc[both, c].mean()),
                "datasets": len(both),
            }
        )
    out = pd.DataFrame(rows, columns=["condition", "params", "accuracy", "datasets"]).set_index("condition")
    full = out["params"].get("full", math.nan)
    out["share_of_full"] = out["params"] / full
    return out.sort_values("params", kind="stable")


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
    """Datasets × components table of plasticity averaged over layers, for one probe mode."""
    sub = pooled[pooled["mode"] == mode]
    table = sub.groupby(["dataset", "component"])["mean"].mean().unstack("component")
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


# ---------------------------------------------------------------- curves


def curve_bands(curves: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per (dataset, condition, key, step) of step metrics.

    ``curves`` has columns run_id, key, step, value; ``runs`` maps run_id to dataset and
    condition.
    """
    df = curves.merge(runs[["run_id", "dataset", "condition"]], on="run_id")
    g = df.groupby(CELL + ["key", "step"])["value"]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "n": g.size()}).reset_index()


def display_scale(values: Iterable[float]) -> float:
    """100 when accuracies look like fractions (all within [0, 1]), else 1."""
    v = np.asarray(list(values), dtype=float)
    v = v[~np.isnan(v)]
    return 100.0 if len(v) and v.min() >= 0 and v.max() <= 1 else 1.0
