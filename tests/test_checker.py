"""benchmarks/checker.py on stores seeded with each anomaly it is there to find: trials written by
raystudy's own recording functions through a real MLflow client over SQLite, then spoiled one way."""

import dataclasses
import gzip
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import checker  # noqa: E402

from raystudy.tracking import connect, record  # noqa: E402
from raystudy.train import rehearsal  # noqa: E402
from raystudy.train.config import FinetuneConfig  # noqa: E402

CONDITIONS = ("MHA", "FC1", "LN1")


def trial(cl, exp: str, key: str, condition: str, tags=None, final=None) -> str:
    """A rehearsal trial recorded as a driver records it: its steps, then its final results."""
    cfg = FinetuneConfig(condition=condition, steps=40, eval_every=20, log_every=10, warmup_steps=2)
    run = record.open_trial(cl, exp, None, key, dataclasses.asdict(cfg), extra_tags=tags)
    record.log_steps(cl, run, [m for m, _ in rehearsal.reports(key, cfg)])
    record.finish_trial(cl, run, {**rehearsal.final_results(key, cfg), **(final or {})})
    return run


@pytest.fixture()
def study(tmp_path, mlflow_uri):
    uri = mlflow_uri
    cl = connect.client(uri)
    exp = connect.experiment_id(cl, "study", artifact_location=str(tmp_path / "artifacts"))
    runs = [trial(cl, exp, f"k{i}", c) for i, c in enumerate(CONDITIONS)]
    return SimpleNamespace(uri=uri, cl=cl, exp=exp, runs=runs, keys={f"k{i}" for i in range(3)}, tmp=tmp_path)


def kinds(found) -> list[str]:
    return sorted(a.kind for a in found)


def test_a_study_recorded_once_has_no_anomaly(study):
    assert checker.check(study.uri, "study", expected=study.keys) == []
    assert checker.counts(checker.trial_runs(study.uri, "study")) == {"runs": 3, "keys": 3, "ended": 3, "running": 0}


def test_a_metric_step_logged_twice_is_reported(study):
    from mlflow.entities import Metric

    study.cl.log_batch(study.runs[1], metrics=[Metric("loss", 1.0, int(time.time() * 1000), 10)])
    found = checker.check(study.uri, "study", expected=study.keys)
    assert kinds(found) == ["step_twice"] and f"run {study.runs[1]} logged loss at step 10 2 times" in str(found[0])


def test_a_run_left_running_and_a_lost_trial_are_reported(study):
    cfg = FinetuneConfig(condition="FC2", steps=40)
    record.open_trial(study.cl, study.exp, None, "k3", dataclasses.asdict(cfg))
    found = checker.check(study.uri, "study", expected=study.keys | {"k3", "k4"})
    assert kinds(found) == ["lost", "running"]
    assert "trial k4 has no run" in str(found) and "(trial k3) is RUNNING" in str(found)
    assert kinds(checker.check(study.uri, "study", expected=5)) == ["lost", "running"]  # a count will do


def test_a_trial_with_two_runs_is_reported(study):
    # open_trial would reopen k1's run: a second one made by hand
    run = study.cl.create_run(study.exp, tags={"raystudy.role": "trial", "raystudy.key": "k1"})
    study.cl.set_tag(run.info.run_id, "raystudy.status", "finished")
    study.cl.set_terminated(run.info.run_id)
    found = checker.check(study.uri, "study", expected=study.keys)
    assert kinds(found) == ["twice"] and "trial k1 has 2 runs" in str(found[0])


def test_a_final_result_unlike_the_last_report_is_reported(study):
    trial(study.cl, study.exp, "k3", "FC2", final={"best_val_acc": 0.123})
    found = checker.check(study.uri, "study", expected=study.keys | {"k3"})
    assert kinds(found) == ["final"] and "final best_val_acc 0.123" in str(found[0])


def test_a_grid_trial_ended_interrupted_is_unended_but_a_searchs_is_an_end(study):
    run = record.open_trial(
        study.cl, study.exp, None, "k3", dataclasses.asdict(FinetuneConfig()), {"raystudy.search": "s"}
    )
    record.fail_trial(study.cl, run, "driver stopped", status="interrupted")
    assert kinds(checker.check(study.uri, "study")) == ["unended"]
    assert checker.check(study.uri, "study", search="s") == []


def test_optuna_and_mlflow_disagreeing_is_reported(study):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for i, c in enumerate(CONDITIONS):
        trial(study.cl, study.exp, f"s{i}", c, tags={"raystudy.search": "s"})
    db = study.tmp / "optuna.db"
    told = optuna.create_study(study_name="s", storage=f"sqlite:///{db}", direction="maximize")
    for v in (0.5, 0.6):
        told.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=v))
    found = checker.check(study.uri, "study", search="s", optuna_db=db)
    assert kinds(found) == ["optuna"] and "MLflow holds 3 ended runs, Optuna 2 COMPLETE" in str(found[0])
    told.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.7))
    assert checker.check(study.uri, "study", search="s", optuna_db=db) == []
    told.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.8))
    assert "some were lost" in str(checker.check(study.uri, "study", search="s", optuna_db=db))


def test_a_latest_metric_behind_its_history_breaks_integrity(study):
    with sqlite3.connect(study.uri.removeprefix("sqlite:///")) as c:
        c.execute("update latest_metrics set step = 10 where run_uuid = ? and key = 'loss'", (study.runs[0],))
    found = checker.check(study.uri, "study", expected=study.keys)
    assert kinds(found) == ["integrity"] and "latest loss at step 10, its highest step 40" in str(found[0])


def test_the_newest_snapshot_must_restore(study):
    snaps = study.tmp / "backups"
    snaps.mkdir()
    with open(study.uri.removeprefix("sqlite:///"), "rb") as src, gzip.open(snaps / "mlflow-1.sqlite.gz", "wb") as d:
        shutil.copyfileobj(src, d)
    assert checker.check(study.uri, "study", snapshots=list(snaps.iterdir())) == []
    (snaps / "mlflow-2.sqlite.gz").write_bytes(gzip.compress(b"not a database"))  # newer, and broken
    found = checker.check(study.uri, "study", snapshots=list(snaps.iterdir()))
    assert kinds(found) == ["snapshot"] and "mlflow-2.sqlite.gz" in str(found[0])


def test_a_command_must_end_in_a_clear_line():
    clear = "search stopped; run the same command to resume it\n"
    ended = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n'
    inside = "Traceback (most recent call last):\n  ...\nKeyError: 'a'\ngrid done\n"
    # Ray's own fatal error (a driver joining a node whose raylet had died, seen by the nemesis on
    # two hosts), whose C++ stack ends in Python's frames: neither a Python traceback nor its last line
    fatal = (
        "[2026-12-06 20:14:46,641 C 22032 22032] raylet_ipc_client.cc:85: Failed to connect to socket\n"
        "*** StackTrace Information ***\n/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85) [0x7f]\n"
    )
    logs = {"a.log": clear, "b.log": ended, "c.log": inside, "d.log": "", "e.log": fatal}
    found = checker.last_lines(logs)
    assert [(a.kind, a.detail.split(" ")[0]) for a in found] == [("last_line", f"{n}.log") for n in "bce"], found
    assert "ends in a traceback: ValueError: boom" in str(found[0])
    assert "Ray's fatal error" in str(found[2])


def test_the_command_line_exits_1_on_an_anomaly_and_2_on_bad_input(study):
    from mlflow.entities import Metric

    cmd = [sys.executable, str(ROOT / "benchmarks" / "checker.py"), "--store", study.uri, "--experiment", "study"]
    p = subprocess.run([*cmd, "--trials", "3"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "0 anomalies", p.stdout + p.stderr
    study.cl.log_batch(study.runs[0], metrics=[Metric("val_acc", 0.5, 0, 20)])
    p = subprocess.run([*cmd, "--trials", "4"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout.splitlines()[-1] == "2 anomalies", p.stdout
    p = subprocess.run([*cmd[:3], str(study.tmp / "none.db")], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "no such file" in p.stderr
