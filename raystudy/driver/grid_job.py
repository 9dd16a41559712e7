"""A grid job, as ``raystudy grid`` prepared it, run: its dry run, the drive on Ray with the
study's parent run, what an adaptive policy stopped, and the closing table."""

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
from raystudy.errors import ConfigError, disk_full, fail
from raystudy.measure import costs
from raystudy.models import components, registry
from raystudy.spaces import adaptive, grids
from raystudy.tracking import connect, query, record, tags, views


def projection(policy, space, model: str, trials: list) -> str:
    """What ``policy`` would spend of the grid: halving's share is fixed by the grid's shape, the
    race's by the data, so both ends (every lr stays in the race, one per cell is left at the
    first milestone) are given, priced like the full grid (measured step times, else the space's
    estimate)."""
    view = [adaptive.trial_of(t.key, t.config) for t in trials]
    full = grids.gpu_hours(space, model, trials)
    lines = [f"adaptive {policy.name} (replay a finished grid to measure it: python -m raystudy replay):"]
    ends = ((False, "from the grid's shape"),)
    if policy.race:
        ends = ((False, "every lr stays in the race"), (True, "one lr per cell is left at the first milestone"))
    for settled, what in ends:
        steps = adaptive.planned_steps(policy, view, settled)
        items = [grids.trial_cost({**t.config, "steps": steps[t.key]}, t.gpu, t.workers) for t in trials]
        hours = grids.gpu_hours(space, model, items)
        sgd = [v for v in view if components.has_lr(v["condition"])]  # the linear probe takes no steps
        frac = sum(steps[v["key"]] for v in sgd) / max(1, sum(v["steps"] for v in sgd))
        cost = (
            f"{costs.hours_text(hours.hours)} of {costs.hours_text(full.hours)} GPU-hours"
            if hours.hours is not None and full.hours
            else "no GPU-hour estimate"
        )
        lines.append(f"  {what}: {100 * frac:.1f}% of the steps, {cost}")
    return "\n".join(lines)


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


def rehearsal_line(job: Job) -> str:
    """The first and last line of a rehearsal: its numbers are no result."""
    return (
        f"rehearsal: synthetic trials (about {job.rehearse:g} s each), no model or data; "
        f"recorded in experiment {job.experiment!r}"
    )


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


def scope_line(job: Job) -> str | None:
    """Where experiments narrowed the grid: one line with what every dataset would take."""
    datasets, conds, optimizers, overrides, scope = job.grid
    if not scope or all(len(ds) == len(job.space.datasets) for ds in scope.values()):
        return None
    every = grids.plan(job.space, job.model, None, conds, optimizers, overrides)
    hours = grids.gpu_hours(job.space, job.model, every["costs"])
    cost = f", {costs.hours_text(hours.hours)} GPU-hours" if hours.hours is not None else ""
    names = [n for n, e in job.space.experiments.items() if not e["models"] or job.model in e["models"]]
    planned = job.plan["datasets"]
    narrower = [f"{o} on {len(ds)} of them ({', '.join(ds)})" for o, ds in scope.items() if len(ds) < len(planned)]
    return (
        (f"  {'; '.join(narrower)}\n" if narrower and len(scope) > 1 else "")
        + f"  as the space's experiments ({', '.join(names)}) scope {job.model}; every dataset: add --datasets all "
        f"({every['trials']:,} trials{cost})"
    )


def run(job: Job) -> int:
    """The grid's plan, then its dry run, its ranking if MLflow holds it all, or its run; the exit
    status. A rehearsal says so first and last, whatever happens between."""
    if job.rehearse is None:
        return _run(job)
    print(rehearsal_line(job), flush=True)
    try:
        return _run(job)
    finally:
        print(rehearsal_line(job), flush=True)


def _run(job: Job) -> int:
    plan, mopts, hours = job.plan, job.mopts, job.hours
    gpus = mopts["gpu"] * mopts["workers"] if mopts["workers"] > 1 else mopts["gpu"]
    print(
        f"grid {job.space.name} for {job.model}: {plan['trials']:,} trials = {len(plan['datasets'])} datasets × "
        f"{len(plan['conditions'])} conditions × {len(plan['optimizers'])} optimizers × lrs × seeds"
    )
    print(f"  datasets: {', '.join(plan['datasets'])}")
    for note in job.notes:
        print(f"  {note}")
    if (line := scope_line(job)) is not None:
        print(line)
    print(
        f"  GPUs per trial: {gpus:g}"
        + (f" ({mopts['workers']} DDP workers)" if mopts["workers"] > 1 else "")
        + f"; {hours.describe()}"
    )
    if hours.measured:  # per condition: frozen components cost less
        print("  GPU-hours per condition: " + ", ".join(f"{c} {h:,.0f}" for c, h in hours.by_condition.items()))
    if job.rehearse is not None:  # the GPUs and hours above are the real grid's
        print(f"  rehearsal: each trial sleeps about {job.rehearse:g} s on one CPU, no GPU, loading no weights or data")
    if job.args.dry_run:
        return dry_run(job)
    if len(job.done) == len(job.trials):  # nothing to run: the answer is in MLflow
        print(f"all {len(job.trials)} trials are already done (MLflow: {job.uri}); nothing to run")
        cl = connect.client(job.uri)
        show_results(cl, cl.get_experiment_by_name(job.experiment).experiment_id, job)
        return 0
    return drive(job)


def dry_run(job: Job) -> int:
    """What MLflow already holds of the grid and, with ``--adaptive``, what the policy would spend; starts nothing."""
    total = job.plan["trials"]
    if job.done:
        left = grids.gpu_hours(
            job.space, job.model, [t for t in job.trials if job.known.get(t.key) not in tags.TERMINAL]
        )
        print(
            f"  already done (in MLflow): {len(job.done):,} of {total:,} trials; "
            f"{total - len(job.done):,} to run"
            + (
                f", {costs.hours_text(left.hours)} GPU-hours"
                if left.hours is not None and job.hours.hours is not None
                else ""
            )
        )
    else:
        print(f"  already done (in MLflow): none of {total:,} trials")
    if job.policy is not None:
        print(projection(job.policy, job.space, job.model, grids.expand(job.space, job.model, *job.grid)))
    print("dry run: nothing started")
    return 0


def _storage(flag: str | None):
    """Where Tune keeps the grid's state: a bucket URI as given, a local folder resolved."""
    if (flag or "").startswith(("s3://", "gs://")):
        return flag
    return Path(flag or "runs/ray").resolve()


def drive(job: Job) -> int:
    """Run the grid's unfinished trials on Ray (``run_trials``); then, on a cluster, a snapshot of
    MLflow's store (``driver.snapshot``), however the grid ended once it had started; the exit status."""
    from raystudy.driver import placement, session, snapshot

    storage = _storage(job.args.storage)
    # A rehearsal's Tune folder and lock are its own: it never resumes, or blocks, the real grid.
    label = f"{job.space.study}-{job.model}" + ("-rehearsal" if job.rehearse else "")
    s = session.Session(
        storage,
        lock.grid_name(job.trials, label),
        job.model,
        address=job.args.address,
        num_cpus=job.args.num_cpus,
        temp_dir=job.args.ray_temp_dir,
        dashboard=not job.rehearse and any(t.workers > 1 for t in job.trials),
        banner=f"MLflow: {job.uri} (experiment {job.experiment!r}); checkpoints: {storage}",
        weights_log=lambda line: print(line, flush=True),
        weights=job.rehearse is None,
    )
    started = True
    try:
        return run_trials(job, s, storage, label)
    except placement.Refused as e:  # what the nodes cannot hold or see: nothing ran
        started = False
        return fail(e)
    finally:
        if s.started is not None and started:  # it held the lock: a grid refused before it started wrote nothing
            snapshot.take()


def run_trials(job: Job, s, storage, label: str) -> int:
    """The grid's unfinished trials run in the session ``s``; its summary and ranking, the exit status."""
    from raystudy.driver import grid_run, placement

    args, trials, uri = job.args, job.trials, job.uri
    try:  # one driver per grid: a second one refuses before starting anything
        with s:
            print(
                f"running {len(trials) - len(job.done)} of {len(trials)} trials"
                + (f" ({len(job.done)} already done)" if job.done else "")
                + "; one line as each ends",
                flush=True,
            )
            counts = grid_run.run_grid(
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
    except placement.Refused:  # ``drive`` says it, and takes no snapshot
        raise
    except (ConfigError, registry.WeightsUnavailable) as e:
        return fail(e)
    except KeyboardInterrupt:  # Ctrl-C: the first once Tune has stopped (tune_glue.Stopped), or a second
        return stopped(job)
    except Exception as e:
        if not disk_full(e):
            raise
        return stopped_on_full_disk(job, storage)
    if counts["unfinished"]:  # trials Tune left unfinished unasked: the rerun goes on with them too
        return stopped(job)
    print(
        f"\ndone in {time.time() - s.started:.0f} s: {counts['finished']} finished, {counts['diverged']} diverged, "
        f"{counts['failed']} failed, {counts['unfinished']} unfinished"
        + (f", {counts['stopped']} stopped by the policy" if job.policy is not None else "")
        + " "
        f"({counts['already_done']} were already done)"
    )
    if job.policy is not None:
        print(judged_by_replay(job.policy.name))
    show_results(connect.client(uri), counts["experiment_id"], job)
    return 0 if counts["unfinished"] == 0 and counts["failed"] == 0 else 1


def judged_by_replay(policy: str) -> str:
    """The closing line of an adaptive grid: where its verdict against the reseeding floor comes from.
    The trials it stopped never ran, so this grid cannot compare itself with the full one."""
    return (
        f"policy {policy}: its agreement with the full grid, against the reseeding floor, comes from a "
        f"replay of a full grid: python -m raystudy replay --recording FILE --policy {policy} (docs/adaptive.md)"
    )


def stopped_on_full_disk(job: Job, storage) -> int:
    """A full disk whose first sign was the driver's own write (its lock, Tune's state as a Tuner
    is made, MLflow's store), not a trial's: said in one line as a trial's is, then ``stopped``."""
    from raystudy.driver import tune_glue

    tune_glue.say_full_disk(job.uri, {"storage": storage})
    return stopped(job)


def stopped(job: Job) -> int:
    """Ctrl-C: one line on where the grid stands and how to go on, and the ranking so far (none
    after a full disk: the ranking is written to MLflow too)."""
    from raystudy.driver import tune_glue

    uri, experiment, trials = job.uri, job.experiment, job.trials
    known = query.known_statuses(uri, experiment)
    done = sum(known.get(t.key) in tags.TERMINAL for t in trials)
    print(f"\ngrid stopped: {done} of {len(trials)} trials done; run the same command to resume it", flush=True)
    if done and tune_glue.full_disk_said() is None:
        cl = connect.client(uri)
        exp_id = cl.get_experiment_by_name(experiment).experiment_id
        show_results(cl, exp_id, job, partial=done if done < len(trials) else None)
    return 130


def show_results(cl, exp_id: str, job: Job, partial: int | None = None) -> None:
    """The ranking of the grid's conditions from MLflow (``job.ranking``); ``partial``: only that
    many trials are done, and the ranking says so."""
    import pandas as pd

    uri, model, trials = job.uri, job.model, job.trials
    keys = {t.key for t in trials}
    found = query.find_runs(cl, exp_id, raystudy__role="trial")
    runs = pd.DataFrame([r for r in query.rows(found) if r["key"] in keys])
    table = job.ranking(runs) if job.ranking is not None else pd.DataFrame()
    if not table.empty:
        parents = [
            r.data.tags.get("mlflow.parentRunId")
            for r in found
            if r.data.tags.get("raystudy.key") in keys and r.data.tags.get("mlflow.parentRunId")
        ]
        if parents:  # the grid's parent run carries the ranking too (MLflow UI)
            record.log_ranking(
                cl, max(set(parents), key=parents.count), table.to_dict("records"), partial=partial is not None
            )
        head = (
            f"PARTIAL ranking, over the {partial} of {len(keys)} trials done so far "
            if partial is not None
            else "ranking "
        )
        print(
            f"\n{head}(lr chosen on validation; test accuracy, mean over seeds then datasets; "
            "average rank over datasets), as raystudy report computes it:"
        )
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if registry.note(model):
        print(f"\nnote: {registry.note(model)}")
    print("\n" + "\n".join(views.browse_lines(uri, exp_id)))
