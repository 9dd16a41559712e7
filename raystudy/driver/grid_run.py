"""A list of trials (a grid, or a search's test re-evaluation) run on Ray exactly once each,
resuming an interrupted run of the same trials; MLflow knows which are done."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from raystudy.driver import (
    console,
    mlflow_trials,
    placement,
    reconcile,
    scheduler,
    session,
    shared,
    study_loop,
    tune_state,
    tuner,
)
from raystudy.driver.lock import grid_lock, grid_name
from raystudy.spaces import adaptive, schema
from raystudy.spaces.grids import Trial, grid_key
from raystudy.tracking import query, record, tags

ENDS = ("finished", "diverged", "failed", "stopped")
# Trials of one Tune run, unless the space's ``tune.trials_per_run`` says otherwise: Tune keeps
# every trial it has run in memory and writes them all into each experiment checkpoint (a JSON it
# rewrites as the run goes and reads back whole on a resume), so a grid of thousands runs as Tune
# runs of this many, one after another.
TRIALS_PER_RUN = schema.TUNE["trials_per_run"].default


@dataclass(frozen=True)
class Settings:
    """How ``run_grid`` drives a grid: its arguments past the trials, built once."""

    model: str
    tracking_uri: str
    storage: Path
    max_failures: int
    max_concurrent: int | None
    threads: int
    checkpoint_every_s: float = 0.0
    verbose: int = 0
    quiet: bool = False
    policy: adaptive.Policy | None = None
    rehearse: float | None = None
    trials_per_run: int = TRIALS_PER_RUN


def run_grid(trials: list[Trial], *, label: str, experiment: str, role: str = "grid", **settings) -> dict[str, Any]:
    """Run ``trials`` on the connected Ray, driven as ``settings`` (the fields of ``Settings``) say;
    returns counts. Resumes an interrupted run of the same grid.

    ``label`` names the parent run (``<role>-<label>``) and Tune's experiment folder. Raises
    ``GridBusy`` if another driver runs the same grid, ``interrupt.Stopped`` if the user stopped
    it. One line per trial that ends (``console.ConsoleTrials``; ``quiet``: only those that did
    not finish); ``verbose`` > 0 brings back Tune's own tables and its result files (JSON, CSV,
    TensorBoard). ``policy`` (``raystudy.spaces.adaptive``) stops trials the study does not need
    (``scheduler.AdaptiveScheduler``); they are recorded ``stopped``. ``rehearse``: seconds of
    each trial of a dress rehearsal (``train.rehearsal``), whose trials report synthetic numbers
    on the real schedule; its runs are tagged as a rehearsal's. A grid of more than
    ``trials_per_run`` trials runs as Tune runs of that many, one after another (``parts``).
    """
    s = Settings(**settings)
    preflight(trials, s)
    with grid_lock(s.storage, grid_name(trials, label)):
        cl, exp_id = session.experiment(s.tracking_uri, experiment)
        with session.parent_run(
            cl,
            exp_id,
            grid_key(trials),
            f"{role}-{label}",
            {
                "label": label,
                "model": s.model,
                "trials": len(trials),
                **record.grid_data_params([t.config for t in trials]),
            },
            role,
        ) as parent:
            counts = _drive(trials, label, s, cl, exp_id, parent)
    counts.update(experiment_id=exp_id, parent_run_id=parent.run_id)
    return counts


def preflight(trials: list[Trial], s: Settings) -> None:
    """Before anything runs or is recorded: raises ``ConfigError`` (one line) where a trial cannot
    be placed on the connected Ray's nodes (``placement``), or where the storage, a local path, is
    not the same folder on every node that may run a trial (``shared``)."""
    shared.preflight(s.storage, [placement.of_trial(t.as_dict(), rehearse=bool(s.rehearse)) for t in trials])


def _drive(trials: list[Trial], label: str, s: Settings, cl, exp_id: str, parent) -> dict[str, Any]:
    """Run the trials MLflow does not hold as done (``study_loop``), count how all of them ended,
    tag the parent."""
    grid = GridTrials(trials, label, s, cl, exp_id, parent.run_id)
    left = study_loop.run(grid, s.verbose)
    parent.status = "incomplete" if left else "finished"
    return grid.counts


class GridTrials:
    """A grid's expansion as a study's source (``study_loop.Source``): the Tune runs of its
    ``parts``, each over its trials that MLflow does not hold done, recorded under the parent run
    ``parent_id``; ``counts`` says how the trials ended."""

    def __init__(self, trials: list[Trial], label: str, s: Settings, cl, exp_id: str, parent_id: str):
        self.trials, self.s, self.cl, self.exp_id, self.parent_id = trials, s, cl, exp_id, parent_id
        self.name = grid_name(trials, label)
        self.runs = parts(trials, self.name, s.trials_per_run, s.policy is not None)
        self.counts: dict[str, Any] = {"trials": len(trials), "already_done": 0, "interrupted": 0}
        self.done: set[str] = set()
        self.lines: console.ConsoleTrials | None = None

    def after_a_kill(self) -> None:
        """Trials finished on storage but not in MLflow recorded, and those the policy stops; the
        console numbered on from what is done."""
        made = tags.of_rehearsal(self.s.rehearse)
        self.done = reconcile.grid_after_a_kill(
            self.trials, self.runs, self.s.storage, self.s.policy, made, self.cl, self.exp_id, self.parent_id
        )
        self.counts["already_done"] = len(self.done)
        shown = console.varying(t.config for t in self.trials)
        self.lines = console.ConsoleTrials(len(self.trials), self.done, shown, quiet=self.s.quiet)

    def tune_runs(self):
        """A Tune run a part, over its trials MLflow does not hold done: the interrupted run restored, or a new one."""
        for name, part in self.runs:  # a part whose trials MLflow holds done needs no Tune run
            pending = [t for t in part if t.key not in self.done]
            if pending:
                yield _tuner(self.trials, part, pending, name, self.lines, self.s, self.exp_id, self.parent_id)

    def close(self) -> None:
        """Tune has ended every trial (or the driver is going down): no run stays RUNNING."""
        where = {"mlflow__parentRunId": self.parent_id}
        self.counts["interrupted"] += reconcile.close_run(
            self.cl, self.s.tracking_uri, self.exp_id, self.parent_id, **where
        )

    def after_run(self) -> None:
        """Nothing: a grid's trials are known before it runs."""
        pass

    def unfinished(self) -> int:
        """How every trial of the grid ended (``counts``), after the policy's late stops; the trials with no end."""
        counts, trials = self.counts, self.trials
        if self.s.policy is not None:
            late = reconcile.stop_late(self.cl, self.exp_id, trials, self.s.policy)
            if late:
                print(f"{late} trial(s) ended before the policy's decision to stop them; recorded stopped", flush=True)
        known = query.statuses(self.cl, self.exp_id)
        statuses = [known.get(t.key) for t in trials]
        for end in ENDS:
            counts[end] = statuses.count(end)
        counts["unfinished"] = len(trials) - sum(counts[end] for end in ENDS)
        if counts["interrupted"] and not counts["unfinished"]:  # Tune ended them, yet MLflow had no end
            print(f"{counts['interrupted']} trial run(s) had no end from Tune; marked interrupted", flush=True)
        return counts["unfinished"]


def parts(trials: list[Trial], name: str, size: int, seed_major: bool = False) -> list[tuple[str, list[Trial]]]:
    """The grid's Tune runs, in the order they run (``tuner.runs``): (Tune's folder name, its
    trials). The split is over the whole grid, whatever is done, so that the same grid splits the
    same way on every rerun and each part's Tune state is found again. ``seed_major`` (an adaptive
    policy): earlier seeds first, so that the policy decides on them before later seeds start."""
    ordered = sorted(trials, key=scheduler.seed_major(trials)) if seed_major else list(trials)
    return tuner.runs(ordered, name, size)


def _tuner(
    trials: list[Trial],
    part: list[Trial],
    pending: list[Trial],
    name: str,
    lines: console.ConsoleTrials,
    s: Settings,
    exp_id: str,
    parent_id: str,
):
    """The Tuner of the ``pending`` trials of a ``part`` of ``trials`` in Tune's folder ``name``:
    the interrupted run's, restored, or a new one over a grid search of them; ``lines``, the
    grid's console, goes on counting."""

    def resumed(restored):
        print(
            f"resuming {tune_state.folder(s.storage, name)}: {len(pending)} of {len(part)} trials unfinished",
            flush=True,
        )
        tuner.set_console(restored, lines, s.verbose)
        _record_here(restored, s.tracking_uri, exp_id, parent_id)

    def new_in(folder: str):
        # under a cap, the newest pending trial starts first, on an ended trial's process
        capped = s.max_concurrent is not None
        policy = scheduler.NewestFirst() if capped else None
        if s.policy is not None:  # ``parts`` put earlier seeds first, which ``pending`` keeps
            policy = scheduler.AdaptiveScheduler(s.policy, trials, s.tracking_uri, exp_id, newest_first=capped)
        common = tuner.shared_config(s.storage, s.threads, s.checkpoint_every_s, s.rehearse)
        return tuner.new(
            trainable,
            name=folder,
            storage=s.storage,
            param_space={**common, "trial": tune.grid_search([t.as_dict() for t in pending])},
            recorders=[
                mlflow_trials.MlflowTrials(s.tracking_uri, exp_id, parent_id, tags.of_rehearsal(s.rehearse)),
                lines,
            ],
            max_failures=s.max_failures,
            verbose=s.verbose,
            max_concurrent_trials=s.max_concurrent,
            scheduler=policy,
            trial_name_creator=tuner.trial_name,
            trial_dirname_creator=tuner.trial_name,
        )

    trainable = tuner.trainable(s.rehearse, _resources)
    left = f"{len(pending)} unfinished trials"
    return tuner.restored_or_new(s.storage, name, trainable, s.verbose, new_in, resumed, left)


def _record_here(restored, uri: str, exp_id: str, parent_id: str) -> None:
    """A restored Tuner's recording callback writes where this session records: the tracking
    server's address may have changed since (a SLURM job's server is on whichever node it got)."""
    for cb in restored._local_tuner.get_run_config().callbacks or []:
        if isinstance(cb, mlflow_trials.MlflowTrials):
            cb.tracking_uri, cb.experiment_id, cb.parent_id = uri, exp_id, parent_id


def _resources(config):
    """A trial's Ray resources; a multi-worker trial only drives its TorchTrainer, whose workers hold the devices."""
    # A multi-worker trial's own process takes no CPU: even 0.01 left a node whose CPUs equal a
    # worker's one short (two 1-CPU hosts never held 2 x 1-CPU workers), and a head kept free of
    # trials can run it.
    return tune.PlacementGroupFactory([placement.of_trial(config["trial"]).own])


def concurrency(cap: int | None, workers: int, gpu: float) -> int | None:
    """The cap on concurrent trials: ``cap`` if given; for multi-worker trials (nested
    TorchTrainers), one per free set of devices in the connected Ray; else None (by resources)."""
    if cap is not None or workers <= 1:
        return cap
    import ray

    total = ray.cluster_resources().get("GPU" if gpu else "CPU", 0)
    # An autoscaling cluster may have no GPU node yet: then its max_workers is the cap.
    return max(1, int(total // max(1, workers))) if total else None
