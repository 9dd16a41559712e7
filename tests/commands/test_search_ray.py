"""Optuna searches on the offline demo through real Ray Tune and MLflow (slow)."""

import signal
import subprocess
import sys

import pytest
import yaml

from raystudy.driver import faults
from tests.helpers import (
    count_status,
    ctrl_c_twice,
    driver_env,
    freeze_running_trials,
    kill_group,
    running_workers,
    search_runs,
    start,
    thaw,
    wait_for,
)

pytestmark = pytest.mark.slow

SPACE = {
    "study": "ts",
    "base": {
        "model": "vit_demo",
        "dataset": "digits_c",
        "steps": 60,
        "eval_every": 10,
        "log_every": 10,
        "batch_size": 32,
    },
    "conditions": ["MHA"],
    "params": {
        "optimizer": {"choice": ["sgd", "adamw"]},
        "lr": {"loguniform": [1.0e-3, 0.5]},
        "warmup_steps": {"randint": [0, 10]},
        "momentum": {"uniform": [0.8, 0.99], "when": {"optimizer": "sgd"}},
        "beta2": {"uniform": [0.95, 0.999], "when": {"optimizer": "adamw"}},
    },
    "budget": {"num_samples": 8},
    "scheduler": {"grace_period": 10, "reduction_factor": 2},
    "test_seeds": [100, 101],
    # one trial at a time, the fresh-seed runs too: a cap a user sets (a GPU's memory) holds for
    # every stage; on a 2-core machine a second trial at once is a process start and no speed
    "tune": {"checkpoint_every_s": 0, "max_concurrent": 1},
}


@pytest.fixture()
def work(tmp_path, demo_weights, mlflow_uri, shared_ray):  # mlflow_uri: ./mlflow.db starts as an empty store
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SPACE))
    return tmp_path, shared_ray


def cmd(tmp, ray):
    """The search's command line; ``ray``: the shared Ray's ``--address``."""
    return [sys.executable, "-m", "raystudy", "search", "--space", str(tmp / "s.yaml"), *ray, "--quiet"]


def runs(tmp):
    return search_runs(f"sqlite:///{tmp}/mlflow.db", "raystudy-ts-vit_demo")


def optuna_trials(tmp, name="ts-vit_demo-digits_c-MHA"):
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp}/runs/search/optuna/optuna.db")
    return study.get_trials(deepcopy=False)


def test_search_with_asha_then_fresh_seed_test_all_in_mlflow(work):
    tmp, ray = work
    # as on a cluster's head (node.sh env): the search ends with one snapshot of the store, taken last
    snap = f"cp {tmp}/mlflow.db {tmp}/snap.db && echo snapshot of MLflow: {tmp}/snap.db"
    env = driver_env(RAYSTUDY_SNAPSHOT_CMD=snap)
    p = subprocess.run(cmd(tmp, ray), cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == f"snapshot of MLflow: {tmp}/snap.db", p.stdout[-3000:]
    # 8 trials, 2 fresh seeds and their 2 parent runs, all ended in the snapshot
    assert count_status(tmp / "snap.db", "finished", "stopped") == 12 and not count_status(tmp / "snap.db", "running")
    assert "best configuration per condition" in p.stdout and "(2 seeds)" in p.stdout
    df = runs(tmp)
    trials = df[df["tags.raystudy.search"] == "ts-vit_demo-digits_c-MHA"]
    assert len(trials) == 8 and trials["tags.raystudy.key"].nunique() == 8
    status = trials["tags.raystudy.status"]
    assert (status == "stopped").sum() >= 1, status.tolist()  # ASHA stopped weak trials early
    assert (status == "finished").sum() >= 1
    assert trials[status == "stopped"]["metrics.test_acc"].isna().all()
    # the best finished trial's config, re-run on test with the fresh seeds 100 and 101
    tested = df[df["tags.mlflow.parentRunId"].isin(df[df["tags.raystudy.role"] == "search-test"]["run_id"])]
    assert sorted(tested["params.seed"].astype(int)) == [100, 101]
    assert tested["metrics.test_acc"].between(0, 1).all()
    first, second = tested.sort_values("start_time").to_dict("records")
    assert first["end_time"] <= second["start_time"], tested[["start_time", "end_time"]]  # the space's cap
    best = trials[status == "finished"].sort_values("metrics.best_val_acc").iloc[-1]
    assert set(tested["params.lr"]) == {best["params.lr"]}
    assert len([t for t in optuna_trials(tmp) if t.state.name == "COMPLETE"]) == 8
    # trial runs are named by condition and rounded sampled values; the end says where to browse
    for _, t in trials.iterrows():
        name = t["tags.mlflow.runName"]
        assert name.startswith("MHA·") and f"lr{float(t['params.lr']):.2g}" in name, name
    assert f"Optuna studies: optuna-dashboard sqlite:///{tmp}/runs/search/optuna/optuna.db" in p.stdout
    for tune_output in ("Configuration for experiment", "ensorboard", "View detailed results"):  # --quiet
        assert tune_output not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "browse: mlflow ui --backend-store-uri sqlite:///" in p.stdout


def test_interrupted_search_resumes_without_repeating_trials(work):
    # Killed twice at the one point that can lose a result: as Tune ends a trial, Optuna has
    # recorded it COMPLETE and MLflow has not ended its run (``faults.KILL_AT_TRIAL_END``). Each
    # resumed session records such a trial from Tune's files; the budget is recorded once.
    tmp, ray = work
    before: dict[int, dict] = {}
    for session in (1, 2):
        log = open(tmp / f"killed{session}.log", "w")
        proc = start(cmd(tmp, ray), tmp, stdout=log, env=driver_env(**{faults.KILL_AT_TRIAL_END: "2"}))
        try:
            proc.wait(timeout=900)
        finally:
            kill_group(proc)
            log.close()
        out = (tmp / f"killed{session}.log").read_text()
        assert proc.returncode == -signal.SIGKILL, out[-3000:]
        before = {t.number: t.params for t in optuna_trials(tmp) if t.state.name == "COMPLETE"}
        assert len(before) == 2 * session, out[-3000:]
        # the window: Optuna holds the killed trial COMPLETE, MLflow holds its run RUNNING
        assert count_status(tmp / "mlflow.db", "finished", "stopped") == 2 * session - 1, out[-3000:]
        if session == 2:
            assert "1 trial(s) ended in Tune's files but not in MLflow: recorded from their results" in out, out
    p = subprocess.run(cmd(tmp, ray), cwd=tmp, env=driver_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 trial(s) ended in Tune's files but not in MLflow: recorded from their results" in p.stdout
    assert "4 trials done, 4 to run" in p.stdout, p.stdout[-3000:]
    after = [t for t in optuna_trials(tmp) if t.state.name == "COMPLETE"]
    assert len(after) == 8  # the budget, not the budget again
    assert all(after[i].params == before[t] for i, t in enumerate(sorted(before)))  # history kept
    df = runs(tmp)
    trials = df[df["tags.raystudy.search"] == "ts-vit_demo-digits_c-MHA"]
    assert trials["tags.raystudy.key"].is_unique
    # 8 distinct configs, each recorded as it ended: none lost to a kill, none run twice
    assert len(trials) == 8, trials[["tags.raystudy.key", "tags.raystudy.status"]]
    assert set(trials["tags.raystudy.status"]) <= {"finished", "stopped", "diverged"}, trials["tags.raystudy.status"]
    assert (trials["status"] == "FINISHED").all(), trials[["status", "tags.raystudy.status"]]
    assert (trials["tags.raystudy.recovered"] == "1").sum() == 2


def test_an_interrupted_search_leaves_no_run_running(work):
    # Ctrl-C once: Tune's graceful stop returns from tuner.fit() as if the study were done; the
    # search must stop there (not test a best config, not start the next stage) and say so.
    # Ctrl-C twice raises KeyboardInterrupt out of the search's tuner.fit().
    # Either way the search closes its runs and says in one line how to go on.
    tmp, ray = work
    space = {**SPACE, "base": {**SPACE["base"], "steps": 4000, "eval_every": 200}}
    (tmp / "s.yaml").write_text(yaml.safe_dump(space))
    uri = f"sqlite:///{tmp}/mlflow.db"
    for twice in (False, True):
        proc, frozen = start(cmd(tmp, ray), tmp), []
        try:
            wait_for(lambda: running_workers(uri, "raystudy-ts-vit_demo"), proc)
            assert proc.poll() is None, "the search ended before it could be interrupted"
            if twice:
                frozen = freeze_running_trials(uri, "raystudy-ts-vit_demo")  # the second comes while Tune stops
                out = ctrl_c_twice(proc)
            else:
                proc.send_signal(signal.SIGINT)
                out, _ = proc.communicate(timeout=300)
        finally:
            kill_group(proc)
            thaw(frozen)
        df = runs(tmp)
        assert proc.returncode == 130 and "search stopped; run the same command to resume it" in out, out[-3000:]
        assert "stopping: saving Tune's state and ending the running trials; Ctrl-C again" in out, out[-3000:]
        assert "best configuration per condition" not in out, out[-3000:]
        assert (df["status"] != "RUNNING").all(), df[["status", "tags.raystudy.role", "tags.raystudy.status"]]
        parent = df[df["tags.raystudy.role"] == "search"].iloc[0]
        assert parent["tags.raystudy.status"] == "interrupted"


def test_a_rehearsal_search_records_each_trial_once_and_says_how_near_the_known_optimum_it_came(work):
    # The same driver over synthetic trials scored on a known landscape (``--rehearse``): its own
    # experiment and Optuna study, each trial once, and a closing line whose numbers this test
    # works out again from what MLflow and Optuna hold.
    import re

    from raystudy.spaces import searches
    from raystudy.train import rehearsal

    tmp, ray = work
    # Tune runs of 5 trials: the study goes on from one to the next (12 = 5 + 5 + 2)
    space = {**SPACE, "budget": {"num_samples": 12}, "tune": {"checkpoint_every_s": 0, "trials_per_run": 5}}
    (tmp / "s.yaml").write_text(yaml.safe_dump(space))
    p = subprocess.run(
        [*cmd(tmp, ray), "--rehearse", "0.2"], cwd=tmp, env=driver_env(), capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = search_runs(f"sqlite:///{tmp}/mlflow.db", "raystudy-ts-vit_demo-rehearsal")
    name = "ts-vit_demo-digits_c-MHA-rehearsal"
    trials = df[df["tags.raystudy.search"] == name]
    assert len(trials) == 12 and trials["tags.raystudy.key"].is_unique
    assert (trials["tags.raystudy.rehearsal"] == "1").all() and (trials["status"] == "FINISHED").all()
    study = optuna_trials(tmp, name)
    assert len([t for t in study if t.state.name == "COMPLETE"]) == 12
    folders = sorted(p.name.rsplit("-", 1)[1] for p in (tmp / "runs" / "search").glob(f"{name}-*-part*"))
    assert folders == ["part1of3", "part2of3", "part3of3"], folders
    with pytest.raises(KeyError):  # the real study is not touched
        optuna_trials(tmp)

    found = re.search(
        r"rehearsal: known optimum ([\d.]+); chosen config ([\d.]+) .* closest of (\d+) trials ([\d.]+)", p.stdout
    )
    assert found, p.stdout[-3000:]
    optimum, chosen, told, closest = float(found[1]), float(found[2]), int(found[3]), float(found[4])
    land = searches.landscape(searches.load_search(str(tmp / "s.yaml")))
    true = [rehearsal.landscape_score(land, t.params) for t in study if t.state.name == "COMPLETE"]
    assert optimum == 0.95 and told == 12 and closest == round(max(true), 3)
    # the chosen config: the finished trial with the best validation accuracy, scored on the landscape
    best = trials[trials["tags.raystudy.status"] == "finished"].sort_values("metrics.best_val_acc").iloc[-1]
    params = {t.params["lr"]: t.params for t in study if t.state.name == "COMPLETE"}
    assert chosen == round(rehearsal.landscape_score(land, params[float(best["params.lr"])]), 3)
    assert chosen <= closest <= optimum


def test_a_search_stops_on_a_trial_tune_left_without_an_end_and_the_same_command_records_it(work):
    # MLflow never hears that Tune ended the second trial (``faults.LOSE_TRIAL_END``): its run is
    # closed interrupted as the Tune run ends. As a grid does, the search stops there rather than
    # test a best config chosen without it; the same command records it from Tune's files.
    tmp, ray = work
    (tmp / "s.yaml").write_text(yaml.safe_dump({**SPACE, "budget": {"num_samples": 4}}))
    rehearse = [*cmd(tmp, ray), "--rehearse", "0.2"]
    lose = driver_env(**{faults.LOSE_TRIAL_END: "2"})
    p = subprocess.run(rehearse, cwd=tmp, env=lose, capture_output=True, text=True, timeout=900)
    assert p.returncode == 130, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 trial run(s) had no end from Tune; marked interrupted" in p.stdout, p.stdout[-3000:]
    assert "search stopped; run the same command to resume it" in p.stdout
    assert "best configuration per condition" not in p.stdout  # nothing tested, no study done
    p = subprocess.run(rehearse, cwd=tmp, env=driver_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 trial(s) ended in Tune's files but not in MLflow: recorded from their results" in p.stdout
    assert "4 trials done, 0 to run" in p.stdout and "best configuration per condition" in p.stdout
    df = search_runs(f"sqlite:///{tmp}/mlflow.db", "raystudy-ts-vit_demo-rehearsal")
    trials = df[df["tags.raystudy.search"] == "ts-vit_demo-digits_c-MHA-rehearsal"]
    assert len(trials) == 4 and trials["tags.raystudy.key"].is_unique
    assert set(trials["tags.raystudy.status"]) <= {"finished", "stopped"}, trials["tags.raystudy.status"]


def test_a_search_whose_time_budget_ends_its_study_is_done_not_stopped(work):
    # Tune's time budget ends the run and cuts the trials it holds without telling the callbacks:
    # trials without an end, but the budget's, so the study is done and its best config tested.
    tmp, ray = work
    (tmp / "s.yaml").write_text(yaml.safe_dump({**SPACE, "budget": {"num_samples": 60}}))
    argv = [*cmd(tmp, ray), "--rehearse", "0.5", "--time-budget", "6"]
    p = subprocess.run(argv, cwd=tmp, env=driver_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "search stopped" not in p.stdout and "best configuration per condition" in p.stdout, p.stdout[-3000:]
    done = [t for t in optuna_trials(tmp, "ts-vit_demo-digits_c-MHA-rehearsal") if t.state.name == "COMPLETE"]
    assert 0 < len(done) < 60
    df = search_runs(f"sqlite:///{tmp}/mlflow.db", "raystudy-ts-vit_demo-rehearsal")
    assert (df["status"] != "RUNNING").all(), df[["status", "tags.raystudy.status"]]


def test_a_search_runs_its_trials_on_a_few_reused_processes(tmp_path, mlflow_uri, ray_tmp):
    # 100 short rehearsal trials on a Ray of 12 logical CPUs of the search's own, no cap in the
    # space: the search caps its trials at the 12 the Ray holds and starts each on an ended trial's
    # process. Uncapped, Tune started a searcher's trials one at a time; under a cap it gave an
    # ended trial's process to the oldest waiting trial, killing the one already starting for it:
    # 44 worker processes for these 100 trials before, about 15 now.
    from raystudy.driver import local_ray

    n = 100
    space = {**SPACE, "budget": {"num_samples": n}, "test_seeds": [100], "tune": {"checkpoint_every_s": 0}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(space))
    own = ["--num-cpus", "12", "--ray-temp-dir", ray_tmp, "--rehearse", "0.2"]
    p = subprocess.run(cmd(tmp_path, own), cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    name = "ts-vit_demo-digits_c-MHA-rehearsal"
    assert len([t for t in optuna_trials(tmp_path, name) if t.state.name == "COMPLETE"]) == n
    workers = local_ray.worker_processes(ray_tmp)
    assert 0 < workers <= 0.3 * n, workers
