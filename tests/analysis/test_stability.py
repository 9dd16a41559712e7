"""analysis.stability: the bootstrap that re-chooses each cell's lr, on hand-worked cases and against
an independent bootstrap written here with plain loops."""

import itertools

import numpy as np
import pandas as pd
import pytest

from analysis import AnalysisError, stability
from analysis.stats import selection

# One dataset; condition X has two lrs and two seeds, Y one lr. X's validation accuracy picks lr
# 0.1 on both seeds (0.7 vs 0.65) and on seed 0 alone, lr 0.3 on seed 1 alone; a mixed draw
# (seeds 0 and 1) is the data itself. Of the 4 equally likely draws of two seeds, only (1, 1)
# moves X's lr: it is chosen again in 3/4. X's test accuracy at the chosen lr: (0, 0) 0.8,
# (1, 1) 0.9, mixed 0.7, against Y's 0.74: Y is top-1 (the data's answer) in the two mixed draws,
# 1/2; with the lr fixed at 0.1, (1, 1) gives X 0.6, and Y holds in 3/4.
FLIP = [
    # condition, lr, seed, val, test
    ("X", 0.1, 0, 0.9, 0.8),
    ("X", 0.1, 1, 0.5, 0.6),
    ("X", 0.3, 0, 0.6, 0.5),
    ("X", 0.3, 1, 0.7, 0.9),
    ("Y", 0.1, 0, 0.74, 0.74),
    ("Y", 0.1, 1, 0.74, 0.74),
]


def flip_runs() -> pd.DataFrame:
    df = pd.DataFrame(FLIP, columns=["condition", "lr", "seed", "val_acc", "test_acc"])
    df["dataset"] = "A"
    df["status"] = "finished"
    return df


def test_grid_holds_the_runs_and_the_reports_lr_choice():
    g = stability.grid(flip_runs(), ["X", "Y"], ["A"])
    assert g.select.shape == (2, 1, 2, 2) and g.lrs == [0.1, 0.3] and g.seeds == [0, 1]
    assert g.select[0, 0, 1, 1] == 0.7 and np.isnan(g.select[1, 0, 1]).all()  # Y has no lr 0.3
    assert g.chosen.tolist() == [[0], [0]]
    assert stability.seed_counts(g).tolist() == [[2], [2]]


def test_a_cell_whose_lr_flips_under_a_known_resampling():
    g = stability.grid(flip_runs(), ["X", "Y"], ["A"])
    boot = stability.replicates(g, reps=400, seed=3)
    # the draws, as documented: one dataset, so no dataset draw; floor(u * 2) picks the seed
    u = np.random.default_rng(3).random((400, 2, 1, 2))
    both_one = (np.floor(u[:, 0, 0] * 2) == 1).all(axis=-1)
    assert (boot.chosen[:, 0, 0] == np.where(both_one, 1, 0)).all()
    assert (boot.chosen[:, 1, 0] == 0).all()
    share = stability.rechoice(g, boot)
    assert share[0, 0] == pytest.approx(1 - both_one.mean()) and share[1, 0] == 1.0
    many = stability.rechoice(g, stability.replicates(g, reps=20000, seed=0))
    assert many[0, 0] == pytest.approx(3 / 4, abs=0.015)


def test_rank_probabilities_and_intervals_include_the_lr_choice():
    g = stability.grid(flip_runs(), ["X", "Y"], ["A"])
    boot = stability.replicates(g, reps=20000, seed=1)
    chosen = stability.condition_means(boot.test)
    fixed = stability.condition_means(boot.fixed)
    p = stability.rank_probabilities(chosen)
    assert p[1, 0] == pytest.approx(1 / 2, abs=0.015) and p[0, 0] == pytest.approx(1 / 2, abs=0.015)
    assert p.sum(axis=1) == pytest.approx([1, 1])
    assert stability.rank_probabilities(fixed)[1, 0] == pytest.approx(3 / 4, abs=0.015)
    assert stability.beats(chosen, 1)[0] == pytest.approx(1 / 2, abs=0.015)
    # X's mean is 0.8, 0.9 (a quarter each) or 0.7 (half) with the lr re-chosen; 0.6 to 0.8 fixed
    assert set(np.round(chosen[:, 0], 9)) == {0.7, 0.8, 0.9}
    lo, hi = stability.percentile_interval(chosen)
    flo, fhi = stability.percentile_interval(fixed)
    assert (lo[0], hi[0]) == pytest.approx((0.7, 0.9)) and (flo[0], fhi[0]) == pytest.approx((0.6, 0.8))


def test_projection_with_more_seeds_by_hand():
    # Four draws of X's two seeds: k seeds 0 and 4 - k seeds 1, k ~ Binomial(4, 1/2). lr 0.1 wins
    # on validation from k = 2 (3k > 2(4 - k)); X's test there is 0.7 at k = 2, 0.75 at k = 3, 0.8
    # at k = 4, and at lr 0.3 0.9 (k = 0) or 0.8 (k = 1): Y (0.74) is top-1 only at k = 2, 6/16.
    g = stability.grid(flip_runs(), ["X", "Y"], ["A"])
    proj = stability.projection(g, top=1, compared=[0, 1], budgets=[2, 4], reps=20000, seed=0, datasets=True)
    assert proj["seeds"].tolist() == [2, 4] and proj["gpu_hours"].tolist() == [1.0, 2.0]
    assert proj["p_top1"].tolist() == pytest.approx([1 / 2, 6 / 16], abs=0.015)
    assert stability.seed_budgets(3) == [3, 5, 6, 9, 10] and stability.seed_budgets(5) == [5, 10, 15]


def test_ties_share_the_better_rank():
    # two replicates: X and Y tied at the top of the first, Z alone at the top of the second
    p = stability.rank_probabilities(np.array([[0.7, 0.7, 0.5], [0.2, 0.4, 0.6]]))
    assert p[:, 0].tolist() == [0.5, 0.5, 0.5] and p[:, 1].tolist() == [0.0, 0.5, 0.0]
    assert p[:, 2].tolist() == [0.5, 0.0, 0.5]


def test_a_cell_without_a_finished_run_is_refused():
    runs = flip_runs()
    runs.loc[runs["condition"] == "Y", "status"] = "diverged"
    g = stability.grid(runs, ["X", "Y"], ["A"])
    with pytest.raises(AnalysisError, match="Y has no finished run on A"):
        stability.replicates(g, reps=10)


# ---------------------------------------------------------------- against an independent bootstrap


def synthetic_runs(seed: int = 7) -> pd.DataFrame:
    """3 conditions × 3 datasets × 3 lrs × 3 seeds of noisy accuracies; a few runs diverged, one
    condition has a single lr."""
    rng = np.random.default_rng(seed)
    rows = []
    for (k, c), (j, d), lr, s in itertools.product(
        enumerate("PQR"), enumerate(["d0", "d1", "d2"]), [0.01, 0.03, 0.1], [0, 1, 2]
    ):
        if c == "R" and lr != 0.03:
            continue
        base = 0.6 + 0.02 * k + 0.1 * j - 3 * (lr - 0.03) ** 2
        val, test = base + rng.normal(0, 0.03), base + rng.normal(0, 0.03)
        status = "diverged" if rng.random() < 0.08 and c != "R" else "finished"
        ok = status == "finished"
        rows.append((d, c, lr, s, val if ok else np.nan, test if ok else np.nan, status))
    return pd.DataFrame(rows, columns=["dataset", "condition", "lr", "seed", "val_acc", "test_acc", "status"])


def loop_bootstrap(runs: pd.DataFrame, conds, datasets, reps: int, seed: int, n_draw=None):
    """The bootstrap with plain loops and the same documented draws: per replicate, each
    condition's chosen lr per dataset position and its test accuracy there."""
    lrs = sorted(set(runs["lr"]))
    seeds = sorted(set(runs["seed"]))
    done = runs[runs["status"] == "finished"]
    val, test = {}, {}
    for r in done.itertuples():
        val[(r.condition, r.dataset, r.lr, r.seed)] = r.val_acc
        test[(r.condition, r.dataset, r.lr, r.seed)] = r.test_acc
    avail = {(c, d): [s for s in seeds if any((c, d, lr, s) in val for lr in lrs)] for c in conds for d in datasets}
    K, D = len(conds), len(datasets)
    n = {key: len(v) for key, v in avail.items()}
    draws = {key: (n_draw(v) if n_draw else v) for key, v in n.items()}
    m = max(draws.values())
    rng = np.random.default_rng(seed)
    dsel = rng.integers(0, D, size=(reps, D))
    u = rng.random((reps, K, D, m))
    chosen = np.full((reps, K, D), -1)
    acc = np.full((reps, K, D), np.nan)
    for r in range(reps):
        for k, c in enumerate(conds):
            for j in range(D):
                d = datasets[dsel[r, j]]
                picks = [avail[(c, d)][int(np.floor(u[r, k, j, i] * n[(c, d)]))] for i in range(draws[(c, d)])]
                best, best_val = -1, -np.inf
                for li, lr in enumerate(lrs):
                    vs = [val[(c, d, lr, s)] for s in picks if (c, d, lr, s) in val]
                    if vs and np.mean(vs) > best_val + 1e-12:
                        best, best_val = li, np.mean(vs)
                chosen[r, k, j] = best
                acc[r, k, j] = np.mean([test[(c, d, lrs[best], s)] for s in picks if (c, d, lrs[best], s) in test])
    return dsel, chosen, acc


def test_against_an_independent_bootstrap():
    runs = synthetic_runs()
    conds, datasets = ["P", "Q", "R"], ["d0", "d1", "d2"]
    g = stability.grid(runs, conds, datasets)
    boot = stability.replicates(g, reps=150, seed=11)
    dsel, chosen, acc = loop_bootstrap(runs, conds, datasets, 150, 11)
    assert (boot.dsel == dsel).all() and (boot.chosen == chosen).all()
    assert boot.test == pytest.approx(acc)
    means = acc.mean(axis=-1)
    ranks = np.array([[1 + sum(row[o] > row[k] for o in range(3)) for k in range(3)] for row in means])
    expect = np.array([[np.mean(ranks[:, k] == j + 1) for j in range(3)] for k in range(3)])
    assert stability.rank_probabilities(stability.condition_means(boot.test)) == pytest.approx(expect)
    # the re-choice share: per cell, over its appearances in the replicates
    orig = g.chosen
    for k in range(3):
        for d in range(3):
            at = dsel == d
            assert stability.rechoice(g, boot)[k, d] == pytest.approx((chosen[:, k][at] == orig[k, d]).mean())
    # more seeds: each cell draws round(n' / n · its seeds), the same documented draws
    _, _, acc6 = loop_bootstrap(runs, conds, datasets, 60, 5, n_draw=lambda v: round(v * 6 / 3))
    means6 = acc6.mean(axis=-1)
    for top in range(3):
        proj = stability.projection(g, top, [0, 1, 2], [6], reps=60, seed=5, datasets=True)
        assert proj["p_top1"].iloc[0] == pytest.approx(np.mean([(row > row[top]).sum() == 0 for row in means6]))


def test_the_replicate_choice_is_the_reports_rule():
    # rebuild a replicate's runs table from its draws and choose with selection.best_lr
    runs = synthetic_runs(seed=2)
    conds, datasets = ["P", "Q", "R"], ["d0", "d1", "d2"]
    g = stability.grid(runs, conds, datasets)
    boot = stability.replicates(g, reps=8, seed=4, datasets=False)
    u = np.random.default_rng(4).random((8, 3, 3, 3))
    n = stability.seed_counts(g)
    for r in range(8):
        parts = []
        for k, c in enumerate(conds):
            for j, d in enumerate(datasets):
                cell = runs[(runs["condition"] == c) & (runs["dataset"] == d)]
                avail = sorted(cell.loc[cell["status"] == "finished", "seed"].unique())
                for i in range(n[k, j]):
                    s = avail[int(np.floor(u[r, k, j, i] * n[k, j]))]
                    parts.append(cell[cell["seed"] == s].assign(seed=i))
        best = selection.best_lr(selection.seed_means(pd.concat(parts)), "val").set_index(["condition", "dataset"])
        for k, c in enumerate(conds):
            for j, d in enumerate(datasets):
                assert g.lrs[boot.chosen[r, k, j]] == best.loc[(c, d), "lr"]
                assert boot.test[r, k, j] == pytest.approx(best.loc[(c, d), "test_mean"])


def test_rank_probability_figure(tmp_path):
    from analysis import figures

    p = pd.DataFrame({"P(rank 1)": [0.6, 0.4], "P(rank 2)": [0.4, 0.6], "P(X ahead)": [np.nan, 0.6]}, index=["X", "Y"])
    files = figures.rank_probabilities(p, base=tmp_path / "ranks")
    assert [f.name for f in files] == ["ranks.png", "ranks.pdf"]
    assert files[0].read_bytes()[:4] == b"\x89PNG"
