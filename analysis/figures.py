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


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(fig, base: str | os.PathLike) -> list[Path]:
    """Write ``base.png`` (150 dpi) and ``base.pdf``."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    # Appended, not with_suffix: model names carry dots (vit_base_patch16_224.orig_in21k).
    paths = [base.with_name(base.name + ".png"), base.with_name(base.name + ".pdf")]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


def colors(names: list[str]) -> dict[str, tuple]:
    """One stable colour per name, in the given order (tab10, then tab20)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def _grid(n: int, width: float = 3.4, height: float = 2.6):
    ncols = min(4, max(1, n))
    nrows = math.ceil(n / ncols)
    fig = _figure(width * ncols, height * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _log_y(ax) -> None:
    """Log y axis labelled with plain numbers (0.5, 2, 10) rather than 5×10⁻¹."""
    from matplotlib.ticker import LogFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))


def accuracy(best: pd.DataFrame, conditions: list[str], base: str | os.PathLike,
             scale: float = 1.0, title: str = "") -> list[Path]:
    """Test accuracy at the best lr, mean ± std over seeds, per condition for each dataset.

    One group of markers per dataset and one for the average over datasets.
    """
    datasets = sorted(best["dataset"].unique())
    groups = datasets + ["average"]
    avg = best.groupby("condition")["test_mean"].mean()
    col = colors(conditions)
    fig = _figure(max(6.0, 0.75 * len(groups) + 2.5), 3.8)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(conditions))
    for j, c in enumerate(conditions):
        sub = best[best["condition"] == c].set_index("dataset")
        y = [sub["test_mean"].get(d, np.nan) * scale for d in datasets] + [avg.get(c, np.nan) * scale]
        e = [sub["test_std"].get(d, np.nan) * scale for d in datasets] + [np.nan]
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        ax.errorbar(x, y, yerr=np.nan_to_num(e), fmt="o", ms=4, capsize=2, color=col[c], label=c)
    for g in range(1, len(groups)):
        ax.axvline(g - 0.5, color="0.85", lw=0.6, zorder=0)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel("test accuracy" + (" (%)" if scale == 100 else ""))
    ax.set_title(title or "Test accuracy at the best lr (mean ± std over seeds)", fontsize=10)
    ax.legend(fontsize=8, ncols=min(len(conditions), 7), loc="lower center",
              bbox_to_anchor=(0.5, 1.08), frameon=False)
    return save(fig, base)


def curves(bands: pd.DataFrame, key: str, conditions: list[str], base: str | os.PathLike,
           ylabel: str = "", log: bool = False) -> list[Path]:
    """One panel per dataset: ``key`` against step, one line per condition, ±std over seeds."""
    sub = bands[bands["key"] == key]
    datasets = sorted(sub["dataset"].unique())
    if not datasets:
        return []
    col = colors(conditions)
    fig, axes = _grid(len(datasets))
    for ax, d in zip(axes, datasets):
        for c in conditions:
            s = sub[(sub["dataset"] == d) & (sub["condition"] == c)].sort_values("step")
            if s.empty:
                continue
            ax.plot(s["step"], s["mean"], color=col[c], lw=1.2, label=c)
            ax.fill_between(s["step"], s["mean"] - s["std"], s["mean"] + s["std"],
                            color=col[c], alpha=0.2, lw=0)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(ylabel or key, fontsize=8)
        if log:
            _log_y(ax)
        ax.tick_params(which="both", labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4), fontsize=8,
               frameon=False)
    return save(fig, base)


def plasticity_layers(pooled: pd.DataFrame, components: list[str], base: str | os.PathLike,
                      modes: list[str] | None = None, title: str = "") -> list[Path]:
    """Plasticity per layer, one line per component with its 95% band: a row of panels per probe
    mode (shared, in situ), a column per dataset. The one plasticity figure of raystudy: the
    report and the probe CLI both draw it.

    The dotted line is P = 1, where a component neither amplifies nor contracts differences.
    """
    modes = [m for m in (modes or ("shared", "in_situ")) if m in set(pooled["mode"])]
    datasets = sorted(pooled["dataset"].unique())
    if not datasets or not modes:
        return []
    col = colors(components)
    ncols = len(datasets)
    fig = _figure(3.4 * ncols, 2.6 * len(modes) + 0.5)
    axes = fig.subplots(len(modes), ncols, squeeze=False)
    for row, mode in zip(axes, modes):
        sub = pooled[pooled["mode"] == mode]
        for ax, d in zip(row, datasets):
            for c in components:
                s = sub[(sub["dataset"] == d) & (sub["component"] == c)].sort_values("layer")
                if s.empty:
                    continue
                ax.plot(s["layer"], s["mean"], "o-", ms=3, color=col[c], lw=1.2, label=c)
                ax.fill_between(s["layer"], s["ci_low"], s["ci_high"], color=col[c], alpha=0.25, lw=0)
            ax.axhline(1.0, color="0.5", ls=":", lw=0.8)
            _log_y(ax)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_title(f"{d} ({mode.replace('_', ' ')} input)", fontsize=9)
            ax.set_xlabel("layer", fontsize=8)
            ax.set_ylabel("plasticity P(f)", fontsize=8)
            ax.tick_params(which="both", labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 5), fontsize=8,
               frameon=False, title=title or "plasticity per layer (95% interval)", title_fontsize=9)
    return save(fig, base)


def cd_diagram(avg_ranks: pd.Series, cd: float, cliques: list[list[str]],
               base: str | os.PathLike, title: str = "") -> list[Path]:
    """Critical-difference diagram (Demšar 2006): average ranks on an axis, rank 1 on the left.

    Conditions joined by a thick bar are not significantly different (Nemenyi, their average
    ranks differ by less than CD).
    """
    r = avg_ranks.sort_values()
    k = len(r)
    lo, hi = 1, max(k, math.ceil(r.max()))
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
    ax.plot([lo, hi], [0, 0], color="k", lw=1)
    for t in range(lo, hi + 1):
        ax.plot([t, t], [0, 0.07], color="k", lw=1)
        ax.text(t, 0.12, str(t), ha="center", va="bottom", fontsize=8)
    ax.plot([lo, lo + cd], [0.55, 0.55], color="k", lw=1.5)
    for x in (lo, lo + cd):
        ax.plot([x, x], [0.5, 0.6], color="k", lw=1)
    ax.text(lo + cd / 2, 0.63, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8)
    for i, (name, rank) in enumerate(r.items()):
        left = i < half
        row = i if left else k - 1 - i
        y = first - step * (row + 0.5)
        x_end = lo - 0.1 * span if left else hi + 0.1 * span
        ax.plot([rank, rank, x_end], [0, y, y], color="k", lw=0.8)
        ax.text(x_end + (-0.02 if left else 0.02) * span, y, f"{name} ({rank:.2f})",
                ha="right" if left else "left", va="center", fontsize=8)
    for j, group in enumerate(cliques):
        y = -0.15 - bar * j
        ax.plot([r[group[0]] - 0.03 * span, r[group[-1]] + 0.03 * span], [y, y], color="k", lw=3,
                solid_capstyle="butt")
    if title:
        ax.set_title(title, fontsize=9)
    return save(fig, base)


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


def intervals(agg: pd.DataFrame, conditions: list[str], base: str | os.PathLike,
              scale: float = 1.0, title: str = "") -> list[Path]:
    """Interval plot (rliable style): per condition the mean and the IQM with 95% intervals.

    ``agg`` is ``analysis.intervals.aggregate_intervals``: condition, statistic, estimate, low,
    high.
    """
    col = colors(conditions)
    stats_ = [s for s in ("mean", "iqm") if s in set(agg["statistic"])]
    fig = _figure(3.2 * len(stats_) + 0.8, 0.32 * len(conditions) + 1.2)
    axes = fig.subplots(1, len(stats_), squeeze=False)[0]
    names = {"mean": "mean over datasets", "iqm": "interquartile mean of runs"}
    for ax, s in zip(axes, stats_):
        sub = agg[agg["statistic"] == s].set_index("condition").reindex(conditions)
        y = np.arange(len(conditions))[::-1]
        for yi, c in zip(y, conditions):
            ax.hlines(yi, sub.loc[c, "low"] * scale, sub.loc[c, "high"] * scale, color=col[c],
                      lw=6, alpha=0.6)
            ax.plot(sub.loc[c, "estimate"] * scale, yi, "|", color="k", ms=12, mew=1.5)
        ax.set_yticks(y, conditions if ax is axes[0] else [""] * len(conditions), fontsize=8)
        ax.set_ylim(-0.7, len(conditions) - 0.3)
        ax.set_xlabel(names[s] + (" (%)" if scale == 100 else ""), fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(title or "Test accuracy, 95% stratified-bootstrap intervals", fontsize=9)
    return save(fig, base)


def improvement(pairs: pd.DataFrame, base: str | os.PathLike, title: str = "") -> list[Path]:
    """Probability of improvement P(a > b) with 95% intervals, one row per pair (rliable style).

    ``pairs`` is ``analysis.intervals.pairwise_intervals``; 0.5 (dotted) is no preference.
    """
    labels = [f"P({a} > {b})" for a, b in zip(pairs["a"], pairs["b"])]
    fig = _figure(5.0, 0.26 * len(labels) + 1.0)
    ax = fig.add_subplot()
    _ci_rows(ax, labels, pairs["p_improve"], pairs["p_improve_low"], pairs["p_improve_high"],
             "tab:blue", 0.5, "probability of improvement (a run of a beats a run of b)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(title or "Probability of improvement, 95% stratified-bootstrap intervals", fontsize=9)
    return save(fig, base)


def rope_bars(rope: pd.DataFrame, base: str | os.PathLike, width: float,
              title: str = "") -> list[Path]:
    """Stacked bars of P(a better), P(practically equivalent), P(b better) per pair.

    ``rope`` has a, b and, per test, ``{test}_p_a``, ``{test}_p_rope``, ``{test}_p_b`` for the
    tests ``signed_rank`` and ``hierarchical`` (whichever are present and not all NaN).
    """
    tests = [t for t in ("signed_rank", "hierarchical")
             if f"{t}_p_rope" in rope and rope[f"{t}_p_rope"].notna().any()]
    if not tests:
        return []
    names = {"signed_rank": "Bayesian signed-rank (dataset means)",
             "hierarchical": "hierarchical (datasets × seeds)"}
    labels = [f"{a} vs {b}" for a, b in zip(rope["a"], rope["b"])]
    y = np.arange(len(labels))[::-1]
    fig = _figure(3.6 * len(tests) + 1.4, 0.26 * len(labels) + 1.3)
    axes = fig.subplots(1, len(tests), squeeze=False)[0]
    parts = (("p_a", "a better", "tab:blue"), ("p_rope", "equivalent", "0.75"),
             ("p_b", "b better", "tab:orange"))
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
    fig.legend(handles, lab, loc="outside upper center", ncols=3, fontsize=8, frameon=False,
               title=title or f"Practical equivalence, ROPE ±{width:g} accuracy points",
               title_fontsize=9)
    return save(fig, base)


def tuning_budget(budget: pd.DataFrame, conditions: list[str], base: str | os.PathLike,
                  scale: float = 1.0) -> list[Path]:
    """Expected best validation accuracy and the test accuracy there against lrs tried
    (Dodge et al., 2019), one line per condition, averaged over datasets."""
    col = colors(conditions)
    fig = _figure(7.5, 3.0)
    axes = fig.subplots(1, 2)
    for ax, key, lab in ((axes[0], "expected_val", "expected best validation accuracy"),
                         (axes[1], "expected_test", "expected test accuracy at that lr")):
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
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 7), fontsize=8,
               frameon=False, title="Expected accuracy against tuning budget (Dodge et al., 2019)",
               title_fontsize=9)
    return save(fig, base)


__all__ = ["accuracy", "curves", "plasticity_layers", "cd_diagram", "intervals", "improvement",
           "rope_bars", "tuning_budget", "save", "colors"]


def parameter_efficiency(eff: pd.DataFrame, base: str | os.PathLike, scale: float = 1.0,
                         title: str = "") -> list[Path]:
    """Accuracy against trainable parameter count (log x), one labelled point per condition.

    ``eff`` is ``analysis.stats.parameter_efficiency`` (index: condition; params, accuracy).
    """
    names = list(eff.index)
    col = colors(names)
    fig = _figure(5.5, 3.6)
    ax = fig.add_subplot()
    for c in names:
        x, y = eff.loc[c, "params"], eff.loc[c, "accuracy"] * scale
        ax.plot(x, y, "o", ms=6, color=col[c])
        ax.annotate(c, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters (log scale)", fontsize=8)
    ax.set_ylabel("mean test accuracy" + (" (%)" if scale == 100 else ""), fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    ax.set_title(title or "Accuracy against trainable parameters", fontsize=9)
    return save(fig, base)


def gains(avg_gain: pd.Series, base: str | os.PathLike, reference: str, title: str = "") -> list[Path]:
    """Horizontal bars of each condition's mean relative gain (%) over ``reference``."""
    names = [c for c in avg_gain.index if c != reference]
    col = colors(list(avg_gain.index))
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


def setting_means(ab: pd.DataFrame, base: str | os.PathLike, scale: float = 1.0,
                  title: str = "") -> list[Path]:
    """One row per condition, one marker per setting (e.g. SGD and AdamW): mean test accuracy.

    ``ab`` is ``analysis.stats.setting_means`` (index: condition; a ``datasets`` column).
    """
    names = [c for c in ab.columns if c != "datasets"]
    col = colors(names)
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
