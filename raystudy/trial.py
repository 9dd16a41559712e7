"""One trial on Ray: the Tune function trainable for every condition, and the driver's MLflow callback.

``run_trial`` runs the finetuning loop in the trial itself (one GPU, or a fraction, or CPU), or,
when the trial asks for several workers (ViT-H), launches a ``TorchTrainer`` with DDP workers
from inside the trial, the interop pattern of Ray 2.5x/2.60 (``Tuner(TorchTrainer)`` is gone).
The same loop, ``engine.train``, runs in both. Checkpoints go through Tune (or Train) to the
run's storage path, so a retried trial continues from its last evaluation, not from step 0.

MLflow is written by ``MlflowTrials`` in the driver only: one writer, so a SQLite store never
sees "database is locked", and runs are found by trial key, so a rerun never duplicates one.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from ray import tune

from raystudy import engine, tracking
from raystudy.config import from_dict

STATE_FILE = "state.pt"


def _save_state(state: dict, folder: str) -> None:
    torch.save(state, Path(folder) / STATE_FILE)


def _load_state(checkpoint) -> dict | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return torch.load(Path(d) / STATE_FILE, map_location="cpu", weights_only=False)


class Reporter:
    """The engine's ``report`` on Ray: step measurements wait in ``pending`` and travel with the
    next evaluation (or the final) report, a checkpoint goes with an evaluation when ``every_s``
    seconds have passed since the last one (0: every evaluation).

    Fewer reports, fewer round trips to the driver: a report costs a driver-side turn (Tune's
    bookkeeping, the MLflow write), which dominated a short trial's overhead. Seconds rather
    than steps for checkpoints: a 5-second demo trial needs none, a 3-hour ViT-H trial many.
    """

    def __init__(self, report_fn, checkpoint_cls, every_s: float):
        self.report_fn, self.checkpoint_cls, self.every_s = report_fn, checkpoint_cls, every_s
        self.last, self.best, self.pending = time.monotonic(), 0.0, []

    def __call__(self, metrics: dict[str, Any], state: dict | None) -> None:
        self.best = max(self.best, metrics.get("val_acc", 0.0))
        if state is None and not metrics.get("diverged"):
            self.pending.append(metrics)
            return
        # "score" (best validation accuracy so far) is what schedulers such as ASHA compare.
        out = {**metrics, "score": self.best, "history": self.pending}
        self.pending = []
        if state is None or time.monotonic() - self.last < self.every_s:
            self.report_fn(out)
            return
        with tempfile.TemporaryDirectory() as d:
            _save_state(state, d)
            self.report_fn(out, checkpoint=self.checkpoint_cls.from_directory(d))
        self.last = time.monotonic()

    def final(self, results: dict[str, Any]) -> None:
        self.report_fn({**results, "final": 1, "step": results["steps_done"],
                        "score": results.get("best_val_acc", self.best), "history": self.pending})
        self.pending = []


def run_trial(config: dict[str, Any]) -> None:
    """The Tune trainable: ``config`` holds one trial (``key``, flat ``config``, ``workers``).

    It never touches MLflow: the driver launches only keys not yet done, and if a restored
    experiment reruns a trial that had already finished, the driver's callback finds the key
    done and records nothing (compute spent twice, never a second run). Keeping MLflow out of
    the workers saves each of them the import and the store's start-up.
    """
    trial = config["trial"]
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    cfg = from_dict(trial["config"])
    if trial.get("workers", 1) > 1:
        _run_ddp(trial, config)  # rank 0's final results reach Tune through TuneReportCallback
        return
    resume = _load_state(tune.get_checkpoint())
    reporter = Reporter(tune.report, tune.Checkpoint, float(config.get("checkpoint_every_s", 0)))
    reporter.final(engine.train(cfg, report=reporter, resume=resume))


def _ddp_loop(loop_config: dict[str, Any]) -> None:
    """Each DDP worker of the TorchTrainer: the same engine.train, reporting through Ray Train."""
    import ray.train

    cfg = from_dict(loop_config["config"])
    resume = _load_state(ray.train.get_checkpoint())
    rank = ray.train.get_context().get_world_rank()

    def report(metrics, checkpoint=None):
        # every worker reports (Train's collective); only rank 0 carries the checkpoint
        ray.train.report(metrics, checkpoint=checkpoint if rank == 0 else None)

    reporter = Reporter(report, ray.train.Checkpoint, float(loop_config.get("checkpoint_every_s", 0)))
    reporter.final(engine.train(cfg, report=reporter, resume=resume))


def _run_ddp(trial: dict[str, Any], config: dict[str, Any]) -> None:
    """Launch a TorchTrainer from inside the Tune trial; its reports become the trial's.

    The run is named by the trial key under the grid's storage path, so a retried trial's
    TorchTrainer finds its own earlier checkpoints and resumes from them.
    """
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    use_gpu = trial.get("gpu", 0) > 0
    per_worker = {"GPU": 1, "CPU": trial["cpu"]} if use_gpu else {"CPU": trial["cpu"]}
    trainer = TorchTrainer(
        _ddp_loop,
        train_loop_config={"config": trial["config"], "checkpoint_every_s": config.get("checkpoint_every_s", 0)},
        scaling_config=ray.train.ScalingConfig(num_workers=trial["workers"], use_gpu=use_gpu,
                                               resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(
            name=f"ddp-{trial['key']}", storage_path=config["storage_path"],
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1)),
    )
    trainer.fit()


class MlflowTrials(tune.Callback):
    """Writes every trial to MLflow from the driver, exactly once per trial key."""

    def __init__(self, tracking_uri: str, experiment_id: str, parent_id: str | None,
                 tags: dict[str, str] | None = None):
        self.tracking_uri, self.experiment_id, self.parent_id = tracking_uri, experiment_id, parent_id
        self.tags = dict(tags or {})
        self._runs: dict[str, str | None] = {}
        self._where: dict[str, str] = {}
        self._cl = None

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_id": self.parent_id, "tags": self.tags, "_runs": {}, "_where": {}, "_cl": None}

    @property
    def cl(self):
        if self._cl is None:
            self._cl = tracking.client(self.tracking_uri)
        return self._cl

    def _run(self, trial) -> str | None:
        """The MLflow run of ``trial``; None if its key already finished (it will skip)."""
        if trial.trial_id not in self._runs:
            t = trial.config["trial"]
            status, _ = tracking.trial_status(self.cl, self.experiment_id, t["key"])
            self._runs[trial.trial_id] = (None if status in tracking.TERMINAL else
                                          tracking.open_trial(self.cl, self.experiment_id, self.parent_id,
                                                              t["key"], t["config"],
                                                              {"raystudy.tune_trial": trial.trial_id, **self.tags}))
        return self._runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._run(trial)
        if run_id is None:
            return
        where = f"{result.get('node_ip')}:{result.get('pid')}"
        if self._where.get(trial.trial_id) != where:  # which node and process run it (debugging)
            self._where[trial.trial_id] = where
            self.cl.set_tag(run_id, "raystudy.worker", where)
        steps = list(result.get("history") or [])
        if not result.get("final"):
            steps.append(result)
        tracking.log_steps(self.cl, run_id, steps)

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._run(trial)
        last = trial.last_result or {}
        if run_id is None:
            return
        if not last.get("final"):  # a scheduler (ASHA) stopped it early: no test accuracy
            last = {**last, "status": "stopped"}
        tracking.finish_trial(self.cl, run_id, last)
        self._runs.pop(trial.trial_id, None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A failed attempt that Tune retries: count it and keep its error."""
        run_id = self._run(trial)
        if run_id is not None:
            attempts = int(self.cl.get_run(run_id).data.tags.get("raystudy.attempts", "1")) + 1
            self.cl.set_tag(run_id, "raystudy.attempts", str(attempts))
            self.cl.set_tag(run_id, "raystudy.last_error", _error_text(trial)[-5000:])

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._run(trial)
        if run_id is not None:
            tracking.fail_trial(self.cl, run_id, _error_text(trial)[-5000:])
            self._runs.pop(trial.trial_id, None)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        text = Path(path).read_text().strip()
        # The last line of a traceback says what went wrong; keep the whole for the artifact.
        return text
    return "trial failed (no error file)"
