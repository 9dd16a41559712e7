"""A search job, as ``raystudy search`` prepared it, run: one Optuna study per condition on Ray,
its test re-evaluation, and the summary."""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from raystudy.driver import tune_glue
from raystudy.errors import ConfigError, disk_full, fail
from raystudy.models import registry
from raystudy.spaces import grids, searches
from raystudy.tracking import query, views
from raystudy.train.config import from_dict, trial_key, validate


def budget_line(time_budget: float | None, studies: int, num_samples: int) -> str:
    """What the search may spend: the time budget per study and over all of them."""
    if not time_budget:
        return f"time budget: none; each of the {studies} studies runs its {num_samples} trials to the end"
    total = time_budget * studies
    return (
        f"time budget: {time_budget:g} s per study, at most {total:g} s ({total / 3600:.2g} h) for the "
        f"{studies} studies, then the test re-runs of each best config"
    )


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


def run(job: Job) -> int:
    """Every study of the search on Ray (``driver.session``), then the best config per condition;
    then, on a cluster, a snapshot of MLflow's store (``driver.snapshot``), however the search
    ended once it had started; the exit status."""
    from raystudy.driver import placement, session, snapshot

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
    started = True
    try:
        return _run_studies(job, s, storage, skey)
    except placement.Refused as e:  # what the nodes cannot hold or see: nothing ran
        started = False
        return fail(e)
    finally:
        if s.started is not None and started:  # it held the lock: a search refused before it started wrote nothing
            snapshot.take(what="search")


def _run_studies(job: Job, s, storage: Path, skey: str) -> int:
    """The search's studies in the session ``s`` (one driver per search: a second one refuses
    before starting anything), their summary; the exit status."""
    from raystudy.driver import placement, session, shared

    try:
        with s:
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
                summary = [study(job, label, cond, storage, cl, exp_id, parent.run_id) for label, cond in job.studies]
    except placement.Refused:  # ``run`` says it, and takes no snapshot
        raise
    except (ConfigError, registry.WeightsUnavailable) as e:
        return fail(e)
    except KeyboardInterrupt:  # Ctrl-C: Optuna's studies and MLflow keep what is done; the rerun goes on from there
        print("\nsearch stopped; run the same command to resume it", flush=True)
        return 130
    except Exception as e:
        if not disk_full(e):
            raise
        first = {"storage": storage, "the Optuna storage": (storage / "optuna").resolve()}
        tune_glue.say_full_disk(job.uri, first, "search")
        print("\nsearch stopped; run the same command to resume it", flush=True)
        return 130
    print_summary(summary)
    optuna_db = storage / "optuna" / "optuna.db"
    browse = [*views.browse_lines(job.uri, exp_id), f"Optuna studies: optuna-dashboard sqlite:///{optuna_db}"]
    print("\n" + "\n".join(browse))
    return 0


def study(job: Job, label: str, cond: str | None, storage: Path, cl, exp_id: str, parent: str) -> dict[str, Any]:
    """One condition's Optuna study, then its best config re-run on test with fresh seeds; its summary."""
    from raystudy.driver import grid_run, optuna_search

    tuning = job.tuning
    best = optuna_search.search_condition(
        job.space,
        label,
        cond,
        model=job.model,
        dataset=job.dataset,
        base=job.base,
        tracking_uri=job.uri,
        exp_id=exp_id,
        parent=parent,
        storage=storage,
        num_samples=job.num_samples,
        time_budget_s=job.time_budget,
        resources=job.resources,
        tuning=tuning,
        verbose=0 if job.args.quiet else 1,
        rehearse=job.rehearse,
    )
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


def print_summary(summary: list[dict[str, Any]]) -> None:
    """The best configuration per condition: validation and test accuracy, its knobs, the trial counts."""
    print("\nbest configuration per condition (chosen on validation, tested with fresh seeds):")
    for s in summary:
        if "config" not in s:
            print(f"  {s['condition']:<16} no finished trial ({s['trials']} trials, {s['stopped']} stopped early)")
            continue
        c = s["config"]
        knobs = ", ".join(
            f"{k}={c[k]:.3g}" if isinstance(c[k], float) else f"{k}={c[k]}"
            for k in ("optimizer", "lr", "weight_decay", "warmup_steps", "batch_size")
            if k in c
        )
        print(
            f"  {s['condition']:<16} val {s['val_acc']:.4f}  test {s['test_acc']:.4f} ± {s['test_std']:.4f} "
            f"({s['test_runs']} seeds)  [{knobs}]  trials: {s['finished']} finished, "
            f"{s['stopped']} stopped early by ASHA"
        )
        if "found" in s:
            print("    " + found_line(s["found"]))


def found_line(f: dict[str, Any]) -> str:
    """A rehearsal study against its known optimum: the chosen config's true plateau, the best
    any finished trial had, and how far each is below the optimum (the regret)."""
    return (
        f"rehearsal: known optimum {f['optimum']:.3f}; chosen config {f['chosen']:.3f} "
        f"(regret {f['optimum'] - f['chosen']:.3f}); closest of {f['told']} trials {f['closest']:.3f} "
        f"(regret {f['optimum'] - f['closest']:.3f})"
    )
