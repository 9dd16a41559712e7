"""analysis.tables: the Markdown, LaTeX and CSV writers and the cell formats."""

import math

import pandas as pd
import pytest

from analysis import tables


def small() -> pd.DataFrame:
    df = pd.DataFrame(
        {"cifar_10": ["90.8 ± 0.3", tables.DASH], "avg": [1.5, math.nan]},
        index=pd.Index(["MHA", "LN1"], name="condition"),
    )
    return df


def test_cell_formats():
    assert tables.mean_std(90.84, 0.26) == "90.8 ± 0.3"
    assert tables.mean_std(90.84, math.nan) == "90.8"
    assert tables.mean_std(math.nan, 0.1) == tables.DASH
    assert tables.fmt(0.5, 2) == "0.50" and tables.fmt(math.nan) == tables.DASH and tables.fmt("x") == "x"
    assert tables.fmt_p(0.0123456) == "0.0123" and tables.fmt_p(1e-6) == "<1e-4"
    assert tables.fmt_lr(0.003) == "0.003" and tables.fmt_lr(math.nan) == tables.DASH


def test_markdown_lines_up():
    text = tables.markdown(small())
    assert text == (
        "| condition | cifar_10   | avg    |\n"
        "|-----------|------------|--------|\n"
        "| MHA       | 90.8 ± 0.3 | 1.5000 |\n"
        "| LN1       | —          | —      |\n"
    )
    assert tables.markdown(pd.DataFrame({"a|b": ["x"]}), index=False).splitlines()[0] == r"| a\|b |"


def test_latex_escapes():
    text = tables.latex(small())
    assert text.splitlines() == [
        r"\begin{tabular}{lrr}",
        r"\toprule",
        r"condition & cifar\_10 & avg \\",
        r"\midrule",
        r"MHA & 90.8 $\pm$ 0.3 & 1.5000 \\",
        r"LN1 & -- & -- \\",
        r"\bottomrule",
        r"\end{tabular}",
    ]
    assert tables.latex_escape("50% & #1") == r"50\% \& \#1"


def test_write_table_keeps_numbers_in_csv(tmp_path):
    data = pd.DataFrame({"condition": ["MHA", "LN1"], "mean": [0.908, math.nan]})
    paths = tables.write_table(tmp_path, "t", small(), data)
    assert [p.name for p in paths] == ["t.md", "t.tex", "t.csv"]
    back = pd.read_csv(tmp_path / "t.csv")
    assert list(back.columns) == ["condition", "mean"] and back["mean"][0] == 0.908
    tables.write_table(tmp_path, "u", small())
    assert pd.read_csv(tmp_path / "u.csv", index_col=0).loc["MHA", "cifar_10"] == "90.8 ± 0.3"


def test_accuracy_and_status_tables():
    best = pd.DataFrame(
        {
            "dataset": ["A", "A", "B"],
            "condition": ["X", "Y", "X"],
            "test_mean": [0.71, 0.61, 0.91],
            "test_std": [0.01, 0.01, math.nan],
        }
    )
    avg = pd.Series({"X": 0.81, "Y": 0.61})
    t = tables.accuracy_table(best, ["X", "Y"], avg, pd.Series({"X": 1.0, "Y": 2.0}), scale=100)
    assert t.loc["X"].tolist() == ["71.0 ± 1.0", "91.0", "81.0", "1.00"]
    assert t.loc["Y", "B"] == tables.DASH
    runs = pd.DataFrame({"condition": ["X", "X", "Y", "Y"], "status": ["finished", "diverged", "finished", "running"]})
    s = tables.status_table(runs, ["X", "Y"])
    assert s.loc["X"].tolist() == [2, 1, 1, 0, 0] and s.loc["Y", "running"] == 1


def test_ranking_chooses_lr_on_validation():
    df = pd.DataFrame(
        [
            # MHA: lr 0.1 wins on val (0.9) though lr 0.3 has the better test accuracy
            dict(dataset="d", condition="MHA", lr=0.1, seed=0, status="finished", val_acc=0.9, test_acc=0.70),
            dict(dataset="d", condition="MHA", lr=0.3, seed=0, status="finished", val_acc=0.5, test_acc=0.80),
            dict(dataset="d", condition="LN1", lr=0.1, seed=0, status="finished", val_acc=0.4, test_acc=0.40),
            dict(dataset="d", condition="LN1", lr=0.3, seed=0, status="diverged", val_acc=None, test_acc=None),
        ]
    )
    r = tables.closing_ranking(df)
    assert list(r["condition"]) == ["MHA", "LN1"]
    assert r.iloc[0]["test_acc"] == pytest.approx(0.70)


def test_ranking_shows_no_lr_for_the_linear_probe():
    # the linear probe's closed form has no lr: its runs carry the space's lr, which means nothing
    df = pd.DataFrame(
        [
            dict(dataset="d", condition=c, lr=lr, seed=0, status="finished", val_acc=v, test_acc=v)
            for c, lr, v in (("MHA", 0.1, 0.5), ("MHA", 0.3, 0.6), ("linear_probe", 0.1, 0.4))
        ]
    )
    r = tables.closing_ranking(df).set_index("condition")
    assert r.loc["MHA", "best_lr"] == "0.3" and r.loc["linear_probe", "best_lr"] == "-"


def test_ranking_is_the_reports_average_and_average_rank():
    rows = []
    for d, accs in {"a": {"MHA": (0.8, 0.6), "LN1": (0.5, 0.5)}, "b": {"MHA": (0.4, 0.4), "LN1": (0.7, 0.5)}}.items():
        for c, (s0, s1) in accs.items():
            rows += [
                dict(dataset=d, condition=c, lr=0.1, seed=0, status="finished", val_acc=0.5, test_acc=s0),
                dict(dataset=d, condition=c, lr=0.1, seed=1, status="finished", val_acc=0.5, test_acc=s1),
            ]
    r = tables.closing_ranking(pd.DataFrame(rows)).set_index("condition")
    # seed means: MHA a 0.7, b 0.4 -> 0.55; LN1 a 0.5, b 0.6 -> 0.55; ranks: a MHA 1, b LN1 1
    assert r.loc["MHA", "test_acc"] == pytest.approx(0.55) and r.loc["LN1", "test_acc"] == pytest.approx(0.55)
    assert r.loc["MHA", "avg_rank"] == r.loc["LN1", "avg_rank"] == 1.5 and r.loc["MHA", "runs"] == 4


def test_ranking_counts_a_rerun_trial_once():
    # a trial that failed and was rerun under the same key: its finished try alone counts, as in the report
    row = dict(dataset="d", condition="MHA", lr=0.1, seed=0, val_acc=0.5)
    df = pd.DataFrame(
        [
            {**row, "key": "k0", "status": "failed", "test_acc": None, "start_time": 1},
            {**row, "key": "k0", "status": "finished", "test_acc": 0.6, "start_time": 2},
            {**row, "key": "k1", "seed": 1, "status": "finished", "test_acc": 0.8, "start_time": 3},
            {**row, "key": "k1", "seed": 1, "status": "finished", "test_acc": 0.8, "start_time": 4},
        ]
    )
    r = tables.closing_ranking(df).set_index("condition")
    assert r.loc["MHA", "runs"] == 2 and r.loc["MHA", "test_acc"] == pytest.approx(0.7)
