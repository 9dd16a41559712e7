"""One Optuna study on Ray Tune: ``OptunaSearch`` (TPE, seeded, persisted in SQLite) proposes
configs, ASHA stops weak trials early, ``mlflow_trials.MlflowTrials`` records each trial once."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from raystudy.driver import console, interrupt, reconcile, study_loop, tuner
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


def search(study: OptunaTrials) -> dict[str, Any]:
    """Run one Optuna study (``OptunaTrials``) by the study loop (``study_loop``); returns the best
    finished trial's config and score (``best_of``), and for a rehearsal how near the known
    optimum it came (``found``). Raises ``interrupt.Stopped`` where a Tune run was stopped, or
    Tune left trials without an end, before the budget was spent."""
    if study_loop.run(study, study.verbose):
        raise interrupt.Stopped(f"{study.name}: trials Tune left without an end")
    best = best_of(study.cl, study.mlflow[1], study.name)
    if study.rehearse and "config" in best:
        best["found"] = found(study.ostore, study.name, study.sampler, best["key"])
    return best


class OptunaTrials:
    """An Optuna study as a study's source (``study_loop.Source``): its trials drawn by Ray's
    ``OptunaSearch`` (``make_searcher``), stopped early by ASHA, in Tune runs of
    ``tune.trials_per_run`` until ``budget`` (trials, seconds or None) is spent; recorded under
    the parent run of ``mlflow`` (tracking URI, experiment id, parent run id). ``label``: a
    condition, or ``components`` when the condition itself is searched. One line per trial that
    ends, as a grid's (``console.ConsoleTrials``); ``output``: Tune's verbosity (> 0: its own
    tables) and ``quiet`` (only the trials that did not finish, ASHA's stops among them). A
    rehearsal's (``rehearse``: seconds a trial) study is its own."""

    def __init__(
        self,
        space: SearchSpace,
        label: str,
        condition: str | None,
        *,
        model: str,
        dataset: str,
        base: dict[str, Any],
        mlflow: tuple[str, str, str],
        storage: Path,
        budget: tuple[int, float | None],
        resources: dict[str, Any],
        tuning: dict[str, Any],
        output: tuple[int, bool],
        rehearse: float | None = None,
    ):
        self.space, self.label, self.condition, self.base = space, label, condition, base
        self.mlflow, self.storage, self.resources, self.tuning = mlflow, storage, resources, tuning
        (self.num_samples, self.time_budget_s), (self.verbose, self.quiet) = budget, output
        self.rehearse = rehearse
        # a rehearsal's study is its own: it never resumes, or feeds its history to, the real one
        self.name = f"{space.study}-{model}-{dataset}-{label}" + (rehearsal.SUFFIX if rehearse else "")
        self.cl = connect.client(mlflow[0])
        self.ostore = optuna_storage(storage / "optuna")
        self.sampler = Sampler(space, condition, base, resources)
        self.asha = _asha(space, base)  # one for the session: its rungs go on from part to part
        self.remaining, self.ended_before, self.deadline = self.num_samples, 0, None
        self.lines: console.ConsoleTrials | None = None

    def _recorded(self) -> tuple:
        return self.cl, self.mlflow[1], self.mlflow[2]

    def after_a_kill(self) -> None:
        """Optuna and MLflow caught up with each other (``reconcile.study_after_a_kill``); the
        budget left, the console and the time budget's deadline set."""
        # the trials done are Optuna's (what the budget counts), the console's count included
        done = reconcile.study_after_a_kill(
            self.ostore, self.name, self.sampler, self._recorded(), self.storage, self.label
        )
        self.remaining = max(self.num_samples - done, 0)
        print(f"\n[{self.label}] Optuna study {self.name!r}: {done} trials done, {self.remaining} to run", flush=True)
        self.lines = console.ConsoleTrials(self.num_samples, done, quiet=self.quiet, by_name=True, stopped_by="ASHA")
        self.ended_before = self._ended()
        self.deadline = None if self.time_budget_s is None else time.monotonic() + self.time_budget_s

    def _ended(self) -> int:
        """The study's trial runs MLflow holds ended, failed ones too."""
        runs = query.find_runs(self.cl, self.mlflow[1], raystudy__role="trial", raystudy__search=self.name)
        return sum(r.data.tags.get(tracking.STATUS) in (*tracking.TERMINAL, "failed") for r in runs)

    def _spent(self) -> bool:
        """Whether the time budget is spent: Tune cuts the trials it holds then, as their end."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def tune_runs(self):
        """Tune runs of ``tune.trials_per_run`` over the budget left, each with a searcher that
        reads the study's whole history; none once the time budget is spent."""
        session = f"{self.name}-{int(time.time())}"
        for name, part in tuner.runs(list(range(self.remaining)), session, int(self.tuning["trials_per_run"])):
            if not part or self._spent():
                return
            budget = None if self.deadline is None else self.deadline - time.monotonic()
            yield self._tuner(name, len(part), budget)

    def close(self) -> None:
        """The study's runs left RUNNING closed ``interrupted``, said in a line."""
        stale = reconcile.close_run(self.cl, *self.mlflow, raystudy__search=self.name)
        if stale:
            print(f"[{self.label}] {stale} trial run(s) had no end from Tune; marked interrupted", flush=True)

    def after_run(self) -> None:
        """Optuna told what MLflow ended and it never heard of (a tell Ray let fail: a full disk)."""
        reconcile.catch_up_optuna(self.ostore, self.name, self.sampler, self._recorded(), self.storage)

    def unfinished(self) -> int:
        """The budget left that has no end in MLflow; none once the time budget is spent (Tune cut what it held)."""
        if self._spent():
            return 0
        return max(self.remaining - (self._ended() - self.ended_before), 0)

    def _tuner(self, name: str, num_samples: int, time_budget_s: float | None):
        """The Tuner of one Tune run of the study's session (Tune's folder ``name``): ``num_samples``
        trials from a searcher over the study's whole history, under the session's ASHA; a
        rehearsal's trials are ``train.rehearsal``'s, on one CPU, scored on the space's landscape."""
        from raystudy.driver import ledger, mlflow_trials
        from raystudy.spaces import searches

        space, tuning, rehearse = self.space, self.tuning, self.rehearse
        searcher = make_searcher(space, self.condition, self.base, self.resources, self.ostore, self.name)
        extra = {"rehearse_landscape": searches.landscape(space)} if rehearse else {}
        shared = tuner.shared_config(
            self.storage, tuning["threads_per_trial"], tuning["checkpoint_every_s"], rehearse, **extra
        )
        return tuner.new(
            tuner.trainable(rehearse, {"cpu": self.resources["cpu"], "gpu": self.resources["gpu"]}),
            name=name,
            storage=self.storage,
            param_space=shared,
            # the ledger first: a result is on storage before the searcher or MLflow hear of it
            recorders=[
                ledger.ResultLedger(ledger.of_study(self.storage, self.name)),
                mlflow_trials.MlflowTrials(
                    *self.mlflow, {"raystudy.search": self.name, **tracking.of_rehearsal(rehearse)}
                ),
                self.lines,
            ],
            max_failures=tuning["max_failures"],
            verbose=self.verbose,
            search_alg=searcher,
            scheduler=self.asha,
            num_samples=num_samples,
            time_budget_s=time_budget_s,
            max_concurrent_trials=tuning["max_concurrent"] or self._at_once(),
        )

    def _at_once(self) -> int | None:
        """The cap on concurrent trials where the space sets none: the trials the cluster holds at
        once (``placement.at_once``), its autoscaler's nodes included; None (Tune's default) where
        it may add nodes whose resources are not known here. Without a cap, Tune starts a
        searcher's trials one at a time, each waiting for the last one's process."""
        from raystudy.driver import placement

        c = placement.cluster()
        shape = placement.shape(1, self.resources["cpu"], self.resources["gpu"], rehearse=bool(self.rehearse))
        return None if c.unknown else placement.at_once(shape, c) or None


def _asha(space: SearchSpace, base: dict[str, Any]):
    """ASHA over the study's trials: stops a trial whose score at a rung falls below the best
    1/reduction_factor of those recorded there; the newest pending trial starts first, on an
    ended trial's process (``scheduler.newest_pending``)."""
    from raystudy.driver import scheduler

    steps = int(base.get("steps", FinetuneConfig.steps))
    # max_t past the last step: a trial that reaches the end finishes itself (and is tested)
    return scheduler.NewestFirstASHA(
        time_attr="step",
        metric="score",
        mode="max",
        max_t=steps + 1,
        grace_period=min(space.grace_period, steps),
        reduction_factor=space.reduction_factor,
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
