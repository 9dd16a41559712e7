"""Study-level early stopping: which trials of a grid need not run to the end (or at all).

A policy is a pure function of what has been seen of the grid's trials. ``decide(policy, trials,
seen)`` returns the trials to stop and the step to stop them at; the live grid
(``raystudy.driver.scheduler``) calls it on every evaluation, the replay (``analysis.replaying``) once on a
finished grid's recorded curves: the same code, so the same data gives the same decisions.

Shapes (plain Python, no pandas: the live scheduler calls this on every result):

- ``trials``: one mapping per trial of the grid: ``key``, ``dataset``, ``condition``,
  ``optimizer``, ``lr``, ``seed``, ``steps``, ``eval_every``.
- ``seen``: trial key -> ``Seen``: the validation accuracies by step so far, whether the trial
  has ended (finished, diverged or failed), and its final best validation accuracy if it has one.
  A trial not yet started is absent.

Rules. A *cell* is (dataset, condition, optimizer); its lrs × seeds are its trials.

- ``halving``: successive halving over the lr axis of each cell, decided on the cell's first
  seed. At each milestone (a fraction of the steps, rounded up to an evaluation), once every lr
  still alive has reached it (or ended), the lrs are ranked by the best validation accuracy up
  to the milestone and the best ``max(keep_min, ceil(alive / eta))`` are kept. A dropped lr is
  dropped for every seed (paired comparisons): the first seed's trial stops at the milestone,
  the other seeds' trials are not started (step 0).
- ``race``: a cell's lrs race over its seeds, one seed after another, and an lr leaves the race
  only when it trails by more than noise can explain. Within a seed, at each milestone (once every
  lr still in the race has reached it), an lr whose best validation accuracy so far trails that
  seed's best by more than ``gap`` is out (a diverging or far too slow lr). After the first k of n
  seeds have ended for every lr in the race, an lr is out when its k-seed mean of best validation
  accuracy trails the leader's by more than ``swing * sqrt(n - k) / k``: to become the n-seed
  choice, the n - k seeds still to run would have to move its paired difference with the leader
  by more than one standard deviation (``swing``: the spread of one seed's paired difference). An
  lr out of the race is out for every seed (its trial at a milestone stops there, its later seeds
  never start, its earlier seeds' finished trials are stopped, out of the choice); the leader, and
  any lr it cannot yet tell apart from it, runs every seed, so whenever the race keeps the chosen
  lr the analysis sees exactly the full grid's numbers for it.

Decisions use only data up to the milestone they are taken at, and wait for the data they need:
a trial that runs past a milestone while its rung is incomplete does not change the decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raystudy.errors import ConfigError

CELL = ("dataset", "condition", "optimizer")


@dataclass(frozen=True)
class Policy:
    """An allocation policy: which rules, with which settings."""

    name: str
    halving: bool = False
    eta: int = 2  # keep 1/eta of the lrs at each milestone
    keep_min: int = 2  # lrs that always run to the end
    milestones: tuple[float, ...] = (0.25,)  # fractions of the trial's steps
    race: bool = False
    gap: float = 0.1  # race: val-acc points an lr may trail at a milestone
    swing: float = 0.01  # race: the spread of one seed's paired lr difference


POLICIES = {
    "identity": Policy("identity"),
    "halving": Policy("halving", halving=True),
    "race": Policy("race", race=True, milestones=(0.125, 0.25)),
}


@dataclass(frozen=True)
class Seen:
    """What has been seen of one trial: (step, validation accuracy) points, in step order."""

    points: tuple[tuple[int, float], ...] = ()
    ended: bool = False
    best: float = math.nan  # final best validation accuracy, when the trial reported one


@dataclass(frozen=True)
class Stop:
    """A decision: stop the trial at ``step`` (0: never start it), by ``rule``."""

    step: int
    rule: str


def policy(name: str, flag: str = "--adaptive") -> Policy:
    """The policy called ``name``; ConfigError naming the valid ones."""
    if name not in POLICIES:
        raise ConfigError(f"{flag} {name!r}: unknown policy; valid: {', '.join(POLICIES)}")
    return POLICIES[name]


def milestone_steps(p: Policy, steps: int, eval_every: int) -> list[int]:
    """The steps the milestones fall on: each fraction of ``steps`` rounded up to an evaluation,
    before the last step (a decision at the end saves nothing)."""
    out = []
    for f in p.milestones:
        m = min(steps, math.ceil(f * steps / eval_every) * eval_every)
        if 0 < m < steps and m not in out:
            out.append(m)
    return sorted(out)


def _score(s: Seen | None, upto: int | None = None) -> float:
    """Best validation accuracy seen (up to step ``upto``); -inf when there is none (a trial that
    diverged before its first evaluation loses every comparison)."""
    if s is None:
        return -math.inf
    vals = [v for step, v in s.points if (upto is None or step <= upto) and v == v]
    if upto is None and s.best == s.best:
        vals.append(s.best)
    return max(vals) if vals else -math.inf


def _reached(s: Seen | None, step: int) -> bool:
    return s is not None and (s.ended or any(st >= step for st, _ in s.points))


def _cells(trials: Sequence[Mapping]) -> dict[tuple, list[Mapping]]:
    cells: dict[tuple, list[Mapping]] = {}
    for t in trials:
        cells.setdefault(tuple(t[c] for c in CELL), []).append(t)
    return cells


def decide(p: Policy, trials: Sequence[Mapping], seen: Mapping[str, Seen]) -> dict[str, Stop]:
    """Trial key -> ``Stop`` for every trial the policy stops, given what has been ``seen``."""
    stops: dict[str, Stop] = {}
    for members in _cells(trials).values():
        if p.halving:
            stops.update(_halving(p, members, seen))
        if p.race:
            stops.update(_race(p, members, seen))
    return stops


def _halving(p: Policy, members: list[Mapping], seen: Mapping[str, Seen]) -> dict[str, Stop]:
    """The ``halving`` rule on one cell's trials (see the module docstring)."""
    lrs = sorted({t["lr"] for t in members})
    if len(lrs) <= p.keep_min:
        return {}
    judge = min(t["seed"] for t in members)
    first = {t["lr"]: t for t in members if t["seed"] == judge}
    steps = max(t["steps"] for t in first.values())
    every = min(t["eval_every"] for t in first.values())
    alive, out = [lr for lr in lrs if lr in first], {}
    for m in milestone_steps(p, steps, every):
        if len(alive) <= p.keep_min:
            break
        if not all(_reached(seen.get(first[lr]["key"]), m) for lr in alive):
            break  # the rung is incomplete: decide when it is
        score = {lr: _score(seen.get(first[lr]["key"]), m) for lr in alive}
        ranked = sorted(alive, key=lambda lr: (-score[lr], lr))
        kept = ranked[: max(p.keep_min, math.ceil(len(alive) / p.eta))]
        for t in members:
            if t["lr"] in alive and t["lr"] not in kept:
                out[t["key"]] = Stop(m if t["seed"] == judge else 0, f"halving@{m}")
        alive = kept
    return out


def _race(p: Policy, members: list[Mapping], seen: Mapping[str, Seen]) -> dict[str, Stop]:
    """The ``race`` rule on one cell's trials (see the module docstring)."""
    seeds = sorted({t["seed"] for t in members})
    alive = sorted({t["lr"] for t in members})
    if len(alive) < 2:
        return {}
    trial = {(t["lr"], t["seed"]): t for t in members}
    steps = max(t["steps"] for t in members)
    every = min(t["eval_every"] for t in members)
    out: dict[str, Stop] = {}

    def drop(lrs: list, k: int, step: int, rule: str) -> None:
        """``lrs`` leave the race during seed index ``k``: earlier seeds ran (out of the choice),
        seed k stops at ``step``, later seeds never start."""
        for t in members:
            if t["lr"] in lrs:
                i = seeds.index(t["seed"])
                out[t["key"]] = Stop(t["steps"] if i < k else step if i == k else 0, rule)

    def ran(lr, seed, upto=None):
        t = trial.get((lr, seed))
        return _score(seen.get(t["key"]), upto) if t else -math.inf

    for k, seed in enumerate(seeds):
        for m in milestone_steps(p, steps, every):
            if len(alive) < 2:
                break
            if not all(_reached(seen.get(trial[(lr, seed)]["key"]), m) for lr in alive if (lr, seed) in trial):
                return out  # the rung is incomplete: decide when it is
            score = {lr: ran(lr, seed, m) for lr in alive}
            lost = [lr for lr in alive if score[lr] < max(score.values()) - p.gap]
            drop(lost, k, m, f"race@{m}")
            alive = [lr for lr in alive if lr not in lost]
        if k == len(seeds) - 1 or len(alive) < 2:
            break
        if not all(seen.get(trial[(lr, seed)]["key"], Seen()).ended for lr in alive if (lr, seed) in trial):
            return out  # seed k still runs: the next seed waits for it
        mean = {lr: sum(ran(lr, s) for s in seeds[: k + 1]) / (k + 1) for lr in alive}
        bound = p.swing * math.sqrt(len(seeds) - k - 1) / (k + 1)
        lost = [lr for lr in alive if mean[lr] < max(mean.values()) - bound]
        drop(lost, k + 1, 0, f"race after {k + 1} seed{'s' if k else ''}")
        alive = [lr for lr in alive if lr not in lost]
    return out


def planned_steps(p: Policy, trials: Sequence[Mapping], settled: bool = False) -> dict[str, int]:
    """Steps each trial runs under ``p`` when no trial diverges, from the grid's shape alone:
    halving's cost is fixed by the lrs and milestones; the race's depends on the data, so
    ``settled`` says whether one lr per cell is left at the first milestone (the best case) or all
    stay in the race."""
    out = {t["key"]: t["steps"] for t in trials}
    for members in _cells(trials).values():
        seeds = sorted({t["seed"] for t in members})
        lrs = sorted({t["lr"] for t in members})
        if p.race and settled and len(lrs) > 1:
            ms = milestone_steps(p, max(t["steps"] for t in members), min(t["eval_every"] for t in members))
            for t in members:  # the smallest lr stays (which one is the data's; the cost is not)
                if t["lr"] != lrs[0]:
                    out[t["key"]] = (ms[0] if ms else t["steps"]) if t["seed"] == seeds[0] else 0
        if p.halving and len(lrs) > p.keep_min:
            for key, step in _halving_plan(p, members, seeds[0]).items():
                out[key] = min(out[key], step)
    return out


def _halving_plan(p: Policy, members: list[Mapping], judge) -> dict[str, int]:
    """Trial key -> the step halving stops it at, for as many lrs of a cell as it drops, priced by
    rank: which lr drops is the data's; how many and when is not."""
    first = [t for t in members if t["seed"] == judge]
    alive = len({t["lr"] for t in members})
    stop_at: list[int] = []  # the milestone each dropped lr (by rank) stops at
    for m in milestone_steps(p, max(t["steps"] for t in first), min(t["eval_every"] for t in first)):
        if alive <= p.keep_min:
            break
        kept = max(p.keep_min, math.ceil(alive / p.eta))
        stop_at += [m] * (alive - kept)
        alive = kept
    by_seed: dict = {}
    for t in sorted(members, key=lambda t: (t["seed"] != judge, t["lr"])):
        by_seed.setdefault(t["seed"], []).append(t)
    out = {}
    for seed, ts in by_seed.items():
        for t, m in zip(ts[len(ts) - len(stop_at) :], stop_at):
            out[t["key"]] = m if seed == judge else 0
    return out


# ---------------------------------------------------------------- from the run record

ENDED = ("finished", "diverged", "failed", "stopped")


def trial_of(key: str, config: Mapping) -> dict:
    """The policy's view of a trial from its flat finetuning config."""
    return {
        "key": key,
        **{c: config[c] for c in CELL},
        "lr": float(config["lr"]),
        "seed": int(config["seed"]),
        "steps": int(config["steps"]),
        "eval_every": int(config["eval_every"]),
    }


def seen_of(points, status: str | None, best: float = math.nan) -> Seen:
    """``Seen`` from a run's (step, val_acc) history, its raystudy status and final best val acc."""
    pts = tuple(sorted((int(s), float(v)) for s, v in points))
    return Seen(pts, status in ENDED, float(best) if status == "finished" else math.nan)
