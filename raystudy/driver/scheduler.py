"""Tune's schedulers as the driver runs them: study-level early stopping (``raystudy.spaces.adaptive``'s
policy decides, Tune stops), and the trial to start chosen so that a trial's process is reused
(``newest_pending``)."""

from __future__ import annotations

from ray.tune.experiment import Trial as TuneTrial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from raystudy.spaces import adaptive
from raystudy.spaces.grids import Trial
from raystudy.tracking import connect, query, tags, views


def newest_pending(tune_controller) -> TuneTrial | None:
    """The pending trial Tune added last, for Tune to start next; None where none is pending.

    Tune gives an ended trial's actor (its worker process) to the trial the scheduler chooses.
    Under a cap on concurrent trials, Tune's own choice, the oldest pending trial, is one whose
    actor is already starting: Tune kills that actor for the reused one, then starts another for
    the trial the freed slot brought, so nearly every trial costs a new worker process. The
    newest pending trial is the one the freed slot brought, with no actor yet."""
    for trial in reversed(tune_controller.get_trials()):
        if trial.status == TuneTrial.PENDING:
            return trial
    return None


class NewestFirst(FIFOScheduler):
    """Tune's FIFO scheduler, the newest pending trial started first (``newest_pending``): a grid's
    under a cap on concurrent trials."""

    def choose_trial_to_run(self, tune_controller):
        """The newest pending trial, else the oldest paused one."""
        return newest_pending(tune_controller) or super().choose_trial_to_run(tune_controller)


class NewestFirstASHA(ASHAScheduler):
    """ASHA, the newest pending trial started first (``newest_pending``): a search's."""

    def choose_trial_to_run(self, tune_controller):
        """The newest pending trial, else the oldest paused one."""
        return newest_pending(tune_controller) or super().choose_trial_to_run(tune_controller)


def recorded_view(cl, exp_id: str, trials: list[Trial]) -> dict[str, adaptive.Seen]:
    """What MLflow holds of ``trials``, as the policy sees it (a resumed driver starts from it)."""
    keys = {t.key for t in trials}
    seen = {}
    for run in query.find_runs(cl, exp_id, raystudy__role="trial"):
        key, status = run.data.tags.get(tags.KEY), run.data.tags.get(tags.STATUS)
        if key in keys and (key not in seen or status in tags.TERMINAL):
            seen[key] = views.policy_view(cl, run)
    return seen


def observed(s: adaptive.Seen, result: dict) -> adaptive.Seen:
    """What the policy has seen of a trial, ``s``, once the trial reports ``result``: its validation
    point, whether it ended (a final result), its best validation accuracy if it finished."""
    points = s.points
    if "val_acc" in result and not result.get("final"):
        points = tuple(p for p in points if p[0] != int(result["step"])) + (
            (int(result["step"]), float(result["val_acc"])),
        )
    ended = s.ended or bool(result.get("final"))
    best = (
        float(result.get("best_val_acc", float("nan")))
        if result.get("final") and result.get("status", "finished") == "finished"
        else s.best
    )
    return adaptive.Seen(tuple(sorted(points)), ended, best)


def seed_major(trials: list[Trial]):
    """A sort key for ``trials``: a trial's seed's index in its cell, then its cell and lr;
    earlier seeds first, so decisions on them come before later seeds start."""
    seeds: dict[tuple, list] = {}
    for t in trials:
        seeds.setdefault(tuple(t.config[c] for c in adaptive.CELL), []).append(t.config["seed"])

    def key(t: Trial):
        """(seed index, cell, lr) of ``t``."""
        cell = tuple(t.config[c] for c in adaptive.CELL)
        return (sorted(set(seeds[cell])).index(t.config["seed"]), *map(str, cell), t.config["lr"])

    return key


class AdaptiveScheduler(FIFOScheduler):
    """Tune's side of ``raystudy.spaces.adaptive``: on every result, the policy over everything seen of
    the grid; a running trial it stops ends there, a pending one it stops never starts.

    What it has seen lives in MLflow too (the driver logs every evaluation), so a restored
    driver rebuilds it from there instead of from Tune's pickle.
    """

    def __init__(
        self,
        policy: adaptive.Policy,
        trials: list[Trial],
        tracking_uri: str,
        experiment_id: str,
        newest_first: bool = False,
    ):
        super().__init__()
        self.policy, self.tracking_uri, self.experiment_id = policy, tracking_uri, experiment_id
        self.newest_first = newest_first  # under a cap on concurrent trials (``newest_pending``)
        self.trials = [adaptive.trial_of(t.key, t.config) for t in trials]
        self._grid = trials
        self._seen: dict[str, adaptive.Seen] | None = None
        self.decisions: dict[str, adaptive.Stop] = {}

    def __getstate__(self):
        return {**self.__dict__, "_seen": None}

    @property
    def seen(self) -> dict[str, adaptive.Seen]:
        """What the policy has seen of each trial key, read from MLflow on first use."""
        if self._seen is None:
            self._seen = recorded_view(connect.client(self.tracking_uri), self.experiment_id, self._grid)
        return self._seen

    def _observe(self, key: str, result: dict) -> None:
        self.seen[key] = observed(self.seen.get(key, adaptive.Seen()), result)
        self.decisions = adaptive.decide(self.policy, self.trials, self.seen)

    def on_trial_result(self, tune_controller, trial, result):
        """STOP for a running trial the policy has decided to stop, else CONTINUE."""
        key = trial.config["trial"]["key"]
        self._observe(key, result)
        return TrialScheduler.STOP if key in self.decisions and not result.get("final") else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result):
        """A trial's end, seen by the policy."""
        if result:
            self._observe(trial.config["trial"]["key"], result)

    def on_trial_error(self, tune_controller, trial):
        """Failed for good: it has ended, so decisions waiting for it (the seed rule) can come.
        Tune calls this for a retried failure too, after marking the trial ERROR: not an end."""
        if trial.status != TuneTrial.ERROR:
            self._observe(trial.config["trial"]["key"], {"final": 1, "status": "failed"})

    def choose_trial_to_run(self, tune_controller):
        """Tune's next trial to start; pending trials the policy has stopped never start."""
        for trial in list(tune_controller.get_trials()):
            if trial.status == TuneTrial.PENDING and trial.config["trial"]["key"] in self.decisions:
                tune_controller.stop_trial(trial)  # recorded stopped at step 0; never started
        # a Tune state pickled before ``newest_first`` existed restores without it
        newest = newest_pending(tune_controller) if getattr(self, "newest_first", False) else None
        return newest or super().choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        """Tune's status line for the scheduler."""
        return f"raystudy.spaces.adaptive policy {self.policy.name}: {len(self.decisions)} trials stopped"
