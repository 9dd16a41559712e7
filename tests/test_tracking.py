import pytest

from raystudy import tracking
from raystudy.config import trial_key


@pytest.fixture()
def store(mlflow_uri):
    uri = mlflow_uri
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "t", tracking.default_artifact_location(uri))
    return uri, cl, exp


CFG = {"model": "vit_demo", "dataset": "digits_c", "condition": "MHA", "optimizer": "sgd", "lr": 0.1,
       "seed": 0, "steps": 10, "device": "auto"}


def test_trial_key_is_stable_and_ignores_execution_keys():
    k = trial_key(CFG)
    assert k == trial_key(dict(reversed(list(CFG.items()))))
    assert k == trial_key({**CFG, "device": "cuda", "num_workers": 4})
    assert k != trial_key({**CFG, "seed": 1})


def test_open_trial_twice_gives_one_run(store):
    uri, cl, exp = store
    parent = tracking.parent_run(cl, exp, "g1", "grid", {"space": "demo"})
    assert tracking.parent_run(cl, exp, "g1", "grid", {"space": "demo"}) == parent
    key = trial_key(CFG)
    r1 = tracking.open_trial(cl, exp, parent, key, CFG)
    r2 = tracking.open_trial(cl, exp, parent, key, CFG)  # a rerun after a crash
    assert r1 == r2
    assert tracking.trial_status(cl, exp, key)[0] == "running"
    run = cl.get_run(r1)
    assert run.data.tags["raystudy.attempts"] == "2"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.params["lr"] == "0.1" and run.data.tags["condition"] == "MHA"
    tracking.log_steps(cl, r1, [{"loss": 1.5, "grad_norm/MHA": 0.3, "training_iteration": 4, "step": 10}])
    tracking.finish_trial(cl, r1, {"status": "finished", "test_acc": 0.5, "best_val_acc": 0.6})
    run = cl.get_run(r1)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_acc"] == 0.5 and run.data.metrics["grad_norm/MHA"] == 0.3
    assert "training_iteration" not in run.data.metrics  # Tune's bookkeeping is not a metric
    assert tracking.trial_status(cl, exp, key)[0] == "finished"
    assert [a.path for a in cl.list_artifacts(r1)] == ["config.yaml"]


def test_diverged_is_finished_not_failed_and_failed_keeps_its_error(store):
    uri, cl, exp = store
    k1, k2 = trial_key(CFG), trial_key({**CFG, "seed": 9})
    r1 = tracking.open_trial(cl, exp, None, k1, CFG)
    tracking.finish_trial(cl, r1, {"status": "diverged", "test_acc": float("nan")})
    r2 = tracking.open_trial(cl, exp, None, k2, {**CFG, "seed": 9})
    tracking.fail_trial(cl, r2, "Traceback ...\nDatasetUnavailable: no files")
    assert cl.get_run(r1).info.status == "FINISHED"
    assert cl.get_run(r1).data.tags["raystudy.status"] == "diverged"
    assert "test_acc" not in cl.get_run(r1).data.metrics  # NaN is not recorded as a number
    assert cl.get_run(r2).info.status == "FAILED"
    assert cl.get_run(r2).data.tags["raystudy.error"].endswith("no files")


def test_check_uri(tmp_path):
    tracking.check_uri(f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(tracking.TrackingUnavailable, match="does not exist"):
        tracking.check_uri(f"sqlite:///{tmp_path}/nope/x.db")
    with pytest.raises(tracking.TrackingUnavailable, match="unreachable"):
        tracking.check_uri("http://127.0.0.1:9", timeout=1)
    with pytest.raises(tracking.TrackingUnavailable, match="file store"):
        tracking.check_uri("file:///tmp/mlruns")


def test_default_uri_is_sqlite_in_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.default_uri() == f"sqlite:///{tmp_path}/mlflow.db"


def test_close_stale_marks_only_running_runs_of_the_selection(store):
    uri, cl, exp = store
    k = [trial_key({**CFG, "seed": s}) for s in range(3)]
    r = [tracking.open_trial(cl, exp, None, k[s], {**CFG, "seed": s}, {"raystudy.search": "a" if s < 2 else "b"})
         for s in range(3)]
    tracking.finish_trial(cl, r[0], {"status": "finished", "test_acc": 0.5})
    assert tracking.close_stale(cl, exp, raystudy__search="a") == 1
    assert cl.get_run(r[1]).info.status == "KILLED"
    assert cl.get_run(r[1]).data.tags["raystudy.status"] == "interrupted"
    assert cl.get_run(r[0]).info.status == "FINISHED"   # finished runs untouched
    assert cl.get_run(r[2]).info.status == "RUNNING"    # another search's run untouched
    assert tracking.close_stale(cl, exp, raystudy__search="a") == 0


def test_statuses_in_one_query_prefer_terminal(store):
    uri, cl, exp = store
    keys = [trial_key({**CFG, "seed": s}) for s in range(3)]
    runs = [tracking.open_trial(cl, exp, None, k, {**CFG, "seed": s}) for s, k in enumerate(keys)]
    tracking.finish_trial(cl, runs[0], {"status": "finished"})
    tracking.fail_trial(cl, runs[1], "boom")
    assert tracking.statuses(cl, exp) == {keys[0]: "finished", keys[1]: "failed", keys[2]: "running"}
