"""--adaptive on a real local Ray and MLflow store (slow): the live policy's decisions are the
replay's on the same recorded curves, stopped trials are recorded once, a killed driver resumes."""

import os
import signal
import subprocess

import pytest

from raystudy.train.rehearsal import experiment_name
from tests.commands.test_grid_ray import grid_cmd, run, trial_runs, work, write_space  # noqa: F401 - fixtures
from tests.helpers import count_status, kill_group, start, wait_for

pytestmark = pytest.mark.slow

REHEARSAL = experiment_name("raystudy-t-vit_demo")  # where a rehearsal of the grid records

# 2 conditions x 3 lrs x 3 seeds; halving at step 5 drops one lr per cell for every seed.
SPACE = {
    "study": "t",
    "base": {
        "model": "vit_demo",
        "steps": 20,
        "warmup_steps": 2,
        "eval_every": 5,
        "log_every": 5,
        "batch_size": 32,
        "probe_pairs": 0,
    },
    "grid": {
        "condition": {"grid_search": ["MHA", "LN2"]},
        "lr": {"grid_search": [0.03, 0.1, 0.3]},
        "seed": {"grid_search": [0, 1, 2]},
    },
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0},
}


def test_live_policy_equals_replay_records_stops_once_and_resumes_after_a_kill(work):  # noqa: F811
    from analysis import replaying
    from raystudy.spaces import adaptive

    tmp, ray = work
    cmd = grid_cmd(write_space(tmp, SPACE), ray, "--adaptive", "halving")
    proc = start(cmd, tmp, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: count_status(tmp / "mlflow.db", "finished", "stopped") >= 4, proc, timeout=400)
        assert proc.poll() is None, "grid finished before it could be killed"
        proc.send_signal(signal.SIGKILL)  # the driver only; mid-grid
        proc.wait()
    finally:
        kill_group(proc)
    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    uri = f"sqlite:///{tmp}/mlflow.db"
    df = trial_runs(uri)
    # every trial key exactly once, none left running; the policy's stops are `stopped`
    assert len(df) == 18 and df["tags.raystudy.key"].nunique() == 18, df[["tags.raystudy.key", "status"]]
    assert set(df["status"]) == {"FINISHED"}
    assert set(df["tags.raystudy.status"]) <= {"finished", "stopped", "diverged"}
    stopped = df[df["tags.raystudy.status"] == "stopped"]
    n = len(stopped)
    assert f"0 unfinished, {n} stopped by the policy" in p.stdout
    assert (
        "policy halving: its agreement with the full grid, against the reseeding floor, comes from a replay" in p.stdout
    )
    assert stopped["tags.raystudy.stopped_at"].notna().all()
    # stopped by the scheduler while running or before starting: no test accuracy. A trial whose
    # rung completed only after it ended is recorded stopped afterwards (its numbers stay logged).
    late = stopped["tags.raystudy.stopped_late"] == "1" if "tags.raystudy.stopped_late" in stopped else False
    assert stopped.loc[~late, "metrics.test_acc"].isna().all() and (~late).sum() >= 1

    # the replay of the policy on what MLflow recorded decides exactly what the live grid did
    grid = replaying.recorded("raystudy-t-vit_demo", uri)
    decided = adaptive.decide(adaptive.policy("halving"), grid["trials"], grid["seen"])
    assert set(decided) == set(stopped["tags.raystudy.key"])
    halved = {k for k, s in decided.items() if s.rule.startswith("halving")}
    assert len(halved) == 2 * 3  # one lr of each condition, all three seeds
    by_key = stopped.set_index("tags.raystudy.key")
    for key in halved:  # a stop never comes before its milestone
        at = int(by_key.loc[key, "tags.raystudy.stopped_at"])
        assert at == 0 or at >= decided[key].step
    # later seeds of a dropped lr never start: no evaluation was logged for them
    later = [k for k in halved if decided[k].step == 0]
    early = set(stopped.loc[~late, "tags.raystudy.key"])
    assert (
        all(
            not grid["seen"][k].points for k in later if k in early and by_key.loc[k, "tags.raystudy.stopped_at"] == "0"
        )
        and len(later) == 4
    )

    # and the analysis: stopped runs are counted, never averaged; the conclusions equal the replay's
    r = replaying.replay(grid, adaptive.policy("identity"))
    assert r["stopped"] == n and (r["runs"]["status"] == "stopped").sum() == n
    live = replaying.conclusions(grid["runs"])
    assert all(
        lr not in {t["lr"] for t in grid["trials"] if t["key"] in halved and (t["dataset"], t["condition"]) == cell}
        for cell, lr in live["chosen_lr"].items()
    )


def test_trials_the_policy_stopped_after_the_store_snapshot_are_recorded_stopped_from_storage(
    work,  # noqa: F811
    ray_tmp,
):
    # A lost head: its store comes back from a snapshot taken before the grid, while Tune's folder
    # under --storage (the bucket) holds every trial, those the policy stopped among them.
    import shutil

    tmp, _ = work
    space = {**SPACE, "grid": {**SPACE["grid"], "seed": 0}}  # 2 conditions x 3 lrs; halving drops one lr of each
    # 12-second rehearsal trials, all six at once (a Ray of six logical CPUs; a rehearsal trial sleeps
    # on one): a cell's lrs side by side, so the dropped one is stopped mid-run on any machine (real
    # 20-step trials could end before their slowest sibling reached the milestone)
    ray = ["--ray-temp-dir", ray_tmp, "--num-cpus", "6"]
    cmd = grid_cmd(write_space(tmp, space), ray, "--adaptive", "halving", "--rehearse", "12")
    shutil.copy(tmp / "mlflow.db", tmp / "snapshot.db")  # the store as the newest snapshot has it
    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    uri = f"sqlite:///{tmp}/mlflow.db"
    full = trial_runs(uri, REHEARSAL).set_index("tags.raystudy.key")
    assert len(full) == 6 and set(full["status"]) == {"FINISHED"}
    live = full["tags.raystudy.status"] == "stopped"
    if "tags.raystudy.stopped_late" in full:
        live &= full["tags.raystudy.stopped_late"] != "1"
    assert live.sum() >= 1, full["tags.raystudy.status"]  # stopped by the scheduler, mid-run
    results = {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in (tmp / "runs" / "ray").glob("*/*/result.json")}
    os.replace(tmp / "snapshot.db", tmp / "mlflow.db")

    p = run(cmd, tmp)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "0 unfinished" in p.stdout and "PARTIAL" not in p.stdout, p.stdout[-3000:]
    assert f"{live.sum()} trial(s) the policy stopped, missing from MLflow: recorded stopped" in p.stdout
    df = trial_runs(uri, REHEARSAL)
    assert len(df) == 6 and df["tags.raystudy.key"].nunique() == 6, df[["tags.raystudy.key", "status"]]
    assert set(df["status"]) == {"FINISHED"}
    df = df.set_index("tags.raystudy.key")
    assert df["tags.raystudy.status"].to_dict() == full["tags.raystudy.status"].to_dict()
    stopped = full.index[live]
    for col in ("tags.raystudy.stopped_at", "metrics.steps_done"):  # stopped where the live scheduler stopped it
        assert df.loc[stopped, col].to_dict() == full.loc[stopped, col].to_dict(), col
    assert df.loc[stopped, "metrics.test_acc"].isna().all()  # no final results for a stopped trial
    # none trained again: Tune wrote no result
    assert {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in results} == results
