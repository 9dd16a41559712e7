"""A search job, as ``raystudy search`` prepared it, run: one Optuna study per condition on Ray,
its test re-evaluation; what it prints at its end is the command's (``commands.search_text``)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystudy.spaces import grids, searches
from raystudy.tracking import query
from raystudy.train.config import from_dict, trial_key, validate


@dataclasses.dataclass
class Job:
    """A search command, checked: the space, its studies, the trials' resources and tuning, where they are recorded."""

    args: argparse.Namespace
    space: searches.SearchSpace
    base: dict[str, Any]
    model: str
    dataset: str
    conditions: list[str]
    studies: list[tuple[str, str | None]]
    resources: dict[str, Any]
    num_samples: int
    time_budget: float | None
    test_seeds: list[int]
    tuning: dict[str, Any]
    uri: str
    experiment: str
    rehearse: float | None = None  # a dress rehearsal's seconds per trial (``train.rehearsal``)


def check_samples(space: searches.SearchSpace, studies: list, base: dict[str, Any], resources: dict[str, Any]) -> None:
    """A dry sample through the sampler: catches configs the space can produce but ``validate`` refuses."""
    import optuna

    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(8):
        for _, cond in studies:
            validate(from_dict(searches.Sampler(space, cond, base, resources)(probe.ask())["trial"]["finetune"]))


def run(
    job: Job,
    summarize: Callable[[Job, list[dict[str, Any]], str, Path], int],
    stopped: Callable[[list[dict[str, Any]]], int],
) -> int:
    """Every study of the search on Ray in a session of its own (``driver.job``); the exit status.
    The command's two ends: ``summarize(job, summary, experiment id, storage)`` once every study
    has ended (each study's best config), ``stopped(summary of the studies done)`` on Ctrl-C, a
    full disk, or trials Tune left unfinished (Optuna's studies and MLflow keep what is done; the
    rerun goes on from there)."""
    from raystudy.driver import job as study_job
    from raystudy.driver import placement, session, shared

    args = job.args
    storage = Path(args.storage or "runs/search").resolve()
    skey = trial_key(
        {
            "space": job.space.name,
            "model": job.model,
            "dataset": job.dataset,
            "base": job.base,
            "conditions": job.conditions,
            # a rehearsal's lock and Tune folders are its own (a real search's key is as it was)
            **({"rehearsal": True} if job.rehearse else {}),
        }
    )
    s = session.Session(
        storage,
        f"search-{job.space.study}-{skey}",
        job.model,
        address=args.address,
        num_cpus=args.num_cpus,
        temp_dir=args.ray_temp_dir,
        weights=job.rehearse is None,
    )

    summary: list[dict[str, Any]] = []  # each study's, as it ends

    def inside() -> tuple[list[dict[str, Any]], str]:
        # before anything runs or is recorded: a trial the nodes cannot hold, storage they do not share
        shared.preflight(storage, [placement.shape(1, job.resources["cpu"], job.resources["gpu"])])
        cl, exp_id = session.experiment(job.uri, job.experiment)
        with session.parent_run(
            cl,
            exp_id,
            skey,
            f"search-{job.space.name}-{job.model}-{job.dataset}",
            {"space": job.space.name, "model": job.model, "dataset": job.dataset, "num_samples": job.num_samples},
            role="search",
        ) as parent:
            for label, cond in job.studies:
                summary.append(study(job, label, cond, storage, cl, exp_id, parent.run_id))
            return summary, exp_id

    def after(done: tuple[list[dict[str, Any]], str]) -> int:
        summary, exp_id = done
        return summarize(job, summary, exp_id, storage)

    places = {"storage": storage, "the Optuna storage": (storage / "optuna").resolve()}
    return study_job.run(s, "search", inside, after, lambda: stopped(summary), (job.uri, places))


def study(job: Job, label: str, cond: str | None, storage: Path, cl, exp_id: str, parent: str) -> dict[str, Any]:
    """One condition's Optuna study, then its best config re-run on test with fresh seeds; its summary."""
    from raystudy.driver import grid_run, interrupt, optuna_search

    tuning = job.tuning
    study = optuna_search.OptunaTrials(
        job.space,
        label,
        cond,
        model=job.model,
        dataset=job.dataset,
        base=job.base,
        mlflow=(job.uri, exp_id, parent),
        storage=storage,
        budget=(job.num_samples, job.time_budget),
        resources=job.resources,
        tuning=tuning,
        output=(1 if job.args.tune_output else 0, job.args.quiet),
        rehearse=job.rehearse,
    )
    best = optuna_search.search(study)
    if "config" not in best:
        print(f"[{label}] no trial finished: nothing to evaluate on test")
        return {"condition": label, **best}
    trials = [
        grids.Trial(trial_key(c), c, job.resources["gpu"], job.resources["cpu"], 1)
        for c in ({**best["config"], "seed": s} for s in job.test_seeds)
    ]
    counts = grid_run.run_grid(
        trials,
        label=f"{best['study']}-test",
        model=job.model,
        tracking_uri=job.uri,
        experiment=job.experiment,
        storage=storage,
        max_failures=int(tuning["max_failures"]),
        max_concurrent=tuning["max_concurrent"],
        threads=int(tuning["threads_per_trial"]),
        checkpoint_every_s=float(tuning["checkpoint_every_s"]),
        verbose=0,
        role="search-test",
        rehearse=job.rehearse,
    )
    if counts["unfinished"]:  # as a grid does: the same command goes on with them
        raise interrupt.Stopped(f"{best['study']}-test: {counts['unfinished']} trials unfinished")
    keys = {t.key for t in trials}
    rows = [
        r
        for r in query.rows(query.find_runs(cl, exp_id, raystudy__role="trial"))
        if r["key"] in keys and r["status"] == "finished"
    ]
    acc = [r["test_acc"] for r in rows]
    return {
        "condition": best["config"]["condition"],
        **best,
        "test_acc": sum(acc) / len(acc) if acc else math.nan,
        "test_std": statistics.stdev(acc) if len(acc) > 1 else math.nan,
        "test_runs": counts["finished"],
    }
