"""The paper's tables from runs: main table, relative gain, optimizer ablation, settings,
parameter efficiency; the paper's table shape as input; labelled test alternatives; one dataset."""

import io
import math

import pandas as pd
import pytest
from scipy import stats as st

from analysis import AnalysisError, load, reporting, tables
from analysis.commands import report
from analysis.stats import selection, significance

FIVE = ["LN1", "MHA", "LN2", "FC1", "FC2"]

# The paper's table shape, made up (not the paper's numbers): one row per dataset, one column
# per condition, a ± cell and the table's own average row (dropped on reading).
WIDE_CSV = """dataset,LN1,MHA,LN2,FC1,FC2,full,linear_probe
d1,80.0,84.0,81.0,83.0,82.0,90.0,70.0
d2,70.0,75.5,71.0,74.0,72.5,80.0,60.0
d3,60.0 ± 0.5,66.0,61.5,64.0,62.0,50.0,55.0
d4,90.0,92.0,90.5,91.0,91.5,95.0,85.0
d5,50.0,53.0,52.0,51.5,50.5,58.0,40.0
d6,85.0,88.0,86.0,87.5,86.5,89.0,80.0
Average,72.5,76.4,73.7,75.2,74.2,77.0,65.0
"""
WIDE = pd.read_csv(io.StringIO(WIDE_CSV.replace("60.0 ± 0.5", "60.0"))).set_index("dataset").drop("Average")


@pytest.fixture
def wide_csv(tmp_path):
    p = tmp_path / "paper_shape.csv"
    p.write_text(WIDE_CSV)
    return p


# ---------------------------------------------------------------- pure functions


def test_relative_gain_by_hand():
    table = pd.DataFrame({"lp": [50.0, 80.0], "MHA": [60.0, 84.0]}, index=["a", "b"])
    g = selection.relative_gain(table, "lp")
    # (60 − 50) / 50 = 20%; (84 − 80) / 80 = 5%
    assert g["MHA"].tolist() == pytest.approx([20.0, 5.0]) and g["lp"].tolist() == [0.0, 0.0]
    shown = tables.dataset_table(g, ["lp", "MHA"], "average", 2)
    assert shown.loc["average", "MHA"] == "12.50"
    with pytest.raises(AnalysisError, match="gain reference 'full'"):
        selection.relative_gain(table, "full")


def _best(rows):
    return pd.DataFrame(rows, columns=["dataset", "condition", "test_mean"])


def test_setting_means_over_common_datasets():
    sgd = _best([("a", "MHA", 0.8), ("b", "MHA", 0.6), ("c", "MHA", 0.1)])
    adamw = _best([("a", "MHA", 0.9), ("b", "MHA", 0.7), ("a", "LN1", 0.5)])
    ab = selection.setting_means({"sgd": sgd, "adamw": adamw}, ["MHA", "LN1"])
    # c is sgd's only: left out, so both columns average a and b
    assert ab.loc["MHA", "sgd"] == pytest.approx(0.7) and ab.loc["MHA", "adamw"] == pytest.approx(0.8)
    assert ab.loc["MHA", "datasets"] == 2
    assert ab.loc["LN1", "datasets"] == 0 and math.isnan(ab.loc["LN1", "sgd"])
    shown = tables.ablation_table(ab, scale=100)
    assert shown.loc["MHA"].tolist() == ["70.0", "80.0", "10.0", "2"]
    assert list(shown.columns) == ["sgd", "adamw", "adamw − sgd", "datasets"]


def test_trainable_params_and_efficiency_by_hand():
    runs = pd.DataFrame(
        {
            "dataset": ["a", "a", "b", "a", "b"],
            "condition": ["MHA", "MHA", "MHA", "full", "full"],
            "trainable_params": [100.0, 100.0, 120.0, 1000.0, float("nan")],
        }
    )
    params = selection.trainable_params(runs)
    assert params.loc["a", "MHA"] == 100 and params.loc["b", "MHA"] == 120
    assert math.isnan(params.loc["b", "full"])
    acc = pd.DataFrame({"MHA": [0.8, 0.6], "full": [0.9, 0.7]}, index=["a", "b"])
    eff = selection.parameter_efficiency(params, acc)
    assert list(eff.index) == ["MHA", "full"]  # by count
    assert eff.loc["MHA", "params"] == 110 and eff.loc["MHA", "accuracy"] == pytest.approx(0.7)
    # full has a count on a only: its accuracy is a's, over the same datasets as the count
    assert eff.loc["full", "accuracy"] == pytest.approx(0.9) and eff.loc["full", "datasets"] == 1
    assert eff.loc["MHA", "share_of_full"] == pytest.approx(0.11)
    shown = tables.efficiency_table(eff, 100)
    assert shown.loc["full"].tolist() == ["1,000", "100.000", "90.0", "1"]
    assert selection.trainable_params(runs.drop(columns="trainable_params")).empty


def test_main_table_is_datasets_by_conditions_with_average():
    best = pd.DataFrame(
        {
            "dataset": ["a", "a", "b", "b"],
            "condition": ["X", "Y", "X", "Y"],
            "test_mean": [0.8, 0.6, 0.7, 0.9],
            "test_std": [0.01, math.nan, 0.02, 0.0],
        }
    )
    t = tables.main_table(best, ["X", "Y"], pd.Series({"X": 1.5, "Y": 1.5}), scale=100)
    assert list(t.index) == ["a", "b", "average", "avg rank"]
    assert t.loc["a"].tolist() == ["80.0 ± 1.0", "60.0"] and t.loc["average"].tolist() == ["75.0", "75.0"]


def test_tests_table_names_each_alternative():
    table = pd.DataFrame({"MHA": [5.0, 6, 7, 8, 9], "FC1": [6.0, 5, 8, 4, 9.5]})
    two = tables.tests_table(significance.paired_tests(table, "MHA"))
    assert "Wilcoxon p (one-sided, reference greater)" in two.columns
    assert "t-test p (two-sided)" in two.columns and len([c for c in two if c.startswith("t-test")]) == 1
    one = tables.tests_table(significance.paired_tests(table, "MHA", t_alternative="greater"))
    assert {"t-test p (one-sided, reference greater)", "t-test p (two-sided)"} <= set(one.columns)


def test_run_row_carries_the_trainable_parameter_count():
    tags = {"condition": "MHA", "dataset": "d", "raystudy.status": "finished"}
    row = load.run_row(
        "r",
        "FINISHED",
        tags,
        {"lr": "0.1", "seed": "0"},
        {"best_val_acc": 0.8, "test_acc": 0.7, "trainable_params": 2_362_368},
    )
    assert row["trainable_params"] == 2_362_368
    assert math.isnan(load.run_row("r", "FINISHED", tags, {}, {"test_acc": 0.7})["trainable_params"])


# ---------------------------------------------------------------- the paper's table shape


def test_wide_csv_reads_as_a_summary(wide_csv, tmp_path):
    kind, s = load.read_csv(wide_csv)
    assert kind == "summary" and s.attrs["dropped_rows"] == 1
    assert sorted(s["dataset"].unique()) == ["d1", "d2", "d3", "d4", "d5", "d6"]
    cell = s.set_index(["dataset", "condition"]).loc[("d3", "LN1")]
    assert (cell["test_mean"], cell["test_std"]) == (60.0, 0.5)
    bad = tmp_path / "bad.csv"
    bad.write_text("dataset,MHA,LN1\nd1,84,high\n")
    with pytest.raises(AnalysisError, match="dataset 'd1', condition 'LN1': 'high' is not a number"):
        load.read_csv(bad)


def test_report_from_the_paper_shape(wide_csv, tmp_path, capsys):
    """Two-sided t-tests, five-component Friedman and ranks, labelled."""
    out = tmp_path / "out"
    assert (
        report.main(
            [
                "--csv",
                str(wide_csv),
                "--paper-comparison",
                "--out",
                str(out),
                "--bootstrap-reps",
                "200",
                "--no-hierarchical",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Ranks, paired tests, Friedman and the CD diagram over 5 of them: LN1, MHA, LN2, FC1, FC2" in printed
    assert "1 average row(s) of the input table left out" in printed
    tests = pd.read_csv(out / "tests.csv").set_index("other")
    assert list(tests.index) == ["LN1", "LN2", "FC1", "FC2"]  # full, linear_probe not tested
    for other in tests.index:
        assert tests.loc[other, "t_p"] == pytest.approx(st.ttest_rel(WIDE["MHA"], WIDE[other]).pvalue)
        assert tests.loc[other, "wilcoxon_p"] == pytest.approx(
            st.wilcoxon(WIDE["MHA"], WIDE[other], alternative="greater").pvalue
        )
    assert (tests["t_alternative"] == "two-sided").all() and (tests["wilcoxon_alternative"] == "greater").all()
    assert "t-test p (two-sided)" in (out / "tests.md").read_text()
    assert "paired t-test two-sided, as in the paper" in printed
    omni = pd.read_csv(out / "omnibus.csv").set_index("test")
    fr = st.friedmanchisquare(*[WIDE[c] for c in FIVE])
    assert omni.loc["friedman", "statistic"] == pytest.approx(fr.statistic)
    assert omni.loc["friedman", "k"] == 5 and omni.loc["nemenyi_cd", "k"] == 5
    ranks = pd.read_csv(out / "ranks.csv", index_col=0)
    assert list(ranks.columns) == FIVE
    # MHA is best of the five on every dataset; full is not ranked, though in the tables
    assert (ranks["MHA"] == 1).all()
    main = (out / "main_table.md").read_text()
    assert "| avg rank | 5.00" in main and "full" in main
    avg_rank = next(ln for ln in main.splitlines() if ln.startswith("| avg rank"))
    assert avg_rank.rstrip().endswith("| —            |")  # linear_probe: not ranked
    # gains over linear_probe (present), per dataset and averaged
    gain = pd.read_csv(out / "relative_gain.csv", index_col=0)
    assert gain.loc["d1", "MHA"] == pytest.approx(20.0)
    assert "Parameter efficiency\n\nSkipped: a per-dataset summary has no parameter counts." in printed
    for f in ("cd_diagram", "relative_gain"):
        assert (out / "figures" / f"{f}.png").is_file() and (out / "figures" / f"{f}.pdf").is_file()


def test_without_the_flag_every_condition_is_compared(wide_csv, tmp_path):
    reporting.report_from_csv(wide_csv, tmp_path / "all", options=_quick(), draw_figures=False)
    assert pd.read_csv(tmp_path / "all" / "omnibus.csv").set_index("test").loc["friedman", "k"] == 7


def test_one_sided_t_option(wide_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        report.main(
            [
                "--csv",
                str(wide_csv),
                "--t-alternative",
                "greater",
                "--out",
                str(out),
                "--bootstrap-reps",
                "200",
                "--no-hierarchical",
                "--no-figures",
            ]
        )
        == 0
    )
    tests = pd.read_csv(out / "tests.csv").set_index("other")
    p = st.ttest_rel(WIDE["MHA"], WIDE["LN1"], alternative="greater").pvalue
    assert tests.loc["LN1", "t_p"] == pytest.approx(p) and tests.loc["LN1", "t_alternative"] == "greater"
    md = (out / "tests.md").read_text()
    assert "t-test p (one-sided, reference greater)" in md and "t-test p (two-sided)" in md


def _quick():
    from analysis.sections import trust

    return trust.Options(reps=200, hierarchical=False)


def test_one_dataset_refuses_the_cd_diagram(wide_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        report.main(
            [
                "--csv",
                str(wide_csv),
                "--datasets",
                "d1",
                "--paper-comparison",
                "--out",
                str(out),
                "--bootstrap-reps",
                "200",
                "--no-hierarchical",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "One dataset (d1): every test here compares conditions across datasets." in printed
    assert "- No Friedman test: it needs two or more datasets." in printed
    assert "no critical-difference diagram" in printed
    assert "No paired tests of MHA against the others" in printed
    assert not (out / "figures" / "cd_diagram.png").exists()
    assert not (out / "omnibus.csv").exists() and not (out / "tests.csv").exists()
    assert "p = 0.5" not in printed


def test_unknown_compared_or_gain_reference_exits_2(wide_csv, tmp_path, capsys):
    assert (
        report.main(
            ["--csv", str(wide_csv), "--conditions", "MHA,LN1,full", "--paper-comparison", "--out", str(tmp_path)]
        )
        == 2
    )
    assert "compared condition(s) LN2, FC1, FC2 are not among" in capsys.readouterr().err
    assert report.main(["--csv", str(wide_csv), "--gain-reference", "lora", "--out", str(tmp_path)]) == 2
    assert "gain reference 'lora'" in capsys.readouterr().err


# ---------------------------------------------------------------- runs: settings and parameters


def _runs(optimizer: str, model: str, shift: float, params: bool = True) -> pd.DataFrame:
    """Two datasets × (MHA, full, lora) × one lr × two seeds; accuracy = base + shift."""
    base = {"MHA": 0.80, "full": 0.85, "lora": 0.78}
    count = {"MHA": 2_400_000, "full": 86_000_000, "lora": 300_000}
    rows = []
    for d, head in (("a", 10), ("b", 100)):
        for c, acc in base.items():
            for seed in (0, 1):
                rows.append(
                    {
                        "model": model,
                        "optimizer": optimizer,
                        "dataset": d,
                        "condition": c,
                        "lr": 0.1,
                        "seed": seed,
                        "val_acc": acc + shift,
                        "test_acc": acc + shift + (0.02 if d == "b" else 0) + 0.01 * seed,
                        "trainable_params": count[c] + 769 * head if params else math.nan,
                    }
                )
    return pd.DataFrame(rows)


def test_optimizer_ablation_and_settings_tables(tmp_path, capsys):
    df = pd.concat([_runs("sgd", "vit_a", 0.0), _runs("adamw", "vit_a", 0.05), _runs("sgd", "vit_b", 0.1)])
    p = tmp_path / "runs.csv"
    df.to_csv(p, index=False)
    out = tmp_path / "out"
    r = reporting.report_from_csv(p, out, reference="MHA", options=_quick())
    ab = pd.read_csv(out / "optimizer_ablation_vit_a.csv", index_col=0)
    # MHA with SGD: (0.805 + 0.825) / 2 = 0.815; AdamW 0.05 higher
    assert ab.loc["MHA", "sgd"] == pytest.approx(0.815) and ab.loc["MHA", "adamw"] == pytest.approx(0.865)
    assert list(ab.columns) == ["datasets", "sgd", "adamw"]
    assert "adamw − sgd" in (out / "optimizer_ablation_vit_a.md").read_text()
    for f in ("optimizer_ablation_vit_a", "settings"):
        assert (out / "figures" / f"{f}.png").is_file() and (out / "figures" / f"{f}.pdf").is_file()
    assert "Optimizer ablation, vit_b: runs of one optimizer only (sgd); no table." in r.text
    settings = pd.read_csv(out / "settings.csv", index_col=0)
    assert settings.loc["full", "vit_b, sgd"] == pytest.approx(0.965)
    assert (out / "report.md").read_text() == r.text
    for sub in ("vit_a_sgd", "vit_a_adamw", "vit_b_sgd"):
        assert (out / sub / "main_table_lr_on_val.md").is_file()


def test_parameter_efficiency_from_runs(tmp_path):
    p = tmp_path / "runs.csv"
    _runs("sgd", "vit_a", 0.0).to_csv(p, index=False)
    out = tmp_path / "out"
    r = reporting.report_from_csv(p, out, reference="MHA", options=_quick())
    eff = pd.read_csv(out / "parameter_efficiency.csv", index_col=0)
    assert list(eff.index) == ["lora", "MHA", "full"]  # by count
    assert eff.loc["lora", "params"] == 300_000 + 769 * 55  # heads of 10 and 100 classes
    assert eff.loc["MHA", "accuracy"] == pytest.approx(0.815)
    assert "lora" in r.text and "Parameter efficiency" in r.text
    for suffix in (".png", ".pdf"):
        assert (out / "figures" / f"parameter_efficiency{suffix}").stat().st_size > 1000
    assert "trainable_params" in pd.read_csv(out / "runs.csv").columns  # kept for a rerun
    # without counts, one line and no table
    _runs("sgd", "vit_a", 0.0, params=False).drop(columns="trainable_params").to_csv(p, index=False)
    r = reporting.report_from_csv(p, tmp_path / "none", reference="MHA", options=_quick())
    assert "Skipped: the runs have no trainable parameter counts (trainable_params)." in r.text
    assert not (tmp_path / "none" / "parameter_efficiency.csv").exists()


def test_the_papers_experiments_tables_compare_on_the_datasets_both_sides_ran(tmp_path):
    """Runs shaped like the paper's three experiments: ViT-B with SGD on 11 datasets, with AdamW on
    4 of them, ViT-L and ViT-H on one. The optimizer ablation compares on the 4, the models on the 1."""
    from raystudy.spaces import grids

    space = grids.load_grid("paper")
    every = list(space.datasets)
    adamw = grids.experiment_datasets(space, "vit_base", "adamw")
    clipart = grids.experiment_datasets(space, "vit_huge", "sgd")
    shift = {
        ("vit_base", "sgd"): 0.0,
        ("vit_base", "adamw"): 0.03,
        ("vit_large", "sgd"): 0.05,
        ("vit_huge", "sgd"): 0.07,
    }
    scopes = {
        ("vit_base", "sgd"): every,
        ("vit_base", "adamw"): adamw,
        ("vit_large", "sgd"): clipart,
        ("vit_huge", "sgd"): clipart,
    }
    rows = [
        {
            "model": m,
            "optimizer": o,
            "dataset": d,
            "condition": c,
            "lr": 0.1,
            "seed": seed,
            "val_acc": 0.5,
            "test_acc": 0.5 + 0.01 * i + (0.1 if c == "MHA" else 0.0) + shift[(m, o)] + 0.001 * seed,
        }
        for (m, o), ds in scopes.items()
        for i, d in enumerate(every)
        if d in ds
        for c in ("MHA", "LN1")
        for seed in (0, 1)
    ]
    p = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    out = tmp_path / "out"
    reporting.report_from_csv(p, out, reference="MHA", options=_quick(), draw_figures=False)
    ab = pd.read_csv(out / "optimizer_ablation_vit_base.csv", index_col=0)
    idx = [every.index(d) for d in adamw]  # the datasets both optimizers ran
    want_sgd = 0.5 + 0.01 * sum(idx) / len(idx) + 0.1 + 0.0005
    assert ab.loc["MHA", "datasets"] == 4
    assert ab.loc["MHA", "sgd"] == pytest.approx(want_sgd) and ab.loc["MHA", "adamw"] == pytest.approx(want_sgd + 0.03)
    settings = pd.read_csv(out / "settings.csv", index_col=0)
    i = every.index("domainnet_clipart")
    assert settings.loc["MHA", "datasets"] == 1
    for col, s in (("vit_base, sgd", 0.0), ("vit_large, sgd", 0.05), ("vit_huge, sgd", 0.07)):
        assert settings.loc["MHA", col] == pytest.approx(0.5 + 0.01 * i + 0.1 + s + 0.0005)
