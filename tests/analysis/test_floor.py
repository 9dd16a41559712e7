"""analysis.floor (the full grid against its reseedings, and the verdict rule), analysis.agreement's
calls, analysis.recordings, and the replay from a recording: hand-worked cases, an independent
bootstrap written here with plain loops, and the real demo_adaptive recording shipped in benchmarks/."""

import gzip

import numpy as np
import pandas as pd
import pytest

from analysis import AnalysisError, agreement, floor, recordings, replaying, synthetic
from analysis.commands import replay
from analysis.stats import selection, significance
from raystudy.spaces import adaptive
from tests.analysis.commands.test_replay import grid_of
from tests.analysis.test_stability import flip_runs, synthetic_runs
from tests.helpers import REPO

RECORDINGS = REPO / "benchmarks" / "recordings"


# ---------------------------------------------------------------- hand-worked


def test_a_cell_whose_lr_flips_under_a_known_resampling():
    # test_stability's FLIP: X's lr moves from 0.1 to 0.3 only when seed 1 is drawn twice
    # (1/4); X's test mean is 0.8 for (0, 0), 0.9 for (1, 1), 0.7 for a mixed draw, against Y's
    # 0.74: the full grid's order (Y, X) holds only in the mixed draws (1/2).
    f = floor.floor(flip_runs(), reference="Y", reps=400, seed=3)
    u = np.random.default_rng(3).random((400, 2, 1, 2))  # the documented draws: no dataset draw
    x = np.floor(u[:, 0, 0] * 2)  # conditions in the table's order: X, Y
    both_one, mixed = (x == 1).all(axis=-1), x[:, 0] != x[:, 1]
    assert (f.same_lr == np.where(both_one, 1, 2)).all() and f.cells == 2
    assert (f.same_top1 == mixed).all() and (f.tau == np.where(mixed, 1.0, -1.0)).all()
    assert f.calls == 0 and (f.flips == 0).all()  # one dataset: no test runs
    assert f.held == {floor.TOP1: pytest.approx(mixed.mean())}
    assert f.bar("same_lr") == 1 and f.quantile("same_lr", 0.5) == 2
    many = floor.floor(flip_runs(), reference="Y", reps=1000, seed=0)
    assert (many.same_lr == 1).mean() == pytest.approx(1 / 4, abs=0.05)
    assert many.same_top1.mean() == pytest.approx(1 / 2, abs=0.05)
    assert many.confident() == []  # the top-1 holds in half the reseedings: no confident call


def bare_floor(same_lr, tau, held) -> floor.Floor:
    same_lr, tau = np.array(same_lr), np.array(tau, dtype=float)
    return floor.Floor(len(same_lr), 28, 3, same_lr, tau, np.ones(len(same_lr), bool), np.zeros(len(same_lr)), held)


def agreeing(same_lr=28, tau=1.0, flips=(), same_top1=True) -> dict:
    return {"same_lr": same_lr, "kendall_tau": tau, "flips": list(flips), "same_top1": same_top1}


def test_the_rule_against_the_floors_5_percent_and_the_confident_calls():
    # 20 replicates: the 5% quantile is the lowest value (1 of 20 reaches it or falls below)
    f = bare_floor([20] + [25] * 19, [0.6] + [1.0] * 19, {"friedman": 0.99, "holm a vs b": 0.6, floor.TOP1: 0.97})
    assert (f.bar("same_lr"), f.bar("tau"), f.quantile("same_lr", 0.5)) == (20, 0.6, 25)
    assert f.confident() == ["friedman", floor.TOP1]
    assert floor.verdict(agreeing(same_lr=20, tau=0.6, flips=["holm a vs b"]), f) == {
        "preserving": True,
        "checks": ["same lr 20 >= 20", "tau 0.600 >= 0.600", "no confident call flipped"],
        "why": [],
    }
    v = floor.verdict(agreeing(same_lr=19, tau=0.5, flips=["friedman"], same_top1=False), f)
    assert not v["preserving"] and v["why"] == [
        "same lr 19 < 20",
        "tau 0.500 < 0.600",
        "flips confident friedman, top-1",
    ]
    assert floor.verdict_text(v).startswith("NOT conclusion-preserving (against the floor's 5%: same lr 19 < 20")
    assert not floor.verdict(agreeing(tau=float("nan")), f)["preserving"]  # no ranking: no verdict for it


def test_the_rule_is_calibrated_on_reseedings_it_was_not_measured_on():
    """A reseeding of the full grid, drawn apart from the floor's, passes the rule in about 95%
    of cases or more per criterion: the rule calls "not preserving" what reseeding rarely does."""
    runs = synthetic_runs(seed=5)
    f = floor.floor(runs, reference="P", reps=200, seed=1)
    fresh = floor.floor(runs, reference="P", reps=100, seed=2)
    lr_ok = (fresh.same_lr >= f.bar("same_lr")).mean()
    tau_ok = (fresh.tau >= f.bar("tau")).mean()
    assert lr_ok >= 0.9 and tau_ok >= 0.9 and min(lr_ok, tau_ok) <= 0.995  # not a bar anything passes


# ---------------------------------------------------------------- against an independent bootstrap


def loop_floor(runs: pd.DataFrame, reference: str, reps: int, seed: int):
    """The floor with plain loops and the report's own path: each replicate's runs table rebuilt
    from the documented draws (seeds drawn with replacement per cell, relabelled), its
    conclusions by ``agreement.conclusions`` (``selection.best_lr``, ``significance.paired_tests``, ...)."""
    full = agreement.conclusions(runs, reference)
    conds, datasets = sorted(set(runs["condition"])), sorted(set(runs["dataset"]))
    done = runs[runs["status"] == "finished"]
    avail = {
        (c, d): sorted(done[(done["condition"] == c) & (done["dataset"] == d)]["seed"].unique())
        for c in conds
        for d in datasets
    }
    m = max(len(v) for v in avail.values())
    u = np.random.default_rng(seed).random((reps, len(conds), len(datasets), m))
    out = []
    for r in range(reps):
        parts = []
        for k, c in enumerate(conds):
            for j, d in enumerate(datasets):
                cell = runs[(runs["condition"] == c) & (runs["dataset"] == d)]
                seeds = avail[(c, d)]
                for i in range(len(seeds)):
                    s = seeds[int(np.floor(u[r, k, j, i] * len(seeds)))]
                    parts.append(cell[cell["seed"] == s].assign(seed=i))
        c = agreement.compare(full, agreement.conclusions(pd.concat(parts), reference))
        out.append((c["same_lr"], c["kendall_tau"], c["same_top1"], len(c["flips"])))
    return [np.array(v) for v in zip(*out)]


def test_against_an_independent_bootstrap():
    runs = synthetic_runs(seed=7)
    f = floor.floor(runs, reference="P", reps=40, seed=9)
    same, tau, top, flips = loop_floor(runs, "P", 40, 9)
    assert (f.same_lr == same).all() and (f.same_top1 == top).all() and (f.flips == flips).all()
    assert f.tau == pytest.approx(tau)
    assert len(set(same)) > 1 and flips.max() > 0  # the case moves both, so the check has teeth


def test_calls_are_the_reports_tests():
    runs = synthetic.fake_runs(n_datasets=6, seed=4)
    table = selection.wide(selection.best_lr(selection.seed_means(runs), "val"))
    calls = agreement.calls_of(table, "MHA")
    expect = {}
    for r in significance.paired_tests(table, "MHA").itertuples():
        expect[f"wilcoxon MHA > {r.other}"] = r.wilcoxon_p <= 0.05
        expect[f"t MHA vs {r.other}"] = r.t_p <= 0.05
    expect["friedman"] = significance.friedman(table)["p"] <= 0.05
    for r in significance.pairwise_wilcoxon(table).itertuples():
        expect[f"holm {r.a} vs {r.b}"] = bool(r.significant)
    assert calls == expect and any(calls.values()) and not all(calls.values())


def test_across_compares_two_recordings_as_a_replay():
    a = synthetic_runs(seed=7)
    b = a.assign(val_acc=a["val_acc"] + np.where(a["lr"] == 0.1, 0.2, 0.0))  # lr 0.1 wins every cell of P, Q
    c = floor.across(a, b, "P")
    assert c == agreement.compare(agreement.conclusions(a, "P"), agreement.conclusions(b, "P"))
    chosen = agreement.conclusions(a, "P")["chosen_lr"]
    assert c["same_lr"] == sum(1 for (d, k), lr in chosen.items() if k == "R" or lr == 0.1)


# ---------------------------------------------------------------- recordings


def test_a_recording_replays_as_its_store(tmp_path):
    g = grid_of(synthetic.fake_runs(n_datasets=3, seed=2))
    path = recordings.save(g, tmp_path / "g.csv.gz")
    again = recordings.load(path)
    assert again["trials"] == g["trials"] and again["seen"] == g["seen"]
    for name in adaptive.POLICIES:
        a, b = replaying.replay(g, adaptive.policy(name)), replaying.replay(again, adaptive.policy(name))
        assert a["decisions"] == b["decisions"] and replaying.summary_line(a) == replaying.summary_line(b)
    assert recordings.save(again, tmp_path / "h.csv.gz").read_bytes() == path.read_bytes()  # reproducible


def test_a_bad_recording_is_one_line(tmp_path, capsys):
    with pytest.raises(AnalysisError, match="no such file"):
        recordings.load(tmp_path / "none.csv.gz")
    (tmp_path / "bad.csv.gz").write_bytes(gzip.compress(b"key,dataset\nk,d\n"))
    with pytest.raises(AnalysisError, match="missing columns model, optimizer"):
        recordings.load(tmp_path / "bad.csv.gz")
    for argv, err in (
        (["--policy", "race"], "give one of --experiment NAME"),
        (["--policy", "race", "--experiment", "x", "--recording", "y"], "give one of --experiment NAME"),
        (["--policy", "race", "--recording", "y", "--reps", "-1"], "--reps -1: must be 0"),
        (["--policy", "race", "--recording", "y", "--reseeded", "z"], "--reseeded 'z': no such file"),
        (["--policy", "race", "--recording", str(tmp_path / "none.csv.gz")], "no such file"),
    ):
        assert replay.main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and err in lines[0], lines


# ---------------------------------------------------------------- a real recording


def test_race_on_the_recorded_demo_grid_against_its_floor(capsys):
    """The seeds-0-2 recording of demo_adaptive (benchmarks/recordings, exported from its store):
    the replay from the file, the floor and the verdicts, and the figures docs/adaptive.md gives."""
    path = RECORDINGS / "s012.csv.gz"
    assert path.stat().st_size < 100_000
    g = recordings.load(path)
    assert len(g["trials"]) == 300 and (g["runs"]["status"] == "finished").all()
    f = floor.floor(replaying.apply(g["runs"], {}), reps=40)
    assert f.cells == 28 and f.calls == 34 and f.bar("same_lr") < 28
    ident = replaying.replay(g, adaptive.policy("identity"), against=f)
    assert ident["same_lr"] == 28 and ident["verdict"]["preserving"]
    race = replaying.replay(g, adaptive.policy("race"), against=f)
    assert (round(100 * race["step_fraction"], 1), race["same_lr"], race["flips"]) == (44.1, 23, [])
    assert race["verdict"]["checks"][0].startswith("same lr 23 >= ")
    assert replay.main(["--recording", str(path), "--policy", "race", "--reps", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("race: 210 of 300 trials stopped; steps 10,160 of 23,040 (44.1%)")
    assert "conclusion-preserving (against the floor's 5%" in lines[0]
    assert lines[-1].startswith("floor (the full grid against 20 reseedings of itself): same lr in median ")


def test_the_benchmark_prints_the_table_from_a_clone():
    import subprocess
    import sys

    root = RECORDINGS.parent.parent
    cmd = [
        sys.executable,
        "benchmarks/bench_adaptive.py",
        "--recordings",
        str(RECORDINGS / "s012.csv.gz"),
        "--reps",
        "5",
    ]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| s012 |")]
    assert [r.split(" | ")[1] for r in rows] == ["`identity`", "`halving`", "`race`"]
    assert rows[2].startswith("| s012 | `race` | 44.1% | 23 of 28 (")
    p = subprocess.run([*cmd[:3], "nope.csv.gz"], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == "error: --recordings: nope.csv.gz"


def test_the_two_seed_sets_compared_directly():
    """The seeds-0-2 and seeds-3-5 recordings of demo_adaptive: the floor's second measure, as
    docs/adaptive.md gives it."""
    a, b = (replaying.apply(recordings.load(RECORDINGS / f"{n}.csv.gz")["runs"], {}) for n in ("s012", "s345"))
    c = floor.across(a, b)
    assert (c["same_lr"], c["cells"], c["kendall_tau"], c["flips"]) == (22, 28, 1.0, ["t MHA vs LN2"])
    assert replaying.across_line(c).startswith("same lr in 22 of 28 cells; Kendall tau 1.000; top-1 linear_probe")
