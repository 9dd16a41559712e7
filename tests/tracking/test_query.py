"""tracking.query: what a resumed grid knows is done, read in one SQL query, as MLflow's search reads it."""

import math

from raystudy.tracking import query
from raystudy.tracking.tags import KEY, ROLE, STATUS


def _store(uri):
    """Three experiments of trial runs, in the order they started; returns the client."""
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    a, b, c = (cl.create_experiment(n) for n in ("a", "b", "c"))
    runs = [  # (experiment, role, key, status), oldest first
        (a, "trial", "k1", "finished"),
        (a, "trial", "k2", "running"),
        (a, "trial", "k2", "finished"),  # a rerun's record: the terminal one wins
        (a, "trial", "k3", "failed"),
        (a, "trial", "k3", "running"),  # neither terminal: the newest
        (a, "trial", "k4", "finished"),
        (a, "trial", "k4", "running"),
        (a, "grid", "k9", "finished"),  # a parent run is no trial
        (a, "trial", "k6", None),  # no status yet
        (b, "trial", "k7", "finished"),
        (c, "trial", "k8", "finished"),
    ]
    for t, (exp, role, key, status) in enumerate(runs):
        tags = {ROLE: role, KEY: key} | ({STATUS: status} if status else {})
        cl.create_run(exp, start_time=1_000 + t, tags=tags)
    gone = cl.create_run(a, start_time=2_000, tags={ROLE: "trial", KEY: "k5", STATUS: "finished"})
    cl.delete_run(gone.info.run_id)
    cl.delete_experiment(c)
    return cl, a


def test_the_sql_read_of_what_is_done_is_mlflows_search_of_it(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _store(uri)
    want = {"k1": "finished", "k2": "finished", "k3": "running", "k4": "finished", "k6": None}
    assert query.searched_statuses(cl, a) == want  # MLflow's search
    monkeypatch.setattr(query, "searched_statuses", None)  # from here on, SQL alone answers
    assert query.statuses(cl, a) == want
    assert query.known_statuses(uri, "a") == want
    assert query.known_statuses(uri, "b") == {"k7": "finished"}
    assert query.known_statuses(uri, "c") == {} and query.known_statuses(uri, "none") == {}  # deleted, missing


def test_a_store_not_made_yet_is_not_made_by_reading_it(tmp_path):
    db = tmp_path / "mlflow.db"
    assert query.known_statuses(f"sqlite:///{db}", "a") == {} and not db.exists()


def test_a_schema_the_sql_does_not_know_is_read_by_mlflows_search(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _store(uri)
    monkeypatch.setattr(query, "_STATUSES_SQL", "SELECT key, value FROM tags_of_another_mlflow")
    assert query._sql_statuses(uri, "1 = 1") is None
    assert query.known_statuses(uri, "b") == {"k7": "finished"}
    assert query.statuses(cl, a)["k3"] == "running"


def _runs_store(uri):
    """Trial runs of every shape the analysis reads, beside runs it must not: returns (client, id)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    cl = MlflowClient(tracking_uri=uri)
    a, b = cl.create_experiment("a"), cl.create_experiment("b")
    cell = {"dataset": "digits", "condition": "MHA", "model": "vit_demo", "optimizer": "sgd"}

    def trial(exp, key, status, mlflow_status, params, metrics, start, **more):
        tags = {ROLE: "trial", KEY: key, **cell, **more} | ({STATUS: status} if status else {})
        run = cl.create_run(exp, start_time=start, tags=tags).info.run_id
        if params:
            cl.log_batch(run, params=[Param(k, str(v)) for k, v in params.items()])
        if metrics:  # (key, value, step): several steps of one key, logged out of order
            cl.log_batch(run, metrics=[Metric(k, v, 1_000 + i, step) for i, (k, v, step) in enumerate(metrics)])
        if mlflow_status != "RUNNING":
            cl.set_terminated(run, mlflow_status)
        return run

    p = {"lr": 0.1, "seed": 0, "probe_pairs": 0}
    done = [("best_val_acc", 0.5, 0), ("test_acc", 0.45, 0), ("trainable_params", 2000.0, 0)]
    trial(
        a,
        "k1",
        "finished",
        "FINISHED",
        p,
        [*done, ("val_acc", 0.3, 20), ("val_acc", 0.2, 10), ("val_acc", 0.4, 30)],
        10,
    )
    trial(a, "k2", "diverged", "FAILED", {**p, "seed": 1}, [("loss", float("nan"), 5), ("class0_test_acc", 0.1, 5)], 11)
    trial(a, "k3", "failed", "FAILED", {}, [("grad_norm/MHA", float("inf"), 3)], 12, **{"raystudy.error": "boom"})
    trial(a, "k4", "stopped", "KILLED", {**p, "seed": 2}, [], 13)
    trial(a, "k5", None, "RUNNING", {**p, "seed": 3}, [("val_acc", 0.1, 0)], 14)  # no raystudy status yet
    trial(a, "k6", "finished", "FINISHED", {**p, "seed": 4}, [("best_val_acc", 0.6, 0)], 15)  # without test_acc
    # a rerun of k1 that started in the same millisecond as k6: the tie is broken by run id, as MLflow's is
    trial(a, "k1", "finished", "FINISHED", p, [*done, ("test_acc", 0.47, 1)], 15)
    gone = trial(a, "k7", "finished", "FINISHED", p, done, 16)
    cl.delete_run(gone)
    parent = cl.create_run(a, start_time=1, tags={ROLE: "grid"}).info.run_id
    cl.log_batch(parent, params=[Param("lr", "9")])
    trial(b, "k8", "finished", "FINISHED", p, done, 17)  # another experiment
    return cl, a


def _seen(records):
    """What a record holds, comparable with NaN in it."""
    return [
        (
            r.run_id,
            r.status,
            r.start_time,
            sorted(r.tags.items()),
            sorted(r.params.items()),
            repr(sorted(r.metrics.items())),
        )
        for r in records
    ]


def test_the_sql_read_of_the_trial_runs_is_mlflows_search_of_them(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _runs_store(uri)
    searched = [query.Recorded.of(r) for r in query.find_runs(cl, a, raystudy__role="trial")]
    assert [r.tags[KEY] for r in searched][:5] == ["k1", "k2", "k3", "k4", "k5"] and len(searched) == 7
    monkeypatch.setattr(query, "find_runs", None)  # from here on, SQL alone answers
    read = query.trial_runs(cl, a)
    assert _seen(read) == _seen(searched)
    first = read[0]
    assert first.metrics["val_acc"] == 0.4  # the highest step's value, not the last logged
    assert math.isnan(read[1].metrics["loss"]) and read[2].metrics["grad_norm/MHA"] == 1.7976931348623157e308
    assert read[2].params == {} and read[3].metrics == {}


def test_the_runs_table_is_the_same_read_either_way(tmp_path, monkeypatch):
    import pandas as pd

    from analysis import load

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _runs_store(uri)
    by_sql = load.from_mlflow("a", uri)
    monkeypatch.setattr(query, "_database_of", lambda cl, exp_id: None)  # MLflow's search
    by_search = load.from_mlflow("a", uri)
    pd.testing.assert_frame_equal(by_sql, by_search)
    assert by_sql.attrs == by_search.attrs
    # by dataset, condition, lr, seed: k1, k2, k4, k5, k6, then k3 (no params: its lr NaN)
    assert list(by_sql["status"]) == ["finished", "diverged", "stopped", "running", "failed", "failed"]
    assert by_sql.attrs["replaced"] == 1  # k1's two runs: one row, the rerun's, its test_acc at its latest step
    assert by_sql["test_acc"].iloc[0] == 0.47


def test_a_schema_the_sql_does_not_know_reads_the_trial_runs_by_mlflows_search(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _runs_store(uri)
    monkeypatch.setattr(query, "_METRICS_SQL", "SELECT a, b, c, d FROM metrics_of_another_mlflow")
    assert query._sql_trial_runs(*query._database_of(cl, a)) is None
    assert len(query.trial_runs(cl, a)) == 7


def test_metric_histories_read_with_sql_are_mlflows_point_for_point(tmp_path, monkeypatch):
    from mlflow.entities import Metric

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cl, a = _runs_store(uri)
    runs = [r.info.run_id for r in cl.search_runs([a])]
    # out of order, a step logged twice, NaN and inf, keys another run lacks
    points = [(0, 0.1, 5), (20, 0.3, 1), (10, float("nan"), 3), (10, 0.2, 4), (30, float("inf"), 2)]
    cl.log_batch(runs[0], metrics=[Metric("val_acc", v, t, s) for s, v, t in points])
    cl.log_batch(runs[1], metrics=[Metric("grad_norm/MHA", 1.0 + s, 7, s) for s in range(3)])
    keys = ["val_acc", "grad_norm/MHA", "loss", "never"]
    monkeypatch.setattr(query, "_CHUNK", 2)  # several chunks of runs
    found = query.metric_histories(cl, runs, keys)
    want = {}
    for run in runs:
        for key in keys:
            history = [(m.step, m.value) for m in cl.get_metric_history(run, key)]
            if history:
                want[(run, key)] = history
    assert repr(sorted(found.items())) == repr(sorted(want.items()))
    assert [s for s, _ in found[(runs[0], "val_acc")]][:3] == [20, 30, 10]  # by timestamp, as MLflow orders
    assert query.metric_histories(cl, [], keys) == {}


def test_the_curves_table_is_the_same_read_either_way(tmp_path, monkeypatch):
    import pandas as pd

    from analysis import load

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _runs_store(uri)
    runs = load.from_mlflow("a", uri)
    keys = ["val_acc", "grad_norm/{condition}", "loss"]
    by_sql = load.step_metrics(runs, keys, uri)
    assert len(by_sql) >= 3 and set(by_sql["key"]) <= set(keys)
    monkeypatch.setattr(query, "metric_histories", lambda cl, ids, keys: None)  # MLflow's call per run and key
    pd.testing.assert_frame_equal(by_sql, load.step_metrics(runs, keys, uri))
