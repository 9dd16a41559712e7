"""The report (raystudy report) over CSV input: per-run results and a per-dataset summary, good and bad."""

import io
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from analysis import AnalysisError, load, reporting
from analysis.commands import export, report
from analysis.stats import selection, significance

# Per-run results as another codebase might publish them: no run_id, no model or optimizer.
# Cell (A, X): lr 0.1 is best on validation (0.81) but lr 0.3 on test (0.76 vs 0.71).
# Cell (B, Y): one seed at lr 0.3 diverged (kept, counted, left out of the mean).
RUNS_CSV = """dataset,condition,lr,seed,val_acc,test_acc,status
A,X,0.1,0,0.80,0.70,finished
A,X,0.1,1,0.82,0.72,finished
A,X,0.3,0,0.78,0.75,finished
A,X,0.3,1,0.78,0.77,finished
A,Y,0.1,0,0.60,0.60,finished
A,Y,0.1,1,0.62,0.62,finished
A,Y,0.3,0,0.50,0.50,finished
A,Y,0.3,1,0.52,0.52,finished
A,Z,0.1,0,0.40,0.40,finished
A,Z,0.1,1,0.40,0.42,finished
A,Z,0.3,0,,,failed
A,Z,0.3,1,0.30,0.30,finished
B,X,0.1,0,0.90,0.90,finished
B,X,0.1,1,0.92,0.92,finished
B,X,0.3,0,0.80,0.80,finished
B,X,0.3,1,0.80,0.80,finished
B,Y,0.1,0,0.70,0.70,finished
B,Y,0.1,1,0.70,0.72,finished
B,Y,0.3,0,0.95,0.96,finished
B,Y,0.3,1,,,diverged
B,Z,0.1,0,0.50,0.50,finished
B,Z,0.1,1,0.52,0.52,finished
B,Z,0.3,0,0.40,0.40,finished
B,Z,0.3,1,0.40,0.40,finished
"""

# The paper's headline numbers (the paper: MHA 90.8, FC1 90.7, FC2 90.3, LN2 89.9, LN1 89.8 on
# average over 11 datasets) need per-dataset values for the tests: a made-up table whose column
# means round to them.
PAPER_LIKE = pd.DataFrame(
    {
        "MHA": [99.7, 92.3, 94.3, 89.5, 92.7, 93.8, 91.1, 79.4, 72.1, 99.9, 94.5],
        "FC1": [99.7, 91.6, 94.0, 89.1, 92.7, 93.5, 90.6, 79.2, 72.6, 99.9, 95.3],
        "FC2": [99.1, 92.0, 94.0, 89.1, 92.3, 93.0, 90.2, 78.8, 71.6, 99.8, 93.9],
        "LN2": [98.9, 91.4, 93.2, 88.3, 91.9, 92.9, 90.1, 77.7, 71.8, 99.7, 93.5],
        "LN1": [98.7, 91.1, 93.4, 89.0, 92.3, 93.0, 89.7, 77.6, 71.2, 99.4, 92.9],
    },
    index=[
        "cifar10",
        "cifar100",
        "cifar10c_contrast",
        "cifar10c_gaussian_noise",
        "cifar10c_motion_blur",
        "cifar10c_snow",
        "cifar10c_speckle_noise",
        "domainnet_clipart",
        "domainnet_sketch",
        "flowers102",
        "pets",
    ],
)


@pytest.fixture
def runs_csv(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text(RUNS_CSV)
    return p


@pytest.fixture
def paper_csv(tmp_path):
    long = PAPER_LIKE.rename_axis("dataset").reset_index().melt("dataset", var_name="condition", value_name="mean")
    p = tmp_path / "paper.csv"
    long.to_csv(p, index=False)
    return p


def test_per_run_csv_loads_and_keeps_every_row(runs_csv):
    kind, runs = load.read_csv(runs_csv)
    assert kind == "runs" and len(runs) == 24
    assert runs["status"].value_counts().to_dict() == {"finished": 22, "failed": 1, "diverged": 1}
    assert runs.loc[runs["status"] != "finished", ["val_acc", "test_acc"]].isna().all().all()
    assert set(runs["model"]) == {"unknown"} and runs["run_id"].is_unique


def test_report_on_per_run_csv(runs_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--csv", str(runs_csv), "--reference", "X", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # the main table: (A, X) at the lr chosen on validation, mean ± std (ddof 0) in percent;
    # then the same on test (the paper's choice), each labelled
    assert "| A        | 71.0 ± 1.0 | 61.0 ± 1.0 | 41.0 ± 1.0 |" in printed
    assert "| average  | 81.0       | 78.5       | 46.0       |" in printed
    assert "lr chosen on validation accuracy (the default) — used by the rest" in printed
    assert "lr chosen on test accuracy (as the paper did):" in printed
    main_test = pd.read_csv(out / "main_table_lr_on_test.csv").set_index(["dataset", "condition"])
    assert main_test.loc[("A", "X"), "test_mean"] == pytest.approx(0.76)
    assert "as the paper did" in (out / "main_table_lr_on_test.tex").read_text()
    # both selections are reported, and where they differ
    sel = pd.read_csv(out / "selection.csv", index_col=0)
    assert sel.loc["X", "average, lr on val"] == 81.0 and sel.loc["X", "average, lr on test"] == 83.5
    assert sel.loc["X", "datasets where the lr differs"] == "1/2"
    assert "0.1 / 0.3" in (out / "chosen_lr.md").read_text()
    best = pd.read_csv(out / "accuracy_val_selected.csv")
    by = best.set_index(["dataset", "condition"])
    assert by.loc[("B", "Y"), "n"] == 1 and by.loc[("B", "Y"), "n_diverged"] == 1
    assert by.loc[("A", "Z"), "n_failed"] == 1
    # nothing dropped: the run-status table counts all 24 runs
    status = pd.read_csv(out / "run_status.csv", index_col=0)
    assert status["runs"].sum() == 24 and status.loc["Z", "failed"] == 1
    # tests over per-dataset means agree with scipy
    tests = pd.read_csv(out / "tests.csv").set_index("other")
    table = selection.wide(selection.best_lr(selection.seed_means(load.read_csv(runs_csv)[1]), "val"))
    ref = st.wilcoxon(table["X"], table["Z"], alternative="greater")
    assert tests.loc["Z", "wilcoxon_p"] == pytest.approx(ref.pvalue)
    for name in (
        "accuracy_val_selected",
        "accuracy_test_selected",
        "ranks",
        "lr_robustness",
        "tests",
        "posthoc",
        "selection",
        "chosen_lr",
    ):
        for suffix in (".md", ".csv", ".tex"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, name + suffix
    assert r"$\pm$" in (out / "accuracy_val_selected.tex").read_text()
    for fig in ("accuracy_val_selected", "cd_diagram"):
        assert (out / "figures" / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / "figures" / f"{fig}.pdf").read_bytes()[:4] == b"%PDF"

    # --no-figures: the same report and files, byte for byte, less the figures, none drawn
    bare = tmp_path / "bare"
    assert report.main(["--csv", str(runs_csv), "--reference", "X", "--no-figures", "--out", str(bare)]) == 0
    figs = [p for p in out.rglob("*") if p.is_file() and "figures" in p.relative_to(out).parts]
    rest = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p not in figs)
    assert len(figs) >= 8 and not (bare / "figures").exists()
    assert sorted(p.relative_to(bare) for p in bare.rglob("*") if p.is_file()) == rest
    assert all((bare / f).read_bytes() == (out / f).read_bytes() for f in rest)
    assert capsys.readouterr().out.split("\nwrote ")[0] == printed.split("\nwrote ")[0]


def test_select_on_test_flag(runs_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        report.main(
            ["--csv", str(runs_csv), "--reference", "X", "--select-on", "test", "--no-figures", "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| A        | 76.0 ± 1.0 | 61.0 ± 1.0 | 41.0 ± 1.0 |" in printed
    assert "lr chosen on test accuracy (as the paper did) — used by the rest" in printed
    assert (out / "accuracy_test_selected.md").is_file() and (out / "accuracy_val_selected.md").is_file()


def test_the_written_runs_csv_gives_the_same_tables(runs_csv, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    reporting.report_from_csv(runs_csv, first, reference="X", draw_figures=False)
    reporting.report_from_csv(first / "runs.csv", second, reference="X", draw_figures=False)
    for name in (
        "accuracy_val_selected.md",
        "accuracy_test_selected.csv",
        "tests.csv",
        "lr_robustness.csv",
        "ranks.csv",
        "posthoc.csv",
    ):
        assert (first / name).read_text() == (second / name).read_text(), name


def test_summary_csv_of_paper_means(paper_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--csv", str(paper_csv), "--no-figures", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    avg = PAPER_LIKE.mean()
    assert [round(avg[c], 1) for c in ("MHA", "FC1", "FC2", "LN2", "LN1")] == [90.8, 90.7, 90.3, 89.9, 89.8]
    average = next(ln for ln in printed.splitlines() if ln.startswith("| average "))
    # the paper's column order: LN1, MHA, LN2, FC1, FC2
    assert [c.strip() for c in average.split("|")[2:-1]] == ["89.8", "90.8", "89.9", "90.7", "90.3"]
    tests = pd.read_csv(out / "tests.csv").set_index("other")
    for other in ("FC1", "FC2", "LN2", "LN1"):
        w = st.wilcoxon(PAPER_LIKE["MHA"], PAPER_LIKE[other], alternative="greater")
        t = st.ttest_rel(PAPER_LIKE["MHA"], PAPER_LIKE[other])  # two-sided, as the paper
        assert tests.loc[other, "wilcoxon_p"] == pytest.approx(w.pvalue)
        assert tests.loc[other, "t_p"] == pytest.approx(t.pvalue)
        assert tests.loc[other, "t_alternative"] == "two-sided"
    # every MHA − LN1 difference is positive: W+ = 1 + ... + 11 = 66, significant at 5%
    assert tests.loc["LN1", "wilcoxon_W"] == 66 and tests.loc["LN1", "wilcoxon_p"] < 0.05
    fr = st.friedmanchisquare(*[PAPER_LIKE[c] for c in PAPER_LIKE])
    omni = pd.read_csv(out / "omnibus.csv").set_index("test")
    assert omni.loc["friedman", "statistic"] == pytest.approx(fr.statistic)
    assert omni.loc["nemenyi_cd", "statistic"] == pytest.approx(2.728 * (30 / 66) ** 0.5)
    ranks = pd.read_csv(out / "ranks.csv", index_col=0)
    assert ranks.loc["cifar10"].to_dict() == {"MHA": 1.5, "FC1": 1.5, "FC2": 3.0, "LN2": 4.0, "LN1": 5.0}
    assert "Friedman test over 5 conditions and 11 datasets" in printed
    assert not (out / "lr_robustness.csv").exists()  # no lrs in a summary


def test_summary_and_runs_give_the_same_tests(runs_csv, tmp_path):
    """A summary of the per-dataset means at the best lr yields the same tests as the runs."""
    _, runs = load.read_csv(runs_csv)
    best = selection.best_lr(selection.seed_means(runs), "val")
    summary = tmp_path / "summary.csv"
    best.rename(columns={"test_mean": "mean", "test_std": "std"})[["dataset", "condition", "mean", "std"]].to_csv(
        summary, index=False
    )
    reporting.report_from_csv(runs_csv, tmp_path / "a", reference="X", draw_figures=False)
    reporting.report_from_csv(summary, tmp_path / "b", reference="X", draw_figures=False)
    for name in ("tests.csv", "posthoc.csv", "ranks.csv", "omnibus.csv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text(), name
    a = (tmp_path / "a" / "accuracy_val_selected.md").read_text()
    assert a == (tmp_path / "b" / "accuracy.md").read_text()


def test_several_settings_get_one_folder_each(tmp_path):
    df = pd.read_csv(io.StringIO(RUNS_CSV))
    both = pd.concat([df.assign(optimizer="sgd"), df.assign(optimizer="adamw")])
    both["model"] = "vit_demo"
    p = tmp_path / "both.csv"
    both.to_csv(p, index=False)
    r = reporting.report_from_csv(p, tmp_path / "out", reference="X", draw_figures=False)
    assert (tmp_path / "out" / "vit_demo_sgd" / "tests.csv").is_file()
    assert (tmp_path / "out" / "vit_demo_adamw" / "tests.csv").is_file()
    assert "raystudy analysis: vit_demo, adamw" in r.text and "vit_demo, sgd" in r.text


def test_one_condition_has_nothing_to_compare(tmp_path, capsys):
    p = tmp_path / "one.csv"
    p.write_text("\n".join(ln for ln in RUNS_CSV.splitlines() if ln.startswith(("dataset", "A,X", "B,X"))))
    assert report.main(["--csv", str(p), "--out", str(tmp_path / "out")]) == 0
    assert "One condition only (X): nothing to compare." in capsys.readouterr().out


def test_plasticity_csv_next_to_accuracy(paper_csv, tmp_path, capsys):
    # plasticity of the five components, one layer, in the paper's order on every dataset
    plast = pd.DataFrame(
        [
            {
                "model": "vit_base",
                "dataset": d,
                "mode": "shared",
                "layer": 0,
                "component": c,
                "mean": m,
                "std": 0.1,
                "n": 100,
                "ci_low": m - 0.02,
                "ci_high": m + 0.02,
                "bound": math.nan,
            }
            for d in PAPER_LIKE.index
            for c, m in (("MHA", 9.0), ("FC1", 6.0), ("FC2", 5.0), ("LN2", 2.0), ("LN1", 1.0))
        ]
    )
    p = tmp_path / "plasticity.csv"
    plast.to_csv(p, index=False)
    out = tmp_path / "out"
    assert report.main(["--csv", str(paper_csv), "--plasticity", str(p), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Components by plasticity (highest first): MHA > FC1 > FC2 > LN2 > LN1" in printed
    corr = pd.read_csv(out / "plasticity_correlation_shared.csv").set_index("dataset")
    means = PAPER_LIKE.mean()
    assert corr.loc["all", "rho"] == pytest.approx(
        st.spearmanr([9, 6, 5, 2, 1], [means[c] for c in ("MHA", "FC1", "FC2", "LN2", "LN1")]).statistic
    )
    assert corr.loc["all", "rho"] == pytest.approx(1.0)  # the means keep the paper's order
    assert (out / "figures" / "plasticity.png").is_file()


@pytest.mark.parametrize(
    "edit,args,needle",
    [
        (None, ["--reference", "MHA"], "reference condition 'MHA' is not among the conditions: X, Y, Z"),
        (lambda t: t.replace("test_acc", "acc"), [], "missing column(s) test_acc"),
        (
            lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("B,Z")),
            ["--reference", "X"],
            "condition 'Z' has no runs on 1 of 2 datasets: B",
        ),
        (
            lambda t: "\n".join(
                ln
                if ln.startswith(("dataset", "A,")) or not ln.startswith("B,Y")
                else ln.rsplit(",", 3)[0] + ",,,failed"
                for ln in t.splitlines()
            ),
            ["--reference", "X"],
            "condition 'Y' has no usable finished run on B",
        ),
        (
            lambda t: "\n".join(
                ln.rsplit(",", 3)[0] + ",,,failed" if not ln.startswith("dataset") else ln for ln in t.splitlines()
            ),
            [],
            "no finished runs (24 failed)",
        ),
        (
            lambda t: t.replace("val_acc", "other"),
            ["--reference", "X"],
            "choose it on test accuracy with --select-on test",
        ),
        (None, ["--reference", "X", "--conditions", "X,W"], "no condition 'W'; there are: X, Y, Z"),
        (None, ["--reference", "X", "--datasets", "C"], "no dataset 'C'; there are: A, B"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, edit, args, needle):
    p = tmp_path / "runs.csv"
    p.write_text(edit(RUNS_CSV) if edit else RUNS_CSV)
    assert report.main(["--csv", str(p), "--out", str(tmp_path / "out")] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert needle in err[0]


def test_bad_summary_and_missing_file(tmp_path, capsys):
    p = tmp_path / "s.csv"
    p.write_text("dataset,condition,mean\nA,X,1\nA,X,2\n")
    assert report.main(["--csv", str(p), "--reference", "X"]) == 2
    assert "dataset 'A', condition 'X' appears more than once" in capsys.readouterr().err
    with pytest.raises(AnalysisError, match="does not exist"):
        load.read_csv(tmp_path / "nope.csv")


def test_cli_subprocess(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "report", "--csv", str(tmp_path / "nope.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == f"error: CSV file {str(tmp_path / 'nope.csv')!r} does not exist"


@pytest.mark.parametrize(
    "uri,needle",
    [
        ("sqlite:////nonexistent/dir/m.db", "folder /nonexistent/dir does not exist"),
        ("ftp://host/x", "unsupported tracking URI"),
    ],
)
def test_unusable_tracking_uri_exits_2(tmp_path, capsys, uri, needle):
    from analysis.commands import report

    for main in (report.main, export.main):
        assert main(["--experiment", "x", "--tracking-uri", uri, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


# ---------------------------------------------------------------- the reason each skipped test gives


def _summary(tmp_path, table: pd.DataFrame):
    p = tmp_path / "summary.csv"
    table.to_csv(p, index_label="dataset")
    return p


@pytest.mark.parametrize("k", [4, 6])
def test_friedman_skip_names_identical_conditions_not_their_number(tmp_path, capsys, k):
    table = pd.DataFrame({f"C{i}": [80.0, 70.0, 90.0] for i in range(k)}, index=["a", "b", "c"])
    assert significance.friedman_skip(table) == (
        f"all {k} conditions have the same accuracy on every dataset "
        "(every dataset ties them): there is no order to test"
    )
    assert significance.friedman_skip(table.iloc[:, :2]) == "needs at least 3 conditions (have 2)"
    assert significance.friedman_skip(table.iloc[:1]) == "needs at least 2 datasets (have 1)"
    assert (
        report.main(
            [
                "--csv",
                str(_summary(tmp_path, table)),
                "--out",
                str(tmp_path / "o"),
                "--reference",
                "C0",
                "--no-figures",
                "--bootstrap-reps",
                "50",
                "--no-hierarchical",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert f"Friedman test: not run: all {k} conditions have the same accuracy on every dataset" in out
    assert "needs at least 3 conditions" not in out and "Warning" not in err


def test_hierarchical_skip_says_the_differences_have_no_spread():
    from analysis import bayes

    x = np.array([[0.8, 0.7], [0.6, 0.9]])
    assert bayes.hierarchical_skip(x, x + 0.05) == bayes.NO_SPREAD
    assert bayes.hierarchical_skip(x[:1], x[:1] + [[0.1, 0.2]]) == bayes.NO_DATASETS
    assert bayes.hierarchical_skip(x, x + [[0.1, 0.0], [0.0, 0.2]]) is None
    (r,) = bayes.hierarchical([(x, x + 0.05)], rope=0.01)
    assert math.isnan(r["p_rope"]) and r["skipped"] == bayes.NO_SPREAD


def test_a_shift_without_its_interval_says_why(tmp_path, capsys):
    # four datasets: the exact 95% Hodges-Lehmann interval needs six
    table = pd.DataFrame(
        {"A": [80.0, 70.0, 90.0, 60.0], "B": [78.0, 71.0, 85.0, 59.0], "C": [70.0, 65.0, 80.0, 50.0]},
        index=["a", "b", "c", "d"],
    )
    assert (
        report.main(
            [
                "--csv",
                str(_summary(tmp_path, table)),
                "--out",
                str(tmp_path / "o"),
                "--reference",
                "A",
                "--no-figures",
                "--bootstrap-reps",
                "50",
                "--no-hierarchical",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(no CI: n < 6)" in (tmp_path / "o" / "posthoc.md").read_text()
    assert "has no interval: the exact 95% interval inverts the signed-rank test" in out


def test_a_finished_run_without_a_test_accuracy_is_counted_as_failed_with_a_line(tmp_path, capsys):
    p = tmp_path / "runs.csv"
    p.write_text(RUNS_CSV.replace("A,X,0.1,1,0.82,0.72,finished", "A,X,0.1,1,0.82,,finished"))
    kind, runs = load.read_csv(p)
    assert kind == "runs"
    row = runs[(runs["dataset"] == "A") & (runs["condition"] == "X") & (runs["lr"] == 0.1) & (runs["seed"] == 1)]
    assert row["status"].tolist() == ["failed"] and row["error"].tolist() == [load.NO_TEST_ACC]
    assert (
        report.main(
            [
                "--csv",
                str(p),
                "--out",
                str(tmp_path / "o"),
                "--no-figures",
                "--reference",
                "X",
                "--bootstrap-reps",
                "50",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "1 run(s) recorded as finished have no test accuracy: counted as failed, not averaged "
        "(first: X on A, lr 0.1, seed 1)"
    ) in out


def test_the_report_says_how_accuracy_was_counted_and_the_probe_fitted(tmp_path, capsys):
    lines = RUNS_CSV.strip().splitlines()
    csv = "\n".join(
        [lines[0] + ",accuracy,linear_probe_data"] + [ln + ",batch_mean,augmented" for ln in lines[1:]]
    ).replace(",Z,", ",linear_probe,")
    p = tmp_path / "runs.csv"
    p.write_text(csv + "\n")
    assert (
        report.main(
            [
                "--csv",
                str(p),
                "--out",
                str(tmp_path / "o"),
                "--no-figures",
                "--reference",
                "X",
                "--bootstrap-reps",
                "50",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Accuracy: the mean of per-batch accuracies, as the paper's code counts (accuracy: batch_mean)" in out
    assert (
        "Linear probe: fitted on one augmented pass of training batches, as the paper's code "
        "(linear_probe_data: augmented)"
    ) in out
    from raystudy.tracking import query

    row = query.run_row("r", "FINISHED", {"raystudy.status": "finished"}, {"lr": "0.1", "seed": "0"}, {"test_acc": 0.5})
    assert (row["accuracy"], row["linear_probe_data"]) == ("per_image", "clean")  # runs before the keys


def test_the_report_opens_with_how_stable_its_answer_is(runs_csv, paper_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--csv", str(runs_csv), "--reference", "X", "--no-figures", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    # the sections after the header: the answer, then how stable it is
    headings = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert headings[:3] == ["## The answer: which parts to finetune", "## How stable is this answer", "## Main table"]
    para = text.split("## How stable is this answer\n\n")[1].split("\n\n")[0]
    assert para.startswith("The top-1 (X) holds in ") and "seeds would make" in para
    # (B, Y): lr 0.3 (0.95) has seed 0 only, seed 1 diverged there; a draw of seed 1 twice leaves
    # lr 0.1 alone: the chosen lr is chosen again where seed 0 is drawn, 3/4 of the time
    cells = pd.read_csv(out / "stability_lr.csv").set_index(["dataset", "condition"])
    assert cells.loc[("B", "Y"), "rechosen"] == pytest.approx(3 / 4, abs=0.03)
    assert cells.drop(("B", "Y"))["rechosen"].eq(1.0).all()
    assert "0.3: 7" in (out / "stability_lr.md").read_text()
    ranks = pd.read_csv(out / "stability_ranks.csv", index_col=0)
    assert ranks.filter(like="P(rank").sum(axis=1).to_numpy() == pytest.approx(1.0)
    for name in ("stability_lr", "stability_ranks", "stability_intervals", "stability_seeds"):
        for suffix in (".md", ".csv", ".tex"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, name + suffix
    seeds = pd.read_csv(out / "stability_seeds.csv")
    assert seeds["seeds"].tolist() == [2, 4, 5, 6, 10] and seeds["gpu_hours"].tolist() == [1, 2, 2.5, 3, 5]
    # where the runs cannot support it: one line
    assert report.main(["--csv", str(paper_csv), "--no-figures", "--out", str(tmp_path / "summary")]) == 0
    assert "Skipped: a per-dataset summary has no seeds to resample" in (tmp_path / "summary" / "report.md").read_text()
    one = tmp_path / "one_seed.csv"
    one.write_text("\n".join(ln for ln in RUNS_CSV.splitlines() if ln.split(",")[3] != "1"))
    assert report.main(["--csv", str(one), "--reference", "X", "--no-figures", "--out", str(tmp_path / "one")]) == 0
    assert "Skipped: one seed per cell" in (tmp_path / "one" / "report.md").read_text()
    assert not (tmp_path / "one" / "stability_lr.csv").exists()


def test_a_new_section_is_one_function_in_the_list(runs_csv, tmp_path, monkeypatch):
    # docs/development.md's recipe: a section is a pure function of the Study, listed in
    # paper.SECTIONS at its place in the report; nothing else changes
    from analysis import output
    from analysis.sections import paper

    def spread(s):
        widest = (s.table.max(axis=1) - s.table.min(axis=1)).idxmax()
        return output.section("Spread", f"The conditions differ most on {widest}.")

    monkeypatch.setattr(paper, "SECTIONS", (*paper.SECTIONS[:4], spread, *paper.SECTIONS[4:]))
    out = tmp_path / "out"
    assert report.main(["--csv", str(runs_csv), "--reference", "X", "--out", str(out), "--no-figures"]) == 0
    md = (out / "report.md").read_text()
    assert "## Spread\n\nThe conditions differ most on B." in md  # B: 0.91 - 0.51 against A's 0.71 - 0.41
    assert md.index("## Spread") > md.index("| average ")  # after the main table, before the rest
