"""When the driver writes a Tune trial's MLflow run: the Tune callback.

``MlflowTrials`` is the one process that writes a grid's trial runs: one writer, so a SQLite store
never sees "database is locked", and runs are found by trial key (``tracking.open_trial``), so a
rerun never duplicates one. *What* it writes, the run record itself, is ``raystudy.tracking``'s:
every write of a run goes through a function there.
"""

from __future__ import annotations

import os
from pathlib import Path

from ray import tune

from raystudy import tracking


class MlflowTrials(tune.Callback):
    """Writes every trial to MLflow from the driver, exactly once per trial key."""

    def __init__(
        self, tracking_uri: str, experiment_id: str, parent_id: str | None, tags: dict[str, str] | None = None
    ):
        self.tracking_uri, self.experiment_id, self.parent_id = tracking_uri, experiment_id, parent_id
        self.tags = dict(tags or {})
        self._runs: dict[str, str | None] = {}
        self._where: dict[str, str] = {}
        self._upto: dict[str, dict[str, int]] = {}  # run -> last step logged, by kind
        self._cl = None

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {
            "tracking_uri": self.tracking_uri,
            "experiment_id": self.experiment_id,
            "parent_id": self.parent_id,
            "tags": self.tags,
            "_runs": {},
            "_where": {},
            "_upto": {},
            "_cl": None,
        }

    @property
    def cl(self):
        """The MLflow client, made on first use (a restored callback has none)."""
        if self._cl is None:
            self._cl = tracking.client(self.tracking_uri)
        return self._cl

    def _run(self, trial) -> str | None:
        """The MLflow run of ``trial``; None if its key already finished (it will skip)."""
        if trial.trial_id not in self._runs:
            t = trial.config["trial"]
            status, _ = tracking.trial_status(self.cl, self.experiment_id, t["key"])
            self._runs[trial.trial_id] = (
                None
                if status in tracking.TERMINAL
                else tracking.open_trial(
                    self.cl,
                    self.experiment_id,
                    self.parent_id,
                    t["key"],
                    t["finetune"],
                    {"raystudy.tune_trial": trial.trial_id, **self.tags},
                    name=t.get("name"),
                )
            )
        return self._runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        """Opens (or reopens) the trial's run."""
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Logs the steps of ``result`` the run does not have yet, and where the trial runs."""
        run_id = self._run(trial)
        if run_id is None:
            return
        where = f"{result.get('node_ip')}:{result.get('pid')}"
        if self._where.get(trial.trial_id) != where:  # which node and process run it (debugging)
            self._where[trial.trial_id] = where
            tracking.note_worker(self.cl, run_id, where)
        steps = list(result.get("history") or [])
        if not result.get("final"):
            steps.append(result)
        if run_id not in self._upto:  # a run reopened by a retry or a rerun: what it already has
            self._upto[run_id] = tracking.logged_upto(self.cl, run_id)
        tracking.log_steps(self.cl, run_id, steps, self._upto[run_id])

    def on_trial_complete(self, iteration, trials, trial, **info):
        """Logs the trial's final results and ends its run; a trial stopped early is recorded ``stopped``."""
        run_id = self._run(trial)
        last = trial.last_result or {}
        if run_id is None:
            return
        if not last.get("final"):  # a scheduler stopped it early (or before it started): no test accuracy
            last = {**last, "status": "stopped", "steps_done": int(last.get("step", 0))}
            tracking.note_stopped(self.cl, run_id, last["steps_done"])
        tracking.finish_trial(self.cl, run_id, last)
        if last.get("resumed_from"):
            tracking.note_resumed(self.cl, run_id, last["resumed_from"])
        self._runs.pop(trial.trial_id, None)
        self._upto.pop(run_id, None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A failed attempt that Tune retries: count it and keep its error."""
        run_id = self._run(trial)
        if run_id is not None:
            tracking.note_retry(self.cl, run_id, error_text(trial))

    def on_trial_error(self, iteration, trials, trial, **info):
        """A trial failed for good: its run ends ``failed`` with the error."""
        run_id = self._run(trial)
        if run_id is not None:
            tracking.fail_trial(self.cl, run_id, error_text(trial)[-5000:])
            self._runs.pop(trial.trial_id, None)


def error_text(trial) -> str:
    """The error Tune saved for ``trial`` (its traceback), or a line saying there is none."""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        return Path(path).read_text().strip()
    return "trial failed (no error file)"
