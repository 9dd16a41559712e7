"""When the driver writes a Tune trial's MLflow run: the Tune callback.

``MlflowTrials`` is the one process that writes a grid's trial runs: one writer, so a SQLite store
never sees "database is locked", and runs are found by trial key (``record.open_trial``), so a
rerun never duplicates one. *What* it writes, the run record itself, is ``raystudy.tracking``'s:
every write of a run goes through a function there. A tracking server that is away is waited for
by ``driver.backlog``: the writes keep their order, and past its limit the grid stops.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune

from raystudy.driver import backlog, faults, full_disk
from raystudy.errors import disk_full
from raystudy.tracking import connect, query, record
from raystudy.tracking import tags as tracking


class MlflowTrials(tune.Callback):
    """Writes every trial to MLflow from the driver, exactly once per trial key."""

    def __init__(
        self, tracking_uri: str, experiment_id: str, parent_id: str | None, tags: dict[str, str] | None = None
    ):
        self.tracking_uri, self.experiment_id, self.parent_id = tracking_uri, experiment_id, parent_id
        self.tags = dict(tags or {})
        self._runs: dict[str, str | None] = {}
        self._where: dict[str, str] = {}
        self._records: dict[str, record.TrialRecord] = {}  # run -> its record (the steps it has)
        self._cl = None
        self._stopping = False
        self._ended = 0
        self._storage = None

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {
            "tracking_uri": self.tracking_uri,
            "experiment_id": self.experiment_id,
            "parent_id": self.parent_id,
            "tags": self.tags,
            "_runs": {},
            "_where": {},
            "_records": {},
            "_cl": None,
            "_stopping": False,
            "_ended": 0,
            "_storage": None,
        }

    @property
    def cl(self):
        """The MLflow client, made on first use (a restored callback has none)."""
        if self._cl is None:
            self._cl = connect.client(self.tracking_uri)
        return self._cl

    @property
    def waiting(self) -> backlog.Backlog:
        """The grid's writes waiting for a tracking server that is away (``driver.backlog``)."""
        return backlog.of(self.tracking_uri, self.experiment_id, self.parent_id)

    def _write(self, write: Callable[[Any], Any]) -> None:
        """Write now, or after what waits for the server; past the outage limit, stop the grid; on
        a full disk, stop it (``full_disk.stop``) and drop what cannot be written
        (the trials that did not end in MLflow run again on the rerun)."""
        try:
            self.waiting.put(write, self.cl)
        except Exception as e:
            if not disk_full(e):
                raise
            self.waiting.pending.clear()
            self._full_disk()
            return
        self._stop_if_away_too_long()

    def _full_disk(self, trial=None) -> None:
        """The grid stops on a full disk: one line naming the fullest of its storage, its store and
        the tensor cache."""
        storage = (trial.config.get("storage_path") if trial is not None else None) or self._storage
        places = full_disk.places(self.tracking_uri, {"storage": storage})
        full_disk.stop(places, "search" if "raystudy.search" in self.tags else "grid")

    def _stop_if_away_too_long(self) -> None:
        """The server away past the limit: Tune stops the grid as on a Ctrl-C (its SIGUSR1 handler
        is that of SIGINT), keeping its state for the same command to resume."""
        held = self.waiting
        # Without Tune's handler (a Tune run outside the main thread), SIGUSR1 would kill the driver.
        if held.expired() and not self._stopping and callable(signal.getsignal(signal.SIGUSR1)):
            self._stopping = True
            print(
                f"tracking server {self.tracking_uri} unreachable for {held.limit:g} s ({backlog.LIMIT_ENV}): "
                "stopping the grid; its runs are written and closed when the server is back",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGUSR1)

    def on_step_end(self, iteration, trials, **info):
        """While the server is away: write what waits once it is back, or stop the grid past the limit."""
        if self.waiting.pending:
            self.waiting.flush(self.cl)
            self._stop_if_away_too_long()

    def _run(self, trial_id: str, t: dict[str, Any]) -> str | None:
        """The MLflow run of trial ``trial_id`` (its ``trial`` config ``t``); None if its key
        already finished (it will skip)."""
        if trial_id not in self._runs:
            status, _ = query.trial_status(self.cl, self.experiment_id, t["key"])
            self._runs[trial_id] = (
                None
                if status in tracking.TERMINAL
                else record.open_trial(
                    self.cl,
                    self.experiment_id,
                    self.parent_id,
                    t["key"],
                    t["finetune"],
                    {"raystudy.tune_trial": trial_id, **self.tags},
                    name=t.get("name"),
                )
            )
        return self._runs[trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        """Opens (or reopens) the trial's run."""
        trial_id, t = trial.trial_id, trial.config["trial"]
        self._storage = trial.config.get("storage_path")
        self._write(lambda cl: self._run(trial_id, t))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Logs the steps of ``result`` the run does not have yet, and where the trial runs."""
        trial_id, t = trial.trial_id, trial.config["trial"]
        self._write(lambda cl: self._log_result(trial_id, t, result))

    def _log_result(self, trial_id: str, t: dict[str, Any], result: dict[str, Any]) -> None:
        """``on_trial_result``'s writes; written again whole if the server went away midway."""
        run_id = self._run(trial_id, t)
        if run_id is None:
            return
        # a DDP trial's workers, each ip:pid; else the trial's own process
        where = result.get("workers_at") or f"{result.get('node_ip')}:{result.get('pid')}"
        if self._where.get(trial_id) != where:  # which node and process run it (debugging)
            record.note_worker(self.cl, run_id, where)
            self._where[trial_id] = where
        self._record(run_id).log([result])

    def _record(self, run_id: str) -> record.TrialRecord:
        """The run's record, kept while its trial runs (it knows which steps the run has)."""
        if run_id not in self._records:
            self._records[run_id] = record.TrialRecord(self.cl, run_id)
        return self._records[run_id]

    def on_trial_complete(self, iteration, trials, trial, **info):
        """Logs the trial's final results and ends its run; a trial stopped early is recorded ``stopped``."""
        trial_id, t, last = trial.trial_id, trial.config["trial"], dict(trial.last_result or {})
        self._ended += 1
        faults.kill_at(faults.KILL_AT_TRIAL_END, self._ended)
        if not faults.at(faults.LOSE_TRIAL_END, self._ended):
            self._write(lambda cl: self._complete(trial_id, t, last))

    def _complete(self, trial_id: str, t: dict[str, Any], last: dict[str, Any]) -> None:
        """``on_trial_complete``'s writes."""
        run_id = self._run(trial_id, t)
        if run_id is None:
            return
        self._record(run_id).end(last)  # no final result: a scheduler stopped it early (or before it started)
        self._runs.pop(trial_id, None)
        self._records.pop(run_id, None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A failed attempt that Tune retries: count it and keep its error."""
        trial_id, t, error = trial.trial_id, trial.config["trial"], error_text(trial)
        if disk_full(error):  # a retry would fail on the same disk
            self._full_disk(trial)

        def write(cl):
            run_id = self._run(trial_id, t)
            if run_id is not None:
                record.note_retry(self.cl, run_id, error)

        self._write(write)

    def on_trial_error(self, iteration, trials, trial, **info):
        """A trial failed for good: its run ends ``failed`` with the error."""
        trial_id, t, error = trial.trial_id, trial.config["trial"], error_text(trial)
        if disk_full(error):
            self._full_disk(trial)

        def write(cl):
            run_id = self._run(trial_id, t)
            if run_id is not None:
                self._record(run_id).fail(error[-5000:])
                self._runs.pop(trial_id, None)
                self._records.pop(run_id, None)

        self._write(write)


def error_text(trial) -> str:
    """The error Tune saved for ``trial`` (its traceback), or a line saying there is none."""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        return Path(path).read_text().strip()
    return "trial failed (no error file)"
