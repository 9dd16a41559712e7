"""A dress rehearsal end to end: ``raystudy grid --rehearse`` on a real Ray and MLflow store,
synthetic one-second trials through the whole driver (slow: tens of seconds)."""

import signal
import subprocess
import sys

import pytest
import yaml

from tests.helpers import count_status, driver_env, kill_group, search_runs, start, wait_for

pytestmark = pytest.mark.slow

# 2 datasets x (2 conditions x 2 lrs + the linear probe, which has no lr) = 10 trials.
SPACE = {
    "study": "t",
    "base": {"model": "vit_demo", "steps": 40, "warmup_steps": 4, "eval_every": 20, "log_every": 10, "batch_size": 32},
    "grid": {
        "condition": {"grid_search": ["MHA", "LN2", "linear_probe"]},
        "lr": {"grid_search": [0.1, 0.3]},
        "seed": 0,
    },
    "datasets": {"digits_c": {}, "digits_blur": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0, "max_concurrent": 2},
}
EXPERIMENT = "raystudy-t-vit_demo-rehearsal"


def kill_once_finished(cmd: list[str], tmp_path, done: int) -> None:
    """Start the grid ``cmd`` and SIGKILL its driver once the store holds ``done`` finished trials."""
    proc = start(cmd, tmp_path, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: count_status(tmp_path / "mlflow.db", "finished") >= done, proc, what=f"{done} trials")
        assert proc.poll() is None, "the rehearsal ended before it could be killed"
        proc.send_signal(signal.SIGKILL)  # the driver, mid-grid
        proc.wait()
    finally:
        kill_group(proc)


def test_a_rehearsal_runs_the_grid_once_each_in_its_own_experiment_and_the_report_says_so(
    tmp_path, mlflow_uri, shared_ray, capsys
):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(space), *shared_ray, "--rehearse", "1"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=driver_env())
    out = p.stdout.strip().splitlines()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = f"rehearsal: synthetic trials (about 1 s each), no model or data; recorded in experiment '{EXPERIMENT}'"
    assert out[0] == line and out[-1] == line, (out[:3], out[-3:])
    assert "10 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    df = search_runs(uri, EXPERIMENT)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 10 and trials["tags.raystudy.key"].nunique() == 10  # every trial exactly once
    assert set(trials["status"]) == {"FINISHED"} and set(trials["tags.raystudy.status"]) == {"finished"}
    assert set(trials["tags.raystudy.rehearsal"]) == {"1"}
    assert set(trials["tags.raystudy.attempts"]) == {"1"}
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    assert [e.name for e in cl.search_experiments()] == [EXPERIMENT, "Default"]  # no real study's experiment
    for _, run in trials.iterrows():
        steps = {k: [m.step for m in cl.get_metric_history(run["run_id"], k)] for k in ("loss", "val_acc")}
        if run["params.condition"] == "linear_probe":  # no steps: final results alone
            assert steps == {"loss": [], "val_acc": []}
            assert run["metrics.steps_done"] == 0
        else:  # the real trial's schedule: log_every 10, eval_every 20 of 40 steps
            assert steps == {"loss": [10, 20, 30, 40], "val_acc": [20, 40]}
            assert run["metrics.steps_done"] == 40 and run["metrics.best_step"] in (20, 40)
        assert 0 <= run["metrics.test_acc"] <= 1
    ckpts = list((tmp_path / "runs" / "ray").glob("t-vit_demo-rehearsal-*/*/checkpoint_*/rehearsal.json"))
    assert ckpts, sorted(str(q) for q in (tmp_path / "runs" / "ray").rglob("*"))[:40]  # the grid's storage

    # the same command again: MLflow holds it all, nothing runs twice
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=driver_env())
    assert again.returncode == 0 and "all 10 trials are already done" in again.stdout, again.stdout[-2000:]
    assert again.stdout.splitlines()[0] == line and again.stdout.strip().splitlines()[-1] == line
    assert len(search_runs(uri, EXPERIMENT).query("`tags.raystudy.role` == 'trial'")) == 10

    from analysis.commands import export, report

    capsys.readouterr()
    args = ["--experiment", EXPERIMENT, "--tracking-uri", uri, "--no-figures", "--bootstrap-reps", "100"]
    assert report.main([*args, "--out", str(tmp_path / "report")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("REHEARSAL: the report of 10 synthetic run(s) of a dress rehearsal"), first
    assert (tmp_path / "report" / "report.md").read_text().startswith("**REHEARSAL:")
    assert export.main(["--experiment", EXPERIMENT, "--tracking-uri", uri, "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("REHEARSAL: the export of 10 synthetic run(s)")


def test_a_killed_rehearsal_resumes_from_its_checkpoints_with_the_same_numbers(tmp_path, mlflow_uri, shared_ray):
    from analysis.best_config import run_config
    from raystudy.train import rehearsal
    from raystudy.train.config import from_dict

    space = {
        **SPACE,
        "base": {**SPACE["base"], "eval_every": 10},  # a checkpoint each second of a 4-second trial
        "grid": {**SPACE["grid"], "condition": {"grid_search": ["MHA", "LN2"]}},
        "datasets": {"digits_c": {}},
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(path), *shared_ray, "--rehearse", "4"]
    kill_once_finished(cmd, tmp_path, 1)
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=driver_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "resuming" in p.stdout and "4 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout, p.stdout[-3000:]

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    df = search_runs(uri, EXPERIMENT)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 4 and trials["tags.raystudy.key"].nunique() == 4
    assert set(trials["tags.raystudy.status"]) == {"finished"} and set(trials["tags.raystudy.rehearsal"]) == {"1"}
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    for _, run in trials.iterrows():  # every evaluation once, each the curve's own number however it ran
        cfg = from_dict(run_config(run["run_id"], uri))
        want = [(m["step"], m["val_acc"]) for m, ev in rehearsal.reports(run["tags.raystudy.key"], cfg) if ev]
        got = sorted((m.step, m.value) for m in cl.get_metric_history(run["run_id"], "val_acc"))
        # steps exactly, values to float precision (approx compares flat sequences, not pairs)
        assert [s for s, _ in got] == [s for s, _ in want], (run["tags.raystudy.key"], got, want)
        assert [v for _, v in got] == pytest.approx([v for _, v in want]), (run["tags.raystudy.key"], got, want)
    resumed = trials["tags.raystudy.resumed_from"].dropna() if "tags.raystudy.resumed_from" in trials else []
    assert set(resumed) <= {"10", "20", "30"}  # a trial cut short went on from its last checkpoint


def test_a_rehearsal_whose_driver_is_killed_twice_holds_every_trial_once_nothing_running_no_step_twice(
    tmp_path, mlflow_uri, shared_ray
):
    # exactly once at scale, at the size CI affords: 30 one-second trials in Tune runs of 8 (as
    # a grid of thousands runs in Tune runs of 500), the driver SIGKILLed in the middle of the
    # first and of the second run (5 and 12 done), then the same command to the end
    space = {
        **SPACE,
        "grid": {**SPACE["grid"], "seed": {"grid_search": [0, 1, 2]}},
        "tune": {**SPACE["tune"], "trials_per_run": 8},
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(path), *shared_ray, "--rehearse", "1"]
    for done in (5, 12):
        kill_once_finished(cmd, tmp_path, done)
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=driver_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "30 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout, p.stdout[-3000:]
    folders = sorted(f.name.rsplit("-", 1)[1] for f in (tmp_path / "runs" / "ray").glob("t-vit_demo-rehearsal-*-part*"))
    assert folders == ["part1of4", "part2of4", "part3of4", "part4of4"], folders
    assert "resuming" in p.stdout, p.stdout[-3000:]  # the run the second kill cut short, restored

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    df = search_runs(uri, EXPERIMENT)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 30 and trials["tags.raystudy.key"].is_unique  # every trial once
    assert set(trials["tags.raystudy.status"]) == {"finished"}
    assert "RUNNING" not in set(df["status"]), df[["tags.raystudy.role", "status"]]  # parents too
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    for _, run in trials.iterrows():  # no step twice, none missing
        steps = {k: sorted(m.step for m in cl.get_metric_history(run["run_id"], k)) for k in ("loss", "val_acc")}
        want = {"loss": [], "val_acc": []} if run["params.condition"] == "linear_probe" else None
        assert steps == (want or {"loss": [10, 20, 30, 40], "val_acc": [20, 40]}), (run["tags.raystudy.key"], steps)


def test_a_driver_killed_before_tune_first_saves_leaves_a_state_whose_part_starts_afresh_once_each(
    tmp_path, mlflow_uri, shared_ray
):
    # A driver SIGKILLed after a Tune run's tuner.pkl and before its first save (as a part begins;
    # seen in CI) left a state Tune could not resume: it started the run anew without the param
    # space, a trial with no config, and the rerun crashed. Here the driver is killed anywhere and
    # its Tune state cut back to what such a kill leaves.
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE))
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(path), *shared_ray, "--rehearse", "1"]
    kill_once_finished(cmd, tmp_path, 2)
    (folder,) = (tmp_path / "runs" / "ray").glob("t-vit_demo-rehearsal-*")
    saved = [*folder.glob("experiment_state-*.json"), *folder.glob("basic-variant-state-*.json")]
    assert (folder / "tuner.pkl").is_file() and len(saved) >= 2, sorted(f.name for f in folder.iterdir())
    for f in saved:
        f.unlink()
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=driver_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "could not restore the interrupted run's Tune state" in p.stdout, p.stdout[-3000:]
    assert "it has no experiment state" in p.stdout
    assert "10 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout, p.stdout[-3000:]
    df = search_runs(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 10 and trials["tags.raystudy.key"].nunique() == 10
    assert set(trials["tags.raystudy.status"]) == {"finished"} and set(df["status"]) == {"FINISHED"}
