"""analysis.stats on tiny arrays whose answers are worked out by hand (and checked against scipy)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy import stats as st

from analysis import AnalysisError
from analysis.stats import effects, paired, pooling, selection, significance


def toy_runs() -> pd.DataFrame:
    """2 datasets × 2 conditions × 2 lrs × 2 seeds, where choosing the lr on val or test differs.

    Cell (A, X): lr 0.1 has the better validation mean (0.81 vs 0.78) but the worse test mean
    (0.71 vs 0.76). Cell (B, Y) at lr 0.3: one seed diverged, so its mean is the other seed's.
    """
    rows = [
        # dataset, condition, lr, seed, val, test, status
        ("A", "X", 0.1, 0, 0.80, 0.70, "finished"),
        ("A", "X", 0.1, 1, 0.82, 0.72, "finished"),
        ("A", "X", 0.3, 0, 0.78, 0.75, "finished"),
        ("A", "X", 0.3, 1, 0.78, 0.77, "finished"),
        ("A", "Y", 0.1, 0, 0.60, 0.60, "finished"),
        ("A", "Y", 0.1, 1, 0.62, 0.62, "finished"),
        ("A", "Y", 0.3, 0, 0.50, 0.50, "finished"),
        ("A", "Y", 0.3, 1, 0.52, 0.52, "finished"),
        ("B", "X", 0.1, 0, 0.90, 0.90, "finished"),
        ("B", "X", 0.1, 1, 0.92, 0.92, "finished"),
        ("B", "X", 0.3, 0, 0.80, 0.80, "finished"),
        ("B", "X", 0.3, 1, 0.80, 0.80, "finished"),
        ("B", "Y", 0.1, 0, 0.70, 0.70, "finished"),
        ("B", "Y", 0.1, 1, 0.70, 0.72, "finished"),
        ("B", "Y", 0.3, 0, 0.95, 0.96, "finished"),
        ("B", "Y", 0.3, 1, math.nan, math.nan, "diverged"),
    ]
    return pd.DataFrame(rows, columns=["dataset", "condition", "lr", "seed", "val_acc", "test_acc", "status"])


def test_seed_means_count_statuses_and_skip_unfinished():
    m = selection.seed_means(toy_runs()).set_index(["dataset", "condition", "lr"])
    ax = m.loc[("A", "X", 0.1)]
    assert ax["test_mean"] == pytest.approx(0.71) and ax["test_std"] == pytest.approx(0.01)
    by = m.loc[("B", "Y", 0.3)]
    assert (by["n_runs"], by["n"], by["n_diverged"], by["n_failed"]) == (2, 1, 1, 0)
    assert by["test_mean"] == pytest.approx(0.96) and by["test_std"] == 0.0
    # ddof=1 is the sample std: sqrt(((0.70-0.71)^2 + (0.72-0.71)^2) / 1)
    m1 = selection.seed_means(toy_runs(), ddof=1).set_index(["dataset", "condition", "lr"])
    assert m1.loc[("A", "X", 0.1), "test_std"] == pytest.approx(math.sqrt(2) * 0.01)


def test_best_lr_on_val_and_on_test_differ():
    means = selection.seed_means(toy_runs())
    on_val = selection.best_lr(means, "val").set_index(["dataset", "condition"])
    on_test = selection.best_lr(means, "test").set_index(["dataset", "condition"])
    assert on_val.loc[("A", "X"), "lr"] == 0.1 and on_val.loc[("A", "X"), "test_mean"] == pytest.approx(0.71)
    assert on_test.loc[("A", "X"), "lr"] == 0.3 and on_test.loc[("A", "X"), "test_mean"] == pytest.approx(0.76)
    # (B, Y): lr 0.3 wins on both with its one finished seed; the diverged run is counted
    assert on_val.loc[("B", "Y"), "lr"] == 0.3 and on_val.loc[("B", "Y"), "n"] == 1
    assert on_val.loc[("B", "Y"), "n_diverged"] == 1
    # averages over datasets: X = (0.71 + 0.91) / 2 on val, (0.76 + 0.91) / 2 on test
    assert selection.wide(on_val.reset_index()).mean()["X"] == pytest.approx(0.81)
    assert selection.wide(on_test.reset_index()).mean()["X"] == pytest.approx(0.835)


def test_an_lr_where_every_run_diverged_cannot_be_chosen():
    runs = toy_runs()
    runs.loc[(runs["condition"] == "X") & (runs["lr"] == 0.1), ["val_acc", "test_acc"]] = math.nan
    runs.loc[(runs["condition"] == "X") & (runs["lr"] == 0.1), "status"] = "diverged"
    best = selection.best_lr(selection.seed_means(runs), "val").set_index(["dataset", "condition"])
    assert best.loc[("A", "X"), "lr"] == 0.3 and best.loc[("B", "X"), "lr"] == 0.3
    assert best.loc[("A", "X"), "n_diverged"] == 2


def test_all_diverged_cell_and_missing_condition_are_named():
    runs = toy_runs()
    bad = (runs["dataset"] == "B") & (runs["condition"] == "Y")
    runs.loc[bad, "status"] = "failed"
    best = selection.best_lr(selection.seed_means(runs), "val")
    assert best.set_index(["dataset", "condition"]).loc[("B", "Y"), "n_failed"] == 4
    with pytest.raises(AnalysisError, match=r"condition 'Y' has no usable finished run on B"):
        selection.check_complete(best)
    best = selection.best_lr(selection.seed_means(runs[~bad]), "val")
    with pytest.raises(AnalysisError, match=r"condition 'Y' has no runs on 1 of 2 datasets: B"):
        selection.check_complete(best)


def test_ranks_average_ties_and_higher_is_better():
    t = pd.DataFrame({"a": [90.0, 50.0], "b": [80.0, 50.0], "c": [80.0, 40.0]}, index=["d1", "d2"])
    r = selection.ranks(t)
    assert r.loc["d1"].tolist() == [1.0, 2.5, 2.5]
    assert r.loc["d2"].tolist() == [1.5, 1.5, 3.0]
    assert r.mean().tolist() == [1.25, 2.0, 2.75]


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.lists(hs.sampled_from([0.1, 0.2, 0.5, float("nan")]), min_size=3, max_size=3), max_size=5))
def test_ranks_are_scipys_rankdata_including_rows_with_a_missing_value(rows):
    values = np.array(rows, dtype=float).reshape(len(rows), 3)
    want = np.vstack([st.rankdata(-v, method="average") for v in values]) if len(values) else values
    got = selection.ranks(pd.DataFrame(values, columns=["a", "b", "c"])).to_numpy()
    assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


def test_ranks_with_gaps_and_ties_worked_by_hand():
    # d1: b alone first, a and c tied next (ranks 2 and 3 shared), d last after the gap
    t = pd.DataFrame({"a": [0.8, 0.9], "b": [0.9, 0.9], "c": [0.8, 0.9], "d": [0.1, 0.2]}, index=["d1", "d2"])
    assert selection.ranks(t).loc["d1"].tolist() == [2.5, 1.0, 2.5, 4.0]
    assert selection.ranks(t, ties="min").loc["d1"].tolist() == [2.0, 1.0, 2.0, 4.0]
    # d2: three tied at the top share ranks 1-3 (average 2, best 1); d keeps rank 4, not 2
    assert selection.ranks(t).loc["d2"].tolist() == [2.0, 2.0, 2.0, 4.0]
    assert selection.ranks(t, ties="min").loc["d2"].tolist() == [1.0, 1.0, 1.0, 4.0]


def test_ranks_of_an_array_rank_its_last_axis():
    v = np.array([[[0.3, 0.1, 0.2]], [[0.5, 0.5, 0.9]]])
    assert selection.ranks(v).tolist() == [[[1.0, 3.0, 2.0]], [[2.5, 2.5, 1.0]]]
    assert selection.ranks(v, ties="min").tolist() == [[[1.0, 3.0, 2.0]], [[2.0, 2.0, 1.0]]]
    with pytest.raises(ValueError, match="ties must be one of average, min"):
        selection.ranks(v, ties="dense")


def test_partial_ranks_rank_what_a_row_has():
    t = pd.DataFrame({"a": [0.5, 0.6], "b": [math.nan, 0.7], "c": [0.9, 0.6]})
    assert selection.ranks(t).loc[0].isna().all()  # as rankdata: a row with a gap has no ranks
    assert selection.ranks(t, partial=True).to_numpy().tolist()[0][::2] == [2.0, 1.0]
    assert math.isnan(selection.ranks(t, partial=True).loc[0, "b"])
    assert selection.ranks(t, partial=True).loc[1].tolist() == [2.5, 1.0, 2.5]


def test_ranks_of_floats_as_they_are_separate_decimal_ties():
    # 0.1 + 0.2 is 0.30000000000000004: tied in decimal, above 0.3 as a float
    v = np.array([0.1 + 0.2, 0.3, 0.2])
    assert selection.ranks(v, ties="min").tolist() == [1.0, 1.0, 3.0]
    assert selection.ranks(v, ties="min", decimal=False).tolist() == [1.0, 2.0, 3.0]


def test_choose_lrs_is_best_lr_of_the_seed_means():
    runs = toy_runs()
    for on in ("val", "test"):
        assert selection.choose_lrs(runs, on).equals(selection.best_lr(selection.seed_means(runs), on))
    got = selection.choose_lrs(runs, "val", ddof=1).set_index(["dataset", "condition"])
    assert got.loc[("A", "X"), "lr"] == 0.1 and got.loc[("A", "X"), "test_std"] == pytest.approx(0.02 / math.sqrt(2))
    assert math.isnan(got.loc[("B", "Y"), "test_std"])  # one finished seed: no std with ddof 1


def test_lr_robustness_is_mean_over_datasets_of_max_minus_min():
    means = selection.seed_means(toy_runs())
    gaps = selection.lr_gaps(means)
    # X: A |0.71 - 0.76| = 0.05, B |0.91 - 0.80| = 0.11; Y: A 0.61 - 0.51 = 0.10, B 0.96 - 0.71 = 0.25
    assert gaps.loc["A", "X"] == pytest.approx(0.05) and gaps.loc["B", "Y"] == pytest.approx(0.25)
    rob = selection.lr_robustness(means)
    assert rob["X"] == pytest.approx(0.08) and rob["Y"] == pytest.approx(0.175)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 → ×3, ×2, ×1 = 0.03, 0.06, 0.04 → running max 0.03, 0.06, 0.06
    adj = paired.holm([0.01, 0.04, 0.03])
    assert adj.tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert (adj <= 0.05).tolist() == [True, False, False]
    assert paired.holm([0.5, 0.9]).tolist() == [1.0, 1.0]  # capped at 1
    out = paired.holm([0.02, math.nan])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1])  # NaN stays out of m


@settings(max_examples=50, deadline=None)
@given(hs.lists(hs.floats(0, 1), min_size=1, max_size=8))
def test_holm_is_monotone_and_no_smaller_than_p(ps):
    adj = paired.holm(ps)
    assert np.all(adj >= np.asarray(ps) - 1e-12) and np.all(adj <= 1)
    order = np.argsort(ps, kind="stable")
    assert np.all(np.diff(adj[order]) >= -1e-12)


def test_wilcoxon_by_hand_and_against_scipy():
    # all five differences positive: W+ = 1+2+3+4+5 = 15; exact P(W+ >= 15) = 1/2^5
    w, p, n = paired.wilcoxon([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert (w, n) == (15.0, 5) and p == pytest.approx(1 / 32)
    # d = 3, -1, 2, 5: ranks of |d| 3, 1, 2, 4; W+ = 3 + 2 + 4 = 9; of the 16 sign patterns
    # only {1,2,3,4} (10) and {2,3,4} (9) reach 9: p = 2/16
    w, p, n = paired.wilcoxon([3, -1, 2, 5], [0, 0, 0, 0])
    assert (w, n) == (9.0, 4) and p == pytest.approx(0.125)
    # a zero difference is dropped (Wilcoxon's convention), as scipy does by default
    assert paired.wilcoxon([3, -1, 2, 5, 7], [0, 0, 0, 0, 7])[:2] == (9.0, pytest.approx(0.125))
    a, b = np.array([0.91, 0.88, 0.95, 0.70, 0.81]), np.array([0.90, 0.89, 0.93, 0.66, 0.80])
    ref = st.wilcoxon(a, b, alternative="greater")
    assert paired.wilcoxon(a, b)[:2] == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    # two-sided reports W+ too, with scipy's two-sided p
    w2, p2, _ = paired.wilcoxon([3, -1, 2, 5], [0, 0, 0, 0], "two-sided")
    assert w2 == 9.0 and p2 == pytest.approx(0.25)
    # no difference at all: no evidence
    assert paired.wilcoxon([1, 2], [1, 2]) == (0.0, 1.0, 0)


def test_signed_rank_null_with_ties_by_hand_and_against_scipy():
    # |d| = 1, 1, 2 → ranks 1.5, 1.5, 3; the 8 sign patterns give W+ = 0, 1.5, 1.5, 3, 3, 4.5,
    # 4.5, 6 with probability 1/8 each
    values, prob = paired.signed_rank_null([1.5, 1.5, 3])
    dist = {v: p for v, p in zip(values, prob) if p > 0}
    assert dist == {0.0: 1 / 8, 1.5: 2 / 8, 3.0: 2 / 8, 4.5: 2 / 8, 6.0: 1 / 8}
    # d = 1, -1, 2: W+ = 1.5 + 3 = 4.5; P(W+ >= 4.5) = 3/8
    assert paired.wilcoxon([1, -1, 2], [0, 0, 0]) == (4.5, pytest.approx(3 / 8), 3)
    # scipy computes the same exact p by a (slow) permutation test when |d| has ties
    d = np.array([0.4, 0.4, -0.1, 0.9, 0.4, 1.2, -0.9, 0.3, 0.3, 0.7, 0.8])
    for alt in ("greater", "less", "two-sided"):
        assert paired.wilcoxon(d, np.zeros_like(d), alt)[1] == pytest.approx(st.wilcoxon(d, alternative=alt).pvalue)


def test_paired_t_by_hand_and_against_scipy():
    # d = 1..5: mean 3, sd sqrt(2.5), se sqrt(2.5)/sqrt(5) = sqrt(0.5), t = 3/sqrt(0.5) = 4.2426
    t, p = paired.paired_t([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert t == pytest.approx(3 / math.sqrt(0.5))
    assert p == pytest.approx(st.t.sf(3 / math.sqrt(0.5), df=4))
    assert p == pytest.approx(st.ttest_rel([1, 2, 3, 4, 5], [0] * 5, alternative="greater").pvalue)
    assert all(math.isnan(v) for v in paired.paired_t([1, 1, 1], [0, 0, 0]))  # no spread: undefined


def test_paired_tests_table_reference_against_each_other():
    table = pd.DataFrame({"MHA": [5.0, 6, 7, 8, 9], "LN1": [4.0, 5, 6, 7, 8], "FC1": [6.0, 5, 8, 4, 9.5]})
    tests = significance.paired_tests(table, "MHA").set_index("other")
    assert list(tests.index) == ["LN1", "FC1"]
    ln1 = tests.loc["LN1"]
    assert ln1["mean_diff"] == 1.0 and ln1["wilcoxon_W"] == 15.0 and ln1["wilcoxon_p"] == pytest.approx(1 / 32)
    assert math.isnan(ln1["t"])  # identical differences: t undefined
    fc1 = tests.loc["FC1"]
    # the paper's t-test is two-sided (scipy's default); the Wilcoxon one-sided
    assert fc1["t_p"] == pytest.approx(st.ttest_rel(table["MHA"], table["FC1"]).pvalue)
    assert (fc1["t_alternative"], fc1["wilcoxon_alternative"]) == ("two-sided", "greater")
    one = significance.paired_tests(table, "MHA", t_alternative="greater").set_index("other").loc["FC1"]
    assert one["t_p"] == pytest.approx(st.ttest_rel(table["MHA"], table["FC1"], alternative="greater").pvalue)
    assert one["t_p_two_sided"] == pytest.approx(fc1["t_p"]) and one["t_alternative"] == "greater"
    with pytest.raises(AnalysisError, match="reference condition 'LN2' is not among"):
        significance.paired_tests(table, "LN2")


def test_friedman_by_hand():
    # every dataset ranks a > b > c: rank sums 4, 8, 12 (ranks 1 = best)
    # chi2 = 12 / (N k (k+1)) Σ R_j² − 3 N (k+1) = 12/48 · 224 − 48 = 8; p = exp(−8/2) for 2 df
    table = pd.DataFrame({"a": [9.0, 8, 7, 6], "b": [5.0, 4, 3, 2], "c": [1.0, 0, -1, -2]})
    fr = significance.friedman(table)
    assert fr["statistic"] == pytest.approx(8.0) and fr["p"] == pytest.approx(math.exp(-4))
    assert (fr["k"], fr["n"]) == (3, 4)
    assert math.isnan(significance.friedman(table[["a", "b"]])["p"])


def test_nemenyi_cd_by_hand():
    # k = 5, N = 11: q = 2.728, CD = 2.728 · sqrt(5·6 / 66) = 1.8393
    assert significance.nemenyi_cd(5, 11) == pytest.approx(2.728 * math.sqrt(30 / 66))
    assert significance.nemenyi_cd(5, 11) == pytest.approx(1.8393, abs=1e-4)
    # the table is the Studentized range / sqrt(2), which scipy gives for any k
    for k, q in significance.NEMENYI_Q05.items():
        assert q == pytest.approx(st.studentized_range.ppf(0.95, k, np.inf) / math.sqrt(2), abs=1e-3)
    assert significance.nemenyi_q(12) == pytest.approx(3.268, abs=1e-3)


def test_cd_cliques():
    r = pd.Series({"a": 1.0, "b": 1.5, "c": 2.2, "d": 4.0})
    # CD 1.3: a–b (0.5), a–c (1.2) < 1.3 → {a, b, c}; b–c but not c–d (1.8) → d alone
    assert significance.cd_cliques(r, 1.3) == [["a", "b", "c"]]
    # CD 1.0: {a, b}, {b, c}; d alone
    assert significance.cd_cliques(r, 1.0) == [["a", "b"], ["b", "c"]]
    assert significance.cd_cliques(r, 0.1) == []


def test_pairwise_wilcoxon_holm():
    table = pd.DataFrame({"a": [1.0, 2, 3, 4, 5, 6], "b": [0.0, 1, 2, 3, 4, 5], "c": [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]})
    pairs = significance.pairwise_wilcoxon(table)
    assert list(zip(pairs["a"], pairs["b"])) == [("a", "b"), ("a", "c"), ("b", "c")]
    # each pair: 6 same-signed differences, exact two-sided p = 2/64; Holm: ×3, ×2, ×1, then max
    assert pairs["p"].tolist() == pytest.approx([1 / 32] * 3)
    assert pairs["p_holm"].tolist() == pytest.approx([3 / 32] * 3)
    assert not pairs["significant"].any()


def test_spearman():
    assert significance.spearman([1, 2, 3, 4], [10, 20, 30, 40])[0] == pytest.approx(1.0)
    assert significance.spearman([1, 2, 3, 4], [4, 3, 2, 1])[0] == pytest.approx(-1.0)
    # d = rank differences 0, 0, -1, 1: rho = 1 − 6·2 / (4·15) = 0.8
    assert significance.spearman([1, 2, 3, 4], [1, 2, 4, 3])[0] == pytest.approx(0.8)
    assert math.isnan(significance.spearman([1, 2], [2, 1])[0])


def test_pool_plasticity():
    df = pd.DataFrame(
        {
            "model": "m",
            "dataset": "d",
            "mode": "shared",
            "layer": 0,
            "component": "MHA",
            "mean": [1.0, 3.0],
            "std": [1.0, 1.0],
            "n": [10, 10],
            "ci_low": 0.0,
            "ci_high": 0.0,
        }
    )
    p = pooling.pool_plasticity(df).iloc[0]
    # mean 2; var = (9·1 + 9·1 + 10·1 + 10·1) / 19 = 2; half = 1.96 · sqrt(2/20)
    assert p["mean"] == 2.0 and p["n"] == 20 and p["std"] == pytest.approx(math.sqrt(2))
    assert p["ci_high"] - p["mean"] == pytest.approx(1.959964 * math.sqrt(0.1))
    one = pooling.pool_plasticity(df.iloc[:1].assign(ci_low=0.4, ci_high=1.6)).iloc[0]
    assert (one["ci_low"], one["ci_high"]) == (0.4, 1.6)


def test_plasticity_vs_accuracy():
    plast = pd.DataFrame({"MHA": [3.0, 2.5], "FC1": [2.0, 2.0], "LN1": [1.0, 0.5]}, index=["d1", "d2"])
    acc = pd.DataFrame(
        {"MHA": [90.0, 80], "FC1": [85.0, 70], "LN1": [80.0, 75], "full": [95.0, 90]}, index=["d1", "d2"]
    )
    ranking, corr = pooling.plasticity_vs_accuracy(plast, acc)
    assert list(ranking.index) == ["MHA", "FC1", "LN1"]
    assert ranking.loc["MHA", "plasticity_rank"] == 1.0 and ranking.loc["LN1", "accuracy_rank"] == 2.5
    c = corr.set_index("dataset")["rho"]
    assert c["d1"] == pytest.approx(1.0) and c["d2"] == pytest.approx(0.5)
    # means: plasticity 2.75, 2.0, 0.75 → ranks 3, 2, 1; accuracy 85, 77.5, 77.5 → 3, 1.5, 1.5;
    # Pearson on the ranks: deviations (1, 0, -1), (1, -.5, -.5): 1.5 / sqrt(2 · 1.5) = sqrt(3)/2
    assert c["all"] == pytest.approx(math.sqrt(3) / 2)
    with pytest.raises(AnalysisError, match="fewer than two components"):
        pooling.plasticity_vs_accuracy(plast, acc[["full"]])


def test_display_scale_and_order():
    assert selection.display_scale([0.5, 0.9, math.nan]) == 100.0
    assert selection.display_scale([90.8, 89.8]) == 1.0
    assert selection.order_conditions(["zz", "MHA", "LN1", "aa"], ("LN1", "MHA")) == ["LN1", "MHA", "aa", "zz"]


def _exact_signed_rank(d_hundredths, alternative):
    """W+ and its exact p by enumerating every sign pattern, on integer differences (no float noise)."""
    import itertools

    from scipy import stats as st

    nz = [x for x in d_hundredths if x != 0]
    r = st.rankdata([abs(x) for x in nz])
    w = sum(ri for ri, x in zip(r, nz) if x > 0)
    null = [sum(ri for ri, s in zip(r, signs) if s) for signs in itertools.product((0, 1), repeat=len(nz))]
    ge = sum(v >= w - 1e-9 for v in null) / len(null)
    le = sum(v <= w + 1e-9 for v in null) / len(null)
    return w, {"greater": ge, "less": le, "two-sided": min(1.0, 2 * min(ge, le))}[alternative], len(nz)


def test_wilcoxon_ties_equal_in_decimal_are_ties():
    # 99.09 - 98.91 and 97.24 - 97.06 are both 0.18, but differ in the 15th digit as floats
    a = [99.09, 97.24, 91.50, 88.20, 95.10, 80.05, 70.30, 93.33, 85.00, 76.40, 90.10]
    b = [98.91, 97.06, 91.10, 88.50, 94.20, 79.00, 70.10, 93.90, 84.10, 75.10, 89.50]
    assert (a[0] - b[0]) != (a[1] - b[1])
    d = [round(x * 100) - round(y * 100) for x, y in zip(a, b)]
    for alt in ("two-sided", "greater"):
        w, p, n = _exact_signed_rank(d, alt)
        got = paired.wilcoxon(a, b, alt)
        assert got[0] == pytest.approx(w) and got[1] == pytest.approx(p, rel=1e-9) and got[2] == n
    w, _, n = _exact_signed_rank(d, "two-sided")
    assert effects.rank_biserial(a, b) == pytest.approx(2 * w / (n * (n + 1) / 2) - 1)


# Means equal in decimal, apart in the 15th digit as floats: 0.1 + 0.2 is 0.30000000000000004.
DECIMAL_TIES = pd.DataFrame(
    {"a": [0.1 + 0.2, 0.7 + 0.1, 0.9], "b": [0.3, 0.8, 0.5], "c": [0.2, 0.4, 0.6]}, index=["d1", "d2", "d3"]
)
EXACT_TIES = pd.DataFrame({"a": [0.3, 0.8, 0.9], "b": [0.3, 0.8, 0.5], "c": [0.2, 0.4, 0.6]}, index=DECIMAL_TIES.index)


def test_ranks_of_means_equal_in_decimal_are_ties():
    assert DECIMAL_TIES.loc["d1", "a"] != DECIMAL_TIES.loc["d1", "b"]  # as floats they differ
    r = selection.ranks(DECIMAL_TIES)
    assert r.loc["d1"].tolist() == [1.5, 1.5, 3.0] and r.loc["d2"].tolist() == [1.5, 1.5, 3.0]
    assert r.equals(selection.ranks(EXACT_TIES))


def test_friedman_of_means_equal_in_decimal_is_that_of_the_ties():
    got, want = significance.friedman(DECIMAL_TIES), significance.friedman(EXACT_TIES)
    assert got["statistic"] == pytest.approx(want["statistic"], rel=1e-12) and got["p"] == pytest.approx(want["p"])
    tied = pd.DataFrame({"a": [0.1 + 0.2, 0.8], "b": [0.3, 0.7 + 0.1], "c": [0.3, 0.8]})
    assert "same accuracy on every dataset" in significance.friedman_skip(tied)
