"""The report's opening section: how stable its answer is under reseeding (``analysis.stability``).

One paragraph answers "how stable is this answer": how often the top-1 holds in replicates that
re-choose every lr, which pairs with the top-1 the seeds do not resolve, how often the lrs are
chosen again, and how many seeds would make the top-1 hold, at what GPU-hour factor. Then the
tables (lr re-choice per cell, rank probabilities, selection-aware intervals, seed projection)
and the rank-probability figure. Where the runs cannot support it, one line says why.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from analysis import figures, stability, tables
from analysis.output import Figure, Section, Table, section
from analysis.study import Study

TITLE = "How stable is this answer"
RESOLVED = 0.95  # a pair counts as resolved when the top-1 is ahead in this share of replicates
TARGET = 0.9  # the projection names the fewest seeds that make the top-1 hold this often


def _skip(s: Study) -> str | None:
    """Why the runs cannot support the section, or None."""
    if s.runs is None:
        return "Skipped: a per-dataset summary has no seeds to resample and no lrs to choose again."
    if len(s.compared) < 2:
        return "Skipped: one condition compared, so there is no ranking whose stability to measure."
    n = int(s.runs.loc[s.runs["status"] == "finished"].groupby(["dataset", "condition"])["seed"].nunique().max())
    if n < 2:
        return "Skipped: one seed per cell; reseeding needs two or more seeds to resample."
    return None


def build(s: Study) -> Section:
    """The section: the paragraph, the four tables and the rank-probability figure, or one line
    saying why the runs cannot support it."""
    why = _skip(s)
    if why is not None:
        return section(TITLE, why)
    m = _measure(s)
    cells = _rechoice_table(s, m)
    ranks = _rank_table(s, m)
    bounds = _interval_table(s, m)
    seeds = _seeds_table(m)
    body = [_paragraph(s, m), _method(s, m)]
    for caption, t, index in (
        ("How often each cell's chosen lr is chosen again (the lr as chosen: share of replicates)", cells, True),
        ("Probability (%) of each rank by the mean over datasets, and of the top-1 being ahead", ranks, True),
        (
            "Each condition's mean with 95% intervals: lr fixed at its choice, and re-chosen in each replicate",
            bounds,
            True,
        ),
        ("Projected share of replicates where the top-1 holds with n' seeds per cell", seeds, False),
    ):
        body.append(f"{caption}:\n\n{tables.markdown(t, index=index).rstrip()}")
    return section(
        TITLE,
        "\n\n".join(body),
        (
            Table("stability_lr", cells, m["cells"]),
            Table("stability_ranks", ranks, m["rank_p"]),
            Table("stability_intervals", bounds, m["bounds"]),
            Table("stability_seeds", seeds, m["projection"], index=False),
        ),
        (Figure("stability_ranks", functools.partial(figures.rank_probabilities, m["rank_p"])),),
    )


def _measure(s: Study) -> dict:
    """The replicates' statistics: per-cell re-choice, rank probabilities, intervals, projection."""
    o = s.options
    g = stability.grid(s.runs, s.order, list(s.table.index), s.select_on)
    datasets = o.over != "seeds"
    boot = stability.replicates(g, o.reps, o.seed, datasets)
    idx = [s.order.index(c) for c in s.compared]
    means = stability.condition_means(boot.test)[:, idx]
    top = max(s.compared, key=lambda c: s.avg[c])  # the first of ties, as the table lists them
    n = int(stability.seed_counts(g).max())
    budgets = stability.seed_budgets(n)
    proj = stability.projection(g, s.order.index(top), idx, budgets, o.reps, o.seed, datasets)
    lo, hi = stability.percentile_interval(stability.condition_means(boot.test))
    flo, fhi = stability.percentile_interval(stability.condition_means(boot.fixed))
    rank_p = pd.DataFrame(
        stability.rank_probabilities(means),
        index=pd.Index(s.compared, name="condition"),
        columns=[f"P(rank {j + 1})" for j in range(len(idx))],
    )
    rank_p[f"P({top} ahead)"] = stability.beats(means, s.compared.index(top))
    rank_p.loc[top, f"P({top} ahead)"] = np.nan
    bounds = pd.DataFrame(
        {"mean": s.avg[s.order].to_numpy(float), "fixed_low": flo, "fixed_high": fhi, "low": lo, "high": hi},
        index=pd.Index(s.order, name="condition"),
    )
    return {
        "grid": g,
        "n": n,
        "top": top,
        "cells": _cells_frame(g, stability.rechoice(g, boot)),
        "rank_p": rank_p,
        "bounds": bounds,
        "projection": proj,
    }


def _cells_frame(g: stability.Grid, share: np.ndarray) -> pd.DataFrame:
    """One row per cell: its chosen lr, how many lrs it could choose among, its seeds, the re-choice share."""
    choosable = (~np.isnan(g.select)).any(axis=-1).sum(axis=-1)
    n = stability.seed_counts(g)
    rows = [
        {
            "dataset": d,
            "condition": c,
            "lr": g.lrs[g.chosen[k, j]],
            "lrs": int(choosable[k, j]),
            "seeds": int(n[k, j]),
            "rechosen": float(share[k, j]),
        }
        for j, d in enumerate(g.datasets)
        for k, c in enumerate(g.conditions)
    ]
    return pd.DataFrame(rows)


def _rechoice_table(s: Study, m: dict) -> pd.DataFrame:
    """Datasets × conditions: ``lr: share%`` of each cell, ``only lr`` where there was no choice."""
    cells = m["cells"].copy()
    share = [
        "only lr" if k == 1 else tables.DASH if pd.isna(r) else f"{100 * r:.0f}%"  # a dataset never drawn: no share
        for k, r in zip(cells["lrs"], cells["rechosen"])
    ]
    cells["shown"] = [f"{tables.fmt_lr(lr)}: {x}" for lr, x in zip(cells["lr"], share)]
    table = cells.pivot(index="dataset", columns="condition", values="shown")[s.order]
    table.columns.name = None
    return table


def _rank_table(s: Study, m: dict) -> pd.DataFrame:
    """The rank probabilities in percent, conditions by their reported rank (best first)."""
    order = sorted(s.compared, key=lambda c: -s.avg[c])
    return m["rank_p"].loc[order].map(lambda v: tables.fmt(100 * v, 0))


def _interval_table(s: Study, m: dict) -> pd.DataFrame:
    """Each condition's mean with its lr-fixed and its selection-aware interval."""
    b, unit = m["bounds"], s.unit
    return pd.DataFrame(
        {
            f"mean{unit} [95% CI, lr fixed]": [
                tables.interval(r["mean"], r["fixed_low"], r["fixed_high"], 2, s.scale) for _, r in b.iterrows()
            ],
            f"mean{unit} [95% CI, lr re-chosen]": [
                tables.interval(r["mean"], r["low"], r["high"], 2, s.scale) for _, r in b.iterrows()
            ],
        },
        index=b.index,
    )


def _seeds_table(m: dict) -> pd.DataFrame:
    """The projection as shown: seeds per cell, GPU-hours against the runs', P(top-1 holds)."""
    p = m["projection"]
    return pd.DataFrame(
        {
            "seeds per cell": p["seeds"].astype(str),
            "GPU-hours": [f"{g:.1f}x" for g in p["gpu_hours"]],
            f"P({m['top']} top-1)": [f"{100 * v:.0f}%" for v in p["p_top1"]],
        }
    )


def _paragraph(s: Study, m: dict) -> str:
    """The one-paragraph answer: the top-1's hold, unresolved pairs, lr re-choice, seeds to budget."""
    top, n, proj = m["top"], m["n"], m["projection"]
    held = float(proj["p_top1"].iloc[0])
    ahead = m["rank_p"][f"P({top} ahead)"].drop(top)
    open_ = [f"{top} vs {c} ({100 * p:.0f}% ahead)" for c, p in ahead.items() if p < RESOLVED]
    seeds = f"{n} seed{'s' * (n != 1)}"
    text = [f"The top-1 ({top}) holds in {100 * held:.0f}% of reseedings."]
    if open_:
        text.append(f"Not resolved by {seeds}: {', '.join(open_)}.")
    else:
        text.append(f"{top} is ahead of every other condition in at least {100 * RESOLVED:.0f}% of them.")
    text.append(_lr_sentence(m["cells"]))
    text.append(_budget_sentence(proj, n, held))
    return " ".join(text)


def _lr_sentence(cells: pd.DataFrame) -> str:
    """How often the chosen lrs are chosen again, and the least stable cell."""
    choice = cells[cells["lrs"] > 1]
    if choice.empty:
        return "No cell has more than one lr to choose among."
    worst = choice.loc[choice["rechosen"].idxmin()]
    return (
        f"Each cell's chosen lr is chosen again in {100 * choice['rechosen'].mean():.0f}% of them on average over "
        f"the {len(choice)} cells with a choice (least often: {worst['condition']} on {worst['dataset']}, "
        f"{100 * worst['rechosen']:.0f}%)."
    )


def _budget_sentence(proj: pd.DataFrame, n: int, held: float) -> str:
    """The fewest seeds projected to make the top-1 hold in ``TARGET`` of reseedings, at what cost."""
    if held >= TARGET:
        nxt = proj[proj["seeds"] > n].iloc[0]
        return (
            f"It holds in at least {100 * TARGET:.0f}% with the {n} seeds run; {int(nxt['seeds'])} seeds would make "
            f"it about {100 * nxt['p_top1']:.0f}%, at {nxt['gpu_hours']:.1f}x the GPU-hours."
        )
    more = proj[(proj["seeds"] > n) & (proj["p_top1"] >= TARGET)]
    row = more.iloc[0] if len(more) else proj.iloc[-1]
    text = (
        f"{int(row['seeds'])} seeds would make the top-1 hold in about {100 * row['p_top1']:.0f}%, at "
        f"{row['gpu_hours']:.1f}x the GPU-hours"
    )
    return text + ("." if len(more) else f"; no seed count up to {int(row['seeds'])} reaches {100 * TARGET:.0f}%.")


def _method(s: Study, m: dict) -> str:
    """What a replicate is, and how to read the projection."""
    o = s.options
    over = "seeds within each cell" + (" and datasets" if o.over != "seeds" and s.table.shape[0] > 1 else "")
    return (
        f"{o.reps} bootstrap replicates (seed {o.seed}) resampling {over}; a drawn seed brings its run at every "
        f"lr, and each cell's lr is chosen again in every replicate on {s.chosen} accuracy, as the report "
        "chooses it. Conditions rank by the mean over datasets of the test accuracy at the re-chosen lr; "
        "tied means share the better rank. The projection draws n' seeds per cell with replacement from "
        f"the {m['n']} recorded: it extrapolates the recorded seeds' spread and cannot remove the part that "
        "comes from which datasets were run."
    )
