"""The names of the MLflow record: tags, metric names, statuses, the UI's view of the runs table."""

from __future__ import annotations

import math
from typing import Any

# Tag names of the run record.
ROLE, KEY, STATUS, ERROR, ATTEMPTS = (
    "raystudy.role",
    "raystudy.key",
    "raystudy.status",
    "raystudy.error",
    "raystudy.attempts",
)
STOPPED_AT = "raystudy.stopped_at"  # the step an adaptive policy stopped the trial at
WORKER, RESUMED_FROM, LAST_ERROR = "raystudy.worker", "raystudy.resumed_from", "raystudy.last_error"
REHEARSAL = "raystudy.rehearsal"  # "1" on a dress rehearsal's runs (``raystudy grid --rehearse``): synthetic numbers


def of_rehearsal(rehearse: float | None) -> dict[str, str]:
    """Tags on every trial run a driver makes: a dress rehearsal's say so (its numbers are synthetic)."""
    return {REHEARSAL: "1"} if rehearse else {}


# Final results logged as metrics; class0_*: a run that diverged before its first evaluation,
# the accuracies of predicting class 0 everywhere (what the paper's code tests for it).
FINAL_METRICS = (
    "best_val_acc",
    "test_acc",
    "test_loss",
    "best_step",
    "steps_done",
    "wall_s",
    "trainable_params",
    "class0_val_acc",
    "class0_test_acc",
)
# Step metrics reported by the loop.
STEP_METRICS = ("loss", "scheduled_lr", "val_acc", "val_loss", "best_val_acc")

# The experiment tag MLflow's UI reads to open an experiment as classic ML runs, not GenAI traces.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The run description the UI shows (Markdown) on a run's page and in the runs table.
NOTE = "mlflow.note.content"
MAX_NOTE = 8000  # MLflow's limit on a tag's value, the description's too
REPORT_HEAD = "\n## Analysis report"  # where the report starts in the parent run's description

# Statuses of a trial that is done: never run again. "stopped": ended early by a scheduler.
TERMINAL = ("finished", "diverged", "stopped")


# The runs table as raystudy wants it seen: the key metrics and the status as columns (MLflow's
# defaults, Source, Models and Dataset, are empty here), best test accuracy first. Stored as a
# view the UI shares by URL (an experiment tag ``mlflow.sharedViewState.<key>``, JSON).
VIEW_KEY = "raystudy"
RUNS_VIEW = {
    "orderByKey": "metrics.`test_acc`",
    "orderByAsc": False,
    "selectedColumns": ["metrics.`test_acc`", "metrics.`best_val_acc`", "tags.`raystudy.status`"],
}


def experiment_tags() -> dict[str, str]:
    """Every raystudy experiment's tags: classic ML runs, and ``RUNS_VIEW`` where ``runs_url``
    points the UI."""
    import json

    return {EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1], f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(RUNS_VIEW)}


DATA_TAG = "raystudy.data."  # a run on your own data: raystudy.data.location, .test_size, .test_hash, ...


def as_number(value: Any) -> float:
    """A tag, param or metric value as a float; NaN where it is none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
