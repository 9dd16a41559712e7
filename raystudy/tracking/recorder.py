"""One finetuning run (``raystudy finetune``) in MLflow, recorded as the grid records a trial.

The grid's trials are recorded from the driver (``raystudy.driver.records``); a single run has
no driver, so its command records it as it goes, through the same ``record.TrialRecord``.
"""

from __future__ import annotations

from typing import Any

from raystudy.tracking import connect, record
from raystudy.train.config import FinetuneConfig


class Recorder:
    """The run in MLflow, recorded as the grid records a trial (``tracking``'s ``TrialRecord``):
    config as params and ``config.yaml``, step metrics, final results, status tags.

    The run opens at the first measurement: a run whose data or weights are missing leaves no
    run (and no store) behind, as bad input writes nothing.
    """

    def __init__(self, uri: str, experiment: str, cfg: FinetuneConfig):
        self.uri, self.experiment, self.config = uri, experiment, cfg.to_dict()
        self.run_id: str | None = None
        self.pending: list[dict[str, Any]] = []

    def open(self) -> None:
        """Find or create the run (once); its step metrics logged so far are not logged again."""
        from raystudy.train.config import trial_key

        if self.run_id is not None:
            return
        self.cl = connect.client(self.uri)
        exp_id = connect.experiment_id(self.cl, self.experiment, connect.default_artifact_location(self.uri))
        self.run_id = record.open_trial(
            self.cl, exp_id, None, trial_key(self.config), self.config, extra_tags={"raystudy.source": "finetune"}
        )
        self.run = record.TrialRecord(self.cl, self.run_id)

    def report(self, m: dict[str, Any]) -> None:
        """Keep one report of the loop; written to MLflow at each evaluation."""
        self.open()
        self.pending.append(dict(m))
        if "val_acc" in m:  # flush at evaluations: few writes, curves visible while it runs
            self.flush()

    def flush(self) -> None:
        """Log the reports kept since the last write."""
        self.run.log(self.pending)
        self.pending = []

    def finish(self, results: dict[str, Any]) -> None:
        """Log the final results and close the run as finished (or diverged)."""
        self.open()
        self.flush()
        self.run.end(results, final=True)  # engine.train's results are the run's final ones

    def fail(self, error: str, status: str = "failed") -> None:
        """Close the run as ``status`` (failed, with ``error``; or interrupted); no-op if none opened."""
        if self.run_id is None:
            return  # it failed before measuring anything: nothing was recorded
        self.flush()
        self.run.fail(error, status)
