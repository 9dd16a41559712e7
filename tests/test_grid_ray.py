"""The grid end to end on a real local Ray and a real MLflow store (slow: tens of seconds each)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

# 2 conditions x 2 lrs x 1 seed; lr 1e30 diverges.
SPACE = {
    "study": "t", "base": {"model": "vit_demo", "steps": 40, "warmup_steps": 4, "eval_every": 20,
                           "log_every": 10, "batch_size": 32},
    "grid": {"condition": {"grid_search": ["MHA", "LN2"]}, "lr": {"grid_search": [0.1, 1.0e30]},
             "seed": 0},
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0},
}


@pytest.fixture()
def work(tmp_path, demo_weights):
    # Ray's sockets need a short path; its own temp dir keeps it away from any other Ray here.
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    yield tmp_path, ray_tmp
    shutil.rmtree(ray_tmp, ignore_errors=True)


def write_space(tmp_path, space=SPACE):
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    return p


def grid_cmd(space_file, ray_tmp, *extra):
    return [sys.executable, "-m", "raystudy.grid", "--space", str(space_file), "--ray-temp-dir", ray_tmp,
            "--num-cpus", "2", "--quiet", *extra]


def run(cmd, cwd, timeout=600):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def trial_runs(uri, experiment="raystudy-t-vit_demo"):
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        df = mlflow.search_runs(experiment_names=[experiment])
    finally:
        mlflow.set_tracking_uri(None)
    return df[df["tags.raystudy.role"] == "trial"]


def test_demo_grid_end_to_end_with_divergence(work):
    tmp, ray_tmp = work
    p = run(grid_cmd(write_space(tmp), ray_tmp), tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 finished, 2 diverged, 0 failed, 0 unfinished" in p.stdout
    assert "ranking" in p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 4 and df["tags.raystudy.key"].nunique() == 4
    assert set(df["status"]) == {"FINISHED"}
    ok = df[df["params.lr"] == "0.1"]
    assert set(ok["tags.raystudy.status"]) == {"finished"}
    assert ok["metrics.test_acc"].between(0, 1).all() and ok["metrics.grad_norm/HEAD"].notna().all()
    bad = df[df["params.lr"] != "0.1"]
    assert set(bad["tags.raystudy.status"]) == {"diverged"} and bad["metrics.test_acc"].isna().all()
    parent = df["tags.mlflow.parentRunId"].unique()
    assert len(parent) == 1

    # Rerunning a finished grid starts nothing and duplicates nothing.
    p = run(grid_cmd(write_space(tmp), ray_tmp), tmp)
    assert p.returncode == 0 and "(4 were already done)" in p.stdout
    assert len(trial_runs(f"sqlite:///{tmp}/mlflow.db")) == 4


def test_failing_trial_is_retried_then_failed_and_the_rest_completes(work):
    tmp, ray_tmp = work
    space = {**SPACE, "grid": {**SPACE["grid"], "lr": 0.1},
             "datasets": {"digits_c": {}, "cifar10c_snow": {"data_root": str(tmp / "no-data")}}}
    p = run(grid_cmd(write_space(tmp, space), ray_tmp, "--max-failures", "1"), tmp)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 finished, 0 diverged, 2 failed" in p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 4
    failed = df[df["params.dataset"] == "cifar10c_snow"]
    assert set(failed["status"]) == {"FAILED"} and set(failed["tags.raystudy.status"]) == {"failed"}
    assert failed["tags.raystudy.error"].str.contains("CIFAR-10-C").all()
    assert set(failed["tags.raystudy.attempts"]) == {"2"}  # the first try and one retry
    assert set(df[df["params.dataset"] == "digits_c"]["tags.raystudy.status"]) == {"finished"}


def _count_done(db):
    import sqlite3

    if not Path(db).exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            return c.execute("select count(*) from tags where key='raystudy.status' and value='finished'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_killed_driver_then_rerun_completes_exactly_once(work):
    tmp, ray_tmp = work
    space = {**SPACE, "base": {**SPACE["base"], "steps": 120, "eval_every": 30},
             "grid": {"condition": {"grid_search": ["MHA", "LN2", "FC1"]}, "lr": {"grid_search": [0.1, 0.2]},
                      "seed": 0}}
    cmd = grid_cmd(write_space(tmp, space), ray_tmp)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while _count_done(tmp / "mlflow.db") < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert proc.poll() is None, "grid finished before it could be killed"
        proc.send_signal(signal.SIGKILL)  # the driver only; mid-grid
        proc.wait()
    finally:
        time.sleep(3)
        try:  # Ray processes the killed driver started: ours, in our own session
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    before = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert 2 <= (before["tags.raystudy.status"] == "finished").sum() < 6
    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "resuming" in p.stdout  # Tune restored the interrupted experiment, checkpoints included
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 6 and df["tags.raystudy.key"].nunique() == 6, df[["tags.raystudy.key", "status"]]
    assert set(df["status"]) == {"FINISHED"} and set(df["tags.raystudy.status"]) == {"finished"}
    # runs finished before the kill are the same runs, untouched
    done = before[before["tags.raystudy.status"] == "finished"]
    assert set(done["run_id"]) <= set(df["run_id"])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_grid_against_a_real_mlflow_server(work):
    tmp, ray_tmp = work
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp}/server.db",
                               "--artifacts-destination", str(tmp / "artifacts")],
                              cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        space = {**SPACE, "grid": {**SPACE["grid"], "lr": 0.1}}
        p = run(grid_cmd(write_space(tmp, space), ray_tmp, "--tracking-uri", uri), tmp)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        df = trial_runs(uri)
        assert len(df) == 2 and set(df["tags.raystudy.status"]) == {"finished"}
        assert not (tmp / "mlflow.db").exists()  # everything went to the server
        from mlflow import MlflowClient

        assert [a.path for a in MlflowClient(uri).list_artifacts(df.iloc[0]["run_id"])] == ["config.yaml"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_multi_worker_trial_runs_a_nested_torchtrainer(work):
    # The ViT-H pattern on CPU: the Tune trial launches a TorchTrainer with 2 DDP (gloo) workers.
    tmp, ray_tmp = work
    space = {**SPACE, "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
             "models": {"vit_demo": {"workers": 2, "cpu": 0.5}}}
    p = run(grid_cmd(write_space(tmp, space), ray_tmp), tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(2 DDP workers)" in p.stdout and "1 finished" in p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 1 and 0 <= df.iloc[0]["metrics.test_acc"] <= 1
    assert df.iloc[0]["metrics.grad_norm/MHA"] > 0
    # the TorchTrainer checkpointed under the grid's storage, named by the trial key
    assert list((tmp / "runs" / "ray").glob(f"ddp-{df.iloc[0]['tags.raystudy.key']}/checkpoint_*"))


def test_retried_trial_resumes_from_its_checkpoint_not_step_0(work):
    # Kill the worker process running a trial after its checkpoint at step 40: Tune retries it,
    # and the retry continues from the checkpoint (step-20 validation is not measured twice).
    import mlflow

    tmp, ray_tmp = work
    space = {**SPACE, "base": {**SPACE["base"], "steps": 400, "eval_every": 20},
             "grid": {"condition": "MHA", "lr": 0.1, "seed": 0}}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(grid_cmd(write_space(tmp, space), ray_tmp), cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    uri = f"sqlite:///{tmp}/mlflow.db"
    try:
        deadline, killed = time.time() + 300, None
        while time.time() < deadline and proc.poll() is None and killed is None:
            time.sleep(0.5)
            try:
                df = trial_runs(uri)
            except Exception:  # noqa: BLE001 - store not created yet
                continue
            if df.empty or "tags.raystudy.worker" not in df or df["tags.raystudy.worker"].isna().all():
                continue
            run_id = df.iloc[0]["run_id"]
            steps = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(run_id, "val_acc")]
            if max(steps, default=0) >= 60:  # the step-40 checkpoint is persisted by now
                killed = int(df.iloc[0]["tags.raystudy.worker"].rsplit(":", 1)[1])
                os.kill(killed, signal.SIGKILL)
        assert killed, "the trial ended before it could be killed"
        out, _ = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-3000:]
    df = trial_runs(uri)
    assert len(df) == 1 and df.iloc[0]["tags.raystudy.status"] == "finished"
    assert df.iloc[0]["tags.raystudy.attempts"] == "2"
    assert int(df.iloc[0]["tags.raystudy.worker"].rsplit(":", 1)[1]) != killed
    steps = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(df.iloc[0]["run_id"], "val_acc")]
    assert steps.count(20) == 1 and steps.count(400) == 1, steps
