"""analysis.load without a tracking server: one run's row, reruns, and the CSV formats."""

import math

import pandas as pd
import pytest

from analysis import AnalysisError, load
from raystudy.tracking import query

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
