"""Replaying a grid under a policy (analysis.replaying, raystudy replay): hand-worked on in-memory grids, and from a
real MLflow store written by raystudy's own tracking writer."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis import replaying, reporting, synthetic
from analysis.commands import replay
from analysis.sections import trust
from raystudy.spaces import adaptive
from raystudy.spaces.adaptive import Seen, Stop

STEPS, EVERY = 100, 25


def grid_of(runs: pd.DataFrame) -> dict:
    """A recorded grid from a runs table: curves that climb to each run's validation accuracy
    (the lrs keep their final order from the first evaluation on), 1 s a step."""
    runs = runs.assign(key=[f"k{i}" for i in range(len(runs))], steps_done=float(STEPS), wall_s=float(STEPS))
    runs.loc[runs["status"] == "diverged", "steps_done"] = 10.0
    runs.loc[runs["status"] == "diverged", "wall_s"] = 10.0
    trials, seen = [], {}
    for r in runs.itertuples():
        trials.append(
            {
                "key": r.key,
                "dataset": r.dataset,
                "condition": r.condition,
                "optimizer": r.optimizer,
                "lr": r.lr,
                "seed": r.seed,
                "steps": STEPS,
                "eval_every": EVERY,
            }
        )
        if r.status == "finished":
            pts = tuple((s, r.val_acc * f) for s, f in zip((25, 50, 75, 100), (0.7, 0.85, 0.95, 1.0)))
            seen[r.key] = Seen(pts, True, r.val_acc)
        else:
            seen[r.key] = Seen((), True)
    return {"runs": runs, "trials": trials, "seen": seen}


@pytest.fixture(scope="module")
def study():
    return grid_of(synthetic.fake_runs(n_datasets=6, seed=3))


def quick():
    return trust.Options(reps=50, hierarchical=False)


def test_identity_replay_reproduces_the_full_report(study, tmp_path):
    r = replaying.replay(study, adaptive.policy("identity"))
    assert r["stopped"] == 0 and r["step_fraction"] == 1.0 and not r["flips"]
    full = reporting.analyse(tmp_path / "full", runs=study["runs"], options=quick(), draw_figures=False)
    again = reporting.analyse(
        tmp_path / "replayed", runs=r["runs"][study["runs"].columns], options=quick(), draw_figures=False
    )
    assert again.text == full.text
    for name in ("tests.csv", "posthoc.csv", "omnibus.csv", "accuracy_val_selected.csv"):
        assert (tmp_path / "replayed" / name).read_text() == (tmp_path / "full" / name).read_text()


def test_halving_on_a_grid_whose_order_is_set_at_the_first_evaluation(study):
    r = replaying.replay(study, adaptive.policy("halving"))
    runs = r["runs"]
    # 6 datasets x 7 conditions x 4 lrs (synthetic: the linear probe too): 2 lrs dropped per
    # cell, for 3 seeds; diverged runs that end before the step they would stop at keep their status
    stopped = runs[runs["status"] == "stopped"]
    dropped_diverged = sum(1 for k, s in r["decisions"].items() if runs.set_index("key").loc[k, "status"] == "diverged")
    assert len(r["decisions"]) == 6 * 7 * 2 * 3 and len(stopped) + dropped_diverged == len(r["decisions"])
    assert stopped[["val_acc", "test_acc"]].isna().all().all()
    first = stopped[stopped["seed"] == 0]
    assert set(first["spent_steps"]) <= {25.0} and set(stopped[stopped["seed"] > 0]["spent_steps"]) == {0.0}
    # the curves keep the final order, so the two best lrs by seed 0's validation accuracy
    # survive: the lr stays the full grid's exactly where that lr is one of them
    full = replaying.conclusions(replaying.apply(study["runs"], {}))["chosen_lr"]
    seed0 = study["runs"][study["runs"]["seed"] == 0]
    expect = sum(
        1
        for (d, c), lr in full.items()
        if lr in seed0[(seed0["dataset"] == d) & (seed0["condition"] == c)].nlargest(2, "val_acc")["lr"].values
    )
    assert r["same_lr"] == expect and len(r["lr_changed"]) == r["cells"] - expect
    assert r["step_fraction"] == pytest.approx(r["steps"] / r["full_steps"])
    assert r["step_fraction"] < 0.6


def test_race_keeps_the_full_grids_lr_exactly_where_that_lr_ran_every_seed(study):
    r = replaying.replay(study, adaptive.policy("race"))
    runs = r["runs"]
    # an lr is in the choice with all its seeds or out with all of them: never half its seeds,
    # whose mean over fewer seeds could win the choice (a diverged seed ended on its own)
    for _, g in runs.groupby(["dataset", "condition", "optimizer", "lr"]):
        assert not ({"stopped"} <= set(g["status"]) and "finished" in set(g["status"])), g
    # the survivors' numbers are the full grid's: where its lr survives, the choice is the same
    full = replaying.conclusions(replaying.apply(study["runs"], {}))["chosen_lr"]
    kept = [
        (d, c)
        for (d, c), lr in full.items()
        if not (
            runs[(runs["dataset"] == d) & (runs["condition"] == c) & (runs["lr"] == lr)]["status"] == "stopped"
        ).any()
    ]
    assert r["same_lr"] == len(kept) and 0 < len(kept) < r["cells"]
    assert r["stopped"] > 0 and r["step_fraction"] < 1
    # a trial of an lr that left after its seed ended is priced whole, a later seed's at nothing
    after = runs[runs["stop_rule"].str.startswith("race after")]
    ran = after["seed"] < after["stop_rule"].str.extract(r"after (\d)")[0].astype(int)
    assert set(after.loc[ran, "spent_steps"]) == {float(STEPS)} and set(after.loc[~ran, "spent_steps"]) == {0.0}


def test_apply_prices_what_runs_and_keeps_early_divergence():
    runs = pd.DataFrame(
        {
            "key": ["a", "b", "c", "d"],
            "status": ["finished", "diverged", "finished", "diverged"],
            "val_acc": [0.9, np.nan, 0.8, np.nan],
            "test_acc": [0.88, np.nan, 0.79, np.nan],
            "steps_done": [100.0, 10.0, 100.0, 80.0],
            "wall_s": [50.0, 5.0, 50.0, 40.0],
        }
    )
    out = replaying.apply(runs, {"a": Stop(25, "halving@25"), "b": Stop(25, "halving@25"), "d": Stop(0, "seeds@2")})
    assert list(out["status"]) == ["stopped", "diverged", "finished", "stopped"]
    assert list(out["spent_steps"]) == [25.0, 10.0, 100.0, 0.0]
    assert list(out["spent_s"]) == [12.5, 5.0, 50.0, 0.0]
    assert math.isnan(out.loc[0, "test_acc"]) and out.loc[2, "test_acc"] == 0.79
    assert list(out["stop_rule"]) == ["halving@25", "", "", "seeds@2"]


def test_compare_names_changed_lrs_tau_and_flips():
    full = {
        "chosen_lr": {("d", "MHA"): 0.1, ("d", "FC1"): 0.3},
        "mean": pd.Series({"MHA": 0.9, "FC1": 0.8, "LN1": 0.7}),
        "calls": {"friedman": True, "x": False},
    }
    other = {
        "chosen_lr": {("d", "MHA"): 0.1, ("d", "FC1"): 0.1},
        "mean": pd.Series({"FC1": 0.95, "MHA": 0.9, "LN1": 0.7}),
        "calls": {"friedman": False, "x": False},
    }
    c = replaying.compare(full, other)
    assert (c["cells"], c["same_lr"], c["lr_changed"]) == (2, 1, ["d/FC1: 0.3 -> 0.1"])
    assert c["kendall_tau"] == pytest.approx(1 / 3)  # one discordant pair of three
    assert (c["top1"], c["top1_replay"], c["same_top1"]) == ("MHA", "FC1", False)
    assert c["flips"] == ["friedman"] and c["calls"] == 2


def test_stopped_runs_are_left_out_of_means_and_counted(study, tmp_path):
    """A stopped run is a loser of the lr choice: never a zero in a mean, and the report counts it."""
    runs = study["runs"].copy()
    cell = (runs["dataset"] == "ds00") & (runs["condition"] == "MHA")
    best_lr = runs[cell].groupby("lr")["val_acc"].mean().idxmax()
    # stop every seed of the best lr: the cell's choice moves to the next lr, its mean is over finished seeds
    hit = cell & (runs["lr"] == best_lr)
    runs.loc[hit, "status"] = "stopped"
    runs.loc[hit, ["val_acc", "test_acc"]] = np.nan
    c = replaying.conclusions(runs)
    assert c["chosen_lr"][("ds00", "MHA")] != best_lr
    out = reporting.analyse(tmp_path, runs=runs[study["runs"].columns], options=quick(), draw_figures=False)
    assert f"{int(hit.sum())} stopped" in out.text.splitlines()[2]


def test_policy_all_and_bad_policy_on_the_command_line(capsys):
    assert replay.main(["--experiment", "x", "--policy", "asha"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --policy 'asha': unknown policy; valid: identity, halving, race"
    for gone in ("seeds", "halving2", "halving+seeds", "halving2+seeds"):  # the policies removed
        assert replay.main(["--experiment", "x", "--policy", gone]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: --policy {gone!r}: unknown policy; valid: identity, halving, race"


@pytest.mark.slow
def test_replay_from_an_mlflow_store(tmp_path, capsys):
    """A store written by raystudy.tracking (as the grid's driver writes it): replay reads the
    curves and the costs back, and the command line prints and writes every policy."""
    import mlflow

    from raystudy.tracking import connect, record
    from raystudy.train.config import FinetuneConfig, trial_key

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = mlflow.MlflowClient(tracking_uri=uri)
    exp = connect.experiment_id(c, "rp", (tmp_path / "art").as_uri())
    parent = record.parent_run(c, exp, "g", "grid-rp", {})
    final = {}
    for d in ("digits", "digits_c"):
        for cond, base in (("MHA", 0.9), ("FC1", 0.8)):
            for i, lr in enumerate((0.01, 0.03, 0.1, 0.3)):
                for seed in (0, 1):
                    cfg = FinetuneConfig(
                        model="vit_demo",
                        pretrained=False,
                        dataset=d,
                        condition=cond,
                        lr=lr,
                        seed=seed,
                        steps=100,
                        eval_every=25,
                    ).to_dict()
                    rid = record.open_trial(c, exp, parent, trial_key(cfg), cfg)
                    val = base - 0.05 * i + 0.01 * seed
                    record.log_steps(
                        c,
                        rid,
                        [{"step": s, "val_acc": val * f} for s, f in zip((25, 50, 75, 100), (0.8, 0.9, 0.95, 1.0))],
                    )
                    record.finish_trial(
                        c,
                        rid,
                        {
                            "status": "finished",
                            "best_val_acc": val,
                            "test_acc": val - 0.02,
                            "steps_done": 100,
                            "wall_s": 20.0,
                        },
                    )
                    final[(d, cond, lr, seed)] = val
    grid = replaying.recorded("rp", uri)
    assert len(grid["trials"]) == 32 and grid["runs"]["wall_s"].sum() == 32 * 20.0
    key = grid["runs"].set_index(["dataset", "condition", "lr", "seed"]).loc[("digits", "FC1", 0.03, 1), "key"]
    assert grid["seen"][key] == Seen(((25, 0.76 * 0.8), (50, 0.76 * 0.9), (75, 0.76 * 0.95), (100, 0.76)), True, 0.76)
    h = replaying.replay(grid, adaptive.policy("halving"))
    # per cell: seed 0 runs 2 lrs x 100 steps + 2 x 25, seed 1 the 2 kept lrs only
    assert h["steps"] == 4 * (2 * 100 + 2 * 25 + 2 * 100) and h["stopped"] == 16
    assert h["same_lr"] == h["cells"] == 4 and h["same_top1"]
    assert (
        replay.main(["--experiment", "rp", "--tracking-uri", uri, "--policy", "all", "--out", str(tmp_path / "o")]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("identity: 0 of 32 trials stopped; steps 3,200 of 3,200 (100.0%)")
    assert lines[1].startswith("halving: 16 of 32 trials stopped; steps 1,800 of 3,200 (56.2%)")
    # race per cell: lr 0.3 trails by 0.12 at 25 (out there), 0.03 and 0.1 by 0.05 and 0.1 after
    # seed 0 (bound 0.01): seed 0 runs 3 x 100 + 25, seed 1 only lr 0.01
    race = next(ln for ln in lines if ln.startswith("race:"))
    assert (
        race.startswith("race: 24 of 32 trials stopped; steps 1,700 of 3,200 (53.1%)") and "same lr in 4 of 4" in race
    )
    assert (tmp_path / "o" / "replay.json").is_file() and (tmp_path / "o" / "decisions_race.csv").is_file()
    assert {p.name for p in (tmp_path / "o").iterdir()} == {
        "replay.json",
        "decisions_identity.csv",
        "decisions_halving.csv",
        "decisions_race.csv",
    }
