"""What a killed driver left, put right before a study goes on: one home for every path.

- Trials that ended on storage but not in MLflow (a store restored to an older snapshot, or a
  driver killed as Tune ended a trial): their runs written from the results on storage
  (``driver.ledger``), once, so they are never trained again (``record_finished``,
  ``record_ended``; a grid's ``grid_after_a_kill``).
- Under an adaptive policy, the trials it stops that MLflow does not hold (``record_stopped``,
  deciding as the live scheduler does), and those that finished before its decision came
  (``stop_late``).
- A search's Optuna study and MLflow caught up with each other (``study_after_a_kill``): what
  Optuna holds COMPLETE recorded in MLflow, what MLflow ended told to Optuna, runs left RUNNING
  closed.
- After each Tune run, whatever way it ended: no run left RUNNING (``close_run``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from raystudy.driver import backlog, ledger, scheduler
from raystudy.spaces import adaptive
from raystudy.spaces.grids import Trial
from raystudy.spaces.searches import Sampler
from raystudy.tracking import query, record, tags


def record_finished(cl, exp_id: str, parent_id: str, path, keys: set[str], made: dict[str, str] | None = None) -> int:
    """Record in MLflow each trial of ``keys`` whose final result is in the Tune folder ``path``
    (a local path or a storage URI); returns how many; ``made``: tags on a run made anew. A folder
    that cannot be read records none."""
    found = 0
    for t, results in ledger.finished(path, keys):
        _write(cl, exp_id, parent_id, t, results, made)
        found += 1
    return found


def record_ended(cl, exp_id: str, parent_id: str, paths, keys: set[str], made: dict[str, str] | None = None) -> int:
    """Record in MLflow each trial of ``keys`` as its results in the Tune folders ``paths`` end:
    ``finished`` on a final result, else ``stopped`` at its last step. For trials Tune is known to
    have ended (a searcher holds them done: an early-stopping scheduler stopped those without a
    final result); ``made``: tags on a run made anew. Returns how many; a trial with no result, none."""
    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for path in paths:
        for key, got in ledger.reported(path, keys).items():
            if key not in found or (ledger.final(got[1]) and not ledger.final(found[key][1])):
                found[key] = got
    ended = [(t, results) for t, results in found.values() if results]
    for t, results in ended:
        _write(cl, exp_id, parent_id, t, results, made)
    return len(ended)


def record_stopped(
    cl, exp_id: str, parent_id: str, paths, keys: set[str], policy, trials: list, made: dict[str, str] | None = None
) -> int:
    """Record ``stopped`` each trial of ``keys`` (none done in MLflow) that the adaptive ``policy``
    stops, deciding on what MLflow holds of the grid's ``trials`` and what those of ``keys``
    reported to the Tune folders ``paths``, as the live scheduler did (or would, on the trial's next
    result). Its run gets the steps it reported and ends stopped at the last (0: it never
    started), as the live driver records it; returns how many; ``made``: tags on a run made anew."""
    found: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for path in paths:
        found.update(ledger.reported(path, keys))  # a key is in one part's folder
    seen = scheduler.recorded_view(cl, exp_id, trials)
    for key, (_, results) in found.items():
        s = adaptive.Seen()
        for r in results:
            s = scheduler.observed(s, r)
        seen[key] = s
    decisions = adaptive.decide(policy, [adaptive.trial_of(t.key, t.config) for t in trials], seen)
    n = 0
    for t in trials:
        if t.key in keys and t.key in decisions:
            config, results = found.get(t.key, (t.as_dict(), []))
            _write(cl, exp_id, parent_id, config, results, made)
            n += 1
    return n


def _write(
    cl, exp_id: str, parent_id: str, t: dict[str, Any], results: list[dict[str, Any]], made: dict | None = None
) -> None:
    """The trial's run (the existing one of its key, else a new one, with the tags ``made``): its curves,
    its final results, ended; results that end without a final one (stopped by the policy or a
    scheduler) end it ``stopped``."""
    _, run = query.trial_status(cl, exp_id, t["key"])
    if run is None:
        extra = {"raystudy.recovered": "1", **(made or {})}
        run_id = record.open_trial(cl, exp_id, parent_id, t["key"], t["finetune"], extra, name=t.get("name"))
    else:
        run_id = run.info.run_id
        cl.set_tag(run_id, "raystudy.recovered", "1")
    rec = record.TrialRecord(cl, run_id)  # as the live driver records it, a stopped trial included
    rec.log(results)
    rec.end(results[-1] if results else {})


def grid_after_a_kill(
    trials: list, runs: list[tuple[str, list]], storage, policy, made: dict[str, str], cl, exp_id: str, parent_id: str
) -> set[str]:
    """The keys of ``trials`` MLflow holds as done, once it has recorded those that finished on
    storage only (a store restored to an older snapshot), and under an adaptive ``policy`` those it
    stops. ``runs``: the grid's Tune runs (Tune's folder name under ``storage``, its trials), each
    folder read for its own trials alone; ``made``: tags on runs made from storage."""
    from raystudy.driver import tune_state

    known = query.statuses(cl, exp_id)
    missing_in = {}  # Tune's folder of a part -> the keys of its trials MLflow does not hold done
    for name, part in runs:
        missing = {t.key for t in part if known.get(t.key) not in tags.TERMINAL}
        if missing:
            missing_in[tune_state.folder(storage, name)] = missing
    found = 0
    for path, missing in missing_in.items():
        n = record_finished(cl, exp_id, parent_id, path, missing, made)
        if n:
            print(f"{n} trial(s) finished in {path} but missing from MLflow: recorded from their results", flush=True)
        found += n
    if found:
        known = query.statuses(cl, exp_id)
    missing = {k for keys in missing_in.values() for k in keys if known.get(k) not in tags.TERMINAL}
    if missing and policy is not None:
        paths = list(missing_in)
        stopped = record_stopped(cl, exp_id, parent_id, paths, missing, policy, trials, made)
        if stopped:
            known = query.statuses(cl, exp_id)
            where = paths[0] if len(paths) == 1 else f"{len(paths)} Tune folders under {storage}"
            print(
                f"{stopped} trial(s) the policy stopped, missing from MLflow: recorded stopped from {where}", flush=True
            )
    return {t.key for t in trials if known.get(t.key) in tags.TERMINAL}


def stop_late(cl, exp_id: str, trials: list[Trial], policy: adaptive.Policy) -> int:
    """Runs the policy stops that finished before its decision came (their rung completed after
    they ended): recorded ``stopped`` too, so the analysis sees what the policy decided. Returns how many."""
    decisions = adaptive.decide(
        policy, [adaptive.trial_of(t.key, t.config) for t in trials], scheduler.recorded_view(cl, exp_id, trials)
    )
    n = 0
    for key, stop in decisions.items():
        status, run = query.trial_status(cl, exp_id, key)
        if status == "finished":
            record.mark_stopped_late(cl, run.info.run_id, stop.step, stop.rule)
            n += 1
    return n


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


def catch_up_mlflow(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path) -> int:
    """Record in MLflow (``mlflow``: client, experiment, parent run) the trials the persisted study
    holds COMPLETE whose runs never ended (a driver killed as Tune ended a trial: Optuna hears of
    the end before MLflow), from the results its trials reported to the ``ledger`` under ``folder``
    (``record_ended``); returns how many. Each is known by its key: its config drawn
    again by ``sampler`` from the trial's params."""
    import optuna

    cl, exp_id, parent = mlflow
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    told = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    keys = {drawn(sampler, t)["key"] for t in told}
    known = query.statuses(cl, exp_id)
    missing = {k for k in keys if known.get(k) not in (*tags.TERMINAL, "failed")}
    if not missing:
        return 0
    made = {"raystudy.search": study_name}
    return record_ended(cl, exp_id, parent, [ledger.of_study(folder, study_name)], missing, made)


def catch_up_optuna(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path) -> int:
    """Tell the persisted study, COMPLETE, the trials it holds RUNNING whose runs MLflow holds
    ended (finished, stopped, diverged; ``mlflow``: client, experiment, parent run), each with the
    score of its last result in the ``ledger`` under ``folder``, as Ray's searcher would have told
    it; returns how many. The searcher hears of a trial's end before MLflow does, and Ray lets a
    tell that fails (a full disk) pass as a warning: the run is recorded, the study never heard.
    Left RUNNING, ``completed_trials`` would fail such a trial and the search run another."""
    import optuna

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
    ended = {k for k in running if known.get(k) in tags.TERMINAL}
    told = 0
    for key, (_, results) in ledger.reported(ledger.of_study(folder, study_name), ended).items():
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


def study_after_a_kill(storage, study_name: str, sampler: Sampler, mlflow: tuple, folder: Path, label: str) -> int:
    """What a killed session of the study left, put right before it goes on: trials Optuna holds
    COMPLETE that MLflow never ended recorded (``catch_up_mlflow``), trials MLflow ended that Optuna
    never heard of told (``catch_up_optuna``), runs left RUNNING mid-trial closed (their configs are
    not sampled again); returns the trials done."""
    cl, exp_id, _ = mlflow
    told = catch_up_mlflow(storage, study_name, sampler, mlflow, folder)
    if told:
        print(f"[{label}] {told} trial(s) ended in Tune's files but not in MLflow: recorded from their results")
    heard = catch_up_optuna(storage, study_name, sampler, mlflow, folder)
    if heard:
        print(f"[{label}] {heard} trial(s) ended in MLflow but not in Optuna: told Optuna their last scores")
    record.close_stale(cl, exp_id, raystudy__search=study_name)
    return completed_trials(storage, study_name)


def close_run(cl, tracking_uri: str, exp_id: str, parent_id: str, **where) -> int:
    """What ``tuner.fit`` does once every trial of a Tune run has ended, or the driver is going
    down: the writes held while the tracking server was away settled, then the runs ``where``
    selects (``query.find_runs``'s filters) that are still RUNNING closed; returns how many."""
    held = backlog.of(tracking_uri, exp_id, parent_id)
    held.settle(cl, wait=held.limit)  # what the trials reported while the server was away
    return record.close_stale(cl, exp_id, **where)
