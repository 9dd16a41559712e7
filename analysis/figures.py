"""The study's figures, each written as PNG and PDF.

Figures are drawn on ``matplotlib.figure.Figure`` objects, never through pyplot, so no GUI
backend is chosen and nothing global changes: PNG goes through Agg, PDF through the PDF backend.
Every function takes the tables ``analysis.stats`` returns and a path without suffix, and
returns the files it wrote.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats import selection


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(fig, base: str | os.PathLike) -> list[Path]:
    """Write ``base.png`` (150 dpi) and ``base.pdf``."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    # Appended, not with_suffix: model names carry dots (vit_base_patch16_224.orig_in21k).
    paths = [base.with_name(base.name + ".png"), base.with_name(base.name + ".pdf")]
    # Constrained layout places everything inside the figure, so no "tight" bbox (which draws
    # each file twice); the PDF reuses the PNG's layout instead of solving it again.
    fig.savefig(paths[0], dpi=150)
    engine = fig.get_layout_engine()
    fig.set_layout_engine("none")
    fig.savefig(paths[1])
    fig.set_layout_engine(engine)
    return paths


class Outputs(list):
    """The files an analysis wrote, in order, and whether it draws its figures: ``add(fig_fn,
    ...)`` draws ``fig_fn(...)`` and keeps the files it wrote, or does nothing when ``draw`` is
    off (``--no-figures``: the tables and tests alone, without drawing's seconds per figure)."""

    def __init__(self, draw: bool = True):
        super().__init__()
        self.draw = draw

    def add(self, fig_fn, *args, **kw) -> None:
        """Draw ``fig_fn(*args, **kw)`` and keep the files it returns, when drawing is on."""
        if self.draw:
            self.extend(fig_fn(*args, **kw))


def palette(names) -> dict[str, tuple]:
    """One colour per name, the same in every figure: each condition of the study keeps its own
    tab10 colour (in the tables' order: the paper's conditions, the other components, LoRA),
    whichever others a figure shows; other names (settings, new conditions) take the colours
    left, in the order given."""
    from matplotlib import colormaps

    from raystudy.models.components import PAPER_CONDITIONS, STUDY_COMPONENTS

    known = list(dict.fromkeys(PAPER_CONDITIONS + STUDY_COMPONENTS + ("lora",)))
    extra = [n for n in dict.fromkeys(names) if n not in known]
    tab10, tab20 = colormaps["tab10"], colormaps["tab20"]
    # past tab10, tab20's light shades: they never repeat a condition's colour
    slots = [tab10(i) for i in range(10)] + [tab20(2 * i + 1) for i in range(10)]
    slot = {n: i for i, n in enumerate(known + extra)}
    return {n: slots[slot[n] % len(slots)] for n in names}


def _grid(n: int, width: float = 3.4, height: float = 2.6):
    ncols = min(4, max(1, n))
    nrows = math.ceil(n / ncols)
    fig = _figure(width * ncols, height * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


class _LogLabels:
    """Labels of a log axis, all in one style: plain numbers (0.5, 2, 10) while the axis stays
    within 0.001..10,000, else powers of ten; between decades, 2 and 5 (and 3 under one decade)
    are labelled only while the axis spans less than two decades."""

    def __init__(self, minor: bool):
        self.minor = minor

    def formatter(self, axis):
        """A matplotlib tick formatter of ``axis`` giving ``label``'s text."""
        from matplotlib.ticker import FuncFormatter

        return FuncFormatter(lambda x, pos: self.label(x, axis.get_view_interval()))

    def label(self, x: float, view) -> str:
        """The label of tick ``x`` on an axis showing ``view`` (low, high); empty: no label."""
        if not (x > 0 and math.isfinite(x)):
            return ""
        lo, hi = sorted(float(v) for v in view)
        if lo <= 0:
            return ""
        exp = math.floor(math.log10(x) + 1e-9)
        lead = round(x / 10**exp, 6)
        decades = math.log10(hi / lo)
        if self.minor and not (decades < 2 and lead in (2, 5) or decades < 1 and lead == 3):
            return ""
        if lo >= 1e-3 and hi <= 1e4:
            return f"{x:g}"
        return rf"${lead:g}\times10^{{{exp}}}$" if self.minor else rf"$10^{{{exp}}}$"


def _log_axis(ax, which: str = "y") -> None:
    """A log axis with ``_LogLabels``: every tick label on it in the same style."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis.set_major_formatter(_LogLabels(minor=False).formatter(axis))
    axis.set_minor_formatter(_LogLabels(minor=True).formatter(axis))


def _log_y(ax) -> None:
    _log_axis(ax, "y")


def rank_order(best: pd.DataFrame, conditions: list[str], value: str = "test_mean") -> list[str]:
    """``conditions`` best first: by average rank over datasets (``selection.ranks``, a dataset
    missing a condition ranking the others), ties by the mean over datasets, then by the order
    given; values equal in decimal tie (``paired.tie_exact``)."""
    from analysis.stats import paired, selection

    table = best.pivot_table(index="dataset", columns="condition", values=value).reindex(columns=conditions)
    rank = selection.ranks(table, partial=True).mean().fillna(np.inf)
    table = pd.DataFrame(paired.tie_exact(table.to_numpy(float)), index=table.index, columns=table.columns)
    mean = pd.Series(paired.tie_exact(table.mean().to_numpy(float)), index=table.columns).fillna(-np.inf)
    return sorted(conditions, key=lambda c: (rank[c], -mean[c], conditions.index(c)))


def average_spread(best: pd.DataFrame, conditions: list[str], paper: bool = False) -> pd.DataFrame:
    """Per condition, the mean over datasets of the seed means and its seed spread: the std over
    seeds of the average over datasets, sqrt(sum of the datasets' seed variances) / datasets
    (seeds independent across datasets). NaN where a dataset has no std (one seed).

    ``paper``: the paper's bars instead, the pooled seed std over the seeds' count,
    sqrt(mean of the datasets' seed variances) / sqrt(seeds): the standard error of one
    dataset's mean, not of the average over datasets, so wider by about sqrt(datasets)."""
    g = best[best["condition"].isin(conditions)].groupby("condition")
    if paper:
        seeds = g["n"].max() if "n" in best else math.nan
        std = g["test_std"].apply(lambda v: math.sqrt((v**2).mean(skipna=False))) / np.sqrt(seeds)
    else:
        std = g["test_std"].apply(lambda v: math.sqrt((v**2).sum(skipna=False)) / len(v))
    return pd.DataFrame({"mean": g["test_mean"].mean(), "std": std}).reindex(conditions)


def accuracy_figure(
    best: pd.DataFrame, conditions: list[str], scale: float = 1.0, title: str = "", paper: bool = False
):
    """Test accuracy at the best lr per condition, best rank first: a panel of every dataset
    (mean ± std over seeds) and a panel of the average over datasets (± its seed spread, or
    with ``paper`` the paper's bars: ``average_spread``)."""
    order = rank_order(best, conditions)
    datasets = sorted(best["dataset"].unique())
    col = palette(order)
    fig = _figure(max(6.5, 0.75 * len(datasets) + 0.35 * len(order) + 3.0), 3.8)
    ax, avg_ax = fig.subplots(
        1, 2, sharey=True, width_ratios=[max(1.5, 0.75 * len(datasets)), max(1.2, 0.35 * len(order))]
    )
    width = 0.8 / max(1, len(order))
    for j, c in enumerate(order):
        sub = best[best["condition"] == c].set_index("dataset")
        y = [sub["test_mean"].get(d, np.nan) * scale for d in datasets]
        e = [sub["test_std"].get(d, np.nan) * scale for d in datasets]
        x = np.arange(len(datasets)) - 0.4 + width * (j + 0.5)
        ax.errorbar(x, y, yerr=np.nan_to_num(e), fmt="o", ms=4, capsize=2, color=col[c], label=c)
    for g in range(1, len(datasets)):
        ax.axvline(g - 0.5, color="0.85", lw=0.6, zorder=0)
    ax.set_xticks(range(len(datasets)), datasets, rotation=30, ha="right")
    ax.set_ylabel("test accuracy" + (" (%)" if scale == 100 else ""))
    ax.set_title("per dataset (mean ± std over seeds)", fontsize=9)
    avg = average_spread(best, order, paper)
    for i, c in enumerate(order):
        avg_ax.errorbar(
            i,
            avg.loc[c, "mean"] * scale,
            yerr=np.nan_to_num(avg.loc[c, "std"] * scale),
            fmt="o",
            ms=6,
            capsize=3,
            color=col[c],
            label=c,
        )
    avg_ax.set_xticks(range(len(order)), order, rotation=45, ha="right", fontsize=8)
    avg_ax.set_xlim(-0.6, len(order) - 0.4)
    avg_ax.set_title(
        f"average over {len(datasets)} dataset{'s' * (len(datasets) != 1)}\n"
        + ("(± pooled seed std / √seeds, the paper's)" if paper else "(± std over seeds)")
        + ", best rank left",
        fontsize=9,
    )
    for a in (ax, avg_ax):
        a.grid(axis="y", color="0.92", lw=0.6)
        a.set_axisbelow(True)
    fig.legend(
        *ax.get_legend_handles_labels(),
        fontsize=8,
        ncols=min(len(order), 7),
        loc="outside upper center",
        frameon=False,
        title=title or "Test accuracy at the best lr, conditions by average rank",
        title_fontsize=10,
    )
    return fig


def accuracy(
    best: pd.DataFrame,
    conditions: list[str],
    base: str | os.PathLike,
    scale: float = 1.0,
    title: str = "",
    paper: bool = False,
) -> list[Path]:
    """``accuracy_figure`` as PNG and PDF."""
    return save(accuracy_figure(best, conditions, scale, title, paper), base)


def curves(
    bands: pd.DataFrame, key: str, conditions: list[str], base: str | os.PathLike, ylabel: str = "", log: bool = False
) -> list[Path]:
    """One panel per dataset: ``key`` against step, one line per condition, ±std over seeds."""
    sub = bands[bands["key"] == key]
    datasets = sorted(sub["dataset"].unique())
    if not datasets:
        return []
    col = palette(conditions)
    fig, axes = _grid(len(datasets))
    for ax, d in zip(axes, datasets):
        for c in conditions:
            s = sub[(sub["dataset"] == d) & (sub["condition"] == c)].sort_values("step")
            if s.empty:
                continue
            ax.plot(s["step"], s["mean"], color=col[c], lw=1.2, label=c)
            ax.fill_between(s["step"], s["mean"] - s["std"], s["mean"] + s["std"], color=col[c], alpha=0.2, lw=0)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(ylabel or key, fontsize=8)
        if log:
            _log_y(ax)
        ax.tick_params(which="both", labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4), fontsize=8, frameon=False)
    return save(fig, base)


def component_summary(pooled: pd.DataFrame, mode: str, components: list[str]) -> pd.DataFrame:
    """Per component, plasticity averaged over layers and datasets with a 95% interval, and each
    dataset's layer average. The interval averages the per-layer bounds: exact when the layers'
    errors move together (the same pairs probe every layer), wider than needed otherwise."""
    sub = pooled[(pooled["mode"] == mode) & pooled["component"].isin(components)]
    per_dataset = sub.groupby(["component", "dataset"])["mean"].mean()
    g = sub.groupby("component")
    out = pd.DataFrame(
        {
            "mean": g["mean"].mean(),
            "ci_low": g["ci_low"].mean(),
            "ci_high": g["ci_high"].mean(),
            "datasets": per_dataset.groupby(level="component").agg(list),
        }
    )
    return out.reindex([c for c in components if c in out.index])


def plasticity_figure(pooled: pd.DataFrame, components: list[str], modes: list[str] | None = None, title: str = ""):
    """Plasticity as the paper shows it, a row per probe mode (shared, in situ): per-component
    bars on a log scale with 95% intervals (dots: each dataset's average over layers), and
    beside them, a panel per dataset of the per-layer curves with their 95% bands. None when
    there is nothing to draw. The dotted line is P = 1, where a component neither amplifies nor
    contracts differences."""
    modes = [m for m in (modes or ("shared", "in_situ")) if m in set(pooled["mode"])]
    datasets = sorted(pooled["dataset"].unique())
    if not datasets or not modes:
        return None
    col = palette(components)
    fig = _figure(3.0 + 3.2 * len(datasets), 2.7 * len(modes) + 0.6)
    axes = fig.subplots(
        len(modes),
        1 + len(datasets),
        squeeze=False,
        width_ratios=[max(1.0, 0.3 * len(components))] + [1.0] * len(datasets),
    )
    for row, mode in zip(axes, modes):
        what = mode.replace("_", " ")
        bars, summary = row[0], component_summary(pooled, mode, components)
        x = np.arange(len(summary))
        m = summary["mean"].to_numpy(float)
        err = np.vstack([m - summary["ci_low"].to_numpy(float), summary["ci_high"].to_numpy(float) - m])
        bars.bar(x, m, color=[col[c] for c in summary.index], width=0.7, alpha=0.85)
        bars.errorbar(x, m, yerr=np.clip(err, 0, None), fmt="none", ecolor="k", capsize=3, lw=1)
        for xi, values in zip(x, summary["datasets"]):
            bars.plot(np.full(len(values), xi), values, ".", color="k", ms=3)
        bars.set_xticks(x, list(summary.index), fontsize=8)
        bars.set_title(f"per component ({what} input)", fontsize=9)
        bars.set_ylabel("plasticity P(f), mean over layers", fontsize=8)
        for ax, d in zip(row[1:], datasets):
            sub = pooled[(pooled["mode"] == mode) & (pooled["dataset"] == d)]
            for c in components:
                s = sub[sub["component"] == c].sort_values("layer")
                if s.empty:
                    continue
                ax.plot(s["layer"], s["mean"], "o-", ms=3, color=col[c], lw=1.2, label=c)
                ax.fill_between(s["layer"], s["ci_low"], s["ci_high"], color=col[c], alpha=0.25, lw=0)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_title(f"{d} ({what} input)", fontsize=9)
            ax.set_xlabel("layer", fontsize=8)
            ax.set_ylabel("plasticity P(f)", fontsize=8)
        for ax in row:
            ax.axhline(1.0, color="0.5", ls=":", lw=0.8)
            _log_y(ax)
            ax.tick_params(which="both", labelsize=7)
    handles, labels = axes[0][1].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside upper center",
        ncols=min(len(labels), 5),
        fontsize=8,
        frameon=False,
        title=title or "Plasticity per component and per layer (95% intervals)",
        title_fontsize=9,
    )
    return fig


def plasticity_layers(
    pooled: pd.DataFrame,
    components: list[str],
    base: str | os.PathLike,
    modes: list[str] | None = None,
    title: str = "",
) -> list[Path]:
    """``plasticity_figure`` as PNG and PDF: the one plasticity figure of raystudy, which the
    report and the probe CLI both draw. Nothing to draw: no files."""
    fig = plasticity_figure(pooled, components, modes, title)
    return [] if fig is None else save(fig, base)


def cd_figure(avg_ranks: pd.Series, cd: float, cliques: list[list[str]], n_datasets: int, title: str = ""):
    """Critical-difference diagram (Demšar 2006): average ranks on an axis, rank 1 on the left.

    Conditions joined by a thick bar are not significantly different (Nemenyi, their average
    ranks differ by less than CD). Ranks over one dataset are that dataset's own: there is no
    test to draw, so fewer than 2 datasets raise AnalysisError. The axis runs far enough to hold
    the CD bar, which starts at rank 1.
    """
    from analysis import AnalysisError

    if n_datasets < 2:
        raise AnalysisError(
            f"a critical-difference diagram needs average ranks over 2 or more datasets; got {n_datasets}"
        )
    r = avg_ranks.sort_values()
    k = len(r)
    lo = 1
    hi = max(k, math.ceil(r.max()), math.ceil(lo + cd - 1e-9))
    span = hi - lo or 1
    half = math.ceil(k / 2)
    step, bar = 0.28, 0.14
    top = 0.9
    first = -0.25 - bar * len(cliques)
    bottom = first - step * (half + 0.5)
    fig = _figure(7.0, 0.9 * (top - bottom) + 0.3)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(lo - 0.45 * span, hi + 0.45 * span)
    ax.set_ylim(bottom, top)
    ax.plot([lo, hi], [0, 0], color="k", lw=1, gid="rank_axis")
    for t in range(lo, hi + 1):
        ax.plot([t, t], [0, 0.07], color="k", lw=1)
        ax.text(t, 0.12, str(t), ha="center", va="bottom", fontsize=8)
    ax.plot([lo, lo + cd], [0.55, 0.55], color="k", lw=1.5, gid="cd_bar")
    for x in (lo, lo + cd):
        ax.plot([x, x], [0.5, 0.6], color="k", lw=1)
    ax.text(lo + cd / 2, 0.63, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8)
    for i, (name, rank) in enumerate(r.items()):
        left = i < half
        row = i if left else k - 1 - i
        y = first - step * (row + 0.5)
        x_end = lo - 0.1 * span if left else hi + 0.1 * span
        ax.plot([rank, rank, x_end], [0, y, y], color="k", lw=0.8)
        ax.text(
            x_end + (-0.02 if left else 0.02) * span,
            y,
            f"{name} ({rank:.2f})",
            ha="right" if left else "left",
            va="center",
            fontsize=8,
        )
    for j, group in enumerate(cliques):
        y = -0.15 - bar * j
        ax.plot([r[group[0]] - 0.03 * span, r[group[-1]] + 0.03 * span], [y, y], color="k", lw=3, solid_capstyle="butt")
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def cd_diagram(
    avg_ranks: pd.Series,
    cd: float,
    cliques: list[list[str]],
    base: str | os.PathLike,
    title: str = "",
    *,
    n_datasets: int,
) -> list[Path]:
    """``cd_figure`` as PNG and PDF."""
    return save(cd_figure(avg_ranks, cd, cliques, n_datasets, title), base)


def _ci_rows(ax, labels, est, low, high, color, ref=None, xlabel=""):
    """One horizontal interval per row, the first label on top."""
    y = np.arange(len(labels))[::-1]
    est, low, high = (np.asarray(v, float) for v in (est, low, high))
    ax.hlines(y, low, high, color=color, lw=5, alpha=0.45)
    ax.plot(est, y, "|", color="k", ms=12, mew=1.5)
    if ref is not None:
        ax.axvline(ref, color="0.5", ls=":", lw=0.8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_axisbelow(True)


def _best_first(values: pd.Series, names: list[str]) -> list[str]:
    """``names`` by ``values`` highest first; names without a value last, in the order given."""
    return sorted(names, key=lambda c: -values[c] if c in values and pd.notna(values[c]) else np.inf)


def intervals(
    agg: pd.DataFrame, conditions: list[str], base: str | os.PathLike, scale: float = 1.0, title: str = ""
) -> list[Path]:
    """``intervals_figure`` as PNG and PDF."""
    return save(intervals_figure(agg, conditions, scale, title), base)


def intervals_figure(agg: pd.DataFrame, conditions: list[str], scale: float = 1.0, title: str = ""):
    """Interval plot (rliable style): per condition the mean and the IQM with 95% intervals,
    the best mean on top.

    ``agg`` is ``analysis.intervals.aggregate_intervals``: condition, statistic, estimate, low,
    high.
    """
    col = palette(conditions)
    stats_ = [s for s in ("mean", "iqm") if s in set(agg["statistic"])]
    if stats_:
        conditions = _best_first(agg[agg["statistic"] == stats_[0]].set_index("condition")["estimate"], conditions)
    fig = _figure(3.2 * len(stats_) + 0.8, 0.32 * len(conditions) + 1.2)
    axes = fig.subplots(1, len(stats_), squeeze=False)[0]
    names = {"mean": "mean over datasets", "iqm": "interquartile mean of runs"}
    for ax, s in zip(axes, stats_):
        sub = agg[agg["statistic"] == s].set_index("condition").reindex(conditions)
        y = np.arange(len(conditions))[::-1]
        for yi, c in zip(y, conditions):
            ax.hlines(yi, sub.loc[c, "low"] * scale, sub.loc[c, "high"] * scale, color=col[c], lw=6, alpha=0.6)
            ax.plot(sub.loc[c, "estimate"] * scale, yi, "|", color="k", ms=12, mew=1.5)
        ax.set_yticks(y, conditions if ax is axes[0] else [""] * len(conditions), fontsize=8)
        ax.set_ylim(-0.7, len(conditions) - 0.3)
        ax.set_xlabel(names[s] + (" (%)" if scale == 100 else ""), fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(title or "Test accuracy, 95% stratified-bootstrap intervals", fontsize=9)
    return fig


def rank_probabilities(rank_p: pd.DataFrame, base: str | os.PathLike, title: str = "") -> list[Path]:
    """Per condition, a bar stacked by the probability of each rank (rank 1 darkest), the
    likeliest top-1 on top.

    ``rank_p`` has one row per condition and columns ``P(rank 1)`` ... ``P(rank K)`` (others ignored).
    """
    from matplotlib import colormaps

    cols = [c for c in rank_p.columns if str(c).startswith("P(rank ")]
    order = list(rank_p.sort_values(cols, ascending=False).index)
    fig = _figure(5.6, 0.32 * len(order) + 1.4)
    ax = fig.add_subplot()
    y = np.arange(len(order))[::-1]
    left = np.zeros(len(order))
    shades = colormaps["viridis"](np.linspace(0.1, 0.95, len(cols)))
    for col, shade in zip(cols, shades):
        width = rank_p.loc[order, col].to_numpy(float) * 100
        ax.barh(y, width, left=left, color=shade, height=0.7, label=col[2:-1])
        left += width
    ax.set_yticks(y, order, fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of replicates (%)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, ncols=min(len(cols), 7), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(title or "Rank of each condition over bootstrap replicates, lr re-chosen in each", fontsize=9)
    return save(fig, base)


def improvement(pairs: pd.DataFrame, base: str | os.PathLike, title: str = "") -> list[Path]:
    """Probability of improvement P(a > b) with 95% intervals, one row per pair (rliable style).

    ``pairs`` is ``analysis.intervals.pairwise_intervals``; 0.5 (dotted) is no preference.
    """
    labels = [f"P({a} > {b})" for a, b in zip(pairs["a"], pairs["b"])]
    fig = _figure(5.0, 0.26 * len(labels) + 1.0)
    ax = fig.add_subplot()
    _ci_rows(
        ax,
        labels,
        pairs["p_improve"],
        pairs["p_improve_low"],
        pairs["p_improve_high"],
        "tab:blue",
        0.5,
        "probability of improvement (a run of a beats a run of b)",
    )
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(title or "Probability of improvement, 95% stratified-bootstrap intervals", fontsize=9)
    return save(fig, base)


def rope_bars(rope: pd.DataFrame, base: str | os.PathLike, width: float, title: str = "") -> list[Path]:
    """Stacked bars of P(a better), P(practically equivalent), P(b better) per pair.

    ``rope`` has a, b and, per test, ``{test}_p_a``, ``{test}_p_rope``, ``{test}_p_b`` for the
    tests ``signed_rank`` and ``hierarchical`` (whichever are present and not all NaN).
    """
    tests = [t for t in ("signed_rank", "hierarchical") if f"{t}_p_rope" in rope and rope[f"{t}_p_rope"].notna().any()]
    if not tests:
        return []
    names = {"signed_rank": "Bayesian signed-rank (dataset means)", "hierarchical": "hierarchical (datasets × seeds)"}
    labels = [f"{a} vs {b}" for a, b in zip(rope["a"], rope["b"])]
    y = np.arange(len(labels))[::-1]
    fig = _figure(3.6 * len(tests) + 1.4, 0.26 * len(labels) + 1.3)
    axes = fig.subplots(1, len(tests), squeeze=False)[0]
    parts = (("p_a", "a better", "tab:blue"), ("p_rope", "equivalent", "0.75"), ("p_b", "b better", "tab:orange"))
    for ax, t in zip(axes, tests):
        left = np.zeros(len(labels))
        for key, lab, c in parts:
            v = np.nan_to_num(rope[f"{t}_{key}"].to_numpy(float))
            ax.barh(y, v, left=left, color=c, height=0.7, label=lab, edgecolor="white", lw=0.5)
            left += v
        ax.set_yticks(y, labels if ax is axes[0] else [""] * len(labels), fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_title(names[t], fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("posterior probability", fontsize=8)
    handles, lab = axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        lab,
        loc="outside upper center",
        ncols=3,
        fontsize=8,
        frameon=False,
        title=title or f"Practical equivalence, ROPE ±{width:g} accuracy points",
        title_fontsize=9,
    )
    return save(fig, base)


def tuning_budget(
    budget: pd.DataFrame, conditions: list[str], base: str | os.PathLike, scale: float = 1.0
) -> list[Path]:
    """Expected best validation accuracy and the test accuracy there against lrs tried
    (Dodge et al., 2019), one line per condition, averaged over datasets."""
    col = palette(conditions)
    fig = _figure(7.5, 3.0)
    axes = fig.subplots(1, 2)
    for ax, key, lab in (
        (axes[0], "expected_val", "expected best validation accuracy"),
        (axes[1], "expected_test", "expected test accuracy at that lr"),
    ):
        for c in conditions:
            s = budget[budget["condition"] == c].sort_values("n_lrs")
            if s.empty:
                continue
            ax.plot(s["n_lrs"], s[key] * scale, "o-", ms=3, lw=1.2, color=col[c], label=c)
        ax.set_xlabel("learning rates tried", fontsize=8)
        ax.set_ylabel(lab + (" (%)" if scale == 100 else ""), fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside upper center",
        ncols=min(len(labels), 7),
        fontsize=8,
        frameon=False,
        title="Expected accuracy against tuning budget (Dodge et al., 2019)",
        title_fontsize=9,
    )
    return save(fig, base)


__all__ = [
    "accuracy",
    "curves",
    "plasticity_layers",
    "cd_diagram",
    "intervals",
    "improvement",
    "rope_bars",
    "tuning_budget",
    "save",
    "palette",
    "rank_order",
]


def parameter_efficiency(eff: pd.DataFrame, base: str | os.PathLike, scale: float = 1.0, title: str = "") -> list[Path]:
    """Accuracy against trainable parameter count (log x), one labelled point per condition.

    ``eff`` is ``analysis.stats.selection.parameter_efficiency`` (index: condition; params, accuracy).
    """
    names = list(eff.index)
    col = palette(names)
    fig = _figure(5.5, 3.6)
    ax = fig.add_subplot()
    for c in names:
        x, y = eff.loc[c, "params"], eff.loc[c, "accuracy"] * scale
        ax.plot(x, y, "o", ms=6, color=col[c])
        ax.annotate(c, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=8)
    _log_axis(ax, "x")
    ax.set_xlabel("trainable parameters (log scale)", fontsize=8)
    ax.set_ylabel("mean test accuracy" + (" (%)" if scale == 100 else ""), fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    ax.set_title(title or "Accuracy against trainable parameters", fontsize=9)
    return save(fig, base)


def gains(avg_gain: pd.Series, base: str | os.PathLike, reference: str, title: str = "") -> list[Path]:
    """Horizontal bars of each condition's mean relative gain (%) over ``reference``."""
    names = _best_first(avg_gain, [c for c in avg_gain.index if c != reference])
    col = palette(list(avg_gain.index))
    fig = _figure(5.0, 0.3 * len(names) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(names))[::-1]
    ax.barh(y, [avg_gain[c] for c in names], color=[col[c] for c in names])
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"mean relative gain over {reference} (%)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title or f"Relative gain over {reference}, mean over datasets", fontsize=9)
    return save(fig, base)


def setting_means(ab: pd.DataFrame, base: str | os.PathLike, scale: float = 1.0, title: str = "") -> list[Path]:
    """One row per condition, one marker per setting (e.g. SGD and AdamW): mean test accuracy.

    ``ab`` is ``analysis.stats.selection.setting_means`` (index: condition; a ``datasets`` column;
    the settings' spread columns, where it has them, are not markers).
    """
    names = [c for c in ab.columns if c != "datasets" and not c.endswith(selection.SPREAD)]
    col = palette(names)
    conds = list(ab.index)
    fig = _figure(5.0, 0.32 * len(conds) + 1.3)
    ax = fig.add_subplot()
    y = np.arange(len(conds))[::-1]
    for n in names:
        ax.plot(ab[n].to_numpy(float) * scale, y, "o", ms=6, color=col[n], label=n)
    ax.set_yticks(y, conds, fontsize=8)
    ax.set_xlabel("mean test accuracy" + (" (%)" if scale == 100 else ""), fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False, loc="best")
    ax.set_title(title, fontsize=9)
    return save(fig, base)
