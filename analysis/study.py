"""The study a report describes, built once and checked before anything is written.

``build`` takes per-run results (or a per-dataset summary) and the report's options, checks each
option against the data -- the conditions and datasets named, every cell filled, the reference
conditions present -- and returns a frozen ``Study``: the runs, the seed means, the chosen lrs,
the conditions' order and the rest of what the report's sections (``analysis.sections``) read.
Every refusal is an AnalysisError raised here, before the report's folder exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import AnalysisError, load
from analysis.scores import Options, scores_of
from analysis.stats import selection


def paper_order() -> tuple[str, ...]:
    """The order tables list conditions in: the paper's, then the other components, then LoRA."""
    from raystudy.models.components import PAPER_CONDITIONS, STUDY_COMPONENTS

    return tuple(dict.fromkeys(PAPER_CONDITIONS + STUDY_COMPONENTS + ("lora",)))


def restrict(df: pd.DataFrame, conditions: list[str] | None, datasets: list[str] | None, source: str) -> pd.DataFrame:
    """The rows of ``df`` on ``conditions`` and ``datasets`` (all where None); a name that is
    not in ``df`` is an AnalysisError listing the names there are."""
    for col, wanted in (("condition", conditions), ("dataset", datasets)):
        if wanted:
            unknown = [w for w in wanted if w not in set(df[col])]
            if unknown:
                raise AnalysisError(
                    f"{source}: no {col} {', '.join(map(repr, unknown))}; there are: {', '.join(sorted(set(df[col])))}"
                )
            df = df[df[col].isin(wanted)]
    return df


def compared_conditions(order: list[str], compare: list[str] | None, source: str) -> list[str]:
    """The conditions the tests and ranks are over: ``compare`` in table order, all if None."""
    if not compare:
        return list(order)
    missing = [c for c in compare if c not in order]
    if missing:
        raise AnalysisError(
            f"{source}: the compared condition(s) {', '.join(missing)} are not "
            f"among the conditions analysed: {', '.join(order)}"
        )
    return [c for c in order if c in compare]


@dataclass(frozen=True)
class Study:
    """One study (one model, optimizer, low-data flag) as the report's sections read it.

    ``runs`` (None for a per-dataset summary) and ``summary`` as restricted to the conditions and
    datasets analysed; ``means``: seed means per (dataset, condition, lr), None for a summary;
    ``best``: the cells at the lr chosen on ``select_on`` (the summary itself for a summary);
    ``best_other``: at the lr chosen the other way, where the runs allow; ``order``: the
    conditions analysed in table order; ``compared``: those ranks and tests are over; ``table``:
    datasets × conditions of ``best``'s test accuracy; ``scores``: (K, D, S) test accuracies at
    the chosen lr (``analysis.scores.scores_of``); ``gain_reference``: resolved, None when there is none;
    ``as_paper``: the paper's computations where raystudy's differ (``raystudy report --as-paper``).
    """

    source: str
    runs: pd.DataFrame | None
    summary: pd.DataFrame | None
    means: pd.DataFrame | None
    best: pd.DataFrame
    best_other: pd.DataFrame | None
    select_on: str
    scale: float
    order: list[str]
    compared: list[str]
    table: pd.DataFrame
    ranks: pd.DataFrame
    scores: np.ndarray
    reference: str
    gain_reference: str | None
    t_alternative: str
    options: Options
    bands: pd.DataFrame | None
    plasticity: pd.DataFrame | None
    title: str
    as_paper: bool = False

    @property
    def avg(self) -> pd.Series:
        """Each condition's mean test accuracy over datasets."""
        return self.table.mean(axis=0)

    @property
    def avg_rank(self) -> pd.Series:
        """Each compared condition's average rank over datasets."""
        return self.ranks.mean(axis=0)

    @property
    def unit(self) -> str:
        """`` (%)`` where accuracies are shown in percent, else empty."""
        return " (%)" if self.scale == 100 else ""

    @property
    def chosen(self) -> str | None:
        """The accuracy the lr was chosen on, in words; None for a per-dataset summary."""
        return {"val": "validation", "test": "test"}[self.select_on] if self.runs is not None else None


def _choose_lrs(runs: pd.DataFrame, select_on: str, ddof: int, source: str):
    """(means, best, best_other, scale) of per-run results; refuses runs without the accuracy
    the lr is chosen on."""
    load.check_runs(runs, source)
    finished = runs["status"] == "finished"
    if select_on == "val" and runs.loc[finished, "val_acc"].isna().all():
        raise AnalysisError(
            f"{source}: no validation accuracies (val_acc) to choose the lr "
            "on; choose it on test accuracy with --select-on test"
        )
    means = selection.seed_means(runs, ddof=ddof)
    best = selection.choose_lrs(runs, select_on, ddof)
    other = "test" if select_on == "val" else "val"
    best_other = selection.choose_lrs(runs, other, ddof) if runs.loc[finished, f"{other}_acc"].notna().any() else None
    return means, best, best_other, selection.display_scale(runs["test_acc"])


def _gain_reference(order: list[str], gain_reference: str | None, reference: str) -> str | None:
    """The condition relative gains are over: as given, else linear_probe if analysed, else
    ``reference`` if analysed, else None."""
    ref = gain_reference or next((c for c in ("linear_probe", reference) if c in order), None)
    if ref is not None and ref not in order:
        raise AnalysisError(f"gain reference {ref!r} is not among the conditions: {', '.join(order)}")
    return ref


def _checked_conditions(
    best: pd.DataFrame, best_other: pd.DataFrame | None, compare: list[str] | None, reference: str, source: str
) -> tuple[list[str], list[str]]:
    """The conditions analysed, in the paper's order, and those compared, once the chosen results
    (and the other selection's, if any) are complete and ``reference`` is among those compared;
    raises AnalysisError otherwise."""
    selection.check_complete(best)
    order = selection.order_conditions(best["condition"], paper_order())
    compared = compared_conditions(order, compare, source)
    if best_other is not None:  # its table and ranks are shown beside the chosen one's
        selection.check_complete(best_other)
    if len(compared) >= 2 and reference not in compared:
        raise AnalysisError(
            f"reference condition {reference!r} is not among the conditions: {', '.join(map(str, compared))}"
        )
    return order, compared


def build(
    *,
    runs: pd.DataFrame | None = None,
    summary: pd.DataFrame | None = None,
    select_on: str = "val",
    reference: str = "MHA",
    conditions: list[str] | None = None,
    datasets: list[str] | None = None,
    bands: pd.DataFrame | None = None,
    plasticity: pd.DataFrame | None = None,
    ddof: int = 0,
    title: str = "",
    options: Options | None = None,
    t_alternative: str = "two-sided",
    compare: list[str] | None = None,
    gain_reference: str | None = None,
    as_paper: bool = False,
) -> Study:
    """The checked ``Study`` of ``runs`` or ``summary`` (the arguments of
    ``analysis.reporting.analyse``); raises AnalysisError on any bad input."""
    if (runs is None) == (summary is None):
        raise AnalysisError("give either per-run results or a per-dataset summary")
    source = (runs if runs is not None else summary).attrs.get("source", "input")
    if runs is not None:
        runs = restrict(runs, conditions, datasets, source)
        means, best, best_other, scale = _choose_lrs(runs, select_on, ddof, source)
    else:
        summary = restrict(summary, conditions, datasets, source)
        means, best, best_other = None, summary, None
        scale = selection.display_scale(summary["test_mean"])
    order, compared = _checked_conditions(best, best_other, compare, reference, source)
    table = selection.wide(best, conditions=order)
    return Study(
        source=source,
        runs=runs,
        summary=summary,
        means=means,
        best=best,
        best_other=best_other,
        select_on=select_on,
        scale=scale,
        order=order,
        compared=compared,
        table=table,
        ranks=selection.ranks(table[compared]),
        scores=scores_of(runs, best, table, order),
        reference=reference,
        gain_reference=_gain_reference(order, gain_reference, reference),
        t_alternative=t_alternative,
        options=options or Options(),
        bands=bands,
        plasticity=plasticity,
        title=title,
        as_paper=as_paper,
    )


__all__ = ["Study", "build", "paper_order", "restrict", "compared_conditions"]
