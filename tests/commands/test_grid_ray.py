"""The grid end to end on a real local Ray and a real MLflow store (slow: tens of seconds each)."""

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    checkpoint_steps,
    count_status,
    ctrl_c_twice,
    driver_env,
    free_port,
    freeze_running_trials,
    kill_group,
    mlflow_server,
    search_runs,
    start,
    thaw,
    wait_for,
)

pytestmark = pytest.mark.slow

# 2 conditions x 2 lrs x 1 seed; lr 1e30 diverges. One trial at a time: on a 2-core machine a
# second trial at once adds a process start (about ten CPU seconds of imports) and no speed;
# trials side by side are the end-to-end test's and the second-driver test's.
SPACE = {
    "study": "t",
    "base": {"model": "vit_demo", "steps": 40, "warmup_steps": 4, "eval_every": 20, "log_every": 10, "batch_size": 32},
    "grid": {"condition": {"grid_search": ["MHA", "LN2"]}, "lr": {"grid_search": [0.1, 1.0e30]}, "seed": 0},
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0, "max_concurrent": 1},
}


@pytest.fixture()
def work(tmp_path, demo_weights, mlflow_uri, shared_ray):
    # The driver's default store (./mlflow.db) starts as a copy of an empty one: creating a store
    # is seconds of migrations, tested once in test_tracking_record. The drivers join this test process's
    # shared Ray: what these tests check is the driver's.
    return tmp_path, shared_ray


def own_ray(ray_tmp) -> list[str]:
    """A driver's arguments for a local Ray of its own, in its own temp dir."""
    return ["--ray-temp-dir", ray_tmp, "--num-cpus", "2"]


def write_space(tmp_path, space=SPACE):
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    return p


def grid_cmd(space_file, ray, *extra):
    """The grid's command line; ``ray``: the shared Ray's ``--address`` or ``own_ray(...)``."""
    return [sys.executable, "-m", "raystudy.grid", "--space", str(space_file), *ray, *extra]


def run(cmd, cwd, timeout=600):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=driver_env())


def trial_runs(uri, experiment="raystudy-t-vit_demo"):
    df = search_runs(uri, experiment)
    return df[df["tags.raystudy.role"] == "trial"]


def test_failing_trial_is_retried_then_failed_and_the_rest_completes(work):
    tmp, ray = work
    space = {
        **SPACE,
        "grid": {**SPACE["grid"], "lr": 0.1},
        "datasets": {"digits_c": {}, "cifar10c_snow": {"data_root": str(tmp / "no-data")}},
    }
    p = run(grid_cmd(write_space(tmp, space), ray, "--max-failures", "1", "--quiet"), tmp)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 finished, 0 diverged, 2 failed" in p.stdout
    # --quiet: a line for each retry and each failed trial, none for the finished ones
    out = p.stdout.splitlines()
    failed = [ln for ln in out if ln.startswith("[") and "cifar10c_snow" in ln]
    assert len(failed) == 2 and all("FAILED: DatasetUnavailable: dataset 'cifar10c_snow'" in ln for ln in failed), out
    assert (
        len(
            [
                ln
                for ln in out
                if ln.startswith("retrying LN2 cifar10c_snow") or ln.startswith("retrying MHA cifar10c_snow")
            ]
        )
        == 2
    ), out
    assert not [ln for ln in out if ln.startswith("[") and "digits_c" in ln], out
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 4
    failed = df[df["params.dataset"] == "cifar10c_snow"]
    assert set(failed["status"]) == {"FAILED"} and set(failed["tags.raystudy.status"]) == {"failed"}
    assert failed["tags.raystudy.error"].str.contains("CIFAR-10-C").all()
    assert set(failed["tags.raystudy.attempts"]) == {"2"}  # the first try and one retry
    assert set(df[df["params.dataset"] == "digits_c"]["tags.raystudy.status"]) == {"finished"}


def test_killed_driver_then_rerun_completes_exactly_once(work):
    tmp, ray = work
    space = {
        **SPACE,
        "base": {**SPACE["base"], "steps": 120, "eval_every": 30},
        "grid": {"condition": {"grid_search": ["MHA", "LN2", "FC1"]}, "lr": {"grid_search": [0.1, 0.2]}, "seed": 0},
    }
    cmd = grid_cmd(write_space(tmp, space), ray)
    proc = start(cmd, tmp, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: count_status(tmp / "mlflow.db", "finished") >= 2, proc)
        assert proc.poll() is None, "grid finished before it could be killed"
        proc.send_signal(signal.SIGKILL)  # the driver only; mid-grid
        proc.wait()
    finally:
        kill_group(proc)
    before = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    n_before = (before["tags.raystudy.status"] == "finished").sum()
    assert 2 <= n_before < 6

    # The rerun, stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it) once a
    # trial has ended: one line says how to go on, the ranking says it is partial.
    proc = start(cmd, tmp)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("["):
                kill_group(proc, sig=signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=300)
    finally:
        kill_group(proc)
    stopped = "".join(seen) + rest
    assert proc.returncode == 130, stopped
    assert "resuming" in stopped and re.search(r"^\[\d/6\] ", stopped, re.M), stopped
    assert int(re.search(r"^\[(\d)/6\]", stopped, re.M).group(1)) == n_before + 1  # numbered on from MLflow
    assert re.search(r"grid stopped: \d of 6 trials done; run the same command to resume it", stopped), stopped
    assert "PARTIAL ranking, over the" in stopped
    for noise in ("Tuner.restore", "FileNotFoundError", "Traceback", "Failed to fetch"):
        assert noise not in stopped, stopped

    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "resuming" in p.stdout  # Tune restored the interrupted experiment, checkpoints included
    assert re.search(r"^\[6/6\] ", p.stdout, re.M) and "PARTIAL" not in p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 6 and df["tags.raystudy.key"].nunique() == 6, df[["tags.raystudy.key", "status"]]
    assert set(df["status"]) == {"FINISHED"} and set(df["tags.raystudy.status"]) == {"finished"}
    # runs finished before the kill are the same runs, untouched
    done = before[before["tags.raystudy.status"] == "finished"]
    assert set(done["run_id"]) <= set(df["run_id"])


def _snapshot(db, to):
    """A consistent copy of the SQLite store ``db`` while a driver writes it (SQLite's online backup)."""
    import sqlite3

    src, dst = sqlite3.connect(db, timeout=30), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _curves(uri, df):
    """Key -> (steps of loss, steps and values of val_acc) of the trial runs in ``df`` (indexed by key)."""
    from mlflow import MlflowClient

    cl = MlflowClient(uri)
    out = {}
    for key, run_id in df["run_id"].items():
        loss = sorted(m.step for m in cl.get_metric_history(run_id, "loss"))
        out[key] = (loss, sorted((m.step, m.value) for m in cl.get_metric_history(run_id, "val_acc")))
    return out


@pytest.mark.parametrize("tune_state", ["kept", "lost"])
def test_trials_finished_after_the_store_snapshot_are_recorded_from_storage_not_retrained(work, tune_state):
    # A lost head: its store comes back from a snapshot taken mid-grid, while Tune's folder under
    # --storage (the bucket) still holds every trial that finished after it; its experiment state
    # too ("kept"), or only the trials' folders ("lost").
    tmp, ray = work
    cmd = grid_cmd(write_space(tmp), ray)
    proc = start(cmd, tmp, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: count_status(tmp / "mlflow.db", "finished", "diverged") >= 1, proc)
        _snapshot(tmp / "mlflow.db", tmp / "snapshot.db")
        assert proc.wait(timeout=600) == 0
    finally:
        kill_group(proc)
    full = trial_runs(f"sqlite:///{tmp}/mlflow.db").set_index("tags.raystudy.key")
    assert len(full) == 4 and set(full["status"]) == {"FINISHED"}
    n_snap = count_status(tmp / "snapshot.db", "finished", "diverged")
    assert 1 <= n_snap < 4, "the grid ended before the snapshot"
    results = {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in (tmp / "runs" / "ray").glob("*/*/result.json")}
    states = set((tmp / "runs" / "ray").glob("*/*/checkpoint_*/state.pt"))
    assert len(results) == 4
    curves = _curves(f"sqlite:///{tmp}/mlflow.db", full)
    os.replace(tmp / "snapshot.db", tmp / "mlflow.db")
    if tune_state == "lost":
        for f in (tmp / "runs" / "ray").glob("*/*"):
            if f.is_file():
                f.unlink()
        assert not list((tmp / "runs" / "ray").glob("*/tuner.pkl"))

    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{4 - n_snap} trial(s) finished in " in p.stdout, p.stdout
    assert "resuming" not in p.stdout and "PARTIAL" not in p.stdout, p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 4 and df["tags.raystudy.key"].nunique() == 4, df[["tags.raystudy.key", "status"]]
    assert set(df["status"]) == {"FINISHED"}
    df = df.set_index("tags.raystudy.key")
    assert df["tags.raystudy.status"].to_dict() == full["tags.raystudy.status"].to_dict()
    for col in ("metrics.test_acc", "metrics.best_val_acc", "metrics.steps_done", "params.lr", "params.condition"):
        assert df[col].fillna(-1).to_dict() == full[col].fillna(-1).to_dict(), col
    assert (df["tags.raystudy.attempts"] == "1").all()
    assert _curves(f"sqlite:///{tmp}/mlflow.db", df) == curves  # every step once, as the first store had it
    # none trained again: Tune wrote no result and no checkpoint
    assert {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in results} == results
    assert set((tmp / "runs" / "ray").glob("*/*/result.json")) == set(results)
    assert set((tmp / "runs" / "ray").glob("*/*/checkpoint_*/state.pt")) == states


def _rest(uri, path, body=None):
    """An MLflow REST call (GET, or POST with a JSON body), as the UI makes it."""
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{path}",
        method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_grid_against_a_real_mlflow_server(work):
    tmp, ray = work
    (tmp / "mlflow.db").unlink()  # this grid must write nothing locally
    port = free_port()
    server = mlflow_server(tmp, port)
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        wait_for(lambda: urllib.request.urlopen(uri + "/health", timeout=2), timeout=90)
        space = {**SPACE, "grid": {**SPACE["grid"], "lr": 0.1}, "base": {**SPACE["base"], "probe_pairs": 16}}
        p = run(grid_cmd(write_space(tmp, space), ray, "--tracking-uri", uri), tmp)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        df = trial_runs(uri)
        assert len(df) == 2 and set(df["tags.raystudy.status"]) == {"finished"}
        assert not (tmp / "mlflow.db").exists()  # everything went to the server
        from mlflow import MlflowClient

        assert {a.path for a in MlflowClient(uri).list_artifacts(df.iloc[0]["run_id"])} == {
            "config.yaml",
            "plasticity_before.csv",
            "plasticity_after.csv",
        }

        # What the UI's pages show, read through the server's REST API as the UI reads it.
        exp = _rest(uri, "experiments/get-by-name?experiment_name=raystudy-t-vit_demo")["experiment"]
        assert {t["key"]: t["value"] for t in exp["tags"]}["mlflow.experimentKind"] == "custom_model_development"
        assert f"browse: {uri}/#/experiments/{exp['experiment_id']}/runs?" in p.stdout
        runs = _rest(uri, "runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"]["tags"]} for r in runs}
        metrics = {r["info"]["run_id"]: {m["key"]: m["value"] for m in r["data"].get("metrics", [])} for r in runs}
        trials = [r for r in runs if tags[r["info"]["run_id"]]["raystudy.role"] == "trial"]
        assert {r["info"]["run_name"] for r in trials} == {"MHA·digits_c·lr0.1·s0", "LN2·digits_c·lr0.1·s0"}
        for r in trials:
            m = metrics[r["info"]["run_id"]]
            assert 0 <= m["test_acc"] <= 1 and 0 <= m["best_val_acc"] <= 1
            for mode in ("shared", "in_situ"):  # per component, before and after finetuning
                for c in ("LN1", "MHA", "LN2", "FC1", "FC2"):
                    assert m[f"plasticity/{mode}/{c}"] > 0 and m[f"plasticity_after/{mode}/{c}"] > 0
            assert tags[r["info"]["run_id"]]["mlflow.note.content"].startswith("test ")
        (parent,) = [r["info"]["run_id"] for r in runs if tags[r["info"]["run_id"]]["raystudy.role"] == "grid"]
        by_name = {r["info"]["run_name"]: metrics[r["info"]["run_id"]] for r in trials}
        for cond in ("MHA", "LN2"):  # one seed, one lr, one dataset: the condition's mean is its run
            trial = by_name[f"{cond}·digits_c·lr0.1·s0"]
            assert metrics[parent][f"test_acc/{cond}"] == pytest.approx(trial["test_acc"])
        assert sorted(metrics[parent][f"rank/{c}"] for c in ("MHA", "LN2")) in ([1, 2], [1.5, 1.5])
        note = tags[parent]["mlflow.note.content"]
        assert note.startswith("## Ranking") and "| 1 |" in note and "| 2 |" in note

        # The report, once run, is in the parent's description and artifacts.
        p = run(
            [
                sys.executable,
                "-m",
                "raystudy",
                "report",
                "--experiment",
                "raystudy-t-vit_demo",
                "--tracking-uri",
                uri,
                "--out",
                str(tmp / "report"),
                "--no-curves",
                "--bootstrap-reps",
                "200",
                "--no-hierarchical",
            ],
            tmp,
        )
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        note = _rest(uri, f"runs/get?run_id={parent}")["run"]["data"]["tags"]
        note = {t["key"]: t["value"] for t in note}["mlflow.note.content"]
        assert note.startswith("## Ranking") and "## Analysis report" in note
        assert "analysis/report.md" in {a.path for a in MlflowClient(uri).list_artifacts(parent, "analysis")}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_multi_worker_trial_runs_a_nested_torchtrainer(work, ray_tmp):
    # The ViT-H pattern on CPU: the Tune trial launches a TorchTrainer with 2 DDP (gloo) workers,
    # on a Ray of its own: the driver starts Ray's dashboard for Ray Train.
    tmp, _ = work
    space = {
        **SPACE,
        "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
        "models": {"vit_demo": {"workers": 2, "cpu": 0.5}},
    }
    p = run(grid_cmd(write_space(tmp, space), own_ray(ray_tmp)), tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(2 DDP workers)" in p.stdout and "1 finished" in p.stdout
    df = trial_runs(f"sqlite:///{tmp}/mlflow.db")
    assert len(df) == 1 and 0 <= df.iloc[0]["metrics.test_acc"] <= 1
    assert df.iloc[0]["metrics.grad_norm/MHA"] > 0
    # the TorchTrainer checkpointed under the grid's storage, named by the trial key
    assert list((tmp / "runs" / "ray").glob(f"ddp-{df.iloc[0]['tags.raystudy.key']}/checkpoint_*"))


def _newest_checkpoint_step(storage):
    steps = checkpoint_steps(Path(storage).glob("*/*/checkpoint_*/state.pt"))
    return max(steps, key=steps.get) if steps else None


def test_retried_trial_resumes_from_its_checkpoint_and_logs_each_step_once(work):
    # Kill the worker process running a trial past its last checkpoint:
    # Tune retries it from that checkpoint, and the steps the first attempt had already logged
    # past it are not logged again.
    import mlflow

    tmp, ray = work
    # Checkpoints at most every 2 s, so that on a loaded machine (evaluations seconds apart) an
    # evaluation still gets logged past the newest checkpoint before the kill.
    space = {
        **SPACE,
        "base": {**SPACE["base"], "steps": 600, "eval_every": 20},
        "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
        "tune": {"max_failures": 1, "checkpoint_every_s": 2},
    }
    proc = start(grid_cmd(write_space(tmp, space), ray), tmp)
    uri = f"sqlite:///{tmp}/mlflow.db"

    def worker_past_its_checkpoint():
        df = trial_runs(uri)
        if df.empty or "tags.raystudy.worker" not in df or df["tags.raystudy.worker"].isna().all():
            return None
        ck = _newest_checkpoint_step(tmp / "runs" / "ray")
        steps = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(df.iloc[0]["run_id"], "val_acc")]
        if ck and max(steps, default=0) >= ck + 20:  # logged past the checkpoint
            return int(df.iloc[0]["tags.raystudy.worker"].rsplit(":", 1)[1])
        return None

    try:
        killed = wait_for(worker_past_its_checkpoint, proc, every=0.3)
        assert killed, "the trial ended before it could be killed"
        os.kill(killed, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out[-3000:]
    df = trial_runs(uri)
    assert len(df) == 1 and df.iloc[0]["tags.raystudy.status"] == "finished"
    assert df.iloc[0]["tags.raystudy.attempts"] == "2"
    assert int(df.iloc[0]["tags.raystudy.worker"].rsplit(":", 1)[1]) != killed
    cl = mlflow.MlflowClient(uri)
    for key, every in (("val_acc", 20), ("loss", 10), ("grad_norm/MHA", 10)):
        steps = sorted(m.step for m in cl.get_metric_history(df.iloc[0]["run_id"], key))
        assert steps == list(range(every, 601, every)), (key, steps)
    assert int(df.iloc[0]["tags.raystudy.resumed_from"]) >= 20  # from its checkpoint, not step 0


def _grid_name(space_file, model="vit_demo"):
    from raystudy.driver import lock
    from raystudy.spaces import grids

    space = grids.load_grid(str(space_file))
    return lock.grid_name(grids.expand(space, model, None, None, None, {}), f"{space.study}-{model}")


def test_an_unrestorable_tune_state_falls_back_to_a_fresh_run(work):
    # A Tune state at the grid's path that is not this grid's, or is half written (a full
    # disk), must not be restored: a rerun restoring it would start nothing, or die.
    tmp, ray = work
    storage = tmp / "runs" / "ray"
    foreign = write_space(tmp, {**SPACE, "grid": {"condition": "MHA", "lr": 0.1, "seed": 0}})
    # same trainable name, no trial config in its param space
    code = (
        f"import ray; from ray import tune; ray.init(address={ray[1]!r})\n"
        "def run_trial(config):\n    return None\n"
        f"tune.Tuner(run_trial, param_space={{'x': tune.grid_search([1])}}, run_config=tune.RunConfig("
        f"name={_grid_name(foreign)!r}, storage_path={str(storage)!r}, verbose=0)).fit()"
    )
    p = run([sys.executable, "-c", code], tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    p = run(grid_cmd(foreign, ray), tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    said = [line for line in p.stdout.splitlines() if "could not restore" in line]
    assert len(said) == 1 and "starting afresh over the 1 unfinished trials" in said[0], p.stdout[-2000:]
    assert "1 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout

    half = tmp / "half.yaml"
    half.write_text(yaml.safe_dump({**SPACE, "grid": {"condition": "MHA", "lr": 0.1, "seed": 1}}))
    (storage / _grid_name(half)).mkdir()
    (storage / _grid_name(half) / "tuner.pkl").write_bytes(b"\x80\x04\x95")  # cut short
    p = run(grid_cmd(half, ray), tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "could not restore" in p.stdout and "1 finished, 0 diverged, 0 failed, 0 unfinished" in p.stdout


def test_a_second_driver_refuses_and_an_interrupted_driver_leaves_no_run_running(work, ray_tmp):
    # One running grid serves two checks (one Ray start-up, not two).
    # A second driver for the same grid must refuse, not train every trial again.
    # Ctrl+C twice (the second skips Tune's graceful stop) raises
    # KeyboardInterrupt out of tuner.fit(); the parent and the trial runs must still be closed,
    # and the grid says in one line that it stopped.
    tmp, ray = work
    space = {
        **SPACE,
        "base": {**SPACE["base"], "steps": 4000, "eval_every": 100},
        "grid": {"condition": "MHA", "lr": 0.1, "seed": {"grid_search": [0, 1]}},
        "tune": {**SPACE["tune"], "max_concurrent": None},
    }
    f = write_space(tmp, space)
    proc, frozen = start(grid_cmd(f, ray), tmp), []
    uri = f"sqlite:///{tmp}/mlflow.db"
    try:
        # both trials running (two CPUs, one each): nothing more of this grid can start
        wait_for(lambda: trial_runs(uri)["tags.raystudy.worker"].notna().sum() == 2, proc)
        assert proc.poll() is None, "the grid ended before a second driver could try it"
        p = run(grid_cmd(f, own_ray(ray_tmp)), tmp, timeout=240)
        assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {proc.pid} on host {socket.gethostname()}" in lines[0], p.stderr
        assert len(trial_runs(uri)) == 2  # the second driver added no run

        assert proc.poll() is None, "the grid ended before it could be interrupted"
        frozen = freeze_running_trials(uri, "raystudy-t-vit_demo")  # the second comes while Tune stops
        out = ctrl_c_twice(proc)
    finally:
        kill_group(proc)
        thaw(frozen)
    df = search_runs(uri, "raystudy-t-vit_demo")
    assert proc.returncode == 130 and "grid stopped" in out, out[-3000:]
    # the first Ctrl-C said what it does (Tune's own warning, which names Tuner.restore, does not show)
    assert "stopping: saving Tune's state and ending the running trials; Ctrl-C again" in out, out[-3000:]
    assert "Tuner.restore" not in out and "Stop signal received" not in out, out[-3000:]
    assert (df["status"] != "RUNNING").all(), df[["status", "tags.raystudy.role", "tags.raystudy.status"]]
    parent = df[df["tags.raystudy.role"] == "grid"].iloc[0]
    assert parent["tags.raystudy.status"] == "interrupted"


# Holds every CPU of the Ray at argv[1] in a placement group until stdin closes: another job's trials.
_HOG = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
pg = ray.util.placement_group([{"CPU": ray.cluster_resources()["CPU"]}])
ray.get(pg.ready())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_trial_waiting_for_resources_another_job_holds_is_said_then_runs_when_they_free(work):
    tmp, ray = work
    hog = subprocess.Popen(
        [sys.executable, "-c", _HOG, ray[1]],
        env=driver_env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert hog.stdout.readline().strip() == "held"
        space = {**SPACE, "grid": {"condition": "MHA", "lr": 0.1, "seed": 0}}
        log = tmp / "grid.log"
        with open(log, "w") as out:
            p = start(grid_cmd(write_space(tmp, space), ray), tmp, stdout=out, env=driver_env(RAYSTUDY_WAIT_S="3"))
        said = wait_for(lambda: "waiting for resources" in log.read_text(), p, timeout=120)
        assert said, log.read_text()[-3000:]
        line = next(ln for ln in log.read_text().splitlines() if "waiting for resources" in ln)
        assert line == "1 trial waiting for resources: it needs {CPU: 1}; free: {CPU: 0} on 1 node"
        hog.stdin.close()  # the other job ends: the trial runs
        assert p.wait(timeout=300) == 0, log.read_text()[-3000:]
        assert "1 finished" in log.read_text()
    finally:
        kill_group(hog)


def test_a_trial_on_a_reused_process_logs_what_it_logs_on_a_fresh_one(work):
    # Tune starts a trial on an ended trial's process (``reuse_actors``): nothing the first trial
    # left there (torch's random state, its threads, a loaded model or dataset) may reach the
    # second trial's numbers. Two seeds one at a time, then the second alone in a store of its own.
    import shutil

    from raystudy.tracking import connect

    tmp, ray = work
    alone = tmp / "alone"
    alone.mkdir()
    shutil.copy(tmp / "mlflow.db", alone / "mlflow.db")  # an empty store, as the fixture's
    grid = {"condition": "MHA", "lr": 0.1, "seed": {"grid_search": [0, 1]}}
    p = run(grid_cmd(write_space(tmp, {**SPACE, "grid": grid}), ray, "--quiet"), tmp)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    both = trial_runs(f"sqlite:///{tmp}/mlflow.db").sort_values("start_time")
    first, second = both.to_dict("records")
    assert first["tags.raystudy.worker"] == second["tags.raystudy.worker"]  # ip:pid: one process
    seed = int(second["params.seed"])
    p = run(grid_cmd(write_space(alone, {**SPACE, "grid": {**grid, "seed": seed}}), ray, "--quiet"), alone)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (fresh,) = trial_runs(f"sqlite:///{alone}/mlflow.db").to_dict("records")
    assert fresh["tags.raystudy.worker"] != second["tags.raystudy.worker"]

    def history(uri: str, run_id: str) -> dict:
        """Every metric's steps and values but the seconds it took (``wall_s``: a warm process is faster)."""
        cl = connect.client(uri)
        keys = [k for k in cl.get_run(run_id).data.metrics if not k.endswith("_s")]
        return {k: [(m.step, m.value) for m in cl.get_metric_history(run_id, k)] for k in keys}

    reused = history(f"sqlite:///{tmp}/mlflow.db", second["run_id"])
    assert {"val_acc", "loss", "grad_norm/MHA"} <= set(reused), sorted(reused)
    assert history(f"sqlite:///{alone}/mlflow.db", fresh["run_id"]) == reused
