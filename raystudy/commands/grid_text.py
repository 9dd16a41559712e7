"""What ``raystudy grid`` prints, and the order it runs in: the plan, then its dry run, the
ranking MLflow already holds, or the run (``driver.grid_job``); the line it ends with, done or
stopped, and the ranking of its conditions."""

from __future__ import annotations

from raystudy.driver import grid_job
from raystudy.measure import costs
from raystudy.models import components, registry
from raystudy.spaces import adaptive, grids
from raystudy.tracking import connect, query, record, tags, views


def run(job) -> int:
    """The grid's plan, then its dry run, its ranking if MLflow holds it all, or its run; the exit
    status. A rehearsal says so first and last, whatever happens between."""
    if job.rehearse is None:
        return _run(job)
    print(rehearsal_line(job), flush=True)
    try:
        return _run(job)
    finally:
        print(rehearsal_line(job), flush=True)


def _run(job) -> int:
    """The plan, then the dry run, the ranking MLflow holds, or the run."""
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
    return grid_job.drive(job, lambda counts, seconds: finished(job, counts, seconds), lambda: stopped(job))


def dry_run(job) -> int:
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


def scope_line(job) -> str | None:
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


def rehearsal_line(job) -> str:
    """The first and last line of a rehearsal: its numbers are no result."""
    return (
        f"rehearsal: synthetic trials (about {job.rehearse:g} s each), no model or data; "
        f"recorded in experiment {job.experiment!r}"
    )


def finished(job, counts: dict, seconds: float) -> int:
    """The grid's end, every trial ended: one line of how they ended, the ranking; the exit status
    (1 where a trial failed)."""
    print(
        f"\ndone in {seconds:.0f} s: {counts['finished']} finished, "
        f"{counts['diverged']} diverged, {counts['failed']} failed, {counts['unfinished']} unfinished"
        + (f", {counts['stopped']} stopped by the policy" if job.policy is not None else "")
        + " "
        f"({counts['already_done']} were already done)"
    )
    if job.policy is not None:
        print(judged_by_replay(job.policy.name))
    show_results(connect.client(job.uri), counts["experiment_id"], job)
    return 0 if counts["unfinished"] == 0 and counts["failed"] == 0 else 1


def judged_by_replay(policy: str) -> str:
    """The closing line of an adaptive grid: where its verdict against the reseeding floor comes from.
    The trials it stopped never ran, so this grid cannot compare itself with the full one."""
    return (
        f"policy {policy}: its agreement with the full grid, against the reseeding floor, comes from a "
        f"replay of a full grid: python -m raystudy replay --recording FILE --policy {policy} (docs/adaptive.md)"
    )


def stopped(job) -> int:
    """Ctrl-C: one line on where the grid stands and how to go on, and the ranking so far (none
    after a full disk: the ranking is written to MLflow too)."""
    from raystudy.driver import full_disk

    uri, experiment, trials = job.uri, job.experiment, job.trials
    known = query.known_statuses(uri, experiment)
    done = sum(known.get(t.key) in tags.TERMINAL for t in trials)
    print(f"\ngrid stopped: {done} of {len(trials)} trials done; run the same command to resume it", flush=True)
    if done and full_disk.said() is None:
        cl = connect.client(uri)
        exp_id = cl.get_experiment_by_name(experiment).experiment_id
        show_results(cl, exp_id, job, partial=done if done < len(trials) else None)
    return 130


def show_results(cl, exp_id: str, job, partial: int | None = None) -> None:
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
