"""analysis.load without a tracking server: one run's row, reruns, and the CSV formats."""

import math

import pandas as pd
import pytest

from analysis import AnalysisError, load
from raystudy.tracking import query
from tests.helpers import REPO as CHECKOUT

PARAMS = {
    "model": "vit_demo",
    "dataset": "digits_c",
    "condition": "MHA",
    "optimizer": "sgd",
    "lr": "0.1",
    "seed": "42",
    "low_data": "False",
}
TAGS = {
    "raystudy.role": "trial",
    "condition": "MHA",
    "dataset": "digits_c",
    "model": "vit_demo",
    "optimizer": "sgd",
    "mlflow.parentRunId": "p1",
    "raystudy.key": "k1",
}


def test_run_row_finished_diverged_failed():
    done = load.run_row(
        "r1", "FINISHED", {**TAGS, "raystudy.status": "finished"}, PARAMS, {"best_val_acc": 0.8, "test_acc": 0.75}
    )
    assert (done["status"], done["val_acc"], done["test_acc"], done["lr"], done["seed"]) == (
        "finished",
        0.8,
        0.75,
        0.1,
        42,
    )
    assert (done["parent_run_id"], done["key"], done["low_data"]) == ("p1", "k1", False)
    # a diverged run may have logged a best_val_acc before diverging: it is not a result
    div = load.run_row("r2", "FINISHED", {**TAGS, "raystudy.status": "diverged"}, PARAMS, {"best_val_acc": 0.3})
    assert div["status"] == "diverged" and math.isnan(div["val_acc"]) and math.isnan(div["test_acc"])
    failed = load.run_row("r3", "FAILED", {**TAGS, "raystudy.status": "failed", "raystudy.error": "OOM"}, PARAMS, {})
    assert (failed["status"], failed["error"]) == ("failed", "OOM")
    # no raystudy.status tag: MLflow's own status; finished without a test accuracy is a failure
    assert load.run_row("r4", "KILLED", TAGS, PARAMS, {})["status"] == "failed"
    assert load.run_row("r5", "RUNNING", TAGS, PARAMS, {})["status"] == "running"
    odd = load.run_row("r6", "FINISHED", TAGS, PARAMS, {"best_val_acc": 0.8})
    assert odd["status"] == "failed" and odd["error"] == "finished without a test_acc metric"


def test_a_runs_columns_are_the_one_list_of_the_run_record():
    # The runs table's columns are tracking's (query.RUN_COLUMNS ...), which load reads, not a copy.
    assert load.RUN_COLUMNS is query.RUN_COLUMNS and load.EXTRA_COLUMNS is query.EXTRA_COLUMNS
    row = load.run_row("r1", "FINISHED", TAGS, PARAMS, {"test_acc": 0.7})
    assert list(row) == query.ROW_COLUMNS  # a row has every column and nothing else
    assert set(query.ROW_COLUMNS) | {"start_time"} == set(load.RUN_COLUMNS + load.EXTRA_COLUMNS + load.DIVERGED_TESTED)


def test_dedupe_keeps_the_finished_then_latest_try():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d", "e"],
            "key": ["k1", "k1", "k2", "k2", ""],
            "status": ["failed", "finished", "finished", "finished", "failed"],
            "start_time": [3, 1, 1, 2, 0],
        }
    )
    kept, replaced = load.dedupe(runs)
    assert sorted(kept["run_id"]) == ["b", "d", "e"] and replaced == 2


def test_runs_csv_defaults(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("dataset,condition,lr,seed,test_acc\nA,X,0.1,0,0.7\nA,X,0.1,1,\n")
    kind, runs = load.read_csv(p)
    assert kind == "runs" and list(runs["status"]) == ["finished", "failed"]
    assert runs["val_acc"].isna().all() and list(runs["run_id"]) == ["row0", "row1"]
    assert list(runs.columns[: len(load.RUN_COLUMNS)]) == load.RUN_COLUMNS


def test_summary_csv(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("dataset,condition,mean,std\nA,MHA,90.8,0.3\nA,LN1,89.8,\n")
    kind, s = load.read_csv(p)
    assert kind == "summary" and s["test_mean"].tolist() == [90.8, 89.8]
    assert s["test_std"].iloc[0] == 0.3 and math.isnan(s["test_std"].iloc[1])


@pytest.mark.parametrize(
    "text,needle",
    [
        ("dataset,condition,seed,test_acc\nA,X,0,0.7\n", "missing column(s) lr for per-run results"),
        ("dataset,mean\nA,0.7\n", "missing column(s) condition for a per-dataset summary"),
        ("", "is empty"),
        ("dataset,condition,lr,seed,test_acc\nA,X,fast,0,0.7\n", "1 finished row(s) have no numeric lr"),
    ],
)
def test_bad_csv(tmp_path, text, needle):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(AnalysisError) as e:
        load.read_csv(p)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_read_plasticity(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("model,dataset,mode,layer,component,mean\nm,d,shared,0,MHA,1.0\n")
    with pytest.raises(AnalysisError, match=r"missing column\(s\) std, n for plasticity"):
        load.read_plasticity(p)
    # as a trial or finetune --out writes it (n, mean, std): the interval is computed; given, kept
    from scipy import stats

    p.write_text(
        "model,dataset,mode,layer,component,mean,std,n,bound\nm,d,shared,0,MHA,1.0,0.5,20,3.0\n"
        "m,d,shared,1,MHA,1.0,,1,3.0\n"
    )
    df = load.read_plasticity(p)
    half = stats.t.ppf(0.975, 19) * 0.5 / math.sqrt(20)
    assert list(df.columns) == load.PLASTICITY_COLUMNS
    assert (df.loc[0, "ci_low"], df.loc[0, "ci_high"]) == pytest.approx((1.0 - half, 1.0 + half), rel=1e-12)
    assert df.loc[1, ["ci_low", "ci_high"]].isna().all()
    p.write_text("model,dataset,mode,layer,component,mean,std,n,ci_low,ci_high\nm,d,shared,0,MHA,1.0,0.5,20,0.9,1.1\n")
    assert load.read_plasticity(p).loc[0, "ci_low"] == 0.9


# ---------------------------------------------------------------- the paper's counting, compressed files
REPO = "github.com/ambroiseodt/vit-plasticity@268c240"


def test_a_diverged_csv_row_counts_in_the_paper_mode_as_the_mlflow_reader_counts_it(tmp_path):
    """The reference never checks for divergence: a diverged run's tested accuracy enters its
    tables like any other (vit-plasticity apps/vit/train.py:326-331 keeps training and evaluating;
    apps/plots/finetuning.py:456 reads every run's test_acc). from_mlflow(diverged_tested=True)
    counts such a run as finished; a CSV row read with diverged_tested does the same, from its
    test_acc or, as the run record names them, diverged_test_acc and diverged_val_acc."""
    p = tmp_path / "runs.csv"
    p.write_text(
        "dataset,condition,lr,seed,val_acc,test_acc,status,diverged_val_acc,diverged_test_acc\n"
        "A,MHA,0.1,0,0.80,0.70,finished,,\n"
        "A,MHA,0.3,0,0.55,0.50,diverged,,\n"  # its tested accuracy in test_acc
        "A,MHA,1.0,0,,,diverged,0.12,0.10\n"  # in the record's columns (class 0 everywhere)
        "A,MHA,3.0,0,,,diverged,,\n"  # never tested: stays diverged
    )
    _, default = load.read_csv(p)
    assert list(default["status"]) == ["finished", "diverged", "diverged", "diverged"]
    assert default["test_acc"].notna().sum() == 1
    _, paper = load.read_csv(p, diverged_tested=True)
    assert list(paper["status"]) == ["finished", "finished", "finished", "diverged"], REPO
    assert paper["test_acc"].tolist()[:3] == [0.70, 0.50, 0.10]
    assert paper["val_acc"].tolist()[:3] == [0.80, 0.55, 0.12]
    assert paper.attrs["diverged_tested"] == 2


def _runs_csv_text() -> str:
    return "dataset,condition,lr,seed,test_acc\nA,X,0.1,0,0.7\nA,Y,0.1,0,0.6\n"


@pytest.mark.parametrize("suffix", [".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zip", ".gz"])
def test_a_compressed_csv_is_read_as_the_csv_inside(tmp_path, suffix):
    plain = tmp_path / "runs.csv"
    plain.write_text(_runs_csv_text())
    packed = tmp_path / f"runs{suffix}"
    pd.read_csv(plain).to_csv(packed, index=False)  # pandas compresses by the name, as it reads
    _, want = load.read_csv(plain)
    _, got = load.read_csv(packed)
    pd.testing.assert_frame_equal(got, want, check_like=True)


def test_the_projects_own_recordings_are_read_as_runs():
    path = CHECKOUT / "benchmarks" / "recordings" / "s012.csv.gz"
    kind, runs = load.read_csv(path)
    assert kind == "runs" and len(runs) == 300 and (runs["status"] == "finished").all()


def test_a_binary_or_damaged_file_is_still_refused_in_one_line(tmp_path):
    binary = tmp_path / "runs.csv"
    binary.write_bytes(b"dataset,condition\x00\x01\x02")
    fake = tmp_path / "runs.csv.gz"
    fake.write_text(_runs_csv_text())  # named gzip, not gzip
    inner = tmp_path / "inner.csv.gz"
    import gzip

    inner.write_bytes(gzip.compress(b"dataset,condition\x00\x01\x02"))  # gzip of a binary file
    for p, needle in ((binary, "(binary)"), (fake, "not a readable CSV"), (inner, "(binary)")):
        with pytest.raises(AnalysisError) as e:
            load.read_csv(p)
        assert needle in str(e.value) and "\n" not in str(e.value), p.name
