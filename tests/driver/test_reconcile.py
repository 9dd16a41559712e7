"""driver.reconcile: trials finished in Tune's folder but missing from MLflow, recorded from their files
(the grid end to end, a store restored to a snapshot, is commands/test_grid_ray.py's)."""

import json
from types import SimpleNamespace

from raystudy.driver import ledger, optuna_search, reconcile
from raystudy.spaces import searches
from raystudy.tracking import connect, query, record

CONFIG = {"condition": "MHA", "dataset": "digits_c", "optimizer": "sgd", "lr": 0.1, "seed": 0, "model": "vit_demo"}
FINAL = {"final": 1, "step": 20, "steps_done": 20, "test_acc": 0.8, "best_val_acc": 0.7, "status": "finished"}


def trial_folder(root, name, key, results, params=None):
    """A Tune trial folder as the grid leaves it: its config, then one JSON line per result."""
    d = root / name
    d.mkdir(parents=True)
    params = json.dumps({"threads": 1, "trial": {"key": key, "finetune": CONFIG}}) if params is None else params
    (d / "params.json").write_text(params)
    (d / "result.json").write_text("".join(json.dumps(r) + "\n" for r in results))
    (d / "checkpoint_000000").mkdir()  # a folder without params.json is none of the trials


def test_finished_trials_on_storage_are_recorded_once_with_their_curves_and_results(tmp_path, mlflow_uri):
    grid = tmp_path / "grid"
    first = {"step": 10, "loss": 1.0, "val_acc": 0.5, "history": [{"step": 5, "loss": 1.5}]}
    trial_folder(grid, "a", "ka", [first, {**FINAL, "history": [{"step": 15, "loss": 0.9}]}])
    trial_folder(grid, "b", "kb", [first])  # still running when the head went: no final result
    trial_folder(grid, "c", "kc", [first, FINAL])  # not asked for (MLflow has it done)
    trial_folder(grid, "d", "kd", [FINAL], params='{"trial": {"key"')  # cut short
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "grid-key", "grid-t", {}, role="grid")

    assert reconcile.record_finished(cl, exp, parent, grid, {"ka", "kb", "kd"}) == 1
    assert query.statuses(cl, exp) == {"ka": "finished"}
    _, run = query.trial_status(cl, exp, "ka")
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["raystudy.recovered"] == "1" and run.data.tags["raystudy.attempts"] == "1"
    assert run.data.metrics["test_acc"] == 0.8 and run.data.params["lr"] == "0.1"
    assert [(m.step, m.value) for m in cl.get_metric_history(run.info.run_id, "loss")] == [
        (5, 1.5),
        (10, 1.0),
        (15, 0.9),
    ]


def test_a_run_the_snapshot_holds_as_running_is_the_one_recorded(tmp_path, mlflow_uri):
    grid = tmp_path / "grid"
    trial_folder(grid, "a", "ka", [{"step": 10, "loss": 1.0}, {**FINAL, "history": [{"step": 15, "loss": 0.9}]}])
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    run_id = record.open_trial(cl, exp, None, "ka", CONFIG)
    record.log_steps(cl, run_id, [{"step": 10, "loss": 1.0}])  # what it had logged by the snapshot

    assert reconcile.record_finished(cl, exp, None, grid, {"ka"}) == 1
    (run,) = query.find_runs(cl, exp, raystudy__role="trial")
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.tags["raystudy.status"] == "finished" and run.data.tags["raystudy.attempts"] == "1"
    assert [m.step for m in cl.get_metric_history(run_id, "loss")] == [10, 15]


def test_no_tune_folder_records_nothing(tmp_path, mlflow_uri):
    cl = connect.client(mlflow_uri)
    assert (
        reconcile.record_finished(
            cl,
            connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri)),
            None,
            tmp_path / "missing",
            {"ka"},
        )
        == 0
    )


def test_a_storage_uri_is_read_through_its_filesystem(tmp_path, mlflow_uri):
    trial_folder(tmp_path / "grid", "a", "ka", [FINAL])
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    assert [t["key"] for t, _ in ledger.finished(f"file://{tmp_path}/grid", {"ka"})] == ["ka"]
    assert reconcile.record_finished(cl, exp, None, f"file://{tmp_path}/grid", {"ka"}) == 1
    assert query.statuses(cl, exp) == {"ka": "finished"}
    assert ledger.finished("nosuchscheme://bucket/grid", {"ka"}) == []  # unreachable storage: nothing known


def _halving_grid(tmp_path) -> list:
    """One cell, 3 lrs x 2 seeds; halving keeps 2 of the 3 lrs at step 5 (a quarter of 20 steps)."""
    import yaml

    from raystudy.spaces import grids

    space = {
        "study": "t",
        "base": {"model": "vit_demo", "steps": 20, "warmup_steps": 2, "eval_every": 5, "log_every": 5},
        "grid": {"condition": "MHA", "lr": {"grid_search": [0.03, 0.1, 0.3]}, "seed": {"grid_search": [0, 1]}},
        "datasets": {"digits_c": {}},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    return grids.expand(grids.load_grid(str(tmp_path / "space.yaml")))


def test_under_a_policy_the_trials_it_stops_are_recorded_stopped_and_the_rest_left_to_run(tmp_path, mlflow_uri):
    from raystudy.spaces import adaptive

    trials = _halving_grid(tmp_path)
    by = {(t.config["lr"], t.config["seed"]): t for t in trials}
    grid = tmp_path / "grid"

    def folder(lr, seed, results):
        t = by[(lr, seed)]
        trial_folder(grid, f"{lr}-{seed}", t.key, results, params=json.dumps({"trial": t.as_dict()}))

    def at(step, val):
        return {"step": step, "loss": 1.0, "val_acc": val}

    folder(0.1, 0, [at(5, 0.6), at(10, 0.6), FINAL])
    folder(0.3, 0, [at(5, 0.5), at(10, 0.5), FINAL])
    folder(0.03, 0, [at(5, 0.1)])  # the worst at step 5: the scheduler stopped it there
    folder(0.1, 1, [at(5, 0.6), at(10, 0.6)])  # running when the head went: kept by the policy
    # (0.03, 1) never started (the policy had dropped its lr); (0.3, 1) had not started yet
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "grid-key", "grid-t", {}, role="grid")
    keys = {t.key for t in trials}
    assert reconcile.record_finished(cl, exp, parent, grid, keys) == 2
    missing = keys - set(query.statuses(cl, exp))

    assert reconcile.record_stopped(cl, exp, parent, [grid], missing, adaptive.policy("halving"), trials) == 2
    statuses = query.statuses(cl, exp)
    assert {k: v for k, v in statuses.items() if v == "stopped"} == {
        by[(0.03, 0)].key: "stopped",
        by[(0.03, 1)].key: "stopped",
    }
    assert by[(0.1, 1)].key not in statuses and by[(0.3, 1)].key not in statuses  # left to run
    for (lr, seed), step in (((0.03, 0), 5), ((0.03, 1), 0)):
        _, run = query.trial_status(cl, exp, by[(lr, seed)].key)
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.tags["raystudy.stopped_at"] == str(step) and run.data.metrics["steps_done"] == step
        assert "test_acc" not in run.data.metrics  # a stopped trial has no final results
    _, run = query.trial_status(cl, exp, by[(0.03, 0)].key)
    assert [(m.step, m.value) for m in cl.get_metric_history(run.info.run_id, "val_acc")] == [(5, 0.1)]


def test_trials_a_searcher_holds_ended_are_recorded_as_their_results_end(tmp_path, mlflow_uri):
    # a search's ledger: one trial finished, one stopped early by ASHA at step 10, both done for
    # Optuna when the driver was killed; the second's run was RUNNING
    ledger = tmp_path / "results"
    trial_folder(ledger, "ka", "ka", [{"step": 10, "loss": 1.0}, FINAL])
    trial_folder(ledger, "kb", "kb", [{"step": 10, "loss": 1.2, "val_acc": 0.3}])
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "search-key", "search-t", {}, role="search")
    running = record.open_trial(cl, exp, parent, "kb", CONFIG, {"raystudy.search": "s"})

    tags = {"raystudy.search": "s"}
    assert reconcile.record_ended(cl, exp, parent, [ledger, tmp_path / "missing"], {"ka", "kb"}, tags) == 2
    assert query.statuses(cl, exp) == {"ka": "finished", "kb": "stopped"}
    _, a = query.trial_status(cl, exp, "ka")
    assert a.data.tags["raystudy.search"] == "s" and a.data.metrics["test_acc"] == 0.8
    _, b = query.trial_status(cl, exp, "kb")
    assert b.info.run_id == running and b.info.status == "FINISHED" and b.data.metrics["steps_done"] == 10


def test_trials_mlflow_ended_whose_tell_optuna_never_got_are_told_their_last_score_not_run_again(tmp_path, mlflow_uri):
    # Ray's searcher tells Optuna a trial's end before MLflow hears of it and lets a failed tell
    # (a full disk) pass as a warning: MLflow ended the run, Optuna holds the trial RUNNING. CI
    # saw a resumed search fail such a trial and run another: 9 ended runs for 8 COMPLETE trials.
    import optuna

    space = searches.load_search("optimiser")
    base = {**space.base, "model": "vit_demo", "dataset": "digits_c"}
    res = {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    store = optuna_search.optuna_storage(tmp_path / "optuna")
    searcher = optuna_search.make_searcher(space, "MHA", base, res, store, "s")
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "search-key", "search-s", {}, role="search")
    written = ledger.ResultLedger(ledger.of_study(tmp_path, "s"))
    final = {"final": 1, "step": 20, "steps_done": 20, "test_acc": 0.8, "best_val_acc": 0.7, "status": "finished"}
    ends = {  # how each trial ended: its results, and what its run says
        "told": ([{"step": 10, "score": 0.3}, {**final, "score": 0.3}], "end"),
        "finished": ([{"step": 10, "score": 0.5}, {**final, "score": 0.6}], "end"),
        "stopped": ([{"step": 10, "score": 0.2}], "end"),  # ASHA stopped it: no final result
        "killed": ([{"step": 10, "score": 0.9}], "interrupted"),
    }
    number = {}
    for i, (name, (results, how)) in enumerate(ends.items()):
        cfg = searcher.suggest(str(i))
        number[name] = i
        for r in results:
            written.on_trial_result(0, [], SimpleNamespace(config=cfg), r)
        run_id = record.open_trial(
            cl, exp, parent, cfg["trial"]["key"], cfg["trial"]["finetune"], {"raystudy.search": "s"}
        )
        if name == "told":
            searcher.on_trial_complete(str(i), results[-1])
        if how == "end":
            record.TrialRecord(cl, run_id).end(results[-1])
        else:
            record.TrialRecord(cl, run_id).fail("killed", status="interrupted")

    sampler = searches.Sampler(space, "MHA", base, res)  # the searcher's: keys from params
    done = reconcile.study_after_a_kill(store, "s", sampler, (cl, exp, parent), tmp_path, "MHA")
    trials = optuna.load_study(study_name="s", storage=store).get_trials(deepcopy=False)
    got = {name: (trials[n].state.name, trials[n].value) for name, n in number.items()}
    assert got == {
        "told": ("COMPLETE", 0.3),
        "finished": ("COMPLETE", 0.6),
        "stopped": ("COMPLETE", 0.2),
        "killed": ("FAIL", None),  # never ended: its config is not run again, nor counted done
    }
    assert done == 3


def test_a_grid_in_parts_has_what_its_tune_folders_hold_recorded_and_says_how_many_folders(
    tmp_path, mlflow_uri, capsys
):
    # a grid of two Tune runs (a part a seed), its store restored to a snapshot that holds none of
    # them: each part's folder is read for its own trials; the policy's stops come from both
    from raystudy.spaces import adaptive

    trials = _halving_grid(tmp_path)
    by = {(t.config["lr"], t.config["seed"]): t for t in trials}
    storage = tmp_path / "ray"
    runs = [(f"g-part{s + 1}of2", [t for t in trials if t.config["seed"] == s]) for s in (0, 1)]

    def folder(lr, seed, results):
        t = by[(lr, seed)]
        trial_folder(storage / runs[seed][0], f"{lr}", t.key, results, params=json.dumps({"trial": t.as_dict()}))

    at = {"step": 5, "loss": 1.0}
    folder(0.1, 0, [{**at, "val_acc": 0.6}, FINAL])
    folder(0.3, 0, [{**at, "val_acc": 0.5}, FINAL])
    folder(0.03, 0, [{**at, "val_acc": 0.1}])  # stopped by the scheduler at step 5
    folder(0.1, 1, [{**at, "val_acc": 0.6}, FINAL])
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "grid-key", "grid-t", {}, role="grid")

    policy = adaptive.policy("halving")
    done = reconcile.grid_after_a_kill(trials, runs, storage, policy, {}, cl, exp, parent)
    finished = {by[(0.1, 0)].key, by[(0.3, 0)].key, by[(0.1, 1)].key}
    assert done == finished | {by[(0.03, 0)].key, by[(0.03, 1)].key}
    out = capsys.readouterr().out
    assert f"2 trial(s) finished in {storage / runs[0][0]} but missing from MLflow" in out, out
    assert (
        f"2 trial(s) the policy stopped, missing from MLflow: recorded stopped from 2 Tune folders under {storage}"
        in out
    )
