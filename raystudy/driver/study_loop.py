"""A study's trials run on Ray the same way whatever their source: what a killed driver left put
right, the source's Tune runs fitted one after another (each closed however it ended), then the
trials left without an end counted, so that a grid and a search stop, and resume, alike.

The sources: a grid's expansion (``grid_run.GridTrials``; a search's test re-evaluation is a
small grid) and an Optuna study sampled through Ray's ``OptunaSearch`` (``optuna_search.OptunaTrials``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from raystudy.driver import interrupt, tuner


class Source(Protocol):
    """Where a study's trials come from, and what it records of them."""

    name: str  # how the study is said when it stops (a grid's label, an Optuna study's name)

    def after_a_kill(self) -> None:
        """What a killed driver left of the study put right (``reconcile``), before anything runs."""

    def tune_runs(self) -> Iterable[Any]:
        """The study's Tuners (``tuner.new``, ``tuner.restored_or_new``), each made once the run before has ended."""

    def close(self) -> None:
        """After each Tune run, however it ended: no run left RUNNING (``reconcile.close_run``)."""

    def after_run(self) -> None:
        """After each Tune run that was not stopped."""

    def unfinished(self) -> int:
        """The trials the study was to end this session that have no end: the same command goes on with them."""


def run(source: Source, verbose: int) -> int:
    """Run the study of ``source`` (``verbose`` > 0: Tune's own tables); returns the trials left
    without an end. Raises ``interrupt.Stopped`` where a Tune run was stopped (one Ctrl-C, a full
    disk, the driver's Ray node lost) with trials left: the runs after it wait for the same command."""
    source.after_a_kill()
    stopped = tuner.fit_each(source.tune_runs(), verbose, source.close, source.after_run)
    left = source.unfinished()
    if stopped and left:
        raise interrupt.Stopped(f"{source.name}: {left} trials unfinished")
    return left
