"""Fault points: moments at which a test makes the driver fail, named in one place.

Each point is an environment variable that only tests and benchmarks set; unset (always, for a
user), a point does nothing. Production code marks a point with one call and holds no other test
logic.

``KILL_AT_TRIAL_END=N``: the driver kills itself (SIGKILL) as Tune ends its Nth trial, after the
searcher (Optuna) has heard of the end and before MLflow has: the one moment a kill leaves a trial
done for the searcher and running for MLflow, which a resumed driver must record.

``LOSE_TRIAL_END=N``: MLflow never hears that Tune ended the Nth trial (as if the write were
lost): its run stays RUNNING until the Tune run is closed (``interrupted``), a trial Tune left
without an end, on which a grid and a search alike stop so that the same command records it.
"""

from __future__ import annotations

import os
import signal

KILL_AT_TRIAL_END = "RAYSTUDY_KILL_AT_TRIAL_END"
LOSE_TRIAL_END = "RAYSTUDY_LOSE_TRIAL_END"
POINTS = (KILL_AT_TRIAL_END, LOSE_TRIAL_END)


def at(point: str, count: int) -> bool:
    """Whether the fault point ``point`` is set to ``count``."""
    return os.environ.get(point) == str(count)


def kill_at(point: str, count: int) -> None:
    """SIGKILL this process if the fault point ``point`` is set to ``count``."""
    if at(point, count):
        os.kill(os.getpid(), signal.SIGKILL)
