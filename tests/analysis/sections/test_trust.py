"""The report's statistics past p-values, each on a hand-worked or library-checked example:
bootstrap intervals (against an independent resample written here), probability of
improvement, Bayesian ROPE tests (against baycomp), effect sizes, tuning budget, variance."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate
from scipy import stats as st

from analysis import AnalysisError, bayes, intervals
from analysis.stats import budget, effects, paired, selection, significance, variance

# ---------------------------------------------------------------- bootstrap


def test_score_array_pairs_runs_by_seed_and_leaves_gaps():
    sel = pd.DataFrame(
        {
            "condition": ["A", "A", "B", "A"],
            "dataset": ["d1", "d1", "d1", "d2"],
            "seed": [0, 2, 2, 0],
            "test_acc": [0.1, 0.2, 0.3, 0.4],
        }
    )
    scores, seeds = intervals.score_array(sel, ["A", "B"], ["d1", "d2"])
    assert seeds == [0, 2] and scores.shape == (2, 2, 2)
    assert scores[0, 0].tolist() == [0.1, 0.2] and scores[0, 1, 0] == 0.4
    assert np.isnan(scores[1, 0, 0]) and scores[1, 0, 1] == 0.3


def test_iqm_is_scipy_trim_mean_and_mean_is_mean_of_seed_means():
    x = np.array([[[1.0, 2.0, 3.0], [4.0, 5.0, np.nan]], [[9.0, 1.0, 1.0], [2.0, 8.0, 7.0]]])
    for k in range(2):
        finite = x[k][~np.isnan(x[k])]
        assert intervals.iqm(x[k]) == pytest.approx(st.trim_mean(finite, 0.25))
    # condition 0: (mean(1,2,3) + mean(4,5)) / 2 = (2 + 4.5) / 2
    assert intervals.mean_score(x)[0] == pytest.approx(3.25)


def test_probability_of_improvement_by_hand():
    # dataset 1: x (1, 2) vs y (1.5, 0.5): 1 > 0.5, 2 > 1.5, 2 > 0.5 -> 3/4
    # dataset 2: x (1) vs y (1, absent): a tie -> 1/2; the mean over datasets is 0.625
    x = np.array([[1.0, 2.0], [1.0, np.nan]])
    y = np.array([[1.5, 0.5], [1.0, np.nan]])
    assert intervals.improvement(x, y) == pytest.approx(0.625)
    assert intervals.improvement(y, x) == pytest.approx(0.375)


def test_probability_of_improvement_from_ranks_counts_every_pair_exactly():
    """Counted from ranks, P(X > Y) equals the count over every pair of seeds, bit for bit:
    ties within and across x and y (values rounded to few digits), absent seeds, a dataset with
    no pair, replicate axes in front, and an infinite score (counted pair by pair)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        shape = (*rng.integers(1, 4, size=rng.integers(0, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 8)))
        x, y = (np.round(rng.random(shape), int(rng.integers(0, 3))) for _ in range(2))
        x[rng.random(shape) < 0.3] = np.nan
        y[rng.random(shape) < 0.3] = np.nan
        if rng.random() < 0.1:
            x[(0,) * len(shape)] = np.inf
        by_pairs = intervals._improvement_by_pairs(x, y)
        assert np.array_equal(intervals.improvement(x, y), by_pairs, equal_nan=True), (x, y)


def toy_scores(seed=3, K=3, D=5, S=4):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.6, 0.95, size=(1, D, 1))
    scores = base + np.array([0.0, -0.01, -0.03])[:K, None, None] + rng.normal(0, 0.01, (K, D, S))
    scores[1, 2, 3] = np.nan  # a missing seed is never drawn
    return scores


def naive_bootstrap(scores, reps, seed):
    """An independent two-level resample written plainly: datasets, then seeds per condition."""
    rng = np.random.default_rng(seed)
    K, D, _ = scores.shape
    means = np.empty((reps, K))
    poi = np.empty(reps)
    for r in range(reps):
        ds = rng.choice(D, D)
        drawn = []
        for k in range(K):
            rows = []
            for d in ds:
                seeds = scores[k, d][~np.isnan(scores[k, d])]
                rows.append(rng.choice(seeds, len(seeds)))
            drawn.append(rows)
            means[r, k] = np.mean([row.mean() for row in rows])
        poi[r] = np.mean(
            [np.mean([(a > b) + 0.5 * (a == b) for a in xa for b in xb]) for xa, xb in zip(drawn[0], drawn[1])]
        )
    return means, poi


def test_bootstrap_intervals_agree_with_an_independent_resample():
    scores = toy_scores()
    agg = intervals.aggregate_intervals(scores, ["A", "B", "C"], reps=3000, seed=11)
    pairs = intervals.pairwise_intervals(scores, ["A", "B", "C"], reps=3000, seed=11)
    means, poi = naive_bootstrap(scores, 3000, seed=12345)
    mean_rows = agg[agg["statistic"] == "mean"].set_index("condition")
    for k, c in enumerate("ABC"):
        lo, hi = np.percentile(means[:, k], [2.5, 97.5])
        width = hi - lo
        assert mean_rows.loc[c, "low"] == pytest.approx(lo, abs=0.1 * width)
        assert mean_rows.loc[c, "high"] == pytest.approx(hi, abs=0.1 * width)
        assert mean_rows.loc[c, "estimate"] == pytest.approx(intervals.mean_score(scores)[k])
    ab = pairs.set_index(["a", "b"]).loc[("A", "B")]
    lo, hi = np.percentile(poi, [2.5, 97.5])
    assert ab["p_improve_low"] == pytest.approx(lo, abs=0.05)
    assert ab["p_improve_high"] == pytest.approx(hi, abs=0.05)
    assert ab["cliffs_delta"] == pytest.approx(2 * ab["p_improve"] - 1)


def test_bootstrap_is_deterministic_and_draws_only_finished_seeds():
    scores = toy_scores()
    a, va = intervals.resample(scores, 50, seed=4)
    b, _ = intervals.resample(scores, 50, seed=4)
    assert np.array_equal(a, b, equal_nan=True)
    finished = set(np.round(scores[~np.isnan(scores)], 12))
    assert set(np.round(a[va], 12)) <= finished
    # condition 1 has 3 finished seeds on dataset 2: every draw of it fills exactly 3 slots
    fixed, valid = intervals.resample(scores, 20, seed=4, datasets=False)
    assert (valid[:, 1, 2].sum(axis=-1) == 3).all() and (valid[:, 0, 2].sum(axis=-1) == 4).all()


def test_bootstrap_of_one_dataset_mean_matches_the_analytic_spread():
    # the bootstrap sd of a mean of n values is the ddof-0 sd over sqrt(n)
    x = np.arange(10.0)[None, None, :]
    v, _ = intervals.resample(x, 20000, seed=0, datasets=False)
    assert intervals.mean_score(v)[:, 0].std() == pytest.approx(np.std(x) / math.sqrt(10), rel=0.03)


def test_rank_correlation_rows_is_spearman():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    y[0] = x[0] ** 3
    x[1, :2] = 1.0  # ties
    rho = intervals.rank_correlation_rows(x, y)
    for i in range(4):
        assert rho[i] == pytest.approx(st.spearmanr(x[i], y[i]).statistic)
    assert rho[0] == pytest.approx(1.0)


def test_correlation_intervals_shapes_and_perfect_order():
    scores = toy_scores(K=3)  # A > B > C on average
    measure = pd.DataFrame([[3.0, 2.0, 1.0]] * 5, columns=["A", "B", "C"], index=[f"d{i}" for i in range(5)])
    corr = intervals.correlation_intervals(measure, scores, ["A", "B", "C"], list(measure.index), reps=200, seed=0)
    assert list(corr["dataset"]) == list(measure.index) + ["mean"]
    assert ((corr["low"] <= corr["rho"] + 1e-12) & (corr["rho"] <= corr["high"] + 1e-12)).all()
    with pytest.raises(AnalysisError, match="at least three components"):
        intervals.correlation_intervals(measure[["A", "B"]], scores, ["A", "B", "C"], list(measure.index))


# ---------------------------------------------------------------- Bayesian tests


def test_signed_rank_is_baycomps_test():
    baycomp = pytest.importorskip("baycomp")
    rng = np.random.default_rng(1)
    x = rng.normal(0.9, 0.03, 11)
    y = x - 0.004 + rng.normal(0, 0.004, 11)
    for rope in (0.005, 0.0):
        ours = bayes.signed_rank_samples(x, y, rope, nsamples=3000, random_state=3)
        ref = baycomp.SignedRankTest.sample(x, y, rope, nsamples=3000, random_state=3)
        assert np.allclose(ours, ref, atol=1e-12)
    probs = bayes.signed_rank(x, y, 0.005, nsamples=3000, random_state=3)
    ref = baycomp.SignedRankTest.probs(x, y, 0.005, nsamples=3000, random_state=3)
    assert (probs["p_a"], probs["p_rope"], probs["p_b"]) == pytest.approx(ref)


def test_signed_rank_by_hand_on_clear_cases():
    x = np.arange(8.0)
    # b better on every dataset; only the prior's pseudo-observation at 0 leaves a little doubt
    assert bayes.signed_rank(x, x + 2.0, 0.5)["p_b"] > 0.999
    assert bayes.signed_rank(x, x + 0.1, 0.5)["p_rope"] == 1.0  # always inside the ROPE
    assert math.isnan(bayes.signed_rank([1.0], [2.0], 0.5)["p_rope"])  # one dataset: no test


# baycomp 1.0.3's HierarchicalTest (pystan 3.10, 4 chains × 4,000 samples) on these data, with
# runs=1e-9 so that its correlation rho = runs/seeds is ~0 as here: (p_left, p_rope, p_right).
STAN_REFERENCE = {"moderate": (0.0890625, 0.9095625, 0.001375), "clear": (1.0, 0.0, 0.0)}


def stan_cases():
    rng = np.random.default_rng(7)
    q, m = 6, 5
    base = rng.normal(90, 5, size=(q, 1))
    x = base + rng.normal(0, 0.6, size=(q, m))
    eff = np.array([0.3, 0.5, 0.1, 0.4, 0.6, 0.2])[:, None]
    y = x - eff + rng.normal(0, 0.4, size=(q, m))
    y2 = x - 2.0 + rng.normal(0, 0.4, size=(q, m))
    return {"moderate": (x, y), "clear": (x, y2)}


def test_hierarchical_agrees_with_baycomps_stan_fit():
    cases = stan_cases()
    out = bayes.hierarchical([cases["moderate"], cases["clear"]], 0.5, random_state=0)
    for res, name in zip(out, ("moderate", "clear")):
        ref = STAN_REFERENCE[name]
        assert (res["p_a"], res["p_rope"], res["p_b"]) == pytest.approx(ref, abs=0.04), name
        assert res["datasets"] == 6
    # the posterior mean difference y − x is near the data's: −0.35 and −2
    assert out[0]["delta0"] == pytest.approx(-0.35, abs=0.1)
    assert out[1]["delta0"] == pytest.approx(-2.0, abs=0.15)


def test_hierarchical_degrades_without_seeds_or_datasets():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    one_seed = bayes.hierarchical([(x[:, :1], x[:, :1] + 1)], 0.5)[0]
    assert math.isnan(one_seed["p_rope"]) and one_seed["datasets"] == 0
    one_dataset = bayes.hierarchical([(x[:1], x[:1] + 1)], 0.5)[0]
    assert math.isnan(one_dataset["p_rope"])
    with pytest.raises(AnalysisError, match="ROPE"):
        bayes.hierarchical([(x, x)], -1.0)


def test_truncated_samplers_match_their_distributions():
    rng = np.random.default_rng(0)
    # Gamma(shape 2, rate 1) truncated to [1, 3]: mean by numerical integration
    g = bayes._trunc_gamma(np.full(40000, 2.0), np.ones(40000), np.ones(40000), np.full(40000, 3.0), rng)
    pdf = lambda t: st.gamma.pdf(t, 2.0)  # noqa: E731
    mean = integrate.quad(lambda t: t * pdf(t), 1, 3)[0] / integrate.quad(pdf, 1, 3)[0]
    assert g.min() >= 1 and g.max() <= 3 and g.mean() == pytest.approx(mean, abs=0.01)
    h = bayes._gamma_above(np.full(40000, 2.0), np.ones(40000), np.full(40000, 1.0), rng)
    assert h.min() >= 1 and h.mean() == pytest.approx(
        st.gamma.expect(lambda t: t, (2.0,), lb=1, conditional=True), abs=0.02
    )
    n = bayes._trunc_normal(np.zeros(40000), np.ones(40000), -0.5, 2.0, rng)
    assert n.min() >= -0.5 and n.mean() == pytest.approx(st.truncnorm.mean(-0.5, 2.0), abs=0.01)


# ---------------------------------------------------------------- effect sizes


def test_hodges_lehmann_by_hand():
    # d = 1, 2, 10: Walsh averages 1, 1.5, 2, 5.5, 6, 10 -> median 3.75; n = 3: no 95% interval
    est, lo, hi = effects.hodges_lehmann([1, 2, 10], [0, 0, 0])
    assert est == 3.75 and math.isnan(lo) and math.isnan(hi)
    # d = 1..11: P(W+ <= 10) = 0.021 <= 0.025 < P(W+ <= 11), so the interval runs from the 11th
    # smallest to the 11th largest of the 66 Walsh averages: 3.5 and 8.5
    est, lo, hi = effects.hodges_lehmann(np.arange(1.0, 12.0), np.zeros(11))
    assert (est, lo, hi) == (6.0, 3.5, 8.5)
    null_w, null_p = paired.signed_rank_null(np.arange(1, 12))
    assert null_p[null_w <= 10].sum() == pytest.approx(0.0210, abs=1e-4)


def test_hodges_lehmann_interval_inverts_the_wilcoxon_test():
    rng = np.random.default_rng(5)
    d = rng.normal(0.5, 1.0, 12)
    est, lo, hi = effects.hodges_lehmann(d, np.zeros(12))
    # shifts just inside the interval are not rejected at 5% (two-sided), just outside are
    assert st.wilcoxon(d - (lo + 1e-9)).pvalue > 0.05 and st.wilcoxon(d - (lo - 1e-6)).pvalue <= 0.05


def test_rank_biserial_by_hand():
    # d = 1, −2, 3: ranks 1, 2, 3; W+ = 4 of 6 -> r = 2·4/6 − 1 = 1/3
    assert effects.rank_biserial([1, -2, 3], [0, 0, 0]) == pytest.approx(1 / 3)
    assert effects.rank_biserial([1, 2], [0, 0]) == 1.0
    assert math.isnan(effects.rank_biserial([1, 2], [1, 2]))


def test_holm_matches_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = [0.01, 0.04, 0.03, 0.2, 0.001, 0.04]
    assert paired.holm(p) == pytest.approx(multitest.multipletests(p, method="holm")[1])


def test_wilcoxon_cliques_follow_the_holm_decisions():
    r = pd.Series({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    pairs = pd.DataFrame(
        {"a": ["a", "a", "b", "c"], "b": ["c", "d", "d", "d"], "significant": [True, True, False, False]}
    )
    # a–c significant: a joins b only; b, c, d share no significant pair
    assert significance.wilcoxon_cliques(r, pairs) == [["a", "b"], ["b", "c", "d"]]
    # the Nemenyi bars are rank_cliques with "ranks apart by CD or more"
    for cd in (0.5, 1.5, 2.5, 3.5):
        assert significance.rank_cliques(r, lambda x, y: abs(r[x] - r[y]) >= cd) == significance.cd_cliques(r, cd)


# ---------------------------------------------------------------- tuning budget, variance


def test_expected_max_by_hand():
    # values 1, 2, 3: E[max of 1] = 2; of 2: 1·1/9 + 2·3/9 + 3·5/9 = 22/9
    assert budget.expected_max([3, 1, 2], 1) == pytest.approx(2.0)
    assert budget.expected_max([3, 1, 2], 2) == pytest.approx(22 / 9)
    assert budget.expected_max([3, 1, 2], 50) == pytest.approx(3.0, abs=1e-6)
    # the test accuracy at the draw best on validation: same weights on the follower
    assert budget.expected_max([3, 1, 2], 2, follow=[30, 10, 20]) == pytest.approx(220 / 9)


def test_tuning_budget_and_lr_edges():
    means = pd.DataFrame(
        {
            "dataset": ["d"] * 3 + ["e"] * 2,
            "condition": ["X"] * 5,
            "lr": [0.1, 0.3, 1.0, 0.1, 0.3],
            "val_mean": [1.0, 2.0, 3.0, 5.0, 4.0],
            "test_mean": [1.0, 2.0, 3.0, 5.0, 4.0],
            "val_std": 0.0,
            "test_std": 0.0,
            "n_runs": 1,
            "n": 1,
            "n_diverged": 0,
            "n_failed": 0,
        }
    )
    b = budget.tuning_budget(means).set_index("n_lrs")
    # n = 2: d gives 22/9; e (values 4, 5): 4·1/4 + 5·3/4 = 4.75; mean over the datasets
    assert b.loc[2, "expected_val"] == pytest.approx((22 / 9 + 4.75) / 2)
    assert b.loc[3, "datasets"] == 1 and b.loc[1, "datasets"] == 2
    best = selection.best_lr(means, "val")
    edges = budget.lr_edges(means, best).set_index("dataset")
    assert edges.loc["d", "edge"] == "high" and edges.loc["e", "edge"] == "low"


def test_variance_decomposition_by_hand():
    # one dataset pair: d1 has lr a (1, 3) and lr b (5, 7); d2 has lr a (11, 13)
    runs = pd.DataFrame(
        {
            "condition": "X",
            "dataset": ["d1"] * 4 + ["d2"] * 2,
            "lr": ["a", "a", "b", "b", "a", "a"],
            "seed": [0, 1, 0, 1, 0, 1],
            "test_acc": [1.0, 3.0, 5.0, 7.0, 11.0, 13.0],
            "status": "finished",
        }
    )
    v = variance.variance_decomposition(runs).iloc[0]
    # grand mean 40/6; dataset means 4 (x4) and 12 (x2); lr means 2, 6 (d1) and 12
    y = runs["test_acc"].to_numpy()
    assert v["var_total"] == pytest.approx(np.var(y))
    assert v["var_dataset"] == pytest.approx((4 * (4 - 40 / 6) ** 2 + 2 * (12 - 40 / 6) ** 2) / 6)
    assert v["var_lr"] == pytest.approx(4 * 4 / 6)  # |2 − 4| = |6 − 4| = 2 on four runs
    assert v["var_seed"] == pytest.approx(1.0)  # every run 1 from its cell mean
    assert v["var_dataset"] + v["var_lr"] + v["var_seed"] == pytest.approx(v["var_total"])


# ---------------------------------------------------------------- the report's new sections

NEW_TABLES = ("intervals", "intervals_pairwise", "rope", "tuning_budget", "lr_edges", "variance")
NEW_FIGURES = ("intervals", "probability_of_improvement", "rope", "tuning_budget")


@pytest.fixture(scope="module")
def study_csv(tmp_path_factory):
    from analysis.synthetic import fake_runs

    p = tmp_path_factory.mktemp("study") / "runs.csv"
    fake_runs(
        n_datasets=4, conditions=("LN1", "MHA", "FC1", "linear_probe"), lrs=(0.001, 0.01, 0.1), seeds=(0, 1, 2), seed=1
    ).to_csv(p, index=False)
    return p


def test_report_writes_every_new_table_and_figure(study_csv, tmp_path, capsys):
    from analysis.commands import report

    out = tmp_path / "out"
    assert report.main(["--csv", str(study_csv), "--out", str(out), "--bootstrap-reps", "300"]) == 0
    text = capsys.readouterr().out
    for title in (
        "## Interval estimates (stratified bootstrap)",
        "## Practical equivalence (ROPE ±0.5 accuracy points)",
        "## Tuning budget and the lr grid",
        "## Where the spread comes from",
    ):
        assert title in text
    assert "- MHA vs FC1: " in text and "hierarchical: " in text
    for name in NEW_TABLES:
        for suffix in (".md", ".csv", ".tex"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, name + suffix
    for fig in NEW_FIGURES:
        assert (out / "figures" / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / "figures" / f"{fig}.pdf").read_bytes()[:4] == b"%PDF"
    rope = pd.read_csv(out / "rope.csv")
    assert len(rope) == 6 and list(rope.loc[:2, "a"]) == ["MHA"] * 3  # reference first
    for t in ("signed_rank", "hierarchical"):
        assert rope[[f"{t}_p_a", f"{t}_p_rope", f"{t}_p_b"]].sum(axis=1).to_numpy() == pytest.approx(1.0)
    # the signed-rank column is the function's output on the per-dataset means of the tables
    acc = pd.read_csv(out / "accuracy_val_selected.csv")
    table = selection.wide(acc)
    ref = bayes.signed_rank(table["MHA"], table["FC1"], 0.005)
    row = rope.set_index(["a", "b"]).loc[("MHA", "FC1")]
    assert row["signed_rank_p_rope"] == pytest.approx(ref["p_rope"])
    # effect sizes sit beside the p-values
    tests = pd.read_csv(out / "tests.csv").set_index("other")
    hl = effects.hodges_lehmann(table["MHA"], table["LN1"])
    assert tests.loc["LN1", ["hl", "hl_low", "hl_high"]].tolist() == pytest.approx(list(hl), nan_ok=True)
    assert "HL shift [95% CI]" in (out / "posthoc.md").read_text()
    # the mean's interval brackets the accuracy table's average
    agg = pd.read_csv(out / "intervals.csv")
    mean = agg[agg["statistic"] == "mean"].set_index("condition")
    assert mean.loc["MHA", "estimate"] == pytest.approx(table["MHA"].mean())
    assert (mean["low"] <= mean["estimate"]).all() and (mean["estimate"] <= mean["high"]).all()
    assert "Mean-rank based" in (out / "report.md").read_text() or "mean-rank based" in text


def test_report_flags(study_csv, tmp_path, capsys):
    from analysis.commands import report

    out = tmp_path / "out"
    assert (
        report.main(
            [
                "--csv",
                str(study_csv),
                "--out",
                str(out),
                "--bootstrap-reps",
                "200",
                "--rope",
                "2",
                "--no-hierarchical",
                "--cd-cliques",
                "wilcoxon",
                "--bootstrap-over",
                "seeds",
                "--bootstrap-seed",
                "3",
                "--no-figures",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "## Practical equivalence (ROPE ±2 accuracy points)" in text
    assert "Hierarchical test: off (--no-hierarchical)." in text
    assert "The CD diagram's bars come from the Holm-corrected Wilcoxon tests" in text
    assert "200 bootstrap replicates (seed 3) resampling seeds within each dataset" in text
    assert "hierarchical_p_rope" not in pd.read_csv(out / "rope.csv").columns
    assert report.main(["--csv", str(study_csv), "--out", str(out), "--rope", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --rope must be a finite number >= 0, got -1.0"


def test_report_degrades_on_one_dataset_and_one_seed(study_csv, tmp_path, capsys):
    from analysis.commands import report

    assert (
        report.main(
            ["--csv", str(study_csv), "--out", str(tmp_path / "a"), "--datasets", "ds00", "--bootstrap-reps", "100"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "One dataset (ds00): the Bayesian tests compare conditions over datasets" in text
    assert "One dataset: the intervals reflect seeds only." in text
    runs = pd.read_csv(study_csv)
    one = tmp_path / "one_seed.csv"
    runs[runs["seed"] == 0].to_csv(one, index=False)
    assert report.main(["--csv", str(one), "--out", str(tmp_path / "b"), "--bootstrap-reps", "100"]) == 0
    text = capsys.readouterr().out
    assert "One run per dataset and condition: the intervals reflect datasets only" in text
    assert "Hierarchical test: needs two or more datasets with two or more paired seeds" in text
    assert "One seed: the seed part is zero by construction." in text


def test_report_condition_order_is_the_components_order():
    from analysis import reporting
    from raystudy.models.components import PAPER_CONDITIONS, STUDY_COMPONENTS

    assert reporting.paper_order() == tuple(dict.fromkeys(PAPER_CONDITIONS + STUDY_COMPONENTS + ("lora",)))


def test_report_says_when_no_interval_can_be_estimated(study_csv, tmp_path, capsys):
    from analysis.commands import report

    runs = pd.read_csv(study_csv)
    one = tmp_path / "one_seed.csv"
    runs[runs["seed"] == 0].to_csv(one, index=False)
    assert (
        report.main(["--csv", str(one), "--out", str(tmp_path / "a"), "--bootstrap-over", "seeds", "--no-hierarchical"])
        == 0
    )
    assert "datasets fixed (--bootstrap-over seeds): no interval can be estimated." in capsys.readouterr().out
    assert not (tmp_path / "a" / "intervals.csv").exists()
