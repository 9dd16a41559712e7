import subprocess
import sys
import time

import pytest

from raystudy.tracking import connect, query, record, views
from raystudy.tracking import tags as tracking
from raystudy.train.config import trial_key


@pytest.fixture()
def store(mlflow_uri):
    uri = mlflow_uri
    cl = connect.client(uri)
    exp = connect.experiment_id(cl, "t", connect.default_artifact_location(uri))
    return uri, cl, exp


CFG = {
    "model": "vit_demo",
    "dataset": "digits_c",
    "condition": "MHA",
    "optimizer": "sgd",
    "lr": 0.1,
    "seed": 0,
    "steps": 10,
    "device": "auto",
}


def test_trial_key_is_stable_and_ignores_execution_keys():
    k = trial_key(CFG)
    assert k == trial_key(dict(reversed(list(CFG.items()))))
    assert k == trial_key({**CFG, "device": "cuda", "num_workers": 4})
    assert k != trial_key({**CFG, "seed": 1})


def test_open_trial_twice_gives_one_run(store):
    uri, cl, exp = store
    parent = record.parent_run(cl, exp, "g1", "grid", {"space": "demo"})
    assert record.parent_run(cl, exp, "g1", "grid", {"space": "demo"}) == parent
    key = trial_key(CFG)
    r1 = record.open_trial(cl, exp, parent, key, CFG)
    r2 = record.open_trial(cl, exp, parent, key, CFG)  # a rerun after a crash
    assert r1 == r2
    assert query.trial_status(cl, exp, key)[0] == "running"
    run = cl.get_run(r1)
    assert run.data.tags["raystudy.attempts"] == "2"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.params["lr"] == "0.1" and run.data.tags["condition"] == "MHA"
    record.log_steps(cl, r1, [{"loss": 1.5, "grad_norm/MHA": 0.3, "training_iteration": 4, "step": 10}])
    record.finish_trial(cl, r1, {"status": "finished", "test_acc": 0.5, "best_val_acc": 0.6})
    run = cl.get_run(r1)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_acc"] == 0.5 and run.data.metrics["grad_norm/MHA"] == 0.3
    assert "training_iteration" not in run.data.metrics  # Tune's bookkeeping is not a metric
    assert query.trial_status(cl, exp, key)[0] == "finished"
    assert [a.path for a in cl.list_artifacts(r1)] == ["config.yaml"]


def test_a_run_created_by_a_driver_killed_before_its_params_gets_them_when_reopened(store, monkeypatch):
    """A kill between the run's creation and its params left a run the analysis cannot read."""
    uri, cl, exp = store
    key = trial_key(CFG)

    def killed(*a, **kw):
        raise KeyboardInterrupt  # the driver dies right after create_run

    with monkeypatch.context() as m:
        m.setattr(cl, "log_batch", killed)
        with pytest.raises(KeyboardInterrupt):
            record.open_trial(cl, exp, None, key, CFG)
    (run,) = cl.search_runs([exp])
    assert run.data.params == {}  # what the killed driver left
    rid = record.open_trial(connect.client(uri), exp, None, key, CFG)  # the resumed driver
    assert rid == run.info.run_id
    run = cl.get_run(rid)
    assert run.data.params == {k: str(v) for k, v in CFG.items()}
    assert [a.path for a in cl.list_artifacts(rid)] == ["config.yaml"]
    assert run.data.tags["raystudy.attempts"] == "2" and run.data.tags["raystudy.status"] == "running"


def test_diverged_is_finished_not_failed_and_failed_keeps_its_error(store):
    uri, cl, exp = store
    k1, k2 = trial_key(CFG), trial_key({**CFG, "seed": 9})
    r1 = record.open_trial(cl, exp, None, k1, CFG)
    record.finish_trial(cl, r1, {"status": "diverged", "test_acc": float("nan")})
    r2 = record.open_trial(cl, exp, None, k2, {**CFG, "seed": 9})
    record.fail_trial(cl, r2, "Traceback ...\nDatasetUnavailable: no files")
    assert cl.get_run(r1).info.status == "FINISHED"
    assert cl.get_run(r1).data.tags["raystudy.status"] == "diverged"
    assert "test_acc" not in cl.get_run(r1).data.metrics  # NaN is not recorded as a number
    assert cl.get_run(r2).info.status == "FAILED"
    assert cl.get_run(r2).data.tags["raystudy.error"].endswith("no files")


def test_check_uri(tmp_path):
    connect.check_uri(f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(connect.TrackingUnavailable, match="does not exist"):
        connect.check_uri(f"sqlite:///{tmp_path}/nope/x.db")
    with pytest.raises(connect.TrackingUnavailable, match="unreachable"):
        connect.check_uri("http://127.0.0.1:9", timeout=1)
    with pytest.raises(connect.TrackingUnavailable, match="file store"):
        connect.check_uri("file:///tmp/mlruns")


def test_a_store_being_written_is_checked_without_waiting_for_the_writer(store):
    import sqlite3
    import time

    uri, cl, exp = store
    record.open_trial(cl, exp, None, trial_key(CFG), CFG)
    writer = sqlite3.connect(str(connect.sqlite_path(uri)), isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # another driver in the middle of a write
    try:
        t0 = time.monotonic()
        connect.check_uri(uri)
        assert time.monotonic() - t0 < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_damaged_store_is_refused_and_left_as_it_is(store):
    uri, cl, exp = store
    record.open_trial(cl, exp, None, trial_key(CFG), CFG)
    path = connect.sqlite_path(uri)
    data = bytearray(path.read_bytes())
    middle = len(data) // 4096 // 2 * 4096
    data[middle : middle + 8 * 4096] = b"\xde\xad\xbe\xef" * 8 * 1024
    path.write_bytes(bytes(data))
    before = sorted(path.parent.iterdir())
    with pytest.raises(connect.TrackingUnavailable, match=r"is damaged \(SQLite: .*\.recover"):
        connect.check_uri(uri)
    assert path.read_bytes() == bytes(data) and sorted(path.parent.iterdir()) == before


def test_default_uri_is_sqlite_in_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert connect.default_uri() == f"sqlite:///{tmp_path}/mlflow.db"


def test_close_stale_marks_only_running_runs_of_the_selection(store):
    uri, cl, exp = store
    k = [trial_key({**CFG, "seed": s}) for s in range(3)]
    r = [
        record.open_trial(cl, exp, None, k[s], {**CFG, "seed": s}, {"raystudy.search": "a" if s < 2 else "b"})
        for s in range(3)
    ]
    record.finish_trial(cl, r[0], {"status": "finished", "test_acc": 0.5})
    assert record.close_stale(cl, exp, raystudy__search="a") == 1
    assert cl.get_run(r[1]).info.status == "KILLED"
    assert cl.get_run(r[1]).data.tags["raystudy.status"] == "interrupted"
    assert cl.get_run(r[0]).info.status == "FINISHED"  # finished runs untouched
    assert cl.get_run(r[2]).info.status == "RUNNING"  # another search's run untouched
    assert record.close_stale(cl, exp, raystudy__search="a") == 0


def test_close_stale_ends_a_run_whose_driver_died_between_its_result_and_its_end(store):
    # A driver killed inside finish_trial (after the result's tags, before set_terminated: the
    # plasticity artifacts are written in between) left the run RUNNING after every resume.
    from mlflow.entities import RunTag

    uri, cl, exp = store
    key = trial_key(CFG)
    run = record.open_trial(cl, exp, None, key, CFG, {"raystudy.search": "a"})
    cl.log_batch(run, tags=[RunTag("raystudy.status", "finished")])  # and then the kill
    assert record.close_stale(cl, exp, raystudy__search="a") == 0  # nothing was interrupted
    assert cl.get_run(run).info.status == "FINISHED"
    assert cl.get_run(run).data.tags["raystudy.status"] == "finished"  # its result stands


def test_statuses_in_one_query_prefer_terminal(store):
    uri, cl, exp = store
    keys = [trial_key({**CFG, "seed": s}) for s in range(3)]
    runs = [record.open_trial(cl, exp, None, k, {**CFG, "seed": s}) for s, k in enumerate(keys)]
    record.finish_trial(cl, runs[0], {"status": "finished"})
    record.fail_trial(cl, runs[1], "boom")
    assert query.statuses(cl, exp) == {keys[0]: "finished", keys[1]: "failed", keys[2]: "running"}


# ---------------------------------------------------------------- what the MLflow UI shows


def test_sqlite_path_is_the_stores_file_and_none_otherwise():
    from pathlib import Path

    assert connect.sqlite_path("sqlite:////tmp/x/mlflow.db") == Path("/tmp/x/mlflow.db")
    assert connect.sqlite_path("http://127.0.0.1:5000") is None
    assert connect.sqlite_path("postgresql://u@h/db") is None


def test_trial_names_are_short_with_lr_rounded():
    assert record.trial_name({**CFG, "lr": 0.30000000000000004, "seed": 1}) == "MHA·digits_c·lr0.3·s1"
    assert record.trial_name({**CFG, "lr": 3.1623e-05}) == "MHA·digits_c·lr3.16e-05·s0"
    assert record.trial_name({**CFG, "optimizer": "adamw", "lr": 0.001}) == "MHA·digits_c·adamw·lr0.001·s0"
    assert record.trial_name({**CFG, "condition": "linear_probe"}) == "linear_probe·digits_c·s0"


def test_plasticity_metrics_average_layers_per_mode_and_component():
    table = [
        {"mode": "shared", "layer": 0, "component": "MHA", "mean": 2.0},
        {"mode": "shared", "layer": 1, "component": "MHA", "mean": 4.0},
        {"mode": "in_situ", "layer": 0, "component": "MHA", "mean": 5.0},
        {"mode": "shared", "layer": 0, "component": "LN1", "mean": float("nan")},
        {"mode": "shared", "layer": 1, "component": "LN1", "mean": 1.5},
    ]
    assert record.plasticity_metrics(table) == {
        "plasticity/shared/MHA": 3.0,
        "plasticity/in_situ/MHA": 5.0,
        "plasticity/shared/LN1": 1.5,
    }
    assert record.plasticity_metrics([], "plasticity_after") == {}


def test_finished_trial_has_its_name_description_and_plasticity_metrics(store):
    uri, cl, exp = store
    run = record.open_trial(cl, exp, None, trial_key(CFG), CFG)
    before = [{"mode": "shared", "layer": i, "component": "FC1", "mean": 1.0 + i} for i in range(3)]
    record.finish_trial(
        cl,
        run,
        {
            "status": "finished",
            "test_acc": 0.727,
            "best_val_acc": 0.748,
            "plasticity_before": before,
            "plasticity_after": before[:1],
        },
    )
    r = cl.get_run(run)
    assert r.info.run_name == "MHA·digits_c·lr0.1·s0"
    assert r.data.metrics["plasticity/shared/FC1"] == 2.0
    assert r.data.metrics["plasticity_after/shared/FC1"] == 1.0
    assert r.data.tags[tracking.NOTE] == "test 72.7 · val 74.8"
    assert {a.path for a in cl.list_artifacts(run)} == {"config.yaml", "plasticity_before.csv", "plasticity_after.csv"}


def test_experiments_open_as_classic_ml_runs_in_raystudys_view(store):
    import json

    uri, cl, exp = store
    tags = cl.get_experiment(exp).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.raystudy"])
    assert view["orderByKey"] == "metrics.`test_acc`" and "metrics.`best_val_acc`" in view["selectedColumns"]
    for k in tags:
        if k.startswith("mlflow."):
            cl.delete_experiment_tag(exp, k)  # an experiment an older raystudy made
    assert connect.experiment_id(cl, "t") == exp
    assert tracking.experiment_tags().items() <= cl.get_experiment(exp).tags.items()


def test_parent_run_carries_the_ranking_and_then_the_report(store):
    uri, cl, exp = store
    parent = record.parent_run(cl, exp, "g1", "grid", {"space": "demo"})
    rows = [
        {"condition": "MHA", "test_acc": 0.75, "avg_rank": 1.0, "best_lr": "0.3", "runs": 2},
        {"condition": "LN1", "test_acc": 0.5, "avg_rank": 2.0, "best_lr": "1", "runs": 2},
    ]
    record.log_ranking(cl, parent, rows, partial=True)
    r = cl.get_run(parent)
    assert r.data.metrics == {"test_acc/MHA": 0.75, "rank/MHA": 1.0, "test_acc/LN1": 0.5, "rank/LN1": 2.0}
    note = r.data.tags[tracking.NOTE]
    assert "partial" in note and "| 1 | MHA | 75.00 | 1.00 | 0.3 | 2 |" in note
    assert note.index("| 1 | MHA") < note.index("| 2 | LN1")
    record.attach_report(cl, parent, "# Report\n\nMHA wins.\n")
    record.attach_report(cl, parent, "# Report\n\n" + "x\n" * 5000)  # a rerun replaces it, cut to fit
    note = cl.get_run(parent).data.tags[tracking.NOTE]
    assert note.count("## Analysis report") == 1 and "MHA wins" not in note
    assert "| 1 | MHA" in note and note.endswith("see the artifact)") and len(note) <= tracking.MAX_NOTE
    record.log_ranking(cl, parent, rows[::-1])  # the grid rerun: a new ranking, the report kept
    again = cl.get_run(parent).data.tags[tracking.NOTE]
    assert "| 1 | LN1" in again and "partial" not in again
    assert again.split("## Analysis report")[1] == note.split("## Analysis report")[1]
    # the same numbers again add no point to the charts; a changed one adds one
    assert [len(cl.get_metric_history(parent, k)) for k in ("test_acc/MHA", "rank/LN1")] == [1, 1]
    record.log_ranking(cl, parent, [{**rows[0], "test_acc": 0.8}, rows[1]])
    assert [m.value for m in cl.get_metric_history(parent, "test_acc/MHA")] == [0.75, 0.8]
    assert len(cl.get_metric_history(parent, "rank/LN1")) == 1


def test_runs_url_for_a_server_and_for_a_database_store():
    assert views.runs_url("http://head:5000/", "7").startswith("http://head:5000/#/experiments/7/runs?")
    lines = views.browse_lines("sqlite:////x/mlflow.db", "3")
    assert lines[0] == "browse: mlflow ui --backend-store-uri sqlite:////x/mlflow.db"
    assert lines[1] == "  then open http://127.0.0.1:5000/#/experiments/3/runs?viewStateShareKey=raystudy"


def test_the_policys_view_of_a_run_reads_its_status_as_the_runs_table_does(store):
    uri, cl, exp = store
    runs = {s: record.open_trial(cl, exp, None, trial_key({**CFG, "seed": s}), {**CFG, "seed": s}) for s in range(3)}
    for run_id in runs.values():
        record.log_steps(cl, run_id, [{"val_acc": 0.6, "step": 10}, {"val_acc": 0.4, "step": 20}])
    record.finish_trial(cl, runs[0], {"status": "finished", "test_acc": 0.5, "best_val_acc": 0.6})
    record.finish_trial(cl, runs[1], {"status": "finished", "best_val_acc": 0.6})  # no test accuracy
    view = {s: views.policy_view(cl, cl.get_run(r)) for s, r in runs.items()}
    assert view[0].points == ((10, 0.6), (20, 0.4)) and view[0].ended and view[0].best == 0.6
    row = query.rows([cl.get_run(runs[1])])[0]
    assert row["status"] == "failed" and view[1].ended and view[1].best != view[1].best  # NaN: no result to rank
    assert view[2].points == view[0].points and not view[2].ended  # still running


def _open_store_at(uri, at):
    code = (
        f"import time, sys; from raystudy.tracking import connect; time.sleep(max(0, {at!r} - time.time())); "
        f"connect.experiment_id(connect.client({uri!r}), 'e')"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_drivers_creating_a_new_store_at_once_leave_it_usable(tmp_path):
    # Two drivers creating the SQLite schema at once must not leave a broken store.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    at = time.time() + 8  # after every interpreter has imported MLflow
    procs = [_open_store_at(uri, at) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-1500:] for o in outs)
    assert connect.experiment_id(connect.client(uri), "e")


def test_a_trial_the_policy_stopped_after_it_finished_is_recorded_stopped_late(mlflow_uri):
    from raystudy.train.config import trial_key

    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "r", connect.default_artifact_location(mlflow_uri))
    run = record.open_trial(cl, exp, None, trial_key(_STOPPED_CFG), _STOPPED_CFG)
    record.finish_trial(cl, run, {"status": "finished", "final": 1, "best_val_acc": 0.5, "test_acc": 0.5})
    record.mark_stopped_late(cl, run, 20, "race")
    tags = cl.get_run(run).data.tags
    assert tags[tracking.STATUS] == "stopped" and tags[tracking.STOPPED_AT] == "20"
    assert tags["raystudy.stopped_late"] == "1" and tags["raystudy.stop_rule"] == "race"
    assert query.statuses(cl, exp) == {trial_key(_STOPPED_CFG): "stopped"}


_STOPPED_CFG = {
    "model": "vit_demo",
    "dataset": "digits_c",
    "condition": "MHA",
    "optimizer": "sgd",
    "lr": 0.1,
    "seed": 0,
    "steps": 10,
    "device": "auto",
}


def test_a_trial_record_logs_its_steps_once_then_ends_stopped_finished_or_failed(store):
    # The one sequence the grid's callback, the recovered trials and the finetune command write.
    uri, cl, exp = store
    run_id = record.open_trial(cl, exp, None, "k1", CFG)
    rec = record.TrialRecord(cl, run_id)
    first = {"step": 10, "loss": 1.0, "val_acc": 0.5, "history": [{"step": 5, "loss": 1.5}]}
    rec.log([first])
    rec.log([first])  # a result seen twice logs no point twice
    rec.end(first)  # no final result: stopped at its last step
    run = cl.get_run(run_id)
    assert [(m.step, m.value) for m in cl.get_metric_history(run_id, "loss")] == [(5, 1.5), (10, 1.0)]
    assert run.data.tags[tracking.STATUS] == "stopped" and run.data.tags[tracking.STOPPED_AT] == "10"
    assert run.info.status == "FINISHED" and "test_acc" not in run.data.metrics

    run_id = record.open_trial(cl, exp, None, "k2", CFG)
    rec = record.TrialRecord(cl, run_id)
    final = {"final": 1, "step": 20, "steps_done": 20, "test_acc": 0.8, "best_val_acc": 0.7, "resumed_from": 10}
    rec.log([first, {**final, "history": [{"step": 15, "loss": 0.9}]}])  # the final result is no step
    rec.end(final)
    run = cl.get_run(run_id)
    assert [m.step for m in cl.get_metric_history(run_id, "loss")] == [5, 10, 15]
    assert run.data.tags[tracking.STATUS] == "finished" and run.data.tags[tracking.RESUMED_FROM] == "10"
    assert tracking.STOPPED_AT not in run.data.tags and run.data.metrics["test_acc"] == 0.8

    for key, status, mlflow_status in (("k3", "failed", "FAILED"), ("k4", "interrupted", "KILLED")):
        run_id = record.open_trial(cl, exp, None, key, CFG)
        record.TrialRecord(cl, run_id).fail("boom", status)
        run = cl.get_run(run_id)
        assert run.data.tags[tracking.STATUS] == status and run.info.status == mlflow_status
        assert (tracking.ERROR in run.data.tags) == (status == "failed")


def test_a_step_written_again_after_its_answer_was_lost_is_logged_once(store):
    # Seen under a SLURM scancel: the tracking server stored a trial's last step and was stopped
    # before it answered; the driver's backlog wrote the result again whole and the step (all its
    # metrics, the same values 134 ms apart) was logged twice.
    import requests

    uri, cl, exp = store

    class AnswerLost:  # the real client; once armed, a log_batch is stored and its answer lost
        def __init__(self, cl):
            self.cl, self.armed = cl, False

        def __getattr__(self, name):
            return getattr(self.cl, name)

        def log_batch(self, *args, **kwargs):
            self.cl.log_batch(*args, **kwargs)
            if self.armed:
                self.armed = False
                raise requests.exceptions.ConnectionError("the server was stopped before it answered")

    run_id = record.open_trial(cl, exp, None, "k1", CFG)
    client = AnswerLost(cl)
    rec = record.TrialRecord(client, run_id)
    rec.log([{"step": 10, "loss": 1.0, "val_acc": 0.5}])
    last, client.armed = {"step": 20, "loss": 0.5, "val_acc": 0.6}, True
    with pytest.raises(requests.exceptions.ConnectionError):
        rec.log([last])
    rec.log([last])  # the backlog's retry, the same write whole
    rec.log([{"step": 30, "loss": 0.4, "val_acc": 0.7}])
    for key in ("loss", "val_acc"):
        assert [m.step for m in cl.get_metric_history(run_id, key)] == [10, 20, 30], key


def test_a_trial_ended_again_after_a_kill_between_its_final_metrics_and_status_logs_none_twice(store):
    # MLflow's log_batch commits a batch's metrics, then its tags: a driver SIGKILLed between them
    # (seen in bench_scale's kills) left the final metrics with the run still "running", and the
    # trial's rerun logged every final metric a second time at step 0.
    from mlflow.entities import Metric

    uri, cl, exp = store
    run_id = record.open_trial(cl, exp, None, "k1", CFG)
    rec = record.TrialRecord(cl, run_id)
    evals = [{"step": 10, "loss": 1.0, "val_acc": 0.5, "best_val_acc": 0.5}]
    rec.log(evals)
    final = {"final": 1, "step": 20, "steps_done": 20, "test_acc": 0.8, "best_val_acc": 0.7, "wall_s": 3.0}
    first = [Metric(k, float(final[k]), 1, 0) for k in ("steps_done", "test_acc", "best_val_acc", "wall_s")]
    cl.log_batch(run_id, metrics=first)  # the first end's metrics; then the kill, before its tags
    assert query.trial_status(cl, exp, "k1")[0] == "running"
    record.TrialRecord(cl, run_id).end({**final, "wall_s": 2.9})  # the rerun's end
    run = cl.get_run(run_id)
    assert run.data.tags[tracking.STATUS] == "finished" and run.info.status == "FINISHED"
    for key in ("steps_done", "test_acc", "wall_s"):
        assert [(m.step, m.value) for m in cl.get_metric_history(run_id, key)] == [(0, final[key])], key
    assert sorted((m.step, m.value) for m in cl.get_metric_history(run_id, "best_val_acc")) == [(0, 0.7), (10, 0.5)]

    # a run whose cut-off end was a stop (steps_done, wall_s), then a whole end: what it had stays
    # as it was, the rest is added
    run_id = record.open_trial(cl, exp, None, "k2", CFG)
    cl.log_batch(run_id, metrics=[Metric("steps_done", 10.0, 1, 0), Metric("wall_s", 1.0, 1, 0)])
    record.TrialRecord(cl, run_id).end(final)
    run = cl.get_run(run_id)
    assert run.data.metrics["test_acc"] == 0.8 and run.data.metrics["best_val_acc"] == 0.7
    assert [(m.step, m.value) for m in cl.get_metric_history(run_id, "steps_done")] == [(0, 10.0)]
