"""Allocation policies on hand-worked curve tables (raystudy.spaces.adaptive): no Ray, no torch."""

import math
import re

import pytest

from raystudy.errors import ConfigError
from raystudy.spaces import adaptive
from raystudy.spaces.adaptive import Seen, Stop

LRS = (0.01, 0.03, 0.1, 0.3)


def grid(conditions=("MHA",), lrs=LRS, seeds=(0, 1, 2), datasets=("d",), steps=100, every=25):
    return [
        {
            "key": f"{d}/{c}/{lr}/{s}",
            "dataset": d,
            "condition": c,
            "optimizer": "sgd",
            "lr": lr,
            "seed": s,
            "steps": steps,
            "eval_every": every,
        }
        for d in datasets
        for s in seeds
        for c in conditions
        for lr in lrs
    ]


def curve(*vals, every=25, ended=True):
    return Seen(tuple((every * (i + 1), v) for i, v in enumerate(vals)), ended)


def test_policy_names_are_checked():
    assert adaptive.policy("halving").halving
    for name in ("asha", "seeds", "halving2", "halving+seeds", "halving2+seeds"):
        with pytest.raises(
            ConfigError, match=f"--adaptive '{re.escape(name)}': unknown policy; valid: identity, halving, race$"
        ):
            adaptive.policy(name)


def test_milestones_round_up_to_an_evaluation_and_skip_the_end():
    p = adaptive.Policy("x", halving=True, milestones=(0.25, 0.3, 1.0))
    assert adaptive.milestone_steps(p, 100, 20) == [40]  # 25 -> 40, 30 -> 40, 100 is the end
    assert adaptive.milestone_steps(p, 300, 50) == [100]


def test_identity_stops_nothing():
    trials = grid()
    seen = {t["key"]: curve(0.5, 0.6, 0.7, 0.8) for t in trials}
    assert adaptive.decide(adaptive.policy("identity"), trials, seen) == {}


def test_halving_drops_the_two_worst_lrs_of_the_first_seed_for_every_seed():
    trials = grid()
    # first seed at step 25 (the milestone): lr 0.1 best (0.9), then 0.03 (0.8), 0.3 (0.7), 0.01 (0.6);
    # after the milestone 0.01 would overtake everything: the decision must not see it.
    seen = {
        "d/MHA/0.01/0": curve(0.6, 0.99),
        "d/MHA/0.03/0": curve(0.8, 0.8),
        "d/MHA/0.1/0": curve(0.9, 0.9),
        "d/MHA/0.3/0": curve(0.7, 0.7),
    }
    stops = adaptive.decide(adaptive.policy("halving"), trials, seen)
    assert stops == {
        "d/MHA/0.01/0": Stop(25, "halving@25"),
        "d/MHA/0.3/0": Stop(25, "halving@25"),
        "d/MHA/0.01/1": Stop(0, "halving@25"),
        "d/MHA/0.3/1": Stop(0, "halving@25"),
        "d/MHA/0.01/2": Stop(0, "halving@25"),
        "d/MHA/0.3/2": Stop(0, "halving@25"),
    }


def test_halving_waits_for_the_whole_rung_and_ties_keep_the_smaller_lr():
    trials = grid()
    seen = {
        "d/MHA/0.01/0": curve(0.5, ended=False),
        "d/MHA/0.03/0": curve(0.5, ended=False),
        "d/MHA/0.1/0": curve(0.5, ended=False),
    }
    p = adaptive.policy("halving")
    assert adaptive.decide(p, trials, seen) == {}  # lr 0.3 not at 25 yet
    seen["d/MHA/0.3/0"] = Seen((), ended=True)  # diverged before evaluating
    stops = adaptive.decide(p, trials, seen)
    assert {k for k, s in stops.items() if s.step} == {"d/MHA/0.1/0", "d/MHA/0.3/0"}


def test_halving_keeps_keep_min_and_halves_again_at_each_milestone():
    trials = grid(lrs=(1, 2, 3, 4, 5, 6, 7, 8), seeds=(0,))
    p = adaptive.Policy("h", halving=True, milestones=(0.25, 0.5), keep_min=2)
    seen = {f"d/MHA/{lr}/0": curve(lr / 10, lr / 10 if lr % 2 else 0.0) for lr in range(1, 9)}
    stops = adaptive.decide(p, trials, seen)
    # at 25: keep 5..8; at 50 (best so far) odd lrs keep their score, even ones keep 25's: 8, 7
    assert {k: s.step for k, s in stops.items()} == {
        "d/MHA/1/0": 25,
        "d/MHA/2/0": 25,
        "d/MHA/3/0": 25,
        "d/MHA/4/0": 25,
        "d/MHA/5/0": 50,
        "d/MHA/6/0": 50,
    }


def test_one_lr_cells_are_never_halved():
    trials = grid(conditions=("linear_probe",), lrs=(0.1,))
    seen = {t["key"]: curve(0.5) for t in trials}
    assert adaptive.decide(adaptive.policy("halving"), trials, seen) == {}


def test_halving_judges_the_first_seed_alone():
    trials = grid()
    # seed 0 keeps 0.1 and 0.03; seed 1 disagrees strongly about 0.03 vs 0.3, and does not count
    at25 = {
        (0.01, 0): 0.6,
        (0.03, 0): 0.8,
        (0.1, 0): 0.9,
        (0.3, 0): 0.7,
        (0.01, 1): 0.6,
        (0.03, 1): 0.5,
        (0.1, 1): 0.9,
        (0.3, 1): 0.9,
    }
    seen = {f"d/MHA/{lr}/{s}": curve(v, ended=False) for (lr, s), v in at25.items()}
    one = adaptive.decide(adaptive.policy("halving"), trials, seen)
    assert {k for k in one if k.endswith("/0")} == {"d/MHA/0.01/0", "d/MHA/0.3/0"}
    del seen["d/MHA/0.3/1"]  # nor does the rung wait for it
    assert adaptive.decide(adaptive.policy("halving"), trials, seen) == one


def test_planned_steps_from_the_shape():
    trials = grid()  # 4 lrs x 3 seeds x 100 steps = 1200
    plan = adaptive.planned_steps(adaptive.policy("halving"), trials)
    assert sum(plan.values()) == 2 * 25 + 2 * 100 + 2 * 2 * 100  # 650
    assert sum(adaptive.planned_steps(adaptive.policy("identity"), trials).values()) == 1200


def test_decisions_do_not_depend_on_data_past_the_milestone():
    trials = grid(seeds=(0,))
    a = {t["key"]: curve(t["lr"], 0.0, 0.0, 0.0) for t in trials}
    b = {t["key"]: curve(t["lr"], 1 - t["lr"], 0.5, 0.2) for t in trials}
    p = adaptive.policy("halving")
    assert adaptive.decide(p, trials, a) == adaptive.decide(p, trials, b)
    assert not math.isnan(adaptive.decide(p, trials, a)["d/MHA/0.01/0"].step)


def test_race_drops_an_lr_at_the_milestone_and_between_seeds_and_keeps_the_leader_everywhere():
    trials = grid()  # 4 lrs x 3 seeds, 100 steps, evaluations every 25: one milestone, 25
    p = adaptive.policy("race")  # gap 0.1, swing 0.01
    assert adaptive.milestone_steps(p, 100, 25) == [25]  # 12.5 and 25 both round up to 25
    # seed 0 at 25: best 0.8 (lr 0.1); 0.01 trails by 0.3 > gap: out there, for every seed. 0.3
    # trails by 0.08: stays. Finals: 0.03 0.85, 0.1 0.86, 0.3 0.80. After one seed of three the
    # bound is 0.01 * sqrt(2) / 1 = 0.014: 0.03 (0.01 behind) stays, 0.3 (0.06 behind) is out.
    seen = {
        "d/MHA/0.01/0": curve(0.5, ended=False),
        "d/MHA/0.03/0": curve(0.75, 0.85),
        "d/MHA/0.1/0": curve(0.8, 0.86),
        "d/MHA/0.3/0": curve(0.72, 0.80),
    }
    stops = adaptive.decide(p, trials, seen)
    assert stops == {
        "d/MHA/0.01/0": Stop(25, "race@25"),
        "d/MHA/0.01/1": Stop(0, "race@25"),
        "d/MHA/0.01/2": Stop(0, "race@25"),
        # its first seed ran to the end: stopped all the same, out of the lr choice
        "d/MHA/0.3/0": Stop(100, "race after 1 seed"),
        "d/MHA/0.3/1": Stop(0, "race after 1 seed"),
        "d/MHA/0.3/2": Stop(0, "race after 1 seed"),
    }
    # seed 1: 0.03 0.88, 0.1 0.84 (no one 0.1 behind at 25). Means 0.865 and 0.85; after two
    # seeds the bound is 0.01 * sqrt(1) / 2 = 0.005: 0.1, 0.015 behind, is out; 0.03 runs seed 2
    seen.update({"d/MHA/0.03/1": curve(0.7, 0.88), "d/MHA/0.1/1": curve(0.75, 0.84)})
    after = adaptive.decide(p, trials, seen)
    assert {k: v for k, v in after.items() if k not in stops} == {
        "d/MHA/0.1/0": Stop(100, "race after 2 seeds"),
        "d/MHA/0.1/1": Stop(100, "race after 2 seeds"),
        "d/MHA/0.1/2": Stop(0, "race after 2 seeds"),
    }
    assert not any("/0.03/" in k for k in after)  # the choice runs every seed


def test_race_waits_for_the_rung_and_for_the_seed_and_ignores_data_past_the_milestone():
    trials = grid()
    p = adaptive.policy("race")
    seen = {
        "d/MHA/0.01/0": curve(0.5, ended=False),
        "d/MHA/0.03/0": curve(0.8, ended=False),
        "d/MHA/0.1/0": curve(0.8, ended=False),
    }
    assert adaptive.decide(p, trials, seen) == {}  # 0.3 not at 25 yet
    seen["d/MHA/0.3/0"] = Seen((), ended=True)  # diverged before evaluating
    assert set(adaptive.decide(p, trials, seen)) == {f"d/MHA/{lr}/{s}" for lr in (0.01, 0.3) for s in (0, 1, 2)}
    # 0.01 climbs to 0.99 after the milestone: the decision taken at 25 stands
    seen["d/MHA/0.01/0"] = curve(0.5, 0.99)
    assert adaptive.decide(p, trials, seen)["d/MHA/0.01/0"] == Stop(25, "race@25")
    # 0.03 and 0.1 still run their first seed: no decision about the second seed yet
    assert set(adaptive.decide(p, trials, seen)) == {f"d/MHA/{lr}/{s}" for lr in (0.01, 0.3) for s in (0, 1, 2)}
    # both end level: nobody is out after one seed; the rest is the seeds'
    seen["d/MHA/0.03/0"], seen["d/MHA/0.1/0"] = curve(0.8, 0.9), curve(0.8, 0.9)
    assert set(adaptive.decide(p, trials, seen)) == {f"d/MHA/{lr}/{s}" for lr in (0.01, 0.3) for s in (0, 1, 2)}


def test_race_swing_and_gap_settings_and_its_projection():
    trials = grid(seeds=(0, 1))
    seen = {
        "d/MHA/0.01/0": curve(0.5, 0.6),
        "d/MHA/0.03/0": curve(0.75, 0.85),
        "d/MHA/0.1/0": curve(0.8, 0.90),
        "d/MHA/0.3/0": curve(0.65, 0.70),
    }
    # one seed of two: bound swing * 1 / 1. 0.03 is 0.05 behind: out with swing 0.01, in with 0.1;
    # a gap of 0.4 keeps 0.01 (0.3 behind at 25) until the seed ends, 0.3 behind
    tight, loose = adaptive.Policy("t", race=True, swing=0.01), adaptive.Policy("l", race=True, swing=0.1, gap=0.4)
    assert {k for k in adaptive.decide(tight, trials, seen) if "/0.03/" in k} == {"d/MHA/0.03/0", "d/MHA/0.03/1"}
    assert {k: s.rule for k, s in adaptive.decide(loose, trials, seen).items()} == {
        f"d/MHA/{lr}/{s}": "race after 1 seed" for lr in (0.01, 0.3) for s in (0, 1)
    }
    p = adaptive.policy("race")
    assert sum(adaptive.planned_steps(p, grid()).values()) == 1200  # nobody leaves
    assert sum(adaptive.planned_steps(p, grid(), settled=True).values()) == 3 * 25 + 3 * 100  # one lr left
