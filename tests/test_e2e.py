"""The study end to end: demo grid (Ray + MLflow) -> analysis -> tables, figures, exported configs,
one exported config rerun (slow, about a minute on a quiet machine)."""

import subprocess
import sys

import pytest
import yaml
from drivers import driver_env

pytestmark = pytest.mark.slow

SPACE = {
    "study": "e2e", "base": {"model": "vit_demo", "steps": 40, "warmup_steps": 4, "eval_every": 20,
                             "log_every": 10, "batch_size": 32, "probe_pairs": 32},
    # one lr keeps it to 12 trials: choosing the lr is the analysis tests' and the demo grid's job
    "grid": {"condition": {"grid_search": ["MHA", "LN2", "FC1"]}, "lr": 0.3, "seed": {"grid_search": [0, 1]}},
    "datasets": {"digits_c": {}, "digits_rotate": {}},   # two: Friedman and a CD diagram to compute
}


def test_grid_analysis_export_rerun(tmp_path, demo_weights, mlflow_uri, shared_ray):  # ./mlflow.db: an empty store
    env = driver_env()
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    p = subprocess.run([sys.executable, "-m", "raystudy.grid", "--space", "space.yaml", *shared_ray, "--quiet"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "12 finished" in p.stdout

    # the plasticity tables before and after finetuning are artifacts of every trial run
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cl = mlflow.MlflowClient(uri)
    exp = cl.get_experiment_by_name("raystudy-e2e-vit_demo")
    run = cl.search_runs([exp.experiment_id], "tags.`raystudy.role` = 'trial'")[0]
    assert {a.path for a in cl.list_artifacts(run.info.run_id)} == {
        "config.yaml", "plasticity_before.csv", "plasticity_after.csv"}

    out = tmp_path / "analysis_out"
    p = subprocess.run([sys.executable, "-m", "analysis.report", "--experiment", "raystudy-e2e-vit_demo",
                        "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "MHA" in p.stdout and "Significance" in p.stdout
    files = {f.name for f in out.rglob("*")}
    assert {"report.md", "accuracy_val_selected.md", "accuracy_val_selected.tex", "accuracy_val_selected.csv"} <= files
    # two datasets: the across-dataset tests are computed, not skipped
    assert "cd_diagram.png" in files and "posthoc.csv" in files
    import pandas as pd

    omnibus = pd.read_csv(out / "omnibus.csv").set_index("test")
    assert 0 <= omnibus.loc["friedman", "p"] <= 1 and omnibus.loc["nemenyi_cd", "n"] == 2
    assert "Friedman test over 3 conditions and 2 datasets: chi2 =" in (out / "report.md").read_text()
    assert any(f.startswith("plasticity") and f.endswith(".png") for f in files), sorted(files)
    grid_run = cl.search_runs([exp.experiment_id], "tags.`raystudy.role` = 'grid'")[0]
    logged = [a.path for a in cl.list_artifacts(grid_run.info.run_id, "analysis")]
    assert logged, "analysis outputs not logged to the grid's parent run"

    best = tmp_path / "best"
    p = subprocess.run([sys.executable, "-m", "analysis.export_best", "--experiment", "raystudy-e2e-vit_demo",
                        "--per-dataset", "--out", str(best)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    exported = sorted(best.rglob("*.yaml"))
    assert len(exported) == 6, exported   # 3 conditions x 2 datasets
    mha = next(f for f in exported if f.stem == "MHA")
    assert mha.read_text().startswith("#") and "python -m raystudy.finetune --config" in mha.read_text()
    cfg = yaml.safe_load(mha.read_text())
    assert cfg["condition"] == "MHA" and cfg["lr"] in (0.1, 0.3)
    p = subprocess.run([sys.executable, "-m", "raystudy.finetune", "--config", str(mha), "--quiet"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "test acc" in p.stdout
