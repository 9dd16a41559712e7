"""A grid job, as ``raystudy grid`` prepared it: the command checked (the space, its trials, what
MLflow already holds, your own data unchanged), and its drive on Ray in a session of its own."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystudy.data import userdata
from raystudy.driver import lock
from raystudy.errors import ConfigError
from raystudy.spaces import adaptive, grids
from raystudy.tracking import query, tags


@dataclasses.dataclass
class Job:
    """A grid command, checked: the space, its trials, where they are recorded, what MLflow already holds."""

    args: argparse.Namespace
    space: grids.Space
    model: str
    grid: tuple  # datasets, conditions, optimizers, overrides, scope (optimizer -> its experiments' datasets)
    plan: dict
    mopts: dict
    hours: Any  # costs.Estimate
    tuning: dict
    max_failures: int
    policy: adaptive.Policy | None
    uri: str
    experiment: str
    known: dict[str, str]
    trials: list
    done: list
    notes: list = dataclasses.field(default_factory=list)  # what the check of your own data says
    rehearse: float | None = None  # a dress rehearsal's seconds per trial (``train.rehearsal``)
    # The closing ranking of a runs table (the command's: the analysis's table); None: none shown.
    ranking: Callable[[Any], Any] | None = None


def done_trials(uri: str, experiment: str, known: dict[str, str], trials: list, accept: bool) -> list:
    """The ``trials`` MLflow holds done. Raises ``ConfigError`` where the grid's own data is no
    longer what the study's ended runs on it saw (``check_data``), unless ``accept``."""
    if known and not accept:
        check_data(uri, experiment, {t.config["data"] for t in trials if t.config.get("data")}, "grid")
    return [t for t in trials if known.get(t.key) in tags.TERMINAL]


def check_data(uri: str, experiment: str, where: set[str], command: str) -> None:
    """Raises ``ConfigError`` in one line where your own data at ``where`` (folders, tables,
    ``hf:NAME``) is no longer what the experiment's ended runs on it saw: a trial's key holds its
    data's location, not its contents, so a grid would never train on the change and a search
    would mix trials on both."""
    if not where:
        return
    for loc, (seen, n) in query.recorded_data(uri, experiment, where).items():
        now = _summary(loc)
        what = userdata.change(seen, now) if now is not None else None
        if what:
            raise ConfigError(
                f"data {loc} changed since the study's {n} recorded runs on it saw it: {what}; "
                f"run the {command} as a new study (--experiment NEW_NAME), or add --accept-data-change "
                "to go on knowingly (its recorded runs stay done, on the data as it was)"
            )


def _summary(loc: str) -> dict[str, str] | None:
    """``userdata.summary`` of ``loc``; None where it is gone (a folder) or cannot be read now (a
    hub dataset): nothing to compare, and the trials will say why they cannot read it."""
    if not loc.startswith(userdata.HF_PREFIX):
        return userdata.summary(loc) if os.path.exists(loc) else None
    try:
        return userdata.summary(loc)
    except userdata.DataError:
        return None


def experiment_scope(
    space, model: str, datasets: list[str] | None, optimizers: list[str] | None
) -> dict[str, list[str]]:
    """Per optimizer, the datasets the space's experiments run ``model`` on with it; none where
    ``--datasets`` names them or no experiment names the pair."""
    if datasets is not None or not space.experiments:
        return {}
    opts = optimizers or [o for o in space.grid.get("optimizer", list(space.optimizers))]
    found = {o: grids.experiment_datasets(space, model, o) for o in opts}
    return {o: ds for o, ds in found.items() if ds is not None}


def _storage(flag: str | None):
    """Where Tune keeps the grid's state: a bucket URI as given, a local folder resolved."""
    if (flag or "").startswith(("s3://", "gs://")):
        return flag
    return Path(flag or "runs/ray").resolve()


def drive(job: Job, finished: Callable[[dict[str, Any], float], int], stopped: Callable[[], int]) -> int:
    """Run the grid's unfinished trials on Ray in a session of its own (``driver.job``); the exit
    status. The command's two ends: ``finished(counts, seconds)`` once every trial has ended,
    ``stopped()`` on Ctrl-C, a full disk, or trials Tune left unfinished (the rerun goes on with
    them too)."""
    from raystudy.driver import grid_run, session
    from raystudy.driver import job as study_job

    args, trials, uri = job.args, job.trials, job.uri
    storage = _storage(args.storage)
    # A rehearsal's Tune folder and lock are its own: it never resumes, or blocks, the real grid.
    label = f"{job.space.study}-{job.model}" + ("-rehearsal" if job.rehearse else "")
    s = session.Session(
        storage,
        lock.grid_name(trials, label),
        job.model,
        address=args.address,
        num_cpus=args.num_cpus,
        temp_dir=args.ray_temp_dir,
        dashboard=not job.rehearse and any(t.workers > 1 for t in trials),
        banner=f"MLflow: {uri} (experiment {job.experiment!r}); checkpoints: {storage}",
        weights_log=lambda line: print(line, flush=True),
        weights=job.rehearse is None,
    )

    def inside() -> dict[str, Any]:
        print(
            f"running {len(trials) - len(job.done)} of {len(trials)} trials"
            + (f" ({len(job.done)} already done)" if job.done else "")
            + "; one line as each ends",
            flush=True,
        )
        return grid_run.run_grid(
            trials,
            label=label,
            model=job.model,
            tracking_uri=uri,
            experiment=job.experiment,
            storage=storage,
            max_failures=job.max_failures,
            threads=int(job.tuning["threads_per_trial"]),
            max_concurrent=grid_run.concurrency(
                args.max_concurrent or job.tuning["max_concurrent"],
                1 if job.rehearse else job.mopts["workers"],  # a rehearsal's trial is one process
                job.mopts["gpu"],
            ),
            checkpoint_every_s=float(job.tuning["checkpoint_every_s"]),
            trials_per_run=int(job.tuning["trials_per_run"]),
            verbose=1 if args.tune_output else 0,
            quiet=args.quiet,
            policy=job.policy,
            rehearse=job.rehearse,
        )

    def after(counts: dict[str, Any]) -> int:
        return stopped() if counts["unfinished"] else finished(counts, time.time() - s.started)

    return study_job.run(s, "grid", inside, after, stopped, (uri, {"storage": storage}))
