"""The study end to end: demo grid (Ray + MLflow, diverging trials among them) -> console ->
analysis -> tables, figures, exported configs, one exported config rerun, and the finished grid
rerun (slow, about two minutes on a quiet machine)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.commands.test_grid_ray import own_ray, trial_runs
from tests.helpers import driver_env, experiment_runs

pytestmark = pytest.mark.slow

SPACE = {
    "study": "e2e",
    "base": {
        "model": "vit_demo",
        "steps": 40,
        "warmup_steps": 4,
        "eval_every": 20,
        "log_every": 10,
        "batch_size": 32,
        "probe_pairs": 32,
    },
    # lr 1e30 diverges (at its first loss check: a second of work), so the grid's console,
    # records and analysis meet diverged trials; one lr that trains keeps the rest to 12 trials.
    "grid": {
        "condition": {"grid_search": ["MHA", "LN2", "FC1"]},
        "lr": {"grid_search": [0.3, 1.0e30]},
        "seed": {"grid_search": [0, 1]},
    },
    "datasets": {"digits_c": {}, "digits_rotate": {}},  # two: Friedman and a CD diagram to compute
}

TRIAL_LINE = re.compile(
    r"^\[ ?\d+/24\] (MHA|LN2|FC1) (digits_c|digits_rotate) lr (0\.3|1e\+30) seed [01]  "
    r"(val \d+\.\d  test \d+\.\d|diverged at step \d+)  \d+ s  \| \d running, \d+ pending"
)


def test_grid_analysis_export_rerun(
    tmp_path, demo_weights, mlflow_uri, shared_ray, ray_tmp
):  # ./mlflow.db: an empty store
    env = driver_env()
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    grid = [sys.executable, "-m", "raystudy.grid", "--space", "space.yaml"]
    p = subprocess.run([*grid, *shared_ray], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "12 finished, 12 diverged, 0 failed, 0 unfinished" in p.stdout
    assert "ranking" in p.stdout
    # The console: one line per trial, numbered in the order they ended, and none of Tune's tables
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == 24 and all(TRIAL_LINE.match(ln) for ln in lines), lines
    assert [ln[: ln.index("]") + 1] for ln in lines] == [f"[{i:2}/24]" for i in range(1, 25)]
    assert lines[-1].endswith("| 0 running, 0 pending") and "ETA" in lines[0]
    everything = p.stdout + p.stderr
    for tune_output in ("╭", "Trial status", "Configuration for experiment", "ensorboard", "Failed to fetch"):
        assert tune_output not in everything, everything
    assert len(everything.splitlines()) - len(lines) < 26, everything  # the rest: a header and the ranking
    assert not list((tmp_path / "runs").rglob("events.out.tfevents*"))
    assert not list((tmp_path / "runs").rglob("progress.csv"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    df = trial_runs(uri, "raystudy-e2e-vit_demo")
    assert len(df) == 24 and df["tags.raystudy.key"].nunique() == 24
    assert set(df["status"]) == {"FINISHED"}
    ok = df[df["params.lr"] == "0.3"]
    assert set(ok["tags.raystudy.status"]) == {"finished"}
    assert ok["metrics.test_acc"].between(0, 1).all() and ok["metrics.grad_norm/HEAD"].notna().all()
    bad = df[df["params.lr"] != "0.3"]
    assert set(bad["tags.raystudy.status"]) == {"diverged"} and bad["metrics.test_acc"].isna().all()
    assert df["tags.mlflow.parentRunId"].nunique() == 1

    # the plasticity tables before and after finetuning are artifacts of every trial run
    import mlflow

    cl = mlflow.MlflowClient(uri)
    finished = "tags.`raystudy.role` = 'trial' and tags.`raystudy.status` = 'finished'"
    run = experiment_runs(cl, "raystudy-e2e-vit_demo", finished)[0]
    assert {a.path for a in cl.list_artifacts(run.info.run_id)} == {
        "config.yaml",
        "plasticity_before.csv",
        "plasticity_after.csv",
    }

    out = tmp_path / "analysis_out"
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "report", "--experiment", "raystudy-e2e-vit_demo", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    grid_run = experiment_runs(cl, "raystudy-e2e-vit_demo", "tags.`raystudy.role` = 'grid'")[0]
    logged = [a.path for a in cl.list_artifacts(grid_run.info.run_id, "analysis")]
    assert logged, "analysis outputs not logged to the grid's parent run"

    best = tmp_path / "best"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "raystudy",
            "export",
            "--experiment",
            "raystudy-e2e-vit_demo",
            "--per-dataset",
            "--out",
            str(best),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    exported = sorted(best.rglob("*.yaml"))
    assert len(exported) == 6, exported  # 3 conditions x 2 datasets
    mha = next(f for f in exported if f.stem == "MHA")
    assert mha.read_text().startswith("#") and "python -m raystudy finetune --config" in mha.read_text()
    cfg = yaml.safe_load(mha.read_text())
    assert cfg["condition"] == "MHA" and cfg["lr"] in (0.1, 0.3)
    p = subprocess.run(
        [sys.executable, "-m", "raystudy", "finetune", "--config", str(mha), "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "test acc" in p.stdout

    # Rerunning a finished grid starts nothing (not even the local Ray it is told to start) and
    # duplicates nothing.
    p = subprocess.run([*grid, *own_ray(ray_tmp)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "all 24 trials are already done" in p.stdout and "ranking" in p.stdout
    assert not list(Path(ray_tmp).glob("session_*"))
    assert len(trial_runs(uri, "raystudy-e2e-vit_demo")) == 24
