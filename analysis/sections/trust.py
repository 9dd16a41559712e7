"""The report's sections past p-values: intervals, equivalence, tuning budget, variance.

Each ``*_section`` takes what ``analysis.study.Study`` holds and returns an
``analysis.output.Section`` (its Markdown, tables and figures) without writing anything. Where
the data cannot support a statistic (one dataset, one seed, one lr) the section says so in one
line instead. The statistics are in ``analysis.stats``,
``analysis.intervals`` and ``analysis.bayes``.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pandas as pd

from analysis import AnalysisError, bayes, figures, intervals, tables
from analysis.output import Figure, Section, Table, section
from analysis.scores import BOOTSTRAP_OVER, CD_CLIQUES, Options, scores_of  # noqa: F401 - the report's flags name them
from analysis.stats import budget as stats
from analysis.stats import variance

SINGLE = ("LN1", "MHA", "LN2", "FC1", "FC2")


def pair_list(order: list[str], reference: str | None) -> list[tuple[str, str]]:
    """The reference against each other condition first (reference as ``a``), then the rest."""
    if reference not in order:
        return list(itertools.combinations(order, 2))
    first = [(reference, c) for c in order if c != reference]
    rest = [(a, b) for a, b in itertools.combinations(order, 2) if reference not in (a, b)]
    return first + rest


def _shape_note(scores: np.ndarray) -> str | None:
    _, D, _ = scores.shape
    seeds = int((~np.isnan(scores)).sum(axis=-1).max())
    if D == 1 and seeds == 1:
        return "One dataset and one run per condition: no interval can be estimated."
    if D == 1:
        return "One dataset: the intervals reflect seeds only."
    if seeds == 1:
        return (
            "One run per dataset and condition: the intervals reflect datasets only, and "
            "P(X > Y) is the share of datasets where X beats Y."
        )
    return None


# ---------------------------------------------------------------- 1. intervals


def intervals_section(scores: np.ndarray, order: list[str], reference: str, scale: float, opts: Options) -> Section:
    """Bootstrap intervals of each condition's mean and IQM, of every pairwise difference, and
    the probability of improvement."""
    note = _shape_note(scores)
    title = "Interval estimates (stratified bootstrap)"
    fixed = opts.over == "seeds" or scores.shape[1] == 1
    if fixed and int((~np.isnan(scores)).sum(axis=-1).max()) == 1:
        note = (
            "One run per dataset and condition, and datasets fixed (--bootstrap-over seeds): "
            "no interval can be estimated."
            if scores.shape[1] > 1
            else note
        )
        return section(title, note)
    boot = intervals.resample(scores, opts.reps, opts.seed, datasets=not fixed)
    agg = intervals.aggregate_intervals(scores, order, boot=boot)
    pairs = intervals.pairwise_intervals(scores, order, boot=boot, pairs=pair_list(order, reference))
    shown = _aggregate_shown(agg, order, scale)
    pshown = _pairwise_shown(pairs, scale)
    lines = _intervals_lines(opts, fixed, note)
    lines += ["", tables.markdown(shown).rstrip(), "", tables.markdown(pshown).rstrip()]
    return section(
        title,
        "\n".join(lines),
        (Table("intervals", shown, agg), Table("intervals_pairwise", pshown, pairs)),
        (
            Figure("intervals", functools.partial(figures.intervals, agg, order, scale=scale)),
            Figure("probability_of_improvement", functools.partial(figures.improvement, pairs)),
        ),
    )


def _aggregate_shown(agg: pd.DataFrame, order: list[str], scale: float) -> pd.DataFrame:
    """The shown table of each condition's mean and IQM with its interval, one row per condition."""
    unit = " (%)" if scale == 100 else ""
    wide = agg.pivot(index="condition", columns="statistic", values=["estimate", "low", "high"])

    def column(stat: str) -> list[str]:
        return [
            tables.interval(
                wide.loc[c, ("estimate", stat)], wide.loc[c, ("low", stat)], wide.loc[c, ("high", stat)], 2, scale
            )
            for c in order
        ]

    return pd.DataFrame(
        {f"mean{unit} [95% CI]": column("mean"), f"IQM{unit} [95% CI]": column("iqm")},
        index=pd.Index(order, name="condition"),
    )


def _pairwise_shown(pairs: pd.DataFrame, scale: float) -> pd.DataFrame:
    """The shown table of every pair's mean and IQM differences, probability of improvement and
    Cliff's delta, each with its interval, indexed by pair."""

    def column(key: str, by: float = 1.0) -> list[str]:
        return [tables.interval(*r, 2, by) for r in zip(pairs[key], pairs[f"{key}_low"], pairs[f"{key}_high"])]

    return pd.DataFrame(
        {
            "pair": [f"{a} − {b}" for a, b in zip(pairs["a"], pairs["b"])],
            "mean diff [95% CI]": column("mean_diff", scale),
            "IQM diff [95% CI]": column("iqm_diff", scale),
            "P(a > b) [95% CI]": column("p_improve"),
            "Cliff's delta [95% CI]": column("cliffs_delta"),
        }
    ).set_index("pair")


def _intervals_lines(opts: Options, fixed: bool, note: str | None) -> list[str]:
    """The interval section's explanation: what was resampled and how to read the intervals."""
    over = "seeds within each dataset" if fixed else "datasets, and seeds within each drawn dataset"
    lines = [
        f"{opts.reps} bootstrap replicates (seed {opts.seed}) resampling {over}; percentile "
        "95% intervals. Mean: the average over datasets of the seed means (the accuracy "
        "table's average); IQM: the interquartile mean of all runs; P(a > b): the chance a "
        "run of a beats a run of b on the same dataset, averaged over datasets (Cliff's "
        "delta = 2 P − 1)."
    ]
    if not fixed:
        lines.append(
            "With datasets resampled, a condition's own interval includes how hard the "
            "drawn datasets are; the differences are paired over datasets (the same "
            "draw for both conditions) and are the intervals to read for comparisons."
        )
    if note:
        lines.append(note)
    return lines


# ---------------------------------------------------------------- 2. equivalence


def rope_section(
    table: pd.DataFrame, scores: np.ndarray, order: list[str], reference: str, scale: float, opts: Options
) -> Section:
    """Bayesian signed-rank and hierarchical tests with a ROPE for every pair."""
    title = f"Practical equivalence (ROPE ±{opts.rope:g} accuracy points)"
    n_d = table.shape[0]
    if n_d < 2:
        return section(
            title,
            f"One dataset ({table.index[0]}): the Bayesian tests compare conditions over datasets; nothing to test.",
        )
    width = opts.rope / scale if scale == 100 else opts.rope
    pairs = pair_list(order, reference)
    df = _signed_rank_frame(table, pairs, width, opts.seed)
    hier_note = _add_hierarchical(df, scores, order, pairs, width, opts)
    has_h = "hierarchical_p_rope" in df and df["hierarchical_p_rope"].notna().any()
    shown = _rope_shown(df, pairs, has_h)
    lines = [
        f"For each pair, the posterior probability that a new dataset's difference is "
        f"most probably in favour of a by more than {opts.rope:g} points (P(a better)), "
        "within that margin (P(equivalent)), or in favour of b. Bayesian signed-rank test "
        f"over the {n_d} per-dataset means (Benavoli et al., 2014; as baycomp's "
        "SignedRankTest, prior 0.5, 50,000 samples)"
        + (
            "; hierarchical model over datasets and seeds (Corani et al., 2017; baycomp's "
            "priors, seeds independent, Gibbs sampling: 8 chains × 500 draws)"
            if has_h
            else ""
        )
        + "."
    ]
    if hier_note:
        lines.append(hier_note)
    lines += ["", *_verdicts(df, pairs, order, reference, has_h), "", tables.markdown(shown).rstrip()]
    return section(
        title,
        "\n".join(lines),
        (Table("rope", shown, df),),
        (Figure("rope", functools.partial(figures.rope_bars, df, width=opts.rope)),),
    )


def _signed_rank_frame(table: pd.DataFrame, pairs: list[tuple[str, str]], width: float, seed: int) -> pd.DataFrame:
    """One row per pair: the Bayesian signed-rank test over the per-dataset means."""
    rows = []
    for a, b in pairs:
        r = bayes.signed_rank(table[a].to_numpy(float), table[b].to_numpy(float), width, random_state=seed)
        rows.append(
            {
                "a": a,
                "b": b,
                "datasets": r["n"],
                "signed_rank_p_a": r["p_a"],
                "signed_rank_p_rope": r["p_rope"],
                "signed_rank_p_b": r["p_b"],
            }
        )
    return pd.DataFrame(rows)


def _add_hierarchical(
    df: pd.DataFrame, scores: np.ndarray, order: list[str], pairs: list[tuple[str, str]], width: float, opts: Options
) -> str | None:
    """The hierarchical test's columns added to ``df`` (``opts.hierarchical`` on); returns a
    note where it could not run or was off."""
    if not opts.hierarchical:
        return "Hierarchical test: off (--no-hierarchical)."
    idx = {c: i for i, c in enumerate(order)}
    h = bayes.hierarchical([(scores[idx[a]], scores[idx[b]]) for a, b in pairs], width, random_state=opts.seed)
    df["hierarchical_p_a"] = [r["p_a"] for r in h]
    df["hierarchical_p_rope"] = [r["p_rope"] for r in h]
    df["hierarchical_p_b"] = [r["p_b"] for r in h]
    # delta0 is the mean of b − a; reported as a − b like every other difference
    df["hierarchical_mean_diff"] = [-r["delta0"] for r in h]
    skipped = {(a, b): r["skipped"] for (a, b), r in zip(pairs, h) if r["skipped"]}
    if not skipped:
        return None
    if len(skipped) == len(pairs) and len(set(skipped.values())) == 1:
        return f"Hierarchical test: {next(iter(skipped.values()))}."
    return "Hierarchical test: " + "; ".join(f"{a} vs {b} {why}" for (a, b), why in skipped.items()) + "."


def _rope_shown(df: pd.DataFrame, pairs: list[tuple[str, str]], has_h: bool) -> pd.DataFrame:
    """The ROPE table as shown: the three probabilities of each test, per pair."""
    f = lambda v: tables.fmt(v, 3)  # noqa: E731
    shown = pd.DataFrame(
        {
            "pair (a vs b)": [f"{a} vs {b}" for a, b in pairs],
            "P(a better)": df["signed_rank_p_a"].map(f),
            "P(equivalent)": df["signed_rank_p_rope"].map(f),
            "P(b better)": df["signed_rank_p_b"].map(f),
        }
    )
    if has_h:
        shown["hier. P(a better)"] = df["hierarchical_p_a"].map(f)
        shown["hier. P(equivalent)"] = df["hierarchical_p_rope"].map(f)
        shown["hier. P(b better)"] = df["hierarchical_p_b"].map(f)
    return shown.set_index("pair (a vs b)")


def _verdicts(
    df: pd.DataFrame, pairs: list[tuple[str, str]], order: list[str], reference: str, has_h: bool
) -> list[str]:
    """One line per pair of the reference (every pair without one): each test's verdict."""
    lines = []
    for (a, b), r in zip(pairs, df.itertuples()):
        if a != reference and reference in order:
            continue
        text = (
            f"- {a} vs {b}: "
            + _verdict(a, b, r.signed_rank_p_a, r.signed_rank_p_rope, r.signed_rank_p_b)
            + " (signed-rank)"
        )
        if has_h and not math.isnan(r.hierarchical_p_rope):
            text += "; hierarchical: " + _verdict(a, b, r.hierarchical_p_a, r.hierarchical_p_rope, r.hierarchical_p_b)
        lines.append(text + ".")
    return lines


def _verdict(a: str, b: str, pa: float, pe: float, pb: float) -> str:
    """ "practically equivalent with probability 0.83 (MHA better 0.17, FC1 better 0.00)"."""
    if math.isnan(pe):
        return "not testable"
    named = [(pa, f"{a} better"), (pe, "practically equivalent"), (pb, f"{b} better")]
    top = max(named)
    rest = ", ".join(f"{n} {p:.2f}" for p, n in named if n != top[1])
    return f"{top[1]} with probability {top[0]:.2f} ({rest})"


# ---------------------------------------------------------------- 5. tuning budget


def budget_section(means: pd.DataFrame, best: pd.DataFrame, order: list[str], scale: float) -> Section:
    """Expected best validation (and its test accuracy) against lrs tried; lrs at grid edges."""
    title = "Tuning budget and the lr grid"
    budget = stats.tuning_budget(means)
    edges = stats.lr_edges(means, best)
    lines, written, figs = _budget_part(budget, order, scale)
    shown_e, edge_line = _edges_part(edges, order)
    written.append(Table("lr_edges", shown_e, edges, index=True))
    lines.append(edge_line)
    lines += ["", tables.markdown(shown_e).rstrip()]
    return section(title, "\n".join(lines), tuple(written), figs)


def _budget_part(budget: pd.DataFrame, order: list[str], scale: float) -> tuple[list[str], list[Table], tuple]:
    """The tuning-budget part: its lines, its table (none with one lr per cell) and its figure."""
    top = int(budget["n_lrs"].max()) if len(budget) else 0
    if top < 2:
        return ["One lr per cell: no tuning budget to trace."], [], ()
    t = budget.pivot(index="condition", columns="n_lrs", values=["expected_val", "expected_test"])
    shown = pd.DataFrame(
        {
            f"{n} lr{'s' if n > 1 else ''}": [
                f"{tables.fmt(t.loc[c, ('expected_val', n)] * scale, 2)} / "
                f"{tables.fmt(t.loc[c, ('expected_test', n)] * scale, 2)}"
                if c in t.index
                else tables.DASH
                for c in order
            ]
            for n in range(1, top + 1)
        },
        index=pd.Index(order, name="condition"),
    )
    figs = (Figure("tuning_budget", functools.partial(figures.tuning_budget, budget, order, scale=scale)),)
    lines = [
        "Expected best validation accuracy / the test accuracy at that lr, when n of the "
        "grid's lrs are drawn at random (with replacement) and the best on validation "
        "kept (Dodge et al., 2019), averaged over datasets. A curve still rising at the "
        "full grid says more lrs would help.",
        "",
        tables.markdown(shown).rstrip(),
        "",
    ]
    return lines, [Table("tuning_budget", shown, budget, index=True)], figs


def _edges_part(edges: pd.DataFrame, order: list[str]) -> tuple[pd.DataFrame, str]:
    """The shown table of where each condition's chosen lr sits in its grid, and the line naming
    the conditions whose chosen lr is at an edge."""
    counts = pd.crosstab(edges["condition"], edges["edge"])
    n_d = edges.groupby("condition").size()
    shown_e = pd.DataFrame(
        {
            "chosen lr at top of grid": [f"{int(counts.loc[c].get('high', 0))}/{n_d[c]}" for c in order],
            "at bottom": [f"{int(counts.loc[c].get('low', 0))}/{n_d[c]}" for c in order],
            "inside": [f"{int(counts.loc[c].get('inside', 0))}/{n_d[c]}" for c in order],
            "grid sizes": [
                ", ".join(map(str, sorted(set(edges.loc[edges["condition"] == c, "grid_size"].dropna().astype(int)))))
                for c in order
            ],
        },
        index=pd.Index(order, name="condition"),
    )
    flagged = [(c, e) for c in order for e in ("high", "low") if counts.loc[c].get(e, 0) > 0 and c in counts.index]
    if not flagged:
        return shown_e, "No chosen lr sits at an edge of its grid."
    hi = [f"{c} ({int(counts.loc[c]['high'])}/{n_d[c]})" for c, e in flagged if e == "high"]
    lo = [f"{c} ({int(counts.loc[c]['low'])}/{n_d[c]})" for c, e in flagged if e == "low"]
    text = "Chosen lr at an edge of its grid (datasets): "
    text += "; ".join(
        p
        for p in (("largest lr: " + ", ".join(hi)) if hi else "", ("smallest lr: " + ", ".join(lo)) if lo else "")
        if p
    )
    text += ". The optimum may lie outside the grid: extend it beyond that edge."
    if (edges["grid_size"] == 2).all():
        text += " (Every grid here has two lrs, so every choice is at an edge.)"
    return shown_e, text


# ---------------------------------------------------------------- 6. variance


def variance_section(runs: pd.DataFrame, order: list[str], scale: float) -> Section:
    """How the spread of finished runs splits into dataset, lr and seed, per condition."""
    v = variance.variance_decomposition(runs).set_index("condition").reindex(order)
    unit = " (%)" if scale == 100 else ""
    sd = lambda x: tables.fmt(math.sqrt(x) * scale if x == x else math.nan, 2)  # noqa: E731
    pct = lambda x: tables.fmt(100 * x, 1) + "%" if x == x else tables.DASH  # noqa: E731
    shown = pd.DataFrame(
        {
            "runs": [tables.fmt(n, 0) if n == n else tables.DASH for n in v["n_runs"]],
            f"sd total{unit}": v["var_total"].map(sd),
            "dataset": [f"{sd(a)} ({pct(b)})" for a, b in zip(v["var_dataset"], v["share_dataset"])],
            "lr": [f"{sd(a)} ({pct(b)})" for a, b in zip(v["var_lr"], v["share_lr"])],
            "seed": [f"{sd(a)} ({pct(b)})" for a, b in zip(v["var_seed"], v["share_seed"])],
            "seed share within datasets": [
                pct(s / (s + lr)) if s + lr > 0 else tables.DASH for s, lr in zip(v["var_seed"], v["var_lr"])
            ],
        },
        index=pd.Index(order, name="condition"),
    )
    body = (
        "Finished runs of each condition, all lrs: the variance splits exactly into between "
        "datasets, between lrs within a dataset and between seeds at one (dataset, lr) (law "
        "of total variance, ddof 0). Cells: standard deviation of that part (share of the "
        "variance); the last column is the seed part's share of what is left once datasets "
        "are accounted for (seed against lr)."
    )
    if runs["seed"].nunique() < 2:
        body += " One seed: the seed part is zero by construction."
    return section(
        "Where the spread comes from",
        body + "\n\n" + tables.markdown(shown),
        (Table("variance", shown, v.reset_index(), index=True),),
    )


# ---------------------------------------------------------------- 7. rank correlations


def correlation(
    name: str,
    measure: pd.DataFrame,
    scores: np.ndarray,
    order: list[str],
    datasets: list[str],
    opts: Options,
    slug: str,
) -> Section:
    """Spearman rho between ``measure`` (datasets × components) and accuracy, with intervals:
    a paragraph (no heading) and its table ``SLUG_correlation_ci``."""
    try:
        corr = intervals.correlation_intervals(measure, scores, order, datasets, opts.reps, opts.seed)
    except AnalysisError as e:
        return Section(f"{name}: {e}.")
    shown = corr.set_index("dataset")
    shown = pd.DataFrame(
        {"rho [95% CI]": [tables.interval(r, lo, hi, 2) for r, lo, hi in zip(corr["rho"], corr["low"], corr["high"])]},
        index=shown.index,
    )
    m = corr.set_index("dataset").loc["mean"]
    comps = [c for c in measure.columns if c in order]
    rank = measure[comps].mean().sort_values(ascending=False)
    tie = (
        " A dash: no spread to rank (the measure or the accuracy ties across components)."
        if corr["rho"].isna().any()
        else ""
    )
    return Section(
        f"{name} (highest first): {' > '.join(rank.index)}. Spearman rho with accuracy "
        f"across components, per dataset with a seed-bootstrap interval, and the mean over "
        f"datasets: {tables.interval(m['rho'], m['low'], m['high'], 2)} (datasets and seeds "
        f"resampled).{tie}\n\n" + tables.markdown(shown),
        (Table(f"{slug}_correlation_ci", shown, corr, index=True),),
    )


def grad_norms(bands: pd.DataFrame) -> pd.DataFrame:
    """Datasets × components: the trained component's gradient norm averaged over steps and
    seeds, for the single-component conditions (``grad_norm/{condition}`` curves)."""
    own = bands[(bands["key"] == "grad_norm/{condition}") & bands["condition"].isin(SINGLE)]
    t = own.groupby(["dataset", "condition"])["mean"].mean().unstack("condition")
    t.columns.name = None
    return t
