"""The race's variants tried for about a third of the steps (docs/adaptive.md's history), replayed.

    python benchmarks/adaptive_candidates.py                       # A and B on the three recordings
    python benchmarks/adaptive_candidates.py --orders              # and over the six orders of the seeds
    python benchmarks/adaptive_candidates.py --recordings s012 --candidates "gap 0.07,spread 1"

None of them is a policy of raystudy: each is the race (``raystudy.spaces.adaptive``) with a rule added,
kept here so that the history's figures can be measured again. The rules, as the history
describes them:
- ``lo``/``frac`` (learning-curve extrapolation): at a milestone, an lr trailing its seed's best by
  more than ``lo`` is also out when its best so far plus ``frac`` x its last positive slope x the
  steps left stays below the leader's best so far;
- ``spread`` (and ``minswing``): from the second seed on, the k-seed bound's swing is ``spread`` x
  the largest standard deviation of the cell's paired differences (leader minus each lr);
- ``pool`` (pooled across datasets): an lr whose mean first-seed deficit over the condition's
  datasets (each capped at 0.5) exceeds ``pool`` is out after the first or second seed as soon as
  its mean trails the cell's leader at all.
Prints one line per recording and candidate: steps spent, same lr against the floor's bar,
Kendall tau, calls flipped, the verdict (``analysis.floor``); with ``--orders``, the same over the
six orders the three seeds could have run in (the replay permutes the seed labels).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (the race's settings changed, the added rule's settings)
CANDIDATES = {
    "race": ({}, {}),
    "gap 0.07": ({"gap": 0.07}, {}),
    "spread 1": ({}, {"spread": 1.0}),
    "spread 0.5 min 0.01": ({}, {"spread": 0.5, "minswing": 0.01}),
    "extrapolate 0.05 x 0.25": ({}, {"lo": 0.05, "frac": 0.25}),
    "extrapolate 0.02 x 0.1": ({}, {"lo": 0.02, "frac": 0.1}),
    "pooled": ({}, {"pool": 0.01}),
    "A: pooled + gap 0.07": ({"gap": 0.07}, {"pool": 0.01}),
    "B: A + extrapolate 0.04 x 0.5": ({"gap": 0.07}, {"pool": 0.01, "lo": 0.04, "frac": 0.5}),
}
DEFAULT = ("race", "A: pooled + gap 0.07", "B: A + extrapolate 0.04 x 0.5")


def _slope(seen, upto: int) -> float:
    """Validation accuracy gained per step between the last two evaluations up to ``upto``."""
    pts = [(st, v) for st, v in (seen.points if seen else ()) if st <= upto and v == v]
    if len(pts) < 2:
        return math.inf
    (s0, v0), (s1, v1) = pts[-2], pts[-1]
    return (v1 - v0) / (s1 - s0)


def _out_at_milestone(p, rule: dict, score: dict, slopes: dict, steps_left: int) -> list:
    """The lrs out at a milestone of one seed: the race's gap, and the extrapolation if asked."""
    lead = max(score.values())
    out = []
    for lr, s in score.items():
        behind = lead - s
        if behind > p.gap:
            out.append(lr)
        elif rule.get("lo") is not None and behind > rule["lo"]:
            if s + max(slopes[lr], 0) * steps_left * rule["frac"] < lead:
                out.append(lr)
    return out


def _swing(p, rule: dict, k: int, alive: list, mean: dict, diffs) -> float:
    """The k-seed bound's swing: the race's, or the measured spread of the paired differences."""
    if not rule.get("spread") or k < 1:
        return p.swing
    lead = max(alive, key=mean.get)
    sds = []
    for lr in alive:
        if lr != lead:
            d = diffs(lead, lr)
            mu = sum(d) / len(d)
            sds.append(math.sqrt(sum((x - mu) ** 2 for x in d) / (len(d) - 1)))
    return max(rule["spread"] * max(sds) if sds else p.swing, rule.get("minswing", 0.0))


def race_with(p, rule: dict, members: list, seen: dict, pooled: dict) -> dict:
    """The race over one cell's trials with ``rule`` added: key -> Stop (``raystudy.spaces.adaptive``)."""
    from raystudy.spaces.adaptive import Seen, Stop, _reached, _score, milestone_steps

    seeds = sorted({t["seed"] for t in members})
    alive = sorted({t["lr"] for t in members})
    trial = {(t["lr"], t["seed"]): t for t in members}
    steps = max(t["steps"] for t in members)
    every = min(t["eval_every"] for t in members)
    out = {}

    def ran(lr, seed, upto=None):
        t = trial.get((lr, seed))
        return _score(seen.get(t["key"]), upto) if t else -math.inf

    def drop(lrs, k, step, why):
        for t in members:
            if t["lr"] in lrs:
                i = seeds.index(t["seed"])
                out[t["key"]] = Stop(t["steps"] if i < k else step if i == k else 0, why)

    for k, seed in enumerate(seeds):
        for m in milestone_steps(p, steps, every):
            if len(alive) < 2:
                break
            if not all(_reached(seen.get(trial[(lr, seed)]["key"]), m) for lr in alive if (lr, seed) in trial):
                return out
            score = {lr: ran(lr, seed, m) for lr in alive}
            slopes = {lr: _slope(seen.get(trial[(lr, seed)]["key"]), m) for lr in alive}
            lost = _out_at_milestone(p, rule, score, slopes, steps - m)
            drop(lost, k, m, f"race@{m}")
            alive = [lr for lr in alive if lr not in lost]
        if k == len(seeds) - 1 or len(alive) < 2:
            break
        if not all(seen.get(trial[(lr, seed)]["key"], Seen()).ended for lr in alive if (lr, seed) in trial):
            return out
        mean = {lr: sum(ran(lr, s) for s in seeds[: k + 1]) / (k + 1) for lr in alive}
        sw = _swing(p, rule, k, alive, mean, lambda a, b: [ran(a, s) - ran(b, s) for s in seeds[: k + 1]])
        bound = sw * math.sqrt(len(seeds) - k - 1) / (k + 1)
        lead = max(mean.values())
        pooled_out = rule.get("pool") is not None and k < 2
        lost = [
            lr for lr in alive if mean[lr] < lead - (0.0 if pooled_out and pooled.get(lr, 0) > rule["pool"] else bound)
        ]
        drop(lost, k + 1, 0, "after")
        alive = [lr for lr in alive if lr not in lost]
    return out


def _pooled(cells: dict, seen: dict) -> dict:
    """(condition, optimizer) -> lr -> mean over datasets of its first-seed deficit (capped at 0.5)."""
    from raystudy.spaces.adaptive import _score

    acc: dict = {}
    for (_, cond, opt), members in cells.items():
        first = min(t["seed"] for t in members)
        score = {t["lr"]: _score(seen.get(t["key"])) for t in members if t["seed"] == first}
        top = max(score.values())
        for lr, v in score.items():
            acc.setdefault((cond, opt), {}).setdefault(lr, []).append(min(top - v, 0.5))
    return {c: {lr: sum(v) / len(v) for lr, v in lrs.items()} for c, lrs in acc.items()}


def judge(grid: dict, name: str, f) -> tuple:
    """Candidate ``name`` replayed on ``grid``: (steps share, same lr, bar, tau, flips, preserving)."""
    from analysis import floor, replaying
    from analysis.agreement import compare, conclusions
    from raystudy.spaces import adaptive

    changed, rule = CANDIDATES[name]
    p = dataclasses.replace(adaptive.POLICIES["race"], **changed)
    cells = adaptive._cells(grid["trials"])
    pooled = _pooled(cells, grid["seen"]) if rule.get("pool") is not None else {}
    stops = {}
    for key, members in cells.items():
        stops.update(race_with(p, rule, members, grid["seen"], pooled.get((key[1], key[2]), {})))
    full, runs = replaying.apply(grid["runs"], {}), replaying.apply(grid["runs"], stops)
    a = compare(conclusions(full, "MHA"), conclusions(runs, "MHA"))
    share = runs["spent_steps"].sum() / full["spent_steps"].sum()
    return share, a["same_lr"], f.bar("same_lr"), a["kendall_tau"], len(a["flips"]), floor.verdict(a, f)["preserving"]


def main(argv: list[str] | None = None) -> int:
    """Print each candidate's replay on each recording (and, with --orders, over the seed orders)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recordings", default="s012,s345,wide", help="names under benchmarks/recordings/")
    ap.add_argument("--candidates", default=",".join(DEFAULT), help=f"comma-separated: {', '.join(CANDIDATES)}")
    ap.add_argument("--orders", action="store_true", help="also over the six orders the seeds could run in")
    ap.add_argument("--reps", type=int, default=200, help="reseedings of the floor (default: 200)")
    a = ap.parse_args(argv)
    names = [c.strip() for c in a.candidates.split(",")]
    recs = [r.strip() for r in a.recordings.split(",")]
    bad = [c for c in names if c not in CANDIDATES] + [
        r for r in recs if not (HERE / "recordings" / f"{r}.csv.gz").is_file()
    ]
    if bad:
        print(f"error: unknown candidate or recording: {', '.join(bad)}", file=sys.stderr)
        return 2
    from analysis import floor, recordings, replaying

    for rec in recs:
        grid = recordings.load(HERE / "recordings" / f"{rec}.csv.gz")
        f = floor.floor(replaying.apply(grid["runs"], {}), reps=a.reps)
        seeds = sorted({t["seed"] for t in grid["trials"]})
        for name in names:
            share, same, bar, tau, flips, ok = judge(grid, name, f)
            line = f"{rec} {name}: {100 * share:.1f}% of the steps, same lr {same} (bar {bar:g}), tau {tau:.3f}, "
            print(line + f"{flips} flipped, {'preserving' if ok else 'NOT preserving'}", flush=True)
            if a.orders:
                res = []
                for perm in itertools.permutations(seeds):
                    relabel = dict(zip(seeds, perm, strict=True))
                    g = dict(grid, trials=[dict(t, seed=relabel[t["seed"]]) for t in grid["trials"]])
                    share, same, _, _, _, ok = judge(g, name, f)
                    res.append(f"{100 * share:.1f}%/{same}{'' if ok else ' NOT'}")
                print(f"  over the seed orders: {'; '.join(res)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
