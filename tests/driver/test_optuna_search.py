"""driver.optuna_search: a resumed search goes on from the persisted study."""

from types import SimpleNamespace

from raystudy.driver import optuna_search
from raystudy.spaces import searches
from raystudy.tracking import connect, record


def test_a_resumed_search_suggests_no_config_twice(tmp_path):
    # Rebuilt with the same seed, a searcher would replay its first suggestions.
    space = searches.load_search("optimiser")
    base = {**space.base, "model": "vit_demo", "dataset": "digits_c"}
    res = {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    store = optuna_search.optuna_storage(tmp_path)

    def session(n, first):
        s = optuna_search.make_searcher(space, "MHA", base, res, store, "s")
        keys = []
        for i in range(n):
            cfg = s.suggest(f"{first + i}")
            keys.append(cfg["trial"]["key"])
            s.on_trial_complete(f"{first + i}", {"score": 0.1 * i, "step": 1})
        return keys

    first = session(3, 0)
    optuna_search.completed_trials(store, "s")
    second = session(3, 3)  # the search killed and run again: same space, same seed
    assert len(set(first + second)) == 6, (first, second)


def test_a_session_runs_as_tune_runs_of_at_most_trials_per_run():
    assert optuna_search.parts(12, 5) == [5, 5, 2]
    assert optuna_search.parts(10, 5) == [5, 5]
    assert optuna_search.parts(3, 500) == [3]
    assert optuna_search.parts(0, 5) == []


def test_trials_mlflow_ended_whose_tell_optuna_never_got_are_told_their_last_score_not_run_again(tmp_path, mlflow_uri):
    # Ray's searcher tells Optuna a trial's end before MLflow hears of it and lets a failed tell
    # (a full disk) pass as a warning: MLflow ended the run, Optuna holds the trial RUNNING. CI
    # saw a resumed search fail such a trial and run another: 9 ended runs for 8 COMPLETE trials.
    import optuna

    from raystudy.driver import records

    space = searches.load_search("optimiser")
    base = {**space.base, "model": "vit_demo", "dataset": "digits_c"}
    res = {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    store = optuna_search.optuna_storage(tmp_path / "optuna")
    searcher = optuna_search.make_searcher(space, "MHA", base, res, store, "s")
    cl = connect.client(mlflow_uri)
    exp = connect.experiment_id(cl, "e", connect.default_artifact_location(mlflow_uri))
    parent = record.parent_run(cl, exp, "search-key", "search-s", {}, role="search")
    ledger = records.ResultLedger(optuna_search.ledger(tmp_path, "s"))
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
            ledger.on_trial_result(0, [], SimpleNamespace(config=cfg), r)
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
    done = optuna_search._after_a_kill(store, "s", sampler, (cl, exp, parent), tmp_path, "MHA")
    trials = optuna.load_study(study_name="s", storage=store).get_trials(deepcopy=False)
    got = {name: (trials[n].state.name, trials[n].value) for name, n in number.items()}
    assert got == {
        "told": ("COMPLETE", 0.3),
        "finished": ("COMPLETE", 0.6),
        "stopped": ("COMPLETE", 0.2),
        "killed": ("FAIL", None),  # never ended: its config is not run again, nor counted done
    }
    assert done == 3
