"""One Optuna study on Ray Tune: ``OptunaSearch`` (TPE, seeded, persisted in SQLite) proposes
configs, ASHA stops weak trials early, ``records.MlflowTrials`` records each trial once."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from raystudy.driver import backlog, tune_glue
from raystudy.spaces.searches import Sampler, SearchSpace
from raystudy.tracking import connect, query, record
from raystudy.tracking import tags as tracking
from raystudy.train import rehearsal
from raystudy.train.config import FinetuneConfig


def optuna_storage(folder: Path):
    """The Optuna storage of a search: ``optuna.db`` (SQLite) in ``folder``, created if missing."""
    import optuna

    folder.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")


def completed_trials(storage, study_name: str) -> int:
    """Trials of the persisted study that finished; stale RUNNING ones (a killed search) are failed."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    done = 0
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.RUNNING:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        elif t.state == optuna.trial.TrialState.COMPLETE:
            done += 1
    return done


def record_told(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path) -> int:
    """Record in MLflow (``mlflow``: client, experiment, parent run) the trials the persisted study
    holds COMPLETE whose runs never ended (a driver killed as Tune ended a trial: Optuna hears of
    the end before MLflow), from the results its trials reported to the ``ledger`` under ``folder``
    (``recovered.record_ended``); returns how many. Each is known by its key: its config drawn
    again by ``sampler`` from the trial's params."""
    import optuna

    from raystudy.driver import recovered

    cl, exp_id, parent = mlflow
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    told = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    keys = {drawn(sampler, t)["key"] for t in told}
    known = query.statuses(cl, exp_id)
    missing = {k for k in keys if known.get(k) not in (*tracking.TERMINAL, "failed")}
    if not missing:
        return 0
    tags = {"raystudy.search": study_name}
    return recovered.record_ended(cl, exp_id, parent, [ledger(folder, study_name)], missing, tags)


def tell_recorded(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path) -> int:
    """Tell the persisted study, COMPLETE, the trials it holds RUNNING whose runs MLflow holds
    ended (finished, stopped, diverged; ``mlflow``: client, experiment, parent run), each with the
    score of its last result in the ``ledger`` under ``folder``, as Ray's searcher would have told
    it; returns how many. The searcher hears of a trial's end before MLflow does, and Ray lets a
    tell that fails (a full disk) pass as a warning: the run is recorded, the study never heard.
    Left RUNNING, ``completed_trials`` would fail such a trial and the search run another."""
    import optuna

    from raystudy.driver import recovered

    cl, exp_id, _ = mlflow
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    running = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        try:
            running[drawn(sampler, t)["key"]] = t
        except (ValueError, KeyError, TypeError):  # its params cut short: failed as before
            continue
    if not running:
        return 0
    known = query.statuses(cl, exp_id)
    ended = {k for k in running if known.get(k) in tracking.TERMINAL}
    told = 0
    for key, (_, results) in recovered.reported(ledger(folder, study_name), ended).items():
        score = results[-1].get("score") if results else None
        if isinstance(score, (int, float)) and math.isfinite(score):
            storage.set_trial_state_values(running[key]._trial_id, optuna.trial.TrialState.COMPLETE, [float(score)])
            told += 1
    return told


def drawn(sampler: Sampler, trial) -> dict[str, Any]:
    """The raystudy trial (its ``key``, its ``sampled`` values, ...) that ``sampler`` draws again
    from a study trial's params: how a trial of the study is known in MLflow and the ledger."""
    import optuna

    return sampler(optuna.trial.FixedTrial(trial.params))["trial"]


def ledger(storage: Path, study_name: str) -> Path:
    """The folder of every result the study's trials reported (``records.ResultLedger``)."""
    return storage / "results" / study_name


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
    rehearse: float | None = None,
) -> dict[str, Any]:
    """One Optuna study (``label``: a condition, or ``components`` when the condition itself is
    searched); returns the best finished trial's config and score (``best_of``), and for a
    rehearsal (``rehearse``: seconds a trial) how near the known optimum it came (``found``).
    Raises ``tune_glue.Stopped`` if the user stopped it before its budget."""
    # a rehearsal's study is its own: it never resumes, or feeds its history to, the real one
    study_name = f"{space.study}-{model}-{dataset}-{label}" + (rehearsal.SUFFIX if rehearse else "")
    cl = connect.client(tracking_uri)
    ostore = optuna_storage(storage / "optuna")
    sampler = Sampler(space, condition, base, resources)
    done = _after_a_kill(ostore, study_name, sampler, (cl, exp_id, parent), storage, label)
    remaining = max(num_samples - done, 0)
    print(f"\n[{label}] Optuna study {study_name!r}: {done} trials done, {remaining} to run", flush=True)
    mlflow = (tracking_uri, exp_id, parent)
    asha = _asha(space, base)  # one for the session: its rungs go on from part to part
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    runs = parts(remaining, int(tuning["trials_per_run"]))
    for i, n in enumerate(runs):
        budget = None if deadline is None else deadline - time.monotonic()
        if budget is not None and budget <= 0:
            break
        searcher = make_searcher(space, condition, base, resources, ostore, study_name)
        name = f"{study_name}-{int(time.time())}" + (f"-part{i + 1}of{len(runs)}" if len(runs) > 1 else "")
        tuner = _tuner(
            searcher, asha, study_name, name, n, budget, storage, space, resources, tuning, verbose, mlflow, rehearse
        )
        close = _closer(cl, mlflow, study_name, label)
        if not tune_glue.fit(tuner, verbose, close):
            tell_recorded(ostore, study_name, sampler, (cl, exp_id, parent), storage)  # a tell Ray let fail
        elif completed_trials(ostore, study_name) < num_samples:
            raise tune_glue.Stopped(f"study {study_name!r} stopped before its budget")
    best = best_of(cl, exp_id, study_name)
    if rehearse and "config" in best:
        best["found"] = found(ostore, study_name, sampler, best["key"])
    return best


def _closer(cl, mlflow: tuple[str, str, str], study_name: str, label: str):
    """What ``tune_glue.fit`` calls once every trial of the session has ended, or the driver is
    going down: the writes held while the tracking server was away settled, and no run left RUNNING."""

    def close():
        tracking_uri, exp_id, parent = mlflow
        held = backlog.of(tracking_uri, exp_id, parent)
        held.settle(cl, wait=held.limit)  # what the trials reported while the server was away
        stale = record.close_stale(cl, exp_id, raystudy__search=study_name)
        if stale:
            print(f"[{label}] {stale} trial run(s) had no end from Tune; marked interrupted", flush=True)

    return close


def _after_a_kill(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path, label: str) -> int:
    """What a killed session of the study left, put right before it goes on: trials Optuna holds
    COMPLETE that MLflow never ended recorded (``record_told``), trials MLflow ended that Optuna
    never heard of told (``tell_recorded``), runs left RUNNING mid-trial closed (their configs are
    not sampled again); returns the trials done."""
    cl, exp_id, _ = mlflow
    told = record_told(storage, study_name, sampler, mlflow, folder)
    if told:
        print(f"[{label}] {told} trial(s) ended in Tune's files but not in MLflow: recorded from their results")
    heard = tell_recorded(storage, study_name, sampler, mlflow, folder)
    if heard:
        print(f"[{label}] {heard} trial(s) ended in MLflow but not in Optuna: told Optuna their last scores")
    record.close_stale(cl, exp_id, raystudy__search=study_name)
    return completed_trials(storage, study_name)


def parts(trials: int, size: int) -> list[int]:
    """The sizes of a session's Tune runs, in order: ``trials`` in runs of at most ``size``. Tune
    keeps every trial of a run in memory and rewrites them all into its experiment checkpoint as
    the run goes, so a search of thousands runs as Tune runs of this many, as a grid does (its
    space's ``tune.trials_per_run``); each run's searcher reads the study's whole history."""
    return [min(size, trials - i) for i in range(0, trials, size)]


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
    verbose: int,
    mlflow: tuple[str, str, str],
    rehearse: float | None = None,
):
    """The Tuner of one Tune run of a study's session (Tune's folder ``name``): ``num_samples``
    trials from ``searcher`` under ``asha``; a rehearsal's trials are ``train.rehearsal``'s, on
    one CPU, scored on the space's landscape."""
    from ray import tune

    from raystudy.driver import checkpoints, records

    kept, pruner = checkpoints.keep_checkpoints()
    trainable, fixed, run_tags = _trainable(space, study_name, storage, resources, tuning, rehearse)
    return tune.Tuner(
        trainable,
        param_space=fixed,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=asha,
            num_samples=num_samples,
            time_budget_s=time_budget_s,
            reuse_actors=True,
            max_concurrent_trials=tuning["max_concurrent"],
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            verbose=verbose,
            # the ledger first: a result is on storage before the searcher or MLflow hear of it
            callbacks=[
                records.ResultLedger(ledger(storage, study_name)),
                records.MlflowTrials(*mlflow, run_tags),
                pruner,
            ],
            failure_config=tune.FailureConfig(max_failures=int(tuning["max_failures"])),
            checkpoint_config=kept,
        ),
    )


def _trainable(
    space: SearchSpace,
    study_name: str,
    storage: Path,
    resources: dict[str, Any],
    tuning: dict[str, Any],
    rehearse: float | None,
):
    """What Tune runs for each trial of the study, the config every trial shares and the tags of
    its runs: ``run_trial``, or a rehearsal's trial (one CPU, scored on the space's landscape)."""
    from ray import tune

    from raystudy.spaces import searches
    from raystudy.train.trial import run_trial

    fixed = {
        "storage_path": str(storage),
        "threads": int(tuning["threads_per_trial"]),
        "checkpoint_every_s": float(tuning["checkpoint_every_s"]),
    }
    run_tags = {"raystudy.search": study_name}
    if not rehearse:
        return tune.with_resources(run_trial, {"cpu": resources["cpu"], "gpu": resources["gpu"]}), fixed, run_tags
    fixed.update(rehearse_s=rehearse, rehearse_landscape=searches.landscape(space))
    run_tags[tracking.REHEARSAL] = "1"
    return rehearsal.tune_trainable(), fixed, run_tags


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
        trial = drawn(sampler, t)
        scores[trial["key"]] = rehearsal.landscape_score(land, trial["sampled"])
    return {
        "optimum": rehearsal.TOP,
        "chosen": scores.get(chosen_key, math.nan),
        "closest": max(scores.values(), default=math.nan),
        "told": len(told),
    }
