"""The floor: how far reseeding alone moves the study's conclusions, and whether a policy stays within it.

A policy's replay is judged against the full grid (``analysis.agreement.compare``: the lr chosen
per cell, Kendall τ of the ranking and the same top-1, significance calls flipped). The full grid
does not agree perfectly with itself either: rerun with other seeds, its lrs, ranking and calls
move. ``floor`` measures that spread with ``analysis.stability``'s replicates (each cell's seeds
drawn again with replacement, the datasets kept, every lr chosen again inside the replicate): the
same statistics between the full grid and each replicate. ``across`` is the second, independent
measure: two recordings of the same grid with different seed sets, compared directly.

The rule (``verdict``): a policy is *conclusion-preserving* when its same-lr count and its τ reach
what 95% of the reseedings reach (the floor's 5% quantile, ``QUANTILE``): its disagreement with the
full grid is within what reseeding alone produces; and when it flips no confident call: a
significance call, or the top-1, that holds in at least ``CONFIDENT`` of the replicates. Both are
one-sided 5% tests of "the policy moved the answer more than reseeding does". The replicates share
about two of three seeds with the full grid, so they agree with it more than an independent seed
set does (``across``): the bar is stricter than a second recording.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis import agreement, stability
from analysis.stats import selection

QUANTILE = 0.05  # a policy agrees with the full grid at least as well as 95% of reseedings do
CONFIDENT = 0.95  # a call the full grid makes in this share of reseedings is not to be flipped
TOP1 = "top-1"  # the name the top-1 goes by among the confident calls


@dataclass(frozen=True)
class Floor:
    """The full grid against its reseedings, one entry per replicate: ``same_lr`` (of ``cells``),
    Kendall ``tau``, ``same_top1``, ``flips`` (of ``calls``); ``held``: each of the full grid's
    calls, and the top-1 (``TOP1``), with the share of replicates that make it too."""

    reps: int
    cells: int
    calls: int
    same_lr: np.ndarray
    tau: np.ndarray
    same_top1: np.ndarray
    flips: np.ndarray
    held: dict[str, float]

    def quantile(self, stat: str, q: float) -> float:
        """The ``q`` quantile of ``stat`` (``same_lr``, ``tau``, ``flips``) over the replicates: the
        smallest value that share of them reach or fall below."""
        return float(np.quantile(getattr(self, stat), q, method="inverted_cdf"))

    def bar(self, stat: str) -> float:
        """The value of ``stat`` (``same_lr`` or ``tau``) a policy must reach: its ``QUANTILE`` quantile."""
        return self.quantile(stat, QUANTILE)

    def confident(self) -> list[str]:
        """The calls (and the top-1) that hold in at least ``CONFIDENT`` of the replicates."""
        return [name for name, share in self.held.items() if share >= CONFIDENT]


def replicate_conclusions(g: stability.Grid, chosen: np.ndarray, test: np.ndarray, reference: str) -> dict[str, Any]:
    """``agreement.conclusions`` of one replicate: ``chosen`` (K, D) lr indices, ``test`` (K, D)
    the test accuracy there, over ``g``'s conditions and datasets."""
    lr = [math.nan if i < 0 else g.lrs[i] for i in chosen.ravel()]
    cells = [(d, c) for c in g.conditions for d in g.datasets]
    table = pd.DataFrame(test.T, index=g.datasets, columns=g.conditions)
    return {
        "chosen_lr": dict(zip(cells, lr)),
        "mean": table.mean(axis=0).sort_values(ascending=False),
        "calls": agreement.calls_of(table, reference),
    }


def floor(runs: pd.DataFrame, reference: str = "MHA", reps: int = 200, seed: int = 0) -> Floor:
    """The floor of the full grid's ``runs``: ``reps`` reseedings (seeds drawn again in every cell,
    datasets kept, lrs chosen again), each compared with the full grid as a policy's replay is."""
    full = agreement.conclusions(runs, reference)
    conditions = list(selection.wide(selection.choose_lrs(runs, "val")).columns)
    datasets = sorted({d for d, _ in full["chosen_lr"]})
    g = stability.grid(runs, conditions, datasets, "val")
    boot = stability.replicates(g, reps, seed, datasets=False)
    rows, held = [], {name: 0 for name in [*full["calls"], TOP1]}
    for r in range(reps):
        c = agreement.compare(full, replicate_conclusions(g, boot.chosen[r], boot.test[r], reference))
        rows.append((c["same_lr"], c["kendall_tau"], c["same_top1"], len(c["flips"])))
        for name in full["calls"]:
            held[name] += name not in c["flips"]
        held[TOP1] += c["same_top1"]
    same, tau, top, flips = (np.array(v) for v in zip(*rows))
    return Floor(
        reps, len(full["chosen_lr"]), len(full["calls"]), same, tau, top, flips, {k: v / reps for k, v in held.items()}
    )


def across(runs_a: pd.DataFrame, runs_b: pd.DataFrame, reference: str = "MHA") -> dict[str, Any]:
    """Two recordings of the same grid (different seed sets) compared directly: ``agreement.compare``
    of their conclusions, ``runs_a`` as the full grid."""
    return agreement.compare(agreement.conclusions(runs_a, reference), agreement.conclusions(runs_b, reference))


def verdict(a: dict[str, Any], f: Floor) -> dict[str, Any]:
    """The rule on one comparison ``a`` (``agreement.compare``) against the floor ``f``:
    ``preserving``, ``checks`` (each criterion against its bar, in words) and ``why`` (those failed)."""
    lr_bar, tau_bar = f.bar("same_lr"), f.bar("tau")
    flipped = [n for n in f.confident() if (not a["same_top1"] if n == TOP1 else n in a["flips"])]
    checks = [
        (a["same_lr"] >= lr_bar, f"same lr {a['same_lr']} {'>=' if a['same_lr'] >= lr_bar else '<'} {lr_bar:g}"),
        (
            a["kendall_tau"] >= tau_bar,
            f"tau {a['kendall_tau']:.3f} {'>=' if a['kendall_tau'] >= tau_bar else '<'} {tau_bar:.3f}",
        ),
        (not flipped, f"flips confident {', '.join(flipped)}" if flipped else "no confident call flipped"),
    ]
    return {
        "preserving": all(ok for ok, _ in checks),
        "checks": [text for _, text in checks],
        "why": [text for ok, text in checks if not ok],
    }


def floor_line(f: Floor) -> str:
    """One line: the floor's medians and 5-95% ranges, and the confident calls."""

    def spread(stat: str, fmt: str) -> str:
        lo, mid, hi = (f.quantile(stat, q) for q in (0.05, 0.5, 0.95))
        return f"median {mid:{fmt}} (5-95%: {lo:{fmt}}-{hi:{fmt}})"

    conf = f.confident()
    return (
        f"floor (the full grid against {f.reps} reseedings of itself): same lr in {spread('same_lr', 'g')} of "
        f"{f.cells} cells; Kendall tau {spread('tau', '.3f')}; same top-1 in {100 * f.same_top1.mean():.0f}%; "
        f"calls flipped {spread('flips', 'g')} of {f.calls}; {len(conf)} confident "
        f"(held in >= {100 * CONFIDENT:.0f}%): {', '.join(conf) or 'none'}"
    )


def verdict_text(v: dict[str, Any]) -> str:
    """The verdict in words: conclusion-preserving, or not and why."""
    head = "conclusion-preserving" if v["preserving"] else "NOT conclusion-preserving"
    return f"{head} (against the floor's {100 * QUANTILE:g}%: {', '.join(v['checks'])})"


__all__ = ["Floor", "QUANTILE", "CONFIDENT", "TOP1", "floor", "across", "verdict", "floor_line", "verdict_text"]
