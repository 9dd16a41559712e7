"""export_best's choices on hand-made runs (no MLflow): which lr and seed each condition exports."""

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis import AnalysisError, best_config
from analysis.commands import export


def runs(rows):
    df = pd.DataFrame(rows, columns=["run_id", "dataset", "condition", "lr", "seed", "val_acc", "test_acc", "status"])
    return df.assign(model="vit_demo", optimizer="sgd", low_data=False)


def test_best_per_dataset_and_overall_choose_on_validation():
    df = runs(
        [
            # MHA on a: lr 0.1 has the better mean val (0.8 vs 0.6); seed 1 is its best seed
            ("r1", "a", "MHA", 0.1, 0, 0.7, 0.60, "finished"),
            ("r2", "a", "MHA", 0.1, 1, 0.9, 0.62, "finished"),
            ("r3", "a", "MHA", 0.3, 0, 0.6, 0.90, "finished"),
            ("r4", "a", "MHA", 0.3, 1, 0.6, 0.91, "finished"),
            # MHA on b: lr 0.3 wins on b, but over both datasets 0.1 scores (0.8 + 0.5)/2 vs (0.6 + 0.55)/2
            ("r5", "b", "MHA", 0.1, 0, 0.5, 0.40, "finished"),
            ("r6", "b", "MHA", 0.3, 0, 0.55, 0.41, "finished"),
            # a diverged run never wins
            ("r7", "a", "LN1", 1.0, 0, math.nan, math.nan, "diverged"),
            ("r8", "a", "LN1", 0.1, 0, 0.3, 0.3, "finished"),
        ]
    )
    per = best_config.best_per_dataset(df).set_index(["dataset", "condition"])
    assert per.loc[("a", "MHA"), "lr"] == 0.1 and per.loc[("a", "MHA"), "seed"] == 1
    assert per.loc[("b", "MHA"), "lr"] == 0.3
    assert per.loc[("a", "LN1"), "lr"] == 0.1
    over = best_config.best_overall(df[df["condition"] == "MHA"]).iloc[0]
    assert over["lr"] == 0.1 and over["datasets"] == ["a", "b"]
    assert over["mean"] == pytest.approx((0.61 + 0.40) / 2)
    on_test = best_config.best_per_dataset(df, select_on="test").set_index(["dataset", "condition"])
    assert on_test.loc[("a", "MHA"), "lr"] == 0.3


def test_best_overall_refuses_an_lr_missing_on_a_dataset():
    df = runs([("r1", "a", "MHA", 0.1, 0, 0.7, 0.6, "finished"), ("r2", "b", "MHA", 0.3, 0, 0.7, 0.6, "finished")])
    with pytest.raises(AnalysisError, match="no lr has a finished run on all of a, b"):
        best_config.best_overall(df)


def test_header_names_the_rerun_command_and_why():
    row = {
        "condition": "MHA",
        "dataset": "a",
        "lr": 0.1,
        "mean": 0.61,
        "n": 2,
        "seed": 1,
        "val_acc": 0.9,
        "test_acc": 0.62,
        "run_id": "r2",
    }
    text = best_config.header(Path("out/MHA.yaml"), row, "val", True, 100.0)
    assert text.startswith("# python -m raystudy finetune --config out/MHA.yaml\n")
    assert "lr 0.1 chosen on validation accuracy (seed-mean test acc 61.00% over 2 seeds)" in text
    assert all(line.startswith("#") for line in text.splitlines())


def test_names_from_tags_never_leave_out(tmp_path, mlflow_uri):
    """A run whose dataset tag is '..' (MLflow tags are anyone's to set) writes inside --out."""
    import mlflow

    from raystudy.tracking import connect, record
    from raystudy.train.config import FinetuneConfig, trial_key

    c = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    exp = connect.experiment_id(c, "planted", (tmp_path / "artifacts").as_uri())
    for ds, cond in ((("..", "MHA")), (".", "../../evil"), ("digits", "..")):
        cfg = FinetuneConfig(pretrained=False, dataset=ds, condition=cond).to_dict()
        rid = record.open_trial(c, exp, None, trial_key(cfg), cfg)
        record.finish_trial(c, rid, {"status": "finished", "best_val_acc": 0.5, "test_acc": 0.5})
    out = tmp_path / "a" / "best"
    assert (
        export.main(["--experiment", "planted", "--tracking-uri", mlflow_uri, "--per-dataset", "--out", str(out)]) == 0
    )
    written = sorted((tmp_path / "a").rglob("*.yaml"))
    assert len(written) == 3
    assert all(out.resolve() in p.resolve().parents for p in written), written
