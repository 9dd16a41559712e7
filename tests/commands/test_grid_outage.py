"""A real MLflow tracking server killed mid-grid for longer than the driver's outage limit
(``RAYSTUDY_TRACKING_OUTAGE_S``): the grid stops as a Ctrl-C stops it, writes what its trials
reported once the server is back, and the same command resumes it, every run exactly once (slow)."""

import gzip
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from raystudy.train.rehearsal import experiment_name
from tests.helpers import (
    REPO,
    driver_env,
    free_port,
    kill_group,
    mlflow_server,
    output_of,
    search_runs,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow

NODE_SH = REPO / "cluster" / "node.sh"

LIMIT_S = 20  # the driver's limit in this test; the server stays away longer
AWAY_S = 26

# 4 trials, one at a time, long enough that the limit passes while the second or third runs.
SPACE = {
    "study": "t",
    "base": {
        "model": "vit_demo",
        "steps": 600,
        "warmup_steps": 4,
        "eval_every": 100,
        "log_every": 50,
        "batch_size": 32,
    },
    "grid": {"condition": {"grid_search": ["MHA", "LN2"]}, "lr": {"grid_search": [0.1, 0.2]}, "seed": 0},
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0, "max_concurrent": 1},
}
EXPERIMENT = "raystudy-t-vit_demo"
REHEARSAL = experiment_name(EXPERIMENT)  # where a rehearsal of the grid records

# The MLflow client's own retries kept short: what is tested is the driver's behaviour past them.
CLIENT = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "RAYSTUDY_TRACKING_OUTAGE_S": str(LIMIT_S),
}


def serve(tmp, port) -> subprocess.Popen:
    """A real ``mlflow server`` on ``port`` over the SQLite store ``tmp/server.db``, answering /health."""
    server = mlflow_server(tmp, port)
    assert wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2), timeout=120)
    return server


def runs(uri, experiment=EXPERIMENT):
    return search_runs(uri, experiment)


def reporting(uri, experiment=EXPERIMENT) -> bool:
    """A trial run is RUNNING and has reported (its worker is tagged)."""
    df = runs(uri, experiment)
    return "tags.raystudy.worker" in df and bool(
        ((df["status"] == "RUNNING") & df["tags.raystudy.worker"].notna()).any()
    )


def test_a_server_away_past_the_limit_stops_the_grid_which_then_resumes_exactly_once(
    tmp_path, demo_weights, mlflow_uri, shared_ray
):
    tmp = tmp_path
    (tmp / "mlflow.db").rename(tmp / "server.db")  # an empty store (schema made) for the server
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    # 20-second rehearsal trials: the limit passes while trials remain on any machine (real training
    # of the four could end within it on a fast one)
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(space), *shared_ray, "--tracking-uri", uri]
    cmd += ["--rehearse", "20"]
    # As on a cluster's head: the grid's end takes a snapshot of the server's store (node.sh snapshot),
    # whose records node.sh mlflow would have written to the head's state folder.
    state = tmp / "head"
    state.mkdir()
    (state / "mlflow-store").write_text(f"sqlite:///{tmp}/server.db\n")
    (state / "mlflow-backups").write_text(f"{tmp}/backups\n")
    env = driver_env(**CLIENT, RAYSTUDY_SNAPSHOT_CMD=f"RAYSTUDY_STATE={state} bash {NODE_SH} snapshot")
    server = serve(tmp, port)
    proc = None
    try:
        proc = start(cmd, tmp, env=env)
        assert wait_for(lambda: reporting(uri, REHEARSAL), proc, timeout=300), output_of(proc)
        os.killpg(server.pid, signal.SIGKILL)  # the server and its worker, by process id, mid-trial
        server.wait(timeout=30)
        killed = time.time()
        time.sleep(AWAY_S)
        assert proc.poll() is None, output_of(proc)  # still there: it waits for the server
        server = serve(tmp, port)
        out, _ = proc.communicate(timeout=300)
        back = time.time()
    finally:
        if proc is not None:
            kill_group(proc)
    assert back - killed > LIMIT_S
    assert proc.returncode == 130, out[-4000:]
    assert re.search(rf"tracking server {re.escape(uri)} unreachable for {LIMIT_S} s .*stopping the grid", out), out
    assert "run the same command to resume it" in out, out[-4000:]
    for noise in ("Traceback", "MlflowException"):
        assert noise not in out, out[-4000:]
    df = runs(uri, REHEARSAL)
    # Nothing left RUNNING; the parent and the unfinished trials are what a Ctrl-C leaves.
    assert (df["status"] != "RUNNING").all(), df[["status", "tags.raystudy.role", "tags.raystudy.status"]]
    parent = df[df["tags.raystudy.role"] == "grid"]
    assert len(parent) == 1 and parent.iloc[0]["tags.raystudy.status"] == "interrupted"
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert set(trials["tags.raystudy.status"]) <= {"finished", "interrupted"}, trials["tags.raystudy.status"]
    assert (trials["tags.raystudy.status"] == "interrupted").sum() >= 1
    finished_before = set(trials[trials["tags.raystudy.status"] == "finished"]["run_id"])
    # What the first trial reported while the server was away is on it: its curve has no gap.
    first = trials.sort_values("start_time").iloc[0]["run_id"]
    from mlflow import MlflowClient

    steps = [m.step for m in MlflowClient(uri).get_metric_history(first, "loss")]
    assert len(steps) >= 3 and steps == list(range(steps[0], steps[-1] + 1, steps[1] - steps[0])), steps
    # The grid stopped by the limit took one snapshot as it ended, after what it held was written.
    said = [ln for ln in out.splitlines() if "snapshot of MLflow's store" in ln]
    assert len(said) == 1 and said[0].startswith(f"snapshot of MLflow's store: {tmp}/backups/mlflow-"), out[-4000:]
    snap = tmp / "snapshot.db"
    snap.write_bytes(gzip.decompress(Path(said[0].split()[4]).read_bytes()))
    with sqlite3.connect(snap) as c:
        assert c.execute("select count(*) from runs where status = 'RUNNING'").fetchone() == (0,)
        assert c.execute(
            "select t.value from tags t join tags r on r.run_uuid = t.run_uuid "
            "where r.key = 'raystudy.role' and r.value = 'grid' and t.key = 'raystudy.status'"
        ).fetchall() == [("interrupted",)]

    try:
        p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "resuming" in p.stdout
        last = p.stdout.strip().splitlines()[-2:]  # the snapshot, then the rehearsal's closing banner
        assert last[0].endswith("(2 kept, the newest 24)") and last[1].startswith("rehearsal:"), p.stdout[-3000:]
        df = runs(uri, REHEARSAL)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 4 and trials["tags.raystudy.key"].nunique() == 4, trials[["tags.raystudy.key", "status"]]
    assert set(trials["status"]) == {"FINISHED"} and set(trials["tags.raystudy.status"]) == {"finished"}
    assert finished_before <= set(trials["run_id"])
    assert len(df[df["tags.raystudy.role"] == "grid"]) == 1


def test_a_server_back_within_the_limit_gets_every_report_and_the_grid_completes(
    tmp_path, demo_weights, mlflow_uri, shared_ray
):
    tmp = tmp_path
    (tmp / "mlflow.db").rename(tmp / "server.db")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({**SPACE, "grid": {**SPACE["grid"], "lr": 0.1}}))  # 2 trials
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", str(space), *shared_ray, "--tracking-uri", uri]
    server = serve(tmp, port)
    proc = None
    try:
        proc = start(cmd, tmp, env=driver_env(**{**CLIENT, "RAYSTUDY_TRACKING_OUTAGE_S": "300"}))
        assert wait_for(lambda: reporting(uri), proc, timeout=300), output_of(proc)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        time.sleep(8)  # past the client's retries, well within the driver's limit
        server = serve(tmp, port)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-4000:]
        df = runs(uri)
        from mlflow import MlflowClient

        curves = [[m.step for m in MlflowClient(uri).get_metric_history(r, "loss")] for r in df["run_id"]]
    finally:
        if proc is not None:
            kill_group(proc)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert f"tracking server {uri} unreachable: keeping what the trials report in memory" in out, out[-4000:]
    assert re.search(rf"tracking server {re.escape(uri)} back after \d+ s; what was held is written", out), out
    assert "stopping the grid" not in out and "Traceback" not in out, out[-4000:]
    assert (df["status"] == "FINISHED").all(), df[["status", "tags.raystudy.role"]]
    assert df[df["tags.raystudy.role"] == "grid"].iloc[0]["tags.raystudy.status"] == "finished"
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 2 and trials["tags.raystudy.key"].nunique() == 2
    assert set(trials["tags.raystudy.status"]) == {"finished"}
    # Every step reported while the server was away is on its run, in order, once.
    curves = [c for c, role in zip(curves, df["tags.raystudy.role"]) if role == "trial"]
    for steps in curves:
        assert len(steps) >= 3 and steps == list(range(steps[0], steps[-1] + 1, steps[1] - steps[0])), steps
    assert len(curves[0]) == len(curves[1])
