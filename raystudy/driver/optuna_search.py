"""One Optuna study on Ray Tune: ``OptunaSearch`` (TPE, seeded, persisted in SQLite) proposes
configs, ASHA stops weak trials early, ``mlflow_trials.MlflowTrials`` records each trial once."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from raystudy.driver import console, interrupt, reconcile, tuner
from raystudy.spaces.searches import Sampler, SearchSpace
from raystudy.tracking import connect, query
from raystudy.tracking import tags as tracking
from raystudy.train import rehearsal
from raystudy.train.config import FinetuneConfig


def optuna_storage(folder: Path):
    """The Optuna storage of a search: ``optuna.db`` (SQLite) in ``folder``, created if missing."""
    import optuna

    folder.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")


def make_searcher(
    space: SearchSpace, condition: str | None, base: dict[str, Any], resources: dict[str, Any], storage, study_name: str
):
    """Ray's OptunaSearch over the persisted study ``study_name``, resumed with its history.

    The sampler's seed is the space's plus the number of trials the study already holds: a
    resumed search draws on from there instead of replaying the first session's draws
    (TPE's random start-up trials), and the same history still gives the same suggestions.
    """
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    try:
        held = len(optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False))
    except KeyError:
        held = 0
    seed = None if space.seed is None else space.seed + held
    return OptunaSearch(
        space=Sampler(space, condition, base, resources),
        metric="score",
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=seed),
        storage=storage,
        study_name=study_name,
    )


def search_condition(
    space: SearchSpace,
    label: str,
    condition: str | None,
    *,
    model: str,
    dataset: str,
    base: dict[str, Any],
    tracking_uri: str,
    exp_id: str,
    parent: str,
    storage: Path,
    num_samples: int,
    time_budget_s: float | None,
    resources: dict[str, Any],
    tuning: dict[str, Any],
    verbose: int,
    quiet: bool = False,
    rehearse: float | None = None,
) -> dict[str, Any]:
    """One Optuna study (``label``: a condition, or ``components`` when the condition itself is
    searched); returns the best finished trial's config and score (``best_of``), and for a
    rehearsal (``rehearse``: seconds a trial) how near the known optimum it came (``found``).
    One line per trial that ends, as a grid's (``console.ConsoleTrials``; ``quiet``: only those
    that did not finish, ASHA's stops among them); ``verbose`` > 0 brings back Tune's own tables.
    Raises ``interrupt.Stopped`` if the user stopped it before its budget."""
    # a rehearsal's study is its own: it never resumes, or feeds its history to, the real one
    study_name = f"{space.study}-{model}-{dataset}-{label}" + (rehearsal.SUFFIX if rehearse else "")
    cl = connect.client(tracking_uri)
    ostore = optuna_storage(storage / "optuna")
    sampler = Sampler(space, condition, base, resources)
    done = reconcile.study_after_a_kill(ostore, study_name, sampler, (cl, exp_id, parent), storage, label)
    remaining = max(num_samples - done, 0)
    print(f"\n[{label}] Optuna study {study_name!r}: {done} trials done, {remaining} to run", flush=True)
    mlflow = (tracking_uri, exp_id, parent)
    asha = _asha(space, base)  # one for the session: its rungs go on from part to part
    lines = _console(cl, exp_id, study_name, num_samples, quiet)
    close = _closer(cl, mlflow, study_name, label)
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s

    def tune_runs():  # each searcher reads the study's whole history, the last run's trials included
        session = f"{study_name}-{int(time.time())}"
        for name, part in tuner.runs(list(range(remaining)), session, int(tuning["trials_per_run"])):
            budget = None if deadline is None else deadline - time.monotonic()
            if not part or (budget is not None and budget <= 0):
                return
            searcher = make_searcher(space, condition, base, resources, ostore, study_name)
            args = (searcher, asha, study_name, name, len(part), budget, storage, space, resources, tuning)
            yield _tuner(*args, (verbose, lines), mlflow, rehearse)

    def told():  # a tell Ray let fail (a full disk): the study hears of what MLflow ended
        reconcile.catch_up_optuna(ostore, study_name, sampler, (cl, exp_id, parent), storage)

    stopped = tuner.fit_each(tune_runs(), verbose, close, told)
    if stopped and reconcile.completed_trials(ostore, study_name) < num_samples:
        raise interrupt.Stopped(f"study {study_name!r} stopped before its budget")
    best = best_of(cl, exp_id, study_name)
    if rehearse and "config" in best:
        best["found"] = found(ostore, study_name, sampler, best["key"])
    return best


def _closer(cl, mlflow: tuple[str, str, str], study_name: str, label: str):
    """What ``tuner.fit`` calls once every trial of a Tune run has ended, or the driver is going
    down: ``reconcile.close_run`` over the study's runs, and a line if any was left RUNNING."""

    def close():
        stale = reconcile.close_run(cl, *mlflow, raystudy__search=study_name)
        if stale:
            print(f"[{label}] {stale} trial run(s) had no end from Tune; marked interrupted", flush=True)

    return close


def _console(cl, exp_id: str, study_name: str, num_samples: int, quiet: bool) -> console.ConsoleTrials:
    """The study's console: its trials said by name, numbered over its budget on from those MLflow
    holds ended, ASHA's stops said."""
    runs = query.find_runs(cl, exp_id, raystudy__role="trial", raystudy__search=study_name)
    ended = {r.data.tags.get(tracking.KEY) for r in runs if r.data.tags.get(tracking.STATUS) in tracking.TERMINAL}
    return console.ConsoleTrials(num_samples, ended, quiet=quiet, by_name=True, stopped_by="ASHA")


def _asha(space: SearchSpace, base: dict[str, Any]):
    """ASHA over the study's trials: stops a trial whose score at a rung falls below the best
    1/reduction_factor of those recorded there."""
    from ray.tune.schedulers import ASHAScheduler

    steps = int(base.get("steps", FinetuneConfig.steps))
    # max_t past the last step: a trial that reaches the end finishes itself (and is tested)
    return ASHAScheduler(
        time_attr="step",
        metric="score",
        mode="max",
        max_t=steps + 1,
        grace_period=min(space.grace_period, steps),
        reduction_factor=space.reduction_factor,
    )


def _tuner(
    searcher,
    asha,
    study_name: str,
    name: str,
    num_samples: int,
    time_budget_s: float | None,
    storage: Path,
    space: SearchSpace,
    resources: dict[str, Any],
    tuning: dict[str, Any],
    output: tuple[int, Any],
    mlflow: tuple[str, str, str],
    rehearse: float | None = None,
):
    """The Tuner of one Tune run of a study's session (Tune's folder ``name``): ``num_samples``
    trials from ``searcher`` under ``asha``; ``output``: Tune's verbosity and the study's console;
    a rehearsal's trials are ``train.rehearsal``'s, on one CPU, scored on the space's landscape."""
    verbose, lines = output
    from raystudy.driver import ledger, mlflow_trials
    from raystudy.spaces import searches

    extra = {"rehearse_landscape": searches.landscape(space)} if rehearse else {}
    shared = tuner.shared_config(storage, tuning["threads_per_trial"], tuning["checkpoint_every_s"], rehearse, **extra)
    made = {"raystudy.search": study_name, **({tracking.REHEARSAL: "1"} if rehearse else {})}
    return tuner.new(
        tuner.trainable(rehearse, {"cpu": resources["cpu"], "gpu": resources["gpu"]}),
        name=name,
        storage=storage,
        param_space=shared,
        # the ledger first: a result is on storage before the searcher or MLflow hear of it
        recorders=[
            ledger.ResultLedger(ledger.of_study(storage, study_name)),
            mlflow_trials.MlflowTrials(*mlflow, made),
            lines,
        ],
        max_failures=tuning["max_failures"],
        verbose=verbose,
        search_alg=searcher,
        scheduler=asha,
        num_samples=num_samples,
        time_budget_s=time_budget_s,
        max_concurrent_trials=tuning["max_concurrent"],
    )


def best_of(cl, exp_id: str, study_name: str) -> dict[str, Any]:
    """The finished trial of ``study_name`` with the best validation accuracy, and the counts."""
    runs = query.find_runs(cl, exp_id, raystudy__role="trial", raystudy__search=study_name)
    status = [r.data.tags.get(tracking.STATUS) for r in runs]
    finished = [r for r, s in zip(runs, status) if s == "finished" and "best_val_acc" in r.data.metrics]
    out = {
        "study": study_name,
        "trials": len(runs),
        "stopped": status.count("stopped"),
        "finished": len(finished),
        "diverged": status.count("diverged"),
        "failed": status.count("failed"),
    }
    if finished:
        best = max(finished, key=lambda r: r.data.metrics["best_val_acc"])
        out.update(
            best_run=best.info.run_id,
            key=best.data.tags.get(tracking.KEY),
            val_acc=best.data.metrics["best_val_acc"],
            config=query.run_config(best.data.params),
        )
    return out


def found(storage, study_name: str, sampler: Sampler, chosen_key: str | None) -> dict[str, Any]:
    """How near a rehearsal study came to its landscape's known optimum: the true plateau
    (``rehearsal.landscape_score``) of the config the search chose (its run's key: ``chosen_key``),
    and the best true plateau among every trial it ran to the end, against the optimum's."""
    import optuna

    from raystudy.spaces import searches

    land = searches.landscape(sampler.space)
    told = optuna.load_study(study_name=study_name, storage=storage).get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
    )
    scores = {}
    for t in told:
        trial = reconcile.drawn(sampler, t)
        scores[trial["key"]] = rehearsal.landscape_score(land, trial["sampled"])
    return {
        "optimum": rehearsal.TOP,
        "chosen": scores.get(chosen_key, math.nan),
        "closest": max(scores.values(), default=math.nan),
        "told": len(told),
    }
